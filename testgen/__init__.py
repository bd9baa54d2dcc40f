"""Reference implementations, generated tests and their verification on a GPU."""

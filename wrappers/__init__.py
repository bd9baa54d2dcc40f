"""Host wrappers and pybind bindings that turn a kernel unit into a PyTorch extension."""

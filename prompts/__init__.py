"""kminer's Jinja templates: the label, the test, the LLM prompts, the dataset card, the review
pages (`ui/`). They are package data, found through importlib.resources, so an installed wheel
reads the same files as a checkout."""

from importlib import resources
from pathlib import Path

HERE = Path(str(resources.files(__name__)))

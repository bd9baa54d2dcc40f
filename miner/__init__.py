"""kminer's mining half: from a repository to one standalone CUDA compile unit per kernel."""

__version__ = "0.1.0"

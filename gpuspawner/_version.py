"""The package's version, apart so that the node agent needs nothing else."""

__version__ = "0.1.0"

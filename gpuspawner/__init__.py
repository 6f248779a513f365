"""gpuspawner: a JupyterHub spawner for Docker Swarm clusters with GPUs of several models."""

__version__ = "0.1.0"

from .spawner import GPUSwarmSpawner, validate_config  # noqa: E402

__all__ = ["GPUSwarmSpawner", "validate_config", "__version__"]

"""gpuspawner: a JupyterHub spawner for Docker Swarm clusters with GPUs of several models."""

__version__ = "0.1.0"

from .spawner import GPUSwarmSpawner  # noqa: E402

__all__ = ["GPUSwarmSpawner", "__version__"]

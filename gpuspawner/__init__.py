"""gpuspawner: a JupyterHub spawner for Docker Swarm clusters with GPUs of several models."""

from ._version import __version__

__all__ = ["GPUSwarmSpawner", "validate_config", "__version__"]


def __getattr__(name):
    # The spawner (and with it docker and jupyterhub) loads on first use only,
    # so the node agent runs on GPU nodes that have neither installed.
    if name in ("GPUSwarmSpawner", "validate_config"):
        from .spawn import spawner

        return getattr(spawner, name)
    raise AttributeError(f"module 'gpuspawner' has no attribute {name!r}")

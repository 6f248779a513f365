"""GPUSwarmSpawner, a thin adapter from JupyterHub's calls to the hub's GPUHub, with its form,
progress events, error messages and the access rules at a spawn."""

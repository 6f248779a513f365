"""Development tools: the local multi-node swarm, the Jupyter server image, a real hub,
PostgreSQL and browser for the tests, the fake NVML, and the demo. Not part of the wheel."""

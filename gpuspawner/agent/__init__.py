"""gpuspawner-agent, which runs on GPU nodes: NVML readings posted to the hub. It imports nothing of the
hub's side (only the report's shape and health rules, in gpuspawner.core)."""

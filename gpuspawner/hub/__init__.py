"""The hub's GPU state: GPUHub (app.py), built once from the settings (settings.py), and what it runs
in the hub (resume.py: the spawns waiting in line when the hub stopped)."""

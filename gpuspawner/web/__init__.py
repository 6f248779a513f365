"""The hub's gpuspawner endpoints and pages, served by JupyterHub under /hub/ (registered by configure(c))."""

"""Pure values and rules: the inventory, shares (integer thousandths), requests, labels, user options,
access rules, budgets, agents' reports, the line's order, idle timers and what admin settings could
reach devices. Nothing here imports docker, jupyterhub, tornado or sqlalchemy
(tests/unit/test_import_graph.py)."""

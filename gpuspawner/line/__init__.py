"""The waiting line per GPU model as the hub serves it (its order rules are gpuspawner.core.line_order)."""

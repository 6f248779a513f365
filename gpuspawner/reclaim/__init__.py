"""Idle and held-time reclaim: readings per holder, warnings, stops through the hub."""

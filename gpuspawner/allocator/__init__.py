"""Placement decisions: requests in, an Allocation or a reasoned refusal out (standard library only)."""

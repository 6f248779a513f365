"""Planning a line's serving (pure: the standard library, the allocator and the
pure core): who may be served now without delaying those ahead (backfill)."""

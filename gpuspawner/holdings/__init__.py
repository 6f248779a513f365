"""Who holds which GPUs: each holding's life, its ledger writes, ports, reconciliation with the swarm."""

"""The cluster as the hub sees it: the swarm seam (the only Docker API calls), the service spec
(a pure function of validated values, in docker-py's types), nodes, the inventory sources and
agents' reports merged, the admin views, and doctor's checks."""

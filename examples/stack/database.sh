#!/bin/sh
# The stack's PostgreSQL (the hub's state and gpuspawner's ledger), backed up and restored.
# Run it on the node that keeps the database (label gpuspawner.db=true), as root:
#
#   examples/stack/database.sh backup FILE     # a plain SQL dump, written 0600
#   examples/stack/database.sh restore FILE    # drops the database and loads FILE
#
# Restore with the hub stopped (docs/deploy.md, "Backup and restore"): on a manager,
# `docker service scale gpuspawner_hub=0` before and `=1` after. Servers keep running.
set -eu
umask 077
what=${1:-}
file=${2:-}
if [ -z "$what" ] || [ -z "$file" ]; then
  echo "usage: $0 backup|restore FILE" >&2
  exit 2
fi
db=$(docker ps -q -f label=com.docker.swarm.service.name=${STACK:-gpuspawner}_postgres)
if [ -z "$db" ]; then
  echo "$0: no running ${STACK:-gpuspawner}_postgres container on this node" >&2
  exit 1
fi
psql() { docker exec -i "$db" psql -U jupyterhub -v ON_ERROR_STOP=1 -q "$@"; }
case "$what" in
  backup)
    docker exec "$db" pg_dump -U jupyterhub jupyterhub > "$file.partial"
    mv "$file.partial" "$file"
    echo "backed up to $file ($(wc -c < "$file") bytes)"
    ;;
  restore)
    [ -s "$file" ] || { echo "$0: $file is missing or empty" >&2; exit 1; }
    psql -d postgres -c 'DROP DATABASE IF EXISTS jupyterhub WITH (FORCE)' -c 'CREATE DATABASE jupyterhub'
    psql -d jupyterhub < "$file" > /dev/null   # the dump's own queries' results; errors stay on stderr
    echo "restored from $file"
    ;;
  *)
    echo "usage: $0 backup|restore FILE" >&2
    exit 2
    ;;
esac

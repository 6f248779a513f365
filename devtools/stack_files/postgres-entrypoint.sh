#!/bin/sh
# PostgreSQL for the local stack, started the way the official postgres image starts it
# (the subset examples/stack/stack.yml uses): on a first start, a cluster in $PGDATA
# whose superuser $POSTGRES_USER has the password in $POSTGRES_PASSWORD_FILE, the
# database $POSTGRES_DB, password logins from the network; then the server, as postgres,
# with any arguments as more server options (as the official image's command takes them).
#
# The server is this container's process 1 (exec, no shell left behind), so a stop signal
# reaches it as it reaches the official image's: SIGINT is PostgreSQL's fast shutdown
# (clients disconnected, a checkpoint, no recovery at the next start), SIGTERM its smart
# shutdown (it waits for every client to disconnect). stack.yml stops it with SIGINT.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    cp "$POSTGRES_PASSWORD_FILE" "$pwfile" && chown postgres "$pwfile"
    as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\"" | as_postgres postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*' "$@"

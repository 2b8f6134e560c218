#!/bin/sh
# Initialise a cluster on first start and run postgres in the foreground as the postgres user.
# Follows the official image: POSTGRES_PASSWORD is required, POSTGRES_USER defaults to postgres,
# POSTGRES_DB to the user name; `postgres ARGS` passes ARGS to the server. Unlike the official
# image, the server starts once (no temporary init server), so "ready to accept connections" is
# logged exactly once.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "racecert-postgres: POSTGRES_PASSWORD must be set" >&2
    exit 1
fi
if [ "${1:-postgres}" != "postgres" ]; then
    exec "$@"
fi
[ "$#" -gt 0 ] && shift

as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    chown postgres "$pwfile"
    as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-sync >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != "postgres" ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\"" \
            | as_postgres postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
    postgres -D "$PGDATA" -c listen_addresses='*' "$@"

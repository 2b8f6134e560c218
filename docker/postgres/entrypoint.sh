#!/bin/sh
# Initialise a cluster on first start and run postgres in the foreground as the postgres user.
# Follows the official image: POSTGRES_PASSWORD is required, POSTGRES_USER defaults to postgres,
# POSTGRES_DB to the user name, POSTGRES_HOST_AUTH_METHOD (scram-sha-256 or md5) to
# scram-sha-256; `postgres ARGS` passes ARGS to the server. Unlike the official
# image, the server starts once (no temporary init server), so "ready to accept connections" is
# logged exactly once.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
case "$POSTGRES_HOST_AUTH_METHOD" in
    scram-sha-256|md5) ;;
    *)
        echo "racecert-postgres: POSTGRES_HOST_AUTH_METHOD must be scram-sha-256 or md5, not $POSTGRES_HOST_AUTH_METHOD" >&2
        exit 1
        ;;
esac
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
    if [ "$POSTGRES_HOST_AUTH_METHOD" = md5 ]; then
        # The role's password must be stored as an MD5 hash for md5 authentication to use it (a
        # SCRAM-stored one makes the server ask for SCRAM); a password given already hashed is
        # stored as it is.
        printf 'md5%s\n' "$(printf '%s%s' "$POSTGRES_PASSWORD" "$POSTGRES_USER" | md5sum | cut -d' ' -f1)" > "$pwfile"
    else
        printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    fi
    chown postgres "$pwfile"
    as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host="$POSTGRES_HOST_AUTH_METHOD" -E UTF8 --no-sync >/dev/null
    rm -f "$pwfile"
    echo "host all all all $POSTGRES_HOST_AUTH_METHOD" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != "postgres" ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\"" \
            | as_postgres postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
    postgres -D "$PGDATA" -c listen_addresses='*' "$@"

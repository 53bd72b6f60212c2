#!/bin/sh
# PostgreSQL for docker/compose.yaml: on first start a cluster in $PGDATA whose owner role is $POSTGRES_USER
# (telefuser) with $POSTGRES_PASSWORD and a database $POSTGRES_DB (telefuser); then the server, in the foreground.
#   POSTGRES_LISTEN  addresses to listen on (127.0.0.1)     PGPORT  its port (5432)
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD: the password of the role the replicas connect as}"
user=${POSTGRES_USER:-telefuser} db=${POSTGRES_DB:-telefuser}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" -A scram-sha-256 -E UTF8 --locale=C >/dev/null
    rm -f "$pwfile"
    # initdb lets in loopback only; replicas on other hosts or container networks connect with the password too.
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    echo "CREATE DATABASE \"$db\"" | "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses="${POSTGRES_LISTEN:-127.0.0.1}" -p "${PGPORT:-5432}" -k /tmp

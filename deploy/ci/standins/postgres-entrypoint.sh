#!/bin/bash
# The Postgres stand-in's entrypoint, after the official image's: as root it owns the data
# directory over to `postgres` and re-runs itself as that user; an empty data directory is
# initialised with POSTGRES_USER (default postgres) as the superuser, POSTGRES_PASSWORD as its
# password (required, as in the official image), POSTGRES_DB (default: the user's name) created,
# and password (scram-sha-256) access from any address; then the server runs in the foreground.
set -euo pipefail
: "${PGDATA:=/var/lib/postgresql/data}"

if [[ "${1:-}" == postgres && "$(id -u)" == 0 ]]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  find "$PGDATA" /var/run/postgresql \! -user postgres -exec chown postgres:postgres '{}' +
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [[ "${1:-}" == postgres && ! -s "$PGDATA/PG_VERSION" ]]; then
  if [[ -z "${POSTGRES_PASSWORD:-}" ]]; then
    echo "postgres stand-in: the data directory is empty and POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is a list of arguments, as upstream
  initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
    --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 \
    ${POSTGRES_INITDB_ARGS:-} -D "$PGDATA" >/dev/null
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [[ "$db" != postgres ]]; then
    printf 'CREATE DATABASE "%s";\n' "${db//\"/\"\"}" | postgres --single -j -D "$PGDATA" postgres >/dev/null
  fi
  echo "postgres stand-in: initialised $PGDATA (user $user, database $db)"
fi
exec "$@"

#!/usr/bin/env bash
# Starts a local PostgreSQL for the storage tests and prints its SQLAlchemy URL. Prints nothing
# (and the PostgreSQL cases of tests/storage are skipped) when it cannot: not root, no package,
# or no server within the time limits. Installing takes about 25 s on a fresh machine.
set -u
[ "$(id -u)" = 0 ] || exit 0
if ! command -v pg_lsclusters >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  timeout 100 apt-get install -y -q postgresql >/dev/null 2>&1 \
    || { timeout 30 apt-get update -qq >/dev/null 2>&1 \
         && timeout 100 apt-get install -y -q postgresql >/dev/null 2>&1; } || exit 0
fi
read -r version cluster port status _ < <(pg_lsclusters -h | head -n 1) || exit 0
[ "$status" = online ] || timeout 30 pg_ctlcluster "$version" "$cluster" start >/dev/null 2>&1 \
  || exit 0
psql_do() { runuser -u postgres -- psql -p "$port" -tAqc "$1"; }
[ "$(psql_do "SELECT 1 FROM pg_roles WHERE rolname = 'moescope'")" = 1 ] \
  || psql_do "CREATE ROLE moescope LOGIN PASSWORD 'moescope'" >/dev/null || exit 0
[ "$(psql_do "SELECT 1 FROM pg_database WHERE datname = 'moescope_test'")" = 1 ] \
  || psql_do "CREATE DATABASE moescope_test OWNER moescope" >/dev/null || exit 0
echo "postgresql+psycopg://moescope:moescope@127.0.0.1:$port/moescope_test"

#!/usr/bin/env bash
# Installs the Postgres the outbox's Postgres tests run on (crates/conveyor-outbox/tests/postgres.rs): Debian's
# `postgresql` package, when no /usr/lib/postgresql/*/bin/postgres exists. Idempotent: otherwise it does nothing.
# Installing needs apt-get and root (CI and the project's machines run as root); anyone else gets the command to
# run. The package's own cluster is not used: start-postgres.sh makes one under <repo>/.local/run/postgres.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PACKAGES=(postgresql)

how_to_install() {
  err "the outbox's Postgres tests need a Postgres server (initdb, pg_ctl, postgres under /usr/lib/postgresql/<version>/bin)."
  err "  Debian/Ubuntu: sudo apt-get install -y ${PACKAGES[*]}"
  err "  then run: make local-aws"
}

main() {
  postgres_bin_dir >/dev/null && return 0
  hold_lock "$RUN_DIR/postgres-install.lock" 900 "another install-postgres.sh" || return 1
  postgres_bin_dir >/dev/null && return 0
  apt_install "about 50 MB" "${PACKAGES[@]}" || {
    how_to_install
    return 1
  }
  local bin
  bin="$(postgres_bin_dir)" || {
    err "apt-get installed ${PACKAGES[*]} but no /usr/lib/postgresql/*/bin/postgres exists"
    return 1
  }
  log "Postgres $("$bin/postgres" --version | awk '{print $3}') is installed ($bin)"
}

main "$@"

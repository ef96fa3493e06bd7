#!/usr/bin/env bash
# Installs AWS's SQS Extended Client Library for Python, pinned, for Conveyor's large-payload interop tests
# (idempotent; a second run only checks a stamp):
#   .local/extended-client/venv/   Python venv: amazon-sqs-extended-client + boto3, pins in
#                                  extended-client/requirements.txt
# Needs: python3 (3.9+) with venv. Called by the interop test (tests/tests/large_payloads.rs), so a fresh
# clone's `make test` installs it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

EC_SRC="$CONVEYOR_LOCALSTACK_DIR/extended-client"
EC_DIR="$LOCAL_DIR/extended-client"
EC_VENV="$EC_DIR/venv"
PYTHON="${CONVEYOR_PYTHON:-python3}"

stamp() { sha256sum "$EC_SRC/requirements.txt" | cut -d' ' -f1; }

installed() {
  [[ -f "$EC_VENV/.conveyor-installed" && "$(cat "$EC_VENV/.conveyor-installed")" == "$(stamp)" ]] &&
    "$EC_VENV/bin/python" -c 'import sqs_extended_client, boto3' 2>/dev/null
}

install() {
  require_cmd "$PYTHON" "Install Python 3 (Debian: apt-get install -y python3 python3-venv) or set CONVEYOR_PYTHON." || return 1
  if [[ -d "$EC_VENV" ]] && ! "$EC_VENV/bin/python" -c '' 2>/dev/null; then
    rm -rf "$EC_VENV"
  fi
  if [[ ! -x "$EC_VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$EC_VENV" || {
      err "'$PYTHON -m venv' failed. Debian/Ubuntu: apt-get install -y python3-venv"
      return 1
    }
  fi
  rm -f "$EC_VENV/.conveyor-installed"
  log "installing the SQS Extended Client for Python (pins in $EC_SRC/requirements.txt) into $EC_VENV"
  "$EC_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$EC_SRC/requirements.txt"
  "$EC_VENV/bin/python" -c 'import sqs_extended_client, boto3' || {
    err "the SQS Extended Client installed but does not import; see the output above"
    return 1
  }
  stamp >"$EC_VENV/.conveyor-installed"
}

main() {
  mkdir -p "$EC_DIR"
  hold_lock "$EC_DIR/install.lock" 600 "another install-extended-client.sh" || exit 1
  installed || install
}

main "$@"

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

stamp() { sha256sum "$EC_SRC/requirements.txt" | cut -d' ' -f1; }

installed() {
  [[ -f "$EC_VENV/.conveyor-installed" && "$(cat "$EC_VENV/.conveyor-installed")" == "$(stamp)" ]] &&
    "$EC_VENV/bin/python" -c 'import sqs_extended_client, boto3' 2>/dev/null
}

install() {
  install_pinned_venv "$EC_VENV" "$EC_SRC/requirements.txt" 'import sqs_extended_client, boto3' \
    "the SQS Extended Client for Python"
}

main() {
  mkdir -p "$EC_DIR"
  hold_lock "$EC_DIR/install.lock" 600 "another install-extended-client.sh" || exit 1
  installed || install
}

main "$@"

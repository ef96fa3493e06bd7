#!/usr/bin/env bash
# Installs Powertools for AWS Lambda, pinned, for Conveyor's interop tests (idempotent; a second run only
# checks stamps):
#   .local/powertools/venv/          Python venv: aws-lambda-powertools + boto3, pins in powertools/requirements.txt
#   .local/powertools/node/          npm: @aws-lambda-powertools/idempotency + AWS SDK v3, pins in
#                                    powertools/package.json and package-lock.json (npm ci)
# Needs: python3 (3.9+) with venv, npm/node 18+. Called on first need by the interop tests
# (tests/tests/powertools_interop.rs, through conveyor_testing::powertools::ensure_installed), so a fresh
# clone's `make test` installs it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PT_SRC="$CONVEYOR_LOCALSTACK_DIR/powertools"
PT_DIR="$LOCAL_DIR/powertools"
PT_VENV="$PT_DIR/venv"
PT_NODE="$PT_DIR/node"

stamp_text() { sha256sum "$@" | cut -d' ' -f1; }
py_stamp() { stamp_text "$PT_SRC/requirements.txt"; }
node_stamp() { stamp_text "$PT_SRC/package.json" "$PT_SRC/package-lock.json"; }

py_installed() {
  [[ -f "$PT_VENV/.conveyor-installed" && "$(cat "$PT_VENV/.conveyor-installed")" == "$(py_stamp)" ]] &&
    "$PT_VENV/bin/python" -c 'import aws_lambda_powertools, boto3' 2>/dev/null
}
node_installed() {
  [[ -f "$PT_NODE/.conveyor-installed" && "$(cat "$PT_NODE/.conveyor-installed")" == "$(node_stamp)" &&
    -d "$PT_NODE/node_modules/@aws-lambda-powertools/idempotency" ]]
}

install_py() {
  install_pinned_venv "$PT_VENV" "$PT_SRC/requirements.txt" \
    'import aws_lambda_powertools.utilities.idempotency, boto3' "Powertools for Python"
}

install_node() {
  require_cmd npm "Install Node.js 18+ and npm (Debian: apt-get install -y npm)." || return 1
  mkdir -p "$PT_NODE"
  rm -f "$PT_NODE/.conveyor-installed"
  cp "$PT_SRC/package.json" "$PT_SRC/package-lock.json" "$PT_NODE/"
  log "installing Powertools for TypeScript (pins in $PT_SRC/package-lock.json) into $PT_NODE"
  (cd "$PT_NODE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  node_stamp >"$PT_NODE/.conveyor-installed"
}

main() {
  hold_lock "$PT_DIR/install.lock" 600 "another install-powertools.sh" || exit 1
  py_installed || install_py
  node_installed || install_node
}

main "$@"

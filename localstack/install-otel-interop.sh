#!/usr/bin/env bash
# Installs OpenTelemetry's own SQS instrumentations for Python and Node.js, pinned, for Conveyor's trace
# interop test (idempotent; a second run only checks stamps):
#   .local/otel-interop/venv/        Python venv: boto3, opentelemetry-sdk, opentelemetry-instrumentation-boto3sqs,
#                                    opentelemetry-exporter-otlp-proto-http; pins in tests/otel_interop/requirements.txt
#   .local/otel-interop/node/        npm: @opentelemetry/sdk-trace-node, @opentelemetry/instrumentation-aws-sdk,
#                                    @opentelemetry/exporter-trace-otlp-proto, @aws-sdk/client-sqs; pins in
#                                    tests/otel_interop/package.json and package-lock.json (npm ci)
# Needs: python3 (3.9+) with venv, npm/node 18+. Called on first need by tests/tests/traces_interop.rs, so a
# fresh clone's `make test` installs it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OI_SRC="$REPO_ROOT/tests/otel_interop"
OI_DIR="$LOCAL_DIR/otel-interop"
OI_VENV="$OI_DIR/venv"
OI_NODE="$OI_DIR/node"
PY_CHECK='import boto3, opentelemetry.sdk, opentelemetry.instrumentation.boto3sqs, opentelemetry.exporter.otlp.proto.http.trace_exporter'

stamp_text() { sha256sum "$@" | cut -d' ' -f1; }
py_stamp() { stamp_text "$OI_SRC/requirements.txt"; }
node_stamp() { stamp_text "$OI_SRC/package.json" "$OI_SRC/package-lock.json"; }

py_installed() {
  [[ -f "$OI_VENV/.conveyor-installed" && "$(cat "$OI_VENV/.conveyor-installed")" == "$(py_stamp)" ]] &&
    "$OI_VENV/bin/python" -c "$PY_CHECK" 2>/dev/null
}
node_installed() {
  [[ -f "$OI_NODE/.conveyor-installed" && "$(cat "$OI_NODE/.conveyor-installed")" == "$(node_stamp)" &&
    -d "$OI_NODE/node_modules/@opentelemetry/instrumentation-aws-sdk" ]]
}

install_py() {
  install_pinned_venv "$OI_VENV" "$OI_SRC/requirements.txt" "$PY_CHECK" "OpenTelemetry for Python"
}

install_node() {
  require_cmd npm "Install Node.js 18+ and npm (Debian: apt-get install -y npm)." || return 1
  mkdir -p "$OI_NODE"
  rm -f "$OI_NODE/.conveyor-installed"
  cp "$OI_SRC/package.json" "$OI_SRC/package-lock.json" "$OI_NODE/"
  log "installing OpenTelemetry for Node.js (pins in $OI_SRC/package-lock.json) into $OI_NODE"
  (cd "$OI_NODE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  node_stamp >"$OI_NODE/.conveyor-installed"
}

main() {
  hold_lock "$OI_DIR/install.lock" 600 "another install-otel-interop.sh" || exit 1
  py_installed || install_py
  node_installed || install_node
}

main "$@"

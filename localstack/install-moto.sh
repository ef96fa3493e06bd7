#!/usr/bin/env bash
# Installs moto's server from PyPI, pinned, for the test LocalStack 4.8.1 cannot serve: the console's
# fair-queue view reads CloudWatch, whose current SDK protocol (Smithy RPC v2 CBOR) LocalStack 4.8.1 does
# not speak (idempotent; a second run only checks a stamp):
#   .local/moto/venv/bin/moto_server   moto[server] 5.2.6, pins in moto/requirements.txt
# Needs: python3 (3.9+) with venv. Called by the tests that start a moto of their own
# (conveyor_testing::localstack::OwnMoto, tests/tests/console_fair_queues.rs) and by `make test`, so a
# fresh clone installs it before it is needed. Prints the server's path.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MOTO_SRC="$CONVEYOR_LOCALSTACK_DIR/moto"
MOTO_DIR="$LOCAL_DIR/moto"
MOTO_VENV="$MOTO_DIR/venv"

stamp() { sha256sum "$MOTO_SRC/requirements.txt" | cut -d' ' -f1; }

installed() {
  [[ -f "$MOTO_VENV/.conveyor-installed" && "$(cat "$MOTO_VENV/.conveyor-installed")" == "$(stamp)" ]] &&
    [[ -x "$MOTO_VENV/bin/moto_server" ]]
}

install() {
  install_pinned_venv "$MOTO_VENV" "$MOTO_SRC/requirements.txt" 'import moto.server, flask, boto3' \
    "moto's server"
}

main() {
  mkdir -p "$MOTO_DIR"
  installed || {
    hold_lock "$MOTO_DIR/install.lock" 600 "another install-moto.sh" >&2 || exit 1
    installed || install >&2
  }
  echo "$MOTO_VENV/bin/moto_server"
}

main "$@"

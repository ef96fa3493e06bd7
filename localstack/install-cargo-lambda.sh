#!/usr/bin/env bash
# Installs cargo-lambda from PyPI, pinned, for the test that runs the example `bootstrap` under
# `cargo lambda watch --only-lambda-apis` (idempotent; a second run only checks a stamp):
#   .local/cargo-lambda/venv/bin/cargo-lambda   pins in cargo-lambda/requirements.txt
# Needs: python3 (3.9+) with venv. Called by tests/tests/cargo_lambda.rs, so a fresh clone's `make test`
# installs it. Prints the binary's path.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CL_SRC="$CONVEYOR_LOCALSTACK_DIR/cargo-lambda"
CL_DIR="$LOCAL_DIR/cargo-lambda"
CL_VENV="$CL_DIR/venv"

stamp() { sha256sum "$CL_SRC/requirements.txt" | cut -d' ' -f1; }

installed() {
  [[ -f "$CL_VENV/.conveyor-installed" && "$(cat "$CL_VENV/.conveyor-installed")" == "$(stamp)" ]] &&
    [[ -x "$CL_VENV/bin/cargo-lambda" ]]
}

install() {
  install_pinned_venv "$CL_VENV" "$CL_SRC/requirements.txt" \
    "import os, sys; sys.exit(0 if os.access('$CL_VENV/bin/cargo-lambda', os.X_OK) else 1)" "cargo-lambda"
}

main() {
  mkdir -p "$CL_DIR"
  hold_lock "$CL_DIR/install.lock" 600 "another install-cargo-lambda.sh" >&2 || exit 1
  installed || install >&2
  echo "$CL_VENV/bin/cargo-lambda"
}

main "$@"

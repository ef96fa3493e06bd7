#!/usr/bin/env bash
# Installs the headless browser the console's browser tests drive (crates/conveyor-console/tests/browser.rs):
# Debian's `chromium` and `chromium-driver` (chromedriver, the WebDriver server). Idempotent: when both are on
# PATH it only checks them. Installing needs apt-get and root (CI and the project's machines run as root);
# anyone else gets the command to run. Other systems: put a Chromium or Chrome and its matching chromedriver on
# PATH, or point CONVEYOR_CHROMEDRIVER at the driver. Called by `make test` and by the browser tests.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PACKAGES=(chromium chromium-driver)

installed() {
  command -v "${CONVEYOR_CHROMEDRIVER:-chromedriver}" >/dev/null 2>&1 &&
    { [[ -n "${CONVEYOR_CHROMEDRIVER:-}" ]] || command -v chromium >/dev/null 2>&1; }
}

how_to_install() {
  err "the console's browser tests need Chromium and chromedriver."
  err "  Debian/Ubuntu: sudo apt-get install -y ${PACKAGES[*]}"
  err "  elsewhere: install Chromium or Chrome and the matching chromedriver, then put chromedriver on PATH"
  err "  or set CONVEYOR_CHROMEDRIVER=/path/to/chromedriver"
}

main() {
  installed && return 0
  hold_lock "$RUN_DIR/chromium-install.lock" 900 "another install-chromium.sh" || return 1
  installed && return 0
  apt_install "about 100 MB" "${PACKAGES[@]}" || {
    how_to_install
    return 1
  }
  installed || {
    err "apt-get installed ${PACKAGES[*]} but chromium or chromedriver is still not on PATH"
    return 1
  }
  log "chromium $(chromium --version 2>/dev/null | awk '{print $2}') and chromedriver are installed"
}

main "$@"

#!/usr/bin/env bash
# Runs checkov (installed by install.sh beside this script, pinned) on infra/, skipping exactly the
# checks and paths listed in skipped.txt, each with its reason. Exit status: checkov's (0 = no failed check).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"
CHECKOV="$REPO_ROOT/.local/checkov-venv/bin/checkov"

"$HERE/install.sh" --quiet

checks=()
paths=()
while IFS= read -r line || [[ -n "$line" ]]; do
  [[ -z "${line// /}" || "$line" == \#* ]] && continue
  id="${line%%[[:space:]]*}"
  reason="${line#"$id"}"
  if [[ -z "${reason// /}" ]]; then
    printf '[conveyor-checkov] error: %s skips %s without a reason\n' "$HERE/skipped.txt" "$id" >&2
    exit 2
  fi
  case "$id" in
    path:*) paths+=(--skip-path "${id#path:}") ;;
    *) checks+=("$id") ;;
  esac
done <"$HERE/skipped.txt"

skip_checks="$(IFS=,; printf '%s' "${checks[*]}")"
cd "$REPO_ROOT"
exec "$CHECKOV" --directory infra --framework terraform --quiet --compact --skip-download \
  --skip-check "$skip_checks" "${paths[@]}" "$@"

#!/usr/bin/env bash
# Regenerates the README's configuration reference (the block between
# <!-- BEGIN CONFIG REFERENCE --> and <!-- END CONFIG REFERENCE -->) from `ght config --markdown`.
#   scripts/gen-config-doc.sh [path-to-ght]      (default: build/bin/ght)
# tests/cli/readme_config_test.sh fails when the README block is out of date.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GHT=${1:-$ROOT/build/bin/ght}
README=$ROOT/README.md
BEGIN='<!-- BEGIN CONFIG REFERENCE -->'
END='<!-- END CONFIG REFERENCE -->'

[ -x "$GHT" ] || { echo "gen-config-doc.sh: no ght binary at $GHT (build the 'ght' target or pass its path)" >&2; exit 1; }
[ "$(grep -cxF "$BEGIN" "$README")" -eq 1 ] && [ "$(grep -cxF "$END" "$README")" -eq 1 ] ||
  { echo "gen-config-doc.sh: $README must hold exactly one '$BEGIN' and one '$END' line" >&2; exit 1; }

tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.md"' EXIT
# The reference shows defaults only, but a stray GHT_* variable could still make ght refuse to run.
env $(compgen -e | grep '^GHT_' | sed 's/^/-u /') "$GHT" config --markdown >"$tmp.md"
# The block is: a blank line, the table, a blank line (so the table renders after the HTML comment).
awk -v begin="$BEGIN" -v end="$END" -v md="$tmp.md" '
  $0 == begin { print; print ""; while ((getline l < md) > 0) print l; print ""; skip = 1; next }
  $0 == end   { skip = 0 }
  !skip       { print }
' "$README" >"$tmp"
if cmp -s "$tmp" "$README"; then
  echo "gen-config-doc.sh: $README is up to date"
else
  cat "$tmp" >"$README"
  echo "gen-config-doc.sh: updated the configuration reference in $README"
fi

#!/usr/bin/env bash
# Regenerates the options reference, docs/options.md: the block between
# <!-- BEGIN CONFIG REFERENCE --> and <!-- END CONFIG REFERENCE --> is `ght config --markdown`
# (a table of the short docs, then every whole doc); the text around it is kept.
#   scripts/gen-config-doc.sh [path-to-ght]      (default: build/bin/ght)
# tests/cli/config_doc_test.sh fails when the block is out of date.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GHT=${1:-$ROOT/build/bin/ght}
DOC=$ROOT/docs/options.md
BEGIN='<!-- BEGIN CONFIG REFERENCE -->'
END='<!-- END CONFIG REFERENCE -->'

[ -x "$GHT" ] || { echo "gen-config-doc.sh: no ght binary at $GHT (build the 'ght' target or pass its path)" >&2; exit 1; }
[ -f "$DOC" ] && [ "$(grep -cxF "$BEGIN" "$DOC")" -eq 1 ] && [ "$(grep -cxF "$END" "$DOC")" -eq 1 ] ||
  { echo "gen-config-doc.sh: $DOC must exist and hold exactly one '$BEGIN' and one '$END' line" >&2; exit 1; }

tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.md"' EXIT
# The reference shows defaults only, but a stray GHT_* variable could still make ght refuse to run.
env $(compgen -e | grep '^GHT_' | sed 's/^/-u /') "$GHT" config --markdown >"$tmp.md"
# The block is: a blank line, the reference, a blank line (so the table renders after the comment).
awk -v begin="$BEGIN" -v end="$END" -v md="$tmp.md" '
  $0 == begin { print; print ""; while ((getline l < md) > 0) print l; print ""; skip = 1; next }
  $0 == end   { skip = 0 }
  !skip       { print }
' "$DOC" >"$tmp"
if cmp -s "$tmp" "$DOC"; then
  echo "gen-config-doc.sh: $DOC is up to date"
else
  cat "$tmp" >"$DOC"
  echo "gen-config-doc.sh: updated the options reference in $DOC"
fi

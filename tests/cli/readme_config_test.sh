#!/usr/bin/env bash
# Fails when the README's configuration reference differs from `ght config --markdown`.
#   bash tests/cli/readme_config_test.sh <path-to-ght> <project-root>
set -u
GHT=${1:?usage: readme_config_test.sh <path-to-ght> <project-root>}
ROOT=${2:?usage: readme_config_test.sh <path-to-ght> <project-root>}
README=$ROOT/README.md
BEGIN='<!-- BEGIN CONFIG REFERENCE -->'
END='<!-- END CONFIG REFERENCE -->'
fix="scripts/gen-config-doc.sh $GHT"
[ -x "$GHT" ] || { echo "FAIL: no ght executable at $GHT" >&2; exit 1; }

for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ "$(grep -cxF "$BEGIN" "$README")" -ne 1 ] || [ "$(grep -cxF "$END" "$README")" -ne 1 ]; then
  echo "FAIL: $README must hold exactly one '$BEGIN' and one '$END' line" >&2
  exit 1
fi
if ! "$GHT" config --markdown >"$TMP/md" 2>"$TMP/err"; then
  echo "FAIL: 'ght config --markdown' exited non-zero: $(cat "$TMP/err")" >&2
  exit 1
fi
# Same layout as scripts/gen-config-doc.sh writes: blank line, table, blank line.
{ echo; cat "$TMP/md"; echo; } >"$TMP/expected"
awk -v begin="$BEGIN" -v end="$END" '$0 == end { inside = 0 } inside { print } $0 == begin { inside = 1 }' \
  "$README" >"$TMP/actual"
if ! diff -u --label "README.md (configuration reference)" --label "ght config --markdown" \
  "$TMP/actual" "$TMP/expected" >"$TMP/diff"; then
  cat "$TMP/diff" >&2
  echo "FAIL: the README configuration reference is out of date; run: $fix" >&2
  exit 1
fi
echo "readme_config_test.sh: README configuration reference is up to date"

#!/usr/bin/env bash
# Fails when the options reference (docs/options.md) differs from `ght config --markdown`, or when
# the README stops linking to it.
#   bash tests/cli/config_doc_test.sh <path-to-ght> <project-root>
set -u
GHT=${1:?usage: config_doc_test.sh <path-to-ght> <project-root>}
ROOT=${2:?usage: config_doc_test.sh <path-to-ght> <project-root>}
DOC=$ROOT/docs/options.md
BEGIN='<!-- BEGIN CONFIG REFERENCE -->'
END='<!-- END CONFIG REFERENCE -->'
fix="scripts/gen-config-doc.sh $GHT"
[ -x "$GHT" ] || { echo "FAIL: no ght executable at $GHT" >&2; exit 1; }
[ -f "$DOC" ] || { echo "FAIL: no options reference at $DOC" >&2; exit 1; }

for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ "$(grep -cxF "$BEGIN" "$DOC")" -ne 1 ] || [ "$(grep -cxF "$END" "$DOC")" -ne 1 ]; then
  echo "FAIL: $DOC must hold exactly one '$BEGIN' and one '$END' line" >&2
  exit 1
fi
grep -qF '](docs/options.md)' "$ROOT/README.md" ||
  { echo "FAIL: README.md does not link to docs/options.md" >&2; exit 1; }
if ! "$GHT" config --markdown >"$TMP/md" 2>"$TMP/err"; then
  echo "FAIL: 'ght config --markdown' exited non-zero: $(cat "$TMP/err")" >&2
  exit 1
fi
# Same layout as scripts/gen-config-doc.sh writes: blank line, reference, blank line.
{ echo; cat "$TMP/md"; echo; } >"$TMP/expected"
awk -v begin="$BEGIN" -v end="$END" '$0 == end { inside = 0 } inside { print } $0 == begin { inside = 1 }' \
  "$DOC" >"$TMP/actual"
if ! diff -u --label "docs/options.md (options reference)" --label "ght config --markdown" \
  "$TMP/actual" "$TMP/expected" >"$TMP/diff"; then
  cat "$TMP/diff" >&2
  echo "FAIL: docs/options.md is out of date; run: $fix" >&2
  exit 1
fi
echo "config_doc_test.sh: docs/options.md is up to date"

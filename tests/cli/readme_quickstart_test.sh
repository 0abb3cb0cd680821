#!/usr/bin/env bash
# CLI test: the README's "Quickstart on your own text" block runs as written (prep, train,
# sample, export, report), on a few Austen chapters, with the step count cut to 20.
#   bash tests/cli/readme_quickstart_test.sh <path-to-ght> <project-root>
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
source "$(dirname "$0")/train_common.sh"

block=$(awk '/^## Quickstart on your own text/{f=1} f && /^```sh$/{g=1; next} g && /^```$/{exit} g' "$root/README.md")
[ -n "$block" ] || fail "no sh block under '## Quickstart on your own text' in README.md"
for cmd in prep train sample export report; do
  grep -q "\$ght $cmd" <<<"$block" || fail "the quickstart has no 'ght $cmd' line"
done
mkdir -p "$work/my-texts"
head -c 300000 "$root/data/austen/emma.txt" >"$work/my-texts/emma.txt"
# The block's own ght= line points at build/bin/ght; the test runs the binary it was given.
script=$(sed -e 's|^ght=.*$|ght="$QUICKSTART_GHT"|' -e 's|--steps [0-9]*|--steps 20|' <<<"$block")
ght_path=$(readlink -f "$ght")
(cd "$work" && QUICKSTART_GHT="$ght_path" bash -euo pipefail -c "$script") >"$work/out.txt" 2>&1 ||
  { cat "$work/out.txt"; fail "the quickstart block failed"; }
[ -f "$work/my-run/config.json" ] || fail "no my-run/config.json"
ls "$work/my-run" | grep -q '^ckpt_00000020$' || fail "no checkpoint at step 20: $(ls "$work/my-run")"
[ -f "$work/my-hf/config.json" ] || fail "export wrote no my-hf/config.json"
grep -q "<svg" "$work/my-run/report.html" || fail "the report has no chart"
echo "readme_quickstart_test: ok"

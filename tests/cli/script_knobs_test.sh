#!/usr/bin/env bash
# Script knobs must not live in the GHT_* namespace: ght rejects every GHT_* variable it does not
# know, so `GHT_DEMO_STEPS=100 scripts/demo.sh` used to stop ght itself. Every GHT_* name a script
# reads must be a registered option, and the demo builds only the `ght` target.
#   bash tests/cli/script_knobs_test.sh <path-to-ght> <project-root>
source "$(dirname "$0")/check_common.sh" "$@"

known=$("$GHT" config --json | sed -n 's/^ *"name": "\(GHT_[A-Z0-9_]*\)".*/\1/p')
[ -n "$known" ] || fail "ght config --json listed no options"
# Variables a script reads (${NAME...}, $NAME) or sets (NAME=...).
for f in "$ROOT"/scripts/*.sh "$ROOT"/bench/*.sh; do
  [ -f "$f" ] || continue
  for name in $(grep -v '^[[:space:]]*#' "$f" | grep -oE '(\$\{?GHT_[A-Z0-9_]+|\bGHT_[A-Z0-9_]+=)' |
                sed -e 's/^\${\{0,1\}//' -e 's/=$//' | sort -u); do
    grep -qx "$name" <<<"$known" || fail "$(basename "$f") uses $name, which is not a GHT_* option (ght would refuse to run with it set)"
  done
done

# The knobs the scripts document work with ght: a renamed knob set in the environment is ignored.
DEMO_STEPS=3 TEST_JOBS=1 BUILD_JOBS=1 "$GHT" config >/dev/null 2>&1 || fail "ght refused to run with DEMO_STEPS/TEST_JOBS/BUILD_JOBS set"

# The demo builds only the ght target (time to first step).
grep -qE '^[^#]*scripts/build\.sh --target ght' "$ROOT/scripts/demo.sh" || fail "scripts/demo.sh does not build only the ght target"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "script_knobs_test: ok"

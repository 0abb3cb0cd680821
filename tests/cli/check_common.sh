# Shared by the tests/cli/*_test.sh scripts that count their failures (sourced, not run):
#   source "$(dirname "$0")/check_common.sh" "$@"
# GHT = $1 (must be executable), ROOT = $2 (the project root), every GHT_* variable of the caller
# unset (e.g. GHT_TEST_REQUIRE_GPU must not change what ght does), TMP a temp dir removed on exit,
# and fail MSG, which reports and counts; each script ends by checking $failures.
set -u
test_name=$(basename "$0")
GHT=${1:?usage: $test_name <path-to-ght> <project-root>}
ROOT=${2:?usage: $test_name <path-to-ght> <project-root>}
[ -x "$GHT" ] || { echo "FAIL: no ght executable at $GHT" >&2; exit 1; }
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
expect_in() {  # expect_in FILE TEXT
  grep -qF -- "$2" "$1" || { fail "expected '$2' in $1:"; sed 's/^/    /' "$1" >&2; }
}
# must_fail NAME -- command...: non-zero exit, no source location in what it says; stderr in $TMP/err
must_fail() {
  local name=$1; shift; shift
  if "$@" >"$TMP/out" 2>"$TMP/err"; then fail "$name: exited 0"; fi
  if grep -qE '\.(cpp|hpp|cu):[0-9]+' "$TMP/err"; then fail "$name: source location in a user message: $(cat "$TMP/err")"; fi
}

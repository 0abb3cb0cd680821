#!/usr/bin/env bash
# CLI test for `ght config` and the GHT_* registry's error reporting.
#   bash tests/cli/config_test.sh <path-to-ght> <project-root>
source "$(dirname "$0")/check_common.sh" "$@"
INC="$ROOT/tier/config_options.inc"
[ -f "$INC" ] || { echo "FAIL: no $INC (is $ROOT the project root?)" >&2; exit 1; }

# ---- `ght config` lists every declared option with value, source, default and doc -------------
if ! "$GHT" config >"$TMP/table" 2>"$TMP/err"; then
  fail "'ght config' exited non-zero: $(cat "$TMP/err")"
fi
header=$(head -n 1 "$TMP/table")
for col in NAME VALUE SOURCE DEFAULT DOC; do
  grep -qw "$col" <<<"$header" || fail "'ght config' header lacks column $col: '$header'"
done

names=$(sed -n 's/^GHT_OPTION(\([A-Z0-9_]*\),.*/\1/p' "$INC")
[ -n "$names" ] || fail "no GHT_OPTION lines found in $INC"
n_opts=0
while IFS= read -r line; do
  case "$line" in GHT_OPTION\(*) ;; *) continue ;; esac
  n_opts=$((n_opts + 1))
  # GHT_OPTION(NAME, TYPE, "DEFAULT", "CHOICES", "DOC", "SHORT"): the table prints SHORT
  name=$(sed 's/^GHT_OPTION(\([A-Z0-9_]*\),.*/\1/' <<<"$line")
  def=$(sed 's/^GHT_OPTION([^,]*, *[A-Za-z]*, *"\([^"]*\)".*/\1/' <<<"$line")
  doc=$(sed 's/.*, *"\(.*\)")[[:space:]]*$/\1/' <<<"$line")
  row=$(grep -E "^$name[[:space:]]" "$TMP/table")
  if [ -z "$row" ]; then
    fail "'ght config' does not list $name"
    continue
  fi
  [ -z "$def" ] && def='""'
  # Columns: NAME VALUE SOURCE DEFAULT DOC; with nothing set, VALUE == DEFAULT and SOURCE == default.
  read -r c_name c_value c_source c_default _ <<<"$row"
  [ "$c_name" = "$name" ] || fail "$name: name column is '$c_name'"
  [ "$c_value" = "$def" ] || fail "$name: value column '$c_value', expected the default '$def'"
  [ "$c_source" = "default" ] || fail "$name: source column '$c_source', expected 'default'"
  [ "$c_default" = "$def" ] || fail "$name: default column '$c_default', expected '$def'"
  grep -qF -- "$doc" <<<"$row" || fail "$name: doc column lacks '$doc' in row: $row"
done <"$INC"
n_rows=$(($(wc -l <"$TMP/table") - 1))
[ "$n_rows" -eq "$n_opts" ] || fail "'ght config' prints $n_rows rows, config_options.inc declares $n_opts"

# ---- sources: file < env < flag ---------------------------------------------------------------
cat >"$TMP/ght.toml" <<'TOML'
[ght]
opt_chunk = "1MiB"
GHT_STAGING_BYTES = "2MiB"
probe_seconds = 3
TOML
GHT_CONFIG="$TMP/ght.toml" GHT_STAGING_BYTES=4MiB \
  "$GHT" --set GHT_PROBE_SECONDS=5 config >"$TMP/src" 2>"$TMP/err" ||
  fail "'ght --set ... config' with GHT_CONFIG exited non-zero: $(cat "$TMP/err")"
check_row() {  # name value source
  local c_name c_value c_source rest
  read -r c_name c_value c_source rest <<<"$(grep -E "^$1[[:space:]]" "$TMP/src")"
  [ "$c_value $c_source" = "$2 $3" ] || fail "$1: expected value '$2' from '$3', got '$c_value' from '$c_source'"
}
check_row GHT_OPT_CHUNK 1MiB file
check_row GHT_STAGING_BYTES 4MiB env
check_row GHT_PROBE_SECONDS 5 flag
check_row GHT_CONFIG "$TMP/ght.toml" env
check_row GHT_DEVICE 0 default

# ---- errors fail every command, naming the variable and the value ----------------------------
# Prefer `ght info` (the lead's target); fall back to `ght config` while info is not registered.
cmd=config
if "$GHT" --help 2>/dev/null | grep -qE '^[[:space:]]+info([[:space:]]|$)'; then cmd=info; fi

GHT_HBM_BUDGET=12Q "$GHT" "$cmd" >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" -ne 0 ] || fail "GHT_HBM_BUDGET=12Q ght $cmd exited 0"
grep -q 'GHT_HBM_BUDGET' "$TMP/err" && grep -q '12Q' "$TMP/err" ||
  fail "GHT_HBM_BUDGET=12Q ght $cmd: stderr does not name the variable and value: $(cat "$TMP/err")"

GHT_HBM_BUDGT=1G "$GHT" "$cmd" >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" -ne 0 ] || fail "GHT_HBM_BUDGT=1G ght $cmd exited 0"
grep -q 'did you mean GHT_HBM_BUDGET' "$TMP/err" ||
  fail "GHT_HBM_BUDGT=1G ght $cmd: stderr does not suggest GHT_HBM_BUDGET: $(cat "$TMP/err")"

"$GHT" --set GHT_DEVICE=x config >/dev/null 2>"$TMP/err" && fail "--set GHT_DEVICE=x exited 0"
grep -q 'GHT_DEVICE=x' "$TMP/err" || fail "--set GHT_DEVICE=x: stderr does not name it: $(cat "$TMP/err")"

# ---- --json is valid JSON with one object per option ------------------------------------------
if ! "$GHT" config --json >"$TMP/json" 2>"$TMP/err"; then
  fail "'ght config --json' exited non-zero: $(cat "$TMP/err")"
elif ! python3 -m json.tool "$TMP/json" >/dev/null 2>"$TMP/err"; then
  fail "'ght config --json' is not valid JSON: $(cat "$TMP/err")"
else
  n_json=$(grep -c '"name":' "$TMP/json")
  [ "$n_json" -eq "$n_opts" ] || fail "'ght config --json' has $n_json objects, expected $n_opts"
fi

if [ "$failures" -ne 0 ]; then
  echo "config_test.sh: $failures failure(s)" >&2
  exit 1
fi
echo "config_test.sh: all checks passed ($n_opts options, errors checked with 'ght $cmd')"

#!/usr/bin/env bash
# CLI test for `ght prep`: the demo corpus, text and token-array inputs, and clear errors.
#   bash tests/cli/prep_test.sh <path-to-ght> <project-root>
set -u
GHT=${1:?usage: prep_test.sh <path-to-ght> <project-root>}
ROOT=${2:?usage: prep_test.sh <path-to-ght> <project-root>}
[ -x "$GHT" ] || { echo "FAIL: no ght executable at $GHT" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
checks=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  checks=$((checks + 1))
  "$@" || fail "$what"
}
int32_at() { od -An -t d4 -j "$2" -N 4 "$1" | tr -d ' '; }  # little-endian hosts only
u16_at() { od -An -t u2 -j "$2" -N 2 "$1" | tr -d ' '; }
size_of() { stat -c %s "$1"; }
# expect_fail NAME PATTERN CMD...: CMD must exit non-zero with PATTERN in its stderr.
expect_fail() {
  local name=$1 pattern=$2
  shift 2
  checks=$((checks + 1))
  if "$@" >"$TMP/out" 2>"$TMP/err"; then
    fail "$name: exited 0, expected an error"
  elif ! grep -qF -- "$pattern" "$TMP/err"; then
    fail "$name: error lacks '$pattern': $(cat "$TMP/err")"
  fi
}

# ---- the demo corpus -------------------------------------------------------------------------
corpus="$ROOT/data/austen"
check "demo corpus exists" test -d "$corpus"
bytes=0
docs=0
for f in "$corpus"/*.txt; do
  bytes=$((bytes + $(size_of "$f")))
  docs=$((docs + 1))
done
check "demo corpus is 1-5 MB (got $bytes)" test "$bytes" -ge 1000000 -a "$bytes" -le 5000000
if ! "$GHT" prep --input "$corpus" --out "$TMP/austen" >"$TMP/out" 2>"$TMP/err"; then
  fail "prep of the demo corpus failed: $(cat "$TMP/err")"
fi
tr="$TMP/austen/train_000000.bin"
va="$TMP/austen/val_000000.bin"
check "train shard written" test -f "$tr"
check "val shard written" test -f "$va"
check "prep.json written" test -f "$TMP/austen/prep.json"
check "magic 20240520" test "$(int32_at "$tr" 0)" = 20240520
check "version 1 (uint16)" test "$(int32_at "$tr" 4)" = 1
ntr=$(int32_at "$tr" 8)
nva=$(int32_at "$va" 8)
check "train size matches header" test "$(size_of "$tr")" = $((1024 + 2 * ntr))
check "val size matches header" test "$(size_of "$va")" = $((1024 + 2 * nva))
check "every byte plus one EOT per document ($((ntr + nva)) vs $((bytes + docs)))" test $((ntr + nva)) = $((bytes + docs))
check "val is about 10% ($nva of $((ntr + nva)))" test $((nva * 100 / (ntr + nva))) -ge 9 -a $((nva * 100 / (ntr + nva))) -le 10
check "the first token is EOT (0)" test "$(u16_at "$tr" 1024)" = 0
first=$(head -c 1 "$(ls "$corpus"/*.txt | head -n 1)" | od -An -t u1 | tr -d ' ')
check "the second token is the first byte of the first file" test "$(u16_at "$tr" 1026)" = "$first"
check "summary names the shards" grep -q "train_000000.bin" "$TMP/out"

# ---- small text input: shard rolling, uint32, no val ------------------------------------------
printf 'abcdefghij' >"$TMP/ten.txt"
if ! "$GHT" prep --input "$TMP/ten.txt" --out "$TMP/small" --shard-tokens 4 --val-fraction 0 --dtype uint32 >/dev/null 2>"$TMP/err"; then
  fail "small prep failed: $(cat "$TMP/err")"
fi
check "11 tokens in 4-token shards -> 3 train shards" test "$(ls "$TMP/small"/train_*.bin | wc -l)" = 3
check "no val shard with --val-fraction 0" test -z "$(ls "$TMP/small"/val_*.bin 2>/dev/null)"
check "uint32 shards are version 2" test "$(int32_at "$TMP/small/train_000000.bin" 4)" = 2
check "last shard holds 3 tokens" test "$(int32_at "$TMP/small/train_000002.bin" 8)" = 3

# ---- token arrays: .npy and raw ---------------------------------------------------------------
# A .npy (format 1.0) of <u2 values 1..6, as numpy writes it: magic, version, a little-endian
# uint16 header length, then the dict padded with spaces and '\n' to a multiple of 64 bytes.
hdr="{'descr': '<u2', 'fortran_order': False, 'shape': (6,), }"
total=$(((10 + ${#hdr} + 1 + 63) / 64 * 64))
pad=$((total - 10 - ${#hdr} - 1))
hlen=$((total - 10))
{
  printf '\x93NUMPY\x01\x00'
  printf "\\x$(printf %02x $((hlen % 256)))\\x$(printf %02x $((hlen / 256)))"
  printf '%s' "$hdr"
  printf '%*s' "$pad" ''
  printf '\n'
  printf '\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00\x06\x00'
} >"$TMP/tok.npy"
if ! "$GHT" prep --from-tokens "$TMP/tok.npy" --out "$TMP/npy" --val-fraction 0.5 >/dev/null 2>"$TMP/err"; then
  fail "npy prep failed: $(cat "$TMP/err")"
fi
check "npy: 3 train tokens" test "$(int32_at "$TMP/npy/train_000000.bin" 8)" = 3
check "npy: uint16 shards by default for <u2" test "$(int32_at "$TMP/npy/train_000000.bin" 4)" = 1
check "npy: val starts at the 4th value" test "$(u16_at "$TMP/npy/val_000000.bin" 1024)" = 4

printf '\x07\x00\x08\x00\x09\x00' >"$TMP/tok.u16"
expect_fail "raw without --dtype" "--dtype" "$GHT" prep --from-tokens "$TMP/tok.u16" --out "$TMP/raw"
if ! "$GHT" prep --from-tokens "$TMP/tok.u16" --dtype uint16 --out "$TMP/raw" --val-fraction 0 >/dev/null 2>"$TMP/err"; then
  fail "raw prep failed: $(cat "$TMP/err")"
fi
check "raw: 3 tokens" test "$(int32_at "$TMP/raw/train_000000.bin" 8)" = 3
check "raw: values kept" test "$(u16_at "$TMP/raw/train_000000.bin" 1028)" = 9

# ---- errors name the offending input ----------------------------------------------------------
expect_fail "missing input" "$TMP/nothere.txt" "$GHT" prep --input "$TMP/nothere.txt" --out "$TMP/e1"
printf 'ab\0cd' >"$TMP/nul.txt"
expect_fail "NUL byte" "$TMP/nul.txt: holds a NUL byte at offset 2" "$GHT" prep --input "$TMP/nul.txt" --out "$TMP/e2"
expect_fail "existing shards" "--overwrite" "$GHT" prep --input "$TMP/ten.txt" --out "$TMP/small"
checks=$((checks + 1))
"$GHT" prep --input "$TMP/ten.txt" --out "$TMP/small" --overwrite --quiet >/dev/null 2>&1 || fail "--overwrite did not replace"
expect_fail "bad val fraction" "--val-fraction" "$GHT" prep --input "$TMP/ten.txt" --out "$TMP/e3" --val-fraction 1.5
expect_fail "both modes" "either --input" "$GHT" prep --input "$TMP/ten.txt" --from-tokens "$TMP/tok.npy" --out "$TMP/e4"
expect_fail "bad dtype" "uint16 or uint32" "$GHT" prep --input "$TMP/ten.txt" --out "$TMP/e5" --dtype int8
printf '\x01\x00\x00\x01' >"$TMP/big.u16"  # values 1 and 256
expect_fail "token over --vocab" "token 1 has id 256" "$GHT" prep --from-tokens "$TMP/big.u16" --dtype uint16 --vocab 256 --out "$TMP/e6"
expect_fail "odd raw size" "not a multiple of 2" "$GHT" prep --from-tokens "$TMP/nul.txt" --dtype uint16 --out "$TMP/e7"
expect_fail "no --out" "--out" "$GHT" prep --input "$TMP/ten.txt"

if [ "$failures" -ne 0 ]; then
  echo "prep_test.sh: $failures of $checks checks failed" >&2
  exit 1
fi
echo "prep_test.sh: all $checks checks passed"

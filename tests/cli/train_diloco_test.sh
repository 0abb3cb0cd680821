#!/usr/bin/env bash
# DiLoCo on the CPU backend (trainer/diloco.hpp), through `ght train` and `mpirun`.
#
# 1. Refusals that need no mpirun: a bad diloco value names its key. (DiLoCo on the CUDA
#    backend: tests/cli/train_nccl_test.sh.)
# 2. One process, H=1, outer lr 1, momentum 0 against data parallel (plain training). The inner
#    AdamW step is the same computation, so step 1's loss is bit-identical. The outer step then
#    sets θ = fl(θ_g − fl(θ_g − θ_l)): that is θ_l exactly where the fp32 pseudo-gradient
#    θ_g − θ_l is exact (Sterbenz: θ_l within a factor 2 of θ_g), and off by at most half an ulp
#    of the pseudo-gradient elsewhere (weights near zero that an update moves by more than their
#    size). So the runs are NOT bit-identical after step 1: parameters differ by ~2^-24 of one
#    update, which AdamW's normalised update passes on without amplifying (as in
#    train_dist_test.sh); seen: losses within 2e-8 relative over 8 steps. The bound is 1e-5, and
#    the final weights must agree within 1e-5 of the largest weight.
# 3. Two ranks, the same settings, against 2-rank data parallel: step 1 is identical (the same
#    weights, the mean of the same losses), step 2 differs by far more than rounding (seen
#    0.3%; checked > 1e-4): each worker's AdamW step normalises its own gradient, and the mean of
#    two AdamW updates is not the AdamW update of the mean gradient. The outer step's arithmetic
#    itself is checked against a reference in tests/trainer/mpi/diloco_mpi_test.cpp.
#    With bf16 pseudo-gradients the outer records' allreduce_bytes are half of fp32's.
# 4. Exact resume on 2 ranks, H=3, 8 steps: stopped at step 4 (inside the window 4..6, where the
#    ranks' weights differ), resumed: steps 5-8 and the outer records are bit-identical, and so
#    are the final checkpoint's weights, momentum and both shards.
# 5. A checkpoint missing rank 1's shard, or with it corrupted, fails to load naming that file.
# 6. Resuming the 2-rank DiLoCo checkpoint on 1 or 4 ranks is refused, naming both counts.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
args=("${small_args[@]}" --data "$work/data" -o train.backend=cpu -o train.threads=1 -o train.log_every=1)
sync_args=(-o diloco.inner_steps=1 -o diloco.outer_lr=1 -o diloco.outer_momentum=0)

# 1. Refusals.
if "$ght" train "${args[@]}" --steps 2 --out "$work/bad" -o diloco.inner_steps=2 -o diloco.outer_lr=0 >"$work/bad.out" 2>&1; then
  fail "diloco.outer_lr=0 was accepted"
fi
grep -q "diloco.outer_lr must be in (0, 10]" "$work/bad.out" || { cat "$work/bad.out"; fail "bad outer_lr not named"; }

# 2. One process: DiLoCo(H=1, lr 1, momentum 0) against data parallel, within the bound.
"$ght" train "${args[@]}" --steps 8 --out "$work/dp1" >/dev/null
"$ght" train "${args[@]}" --steps 8 --out "$work/dl1" "${sync_args[@]}" >/dev/null
compare() { python3 "$root/tests/cli/compare_runs.py" "$@"; }
[ "$(losses_after "$work/dp1/log.jsonl" 0 | sed -n 1p)" = "$(losses_after "$work/dl1/log.jsonl" 0 | sed -n 1p)" ] \
  || fail "one-process DiLoCo(H=1, lr 1, momentum 0): step 1 differs from data parallel"
echo -n "1 process, H=1 lr 1 momentum 0 vs data parallel (step 1 identical): "
compare steps "$work/dp1" "$work/dl1" 1e-5 0 || fail "one-process DiLoCo(H=1, lr 1, momentum 0) is not data parallel within the bound"
echo -n "final weights: "
compare weights "$work/dp1/ckpt_00000008/model.safetensors" "$work/dl1/ckpt_00000008/model.safetensors" 1e-5 \
  || fail "one-process DiLoCo(H=1, lr 1, momentum 0): final weights beyond the bound"

mpirun=$(command -v mpirun || true)
if [ -z "$mpirun" ]; then
  echo "train_diloco_test: skipped: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
np() { local n=$1; shift; "$mpirun" -np "$n" --oversubscribe "$ght" train "$@"; }

# 3. Two ranks: not data parallel.
if ! np 2 "${args[@]}" --steps 3 --out "$work/dp2" >"$work/dp2.out" 2>&1; then
  if grep -q "this build has no MPI" "$work/dp2.out"; then
    echo "train_diloco_test: skipped: ght was built without MPI (install libopenmpi-dev and reconfigure)"
    exit 0
  fi
  cat "$work/dp2.out"
  fail "mpirun -np 2 ght train failed"
fi
np 2 "${args[@]}" --steps 3 --out "$work/dl2" "${sync_args[@]}" >"$work/dl2.out" 2>&1 || { cat "$work/dl2.out"; fail "2-rank DiLoCo failed"; }
python3 - "$work/dp2/log.jsonl" "$work/dl2/log.jsonl" <<'PY' || fail "2-rank DiLoCo(H=1, lr 1, momentum 0) against data parallel"
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "step"] for p in sys.argv[1:])
assert a[0] == b[0], ("step 1", a[0], b[0])
rel = abs(a[1] - b[1]) / a[1]
assert rel > 1e-4, f"step 2 differs by only {rel:.1e}: are the gradients still all-reduced?"
print(f"2 ranks, H=1 lr 1 momentum 0 vs data parallel: step 1 identical, step 2 differs by {rel:.1e} (AdamW is not linear)")
PY
[ "$(grep -c '"type":"outer"' "$work/dl2/log.jsonl")" -eq 3 ] || fail "expected 3 outer records with H=1 over 3 steps"
np 2 "${args[@]}" --steps 3 --out "$work/dl2b" "${sync_args[@]}" -o diloco.bf16_pseudo_grads=true >"$work/dl2b.out" 2>&1 \
  || { cat "$work/dl2b.out"; fail "2-rank DiLoCo with bf16 pseudo-gradients failed"; }
python3 - "$work/dl2/log.jsonl" "$work/dl2b/log.jsonl" <<'PY' || fail "bf16 pseudo-gradients do not halve the all-reduce's bytes"
import json, sys
a, b = ([r["allreduce_bytes"] for r in map(json.loads, open(p)) if r.get("type") == "outer"] for p in sys.argv[1:])
assert len(a) == len(b) == 3 and all(x == 2 * y > 0 for x, y in zip(a, b)), (a, b)
print(f"bf16 pseudo-gradients: {b[0]} bytes per rank per outer all-reduce, fp32 {a[0]}")
PY

# 4. Exact resume on 2 ranks from inside a window.
h3=("${args[@]}" --steps 8 -o diloco.inner_steps=3)
np 2 "${h3[@]}" --out "$work/full" >/dev/null 2>&1 || fail "2-rank DiLoCo H=3 failed"
np 2 "${h3[@]}" --out "$work/part" --stop-at 4 >/dev/null 2>&1 || fail "2-rank DiLoCo with --stop-at 4 failed"
np 2 "${h3[@]}" --out "$work/part" --resume auto >"$work/resume.out" 2>&1 || { cat "$work/resume.out"; fail "2-rank DiLoCo resume failed"; }
grep -q "resumed from .*ckpt_00000004 at step 4" "$work/resume.out" || { cat "$work/resume.out"; fail "did not resume from step 4"; }
a=$(losses_after "$work/full/log.jsonl" 4)
b=$(losses_after "$work/part/log.jsonl" 4)
[ "$(echo "$a" | wc -l)" -eq 4 ] || fail "expected 4 steps after step 4"
[ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b"); fail "losses after a mid-window resume are not bit-identical"; }
outer() { grep '"type":"outer"' "$1" | sed 's/,"seconds".*//'; }  # timings differ
[ "$(outer "$work/full/log.jsonl")" = "$(outer "$work/part/log.jsonl")" ] || fail "outer records differ after resume"
for f in model.safetensors diloco.momentum.safetensors diloco.rank_00000.safetensors diloco.rank_00001.safetensors; do
  cmp -s "$work/full/ckpt_00000008/$f" "$work/part/ckpt_00000008/$f" || fail "$f differs after the resume"
done
echo "2-rank resume from step 4 (inside the window 4..6): steps 5-8, outer steps and the final checkpoint bit-identical"

# 5. A missing or corrupted shard is named.
cp -r "$work/part/ckpt_00000004" "$work/ck_missing"
rm "$work/ck_missing/diloco.rank_00001.safetensors"
if np 2 "${h3[@]}" --out "$work/m" --resume "$work/ck_missing" >"$work/missing.out" 2>&1; then fail "a checkpoint without rank 1's shard loaded"; fi
grep -q "ck_missing/diloco.rank_00001.safetensors: missing" "$work/missing.out" || { cat "$work/missing.out"; fail "the missing shard is not named"; }
cp -r "$work/part/ckpt_00000004" "$work/ck_bad"
printf 'X' | dd of="$work/ck_bad/diloco.rank_00001.safetensors" bs=1 seek=200 conv=notrunc 2>/dev/null
if np 2 "${h3[@]}" --out "$work/c" --resume "$work/ck_bad" >"$work/bad.out" 2>&1; then fail "a corrupted shard loaded"; fi
grep -q "ck_bad/diloco.rank_00001.safetensors: checksum mismatch" "$work/bad.out" || { cat "$work/bad.out"; fail "the corrupted shard is not named"; }
echo "missing shard: $(grep -o 'checkpoint [^ ]*: missing' "$work/missing.out" | head -1)"

# 6. Another rank count is refused.
if "$ght" train "${h3[@]}" --out "$work/one" --resume "$work/part/ckpt_00000004" >"$work/one.out" 2>&1; then fail "1 rank resumed a 2-rank DiLoCo checkpoint"; fi
grep -q "inner states of 2 ranks, but this run has 1" "$work/one.out" || { cat "$work/one.out"; fail "1-rank refusal does not name both counts"; }
if np 4 "${h3[@]}" --out "$work/four" --resume "$work/part/ckpt_00000004" >"$work/four.out" 2>&1; then fail "4 ranks resumed a 2-rank DiLoCo checkpoint"; fi
grep -q "inner states of 2 ranks, but this run has 4" "$work/four.out" || { cat "$work/four.out"; fail "4-rank refusal does not name both counts"; }
echo "another rank count: $(grep -o 'holds the DiLoCo inner states of 2 ranks, but this run has 1' "$work/one.out" | head -1)"

#!/usr/bin/env bash
# ZeRO-1 (trainer/zero.hpp: dist.optimizer_state=sharded, the default with N > 1 ranks) on the CPU
# backend, through `mpirun ght train`.
#
# 1. Refusals that need no mpirun: a bad dist.optimizer_state names the key.
# 2. 2 ranks sharded vs replicated over 5 steps: the same micro-batches, the same arithmetic per
#    element; MPI's two-operand sums are exact in any order, only the double Σg² of the clip
#    coefficient is added in another order (tests/trainer/mpi/zero_mpi_test.cpp). Bound: 1e-6
#    relative on losses and grad norms, 1e-6 of the largest weight on the final weights (seen:
#    bit-identical). The checkpoint holds one zero.rank file per rank and optimizer.json says so.
# 3. Exact resume on 2 ranks: stop at 3, resume: steps 4-5 and the final checkpoint's files are
#    bit-identical to the uninterrupted run's.
# 4. Resharding: the 2-rank sharded checkpoint of step 3 resumed on 1 process and on 4 ranks
#    against the 2-rank replicated checkpoint of step 3 resumed the same way (the old, replicated
#    path): losses within the bound of 2.; a warning says the state was resharded.
# 5. A missing or corrupted shard fails the load naming the file.
# 6. `ght export --hf` of the 2-rank sharded checkpoint writes the whole model: every tensor,
#    within the bound of 2. of the replicated run's export.
# 7. GHT_OPT_DELAY=1 with sharded state is refused, naming dist.optimizer_state.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
args=("${small_args[@]}" --data "$work/data" --steps 5 -o train.backend=cpu -o train.threads=1 -o train.log_every=1
      -o model.grad_accum=1)

# 1.
if "$ght" train "${args[@]}" --out "$work/bad" -o dist.optimizer_state=zero3 >"$work/bad.out" 2>&1; then
  fail "dist.optimizer_state=zero3 was accepted"
fi
grep -q "dist.optimizer_state must be sharded or replicated, got 'zero3'" "$work/bad.out" || { cat "$work/bad.out"; fail "bad dist.optimizer_state not named"; }

mpirun=$(command -v mpirun || true)
if [ -z "$mpirun" ]; then
  echo "train_zero_test: skipped: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
np() { local n=$1; shift; "$mpirun" -np "$n" --oversubscribe "$ght" train "$@"; }
sharded=(-o dist.optimizer_state=sharded)
replicated=(-o dist.optimizer_state=replicated)

# 2.
if ! np 2 "${args[@]}" --out "$work/z" >"$work/z.out" 2>&1; then
  if grep -q "this build has no MPI" "$work/z.out"; then
    echo "train_zero_test: skipped: ght was built without MPI (install libopenmpi-dev and reconfigure)"
    exit 0
  fi
  cat "$work/z.out"
  fail "mpirun -np 2 ght train (sharded) failed"
fi
grep -q "AdamW state sharded (ZeRO-1: this rank holds" "$work/z.out" || { cat "$work/z.out"; fail "the run does not say it shards"; }
np 2 "${args[@]}" --out "$work/r" "${replicated[@]}" >"$work/r.out" 2>&1 || { cat "$work/r.out"; fail "replicated run failed"; }
compare() { python3 "$root/tests/cli/compare_runs.py" "$@"; }
compare steps "$work/z" "$work/r" 1e-6 0 || fail "sharded and replicated 2-rank runs differ"
compare weights "$work/z/ckpt_00000005/model.safetensors" "$work/r/ckpt_00000005/model.safetensors" 1e-6 \
  || fail "sharded and replicated final weights differ"
for f in zero.rank_00000.safetensors zero.rank_00001.safetensors; do
  [ -f "$work/z/ckpt_00000005/$f" ] || fail "the sharded checkpoint has no $f"
done
grep -q '"zero_ranks": 2' "$work/z/ckpt_00000005/optimizer.json" || fail "optimizer.json does not record 2 ZeRO ranks"
[ ! -f "$work/r/ckpt_00000005/zero.rank_00000.safetensors" ] || fail "the replicated checkpoint has a zero shard"

# 3.
np 2 "${args[@]}" --out "$work/part" --stop-at 3 >/dev/null 2>&1 || fail "sharded --stop-at 3 failed"
np 2 "${args[@]}" --out "$work/part" --resume auto >"$work/resume.out" 2>&1 || { cat "$work/resume.out"; fail "sharded resume failed"; }
grep -q "resumed from .*ckpt_00000003 at step 3" "$work/resume.out" || { cat "$work/resume.out"; fail "did not resume from step 3"; }
[ "$(losses_after "$work/z/log.jsonl" 3)" = "$(losses_after "$work/part/log.jsonl" 3)" ] || fail "losses after the resume are not bit-identical"
for f in model.safetensors zero.rank_00000.safetensors zero.rank_00001.safetensors; do
  cmp -s "$work/z/ckpt_00000005/$f" "$work/part/ckpt_00000005/$f" || fail "$f differs after the resume"
done
echo "2-rank sharded resume from step 3: steps 4-5 and the final checkpoint bit-identical"

# 4. Resharding onto 1 and 4 ranks, against the replicated checkpoint resumed the same way.
np 2 "${args[@]}" --out "$work/rpart" "${replicated[@]}" --stop-at 3 >/dev/null 2>&1 || fail "replicated --stop-at 3 failed"
"$ght" train "${args[@]}" --out "$work/one_z" --resume "$work/part/ckpt_00000003" >"$work/one_z.out" 2>&1 \
  || { cat "$work/one_z.out"; fail "1 process did not resume the 2-rank sharded checkpoint"; }
grep -q "written by 2 process(es), this run has 1 (optimizer state resharded)" "$work/one_z.out" || { cat "$work/one_z.out"; fail "no resharding warning"; }
"$ght" train "${args[@]}" --out "$work/one_r" --resume "$work/rpart/ckpt_00000003" >/dev/null 2>&1 || fail "1 process did not resume the replicated checkpoint"
compare steps "$work/one_z" "$work/one_r" 1e-6 3 || fail "2 sharded ranks -> 1 process differs from 2 replicated ranks -> 1 process"
np 4 "${args[@]}" --out "$work/four_z" --resume "$work/part/ckpt_00000003" >"$work/four_z.out" 2>&1 \
  || { cat "$work/four_z.out"; fail "4 ranks did not resume the 2-rank sharded checkpoint"; }
np 4 "${args[@]}" --out "$work/four_r" "${replicated[@]}" --resume "$work/rpart/ckpt_00000003" >/dev/null 2>&1 \
  || fail "4 replicated ranks did not resume the replicated checkpoint"
compare steps "$work/four_z" "$work/four_r" 1e-6 3 || fail "2 -> 4 sharded ranks differs from 2 -> 4 replicated"
[ -f "$work/four_z/ckpt_00000005/zero.rank_00003.safetensors" ] || fail "the 4-rank checkpoint has no rank 3 shard"
echo "resharded 2 -> 1 and 2 -> 4 ranks: the same steps as the replicated checkpoint resumed alike"

# 5.
cp -r "$work/part/ckpt_00000003" "$work/ck_missing"
rm "$work/ck_missing/zero.rank_00001.safetensors"
if np 2 "${args[@]}" --out "$work/m" --resume "$work/ck_missing" >"$work/missing.out" 2>&1; then fail "a checkpoint without rank 1's shard loaded"; fi
grep -q "ck_missing/zero.rank_00001.safetensors: missing" "$work/missing.out" || { cat "$work/missing.out"; fail "the missing shard is not named"; }
cp -r "$work/part/ckpt_00000003" "$work/ck_bad"
printf 'X' | dd of="$work/ck_bad/zero.rank_00001.safetensors" bs=1 seek=300 conv=notrunc 2>/dev/null
if "$ght" train "${args[@]}" --out "$work/c" --resume "$work/ck_bad" >"$work/corrupt.out" 2>&1; then fail "a corrupted shard loaded"; fi
grep -q "ck_bad/zero.rank_00001.safetensors: checksum mismatch" "$work/corrupt.out" || { cat "$work/corrupt.out"; fail "the corrupted shard is not named"; }
echo "missing shard: $(grep -o 'checkpoint [^ ]*: missing' "$work/missing.out" | head -1)"

# 6.
"$ght" export --hf "$work/hf_z" --ckpt "$work/z/ckpt_00000005" >/dev/null || fail "export of the sharded checkpoint failed"
"$ght" export --hf "$work/hf_r" --ckpt "$work/r/ckpt_00000005" >/dev/null || fail "export of the replicated checkpoint failed"
echo -n "export --hf of the 2-rank sharded checkpoint against the replicated run's: "
compare weights "$work/hf_z/model.safetensors" "$work/hf_r/model.safetensors" 1e-6 || fail "the export differs"

# 7.
if GHT_OPT_DELAY=1 np 2 "${args[@]}" --out "$work/delay" >"$work/delay.out" 2>&1; then fail "GHT_OPT_DELAY=1 with sharded state ran"; fi
grep -q "GHT_OPT_DELAY=1 with sharded optimizer state (dist.optimizer_state=sharded" "$work/delay.out" || { cat "$work/delay.out"; fail "the delayed refusal does not name dist.optimizer_state"; }
echo "GHT_OPT_DELAY=1 with sharded state: refused naming dist.optimizer_state"

#!/usr/bin/env bash
# Data parallel on the CPU backend through `mpirun -np 2`, and launch errors. The backend is
# named (cpu), so that on a machine with a GPU the runs stay on the data-parallel path.
#
# 1. A bad launch environment (WORLD_SIZE=2 RANK=3) is refused before anything runs, naming RANK.
#    (The CUDA backend's launches of several processes: train_nccl_test.sh.)
# 2. 2 ranks x 1 micro-batch equal 1 rank x 2 micro-batches over 5 steps: the same data in the
#    same order, the same loss scaling. Only the order of the gradient sums differs: one rank adds
#    micro-batch 2's per-token contributions into a buffer that already holds micro-batch 1's, two
#    ranks add two separately accumulated buffers. That moves gradients by about one fp32 ulp
#    (~6e-8 relative); AdamW's normalised update passes such relative differences through without
#    amplifying them (away from eps), so after 5 steps losses and grad norms differ by ~1e-8 (seen:
#    < 2e-8). The bound is 1e-5 relative: 500x that, and far below what a wrong share of the data
#    or a wrong 1/(N*A) scale moves (the step-1 loss or grad norm by whole percent).
# 3. Only rank 0 writes: one log.jsonl with 5 step records, one "done:" line.
# 4. Resume on 2 ranks: stop at step 3, --resume auto; steps 4-5 are bit-identical to the
#    uninterrupted 2-rank run.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
args=("${small_args[@]}" --data "$work/data" --steps 5 -o train.backend=cpu -o train.threads=1 -o train.eval_every=5 -o train.log_every=1)

# 1. Launch errors need no mpirun.
if WORLD_SIZE=2 RANK=3 MASTER_ADDR=localhost MASTER_PORT=29500 "$ght" train "${args[@]}" --out "$work/bad" \
    >"$work/bad.out" 2>&1; then
  fail "WORLD_SIZE=2 RANK=3 was accepted"
fi
grep -q "RANK=3 is not below WORLD_SIZE=2" "$work/bad.out" || { cat "$work/bad.out"; fail "error does not name RANK and WORLD_SIZE"; }
echo "launch error: $(grep -o 'RANK=3 is not below WORLD_SIZE=2[^(]*' "$work/bad.out" | head -1)"

mpirun=$(command -v mpirun || true)
if [ -z "$mpirun" ]; then
  echo "train_dist_test: skipped: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
np2() { "$mpirun" -np 2 --oversubscribe "$ght" train "$@"; }

"$ght" train "${args[@]}" --out "$work/one" -o model.grad_accum=2 >/dev/null
if ! np2 "${args[@]}" --out "$work/two" -o model.grad_accum=1 >"$work/two.out" 2>&1; then
  if grep -q "this build has no MPI" "$work/two.out"; then
    echo "train_dist_test: skipped: ght was built without MPI (install libopenmpi-dev and reconfigure)"
    exit 0
  fi
  cat "$work/two.out"
  fail "mpirun -np 2 ght train failed"
fi

# 2. Equal within the bound.
python3 - "$work/one/log.jsonl" "$work/two/log.jsonl" <<'PY' || fail "2 ranks differ from 1 rank with 2x the micro-batches"
import json, sys
def recs(p, t):
    return [r for r in map(json.loads, open(p)) if r.get("type") == t]
one, two = recs(sys.argv[1], "step"), recs(sys.argv[2], "step")
assert len(one) == len(two) == 5, (len(one), len(two))
bound, worst = 1e-5, 0.0
for a, b in zip(one, two):
    for k in ("loss", "grad_norm", "aux_loss"):
        rel = abs(a[k] - b[k]) / abs(a[k])
        worst = max(worst, rel)
        if rel > bound:
            sys.exit(f"step {a['step']} {k}: 1 rank {a[k]!r}, 2 ranks {b[k]!r}, relative {rel:.2e} > {bound}")
e1, e2 = recs(sys.argv[1], "eval")[-1]["eval_loss"], recs(sys.argv[2], "eval")[-1]["eval_loss"]
if abs(e1 - e2) / e1 > bound:
    sys.exit(f"eval loss: 1 rank {e1!r}, 2 ranks {e2!r}")
print(f"2 ranks x 1 micro-batch = 1 rank x 2 over 5 steps: worst relative difference {worst:.1e} (bound {bound})")
PY

# 3. Rank 0 alone writes and reports.
[ "$(grep -c '"type":"step"' "$work/two/log.jsonl")" -eq 5 ] || fail "log.jsonl holds $(grep -c '"type":"step"' "$work/two/log.jsonl") step records, not 5"
[ "$(grep -c '^done:' "$work/two.out")" -eq 1 ] || { cat "$work/two.out"; fail "expected one 'done:' line"; }
[ -f "$work/two/ckpt_00000005/COMMITTED" ] || fail "no checkpoint at step 5"

# 4. Resume on the same 2 ranks.
np2 "${args[@]}" --out "$work/resumed" -o model.grad_accum=1 --stop-at 3 >/dev/null 2>&1 || fail "2 ranks with --stop-at 3 failed"
np2 "${args[@]}" --out "$work/resumed" -o model.grad_accum=1 --resume auto >"$work/resume.out" 2>&1 \
  || { cat "$work/resume.out"; fail "2-rank resume failed"; }
grep -q "resumed from .*ckpt_00000003 at step 3" "$work/resume.out" || { cat "$work/resume.out"; fail "did not resume from step 3"; }
a=$(losses_after "$work/two/log.jsonl" 3)
b=$(losses_after "$work/resumed/log.jsonl" 3)
[ "$(echo "$a" | wc -l)" -eq 2 ] || fail "expected 2 steps after step 3"
[ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b"); fail "2-rank losses after resume are not bit-identical"; }
echo "2-rank resume from step 3: steps 4-5 bit-identical"

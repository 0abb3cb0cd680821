#!/usr/bin/env bash
# Data parallel on the CUDA backend over NCCL (trainer/dist/gpu_comm.hpp, trainer/cuda/train_cuda.hpp):
# `mpirun -np 2 ght train`.
#
# 1. Refusals that need neither a GPU nor mpirun: a torchrun-style launch of 2 processes with
#    train.backend=cuda of which only rank 0 starts fails: in a build with NCCL at the TCP store's
#    deadline (GHT_DIST_TIMEOUT=5), naming rank 1 and the address (without a GPU: naming the
#    missing device first), in one without NCCL because it has none (the CUDA backend runs as
#    one process). The CPU backend's torchrun-style refusal (use mpirun) is
#    tests/trainer/dist_comm_test.cpp.
# 2. With NCCL, mpirun and one GPU or more: two ranks on one GPU are refused (GHT_DEVICE=0 on
#    both: the message names GHT_DEVICE, LOCAL_RANK and CUDA_VISIBLE_DEVICES), and so are more
#    ranks on a node than visible GPUs (CUDA_VISIBLE_DEVICES=0: the message names the local-rank
#    variable). DiLoCo on one GPU with H=1, outer lr 1, momentum 0 against plain training: the
#    outer step gives θ = θ_local up to the rounding of the fp32 pseudo-gradient
#    (train_diloco_test.sh), so within the CUDA backend's run-to-run bounds (below: 1e-3 relative
#    on losses, 1e-2 on grad norms).
# 3. With two GPUs or more: 2 GPUs x 1 micro-batch against 1 GPU x 2 micro-batches over 5 steps
#    of the tiny preset: the same data in the same order and the same 1/(N·A) gradient scale, so
#    only the order of the gradient sums differs (NCCL's average of two fp32 buffers against one
#    buffer accumulating both micro-batches) plus the CUDA backend's own run-to-run variation
#    (cuDNN's atomic dQ accumulation: tests/trainer/cuda_model_test.cu compares a resumed run
#    within 1e-3 relative). Bitwise equality is not expected. Bounds: losses (and the final eval
#    loss) within 1e-3 relative, grad norms within 1e-2; a wrong share of the data (both ranks on
#    the same micro-batch) or a sum instead of the mean (2x the gradient) moves the grad norm by
#    far more. The bounds are not yet measured on two GPUs (there were none): if this fails by a
#    small margin, read the printed worst differences before widening them. The 2-GPU run shards
#    the optimizer state (ZeRO-1, the default); the same with replicated state is held to the
#    same bounds. Rank 0 alone writes: one log.jsonl with 5 step records, one "done:" line, the
#    checkpoint (one zero.rank file per rank).
#    The same 2-GPU run launched torchrun-style (scripts/torchrun_env.sh: RANK, WORLD_SIZE,
#    LOCAL_RANK, MASTER_ADDR, MASTER_PORT, no mpirun): NCCL set up through the TCP store, the host
#    collectives NCCL-staged; within the same bounds of the mpirun run; and DiLoCo H=2 the same
#    way (its outer all-reduce NCCL-staged) against the mpirun DiLoCo run. Not run on 2 GPUs yet.
# 4. With two GPUs: resume on 2 GPUs (stop at 3, resume) within those bounds of the uninterrupted run
#    (not bitwise: cuDNN's atomics); the 2-GPU checkpoint resumes on 1 GPU (resharded);
#    `ght export --hf` of it holds every tensor, within 1e-3 of the largest weight of the
#    replicated run's export; DiLoCo on 2 GPUs (H=2) runs, logs its outer steps and learns.
source "$(dirname "$0")/train_common.sh"
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
prep_corpus "$work/data"
base=("${small_args[@]}" --data "$work/data" -o train.backend=cuda -o train.log_every=1)
args=("${base[@]}" --steps 5 -o train.eval_every=5)

# 1. Refusals.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
if GHT_DIST_TIMEOUT=5 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ght" train "${args[@]}" \
    --out "$work/torchrun" >"$work/torchrun.out" 2>&1; then
  fail "train.backend=cuda with WORLD_SIZE=2 (torchrun-style) ran without rank 1"
fi
if grep -q "this build has no NCCL" "$work/torchrun.out"; then
  grep -q "CUDA backend runs as one process" "$work/torchrun.out" || { cat "$work/torchrun.out"; fail "no clear no-NCCL refusal"; }
  nccl=no
else
  grep -q -e "rank 1 of 2 never arrived within 5 s" -e "no CUDA device is visible" "$work/torchrun.out" \
    || { cat "$work/torchrun.out"; fail "a torchrun-style launch without rank 1: no clear error"; }
  if grep -q "never arrived" "$work/torchrun.out"; then
    grep -q "the store at 127.0.0.1:$port" "$work/torchrun.out" || { cat "$work/torchrun.out"; fail "the store's address is not named"; }
  fi
  nccl=yes
fi

[ "$nccl" = yes ] || { echo "train_nccl_test: skipped: ght was built without NCCL (scripts/install-deps.sh, GHT_NCCL_DIR)"; exit 0; }
mpirun=$(command -v mpirun || true)
if [ -z "$mpirun" ]; then
  echo "train_nccl_test: skipped: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  exit 0
fi
gpus=$("$ght" info --json 2>/dev/null | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["topology"]["gpus"]))' || echo 0)
if [ "$gpus" -lt 1 ]; then
  echo "train_nccl_test: skipped: no CUDA device (ght info shows none)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
np2() { "$mpirun" -np 2 --oversubscribe "$@"; }

# 2. Two ranks on one GPU; more ranks than GPUs. mpirun ends the job when the failing rank exits;
#    should it not, the other rank's wait in the GPU check ends at GHT_DIST_TIMEOUT (60 s here).
if np2 -x GHT_DIST_TIMEOUT=60 -x GHT_DEVICE=0 "$ght" train "${args[@]}" --out "$work/same" >"$work/same.out" 2>&1; then
  fail "two ranks with GHT_DEVICE=0 were accepted"
fi
grep -q "ranks 0 and 1 both use the GPU" "$work/same.out" || { cat "$work/same.out"; fail "two ranks on one GPU: no clear error"; }
for v in GHT_DEVICE LOCAL_RANK CUDA_VISIBLE_DEVICES; do
  grep "both use the GPU" "$work/same.out" | grep -q "$v" || fail "the one-GPU error does not name $v"
done
if np2 -x GHT_DIST_TIMEOUT=60 -x CUDA_VISIBLE_DEVICES=0 "$ght" train "${args[@]}" --out "$work/over" >"$work/over.out" 2>&1; then
  fail "two ranks with one visible GPU were accepted"
fi
grep -q "OMPI_COMM_WORLD_LOCAL_RANK=1.*only 1 CUDA device(s) (CUDA_VISIBLE_DEVICES=0" "$work/over.out" \
  || { cat "$work/over.out"; fail "more ranks than GPUs: no clear error"; }
echo "refused: two ranks on one GPU, and two ranks with one visible GPU"

compare() { python3 "$root/tests/cli/compare_runs.py" "$@"; }
"$ght" train "${args[@]}" --out "$work/plain1" >/dev/null 2>&1 || fail "1-GPU plain run failed"
"$ght" train "${args[@]}" --out "$work/diloco1" -o diloco.inner_steps=1 -o diloco.outer_lr=1 -o diloco.outer_momentum=0 \
  >"$work/diloco1.out" 2>&1 || { cat "$work/diloco1.out"; fail "1-GPU DiLoCo failed"; }
compare steps "$work/plain1" "$work/diloco1" 1e-3 0 1e-2 || fail "1-GPU DiLoCo(H=1, lr 1, momentum 0) is not plain training within 1e-3"
[ "$(grep -c '"type":"outer"' "$work/diloco1/log.jsonl")" -eq 5 ] || fail "expected 5 outer records from 1-GPU DiLoCo H=1"

if [ "$gpus" -lt 2 ]; then
  echo "train_nccl_test: skipped: $gpus CUDA device(s); data parallel over NCCL needs 2 (the refusals above ran)"
  exit 0
fi

# 3. 2 GPUs x 1 micro-batch against 1 GPU x 2.
"$ght" train "${args[@]}" --out "$work/one" -o model.grad_accum=2 >"$work/one.out" 2>&1 || { cat "$work/one.out"; fail "1 GPU failed"; }
np2 "$ght" train "${args[@]}" --out "$work/two" -o model.grad_accum=1 >"$work/two.out" 2>&1 \
  || { cat "$work/two.out"; fail "mpirun -np 2 ght train (cuda) failed"; }
grep -q "data parallel over 2 processes (nccl" "$work/two.out" || { cat "$work/two.out"; fail "no data-parallel line"; }
python3 - "$work/one/log.jsonl" "$work/two/log.jsonl" <<'PY' || fail "2 GPUs differ from 1 GPU with 2x the micro-batches"
import json, sys
def recs(p, t):
    return [r for r in map(json.loads, open(p)) if r.get("type") == t]
one, two = recs(sys.argv[1], "step"), recs(sys.argv[2], "step")
assert len(one) == len(two) == 5, (len(one), len(two))
bounds = {"loss": 1e-3, "grad_norm": 1e-2}
worst = {k: 0.0 for k in bounds}
bad = []
for a, b in zip(one, two):
    for k, bound in bounds.items():
        rel = abs(a[k] - b[k]) / abs(a[k])
        worst[k] = max(worst[k], rel)
        if rel > bound:
            bad.append(f"step {a['step']} {k}: 1 GPU {a[k]!r}, 2 GPUs {b[k]!r}, relative {rel:.2e} > {bound}")
e1, e2 = recs(sys.argv[1], "eval")[-1]["eval_loss"], recs(sys.argv[2], "eval")[-1]["eval_loss"]
if abs(e1 - e2) / e1 > 1e-3:
    bad.append(f"eval loss: 1 GPU {e1!r}, 2 GPUs {e2!r}")
print("2 GPUs x 1 micro-batch vs 1 GPU x 2 over 5 steps: worst relative difference " +
      ", ".join(f"{k} {v:.1e} (bound {bounds[k]})" for k, v in worst.items()) +
      f", eval {abs(e1 - e2) / e1:.1e} (bound 1e-3)")
if bad:
    sys.exit("\n".join(bad))
PY
[ "$(grep -c '"type":"step"' "$work/two/log.jsonl")" -eq 5 ] || fail "log.jsonl holds $(grep -c '"type":"step"' "$work/two/log.jsonl") step records, not 5"
[ "$(grep -c '^done:' "$work/two.out")" -eq 1 ] || { cat "$work/two.out"; fail "expected one 'done:' line"; }
[ -f "$work/two/ckpt_00000005/COMMITTED" ] || fail "no checkpoint at step 5"
[ -f "$work/two/ckpt_00000005/zero.rank_00001.safetensors" ] || fail "the 2-GPU checkpoint has no rank 1 shard"
"$root/scripts/torchrun_env.sh" --nproc 2 -- "$ght" train "${args[@]}" --out "$work/two_t" -o model.grad_accum=1 \
  >"$work/two_t.out" 2>&1 || { cat "$work/two_t.out"; fail "the torchrun-style 2-GPU launch failed"; }
grep -q "set up over nccl-staged" "$work/two_t.out" || { cat "$work/two_t.out"; fail "torchrun-style: no NCCL-staged host communicator"; }
echo -n "2 GPUs launched torchrun-style against mpirun: "
compare steps "$work/two" "$work/two_t" 1e-3 0 1e-2 || fail "2 GPUs torchrun-style vs mpirun"
np2 "$ght" train "${args[@]}" --out "$work/two_r" -o model.grad_accum=1 -o dist.optimizer_state=replicated \
  >"$work/two_r.out" 2>&1 || { cat "$work/two_r.out"; fail "2 GPUs with replicated state failed"; }
compare steps "$work/two" "$work/two_r" 1e-3 0 1e-2 || fail "2 GPUs sharded vs replicated"

# 4. Resume, reshard, export, DiLoCo on 2 GPUs.
np2 "$ght" train "${args[@]}" --out "$work/part" -o model.grad_accum=1 --stop-at 3 >/dev/null 2>&1 || fail "2 GPUs --stop-at 3 failed"
np2 "$ght" train "${args[@]}" --out "$work/part" -o model.grad_accum=1 --resume auto >"$work/resume.out" 2>&1 \
  || { cat "$work/resume.out"; fail "2-GPU resume failed"; }
grep -q "resumed from .*ckpt_00000003 at step 3" "$work/resume.out" || { cat "$work/resume.out"; fail "did not resume from step 3"; }
compare steps "$work/two" "$work/part" 1e-3 3 1e-2 || fail "2-GPU resume is not within the bound"
"$ght" train "${args[@]}" --out "$work/one_from_two" -o model.grad_accum=1 --resume "$work/part/ckpt_00000003" \
  >"$work/one_from_two.out" 2>&1 || { cat "$work/one_from_two.out"; fail "1 GPU did not resume the 2-GPU checkpoint"; }
grep -q "optimizer state resharded" "$work/one_from_two.out" || fail "no resharding warning on 1 GPU"
"$ght" export --hf "$work/hf_two" --ckpt "$work/two/ckpt_00000005" >/dev/null || fail "export of the 2-GPU checkpoint failed"
"$ght" export --hf "$work/hf_two_r" --ckpt "$work/two_r/ckpt_00000005" >/dev/null || fail "export of the replicated checkpoint failed"
echo -n "export --hf of the 2-GPU sharded checkpoint against the replicated run's: "
compare weights "$work/hf_two/model.safetensors" "$work/hf_two_r/model.safetensors" 1e-3 || fail "the 2-GPU export"
np2 "$ght" train "${base[@]}" --steps 8 --out "$work/diloco2" -o model.grad_accum=1 -o diloco.inner_steps=2 \
  -o train.eval_every=4 >"$work/diloco2.out" 2>&1 || { cat "$work/diloco2.out"; fail "2-GPU DiLoCo failed"; }
[ "$(grep -c '"type":"outer"' "$work/diloco2/log.jsonl")" -eq 4 ] || fail "expected 4 outer records from 2-GPU DiLoCo H=2 over 8 steps"
python3 - "$work/diloco2/log.jsonl" <<'PY' || fail "2-GPU DiLoCo does not learn"
import json, sys
l = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
assert l[-1] < l[0], l
print(f"2-GPU DiLoCo H=2: loss {l[0]:.3f} -> {l[-1]:.3f} over {len(l)} steps")
PY
# DiLoCo launched torchrun-style: the outer all-reduce goes through NCCL (staged) instead of MPI.
"$root/scripts/torchrun_env.sh" --nproc 2 -- "$ght" train "${base[@]}" --steps 8 --out "$work/diloco2t" -o model.grad_accum=1 \
  -o diloco.inner_steps=2 -o train.eval_every=4 >"$work/diloco2t.out" 2>&1 \
  || { cat "$work/diloco2t.out"; fail "2-GPU DiLoCo launched torchrun-style failed"; }
[ "$(grep -c '"type":"outer"' "$work/diloco2t/log.jsonl")" -eq 4 ] || fail "expected 4 outer records from torchrun-style DiLoCo"
echo -n "2-GPU DiLoCo torchrun-style against mpirun: "
compare steps "$work/diloco2" "$work/diloco2t" 1e-3 0 1e-2 || fail "torchrun-style 2-GPU DiLoCo vs mpirun"

#!/usr/bin/env bash
# The multi-GPU benchmark of issue 17, in one call on a machine with N >= 2 GPUs:
#
#   bench/dist/multi_gpu.sh [--gpus N] [--parts check,scale,diloco,loss] [--out DIR] [--ght BIN]
#                           [--launcher mpirun|torchrun]
#   bench/dist/multi_gpu.sh --dry-run       # here, without GPUs: the CPU backend, tiny models, 2 ranks
#
# --launcher torchrun starts the N-rank runs with torchrun's environment instead of mpirun
# (scripts/torchrun_env.sh: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; NCCL set up
# through the TCP store, the host collectives NCCL-staged). Not with --dry-run (the CPU backend's
# collectives need MPI). The check part runs tests/cli/train_nccl_test.sh either way (it launches
# both ways itself).
#
# Parts (each its own runs under $OUT, a markdown summary last: $OUT/summary.md, summary.json):
#   check   correctness: tests/cli/train_nccl_test.sh (2 GPUs x 1 micro-batch vs 1 GPU x 2 within
#           the stated bounds, sharded vs replicated state, 1-GPU DiLoCo H=1 / outer lr 1 /
#           momentum 0 vs plain training, 2-GPU DiLoCo, resume, resharding onto 1 GPU,
#           checkpoint then a consolidated `ght export --hf`); --dry-run: the CPU tests
#           train_zero_test.sh, train_dist_test.sh and train_diloco_test.sh.
#   scale   data-parallel scaling: configs/bench-h200.toml (5.85B) with 64 micro-batches of
#           1 x 4096 tokens per GPU (262,144 tokens per GPU and step; weak scaling: N GPUs take
#           N x as many per step), master/m/v on the host (GHT_PLACE=master=host,adam_*=host),
#           sharded over the ranks (ZeRO-1, the default): tokens/s on 1 and on N GPUs, the
#           efficiency tokens/s(N) / (N x tokens/s(1)), rank 0's host state bytes (every rank
#           holds the same share to within N x 16 parameters per unit), and from profile.json
#           the reduce-scatters' GPU time, the comm stream's busy time after the last backward
#           (exposed) and so the share hidden behind the backward, the all-gathers' GPU time
#           and the forward's wait for them.
#   diloco  DiLoCo's communication: bench-h200, 64 micro-batches per GPU, H=2 for 4 inner steps
#           on N GPUs (2 outer steps; the state in HBM, GHT_OPTIMIZER=device: a worker's whole
#           AdamW state plus DiLoCo's 3 host copies of the weights would not fit in host memory
#           twice), from log.jsonl: the outer step's seconds and its all-reduce's, the inner
#           step's; the share of communication at H=50 and H=500 is
#           t_outer / (H x t_inner + t_outer) from those measured times (500 real inner steps of
#           a 5.85B model do not fit in a call).
#   loss    `small` on the demo corpus (configs/small.toml, 300 steps) on N GPUs: data parallel
#           against DiLoCo (H=50, outer lr 0.7, momentum 0.9) at equal tokens (the same steps of
#           the same global batch): eval losses at steps 100, 200, 300.
#
# NCCL_NVLS_ENABLE and every other NCCL_* variable pass through as the machine sets them (printed
# in the summary). Knobs: SCALE_STEPS (5; the first is a warm-up), SCALE_ACCUM (64), DILOCO_STEPS
# (4), LOSS_STEPS (300), a per-run timeout RUN_TIMEOUT (420 s). Runtime on 2 H200s, predicted:
# check ~3 min, scale ~5 min (two 5.85B initialisations), diloco ~3 min, loss ~4 min: split the
# parts over calls of 10 minutes (--parts check,scale then --parts diloco,loss).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
ght=build/bin/ght
gpus=""
parts="check,scale,diloco,loss"
out=""
dry=0
launcher=mpirun
usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus=${2:?--gpus needs a number}; shift 2 ;;
    --parts) parts=${2:?--parts needs a list}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --ght) ght=${2:?--ght needs a path}; shift 2 ;;
    --launcher) launcher=${2:?--launcher needs mpirun or torchrun}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "multi_gpu.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
for p in ${parts//,/ }; do
  case "$p" in check|scale|diloco|loss) ;; *) echo "multi_gpu.sh: unknown part '$p' in --parts (check, scale, diloco, loss)" >&2; exit 2 ;; esac
done
want() { [[ ",$parts," == *",$1,"* ]]; }
case "$launcher" in
  mpirun) ;;
  torchrun) [ "$dry" -eq 0 ] || { echo "multi_gpu.sh: --launcher torchrun needs GPUs (the CPU backend's collectives go over MPI; --dry-run uses mpirun)" >&2; exit 2; } ;;
  *) echo "multi_gpu.sh: --launcher $launcher: mpirun or torchrun" >&2; exit 2 ;;
esac
[ -x "$ght" ] || { echo "multi_gpu.sh: $ght is not an executable (build it: scripts/build.sh --target ght, or --ght PATH)" >&2; exit 2; }
mpirun=$(command -v mpirun || true)
[ -n "$mpirun" ] || { echo "multi_gpu.sh: mpirun not found (scripts/install-deps.sh installs Open MPI)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

visible=$("$ght" info --json 2>/dev/null | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["topology"]["gpus"]))' 2>/dev/null || echo 0)
if [ "$dry" -eq 1 ]; then
  gpus=${gpus:-2}
  backend=cpu
  export OMPI_MCA_rmaps_base_oversubscribe=1
else
  gpus=${gpus:-$visible}
  backend=cuda
  if ! [[ "$gpus" =~ ^[0-9]+$ ]] || [ "$gpus" -lt 2 ]; then
    echo "multi_gpu.sh: needs 2 or more GPUs, this machine shows $visible (--gpus N; --dry-run checks the script without GPUs)" >&2
    exit 2
  fi
  [ "$gpus" -le "$visible" ] || { echo "multi_gpu.sh: --gpus $gpus but only $visible visible" >&2; exit 2; }
fi
[[ "$gpus" =~ ^[0-9]+$ ]] && [ "$gpus" -ge 2 ] || { echo "multi_gpu.sh: --gpus must be a number >= 2, got '$gpus'" >&2; exit 2; }
out=${out:-$root/build-gpu/multi-gpu/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
runs=$out/runs
mkdir -p "$runs"
limit=${RUN_TIMEOUT:-420}
note() { echo; echo "--- $* ($(date -u +%T))"; }
# run NAME CMD...: output to $out/NAME.log (and its tail on failure); status in $out/status.txt
run() {
  local name=$1; shift
  echo "+ $*" | tee "$out/$name.log"
  timeout "$limit" "$@" >>"$out/$name.log" 2>&1
  local rc=$?
  echo "$name $rc" >>"$out/status.txt"
  if [ "$rc" -ne 0 ]; then echo "FAIL: $name exited $rc"; tail -20 "$out/$name.log"; fi
  return "$rc"
}
mpi=("$mpirun" -np "$gpus")  # a command, so that `timeout` can run it
[ "$dry" -eq 1 ] && mpi+=(--oversubscribe)
[ "$launcher" = torchrun ] && mpi=("$root/scripts/torchrun_env.sh" --nproc "$gpus" --)
: >"$out/status.txt"

# The models and data of each part: the real ones, or --dry-run's tiny stand-ins on the CPU.
if [ "$dry" -eq 1 ]; then
  data=$out/data
  "$ght" prep --input data/austen --out "$data" --val-fraction 0.05 --quiet || exit 1
  big=(--model tiny --data "$data" -o train.backend=cpu -o train.threads=1 -o model.seq_len=32 -o model.micro_batch=2)
  accum=${SCALE_ACCUM:-2}
  small=(--model tiny --data "$data" -o train.backend=cpu -o train.threads=1 -o model.seq_len=64 -o model.micro_batch=4)
  loss_steps=${LOSS_STEPS:-30} loss_h=5 loss_eval=10
else
  note "data: random uint32 tokens for bench-h200, the demo corpus for small"
  bash bench/make_bench_data.sh "$ght" || exit 1
  [ -f build/data/demo/prep.json ] || "$ght" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet || exit 1
  big=(--config configs/bench-h200.toml --backend cuda)
  accum=${SCALE_ACCUM:-64}
  small=(--config configs/small.toml --backend cuda)
  loss_steps=${LOSS_STEPS:-300} loss_h=50 loss_eval=100
fi
scale_steps=${SCALE_STEPS:-5}
diloco_steps=${DILOCO_STEPS:-4}

# ---- check ----------------------------------------------------------------------------------
if want check; then
  note "check: correctness on $gpus ranks ($backend)"
  if [ "$dry" -eq 1 ]; then
    for t in train_zero_test train_dist_test train_diloco_test; do run "check_$t" bash "tests/cli/$t.sh" "$ght" "$root"; done
  else
    run check_train_nccl_test bash tests/cli/train_nccl_test.sh "$ght" "$root"
  fi
fi

# ---- scale ----------------------------------------------------------------------------------
if want scale; then
  note "scale: 1 and $gpus ranks, $accum micro-batches per rank, state on the host, sharded"
  (
    export GHT_SAVE_CHECKPOINTS=off GHT_PLACE="master=host,adam_*=host"
    common=("${big[@]}" --steps "$scale_steps" --profile-steps "$scale_steps" -o model.grad_accum="$accum" -o train.eval_every=0)
    run scale_1 "$ght" train "${common[@]}" --out "$runs/scale-1"
    run scale_n "${mpi[@]}" "$ght" train "${common[@]}" --out "$runs/scale-$gpus"
  )
fi

# ---- diloco ---------------------------------------------------------------------------------
if want diloco; then
  note "diloco: H=2 over $diloco_steps inner steps on $gpus ranks, $accum micro-batches per rank"
  (
    export GHT_SAVE_CHECKPOINTS=off
    [ "$dry" -eq 1 ] || export GHT_OPTIMIZER=device
    run diloco_n "${mpi[@]}" "$ght" train "${big[@]}" --steps "$diloco_steps" -o model.grad_accum="$accum" \
      -o diloco.inner_steps=2 -o train.eval_every=0 --out "$runs/diloco-$gpus"
  )
fi

# ---- loss -----------------------------------------------------------------------------------
if want loss; then
  note "loss: data parallel vs DiLoCo (H=$loss_h) at equal tokens, $loss_steps steps on $gpus ranks"
  (
    export GHT_SAVE_CHECKPOINTS=off
    common=("${small[@]}" --steps "$loss_steps" -o train.eval_every="$loss_eval" -o train.log_every=10)
    run loss_dp "${mpi[@]}" "$ght" train "${common[@]}" --out "$runs/loss-dp"
    run loss_diloco "${mpi[@]}" "$ght" train "${common[@]}" -o diloco.inner_steps="$loss_h" --out "$runs/loss-diloco"
  )
fi

# ---- summary --------------------------------------------------------------------------------
note "summary"
DRY=$dry GPUS=$gpus LAUNCHER=$launcher PARTS=$parts ACCUM=$accum LOSS_H=$loss_h python3 bench/dist/summary.py "$out" | tee "$out/summary.md"
! grep -qv ' 0$' "$out/status.txt"

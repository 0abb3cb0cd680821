#!/usr/bin/env bash
# One rank of `mpirun -np 2 ght train` killed mid-run (SIGKILL): the job ends with an error that
# names the dead rank, nothing hangs, and the last committed checkpoint still loads (here into
# one process, which warns that the world size changed).
source "$(dirname "$0")/train_common.sh"
mpirun=$(command -v mpirun || true)
if [ -z "$mpirun" ]; then
  echo "train_dist_kill_test: skipped: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
prep_corpus "$work/data"
args=("${small_args[@]}" --data "$work/data" -o train.backend=cpu -o train.threads=1 -o train.ckpt_every=2 -o train.log_every=1)

"$mpirun" -np 2 --oversubscribe "$ght" train "${args[@]}" --out "$work/run" --steps 100000 >"$work/run.out" 2>&1 &
job=$!
# Wait (bounded) for a committed checkpoint, then kill rank 1.
for _ in $(seq 600); do
  ls "$work"/run/ckpt_*/COMMITTED >/dev/null 2>&1 && break
  kill -0 "$job" 2>/dev/null || { cat "$work/run.out"; fail "the 2-rank run ended before its first checkpoint"; }
  sleep 0.1
done
ls "$work"/run/ckpt_*/COMMITTED >/dev/null 2>&1 || { kill -9 "$job"; fail "no checkpoint after 60 s"; }
if grep -q "this build has no MPI" "$work/run.out"; then
  kill "$job" 2>/dev/null; wait "$job" 2>/dev/null
  echo "train_dist_kill_test: skipped: ght was built without MPI"
  exit 0
fi
rank1=""
for p in $(pgrep -f "$ght train" || true); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then rank1=$p; fi
done
[ -n "$rank1" ] || { kill -9 "$job"; cat "$work/run.out"; fail "rank 1's process not found"; }
kill -9 "$rank1"
# mpirun must end the job by itself (bounded wait: a hang fails the test).
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then kill -9 "$job"; fail "the job still runs 30 s after rank 1 was killed"; fi
if wait "$job"; then fail "the job exited 0 after rank 1 was killed"; fi
grep -Eqi "rank 1|process rank 1|rank \[?1\]?" "$work/run.out" ||
  { cat "$work/run.out"; fail "the job's error does not name rank 1"; }
echo "killed rank 1; mpirun said: $(grep -Ei 'rank 1' "$work/run.out" | head -1)"

# The last committed checkpoint loads.
last=$(ls -d "$work"/run/ckpt_* | sort | tail -1)
step=$((10#${last##*_}))
"$ght" train "${args[@]}" --out "$work/run" --steps $((step + 1)) --resume auto >"$work/resume.out" 2>&1 ||
  { cat "$work/resume.out"; fail "resuming after the kill failed"; }
grep -q "resumed from .*ckpt_" "$work/resume.out" || { cat "$work/resume.out"; fail "did not resume from a checkpoint"; }
echo "train_dist_kill_test: ok (resumed at step $step on one process)"

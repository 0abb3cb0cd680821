#!/usr/bin/env bash
# Start N copies of a command on this node with the environment torchrun gives each process
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), without torchrun
# (which needs Python and PyTorch). The same as
#   torchrun --nproc-per-node N --master-addr A --master-port P --no-python CMD ARGS...
# Usage: scripts/torchrun_env.sh [--nproc N] [--master-addr A] [--master-port P] [--] CMD ARGS...
#   defaults: N=2, A=127.0.0.1, P a free port (one that nothing listens on right now)
# Exits with the status of the first process that fails (after stopping the others with SIGTERM),
# or 0 when all succeed. Rank r's output goes to this script's stdout and stderr, unprefixed.
set -uo pipefail
nproc=2
addr=127.0.0.1
port=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) nproc=${2:?--nproc needs a number}; shift 2 ;;
    --master-addr) addr=${2:?--master-addr needs an address}; shift 2 ;;
    --master-port) port=${2:?--master-port needs a port}; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "torchrun_env.sh: no command (--help)" >&2; exit 2; }
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || { echo "torchrun_env.sh: --nproc $nproc is not a positive number" >&2; exit 2; }
if [ -z "$port" ]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])') \
    || { echo "torchrun_env.sh: no free port (python3 missing? pass --master-port)" >&2; exit 2; }
fi
pids=()
for ((r = 0; r < nproc; r++)); do
  RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r LOCAL_WORLD_SIZE=$nproc MASTER_ADDR=$addr MASTER_PORT=$port "$@" &
  pids+=($!)
done
stop() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; }
trap 'stop; wait; exit 143' TERM INT
rc=0
# Poll rather than `wait -n`, which needs bash 5.1 to say which process ended.
while [ ${#pids[@]} -gt 0 ]; do
  for i in "${!pids[@]}"; do
    p=${pids[$i]}
    kill -0 "$p" 2>/dev/null && continue
    wait "$p"
    s=$?
    unset 'pids[i]'
    if [ "$s" -ne 0 ] && [ "$rc" -eq 0 ]; then
      rc=$s
      echo "torchrun_env.sh: a process exited with status $s; stopping the others" >&2
      stop
    fi
  done
  [ ${#pids[@]} -gt 0 ] && sleep 0.2
done
exit "$rc"

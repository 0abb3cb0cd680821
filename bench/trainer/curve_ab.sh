#!/usr/bin/env bash
# Two runs of `small`'s learning-check configuration that differ only in one GHT_* variable
# (bench/trainer/curves.sh runs them and prints the eval losses side by side, the relative gap at
# the last eval and the mean of the last 50 training losses). On the GPU machine; about a minute.
#
#   bash bench/trainer/curve_ab.sh GHT_BIN RUNS_DIR VAR VALUE_A VALUE_B [ght train args...]
#   e.g.  bash bench/trainer/curve_ab.sh build-gpu/bin/ght build-gpu/train-runs GHT_OPT_DELAY 0 1
set -euo pipefail
usage="usage: curve_ab.sh GHT_BIN RUNS_DIR VAR VALUE_A VALUE_B [ght train args...]"
GHT=${1:?$usage}
RUNS=${2:?$usage}
VAR=${3:?$usage}
A=${4:?$usage}
B=${5:?$usage}
shift 5
case "$VAR" in GHT_*) ;; *) echo "curve_ab.sh: VAR must be a GHT_* variable, got '$VAR'" >&2; exit 2 ;; esac
exec bash "$(dirname "$0")/curves.sh" "$GHT" "$RUNS" "$VAR-$A:$VAR=$A" "$VAR-$B:$VAR=$B" -- "$@"

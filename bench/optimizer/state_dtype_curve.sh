#!/usr/bin/env bash
# bf16 against fp32 AdamW state (GHT_OPT_STATE) on `small` (bench/trainer/curve_ab.sh: two runs
# of the learning-check configuration that differ only in the variable). On the GPU machine.
#
#   bash bench/optimizer/state_dtype_curve.sh GHT_BIN RUNS_DIR
set -euo pipefail
exec bash "$(dirname "$0")/../trainer/curve_ab.sh" "${1:?usage: state_dtype_curve.sh GHT_BIN RUNS_DIR}" \
  "${2:?usage: state_dtype_curve.sh GHT_BIN RUNS_DIR}" GHT_OPT_STATE fp32 bf16

#!/usr/bin/env bash
# A smaller AdamW state (GHT_OPT_STATE=bf16, or q8) against fp32 on `small`
# (bench/trainer/curve_ab.sh: two runs of the learning-check configuration that differ only in the
# variable). On the GPU machine.
#
#   bash bench/optimizer/state_dtype_curve.sh GHT_BIN RUNS_DIR [bf16|q8]
set -euo pipefail
usage="usage: state_dtype_curve.sh GHT_BIN RUNS_DIR [bf16|q8]"
exec bash "$(dirname "$0")/../trainer/curve_ab.sh" "${1:?$usage}" "${2:?$usage}" GHT_OPT_STATE fp32 "${3:-bf16}"

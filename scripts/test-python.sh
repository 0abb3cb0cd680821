#!/usr/bin/env bash
# Builds and tests the Python package `ghtier` (python/, pyproject.toml) in a virtual environment.
#
#   scripts/test-python.sh            # .venv-py: creates it, installs what is missing, pip install .,
#                                     # then python -m pytest python/tests
#
# Idempotent: a warm venv installs nothing from PyPI (PyTorch, pytest, scikit-build-core and
# nanobind are installed only when missing) and the package rebuilds incrementally in
# build-python/<venv> (git-ignored; ccache when present). Every step is bounded by `timeout`.
# Environment (named GHTIER_*, not GHT_*: the allocator rejects GHT_ variables it does not know):
# GHTIER_PY_VENV (default .venv-py), PYTHON (the interpreter that creates the venv, default
# python3), GHTIER_PY_PIP_ARGS (extra `pip install .` arguments, e.g.
# "-C cmake.define.GHT_ENABLE_CUDA=OFF"), GHTIER_PY_TORCH_TIMEOUT (seconds for PyTorch's install,
# default 1800: PyPI's torch brings the CUDA wheels, a few GB), GHTIER_PY_CUDA=off (no CUDA in
# the extension).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=${GHTIER_PY_VENV:-.venv-py}
py=$venv/bin/python
say() { printf '[test-python] %s\n' "$*"; }

if [ ! -x "$py" ]; then
  say "creating $venv"
  timeout 300 "${PYTHON:-python3}" -m venv "$venv"
  timeout 300 "$py" -m pip install -q --upgrade pip
fi

need=()
"$py" -c 'import scikit_build_core, nanobind' 2>/dev/null || need+=(scikit-build-core nanobind)
"$py" -c 'import pytest' 2>/dev/null || need+=(pytest)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  timeout 600 "$py" -m pip install -q "${need[@]}"
fi
if ! "$py" -c 'import torch' 2>/dev/null; then
  say "installing torch from PyPI (the first time takes minutes)"
  timeout "${GHTIER_PY_TORCH_TIMEOUT:-1800}" nice -n 5 "$py" -m pip install -q torch
fi

args=(--no-build-isolation -C "build-dir=build-python/$(basename "$venv")")
if command -v ccache >/dev/null; then
  args+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2206 # word splitting of the extra arguments is intended
extra=(${GHTIER_PY_PIP_ARGS:-})
# GHTIER_PY_CUDA=off builds the extension without CUDA (the CPU tests need none).
cuda_define=cmake.define.GHT_ENABLE_CUDA  # a CMake option of the project, not a GHT_* variable
[ "${GHTIER_PY_CUDA:-on}" = off ] && extra+=(-C "$cuda_define=OFF")
say "pip install . (build-python/$(basename "$venv"))"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  timeout 1800 nice -n 5 "$py" -m pip install -q "${args[@]}" "${extra[@]}" .

say "pytest python/tests"
timeout 900 "$py" -m pytest python/tests -q -rs

#!/usr/bin/env bash
# Installs the Debian packages ghtier builds against, and only those that are missing, plus the
# header-only CUTLASS from PyPI (the nvidia-cutlass wheel, into .pydeps/ of the checkout, where
# CMake looks; no Python environment is touched). Running it a second time installs nothing.
# Needs root (or sudo) when a Debian package is missing. Without nvcc CUTLASS is not fetched
# (nothing would use it); a failed fetch only warns: the build then keeps its non-CUTLASS paths.
#
# Usage: scripts/install-deps.sh [--check]
#   --check   only report what is missing; exit 1 if anything is.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git python3
  libnuma-dev libhwloc-dev libtbb-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libtoml11-dev libcli11-dev libxxhash-dev
  libopenmpi-dev openmpi-bin
)

cutlass_version=4.2.0.0
root=$(cd "$(dirname "$0")/.." && pwd)
pydeps=$root/.pydeps
install_cutlass() {
  local have
  have=$(cat "$pydeps/.cutlass-version" 2>/dev/null || true)
  [ "$have" = "$cutlass_version" ] && return 0
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  if [ "${1:-}" = "--check" ]; then echo "install-deps: missing: nvidia-cutlass==$cutlass_version (into .pydeps/)"; return 1; fi
  if python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$pydeps.tmp" \
       "nvidia-cutlass==$cutlass_version"; then
    rm -rf "$pydeps" && mv "$pydeps.tmp" "$pydeps" && echo "$cutlass_version" > "$pydeps/.cutlass-version"
    echo "install-deps: CUTLASS $cutlass_version headers in .pydeps/cutlass_library/source/include"
  else
    rm -rf "$pydeps.tmp"
    echo "install-deps: WARNING: could not install nvidia-cutlass==$cutlass_version; building without CUTLASS" >&2
  fi
}

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  install_cutlass "${1:-}"
  exit $?
fi
echo "install-deps: missing: ${missing[*]}"
if [ "${1:-}" = "--check" ]; then exit 1; fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${#missing[@]} packages"
install_cutlass

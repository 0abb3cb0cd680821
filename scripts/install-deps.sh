#!/usr/bin/env bash
# Installs the Debian packages ghtier builds against, and only those that are missing, plus the
# header-only CUTLASS and cudnn-frontend and NCCL from PyPI (the nvidia-cutlass,
# nvidia-cudnn-frontend and nvidia-nccl-cu13 wheels, into .pydeps/ of the checkout, where CMake
# looks; no Python environment is touched). Running it a second time installs nothing. Needs root
# (or sudo) when a Debian package is missing. Without nvcc no wheel is fetched (nothing would use
# them); a failed fetch only warns: the build then keeps its non-CUTLASS paths, its hand-written
# cuDNN attention graph, or runs the CUDA backend as one process (no NCCL).
#
# Usage: scripts/install-deps.sh [--check]
#   --check   only report what is missing; exit 1 if anything is.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git python3
  libnuma-dev libhwloc-dev libtbb-dev libmimalloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libtoml11-dev libcli11-dev libxxhash-dev libhwy-dev
  libopenmpi-dev openmpi-bin
)

# Wheels from PyPI, each into .pydeps/ of the checkout (pip --target; no Python environment is
# touched), each with a version marker .pydeps/.<name>-version so a second run fetches nothing.
#   nvidia-cutlass     CUTLASS headers (.pydeps/cutlass_library/source/include)
#   nvidia-cudnn-frontend  cudnn-frontend headers: only the wheel's include/, kept as
#                      .pydeps/cudnn_frontend/include (its Python module is not needed)
#   nvidia-nccl-cu13   NCCL (.pydeps/nvidia/nccl/{include,lib}; the wheel's lib holds only
#                      libnccl.so.2), for the CUDA backend's data parallel (trainer/dist/nccl)
cutlass_version=4.2.0.0
cudnn_frontend_version=1.32.0
nccl_version=2.32.3
root=$(cd "$(dirname "$0")/.." && pwd)
pydeps=$root/.pydeps
# install_wheel MODE MARKER PACKAGE VERSION TOP WHAT [FROM]: TOP is the directory under .pydeps/
# the wheel provides (replaced as a whole, so an older version leaves nothing behind); with FROM,
# only that path of the wheel's files is kept, as TOP; without it, everything it installs is.
# MODE is --check or empty.
install_wheel() {
  local mode=$1 marker=$2 pkg=$3 version=$4 top=$5 what=$6 from=${7:-} have tmp
  have=$(cat "$pydeps/.$marker-version" 2>/dev/null || true)
  [ "$have" = "$version" ] && return 0
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  if [ "$mode" = "--check" ]; then echo "install-deps: missing: $pkg==$version (into .pydeps/)"; return 1; fi
  tmp=$pydeps.tmp.$marker
  rm -rf "$tmp"
  if python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
       --only-binary=:all: --target "$tmp" "$pkg==$version"; then
    mkdir -p "$pydeps"
    rm -rf "${pydeps:?}/$top" "$pydeps"/"${pkg//-/_}"-*.dist-info
    if [ -n "$from" ]; then
      mkdir -p "$(dirname "$pydeps/$top")" && cp -a "$tmp/$from" "$pydeps/$top"
    else
      cp -a "$tmp"/. "$pydeps"/
    fi && rm -rf "$tmp" && echo "$version" > "$pydeps/.$marker-version"
    echo "install-deps: $what $version in .pydeps/$top"
  else
    rm -rf "$tmp"
    echo "install-deps: WARNING: could not install $pkg==$version; building without $what" >&2
  fi
}
install_wheels() {
  local rc=0
  install_wheel "${1:-}" cutlass nvidia-cutlass "$cutlass_version" cutlass_library CUTLASS || rc=1
  install_wheel "${1:-}" cudnn_frontend nvidia-cudnn-frontend "$cudnn_frontend_version" \
    cudnn_frontend/include cudnn-frontend include || rc=1
  install_wheel "${1:-}" nccl nvidia-nccl-cu13 "$nccl_version" nvidia/nccl NCCL || rc=1
  return $rc
}

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  install_wheels "${1:-}"
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
install_wheels

#!/usr/bin/env bash
# Installs the Debian packages ghtier builds against, and only those that are missing.
# Running it a second time installs nothing. Needs root (or sudo) when something is missing.
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

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
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

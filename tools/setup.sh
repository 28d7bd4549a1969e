#!/usr/bin/env bash
# Installs the Debian 12 packages simdattn needs (tools/debian-packages.txt; only those missing),
# then configures and builds into build/ (or $SIMDATTN_BUILD_DIR). Idempotent: a second run installs nothing and rebuilds
# only what changed. Works as root, or as a user with sudo. Non-interactive.
#
#   bash tools/setup.sh                 # install + configure + build (Release)
#   SIMDATTN_CMAKE_ARGS="-DSIMDATTN_WERROR=ON" bash tools/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SIMDATTN_BUILD_DIR:-$ROOT/build}"

# The package list: one a line, '#' starts a comment.
mapfile -t PACKAGES < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$ROOT/tools/debian-packages.txt")

missing=()
for p in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
  if [[ "$status" != *"install ok installed"* ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then SUDO=(sudo -n); else
      echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# shellcheck disable=SC2086  # SIMDATTN_CMAKE_ARGS is a list of arguments
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${SIMDATTN_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR/tools/simdattn"

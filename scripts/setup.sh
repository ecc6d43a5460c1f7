#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: install the Debian packages dtrain
# needs (only those missing), then configure and build. Idempotent: a second
# run with nothing changed installs nothing and rebuilds nothing.
#   usage: scripts/setup.sh [cmake --build targets...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DTRAIN_BUILD_DIR:-$root/build}"

# python3-torch: the tests that read checkpoints with PyTorch, and the benchmarks' peer.
# iproute2: the multi-node test's network namespaces (tests/reliability/netns_test.cpp).
# openmpi-bin: mpirun, one of the launchers the launcher test starts train_mlp with.
# python3-matplotlib: scripts/plot_metrics.py. doxygen: the API reference (scripts/api_reference.sh).
# ninja-build: CMake's Ninja generator schedules every target's objects together.
packages=(cmake g++ make ninja-build pkg-config libgloo-dev librange-v3-dev libboost-test-dev libopenblas-dev
          libyaml-cpp-dev nlohmann-json3-dev python3 python3-numpy python3-venv python3-torch iproute2
          openmpi-bin python3-matplotlib doxygen)
[[ -n "${DTRAIN_EXTRA_PACKAGES:-}" ]] && packages+=(${DTRAIN_EXTRA_PACKAGES})
missing=()
# DTRAIN_DEPS_PROVIDED=1: the libraries come from elsewhere (scripts/gpu_check.sh
# unpacks carried .debs into a prefix on a machine that cannot download).
[[ -n "${DTRAIN_DEPS_PROVIDED:-}" ]] && packages=()
for p in ${packages[@]+"${packages[@]}"}; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "dtrain: installing missing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit is optional: nvcc from /usr/local/cuda when present.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# The cudnn-frontend headers (header-only, from PyPI, pinned) for fused
# attention on GPUs, once, into the build folder where CMake looks
# (cmake/FindCUDNN.cmake); cuDNN itself comes with the CUDA toolkit. Without
# PyPI the build goes on without fused attention, and says so.
cudnn_frontend="nvidia-cudnn-frontend==1.32.0"
fe_dir="$build/deps/cudnn-frontend"
if command -v nvcc >/dev/null && [[ ! -f "$fe_dir/include/cudnn_frontend.h" ]] && [[ -z "${DTRAIN_DEPS_PROVIDED:-}" ]]; then
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps "$cudnn_frontend" -d "$tmp" >/dev/null 2>&1; then
    mkdir -p "$fe_dir"
    python3 - "$tmp" "$fe_dir" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  else
    echo "dtrain: could not download $cudnn_frontend from PyPI: building without cuDNN fused attention"
  fi
  rm -rf "$tmp"
fi

jobs="$(nproc)"
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  configure=(-DCMAKE_BUILD_TYPE=Release)
  command -v ninja >/dev/null && configure+=(-G Ninja)
  # ccache, where installed, makes a rebuild of unchanged translation units free.
  if command -v ccache >/dev/null; then
    configure+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$root" -B "$build" "${configure[@]}" ${DTRAIN_CMAKE_ARGS:-}
fi
# DTRAIN_CONFIGURE_ONLY=1: configure, build nothing (scripts/gpu_check.sh builds its own targets).
[[ -n "${DTRAIN_CONFIGURE_ONLY:-}" ]] && exit 0
cmake --build "$build" -j "$jobs" ${1:+--target "$@"}

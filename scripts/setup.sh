#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: install the Debian packages dtrain
# needs (only those missing), then configure and build. Idempotent: a second
# run with nothing changed installs nothing and rebuilds nothing.
#   usage: scripts/setup.sh [cmake --build targets...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DTRAIN_BUILD_DIR:-$root/build}"

# What building and the main job need (demo.sh).
# libdnnl2: oneDNN, the host's GEMM engine where it is installed (loaded at run time; OpenBLAS otherwise).
# libssl-dev: OpenSSL's libcrypto, the HMAC-SHA256 of the job token's handshake (docs/security.md).
packages=(cmake g++ make ninja-build pkg-config libgloo-dev librange-v3-dev libboost-test-dev libopenblas-dev
          libssl-dev libdnnl2 libyaml-cpp-dev nlohmann-json3-dev python3)
# What the tests add (test.sh sets DTRAIN_SETUP_FOR=tests):
# python3-torch: the tests that read checkpoints with PyTorch, and the benchmarks' peer.
# python3-venv: the tests' pinned PyPI packages (transformers, peft, safetensors, tensorboard, conan).
# iproute2: the multi-node test's network namespaces (tests/reliability/netns_test.cpp).
# openmpi-bin: mpirun, one of the launchers the launcher test starts train_mlp with.
# python3-matplotlib: scripts/plot_metrics.py. doxygen: the API reference (scripts/api_reference.sh).
# slurm-wlm, munge: the Slurm test's own cluster (tests/launch/slurm_test.sh starts and stops its daemons).
# clang-16, libclang-rt-16-dev: libFuzzer, for the short fuzz of every parser (CTest fuzz_smoke).
# clang-format: the formatting check (CTest format_check, scripts/format.sh).
# libtorch-dev: LibTorch (1.13) for dtrain::torch, train_libtorch and its tests (docs/libtorch.md).
if [[ "${DTRAIN_SETUP_FOR:-}" == tests ]]; then
  packages+=(python3-numpy python3-venv python3-torch iproute2 openmpi-bin python3-matplotlib doxygen slurm-wlm munge
            clang-16 libclang-rt-16-dev clang-format libtorch-dev)
fi
# The CUDA toolkit is optional: nvcc on PATH, or from /usr/local/cuda.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# With the toolkit, set-up may fetch wheels from PyPI (NCCL where the toolkit
# has none, the cudnn-frontend headers) with Debian's pip.
command -v nvcc >/dev/null && packages+=(python3-pip)
[[ -n "${DTRAIN_EXTRA_PACKAGES:-}" ]] && packages+=(${DTRAIN_EXTRA_PACKAGES})
missing=()
# DTRAIN_DEPS_PROVIDED=1: the libraries come from elsewhere (scripts/gpu_check.sh
# unpacks carried .debs into a prefix on a machine that cannot download).
[[ -n "${DTRAIN_DEPS_PROVIDED:-}" ]] && packages=()
for p in ${packages[@]+"${packages[@]}"}; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "dtrain: these Debian packages are missing and installing them needs root (no sudo here): run as root: apt-get install ${missing[*]}" >&2
      exit 1
    fi
    sudo_cmd=(sudo)
  fi
  echo "dtrain: installing missing Debian packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The cudnn-frontend headers (header-only, from PyPI, pinned) for fused
# attention on GPUs, once, into the build folder where CMake looks
# (cmake/FindCUDNN.cmake); cuDNN itself comes with the CUDA toolkit. Without
# PyPI the build goes on without fused attention, and says so.
cudnn_frontend="nvidia-cudnn-frontend==1.32.0"
fe_dir="$build/deps/cudnn-frontend"

# fetch_wheel SPEC DEST FOLDER: pip downloads the wheel SPEC (no
# dependencies) and unpacks the files under FOLDER/ (include/, lib/) into
# DEST, with FOLDER's own path left out. Debian's Python and pip (installed
# above) do it, whatever python3 comes first on PATH; on failure pip's own
# message is shown, and the function fails.
pip_python=/usr/bin/python3
[[ -x $pip_python ]] || pip_python=$(command -v python3)
fetch_wheel() {
  local tmp status=0
  tmp=$(mktemp -d)
  if ! "$pip_python" -m pip --version >/dev/null 2>&1; then
    echo "dtrain: $pip_python has no pip (Debian's python3-pip) to fetch $1 with" >&2
    status=1
  elif ! "$pip_python" -m pip download -q --no-deps "$1" -d "$tmp" >"$tmp/pip.log" 2>&1; then
    echo "dtrain: pip could not download $1:" >&2
    tail -n 15 "$tmp/pip.log" | sed 's/^/  pip: /' >&2
    status=1
  else
    "$pip_python" - "$tmp" "$2" "$3" <<'PY' || status=1
import glob, os, sys, zipfile
wheel, out, folder = glob.glob(sys.argv[1] + "/*.whl")[0], sys.argv[2], sys.argv[3]
prefix = folder.strip("/") + "/" if folder.strip("/") else ""
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest.startswith(("include/", "lib/")) and not name.endswith("/"):
            dest = os.path.join(out, rest)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                dst.write(src.read())
PY
  fi
  rm -rf "$tmp"
  return $status
}

if command -v nvcc >/dev/null && [[ ! -f "$fe_dir/include/cudnn_frontend.h" ]] && [[ -z "${DTRAIN_DEPS_PROVIDED:-}" ]]; then
  fetch_wheel "$cudnn_frontend" "$fe_dir" "" ||
    echo "dtrain: could not fetch $cudnn_frontend (above): building without cuDNN fused attention"
fi

# NCCL, which GPU training needs: beside the toolkit, in the system or at
# NCCL_ROOT; absent from all of them, PyPI's nvidia-nccl-cu<CUDA major> wheel
# (pinned) unpacked into the build folder, where CMake is pointed at it.
# DTRAIN_NCCL_FROM=pypi takes the wheel even where an NCCL is installed (the
# CTest setup_nccl_fetch runs this path on a machine that has one).
# Without NCCL the build is for CPU ranks only: fine on a machine without a
# GPU, a stop with what to install on one with GPUs.
nccl_version=2.28.9
nccl_dir="$build/deps/nccl"
nccl_args=()
have_nccl=""
gpus=0
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if command -v nvcc >/dev/null && [[ -z "${DTRAIN_DEPS_PROVIDED:-}" ]]; then
  cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  case ${DTRAIN_NCCL_FROM:-auto} in
    auto) search=(${NCCL_ROOT:-} "$cuda_home" /usr /usr/local "$nccl_dir") ;;
    pypi) search=("$nccl_dir") ;;
    *) echo "dtrain: DTRAIN_NCCL_FROM=${DTRAIN_NCCL_FROM}: give auto (the default) or pypi" >&2; exit 2 ;;
  esac
  for d in "${search[@]}"; do
    if [[ -f $d/include/nccl.h ]]; then have_nccl=$d; break; fi
  done
  if [[ -z $have_nccl ]]; then
    cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    wheel="nvidia-nccl-cu${cuda_major}==$nccl_version"
    if [[ ${DTRAIN_NCCL_FROM:-auto} == pypi ]]; then
      echo "dtrain: DTRAIN_NCCL_FROM=pypi: fetching $wheel from PyPI into $nccl_dir"
    else
      echo "dtrain: the CUDA toolkit at $cuda_home has no NCCL: fetching $wheel from PyPI into $nccl_dir"
    fi
    if fetch_wheel "$wheel" "$nccl_dir" nvidia/nccl; then
      ln -sf libnccl.so.2 "$nccl_dir/lib/libnccl.so"
      have_nccl=$nccl_dir
    else
      why="dtrain: the CUDA toolkit at $cuda_home has no NCCL and $wheel could not be fetched (above): install NCCL (from NVIDIA's CUDA apt repository: apt-get install libnccl2 libnccl-dev; or set NCCL_ROOT to an NCCL folder) and run this again"
      if ((gpus > 0)); then
        echo "$why" >&2
        exit 1
      fi
      echo "$why; building for CPU ranks only"
    fi
  fi
  [[ $have_nccl == "$nccl_dir" ]] && nccl_args=(-DNCCL_ROOT="$nccl_dir")
fi

# Configure: the first time with the generator and build type, and again
# every time (about a second), so options given in DTRAIN_CMAKE_ARGS and
# packages installed since are seen. A folder configured before the CUDA
# toolkit and NCCL were here is configured afresh.
configure=()
if [[ -f "$build/CMakeCache.txt" ]] && grep -q '^DTRAIN_CUDA_ENABLED:INTERNAL=OFF' "$build/CMakeCache.txt" &&
   [[ -n $have_nccl ]] && ! grep -q '^DTRAIN_CUDA:STRING=OFF' "$build/CMakeCache.txt"; then
  echo "dtrain: $build was configured without CUDA, which is here now: configuring it afresh"
  configure+=(--fresh)
fi
if [[ ! -f "$build/CMakeCache.txt" || ${configure[0]:-} == --fresh ]]; then
  configure+=(-DCMAKE_BUILD_TYPE=Release)
  command -v ninja >/dev/null && configure+=(-G Ninja)
  # ccache, where installed, makes a rebuild of unchanged translation units free.
  if command -v ccache >/dev/null; then
    configure+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
fi
# DTRAIN_CUDA_CHECK_ONLY=ON in the environment compiles CUDA code only to
# check it (lowest architecture, unoptimised, about 40% less compile time;
# CI asks for it): its binaries are not for GPUs. Otherwise, with or without a
# GPU here, CUDA code is compiled to run: for this machine's GPUs, or for
# Ampere, Ada and Hopper with PTX for newer GPUs where it has none, so a build
# made on a login node runs on the GPU nodes.
if [[ -n $have_nccl ]]; then
  check_only=OFF
  case ${DTRAIN_CUDA_CHECK_ONLY:-} in
    ""|0|OFF|off|no) check_only=OFF ;;
    1|ON|on|yes) check_only=ON ;;
    *) echo "dtrain: DTRAIN_CUDA_CHECK_ONLY=${DTRAIN_CUDA_CHECK_ONLY}: give ON or OFF" >&2; exit 2 ;;
  esac
  [[ $check_only == ON ]] && echo "dtrain: DTRAIN_CUDA_CHECK_ONLY=ON: CUDA code is compiled to be checked, not to run"
  configure+=(-DDTRAIN_CUDA_CHECK_ONLY=$check_only)
fi
cmake -S "$root" -B "$build" ${configure[@]+"${configure[@]}"} ${nccl_args[@]+"${nccl_args[@]}"} ${DTRAIN_CMAKE_ARGS:-}
# DTRAIN_CONFIGURE_ONLY=1: configure, build nothing (scripts/gpu_check.sh builds its own targets).
[[ -n "${DTRAIN_CONFIGURE_ONLY:-}" ]] && exit 0
cmake --build "$build" -j "$(nproc)" ${1:+--target "$@"}

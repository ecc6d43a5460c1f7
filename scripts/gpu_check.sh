#!/usr/bin/env bash
# The whole GPU check in one command, for a GPU machine that cannot download
# anything (docs/gpu.md):
#
#   scripts/gpu_check.sh fetch           on a Debian 12 machine with apt: download
#                                        the Debian packages the build needs into
#                                        .gpu-debs/, and doxygen with its libraries
#                                        into .gpu-debs-docs/ (both git-ignored),
#                                        to be carried
#   scripts/gpu_check.sh [STAGE...]      on the GPU machine (default: all)
#
# A GPU run may carry 64 MiB: .gpu-debs/ (24 MB) and .gpu-debs-docs/ (59 MB)
# travel in two runs on the same machine, the first to build, the second to
# run the whole suite (docs/gpu.md). What the first unpacked stays for the
# second.
#
# Stages, run in the order given:
#   setup   unpack .gpu-debs/ into a prefix (dpkg -x), point CMake, the compilers
#           and the loader at it, then configure and build with scripts/setup.sh
#           (CUDA on, Hopper by default); DTRAIN_GPU_TARGETS limits the targets
#   gpu     the GPU tests alone (ctest -L gpu): none may be skipped
#   test    the whole CTest suite through scripts/test.sh
#   doctor  dtrain-doctor on every local GPU (the NCCL table)
#   bench   bench/run_gpu_bench.sh: the kernels, train_mlp and the GPT example
#           against PyTorch on the same GPU
#   all     setup gpu test doctor bench
#   env     print the exports (eval "$(scripts/gpu_check.sh env)") to run the
#           built programs by hand
#
# Each stage's log goes to the report folder ($DTRAIN_GPU_REPORT, else $OUT
# when set, else build-gpu/report). Environment:
#   DTRAIN_BUILD_DIR     build folder (default build-gpu)
#   DTRAIN_DEPS_PREFIX   where the .debs are unpacked (default /tmp/dtrain-deps)
#   DTRAIN_CMAKE_ARGS    extra configure arguments (e.g. -DDTRAIN_WARNINGS_AS_ERRORS=OFF)
#   CMAKE_CUDA_ARCHITECTURES  default 90 (H100, H200)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
debs="$root/.gpu-debs"
docs_debs="$root/.gpu-debs-docs"
build="${DTRAIN_BUILD_DIR:-$root/build-gpu}"
case $build in /*) ;; *) build="$root/$build" ;; esac
prefix="${DTRAIN_DEPS_PREFIX:-/tmp/dtrain-deps}"
docs_prefix="$prefix-docs"
report="${DTRAIN_GPU_REPORT:-${OUT:-$build/report}}"
arch=x86_64-linux-gnu

# What scripts/setup.sh installs with apt, less what a CUDA image has (the C
# and C++ runtimes, Python, PyTorch, CMake) and less Open MPI (the image has
# its own mpirun): with their runtime libraries, as Debian 12 names them.
packages=(
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  librange-v3-dev nlohmann-json3-dev libyaml-cpp-dev libyaml-cpp0.7
  libboost1.74-dev libboost-test1.74-dev libboost-test1.74.0
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0
)
# doxygen (docs_test builds the API reference) and every library it loads
# but the C, C++ and zlib runtimes: it runs on these alone, through a wrapper
# that puts them first on its own loader path only.
docs_packages=(
  doxygen libclang-cpp14 libclang1-14 libllvm14 libz3-4 libxml2 libicu72
  libedit2 libbsd0 libmd0 libffi8 libtinfo6 liblzma5
)

download() {  # download DIR PACKAGE...
  local dir=$1
  shift
  mkdir -p "$dir"
  rm -f "$dir"/*.deb
  (cd "$dir" && apt-get download "$@")
  du -sh "$dir"
}

fetch() {
  command -v apt-get > /dev/null || { echo "gpu_check: fetch needs apt-get (Debian 12)" >&2; exit 2; }
  download "$debs" "${packages[@]}"
  download "$docs_debs" "${docs_packages[@]}"
  echo "gpu_check: carry .gpu-debs to build (scripts/gpu_check.sh setup ...), then .gpu-debs-docs to run the whole suite (scripts/gpu_check.sh test)"
}

# The stamp of a folder of .debs: their names, so a new set unpacks afresh.
debs_stamp() { (cd "$1" && ls ./*.deb | sort | sha256sum | cut -c1-16); }

unpack_one() {  # unpack_one DEB INTO: dpkg -x where dpkg exists, else the deb's data archive by hand
  if command -v dpkg > /dev/null; then
    dpkg -x "$1" "$2"
  else
    local t
    t=$(mktemp -d)
    (cd "$t" && ar x "$1" && tar -xf data.tar.* -C "$2")
    rm -rf "$t"
  fi
}

# doxygen from .gpu-debs-docs/, where carried (or unpacked by an earlier run
# on this machine) and no doxygen is installed.
docs_env() {
  command -v doxygen > /dev/null && return 0
  local stamp="$docs_prefix/.unpacked"
  if compgen -G "$docs_debs/*.deb" > /dev/null; then
    local want
    want=$(debs_stamp "$docs_debs")
    if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
      rm -rf "$docs_prefix"
      mkdir -p "$docs_prefix/bin"
      for f in "$docs_debs"/*.deb; do unpack_one "$f" "$docs_prefix"; done
      local libs="$docs_prefix/usr/lib/$arch:$docs_prefix/lib/$arch"
      # shellcheck disable=SC2016 # the wrapper expands $LD_LIBRARY_PATH and $@ when it runs
      printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
        "$libs" "$docs_prefix/usr/bin/doxygen" > "$docs_prefix/bin/doxygen"
      chmod +x "$docs_prefix/bin/doxygen"
      echo "$want" > "$stamp"
    fi
  fi
  [[ -f $stamp ]] && export PATH="$docs_prefix/bin:$PATH"
  return 0
}

# Unpacks once per set of .debs, then exports the paths every stage needs.
# Without .debs, what an earlier run on this machine unpacked is used.
deps_env() {
  local stamp="$prefix/.unpacked" want
  if compgen -G "$debs/*.deb" > /dev/null; then
    want=$(debs_stamp "$debs")
  elif [[ -f $stamp ]]; then
    want=$(cat "$stamp")
  else
    echo "gpu_check: no .debs in $debs and none unpacked in $prefix: run 'scripts/gpu_check.sh fetch' where apt works, and carry .gpu-debs" >&2
    exit 2
  fi
  if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    rm -rf "$prefix"
    mkdir -p "$prefix"
    for f in "$debs"/*.deb; do unpack_one "$f" "$prefix"; done
    # Package configs name their files under /usr (Gloo's does, absolutely).
    grep -rl '"/usr/' "$prefix/usr" --include='*.cmake' 2> /dev/null | xargs -r sed -i "s#\"/usr/#\"$prefix/usr/#g"
    # Debian points these at the pthread OpenBLAS with update-alternatives, which dpkg -x does not run.
    local ob="$prefix/usr/lib/$arch/openblas-pthread"
    ln -sf "$ob/libopenblas.so.0" "$prefix/usr/lib/$arch/libopenblas.so.0"
    ln -sf "$ob/libopenblas.so" "$prefix/usr/lib/$arch/libopenblas.so"
    for h in cblas.h openblas_config.h f77blas.h; do
      ln -sf "$prefix/usr/include/$arch/openblas-pthread/$h" "$prefix/usr/include/$h"
    done
    echo "$want" > "$stamp"
  fi
  # NCCL: beside the CUDA toolkit, or PyTorch's wheel (nvidia-nccl-*), whose
  # library has no unversioned name for the linker: give it one.
  local cuda_home=/usr/local/cuda
  if [[ ! -e $cuda_home/include/nccl.h && ! -e /usr/include/nccl.h && -z ${NCCL_ROOT:-} ]]; then
    local wheel
    wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2> /dev/null || true)
    if [[ -n $wheel && -e $wheel/include/nccl.h ]]; then
      mkdir -p "$prefix/nccl/lib"
      ln -sfn "$wheel/include" "$prefix/nccl/include"
      ln -sf "$wheel/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so.2"
      ln -sf "$wheel/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so"
      export NCCL_ROOT="$prefix/nccl"
    fi
  fi
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  local libs="$prefix/usr/lib/$arch:$prefix/usr/lib:$prefix/usr/lib/$arch/openblas-pthread"
  [[ -n ${NCCL_ROOT:-} ]] && libs="$libs:$NCCL_ROOT/lib"
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$libs${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CPLUS_INCLUDE_PATH="$prefix/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  export C_INCLUDE_PATH="$prefix/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
  [[ -x $cuda_home/bin/nvcc ]] && export PATH="$cuda_home/bin:$PATH"
  docs_env
  # The tests' PyTorch (tests/support/python_venv.hpp): the image's python3, not /usr/bin/python3.
  DTRAIN_PYTHON="$(command -v python3 || true)"
  export DTRAIN_PYTHON
  export DTRAIN_DEPS_PROVIDED=1 DTRAIN_BUILD_DIR="$build"
  # Ninja where there is one: CMake's Makefiles build listed targets one after
  # another (DTRAIN_GPU_TARGETS took over 450 s on 16 cores), Ninja together.
  local generator=""
  command -v ninja > /dev/null && generator="-G Ninja"
  export DTRAIN_CMAKE_ARGS="$generator -DDTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-90} ${DTRAIN_CMAKE_ARGS:-}"
}

probe() {
  echo "== machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  nproc
  for t in nvcc g++ cmake ninja python3 dpkg doxygen mpirun ip; do
    printf '%-8s %s\n' "$t" "$(command -v $t || echo missing)"
  done
  nvcc --version | tail -2
  g++ --version | head -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' || true
  echo "NCCL_ROOT=${NCCL_ROOT:-} (nccl.h: $(ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2> /dev/null | tr '\n' ' '))"
}

stage() {  # stage NAME COMMAND...: runs it with its output in the report folder too
  local name=$1
  shift
  echo "=== gpu_check: $name"
  local start=$SECONDS rc=0
  "$@" 2>&1 | tee "$report/$name.log" || rc=$?
  echo "=== gpu_check: $name exited $rc after $((SECONDS - start)) s"
  return "$rc"
}

gpu_tests() {
  # --no-tests=error and the skip check: a GPU test that skips here is a failure.
  ctest --test-dir "$build" -L gpu --output-on-failure --no-tests=error -j 4 | tee "$report/gpu_ctest.txt"
  if grep -q "Not Run\|Skipped" "$report/gpu_ctest.txt"; then
    echo "gpu_check: a GPU test was skipped on a GPU machine" >&2
    return 1
  fi
}

run_stage() {
  case $1 in
    setup)
      stage probe probe
      # shellcheck disable=SC2086
      stage build "$root/scripts/setup.sh" ${DTRAIN_GPU_TARGETS:-} ;;
    gpu) stage gpu gpu_tests ;;
    test) stage test "$root/scripts/test.sh" ;;
    doctor) stage doctor "$build/tools/dtrain-doctor" ;;
    bench) stage bench "$root/bench/run_gpu_bench.sh" "$build" --json "$report/gpu_bench.json" ;;
    env)  # eval "$(scripts/gpu_check.sh env)": the same paths in the calling shell
      for v in CMAKE_PREFIX_PATH LD_LIBRARY_PATH LIBRARY_PATH CPLUS_INCLUDE_PATH C_INCLUDE_PATH PATH NCCL_ROOT DTRAIN_PYTHON; do
        [[ -n ${!v:-} ]] && printf 'export %s=%q\n' "$v" "${!v}"
      done ;;
    all) for s in setup gpu test doctor bench; do run_stage "$s"; done ;;
    *) echo "gpu_check: unknown stage '$1': use fetch, setup, gpu, test, doctor, bench, env or all" >&2; exit 2 ;;
  esac
}

if [[ ${1:-} == fetch ]]; then
  fetch
  exit 0
fi
mkdir -p "$report"
deps_env > /dev/null
(($#)) || set -- all
for s in "$@"; do run_stage "$s"; done

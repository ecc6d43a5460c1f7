#!/usr/bin/env bash
# scripts/setup.sh on a machine whose CUDA toolkit has no NCCL, as far as
# set-up can tell (DTRAIN_NCCL_FROM=pypi: the NCCL beside the toolkit is not
# looked at): it must fetch PyPI's pinned NCCL wheel into the build folder, with
# a python3 first on PATH that has no pip (Debian's own python3 has none until
# set-up installs python3-pip, the cause of the old "PyPI unreachable"), and
# configure must then find that NCCL and enable CUDA. A program built against
# the fetched header and library must report NCCL's version.
#   usage: tests/setup/nccl_fetch_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1
work=$2
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "no CUDA toolkit here: set-up fetches NCCL only for one; skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
python3 -m venv --without-pip "$work/python-without-pip"
if PATH="$work/python-without-pip/bin:$PATH" "$work/python-without-pip/bin/python3" -m pip --version >/dev/null 2>&1; then
  echo "FAIL: the python3 put first on PATH has pip; the test would not show set-up's independence of it"
  exit 1
fi
build=$work/build
status=0
PATH="$work/python-without-pip/bin:$PATH" DTRAIN_NCCL_FROM=pypi DTRAIN_BUILD_DIR="$build" DTRAIN_CONFIGURE_ONLY=1 \
  DTRAIN_CUDA_CHECK_ONLY=ON "$src/scripts/setup.sh" >"$work/setup.log" 2>&1 || status=$?
cat "$work/setup.log"
if ((status != 0)); then
  echo "FAIL: scripts/setup.sh exited $status"
  exit 1
fi
cache=$build/CMakeCache.txt
expect() {  # expect KEY VALUE: the cache holds KEY=VALUE
  local got
  got=$(sed -n "s/^$1:[A-Z]*=//p" "$cache")
  if [[ $got != "$2" ]]; then
    echo "FAIL: $1 is '$got', expected '$2'"
    exit 1
  fi
  echo "ok: $1 = $got"
}
expect NCCL_INCLUDE_DIR "$build/deps/nccl/include"
expect NCCL_LIBRARY "$build/deps/nccl/lib/libnccl.so"
expect DTRAIN_CUDA_ENABLED ON
grep -q "fetching nvidia-nccl-cu" "$work/setup.log" || { echo "FAIL: set-up did not say it fetched NCCL"; exit 1; }
cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
cat >"$work/version.c" <<'C'
#include <nccl.h>
#include <stdio.h>
int main(void) {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 1;
  printf("%d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  return 0;
}
C
cc "$work/version.c" -I "$build/deps/nccl/include" -I "$cuda_home/include" -L "$build/deps/nccl/lib" -lnccl \
   -Wl,-rpath,"$build/deps/nccl/lib" -o "$work/version"
version=$("$work/version")
wanted=$(sed -n 's/^nccl_version=//p' "$src/scripts/setup.sh")
if [[ $version != "$wanted" ]]; then
  echo "FAIL: the fetched NCCL reports $version, set-up pins $wanted"
  exit 1
fi
echo "ok: the fetched NCCL $version links and runs"
rm -rf "$work"

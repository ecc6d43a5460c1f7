#!/usr/bin/env bash
# The install that ports/dtrain/portfile.cmake drives, without vcpkg (which is
# not available here): configure dtrain with the port's options (features off),
# install, check that the config sits in share/dtrain as vcpkg_cmake_config_fixup
# expects, then build and run examples/consumer against that prefix.
#   usage: run_vcpkg_layout.sh <source-dir> <work-dir> <dtrain-run>
set -euo pipefail
src=$1 work=$2 launcher=$3
here=$(cd "$(dirname "$0")" && pwd)

rm -rf "$work"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
      -DDTRAIN_BUILD_TOOLS=OFF -DDTRAIN_CUDA=OFF \
      -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_EXAMPLES=OFF -DDTRAIN_BUILD_BENCH=OFF -DDTRAIN_TORCH=OFF \
      -DDTRAIN_INSTALL_CMAKEDIR=share/dtrain
cmake --build "$work/build"
# A package build compiles nothing: dtrain::runtime's sources are installed
# and built in the consuming project.
built=$(find "$work/build" -name '*.a' -o -name '*.o' | head -n 3)
if [[ -n "$built" ]]; then
  echo "run_vcpkg_layout.sh: the package build compiled something it should leave to the consumer:" >&2
  echo "$built" >&2
  exit 1
fi
"$here/install.sh" "$work/build" "$work/prefix" share/dtrain
if [[ -e "$work/prefix/share/cmake" ]]; then
  echo "run_vcpkg_layout.sh: share/cmake exists; vcpkg expects the config in share/dtrain only" >&2
  exit 1
fi
"$here/run_consumer.sh" "$src" "$work/prefix" "$work/consumer" "$launcher" -DDTRAIN_CUDA=OFF

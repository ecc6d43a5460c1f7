#!/usr/bin/env bash
# Builds examples/consumer, a project of its own, against an installed dtrain
# and runs it on 2 CPU ranks: it exits non-zero unless its loss goes down.
# No build type: the package's own flags only, unoptimised and with
# assertions on (half the compile time of Release; dtrain's own build and
# Conan's test_package cover Release).
#   usage: run_consumer.sh <source-dir> <prefix> <work-dir> <dtrain-run> [cmake options...]
set -euo pipefail
src=$1 prefix=$2 work=$3 launcher=$4
shift 4

rm -rf "$work"
cmake -S "$src/examples/consumer" -B "$work" -DCMAKE_BUILD_TYPE= -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON "$@"
# The point is to consume the install, not some other dtrain on this machine.
found=$(sed -n 's/^dtrain_DIR:PATH=//p' "$work/CMakeCache.txt")
case "$found" in
  "$prefix"/*) echo "run_consumer.sh: found dtrain in $found" ;;
  *) echo "run_consumer.sh: find_package(dtrain) used '$found', not the install in $prefix" >&2; exit 1 ;;
esac
cmake --build "$work" -j 2
"$launcher" --nproc-per-node 2 "$work/dtrain_consumer"

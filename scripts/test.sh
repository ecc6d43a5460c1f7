#!/usr/bin/env bash
# Installs what is missing, builds everything (every CUDA source with nvcc when
# the toolkit is present) and runs the whole CTest suite. GPU tests report
# "skipped" (exit 77) on a machine without a GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DTRAIN_SETUP_FOR=tests "$root/scripts/setup.sh"
build="${DTRAIN_BUILD_DIR:-$root/build}"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"

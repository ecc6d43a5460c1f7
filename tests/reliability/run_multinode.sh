#!/usr/bin/env bash
# Multi-node on one machine: two network namespaces joined by a veth pair,
# a dtrain-run --nnodes 2 in each (tests/reliability/test_netns.cpp). Needs
# CAP_NET_ADMIN (run as root); without it the test exits 77 (skipped).
# Installs what is missing and builds its targets through scripts/setup.sh.
#
#   tests/reliability/run_multinode.sh [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac
DTRAIN_BUILD_DIR=$build "$repo/scripts/setup.sh" test_reliability_netns train_mlp dtrain-run > /dev/null
exec "$build/tests/reliability/test_reliability_netns" --log_level=test_suite

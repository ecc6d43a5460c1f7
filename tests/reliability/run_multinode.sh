#!/usr/bin/env bash
# Multi-node on one machine: two network namespaces joined by a veth pair,
# a dtrain-run --nnodes 2 in each (tests/reliability/netns_test.cpp). Needs
# CAP_NET_ADMIN (run as root); without it the test exits 77 (skipped).
# Installs what is missing and builds its targets through scripts/setup.sh.
#
#   tests/reliability/run_multinode.sh [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac
DTRAIN_BUILD_DIR=$build "$repo/scripts/setup.sh" reliability_netns_test train_mlp dtrain-run > /dev/null
exec "$build/tests/reliability/reliability_netns_test" --log_level=test_suite

#!/usr/bin/env bash
# The sanitizer matrix, too long for the default CI run (each build compiles
# every test again with instrumentation):
#   asan  the whole host test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#         (leaks included); GPU tests are not built (DTRAIN_CUDA=OFF)
#   tsan  the comm, store, launcher, reliability and run-loop tests under ThreadSanitizer
# Any report fails the run (halt_on_error, -fno-sanitize-recover).
#
#   tests/sanitize/run_sanitizers.sh [asan|tsan|all] [CTEST_ARGS...]
#
# Builds go to build-asan/ and build-tsan/. Installs what is missing through
# scripts/setup.sh's package list first. On 2 cores: about 30 minutes per build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
which=${1:-all}
shift || true
case $which in asan|tsan|all) ;; *) echo "usage: tests/sanitize/run_sanitizers.sh [asan|tsan|all] [CTEST_ARGS...]" >&2; exit 2 ;; esac

# The packages (and the default build's dtrain-run); the instrumented builds are configured below.
DTRAIN_BUILD_DIR=$repo/build "$repo/scripts/setup.sh" dtrain-run > /dev/null

supp=$repo/tests/sanitize
run_matrix_entry() {  # name flags tests (ctest -R; empty: all) targets (empty: all) [ctest args]
  local name=$1 flags=$2 tests=$3 targets=$4 build=$repo/build-$1
  shift 4
  # GCC's -Wmaybe-uninitialized misfires on instrumented code (range-v3's
  # variant under ASan), and the project builds its tests with -Werror.
  # Called as `entry || status=1`, where set -e does not apply: each step
  # returns on failure itself, so a failed build never runs a partial suite.
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_CUDA=OFF -DDTRAIN_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer -Wno-maybe-uninitialized" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" > /dev/null || return 1
  cmake --build "$build" -j "$(nproc)" ${targets:+--target $targets} || { echo "== $name: the build failed" >&2; return 1; }
  echo "== $name: ctest ${tests:+-R $tests}"
  ctest --test-dir "$build" --output-on-failure -j "$(nproc)" ${tests:+-R "$tests"} "$@"
}

status=0
if [[ $which == asan || $which == all ]]; then
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_odr_violation=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions=$supp/lsan.supp \
    run_matrix_entry asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined" "" "" "$@" || status=1
fi
# The tests ThreadSanitizer runs: the communicators and the store, the
# launcher, the reliability harnesses (kill -9, preemption, bad input, two
# nodes in network namespaces, the soak) and the run loop (dtrain::fit).
tsan_tests=(comm_gloo_test comm_host_processes_test launch_test
            reliability_faults_test reliability_bad_input_test reliability_preempt_test reliability_netns_test
            reliability_soak fit_test run_config_test robust_test disk_test)
if [[ $which == tsan || $which == all ]]; then
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp \
    run_matrix_entry tsan "-fsanitize=thread" "^($(IFS='|'; echo "${tsan_tests[*]}"))\$" \
      "${tsan_tests[*]/reliability_soak/train_mlp} dtrain-run" "$@" || status=1
fi
exit $status

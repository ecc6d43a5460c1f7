#!/usr/bin/env bash
# Installs what is missing, builds everything (every CUDA source with nvcc when
# the toolkit is present) and runs the whole CTest suite. GPU tests report
# "skipped" (exit 77) on a machine without a GPU; without the CUDA toolkit
# they are not built, and the last line says so. CTest runs one test more
# than there are cores: some tests mostly wait (the Slurm test on Slurm's
# scheduler, Python's imports, the packaging tests' configure steps), and
# with one per core the cores stood idle a quarter of the time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
started=$SECONDS
DTRAIN_SETUP_FOR=tests "$root/scripts/setup.sh"
built=$SECONDS
build="${DTRAIN_BUILD_DIR:-$root/build}"
# CTest starts the longest tests first when it knows their times, which it
# learns from a run: a fresh build starts from the times of a fresh-clone CI
# run on 2 cores (tests/ctest_cost_data.txt), and CTest updates them as usual.
# Without them the long tests that come late in the list ran last, alone.
costs="$build/Testing/Temporary/CTestCostData.txt"
if [[ ! -f $costs ]]; then
  mkdir -p "$(dirname "$costs")"
  cp "$root/tests/ctest_cost_data.txt" "$costs"
fi
status=0
ctest --test-dir "$build" --output-on-failure -j "$(($(nproc) + 1))" "$@" || status=$?
# The last lines are what a CI log's tail shows: where the time went, the
# disk left, and each pinned Python set that could not be installed (its
# tests were skipped), with the reason.
free_mib=$(df -Pm "$build" | awk 'NR == 2 { print $4 }')
echo "dtrain: set-up and build $((built - started)) s, tests $((SECONDS - built)) s; ${free_mib} MiB free in $build"
for skipped in "$build"/python/*.skipped; do
  [[ -f $skipped ]] || continue
  echo "dtrain: the pinned Python set '$(basename "$skipped" .skipped)' was not installed, so the tests that compare against it were skipped:"
  sed 's/^/  /' "$skipped"
done
cache="$build/CMakeCache.txt"
if grep -q '^DTRAIN_CUDA_ENABLED:INTERNAL=OFF' "$cache"; then
  why=$(sed -n 's/^DTRAIN_NO_CUDA_WHY:INTERNAL=//p' "$cache")
  echo "dtrain: tested for CPU ranks only (${why:-no CUDA}): no CUDA source was compiled and no GPU test was built or run"
elif grep -q '^DTRAIN_CUDA_CHECK_ONLY:BOOL=ON' "$cache"; then
  echo "dtrain: CUDA compiled to be checked only (DTRAIN_CUDA_CHECK_ONLY=ON): these binaries are not for GPUs"
fi
exit $status

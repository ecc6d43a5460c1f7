#!/usr/bin/env bash
# `conan create` for dtrain with the Debian 12 profile, whose [platform_requires]
# stand in for ConanCenter, so it runs offline once Conan is installed.
# Conan goes into a venv under the work dir (pip needs PyPI the first time; the
# venv is reused after that); CONAN_HOME and a copy of the recipe's files live
# there too, so nothing is written to the source tree or ~/.conan2.
#   usage: run_conan.sh <source-dir> <work-dir> [conan create options...]
# Exits 77 (CTest: skipped) when Conan cannot be installed.
set -euo pipefail
src=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
shift 2

venv=$work/venv
if [[ ! -x "$venv/bin/conan" ]]; then
  python=/usr/bin/python3
  [[ -x "$python" ]] || python=python3
  rm -rf "$venv"
  if ! "$python" -m venv "$venv"; then
    echo "run_conan.sh: SKIPPED: '$python -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 77
  fi
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --timeout 20 --retries 1 conan==2.34.0; then
    echo "run_conan.sh: SKIPPED: 'pip install conan' failed (is PyPI reachable from here?)"
    rm -rf "$venv"
    exit 77
  fi
fi
conan=$venv/bin/conan
export CONAN_HOME=$work/home
"$conan" --version
"$conan" profile detect --exist-ok
"$conan" remove 'dtrain/*' --confirm

# conan create writes test_package/build next to the recipe: work on a copy.
rm -rf "$work/src"
mkdir -p "$work/src"
cp -R "$src/conanfile.py" "$src/CMakeLists.txt" "$src/LICENSE" "$src/cmake" "$src/include" "$src/test_package" \
      "$work/src/"
profile=$src/tests/packaging/debian12.profile
# A Debug build (-O0 -g): the test checks the recipe, the package and
# test_package, not the optimiser, and takes half the time of
# Release (37 against 70 s on 2 cores; dtrain's own build covers Release).
"$conan" create "$work/src" -pr:h "$profile" -pr:b "$profile" --build=missing --no-remote --format=json \
  -s build_type=Debug "$@" \
  > "$work/graph.json"
# The package carries the licence where Conan looks for it (licenses/).
package=$("$venv/bin/python" -c '
import json, sys
nodes = json.load(open(sys.argv[1]))["graph"]["nodes"].values()
print(next(n["package_folder"] for n in nodes if (n.get("ref") or "").startswith("dtrain/")))' "$work/graph.json")
[[ -f "$package/licenses/LICENSE" ]] || { echo "run_conan.sh: $package/licenses/LICENSE is missing" >&2; exit 1; }
echo "run_conan.sh: dtrain packaged in $package, with licenses/LICENSE"

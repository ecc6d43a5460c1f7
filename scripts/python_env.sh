#!/usr/bin/env bash
# python_env.sh NAME DIR: makes DIR a venv holding the pinned set
# scripts/python/NAME.txt, once: a venv whose stamp matches the set's
# checksum is reused as it is. Prints DIR/bin/python on success.
#
# The tests that compare against a Python library (CTest fixture
# python_env_NAME) and the benchmarks' peer (bench/lib.sh) share one venv per
# set per build folder, so a CI run installs each set once.
#
# Exit status: 0 ready, 2 bad usage, 77 the set could not be installed here
# (no venv module, PyPI unreachable, too little disk): CTest shows the
# fixture and the tests that need it as skipped, with this reason.
set -euo pipefail
usage="usage: python_env.sh NAME DIR"
[[ $# -eq 2 ]] || { echo "$usage" >&2; exit 2; }
name=$1 dir=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
reqs=$here/python/$name.txt
[[ -f $reqs ]] || { echo "python_env: no pinned set named '$name' (scripts/python/*.txt)" >&2; exit 2; }
want=$(sha256sum "$reqs" | cut -d' ' -f1)
stamp=$dir/.dtrain-set
if [[ -x $dir/bin/python && -f $stamp && $(< "$stamp") == "$want" ]]; then
  echo "$dir/bin/python"
  exit 0
fi
echo "python_env: installing the pinned set '$name' into $dir (from PyPI; once per build folder)" >&2
rm -f "$stamp"
mkdir -p "$dir"
need_kb=$((8 * 1024 * 1024))  # torch2: about 5.5 GB installed, and pip's downloads beside it
free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
if ((free_kb < need_kb)); then
  echo "python_env: $((free_kb / 1024)) MiB free under $dir; the set '$name' needs about 8 GiB: free some disk" >&2
  exit 77
fi
[[ -x $dir/bin/python ]] || /usr/bin/python3 -m venv "$dir" ||
  { echo "python_env: cannot create a Python venv in $dir: install python3-venv" >&2; exit 77; }
if ! "$dir/bin/pip" install -q --no-input -r "$reqs" >&2; then
  echo "python_env: pip could not install $reqs into $dir (is PyPI reachable? a proxy in PIP_INDEX_URL?)" >&2
  exit 77
fi
echo "$want" > "$stamp"
echo "$dir/bin/python"

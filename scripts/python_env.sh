#!/usr/bin/env bash
# python_env.sh NAME DIR: makes DIR a venv holding the pinned set
# scripts/python/NAME.txt, once: a venv whose stamp matches the set's
# checksum is reused as it is. Prints DIR/bin/python on success. One call at
# a time per DIR (a lock beside it, DIR.lock): a second (a benchmark started
# beside the tests) waits for the first and then finds its venv.
#
# The tests that compare against a Python library (CTest fixture
# python_env_NAME) and the benchmarks' peer (bench/lib.sh) share one venv per
# set per build folder, so a CI run installs each set once.
#
# Exit status: 0 ready, 2 bad usage, 77 the set could not be installed here
# (no venv module, PyPI unreachable, too little disk): CTest shows the
# fixture and the tests that need it as skipped. The reason, with pip's last
# lines, is kept in DIR.skipped, which the tests and scripts/test.sh's last
# lines print; a partial install is removed, so that a full disk is freed for
# the rest of the suite.
#
# pip keeps no cache (a set is installed once per build folder, and a cache
# would hold its wheels a second time: about 3 GB for a set with PyTorch),
# and the set file's "# disk-gib: N" line says how much free disk the install
# needs at its peak (the venv and pip's unpacked downloads).
set -euo pipefail
usage="usage: python_env.sh NAME DIR"
[[ $# -eq 2 ]] || { echo "$usage" >&2; exit 2; }
name=$1 dir=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
reqs=$here/python/$name.txt
[[ -f $reqs ]] || { echo "python_env: no pinned set named '$name' (scripts/python/*.txt)" >&2; exit 2; }
want=$(sha256sum "$reqs" | cut -d' ' -f1)
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
stamp=$dir/.dtrain-set
skipped=$dir.skipped
if [[ -x $dir/bin/python && -f $stamp && $(< "$stamp") == "$want" ]]; then
  rm -f "$skipped"
  echo "$dir/bin/python"
  exit 0
fi
# skip REASON [LOG]: records why the set is not here, removes what was
# installed of it, and exits 77.
skip() {
  {
    echo "$1"
    [[ -n ${2:-} && -s $2 ]] && tail -n 8 "$2" | sed 's/^/  pip: /'
  } | tee "$skipped" >&2 || true
  rm -rf "$dir"
  exit 77
}
echo "python_env: installing the pinned set '$name' into $dir (from PyPI; once per build folder)" >&2
rm -f "$stamp" "$skipped"
mkdir -p "$dir"
need_gib=$(sed -n 's/^# disk-gib: *\([0-9][0-9]*\).*/\1/p' "$reqs" | head -n 1)
need_gib=${need_gib:-12}
free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
if ((free_kb < need_gib * 1024 * 1024)); then
  skip "python_env: $((free_kb / 1024)) MiB free under $dir; the pinned set '$name' needs about $need_gib GiB: free some disk"
fi
[[ -x $dir/bin/python ]] || /usr/bin/python3 -m venv "$dir" ||
  skip "python_env: cannot create a Python venv in $dir: install python3-venv"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! PIP_NO_CACHE_DIR=1 "$dir/bin/pip" install -q --no-input --no-cache-dir -r "$reqs" >"$log" 2>&1; then
  cat "$log" >&2
  free_kb=$(df -Pk "$(dirname "$dir")" | awk 'NR == 2 { print $4 }')
  skip "python_env: pip could not install the pinned set '$name' ($reqs) into $dir, with $((free_kb / 1024)) MiB free at the end (is PyPI reachable? a proxy in PIP_INDEX_URL? enough disk?)" "$log"
fi
echo "$want" > "$stamp"
echo "$dir/bin/python"

"""What every results file records about its run, and the check that it does.

Every JSON under bench/results/ starts with the same provenance (run_record):
  date     the day it was measured (YYYY-MM-DD, or an ISO time)
  commit   the commit whose code ran: one in this repository's history
  dirty    whether tracked files outside bench/results/ and docs/ differed from it
  machine  the CPU (model, vector flags), cores, the GPU and its driver where
           there is one ("gpu": "none" otherwise), the kernel, the load
A file measured before this rule, whose provenance was recorded afterwards,
says so in "provenance_note"; only there may "dirty" be null (not known) and a
machine field say "not recorded". Any "commit" deeper in a file (a run of
fuzz.json, say) must also be one of the history. bench/docs_tables.py --check
fails on a file that breaks this (provenance_problems below).

The writers import this file by path (each puts bench/ first on sys.path);
shell scripts call `python3 bench/machine.py stamp FILE.json --cores N`.
"""

import json
import os
import platform
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_info():
    """The CPU's model name and the vector flags that decide which GEMM kernels run."""
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    flags = info.get("flags", "").split()
    return {"cpu": info.get("model name", platform.machine()),
            "cpu_flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]}


def _git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()


def commit():
    """The checkout's short commit, or None outside a git checkout."""
    try:
        return _git("rev-parse", "--short=12", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return None


def dirty():
    """Whether the code measured differs from the commit: tracked files changed
    outside bench/results/ and docs/ (what a run writes, and prose); None outside git."""
    try:
        return bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!docs"))
    except (OSError, subprocess.CalledProcessError):
        return None


def gpu_info():
    """The GPUs nvidia-smi lists (name and driver), or "none"."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return {"gpu": "none"}
    gpus = [line.split(",") for line in out.strip().splitlines() if line.strip()]
    if not gpus:
        return {"gpu": "none"}
    return {"gpu": f"{len(gpus)} x {gpus[0][0].strip()}", "driver": gpus[0][1].strip()}


def run_record(cores, **machine):
    """The date, commit and machine (CPU, cores, GPU and driver, kernel, load,
    and `machine`'s extra fields) every results JSON starts with."""
    return {"date": time.strftime("%Y-%m-%d"), "commit": commit(), "dirty": dirty(),
            "machine": {**cpu_info(), "cores": cores, **gpu_info(), "kernel": platform.release(),
                        "load_average_at_end": os.getloadavg(), **machine}}


# --- the check ---------------------------------------------------------------

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T[\d:]+(\.\d+)?Z?)?$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")


class History:
    """Which commits this checkout's history holds; `known` is None when it
    cannot tell (no git, or a shallow clone), and then only the form is checked."""

    def __init__(self):
        self.cache = {}
        try:
            self.known = _git("rev-parse", "--is-shallow-repository") == "false"
        except (OSError, subprocess.CalledProcessError):
            self.known = False

    def has(self, sha):
        if not self.known:
            return True
        if sha not in self.cache:
            r = subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True)
            self.cache[sha] = r.returncode == 0
        return self.cache[sha]


def _commits(value, where=""):
    """(where, commit) of every "commit" member at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "commit":
                yield where or "commit", v
            else:
                yield from _commits(v, f"{where}.{k}" if where else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _commits(v, f"{where}[{i}]")


def provenance_problems(name, data, history):
    """What a results file lacks of its provenance; `name` is its path under bench/results/."""
    if not isinstance(data, dict):
        return [f"bench/results/{name}: not a JSON object"]
    problems = []
    say = lambda text: problems.append(f"bench/results/{name}: {text}")  # noqa: E731
    if not _DATE.match(str(data.get("date", ""))):
        say(f"'date' is {data.get('date')!r}, not YYYY-MM-DD")
    note = data.get("provenance_note")
    if not isinstance(data.get("dirty"), bool) and not (data.get("dirty") is None and "dirty" in data and note):
        say("no 'dirty' (true or false: whether the measured code differed from its commit; null only in a file "
            "whose 'provenance_note' says it was not recorded at the time)")
    machine = data.get("machine")
    if not isinstance(machine, dict):
        say("no 'machine' object (cpu, cores, gpu and driver)")
    else:
        for key in ("cpu", "cores", "gpu"):
            if machine.get(key) in (None, ""):
                say(f"machine has no '{key}'")
            elif machine.get(key) == "not recorded" and not note:
                say(f"machine.{key} is 'not recorded' without a 'provenance_note' saying why")
        if machine.get("gpu") not in (None, "none") and not machine.get("driver"):
            say(f"machine names a GPU ({machine['gpu']}) but not its driver")
    if "commit" not in data:
        say("no 'commit'")
    for where, sha in _commits(data):
        if not isinstance(sha, str) or not _HEX.match(sha):
            say(f"{where} is {sha!r}, not a commit hash")
        elif not history.has(sha):
            say(f"{where} {sha} is not a commit of this repository's history")
    return problems


def results_files():
    """Every JSON under bench/results/, as paths relative to it."""
    base = os.path.join(REPO, "bench", "results")
    out = []
    for folder, _, files in os.walk(base):
        out += [os.path.relpath(os.path.join(folder, f), base) for f in files if f.endswith(".json")]
    return sorted(out)


def stamp(path, cores, extra):
    """Give a results file written by a shell script its provenance (run_record), keeping its own fields."""
    with open(path) as f:
        data = json.load(f)
    record = run_record(cores, **extra)
    data = {**record, **{k: v for k, v in data.items() if k not in record}}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "stamp":
        cores = int(sys.argv[sys.argv.index("--cores") + 1]) if "--cores" in sys.argv else os.cpu_count()
        stamp(sys.argv[2], cores, {})
    elif len(sys.argv) == 2 and sys.argv[1] == "check":
        h = History()
        found = []
        for n in results_files():
            with open(os.path.join(REPO, "bench", "results", n)) as f:
                found += provenance_problems(n, json.load(f), h)
        print("\n".join(found) or "machine.py: every results file has its provenance")
        sys.exit(1 if found else 0)
    else:
        print("usage: bench/machine.py stamp FILE.json [--cores N] | check", file=sys.stderr)
        sys.exit(2)

#!/usr/bin/env python3
"""The GPU check's record (docs/dev/gpu_check.md), and the check that keeps it true.

usage:
  gpu_report.py write REPORT_DIR OUT_JSON   the record of a scripts/gpu_check.sh run, from its
                                            report folder: probe.env, stages.tsv, gpu_junit.xml
                                            and sanitize_*.log
  gpu_report.py check [JSON]                exit 1 when the record shows a failed or skipped test,
                                            a sanitizer error, no sanitizer run or no test at all
                                            that docs/gpu.md does not name, in its table of fixes,
                                            with the commit that fixes it (awaiting the next GPU
                                            run), or when docs/gpu.md does not name the record's
                                            commit; exit 77 (skipped) when there is no record
  gpu_report.py changes [JSON | COMMIT]     the commits since the recorded one (or COMMIT) that
                                            touched code a GPU runs: what a new GPU run must prove
  gpu_report.py status                      the status line the docs show (bench/docs_tables.py's
                                            `gpu.status`)

JSON defaults to the newest record: bench/results/gpu_check.json or any file of
bench/results/gpu_runs/, by date. docs/gpu.md names the failures of that record
between two markers:

    <!-- gpu-fixes: gpu_runs/2026-11-27-e439015.json -->
    | failed in that run | fixed by | what was wrong |
    |---|---|---|
    | `hf_cuda_test` | `9451fe9` | ... |
    <!-- /gpu-fixes -->

(the record's path under bench/results/; a row per failed or skipped test,
`compute-sanitizer` for a sanitizer error or a missing sanitizer run, `stage
NAME` for a failed stage); each commit must come after the record's.
"""

import datetime
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DEFAULT = os.path.join(RESULTS, "gpu_check.json")
# What runs on a GPU: the CUDA backend (its device, kernels, NCCL and host
# transports, binding, offload copies, instance list), cuDNN's fused attention
# and the runtime's CUDA part, and every generic header a Cuda trainer
# compiles (the device concept and fused-attention hook, kernels, units,
# strategies, the Trainer); for records older than include/dtrain/backend/,
# the CUDA communicator's paths before it (the other old paths are in the
# folders named).
CUDA_PATHS = ["include/dtrain/backend/cuda", "cmake/dtrain_cudnn.cpp", "cmake/dtrain_runtime_cuda.cu",
              "include/dtrain/comm/nccl.hpp", "include/dtrain/comm/cuda_binding.hpp",
              "include/dtrain/device", "include/dtrain/kernels", "include/dtrain/comm/binding.hpp",
              "include/dtrain/offload", "include/dtrain/strategy", "include/dtrain/nn", "include/dtrain/optim",
              "include/dtrain/train", "include/dtrain/hf/model.hpp", "tests/kernels/kernels_cuda_test.cu",
              "tests/nn/nn_cuda_test.cu", "tests/strategy/strategies_cuda_test.cu", "tests/hf/hf_cuda_test.cu",
              "tests/comm/nccl_test.cpp"]


def read_env(path):
    """KEY=VALUE lines (probe.env)."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep:
                    out[key] = value
    return out


def junit_tests(path):
    """(name, result, seconds) for every test of a ctest --output-junit file."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            result = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
            result = "failed"
        else:
            result = "passed"
        tests.append({"name": case.get("name"), "result": result, "seconds": round(float(case.get("time", 0)), 2)})
    return tests


def sanitizer_runs(report):
    """Each compute-sanitizer log's tool, program, error count and exit status."""
    runs = []
    for name in sorted(os.listdir(report)):
        m = re.fullmatch(r"sanitize_(\w+?)_(.+)\.log", name)
        if not m:
            continue
        with open(os.path.join(report, name), errors="replace") as f:
            text = f.read()
        summary = re.findall(r"ERROR SUMMARY: (\d+) error", text)
        status = re.findall(r"^=== gpu_check: exit (\d+)$", text, re.M)
        # No summary: the tool never ran to the end (missing, crashed): one error.
        errors = int(summary[-1]) if summary else 1
        runs.append({"tool": m.group(1), "program": m.group(2), "errors": errors,
                     "exit": int(status[-1]) if status else None})
    return runs


def write(report, out):
    probe = read_env(os.path.join(report, "probe.env"))
    stages = []
    stages_file = os.path.join(report, "stages.tsv")
    if os.path.exists(stages_file):
        with open(stages_file) as f:
            for line in f:
                name, seconds, rc = line.split()
                stages.append({"stage": name, "seconds": int(seconds), "exit": int(rc)})
    tests = []
    # gpu: the default paths; paths: every new GPU path on (named so in the record)
    for name, suffix in (("gpu", ""), ("paths", " [new paths]")):
        junit = os.path.join(report, f"{name}_junit.xml")
        if os.path.exists(junit):
            tests += [dict(t, name=t["name"] + suffix) for t in junit_tests(junit)]
    sanitize = sanitizer_runs(report)
    count = lambda r: sum(1 for t in tests if t["result"] == r)  # noqa: E731
    gpus = int(probe.get("gpus") or 1)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": probe.get("commit", "unknown"),
        "dirty": probe.get("dirty") == "true",
        "machine": {"cpu": probe.get("cpu") or "unknown", "cores": int(probe.get("cpus") or 0),
                    "gpu": f"{gpus} x {probe.get('device') or 'unknown'}", "driver": probe.get("driver") or "unknown",
                    **{k: probe[k] for k in ("compiler", "cmake", "torch", "nccl") if k in probe}},
        "device": probe.get("device") or "unknown",
        "driver": probe.get("driver") or "unknown",
        "cuda": probe.get("cuda") or "unknown",
        "tests_run": len(tests),
        "passed": count("passed"),
        "failed": count("failed"),
        "skipped": count("skipped"),
        "sanitizer_errors": sum(r["errors"] for r in sanitize),
        "wall_s": sum(s["seconds"] for s in stages),
        "stages": stages,
        "tests": tests,
        "sanitizer": sanitize,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"gpu_report: {record['tests_run']} GPU test(s): {record['passed']} passed, {record['failed']} failed, "
          f"{record['skipped']} skipped; {record['sanitizer_errors']} sanitizer error(s); {record['wall_s']} s; "
          f"wrote {out}")
    return 0


def records():
    """(path under bench/results/, record) of every GPU check kept, oldest first."""
    found = []
    for name in ["gpu_check.json"] + sorted(os.path.join("gpu_runs", f) for f in os.listdir(
            os.path.join(RESULTS, "gpu_runs")) if f.endswith(".json")):
        path = os.path.join(RESULTS, name)
        if os.path.exists(path):
            with open(path) as f:
                found.append((name, json.load(f)))
    return sorted(found, key=lambda r: str(r[1].get("date", "")))


def newest():
    found = records()
    return found[-1] if found else (None, None)


def problems_of(r):
    """{key: why} of everything the record shows wrong: keys as docs/gpu.md's table of fixes names them."""
    out = {}
    if r.get("tests_run", 0) == 0:
        out["tests"] = "it ran no test"
    for t in r.get("tests", []):
        if t["result"] != "passed":
            out[t["name"]] = t["result"]
    if r.get("sanitizer_errors", 0):
        out["compute-sanitizer"] = f"{r['sanitizer_errors']} sanitizer error(s)"
    elif not r.get("sanitizer"):
        out["compute-sanitizer"] = "no compute-sanitizer run"
    for s in r.get("stages", []):
        if s["exit"] != 0 and s["stage"] not in ("gpu", "paths", "sanitize"):
            out[f"stage {s['stage']}"] = f"stage {s['stage']} exited {s['exit']}"
    return out


FIXES = re.compile(r"<!-- gpu-fixes: (\S+) -->\n(.*?)<!-- /gpu-fixes -->", re.S)


def named_fixes(doc):
    """The record docs/gpu.md's table of fixes is about, and {key: commit} of its rows."""
    m = FIXES.search(doc)
    if not m:
        return None, {}
    rows = {}
    for line in m.group(2).splitlines()[2:]:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return m.group(1), rows


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)


def history_known():
    r = git("rev-parse", "--is-shallow-repository")
    return r.returncode == 0 and r.stdout.strip() == "false"


def check(path):
    if path is None:
        name, r = newest()
        if r is None:
            print("gpu_report: no GPU check recorded yet (bench/results/gpu_check.json, bench/results/gpu_runs/): "
                  "nothing to hold the code to; skipped (exit 77)")
            return 77
    else:
        if not os.path.exists(path):
            print(f"gpu_report: no record at {path}; skipped (exit 77)")
            return 77
        name = os.path.relpath(os.path.abspath(path), RESULTS)
        with open(path) as f:
            r = json.load(f)
    commit = str(r.get("commit", "unknown")).removesuffix("+dirty")
    with open(os.path.join(ROOT, "docs", "gpu.md")) as f:
        doc = f.read()
    complaints = []
    if commit[:7] not in doc:
        complaints.append(f"docs/gpu.md does not name the commit it records ({commit[:12]})")
    found = problems_of(r)
    about, fixes = named_fixes(doc)
    if found and about != name:
        complaints.append(f"docs/gpu.md's table of fixes (<!-- gpu-fixes: ... -->) is about {about or 'no record'}, "
                          f"not the newest, {name}")
        fixes = {}
    known = history_known()
    for key, why in found.items():
        fix = fixes.get(key)
        if not fix:
            complaints.append(f"{key}: {why}, and docs/gpu.md's table of fixes names no commit that fixes it")
        elif known and git("merge-base", "--is-ancestor", commit, fix).returncode != 0:
            complaints.append(f"{key}: the fix named, {fix}, is not a commit after the record's {commit[:12]}")
    for key in fixes:
        if key not in found:
            complaints.append(f"docs/gpu.md's table of fixes names {key}, which did not fail in {name}")
    if complaints:
        print(f"gpu_report: bench/results/{name} (commit {commit[:12]}, {r.get('date')}): " + "; ".join(complaints) +
              ". Fix the cause and name the fix in docs/gpu.md, or rerun scripts/gpu_check.sh on a GPU and record "
              "it (docs/dev/gpu_check.md).")
        return 1
    if found:
        print(f"gpu_report: bench/results/{name}: {len(found)} failure(s), each fixed since by a commit docs/gpu.md "
              "names; awaiting the next GPU run")
    else:
        print(f"gpu_report: {r['tests_run']} GPU tests passed on {r['device']} at {commit[:12]} ({r['date']}), "
              "no sanitizer error")
    return 0


class Unknowable(Exception):
    """What cannot be told from this checkout (a shallow clone, no git)."""


def gpu_changes_since(commit):
    """How many commits since `commit` changed code a GPU runs, counting uncommitted
    changes to it as one more (so the docs written before a commit agree after it)."""
    commit = commit.removesuffix("+dirty")
    if not history_known() or git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise Unknowable(f"the history back to {commit[:12]} is not in this checkout")
    log = git("log", "--format=%h", f"{commit}..HEAD", "--", *CUDA_PATHS)
    pending = git("status", "--porcelain", "--untracked-files=no", "--", *CUDA_PATHS).stdout.strip()
    return len(log.stdout.split()) + (1 if pending else 0)


def status_lines():
    """The docs' GPU status: the newest record, and whether the code has changed since."""
    name, r = newest()
    if r is None:
        return ["**GPU status:** no GPU check has been recorded: nothing here has run on a GPU."]
    commit = str(r["commit"]).removesuffix("+dirty")
    since = gpu_changes_since(commit)
    counts = f"{r['passed']} GPU tests passed, {r['failed']} failed, {r['skipped']} skipped"
    machine = r.get("machine", {})
    gpu = machine.get("gpu") or r.get("device")
    head = (f"**GPU status** (from `bench/results/{name}`): the newest GPU check ran on {gpu} (driver "
            f"{r.get('driver', machine.get('driver', '?'))}, CUDA {r.get('cuda', '?')}) on {str(r['date'])[:10]} at "
            f"commit `{commit[:7]}`: {counts}.")
    if since:
        tail = (f" {since} commit{'s' if since != 1 else ''} since then change{'' if since != 1 else 's'} code a GPU "
                "runs: the GPU path has not run on the current code.")
    else:
        tail = " No code a GPU runs has changed since."
    return [head + tail]


def changes(path):
    if os.path.exists(path):
        with open(path) as f:
            commit = json.load(f)["commit"].removesuffix("+dirty")
    else:
        commit = path  # a commit, not a record
    log = subprocess.run(["git", "-C", ROOT, "log", "--format=%h %ad %<(90,trunc)%s", "--date=short", f"{commit}..HEAD", "--", *CUDA_PATHS],
                         capture_output=True, text=True)
    if log.returncode != 0:
        print(f"gpu_report: git log failed: {log.stderr.strip()}", file=sys.stderr)
        return 1
    lines = log.stdout.strip().splitlines()
    print(f"{len(lines)} commit(s) since {commit[:12]} changed CUDA code" + (":" if lines else ""))
    for line in lines:
        print("  " + line)
    return 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "write" and len(argv) == 3:
        return write(argv[1], argv[2])
    if argv == ["status"]:
        print("\n".join(status_lines()))
        return 0
    if len(argv) >= 1 and argv[0] in ("check", "changes") and len(argv) <= 2:
        if argv[0] == "check":
            return check(argv[1] if len(argv) == 2 else None)
        if len(argv) == 1:
            name, r = newest()
            if r is None:
                print("gpu_report: no record: name a commit (gpu_report.py changes COMMIT)", file=sys.stderr)
                return 2
            path = os.path.join(RESULTS, name)
        else:
            path = argv[1]
        return changes(path)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

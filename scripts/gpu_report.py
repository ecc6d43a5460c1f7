#!/usr/bin/env python3
"""The GPU check's record (docs/dev/gpu_check.md), and the check that keeps it true.

usage:
  gpu_report.py write REPORT_DIR OUT_JSON   the record of a scripts/gpu_check.sh run, from its
                                            report folder: probe.env, stages.tsv, gpu_junit.xml
                                            and sanitize_*.log
  gpu_report.py check [JSON]                exit 1 when the record shows a failed or skipped test,
                                            a sanitizer error or no test at all, or when
                                            docs/gpu.md does not name its commit; exit 77 (skipped)
                                            when there is no record yet
  gpu_report.py changes [JSON | COMMIT]     the commits since the recorded one (or COMMIT) that
                                            touched code a GPU runs: what a new GPU run must prove

JSON defaults to bench/results/gpu_check.json.
"""

import datetime
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "bench", "results", "gpu_check.json")
# What runs on a GPU: the device, its kernels, the NCCL and GPU bindings, and
# every header a Cuda trainer compiles (units, strategies, the Trainer).
CUDA_PATHS = ["include/dtrain/device", "include/dtrain/kernels", "include/dtrain/comm/nccl.hpp",
              "include/dtrain/strategy", "include/dtrain/nn", "include/dtrain/optim", "include/dtrain/train",
              "include/dtrain/hf/model.hpp", "tests/kernels/kernels_cuda_test.cu", "tests/nn/nn_cuda_test.cu",
              "tests/strategy/strategies_cuda_test.cu", "tests/hf/hf_cuda_test.cu", "tests/comm/nccl_test.cpp"]


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
    record = {
        "device": probe.get("device") or "unknown",
        "driver": probe.get("driver") or "unknown",
        "cuda": probe.get("cuda") or "unknown",
        "commit": probe.get("commit", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {k: probe[k] for k in ("cpus", "compiler", "cmake", "torch", "nccl") if k in probe},
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


def check(path):
    if not os.path.exists(path):
        print(f"gpu_report: no GPU check recorded yet ({os.path.relpath(path, ROOT)}): nothing to hold the code to; "
              "skipped (exit 77)")
        return 77
    with open(path) as f:
        r = json.load(f)
    problems = []
    if r.get("tests_run", 0) == 0:
        problems.append("it ran no test")
    for key in ("failed", "skipped", "sanitizer_errors"):
        if r.get(key, 0):
            problems.append(f"{key} = {r[key]}")
    problems += [f"{t['name']} {t['result']}" for t in r.get("tests", []) if t["result"] != "passed"]
    problems += [f"stage {s['stage']} exited {s['exit']}" for s in r.get("stages", []) if s["exit"] != 0]
    if not r.get("sanitizer"):
        problems.append("no compute-sanitizer run")
    with open(os.path.join(ROOT, "docs", "gpu.md")) as f:
        if r.get("commit", "unknown") not in f.read():
            problems.append(f"docs/gpu.md does not name the commit it proves ({r.get('commit')})")
    if problems:
        print(f"gpu_report: {os.path.relpath(path, ROOT)} (commit {r.get('commit')}, {r.get('date')}) records: "
              + "; ".join(problems) + ". Fix the cause, rerun scripts/gpu_check.sh on a GPU and record it "
              "(docs/dev/gpu_check.md).")
        return 1
    print(f"gpu_report: {r['tests_run']} GPU tests passed on {r['device']} at {r['commit'][:12]} ({r['date']}), "
          "no sanitizer error")
    return 0


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
    if len(argv) >= 1 and argv[0] in ("check", "changes") and len(argv) <= 2:
        path = argv[1] if len(argv) == 2 else DEFAULT
        if argv[0] == "check":
            return check(path)
        if not os.path.exists(path) and len(argv) == 1:
            print(f"gpu_report: no record at {path}: name a commit (gpu_report.py changes COMMIT)", file=sys.stderr)
            return 2
        return changes(path)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tables and JSON for the LibTorch benchmark (bench/run_libtorch_bench.sh).

usage: summarize.py WORK_DIR --layouts 2x1,1x2 --sides dtrain-ddp,dtrain-fsdp[,torch-ddp,torch-fsdp2]
                    --repeat N --warmup W --cores C --lm-batch B --resnet-batch B --steps S
                    --size default|smoke --lm "KEYS" --resnet "KEYS" --json OUT
Reads, for every model, layout RxT, side and run i = 1..N:
  WORK_DIR/<model>.RxT.dtrain-*.<i>.jsonl  train_libtorch's metrics (step_ms per step) and the .log
                                           beside it (the banner with the parameter count, "memory
                                           per rank (...): params X | grads Y | optimizer Z ..." and
                                           "peak resident memory (rank 0): X MiB")
  WORK_DIR/<model>.RxT.torch-*.<i>.json    bench/libtorch/peer.py's record
prints one row per model and layout with each side's median step (median of the runs'
medians) and rank 0's peak resident set, the speed of dtrain's DDP over PyTorch's DDP and of
dtrain's FSDP over FSDP2, and dtrain FSDP's model state per rank against the sharded size;
writes every run's figures, the versions, the date, commit and machine to OUT.
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)


def dtrain_run(stem, warmup):
    with open(stem + ".jsonl") as f:
        steps = [json.loads(line)["step_ms"] for line in f if line.strip() and "step_ms" in line]
    run = {"step_ms": steps, "median_ms": statistics.median(steps[warmup:])}
    with open(stem + ".log") as f:
        for line in f:
            if "peak resident memory (rank 0):" in line:
                run["peak_rss_mib"] = float(line.split(":")[-1].split()[0])
            m = re.search(r"train_libtorch: \w+ \(LibTorch ([^,]+), (\d+) parameters", line)
            if m:
                run["libtorch"], run["parameters"] = m.group(1), int(m.group(2))
            m = re.search(r"memory per rank \([^)]*\): params ([\d.]+) \| grads ([\d.]+) \| optimizer ([\d.]+)", line)
            if m:
                run["state_mib"] = round(sum(float(g) for g in m.groups()), 3)
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("layouts", "sides", "size", "lm", "resnet"):
        p.add_argument(f"--{name}", required=True)
    for name in ("repeat", "warmup", "cores", "lm_batch", "resnet_batch", "steps"):
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, required=True)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    sides = a.sides.split(",")
    peer = "torch-ddp" in sides
    rows, versions = [], {}
    header = f"{'model':>7} {'ranks x thr':>11}" + "".join(f" {s + ' ms':>15} {'MiB':>6}" for s in sides)
    if peer:
        header += f" {'DDP x':>6} {'FSDP x':>7}"
    header += f" {'FSDP state/shard':>17}"
    print(header)
    for model in ("lm", "resnet"):
        batch = a.lm_batch if model == "lm" else a.resnet_batch
        for layout in a.layouts.split(","):
            ranks, _, threads = layout.partition("x")
            ranks, threads = int(ranks), int(threads)
            row = {"model": model, "layout": layout, "ranks": ranks, "threads_per_rank": threads,
                   "batch_per_rank": batch, "sides": {}}
            for side in sides:
                runs = []
                for i in range(1, a.repeat + 1):
                    stem = f"{a.work}/{model}.{layout}.{side}.{i}"
                    if side.startswith("dtrain"):
                        runs.append(dtrain_run(stem, a.warmup))
                    else:
                        with open(stem + ".json") as f:
                            runs.append(json.load(f))
                rss = [r["peak_rss_mib"] for r in runs if "peak_rss_mib" in r]
                median = statistics.median(r["median_ms"] for r in runs)
                row["sides"][side] = {"median_ms": round(median, 2),
                                      "samples_per_s": round(ranks * batch / (median / 1000.0), 2),
                                      "peak_rss_mib": round(statistics.median(rss), 1) if rss else None,
                                      "runs": runs}
                first = runs[0]
                if "parameters" in first:
                    row["parameters"] = first["parameters"]
                if "libtorch" in first:
                    versions["dtrain_libtorch"] = first["libtorch"]
                if "torch" in first:
                    versions["peer_torch"] = first["torch"]
                    versions["peer_optimizer"] = first.get("optimizer")
            fsdp = row["sides"]["dtrain-fsdp"]["runs"][0]
            if "state_mib" in fsdp and "parameters" in row:
                shard = 16.0 * row["parameters"] / ranks / 2**20  # fp32 weights, gradients, AdamW's two moments
                row["fsdp_state_mib"] = fsdp["state_mib"]
                row["fsdp_sharded_mib"] = round(shard, 3)
                row["fsdp_state_over_shard"] = round(fsdp["state_mib"] / shard, 4)
            if peer:
                s = row["sides"]
                row["ddp_speed_vs_torch"] = round(s["torch-ddp"]["median_ms"] / s["dtrain-ddp"]["median_ms"], 3)
                row["fsdp_speed_vs_torch"] = round(s["torch-fsdp2"]["median_ms"] / s["dtrain-fsdp"]["median_ms"], 3)
            rows.append(row)
            line = f"{model:>7} {f'{ranks} x {threads}':>11}"
            for side in sides:
                v = row["sides"][side]
                mib = f"{v['peak_rss_mib']:>6.0f}" if v["peak_rss_mib"] is not None else f"{'-':>6}"
                line += f" {v['median_ms']:>15.1f} {mib}"
            if peer:
                line += f" {row['ddp_speed_vs_torch']:>6.2f} {row['fsdp_speed_vs_torch']:>7.2f}"
            ratio = row.get("fsdp_state_over_shard")
            line += f" {ratio:>17.3f}" if ratio is not None else f" {'-':>17}"
            print(line)
    out = {**run_record(cores=a.cores), "benchmark": "libtorch", "size": a.size, "steps": a.steps, "warmup": a.warmup, "repeat": a.repeat,
           "models": {"lm": a.lm, "resnet": a.resnet},
           "settings": "fp32, AdamW lr 3e-3 weight decay 0.1, random batches; dtrain: train_libtorch (the model's "
                       "blocks as dtrain units) under DDP and FSDP full shard; peer: the same model in Python under "
                       "DistributedDataParallel and FSDP2 (fully_shard per block), gloo",
           "versions": versions, "rows": rows}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

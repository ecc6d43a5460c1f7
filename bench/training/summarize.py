"""Merges one bench/run_training_bench.sh run into bench/results/training.json and prints the tables.

usage: summarize.py WORK_DIR REPEAT CORES WARMUP TARGET_JSON
WORK_DIR holds, for each run i in 1..REPEAT: adamw.i.json, adamw_no_errno.i.json,
torch_adamw.i.json, mlp.{1,2}.i.jsonl (train_mlp metrics), torch_mlp.{1,2}.i.json;
and overhead.<threads>.json (bench_ddp_overhead).
"""

import json
import os
import platform
import sys
import time


def median(values):
    """The benches' median: the upper middle for even counts."""
    return sorted(values)[len(values) // 2]


def summary(ms_runs, bytes_moved):
    ms = median(ms_runs)
    return {"runs_ms": ms_runs, "ms": ms, "gbps": round(bytes_moved / ms / 1e6, 3)}


def adamw_results(load):
    """Per size: the median over runs of each run's median time."""
    sides = {"dtrain": load("adamw"), "dtrain_no_errno": load("adamw_no_errno")}
    torch_runs = load("torch_adamw")
    rows = []
    for n in [r["elements"] for r in sides["dtrain"][0]["results"]]:
        def times(run_list, key="adamw_ms", variant=None):
            return [r[key] for run in run_list for r in run["results"]
                    if r["elements"] == n and r.get("variant") == variant]
        row = {"elements": n}
        for name, run_list in sides.items():
            row[name] = summary(times(run_list), 28 * n)
        # Both dtrain builds measure the references the same way: pool their runs.
        pooled = sides["dtrain"] + sides["dtrain_no_errno"]
        row["stream"] = summary(times(pooled, "stream_ms"), 28 * n)
        row["copy"] = summary(times(pooled, "copy_ms"), 16 * n)
        for variant in ("single-tensor", "foreach"):
            row["torch_" + variant] = summary(times(torch_runs, variant=variant), 28 * n)
        rows.append(row)
    # Each size's reference is the pass with AdamW's own traffic (4 streams
    # read, 3 written) through the same threads at the same size: the share
    # says how close to memory-bound AdamW runs, and cannot pass 100% by
    # accounting (memcpy's figure, kept for information, misses the
    # write-allocate reads its destination costs).
    for r in rows:
        best_torch = min(r["torch_single-tensor"]["ms"], r["torch_foreach"]["ms"])
        for name in list(sides) + ["torch_single-tensor", "torch_foreach"]:
            r[name]["vs_stream"] = round(r["stream"]["ms"] / r[name]["ms"], 3)
        for name in sides:
            r[name]["speedup_vs_torch"] = round(best_torch / r[name]["ms"], 3)
    return {"torch": torch_runs[0]["implementation"], "results": rows}


def mlp_results(work, runs, cores, warmup):
    """Per run: the median step after the warm-up (rank 0); reported: the median of the runs."""
    rows = []
    for n in (1, 2):
        d_runs, t_runs = [], []
        for i in runs:
            with open(os.path.join(work, f"mlp.{n}.{i}.jsonl")) as f:
                steps = [json.loads(line)["step_ms"] for line in f]
            d_runs.append(median(steps[warmup:]))
            with open(os.path.join(work, f"torch_mlp.{n}.{i}.json")) as f:
                t_runs.append(json.load(f)["median_step_ms"])
        d, t = median(d_runs), median(t_runs)
        rows.append({"ranks": n, "threads_per_rank": max(1, cores // n),
                     "dtrain": {"runs_step_ms": d_runs, "step_ms": d, "samples_per_s": round(64 * n / d * 1e3, 1)},
                     "torch": {"runs_step_ms": t_runs, "step_ms": t, "samples_per_s": round(64 * n / t * 1e3, 1)},
                     "speedup": round(t / d, 3)})
    return rows


def print_tables(adamw, mlp, overhead, cores, warmup):
    print(f"\n(a) AdamW over one flat fp32 buffer, one process, {cores} thread(s); GB/s = 28 bytes per element / time")
    kinds = ("dtrain", "dtrain_no_errno", "torch_single-tensor", "torch_foreach")
    print(f"{'elements':>9} | {'dtrain':>15} | {'dtrain no-errno':>15} | {'torch 1-tensor':>15} | "
          f"{'torch foreach':>15} | {'stream GB/s':>11} | {'copy GB/s':>9}")
    print(f"{'':>9} | " + " | ".join(f"{'ms':>7} {'GB/s':>7}" for _ in kinds) + " |")
    for r in adamw["results"]:
        cells = " | ".join(f"{r[k]['ms']:>7.1f} {r[k]['gbps']:>7.2f}" for k in kinds)
        print(f"{r['elements'] // 1_000_000:>8}M | {cells} | {r['stream']['gbps']:>11.2f} | {r['copy']['gbps']:>9.2f}")
    print("stream: AdamW's own traffic (read param, grad, m, v; write param, m, v) with one add each, same threads "
          "and size; copy: memcpy, bytes read + written, for information")
    for name, label in (("dtrain", "dtrain (default flags):"), ("dtrain_no_errno", "dtrain (-fno-math-errno):")):
        print(f"{label:<26}" + "; ".join(f"{r['elements'] // 1_000_000}M {r[name]['vs_stream']:.0%} of stream, "
                                         f"{r[name]['speedup_vs_torch']:.2f}x torch's faster variant"
                                         for r in adamw["results"]))

    print(f"\n(b) MLP training step (median after {warmup} warm-up steps)")
    print(f"{'ranks':>5} {'threads/rank':>13} | {'train_mlp ms':>12} {'samples/s':>10} | {'torch DDP ms':>12} "
          f"{'samples/s':>10} | {'dtrain/torch':>12}")
    for m in mlp:
        print(f"{m['ranks']:>5} {m['threads_per_rank']:>13} | {m['dtrain']['step_ms']:>12.3f} "
              f"{m['dtrain']['samples_per_s']:>10.0f} | {m['torch']['step_ms']:>12.3f} "
              f"{m['torch']['samples_per_s']:>10.0f} | {m['speedup']:>11.2f}x")

    for o in overhead:
        print(f"\n(c) DDP overhead at world size 1, {o['threads']} thread(s): Trainer {o['trainer_step_ms']:.3f} ms "
              f"({o['trainer_no_grad_norm_step_ms']:.3f} ms with grad_norm = false), hand-written loop "
              f"{o['hand_step_ms']:.3f} ms: {o['overhead_pct']:+.1f}% ({o['overhead_no_grad_norm_pct']:+.1f}%)")


def main():
    work, repeat, cores, warmup, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    runs = range(1, repeat + 1)

    def load(name):
        out = []
        for i in runs:
            with open(os.path.join(work, f"{name}.{i}.json")) as f:
                out.append(json.load(f))
        return out

    adamw = adamw_results(load)
    mlp = mlp_results(work, runs, cores, warmup)
    overhead = []
    for name in sorted(n for n in os.listdir(work) if n.startswith("overhead.")):
        with open(os.path.join(work, name)) as f:
            overhead.append(json.load(f))
    overhead.sort(key=lambda o: o["threads"])
    merged = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": cores, "kernel": platform.release(),
                    "load_average_at_end": os.getloadavg(),
                    "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "unset (OpenBLAS detects the CPU)")},
        "method": f"per run: the median over iterations (AdamW) or over the steps after the first {warmup} "
                  f"(MLP, rank 0); reported: the median of {repeat} alternating runs (every run's value kept)",
        "adamw": dict(threads=cores, bytes_per_element=28, **adamw),
        "mlp": {"model": "32-256-256-10 MLP, GELU, softmax cross-entropy, AdamW lr 1e-3, fp32, batch 64 per rank",
                "results": mlp},
        "ddp_overhead": overhead,
    }
    with open(target, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    print_tables(adamw, mlp, overhead, cores, warmup)
    shown = os.path.relpath(target)
    print(f"\nwritten: {target if shown.startswith('..') else shown}")


if __name__ == "__main__":
    main()

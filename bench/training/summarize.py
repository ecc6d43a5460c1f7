"""Merges one bench/run_training_bench.sh run into bench/results/training.json and prints the tables.

usage: summarize.py WORK_DIR REPEAT CORES WARMUP TARGET_JSON
WORK_DIR holds, for each run i in 1..REPEAT: adamw.i.json, adamw_no_errno.i.json,
torch_adamw.i.json, mlp.{1,2}.i.jsonl (train_mlp metrics), torch_mlp.{1,2}.i.json,
and in a full run the PyPI peer's peer_adamw.i.json and peer_mlp.{1,2}.i.json;
and overhead.<threads>.json (bench_ddp_overhead).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)


def median(values):
    """The benches' median: the upper middle for even counts."""
    return sorted(values)[len(values) // 2]


def summary(ms_runs, bytes_moved):
    ms = median(ms_runs)
    return {"runs_ms": ms_runs, "ms": ms, "gbps": round(bytes_moved / ms / 1e6, 3)}


def adamw_results(load, has_peer):
    """Per size: the median over runs of each run's median time."""
    sides = {"dtrain": load("adamw"), "dtrain_no_errno": load("adamw_no_errno")}
    torch_runs = load("torch_adamw")
    peer_runs = load("peer_adamw") if has_peer else []
    peer_variants = sorted({r["variant"] for run in peer_runs for r in run["results"]})
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
        for variant in peer_variants:
            row["peer_" + variant] = summary(times(peer_runs, variant=variant), 28 * n)
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
        if peer_variants:
            best_peer = min(r["peer_" + v]["ms"] for v in peer_variants)
            r["best_peer_variant"] = min(peer_variants, key=lambda v: r["peer_" + v]["ms"])
            for v in peer_variants:
                r["peer_" + v]["vs_stream"] = round(r["stream"]["ms"] / r["peer_" + v]["ms"], 3)
            for name in sides:
                r[name]["speedup_vs_peer"] = round(best_peer / r[name]["ms"], 3)
    out = {"torch": torch_runs[0]["implementation"], "results": rows}
    if peer_runs:
        out["peer"] = peer_runs[0]["implementation"] + " (PyPI)"
    return out


def mlp_results(work, runs, cores, warmup, has_peer):
    """Per run: the median step after the warm-up (rank 0); reported: the median of the runs."""
    rows = []
    for n in (1, 2):
        d_runs, t_runs, p_runs = [], [], []
        for i in runs:
            with open(os.path.join(work, f"mlp.{n}.{i}.jsonl")) as f:
                steps = [json.loads(line)["step_ms"] for line in f]
            d_runs.append(median(steps[warmup:]))
            with open(os.path.join(work, f"torch_mlp.{n}.{i}.json")) as f:
                t_runs.append(json.load(f)["median_step_ms"])
            if has_peer:
                with open(os.path.join(work, f"peer_mlp.{n}.{i}.json")) as f:
                    p_runs.append(json.load(f)["median_step_ms"])
        d, t = median(d_runs), median(t_runs)
        row = {"ranks": n, "threads_per_rank": max(1, cores // n),
               "dtrain": {"runs_step_ms": d_runs, "step_ms": d, "samples_per_s": round(64 * n / d * 1e3, 1)},
               "torch": {"runs_step_ms": t_runs, "step_ms": t, "samples_per_s": round(64 * n / t * 1e3, 1)},
               "speedup": round(t / d, 3)}
        if p_runs:
            p = median(p_runs)
            row["peer"] = {"runs_step_ms": p_runs, "step_ms": p, "samples_per_s": round(64 * n / p * 1e3, 1)}
            row["speedup_vs_peer"] = round(p / d, 3)
        rows.append(row)
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
                                         f"{r[name]['speedup_vs_torch']:.2f}x torch 1.13's faster variant"
                                         for r in adamw["results"]))
    if "peer" in adamw:
        print(f"peer: {adamw['peer']}")
        for r in adamw["results"]:
            variants = sorted(k[5:] for k in r if k.startswith("peer_") and isinstance(r[k], dict))
            print(f"{r['elements'] // 1_000_000:>8}M | " + " | ".join(
                f"{v} {r['peer_' + v]['ms']:.1f} ms {r['peer_' + v]['gbps']:.2f} GB/s" for v in variants) +
                f" | dtrain {r['dtrain']['speedup_vs_peer']:.2f}x, -fno-math-errno "
                f"{r['dtrain_no_errno']['speedup_vs_peer']:.2f}x the peer's fastest ({r['best_peer_variant']})")

    print(f"\n(b) MLP training step (median after {warmup} warm-up steps)")
    print(f"{'ranks':>5} {'threads/rank':>13} | {'train_mlp ms':>12} {'samples/s':>10} | {'torch DDP ms':>12} "
          f"{'samples/s':>10} | {'dtrain/torch':>12}")
    for m in mlp:
        print(f"{m['ranks']:>5} {m['threads_per_rank']:>13} | {m['dtrain']['step_ms']:>12.3f} "
              f"{m['dtrain']['samples_per_s']:>10.0f} | {m['torch']['step_ms']:>12.3f} "
              f"{m['torch']['samples_per_s']:>10.0f} | {m['speedup']:>11.2f}x" +
              (f" | peer DDP {m['peer']['step_ms']:.3f} ms: {m['speedup_vs_peer']:.2f}x" if "peer" in m else ""))

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

    has_peer = os.path.exists(os.path.join(work, "peer_adamw.1.json"))
    adamw = adamw_results(load, has_peer)
    mlp = mlp_results(work, runs, cores, warmup, has_peer)
    overhead = []
    for name in sorted(n for n in os.listdir(work) if n.startswith("overhead.")):
        with open(os.path.join(work, name)) as f:
            overhead.append(json.load(f))
    overhead.sort(key=lambda o: o["threads"])
    merged = {
        **run_record(cores, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "unset (OpenBLAS detects the CPU)")),
        "method": f"per run: the median over iterations (AdamW) or over the steps after the first {warmup} "
                  f"(MLP, rank 0); reported: the median of {repeat} alternating runs (every run's value kept)",
        "peers": {"debian": adamw["torch"], "pypi": adamw.get("peer")},
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

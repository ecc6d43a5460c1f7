"""Tables and JSON for one bench/run_strategy_bench.sh run.

usage: summarize.py WORK_DIR --repeat R --cores C --steps S --warmup W --features F --hidden H1,H2,...
                    --classes K --batch B --json TARGET
WORK_DIR holds, for each world size n and run i: LABEL.n.i.jsonl (train_mlp metrics, rank 0; LABEL a
strategy or fsdp-hybrid-gG), torch-ddp-{bf16,fp32}.n.i.json (bench/training/torch_ddp_mlp.py), and
fsdp_probe.json (torch_fsdp_probe.py).
"""

import argparse
import glob
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import cpu_info  # noqa: E402  (bench/machine.py)

MIB = 1 << 20
CATEGORIES = ("params", "grads", "optimizer", "master", "gathered", "activations")
MODEL_STATES = ("params", "grads", "optimizer", "master")  # as MemoryUsage::model_states()
ROW_ORDER = ("ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "fsdp-hybrid", "zero1")
TORCH_PRECISION = {"bf16": "(bf16 autocast)", "fp32": "(fp32)"}
# The ZeRO paper's optimizer-state bytes per parameter for mixed-precision
# Adam: fp32 master weights, momentum and variance.
K = 12

NOTES = [
    "ZeRO model: per-rank model states of the ZeRO paper (Rajbhandari et al. 2020) for mixed-precision Adam, "
    "K = 12, Psi parameters: DDP and NoShard (2+2+K)Psi, ZeRO-1 2Psi + 2Psi + K Psi/N, ZeRO-2 (ShardGradOp) "
    "2Psi + (2+K)Psi/N, ZeRO-3 (FullShard) (2+2+K)Psi/N, HybridShard ZeRO-3 with N = its shard group.",
    "model states = params + grads + optimizer + master (dtrain's MemoryUsage::model_states()); gathered and "
    "activations are transient peaks, not model states; total = every category.",
    "dtrain keeps fp32 gradient shards (4 bytes per parameter, where the paper counts 2) and no persistent bf16 "
    "copy under FSDP (each gather casts the fp32 master shard), so its FullShard and HybridShard model states "
    "are 16Psi/N, the formula's total with a different split.",
    "ShardGradOp and NoShard keep every gathered unit (bf16) from its forward to its backward in 'gathered': "
    "the 2Psi of full parameters the paper counts as ZeRO-2 model state sits there, not in 'params'.",
    "DDP and ZeRO1 keep the bf16 gradient backward writes and an fp32 accumulator the reduction reads "
    "(6 bytes per parameter where the paper counts 2): DDP 20Psi; ZeRO1 also keeps its fp32 gradient shard, "
    "(2 + 6 + 4/N + 12/N)Psi.",
]


def mlp_parameters(features, hidden, classes):
    """Psi of train_mlp's model: a Linear with bias per hidden width, then the classifier."""
    widths = [features] + hidden + [classes]
    return sum(i * o + o for i, o in zip(widths, widths[1:]))


def split_label(label):
    """(strategy, shard group or None) of a run label such as fsdp-hybrid-g2."""
    if label.startswith("fsdp-hybrid-g"):
        return "fsdp-hybrid", int(label[len("fsdp-hybrid-g"):])
    return label, None


def zero_model(strategy, group, n, psi):
    """(ZeRO stage, bytes per rank) of the paper's model for a dtrain strategy at world size n."""
    if strategy in ("ddp", "fsdp-no-shard"):
        return "DDP", (2 + 2 + K) * psi
    if strategy == "zero1":
        return "ZeRO-1", 2 * psi + 2 * psi + K * psi / n
    if strategy == "fsdp-grad-op":
        return "ZeRO-2", 2 * psi + (2 + K) * psi / n
    if strategy == "fsdp-full":
        return "ZeRO-3", (2 + 2 + K) * psi / n
    return f"ZeRO-3, N = {group}", (2 + 2 + K) * psi / group


def read_metrics(path, warmup):
    """(median step ms after the warm-up, the memory object of the last step) of one train_mlp run."""
    with open(path) as f:
        steps = [json.loads(line) for line in f]
    return statistics.median_high([s["step_ms"] for s in steps[warmup:]]), steps[-1]["memory"]


def speed(runs_ms, n, batch):
    ms = statistics.median_high(runs_ms)
    return {"runs_step_ms": [round(m, 4) for m in runs_ms], "step_ms": round(ms, 4),
            "samples_per_s": round(n * batch / ms * 1e3, 1)}


def dtrain_row(work, label, n, runs, args, psi):
    measured = [read_metrics(os.path.join(work, f"{label}.{n}.{i}.jsonl"), args.warmup) for i in runs]
    memory = measured[0][1]
    strategy, group = split_label(label)
    stage, model_bytes = zero_model(strategy, group, n, psi)
    states = sum(memory[c] for c in MODEL_STATES)
    row = {"implementation": "dtrain", "strategy": strategy, "shard_group": group,
           **speed([ms for ms, _ in measured], n, args.batch),
           "memory_bytes": memory, "memory_same_in_every_run": all(m == memory for _, m in measured),
           "model_states_bytes": states, "total_bytes": sum(memory[c] for c in CATEGORIES),
           "zero_model": {"stage": stage, "bytes": round(model_bytes)},
           "model_states_vs_zero_model": round(states / model_bytes, 3)}
    if not row["memory_same_in_every_run"]:
        row["runs_memory_bytes"] = [m for _, m in measured]
    return row


def torch_row(work, precision, n, runs, batch):
    results = []
    for i in runs:
        with open(os.path.join(work, f"torch-ddp-{precision}.{n}.{i}.json")) as f:
            results.append(json.load(f))
    return {"implementation": results[0]["implementation"], "strategy": "torch-ddp", "precision": precision,
            **speed([r["median_step_ms"] for r in results], n, batch)}


def labels_at(work, n):
    """dtrain run labels found for world size n, in table order (hybrid: larger groups first)."""
    found = {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(work, f"*.{n}.1.jsonl"))}

    def key(label):
        strategy, group = split_label(label)
        return ROW_ORDER.index(strategy), -(group or 0)
    return sorted(found, key=key)


def row_name(row):
    if row["strategy"] == "fsdp-hybrid":
        return f"fsdp-hybrid (group {row['shard_group']})"
    if row["strategy"] == "torch-ddp":
        return f"PyTorch DDP {TORCH_PRECISION[row['precision']]}"
    return row["strategy"]


def print_table(n, threads, rows, ddp_rate):
    print(f"\n{n} rank(s), {threads} thread(s) each; MiB per rank (rank 0); speed: median of the runs' medians")
    print("| strategy | samples/s | step ms | vs ddp | " + " | ".join(CATEGORIES) +
          " | model states | ZeRO model | ZeRO stage | total |")
    print("|---|" + "---:|" * (3 + len(CATEGORIES) + 2) + "---|---:|")
    for r in rows:
        cells = [row_name(r), f"{r['samples_per_s']:,.0f}", f"{r['step_ms']:.2f}",
                 f"{r['samples_per_s'] / ddp_rate:.2f}x"]
        if "memory_bytes" in r:
            cells += [f"{r['memory_bytes'][c] / MIB:.2f}" for c in CATEGORIES]
            cells += [f"{r['model_states_bytes'] / MIB:.2f}", f"{r['zero_model']['bytes'] / MIB:.2f}",
                      r["zero_model"]["stage"], f"{r['total_bytes'] / MIB:.2f}"]
        else:
            cells += ["n/a"] * len(CATEGORIES) + ["n/a", "n/a", "", "n/a"]
        print("| " + " | ".join(cells) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("repeat", "cores", "steps", "warmup", "features", "classes", "batch"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--hidden", required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    hidden = [int(h) for h in args.hidden.split(",")]
    psi = mlp_parameters(args.features, hidden, args.classes)
    runs = range(1, args.repeat + 1)

    results = []
    for n in (1, 2, 3):
        rows = [dtrain_row(args.work, label, n, runs, args, psi) for label in labels_at(args.work, n)]
        rows += [torch_row(args.work, precision, n, runs, args.batch) for precision in TORCH_PRECISION]
        results.append({"ranks": n, "threads_per_rank": max(1, args.cores // n), "rows": rows})
    with open(os.path.join(args.work, "fsdp_probe.json")) as f:
        probe = json.load(f)

    merged = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {**cpu_info(), "cores": args.cores, "kernel": platform.release(),
                    "load_average_at_end": os.getloadavg()},
        "method": f"per run: the median step over steps {args.warmup + 1}..{args.steps} (rank 0; train_mlp's "
                  f"step_ms, the same span in the torch script); samples/s = ranks x batch / step; reported: the "
                  f"median of {args.repeat} runs, implementations alternating in an order rotated per run (every "
                  f"run kept); memory: rank 0's bytes by category after the last step (persistent categories "
                  f"current, gathered and activations their peak)",
        "model": {"features": args.features, "hidden": hidden, "classes": args.classes, "parameters": psi,
                  "activation": "gelu", "precision": "bf16 (fp32 master weights, fp32 gradient reduction)",
                  "optimizer": "AdamW lr 1e-3, weight decay 0", "batch_per_rank": args.batch},
        "zero_model_K": K,
        "notes": NOTES,
        "results": results,
        "torch_fsdp_probe": probe,
    }
    with open(args.json, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")

    print(f"\nModel: {args.features}-{'-'.join(map(str, hidden))}-{args.classes} MLP, Psi = {psi:,} parameters, "
          f"bf16, AdamW, batch {args.batch} per rank")
    for res in results:
        ddp_rate = next(r["samples_per_s"] for r in res["rows"] if r["strategy"] == "ddp")
        print_table(res["ranks"], res["threads_per_rank"], res["rows"], ddp_rate)
    print("\nNotes:")
    for note in NOTES:
        print(f"- {note}")
    print(f"\nPyTorch FSDP (torch {probe['torch']}, Python {probe['python']}, gloo, {probe['world_size']} ranks): "
          f"{'ran' if probe['ran'] else 'did not run'}")
    for s in probe["stages"]:
        print(f"- {s['stage']}: " + ("ok" if s["ok"] else s["error"]))
    for mode, t in probe["timings"].items():
        print(f"- {mode}: {t['median_step_ms']:.2f} ms per step, {t['samples_per_s']:,.0f} samples/s")
    shown = os.path.relpath(args.json)
    print(f"\nwritten: {args.json if shown.startswith('..') else shown}")


if __name__ == "__main__":
    main()

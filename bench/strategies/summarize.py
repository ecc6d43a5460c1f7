"""Tables and JSON for one bench/run_strategy_bench.sh run.

usage: summarize.py WORK_DIR --repeat R --cores C --steps S --warmup W --features F --hidden H1,H2,...
                    --classes K --batch B --json TARGET
WORK_DIR holds, for each world size n and run i: LABEL.n.i.jsonl (train_mlp metrics, rank 0; LABEL a
strategy or fsdp-hybrid-gG), torch-ddp-{bf16,fp32}.n.i.json (bench/training/torch_ddp_mlp.py on Debian's
torch) and torch_fsdp_probe.json (torch_fsdp_probe.py on it); in a run with the PyPI peer also
peer-ddp-{bf16,fp32}.n.i.json (torch_ddp_mlp.py --fused-adamw), peer-fsdp-{full,grad-op}.n.i.json
(torch_fsdp_probe.py --run; missing where it failed, its .log beside) and peer_fsdp_probe.json.
"""

import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)

MIB = 1 << 20
CATEGORIES = ("params", "grads", "optimizer", "master", "gathered", "activations")
MODEL_STATES = ("params", "grads", "optimizer", "master")  # as MemoryUsage::model_states()
ROW_ORDER = ("ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "fsdp-hybrid", "zero1")
TORCH_PRECISION = {"bf16": "bf16 autocast", "fp32": "fp32"}
# PyTorch's rows: (run label, the row's strategy) in table order. The peer's
# strategies are named apart from Debian's so that series stay apart in
# scripts/plot_metrics.py --scaling.
TORCH_LABELS = (("torch-ddp-bf16", "torch-ddp"), ("torch-ddp-fp32", "torch-ddp"),
                ("peer-ddp-bf16", "torch-peer-ddp"), ("peer-ddp-fp32", "torch-peer-ddp"),
                ("peer-fsdp-full", "torch-peer-fsdp-full"), ("peer-fsdp-grad-op", "torch-peer-fsdp-grad-op"))
TORCH_CATEGORIES = ("params", "grads", "optimizer")  # what torch_ddp_mlp.py's model_state_bytes counts
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
    "PyTorch rows: memory is the bytes of the tensors rank 0's model and optimizer hold after the last step "
    "(parameters, their .grad, optimizer state; a sharded tensor's local shard), in the params, grads and "
    "optimizer columns; DDP's gradient buckets (4Psi), FSDP's gathered parameters and activations are not "
    "tensors the model or optimizer hold and are not counted. fp32 parameters are the master copy there.",
    "PyTorch FSDP rows (the peer only: torch 1.13's FSDP does not run on the CPU), in the API the row names: "
    "FSDP1 (FullyShardedDataParallel, device_id=cpu; full = FULL_SHARD, grad-op = SHARD_GRAD_OP) or FSDP2 "
    "(fully_shard on a CPU mesh; full = reshard_after_forward True, grad-op = False); each Linear a unit, bf16 "
    "mixed precision (bf16 compute and gathers, fp32 sharded parameters and fp32 reduce-scatter), fused AdamW.",
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


def torch_row(work, label, strategy, n, runs, batch, psi):
    """A PyTorch row (DDP or FSDP) from its runs' JSON; None if this label did not run at n."""
    results = []
    for i in runs:
        path = os.path.join(work, f"{label}.{n}.{i}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            results.append(json.load(f))
    first = results[0]
    row = {"implementation": first["implementation"], "torch_version": first["implementation"].split()[1],
           "strategy": strategy, "precision": first["precision"], "fused_adamw": first.get("fused_adamw", False),
           **speed([r["median_step_ms"] for r in results], n, batch)}
    if "api" in first:  # FSDP: fsdp1 or fsdp2
        row["api"] = first["api"]
    memory = first.get("model_state_bytes")
    if memory:
        row["model_state_bytes"] = memory
        row["model_states_bytes"] = sum(memory[c] for c in TORCH_CATEGORIES)
        if any(r.get("model_state_bytes") != memory for r in results):
            row["runs_model_state_bytes"] = [r.get("model_state_bytes") for r in results]
        if "fsdp" in strategy:
            stage, model_bytes = zero_model("fsdp-full" if strategy.endswith("full") else "fsdp-grad-op",
                                            None, n, psi)
            row["zero_model"] = {"stage": stage, "bytes": round(model_bytes)}
    return row


def torch_failure(work, label, n, runs):
    """Why a PyTorch label has no row at world size n: its first failed run's last log line."""
    for i in runs:
        if not os.path.exists(os.path.join(work, f"{label}.{n}.{i}.json")):
            log = os.path.join(work, f"{label}.{n}.{i}.log")
            lines = [line.strip() for line in open(log)] if os.path.exists(log) else []
            lines = [line for line in lines if line]
            return {"label": label, "run": i, "error": lines[-1] if lines else "no output"}
    return None


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
    if row["implementation"] == "dtrain":
        return row["strategy"]
    version = ".".join(row["torch_version"].split(".")[:2])
    if "fsdp" in row["strategy"]:
        what = f"{row['api'].upper()} {row['strategy'].split('fsdp-', 1)[1]} (bf16 mixed precision"
    else:
        what = f"DDP ({TORCH_PRECISION[row['precision']]}"
    return f"PyTorch {version} {what}{', fused AdamW' if row.get('fused_adamw') else ''})"


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
        elif "model_state_bytes" in r:  # PyTorch: what its model and optimizer tensors hold
            cells += [f"{r['model_state_bytes'][c] / MIB:.2f}" if c in TORCH_CATEGORIES else ""
                      for c in CATEGORIES]
            zero = r.get("zero_model")
            cells += [f"{r['model_states_bytes'] / MIB:.2f}", f"{zero['bytes'] / MIB:.2f}" if zero else "",
                      zero["stage"] if zero else "", ""]
        else:
            cells += [""] * len(CATEGORIES) + ["", "", "", ""]
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

    has_peer = os.path.exists(os.path.join(args.work, "peer_fsdp_probe.json"))
    results = []
    for n in (1, 2, 3):
        rows = [dtrain_row(args.work, label, n, runs, args, psi) for label in labels_at(args.work, n)]
        failed = []
        for label, strategy in TORCH_LABELS:
            if label.startswith("peer") and not has_peer:
                continue
            row = torch_row(args.work, label, strategy, n, runs, args.batch, psi)
            if row is not None:
                rows.append(row)
            else:
                failed.append(torch_failure(args.work, label, n, runs))
        result = {"ranks": n, "threads_per_rank": max(1, args.cores // n), "rows": rows}
        if failed:
            result["did_not_run"] = failed
        results.append(result)
    probes = {}
    for side in ("torch", "peer"):
        path = os.path.join(args.work, f"{side}_fsdp_probe.json")
        if os.path.exists(path):
            with open(path) as f:
                probes["debian" if side == "torch" else "peer"] = json.load(f)
    versions = {side: probe["torch"] for side, probe in probes.items()}

    merged = {
        **run_record(args.cores),
        "method": f"per run: the median step over steps {args.warmup + 1}..{args.steps} (rank 0; train_mlp's "
                  f"step_ms, the same span in the torch scripts); samples/s = ranks x batch / step; reported: the "
                  f"median of {args.repeat} runs, implementations alternating in an order rotated per run (every "
                  f"run kept); memory: rank 0's bytes by category after the last step (persistent categories "
                  f"current, gathered and activations their peak)",
        "model": {"features": args.features, "hidden": hidden, "classes": args.classes, "parameters": psi,
                  "activation": "gelu", "precision": "bf16 (fp32 master weights, fp32 gradient reduction)",
                  "optimizer": "AdamW lr 1e-3, weight decay 0", "batch_per_rank": args.batch},
        "torch_versions": {"debian": versions.get("debian"), "peer": versions.get("peer"),
                           "peer_source": "PyPI (bench/lib.sh's bench_peer_python), CPU side" if has_peer else None},
        "zero_model_K": K,
        "notes": NOTES,
        "results": results,
        "torch_fsdp_probe": probes,
    }
    with open(args.json, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")

    print(f"\nModel: {args.features}-{'-'.join(map(str, hidden))}-{args.classes} MLP, Psi = {psi:,} parameters, "
          f"bf16, AdamW, batch {args.batch} per rank")
    print("PyTorch: " + ", ".join(f"{v} ({'Debian' if side == 'debian' else 'PyPI'})"
                                  for side, v in versions.items() if v))
    for res in results:
        ddp_rate = next(r["samples_per_s"] for r in res["rows"] if r["strategy"] == "ddp")
        print_table(res["ranks"], res["threads_per_rank"], res["rows"], ddp_rate)
        for f in res.get("did_not_run", []):
            print(f"- {f['label']} did not run (run {f['run']}): {f['error']}")
    print("\nNotes:")
    for note in NOTES:
        print(f"- {note}")
    for probe in probes.values():
        print(f"\nPyTorch FSDP probe (torch {probe['torch']}, Python {probe['python']}, gloo, "
              f"{probe['world_size']} ranks): {'ran' if probe['ran'] else 'did not run'}")
        for s in probe["stages"]:
            print(f"- {s['stage']}: " + ("ok" if s["ok"] else s["error"]))
        for mode, t in probe["timings"].items():
            print(f"- {mode}: {t['median_step_ms']:.2f} ms per step, {t['samples_per_s']:,.0f} samples/s")
    shown = os.path.relpath(args.json)
    print(f"\nwritten: {args.json if shown.startswith('..') else shown}")


if __name__ == "__main__":
    main()

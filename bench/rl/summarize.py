"""Tables and JSON of bench/run_rl_bench.sh from its work folder.

usage: summarize.py WORK --models M1,M2 --repeat N --warmup W --steps S --cores C --impls dtrain[,peer]
                    --new-tokens N --prompt L --json OUT
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)

parser = argparse.ArgumentParser()
parser.add_argument("work")
parser.add_argument("--models", required=True)
parser.add_argument("--repeat", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--cores", type=int, required=True)
parser.add_argument("--impls", required=True)
parser.add_argument("--new-tokens", type=int, required=True)
parser.add_argument("--prompt", type=int, required=True)
parser.add_argument("--json", required=True)
args = parser.parse_args()
models, impls = args.models.split(","), args.impls.split(",")


def read(name):
    with open(os.path.join(args.work, name)) as f:
        return f.read()


def find(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        raise SystemExit(f"summarize.py: no {what} in the log:\n{text[-2000:]}")
    return float(m.group(1))


def dtrain_dpo_ms(base):
    steps = [json.loads(line) for line in read(base + ".jsonl").splitlines() if '"loss"' in line]
    step = statistics.median(s["step_ms"] for s in steps[args.warmup:])
    ref = find(r"reference log-probabilities \(copy\): median ([0-9.]+) ms", read(base + ".log"), "reference time")
    return step + ref, step, ref


def median(values):
    return statistics.median(values) if values else None


def ratio(peer, ours):
    return peer / ours if peer and ours else None


out = {**run_record(args.cores),
       "method": "dpo: rank 0's median step after the warm-up, train_lm's step_ms plus its median reference "
                 "forward, beside trl_dpo_ddp.py's whole step; generate: train_lm's one call against the median of "
                 "3 hf_generate.py calls; grpo: train_lm's sampling and training time; medians over the repeats",
       "steps": args.steps, "warmup": args.warmup, "repeat": args.repeat, "dpo": [], "generate": [], "grpo": []}
print("DPO step (sigmoid, 2 pairs per rank, sequences of 128, full fine-tuning against a frozen copy), median ms")
print(f"{'model':<12} {'layout':<7} {'dtrain':>9} {'(step+ref)':>14} {'TRL':>9} {'TRL/dtrain':>10}")
for model in models:
    for n in (2, 1):
        layout = f"{n}x{args.cores // n}"
        ours = [dtrain_dpo_ms(f"dpo.{model}.{n}x.dtrain.{i}") for i in range(1, args.repeat + 1)]
        total = median([o[0] for o in ours])
        peer = None
        if "peer" in impls:
            peer = median([json.loads(read(f"dpo.{model}.{n}x.peer.{i}.json"))["median_ms"]
                           for i in range(1, args.repeat + 1)])
        row = {"model": model, "layout": layout, "dtrain_ms": total, "dtrain_step_ms": median([o[1] for o in ours]),
               "dtrain_reference_ms": median([o[2] for o in ours]), "trl_ms": peer, "ratio_vs_trl": ratio(peer, total)}
        out["dpo"].append(row)
        print(f"{model:<12} {layout:<7} {total:9.1f} {row['dtrain_step_ms']:7.1f}+{row['dtrain_reference_ms']:<6.1f} "
              f"{peer or float('nan'):9.1f} {row['ratio_vs_trl'] or float('nan'):9.2f}x")
print(f"\nGeneration: {args.new_tokens} new tokens after {args.prompt}, greedy, 1 process x {args.cores} threads, "
      "tokens/s")
print(f"{'model':<12} {'batch':>5} {'dtrain':>10} {'transformers':>13} {'dtrain/hf':>10}")
for model in models:
    for batch in (1, 16):
        ours = median([find(r"generate: [0-9]+ new tokens in [0-9.]+ s \(([0-9.]+) tokens/s",
                            read(f"generate.{model}.b{batch}.dtrain.{i}.log"), "tokens/s")
                       for i in range(1, args.repeat + 1)])
        peer = None
        if "peer" in impls:
            peer = median([json.loads(read(f"generate.{model}.b{batch}.peer.{i}.json"))["tokens_per_s"]
                           for i in range(1, args.repeat + 1)])
        row = {"model": model, "batch": batch, "dtrain_tokens_per_s": ours, "hf_tokens_per_s": peer,
               "ratio_vs_hf": ours / peer if peer else None}
        out["generate"].append(row)
        print(f"{model:<12} {batch:>5} {ours:10.1f} {peer or float('nan'):13.1f} {row['ratio_vs_hf'] or float('nan'):9.2f}x")
print("\nGRPO (reward token:7, 4 completions per prompt, 8 completions per rank, 2 ranks x 1 thread)")
print(f"{'model':<12} {'prompts/s':>10} {'sampling s':>11} {'training s':>11}")
for model in models:
    logs = [read(f"grpo.{model}.{i}.log") for i in range(1, args.repeat + 1)]
    pat = r"sampling ([0-9.]+) s, training ([0-9.]+) s: ([0-9.]+) prompts/s"
    rows = [re.search(pat, log) for log in logs]
    if not all(rows):
        raise SystemExit("summarize.py: no GRPO timing in the log:\n" + logs[0][-2000:])
    row = {"model": model, "prompts_per_s": median([float(r.group(3)) for r in rows]),
           "sampling_s": median([float(r.group(1)) for r in rows]),
           "training_s": median([float(r.group(2)) for r in rows])}
    out["grpo"].append(row)
    print(f"{model:<12} {row['prompts_per_s']:10.2f} {row['sampling_s']:11.2f} {row['training_s']:11.2f}")
if "peer" in impls:
    peer = json.loads(read(f"dpo.{models[0]}.2x.peer.1.json"))
    out["peer"] = {k: peer[k] for k in ("torch", "transformers", "trl")}
with open(args.json, "w") as f:
    json.dump(out, f, indent=1)

"""Tables and JSON for bench/run_hf_bench.sh.

usage: summarize.py WORK_DIR --models a,b --repeat N --warmup W --ranks R --json OUT
Reads WORK_DIR/<model>.<impl>.<i>.{jsonl,json} (dtrain's metrics records,
the torch side's JSON), prints per model the median step time and tokens/s of
each side (median of the runs' medians) and their ratio, and writes every
run's figures to OUT.
"""

import argparse
import json
import statistics

parser = argparse.ArgumentParser()
parser.add_argument("work")
parser.add_argument("--models", required=True)
parser.add_argument("--repeat", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--ranks", type=int, required=True)
parser.add_argument("--threads", type=int, required=True)
parser.add_argument("--json", required=True)
args = parser.parse_args()

out = {"ranks": args.ranks, "threads_per_rank": args.threads, "warmup_steps": args.warmup, "models": {}}
print(f"{'model':<14} {'parameters':>12} {'dtrain ms':>10} {'torch ms':>10} {'dtrain tok/s':>13} "
      f"{'torch tok/s':>12} {'ratio':>6}")
for model in args.models.split(","):
    runs = {"dtrain": [], "torch": []}
    for i in range(1, args.repeat + 1):
        with open(f"{args.work}/{model}.dtrain.{i}.jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
        steps = [r["step_ms"] for r in records][args.warmup:]
        median = statistics.median(steps)
        runs["dtrain"].append({"step_ms": [r["step_ms"] for r in records], "median_ms": median,
                               "tokens_per_s": statistics.median([r["tokens_per_s"] for r in records][args.warmup:])})
        with open(f"{args.work}/{model}.torch.{i}.json") as f:
            runs["torch"].append(json.load(f))
    params = runs["torch"][0]["parameters"]  # named_parameters(): a tied head once, as dtrain stores it
    d = statistics.median(r["median_ms"] for r in runs["dtrain"])
    t = statistics.median(r["median_ms"] for r in runs["torch"])
    dt = statistics.median(r["tokens_per_s"] for r in runs["dtrain"])
    tt = statistics.median(r["tokens_per_s"] for r in runs["torch"])
    print(f"{model:<14} {params:>12,} {d:>10.1f} {t:>10.1f} {dt:>13.0f} {tt:>12.0f} {dt / tt:>5.2f}x")
    out["models"][model] = {"parameters": params, "dtrain_median_ms": d, "torch_median_ms": t,
                            "dtrain_tokens_per_s": dt, "torch_tokens_per_s": tt, "ratio": dt / tt, "runs": runs}
try:  # run_hf_bench.sh's loading run: train_lm's line of peak resident sets
    with open(f"{args.work}/load.log") as f:
        line = next(l for l in f if "peak resident set" in l).strip()
    out["gpt2-124m_load_fsdp_full"] = line
    print("loading gpt2-124m (fsdp-full):", line[line.index(":") + 2:])
except (OSError, StopIteration):
    pass
with open(args.json, "w") as f:
    json.dump(out, f, indent=1)
print(f"ratio: dtrain's tokens/s over transformers + PyTorch DDP's, {args.ranks} ranks x {args.threads} thread(s); "
      f"JSON: {args.json}")

"""Tables and JSON for bench/run_hf_bench.sh.

usage: summarize.py WORK_DIR --models a,b --repeat N --warmup W --ranks 2,1 --blocks 128
                    --checkpointing 0 --impls dtrain,torch,peer --cores C --batch B --steps S --json OUT
Reads WORK_DIR/<model>.<ranks>x.b<block>.ac<0|1>.<impl>.<i>.{jsonl,json}
(dtrain's metrics records, the PyTorch sides' JSON), prints one row per
setting with each side's median step (median of the runs' medians) and the
ratios of tokens/s, dtrain over each PyTorch side, and writes every run's
figures, the versions measured, the date, commit and machine to OUT.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)

SIDES = {
    "torch": "Debian's torch with transformers 4.40 (eager attention, default AdamW)",
    "peer": "the PyPI release, eager: SDPA attention, AdamW(fused=True)",
    "peer_compile": "the PyPI release under torch.compile: SDPA attention, AdamW(fused=True)",
}


def dtrain_run(path, warmup):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r["step_ms"] for r in records if "step_ms" in r]
    tokens = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    run = {"step_ms": steps, "median_ms": statistics.median(steps[warmup:]),
           "tokens_per_s": statistics.median(tokens[warmup:])}
    try:  # train_lm's last line: "peak resident memory (rank 0): X MiB", in the run's log beside the records
        with open(path[:-len(".jsonl")] + ".log") as f:
            line = next(l for l in f if "peak resident memory (rank 0):" in l)
        run["peak_rss_mib"] = float(line.split(":")[-1].split()[0])
    except (OSError, StopIteration, ValueError):
        pass
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("models", "ranks", "blocks", "checkpointing", "impls"):
        p.add_argument(f"--{name}", required=True)
    for name in ("repeat", "warmup", "cores", "batch", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--lora", type=int, default=0)
    args = p.parse_args()
    impls = args.impls.split(",")
    peers = [i for i in impls if i != "dtrain"]

    settings, versions = [], {}
    header = f"{'model':<11} {'ranks x thr':>11} {'block':>5} {'ckpt':>4} {'dtrain ms':>10} {'MiB':>6}"
    for side in peers:
        header += f" {side + ' ms':>17} {'MiB':>6} {'x':>6}"
    print(header)
    for model in args.models.split(","):
        for n in (int(r) for r in args.ranks.split(",")):
            for block in (int(b) for b in args.blocks.split(",")):
                for ac in (int(a) for a in args.checkpointing.split(",")):
                    stem = f"{args.work}/{model}.{n}x.b{block}.ac{ac}"
                    runs = {impl: [] for impl in impls}
                    for i in range(1, args.repeat + 1):
                        runs["dtrain"].append(dtrain_run(f"{stem}.dtrain.{i}.jsonl", args.warmup))
                        for side in peers:
                            with open(f"{stem}.{side}.{i}.json") as f:
                                runs[side].append(json.load(f))
                    row = {"model": model, "ranks": n, "threads_per_rank": max(1, args.cores // n),
                           "block_size": block, "activation_checkpointing": bool(ac), "sides": {}}
                    for impl in impls:
                        rss = [r["peak_rss_mib"] for r in runs[impl] if "peak_rss_mib" in r]
                        row["sides"][impl] = {
                            "median_ms": statistics.median(r["median_ms"] for r in runs[impl]),
                            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[impl]),
                            "peak_rss_mib": round(statistics.median(rss), 1) if rss else None,
                            "runs": runs[impl]}
                    for side in peers:
                        first = runs[side][0]
                        row["parameters"] = first["parameters"]  # a tied head once, as dtrain stores it
                        versions[side] = {"torch": first.get("torch"), "transformers": first.get("transformers"),
                                          "attention": first.get("attention"), "settings": SIDES.get(side, side)}
                        if first.get("peft"):
                            versions[side]["peft"] = first["peft"]
                            row["trainable"] = first.get("trainable")
                        row["ratio_vs_" + side] = round(row["sides"]["dtrain"]["tokens_per_s"]
                                                        / row["sides"][side]["tokens_per_s"], 3)
                    settings.append(row)
                    layout = f"{n} x {row['threads_per_rank']}"
                    def mib(impl):
                        v = row["sides"][impl]["peak_rss_mib"]
                        return f"{v:>6.0f}" if v is not None else f"{'-':>6}"
                    line = (f"{model:<11} {layout:>11} {block:>5} "
                            f"{'on' if ac else 'off':>4} {row['sides']['dtrain']['median_ms']:>10.1f} {mib('dtrain')}")
                    for side in peers:
                        line += (f" {row['sides'][side]['median_ms']:>17.1f} {mib(side)}"
                                 f" {row['ratio_vs_' + side]:>5.2f}x")
                    print(line)

    out = {
        **run_record(args.cores),
        "method": f"per run: rank 0's median step over steps {args.warmup + 1}..{args.steps} (train_lm's step_ms; "
                  f"the torch script times zero_grad through optimizer.step); tokens/s = ranks x batch x block / "
                  f"step; reported: the median of {args.repeat} run(s), the sides' order reversed every run; "
                  f"threads per rank = cores / ranks (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS, every side); "
                  f"ratio_vs_<side>: dtrain's tokens/s over that side's",
        "model_setup": {"batch_per_rank": args.batch, "precision": "fp32", "optimizer": "AdamW lr 1e-3, weight decay 0",
                        "strategy": "DDP (gloo on the PyTorch sides)", "data": "random token ids",
                        "lora": ({"r": args.lora, "alpha": 2 * args.lora, "targets": "all-linear", "dropout": 0.0}
                                 if args.lora else None)},
        "sides": versions,
        "settings": settings,
    }
    try:  # run_hf_bench.sh's loading run: train_lm's line of peak resident sets
        with open(f"{args.work}/load.log") as f:
            line = next(l for l in f if "peak resident set" in l).strip()
        out["gpt2-124m_load_fsdp_full"] = line
        print("loading gpt2-124m (fsdp-full, 2 ranks):", line[line.index(":") + 2:])
    except (OSError, StopIteration):
        pass
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for side in peers:
        v = versions[side]
        print(f"{side}: torch {v['torch']}, transformers {v['transformers']}, attention {v['attention']} "
              f"({v['settings']})")
    print(f"x: dtrain's tokens/s over that side's; MiB: rank 0's peak resident set; batch {args.batch} sequences "
          f"per rank{'; LoRA r %d on all-linear, the rest frozen' % args.lora if args.lora else ''}; JSON: {args.json}")


if __name__ == "__main__":
    main()

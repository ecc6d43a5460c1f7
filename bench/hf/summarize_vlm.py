"""Tables and JSON for bench/run_vlm_bench.sh.

usage: summarize_vlm.py WORK_DIR --modes "projector;projector,vision;all" --repeat N --warmup W --ranks 2,1
                        --impls dtrain,peer --cores C --batch B --steps S --size small|smoke --json OUT
Reads WORK_DIR/<mode>.<ranks>x.<impl>.<i>.{jsonl,json} (train_vlm's metrics
records with its log beside them, the PyTorch side's JSON; the mode's comma
written as a plus), prints one row per setting with each side's median step
(median of the runs' medians), rank 0's peak resident set and the ratio of
samples/s, dtrain over the peer, and writes every run's figures, the
versions measured, the date, commit and machine to OUT.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)


def dtrain_run(path, warmup, samples_per_step):
    with open(path) as f:
        steps = [json.loads(line)["step_ms"] for line in f if line.strip() and "step_ms" in line]
    median = statistics.median(steps[warmup:])
    run = {"step_ms": steps, "median_ms": median, "samples_per_s": samples_per_step / (median / 1000.0)}
    with open(path[:-len(".jsonl")] + ".log") as f:
        for line in f:
            if "peak resident memory (rank 0):" in line:
                run["peak_rss_mib"] = float(line.split(":")[-1].split()[0])
            elif line.startswith("train_vlm:"):
                run["banner"] = line.strip()
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("modes", "ranks", "impls", "size"):
        p.add_argument(f"--{name}", required=True)
    for name in ("repeat", "warmup", "cores", "batch", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    impls = args.impls.split(",")
    peer = "peer" in impls

    settings, versions = [], {}
    header = f"{'train':<17} {'ranks x thr':>11} {'dtrain ms':>10} {'MiB':>6}"
    if peer:
        header += f" {'PyTorch ms':>11} {'MiB':>6} {'x':>6}"
    print(header)
    for mode in args.modes.split(";"):
        for n in (int(r) for r in args.ranks.split(",")):
            stem = f"{args.work}/{mode.replace(',', '+')}.{n}x"
            runs = {impl: [] for impl in impls}
            for i in range(1, args.repeat + 1):
                runs["dtrain"].append(dtrain_run(f"{stem}.dtrain.{i}.jsonl", args.warmup, n * args.batch))
                if peer:
                    with open(f"{stem}.peer.{i}.json") as f:
                        runs["peer"].append(json.load(f))
            row = {"train": mode, "ranks": n, "threads_per_rank": max(1, args.cores // n), "sides": {}}
            for impl in impls:
                rss = [r["peak_rss_mib"] for r in runs[impl] if "peak_rss_mib" in r]
                row["sides"][impl] = {
                    "median_ms": statistics.median(r["median_ms"] for r in runs[impl]),
                    "samples_per_s": statistics.median(r["samples_per_s"] for r in runs[impl]),
                    "peak_rss_mib": round(statistics.median(rss), 1) if rss else None,
                    "runs": runs[impl]}
            if peer:
                first = runs["peer"][0]
                row["parameters"], row["trainable_peer"] = first["parameters"], first["trainable"]
                versions["peer"] = {"torch": first["torch"], "transformers": first["transformers"],
                                    "attention": first["attention"], "settings": "eager, SDPA attention, "
                                    "AdamW(fused=True), DDP over gloo"}
                row["ratio_vs_peer"] = round(row["sides"]["dtrain"]["samples_per_s"]
                                             / row["sides"]["peer"]["samples_per_s"], 3)
            settings.append(row)

            def mib(impl):
                v = row["sides"][impl]["peak_rss_mib"]
                return f"{v:>6.0f}" if v is not None else f"{'-':>6}"
            layout = f"{n} x {row['threads_per_rank']}"
            line = f"{mode:<17} {layout:>11} {row['sides']['dtrain']['median_ms']:>10.1f} {mib('dtrain')}"
            if peer:
                line += f" {row['sides']['peer']['median_ms']:>11.1f} {mib('peer')} {row['ratio_vs_peer']:>5.2f}x"
            print(line)

    model = ("CLIP ViT-B/16 tower at 224 px (12 layers x 768, features of layer -2, 196 per image) + Llama "
             "(8 layers x 768, 12 heads, 4 key/value heads, SwiGLU 2048, vocabulary 32064, untied head)"
             if args.size == "small" else "smoke: 32 px CLIP tower of width 32 + Llama of width 32")
    out = {
        **run_record(args.cores),
        "method": f"per run: rank 0's median step over steps {args.warmup + 1}..{args.steps} (train_vlm's step_ms; "
                  f"the PyTorch script times zero_grad through optimizer.step); samples/s = ranks x batch / step; "
                  f"reported: the median of {args.repeat} run(s), the sides' order reversed every run; threads per "
                  f"rank = cores / ranks (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS, both sides); ratio_vs_peer: "
                  f"dtrain's samples/s over the peer's",
        "model_setup": {"model": model, "batch_per_rank": args.batch, "precision": "fp32",
                        "optimizer": "AdamW lr 1e-3, weight decay 0", "strategy": "DDP (gloo on the PyTorch side)",
                        "data": "random normalised pixels, 196 image tokens + 64 text tokens per record, the loss "
                                "over the text"},
        "sides": versions,
        "settings": settings,
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    if peer:
        v = versions["peer"]
        print(f"peer: torch {v['torch']}, transformers {v['transformers']}, {v['settings']}")
    print(f"x: dtrain's samples/s over the peer's; MiB: rank 0's peak resident set; batch {args.batch} records per "
          f"rank; JSON: {args.json}")


if __name__ == "__main__":
    main()

"""Tables and JSON for bench/run_gemm_bench.sh.

usage: summarize.py WORK_DIR --engines a,b --models a,b --threads 1,2 --tokens M --repeat N --cores C --json OUT
Reads WORK_DIR/<engine>.<model>.<threads>.jsonl (bench_gemm's and
torch_gemm.py's lines), prints per model and thread count each engine's
step total (the sum of its products' medians times their counts) with the
speed-up over openblas-pthread, and per product the fastest engine; writes
every line with the date, commit and machine to OUT.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)

BASE = "openblas-pthread"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("engines", "models", "threads"):
        p.add_argument(f"--{name}", required=True)
    for name in ("tokens", "repeat", "cores"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    engines = args.engines.split(",")
    results, steps = [], []
    for model in args.models.split(","):
        for t in (int(x) for x in args.threads.split(",")):
            totals = {}
            per_product = {}
            for engine in engines:
                with open(f"{args.work}/{engine}.{model}.{t}.jsonl") as f:
                    lines = [json.loads(line) for line in f if line.strip()]
                for line in lines:
                    line["threads"] = t
                results.extend(lines)
                step = next(l for l in lines if l["linear"] == "step")
                totals[engine] = step
                for l in lines:
                    if l["linear"] != "step":
                        per_product.setdefault((l["linear"], l["product"]), {})[engine] = l["median_ms"]
            base = totals.get(BASE, next(iter(totals.values())))["median_ms"]
            print(f"\n{model}, {args.tokens} tokens, {t} thread(s): the step's products")
            print(f"  {'engine':<18} {'step ms':>9} {'GFLOP/s':>8} {'vs ' + BASE:>20}")
            for engine in sorted(totals, key=lambda e: totals[e]["median_ms"]):
                s = totals[engine]
                print(f"  {engine:<18} {s['median_ms']:>9.1f} {s['gflops']:>8.1f} {base / s['median_ms']:>19.2f}x")
                steps.append({"model": model, "threads": t, "engine": engine, "step_ms": s["median_ms"],
                              "gflops": s["gflops"], "speedup_vs_" + BASE.replace("-", "_"):
                              round(base / s["median_ms"], 3)})
            wins = {}
            for (linear, product), by_engine in per_product.items():
                best = min(by_engine, key=by_engine.get)
                wins.setdefault(best, []).append(f"{linear}.{product}")
            for engine, products in sorted(wins.items()):
                print(f"  fastest on {len(products)} of {len(per_product)} products: {engine}")
    torch_line = next((l for l in results if l.get("torch")), None)
    out = {
        **run_record(args.cores),
        "method": f"each product (forward X W^T, input dY W, weight dY^T X of every Linear, {args.tokens} tokens) "
                  f"the median of {args.repeat} calls after a warm-up checked against float64; step_ms = sum of "
                  f"the medians times each Linear's count per step; one engine at a time, the others' threads "
                  f"pinned to 1",
        "peer": {"torch": torch_line["torch"], "blas": torch_line["blas"]} if torch_line else None,
        "steps": steps,
        "products": results,
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()

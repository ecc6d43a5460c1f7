"""Tables and JSON for bench/run_gpu_bench.sh (its work folder as input).

Kernels: each pass's GB/s for dtrain and PyTorch, as a share of the copy
bandwidth each measured in its own process. Training: the median over the
runs of each run's median step (dtrain's from its metrics JSONL after the
warm-up, PyTorch's from its JSON), and dtrain's time as a multiple of
PyTorch's (below 1: dtrain is faster).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess


def commit():
    """The full hash of the commit the benchmark ran, with "+dirty" when the tree had changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (head or "unknown") + ("+dirty" if dirty else "")


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def dtrain_median(path, warmup):
    steps = [r["step_ms"] for r in load_jsonl(path)][warmup:]
    if not steps:
        raise SystemExit(f"summarize.py: {path} has no steps after the warm-up")
    return statistics.median(steps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("work")
    parser.add_argument("--repeat", type=int, required=True)
    parser.add_argument("--mlp-warmup", type=int, required=True)
    parser.add_argument("--gpt-warmup", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--mlp-config", default="hidden 1024,1024,1024, GELU, batch 256, AdamW, 300 steps, warm-up 20")
    parser.add_argument("--gpt-config", default="6 layers, d 384, 6 heads, block 256, batch 16, AdamW, 60 steps, "
                                                "warm-up 10")
    a = parser.parse_args()
    w = lambda name: os.path.join(a.work, name)  # noqa: E731

    with open(w("kernels_dtrain.json")) as f:
        kd = json.load(f)
    with open(w("kernels_torch.json")) as f:
        kt = json.load(f)
    copy = {impl["implementation"]: {r["elements"]: r["gbps"] for r in impl["rows"] if r["pass"] == "copy"}
            for impl in (kd, kt)}
    print(f"\n(a) kernels on {kd['device']}: median of {kd['iters']} runs; share = GB/s over the same process's copy")
    print(f"{'pass':<14} {'elements':>11} | {'dtrain GB/s':>11} {'share':>7} | {'torch GB/s':>10} {'share':>7} |"
          f" {'dtrain/torch time':>17}")
    kernels = []
    torch_rows = {(r["pass"], r["elements"]): r for r in kt["rows"]}
    for rd in kd["rows"]:
        n = rd["elements"]
        sd = rd["gbps"] / copy["dtrain"][n]
        rt = torch_rows.get((rd["pass"], n))
        row = {"pass": rd["pass"], "elements": n, "dtrain_ms": rd["ms"], "dtrain_gbps": rd["gbps"],
               "dtrain_share_of_copy": sd}
        if rt is None:  # a pass of the Trainer's that PyTorch has no counterpart of
            print(f"{rd['pass']:<14} {n:>11} | {rd['gbps']:>11.1f} {100 * sd:>6.1f}% | {'-':>10} {'-':>7} | {'-':>17}")
        else:
            st, ratio = rt["gbps"] / copy["torch"][n], rd["ms"] / rt["ms"]
            print(f"{rd['pass']:<14} {n:>11} | {rd['gbps']:>11.1f} {100 * sd:>6.1f}% | {rt['gbps']:>10.1f}"
                  f" {100 * st:>6.1f}% | {ratio:>16.2f}x")
            row.update({"torch_ms": rt["ms"], "torch_gbps": rt["gbps"], "torch_share_of_copy": st,
                        "dtrain_over_torch_time": ratio})
        kernels.append(row)

    training = []
    cases = [("train_mlp", "mlp", "bf16", a.mlp_warmup), ("train_mlp", "mlp", "fp32", a.mlp_warmup),
             ("train_gpt", "gpt", "bf16", a.gpt_warmup)]
    print(f"\n(b, c) step time at world size 1, median of {a.repeat} runs (each run: its median step)")
    print(f"{'model':<10} {'precision':<9} | {'dtrain ms':>9} | {'torch ms':>9} | {'dtrain/torch':>12}")
    for label, key, prec, warmup in cases:
        runs_d = [dtrain_median(w(f"{key}.dtrain.{prec}.{i}.jsonl"), warmup) for i in range(1, a.repeat + 1)]
        runs_t = []
        for i in range(1, a.repeat + 1):
            with open(w(f"{key}.torch.{prec}.{i}.json")) as f:
                runs_t.append(json.load(f)["median_step_ms"])
        d, t = statistics.median(runs_d), statistics.median(runs_t)
        print(f"{label:<10} {prec:<9} | {d:>9.3f} | {t:>9.3f} | {d / t:>11.2f}x")
        training.append({"model": label, "precision": prec, "dtrain_ms": d, "torch_ms": t, "dtrain_over_torch": d / t,
                         "dtrain_runs_ms": runs_d, "torch_runs_ms": runs_t})

    with open(w("mlp.torch.bf16.1.json")) as f:
        torch_impl = json.load(f)["implementation"]
    result = {"device": kd["device"], "cuda_driver": kd.get("cuda_driver"), "commit": commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
              "torch": kt["version"], "torch_implementation": torch_impl,
              "repeat": a.repeat, "kernels": kernels, "training": training,
              "configs": {"train_mlp": a.mlp_config, "train_gpt": f"{a.gpt_config}, vocab {a.vocab}"}}
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()

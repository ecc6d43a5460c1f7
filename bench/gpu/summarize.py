"""Tables and JSON for bench/run_gpu_bench.sh (its work folder as input).

Kernels: each pass's GB/s for dtrain and PyTorch, as a share of the copy
bandwidth each measured in its own process. Training: the median over the
runs of each run's median step (dtrain's from its metrics JSONL after the
warm-up, PyTorch's from its JSON), and dtrain's time as a multiple of
PyTorch's (below 1: dtrain is faster).
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import machine  # noqa: E402  (bench/machine.py)

PROVENANCE = ("date", "commit", "dirty", "machine")


def gpu_record(cores, torch):
    """machine.run_record with the GPU and its driver: nvidia-smi's where it answers, else the
    GPUs PyTorch sees and the kernel module's version (/proc/driver/nvidia/version)."""
    record = machine.run_record(cores)
    m = record["machine"]
    if m.get("gpu") in (None, "none") and torch.cuda.is_available():
        try:
            with open("/proc/driver/nvidia/version") as f:
                found = re.search(r"Kernel Module\s+(\S+)", f.read())
        except OSError:
            found = None
        gpu = {"gpu": f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}",
               "driver": found.group(1) if found else "unknown (no nvidia-smi, no /proc/driver/nvidia/version)"}
        record["machine"] = {**{k: v for k, v in m.items() if k in ("cpu", "cpu_flags", "cores")}, **gpu,
                             **{k: v for k, v in m.items() if k not in ("cpu", "cpu_flags", "cores", "gpu", "driver")}}
    return record


def stamp_kept_parts(result):
    """A file from before the parts carried their own provenance: the parts this run keeps get the
    file's top-level date, commit and dirty (and its provenance note), before the top level
    becomes this run's."""
    def unsuffixed(stamp):  # the writer before bench/machine.py's dirty() wrote "<hash>+dirty"
        c = stamp.get("commit")
        if isinstance(c, str) and c.endswith("+dirty"):
            stamp["commit"], stamp["dirty"] = c[:-len("+dirty")], True

    old = {k: result[k] for k in ("date", "commit", "dirty") if k in result}
    for part in [result.get("kernels_run") or {}] + [row for key in ("training", "language_models", "attention")
                                                     for row in result.get(key, [])]:
        unsuffixed(part)
    if not old:
        return
    unsuffixed(old)
    for k in ("provenance_note", "commit_note"):
        if k in result:
            old[k] = result[k]
    if "kernels" in result and "kernels_run" not in result:
        result["kernels_run"] = dict(old)
    for key in ("training", "language_models", "attention"):
        for row in result.get(key, []):
            if "commit" not in row:
                row.update(old)


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def dtrain_median(path, warmup):
    steps = [r["step_ms"] for r in load_jsonl(path)][warmup:]
    if not steps:
        raise SystemExit(f"summarize.py: {path} has no steps after the warm-up")
    return statistics.median(steps)


def kernels_part(w):
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
    return kd, kt, kernels


def training_rows(w, a, keys):
    cases = [("train_mlp", "mlp", "bf16", a.mlp_warmup), ("train_mlp", "mlp", "fp32", a.mlp_warmup),
             ("train_gpt", "gpt", "bf16", a.gpt_warmup)]
    rows = []
    print(f"\n(b, c) step time at world size 1, median of {a.repeat} runs (each run: its median step)")
    print(f"{'model':<10} {'precision':<9} | {'dtrain ms':>9} | {'torch ms':>9} | {'dtrain/torch':>12}")
    for label, key, prec, warmup in cases:
        if key not in keys:
            continue
        runs_d = [dtrain_median(w(f"{key}.dtrain.{prec}.{i}.jsonl"), warmup) for i in range(1, a.repeat + 1)]
        runs_t = []
        for i in range(1, a.repeat + 1):
            with open(w(f"{key}.torch.{prec}.{i}.json")) as f:
                runs_t.append(json.load(f)["median_step_ms"])
        d, t = statistics.median(runs_d), statistics.median(runs_t)
        print(f"{label:<10} {prec:<9} | {d:>9.3f} | {t:>9.3f} | {d / t:>11.2f}x")
        rows.append({"model": label, "precision": prec, "dtrain_ms": d, "torch_ms": t, "dtrain_over_torch": d / t,
                     "dtrain_runs_ms": runs_d, "torch_runs_ms": runs_t})
    return rows


def lm_rows(w, a):
    """GPT-2 124M and the Llama-shaped model: step times, tokens/s, MFU, ratios to PyTorch eager and compile."""
    cases = [("gpt2", "GPT-2 124M, DDP", "gpt2-124m"), ("llama", "Llama 1.1B, FSDP full shard", "llama-1b"),
             ("llama_ckpt", "Llama 1.1B, FSDP full shard, activation checkpointing", "llama-1b")]
    rows = []
    print(f"\n(d) language models through hf::CausalLm at world size 1, bf16, median of {a.repeat} runs")
    print(f"{'model':<52} | {'dtrain ms':>9} | {'eager ms':>9} | {'compile ms':>10} | {'tokens/s':>9} | {'MFU':>6}"
          f" | {'/eager':>6} | {'/compile':>8}")
    shapes = {}
    for d in os.listdir(a.work):
        if os.path.exists(w(f"{d}/shape.json")):
            with open(w(f"{d}/shape.json")) as f:
                shapes[d.split("-")[0]] = json.load(f)
    for key, label, _ in cases:
        if not os.path.exists(w(f"lm.{key}.dtrain.1.jsonl")):
            continue
        shape = shapes["gpt2" if key == "gpt2" else "llama"]
        records = [load_jsonl(w(f"lm.{key}.dtrain.{i}.jsonl")) for i in range(1, a.repeat + 1)]
        runs_d = [statistics.median([r["step_ms"] for r in rec][a.lm_warmup:]) for rec in records]
        last = records[0][-1]
        tokens_per_step = last["tokens_per_s"] * last["step_ms"] / 1000
        seq = round(last["tokens_per_s"] / last["samples_per_s"])  # the block
        runs_t = []
        for i in range(1, a.repeat + 1):
            with open(w(f"lm.{key}.torch.{i}.json")) as f:
                runs_t.append(json.load(f)["median_step_ms"])
        d, t = statistics.median(runs_d), statistics.median(runs_t)
        tokens_per_s = tokens_per_step / (d / 1000)
        flops_per_token = 6 * shape["params"] + 12 * shape["layers"] * shape["width"] * seq
        mfu = tokens_per_s * flops_per_token / (a.peak_tflops * 1e12)
        row = {"model": label, "dtrain_ms": d, "torch_eager_ms": t, "tokens_per_s": tokens_per_s, "mfu": mfu,
               "ratio_eager": d / t, "dtrain_runs_ms": runs_d, "torch_runs_ms": runs_t,
               "params": shape["params"], "flops_per_token": flops_per_token,
               "dtrain_memory": last.get("memory")}
        compile_ms = None
        if key == "gpt2" and os.path.exists(w("lm.gpt2.compile.json")):
            with open(w("lm.gpt2.compile.json")) as f:
                compile_ms = json.load(f)["median_step_ms"]
            row.update({"torch_compile_ms": compile_ms, "ratio_compile": d / compile_ms})
        rows.append(row)
        c = f"{compile_ms:>10.2f}" if compile_ms else f"{'-':>10}"
        rc = f"{d / compile_ms:>7.2f}x" if compile_ms else f"{'-':>8}"
        print(f"{label:<52} | {d:>9.2f} | {t:>9.2f} | {c} | {tokens_per_s:>9.0f} | {100 * mfu:>5.1f}% |"
              f" {d / t:>5.2f}x | {rc}")
    return rows


def attention_rows(w):
    """The attention alone: dtrain's cuDNN path and PyTorch's flash SDPA, TFLOP/s."""
    rows = []
    for shape in ("12x64", "8x128"):
        if not os.path.exists(w(f"attention_dtrain.{shape}.json")):
            continue
        with open(w(f"attention_dtrain.{shape}.json")) as f:
            d = json.load(f)["rows"]
        with open(w(f"attention_torch.{shape}.json")) as f:
            t = json.load(f)["rows"]
        for rd, rt in zip(d, t):
            rows.append({"time": rd["time"], "batch": rd["batch"], "heads": rd["heads"], "head_dim": rd["head_dim"],
                         "dtrain_tflops": rd["tflops"], "torch_tflops": rt["tflops"],
                         "dtrain_over_torch_time": rd["ms"] / rt["ms"]})
    if rows:
        print("\n(e) attention forward + backward, bf16, causal: TFLOP/s")
        print(f"{'T':>6} {'heads x d':>10} | {'dtrain':>8} | {'torch':>8} | {'dtrain/torch time':>17}")
        for r in rows:
            print(f"{r['time']:>6} {str(r['heads']) + ' x ' + str(r['head_dim']):>10} | {r['dtrain_tflops']:>8.1f} |"
                  f" {r['torch_tflops']:>8.1f} | {r['dtrain_over_torch_time']:>16.2f}x")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("work")
    parser.add_argument("--repeat", type=int, required=True)
    parser.add_argument("--mlp-warmup", type=int, required=True)
    parser.add_argument("--gpt-warmup", type=int, required=True)
    parser.add_argument("--lm-warmup", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--mlp-config", default="hidden 1024,1024,1024, GELU, batch 256, AdamW, 300 steps, warm-up 20")
    parser.add_argument("--gpt-config", default="6 layers, d 384, 6 heads, block 256, batch 16, AdamW, 60 steps, "
                                                "warm-up 10")
    parser.add_argument("--lm-config", default="")
    a = parser.parse_args()
    w = lambda name: os.path.join(a.work, name)  # noqa: E731

    # The parts this run measured replace theirs in the file; the others stay as they were, each
    # with its own date, commit and dirty. The top level's provenance is this run's (the newest).
    result = {}
    if os.path.exists(a.json):
        with open(a.json) as f:
            result = json.load(f)
        stamp_kept_parts(result)
    import torch  # the side's version and the GPU, as PyTorch names it
    record = gpu_record(a.cores, torch)
    stamp = {k: record[k] for k in ("date", "commit", "dirty")}
    result = {**record, **{k: v for k, v in result.items()
                           if k not in PROVENANCE and k not in ("provenance_note", "commit_note")}}
    result.update({"device": torch.cuda.get_device_name(0), "torch": torch.__version__})
    result.setdefault("configs", {})
    if os.path.exists(w("kernels_dtrain.json")):
        kd, kt, kernels = kernels_part(w)
        result.update({"kernels": kernels, "kernels_run": dict(stamp, cuda_driver=kd.get("cuda_driver"),
                                                               repeat=kd["iters"])})
    keys = {k for k in ("mlp", "gpt") if os.path.exists(w(f"{k}.dtrain.bf16.1.jsonl"))}
    if keys:
        rows = training_rows(w, a, keys)
        kept = [r for r in result.get("training", []) if r["model"] != "train_mlp" or "mlp" not in keys]
        kept = [r for r in kept if r["model"] != "train_gpt" or "gpt" not in keys]
        result["training"] = kept + [dict(r, **stamp) for r in rows]
        with open(w(f"{sorted(keys)[0]}.torch.bf16.1.json")) as f:
            result["torch_implementation"] = json.load(f).get("implementation", result.get("torch_implementation"))
        if "mlp" in keys:
            result["configs"]["train_mlp"] = a.mlp_config
        if "gpt" in keys:
            result["configs"]["train_gpt"] = f"{a.gpt_config}, vocab {a.vocab}"
    lm = lm_rows(w, a)
    if lm:
        result["language_models"] = [dict(r, **stamp) for r in lm]
        result["configs"]["language_models"] = a.lm_config
        with open(w("lm.gpt2.torch.1.json")) as f:
            result["lm_torch_implementation"] = json.load(f)["implementation"]
    attention = attention_rows(w)
    if attention:
        result["attention"] = [dict(r, **stamp) for r in attention]
    result["repeat"] = a.repeat
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()

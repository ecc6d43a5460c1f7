"""Tables and JSON for one bench/run_gpt_bench.sh run.

usage: summarize.py WORK_DIR --repeat R --cores C --steps S --warmup W --vocab V --n-layer L --n-embd D
                    --n-head H --block-size T --batch B --json TARGET
WORK_DIR holds, for each world size n in 1, 2, activation checkpointing a in 0, 1 and run i in 1..R:
dtrain.n.aca.i.jsonl (train_gpt metrics, rank 0), dtrain.n.aca.i.log (its output, with the line
"peak resident memory (rank 0): X MiB" where train_gpt prints it), torch.n.aca.i.json
(bench/gpt/torch_ddp_gpt.py, Debian's torch) and, when the run had them, peer.n.aca.i.json (the same
script on the PyPI release, SDPA and the fused AdamW) and peer_compile.n.aca.i.json (the same compiled);
dtrain_openblas.n.aca.i.jsonl/.log: train_gpt with DTRAIN_HOST_THREADS=openblas where a rank has 2+ threads;
dtrain_gemm_openblas.n.aca.i.jsonl/.log: train_gpt with DTRAIN_HOST_GEMM=openblas where oneDNN is the default.
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)

MIB = 1 << 20
CATEGORIES = ("params", "grads", "optimizer", "master", "gathered", "activations")
# The PyPI release's runs when the benchmark had them: eager (SDPA, fused AdamW), and the same compiled.
PEERS = ("peer", "peer_compile")
PEAK_RSS = re.compile(r"peak resident memory \(rank 0\): ([0-9.]+) MiB")


def median(values):
    """The benches' median: the upper middle for even counts."""
    return statistics.median_high(values)


def median_or_none(values):
    known = [v for v in values if v is not None]
    return median(known) if known else None


def dtrain_run(work, n, ac, i, warmup, impl="dtrain"):
    """(median step ms after the warm-up, last step's memory object, peak RSS MiB or None) of one run."""
    base = os.path.join(work, f"{impl}.{n}.ac{ac}.{i}")
    with open(base + ".jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    if len(records) <= warmup:
        raise SystemExit(f"summarize.py: {base}.jsonl has {len(records)} step(s), not more than the {warmup} warm-up")
    rss = None
    with open(base + ".log") as f:
        for line in f:
            m = PEAK_RSS.search(line)
            if m:
                rss = float(m.group(1))
    return median([r["step_ms"] for r in records[warmup:]]), records[-1]["memory"], rss


def speed(runs_ms, tokens_per_step):
    ms = median(runs_ms)
    return {"runs_step_ms": [round(m, 4) for m in runs_ms], "step_ms": round(ms, 4),
            "tokens_per_s": round(tokens_per_step / ms * 1e3, 1)}


def dtrain_row(work, n, ac, runs, args, tokens):
    measured = [dtrain_run(work, n, ac, i, args.warmup) for i in runs]
    memory = measured[-1][1]
    rss_runs = [rss for _, _, rss in measured]
    row = {"implementation": "dtrain train_gpt (ddp)", **speed([ms for ms, _, _ in measured], tokens),
           "runs_peak_rss_mib": rss_runs, "peak_rss_mib": median_or_none(rss_runs),
           "memory_bytes": memory, "memory_total_bytes": sum(memory[c] for c in CATEGORIES),
           "memory_same_in_every_run": all(m == memory for _, m, _ in measured)}
    if not row["memory_same_in_every_run"]:
        row["runs_memory_bytes"] = [m for _, m, _ in measured]
    return row


def torch_row(work, n, ac, runs, tokens, impl="torch"):
    results = []
    for i in runs:
        with open(os.path.join(work, f"{impl}.{n}.ac{ac}.{i}.json")) as f:
            results.append(json.load(f))
    rss_runs = [r["peak_rss_mib"] for r in results]
    before = [r["rss_before_model_mib"] for r in results]
    return {"implementation": results[0]["implementation"], **speed([r["median_step_ms"] for r in results], tokens),
            "runs_peak_rss_mib": rss_runs, "peak_rss_mib": median(rss_runs),
            "runs_rss_before_model_mib": before, "rss_before_model_mib": median(before),
            "parameters": results[0]["parameters"]}


def mib(value, digits=1):
    return "n/a" if value is None else f"{value:,.{digits}f}"


def on_off(ac):
    return "on" if ac else "off"


def print_tables(results, args):
    print(f"\nGPT training step, tokens/s = ranks x {args.batch} x {args.block_size} / step time "
          f"(median of {args.repeat} run(s), each the median after {args.warmup} warm-up steps, rank 0)")
    print("| ranks | threads / rank | activation checkpointing | train_gpt step ms | tokens/s | "
          "torch DDP step ms | tokens/s | dtrain / torch |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        d, t = r["dtrain"], r["torch"]
        print(f"| {r['ranks']} | {r['threads_per_rank']} | {on_off(r['activation_checkpointing'])} | "
              f"{d['step_ms']:.2f} | {d['tokens_per_s']:,.0f} | {t['step_ms']:.2f} | {t['tokens_per_s']:,.0f} | "
              f"{r['speedup']:.2f}x |")
    for impl in PEERS:
        if not all(impl in r for r in results):
            continue
        print(f"\nThe same against {results[0][impl]['implementation']} (PyPI)")
        print("| ranks | threads / rank | activation checkpointing | train_gpt step ms | peer step ms | tokens/s | "
              "dtrain / peer |")
        print("|---:|---:|---|---:|---:|---:|---:|")
        for r in results:
            d, t = r["dtrain"], r[impl]
            print(f"| {r['ranks']} | {r['threads_per_rank']} | {on_off(r['activation_checkpointing'])} | "
                  f"{d['step_ms']:.2f} | {t['step_ms']:.2f} | {t['tokens_per_s']:,.0f} | "
                  f"{r['speedup_vs_' + impl]:.2f}x |")

    pool_rows = [r for r in results if "dtrain_openblas" in r]
    if pool_rows:
        print("\ndtrain's own thread pool (the default) against OpenBLAS's threads (DTRAIN_HOST_THREADS=openblas)")
        print("| ranks | threads / rank | activation checkpointing | pool step ms | openblas step ms | pool speed-up |")
        print("|---:|---:|---|---:|---:|---:|")
        for r in pool_rows:
            print(f"| {r['ranks']} | {r['threads_per_rank']} | {on_off(r['activation_checkpointing'])} | "
                  f"{r['dtrain']['step_ms']:.2f} | {r['dtrain_openblas']['step_ms']:.2f} | {r['pool_speedup']:.2f}x |")

    gemm_rows = [r for r in results if "dtrain_gemm_openblas" in r]
    if gemm_rows:
        print("\noneDNN's GEMMs (the default where it is installed) against OpenBLAS's (DTRAIN_HOST_GEMM=openblas)")
        print("| ranks | threads / rank | activation checkpointing | onednn step ms | openblas step ms | "
              "onednn speed-up |")
        print("|---:|---:|---|---:|---:|---:|")
        for r in gemm_rows:
            print(f"| {r['ranks']} | {r['threads_per_rank']} | {on_off(r['activation_checkpointing'])} | "
                  f"{r['dtrain']['step_ms']:.2f} | {r['dtrain_gemm_openblas']['step_ms']:.2f} | "
                  f"{r['onednn_speedup']:.2f}x |")

    print("\nPeak resident set of rank 0 (getrusage ru_maxrss, MiB; torch's includes the interpreter and its "
          "libraries, 'before model' = its peak before the model was built), and dtrain's tracked memory per rank "
          "(MiB, last step: params, grads, optimizer, master as held, gathered and activations at their peak)")
    print("| ranks | activation checkpointing | train_gpt peak RSS | torch peak RSS | torch before model | "
          + " | ".join(CATEGORIES) + " | tracked total |")
    print("|---:|---|" + "---:|" * (3 + len(CATEGORIES) + 1))
    for r in results:
        d, t = r["dtrain"], r["torch"]
        cells = [str(r["ranks"]), on_off(r["activation_checkpointing"]), mib(d["peak_rss_mib"]),
                 mib(t["peak_rss_mib"]), mib(t["rss_before_model_mib"])]
        cells += [f"{d['memory_bytes'][c] / MIB:.2f}" for c in CATEGORIES]
        cells.append(f"{d['memory_total_bytes'] / MIB:.2f}")
        print("| " + " | ".join(cells) + " |")

    print("\nActivation checkpointing, on against off (same ranks): step time ratio, and dtrain's activations")
    print("| ranks | train_gpt time | torch time | train_gpt activations MiB (off -> on) | "
          "train_gpt peak RSS MiB (off -> on) | torch peak RSS MiB (off -> on) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sorted({r["ranks"] for r in results}):
        off, on = (next(r for r in results if r["ranks"] == n and r["activation_checkpointing"] == ac)
                   for ac in (False, True))
        print(f"| {n} | {on['dtrain']['step_ms'] / off['dtrain']['step_ms']:.2f}x | "
              f"{on['torch']['step_ms'] / off['torch']['step_ms']:.2f}x | "
              f"{off['dtrain']['memory_bytes']['activations'] / MIB:.2f} -> "
              f"{on['dtrain']['memory_bytes']['activations'] / MIB:.2f} | "
              f"{mib(off['dtrain']['peak_rss_mib'])} -> {mib(on['dtrain']['peak_rss_mib'])} | "
              f"{mib(off['torch']['peak_rss_mib'])} -> {mib(on['torch']['peak_rss_mib'])} |")
    if any(r["dtrain"]["peak_rss_mib"] is None for r in results):
        print("\n(train_gpt printed no 'peak resident memory (rank 0)' line in some runs: n/a, null in the JSON)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("repeat", "cores", "steps", "warmup", "vocab", "n-layer", "n-embd", "n-head", "block-size", "batch"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    runs = range(1, args.repeat + 1)

    results = []
    for n in (1, 2):
        tokens = n * args.batch * args.block_size
        for ac in (0, 1):
            d = dtrain_row(args.work, n, ac, runs, args, tokens)
            t = torch_row(args.work, n, ac, runs, tokens)
            row = {"ranks": n, "threads_per_rank": max(1, args.cores // n),
                   "activation_checkpointing": bool(ac), "dtrain": d, "torch": t,
                   "speedup": round(t["step_ms"] / d["step_ms"], 3)}
            if os.path.exists(os.path.join(args.work, f"dtrain_openblas.{n}.ac{ac}.1.jsonl")):
                # the same train_gpt with OpenBLAS's threads (DTRAIN_HOST_THREADS=openblas)
                row["dtrain_openblas"] = speed([dtrain_run(args.work, n, ac, i, args.warmup, "dtrain_openblas")[0]
                                                for i in runs], tokens)
                row["pool_speedup"] = round(row["dtrain_openblas"]["step_ms"] / d["step_ms"], 3)
            if os.path.exists(os.path.join(args.work, f"dtrain_gemm_openblas.{n}.ac{ac}.1.jsonl")):
                # the same train_gpt with OpenBLAS's GEMMs (DTRAIN_HOST_GEMM=openblas)
                row["dtrain_gemm_openblas"] = speed([dtrain_run(args.work, n, ac, i, args.warmup,
                                                                "dtrain_gemm_openblas")[0] for i in runs], tokens)
                row["onednn_speedup"] = round(row["dtrain_gemm_openblas"]["step_ms"] / d["step_ms"], 3)
            for impl in PEERS:
                if os.path.exists(os.path.join(args.work, f"{impl}.{n}.ac{ac}.1.json")):
                    row[impl] = torch_row(args.work, n, ac, runs, tokens, impl)
                    row["speedup_vs_" + impl] = round(row[impl]["step_ms"] / d["step_ms"], 3)
            results.append(row)
    # Both sides build the same model: dtrain's fp32 params (DDP: every
    # parameter on every rank) count 4 bytes per parameter.
    torch_params = results[0]["torch"]["parameters"]
    dtrain_params = results[0]["dtrain"]["memory_bytes"]["params"] // 4

    merged = {
        **run_record(args.cores,
                     OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "unset (OpenBLAS detects the CPU)")),
        "method": f"per run: the median step over steps {args.warmup + 1}..{args.steps} (rank 0; train_gpt's "
                  f"step_ms, the same span in the torch script: zero_grad through optimizer.step); tokens/s = "
                  f"ranks x batch x block_size / step; reported: the median of {args.repeat} runs, the "
                  f"implementations alternating (their order reversed every run; every run kept); threads "
                  f"per rank = cores / ranks (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS, both sides); peak RSS: "
                  f"rank 0's getrusage ru_maxrss at the end; memory_bytes: dtrain's tracked bytes per rank "
                  f"after the last step (params, grads, optimizer, master as held; gathered and activations "
                  f"their peak)",
        "model": {"vocab": args.vocab, "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                  "block_size": args.block_size, "batch_per_rank": args.batch, "parameters": torch_params,
                  "dtrain_parameters": dtrain_params, "precision": "fp32",
                  "optimizer": "AdamW lr 1e-3, weight decay 0",
                  "data": "train_gpt: its generated corpus; torch: random token ids of the same vocabulary"},
        "results": results,
    }
    with open(args.json, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")

    print(f"\nModel: GPT, {args.n_layer} layers x {args.n_embd} wide, {args.n_head} heads, block {args.block_size}, "
          f"vocabulary {args.vocab}, {torch_params:,} parameters"
          + ("" if dtrain_params == torch_params else f" (torch; dtrain {dtrain_params:,})")
          + f", fp32, AdamW, batch {args.batch} x {args.block_size} tokens per rank")
    print_tables(results, args)
    shown = os.path.relpath(args.json)
    print(f"\nwritten: {args.json if shown.startswith('..') else shown}")


if __name__ == "__main__":
    main()

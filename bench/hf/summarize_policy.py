"""Tables and JSON for the ACT policy benchmark (dtrain against LeRobot + PyTorch DDP).

usage: summarize_policy.py WORK_DIR --layouts 2x1,1x2 --repeat N --warmup W --impls dtrain,peer --cores C
                           --batch B --steps S --size default|smoke --json OUT
Reads, for every layout RxT (R ranks x T threads each), side and run i = 1..N:
  WORK_DIR/RxT.dtrain.<i>.jsonl  dtrain's metrics records (one object per step, with
                                 step_ms) and WORK_DIR/RxT.dtrain.<i>.log beside it (the
                                 "peak resident memory (rank 0): X MiB" line and the banner,
                                 the first line that starts with "train_"); or, where it
                                 exists, WORK_DIR/RxT.dtrain.<i>.json, a whole-run record
                                 with the peer's fields (step_ms, median_ms, samples_per_s,
                                 peak_rss_mib)
  WORK_DIR/RxT.peer.<i>.json     bench/hf/torch_ddp_act.py's JSON
prints one row per layout with each side's median step (median of the runs'
medians), rank 0's peak resident set and the ratio of samples/s, dtrain over
the peer, and writes every run's figures, the versions measured, the date,
commit and machine to OUT.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import run_record  # noqa: E402  (bench/machine.py)


def dtrain_run(stem, warmup, samples_per_step):
    """One dtrain run: its whole-run JSON where there is one, else its metrics and log."""
    if os.path.exists(stem + ".json"):
        with open(stem + ".json") as f:
            run = json.load(f)
        if "peak_rss_mib" not in run and "peak_rss_mb" in run:
            run["peak_rss_mib"] = run.pop("peak_rss_mb")
        run.setdefault("median_ms", statistics.median(run["step_ms"][warmup:]))
        run.setdefault("samples_per_s", samples_per_step / (run["median_ms"] / 1000.0))
        return run
    with open(stem + ".jsonl") as f:
        steps = [json.loads(line)["step_ms"] for line in f if line.strip() and "step_ms" in line]
    median = statistics.median(steps[warmup:])
    run = {"step_ms": steps, "median_ms": median, "samples_per_s": samples_per_step / (median / 1000.0)}
    if os.path.exists(stem + ".log"):
        with open(stem + ".log") as f:
            for line in f:
                if "peak resident memory (rank 0):" in line:
                    run["peak_rss_mib"] = float(line.split(":")[-1].split()[0])
                elif line.startswith("train_") and "banner" not in run:
                    run["banner"] = line.strip()
    return run


def layout_of(text):
    ranks, _, threads = text.partition("x")
    if not (ranks.isdigit() and threads.isdigit() and int(ranks) > 0 and int(threads) > 0):
        sys.exit(f"summarize_policy.py: layout '{text}' is not RANKSxTHREADS (2x1, 1x2)")
    return int(ranks), int(threads)


def model_text(peer, size):
    if peer is None:
        return "ACT, LeRobot 0.4.4's defaults" if size == "default" else "smoke: a small ACT"
    vae = (f"VAE encoder of {peer['n_vae_encoder_layers']} layers, latent {peer['latent_dim']}"
           if peer["use_vae"] else "no VAE")
    return (f"ACT: {peer['vision_backbone']} backbone (random weights, frozen batch norm), transformer "
            f"{peer['n_encoder_layers']} encoder + {peer['n_decoder_layers']} decoder layer(s) x {peer['dim_model']}, "
            f"{peer['n_heads']} heads, feed-forward {peer['dim_feedforward']}, {vae}, chunk {peer['chunk_size']}; "
            f"{peer['parameters']} parameters")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("layouts", "impls", "size"):
        p.add_argument(f"--{name}", required=True)
    for name in ("repeat", "warmup", "cores", "batch", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    impls = args.impls.split(",")
    peer = "peer" in impls

    settings, versions, first_peer = [], {}, None
    header = f"{'ranks x thr':>11} {'dtrain ms':>10} {'MiB':>6}"
    if peer:
        header += f" {'LeRobot ms':>11} {'MiB':>6} {'x':>6}"
    print(header)
    for layout in args.layouts.split(","):
        n, threads = layout_of(layout)
        stem = f"{args.work}/{n}x{threads}"
        runs = {impl: [] for impl in impls}
        for i in range(1, args.repeat + 1):
            runs["dtrain"].append(dtrain_run(f"{stem}.dtrain.{i}", args.warmup, n * args.batch))
            if peer:
                with open(f"{stem}.peer.{i}.json") as f:
                    runs["peer"].append(json.load(f))
        row = {"layout": f"{n}x{threads}", "ranks": n, "threads_per_rank": threads, "sides": {}}
        for impl in impls:
            rss = [r["peak_rss_mib"] for r in runs[impl] if "peak_rss_mib" in r]
            row["sides"][impl] = {
                "median_ms": statistics.median(r["median_ms"] for r in runs[impl]),
                "samples_per_s": statistics.median(r["samples_per_s"] for r in runs[impl]),
                "peak_rss_mib": round(statistics.median(rss), 1) if rss else None,
                "runs": runs[impl]}
        if peer:
            first = first_peer = first_peer or runs["peer"][0]
            row["parameters"], row["trainable_peer"] = first["parameters"], first["trainable"]
            versions["peer"] = {"torch": first["torch"], "lerobot": first["lerobot"],
                                "optimizer": first["optimizer"],
                                "settings": f"eager, LeRobot's ACTPolicy and its ACT preset (AdamW, "
                                            f"{first['optimizer']}; gradient norm clipped at 10), DDP over gloo"}
            row["ratio_vs_peer"] = round(row["sides"]["dtrain"]["samples_per_s"]
                                         / row["sides"]["peer"]["samples_per_s"], 3)
        settings.append(row)

        def mib(impl):
            v = row["sides"][impl]["peak_rss_mib"]
            return f"{v:>6.0f}" if v is not None else f"{'-':>6}"
        line = f"{f'{n} x {threads}':>11} {row['sides']['dtrain']['median_ms']:>10.1f} {mib('dtrain')}"
        if peer:
            line += f" {row['sides']['peer']['median_ms']:>11.1f} {mib('peer')} {row['ratio_vs_peer']:>5.2f}x"
        print(line)

    data = "recorded episodes (dtrain-episodes/1); every frame a sample, its action chunk padded past the episode's end"
    if first_peer is not None:
        h, w = first_peer["image"]
        data = (f"{first_peer['episodes']} episode(s), {first_peer['samples']} frames, "
                f"{len(first_peer['cameras'])} camera(s) at {h}x{w} (uint8, normalised per channel), state "
                f"{first_peer['state_dim']}, action {first_peer['action_dim']}; every frame a sample, its action "
                f"chunk padded past the episode's end (action_is_pad)")
    out = {
        **run_record(args.cores),
        "method": f"per run: rank 0's median step over steps {args.warmup + 1}..{args.steps} (dtrain's step_ms; the "
                  f"PyTorch script times zero_grad through optimizer.step, the batch's normalisation and the "
                  f"gradient clipping included); samples/s = ranks x batch / step; reported: the median of "
                  f"{args.repeat} run(s), the sides' order reversed every run; layouts ranks x threads per rank "
                  f"(OMP_NUM_THREADS = OPENBLAS_NUM_THREADS, both sides); ratio_vs_peer: dtrain's samples/s over "
                  f"the peer's",
        "model_setup": {"model": model_text(first_peer, args.size), "batch_per_rank": args.batch, "precision": "fp32",
                        "optimizer": "AdamW lr 1e-5 (backbone 1e-5), weight decay 1e-4, gradient norm clipped at 10",
                        "loss": "L1 over the unpadded action steps + 10 x KL (LeRobot's ACT)",
                        "strategy": "DDP (gloo on the PyTorch side)", "data": data},
        "sides": versions,
        "settings": settings,
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    if peer:
        v = versions["peer"]
        print(f"peer: torch {v['torch']}, lerobot {v['lerobot']}, {v['settings']}")
    print(f"x: dtrain's samples/s over the peer's; MiB: rank 0's peak resident set; batch {args.batch} samples per "
          f"rank; JSON: {args.json}")


if __name__ == "__main__":
    main()

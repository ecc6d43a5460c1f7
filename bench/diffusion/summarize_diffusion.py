"""Tables and JSON for the diffusion benchmark (dtrain's train_diffusion against diffusers + peft + PyTorch DDP).

usage: summarize_diffusion.py WORK_DIR --modes lora,full --layouts 2x1,1x2 --repeat N --warmup W
                              --impls dtrain,peer --cores C --batch B --steps S --lora-r R --lora-alpha A
                              --lora-targets T --load-at-start "L1 L5 L15" --json OUT
Reads WORK_DIR/model.json (bench/diffusion/make_unet.py's) and, for every mode, layout RxT (R ranks
x T threads each), side and run i = 1..N:
  WORK_DIR/<mode>.RxT.dtrain.<i>.jsonl  train_diffusion's metrics records (step_ms per step) and the
                                        .log beside it (rank 0's peak resident set, the banner)
  WORK_DIR/<mode>.RxT.peer.<i>.json     bench/diffusion/torch_ddp_diffusion.py's JSON
prints one row per mode and layout with each side's median step (median of the runs' medians),
samples/s, rank 0's peak resident set and the ratio of samples/s, dtrain over the peer, and
writes every run's figures, the versions measured, the load, the date, commit and machine to OUT.
"""

import argparse
import json
import os
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(here))  # bench/machine.py
sys.path.insert(0, os.path.join(os.path.dirname(here), "hf"))  # bench/hf/summarize_policy.py
from machine import run_record  # noqa: E402
from summarize_policy import dtrain_run, layout_of  # noqa: E402

MODES = {"lora": "LoRA", "full": "full"}


def dtrain_diffusion_run(stem, warmup, samples_per_step):
    """summarize_policy's dtrain_run, with train_diffusion's first line (rank-prefixed by dtrain-run) as the banner."""
    run = dtrain_run(stem, warmup, samples_per_step)
    if "banner" not in run and os.path.exists(stem + ".log"):
        with open(stem + ".log") as f:
            banner = next((line for line in f if "train_diffusion:" in line), None)
        if banner:
            run["banner"] = banner.split("train_diffusion:", 1)[1].strip()
    return run


def load_text(start, end, cores):
    """What the load averages say of other processes: any load before the run is theirs; at its end the
    benchmark's own processes account for about `cores` of it."""
    before = (f"load average {start[0]:.2f} before the benchmark started: other processes were running"
              if start[0] >= 0.5 else f"load average {start[0]:.2f} before the benchmark started: idle")
    after = f"{end[0]:.2f} at its end"
    if end[0] > cores + 0.5:
        after += f", above the benchmark's own {cores} threads: other processes were running by then"
    loaded = start[0] >= 0.5 or end[0] > cores + 0.5
    return (f"{before}; {after}" + ("; the figures were taken (at least partly) under load (the sides alternate, so "
                                   "both share it; each run's figures are kept: read ratios, not digits)"
                                   if loaded else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    for name in ("modes", "layouts", "impls", "lora-targets", "load-at-start"):
        p.add_argument(f"--{name}", required=True)
    for name in ("repeat", "warmup", "cores", "batch", "steps", "lora-r"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--lora-alpha", type=float, required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    impls = args.impls.split(",")
    peer = "peer" in impls
    with open(os.path.join(args.work, "model.json")) as f:
        model = json.load(f)

    settings, versions, first_peer = [], {}, None
    header = f"{'mode':>5} {'ranks x thr':>11} {'dtrain ms':>10} {'samples/s':>9} {'MiB':>6}"
    if peer:
        header += f" {'peer ms':>9} {'samples/s':>9} {'MiB':>6} {'x':>6}"
    print(header)
    for mode in args.modes.split(","):
        if mode not in MODES:
            sys.exit(f"summarize_diffusion.py: mode '{mode}' is not one of {', '.join(MODES)}")
        for layout in args.layouts.split(","):
            n, threads = layout_of(layout)
            stem = f"{args.work}/{mode}.{n}x{threads}"
            runs = {impl: [] for impl in impls}
            for i in range(1, args.repeat + 1):
                runs["dtrain"].append(dtrain_diffusion_run(f"{stem}.dtrain.{i}", args.warmup, n * args.batch))
                if peer:
                    with open(f"{stem}.peer.{i}.json") as f:
                        runs["peer"].append(json.load(f))
            row = {"mode": mode, "layout": f"{n}x{threads}", "ranks": n, "threads_per_rank": threads, "sides": {}}
            for impl in impls:
                rss = [r["peak_rss_mib"] for r in runs[impl] if "peak_rss_mib" in r]
                row["sides"][impl] = {
                    "median_ms": statistics.median(r["median_ms"] for r in runs[impl]),
                    "samples_per_s": statistics.median(r["samples_per_s"] for r in runs[impl]),
                    "peak_rss_mib": round(statistics.median(rss), 1) if rss else None,
                    "runs": runs[impl]}
            if peer:
                first = runs["peer"][0]
                first_peer = first_peer or first
                row["parameters"], row["trainable_peer"] = first["parameters"], first["trainable"]
                versions["peer"] = {"torch": first["torch"], "diffusers": first["diffusers"], "peft": first["peft"],
                                    "optimizer": first["optimizer"],
                                    "settings": f"eager, diffusers' UNet2DConditionModel (peft's add_adapter for "
                                                f"LoRA), torch.optim.AdamW ({first['optimizer']}), DDP over gloo"}
                row["ratio_vs_peer"] = round(row["sides"]["dtrain"]["samples_per_s"]
                                             / row["sides"]["peer"]["samples_per_s"], 3)
            settings.append(row)

            def cells(impl, width):
                s = row["sides"][impl]
                rss = f"{s['peak_rss_mib']:>6.0f}" if s["peak_rss_mib"] is not None else f"{'-':>6}"
                return f"{s['median_ms']:>{width}.1f} {s['samples_per_s']:>9.3f} {rss}"
            line = f"{mode:>5} {f'{n} x {threads}':>11} {cells('dtrain', 10)}"
            if peer:
                line += f" {cells('peer', 9)} {row['ratio_vs_peer']:>5.2f}x"
            print(line)

    start = [float(v) for v in args.load_at_start.split()[:3]]
    blocks = ", ".join(str(c) for c in model["block_out_channels"])
    unet = (f"UNet2DConditionModel of Stable Diffusion 1.5's structure ({' + '.join(model['down_block_types'])}; "
            f"{' + '.join(model['up_block_types'])}; layers_per_block {model['layers_per_block']}, "
            f"attention_head_dim {model['attention_head_dim']}, cross_attention_dim {model['text'][1]}, "
            f"norm_num_groups {model['norm_num_groups']}) at reduced width: block_out_channels ({blocks}); "
            f"{model['parameters']} parameters, random weights (diffusers' save_pretrained)")
    if model["size"] == "smoke":
        unet = f"smoke: a tiny UNet2DConditionModel, block_out_channels ({blocks}), {model['parameters']} parameters"
    out = {
        **run_record(args.cores, load_average_at_start=start),
        "load": load_text(start, os.getloadavg(), args.cores),
        "method": f"per run: rank 0's median step over steps {args.warmup + 1}..{args.steps} (train_diffusion's "
                  f"step_ms; the PyTorch script times zero_grad through optimizer.step, the batch's gathering, the "
                  f"noise and timestep draws and the noising included); samples/s = ranks x batch / step; "
                  f"reported: the median of {args.repeat} run(s), the sides' order reversed every run; layouts "
                  f"ranks x threads per rank (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS, both sides; "
                  f"torch.set_num_threads the same); ratio_vs_peer: dtrain's samples/s over the peer's",
        "model_setup": {
            "model": unet,
            "latents": model["latents"], "text": model["text"], "records": model["records"],
            "modes": {"lora": f"LoRA r={args.lora_r} alpha {args.lora_alpha:g} on {args.lora_targets} "
                              f"(the UNet frozen; peft's unet.add_adapter on the PyTorch side)",
                      "full": "full fine-tuning (every parameter trains)"},
            "batch_per_rank": args.batch, "precision": "fp32",
            "optimizer": "AdamW lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2 on every trainable "
                         "parameter (dtrain: no_decay=false), constant lr, no gradient clipping",
            "loss": "epsilon prediction, MSE; Stable Diffusion's scaled-linear schedule (betas 0.00085 to 0.012, "
                    "1000 steps; the peer's DDPMScheduler(beta_schedule=\"scaled_linear\")), timesteps uniform, "
                    "no Min-SNR, no noise offset, no caption dropout, no evaluation",
            "strategy": "DDP (gloo on the PyTorch side)",
            "data": f"{model['records']} random records (latents {model['latents']}, encoder_hidden_states "
                    f"{model['text']}, float32) in train_diffusion's records format; no VAE or text encoder runs"},
        "sides": versions,
        "settings": settings,
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    if peer:
        v = versions["peer"]
        print(f"peer: torch {v['torch']}, diffusers {v['diffusers']}, peft {v['peft']}, {v['settings']}")
    print(f"x: dtrain's samples/s over the peer's; MiB: rank 0's peak resident set; batch {args.batch} per rank; "
          f"{out['load']}; JSON: {args.json}")


if __name__ == "__main__":
    main()

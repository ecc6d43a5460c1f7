#!/usr/bin/env python3
"""The docs' performance tables, made from bench/results/*.json.

A table in README.md, docs/*.md or docs/dev/*.md that comes from a results file sits
between two markers, which name the table this script makes there:

    <!-- table: training.adamw -->
    | ... the table ... |
    (source line: the file, its date, machine and commit)
    <!-- /table -->

  docs_tables.py --write   rewrites every marked table from its results file
  docs_tables.py --check   exits 1 naming each marked table that differs from
                           what --write would make, or names an unknown table
  docs_tables.py --list    the tables this script knows, with their files

docs_test runs --check, so a table edited by hand or a results file
re-measured without --write fails CI.

--check also checks every figure in prose by value against the results field
it comes from (bench/docs_figures.py says how a paragraph names them), and that
every results file records its date, commit, dirty flag and machine
(bench/machine.py). Each table's renderer below reads one file; a new table is
a new function in RENDERERS.
"""

import argparse
import json
import os
import re
import sys

import docs_figures
import machine

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import gpu_report  # noqa: E402  (scripts/gpu_report.py: the GPU records)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, folder, f) for folder in ("docs", os.path.join("docs", "dev"))
    for f in os.listdir(os.path.join(ROOT, folder)) if f.endswith(".md"))
BEGIN = re.compile(r"^<!-- table: ([a-z0-9_.-]+) -->$")
END = "<!-- /table -->"


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def torch_version(text):
    """'torch.optim.AdamW, torch 2.15.0+cu132 (PyPI)' -> 'torch 2.15'."""
    m = re.search(r"[Tt]orch (\d+)\.(\d+)", text or "")
    return f"torch {m.group(1)}.{m.group(2)}" if m else "torch"


def torch_minor(version):
    """'2.15.0+cu132' -> 'torch 2.15'."""
    return "torch " + ".".join(version.split(".")[:2])


def source(name, data):
    """The line under a table: which file, when, where, at which commit."""
    machine = data.get("machine") or {}
    if isinstance(machine, str):  # older files: the architecture only
        machine = {"cpu": machine}
    where = machine.get("cpu", "machine not recorded")
    cores = machine.get("cores") or data.get("cores")
    if cores:
        where += f", {cores} cores"
    if machine.get("gpu") and machine["gpu"] != "none":
        where += f", {machine['gpu']} (driver {machine.get('driver', '?')})"
    commit = data.get("commit") or "commit not recorded"
    return f"(`bench/results/{name}`: {data.get('date', 'date not recorded')}, {where}, {commit}.)"


def table(header, align, rows):
    def line(cells):
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
    return [line(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"] + [line(r) for r in rows]


def millions(n):
    return f"{n // 1000000}M" if n % 1000000 == 0 else f"{n:,}"


def training_adamw():
    d = load("training.json")
    a = d["adamw"]
    peer, old = torch_version(a.get("peer")), torch_version(a.get("torch"))
    rows = []
    for r in a["results"]:
        old_best = min(r[k]["ms"] for k in r if k.startswith("torch_"))
        rows.append([millions(r["elements"]), f"{r['dtrain']['ms']:.1f}", f"{r['dtrain']['gbps']:.1f}",
                     f"{r['dtrain_no_errno']['ms']:.1f}", f"{r['dtrain_no_errno']['gbps']:.1f}",
                     f"{r['peer_fused']['ms']:.1f}", f"{r['peer_fused']['gbps']:.1f}",
                     f"{r['peer_foreach']['ms']:.1f}", f"{old_best:.1f}", f"{r['stream']['gbps']:.1f}"])
    header = ["elements", "dtrain ms", "GB/s", "dtrain `-fno-math-errno` ms", "GB/s", f"{peer} `fused=True` ms",
              "GB/s", f"{peer} foreach ms", f"{old} best ms", "stream GB/s"]
    first = table(header, "r" * len(header), rows)
    res = a["results"]
    pct = lambda v: f"{100 * v:.0f}%"
    ratio = lambda v: f"{v:.2f}x"
    shares = [
        ("dtrain, plain `dtrain::dtrain`: share of the stream reference", [pct(r["dtrain"]["vs_stream"]) for r in res]),
        (f"dtrain, plain `dtrain::dtrain`: speed-up over {peer}'s fused AdamW",
         [ratio(r["peer_fused"]["ms"] / r["dtrain"]["ms"]) for r in res]),
        ("dtrain with `dtrain::optimized` (`-fno-math-errno`): share of the stream reference",
         [pct(r["dtrain_no_errno"]["vs_stream"]) for r in res]),
        (f"dtrain with `dtrain::optimized`: speed-up over {peer}'s fused AdamW",
         [ratio(r["peer_fused"]["ms"] / r["dtrain_no_errno"]["ms"]) for r in res]),
        (f"{peer} fused: share of the stream reference", [pct(r["peer_fused"]["vs_stream"]) for r in res]),
        (f"(history) dtrain, plain: speed-up over {old}'s faster variant",
         [f"{min(r[k]['ms'] for k in r if k.startswith('torch_')) / r['dtrain']['ms']:.1f}x" for r in res]),
    ]
    second = table([""] + [millions(r["elements"]) for r in res], "l" + "r" * len(res),
                   [[label] + values for label, values in shares])
    return first + [""] + second + ["", source("training.json", d)]


def training_mlp():
    d = load("training.json")
    peer, old = torch_version(d.get("peers", {}).get("pypi")), torch_version(d.get("peers", {}).get("debian"))
    rows = []
    for r in d["mlp"]["results"]:
        ms = r["dtrain"]["step_ms"]
        rows.append([str(r["ranks"]), str(r["threads_per_rank"]), f"{ms:.3f}", f"{r['dtrain']['samples_per_s']:,.0f}",
                     f"{r['peer']['step_ms']:.3f}", f"{r['peer']['step_ms'] / ms:.2f}x",
                     f"{r['torch']['step_ms']:.3f}", f"{r['torch']['step_ms'] / ms:.2f}x"])
    header = ["ranks", "threads / rank", "train_mlp step ms", "samples/s", f"{peer} DDP step ms", f"dtrain / {peer}",
              f"{old} DDP step ms", f"dtrain / {old}"]
    return table(header, "r" * len(header), rows) + ["", source("training.json", d)]


def training_ddp_overhead():
    d = load("training.json")
    runs = sorted(d["ddp_overhead"], key=lambda r: r["threads"])
    cols = [f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}: step ms (median of {r['steps_timed']})"
            for r in runs]
    rows = [["Trainer, DDP, world size 1"] + [f"{r['trainer_step_ms']:.3f}" for r in runs],
            ["Trainer, `grad_norm = false`"] + [f"{r['trainer_no_grad_norm_step_ms']:.3f}" for r in runs],
            ["hand-written, no communication"] + [f"{r['hand_step_ms']:.3f}" for r in runs],
            ["overhead"] + [f"**{r['overhead_pct']:+.1f}%** ({r['overhead_no_grad_norm_pct']:+.1f}% without the norm)"
                            for r in runs]]
    return table(["loop"] + cols, "l" + "r" * len(runs), rows) + ["", source("training.json", d)]


def gpt_rows():
    d = load("gpt.json")
    return d, sorted(d["results"], key=lambda r: (r["ranks"], r["activation_checkpointing"]))


def gpt_step():
    d, rows = gpt_rows()
    first = rows[0]
    old = torch_version(first["torch"]["implementation"])
    peer = torch_version(first["peer"]["implementation"])
    out = []
    for r in rows:
        ms = r["dtrain"]["step_ms"]
        line = [str(r["ranks"]), str(r["threads_per_rank"]), "on" if r["activation_checkpointing"] else "off",
                f"{ms:.2f}"]
        for side in ("torch", "peer", "peer_compile"):
            other = r.get(side)
            line += [f"{other['step_ms']:.2f}", f"{other['step_ms'] / ms:.2f}x"] if other else ["", ""]
        out.append(line)
    header = ["ranks", "threads / rank", "activation checkpointing", "train_gpt step ms", f"{old} step ms",
              f"dtrain / {old[6:]}", f"{peer} eager step ms", f"dtrain / {peer[6:]} eager",
              f"{peer} compiled step ms", f"dtrain / {peer[6:]} compiled"]
    return table(header, "rrl" + "r" * 7, out) + ["", source("gpt.json", d)]


def gpt_second_side(side, speedup, default_name, side_setting, missing):
    """train_gpt against itself with one setting changed (the runs named `side`), where gpt.json has them."""
    d, rows = gpt_rows()
    out = [[str(r["ranks"]), str(r["threads_per_rank"]), "on" if r["activation_checkpointing"] else "off",
            f"{r['dtrain']['step_ms']:.2f}", f"{r[side]['step_ms']:.2f}", f"{r[speedup]:.2f}x"]
           for r in rows if side in r]
    if not out:
        raise ValueError(f"gpt.json has no {side_setting} runs ({missing})")
    header = ["ranks", "threads / rank", "activation checkpointing", f"{default_name} (default) step ms",
              f"`{side_setting}` step ms", f"{default_name} speed-up"]
    return table(header, "rrlrrr", out) + ["", source("gpt.json", d)]


def gpt_host_threads():
    return gpt_second_side("dtrain_openblas", "pool_speedup", "pool", "DTRAIN_HOST_THREADS=openblas",
                           "a machine with one core?")


def gpt_host_gemm():
    return gpt_second_side("dtrain_gemm_openblas", "onednn_speedup", "oneDNN", "DTRAIN_HOST_GEMM=openblas",
                           "oneDNN not installed?")


def gpt_memory():
    d, rows = gpt_rows()
    old = torch_version(rows[0]["torch"]["implementation"])
    mib = lambda b: f"{b / 1048576:.2f}"
    out = []
    for r in rows:
        m = r["dtrain"]["memory_bytes"]
        out.append([str(r["ranks"]), "on" if r["activation_checkpointing"] else "off",
                    f"{r['dtrain']['peak_rss_mib']:.1f}", f"{r['torch']['peak_rss_mib']:.1f}",
                    mib(m["params"] + m["grads"] + m["optimizer"]), mib(m["activations"])])
    header = ["ranks", "activation checkpointing", "train_gpt peak RSS", f"{old} peak RSS",
              "dtrain params + grads + optimizer", "dtrain activations"]
    return table(header, "rlrrrr", out) + ["", source("gpt.json", d)]


# The models bench/run_hf_bench.sh builds from a config.json (its --models names).
HF_MODELS = {
    "gpt2-124m": "GPT-2 124M (12 x 768, tied head)",
    "llama-100m": "Llama-shaped, 99.5M (8 x 768, 12 heads, 4 KV heads, SwiGLU 2048, vocabulary 32000)",
}


def hf_step(name="hf.json"):
    d = load(name)
    peer, old = torch_minor(d["sides"]["peer"]["torch"]), torch_minor(d["sides"]["torch"]["torch"])
    out, last = [], None
    for r in d["settings"]:
        ms = r["sides"]["dtrain"]["median_ms"]
        line = [HF_MODELS.get(r["model"], r["model"]) if r["model"] != last else "",
                f"{r['ranks']} x {r['threads_per_rank']}", "on" if r["activation_checkpointing"] else "off",
                f"{ms:.1f}"]
        for side in ("peer", "torch"):
            other = r["sides"].get(side)
            line += [f"{other['median_ms']:.1f}", f"{other['median_ms'] / ms:.2f}x"] if other else ["", ""]
        out.append(line)
        last = r["model"]
    header = ["model", "ranks x threads", "checkpointing", "train_lm step ms", f"{peer} step ms",
              f"dtrain / {peer}", f"{old} step ms", f"dtrain / {old}"]
    return table(header, "lll" + "r" * 5, out) + ["", source(name, d)]


def vlm_step():
    d = load("vlm.json")
    peer = torch_minor(d["sides"]["peer"]["torch"])
    out, last = [], None
    for r in d["settings"]:
        dt, pt = r["sides"]["dtrain"], r["sides"]["peer"]
        out.append([f"`{r['train']}`" if r["train"] != last else "", f"{r['ranks']} x {r['threads_per_rank']}",
                    f"{dt['median_ms']:.0f}", f"{dt['peak_rss_mib']:.0f}", f"{pt['median_ms']:.0f}",
                    f"{pt['peak_rss_mib']:.0f}", f"{r['ratio_vs_peer']:.2f}x"])
        last = r["train"]
    header = ["train", "ranks x threads", "train_vlm step ms", "MiB", f"{peer} step ms", "MiB", f"dtrain / {peer}"]
    return table(header, "ll" + "r" * 5, out) + ["", source("vlm.json", d)]


def policy_step():
    d = load("policy.json")
    peer = torch_minor(d["sides"]["peer"]["torch"])
    lerobot = d["sides"]["peer"].get("lerobot", "")
    out = []
    for r in d["settings"]:
        dt, pt = r["sides"]["dtrain"], r["sides"]["peer"]
        out.append([f"{r['ranks']} x {r['threads_per_rank']}", f"{dt['median_ms']:.0f}", f"{dt['peak_rss_mib']:.0f}",
                    f"{pt['median_ms']:.0f}", f"{pt['peak_rss_mib']:.0f}", f"{r['ratio_vs_peer']:.2f}x"])
    name = f"LeRobot {lerobot} + {peer}"
    header = ["ranks x threads", "train_policy step ms", "MiB", f"{name} step ms", "MiB", "dtrain / LeRobot"]
    return table(header, "l" + "r" * 5, out) + ["", source("policy.json", d)]


def diffusion_step():
    d = load("diffusion.json")
    peer = d["sides"]["peer"]
    name = f"diffusers {peer['diffusers']} + {torch_minor(peer['torch'])}"
    out, last = [], None
    for r in d["settings"]:
        dt, pt = r["sides"]["dtrain"], r["sides"]["peer"]
        out.append([{"lora": "LoRA r=16", "full": "full"}[r["mode"]] if r["mode"] != last else "",
                    f"{r['ranks']} x {r['threads_per_rank']}", f"{dt['median_ms']:.0f}",
                    f"{dt['samples_per_s']:.2f}", f"{dt['peak_rss_mib']:.0f}", f"{pt['median_ms']:.0f}",
                    f"{pt['samples_per_s']:.2f}", f"{pt['peak_rss_mib']:.0f}", f"{r['ratio_vs_peer']:.2f}x"])
        last = r["mode"]
    header = ["mode", "ranks x threads", "train_diffusion step ms", "samples/s", "MiB", f"{name} step ms",
              "samples/s", "MiB", "dtrain / diffusers"]
    return table(header, "ll" + "r" * 7, out) + ["", source("diffusion.json", d)]


def offload_steps():
    d = load("offload.json")
    mib = lambda states: (lambda b: "0" if b == 0 else f"{b / 1048576:.2f}")(sum(states.values()))
    out = []
    for r in d["results"]:
        vs = "" if r["offload"] == "none" else f"{100 * r['overhead_vs_none']:+.1f}%"
        out.append([r["strategy"], r["offload"], f"{r['step_ms']:.1f}", vs, mib(r["device_model_states"]),
                    mib(r["host_model_states"])])
    header = ["strategy", "offload", "step ms", "vs none", "device model states MiB", "host MiB"]
    return table(header, "llrrrr", out) + ["", source("offload.json", d)]


def sft_packing():
    d = load("sft_packing.json")
    m = d["modes"]
    rows = [["one record per sequence, padded", f"{m['padded']['median_step_ms']:.1f}",
             f"{100 * m['padded']['fill']:.1f}%", f"{m['padded']['record_tokens_per_s']:.0f}"],
            [f"packed ({d['records']} records in {d['packed_blocks']} blocks)", f"{m['packed']['median_step_ms']:.1f}",
             f"{100 * m['packed']['fill']:.1f}%", f"{m['packed']['record_tokens_per_s']:.0f}"]]
    header = ["mode", "step ms", "blocks filled by records", "record tokens/s"]
    return table(header, "lrrr", rows) + ["", source("sft_packing.json", d)]


def recompute_modes():
    d = load("activation_checkpointing.json")
    names = {"none": "none", "every": "every block", "every2": "every second block",
             "budget": f"budget {d['budget_mib']} MiB"}
    base = next(r for r in d["rows"] if r["mode"] == "none")
    mib = lambda b: f"{b / 1048576:.0f}"
    rows = []
    for r in d["rows"]:
        t, s = r["dtrain"], r["dtrain"]["median_step_ms"] / 1000
        step = f"{s:.2f}" if r is base else f"{s:.2f} ({100 * (s * 1000 / base['dtrain']['median_step_ms'] - 1):+.0f}%)"
        line = [names.get(r["mode"], r["mode"]), step, mib(t["activations_bytes"]), mib(t["estimated_activations_bytes"]),
                f"{t['peak_rss_mib']:.0f}"]
        p = r.get("peer")
        if p:
            ps = p["median_step_ms"] / 1000
            pstep = (f"{ps:.2f}" if r is base
                     else f"{ps:.2f} ({100 * (p['median_step_ms'] / base['peer']['median_step_ms'] - 1):+.0f}%)")
            line += [pstep, f"{p['peak_rss_mib']:.0f}", f"{p['median_step_ms'] / t['median_step_ms']:.2f}x"]
        else:
            line += ["", "", ""]
        rows.append(line)
    peer = torch_minor(base["peer"]["torch"])
    header = ["mode", "dtrain step s", "activations MiB (rank 0)", "estimated", "peak RSS MiB", f"{peer} step s",
              "its peak RSS MiB", "speed"]
    return table(header, "l" + "r" * 7, rows) + ["", source("activation_checkpointing.json", d)]


LORA_MODELS = {"gpt2-124m": "GPT-2 124M", "llama-100m": "Llama shape 100M"}


def lora_steps(name, counts):
    """train_lm with LoRA against peft on both torches; `counts`: the model
    column gives trainable / all parameters."""
    d = load(name)
    side = lambda k: f"torch {'.'.join(d['sides'][k]['torch'].split('.')[:2])} + peft " \
                     f"{'.'.join(d['sides'][k]['peft'].split('.')[:2])}"
    peer, old = side("peer"), side("torch")
    rows = []
    for r in d["settings"]:
        label = LORA_MODELS.get(r["model"], r["model"])
        if counts:
            label += f" ({r['trainable'] / 1e6:.2f}M / {r['parameters'] / 1e6:.1f}M)"
        t = r["sides"]["dtrain"]
        line = [label, f"{t['median_ms']:.1f}", f"{t['peak_rss_mib']:.0f}"]
        for k in ("peer", "torch"):
            o = r["sides"][k]
            line += [f"{o['median_ms']:.1f}", f"{o['peak_rss_mib']:.0f}", f"{o['median_ms'] / t['median_ms']:.2f}x"]
        rows.append(line)
    header = ["model (trainable / all parameters)" if counts else "model", "dtrain step ms", "peak RSS MiB",
              f"{peer} ms", "MiB", f"dtrain / {peer.split()[1]}", f"{old} ms", "MiB", f"dtrain / {old.split()[1]}"]
    return table(header, "l" + "r" * 8, rows) + ["", source(name, d)]


def comm_collectives():
    d = load("comm_bandwidth.json")
    index = lambda side: {(r["collective"], r["bytes"]): r for r in d[side]["results"]} if side in d else {}
    shm, gloo, peer, old = index("dtrain_shm"), index("dtrain_gloo"), index("torch_peer"), index("torch")
    peer_v, old_v = torch_minor(d["torch_versions"]["peer"]), torch_minor(d["torch_versions"]["debian"])
    mib = 1 << 20
    # every all-reduce size, the smallest and largest of the others
    keys = []
    for coll in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        sizes = sorted(b for c, b in shm if c == coll)
        keys += [(coll, b) for b in (sizes if coll == "all_reduce" else [sizes[0], sizes[-1]])]
    rows = []
    for key in keys:
        r = shm[key]
        line = [key[0], f"{key[1] // mib} MiB", f"{r['time_us']:.0f}", f"{r['busbw_gbps']:.2f}"]
        g = gloo.get(key)
        line += [f"{g['time_us']:.0f}", f"{g['busbw_gbps']:.2f}"] if g and g.get("time_us") is not None else ["n/a", ""]
        for other in (peer, old):
            o = other.get(key)
            line += ([f"{o['time_us']:.0f}", f"{o['busbw_gbps']:.2f}", f"{o['time_us'] / r['time_us']:.1f}x"]
                     if o and o.get("time_us") is not None else ["n/a", "", ""])
        rows.append(line)
    header = ["collective", "size", "shm (us)", "shm busbw", "gloo (us)", "gloo busbw", f"{peer_v} (us)",
              f"{peer_v} busbw", f"shm vs {peer_v}", f"{old_v} (us)", f"{old_v} busbw", f"shm vs {old_v}"]
    return table(header, "l" + "r" * 11, rows) + ["", source("comm_bandwidth.json", d)]


def checkpoint_save_load():
    d = load("checkpoint.json")
    mib = lambda b: "0" if b == 0 else f"{b / 1048576:.1f}"
    rows = []
    for r in d["dtrain"]:
        rows.append([r["strategy"], str(r["ranks"]), f"{r['save_sharded_s']:.2f}", f"{r['save_consolidated_s']:.2f}",
                     f"{r['load_sharded_s']:.2f}", f"{r['load_consolidated_s']:.2f}",
                     ", ".join(mib(b) for b in r["sharded_bytes_per_rank"])])
    for side in ("torch_peer", "torch"):
        t = d.get(side)
        if not t:
            continue
        version = torch_minor(t["torch"])
        for v in t.get("variants", [t]):
            if v.get("variant", "default") == "default":
                label = f"{version} `torch.save` / `torch.load`"
            else:
                saving = "no CRC-32" if v["save_options"].get("compute_crc32") is False else \
                    ", ".join(f"{k}={x}" for k, x in v["save_options"].items())
                loading = ", ".join(f"{k}={x}" for k, x in v["load_kwargs"].items())
                label = f"{version} {v['variant']}: {saving} / `{loading}`"
            rows.append([label, "1", f"{v['save_s']:.2f} ({v['save_fsync_s']:.2f} with fsync)", "",
                         f"{v['load_s']:.2f}", "", mib(v["bytes"])])
    header = ["strategy", "ranks", "save sharded s", "save consolidated s", "load sharded s", "load consolidated s",
              "MiB written per rank (sharded)"]
    return table(header, "lrrrrrl", rows) + ["", source("checkpoint.json", d)]


def strategies_label(r):
    """The row's name in the strategy tables."""
    if r["implementation"] == "dtrain":
        return r["strategy"] + (f" (group {r['shard_group']})" if r.get("shard_group") else "")
    version = torch_minor(r.get("torch_version", r["implementation"].split()[1]))[len("torch "):]
    fused = ", fused AdamW" if r.get("fused_adamw") else ""
    if "fsdp" in r["strategy"]:
        mode = "full" if r["strategy"].endswith("full") else "grad-op"
        return f"PyTorch {version} {r.get('api', 'fsdp').upper()} {mode} (bf16 mixed precision{fused})"
    return f"PyTorch {version} DDP ({'bf16 autocast' if r.get('precision') == 'bf16' else 'fp32'}{fused})"


def strategies_ranks(ranks):
    d = load("strategies.json")
    res = next(x for x in d["results"] if x["ranks"] == ranks)
    mib = lambda b: f"{b / 1048576:.2f}"
    ddp = next(r for r in res["rows"] if r["implementation"] == "dtrain" and r["strategy"] == "ddp")
    rows = []
    for r in res["rows"]:
        line = [strategies_label(r), f"{r['samples_per_s']:,.0f}", f"{r['step_ms']:.2f}",
                f"{ddp['step_ms'] / r['step_ms']:.2f}x"]
        zero = r.get("zero_model") or {}
        if r["implementation"] == "dtrain":
            m = r["memory_bytes"]
            line += [mib(m[k]) for k in ("params", "grads", "optimizer", "master", "gathered", "activations")]
            line += [mib(r["model_states_bytes"]), mib(zero["bytes"]), zero["stage"], mib(r["total_bytes"])]
        else:
            m = r["model_state_bytes"]
            line += [mib(m["params"]), mib(m["grads"]), mib(m["optimizer"]), "", "", "", mib(r["model_states_bytes"]),
                     mib(zero["bytes"]) if zero else "", zero.get("stage", ""), ""]
        rows.append(line)
    header = ["strategy", "samples/s", "step ms", "vs ddp", "params", "grads", "optimizer", "master", "gathered",
              "activations", "model states", "ZeRO model", "ZeRO stage", "total"]
    return table(header, "lrrrrrrrrrrrlr", rows) + ["", source("strategies.json", d)]


def cost_model_fit():
    d = load("cost_model.json")
    rows = [[t["name"], f"{t['alpha_us']:.1f}", f"{t['bus_bandwidth_gbps']:.3f}"] for t in d["transports"]]
    return table(["implementation", "alpha (us)", "B (GB/s)"], "lrr", rows) + ["", source("cost_model.json", d)]


def cost_model_checks():
    d = load("cost_model.json")
    rows = [[t["name"], c["collective"], f"{c['bytes'] / 2**20:g}", f"{c['measured_us'] / 1000:.2f}",
             f"{c['predicted_us'] / 1000:.2f}", f"{c['error_pct']:+.0f}%"]
            for t in d["transports"] for c in t["checks"]]
    return (table(["implementation", "collective", "MiB", "measured ms", "predicted ms", "error"], "llrrrr", rows) +
            ["", source("cost_model.json", d)])


def cost_model_scaling():
    d = load("cost_model.json")
    rows = [[r["implementation"], r["strategy"], str(r["ranks"]), f"{r['samples_per_s']:,.0f}",
             f"{r['vs_one_rank']:.2f}"] for r in d["scaling_one_machine"]]
    strat = {"date": d.get("strategies_date"), "machine": d.get("strategies_machine"),
             "commit": d.get("strategies_commit")}
    return (table(["implementation", "strategy", "ranks", "samples/s", "vs 1 rank"], "llrrr", rows) +
            ["", source("strategies.json", strat)])


def cost_model_ddp():
    d = load("cost_model.json")
    p = d["ddp_prediction"]
    rows = [[r["link"], str(r["nodes"]), f"{r['all_reduce_ms']:.2f}", f"{100 * r['efficiency_no_overlap']:.0f}%",
             f"{100 * r['efficiency_full_overlap']:.0f}%"] for r in p["rows"]]
    return (table(["link", "N", "all-reduce ms", "efficiency, no overlap", "efficiency, full overlap"], "lrrrr", rows) +
            ["", f"({p['gradient_bytes'] / 1e6:.2f} MB of fp32 gradients, {p['compute_ms']:.2f} ms of compute per step, "
                 f"alpha {p['alpha_us'] / 1000:.2f} ms; " + source("cost_model.json", d)[1:]])


def fuzz_runs():
    d = load("fuzz.json")
    rows = []
    for run in d["runs"]:
        for t in run["targets"]:
            rate = f"{t['executions'] / t['seconds']:,.0f}" if t["seconds"] else ""
            found = str(t["findings"]) + ("" if t["exit"] in (0, 70, 77) or t["findings"] else " (stopped)")
            rows.append([run["date"], run["commit"], f"`{t['target']}`", f"{t['executions']:,}", str(t["seconds"]),
                         rate, str(t["corpus"]), found])
    return (table(["date", "commit", "target", "executions", "seconds", "exec/s", "corpus", "findings"], "lllrrrrr",
                  rows) + ["", f"(`bench/results/fuzz.json`: every run of `tests/fuzz/run_fuzz.sh`, "
                               f"{d['runs'][-1]['compiler']}, the 2-core development VM; notes per run there.)"])


GEMM_ENGINES = [("openblas-pthread", "OpenBLAS, pthreads (dtrain's `DTRAIN_HOST_GEMM=openblas`)"), ("openblas-openmp", "OpenBLAS, OpenMP"),
                ("blis-pthread", "BLIS, pthreads"), ("onednn", "oneDNN `dnnl_sgemm` (dtrain's default where installed)"),
                ("mkl", "MKL (the PyPI `mkl` wheel)")]
GEMM_MODELS = [("gpt2-124m", "GPT-2 124M"), ("llama-100m", "Llama-shaped")]


def gemm_engines():
    d = load("gemm.json")
    peer = d.get("peer", {})
    labels = dict(GEMM_ENGINES, torch=f"{torch_minor(peer['torch'])} `torch.mm` (bundled {peer.get('blas', '?').upper()})")
    steps = {(s["engine"], s["model"], s["threads"]): s["step_ms"] for s in d["steps"]}
    columns = sorted({(m, t) for _, m, t in steps}, key=lambda c: ([m for m, _ in GEMM_MODELS].index(c[0]), c[1]))
    fastest = {c: min(ms for (e, m, t), ms in steps.items() if (m, t) == c) for c in columns}
    rows = []
    for engine, label in labels.items():
        if not any(e == engine for e, _, _ in steps):
            continue
        cells = []
        for c in columns:
            ms = steps.get((engine, *c))
            cells.append("" if ms is None else f"**{ms:.1f}**" if ms == fastest[c] else f"{ms:.1f}")
        rows.append([label] + cells)
    names = dict(GEMM_MODELS)
    header = ["engine"] + [f"{names[m]}, {t} thread{'s' if t > 1 else ''} ms" for m, t in columns]
    return table(header, "l" + "r" * len(columns), rows) + ["", source("gemm.json", d)]


def gpu_source(*names):
    """GPU results record the device; the line says when the GPU code has changed since their commit."""
    files = [load(n) for n in names]
    d = files[0]
    since = gpu_report.gpu_changes_since(d["commit"])
    age = (f"; {since} commit{'s' if since != 1 else ''} since then change code a GPU runs, so these figures "
           "predate the current code") if since else ""
    return (f"(`bench/results/{names[0]}`" + "".join(f" and `{n}`" for n in names[1:]) +
            f": {d['date']}, {d['machine']['gpu']} (driver {d['machine']['driver']}), commit {d['commit']}{age}.)")


def gpu_status():
    return gpu_report.status_lines()


def gpu_kernels():
    d, v = load("gpu.json"), load("gpu_kernels_adamw_4wide.json")
    ours = {(r["pass"], r["elements"]): r for r in v["rows"]}
    peer = {(r["pass"], r["elements"]): r for r in d["kernels"]}
    label = {"adamw": "AdamW, fp32 (4-wide)", "cast_bf16": "cast fp32 → bf16",
             "unscale_fp16": "unscale fp16 + non-finite count", "grad_norm": "gradient norm (fp32)"}
    pct = lambda x: f"{100 * x:.1f}%"
    rows = []
    for n in sorted({e for _, e in ours}):
        copy_ours, copy_peer = ours[("copy", n)]["gbps"], peer[("copy", n)]["torch_gbps"]
        for name, text in label.items():
            o, p = ours[(name, n)], peer[(name, n)]
            rows.append([text, millions(n), f"{o['ms']:.3f}", f"{o['gbps']:,.0f}", pct(o["gbps"] / copy_ours),
                         f"{p['torch_ms']:.3f}", f"{p['torch_gbps']:,.0f}", pct(p["torch_gbps"] / copy_peer),
                         f"{o['ms'] / p['torch_ms']:.2f}x"])
            if name == "adamw":
                s = peer[(name, n)]
                rows.append(["AdamW, fp32 (scalar, before)", millions(n), f"{s['dtrain_ms']:.3f}",
                             f"{s['dtrain_gbps']:,.0f}", pct(s["dtrain_share_of_copy"]), "", "", "",
                             f"{s['dtrain_ms'] / s['torch_ms']:.2f}x"])
    peer_name = torch_minor(d["torch"])
    header = ["pass", "elements", "dtrain ms", "GB/s", "share of copy", f"{peer_name} ms", "GB/s", "share of copy",
              f"dtrain time / {peer_name}'s"]
    return table(header, "ll" + "r" * 7, rows) + ["", gpu_source("gpu_kernels_adamw_4wide.json", "gpu.json")]


def gpu_training():
    d = load("gpu.json")
    rows, last = [], None
    for r in d["training"]:
        rows.append([f"{r['model']} ({d['configs'][r['model']]})" if r["model"] != last else "same", r["precision"],
                     f"{r['dtrain_ms']:.3f}", f"{r['torch_ms']:.3f}", f"{r['dtrain_ms'] / r['torch_ms']:.2f}x"])
        last = r["model"]
    peer_name = torch_minor(d["torch"])
    header = ["model", "precision", "dtrain ms/step", f"{peer_name} ms/step", f"dtrain / {peer_name}"]
    return table(header, "llrrr", rows) + ["", gpu_source("gpu.json")]


def comm_waiting():
    d = load("comm_bandwidth.json")
    rows = []
    for ranks in (2, 3):
        for wait in ("spin", "futex", "auto"):
            runs = {r["bytes"]: r for r in d["waiting"][f"{wait}_{ranks}"]["results"] if r["collective"] == "all_reduce"}
            small, large = runs[min(runs)], runs[max(runs)]
            rows.append([wait, str(ranks), f"{small['time_us']:.0f}", f"{large['busbw_gbps']:.2f}"])
    header = ["`DTRAIN_SHM_WAIT`", "ranks", "1 MiB (us)", "64 MiB busbw (GB/s)"]
    return table(header, "lrrr", rows) + ["", source("comm_bandwidth.json", d)]


def scale_ranks():
    d = load("scale.json")
    rows = []
    for r in d["runs"]:
        t = {(c["collective"], c["bytes"]): c["time_ms"] for c in r["collectives"]}
        small, large = min(b for _, b in t if b), max(b for _, b in t)
        rd = r["rendezvous"]["start_to_communicator"]
        rows.append([r["transport"], str(r["world_size"]), f"{rd['median_ms']:.0f}", f"{rd['max_ms']:.0f}",
                     f"{t['all_reduce', small]:.2f}",
                     *(f"{t[c, large]:.1f}" for c in ("all_reduce", "reduce_scatter", "all_gather", "broadcast")),
                     f"{t['barrier', 0]:.2f}", f"{r['train']['max_rel_diff_vs_world1']:.1e}"])
    small_k, large_m = small >> 10, large >> 20
    header = ["transport", "ranks", "rendezvous median (ms)", "max (ms)", f"all_reduce {small_k} KiB (ms)",
              f"all_reduce {large_m} MiB (ms)", f"reduce_scatter {large_m} MiB (ms)",
              f"all_gather {large_m} MiB (ms)", f"broadcast {large_m} MiB (ms)", "barrier (ms)",
              "train vs world 1"]
    return table(header, "lrrrrrrrrrr", rows) + ["", source("scale.json", d)]


RENDERERS = {
    "gpu.status": (gpu_status, "gpu_runs/ (the newest GPU check)"),
    "gemm.engines": (gemm_engines, "gemm.json"),
    "gpu.kernels": (gpu_kernels, "gpu_kernels_adamw_4wide.json"),
    "gpu.training": (gpu_training, "gpu.json"),
    "comm.waiting": (comm_waiting, "comm_bandwidth.json"),
    "scale.ranks": (scale_ranks, "scale.json"),
    "cost_model.fit": (cost_model_fit, "cost_model.json"),
    "fuzz.runs": (fuzz_runs, "fuzz.json"),
    "cost_model.checks": (cost_model_checks, "cost_model.json"),
    "cost_model.scaling": (cost_model_scaling, "cost_model.json"),
    "cost_model.ddp": (cost_model_ddp, "cost_model.json"),
    "strategies.ranks1": (lambda: strategies_ranks(1), "strategies.json"),
    "strategies.ranks2": (lambda: strategies_ranks(2), "strategies.json"),
    "strategies.ranks3": (lambda: strategies_ranks(3), "strategies.json"),
    "checkpoint.save_load": (checkpoint_save_load, "checkpoint.json"),
    "comm.collectives": (comm_collectives, "comm_bandwidth.json"),
    "lora.steps": (lambda: lora_steps("lora.json", True), "lora.json"),
    "lora.steps_1x2_b512": (lambda: lora_steps("lora_1x2_b512.json", False), "lora_1x2_b512.json"),
    "recompute.modes": (recompute_modes, "activation_checkpointing.json"),
    "sft.packing": (sft_packing, "sft_packing.json"),
    "offload.steps": (offload_steps, "offload.json"),
    "policy.step": (policy_step, "policy.json"),
    "diffusion.step": (diffusion_step, "diffusion.json"),
    "hf.step": (hf_step, "hf.json"),
    "vlm.step": (vlm_step, "vlm.json"),
    "gpt.step": (gpt_step, "gpt.json"),
    "gpt.memory": (gpt_memory, "gpt.json"),
    "gpt.host_threads": (gpt_host_threads, "gpt.json"),
    "gpt.host_gemm": (gpt_host_gemm, "gpt.json"),
    "training.adamw": (training_adamw, "training.json"),
    "training.mlp": (training_mlp, "training.json"),
    "training.ddp_overhead": (training_ddp_overhead, "training.json"),
}


def blocks(lines):
    """(first line, lines) of each paragraph, list or hand-written table outside code and marked tables."""
    out, cur, start, code, marked = [], [], 0, False, False
    for i, line in enumerate(lines + [""]):
        if line.startswith("```"):
            code = not code
        if code or line.startswith("```") or BEGIN.match(line) or marked or not line.strip():
            if cur:
                out.append((start, cur))
            cur = []
            if BEGIN.match(line):
                marked = True
            elif line == END:
                marked = False
            continue
        if not cur:
            start = i
        cur.append(line)
    return out


def prose_sources(path, lines, cache):
    """Each figure in prose against its source (bench/docs_figures.py). Returns the problems."""
    user_page = not os.path.relpath(path, ROOT).startswith(os.path.join("docs", "dev"))
    problems = []
    for start, block in blocks(lines):
        problems += docs_figures.check_block(f"{os.path.relpath(path, ROOT)}:{start + 1}", block, user_page, cache)
    return problems


def regions(path):
    """(name, first line, end line) of each marked table in `path`, and its lines."""
    with open(path) as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == END), None)
            if end is None:
                raise SystemExit(f"{os.path.relpath(path, ROOT)}:{i + 1}: table '{m.group(1)}' has no {END}")
            found.append((m.group(1), i, end))
            i = end
        i += 1
    return found, lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    g.add_argument("--list", action="store_true")
    args = p.parse_args()
    if args.list:
        for name, (_, f) in RENDERERS.items():
            print(f"{name:28} bench/results/{f}")
        return 0
    problems, tables, cache = [], 0, {}
    for path in DOCS:
        found, lines = regions(path)
        if args.check:
            problems += prose_sources(path, lines, cache)
        if not found:
            continue
        out, at = [], 0
        for name, begin, end in found:
            where = f"{os.path.relpath(path, ROOT)}:{begin + 1}"
            out += lines[at:begin + 1]
            tables += 1
            if name not in RENDERERS:
                problems.append(f"{where}: no table named '{name}' (docs_tables.py --list)")
                out += lines[begin + 1:end]
            else:
                try:
                    made = RENDERERS[name][0]()
                except gpu_report.Unknowable as e:
                    print(f"{where}: table '{name}' not checked: {e}")
                    out += lines[begin + 1:end]
                    at = end
                    continue
                except (OSError, KeyError, ValueError, TypeError, StopIteration) as e:
                    problems.append(f"{where}: table '{name}' cannot be made from bench/results/"
                                    f"{RENDERERS[name][1]}: {type(e).__name__}: {e}")
                    out += lines[begin + 1:end]
                    at = end
                    continue
                if lines[begin + 1:end] != made:
                    problems.append(f"{where}: table '{name}' differs from bench/results/{RENDERERS[name][1]}")
                out += made
            at = end
        out += lines[at:]
        if args.write and out != lines:
            with open(path, "w") as f:
                f.write("\n".join(out))
            print(f"docs_tables.py: wrote {os.path.relpath(path, ROOT)}")
    if args.write:
        failed = [p for p in problems if "differs" not in p]
        for line in failed:
            print(line)
        return 1 if failed else 0
    if args.check:
        history = machine.History()
        for name in machine.results_files():
            with open(os.path.join(RESULTS, name)) as f:
                problems += machine.provenance_problems(name, json.load(f), history)
        for line in problems:
            print(line)
        if problems:
            print("docs_tables.py: run bench/docs_tables.py --write (tables are made from bench/results, "
                  "never edited by hand)")
            return 1
        print(f"docs_tables.py: all {tables} marked tables match their results files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

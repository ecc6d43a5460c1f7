#!/usr/bin/python3
"""Plots of dtrain's metrics files and of the strategy benchmark.

  plot_metrics.py RUN.jsonl [RUN2.jsonl ...] --out DIR [--labels a,b,...] [--smooth N]
      DIR/loss.png         loss against step, one line per file
      DIR/throughput.png   samples/s against step (and tokens/s, in a second
                           panel, when a file's tokens/s differ from its
                           samples/s: a sequence model such as train_gpt)
      --smooth N           plot each step's median over the last N steps
                           (default 1: the values as logged)

  plot_metrics.py --scaling bench/results/strategies.json --out DIR
      DIR/scaling.png      samples/s and per-rank model-state memory against
                           the number of ranks, one line per strategy

RUN.jsonl is the file an example writes with metrics=FILE: one JSON object
per optimizer step (docs/metrics.md). A resumed run appends to it and repeats
the steps after its checkpoint; the later record of a step wins, as in
TensorBoard. A missing, empty or malformed input is one line on stderr and
exit status 2.

Uses Debian's matplotlib (python3-matplotlib) with the Agg backend, so it
runs without a display: /usr/bin/python3 scripts/plot_metrics.py ...
"""
import argparse
import json
import os
import sys

PROGRAM = "plot_metrics.py"
FIGSIZE = (6.4, 4.0)  # at DPI 100: 640 x 400 pixels, a few tens of KB
DPI = 100
# Runs of one model under different strategies often lie on top of each
# other; a dash pattern per file keeps each of them visible.
LINESTYLES = ["-", "--", ":", "-."]


class InputError(Exception):
    """Bad input: reported as one line, exit status 2."""


def read_json_file(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    if not text.strip():
        raise InputError(f"{path} is empty")
    return text


def read_run(path):
    """The records of a metrics JSONL file, one per step, in step order."""
    by_step = {}
    for number, line in enumerate(read_json_file(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path} line {number} is not JSON ({e.msg}): is it a metrics= file?")
        if not isinstance(record, dict):
            raise InputError(f"{path} line {number} is not a JSON object: is it a metrics= file?")
        if "eval/loss" in record:
            continue  # an evaluation's record (dtrain::fit's eval_every): not a step
        if record.get("loss", 0) is None:
            continue  # a step no rank had data for: nothing to plot
        for key in ("step", "loss", "samples_per_s"):
            if not isinstance(record.get(key), (int, float)):
                raise InputError(f"{path} line {number} has no number '{key}': is it a metrics= file?")
        by_step[record["step"]] = record  # a resumed run's repeat of a step replaces the first
    return [by_step[s] for s in sorted(by_step)]


def labels_for(paths, labels):
    if labels is None:
        names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
        return names if len(set(names)) == len(names) else list(paths)
    names = [name.strip() for name in labels.split(",")]
    if len(names) != len(paths):
        raise InputError(f"--labels has {len(names)} name(s) for {len(paths)} file(s): give one per file")
    return names


def matplotlib_modules():
    """pyplot on the Agg backend (no display needed) and MaxNLocator."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("matplotlib is not installed: apt-get install python3-matplotlib, "
                         "and run this script with /usr/bin/python3")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    return plt, MaxNLocator


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=DPI)
    print(path)


def trailing_median(values, n):
    """Each value replaced by the median of it and the n - 1 before it: one
    slow step (a page fault, a neighbour's burst) moves no point."""
    out = []
    for i in range(len(values)):
        window = sorted(values[max(0, i + 1 - n):i + 1])
        mid = len(window) // 2
        out.append(window[mid] if len(window) % 2 else (window[mid - 1] + window[mid]) / 2)
    return out


def plot_runs(paths, labels, out, smooth):
    runs = [read_run(p) for p in paths]
    plt, MaxNLocator = matplotlib_modules()

    fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
    for i, (records, label) in enumerate(zip(runs, labels)):
        ax.plot([r["step"] for r in records], trailing_median([r["loss"] for r in records], smooth), label=label,
                linewidth=1.4, linestyle=LINESTYLES[i % len(LINESTYLES)])
    ax.set_xlabel("step")
    ax.set_ylabel("loss" if smooth == 1 else f"loss (median of {smooth} steps)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend()
    save(fig, out, "loss.png")
    plt.close(fig)

    # train_mlp's tokens/s equal its samples/s (one position per sample);
    # only a sequence model's deserve a panel of their own.
    tokens = any(r.get("tokens_per_s", r["samples_per_s"]) != r["samples_per_s"] for records in runs for r in records)
    fig, axes = plt.subplots(2 if tokens else 1, 1, figsize=(FIGSIZE[0], FIGSIZE[1] * (1.5 if tokens else 1)),
                             sharex=True, squeeze=False, layout="constrained")
    panels = [("samples_per_s", "samples/s")] + ([("tokens_per_s", "tokens/s")] if tokens else [])
    for ax, (key, name) in zip(axes[:, 0], panels):
        for i, (records, label) in enumerate(zip(runs, labels)):
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            ax.plot([p[0] for p in points], trailing_median([p[1] for p in points], smooth), label=label,
                    linewidth=1.4, linestyle=LINESTYLES[i % len(LINESTYLES)])
        ax.set_ylabel(name if smooth == 1 else f"{name} (median of {smooth} steps)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0, 0].legend()
    save(fig, out, "throughput.png")
    plt.close(fig)


def scaling_series(path):
    """{series name: [(ranks, samples/s, model-state bytes or None)]} from the
    strategy benchmark JSON (bench/run_strategy_bench.sh)."""
    try:
        bench = json.loads(read_json_file(path))
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not JSON ({e.msg})")
    results = bench.get("results") if isinstance(bench, dict) else None
    if not isinstance(results, list) or not results or not all(
            isinstance(r, dict) and isinstance(r.get("ranks"), int) and isinstance(r.get("rows"), list)
            for r in results):
        raise InputError(f"{path} has no results[] with 'ranks' and 'rows': --scaling takes the strategy "
                         "benchmark's JSON (bench/results/strategies.json), which has a world-size axis")
    series = {}
    for result in results:
        ranks = result["ranks"]
        for row in result["rows"]:
            if not isinstance(row, dict) or not isinstance(row.get("samples_per_s"), (int, float)):
                raise InputError(f"{path}: a row at ranks {ranks} has no number 'samples_per_s'")
            name = row.get("strategy", "?")
            if row.get("implementation", "dtrain") != "dtrain":
                name += " " + row.get("precision", "")
            group = row.get("shard_group")
            if group is not None:
                name += " (group = all ranks)" if group == ranks else f" (group {group})"
            memory = row.get("memory_bytes")
            states = (sum(memory.get(k, 0) for k in ("params", "grads", "optimizer", "master"))
                      if isinstance(memory, dict) else None)
            series.setdefault(name, []).append((ranks, row["samples_per_s"], states))
    return bench, series


def plot_scaling(path, out):
    bench, series = scaling_series(path)
    plt, _ = matplotlib_modules()
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    for name, points in series.items():
        points.sort()
        dashed = "--" if name.startswith("torch") else "-"
        line, = speed.plot([p[0] for p in points], [p[1] for p in points], dashed, marker="o", markersize=3,
                           linewidth=1.2, label=name)
        with_memory = [p for p in points if p[2] is not None]
        if with_memory:
            memory.plot([p[0] for p in with_memory], [p[2] / 2**20 for p in with_memory], dashed, marker="o",
                        markersize=3, linewidth=1.2, color=line.get_color(), label=name)
    ranks = sorted({p[0] for points in series.values() for p in points})
    for ax in (speed, memory):
        ax.set_xlabel("ranks")
        ax.set_xticks(ranks)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    speed.set_ylabel("samples/s (all ranks)")
    memory.set_ylabel("model states per rank (MiB)")
    memory.set_title("params + grads + optimizer + master (colours as left)", fontsize=9)
    speed.legend(loc="lower left", ncol=2, fontsize=7)
    machine = bench.get("machine", {}) if isinstance(bench.get("machine"), dict) else {}
    model = bench.get("model", {}) if isinstance(bench.get("model"), dict) else {}
    title = "strategy benchmark"
    if "parameters" in model:
        title += f": {model['parameters'] / 1e6:.1f}M-parameter MLP"
    if "batch_per_rank" in model:
        title += f", batch {model['batch_per_rank']} per rank"
    if "cores" in machine:
        title += f", {machine['cores']} CPU cores"
    fig.suptitle(title, fontsize=10)
    save(fig, out, "scaling.png")
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", metavar="RUN.jsonl", help="metrics files written with metrics=FILE")
    parser.add_argument("--out", required=True, help="folder for the PNG files (made if missing)")
    parser.add_argument("--labels", help="comma-separated legend names, one per file (default: the file names)")
    parser.add_argument("--smooth", type=int, default=1, metavar="N",
                        help="plot each step's median over the last N steps (default 1: as logged)")
    parser.add_argument("--scaling", metavar="BENCH.json", help="plot the strategy benchmark's JSON instead")
    args = parser.parse_args()
    try:
        if bool(args.runs) == bool(args.scaling):
            raise InputError("give metrics files (RUN.jsonl ...) or --scaling BENCH.json, not both or neither")
        if args.smooth < 1:
            raise InputError(f"--smooth {args.smooth} is not at least 1: give the steps per median (1: none)")
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create --out {args.out}: {e.strerror}")
        if args.scaling:
            plot_scaling(args.scaling, args.out)
        else:
            plot_runs(args.runs, labels_for(args.runs, args.labels), args.out, args.smooth)
    except InputError as e:
        print(f"{PROGRAM}: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

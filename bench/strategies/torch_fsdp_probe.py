"""Tries PyTorch FSDP on CPU ranks (gloo) and records how far it gets.

Launch one process per rank, e.g.
`dtrain-run --nproc-per-node 2 /usr/bin/python3 bench/strategies/torch_fsdp_probe.py --json probe.json`.

Stages, each recorded as ok or with its exception and the frame that raised it:
  import      `import torch.distributed.fsdp` as installed.
  import, with the dataclass check relaxed
              only if the plain import failed: torch 1.13 predates Python 3.11,
              whose dataclasses reject an unhashable default that torch's
              sharded-tensor metadata uses. This process makes such classes
              hashable while it imports FSDP (torch's files are not changed),
              so the stages below can show the next obstacle.
  FSDP <mode> one training step of bench/training/torch_ddp_mlp.py's model
              wrapped in FSDP with FULL_SHARD, SHARD_GRAD_OP and NO_SHARD.
  collectives the gloo calls FSDP makes (torch 1.13: `_all_gather_base` to
              gather a flat parameter, `_reduce_scatter_base` for its
              gradient) and the list reduce_scatter, called directly; gloo
              rejects an unsupported call on the calling rank before any
              communication, so a failure cannot leave the other ranks waiting.
If a training step runs, `--steps` steps are timed as torch_ddp_mlp.py times
them and the median is reported. Rank 0 writes the JSON; the probe exits 0
whatever it finds.
"""

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import statistics
import sys
import time
import traceback
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))
from torch_ddp_mlp import build_model  # noqa: E402


def attempt(stages, name, fn):
    """Runs fn, records the outcome under name; returns fn's result or None."""
    try:
        result = fn()
    except Exception as e:  # the probe's job is to record whatever is raised
        frames = traceback.extract_tb(e.__traceback__)[-3:]
        stages.append({"stage": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                       "innermost_frames": [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]})
        return None
    stages.append({"stage": name, "ok": True})
    return result


def import_fsdp_with_hashable_dataclasses():
    """Imports FSDP while every dataclass it defines gets object's hash (see the module doc)."""
    plain = dataclasses.dataclass

    def hashable(cls=None, /, **kwargs):
        def wrap(c):
            c = plain(c, **kwargs)
            if c.__hash__ is None:
                c.__hash__ = object.__hash__
            return c
        return wrap if cls is None else wrap(cls)

    for name in [m for m in sys.modules if m.startswith("torch.distributed._shard") or
                 m.startswith("torch.distributed.fsdp")]:
        del sys.modules[name]  # half-imported by the failed plain import
    dataclasses.dataclass = hashable
    try:
        return importlib.import_module("torch.distributed.fsdp")
    finally:
        dataclasses.dataclass = plain


def train_steps(fsdp, mode, args):
    model = fsdp.FullyShardedDataParallel(build_model(args.features, args.hidden, args.classes),
                                          sharding_strategy=getattr(fsdp.ShardingStrategy, mode))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    x = torch.randn(args.batch_size, args.features)
    y = torch.randint(0, args.classes, (args.batch_size,))
    step_ms = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median_high(step_ms[args.steps // 5:])  # the first fifth is warm-up


def gloo_collectives(stages):
    warnings.filterwarnings("ignore", message=".*is a private function.*")
    n = dist.get_world_size()
    attempt(stages, "collective _all_gather_base (FSDP's unshard)",
            lambda: dist._all_gather_base(torch.empty(4 * n), torch.ones(4)))
    attempt(stages, "collective _reduce_scatter_base (FSDP's gradient reduction)",
            lambda: dist._reduce_scatter_base(torch.empty(4), torch.ones(4 * n)))
    attempt(stages, "collective reduce_scatter (list form)",
            lambda: dist.reduce_scatter(torch.empty(4), [torch.ones(4) for _ in range(n)]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", default="1024,1024,1024")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed if a step runs")
    parser.add_argument("--json", help="rank 0 writes the findings here (default: stdout)")
    args = parser.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",")]

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    # A stage that failed on one rank only would leave the others in a collective.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = []
    fsdp = attempt(stages, "import torch.distributed.fsdp", lambda: importlib.import_module("torch.distributed.fsdp"))
    if fsdp is None:
        fsdp = attempt(stages, "import torch.distributed.fsdp, with the dataclass check relaxed",
                       import_fsdp_with_hashable_dataclasses)
    timings = {}
    if fsdp is not None:
        for mode in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
            ms = attempt(stages, f"FSDP {mode}: wrap and train", lambda: train_steps(fsdp, mode, args))
            if ms is not None:
                timings[mode] = {"median_step_ms": round(ms, 4),
                                 "samples_per_s": round(world * args.batch_size / ms * 1e3, 1)}
    gloo_collectives(stages)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return
    result = {"torch": torch.__version__, "python": sys.version.split()[0], "backend": "gloo",
              "world_size": world, "ran": bool(timings), "timings": timings,
              "stages": stages}
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()

"""Tries PyTorch FSDP on CPU ranks (gloo), records how far it gets, and times it where it runs.

Launch one process per rank, e.g.
`dtrain-run --nproc-per-node 2 /usr/bin/python3 bench/strategies/torch_fsdp_probe.py --json probe.json`.

The model is bench/training/torch_ddp_mlp.py's, each Linear its own FSDP unit
(as train_mlp's units) and the whole model the root; --precision bf16 (the
default) is FSDP's mixed precision: bf16 compute and parameter gathers, fp32
sharded parameters and fp32 gradient reduction, as train_mlp's precision=bf16
under FSDP; AdamW (lr 1e-3, weight decay 0) fused where the torch has the
fused CPU kernel (2.4 and later), else its default.

Probe (the default): stages, each recorded as ok or with its exception and
the frame that raised it:
  import      `import torch.distributed.fsdp` as installed.
  import, with the dataclass check relaxed
              only if the plain import failed: torch 1.13 predates Python 3.11,
              whose dataclasses reject an unhashable default that torch's
              sharded-tensor metadata uses. This process makes such classes
              hashable while it imports FSDP (torch's files are not changed),
              so the stages below can show the next obstacle.
  FSDP1 <mode>
              `FullyShardedDataParallel` with FULL_SHARD, SHARD_GRAD_OP and
              NO_SHARD, its compute device left to FSDP (an accelerator's),
              then the same with device_id=torch.device("cpu"); each wraps
              the model and trains --steps steps.
  FSDP2 fully_shard
              `torch.distributed.fsdp.fully_shard` on a CPU device mesh, with
              reshard_after_forward True (ZeRO-3, as FULL_SHARD) and False
              (ZeRO-2, as SHARD_GRAD_OP); --steps steps.
  collectives the gloo calls FSDP makes (`_all_gather_base` /
              all_gather_into_tensor to gather a flat parameter,
              `_reduce_scatter_base` / reduce_scatter_tensor for its
              gradient) and the list reduce_scatter, called directly; gloo
              rejects an unsupported call on the calling rank before any
              communication, so a failure cannot leave the other ranks waiting.
Every training stage that runs is timed: the median step after the first
fifth. Rank 0 writes the JSON; the probe exits 0 whatever it finds.

--run API-SHARDING (fsdp1-full, fsdp1-grad-op, fsdp2-full, fsdp2-grad-op): no
probing; one training run of FSDP1 (device_id=cpu, FULL_SHARD or
SHARD_GRAD_OP) or FSDP2 (reshard_after_forward True or False), measured as
torch_ddp_mlp.py measures DDP: the same data slicing, --steps steps timed
from zero_grad through optimizer.step on rank 0, the median after --warmup,
and the bytes rank 0's model and optimizer hold after the last step (its
shards). Needs a torch whose FSDP runs on the CPU (2.6 and later).
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
from torch_ddp_mlp import build_model, model_state_bytes  # noqa: E402

RESHARD = {"full": True, "grad-op": False}
FSDP1_MODE = {"full": "FULL_SHARD", "grad-op": "SHARD_GRAD_OP"}
RUNS = tuple(f"{api}-{sharding}" for api in ("fsdp1", "fsdp2") for sharding in RESHARD)


def version():
    return tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def make_optimizer(model):
    extra = {"fused": True} if version() >= (2, 4) else {}
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, **extra)


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


def fsdp1_model(fsdp, mode, args, cpu):
    """FSDP1: each Linear a FullyShardedDataParallel unit, then the root."""
    kwargs = {"sharding_strategy": getattr(fsdp.ShardingStrategy, mode)}
    if args.precision == "bf16":
        kwargs["mixed_precision"] = fsdp.MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                        buffer_dtype=torch.float32)
    if cpu:
        kwargs["device_id"] = torch.device("cpu")
    net = build_model(args.features, args.hidden, args.classes)
    units = [fsdp.FullyShardedDataParallel(m, **kwargs) if isinstance(m, torch.nn.Linear) else m for m in net]
    return fsdp.FullyShardedDataParallel(torch.nn.Sequential(*units), **kwargs)


def fsdp2_model(reshard, args):
    """FSDP2: fully_shard on each Linear, then on the root, over a CPU device mesh of every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if args.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    net = build_model(args.features, args.hidden, args.classes)
    for m in net:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return fully_shard(net, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)


def probe_steps(model, args):
    """--steps training steps on one batch; the median step (ms) after the first fifth."""
    opt = make_optimizer(model)
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
    return statistics.median_high(step_ms[args.steps // 5:])


def gloo_collectives(stages):
    warnings.filterwarnings("ignore", message=".*is a private function.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    n = dist.get_world_size()
    attempt(stages, "collective _all_gather_base (FSDP's unshard)",
            lambda: dist._all_gather_base(torch.empty(4 * n), torch.ones(4)))
    attempt(stages, "collective _reduce_scatter_base (FSDP's gradient reduction)",
            lambda: dist._reduce_scatter_base(torch.empty(4), torch.ones(4 * n)))
    attempt(stages, "collective reduce_scatter (list form)",
            lambda: dist.reduce_scatter(torch.empty(4), [torch.ones(4) for _ in range(n)]))


def probe(args, rank, world):
    stages, timings = [], {}

    def timed(name, make):
        ms = attempt(stages, name, lambda: probe_steps(make(), args))
        if ms is not None:
            timings[name] = {"median_step_ms": round(ms, 4),
                             "samples_per_s": round(world * args.batch_size / ms * 1e3, 1)}

    fsdp = attempt(stages, "import torch.distributed.fsdp", lambda: importlib.import_module("torch.distributed.fsdp"))
    if fsdp is None:
        fsdp = attempt(stages, "import torch.distributed.fsdp, with the dataclass check relaxed",
                       import_fsdp_with_hashable_dataclasses)
    if fsdp is not None:
        for cpu in (False, True):
            for mode in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
                where = ", device_id=cpu" if cpu else ""
                timed(f"FSDP1 {mode}{where}: wrap and train", lambda: fsdp1_model(fsdp, mode, args, cpu))
        for label, reshard in RESHARD.items():
            timed(f"FSDP2 fully_shard, reshard_after_forward={reshard} (as {label}): wrap and train",
                  lambda: fsdp2_model(reshard, args))
    gloo_collectives(stages)
    dist.barrier()
    return {"torch": torch.__version__, "python": sys.version.split()[0], "backend": "gloo", "world_size": world,
            "precision": args.precision, "fused_adamw": version() >= (2, 4), "ran": bool(timings),
            "timings": timings, "stages": stages}


def timed_run(args, rank, world):
    """One FSDP run measured as torch_ddp_mlp.py measures DDP (see the module doc)."""
    api, sharding = args.run.split("-", 1)
    if api == "fsdp1":
        model = fsdp1_model(importlib.import_module("torch.distributed.fsdp"), FSDP1_MODE[sharding], args, True)
        name = f"FSDP1 {FSDP1_MODE[sharding]}"
    else:
        model = fsdp2_model(RESHARD[sharding], args)
        name = f"FSDP2 fully_shard, reshard_after_forward={RESHARD[sharding]}"
    opt = make_optimizer(model)
    x = torch.randn(args.samples, args.features)
    y = torch.randint(0, args.classes, (args.samples,))
    per_rank = args.samples // world
    batches_per_epoch = per_rank // args.batch_size
    step_ms = []
    for step in range(args.steps):
        first = rank * per_rank + (step % batches_per_epoch) * args.batch_size
        xb, yb = x[first:first + args.batch_size], y[first:first + args.batch_size]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        loss.item()
    memory = model_state_bytes(model, opt)
    dist.barrier()
    del model, opt, loss
    timed = sorted(step_ms[args.warmup:])
    median = timed[len(timed) // 2]
    fused = ", fused AdamW" if version() >= (2, 4) else ""
    return {"implementation": f"PyTorch {torch.__version__} {name} (gloo){fused}", "api": api,
            "sharding": sharding, "world_size": world,
            "threads_per_rank": torch.get_num_threads(), "batch_per_rank": args.batch_size, "hidden": args.hidden,
            "precision": args.precision, "fused_adamw": version() >= (2, 4), "steps": args.steps,
            "warmup": args.warmup, "model_state_bytes": memory, "median_step_ms": round(median, 4),
            "samples_per_s": round(world * args.batch_size / median * 1e3, 1),
            "step_ms": [round(t, 4) for t in step_ms]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", default="1024,1024,1024")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16",
                        help="bf16: FSDP's mixed precision (bf16 compute, fp32 shards and reduction)")
    parser.add_argument("--steps", type=int, default=20, help="probe: per stage that runs; --run: in all")
    parser.add_argument("--run", choices=RUNS, help="time one FSDP configuration only (see the module doc)")
    parser.add_argument("--warmup", type=int, default=20, help="--run: steps left out of the median")
    parser.add_argument("--samples", type=int, default=16384, help="--run: the data set, split over the ranks")
    parser.add_argument("--json", help="rank 0 writes the findings here (default: stdout)")
    args = parser.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",")]
    if args.run and args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    # A stage that failed on one rank only would leave the others in a collective.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    result = timed_run(args, rank, world) if args.run else probe(args, rank, world)
    dist.destroy_process_group()
    if rank != 0:
        return
    text = json.dumps(result, indent=None if args.run else 1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()

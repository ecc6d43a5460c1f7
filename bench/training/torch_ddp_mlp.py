"""PyTorch DDP (gloo) counterpart of train_mlp's benchmark configuration.

The same model as `train_mlp hidden=256,256 activation=gelu`: 32 features,
Linear(32, 256) - GELU - Linear(256, 256) - GELU - Linear(256, 10), softmax
cross-entropy; batch 64 per rank; AdamW (lr 1e-3, weight decay 0, the
torch's CPU default implementation; --fused-adamw: its fused kernel, PyTorch
2.4 and later, refused by name before); fp32 (--precision bf16: forward and
loss under torch.autocast("cpu", torch.bfloat16), while parameters,
gradients, their all-reduce and AdamW stay fp32; gloo has no bf16
all-reduce). Data: random tensors of the same shape (their content does not
change the speed), each rank reading its own contiguous batches as a
DistributedSampler would.

--device cuda: each rank on its local GPU (LOCAL_RANK) under DDP with NCCL,
the model and AdamW in PyTorch's CUDA defaults (the foreach implementation),
bf16 through torch.autocast("cuda"); each batch is copied from host memory in
the step, as a data loader's would be, and the step ends with loss.item(),
which waits for the GPU (train_mlp's step also ends with the loss on the host).

Timed like train_mlp's step_ms: from zero_grad through optimizer.step, per
step on rank 0; the JSON has every step's time and the median after
--warmup steps, and the bytes of the tensors rank 0's model and optimizer
hold after the last step (model_state_bytes: parameters, gradients, optimizer
state; DDP's own gradient buckets are not among them).

Launch one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set,
e.g. `dtrain-run --nproc-per-node 2 /usr/bin/python3 bench/training/torch_ddp_mlp.py`
or `python3 -m torch.distributed.run --nproc_per_node 2 bench/training/torch_ddp_mlp.py`.
Threads per rank: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (dtrain-run sets
both to cores / ranks unless they are set).
"""

import argparse
import json
import os
import time

# Debian's OpenBLAS starts one thread per core in every process unless told
# otherwise, before torch loads it (torch.set_num_threads does not reach it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def build_model(features, hidden, classes):
    layers, width = [], features
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.GELU()]
        width = h
    layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)


def local_bytes(t):
    """Bytes this rank holds of a tensor (its own shard of a sharded one)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def model_state_bytes(module, opt):
    """Bytes of parameters, gradients and optimizer state tensors this rank holds."""
    params = list(module.parameters())
    return {"params": sum(local_bytes(p) for p in params),
            "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(local_bytes(v) for state in opt.state.values() for v in state.values()
                             if torch.is_tensor(v))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the median")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--hidden", default="256,256")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) (PyTorch 2.4+ on the CPU)")
    parser.add_argument("--json", help="rank 0 writes the results here (default: stdout)")
    args = parser.parse_args()
    if args.fused_adamw and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 4):
        parser.error(f"--fused-adamw needs PyTorch 2.4 or later (this is {torch.__version__})")

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    net = build_model(args.features, [int(h) for h in args.hidden.split(",")], args.classes).to(dev)
    model = DDP(net, device_ids=[dev.index]) if cuda else DDP(net)
    extra = {"fused": True} if args.fused_adamw else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, **extra)
    x = torch.randn(args.samples, args.features)
    y = torch.randint(0, args.classes, (args.samples,))
    per_rank = args.samples // world
    batches_per_epoch = per_rank // args.batch_size

    step_ms = []
    for step in range(args.steps):
        first = rank * per_rank + (step % batches_per_epoch) * args.batch_size
        xb, yb = x[first:first + args.batch_size], y[first:first + args.batch_size]
        t0 = time.perf_counter()
        if cuda:
            xb, yb = xb.to(dev), yb.to(dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        if cuda:
            loss.item()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        loss.item()

    memory = model_state_bytes(net, opt)
    dist.barrier()
    # Drop DDP and the optimizer before the process group goes: a gloo group torn down while DDP
    # still holds its buffers can hang the process at exit.
    del model, opt, loss
    dist.destroy_process_group()
    if rank != 0:
        return
    timed = sorted(step_ms[args.warmup:])
    median = timed[len(timed) // 2]
    backend = f"nccl, {torch.cuda.get_device_name(dev)}" if cuda else "gloo"
    fused = ", fused AdamW" if args.fused_adamw else ""
    result = {"implementation": f"PyTorch {torch.__version__} DDP ({backend}){fused}", "world_size": world,
              "threads_per_rank": torch.get_num_threads(), "batch_per_rank": args.batch_size,
              "hidden": [int(h) for h in args.hidden.split(",")], "precision": args.precision,
              "fused_adamw": args.fused_adamw, "steps": args.steps, "warmup": args.warmup,
              "model_state_bytes": memory, "median_step_ms": round(median, 4),
              "samples_per_s": round(world * args.batch_size / median * 1e3, 1),
              "step_ms": [round(t, 4) for t in step_ms]}
    text = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()

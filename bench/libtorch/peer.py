"""The peer of bench/run_libtorch_bench.sh: train_libtorch's model
(examples/libtorch/models.py, the same model in Python) trained by PyTorch
itself under DistributedDataParallel or FSDP2 (fully_shard) on gloo, one
process per rank as torchrun starts them (launched by dtrain-run, which sets
the same RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT environment).

usage: peer.py lm|resnet ddp|fsdp2 --batch-size B --steps S --warmup W --json OUT key=value...
Random batches of the model's shapes, AdamW (fused where this torch has it
for CPU tensors, else foreach), fp32. Rank 0 writes {"step_ms": [...],
"median_ms", "samples_per_s", "peak_rss_mib", "parameters", "torch", "mode"}.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "libtorch"))
from models import build  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["lm", "resnet"])
    p.add_argument("mode", choices=["ddp", "fsdp2"])
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--json", required=True)
    p.add_argument("keys", nargs="*")
    a = p.parse_intermixed_args()
    keys = dict(kv.split("=", 1) for kv in a.keys)
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build(a.kind, keys)
    parameters = sum(t.numel() for t in model.parameters())
    if a.mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        blocks = list(model.blocks) if a.kind == "lm" else list(model.layers)
        for b in blocks:
            fully_shard(b)
        fully_shard(model)
        net = model
    try:
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.1, fused=True)
        optimizer = "fused"
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.1, foreach=True)
        optimizer = "foreach"
    g = torch.Generator().manual_seed(1 + rank)
    if a.kind == "lm":
        vocab, block = int(keys["vocab"]), int(keys["block_size"])
        x = torch.randint(0, vocab, (a.batch_size, block), generator=g)
        y = torch.randint(0, vocab, (a.batch_size, block), generator=g)
    else:
        image, classes = int(keys["image"]), int(keys["classes"])
        x = torch.randn(a.batch_size, 3 * image * image, generator=g)
        y = torch.randint(0, classes, (a.batch_size,), generator=g)
    times = []
    for _ in range(a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1000.0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if rank == 0:
        median = statistics.median(times[a.warmup:])
        with open(a.json, "w") as f:
            json.dump({"step_ms": times, "median_ms": median,
                       "samples_per_s": world * a.batch_size / (median / 1000.0), "peak_rss_mib": round(rss, 1),
                       "parameters": parameters, "torch": torch.__version__, "mode": a.mode,
                       "optimizer": optimizer, "loss": loss.item()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

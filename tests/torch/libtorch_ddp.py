"""train_libtorch against PyTorch's own DistributedDataParallel.

The C++ side (libtorch_ddp_test) trains examples/libtorch/models.hpp's model
with train_libtorch under dtrain-run at 2 ranks from a safetensors file of
initial weights (LibTorch's names), recording every rank's micro-batches
(dump_batches), the step losses (metrics) and the final weights
(save_params, LibTorch's names). This script builds the same model in
Python, loads the same initial weights by name (strict), and trains it under
torch.nn.parallel.DistributedDataParallel on gloo with as many processes as
the dump has ranks, each rank replaying its own recorded batches with the
same AdamW settings. It prints how far dtrain's per-step losses and final
weights are from DDP's, and checks that the final file loads into the Python
model with load_state_dict(strict=True):

  libtorch_ddp.py lm|resnet INIT DUMP_DIR METRICS FINAL key=value...
      keys: lr, weight_decay, and the model's sizes (vocab, block_size, dim,
      heads, layers | image, channels, depth, classes)
  prints {"steps", "ranks", "loss_rel": [...], "param_abs", "param_rel", "worst", "loaded"}
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "libtorch"))
from models import build  # noqa: E402  the same models in Python


def recorded_steps(dump_dir, rank):
    """{step: [{"x": tensor, "y": tensor} per micro-batch]} of one rank."""
    steps = {}
    for name, t in load_file(os.path.join(dump_dir, f"rank-{rank}.safetensors")).items():
        step, micro, tensor = name.split(".", 2)
        steps.setdefault(int(step), {}).setdefault(int(micro), {})[tensor] = t
    return {s: [m[k] for k in sorted(m)] for s, m in steps.items()}


def worker(rank, world, port, argv, result):
    kind, init, dump_dir, metrics, final = argv[:5]
    keys = dict(kv.split("=", 1) for kv in argv[5:])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = build(kind, keys)
    model.load_state_dict(load_file(init), strict=True)
    ddp = nn.parallel.DistributedDataParallel(model)
    # train_libtorch's default no_decay=true: no weight decay on biases and
    # normalisation parameters, which in these models are the 1-D ones.
    wd = float(keys.get("weight_decay", "0"))
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=float(keys["lr"]), betas=(0.9, 0.999), eps=1e-8)
    steps = recorded_steps(dump_dir, rank)
    losses = []
    for s in sorted(steps):
        (micro,) = steps[s]  # one micro-batch per step (accumulate=1)
        opt.zero_grad()
        x = micro["x"]
        logits = ddp(x if x.is_floating_point() else x.long())
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), micro["y"].long().reshape(-1))
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    if rank == 0:
        want = [json.loads(line)["loss"] for line in open(metrics)]
        got = load_file(final)
        loaded = build(kind, keys)
        loaded.load_state_dict(got, strict=True)  # the file dtrain wrote, by LibTorch's names
        worst, param_abs, param_rel = "", 0.0, 0.0
        excluded = []
        for name, p in model.state_dict().items():
            mine, ref = got[name].double(), p.double()
            if name.endswith("qkv.bias"):
                # The key projection's bias has no effect on the loss (softmax
                # is shift-invariant per query): its gradient is rounding
                # noise on both sides, which AdamW turns into +-lr steps of
                # random sign. Compared: the query and value parts.
                d = mine.shape[0] // 3
                mine, ref = torch.cat([mine[:d], mine[2 * d:]]), torch.cat([ref[:d], ref[2 * d:]])
                excluded.append(name + "[key part]")
            diff = (mine - ref).abs().max().item()
            scale = max(ref.abs().max().item(), 1e-12)
            if diff / scale > param_rel:
                worst, param_rel = name, diff / scale
            param_abs = max(param_abs, diff)
        result.put({"steps": len(steps), "ranks": world,
                    "loss_rel": [abs(a - b) / abs(b) for a, b in zip(want, losses)],
                    "loss_first": losses[0], "loss_last": losses[-1], "param_abs": param_abs,
                    "param_rel": param_rel, "worst": worst, "excluded": excluded, "loaded": True, "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    argv = sys.argv[1:]
    ranks = len([f for f in os.listdir(argv[2]) if f.startswith("rank-")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, ranks, port, argv, result)) for r in range(ranks)]
    for p in procs:
        p.start()
    out = None
    while out is None:
        try:
            out = result.get(timeout=2)
        except Exception:  # queue.Empty: a rank that died leaves nothing to wait for
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit("a DDP rank failed: " + str([p.exitcode for p in procs]))
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a DDP rank exited with {p.exitcode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

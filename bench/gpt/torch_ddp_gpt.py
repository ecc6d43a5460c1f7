"""PyTorch DDP (gloo) counterpart of train_gpt's benchmark configuration.

The model of examples/gpt: token embedding and a learned position embedding,
--n-layer pre-LayerNorm blocks (LayerNorm eps 1e-5, causal multi-head
self-attention through one fused qkv Linear(d, 3d) and a Linear(d, d)
projection, both with bias; residual; LayerNorm, Linear(d, 4d), exact (erf)
GELU, Linear(4d, d); residual), a final LayerNorm and an untied head
Linear(d, vocab) without bias; cross-entropy, mean over every token; AdamW
(weight decay 0, torch 1.13's CPU default implementation); fp32. Data: random
token ids in [0, --vocab) (their content does not change the speed), drawn
before the timed loop. --checkpointing recomputes each block in backward
(torch.utils.checkpoint, non-reentrant, so every parameter gets its gradient
under DDP), as train_gpt's activation_checkpointing=true does for its units.

--device cuda: each rank on its local GPU (LOCAL_RANK) under DDP with NCCL,
PyTorch's CUDA defaults (AdamW's foreach implementation), --precision bf16
through torch.autocast("cuda"); the token batches are copied from host memory
in the step and the step ends with loss.item(), which waits for the GPU.

Timed like train_gpt's step_ms: from zero_grad through optimizer.step, per
step on rank 0; the JSON has every step's time, the median after --warmup
steps, tokens/s (world x batch x block / median) and rank 0's peak resident
set (getrusage ru_maxrss), also as it stood before the model was built
(the Python interpreter and torch's libraries).

The peer settings of current PyTorch (2.x; refused by name on 1.13):
--attention sdpa runs F.scaled_dot_product_attention(is_causal=True) in
place of the written-out masked softmax, --fused-adamw takes AdamW's fused
implementation (one kernel per step on the CPU since 2.4), --compile wraps
the model in torch.compile before DDP (its compilation falls in the warm-up
steps; raise --warmup if it does not).

Launch one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set,
e.g. `dtrain-run --nproc-per-node 2 /usr/bin/python3 bench/gpt/torch_ddp_gpt.py --vocab 40`.
Threads per rank: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (dtrain-run sets
both to cores / ranks unless they are set).
"""

import argparse
import json
import math
import os
import resource
import time

# Debian's OpenBLAS starts one thread per core in every process unless told
# otherwise, before torch loads it (torch.set_num_threads does not reach it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def peak_rss_mib():
    """This process's peak resident set so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Block(torch.nn.Module):
    def __init__(self, d, heads, block, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)
        # A buffer so that .to(device) moves it, left out of the state dict; main() tells DDP to leave it
        # alone (gloo cannot broadcast bool, and a constant mask needs no broadcast before each forward).
        self.register_buffer("future", torch.ones(block, block, dtype=torch.bool).triu(1), persistent=False)

    def attention(self, x):
        b, t, d = x.shape
        width = d // self.heads
        q, k, v = (part.view(b, t, self.heads, width).transpose(1, 2) for part in self.qkv(x).split(d, dim=2))
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(o.transpose(1, 2).reshape(b, t, d))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width))
        scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
        return self.proj((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))  # F.gelu: the exact erf form


class Gpt(torch.nn.Module):
    def __init__(self, vocab, block, n_layer, heads, d, checkpointing, sdpa=False):
        super().__init__()
        self.checkpointing = checkpointing
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(block, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, heads, block, sdpa) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[:idx.shape[1]]
        for block in self.blocks:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, required=True, help="as train_gpt prints it ('vocabulary V')")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the median")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpointing", action="store_true", help="recompute each block in backward")
    parser.add_argument("--batches", type=int, default=16, help="distinct random batches per rank, cycled")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    parser.add_argument("--attention", choices=("manual", "sdpa"), default="manual",
                        help="sdpa: F.scaled_dot_product_attention (PyTorch 2)")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) (PyTorch 2.4+ on the CPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    parser.add_argument("--json", help="rank 0 writes the results here (default: stdout)")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    major = int(torch.__version__.split(".")[0])
    for wanted, flag in ((args.attention == "sdpa", "--attention sdpa"), (args.fused_adamw, "--fused-adamw"),
                         (args.compile, "--compile")):
        if wanted and major < 2:
            parser.error(f"{flag} needs PyTorch 2 (this is {torch.__version__})")

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rss_before_model = peak_rss_mib()

    gpt = Gpt(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd, args.checkpointing,
              args.attention == "sdpa").to(dev)
    parameters = sum(p.numel() for p in gpt.parameters())
    # The causal mask is a bool buffer, which gloo cannot broadcast; it is a
    # constant of the shape, so DDP leaves every buffer alone.
    DDP._set_params_and_buffers_to_ignore_for_model(gpt, [name for name, _ in gpt.named_buffers()])
    model = DDP(gpt, device_ids=[dev.index]) if cuda else DDP(gpt)
    if args.compile:
        model = torch.compile(model)
    extra = {"fused": True} if args.fused_adamw else {}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, **extra)
    gen = torch.Generator().manual_seed(1 + rank)
    shape = (args.batches, args.batch_size, args.block_size)
    xs = torch.randint(0, args.vocab, shape, generator=gen)
    ys = torch.randint(0, args.vocab, shape, generator=gen)

    step_ms = []
    for step in range(args.steps):
        xb, yb = xs[step % args.batches], ys[step % args.batches]
        t0 = time.perf_counter()
        if cuda:
            xb, yb = xb.to(dev), yb.to(dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(xb, yb)
        loss.backward()
        opt.step()
        if cuda:
            loss.item()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        loss.item()

    dist.barrier()
    # Drop DDP and the optimizer before the process group goes: a gloo group torn down while DDP
    # still holds its buffers can hang the process at exit.
    del model, opt, loss
    dist.destroy_process_group()
    if rank != 0:
        return
    timed = sorted(step_ms[args.warmup:])
    median = timed[len(timed) // 2]
    tokens = world * args.batch_size * args.block_size
    backend = f"nccl, {torch.cuda.get_device_name(dev)}" if cuda else "gloo"
    settings = [name for on, name in ((args.attention == "sdpa", "SDPA"), (args.fused_adamw, "fused AdamW"),
                                      (args.compile, "torch.compile")) if on]
    implementation = f"PyTorch {torch.__version__} DDP ({backend})" + "".join(", " + s for s in settings)
    result = {"implementation": implementation, "world_size": world, "attention": args.attention,
              "fused_adamw": args.fused_adamw, "compile": args.compile,
              "threads_per_rank": torch.get_num_threads(), "vocab": args.vocab, "n_layer": args.n_layer,
              "n_embd": args.n_embd, "n_head": args.n_head, "block_size": args.block_size,
              "batch_per_rank": args.batch_size, "parameters": parameters, "checkpointing": args.checkpointing,
              "precision": args.precision, "steps": args.steps, "warmup": args.warmup,
              "median_step_ms": round(median, 4), "tokens_per_s": round(tokens / median * 1e3, 1),
              "peak_rss_mib": round(peak_rss_mib(), 1), "rss_before_model_mib": round(rss_before_model, 1),
              "step_ms": [round(t, 4) for t in step_ms]}
    text = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()

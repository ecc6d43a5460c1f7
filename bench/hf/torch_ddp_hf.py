"""transformers + PyTorch DDP (gloo, CPU) counterpart of train_lm in the
Hugging Face benchmark (bench/run_hf_bench.sh).

usage: torch_ddp_hf.py --model-dir DIR --block-size T --batch-size B --steps N --warmup W --json OUT
                      [--attention eager|sdpa] [--fused-adamw] [--compile] [--checkpointing]
                      [--lora-r R --lora-alpha A]

Builds AutoModelForCausalLM.from_config from DIR/config.json (random
weights, fp32, train mode; the configs the benchmark writes have no
dropout), wraps it in DistributedDataParallel over gloo, and trains on random
token ids drawn before the timed loop (labels = ids, so the model's own
shifted cross-entropy) with torch.optim.AdamW (lr 1e-3, weight decay 0).
Each step is timed from zero_grad through optimizer.step on rank 0; the
JSON has every step's milliseconds, the median after the warm-up, tokens/s
(world x B x T / median), rank 0's peak resident set and the versions of
torch and transformers. Launch one process per rank with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (dtrain-run does).

The fastest settings of a current release (the benchmark's peer):
--attention sdpa (transformers' attn_implementation, torch's
scaled_dot_product_attention), --fused-adamw (AdamW(fused=True), torch >= 2.4
on CPU), --compile (torch.compile of the model, compiled during the warm-up).
--checkpointing: transformers' gradient checkpointing of every layer (the
non-reentrant torch.utils.checkpoint). Each option a release lacks is
refused by name.
--lora-r R: peft's LoRA of rank R (lora_alpha A, no dropout, bias none) on
every linear layer of the blocks (target_modules "all-linear"), the rest
frozen; AdamW over the adapters only.
"""

import argparse
import json
import os
import resource
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model-dir", required=True)
parser.add_argument("--block-size", type=int, required=True)
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--json", required=True)
parser.add_argument("--attention", choices=["eager", "sdpa"])
parser.add_argument("--fused-adamw", action="store_true")
parser.add_argument("--compile", action="store_true")
parser.add_argument("--checkpointing", action="store_true")
parser.add_argument("--lora-r", type=int, default=0)
parser.add_argument("--lora-alpha", type=float, default=8.0)
args = parser.parse_args()
major = int(torch.__version__.split(".")[0])
if major < 2 and (args.attention == "sdpa" or args.fused_adamw or args.compile):
    parser.error(f"--attention sdpa, --fused-adamw and --compile need torch >= 2 (this is {torch.__version__})")

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1 + rank)
config = transformers.AutoConfig.from_pretrained(args.model_dir)
extra = {"attn_implementation": args.attention} if args.attention else {}
model = transformers.AutoModelForCausalLM.from_config(config, **extra)
model.train()
if args.lora_r:
    import peft  # noqa: E402
    model = peft.get_peft_model(model, peft.LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha,
                                                       target_modules="all-linear", lora_dropout=0.0, bias="none"))
    if args.checkpointing:
        model.enable_input_require_grads()  # the frozen embedding's output must carry a gradient
if args.checkpointing:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
# GPT-2's causal-mask buffers are bool, which gloo cannot broadcast; every
# buffer is a constant of the config, so DDP leaves them alone.
DDP._set_params_and_buffers_to_ignore_for_model(model, [name for name, _ in model.named_buffers()])
ddp = DDP(model) if world > 1 else model
if args.compile:
    ddp = torch.compile(ddp)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0,
                              **({"fused": True} if args.fused_adamw else {}))
batches = [torch.randint(0, config.vocab_size, (args.batch_size, args.block_size)) for _ in range(4)]
times = []
for step in range(args.steps):
    ids = batches[step % len(batches)]
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = ddp(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    times.append((time.perf_counter() - start) * 1000.0)
if rank == 0:
    median = statistics.median(times[args.warmup:])
    with open(args.json, "w") as f:
        json.dump({"step_ms": times, "median_ms": median,
                   "tokens_per_s": world * args.batch_size * args.block_size / (median / 1000.0),
                   "parameters": sum(p.numel() for p in model.parameters()),
                   "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "peft": __import__("peft").__version__ if args.lora_r else None,
                   "attention": getattr(model.config, "_attn_implementation", None) or "default"}, f)
dist.destroy_process_group()

"""diffusers + PyTorch DDP (gloo, CPU) counterpart of dtrain's diffusion
benchmark: a UNet2DConditionModel fine-tuned on cached latents as diffusers'
train_text_to_image(_lora).py trains it.

usage: torch_ddp_diffusion.py --model UNET_DIR --data RECORDS.safetensors --batch-size B --steps N --warmup W
                              --json OUT [--lora-r R --lora-alpha A --lora-targets to_q,to_k,to_v,to_out.0]
                              [--lr 1e-4] [--weight-decay 1e-2]

UNET_DIR is a diffusers UNet folder (save_pretrained's), loaded with
UNet2DConditionModel.from_pretrained in fp32, train mode. RECORDS is
train_diffusion's records file (include/dtrain/diffusion/data.hpp): latents
[N, C, H, W] and encoder_hidden_states [N, L, D].

--lora-r R > 0: the UNet frozen (requires_grad_(False)) and PEFT adapters
added with unet.add_adapter(LoraConfig(r=R, lora_alpha=A,
init_lora_weights="gaussian", target_modules=...)), as diffusers'
train_text_to_image_lora.py does; only they train. Otherwise every
parameter trains. AdamW (lr, weight decay on every trainable parameter;
fused where this torch runs it on the CPU, foreach otherwise), no gradient
clipping. At more than one rank the UNet is wrapped in
DistributedDataParallel over gloo; each rank takes its own B records per
step in turn (record (step x world + rank) x B + j, modulo N).

The objective is epsilon prediction with Stable Diffusion's schedule,
DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085,
beta_end=0.012, 1000 steps): per record a timestep drawn uniformly and
Gaussian noise, the noisy latents from scheduler.add_noise, the MSE between
the prediction and the noise.

Each step is timed on rank 0 from zero_grad through optimizer.step (the
batch's gathering, the draws and noising, forward, backward, the step);
the JSON has every step's milliseconds, the median after the warm-up,
samples/s (world x B / median), the parameter counts, the last loss, rank
0's peak resident set and the versions. Launch one process per rank with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (dtrain-run and torchrun do);
threads per rank: OMP_NUM_THREADS = OPENBLAS_NUM_THREADS (default 1).
"""

import argparse
import importlib.metadata
import json
import os
import resource
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from diffusers import DDPMScheduler, UNet2DConditionModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--data", required=True)
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--json", required=True)
parser.add_argument("--lora-r", type=int, default=0)
parser.add_argument("--lora-alpha", type=float, default=16.0)
parser.add_argument("--lora-targets", default="to_q,to_k,to_v,to_out.0")
parser.add_argument("--lr", type=float, default=1e-4)
parser.add_argument("--weight-decay", type=float, default=1e-2)
args = parser.parse_args()
if args.steps <= args.warmup:
    parser.error("--steps must exceed --warmup")

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

data = load_file(args.data)
latents, states = data["latents"].float(), data["encoder_hidden_states"].float()
records = latents.shape[0]
scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                          beta_end=0.012, prediction_type="epsilon")

torch.manual_seed(1)
unet = UNet2DConditionModel.from_pretrained(args.model, torch_dtype=torch.float32)
unet.train()
if args.lora_r > 0:
    from peft import LoraConfig

    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, init_lora_weights="gaussian",
                                target_modules=args.lora_targets.split(",")))
trainable = [p for p in unet.parameters() if p.requires_grad]
ddp = DDP(unet) if world > 1 else unet
try:
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay, fused=True)
    optimizer_kind = "fused"
except (RuntimeError, TypeError):
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay, foreach=True)
    optimizer_kind = "foreach"

generator = torch.Generator().manual_seed(1000 + rank)
times = []
for step in range(args.steps):
    pick = torch.tensor([((step * world + rank) * args.batch_size + j) % records for j in range(args.batch_size)])
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    x0, text = latents[pick], states[pick]
    noise = torch.randn(x0.shape, generator=generator)
    t = torch.randint(0, scheduler.config.num_train_timesteps, (args.batch_size,), generator=generator)
    pred = ddp(scheduler.add_noise(x0, noise, t), t, text).sample
    loss = F.mse_loss(pred.float(), noise.float(), reduction="mean")
    loss.backward()
    optimizer.step()
    times.append((time.perf_counter() - start) * 1000.0)
if rank == 0:
    median = statistics.median(times[args.warmup:])
    with open(args.json, "w") as f:
        json.dump({"step_ms": times, "median_ms": median,
                   "samples_per_s": world * args.batch_size / (median / 1000.0),
                   "parameters": sum(p.numel() for p in unet.parameters()),
                   "trainable": sum(p.numel() for p in trainable),
                   "last_loss": loss.item(),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "ranks": world, "threads_per_rank": torch.get_num_threads(), "batch_per_rank": args.batch_size,
                   "records": records, "latents": list(latents.shape[1:]), "text": list(states.shape[1:]),
                   "block_out_channels": list(unet.config.block_out_channels),
                   "lora_r": args.lora_r, "lora_alpha": args.lora_alpha if args.lora_r > 0 else None,
                   "lora_targets": args.lora_targets.split(",") if args.lora_r > 0 else None,
                   "optimizer": optimizer_kind, "torch": torch.__version__,
                   "diffusers": importlib.metadata.version("diffusers"),
                   "peft": importlib.metadata.version("peft")}, f)
dist.destroy_process_group()

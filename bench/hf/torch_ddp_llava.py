"""transformers + PyTorch DDP (gloo, CPU) counterpart of train_vlm in the
VLM benchmark (bench/run_vlm_bench.sh).

usage: torch_ddp_llava.py --model-dir DIR --data FILE --train projector|projector,vision|all
                          --batch-size B --steps N --warmup W --json OUT

Builds LlavaForConditionalGeneration from DIR/config.json (random weights,
fp32, train mode, SDPA attention: the fastest eager settings of the
release), freezes what the mode does not train (as LLaVA's recipes do:
requires_grad off), wraps the model in DistributedDataParallel over gloo
and trains on the records of FILE (pixel_values, input_ids, labels; each
rank its own B records per step, in turn) with AdamW(fused=True) (lr 1e-3,
weight decay 0) over the trainable parameters. The tower's layers after
vision_feature_layer and its post_layernorm feed nothing that has a loss,
so they are frozen in every mode (DDP would otherwise wait for their
gradients). Each step is timed from zero_grad through optimizer.step on
rank 0; the JSON has every step's milliseconds, the median after the
warm-up, samples/s (world x B / median), the parameter counts, rank 0's
peak resident set and the versions. Launch one process per rank with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (dtrain-run does).
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
from safetensors.torch import load_file  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model-dir", required=True)
parser.add_argument("--data", required=True)
parser.add_argument("--train", required=True, choices=["projector", "projector,vision", "all"])
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--json", required=True)
args = parser.parse_args()

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1)
config = transformers.AutoConfig.from_pretrained(args.model_dir)
model = transformers.LlavaForConditionalGeneration._from_config(config, attn_implementation="sdpa")
model.train()
parts = {"projector": ("multi_modal_projector",), "projector,vision": ("multi_modal_projector", "vision_tower"),
         "all": ("",)}[args.train]
layers = config.vision_config.num_hidden_layers
first_unused = layers + config.vision_feature_layer + 1 if config.vision_feature_layer < 0 else \
    config.vision_feature_layer + 1
unused = tuple(f"layers.{i}." for i in range(first_unused, layers)) + ("post_layernorm.",)
for name, p in model.named_parameters():
    trains = any(part in name for part in parts)
    if "vision_tower" in name and any(u in name for u in unused):
        trains = False
    p.requires_grad_(trains)
ddp = DDP(model) if world > 1 else model
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0,
                              fused=True)
data = load_file(args.data)
records = data["input_ids"].shape[0]
times = []
for step in range(args.steps):
    pick = [(rank * args.batch_size + step * world * args.batch_size + i) % records for i in range(args.batch_size)]
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = ddp(input_ids=data["input_ids"][pick], pixel_values=data["pixel_values"][pick],
               labels=data["labels"][pick]).loss
    loss.backward()
    optimizer.step()
    times.append((time.perf_counter() - start) * 1000.0)
if rank == 0:
    median = statistics.median(times[args.warmup:])
    with open(args.json, "w") as f:
        json.dump({"step_ms": times, "median_ms": median,
                   "samples_per_s": world * args.batch_size / (median / 1000.0),
                   "parameters": sum(p.numel() for p in model.parameters()),
                   "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                   "last_loss": loss.item(),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "attention": model.config._attn_implementation}, f)
dist.destroy_process_group()

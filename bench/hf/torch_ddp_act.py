"""LeRobot + PyTorch DDP (gloo, CPU) counterpart of dtrain's ACT policy
benchmark: LeRobot's own ACTPolicy trained as lerobot-train trains it.

usage: torch_ddp_act.py --data EPISODES.safetensors --batch-size B --steps N --warmup W --json OUT
                        [--chunk-size 100] [--n-action-steps C] [--dim-model 512] [--n-heads 8]
                        [--dim-feedforward 3200] [--n-encoder-layers 4] [--n-decoder-layers 1]
                        [--no-vae] [--latent-dim 32] [--n-vae-encoder-layers 4] [--dropout 0.1]
                        [--kl-weight 10] [--vision-backbone resnet18]

EPISODES is dtrain's recorded-episodes file (examples/policy/
export_lerobot_dataset.py writes one): uint8 [N, 3, H, W] per camera (the
metadata's "cameras"), observation.state [N, S], action [N, A] and
episode_index [N]. Every frame t is a sample: the observation at t and the
action chunk actions[t .. t+chunk-1] of its episode, steps past the episode's
end repeating its last action with action_is_pad set (LeRobot's
delta_timestamps padding).

The policy is ACTPolicy(ACTConfig(...)) with LeRobot 0.4.4's defaults unless
a flag says otherwise, random weights (pretrained_backbone_weights None, no
download), fp32, train mode. The batch is processed as LeRobot's
preprocessor does: images / 255, then MEAN_STD normalisation of the images
(per channel), the state and the action with the file's statistics (mean and
population std over all frames, divided by std + 1e-8). The optimizer is
LeRobot's ACT preset, AdamW(policy.get_optim_params(), lr 1e-5, weight decay
1e-4; fused where this torch runs it on the CPU, foreach otherwise) with the
gradient norm clipped at 10 (grad_clip_norm). At more than one rank the
policy is wrapped in DistributedDataParallel over gloo; each rank takes its
own B samples per step in turn (sample (step x world + rank) x B + j, modulo
the number of samples).

Each step is timed on rank 0 from zero_grad through optimizer.step (the
batch's gathering and normalisation, forward, backward, clipping, the
step); the JSON has every step's milliseconds, the median after the
warm-up, samples/s (world x B / median), the parameter counts, the last
loss, rank 0's peak resident set and the versions. Launch one process per
rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (dtrain-run and
torchrun do); threads per rank: OMP_NUM_THREADS = OPENBLAS_NUM_THREADS
(default 1).
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
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies.act.configuration_act import ACTConfig  # noqa: E402
from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: E402

STATE, ACTION, EPS = "observation.state", "action", 1e-8

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--json", required=True)
parser.add_argument("--chunk-size", type=int, default=100)
parser.add_argument("--n-action-steps", type=int, help="default: the chunk size")
parser.add_argument("--dim-model", type=int, default=512)
parser.add_argument("--n-heads", type=int, default=8)
parser.add_argument("--dim-feedforward", type=int, default=3200)
parser.add_argument("--n-encoder-layers", type=int, default=4)
parser.add_argument("--n-decoder-layers", type=int, default=1)
parser.add_argument("--no-vae", action="store_true")
parser.add_argument("--latent-dim", type=int, default=32)
parser.add_argument("--n-vae-encoder-layers", type=int, default=4)
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--kl-weight", type=float, default=10.0)
parser.add_argument("--vision-backbone", default="resnet18")
args = parser.parse_args()
if args.steps <= args.warmup:
    parser.error("--steps must exceed --warmup")

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

# --- the episodes, their statistics and the action chunks ---------------------
with safe_open(args.data, "pt") as f:
    meta = f.metadata() or {}
if meta.get("format") != "dtrain-episodes/1":
    raise SystemExit(f"{args.data}: format {meta.get('format')!r}, not 'dtrain-episodes/1'")
cameras = [c for c in meta.get("cameras", "").split(",") if c]
data = load_file(args.data)
frames = data["episode_index"].shape[0]
episode = data["episode_index"]
if frames == 0 or bool((episode[1:] < episode[:-1]).any()):
    raise SystemExit(f"{args.data}: no frames, or episode_index decreases (an episode's frames must be contiguous)")
stats = {}
for cam in cameras:  # per channel, over every pixel of every frame (in blocks: the file may be large)
    total, squares = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for block in data[cam].split(256):
        x = block.to(torch.float64) / 255.0
        total += x.sum(dim=(0, 2, 3))
        squares += (x * x).sum(dim=(0, 2, 3))
    count = data[cam].numel() // 3
    mean = total / count
    std = (squares / count - mean * mean).clamp_min(0).sqrt()
    stats[cam] = (mean.view(3, 1, 1).float(), std.view(3, 1, 1).float())
for key in (STATE, ACTION):
    stats[key] = (data[key].mean(0), data[key].std(0, unbiased=False))
# chunk[t, k] = min(t + k, last frame of t's episode); pad where t + k is past it
t = torch.arange(frames)
last = torch.searchsorted(episode, episode, right=True) - 1
steps_ahead = t[:, None] + torch.arange(args.chunk_size)[None, :]
chunk = torch.minimum(steps_ahead, last[:, None])
is_pad = steps_ahead > last[:, None]


def normalise(key, x):
    mean, std = stats[key]
    return (x - mean) / (std + EPS)


def batch_of(pick):
    batch = {cam: normalise(cam, data[cam][pick].float() / 255.0) for cam in cameras}
    batch[STATE] = normalise(STATE, data[STATE][pick])
    batch[ACTION] = normalise(ACTION, data[ACTION][chunk[pick]])
    batch["action_is_pad"] = is_pad[pick]
    return batch


# --- the policy, as lerobot-train builds it ------------------------------------
torch.manual_seed(1)
height, width = data[cameras[0]].shape[2:] if cameras else (0, 0)
config = ACTConfig(
    input_features={**{cam: PolicyFeature(FeatureType.VISUAL, (3, *data[cam].shape[2:])) for cam in cameras},
                    STATE: PolicyFeature(FeatureType.STATE, (data[STATE].shape[1],))},
    output_features={ACTION: PolicyFeature(FeatureType.ACTION, (data[ACTION].shape[1],))},
    device="cpu", chunk_size=args.chunk_size, n_action_steps=args.n_action_steps or args.chunk_size,
    vision_backbone=args.vision_backbone, pretrained_backbone_weights=None, dim_model=args.dim_model,
    n_heads=args.n_heads, dim_feedforward=args.dim_feedforward, n_encoder_layers=args.n_encoder_layers,
    n_decoder_layers=args.n_decoder_layers, use_vae=not args.no_vae, latent_dim=args.latent_dim,
    n_vae_encoder_layers=args.n_vae_encoder_layers, dropout=args.dropout, kl_weight=args.kl_weight)
policy = ACTPolicy(config)
policy.train()
ddp = DDP(policy) if world > 1 else policy
preset = config.get_optimizer_preset()
try:
    optimizer = torch.optim.AdamW(policy.get_optim_params(), lr=preset.lr, betas=preset.betas, eps=preset.eps,
                                  weight_decay=preset.weight_decay, fused=True)
    optimizer_kind = "fused"
except (RuntimeError, TypeError):
    optimizer = torch.optim.AdamW(policy.get_optim_params(), lr=preset.lr, betas=preset.betas, eps=preset.eps,
                                  weight_decay=preset.weight_decay, foreach=True)
    optimizer_kind = "foreach"

times = []
for step in range(args.steps):
    pick = torch.tensor([((step * world + rank) * args.batch_size + j) % frames for j in range(args.batch_size)])
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss, _ = ddp(batch_of(pick))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), preset.grad_clip_norm)
    optimizer.step()
    times.append((time.perf_counter() - start) * 1000.0)
if rank == 0:
    median = statistics.median(times[args.warmup:])
    with open(args.json, "w") as f:
        json.dump({"step_ms": times, "median_ms": median,
                   "samples_per_s": world * args.batch_size / (median / 1000.0),
                   "parameters": sum(p.numel() for p in policy.parameters()),
                   "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
                   "last_loss": loss.item(),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "ranks": world, "threads_per_rank": torch.get_num_threads(), "batch_per_rank": args.batch_size,
                   "samples": frames, "episodes": int(torch.unique(episode).numel()), "cameras": cameras,
                   "image": [int(height), int(width)], "state_dim": int(data[STATE].shape[1]),
                   "action_dim": int(data[ACTION].shape[1]), "chunk_size": config.chunk_size,
                   "dim_model": config.dim_model, "n_heads": config.n_heads,
                   "dim_feedforward": config.dim_feedforward, "n_encoder_layers": config.n_encoder_layers,
                   "n_decoder_layers": config.n_decoder_layers, "use_vae": config.use_vae,
                   "latent_dim": config.latent_dim, "n_vae_encoder_layers": config.n_vae_encoder_layers,
                   "vision_backbone": config.vision_backbone, "optimizer": optimizer_kind,
                   "torch": torch.__version__, "lerobot": importlib.metadata.version("lerobot")}, f)
dist.destroy_process_group()

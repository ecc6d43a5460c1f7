#!/usr/bin/env python3
"""LeRobot's ACT policy as the reference for dtrain's robot policy tests.

The C++ tests drive this script with the venv made from
scripts/python/lerobot.txt (lerobot==0.4.4, torch 2.10). It runs on the CPU
and downloads nothing (the ResNet backbone starts from random weights).
Every tensor goes in and out as a .safetensors file.

Subcommands
-----------
make DIR --seed N --use-vae 0|1 --pre-norm 0|1 --batch B --height H
         --width W --cameras C --steps K [--state-dim S]
    Builds a small ACTPolicy (chunk_size 5, n_action_steps 5, dim_model 32,
    n_heads 4, dim_feedforward 48, 2 encoder layers, 1 decoder layer, 2 VAE
    encoder layers, latent_dim 8, dropout 0, kl_weight 10, resnet18 backbone
    without pretrained weights and without dilation, relu) with inputs
    observation.state (STATE, [S], default 3) and C in {1, 2} cameras
    observation.images.top (and observation.images.wrist) (VISUAL, [3,H,W])
    and output action (ACTION, [2]). torch.manual_seed(N) precedes the
    construction; then every FrozenBatchNorm2d buffer of the backbone is
    redrawn from a torch.Generator seeded with N + 1:
        weight ~ 1 + 0.1 N(0,1), bias ~ 0.1 N(0,1),
        running_mean ~ 0.1 N(0,1), running_var ~ U(0.5, 1.5)
    (torchvision's FrozenBatchNorm2d: y = (x - mean) * w / sqrt(var + 1e-5) + b).
    Writes into DIR what LeRobot's training writes:
        config.json, model.safetensors             (policy.save_pretrained)
        policy_preprocessor.json, policy_postprocessor.json and the
        normaliser / unnormaliser state .safetensors (the processors'
        save_pretrained), built by make_act_pre_post_processors from random
        dataset_stats (generator seed N + 3): mean ~ N(0,1), std ~ 0.1 + U(0,1),
        keys observation.state [3], action [2], and each camera [3,1,1].
    and the model's inputs (generator seed N + 2; already normalised, the
    processors are not applied to them):
        batch.safetensors
            observation.images.top    float32 [B,3,H,W]  N(0,1)
            observation.images.wrist  float32 [B,3,H,W]  N(0,1)  (C == 2 only)
            observation.state         float32 [B,3]      N(0,1)
            action                    float32 [B,5,2]    N(0,1)
            action_is_pad             int64   [B,5]      0/1, 1 = padded
            latent_noise              float32 [B,8]      N(0,1)
        steps.safetensors
            the same keys with a leading [K] dimension: K different batches.
    Row b of batch k (batch.safetensors is k = 0) has its last
    (2*b + k) % 5 chunk steps padded: trailing padding, never all padded.

grads DIR OUT
    Loads DIR with ACTPolicy.from_pretrained (strict), converts it to
    float64, train mode, and runs policy.forward on batch.safetensors
    (floats as float64, action_is_pad as bool), the VAE's reparameterisation
    noise torch.randn_like(mu) replaced by latent_noise, then loss.backward().
    OUT (all float64):
        loss, l1_loss, kld_loss   [1]  (kld_loss is 0 without the VAE;
                                        loss = l1_loss + kl_weight * kld_loss)
            l1_loss  = mean over [B,5,2] of |action - actions_hat| * !pad
                       (padded entries count in the divisor B*5*2)
            kld_loss = mean over B of sum over 8 of
                       -0.5 * (1 + log_sigma_x2 - mu^2 - exp(log_sigma_x2))
        actions_hat               [B,5,2]
        mu, log_sigma_x2          [B,8]   (use_vae only)
            latent = mu + exp(log_sigma_x2 / 2) * latent_noise
        grad.<name>   for every parameter with requires_grad and a gradient,
                      <name> as in policy.named_parameters()
                      (e.g. model.encoder.layers.0.self_attn.in_proj_weight)
        param.<name>  for every entry of policy.state_dict() (buffers too)

train DIR OUT --lr LR --steps K
    Loads DIR as for grads (float64, train mode) and runs K steps of
    torch.optim.AdamW over policy.get_optim_params() (both groups at lr LR,
    betas (0.9, 0.999), eps 1e-8, weight_decay 1e-4 on every parameter,
    PyTorch's decoupled form: p -= lr * wd * p, then the Adam update with
    denominator sqrt(v / (1 - b2^t)) + eps; no gradient clipping). Step k
    uses batch k of steps.safetensors and its latent_noise.
    OUT (all float64):
        losses        [K]  the loss at step k, before its update
        param.<name>  every trainable parameter after the K steps

predict DIR BATCH OUT
    Loads DIR (config.json + model.safetensors, e.g. written by dtrain) with
    ACTPolicy.from_pretrained (strict), float32, eval mode. BATCH holds the
    camera keys and observation.state (float32, already normalised).
    OUT (float32):
        actions       [B,5,2]  policy.predict_action_chunk(batch)
        first_action  [B,2]    policy.select_action(batch) after policy.reset()
    If DIR holds policy_preprocessor.json / policy_postprocessor.json, loads
    both pipelines as lerobot's factory does and prints "processors: ok";
    otherwise prints "processors: absent".

inspect DIR
    Prints config.json's keys and every model.safetensors tensor with its
    shape and dtype, one per line (for developers; no test uses it).

dataset ROOT [--episodes E] [--frames F] [--size S] [--seed N]
    Writes a small local LeRobotDataset (LeRobotDataset.create, images
    stored as images): E episodes of F frames, one camera
    observation.images.top of S x S RGB, observation.state [4], action [2],
    random; train_act_test exports it with export_lerobot_dataset.py.

Exit status 0 on success; on failure a message on stderr and status 1
(2 for bad usage).
"""

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

CHUNK = 5
LATENT = 8
STATE_DIM = 3
ACTION_DIM = 2
CAMERAS = ("observation.images.top", "observation.images.wrist")


def fail(msg):
    print(f"lerobot_act: {msg}", file=sys.stderr)
    sys.exit(1)


# Imports are deferred so that `--help` and usage errors are quick.
def _imports():
    global torch, F, load_file, save_file, ACTConfig, ACTPolicy, modeling_act
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file

    from lerobot.policies.act import modeling_act
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy


# ---------------------------------------------------------------- make


def make_config(use_vae, pre_norm, height, width, cameras):
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))}
    for key in CAMERAS[:cameras]:
        inputs[key] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, height, width))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    return ACTConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        push_to_hub=False,
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        vision_backbone="resnet18",
        pretrained_backbone_weights=None,
        replace_final_stride_with_dilation=False,
        pre_norm=bool(pre_norm),
        dim_model=32,
        n_heads=4,
        dim_feedforward=48,
        feedforward_activation="relu",
        n_encoder_layers=2,
        n_decoder_layers=1,
        use_vae=bool(use_vae),
        latent_dim=LATENT,
        n_vae_encoder_layers=2,
        dropout=0.0,
        kl_weight=10.0,
    )


def randomise_frozen_batchnorm(policy, seed):
    from torchvision.ops.misc import FrozenBatchNorm2d

    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for module in policy.model.backbone.modules():
            if isinstance(module, FrozenBatchNorm2d):
                c = module.weight.shape[0]
                module.weight.copy_(1 + 0.1 * torch.randn(c, generator=g))
                module.bias.copy_(0.1 * torch.randn(c, generator=g))
                module.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                module.running_var.copy_(0.5 + torch.rand(c, generator=g))
                n += 1
    if n == 0:
        fail("no FrozenBatchNorm2d in the backbone")


def random_stats(config, seed):
    g = torch.Generator().manual_seed(seed)
    stats = {}
    for key, feature in {**config.input_features, **config.output_features}.items():
        shape = (3, 1, 1) if key.startswith("observation.images.") else tuple(feature.shape)
        stats[key] = {
            "mean": torch.randn(shape, generator=g),
            "std": 0.1 + torch.rand(shape, generator=g),
        }
    return stats


def random_batch(g, batch, height, width, cameras, k):
    out = {}
    for key in CAMERAS[:cameras]:
        out[key] = torch.randn(batch, 3, height, width, generator=g)
    out["observation.state"] = torch.randn(batch, STATE_DIM, generator=g)
    out["action"] = torch.randn(batch, CHUNK, ACTION_DIM, generator=g)
    pad = torch.zeros(batch, CHUNK, dtype=torch.int64)
    for b in range(batch):
        n = (2 * b + k) % CHUNK  # 0..CHUNK-1 trailing padded steps
        if n:
            pad[b, CHUNK - n :] = 1
    out["action_is_pad"] = pad
    out["latent_noise"] = torch.randn(batch, LATENT, generator=g)
    return out


def cmd_make(a):
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    global STATE_DIM
    STATE_DIM = a.state_dim

    if a.cameras not in (1, 2):
        fail("--cameras must be 1 or 2")
    if min(a.batch, a.height, a.width, a.steps) < 1:
        fail("--batch, --height, --width and --steps must be positive")
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)

    config = make_config(a.use_vae, a.pre_norm, a.height, a.width, a.cameras)
    torch.manual_seed(a.seed)
    policy = ACTPolicy(config)
    randomise_frozen_batchnorm(policy, a.seed + 1)
    policy.save_pretrained(out)

    pre, post = make_act_pre_post_processors(config, dataset_stats=random_stats(config, a.seed + 3))
    pre.save_pretrained(out)
    post.save_pretrained(out)

    g = torch.Generator().manual_seed(a.seed + 2)
    save_file(random_batch(g, a.batch, a.height, a.width, a.cameras, 0), str(out / "batch.safetensors"))
    steps = [random_batch(g, a.batch, a.height, a.width, a.cameras, k) for k in range(a.steps)]
    stacked = {key: torch.stack([s[key] for s in steps]) for key in steps[0]}
    save_file(stacked, str(out / "steps.safetensors"))

    print("wrote: " + " ".join(sorted(os.listdir(out))))


# ---------------------------------------------------------------- loading


def load_policy(directory, dtype):
    from lerobot.configs.policies import PreTrainedConfig

    if not (Path(directory) / "config.json").is_file():
        fail(f"{directory}: no config.json")
    if not (Path(directory) / "model.safetensors").is_file():
        fail(f"{directory}: no model.safetensors")
    config = PreTrainedConfig.from_pretrained(directory)
    if not isinstance(config, ACTConfig):
        fail(f"{directory}: config.json is not an ACT config (type {config.type})")
    config.device = "cpu"
    # from_pretrained prints a line on stdout; keep ours short.
    with contextlib.redirect_stdout(io.StringIO()):
        policy = ACTPolicy.from_pretrained(directory, config=config, strict=True)
    policy.to(dtype)
    if dtype != torch.float32:
        # Without the VAE, ACT.forward makes its all-zero latent as float32; cast it
        # (exactly) to the model's dtype so that a float64 model runs.
        proj = policy.model.encoder_latent_input_proj
        proj.register_forward_pre_hook(lambda m, args: (args[0].to(m.weight.dtype),))
    return policy


def model_batch(batch, index=None):
    """float64 model inputs (action_is_pad as bool) and the latent noise from a loaded file."""
    out = {}
    for key, t in batch.items():
        if index is not None:
            t = t[index]
        out[key] = t.bool() if key == "action_is_pad" else t.to(torch.float64)
    noise = out.pop("latent_noise")
    return out, noise


@contextlib.contextmanager
def latent_noise(noise):
    """Within the block, ACT's `torch.randn_like(mu)` returns `noise` (checked: one call, same shape)."""
    calls = []
    real = modeling_act.torch.randn_like

    def fake(like, *args, **kwargs):
        if tuple(like.shape) != tuple(noise.shape):
            raise RuntimeError(f"randn_like{tuple(like.shape)}: latent_noise is {tuple(noise.shape)}")
        calls.append(1)
        return noise.to(dtype=like.dtype, device=like.device)

    modeling_act.torch.randn_like = fake
    try:
        yield calls
    finally:
        modeling_act.torch.randn_like = real


def forward(policy, batch, noise):
    """policy.forward with the given noise; returns (loss, actions_hat, mu, log_sigma_x2)."""
    seen = {}

    def hook(module, args, output):
        seen["actions_hat"], (seen["mu"], seen["log_sigma_x2"]) = output

    handle = policy.model.register_forward_hook(hook)
    try:
        with latent_noise(noise) as calls:
            loss, _ = policy.forward(batch)
    finally:
        handle.remove()
    if len(calls) != (1 if policy.config.use_vae else 0):
        fail(f"randn_like called {len(calls)} times")
    return loss, seen["actions_hat"], seen["mu"], seen["log_sigma_x2"]


# ---------------------------------------------------------------- grads


def cmd_grads(a):
    policy = load_policy(a.dir, torch.float64)
    policy.train()
    batch, noise = model_batch(load_file(os.path.join(a.dir, "batch.safetensors")))
    policy.zero_grad(set_to_none=True)
    loss, actions_hat, mu, log_sigma_x2 = forward(policy, batch, noise)

    # ACTPolicy.forward's formulas, as float64 tensors.
    l1 = (F.l1_loss(batch["action"], actions_hat, reduction="none") * ~batch["action_is_pad"].unsqueeze(-1)).mean()
    if policy.config.use_vae:
        kld = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1).mean()
    else:
        kld = torch.zeros((), dtype=torch.float64)
    mine = l1 + policy.config.kl_weight * kld
    if not torch.allclose(mine, loss, rtol=1e-12, atol=0):
        fail(f"recomputed loss {mine.item()!r} differs from policy.forward's {loss.item()!r}")
    loss.backward()

    out = {
        "loss": loss.detach().reshape(1),
        "l1_loss": l1.detach().reshape(1),
        "kld_loss": kld.detach().reshape(1),
        "actions_hat": actions_hat.detach(),
    }
    if policy.config.use_vae:
        out["mu"] = mu.detach()
        out["log_sigma_x2"] = log_sigma_x2.detach()
    for name, p in policy.named_parameters():
        if p.requires_grad and p.grad is not None:
            out["grad." + name] = p.grad.detach().to(torch.float64)
    for name, t in policy.state_dict().items():
        out["param." + name] = t.detach().to(torch.float64)
    save_file({k: v.contiguous() for k, v in out.items()}, a.out)
    n_grads = sum(k.startswith("grad.") for k in out)
    print(f"loss {loss.item():.12g} l1 {l1.item():.12g} kld {kld.item():.12g}; {n_grads} gradients")


# ---------------------------------------------------------------- train


def cmd_train(a):
    if a.steps < 1:
        fail("--steps must be positive")
    policy = load_policy(a.dir, torch.float64)
    policy.train()
    steps = load_file(os.path.join(a.dir, "steps.safetensors"))
    have = steps["action"].shape[0]
    if a.steps > have:
        fail(f"steps.safetensors holds {have} batches, asked for {a.steps}")

    groups = policy.get_optim_params()
    for group in groups:
        group["lr"] = a.lr
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)

    losses = []
    for k in range(a.steps):
        batch, noise = model_batch(steps, k)
        opt.zero_grad(set_to_none=True)
        loss, *_ = forward(policy, batch, noise)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    out = {"losses": torch.stack(losses).to(torch.float64)}
    for name, p in policy.named_parameters():
        if p.requires_grad:
            out["param." + name] = p.detach().to(torch.float64)
    save_file({k: v.contiguous() for k, v in out.items()}, a.out)
    print(f"losses {losses[0].item():.9g} .. {losses[-1].item():.9g} over {a.steps} steps")


# ---------------------------------------------------------------- predict


def load_processors(directory):
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import (
        batch_to_transition,
        policy_action_to_transition,
        transition_to_batch,
        transition_to_policy_action,
    )
    from lerobot.utils.constants import POLICY_POSTPROCESSOR_DEFAULT_NAME, POLICY_PREPROCESSOR_DEFAULT_NAME

    pre_json = f"{POLICY_PREPROCESSOR_DEFAULT_NAME}.json"
    post_json = f"{POLICY_POSTPROCESSOR_DEFAULT_NAME}.json"
    have = [(Path(directory) / f).is_file() for f in (pre_json, post_json)]
    if not any(have):
        return "absent"
    if not all(have):
        fail(f"{directory}: only one of {pre_json}, {post_json}")
    # As lerobot.policies.factory.make_pre_post_processors does for a pretrained path.
    PolicyProcessorPipeline.from_pretrained(
        directory, config_filename=pre_json, to_transition=batch_to_transition, to_output=transition_to_batch
    )
    PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename=post_json,
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    return "ok"


def cmd_predict(a):
    policy = load_policy(a.dir, torch.float32)
    policy.eval()
    loaded = load_file(a.batch)
    keys = list(policy.config.image_features) + ["observation.state"]
    missing = [k for k in keys if k not in loaded]
    if missing:
        fail(f"{a.batch}: missing {', '.join(missing)}")
    batch = {k: loaded[k].to(torch.float32) for k in keys}
    actions = policy.predict_action_chunk(batch)
    policy.reset()
    first = policy.select_action(batch)
    save_file({"actions": actions.contiguous(), "first_action": first.contiguous()}, a.out)
    print(f"processors: {load_processors(a.dir)}")


# ---------------------------------------------------------------- inspect


def cmd_dataset(a):
    """A small local LeRobotDataset (images stored as images, no video):
    `episodes` episodes of `frames` frames, one camera observation.images.top
    of size x size RGB, observation.state [4] and action [2], random."""
    import shutil

    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    shutil.rmtree(a.root, ignore_errors=True)
    features = {
        "observation.images.top": {"dtype": "image", "shape": (a.size, a.size, 3),
                                   "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (4,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    ds = LeRobotDataset.create(repo_id="local/dtrain_test", root=a.root, fps=10, features=features, use_videos=False)
    rng = np.random.default_rng(a.seed)
    for _ in range(a.episodes):
        for _ in range(a.frames):
            ds.add_frame({
                "observation.images.top": rng.integers(0, 256, size=(a.size, a.size, 3), dtype=np.uint8),
                "observation.state": rng.standard_normal(4).astype(np.float32),
                "action": rng.standard_normal(2).astype(np.float32),
                "task": "reach",
            })
        ds.save_episode()
    ds.finalize()
    print(f"dataset: {ds.num_episodes} episodes, {ds.num_frames} frames in {a.root}")


def cmd_inspect(a):
    from safetensors import safe_open

    with open(os.path.join(a.dir, "config.json")) as f:
        config = json.load(f)
    for key in config:
        print(f"config {key}")
    with safe_open(os.path.join(a.dir, "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            t = f.get_slice(key)
            print(f"tensor {key} {list(t.get_shape())} {t.get_dtype()}")


# ---------------------------------------------------------------- main


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make", help="build a small policy, its processors and input batches in DIR")
    m.add_argument("dir")
    m.add_argument("--seed", type=int, required=True)
    m.add_argument("--use-vae", type=int, choices=(0, 1), required=True)
    m.add_argument("--pre-norm", type=int, choices=(0, 1), required=True)
    m.add_argument("--batch", type=int, required=True)
    m.add_argument("--height", type=int, required=True)
    m.add_argument("--width", type=int, required=True)
    m.add_argument("--cameras", type=int, choices=(1, 2), required=True)
    m.add_argument("--steps", type=int, required=True)
    m.add_argument("--state-dim", type=int, default=STATE_DIM)

    g = sub.add_parser("grads", help="loss, actions and gradients of DIR's policy on DIR/batch.safetensors")
    g.add_argument("dir")
    g.add_argument("out")

    t = sub.add_parser("train", help="K AdamW steps on DIR/steps.safetensors")
    t.add_argument("dir")
    t.add_argument("out")
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--steps", type=int, required=True)

    r = sub.add_parser("predict", help="actions of DIR's policy for BATCH")
    r.add_argument("dir")
    r.add_argument("batch")
    r.add_argument("out")

    i = sub.add_parser("inspect", help="print config.json keys and model.safetensors tensors")
    i.add_argument("dir")

    d = sub.add_parser("dataset", help="a small local LeRobotDataset in ROOT")
    d.add_argument("root")
    d.add_argument("--episodes", type=int, default=3)
    d.add_argument("--frames", type=int, default=12)
    d.add_argument("--size", type=int, default=32)
    d.add_argument("--seed", type=int, default=0)

    a = p.parse_args()
    _imports()
    {"make": cmd_make, "grads": cmd_grads, "train": cmd_train, "predict": cmd_predict, "inspect": cmd_inspect,
     "dataset": cmd_dataset}[a.cmd](a)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # one line on stderr, not a traceback
        print(f"lerobot_act: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)

"""diffusers' side of diffusion_unet_units_test (tests/diffusion).

usage: diffusers_units.py IN OUT

IN: JSON {"resnet": [case...], "timestep": [case...]}, each case the
module's configuration, its parameters by diffusers' names (flat float64
lists), the inputs and the output gradients dtrain used. For each case this
builds diffusers' own module (ResnetBlock2D; conv_in, Timesteps +
TimestepEmbedding and SDXL's add_time_proj + add_embedding as
UNet2DConditionModel holds them), loads the parameters strictly (every name
must match), runs it in float64 and writes OUT: JSON with the outputs and,
by autograd, the input's, the time embedding's and every parameter's
gradient.

diffusers computes the timestep sinusoids in float32 whatever the input's
dtype; the MLPs here are fed the same formula in float64 instead, and each
case reports how far diffusers' float32 sinusoids are from it
("sinusoid_error"), so dtrain's float64 sinusoids are checked against both.
"""

import json
import math
import sys

import torch
from diffusers.models.embeddings import TimestepEmbedding, Timesteps, get_timestep_embedding
from diffusers.models.resnet import ResnetBlock2D

torch.set_grad_enabled(True)
f64 = torch.float64


def tensor(values, shape):
    return torch.tensor(values, dtype=f64).reshape(shape)


def load(module, params):
    state = {name: tensor(params[name], p.shape) for name, p in module.state_dict().items()}
    missing = set(params) - set(state)
    if missing:
        raise SystemExit(f"dtrain names parameters diffusers' module lacks: {sorted(missing)}")
    module.load_state_dict(state, strict=True)


def flat(t):
    return t.detach().reshape(-1).tolist()


def sinusoid64(t, dim, flip, shift):
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=f64) / (half - shift))
    angle = t.to(f64)[:, None] * freq[None, :]
    emb = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
    if flip:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    if dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


def resnet(c):
    block = ResnetBlock2D(in_channels=c["in"], out_channels=c["out"], temb_channels=c["temb_dim"], groups=c["groups"],
                          eps=c["eps"], output_scale_factor=c["output_scale_factor"], dropout=0.0).to(f64)
    load(block, c["params"])
    b, h, w = c["batch"], c["height"], c["width"]
    x = tensor(c["x"], [b, c["in"], h, w]).requires_grad_(True)
    temb = tensor(c["temb"], [b, c["temb_dim"]]).requires_grad_(True)
    y = block(x, temb)
    y.backward(tensor(c["dy"], y.shape))
    return {"y": flat(y), "dx": flat(x.grad), "dtemb": flat(temb.grad),
            "grads": {n: flat(p.grad) for n, p in block.named_parameters()}}


class TimeInput(torch.nn.Module):
    """conv_in, time_embedding and add_embedding under UNet2DConditionModel's names."""

    def __init__(self, c):
        super().__init__()
        self.conv_in = torch.nn.Conv2d(c["latent_channels"], c["channels"], kernel_size=3, padding=1)
        self.time_embedding = TimestepEmbedding(c["channels"], c["temb_dim"])
        if c["text_time"]:
            self.add_embedding = TimestepEmbedding(c["pooled_dim"] + c["time_ids"] * c["time_embed_dim"],
                                                   c["temb_dim"])


def timestep(c):
    m = TimeInput(c).to(f64)
    load(m, c["params"])
    b, h, w = c["batch"], c["height"], c["width"]
    flip, shift = c["flip_sin_to_cos"], c["freq_shift"]
    x = tensor(c["x"], [b, c["latent_channels"], h, w]).requires_grad_(True)
    t = tensor(c["timesteps"], [b])
    y = m.conv_in(x)
    emb = m.time_embedding(sinusoid64(t, c["channels"], flip, shift))
    error = (Timesteps(c["channels"], flip, shift)(t).to(f64) - sinusoid64(t, c["channels"], flip, shift)).abs().max()
    if c["text_time"]:
        ids = tensor(c["time_ids_values"], [b * c["time_ids"]])
        time_embeds = sinusoid64(ids, c["time_embed_dim"], flip, shift).reshape(b, -1)
        pooled = tensor(c["pooled"], [b, c["pooled_dim"]])
        emb = emb + m.add_embedding(torch.cat([pooled, time_embeds], dim=-1))
        ours = get_timestep_embedding(ids, c["time_embed_dim"], flip, shift).to(f64)
        error = max(error, (ours - sinusoid64(ids, c["time_embed_dim"], flip, shift)).abs().max())
    (y * tensor(c["dy"], y.shape)).sum().add((emb * tensor(c["dtemb"], emb.shape)).sum()).backward()
    return {"y": flat(y), "temb": flat(emb), "dx": flat(x.grad), "sinusoid_error": float(error),
            "grads": {n: flat(p.grad) for n, p in m.named_parameters()}}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = {"resnet": [resnet(c) for c in cases["resnet"]], "timestep": [timestep(c) for c in cases["timestep"]]}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()

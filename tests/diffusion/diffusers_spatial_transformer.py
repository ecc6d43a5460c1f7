"""diffusers' own numbers for spatial_transformer_diffusers_test (tests/diffusion).

usage: diffusers_spatial_transformer.py OUT_DIR

For each case (SD 1.x style: 1x1 convolution projections, one block; SDXL
style: Linear projections, two blocks) builds diffusers' Transformer2DModel
in float64 with every parameter drawn at random (norms included), runs it on
random feature maps and text context, backpropagates a random output
gradient, and writes OUT_DIR/<case>.safetensors (float64): the parameters
under their state-dict names, "x" [B, C, H, W], "context" [B, L, D], "dy",
"y" (the output), "dx" and "grad.<name>" for every parameter.
"""

import sys
from pathlib import Path

import torch
from diffusers.models.transformers.transformer_2d import Transformer2DModel
from safetensors.torch import save_file

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(1234)

CASES = {
    # name: (channels, heads, head_dim, cross_dim, context, layers, linear, groups, image)
    "sd1": (32, 2, 16, 24, 5, 1, False, 8, (3, 5)),
    "sdxl": (32, 2, 16, 24, 5, 2, True, 32, (5, 3)),
}

for name, (channels, heads, head_dim, cross, context, layers, linear, groups, (h, w)) in CASES.items():
    model = Transformer2DModel(
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=channels,
        num_layers=layers,
        norm_num_groups=groups,
        cross_attention_dim=cross,
        use_linear_projection=linear,
    ).to(torch.float64)
    with torch.no_grad():
        for k, p in model.named_parameters():
            # norms' weights about 1, everything else about 0, all random
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in k and k.endswith("weight") else 0.0))
    batch = 2
    x = torch.randn(batch, channels, h, w, dtype=torch.float64, requires_grad=True)
    ctx = torch.randn(batch, context, cross, dtype=torch.float64)
    y = model(x, encoder_hidden_states=ctx, return_dict=False)[0]
    dy = torch.randn_like(y)
    y.backward(dy)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    tensors.update({"x": x.detach(), "context": ctx, "dy": dy, "y": y.detach(), "dx": x.grad})
    for k, p in model.named_parameters():
        tensors["grad." + k] = p.grad.detach().contiguous()
    save_file(tensors, str(out / f"{name}.safetensors"))

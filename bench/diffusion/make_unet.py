"""The model and the records of the diffusion benchmark (bench/run_diffusion_bench.sh).

usage: make_unet.py OUT_DIR --size default|smoke [--records N] [--seed 0]

Writes OUT_DIR/unet, a diffusers UNet2DConditionModel with random weights
(seeded), saved with save_pretrained (config.json and
diffusion_pytorch_model.safetensors; no scheduler, VAE or text encoder), and
OUT_DIR/records.safetensors, N random records in train_diffusion's format
(include/dtrain/diffusion/data.hpp): latents [N, 4, H, W] and
encoder_hidden_states [N, L, D], float32.

default: Stable Diffusion 1.5's structure (CrossAttnDownBlock2D x 3 +
DownBlock2D, UpBlock2D + CrossAttnUpBlock2D x 3, layers_per_block 2,
attention_head_dim 8, cross_attention_dim 768, norm_num_groups 32, 1x1
convolution projections) at reduced width, block_out_channels
(64, 128, 256, 256) instead of (320, 640, 1280, 1280); latents 4 x 32 x 32
(256 px images), text 77 x 768.
smoke: block_out_channels (32, 64), 2 blocks (CrossAttnDownBlock2D +
DownBlock2D, UpBlock2D + CrossAttnUpBlock2D), layers_per_block 1, text
8 x 32, latents 4 x 16 x 16.
Needs torch, diffusers and safetensors (the pinned torch2 set).
"""

import argparse
import json
import os

import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import save_file

SIZES = {
    "default": dict(latent=32, text=77, unet=dict(
        block_out_channels=(64, 128, 256, 256), layers_per_block=2, cross_attention_dim=768,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)),
    "smoke": dict(latent=16, text=8, unet=dict(
        block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", choices=sorted(SIZES), required=True)
    p.add_argument("--records", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    size = SIZES[a.size]
    torch.manual_seed(a.seed)
    unet = UNet2DConditionModel(sample_size=size["latent"], in_channels=4, out_channels=4, attention_head_dim=8,
                                norm_num_groups=32, **size["unet"])
    with torch.no_grad():  # random weights everywhere, zero-initialised convolutions included
        for param in unet.parameters():
            param.normal_(0.0, 0.02)
    unet.save_pretrained(os.path.join(a.out, "unet"))
    g = torch.Generator().manual_seed(a.seed + 1)
    dim = size["unet"]["cross_attention_dim"]
    records = {"latents": torch.randn(a.records, 4, size["latent"], size["latent"], generator=g),
               "encoder_hidden_states": torch.randn(a.records, size["text"], dim, generator=g)}
    save_file(records, os.path.join(a.out, "records.safetensors"))
    params = sum(t.numel() for t in unet.parameters())
    with open(os.path.join(a.out, "model.json"), "w") as f:
        json.dump({"size": a.size, "parameters": params, "records": a.records,
                   "latents": [4, size["latent"], size["latent"]], "text": [size["text"], dim],
                   "block_out_channels": list(size["unet"]["block_out_channels"]),
                   "layers_per_block": size["unet"]["layers_per_block"], "attention_head_dim": 8,
                   "norm_num_groups": 32, "down_block_types": list(size["unet"]["down_block_types"]),
                   "up_block_types": list(size["unet"]["up_block_types"])}, f)
    print(f"{a.out}: UNet {params} parameters, {a.records} records")


if __name__ == "__main__":
    main()

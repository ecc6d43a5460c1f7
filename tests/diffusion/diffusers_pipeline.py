"""diffusers' side of train_diffusion_test (tests/diffusion).

usage: diffusers_pipeline.py make DIR
       diffusers_pipeline.py sample DIR LORA_DIR OUT

make: a tiny Stable Diffusion pipeline in DIR/pipeline (a random
AutoencoderKL, a random CLIP text encoder with a tokenizer of single
letters, a random UNet2DConditionModel, SD's DDPMScheduler config), saved
with save_pretrained, and DIR/images: 20 random 32 x 32 images of two kinds
(horizontal or vertical stripes) with captions naming the kind.

sample: the pipeline with the LoRA adapters in LORA_DIR loaded by
load_lora_weights (what a diffusers user does with train_diffusion's
save_lora), two denoising steps at 32 x 32 with and without them; OUT gets
both images ("with", "without").
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from PIL import Image
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer


def tokenizer(directory):
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in letters:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=12)


def make(out):
    torch.manual_seed(3)
    tok = tokenizer(out / "tokenizer_files")
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tok.get_vocab()), hidden_size=24, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=12,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 16),
                        layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=32)
    unet = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32),
                                layers_per_block=1, norm_num_groups=8, cross_attention_dim=24,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=2)
    scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              num_train_timesteps=1000, clip_sample=False)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tok, unet=unet, scheduler=scheduler,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(out / "pipeline")
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(20):
        kind = "horizontal" if i % 2 == 0 else "vertical"
        stripes = (np.arange(32) // 4 % 2 * 200 + 20).astype(np.uint8)
        a = np.repeat(stripes[:, None] if kind == "horizontal" else stripes[None, :], 32, axis=1 if kind ==
                      "horizontal" else 0)
        a = np.clip(a[:, :, None] + rng.integers(-20, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(a).save(images / f"{i:02d}.png")
        (images / f"{i:02d}.txt").write_text(f"a {kind} stripe")


def sample(directory, lora, out):
    pipe = StableDiffusionPipeline.from_pretrained(directory / "pipeline")
    run = dict(prompt="a vertical stripe", num_inference_steps=2, height=32, width=32, output_type="pt",
               guidance_scale=1.0)
    without = pipe(generator=torch.Generator().manual_seed(0), **run).images
    pipe.load_lora_weights(str(lora), weight_name="pytorch_lora_weights.safetensors")
    with_lora = pipe(generator=torch.Generator().manual_seed(0), **run).images
    save_file({"with": with_lora.float().contiguous(), "without": without.float().contiguous()}, out)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        sample(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])

"""Caches what train_diffusion trains on: a Stable Diffusion (1.x/2.x) or SDXL
pipeline's VAE latents and text embeddings of a folder of captioned images,
as one records file (dtrain/diffusion/data.hpp says what it holds).

usage: python cache_latents.py PIPELINE IMAGES OUT.safetensors
           [--resolution 512] [--with-draws] [--seed 0] [--device cpu]

PIPELINE  a diffusers pipeline folder (or Hugging Face id) with vae/,
          tokenizer/ and text_encoder/ (SDXL: tokenizer_2/, text_encoder_2/)
IMAGES    a folder of images (.png .jpg .jpeg .webp), each with its caption in
          a .txt of the same name (an empty caption when there is none)
--resolution  each image is resized (shorter side) and center-cropped to it
--with-draws  also store a noise and a timestep per record (from --seed), so
              that train_diffusion's held-out loss uses exactly these
              (reproducible validation, comparable with diffusers)

The latents are one sample of the VAE's distribution times its
scaling_factor, as diffusers' training scripts use them; SDXL's text
embeddings are both encoders' penultimate hidden states side by side, its
pooled embedding the second encoder's, and its time ids (original size,
crop, target size), as its pipeline computes them. The empty caption's
embedding is stored for classifier-free guidance training (drop_text=).
Needs diffusers, transformers, torch and pillow (the versions
scripts/python/torch2.txt pins are the ones dtrain is checked against).
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKL
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoTokenizer, CLIPTextModel, CLIPTextModelWithProjection


def load_image(path, size):
    image = Image.open(path).convert("RGB")
    w, h = image.size
    scale = size / min(w, h)
    image = image.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BICUBIC)
    left, top = (image.width - size) // 2, (image.height - size) // 2
    image = image.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1)
    return x / 127.5 - 1.0, (h, w), (round(top / scale), round(left / scale))


def encode_text(captions, tokenizers, encoders, sdxl):
    states, pooled = [], None
    for tokenizer, encoder in zip(tokenizers, encoders):
        ids = tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                        return_tensors="pt").input_ids.to(encoder.device)
        out = encoder(ids, output_hidden_states=True)
        states.append(out.hidden_states[-2] if sdxl else out[0])
        if sdxl:
            pooled = out[0]  # the last encoder's projected text embedding
    return torch.cat(states, dim=-1), pooled


@torch.no_grad()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline")
    p.add_argument("images", type=Path)
    p.add_argument("out")
    p.add_argument("--resolution", type=int, default=512)
    p.add_argument("--with-draws", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    root = Path(a.pipeline)
    sdxl = (root / "text_encoder_2").exists()
    vae = AutoencoderKL.from_pretrained(a.pipeline, subfolder="vae").to(a.device)
    tokenizers = [AutoTokenizer.from_pretrained(a.pipeline, subfolder="tokenizer")]
    encoders = [CLIPTextModel.from_pretrained(a.pipeline, subfolder="text_encoder").to(a.device)]
    if sdxl:
        tokenizers.append(AutoTokenizer.from_pretrained(a.pipeline, subfolder="tokenizer_2"))
        encoders.append(CLIPTextModelWithProjection.from_pretrained(a.pipeline, subfolder="text_encoder_2").to(a.device))
    files = sorted(f for f in a.images.iterdir() if f.suffix.lower() in {".png", ".jpg", ".jpeg", ".webp"})
    if not files:
        raise SystemExit(f"no images in {a.images}")
    generator = torch.Generator().manual_seed(a.seed)
    records = {"latents": [], "encoder_hidden_states": [], "pooled": [], "time_ids": []}
    for f in files:
        image, original, crop = load_image(f, a.resolution)
        dist = vae.encode(image[None].to(a.device)).latent_dist
        latents = dist.mean + dist.std * torch.randn(dist.mean.shape, generator=generator).to(a.device)
        records["latents"].append(latents[0].cpu() * vae.config.scaling_factor)
        caption = f.with_suffix(".txt").read_text().strip() if f.with_suffix(".txt").exists() else ""
        states, pooled = encode_text([caption], tokenizers, encoders, sdxl)
        records["encoder_hidden_states"].append(states[0].cpu())
        if sdxl:
            records["pooled"].append(pooled[0].cpu())
            records["time_ids"].append(torch.tensor([*original, *crop, a.resolution, a.resolution], dtype=torch.float32))
    out = {k: torch.stack(v).float().contiguous() for k, v in records.items() if v}
    states, pooled = encode_text([""], tokenizers, encoders, sdxl)
    out["uncond_encoder_hidden_states"] = states[0].cpu().float().contiguous()
    if sdxl:
        out["uncond_pooled"] = pooled[0].cpu().float().contiguous()
    if a.with_draws:
        from diffusers import DDPMScheduler
        steps = DDPMScheduler.from_pretrained(a.pipeline, subfolder="scheduler").config.num_train_timesteps
        out["noise"] = torch.randn(out["latents"].shape, generator=generator)
        out["timesteps"] = torch.randint(0, steps, (len(files),), generator=generator).float()
    save_file(out, a.out)
    print(f"{a.out}: {len(files)} records, latents {tuple(out['latents'].shape[1:])}, "
          f"text {tuple(out['encoder_hidden_states'].shape[1:])}{', SDXL pooled and time ids' if sdxl else ''}")


if __name__ == "__main__":
    main()

"""diffusers' side of diffusion_unet_test (tests/diffusion).

usage: diffusers_unet.py make DIR KIND     KIND: sd | sdxl
       diffusers_unet.py predict MODEL_DIR INPUTS OUT
       diffusers_unet.py train DIR STEPS LR OUT

make: a tiny UNet2DConditionModel of Stable Diffusion's shape (sd: 1x1
convolution projections, one transformer layer) or SDXL's (linear
projections, two transformer layers in the second block, text_time
conditioning), every parameter drawn at random (seeded), saved with
save_pretrained to DIR/unet; inputs in DIR/inputs.safetensors (latents,
timesteps, encoder_hidden_states, target; SDXL: text_embeds, time_ids); and
in DIR/expected.safetensors the model's prediction, the MSE loss against
the target and every parameter's gradient ("grad.<name>"), computed in
float64.

diffusers computes the timestep sinusoids in float32 whatever the model's
dtype; here they are computed in float64 (get_timestep_embedding replaced
by the same formula in float64), as dtrain computes them, so the
comparison measures the model and not float32's rounding of the angles.

predict: the prediction of the UNet saved in MODEL_DIR (loaded with
from_pretrained, float64) on INPUTS, to OUT ("pred").

train: STEPS steps of torch.optim.AdamW (lr LR, no weight decay) on
DIR/unet in float64, each on DIR/inputs.safetensors' whole batch against its
target; OUT holds the loss before each step ("losses") and every parameter
after the last ("param.<name>").
"""

import math
import sys
from pathlib import Path

import torch
import diffusers.models.embeddings as embeddings
from diffusers import UNet2DConditionModel
from safetensors.torch import load_file, save_file

f64 = torch.float64


def sinusoid64(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1, scale=1, max_period=10000):
    half = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=f64) / (half - downscale_freq_shift)
    angle = scale * timesteps.to(f64)[:, None] * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


embeddings.get_timestep_embedding = sinusoid64


def config(kind):
    common = dict(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
                  norm_num_groups=8, cross_attention_dim=24)
    if kind == "sd":
        return dict(common, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=2)
    return dict(common, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
                transformer_layers_per_block=(1, 2), use_linear_projection=True,
                addition_embed_type="text_time", addition_time_embed_dim=8,
                projection_class_embeddings_input_dim=16 + 6 * 8)


def conditioning(inputs, kind):
    if kind != "sdxl":
        return {}
    return {"added_cond_kwargs": {"text_embeds": inputs["text_embeds"].to(f64), "time_ids": inputs["time_ids"].to(f64)}}


def predict(model, inputs, kind):
    return model(inputs["latents"].to(f64), inputs["timesteps"].to(f64), inputs["encoder_hidden_states"].to(f64),
                 **conditioning(inputs, kind)).sample


def make(out, kind):
    torch.manual_seed(7 if kind == "sd" else 11)
    model = UNet2DConditionModel(**config(kind))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out / "unet")
    b, length = 2, 5
    inputs = {"latents": torch.randn(b, 4, 8, 8), "timesteps": torch.tensor([37.0, 901.0]),
              "encoder_hidden_states": torch.randn(b, length, 24), "target": torch.randn(b, 4, 8, 8)}
    if kind == "sdxl":
        inputs["text_embeds"] = torch.randn(b, 16)
        inputs["time_ids"] = torch.tensor([[64.0, 48.0, 0.0, 8.0, 64.0, 48.0], [32.0, 32.0, 4.0, 0.0, 32.0, 32.0]])
    save_file(inputs, out / "inputs.safetensors")
    model = model.to(f64)  # (diffusers warns about casting: this UNet keeps no module in float32)
    pred = predict(model, inputs, kind)
    loss = torch.nn.functional.mse_loss(pred, inputs["target"].to(f64))
    loss.backward()
    expected = {"pred": pred.detach().float().contiguous(), "loss": loss.detach().float().reshape(1)}
    for name, p in model.named_parameters():
        expected["grad." + name] = p.grad.float().contiguous()
    save_file(expected, out / "expected.safetensors")


def train(directory, steps, lr, out):
    model = UNet2DConditionModel.from_pretrained(directory / "unet").to(f64)
    inputs = load_file(directory / "inputs.safetensors")
    kind = "sdxl" if "text_embeds" in inputs else "sd"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(predict(model, inputs, kind), inputs["target"].to(f64))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    result = {"losses": torch.tensor(losses, dtype=torch.float32)}
    for name, p in model.named_parameters():
        result["param." + name] = p.detach().float().contiguous()
    save_file(result, out)


def main():
    if sys.argv[1] == "train":
        train(Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    elif sys.argv[1] == "make":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        make(out, sys.argv[3])
    else:
        model = UNet2DConditionModel.from_pretrained(sys.argv[2]).to(f64)
        inputs = load_file(sys.argv[3])
        kind = "sdxl" if "text_embeds" in inputs else "sd"
        with torch.no_grad():
            pred = predict(model, inputs, kind)
        save_file({"pred": pred.float().contiguous()}, sys.argv[4])


if __name__ == "__main__":
    main()

"""diffusers' side of diffusion_pixart_test (tests/diffusion).

usage: diffusers_pixart.py make DIR
       diffusers_pixart.py predict MODEL_DIR INPUTS OUT
       diffusers_pixart.py train DIR STEPS LR OUT

make: a tiny PixArtTransformer2DModel (sample_size 8, patch 2, two blocks of
two heads of 8, caption_channels 12, 4 latent channels, 8 out: a learned
variance, interpolation_scale 2), every parameter drawn at random (seeded;
the scale-shift tables too), saved with save_pretrained to DIR/transformer;
inputs in DIR/inputs.safetensors (latents [2, 4, 8, 12]: wider than
sample_size, so diffusers recomputes the positions for a 4 x 6 grid;
timesteps, encoder_hidden_states [2, 6, 12], encoder_attention_mask with
the second record's last two tokens padded, target [2, 4, 8, 12]); and in
DIR/expected.safetensors the model's prediction (all 8 channels), the MSE
loss of its first 4 channels against the target (diffusers' PixArt
training scripts' model_pred.chunk(2, dim=1)[0]) and every parameter's
gradient ("grad.<name>"), computed in float64.

diffusers computes the timestep sinusoids in float32 whatever the model's
dtype; here they are computed in float64 (get_timestep_embedding replaced
by the same formula in float64), as dtrain computes them, so the
comparison measures the model and not float32's rounding of the angles
(up to 901 rad). The 2-D position embedding stays diffusers' own (its
float32 grid: positions below 3, rounded within 2e-7).

predict: the prediction of the transformer saved in MODEL_DIR (loaded with
from_pretrained, float64) on INPUTS, to OUT ("pred").

train: STEPS steps of torch.optim.AdamW (lr LR, no weight decay) on
DIR/transformer in float64, each on DIR/inputs.safetensors' whole batch
against its target; OUT holds the loss before each step ("losses") and
every parameter after the last ("param.<name>").
"""

import sys
from pathlib import Path

import torch
from diffusers import PixArtTransformer2DModel
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diffusers_unet  # noqa: E402,F401  (installs diffusers_unet.sinusoid64: the sinusoids in float64)

f64 = torch.float64


CONFIG = dict(sample_size=8, patch_size=2, in_channels=4, out_channels=8, num_layers=2, num_attention_heads=2,
              attention_head_dim=8, cross_attention_dim=16, caption_channels=12, interpolation_scale=2)


def predict(model, inputs):
    return model(inputs["latents"].to(f64), encoder_hidden_states=inputs["encoder_hidden_states"].to(f64),
                 timestep=inputs["timesteps"].to(f64), encoder_attention_mask=inputs["encoder_attention_mask"],
                 added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample


def loss_of(pred, inputs):
    # the learned variance's channels are not trained on
    return torch.nn.functional.mse_loss(pred.chunk(2, dim=1)[0], inputs["target"].to(f64))


def make(out):
    torch.manual_seed(13)
    model = PixArtTransformer2DModel(**CONFIG)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out / "transformer")
    b, length = 2, 6
    inputs = {"latents": torch.randn(b, 4, 8, 12), "timesteps": torch.tensor([37.0, 901.0]),
              "encoder_hidden_states": torch.randn(b, length, 12),
              "encoder_attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.int64),
              "target": torch.randn(b, 4, 8, 12)}
    save_file(inputs, out / "inputs.safetensors")
    model = model.to(f64)
    pred = predict(model, inputs)
    loss = loss_of(pred, inputs)
    loss.backward()
    expected = {"pred": pred.detach().float().contiguous(), "loss": loss.detach().float().reshape(1)}
    for name, p in model.named_parameters():
        expected["grad." + name] = p.grad.float().contiguous()
    save_file(expected, out / "expected.safetensors")


def train(directory, steps, lr, out):
    model = PixArtTransformer2DModel.from_pretrained(directory / "transformer").to(f64)
    inputs = load_file(directory / "inputs.safetensors")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(predict(model, inputs), inputs)
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
        make(out)
    else:
        model = PixArtTransformer2DModel.from_pretrained(sys.argv[2]).to(f64)
        inputs = load_file(sys.argv[3])
        with torch.no_grad():
            pred = predict(model, inputs)
        save_file({"pred": pred.float().contiguous()}, sys.argv[4])


if __name__ == "__main__":
    main()

"""diffusers' and PEFT's side of diffusion_lora_test (tests/diffusion).

usage: diffusers_lora.py make DIR KIND
       diffusers_lora.py train DIR STEPS LR
       diffusers_lora.py predict BASE_DIR LORA_DIR INPUTS OUT

DIR is a folder diffusers_unet.py's make wrote (DIR/unet, DIR/inputs.safetensors).

make: LoRA adapters (rank 2, alpha 3) added to the UNet by diffusers'
add_adapter (PEFT underneath) on KIND's targets (sd: to_q, to_k, to_v,
to_out.0; sdxl: also ff.net.0.proj, ff.net.2, proj_in, proj_out), A and B
drawn at random (seeded, rounded to float32); written as diffusers'
StableDiffusionPipeline.save_lora_weights writes them (DIR/lora:
pytorch_lora_weights.safetensors, "unet."-prefixed names, the adapters'
LoraConfig in the metadata) and as PEFT's own save_pretrained of a PeftModel
over the same UNet writes them (DIR/lora_peft: adapter_config.json,
adapter_model.safetensors). DIR/lora_expected.safetensors: the prediction
with the adapters, the MSE loss against the target and the adapters'
gradients ("grad.<module>.lora_A.weight"), in float64.

train: STEPS steps of torch.optim.AdamW (lr LR, no weight decay) over the
adapters alone, in float64, on the whole batch; DIR/lora_adamw.safetensors
holds the loss before each step ("losses"), every adapter after the last
("param.<module>.lora_A.weight") and the trained model's prediction
("pred"); the trained adapters are saved with save_lora_weights to
DIR/lora_trained.

predict: the prediction of the base UNet in BASE_DIR with the adapters in
LORA_DIR loaded by the UNet's load_lora_adapter (prefix "unet", what
load_lora_weights does for a pipeline's UNet), in float64, to OUT ("pred").
"""

import sys
from pathlib import Path

import torch
from diffusers import StableDiffusionPipeline, UNet2DConditionModel
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diffusers_unet import predict  # noqa: E402  (also installs the float64 sinusoids)

f64 = torch.float64
TARGETS = {"sd": ["to_q", "to_k", "to_v", "to_out.0"],
           "sdxl": ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2", "proj_in", "proj_out"]}


def kind_of(inputs):
    return "sdxl" if "text_embeds" in inputs else "sd"


def lora_config(kind):
    return LoraConfig(r=2, lora_alpha=3, target_modules=TARGETS[kind], init_lora_weights="gaussian")


def base_model(directory):
    return UNet2DConditionModel.from_pretrained(directory / "unet")


def adapters(model):
    return {name: p for name, p in model.named_parameters() if "lora_" in name}


def save_pipeline_format(model, out):
    layers = {k: v.detach().float().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    StableDiffusionPipeline.save_lora_weights(out, unet_lora_layers=layers,
                                              unet_lora_adapter_metadata=model.peft_config["default"].to_dict())


def loss_of(model, inputs):
    pred = predict(model, inputs, kind_of(inputs))
    return pred, torch.nn.functional.mse_loss(pred, inputs["target"].to(f64))


def make(directory, kind):
    torch.manual_seed(23 if kind == "sd" else 29)
    model = base_model(directory)
    model.add_adapter(lora_config(kind))
    with torch.no_grad():
        for p in adapters(model).values():
            p.copy_((torch.randn_like(p) * 0.3).float())
    save_pipeline_format(model, directory / "lora")
    # PEFT's own format: a PeftModel over a fresh base, given the same adapters
    peft_model = get_peft_model(base_model(directory), lora_config(kind))
    state = {"base_model.model." + k: v for k, v in get_peft_model_state_dict(model).items()}
    result = set_peft_model_state_dict(peft_model, state)
    assert not result.unexpected_keys, result.unexpected_keys
    peft_model.save_pretrained(directory / "lora_peft")

    model = model.to(f64)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    inputs = load_file(directory / "inputs.safetensors")
    pred, loss = loss_of(model, inputs)
    loss.backward()
    expected = {"pred": pred.detach().float().contiguous(), "loss": loss.detach().float().reshape(1)}
    for name, p in adapters(model).items():
        expected["grad." + name.replace(".default", "")] = p.grad.float().contiguous()
    save_file(expected, directory / "lora_expected.safetensors")


def with_adapters(base_dir, lora_dir):
    model = UNet2DConditionModel.from_pretrained(base_dir)
    model.load_lora_adapter(str(lora_dir), prefix="unet", adapter_name="default",
                            weight_name="pytorch_lora_weights.safetensors")
    return model.to(f64)


def train(directory, steps, lr):
    model = with_adapters(directory / "unet", directory / "lora")
    inputs = load_file(directory / "inputs.safetensors")
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    opt = torch.optim.AdamW(list(adapters(model).values()), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        _, loss = loss_of(model, inputs)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        pred = predict(model, inputs, kind_of(inputs))
    result = {"losses": torch.tensor(losses, dtype=torch.float32), "pred": pred.float().contiguous()}
    for name, p in adapters(model).items():
        result["param." + name.replace(".default", "")] = p.detach().float().contiguous()
    save_file(result, directory / "lora_adamw.safetensors")
    save_pipeline_format(model, directory / "lora_trained")


def main():
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "train":
        train(Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        model = with_adapters(Path(sys.argv[2]), Path(sys.argv[3]))
        inputs = load_file(sys.argv[4])
        with torch.no_grad():
            pred = predict(model, inputs, kind_of(inputs))
        save_file({"pred": pred.float().contiguous()}, sys.argv[5])


if __name__ == "__main__":
    main()

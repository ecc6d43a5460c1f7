"""Tiny random vision towers from transformers, and what dtrain must match.

    make_tiny_vision.py make OUT KIND LAYER STRATEGY
        KIND clip | siglip. Writes OUT/model (save_pretrained), and
        OUT/reference.safetensors: pixel_values [2, 3, 16, 16], hidden_states.<i>
        for every i, target (random, the selected features' shape) and
        grad.<name> (torch autograd) of mean((features - target)^2) for the
        features hidden_states[LAYER] with STRATEGY (default: drop token 0).
    make_tiny_vision.py check SAVED OUT
        Loads SAVED (dtrain's save_pretrained) in transformers and prints the
        largest difference of its hidden_states, and of its tensors, from
        OUT's; exits 1 when a tensor is missing or extra.
"""
import sys

import torch
import transformers as tf
from safetensors.torch import load_file, save_file

IMAGE, PATCH, HIDDEN, LAYERS, HEADS = 16, 4, 32, 3, 4


def tower_class(kind):
    return tf.CLIPVisionModel if kind == "clip" else tf.SiglipVisionModel


def build(kind):
    torch.manual_seed(7 if kind == "clip" else 8)
    args = dict(image_size=IMAGE, patch_size=PATCH, hidden_size=HIDDEN, intermediate_size=64,
                num_hidden_layers=LAYERS, num_attention_heads=HEADS)
    config = tf.CLIPVisionConfig(**args) if kind == "clip" else tf.SiglipVisionConfig(**args)
    model = tower_class(kind)(config).eval()
    # Random non-zero values everywhere (biases and norms are 0 and 1 at init).
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
            p.add_(torch.sign(p) * 0.01)
    return model


def make(out, kind, layer, strategy):
    model = build(kind)
    model.save_pretrained(out + "/model")
    torch.manual_seed(11)
    pixels = torch.randn(2, 3, IMAGE, IMAGE)
    out_ = model(pixel_values=pixels, output_hidden_states=True)
    ref = {"pixel_values": pixels}
    for i, h in enumerate(out_.hidden_states):
        ref["hidden_states.%d" % i] = h.detach().contiguous()
    features = out_.hidden_states[layer]
    if strategy == "default":
        features = features[:, 1:]
    target = torch.randn_like(features)
    loss = torch.nn.functional.mse_loss(features, target)
    model.zero_grad()
    loss.backward()
    ref["target"] = target.contiguous()
    for name, p in model.named_parameters():
        if p.grad is not None:
            ref["grad." + name] = p.grad.detach().contiguous()
    save_file(ref, out + "/reference.safetensors")


def check(saved, out):
    ref = load_file(out + "/reference.safetensors")
    config = tf.AutoConfig.from_pretrained(saved)
    kind = "clip" if config.model_type == "clip_vision_model" else "siglip"
    model = tower_class(kind).from_pretrained(saved).eval()
    original = tower_class(kind).from_pretrained(out + "/model").eval()
    with torch.no_grad():
        hs = model(pixel_values=ref["pixel_values"], output_hidden_states=True).hidden_states
    worst = max((h - ref["hidden_states.%d" % i]).abs().max().item() for i, h in enumerate(hs))
    a, b = model.state_dict(), original.state_dict()
    if set(a) != set(b):
        print("tensors differ:", sorted(set(a) ^ set(b)))
        return 1
    tensors = max((a[k] - b[k]).abs().max().item() for k in a)
    print("hidden_states %.3e tensors %.3e" % (worst, tensors))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))

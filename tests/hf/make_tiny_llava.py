"""Tiny random LLaVA models (LlavaForConditionalGeneration) from transformers,
and what dtrain must match.

    make_tiny_llava.py make OUT TOWER TEXT TIED
        TOWER clip | siglip, TEXT llama | gemma, TIED 0 | 1 (the head tied to
        the token embedding). Writes OUT/model (save_pretrained) and
        OUT/reference.safetensors: pixel_values [2, 3, 16, 16], ids int64
        [2, T] (each sequence's image token expanded to one per feature, as
        the processor writes them), y int64 [2, T] (the next token, -100 where
        the next is an image token and at the end), logits [2, T, vocab], loss
        (the mean cross-entropy of logits against y) and grad.<name> (torch
        autograd of that loss) for every parameter. transformers 4 takes the
        ids with one image token per image and expands them itself; 5 takes
        them expanded.
    make_tiny_llava.py check SAVED OUT
        Loads SAVED (dtrain's save_pretrained) in transformers and prints the
        largest difference of its logits from OUT/dtrain.safetensors
        (dtrain's), and of the tensors named in OUT/dtrain.safetensors'
        "same" list (comma-separated in its metadata) from the originals;
        exits 1 when the saved model's tensors are not the original's names.
"""
import sys

import torch
import transformers as tf
from safetensors import safe_open
from safetensors.torch import load_file, save_file

IMAGE, PATCH, VISION, TEXT, VOCAB, IMAGE_TOKEN = 16, 4, 32, 24, 50, 49
MAJOR = int(tf.__version__.split(".")[0])


def config_of(tower, text, tied):
    vision = dict(image_size=IMAGE, patch_size=PATCH, hidden_size=VISION, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4)
    vision = tf.CLIPVisionConfig(**vision) if tower == "clip" else tf.SiglipVisionConfig(**vision)
    common = dict(vocab_size=VOCAB, hidden_size=TEXT, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                  tie_word_embeddings=tied)
    if text == "llama":
        text_config = tf.LlamaConfig(**common, rope_theta=500.0)
    else:
        text_config = tf.GemmaConfig(**common, head_dim=6)
    return tf.LlavaConfig(vision_config=vision, text_config=text_config, image_token_index=IMAGE_TOKEN,
                          vision_feature_layer=-2 if tower == "clip" else -1,
                          vision_feature_select_strategy="default" if tower == "clip" else "full",
                          tie_word_embeddings=tied)


def features_per_image(config):
    tokens = (IMAGE // PATCH) ** 2 + (1 if config.vision_config.model_type == "clip_vision_model" else 0)
    return tokens - (1 if config.vision_feature_select_strategy == "default" else 0)


def inputs(config):
    """ids with one image token per image (at 2 and 4), and expanded."""
    torch.manual_seed(11)
    pixels = torch.randn(2, 3, IMAGE, IMAGE)
    compact = torch.randint(0, IMAGE_TOKEN, (2, 8))
    compact[0, 2] = IMAGE_TOKEN
    compact[1, 4] = IMAGE_TOKEN
    n = features_per_image(config)
    rows = []
    for seq in compact.tolist():
        at = seq.index(IMAGE_TOKEN)
        rows.append(seq[:at] + [IMAGE_TOKEN] * n + seq[at + 1:])
    expanded = torch.tensor(rows, dtype=torch.int64)
    y = torch.full_like(expanded, -100)
    y[:, :-1] = expanded[:, 1:]
    y[y == IMAGE_TOKEN] = -100
    return pixels, compact, expanded, y


def logits_of(model, pixels, compact, expanded):
    if MAJOR < 5:
        return model(input_ids=compact, pixel_values=pixels, attention_mask=torch.ones_like(compact)).logits
    return model(input_ids=expanded, pixel_values=pixels).logits


def make(out, tower, text, tied):
    torch.manual_seed(7)
    config = config_of(tower, text, tied)
    model = tf.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # random non-zero values everywhere (norms are 1 and biases 0 at init)
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
            p.add_(torch.sign(p) * 0.01)
    model.save_pretrained(out + "/model")
    model = tf.LlavaForConditionalGeneration.from_pretrained(out + "/model").eval()
    pixels, compact, expanded, y = inputs(config)
    logits = logits_of(model, pixels, compact, expanded)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100)
    model.zero_grad()
    loss.backward()
    ref = {"pixel_values": pixels, "ids": expanded, "y": y, "logits": logits.detach().contiguous(),
           "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        if p.grad is not None:
            ref["grad." + name] = p.grad.detach().contiguous()
    save_file(ref, out + "/reference.safetensors")


def check(saved, out):
    ref = load_file(out + "/reference.safetensors")
    mine = load_file(out + "/dtrain.safetensors")
    with safe_open(out + "/dtrain.safetensors", "pt") as f:
        same = [n for n in (f.metadata() or {}).get("same", "").split(",") if n]
    model = tf.LlavaForConditionalGeneration.from_pretrained(saved).eval()
    original = tf.LlavaForConditionalGeneration.from_pretrained(out + "/model").eval()
    config = model.config
    pixels, compact, expanded, _ = inputs(config)
    with torch.no_grad():
        logits = logits_of(model, pixels, compact, expanded)
    worst = (logits.reshape(-1) - mine["logits"].reshape(-1)).abs().max().item()
    a, b = model.state_dict(), original.state_dict()
    if set(a) != set(b):
        print("tensors differ:", sorted(set(a) ^ set(b)))
        return 1
    # a part's tensors: transformers 4 names them "<part>.", 5 "model.<part>." (lm_head alone)
    kept = [k for k in a if any(("." + k).find("." + part + ".") >= 0 for part in same)]
    tensors = max([(a[k] - b[k]).abs().max().item() for k in kept] + [0.0])
    print("logits %.3e same %.3e of %d" % (worst, tensors, len(kept)))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))

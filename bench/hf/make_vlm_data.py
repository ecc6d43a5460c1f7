"""A LLaVA config and random records for the VLM benchmark (bench/run_vlm_bench.sh).

usage: make_vlm_data.py OUT_DIR --size small|smoke --records N --text T

Writes OUT_DIR/config.json, a transformers LlavaForConditionalGeneration
config (model_type "llava", transformers 5's field names): a CLIP tower
(small: ViT-B/16 at 224 px, hidden 768, 12 layers, 12 heads, MLP 3072,
quick_gelu; smoke: 32 px, patch 8, 2 layers of width 32) whose second-last
layer's patch features (vision_feature_layer -2, select "default") feed the
projector, and a Llama language model (small: hidden 768, 8 layers, 12 heads,
4 key/value heads, SwiGLU 2048, vocabulary 32064, untied head, about 100M
parameters; smoke: 2 layers of width 32, vocabulary 64), and
OUT_DIR/data.safetensors, the records train_vlm and the PyTorch script read:
pixel_values float32 [N, 3, H, W] (normal noise, as normalised pixels are),
input_ids int64 [N, F + T] (a token, the image token expanded to the F patch
features as the processor writes it, then T - 1 random text tokens) and
labels int64 (-100 over the first token and the image tokens, the ids
elsewhere: the loss over the text). Only numpy: the safetensors file is
written by hand (an 8-byte little-endian header length, the JSON header,
the tensors' bytes).
"""

import argparse
import json
import os
import struct

import numpy as np

SIZES = {
    "small": dict(image=224, patch=16, vision=768, vision_layers=12, vision_heads=12, vision_mlp=3072,
                  text=768, layers=8, heads=12, kv_heads=4, mlp=2048, vocab=32064),
    "smoke": dict(image=32, patch=8, vision=32, vision_layers=2, vision_heads=4, vision_mlp=64,
                  text=32, layers=2, heads=4, kv_heads=2, mlp=64, vocab=64),
}


def config(s):
    image_token = s["vocab"] - 1
    return {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": image_token,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": False,
        "vision_config": {
            "model_type": "clip_vision_model", "hidden_size": s["vision"], "intermediate_size": s["vision_mlp"],
            "num_hidden_layers": s["vision_layers"], "num_attention_heads": s["vision_heads"], "num_channels": 3,
            "image_size": s["image"], "patch_size": s["patch"], "hidden_act": "quick_gelu",
            "layer_norm_eps": 1e-5, "attention_dropout": 0.0, "projection_dim": s["vision"]},
        "text_config": {
            "model_type": "llama", "vocab_size": s["vocab"], "hidden_size": s["text"],
            "intermediate_size": s["mlp"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
            "num_key_value_heads": s["kv_heads"], "max_position_embeddings": 1024, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False},
        "transformers_version": "5.24.0",
    }


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", choices=SIZES, required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--text", type=int, required=True)
    args = p.parse_args()
    s = SIZES[args.size]
    c = config(s)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    features = (s["image"] // s["patch"]) ** 2  # "default" drops the class token
    rng = np.random.default_rng(0)
    n, t = args.records, args.text
    ids = rng.integers(0, c["image_token_index"], (n, features + t), dtype=np.int64)
    ids[:, 1:1 + features] = c["image_token_index"]
    labels = ids.copy()
    labels[:, :1 + features] = -100
    pixels = rng.standard_normal((n, 3, s["image"], s["image"]), dtype=np.float32)
    write_safetensors(os.path.join(args.out, "data.safetensors"),
                      {"pixel_values": pixels, "input_ids": ids, "labels": labels})


if __name__ == "__main__":
    main()

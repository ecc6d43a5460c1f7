"""Loads a model directory with transformers (as a user would: AutoModelForCausalLM.from_pretrained)
and writes its float32 logits for the ids in another safetensors file.

usage: transformers_logits.py MODEL_DIR IDS_FILE OUT_FILE
"""
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

model_dir, ids_file, out = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
model.eval()
ids = load_file(ids_file)["ids"]
with torch.no_grad():
    logits = model(ids).logits.reshape(-1, model.config.vocab_size).contiguous()
save_file({"logits": logits}, out)

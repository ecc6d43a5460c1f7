"""PEFT's side of the LoRA parity tests: makes a LoRA adapter with PEFT, or
loads one (PEFT's or dtrain's) onto its base model, and writes the adapted
model's float32 logits for the ids in IDS_FILE (a safetensors file with "ids").

usage: peft_adapter.py make MODEL_DIR ADAPTER_DIR IDS_FILE OUT_FILE TARGETS R ALPHA [MODULES_TO_SAVE]
       peft_adapter.py load MODEL_DIR ADAPTER_DIR IDS_FILE OUT_FILE

make: get_peft_model with LoraConfig(r=R, lora_alpha=ALPHA,
target_modules=TARGETS (comma-separated), init_lora_weights=False: A and B
both random, so the adapter changes the logits), saved with save_pretrained.
MODULES_TO_SAVE (comma-separated) become PEFT's modules_to_save, whose
trained copies are moved off the base weights by random noise too.
"""
import sys

import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

mode, model_dir, adapter_dir, ids_file, out = sys.argv[1:6]
torch.manual_seed(0)
base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
if mode == "make":
    targets, r, alpha = sys.argv[6].split(","), int(sys.argv[7]), float(sys.argv[8])
    modules = sys.argv[9].split(",") if len(sys.argv) > 9 else None
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                             init_lora_weights=False, task_type="CAUSAL_LM", modules_to_save=modules)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, peft.utils.other.ModulesToSaveWrapper):
                copy = module.modules_to_save["default"].weight
                copy.add_(0.05 * torch.randn_like(copy))
    model.save_pretrained(adapter_dir, safe_serialization=True)
elif mode == "load":
    model = peft.PeftModel.from_pretrained(base, adapter_dir)
else:
    sys.exit(f"peft_adapter.py: unknown mode {mode}")
model.eval()
ids = load_file(ids_file)["ids"]
with torch.no_grad():
    logits = model(input_ids=ids).logits.reshape(-1, base.config.vocab_size).contiguous()
save_file({"logits": logits}, out)

"""The training reference for hf_transformers_test: transformers + PyTorch's
AdamW on one batch, in float32.

usage: transformers_train.py MODEL_DIR IDS_FILE OUT_FILE STEPS [PAD [DEVICE [ADAPTER_DIR]]]
Loads MODEL_DIR with AutoModelForCausalLM (train mode; the tiny models have
no dropout), takes ids [B, T] from IDS_FILE as both input and labels (the
model shifts them: position t predicts t + 1), and writes to OUT_FILE:
  logits            the first forward's logits [B * T, vocab]
  loss              the first step's mean loss, [1]
  grad.<name>       every parameter's gradient at the first step
  param.<name>      every parameter after STEPS AdamW steps on that batch
                    (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01)
Names are named_parameters()': a tied head appears once, as the embedding.
PAD > 0 left-pads the first sequence: attention_mask 0 on its first PAD
positions, and labels -100 there and on its first token (whose prediction
would come from a padding position). DEVICE (default cpu) is where it trains:
cuda for the GPU test, with TF32 off so float32 stays float32.
ADAPTER_DIR: a PEFT LoRA adapter loaded onto the model to train (the base
frozen, AdamW over the adapters); grad. and param. then hold the adapters
only, named as in adapter_model.safetensors ("base_model.model.<module>.
lora_A.weight").
"""
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

model_dir, ids_file, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pad = int(sys.argv[5]) if len(sys.argv) > 5 else 0
device = sys.argv[6] if len(sys.argv) > 6 else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
adapter = sys.argv[7] if len(sys.argv) > 7 else ""
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(device)
if adapter:
    import peft
    model = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True).to(device)
model.train()
ids = load_file(ids_file)["ids"].to(device)
mask = torch.ones_like(ids)
labels = ids.clone()
if pad:
    mask[0, :pad] = 0
    labels[0, :pad + 1] = -100
trained = [(name.replace(".default", ""), p) for name, p in model.named_parameters() if p.requires_grad]
optimizer = torch.optim.AdamW([p for _, p in trained], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
result = {}
for step in range(steps):
    optimizer.zero_grad()
    output = model(ids, attention_mask=mask, labels=labels)
    output.loss.backward()
    if step == 0:
        result["logits"] = output.logits.detach().reshape(-1, model.config.vocab_size).clone().cpu().contiguous()
        result["loss"] = output.loss.detach().reshape(1).clone().cpu()
        for name, p in trained:
            result["grad." + name] = p.grad.detach().clone().cpu().contiguous()
    optimizer.step()
for name, p in trained:
    result["param." + name] = p.detach().clone().cpu().contiguous()
save_file(result, out)

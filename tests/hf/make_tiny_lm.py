"""Writes a tiny random transformers causal LM and the logits transformers
computes for random ids, for hf_transformers_test to compare dtrain against.

usage: make_tiny_lm.py OUT_DIR MODEL_TYPE KV_HEADS DTYPE SHARD_BYTES
  MODEL_TYPE: gpt2 (tied head) | llama | llama_tied | qwen2 | mistral | qwen3 (transformers 4.51+,
              head_dim 12) | gemma (tied) |
              (gemma: head_dim 6, gemma3: 12, so q is not hidden_size wide)
              gemma3 (tied; transformers 4.50+: three layers, local, global, local, with
              a sliding window of 3 keys, query_pre_attn_scalar 12, local rotary base 50
              and linear rope scaling by 2 on the global layer)
  KV_HEADS: the key/value heads of the Llama family (GPT-2 ignores it)
  DTYPE: float32 | bfloat16 | float16
  SHARD_BYTES: 0 for one model.safetensors, else save_pretrained's max_shard_size
Writes OUT_DIR/model (the checkpoint) and OUT_DIR/expected.safetensors:
ids int64 [2, 7] and logits float32 [14, vocab], computed in float32 from the
weights as saved (so a 16-bit checkpoint is compared after its rounding).
"""
import sys

import torch
import transformers
from safetensors.torch import save_file

out, model_type, kv_heads, dtype, shard = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
torch.manual_seed(1234)
common = dict(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=kv_heads, max_position_embeddings=16, rms_norm_eps=1e-5, rope_theta=500.0,
              tie_word_embeddings=False)


def gemma3_config():
    sizes = {k: v for k, v in common.items() if k not in ("rope_theta", "tie_word_embeddings")}
    sizes["num_hidden_layers"] = 3
    rope = dict(rope_theta=500.0, rope_local_base_freq=50.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    if int(transformers.__version__.split(".")[0]) >= 5:
        rope = {"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}}
    return transformers.Gemma3TextConfig(**sizes, **rope, head_dim=12, sliding_window=3, query_pre_attn_scalar=12,
                                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                         final_logit_softcapping=None, attn_logit_softcapping=None)


config = {"gpt2": lambda: transformers.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
          "llama": lambda: transformers.LlamaConfig(**common),
          "llama_tied": lambda: transformers.LlamaConfig(**dict(common, tie_word_embeddings=True)),
          "qwen2": lambda: transformers.Qwen2Config(**common, use_sliding_window=False),
          "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
          "gemma": lambda: transformers.GemmaConfig(**dict(common, tie_word_embeddings=True), head_dim=6),
          "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=12, use_sliding_window=False),
          "gemma3": lambda: gemma3_config()}[model_type]()
model = transformers.AutoModelForCausalLM.from_config(config)
with torch.no_grad():  # larger than the default init, so every weight shows in the logits
    for p in model.parameters():
        p.normal_(0.0, 0.2)
model = model.to(getattr(torch, dtype))
kwargs = {"safe_serialization": True}
if shard:
    kwargs["max_shard_size"] = shard
model.save_pretrained(out + "/model", **kwargs)

reloaded = transformers.AutoModelForCausalLM.from_pretrained(out + "/model", torch_dtype=torch.float32)
reloaded.eval()
ids = torch.randint(0, config.vocab_size, (2, 7))
with torch.no_grad():
    logits = reloaded(ids).logits.reshape(-1, config.vocab_size).contiguous()
save_file({"ids": ids.contiguous(), "logits": logits}, out + "/expected.safetensors")

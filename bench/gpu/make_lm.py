"""A randomly initialised transformers causal LM and a token stream, for the
GPU language-model benchmark (bench/run_gpu_bench.sh, part lm).

usage: make_lm.py OUT_DIR SHAPE TOKENS
  SHAPE   gpt2-124m  GPT-2 small: 12 layers, d 768, 12 heads, vocabulary 50257,
                     1024 positions, tied head (GPT2Config's defaults)
          llama-1b   a Llama-shaped 1.1B model: 22 layers, d 2048, 32 heads,
                     4 key/value heads, SwiGLU 5632, RMSNorm, RoPE, vocabulary
                     32000, 2048 positions, untied head
          gpt2-tiny, llama-tiny   the same families at a few layers of d 64 (smoke runs)
  TOKENS  how many random token ids to write (their content does not change
          the speed)
Writes OUT_DIR/model (save_pretrained, bfloat16, what train_lm model= and
from_pretrained read) and OUT_DIR/tokens.npy (int32), and prints the
parameter count N and the FLOPs per token (6 N + 12 layers d T, with N
without the position embeddings), as JSON on the last line.
"""

import json
import sys

import numpy as np
import torch
import transformers

SHAPES = {
    "gpt2-124m": lambda: transformers.GPT2Config(),
    "gpt2-tiny": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=512),
    "llama-1b": lambda: transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                                 num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                                 max_position_embeddings=2048, tie_word_embeddings=False),
    "llama-tiny": lambda: transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                                   max_position_embeddings=128, tie_word_embeddings=False),
}


def main():
    out, shape, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = SHAPES[shape]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out + "/model", safe_serialization=True)
    vocab = config.vocab_size
    np.save(out + "/tokens.npy", np.random.default_rng(0).integers(0, vocab, tokens, dtype=np.int32))
    n = sum(p.numel() for p in model.parameters())
    if shape.startswith("gpt2"):
        n -= model.transformer.wpe.weight.numel()
        layers, width, block = config.n_layer, config.n_embd, config.n_positions
    else:
        layers, width, block = config.num_hidden_layers, config.hidden_size, config.max_position_embeddings
    print(json.dumps({"params": n, "layers": layers, "width": width, "max_block": block, "vocab": vocab}))


if __name__ == "__main__":
    main()

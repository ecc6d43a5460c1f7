"""transformers' generate: the peer of dtrain::generate in the RL benchmark
(bench/run_rl_bench.sh).

usage: hf_generate.py --model-dir DIR --prompt-length L --batch B --new-tokens N --repeat R --json OUT

Loads the model of DIR (fp32, SDPA attention, eval mode) and continues B
copies of one prompt of L random ids by exactly N tokens (greedy, the
key-value cache on: generate's defaults, min_new_tokens = N so no sequence
stops early), R times after one warm-up call; the JSON has each call's
seconds, the median and tokens/s = B x N / median. Threads: OMP_NUM_THREADS.
"""

import argparse
import json
import os
import statistics
import time

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--model-dir", required=True)
parser.add_argument("--prompt-length", type=int, required=True)
parser.add_argument("--batch", type=int, required=True)
parser.add_argument("--new-tokens", type=int, required=True)
parser.add_argument("--repeat", type=int, required=True)
parser.add_argument("--json", required=True)
args = parser.parse_args()
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                          attn_implementation="sdpa").eval()
prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_length), generator=torch.Generator().manual_seed(0))
ids = prompt.repeat(args.batch, 1)


def run():
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                             min_new_tokens=args.new_tokens, do_sample=False, use_cache=True, pad_token_id=0)
    assert out.shape[1] == args.prompt_length + args.new_tokens
    return time.perf_counter() - start


run()
seconds = [run() for _ in range(args.repeat)]
median = statistics.median(seconds)
with open(args.json, "w") as f:
    json.dump({"seconds": seconds, "median_s": median, "tokens_per_s": args.batch * args.new_tokens / median,
               "torch": torch.__version__, "transformers": transformers.__version__}, f)

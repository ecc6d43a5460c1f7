#!/usr/bin/env bash
# Hugging Face model benchmark: train_lm on a GPT-2 124M-shaped and a ~100M
# Llama-shaped model (random weights from a config) against transformers +
# PyTorch DDP (gloo, CPU) on the same shapes, in the same run. Installs what
# is missing (python3-torch; transformers 4.40.2 into a venv beside the
# build) and builds its targets through scripts/setup.sh first (--no-setup:
# use BUILD_DIR as it is).
# usage: bench/run_hf_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# Models (config.json written here, no dropout, fp32, AdamW lr 1e-3 weight
# decay 0): gpt2-124m (n_embd 768, 12 layers, 12 heads, vocabulary 50257,
# tied head: 124,439,808 parameters) and llama-100m (hidden 768, 8 layers,
# 12 heads, 4 key/value heads, SwiGLU 2048, vocabulary 32000, untied head).
# Both sides: 2 ranks x cores/2 threads, DDP, batch 4 sequences of 128
# tokens per rank, random token ids, launched by dtrain-run. Each run reports
# rank 0's median step after the warm-up (2 steps of the default 8); the
# table shows the median of N runs (default 1; the side that starts swaps
# every run) and the ratio of tokens/s, dtrain over PyTorch.
# --smoke (bench/lib.sh): both models shrunk to 2 layers of width 64 and
# vocabulary 512, 3 steps, one run, the JSON in a temporary folder.
# Writes bench/results/hf.json (or --json PATH). About 6 minutes on 2 cores.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_hf_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=8
warmup=2
json=$repo/bench/results/hf.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
if ((smoke)); then
  steps=3
  warmup=1
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_lm=$build/examples/train_lm
cores=$(nproc)
ranks=2
block=128
batch=4

bench_build "python3-torch python3-venv" dtrain-run train_lm
bench_need "$launcher" "$train_lm"
bench_need_torch /usr/bin/python3
# transformers for the PyTorch side, in the venv the hf tests use (a smoke
# run without PyPI is skipped, as hf_transformers_test is).
venv=$build/tests/hf/venv
if ! "$venv/bin/python" -c "import transformers" 2> /dev/null; then
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$venv" ||
    bench_skip "cannot create a Python venv in $venv (python3-venv)"
  timeout 300 "$venv/bin/pip" install -q transformers==4.40.2 ||
    bench_skip "pip could not install transformers==4.40.2 into $venv (is PyPI reachable?)"
fi
python=$venv/bin/python

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The configs, and random token ids for train_lm (a .npy stream it cuts into windows).
gpt2_common='"model_type": "gpt2", "n_positions": 1024, "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": true'
llama_common='"model_type": "llama", "max_position_embeddings": 2048, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": false'
if ((smoke)); then
  gpt2="{$gpt2_common, \"vocab_size\": 512, \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4}"
  llama="{$llama_common, \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 160, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2}"
else
  gpt2="{$gpt2_common, \"vocab_size\": 50257, \"n_embd\": 768, \"n_layer\": 12, \"n_head\": 12}"
  llama="{$llama_common, \"vocab_size\": 32000, \"hidden_size\": 768, \"intermediate_size\": 2048, \"num_hidden_layers\": 8, \"num_attention_heads\": 12, \"num_key_value_heads\": 4}"
fi
for model in gpt2-124m llama-100m; do
  mkdir -p "$work/$model"
  if [[ $model == gpt2-124m ]]; then echo "$gpt2"; else echo "$llama"; fi > "$work/$model/config.json"
  "$python" -c "import json, sys, numpy as np
vocab = json.load(open(sys.argv[1]))['vocab_size']
np.save(sys.argv[2], np.random.default_rng(0).integers(0, vocab, 200000, dtype=np.int32))" \
    "$work/$model/config.json" "$work/$model.npy"
done

# run_one MODEL IMPL REPEAT
run_one() {
  local model=$1 impl=$2 i=$3
  local base=$work/$model.$impl.$i
  if [[ $impl == torch ]]; then
    launch $ranks "$base.log" "$python" "$repo/bench/hf/torch_ddp_hf.py" --model-dir "$work/$model" \
      --block-size $block --batch-size $batch --steps "$steps" --warmup $warmup --json "$base.json"
  else
    launch $ranks "$base.log" "$train_lm" config="$work/$model/config.json" data="$work/$model.npy" \
      block_size=$block batch_size=$batch steps="$steps" strategy=ddp precision=fp32 optimizer=adamw lr=0.001 \
      weight_decay=0 num_workers=0 log_every="$steps" eval_batches=0 metrics="$base.jsonl"
  fi
}

models=(gpt2-124m llama-100m)
echo "$steps steps per run, the first $warmup left out of the medians; $ranks ranks x $((cores / ranks > 0 ? cores / ranks : 1)) thread(s)"
for ((i = 1; i <= repeat; i++)); do
  order=(dtrain torch)
  ((i % 2 == 0)) && order=(torch dtrain)
  for model in "${models[@]}"; do
    echo "run $i/$repeat: $model: ${order[*]}"
    for impl in "${order[@]}"; do run_one "$model" "$impl" "$i"; done
  done
done

# Loading: the GPT-2 model as transformers saves it, loaded by train_lm at
# 2 ranks under fsdp-full (one step): each rank's peak resident set.
"$python" -c "import sys, transformers
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[2], safe_serialization=True)" \
  "$work/gpt2-124m" "$work/gpt2-124m-saved"
launch $ranks "$work/load.log" "$train_lm" model="$work/gpt2-124m-saved" data="$work/gpt2-124m.npy" \
  block_size=$block batch_size=$batch steps=1 strategy=fsdp-full num_workers=0 eval_batches=0

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/hf/summarize.py" "$work" --models "$(IFS=,; echo "${models[*]}")" --repeat "$repeat" \
  --warmup $warmup --ranks $ranks --threads $((cores / ranks > 0 ? cores / ranks : 1)) --json "$json"
bench_check_json

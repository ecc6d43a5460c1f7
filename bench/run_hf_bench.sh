#!/usr/bin/env bash
# Hugging Face model benchmark: train_lm on a GPT-2 124M-shaped and a ~100M
# Llama-shaped model (random weights from a config) against transformers +
# PyTorch DDP (gloo, CPU) on the same shapes, in the same run: Debian's
# torch 1.13 with transformers 4.40.2 (a venv beside the build), and the
# release users install from PyPI (the peer, bench_peer_python: torch 2.15,
# transformers 5.24) at its fastest eager settings, SDPA attention and the
# fused AdamW (DTRAIN_BENCH_PEER_COMPILE=1 adds the same under
# torch.compile). Installs what is missing and builds its targets through
# scripts/setup.sh first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_hf_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# Models (config.json written here, no dropout, fp32, AdamW lr 1e-3 weight
# decay 0): gpt2-124m (n_embd 768, 12 layers, 12 heads, vocabulary 50257,
# tied head: 124,439,808 parameters) and llama-100m (hidden 768, 8 layers,
# 12 heads, 4 key/value heads, SwiGLU 2048, vocabulary 32000, untied head).
# Both sides: DDP, batch 4 sequences per rank, random token ids, launched by
# dtrain-run with cores / ranks threads per rank. The grid, each a
# space-separated list in the environment:
#   DTRAIN_HF_BENCH_MODELS         gpt2-124m llama-100m
#   DTRAIN_HF_BENCH_RANKS          2 1        (2 x 1 thread and 1 x 2 threads on 2 cores)
#   DTRAIN_HF_BENCH_BLOCKS         128        (sequence length; 512 too for the long case)
#   DTRAIN_HF_BENCH_CHECKPOINTING  0          (1: activation checkpointing on both sides)
#   DTRAIN_HF_BENCH_LORA           0          (R: LoRA adapters of rank R, alpha 2R, on every
#                                             linear layer of the blocks, the rest frozen: train_lm's
#                                             lora_ keys against peft; the JSON defaults to lora.json)
# Each run reports rank 0's median step after the warm-up (2 steps of the
# default 8); the table shows the median of N runs (default 1; the order of
# the sides reverses every run) and the ratios of tokens/s, dtrain over each
# PyTorch side.
# --smoke (bench/lib.sh): both models shrunk to 2 layers of width 64 and
# vocabulary 512, 3 steps, one run at 2 ranks, no peer, the JSON in a
# temporary folder.
# Writes bench/results/hf.json (or --json PATH). The default grid takes
# about 12 minutes on 2 cores once the peer's venv exists (23 with checkpointing on and off).
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
batch=4
read -r -a models <<< "${DTRAIN_HF_BENCH_MODELS:-gpt2-124m llama-100m}"
read -r -a rank_list <<< "${DTRAIN_HF_BENCH_RANKS:-2 1}"
read -r -a blocks <<< "${DTRAIN_HF_BENCH_BLOCKS:-128}"
read -r -a ckpts <<< "${DTRAIN_HF_BENCH_CHECKPOINTING:-0}"
lora=${DTRAIN_HF_BENCH_LORA:-0}
[[ $lora =~ ^[0-9]+$ ]] || { echo "run_hf_bench.sh: DTRAIN_HF_BENCH_LORA takes a rank, not '$lora'" >&2; exit 2; }
((lora > 0)) && [[ $json == "$repo/bench/results/hf.json" ]] && json=$repo/bench/results/lora.json
if ((smoke)); then
  rank_list=(2)
  blocks=(128)
  ckpts=(0)
fi
for m in "${models[@]}"; do
  [[ $m == gpt2-124m || $m == llama-100m ]] || { echo "run_hf_bench.sh: unknown model '$m' in DTRAIN_HF_BENCH_MODELS (gpt2-124m, llama-100m)" >&2; exit 2; }
done
for n in "${rank_list[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_hf_bench.sh: DTRAIN_HF_BENCH_RANKS takes rank counts, not '$n'" >&2; exit 2; }; done
for b in "${blocks[@]}"; do [[ $b =~ ^[1-9][0-9]*$ ]] || { echo "run_hf_bench.sh: DTRAIN_HF_BENCH_BLOCKS takes sequence lengths, not '$b'" >&2; exit 2; }; done
for a in "${ckpts[@]}"; do [[ $a == 0 || $a == 1 ]] || { echo "run_hf_bench.sh: DTRAIN_HF_BENCH_CHECKPOINTING takes 0 and 1, not '$a'" >&2; exit 2; }; done

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
# peft for LoRA: without its dependencies, which would replace Debian's torch (hf_transformers_test does the same).
if ((lora > 0)) && ! "$venv/bin/python" -c "import peft" 2> /dev/null; then
  timeout 300 "$venv/bin/pip" install -q --no-deps peft==0.10.0 accelerate==0.29.3 jinja2==3.1.4 markupsafe==2.1.5 ||
    bench_skip "pip could not install peft==0.10.0 into $venv (is PyPI reachable?)"
fi
python=$venv/bin/python
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv
impls=(dtrain torch)
[[ -n $peer_python ]] && impls+=(peer)
[[ -n $peer_python && ${DTRAIN_BENCH_PEER_COMPILE:-0} == 1 ]] && impls+=(peer_compile)

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

# run_one MODEL IMPL RANKS BLOCK AC REPEAT: one side in one setting. The
# files are named <model>.<ranks>x.b<block>.ac<0|1>.<impl>.<repeat>.
run_one() {
  local model=$1 impl=$2 n=$3 block=$4 ac=$5 i=$6
  local base=$work/$model.${n}x.b$block.ac$ac.$impl.$i
  if [[ $impl != dtrain ]]; then
    local extra=() py=$python
    ((ac)) && extra=(--checkpointing)
    [[ $impl == peer* ]] && py=$peer_python && extra+=(--attention sdpa --fused-adamw)
    [[ $impl == peer_compile ]] && extra+=(--compile)
    ((lora > 0)) && extra+=(--lora-r "$lora" --lora-alpha $((2 * lora)))
    launch "$n" "$base.log" "$py" "$repo/bench/hf/torch_ddp_hf.py" --model-dir "$work/$model" \
      --block-size "$block" --batch-size $batch --steps "$steps" --warmup $warmup "${extra[@]}" --json "$base.json"
  else
    local flag=false adapters=()
    ((ac)) && flag=true
    ((lora > 0)) && adapters=(lora_r="$lora" lora_alpha=$((2 * lora)) lora_targets=all-linear)
    launch "$n" "$base.log" "$train_lm" config="$work/$model/config.json" data="$work/$model.npy" "${adapters[@]}" \
      block_size="$block" batch_size=$batch steps="$steps" strategy=ddp precision=fp32 optimizer=adamw lr=0.001 \
      weight_decay=0 num_workers=0 log_every="$steps" eval_batches=0 activation_checkpointing=$flag \
      metrics="$base.jsonl"
  fi
}

echo "$steps steps per run, the first $warmup left out of the medians; ranks ${rank_list[*]}; blocks ${blocks[*]};" \
  "checkpointing ${ckpts[*]}; sides ${impls[*]}"
for ((i = 1; i <= repeat; i++)); do
  # The order of the sides reverses every run: drift in the machine's load
  # spreads over all of them.
  order=("${impls[@]}")
  if ((i % 2 == 0)); then
    order=()
    for ((k = ${#impls[@]} - 1; k >= 0; k--)); do order+=("${impls[k]}"); done
  fi
  for model in "${models[@]}"; do
    for n in "${rank_list[@]}"; do
      for block in "${blocks[@]}"; do
        for ac in "${ckpts[@]}"; do
          echo "run $i/$repeat: $model, $n rank(s) x $((cores / n > 0 ? cores / n : 1)) thread(s), block $block," \
            "checkpointing $( ((ac)) && echo on || echo off): ${order[*]}"
          for impl in "${order[@]}"; do run_one "$model" "$impl" "$n" "$block" "$ac" "$i"; done
        done
      done
    done
  done
done

# Loading: the GPT-2 model as transformers saves it, loaded by train_lm at
# 2 ranks under fsdp-full (one step): each rank's peak resident set.
"$python" -c "import sys, transformers
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[2], safe_serialization=True)" \
  "$work/gpt2-124m" "$work/gpt2-124m-saved"
launch 2 "$work/load.log" "$train_lm" model="$work/gpt2-124m-saved" data="$work/gpt2-124m.npy" \
  block_size=128 batch_size=$batch steps=1 strategy=fsdp-full num_workers=0 eval_batches=0

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/hf/summarize.py" "$work" --models "$(IFS=,; echo "${models[*]}")" --repeat "$repeat" \
  --warmup $warmup --ranks "$(IFS=,; echo "${rank_list[*]}")" --blocks "$(IFS=,; echo "${blocks[*]}")" \
  --checkpointing "$(IFS=,; echo "${ckpts[*]}")" --impls "$(IFS=,; echo "${impls[*]}")" --cores "$cores" \
  --batch $batch --steps "$steps" --lora "$lora" --json "$json"
bench_check_json

#!/usr/bin/env bash
# Preference tuning, generation and online RL: train_lm objective=dpo,
# dtrain::generate and train_lm objective=grpo on a GPT-2 124M-shaped and a
# ~100M Llama-shaped model (random weights, saved by transformers), beside
# the release users install from PyPI in the same run (the peer,
# bench_peer_python: TRL 1.16 with torch 2.15 and transformers 5.24).
# Installs what is missing and builds its targets through scripts/setup.sh
# first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_rl_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
#   dpo       one DPO step (sigmoid, beta 0.1, full fine-tuning against a
#             frozen copy of the model as the reference), 2 pairs per rank,
#             prompts and completions of 64 random ids (sequences of 128),
#             fp32, AdamW, at 2 ranks x 1 thread and 1 rank x 2 threads:
#             train_lm (its median step plus its median reference forward,
#             which runs before the step) beside TRL's DPOTrainer.compute_loss
#             under PyTorch DDP over gloo with the fused AdamW
#             (bench/rl/trl_dpo_ddp.py, the whole step timed);
#   generate  32 new tokens after a prompt of 32, greedy, batch 1 and 16, one
#             process of 2 threads: dtrain::generate with its key-value cache
#             (train_lm generate= generate_batch=) beside transformers'
#             generate (bench/rl/hf_generate.py, SDPA, its cache);
#   grpo      train_lm objective=grpo (reward token:7, 4 completions of 32
#             tokens per prompt, 8 completions per rank, 2 ranks x 1
#             thread): prompts per second, sampling and training (dtrain
#             alone: TRL's GRPOTrainer is not run here).
# Each of the N repeats (default 1) runs every side once; the tables show
# medians, and the ratios are the peer's time over dtrain's (above 1:
# dtrain is faster). Writes bench/results/rl.json (or --json PATH). About
# 15 minutes on 2 cores once the peer's venv exists. --smoke (bench/lib.sh):
# both models 2 layers of width 64, vocabulary 512, 3 steps, 8 new tokens,
# no peer, the JSON in a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_rl_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=6
warmup=2
json=$repo/bench/results/rl.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
new_tokens=32
prompt=32
half=64
if ((smoke)); then
  steps=3
  warmup=1
  new_tokens=8
  prompt=8
  half=8
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_lm=$build/examples/train_lm
cores=$(nproc)

bench_build "python3-venv" dtrain-run train_lm
bench_need "$launcher" "$train_lm"
bench_peer_python  # empty in --smoke
# transformers saves the models: the peer's venv, or in a smoke run the
# torch2 set the tests made (skipped without it, as the tests are).
python=$peer_python
if [[ -z $python ]]; then
  python=${DTRAIN_PYTHON_TORCH2:-$build/python/torch2/bin/python}
  "$python" -c "import transformers" 2> /dev/null ||
    bench_skip "no Python with transformers at $python (the tests make the torch2 set: ctest -R python_env_torch2)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpt2_common='"model_type": "gpt2", "n_positions": 1024, "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": true'
llama_common='"model_type": "llama", "max_position_embeddings": 2048, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": false'
if ((smoke)); then
  gpt2="{$gpt2_common, \"vocab_size\": 512, \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4}"
  llama="{$llama_common, \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 160, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2}"
else
  gpt2="{$gpt2_common, \"vocab_size\": 50257, \"n_embd\": 768, \"n_layer\": 12, \"n_head\": 12}"
  llama="{$llama_common, \"vocab_size\": 32000, \"hidden_size\": 768, \"intermediate_size\": 2048, \"num_hidden_layers\": 8, \"num_attention_heads\": 12, \"num_key_value_heads\": 4}"
fi
models=(gpt2-124m llama-100m)
for model in "${models[@]}"; do
  mkdir -p "$work/$model.config"
  if [[ $model == gpt2-124m ]]; then echo "$gpt2"; else echo "$llama"; fi > "$work/$model.config/config.json"
  # Random weights saved by transformers; pairs and prompts of random ids; a token stream for train_lm's generate=.
  logged "$work/$model.make.log" "$python" - "$work/$model.config" "$work/$model" "$work/$model" "$half" "$prompt" <<'PY'
import json, sys
import numpy as np
import torch, transformers
config_dir, out, data, half, prompt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
config = transformers.AutoConfig.from_pretrained(config_dir)
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out, safe_serialization=True)
rng = np.random.default_rng(1)
v = config.vocab_size
with open(data + ".pairs.jsonl", "w") as f:
    for _ in range(64):
        ids = lambda n: rng.integers(2, v, n).tolist()
        f.write(json.dumps({"prompt_ids": ids(half), "chosen_ids": ids(half), "rejected_ids": ids(half)}) + "\n")
with open(data + ".prompts.jsonl", "w") as f:
    for _ in range(64):
        f.write(json.dumps({"prompt_ids": rng.integers(2, v, 8).tolist()}) + "\n")
np.save(data + ".npy", rng.integers(0, v, 4096, dtype=np.int32))
with open(data + ".prompt", "w") as f:
    f.write(",".join(str(x) for x in rng.integers(0, v, prompt).tolist()))
PY
done

impls=(dtrain)
[[ -n $peer_python ]] && impls+=(peer)
echo "$steps steps per DPO run, the first $warmup left out of the medians; sides ${impls[*]}"
for ((i = 1; i <= repeat; i++)); do
  for model in "${models[@]}"; do
    for n in 2 1; do
      echo "run $i/$repeat: dpo, $model, $n rank(s) x $((cores / n > 0 ? cores / n : 1)) thread(s)"
      for impl in "${impls[@]}"; do
        base=$work/dpo.$model.${n}x.$impl.$i
        if [[ $impl == dtrain ]]; then
          launch "$n" "$base.log" "$train_lm" model="$work/$model" data="$work/$model.pairs.jsonl" objective=dpo \
            reference=copy block_size=$((2 * half)) batch_size=2 steps="$steps" strategy=ddp precision=fp32 \
            optimizer=adamw lr=1e-6 weight_decay=0 num_workers=0 log_every="$steps" eval_batches=0 metrics="$base.jsonl"
        else
          launch "$n" "$base.log" "$peer_python" "$repo/bench/rl/trl_dpo_ddp.py" --model-dir "$work/$model" \
            --pairs "$work/$model.pairs.jsonl" --pairs-per-rank 2 --steps "$steps" --warmup $warmup --json "$base.json"
        fi
      done
    done
    for batch in 1 16; do
      echo "run $i/$repeat: generate, $model, batch $batch"
      for impl in "${impls[@]}"; do
        base=$work/generate.$model.b$batch.$impl.$i
        if [[ $impl == dtrain ]]; then
          launch 1 "$base.log" "$train_lm" model="$work/$model" data="$work/$model.npy" block_size=64 batch_size=1 \
            steps=1 lr=1e-9 num_workers=0 eval_batches=0 generate=$new_tokens generate_batch=$batch \
            prompt="$(cat "$work/$model.prompt")"
        else
          logged "$base.log" with_threads "$cores" "$peer_python" "$repo/bench/rl/hf_generate.py" \
            --model-dir "$work/$model" --prompt-length $prompt --batch $batch --new-tokens $new_tokens --repeat 3 \
            --json "$base.json"
        fi
      done
    done
    echo "run $i/$repeat: grpo, $model, 2 ranks"
    launch 2 "$work/grpo.$model.$i.log" "$train_lm" model="$work/$model" data="$work/$model.prompts.jsonl" \
      objective=grpo reward=token:7 num_generations=4 batch_size=8 max_new_tokens=$new_tokens \
      block_size=$((8 + new_tokens)) steps="$steps" lr=1e-6 num_workers=0 eval_batches=0 log_every="$steps"
  done
done

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/rl/summarize.py" "$work" --models "$(IFS=,; echo "${models[*]}")" --repeat "$repeat" \
  --warmup $warmup --steps "$steps" --cores "$cores" --impls "$(IFS=,; echo "${impls[*]}")" \
  --new-tokens $new_tokens --prompt $prompt --json "$json"
bench_check_json

#!/usr/bin/env bash
# Packed against padded instruction records: train_lm on SFT records whose
# lengths are drawn uniformly from 32 to 512 tokens (the first 16 of each a
# prompt without loss), once with one record per sequence padded to the
# block (packing=false) and once with the records packed end to end into
# blocks (packing=true: best fit by decreasing length, each record attending
# only to itself). Both runs: a Llama-shaped model (hidden 256, 4 layers, 8
# heads, 4 key/value heads, SwiGLU 688, vocabulary 8000; random weights from
# a config), block 512, batch 2 sequences per rank, 2 ranks x 1 thread (on 2
# cores), DDP, fp32, AdamW. Reported: the median step after the warm-up, the
# share of each block the records fill (train_lm's "packing:" line), and
# record tokens per second = ranks x batch x block x fill / step, the rate
# at which training gets through the data; the ratio is packed over padded.
# Installs what is missing and builds its targets through scripts/setup.sh
# first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_sft_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
# Each of the N repeats (default 3) runs both modes, their order swapped
# every repeat; the table shows medians. Writes bench/results/sft_packing.json
# (or --json PATH). About 4 minutes on 2 cores. --smoke (bench/lib.sh): a
# 1-layer model 64 wide, block 64, records of 8 to 64 tokens, 3 steps, one
# repeat, the JSON in a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_sft_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
steps=12
warmup=2
json=$repo/bench/results/sft_packing.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
block=512
shortest=32
records=800
config='{"model_type": "llama", "vocab_size": 8000, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": false}'
if ((smoke)); then
  steps=3
  warmup=1
  block=64
  shortest=8
  records=60
  config='{"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": false}'
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_lm=$build/examples/train_lm
cores=$(nproc)
ranks=2
batch=2

bench_build "" dtrain-run train_lm
bench_need "$launcher" "$train_lm"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "$config" > "$work/config.json"
# Records: lengths uniform in [shortest, block + 1] (train_lm keeps block + 1
# tokens of a record: block inputs, each with its next token), random ids.
/usr/bin/python3 - "$work/records.jsonl" "$records" "$shortest" "$((block + 1))" "$work/config.json" <<'PY'
import json, random, sys
out, n, lo, hi, cfg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
vocab = json.load(open(cfg))["vocab_size"]
rng = random.Random(0)
with open(out, "w") as f:
    for _ in range(n):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]
        f.write(json.dumps({"input_ids": ids, "prompt_length": min(16, len(ids) - 2)}) + "\n")
PY

run_one() {  # run_one MODE(padded|packed) REPEAT
  local mode=$1 i=$2 flag=false
  [[ $mode == packed ]] && flag=true
  launch "$ranks" "$work/$mode.$i.log" "$train_lm" config="$work/config.json" data="$work/records.jsonl" \
    block_size=$block batch_size=$batch steps="$steps" strategy=ddp precision=fp32 optimizer=adamw lr=0.001 \
    num_workers=0 log_every="$steps" eval_batches=0 packing=$flag metrics="$work/$mode.$i.jsonl"
}

echo "records of $shortest to $((block + 1)) tokens, block $block, $ranks ranks x $((cores / ranks > 0 ? cores / ranks : 1)) thread(s), batch $batch per rank; $steps steps, the first $warmup left out"
for ((i = 1; i <= repeat; i++)); do
  order=(padded packed)
  ((i % 2 == 0)) && order=(packed padded)
  echo "run $i/$repeat: ${order[*]}"
  for mode in "${order[@]}"; do run_one "$mode" "$i"; done
done

mkdir -p "$(dirname "$json")"
/usr/bin/python3 - "$work" "$repeat" "$warmup" "$json" "$block" "$batch" "$ranks" "$cores" "$shortest" "$records" "$steps" "$repo" <<'PY'
import json, os, re, statistics, sys
work, repeat, warmup, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
block, batch, ranks, cores, shortest, records, steps, repo = map(str, sys.argv[5:13])
sys.path.insert(0, os.path.join(repo, "bench"))
from machine import run_record  # noqa: E402
block, batch, ranks = int(block), int(batch), int(ranks)
fill = {}
with open(f"{work}/packed.1.log") as f:
    m = re.search(r"packing: (\d+) training records in (\d+) blocks of \d+ positions \(([\d.]+)% tokens, padded one per sequence ([\d.]+)%\)", f.read())
if not m:
    sys.exit("run_sft_bench.sh: no packing line in train_lm's log")
fill = {"packed": float(m.group(3)) / 100, "padded": float(m.group(4)) / 100}
result = {"records": int(m.group(1)), "packed_blocks": int(m.group(2)), "modes": {}}
for mode in ("padded", "packed"):
    runs = []
    for i in range(1, repeat + 1):
        with open(f"{work}/{mode}.{i}.jsonl") as f:
            ms = [json.loads(l)["step_ms"] for l in f if l.strip() and "step_ms" in json.loads(l)]
        runs.append(statistics.median(ms[warmup:]))
    step = statistics.median(runs)
    rate = ranks * batch * block * fill[mode] / (step / 1000)
    result["modes"][mode] = {"median_step_ms": step, "runs_ms": runs, "fill": fill[mode], "record_tokens_per_s": rate}
p, q = result["modes"]["packed"], result["modes"]["padded"]
result["packed_over_padded"] = round(p["record_tokens_per_s"] / q["record_tokens_per_s"], 3)
print(f"{'mode':<7} {'step ms':>9} {'fill':>6} {'record tokens/s':>16}")
for mode in ("padded", "packed"):
    r = result["modes"][mode]
    print(f"{mode:<7} {r['median_step_ms']:>9.1f} {100 * r['fill']:>5.1f}% {r['record_tokens_per_s']:>16.0f}")
print(f"packed / padded: {result['packed_over_padded']:.2f}x the record tokens per second "
      f"({result['records']} records in {result['packed_blocks']} blocks)")
doc = {**run_record(int(cores)),
       "method": f"train_lm, {ranks} ranks, DDP fp32 AdamW, batch {batch} x block {block} per rank; records of "
                 f"{shortest}..{block + 1} tokens (uniform, {records} records, the last tenth held out); median step "
                 f"over steps {warmup + 1}..{steps}, median of {repeat} runs; record tokens/s = ranks x batch x block x "
                 f"fill / step",
       **result}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
PY
bench_check_json

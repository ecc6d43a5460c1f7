#!/usr/bin/env bash
# Aimed activation checkpointing: memory and step time of train_lm on a
# GPT-2 124M-shaped model (random weights from a config: n_embd 768, 12
# layers, 12 heads, vocabulary 50257, tied head) with no checkpointing,
# every block recomputed (activation_checkpointing=true), every second block
# (checkpoint_every=2) and a memory budget (checkpoint_budget_mib: half of
# what checkpointing every block saves, as dtrain-estimate predicts it), 2
# ranks x 1 thread on 2 cores, DDP, fp32, AdamW, batch 4 x block 256 per
# rank, random token ids. Reported per mode: the median step after the
# warm-up, rank 0's activation bytes as the Trainer's allocator counts them
# (the metrics' memory record), dtrain-estimate's prediction of those for
# the same config (--example lm), and rank 0's peak resident set. Beside
# them, in the same run, the PyTorch users install (PyPI, bench/lib.sh's
# pins) on the same model and shapes through transformers, without and with
# its gradient checkpointing (every layer; transformers has no other
# choice), eager SDPA attention and the fused AdamW: its step and peak
# resident set.
# Installs what is missing and builds its targets through scripts/setup.sh
# first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_recompute_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
# Each of the N repeats (default 1) runs every mode, the order reversed
# every repeat; the table shows medians. Writes bench/results/activation_checkpointing.json
# (or --json PATH). About 6 minutes on 2 cores. --smoke (bench/lib.sh): a
# 4-layer model 64 wide, vocabulary 512, block 64, 3 steps, no peer, the
# JSON in a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_recompute_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=5
warmup=2
json=$repo/bench/results/activation_checkpointing.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
block=256
batch=4
gpt2_common='"model_type": "gpt2", "n_positions": 1024, "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": true'
config="{$gpt2_common, \"vocab_size\": 50257, \"n_embd\": 768, \"n_layer\": 12, \"n_head\": 12}"
if ((smoke)); then
  steps=3
  warmup=1
  block=64
  config="{$gpt2_common, \"vocab_size\": 512, \"n_embd\": 64, \"n_layer\": 4, \"n_head\": 4}"
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_lm=$build/examples/train_lm
estimate=$build/tools/dtrain-estimate
cores=$(nproc)
ranks=2

bench_build "" dtrain-run train_lm dtrain-estimate
bench_need "$launcher" "$train_lm" "$estimate"
bench_peer_python  # empty in --smoke
impls=(dtrain)
[[ -n $peer_python ]] && impls+=(peer)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/model"
echo "$config" > "$work/model/config.json"
/usr/bin/python3 -c "import json, sys, random
vocab = json.load(open(sys.argv[1]))['vocab_size']
rng = random.Random(0)
import array
ids = array.array('i', (rng.randrange(vocab) for _ in range(200000)))
with open(sys.argv[2], 'wb') as f:  # .npy: a 1-D int32 array
    header = \"{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }\" % len(ids)
    header += ' ' * (63 - (10 + len(header)) % 64) + '\n'
    f.write(b'\x93NUMPY\x01\x00' + len(header).to_bytes(2, 'little') + header.encode())
    f.write(ids.tobytes())" "$work/model/config.json" "$work/tokens.npy"

# The run's settings as a train_lm config: the estimate reads the same file.
cat > "$work/run.yaml" << EOF
config: $work/model/config.json
data: $work/tokens.npy
block_size: $block
batch_size: $batch
strategy: ddp
precision: fp32
optimizer: adamw
lr: 0.001
weight_decay: 0
num_workers: 0
eval_batches: 0
EOF
estimate_activations() {  # estimate_activations KEY=VALUE...: dtrain-estimate's activation bytes per rank
  "$estimate" --config "$work/run.yaml" --example lm --world $ranks "$@" --json |
    /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['strategies'][0]['activations'])"
}
none=$(estimate_activations)
every=$(estimate_activations activation_checkpointing=true)
budget_mib=$(/usr/bin/python3 -c "print(f'{($none - $every) / 2 / 1048576:.3f}')")
modes=(none every every2 budget)
mode_keys() {  # the train_lm keys of a mode
  case $1 in
    none) echo "activation_checkpointing=false" ;;
    every) echo "activation_checkpointing=true" ;;
    every2) echo "activation_checkpointing=true checkpoint_every=2" ;;
    budget) echo "activation_checkpointing=true checkpoint_budget_mib=$budget_mib" ;;
  esac
}

run_one() {  # run_one IMPL MODE REPEAT
  local impl=$1 mode=$2 i=$3 base=$work/$1.$2.$3
  if [[ $impl == peer ]]; then
    local extra=()
    [[ $mode == every ]] && extra=(--checkpointing)
    launch $ranks "$base.log" "$peer_python" "$repo/bench/hf/torch_ddp_hf.py" --model-dir "$work/model" \
      --block-size $block --batch-size $batch --steps "$steps" --warmup $warmup --attention sdpa --fused-adamw \
      "${extra[@]}" --json "$base.json"
  else
    # shellcheck disable=SC2046
    launch $ranks "$base.log" "$train_lm" --config "$work/run.yaml" steps="$steps" log_every="$steps" \
      metrics="$base.jsonl" $(mode_keys "$mode")
    estimate_activations $(mode_keys "$mode") > "$base.estimate"
  fi
}

echo "GPT-2 124M shape$( ((smoke)) && echo ' (smoke: shrunk)'), block $block, batch $batch per rank, $ranks ranks x" \
  "$((cores / ranks > 0 ? cores / ranks : 1)) thread(s); $steps steps, the first $warmup left out; budget $budget_mib MiB;" \
  "sides ${impls[*]}"
for ((i = 1; i <= repeat; i++)); do
  jobs=()
  for impl in "${impls[@]}"; do
    for mode in "${modes[@]}"; do
      [[ $impl == peer && $mode != none && $mode != every ]] && continue
      jobs+=("$impl:$mode")
    done
  done
  if ((i % 2 == 0)); then
    reversed=()
    for ((k = ${#jobs[@]} - 1; k >= 0; k--)); do reversed+=("${jobs[k]}"); done
    jobs=("${reversed[@]}")
  fi
  echo "run $i/$repeat: ${jobs[*]}"
  for job in "${jobs[@]}"; do run_one "${job%%:*}" "${job#*:}" "$i"; done
done

mkdir -p "$(dirname "$json")"
/usr/bin/python3 - "$work" "$repeat" "$warmup" "$json" "$block" "$batch" "$ranks" "$cores" "$steps" "$repo" \
  "$budget_mib" "${impls[*]}" "$smoke" << 'PY'
import json, os, statistics, sys
work, repeat, warmup, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
block, batch, ranks, cores, steps = map(int, sys.argv[5:10])
repo, budget_mib, impls, smoke = sys.argv[10], float(sys.argv[11]), sys.argv[12].split(), sys.argv[13] == "1"
sys.path.insert(0, os.path.join(repo, "bench"))
from machine import run_record  # noqa: E402
MIB = 1048576.0

def peak_rss(log):
    try:
        with open(log) as f:
            line = next(l for l in f if "peak resident memory (rank 0):" in l)
        return float(line.split(":")[-1].split()[0])
    except (OSError, StopIteration, ValueError):
        return None

modes = {"none": "no checkpointing", "every": "every block recomputed", "every2": "every second block recomputed",
         "budget": f"the fewest blocks within a {budget_mib:.1f} MiB budget"}
rows = []
for mode, what in modes.items():
    runs, acts, rss, est = [], [], [], None
    for i in range(1, repeat + 1):
        base = f"{work}/dtrain.{mode}.{i}"
        with open(base + ".jsonl") as f:
            records = [json.loads(l) for l in f if l.strip()]
        ms = [r["step_ms"] for r in records if "step_ms" in r]
        runs.append(statistics.median(ms[warmup:]))
        acts.append(next(r["memory"]["activations"] for r in records if "memory" in r))
        rss.append(peak_rss(base + ".log"))
        with open(base + ".estimate") as f:
            est = int(f.read())
    row = {"mode": mode, "what": what, "dtrain": {
        "median_step_ms": statistics.median(runs), "runs_ms": runs,
        "activations_bytes": int(statistics.median(acts)), "estimated_activations_bytes": est,
        "peak_rss_mib": statistics.median([r for r in rss if r is not None]) if any(r is not None for r in rss) else None}}
    if "peer" in impls and mode in ("none", "every"):
        peer = []
        for i in range(1, repeat + 1):
            with open(f"{work}/peer.{mode}.{i}.json") as f:
                peer.append(json.load(f))
        row["peer"] = {"median_step_ms": statistics.median(p["median_ms"] for p in peer),
                       "peak_rss_mib": statistics.median(p["peak_rss_mib"] for p in peer if p.get("peak_rss_mib")),
                       "torch": peer[0].get("torch"), "transformers": peer[0].get("transformers"),
                       "checkpointing": "every layer" if mode == "every" else "none"}
        row["step_ratio_vs_peer"] = round(row["peer"]["median_step_ms"] / row["dtrain"]["median_step_ms"], 3)
    rows.append(row)

base = rows[0]["dtrain"]
print(f"{'mode':<7} {'step ms':>9} {'activations MiB':>16} {'estimated':>10} {'peak RSS MiB':>13}"
      + (f" {'peer step ms':>13} {'peer RSS MiB':>13} {'x':>6}" if "peer" in impls else ""))
for r in rows:
    d = r["dtrain"]
    rss = f"{d['peak_rss_mib']:>13.0f}" if d["peak_rss_mib"] is not None else f"{'-':>13}"
    line = (f"{r['mode']:<7} {d['median_step_ms']:>9.1f} {d['activations_bytes'] / MIB:>16.1f} "
            f"{d['estimated_activations_bytes'] / MIB:>10.1f} {rss}")
    if "peer" in r:
        line += f" {r['peer']['median_step_ms']:>13.1f} {r['peer']['peak_rss_mib']:>13.0f} {r['step_ratio_vs_peer']:>5.2f}x"
    print(line)
print("activations: rank 0's, as the Trainer's allocator counts them (units' transient workspace included, which "
      "the estimate leaves out); x: the peer's step over dtrain's")
doc = {**run_record(cores),
       "smoke": smoke,
       "method": f"train_lm on a GPT-2 124M-shaped model (random weights from a config), {ranks} ranks x "
                 f"{max(1, cores // ranks)} thread(s), DDP fp32 AdamW, batch {batch} x block {block} per rank, "
                 f"random token ids; median step over steps {warmup + 1}..{steps}, median of {repeat} run(s); "
                 f"activations from the metrics' first memory record, estimated by dtrain-estimate --config "
                 f"--example lm for the same config; the peer (PyPI torch + transformers, SDPA, fused AdamW, "
                 f"DDP over gloo) without and with gradient checkpointing on every layer",
       "budget_mib": budget_mib,
       "rows": rows}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
PY
bench_check_json

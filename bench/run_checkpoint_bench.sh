#!/usr/bin/env bash
# Checkpoint benchmark: save and load time and bytes per rank of a ~300 MB
# training state (25M fp32 parameters + AdamW state), dtrain at 1, 2 and 3
# ranks under DDP and FSDP FullShard, sharded and consolidated, against
# torch.save / torch.load of the same state in the same run. Installs what is
# missing (python3-torch) and builds its targets through scripts/setup.sh.
# usage: bench/run_checkpoint_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
# Times are medians of N repetitions (default 3) within each run; the page
# cache is warm for loads (the files were just written), as after a restart
# on the same node. --no-setup: use BUILD_DIR as it is. --smoke
# (bench/lib.sh): a 2-layer stack 256 wide, one repetition, the JSON in a
# temporary folder.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_checkpoint_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/checkpoint.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
python=/usr/bin/python3  # Debian's torch lives there; another python3 may come first on PATH
hidden=2048  # 6 Linear layers 2048 wide: 25M parameters
layers=6
if ((smoke)); then
  hidden=256
  layers=2
fi

bench_build python3-torch dtrain-run bench_checkpoint
bench_need "$build/tools/dtrain-run" "$build/bench/checkpoint/bench_checkpoint"
bench_need_torch "$python"

work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-checkpoint-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
results=()
for n in 1 2 3; do
  for s in ddp fsdp-full; do
    echo "dtrain: $s at $n rank(s)..." >&2
    "$build/tools/dtrain-run" --nproc-per-node "$n" "$build/bench/checkpoint/bench_checkpoint" \
      --dir "$work" --strategy "$s" --hidden $hidden --layers $layers --repeat "$repeat" \
      --json "$work/$s.$n.json" > "$work/log" 2>&1 ||
      { cat "$work/log" >&2; exit 1; }
    results+=("$work/$s.$n.json")
  done
done
echo "torch.save / torch.load..." >&2
OMP_NUM_THREADS=$(nproc) "$python" "$repo/bench/checkpoint/torch_checkpoint.py" --dir "$work" --hidden $hidden \
  --layers $layers --repeat "$repeat" > "$work/torch.json"
mkdir -p "$(dirname "$json")"
"$python" - "$json" "$work/torch.json" "${results[@]}" <<'PY'
import json, sys, platform, os
out, torch_file, files = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [json.load(open(f)) for f in files]
torch = json.load(open(torch_file))
mb = lambda b: b / 2**20
print(f"\n{torch['parameters']:,} parameters; torch {torch['torch']} saves {mb(torch['bytes']):.1f} MiB "
      f"in {torch['save_s']:.2f} s ({torch['save_fsync_s']:.2f} s with fsync), loads in {torch['load_s']:.2f} s\n")
print("| strategy | ranks | save sharded s | save consolidated s | load sharded s | load consolidated s | "
      "MiB per rank (sharded) | model.safetensors MiB |")
print("|---|---:|---:|---:|---:|---:|---|---:|")
for r in rows:
    per = ", ".join(f"{mb(b):.1f}" for b in r["sharded_bytes_per_rank"])
    print(f"| {r['strategy']} | {r['ranks']} | {r['save_sharded_s']:.2f} | {r['save_consolidated_s']:.2f} | "
          f"{r['load_sharded_s']:.2f} | {r['load_consolidated_s']:.2f} | {per} | {mb(r['model_safetensors_bytes']):.1f} |")
print(f"| torch.save (+fsync) / torch.load | 1 | {torch['save_s']:.2f} ({torch['save_fsync_s']:.2f}) | | "
      f"{torch['load_s']:.2f} | | {mb(torch['bytes']):.1f} | |")
json.dump({"machine": {"nproc": os.cpu_count(), "platform": platform.platform()}, "dtrain": rows, "torch": torch},
          open(out, "w"), indent=1)
PY
bench_check_json

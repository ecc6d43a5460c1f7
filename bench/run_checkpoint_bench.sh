#!/usr/bin/env bash
# Checkpoint benchmark: save and load time and bytes per rank of a ~250 MB
# training state (21M fp32 parameters + AdamW state), dtrain at 1, 2 and 3
# ranks under DDP and FSDP FullShard, sharded and consolidated, against
# torch.save / torch.load of the same state in the same run
# (bench/checkpoint/torch_checkpoint.py) on two torches: the release users
# install today (the peer: PyPI, pinned in bench/lib.sh, in a venv
# bench_peer_python makes once; its defaults, and its fastest documented
# options as a row of their own: the save without the archive's CRC-32, the
# load memory-mapped with weights_only) and, for history, Debian's torch
# 1.13, which is all a --smoke run uses. Installs what is missing
# (python3-torch) and builds its targets through scripts/setup.sh.
# usage: bench/run_checkpoint_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
# Times are medians of N repetitions (default 3) within each run; the page
# cache is warm for loads (the files were just written), as after a restart
# on the same node. Writes bench/results/checkpoint.json (or --json PATH):
# key torch is Debian's torch, torch_peer the PyPI release. Under a minute
# on 2 cores with the default 3 repetitions. --no-setup: use
# BUILD_DIR as it is. --smoke (bench/lib.sh): a 2-layer stack 256 wide, one
# repetition, no peer, the JSON in a temporary folder.
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
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv

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
for side in torch peer; do
  py=$python
  [[ $side == peer ]] && py=$peer_python
  [[ -n $py ]] || continue
  echo "torch.save / torch.load ($side)..." >&2
  OMP_NUM_THREADS=$(nproc) "$py" "$repo/bench/checkpoint/torch_checkpoint.py" --dir "$work" --hidden $hidden \
    --layers $layers --repeat "$repeat" > "$work/$side.json"
done
mkdir -p "$(dirname "$json")"
DTRAIN_BENCH_DIR="$repo/bench" "$python" - "$json" "$work/torch.json" "$work/peer.json" "${results[@]}" <<'PY'
import json, sys, platform, os
sys.path.insert(0, os.environ["DTRAIN_BENCH_DIR"])
from machine import run_record  # noqa: E402  (bench/machine.py)
out, torch_file, peer_file, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = [json.load(open(f)) for f in files]
torch = json.load(open(torch_file))
peer = json.load(open(peer_file)) if os.path.exists(peer_file) else None
torches = [t for t in (torch, peer) if t]
mb = lambda b: b / 2**20
print(f"\n{torch['parameters']:,} parameters; torch " + "; torch ".join(
    f"{t['torch']} saves {mb(t['bytes']):.1f} MiB in {t['save_s']:.2f} s ({t['save_fsync_s']:.2f} s with fsync), "
    f"loads in {t['load_s']:.2f} s" for t in torches) + "\n")
print("| strategy | ranks | save sharded s | save consolidated s | load sharded s | load consolidated s | "
      "MiB per rank (sharded) | model.safetensors MiB |")
print("|---|---:|---:|---:|---:|---:|---|---:|")
for r in rows:
    per = ", ".join(f"{mb(b):.1f}" for b in r["sharded_bytes_per_rank"])
    print(f"| {r['strategy']} | {r['ranks']} | {r['save_sharded_s']:.2f} | {r['save_consolidated_s']:.2f} | "
          f"{r['load_sharded_s']:.2f} | {r['load_consolidated_s']:.2f} | {per} | {mb(r['model_safetensors_bytes']):.1f} |")
for t in torches:
    version = ".".join(t["torch"].split(".")[:2])
    for v in t.get("variants", [t]):
        save = ", ".join(f"{k}={x}" for k, x in v.get("save_options", {}).items())
        load = ", ".join(f"{k}={x}" for k, x in v.get("load_kwargs", {}).items())
        print(f"| torch {version} torch.save{' (' + save + ')' if save else ''} (+fsync) / torch.load({load}) | 1 | "
              f"{v['save_s']:.2f} ({v['save_fsync_s']:.2f}) | | {v['load_s']:.2f} | | {mb(v['bytes']):.1f} | |")
merged = {**run_record(os.cpu_count()),
          "torch_versions": {"debian": torch["torch"], "peer": peer["torch"] if peer else None,
                             "peer_source": "PyPI (bench/lib.sh's bench_peer_python), CPU side" if peer else None},
          "dtrain": rows, "torch": torch}
if peer:
    merged["torch_peer"] = peer
json.dump(merged, open(out, "w"), indent=1)
PY
bench_check_json

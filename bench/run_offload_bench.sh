#!/usr/bin/env bash
# Offload benchmark: train_gpt at 2 ranks under each strategy with its model
# states on the device (offload=none) and offloaded to host memory
# (offload=optimizer, and offload=params for FSDP), in the same run: the
# median step time (rank 0, after the warm-up), the overhead of each offload
# against none, and the memory split rank 0 measured (the `memory` and
# `host_memory` objects of train_gpt's last metrics record) beside
# dtrain-estimate's prediction for the same settings.
# On a Host device the offloaded states are separate buffers and every copy
# between them and the compute buffers is made (offload/arena.hpp), so the
# overhead is the copies' and the extra passes' cost; on a GPU the copies
# cross PCIe on a stream of their own. PyTorch's FSDP CPUOffload needs CUDA,
# so this host benchmark has no PyTorch side (the training benchmark compares
# the host AdamW with torch.optim.AdamW).
# Then (b): the optimizer state on disk (offload=nvme:DIR): bench_state_disk
# times AdamW over 50M elements with its moments in files in the work folder
# (each pass reading them from the disk and writing them back) against the
# state in memory, beside dd's direct-I/O write and read of 1 GiB there.
# usage: bench/run_offload_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
# Model: n_layer 4, n_embd 128, n_head 4, block 128, batch 8 per rank, AdamW,
# fp32; 40 steps (--steps), 10 of warm-up; N runs (default 3) alternate the
# settings, the table shows the median of the runs' medians. --smoke: a
# 1-layer model 32 wide, 3 steps, one run, the JSON in a temporary folder.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_offload_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
steps=40
warmup=10
json=$repo/bench/results/offload.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
n_layer=4
n_embd=128
n_head=4
block=128
batch=8
if ((smoke)); then
  steps=3
  warmup=1
  n_layer=1
  n_embd=32
  n_head=2
  block=32
  batch=2
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_gpt=$build/examples/train_gpt
estimate=$build/tools/dtrain-estimate
cores=$(nproc)
ranks=2

state_elements_m=50
dd_count=64  # x 16 MiB
if ((smoke)); then
  state_elements_m=2
  dd_count=4
fi
bench_build "" dtrain-run train_gpt dtrain-estimate bench_state_disk
bench_need "$launcher" "$train_gpt" "$estimate" "$build/bench/offload/bench_state_disk"

work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-offload-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

cases=(ddp:none ddp:optimizer zero1:none zero1:optimizer fsdp-full:none fsdp-full:optimizer fsdp-full:params)
for ((i = 1; i <= repeat; i++)); do
  for c in "${cases[@]}"; do
    s=${c%%:*}
    o=${c##*:}
    echo "run $i/$repeat: $s offload=$o..." >&2
    launch $ranks "$work/$s.$o.$i.log" "$train_gpt" strategy="$s" offload="$o" n_layer=$n_layer n_embd=$n_embd \
      n_head=$n_head block_size=$block batch_size=$batch steps=$steps optimizer=adamw lr=0.001 weight_decay=0 \
      num_workers=0 eval_batches=0 log_every=$steps metrics="$work/$s.$o.$i.jsonl"
  done
done

# The model's units as the estimate sees them: train_gpt's own config keys.
printf 'n_layer: %s\nn_embd: %s\nn_head: %s\nblock_size: %s\nbatch_size: %s\n' \
  $n_layer $n_embd $n_head $block $batch > "$work/gpt.yaml"
for c in "${cases[@]}"; do
  s=${c%%:*}
  o=${c##*:}
  "$estimate" --config "$work/gpt.yaml" --example gpt --world $ranks --strategy "$s" --offload "$o" --json \
    > "$work/estimate.$s.$o.json"
done

# (b) the state on disk, and the disk's own direct-I/O figures.
mkdir -p "$work/state"
echo "optimizer state on disk: $state_elements_m M elements..." >&2
with_threads "$cores" "$build/bench/offload/bench_state_disk" --dir "$work/state" --elements-m $state_elements_m \
  --iters "$((smoke ? 1 : 5))" --json "$work/state_disk.json"
dd if=/dev/zero of="$work/state/dd.bin" bs=16M count=$dd_count oflag=direct conv=fdatasync 2> "$work/dd_write.txt"
dd if="$work/state/dd.bin" of=/dev/null bs=16M iflag=direct 2> "$work/dd_read.txt"
rm -f "$work/state/dd.bin"

mkdir -p "$(dirname "$json")"
DTRAIN_BENCH_DIR="$repo/bench" /usr/bin/python3 - "$work" "$repeat" "$warmup" "$json" "$cores" "${cases[@]}" <<'PY'
import json, os, platform, re, sys, time
sys.path.insert(0, os.environ["DTRAIN_BENCH_DIR"])
from machine import run_record  # noqa: E402  (bench/machine.py)
work, repeat, warmup, out, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
cases = sys.argv[6:]
median = lambda v: sorted(v)[len(v) // 2]
states = ("params", "grads", "optimizer", "master")
rows = []
for c in cases:
    s, o = c.split(":")
    runs, last = [], None
    for i in range(1, repeat + 1):
        with open(os.path.join(work, f"{s}.{o}.{i}.jsonl")) as f:
            records = [json.loads(line) for line in f if line.strip()]
        steps = [r["step_ms"] for r in records if "step_ms" in r]
        runs.append(median(steps[warmup:]))
        last = [r for r in records if "memory" in r][-1]
    with open(os.path.join(work, f"estimate.{s}.{o}.json")) as f:
        est = json.load(f)["strategies"][0]
    measured_device = {k: last["memory"][k] for k in states}
    measured_host = {k: last.get("host_memory", {}).get(k, 0) for k in states}
    rows.append({"strategy": s, "offload": o, "runs_step_ms": runs, "step_ms": median(runs),
                 "device_model_states": measured_device, "host_model_states": measured_host,
                 "estimated_device": {k: est[k] for k in states}, "estimated_host": {k: est["host"][k] for k in states}})
base = {r["strategy"]: r["step_ms"] for r in rows if r["offload"] == "none"}
for r in rows:
    r["overhead_vs_none"] = round(r["step_ms"] / base[r["strategy"]] - 1, 4)
    r["estimate_exact"] = (r["device_model_states"] == r["estimated_device"]
                           and r["host_model_states"] == r["estimated_host"])
mib = lambda d: sum(d.values()) / 2**20
print("\n| strategy | offload | step ms (median) | vs none | device model states MiB | host MiB | "
      "= estimate |")
print("|---|---|---:|---:|---:|---:|---|")
for r in rows:
    print(f"| {r['strategy']} | {r['offload']} | {r['step_ms']:.2f} | {r['overhead_vs_none']:+.1%} | "
          f"{mib(r['device_model_states']):.2f} | {mib(r['host_model_states']):.2f} | "
          f"{'yes' if r['estimate_exact'] else 'NO'} |")
def dd_mb_per_s(name):
    text = open(os.path.join(work, name)).read()
    m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", text)
    return round(int(m.group(1)) / float(m.group(2)) / 1e6, 1)
disk = json.load(open(os.path.join(work, "state_disk.json")))
disk["dd_direct_write_mb_per_s"] = dd_mb_per_s("dd_write.txt")
disk["dd_direct_read_mb_per_s"] = dd_mb_per_s("dd_read.txt")
disk["share_of_dd"] = round(disk["state_disk_mb_per_s"] / ((disk["dd_direct_write_mb_per_s"] + disk["dd_direct_read_mb_per_s"]) / 2), 3)
print(f"\n(b) AdamW over {disk['elements'] // 1_000_000}M elements, state in memory {disk['memory_pass_ms']:.1f} ms, "
      f"on disk {disk['disk_pass_ms']:.1f} ms per pass: {disk['state_disk_mb_per_s']:.0f} MB/s of state read + written; "
      f"dd direct write {disk['dd_direct_write_mb_per_s']:.0f} MB/s, read {disk['dd_direct_read_mb_per_s']:.0f} MB/s "
      f"({disk['share_of_dd']:.0%} of their mean)")
result = {"benchmark": "offload", **run_record(cores), "ranks": 2, "repeat": repeat, "warmup_steps": warmup, "results": rows,
          "state_on_disk": disk}
with open(out, "w") as f:
    json.dump(result, f, indent=1)
bad = [r for r in rows if not r["estimate_exact"]]
if bad:
    sys.exit("run_offload_bench.sh: measured model states differ from dtrain-estimate's for "
             + ", ".join(f"{r['strategy']} offload={r['offload']}" for r in bad))
PY
bench_check_json

#!/usr/bin/env bash
# Strategy benchmark: per-rank memory and samples/s of every dtrain strategy
# at 1, 2 and 3 CPU ranks on one model, beside the ZeRO paper's memory model
# and PyTorch of the same model in the same run: the release users install
# today (the peer: PyPI, pinned in bench/lib.sh, in a venv bench_peer_python
# makes once; CPU, gloo), DDP and FSDP, and for history Debian's torch 1.13
# (DDP only: its FSDP does not run on the CPU), which is all a --smoke run
# uses. Installs what is missing (python3-torch) and builds its targets
# through scripts/setup.sh first.
# usage: bench/run_strategy_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
#
# Model: 256 features, hidden [1024, 1024, 1024], GELU, 10 classes (2,372,618
# parameters: model states of 36-54 MiB per unsharded rank dominate the
# 1 MiB of activations, and a gradient all-reduce moves 9.5 MB in fp32);
# precision bf16 (fp32 master weights and gradient reduction), AdamW, batch
# 64 per rank, num_workers=0. Per world size N, train_mlp runs ddp,
# fsdp-full, fsdp-grad-op, fsdp-no-shard, fsdp-hybrid with shard_group=N (one
# machine is one node: the default group, every rank in it) and, for N > 1,
# with shard_group=1 (N groups of one rank: sharding off, the replicas
# all-reduce), and zero1; then bench/training/torch_ddp_mlp.py with
# --precision bf16 (CPU autocast: oneDNN's bf16 GEMMs, fp32 parameters,
# gradients and all-reduce) and with fp32 (1.13: OpenBLAS's GEMMs; the
# peer: MKL's; dtrain's host device: oneDNN's bf16 GEMM where installed) to
# tell the GEMM library from the distributed step, on each
# torch; the peer at its fastest settings, AdamW's fused kernel
# (--fused-adamw). The peer also runs PyTorch FSDP
# (bench/strategies/torch_fsdp_probe.py --run: FSDP2 fully_shard on a CPU
# mesh, each Linear a unit, FSDP's bf16 mixed precision with fp32 shards and
# reduction, fused AdamW) with reshard_after_forward true (as fsdp-full) and
# false (as fsdp-grad-op); a world size where it fails is recorded, not
# fatal. Threads per rank: cores / N, at least 1 (OMP_NUM_THREADS and
# OPENBLAS_NUM_THREADS, both sides). Each of the N repeats (default 3) runs
# every implementation once, in an order rotated by one per repeat; each run
# reports the median step after $warmup warm-up steps (rank 0) and rank 0's
# memory: dtrain's by category, torch's as the bytes its model and optimizer
# tensors hold. Once per bench, bench/strategies/torch_fsdp_probe.py tries
# every PyTorch FSDP API on 2 ranks with each torch and records what runs and
# what stops it. bench/strategies/summarize.py prints the tables (median of
# the repeats) and writes bench/results/strategies.json (or --json PATH) with
# every run and both torch versions. About 10 minutes on 2 idle cores with
# the default 3 repeats and the peer, 18 beside a compile. --no-setup: use
# BUILD_DIR as it is. --smoke (bench/lib.sh): a 32-64-64-10 MLP, batch 8, 4
# steps, one repeat, Debian's torch only, the JSON in a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_strategy_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/strategies.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
launcher=$build/tools/dtrain-run
train_mlp=$build/examples/train_mlp
python=/usr/bin/python3  # Debian's torch lives there; another python3 may come first on PATH
cores=$(nproc)
steps=100
warmup=20
features=256
hidden=1024,1024,1024
classes=10
batch=64
samples=16384
if ((smoke)); then
  steps=4
  warmup=1
  features=32
  hidden=64,64
  batch=8
  samples=256
fi

# The project's set-up installs what is missing (Debian's python3-torch for
# the PyTorch side among it) and builds what the benchmark runs.
bench_build python3-torch dtrain-run train_mlp
bench_need "$launcher" "$train_mlp"
bench_need_torch "$python"
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv
peer_fsdp=fsdp2    # the FSDP API of the peer's rows (torch_fsdp_probe.py --run)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_one RANKS LABEL REPEAT: one implementation at one world size. LABEL is
# a train_mlp strategy, fsdp-hybrid-gK (shard_group=K), torch-ddp-PRECISION
# (Debian's torch), peer-ddp-PRECISION or peer-fsdp-SHARDING (the peer).
run_one() {
  local n=$1 label=$2 i=$3
  local base=$work/$label.$n.$i
  local shape=(--steps "$steps" --warmup "$warmup" --features "$features" --hidden "$hidden"
    --classes "$classes" --batch-size "$batch" --samples "$samples")
  case $label in
    torch-ddp-*)
      launch "$n" "$base.log" "$python" "$repo/bench/training/torch_ddp_mlp.py" "${shape[@]}" \
        --precision "${label#torch-ddp-}" --json "$base.json" ;;
    peer-ddp-*)
      launch "$n" "$base.log" "$peer_python" "$repo/bench/training/torch_ddp_mlp.py" "${shape[@]}" \
        --precision "${label#peer-ddp-}" --fused-adamw --json "$base.json" ;;
    peer-fsdp-*)
      # Not fatal: summarize.py reports a world size where it does not run.
      local t=$((cores / n > 0 ? cores / n : 1))
      with_threads "$t" "$launcher" --nproc-per-node "$n" timeout 300 "$peer_python" \
        "$repo/bench/strategies/torch_fsdp_probe.py" --run "$peer_fsdp-${label#peer-fsdp-}" "${shape[@]}" \
        --precision bf16 --json "$base.json" > "$base.log" 2>&1 ||
        echo "$label at $n rank(s) failed; its log: $base.log" >&2 ;;
    *)
      local strategy=$label group=()
      if [[ $label == fsdp-hybrid-g* ]]; then
        strategy=fsdp-hybrid
        group=(shard_group="${label#fsdp-hybrid-g}")
      fi
      # num_workers=0: batches are gathered between steps, outside the timed
      # step, as the torch script slices its batches outside its timing.
      launch "$n" "$base.log" "$train_mlp" strategy="$strategy" "${group[@]}" precision=bf16 \
        features=$features hidden=$hidden classes=$classes samples=$samples batch_size=$batch \
        optimizer=adamw lr=0.001 weight_decay=0 activation=gelu steps=$steps num_workers=0 \
        log_every=$steps metrics="$base.jsonl" ;;
  esac
}

for ((i = 1; i <= repeat; i++)); do
  for n in 1 2 3; do
    labels=(ddp fsdp-full fsdp-grad-op fsdp-no-shard "fsdp-hybrid-g$n")
    ((n > 1)) && labels+=(fsdp-hybrid-g1)
    labels+=(zero1 torch-ddp-bf16 torch-ddp-fp32)
    [[ -n $peer_python ]] && labels+=(peer-ddp-bf16 peer-ddp-fp32 peer-fsdp-full peer-fsdp-grad-op)
    # Rotating the order by one per repeat spreads any drift in the machine's
    # load over the implementations.
    k=${#labels[@]}
    order=()
    for ((j = 0; j < k; j++)); do order+=("${labels[(j + i - 1) % k]}"); done
    echo "run $i/$repeat: $n rank(s), $((cores / n > 0 ? cores / n : 1)) thread(s) each: ${order[*]}"
    for label in "${order[@]}"; do run_one "$n" "$label" "$i"; done
  done
done

echo "PyTorch FSDP probe, 2 ranks..."
for side in torch peer; do
  py=$python
  [[ $side == peer ]] && py=$peer_python
  [[ -n $py ]] || continue
  launch 2 "$work/${side}_fsdp_probe.log" timeout 300 "$py" "$repo/bench/strategies/torch_fsdp_probe.py" \
    --features $features --hidden $hidden --classes $classes --batch-size $batch \
    --json "$work/${side}_fsdp_probe.json"
done

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/strategies/summarize.py" "$work" --repeat "$repeat" --cores "$cores" --steps $steps \
  --warmup $warmup --features $features --hidden $hidden --classes $classes --batch $batch --json "$json"
bench_check_json

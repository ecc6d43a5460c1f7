#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: train_mlp with DDP
# on every local GPU, or on 2 CPU ranks (shared memory) when there is none. Extra
# arguments are passed to train_mlp as key=value overrides (e.g. steps=100).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DTRAIN_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh" train_mlp dtrain-run dtrain-doctor

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [[ "$gpus" -gt 0 ]] && grep -q "^DTRAIN_CUDA_ENABLED:INTERNAL=ON" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "dtrain demo: training on $gpus GPU(s) with NCCL"
  exec "$build/tools/dtrain-run" --nproc-per-node gpu \
    "$build/examples/train_mlp" --config "$root/examples/configs/ddp_gpu.yaml" "$@"
fi
echo "dtrain demo: no GPU found: training on 2 CPU ranks (shared memory)"
exec "$build/tools/dtrain-run" --nproc-per-node 2 \
  "$build/examples/train_mlp" --config "$root/examples/configs/ddp_host.yaml" "$@"

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
if [[ "$gpus" -gt 0 ]]; then
  # GPUs, but a build without CUDA: say what is missing.
  cache="$build/CMakeCache.txt"
  if ! command -v nvcc >/dev/null 2>&1 && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    why="no CUDA toolkit (nvcc) found: install it (NVIDIA's CUDA repository: apt-get install cuda-toolkit) and run this again"
  elif grep -q '^NCCL_INCLUDE_DIR:PATH=.*NOTFOUND' "$cache" 2>/dev/null; then
    why="CUDA found, NCCL missing: install NCCL (apt-get install libnccl2 libnccl-dev, or set NCCL_ROOT) and run this again"
  elif grep -q '^DTRAIN_CUDA:STRING=OFF' "$cache" 2>/dev/null; then
    why="the build was configured with DTRAIN_CUDA=OFF"
  else
    why="the build has no CUDA: see the CMake output above"
  fi
  echo "dtrain demo: $gpus GPU(s) here, but $why; training on 2 CPU ranks (shared memory) meanwhile"
else
  echo "dtrain demo: no GPU found: training on 2 CPU ranks (shared memory)"
fi
exec "$build/tools/dtrain-run" --nproc-per-node 2 \
  "$build/examples/train_mlp" --config "$root/examples/configs/ddp_host.yaml" "$@"

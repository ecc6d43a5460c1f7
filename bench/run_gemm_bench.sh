#!/usr/bin/env bash
# GEMM engine benchmark: the matrix products of a language model's training
# step (every Linear's forward, input-gradient and weight-gradient product,
# bench/gemm/gemm.cpp) through each engine a host build could use, at 1
# thread and at all cores, in the same run:
#   openblas-pthread  Debian's OpenBLAS, pthreads (what dtrain links today)
#   openblas-openmp   the same OpenBLAS built on OpenMP
#   blis-pthread      Debian's BLIS (its CBLAS layer)
#   onednn            Debian's oneDNN (dnnl_sgemm, OpenMP)
#   mkl               Intel MKL from PyPI (the `mkl` wheel in the peer's venv)
#   torch             torch.mm in the PyPI release (bench_peer_python: its
#                     bundled MKL), the engine the PyTorch peer's steps use
# Installs what is missing (libblis4-pthread, libopenblas0-openmp; the peer's
# venv and the mkl wheel once) and builds bench_gemm through scripts/setup.sh
# first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_gemm_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
#
# Models: gpt2-124m (12 layers of 768, MLP 3072, tied head over 50257
# tokens) and llama-100m (8 layers of 768, 4 key/value heads, SwiGLU 2048,
# 32000 tokens), 512 tokens per product (4 sequences of 128, what a rank
# holds in bench/run_hf_bench.sh). Each product: the median of N calls
# (default 5) after a warm-up whose result is checked against float64. The
# step's total is each product's median times its count per step; the
# table shows it per engine, model and thread count, and the speed-up over
# openblas-pthread. Writes bench/results/gemm.json (or --json PATH).
# --smoke: a tiny model, 16 tokens, 1 thread, the engines that are
# installed, no peer; the JSON in a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_gemm_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=5
json=$repo/bench/results/gemm.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
cores=$(nproc)
models=(gpt2-124m llama-100m)
tokens=512
threads=(1 "$cores")
((cores == 1)) && threads=(1)
if ((smoke)); then
  models=(tiny)
  tokens=16
  threads=(1)
fi

bench_build "libblis4-pthread libopenblas0-openmp" bench_gemm
bench_gemm=$build/bench/gemm/bench_gemm
bench_need "$bench_gemm"
bench_peer_python  # empty in --smoke
mkl_lib=""
if [[ -n $peer_python ]]; then
  peer_venv=$(dirname "$(dirname "$peer_python")")
  if ! compgen -G "$peer_venv/lib/libmkl_rt.so*" > /dev/null; then
    echo "run_gemm_bench.sh: installing the mkl wheel into $peer_venv (once)" >&2
    "$peer_python" -m pip install -q mkl || { echo "run_gemm_bench.sh: pip could not install mkl" >&2; exit 1; }
  fi
  mkl_lib=$(compgen -G "$peer_venv/lib/libmkl_rt.so*" | head -n 1)
fi

lib=/usr/lib/x86_64-linux-gnu
# name api library thread-variable
engines=(
  "openblas-pthread cblas $lib/openblas-pthread/libopenblas.so.0 OPENBLAS_NUM_THREADS"
  "openblas-openmp cblas $lib/openblas-openmp/libopenblas.so.0 OMP_NUM_THREADS"
  "blis-pthread cblas $lib/blis-pthread/libblis.so.4 BLIS_NUM_THREADS"
  "onednn dnnl $lib/libdnnl.so.2 OMP_NUM_THREADS"
)
[[ -n $mkl_lib ]] && engines+=("mkl cblas $mkl_lib MKL_NUM_THREADS")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
measured=()
for spec in "${engines[@]}"; do
  read -r name api path var <<< "$spec"
  if [[ ! -e $path ]]; then
    # Without --no-setup the packages are installed, so only a smoke run on
    # a machine without them gets here; the default engine must be there.
    [[ $name == openblas-pthread ]] && { echo "run_gemm_bench.sh: $path is missing" >&2; exit 1; }
    echo "run_gemm_bench.sh: $name left out: $path is not installed" >&2
    continue
  fi
  measured+=("$name")
  for model in "${models[@]}"; do
    for t in "${threads[@]}"; do
      echo "$name, $model, $t thread(s)"
      env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 BLIS_NUM_THREADS=1 MKL_NUM_THREADS=1 "$var=$t" \
        "$bench_gemm" --engine "$name" --library "$path" --api "$api" --model "$model" --tokens $tokens \
        --repeat "$repeat" --json "$work/$name.$model.$t.jsonl"
    done
  done
done
if [[ -n $peer_python ]]; then
  measured+=(torch)
  for model in "${models[@]}"; do
    for t in "${threads[@]}"; do
      echo "torch (PyPI), $model, $t thread(s)"
      OMP_NUM_THREADS=$t MKL_NUM_THREADS=$t "$peer_python" "$repo/bench/gemm/torch_gemm.py" --engine torch \
        --model "$model" --tokens $tokens --threads "$t" --repeat "$repeat" --json "$work/torch.$model.$t.jsonl"
    done
  done
fi

mkdir -p "$(dirname "$json")"
python3 "$repo/bench/gemm/summarize.py" "$work" --engines "$(IFS=,; echo "${measured[*]}")" \
  --models "$(IFS=,; echo "${models[*]}")" --threads "$(IFS=,; echo "${threads[*]}")" --tokens $tokens \
  --repeat "$repeat" --cores "$cores" --json "$json"
bench_check_json

#!/usr/bin/env bash
# GPU benchmarks, dtrain against PyTorch on the same GPU in the same run
# (docs/performance.md, "On a GPU"). Needs a CUDA build and a python3 whose
# torch sees the GPU (scripts/gpu_check.sh runs this as its bench stage).
# usage: bench/run_gpu_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
#
#  (a) bench_gpu_kernels against bench/gpu/torch_kernels_cuda.py: the fused
#      AdamW pass at 10M and 100M fp32 parameters, the fp32 -> bf16 cast, the
#      fp16 unscale with its non-finite check and the gradient norm, each as a
#      share of the copy bandwidth measured in the same process.
#  (b) train_mlp device=cuda (hidden [1024, 1024, 1024], GELU, batch 256,
#      AdamW, bf16 and fp32) against bench/training/torch_ddp_mlp.py --device
#      cuda, both at world size 1 through dtrain-run (NCCL), 300 steps.
#  (c) train_gpt device=cuda (6 layers, d 384, 6 heads, block 256, batch 16,
#      bf16, AdamW) against bench/gpt/torch_ddp_gpt.py --device cuda, 60 steps.
#  (d) language models through hf::CausalLm (train_lm device=cuda, bf16 with
#      fp32 master weights, AdamW) against transformers + PyTorch on the same
#      weights (bench/gpu/make_lm.py, bench/gpu/torch_lm.py): GPT-2 124M
#      (block 1024, batch 32) under DDP against PyTorch eager (SDPA, fused
#      AdamW) and torch.compile; a Llama-shaped 1.1B model (block 1024,
#      batch 8) under FSDP full shard with activation checkpointing off and
#      on; tokens/s and MFU (6N + 12 layers d T FLOPs per token over the
#      GPU's bf16 dense peak).
#  (e) the attention alone: bench_gpu_attention (cuDNN's fused attention as
#      dtrain calls it) against bench/gpu/torch_attention_cuda.py (SDPA's
#      flash backend), forward + backward, bf16, causal, T = 1024 and 4096,
#      12 heads of 64 and 8 of 128, TFLOP/s.
# (b), (c) and (d) alternate the implementations N times (default 3; torch.compile
# once); each run reports rank 0's median step after the warm-up, the tables
# the median of the N runs. bench/gpu/summarize.py prints the tables and
# writes the JSON (default bench/results/gpu.json), keeping the parts this
# run did not measure from the file as it was (each part records its own
# date, commit and dirty; the top level has this run's, bench/machine.py's
# run_record with the GPU and its driver). DTRAIN_GPU_BENCH_PARTS=kernels,mlp,gpt,lm,attention (the
# default: all) picks parts, so that a short GPU loan can run them one call each.
# dtrain's new GPU paths (docs/gpu.md, "Kernel paths") are taken from the
# environment as set, so the same script measures them on and off.
# --no-setup: use BUILD_DIR as it is.
# --smoke (bench/lib.sh): 1M-element kernels, a few steps of small models,
# one run, the JSON in a temporary folder; without a GPU (or a CUDA build)
# it exits 77, which CTest reports as skipped.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_gpu_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/gpu.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
launcher=$build/tools/dtrain-run
python=${DTRAIN_PYTHON:-python3}  # the one whose torch sees the GPU (as the tests name it)
cores=$(nproc)
kernels=()  # the benches' own defaults: 10M and 100M elements
mlp_steps=300
mlp_warmup=20
mlp_hidden=1024,1024,1024
mlp_batch=256
mlp_samples=65536
gpt_steps=60
gpt_warmup=10
gpt_layers=6
gpt_embd=384
gpt_heads=6
gpt_block=256
gpt_batch=16
if ((smoke)); then
  kernels=(--sizes-m 1 --iters 2)
  mlp_steps=5
  mlp_warmup=1
  mlp_hidden=64,64
  mlp_batch=32
  mlp_samples=1024
  gpt_steps=3
  gpt_warmup=1
  gpt_layers=1
  gpt_embd=64
  gpt_heads=2
  gpt_block=32
  gpt_batch=2
fi
lm_steps=40
lm_warmup=10
lm_gpt=(gpt2-124m 1024 32)   # shape, block, batch
lm_llama=(llama-1b 1024 8)
peak_tflops=989  # H100 and H200 SXM, bf16 dense
if ((smoke)); then
  lm_steps=4
  lm_warmup=1
  lm_gpt=(gpt2-tiny 64 4)
  lm_llama=(llama-tiny 64 4)
fi
gpt=("n_layer=$gpt_layers" "n_embd=$gpt_embd" "n_head=$gpt_heads" "block_size=$gpt_block" "batch_size=$gpt_batch")
parts=",${DTRAIN_GPU_BENCH_PARTS:-kernels,mlp,gpt,lm,attention},"
part() { [[ $parts == *",$1,"* ]]; }

# No GPU here (or no torch that sees one): a smoke run is skipped (77) before
# it builds anything, a full run fails.
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  bench_skip "no GPU that $python's torch sees (DTRAIN_PYTHON names the python to use)"
fi
bench_build "" dtrain-run train_mlp train_gpt train_lm bench_gpu_kernels bench_gpu_attention
[[ -x $build/bench/gpu/bench_gpu_kernels ]] ||
  bench_skip "no bench_gpu_kernels in $build: configure with CUDA (DTRAIN_CUDA=ON)"
bench_need "$launcher" "$build/examples/train_mlp" "$build/examples/train_gpt" "$build/examples/train_lm"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if part kernels; then
  echo "(a) kernels: dtrain, then PyTorch..."
  logged "$work/kernels_dtrain.log" "$build/bench/gpu/bench_gpu_kernels" "${kernels[@]}" \
    --json "$work/kernels_dtrain.json"
  logged "$work/kernels_torch.log" "$python" "$repo/bench/gpu/torch_kernels_cuda.py" "${kernels[@]}" \
    --json "$work/kernels_torch.json"
fi

attention=(--time 1024,4096)
((smoke)) && attention=(--time 128 --batch-tokens 512 --iters 2)
if part attention; then
  echo "(e) the attention alone: dtrain (cuDNN), then PyTorch (SDPA flash)..."
  [[ -x $build/bench/gpu/bench_gpu_attention ]] ||
    { echo "run_gpu_bench.sh: no bench_gpu_attention in $build: configure with DTRAIN_CUDNN=ON" >&2; exit 1; }
  for shape in "12 64" "8 128"; do
    set -- $shape
    logged "$work/attention_dtrain.$1.log" "$build/bench/gpu/bench_gpu_attention" "${attention[@]}" --heads "$1" \
      --head-dim "$2" --json "$work/attention_dtrain.$1x$2.json"
    logged "$work/attention_torch.$1.log" "$python" "$repo/bench/gpu/torch_attention_cuda.py" "${attention[@]}" \
      --heads "$1" --head-dim "$2" --json "$work/attention_torch.$1x$2.json"
  done
fi

vocab=0
if part gpt; then
  launch 1 "$work/vocab.log" "$build/examples/train_gpt" "${gpt[@]}" steps=1 num_workers=0 eval_batches=0 device=cuda
  vocab=$(sed -n 's/.*vocabulary \([0-9][0-9]*\).*/\1/p' "$work/vocab.log" | head -n 1)
  [[ -n $vocab ]] || { cat "$work/vocab.log" >&2; echo "run_gpu_bench.sh: no 'vocabulary V' from train_gpt" >&2; exit 1; }
fi

# lm_run NAME SHAPE BLOCK BATCH STRATEGY CHECKPOINTING RUN: one dtrain run of
# the model make_lm.py wrote into $work/NAME.
lm_run() {
  local name=$1 shape=$2 block=$3 batch=$4 strategy=$5 ckpt=$6 i=$7
  launch 1 "$work/lm.$name.dtrain.$i.log" "$build/examples/train_lm" model="$work/$shape/model" \
    data="$work/$shape/tokens.npy" device=cuda precision=bf16 strategy="$strategy" accumulate=1 \
    block_size="$block" batch_size="$batch" optimizer=adamw lr=0.0003 weight_decay=0.1 clip=1.0 \
    schedule=constant warmup_steps=0 steps=$lm_steps num_workers=2 eval_batches=0 log_every=10 \
    activation_checkpointing="$ckpt" peak_tflops=$peak_tflops metrics="$work/lm.$name.dtrain.$i.jsonl"
}
lm_torch() {  # lm_torch NAME SHAPE BLOCK BATCH RUN [--compile] [--checkpointing]
  local name=$1 shape=$2 block=$3 batch=$4 i=$5
  shift 5
  logged "$work/lm.$name.torch.$i.log" "$python" "$repo/bench/gpu/torch_lm.py" "$work/$shape/model" \
    "$work/$shape/tokens.npy" --batch "$batch" --block "$block" --steps $lm_steps --warmup $lm_warmup "$@" \
    --json "$work/lm.$name.torch.$i.json"
}
if part lm; then
  for shape in "${lm_gpt[0]}" "${lm_llama[0]}"; do
    mkdir -p "$work/$shape"
    logged "$work/$shape/make.log" "$python" "$repo/bench/gpu/make_lm.py" "$work/$shape" "$shape" 4000000
    tail -n 1 "$work/$shape/make.log" > "$work/$shape/shape.json"
  done
  echo "(d) torch.compile on ${lm_gpt[0]} (once: it compiles for minutes)..."
  lm_torch gpt2 "${lm_gpt[@]}" 1 --compile
  mv "$work/lm.gpt2.torch.1.json" "$work/lm.gpt2.compile.json"
fi

for ((i = 1; i <= repeat; i++)); do
  if part mlp; then
    echo "run $i/$repeat: (b) train_mlp and PyTorch, bf16 and fp32..."
    for prec in bf16 fp32; do
      launch 1 "$work/mlp.dtrain.$prec.$i.log" "$build/examples/train_mlp" device=cuda strategy=ddp precision=$prec \
        hidden=$mlp_hidden batch_size=$mlp_batch samples=$mlp_samples optimizer=adamw lr=0.001 weight_decay=0 \
        steps=$mlp_steps num_workers=0 log_every=100 metrics="$work/mlp.dtrain.$prec.$i.jsonl"
      launch 1 "$work/mlp.torch.$prec.$i.log" "$python" "$repo/bench/training/torch_ddp_mlp.py" --device cuda \
        --precision $prec --hidden $mlp_hidden --batch-size $mlp_batch --samples $mlp_samples --steps $mlp_steps \
        --warmup $mlp_warmup --json "$work/mlp.torch.$prec.$i.json"
    done
  fi
  if part gpt; then
    echo "run $i/$repeat: (c) train_gpt and PyTorch, bf16..."
    launch 1 "$work/gpt.dtrain.bf16.$i.log" "$build/examples/train_gpt" "${gpt[@]}" device=cuda strategy=ddp \
      precision=bf16 optimizer=adamw lr=0.001 weight_decay=0 clip=0 schedule=constant warmup_steps=0 \
      steps=$gpt_steps num_workers=0 eval_batches=0 log_every=20 metrics="$work/gpt.dtrain.bf16.$i.jsonl"
    launch 1 "$work/gpt.torch.bf16.$i.log" "$python" "$repo/bench/gpt/torch_ddp_gpt.py" --device cuda \
      --precision bf16 --vocab "$vocab" --n-layer $gpt_layers --n-embd $gpt_embd --n-head $gpt_heads \
      --block-size $gpt_block --batch-size $gpt_batch --steps $gpt_steps --warmup $gpt_warmup \
      --json "$work/gpt.torch.bf16.$i.json"
  fi
  if part lm; then
    echo "run $i/$repeat: (d) ${lm_gpt[0]} (DDP) and ${lm_llama[0]} (FSDP, checkpointing off and on), dtrain and PyTorch..."
    lm_run gpt2 "${lm_gpt[@]}" ddp false "$i"
    lm_torch gpt2 "${lm_gpt[@]}" "$i"
    lm_run llama "${lm_llama[@]}" fsdp-full false "$i"
    lm_torch llama "${lm_llama[@]}" "$i"
    lm_run llama_ckpt "${lm_llama[@]}" fsdp-full true "$i"
    lm_torch llama_ckpt "${lm_llama[@]}" "$i" --checkpointing
  fi
done

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/gpu/summarize.py" "$work" --repeat "$repeat" --mlp-warmup $mlp_warmup \
  --gpt-warmup $gpt_warmup --vocab "$vocab" --json "$json" --cores "$cores" --lm-warmup $lm_warmup --peak-tflops $peak_tflops \
  --lm-config "${lm_gpt[0]} block ${lm_gpt[1]} batch ${lm_gpt[2]} DDP; ${lm_llama[0]} block ${lm_llama[1]} batch ${lm_llama[2]} FSDP full shard; bf16, AdamW, $lm_steps steps, warm-up $lm_warmup" \
  --mlp-config "hidden $mlp_hidden, GELU, batch $mlp_batch, AdamW, $mlp_steps steps, warm-up $mlp_warmup" \
  --gpt-config "$gpt_layers layers, d $gpt_embd, $gpt_heads heads, block $gpt_block, batch $gpt_batch, AdamW, $gpt_steps steps, warm-up $gpt_warmup"
bench_check_json

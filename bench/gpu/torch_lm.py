"""PyTorch's side of the GPU language-model benchmark (bench/run_gpu_bench.sh,
part lm): the model bench/gpu/make_lm.py wrote, trained on one GPU as a
PyTorch user would at their fastest settings, timed like train_lm's step_ms.

  - transformers' AutoModelForCausalLM with SDPA attention (flash on a
    Hopper GPU), float32 weights, torch.autocast("cuda", bfloat16): bf16
    compute with fp32 master weights, what dtrain's Precision<bf16> does;
  - torch.optim.AdamW(fused=True), lr 3e-4, weight decay 0.1;
  - --compile: the model through torch.compile (default mode), its compile
    steps excluded by the warm-up;
  - --checkpointing: transformers' gradient checkpointing (non-reentrant).

Data: rows of --block tokens from TOKENS, --batch per step, copied to the
GPU in the step; the step ends with loss.item(), which waits for the GPU.
The JSON has every step's time, the median after --warmup steps,
tokens/s and the peak GPU memory (torch.cuda.max_memory_allocated).

usage: torch_lm.py MODEL_DIR TOKENS --batch B --block T --steps S --warmup W [--compile] [--checkpointing] --json OUT
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch
import transformers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("tokens")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--block", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--json", required=True)
    a = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = True  # PyTorch users' usual setting; bf16 GEMMs are unaffected
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                                              attn_implementation="sdpa").cuda()
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    step_model = torch.compile(model) if a.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    ids = np.load(a.tokens)
    rows = len(ids) // a.block
    data = torch.from_numpy(ids[: rows * a.block].astype(np.int64)).view(rows, a.block)

    times = []
    for step in range(a.steps):
        first = (step * a.batch) % (rows - a.batch)
        torch.cuda.synchronize()
        start = time.perf_counter()
        batch = data[first:first + a.batch].cuda(non_blocking=False)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        loss.item()
        times.append((time.perf_counter() - start) * 1000)
    median = statistics.median(times[a.warmup:])
    result = {"implementation": f"PyTorch {torch.__version__}, transformers {transformers.__version__}, SDPA, "
                                f"bf16 autocast, fused AdamW" + (", torch.compile" if a.compile else "") +
                                (", gradient checkpointing" if a.checkpointing else ""),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformers": transformers.__version__, "step_ms": times, "median_step_ms": median,
              "tokens_per_s": a.batch * a.block / (median / 1000),
              "peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20}
    with open(a.json, "w") as f:
        json.dump(result, f)
    print(f"{result['implementation']}: median step {median:.2f} ms, {result['tokens_per_s']:.0f} tokens/s")


if __name__ == "__main__":
    main()

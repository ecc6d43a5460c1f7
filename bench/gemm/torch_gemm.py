"""PyTorch's side of the GEMM engine benchmark (bench/run_gemm_bench.sh):
the same products as bench_gemm through torch.mm, in the same JSON lines.

usage: torch_gemm.py --engine NAME --model gpt2-124m|llama-100m|tiny --tokens M --threads T
                     [--repeat N] [--json PATH]

torch.mm on transposed views hands the transposes to its BLAS (MKL in the
x86-64 wheels from PyPI, OpenBLAS in Debian's build) without copying.
"""

import argparse
import json
import statistics
import time

import torch

LINEARS = {
    "gpt2-124m": [("attn.qkv", 768, 2304, 12), ("attn.proj", 768, 768, 12), ("mlp.fc", 768, 3072, 12),
                  ("mlp.proj", 3072, 768, 12), ("lm_head", 768, 50257, 1)],
    "llama-100m": [("q_proj", 768, 768, 8), ("k_proj", 768, 256, 8), ("v_proj", 768, 256, 8),
                   ("o_proj", 768, 768, 8), ("gate_proj", 768, 2048, 8), ("up_proj", 768, 2048, 8),
                   ("down_proj", 2048, 768, 8), ("lm_head", 768, 32000, 1)],
    "tiny": [("fc", 64, 96, 2), ("head", 64, 128, 1)],
}

p = argparse.ArgumentParser()
p.add_argument("--engine", required=True)
p.add_argument("--model", required=True, choices=sorted(LINEARS))
p.add_argument("--tokens", type=int, required=True)
p.add_argument("--threads", type=int, required=True)
p.add_argument("--repeat", type=int, default=5)
p.add_argument("--json")
args = p.parse_args()
torch.set_num_threads(args.threads)
gen = torch.Generator().manual_seed(7)
lines, step_ms, step_flops = [], 0.0, 0.0
for name, k, n, per_step in LINEARS[args.model]:
    m = args.tokens
    x = torch.rand(m, k, generator=gen) * 2 - 1
    w = torch.rand(n, k, generator=gen) * 2 - 1
    dy = torch.rand(m, n, generator=gen) * 2 - 1
    for what, fn, dims in (("forward", lambda: torch.mm(x, w.t()), (m, n, k)),
                           ("input", lambda: torch.mm(dy, w), (m, k, n)),
                           ("weight", lambda: torch.mm(dy.t(), x), (n, k, m))):
        c = fn()  # warm-up, and the check of 8 rows of the result against float64
        rows = torch.randint(0, dims[0], (8,), generator=gen)
        a_rows, b = {"forward": lambda: (x[rows], w.t()), "input": lambda: (dy[rows], w),
                     "weight": lambda: (dy.t()[rows], x)}[what]()
        want = a_rows.double() @ b.double()
        scale = a_rows.double().abs() @ b.double().abs()
        err = ((c[rows].double() - want).abs() / scale.clamp_min(1e-30)).max().item()
        if not err <= 1e-4:
            raise SystemExit(f"torch_gemm.py: {name} {what}: relative error {err} against float64")
        ms = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1000.0)
        median = statistics.median(ms)
        flops = 2.0 * dims[0] * dims[1] * dims[2]
        step_ms += median * per_step
        step_flops += flops * per_step
        lines.append({"engine": args.engine, "model": args.model, "tokens": m, "linear": name, "product": what,
                      "m": dims[0], "n": dims[1], "k": dims[2], "per_step": per_step, "median_ms": round(median, 4),
                      "gflops": round(flops / median / 1e6, 2), "max_rel_error": err})
lines.append({"engine": args.engine, "model": args.model, "tokens": args.tokens, "linear": "step", "product": "all",
              "median_ms": round(step_ms, 3), "gflops": round(step_flops / step_ms / 1e6, 2),
              "torch": torch.__version__, "blas": "mkl" if torch.backends.mkl.is_available() else "other"})
text = "".join(json.dumps(line) + "\n" for line in lines)
if args.json:
    with open(args.json, "w") as f:
        f.write(text)
else:
    print(text, end="")

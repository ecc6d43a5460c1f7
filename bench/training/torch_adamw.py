"""torch.optim.AdamW over one flat fp32 tensor, timed like bench_adamw.

The same sizes, hyper-parameters and accounting as bench/training/adamw.cpp:
one untimed step, then the median of --iters steps; GB/s counts the bytes the
update needs (read param, grad, m, v; write param, m, v: 28 bytes per
element), whatever extra passes an implementation makes. Every CPU
implementation the running torch has is measured: the single-tensor loop
(foreach=False), the multi-tensor one (foreach=True) and, from torch 2.4, the
fused kernel (fused=True, PyTorch's fastest; torch 1.13 has none).

Threads: OMP_NUM_THREADS (intra-op) and OPENBLAS_NUM_THREADS, set by the
caller to what dtrain gets (bench/run_training_bench.sh does).
"""

import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402


def median_ms(iters, fn):
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]  # the C++ bench's median


VARIANTS = {"single-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def make(n, variant):
    gen = torch.Generator().manual_seed(1)
    param = torch.nn.Parameter(torch.randn(n, generator=gen))
    param.grad = torch.randn(n, generator=gen) * 1e-2
    return param, torch.optim.AdamW([param], lr=1e-3, weight_decay=1e-2, **VARIANTS[variant])


def has_fused():
    """Whether this torch runs AdamW(fused=True) on CPU tensors (torch >= 2.4)."""
    try:
        param, opt = make(8, "fused")
        opt.step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def measure(n, variant, iters):
    param, opt = make(n, variant)
    ms = median_ms(iters, opt.step)
    del opt, param
    return ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-m", default="10,100", help="sizes in millions of elements")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--json", help="write the results here (default: stdout)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    variants = ["single-tensor", "foreach"] + (["fused"] if has_fused() else [])
    rows = []
    for n in (int(s) * 1_000_000 for s in args.sizes_m.split(",")):
        for variant in variants:
            ms = measure(n, variant, args.iters)
            rows.append({"elements": n, "variant": variant, "adamw_ms": round(ms, 3),
                         "adamw_gbps": round(28 * n / ms / 1e6, 3)})
    result = {"implementation": f"torch.optim.AdamW, torch {torch.__version__}", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "iters": args.iters, "results": rows}
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()

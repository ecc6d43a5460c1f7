"""PyTorch's counterparts of bench_gpu_kernels, timed the same way.

The same passes over the same sizes, each run --iters times after 3 warm-ups
and timed alone between two CUDA events; the median is reported, with bytes
counted as bench/gpu/kernels_cuda.cu counts them:
  copy          dst.copy_(src), fp32
  adamw         torch.optim.AdamW(fused=True).step() on one fp32 parameter
                (PyTorch's fastest AdamW: one fused multi-tensor kernel)
  adamw_groups  the same over two parameter groups (1/64 of the elements
                without weight decay, as biases and norms), counted with
                dtrain's 29 bytes per element (its group id)
  cast_bf16     dst_bf16.copy_(param_fp32)
  unscale_fp16  torch._amp_foreach_non_finite_check_and_unscale_ on an fp16
                gradient (what GradScaler.unscale_ runs: one pass that scales
                and flags non-finite values; counted with dtrain's 6 bytes per
                element so the GB/s compare time for the same job)
  grad_norm     torch.linalg.vector_norm(grad), fp32
"""

import argparse
import json

import torch


def median_ms(iters, fn):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-m", default="10,100")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    dev = torch.device("cuda")
    rows = []
    for n in [int(s) * 1_000_000 for s in args.sizes_m.split(",")]:
        values = (torch.arange(n, device=dev) % 2001 - 1000).float() * 0.001 + 1e-4
        param = torch.nn.Parameter(values.clone())
        grad = values.clone()
        dst = torch.empty_like(grad)
        half = torch.empty(n, dtype=torch.bfloat16, device=dev)
        g16 = grad.half()
        found_inf = torch.zeros(1, device=dev)
        inv_scale = torch.ones(1, device=dev)
        opt = torch.optim.AdamW([param], lr=1e-4, fused=True)
        param.grad = grad

        rows.append(("copy", n, median_ms(args.iters, lambda: dst.copy_(grad)), 8 * n))
        rows.append(("adamw", n, median_ms(args.iters, opt.step), 28 * n))
        small = n // 64
        w = torch.nn.Parameter(values[small:].clone())
        b = torch.nn.Parameter(values[:small].clone())
        w.grad, b.grad = grad[small:].clone(), grad[:small].clone()
        grouped = torch.optim.AdamW([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                                    lr=1e-4, fused=True)
        rows.append(("adamw_groups", n, median_ms(args.iters, grouped.step), 29 * n))
        del grouped, w, b
        rows.append(("cast_bf16", n, median_ms(args.iters, lambda: half.copy_(param.detach())), 6 * n))
        rows.append(("unscale_fp16", n,
                     median_ms(args.iters,
                               lambda: torch._amp_foreach_non_finite_check_and_unscale_([g16], found_inf, inv_scale)),
                     6 * n))
        rows.append(("grad_norm", n, median_ms(args.iters, lambda: torch.linalg.vector_norm(grad)), 4 * n))
        del opt, param, grad, dst, half, g16
        torch.cuda.empty_cache()

    name = torch.cuda.get_device_name(0)
    print(f"PyTorch {torch.__version__} kernels on {name}, median of {args.iters} runs each")
    print(f"{'pass':<14} {'elements':>12} {'ms':>10} {'GB/s':>10} {'of copy bw':>14}")
    copy = 0.0
    out = []
    for p, n, ms, b in rows:
        gbps = b / (ms * 1e-3) / 1e9
        if p == "copy":
            copy = gbps
        print(f"{p:<14} {n:>12} {ms:>10.4f} {gbps:>10.1f} {100 * gbps / copy:>13.1f}%")
        out.append({"pass": p, "elements": n, "ms": ms, "bytes": b, "gbps": gbps})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"implementation": "torch", "version": torch.__version__, "device": name,
                       "iters": args.iters, "rows": out}, f)


if __name__ == "__main__":
    main()

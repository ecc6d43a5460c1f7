"""PyTorch's counterpart of bench_gpu_attention: scaled_dot_product_attention
with its flash backend, forward + backward, bf16, causal, on the same
problems (q, k, v views of one [B, T, 3, H, d] tensor, as transformers'
GPT-2 splits its fused projection), timed the same way and counted with the
same FLOPs (3.5 * 2 B H T^2 d).

usage: torch_attention_cuda.py [--time 1024,4096] [--batch-tokens 16384] [--heads 12] [--head-dim 64]
                               [--iters N] [--json PATH]
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


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
    p = argparse.ArgumentParser()
    p.add_argument("--time", default="1024,4096")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args()
    rows = []
    name = torch.cuda.get_device_name(0)
    print(f"PyTorch {torch.__version__} SDPA (flash) forward + backward on {name}, bf16, causal")
    for t in [int(x) for x in a.time.split(",")]:
        b, h, d = max(1, a.batch_tokens // t), a.heads, a.head_dim
        qkv = (torch.arange(b * t * 3 * h * d, device="cuda") % 201 - 100).to(torch.bfloat16).mul_(0.01)
        qkv = qkv.view(b, t, 3, h, d).requires_grad_()
        dout = torch.ones(b, h, t, d, device="cuda", dtype=torch.bfloat16) * 0.01

        def step():
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dout)

        ms = median_ms(a.iters, step)
        tflops = 3.5 * 2 * b * h * t * t * d / (ms * 1e-3) / 1e12
        print(f"{t:>8} {b:>6} {ms:>12.3f} {tflops:>12.1f}")
        rows.append({"time": t, "batch": b, "heads": h, "head_dim": d, "ms": ms, "tflops": tflops})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"implementation": f"PyTorch {torch.__version__} SDPA (flash)", "device": name, "rows": rows}, f)


if __name__ == "__main__":
    main()

"""The PyTorch side of conv_torch_test: torch.nn.functional.conv2d in
float64 and its gradients by autograd, on the inputs the test gives.

  conv_torch.py IN OUT    IN: JSON {cases: [{x, weight, bias or null, dy,
                          shape: [N, C, H, W], weight_shape, stride, padding,
                          groups}]}; OUT: JSON [{y, dx, dweight, dbias}]
"""
import json
import sys

import torch


def run(case):
    t = lambda v, shape: torch.tensor(v, dtype=torch.float64).reshape(shape).requires_grad_(True)
    x = t(case["x"], case["shape"])
    w = t(case["weight"], case["weight_shape"])
    b = t(case["bias"], [case["weight_shape"][0]]) if case["bias"] is not None else None
    y = torch.nn.functional.conv2d(x, w, b, stride=case["stride"], padding=case["padding"], groups=case["groups"])
    y.backward(torch.tensor(case["dy"], dtype=torch.float64).reshape(y.shape))
    flat = lambda v: v.detach().reshape(-1).tolist()
    return {"y": flat(y), "dx": flat(x.grad), "dweight": flat(w.grad), "dbias": flat(b.grad) if b is not None else []}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)["cases"]
    with open(sys.argv[2], "w") as f:
        json.dump([run(c) for c in cases], f)


if __name__ == "__main__":
    main()

"""train_gpt and train_policy give PyTorch's losses and
parameters from the same initial weights. The C++ side (models_test) runs the
example with init_from=INIT, metrics=..., save_params=... and
dump_batches=DIR; this script replays the same micro-batches through the same
model written in PyTorch, in float64, and prints how far dtrain's per-step
losses and final parameters are from it:

  parity.py gpt|policy INIT DUMP_DIR METRICS PARAMS key=value...
      keys: lr, weight_decay, no_decay (default true), n_head (gpt), accumulate
  prints {"steps": n, "loss_rel": [...], "param_abs": max, "param_rel": max,
          "worst": name, "compared": tensors, "excluded": [...]}

Every rank's micro-batch k of a step forms one global micro-batch; the loss is
the sum over all of them divided by the step's global count (tokens, or
elements of the action chunks), which is what dtrain's strategies compute.

Safetensors are read and written with numpy here (no safetensors package
needed). Uses Debian's python3-torch.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        a = np.frombuffer(data[base + lo:base + hi], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = a.copy()
    return out


def gelu(x):
    return F.gelu(x)  # the erf form, as dtrain's GELU


class Gpt(torch.nn.Module):
    """Token + position embeddings, pre-LayerNorm blocks, final LayerNorm, an
    untied head without bias; parameters named as dtrain names them."""

    def __init__(self, weights, n_head):
        super().__init__()
        self.p = torch.nn.ParameterDict()
        for name, a in weights.items():
            self.p[name.replace(".", "__")] = torch.nn.Parameter(torch.from_numpy(a.astype(np.float64)))
        units = sorted({int(k.split(".")[0]) for k in weights})
        self.n_layer = len(units) - 4
        self.n_head = n_head

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def ln(self, x, prefix):
        return F.layer_norm(x, (x.shape[-1],), self.w(prefix + ".weight"), self.w(prefix + ".bias"), 1e-5)

    def attention(self, x, prefix):
        b, t, d = x.shape
        h = self.n_head
        qkv = F.linear(x, self.w(prefix + ".qkv.weight"), self.w(prefix + ".qkv.bias"))
        q, k, v = (part.reshape(b, t, h, d // h).transpose(1, 2) for part in qkv.split(d, dim=2))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return F.linear(o, self.w(prefix + ".proj.weight"), self.w(prefix + ".proj.bias"))

    def forward(self, ids):
        t = ids.shape[1]
        x = self.w("0.weight")[ids] + self.w("1.weight")[:t]
        for i in range(2, 2 + self.n_layer):
            u = str(i)
            x = x + self.attention(self.ln(x, u + ".ln1"), u + ".attn")
            m = self.ln(x, u + ".ln2")
            m = F.linear(gelu(F.linear(m, self.w(u + ".mlp.fc1.weight"), self.w(u + ".mlp.fc1.bias"))),
                         self.w(u + ".mlp.fc2.weight"), self.w(u + ".mlp.fc2.bias"))
            x = x + m
        x = self.ln(x, str(2 + self.n_layer))
        return F.linear(x, self.w(str(3 + self.n_layer) + ".weight"))

    # (summed loss, count) of one global micro-batch
    def loss(self, batch):
        logits = self.forward(torch.from_numpy(batch["x"].astype(np.int64)))
        y = torch.from_numpy(batch["y"].astype(np.int64))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"), y.numel()

    # Parameters whose gradient is zero in exact arithmetic: the key part of
    # each qkv bias (adding a constant to every key shifts a query's scores
    # equally, which softmax ignores). Both implementations then see only
    # rounding noise there, which AdamW scales to +-lr steps of random sign.
    def excluded(self):
        return [str(i) + ".attn.qkv.bias[keys]" for i in range(2, 2 + self.n_layer)]

    def compare_slices(self, name, a):
        if name.endswith(".attn.qkv.bias"):
            d = a.shape[0] // 3
            return np.concatenate([a[:d], a[2 * d:]])
        return a


class Policy(torch.nn.Module):
    """Linear, GELU, ..., Linear (dtrain units 0, 2, 4, ...), MSE loss."""

    def __init__(self, weights):
        super().__init__()
        self.p = torch.nn.ParameterDict()
        for name, a in weights.items():
            self.p[name.replace(".", "__")] = torch.nn.Parameter(torch.from_numpy(a.astype(np.float64)))
        self.units = sorted({int(k.split(".")[0]) for k in weights})

    def forward(self, x):
        for i, u in enumerate(self.units):
            x = F.linear(x, self.p[f"{u}__weight"], self.p[f"{u}__bias"])
            if i + 1 < len(self.units):
                x = gelu(x)
        return x

    def loss(self, batch):
        pred = self.forward(torch.from_numpy(batch["x"].astype(np.float64)))
        y = torch.from_numpy(batch["y"].astype(np.float64))
        return ((pred - y) ** 2).sum(), y.numel()

    def excluded(self):
        return []

    def compare_slices(self, name, a):
        return a


def global_batches(dump_dir):
    """{step: {micro: {tensor: array concatenated over ranks in rank order}}}"""
    files = sorted((f for f in os.listdir(dump_dir) if f.startswith("rank-")), key=lambda f: int(f[5:].split(".")[0]))
    steps = {}
    for f in files:
        for name, a in read_safetensors(os.path.join(dump_dir, f)).items():
            step, micro, tensor = name.split(".", 2)
            steps.setdefault(int(step), {}).setdefault(int(micro), {}).setdefault(tensor, []).append(a)
    return {s: {k: {t: np.concatenate(v) for t, v in m.items()} for k, m in ms.items()} for s, ms in steps.items()}, len(files)


def main():
    kind, init, dump_dir, metrics, params = sys.argv[1:6]
    keys = dict(kv.split("=", 1) for kv in sys.argv[6:])
    torch.set_default_dtype(torch.float64)
    weights = read_safetensors(init)
    model = Gpt(weights, int(keys["n_head"])) if kind == "gpt" else Policy(weights)
    # The examples' default no_decay=true: no weight decay on biases and
    # norms, which in these models are exactly the 1-D parameters.
    wd = float(keys.get("weight_decay", "0"))
    tensors = list(model.parameters())
    if keys.get("no_decay", "true") == "true":
        groups = [{"params": [p for p in tensors if p.dim() >= 2], "weight_decay": wd},
                  {"params": [p for p in tensors if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": tensors, "weight_decay": wd}]
    opt = torch.optim.AdamW(groups, lr=float(keys["lr"]), betas=(0.9, 0.999), eps=1e-8)
    steps, ranks = global_batches(dump_dir)
    want = [json.loads(line)["loss"] for line in open(metrics)]
    if len(want) != len(steps):
        raise SystemExit(f"metrics has {len(want)} steps, the dump {len(steps)}")
    loss_rel = []
    for s in sorted(steps):
        opt.zero_grad()
        parts = [model.loss(steps[s][k]) for k in sorted(steps[s])]
        count = sum(c for _, c in parts)
        loss = sum(l for l, _ in parts) / count
        loss.backward()
        opt.step()
        loss_rel.append(abs(want[s - 1] - loss.item()) / abs(loss.item()))
    got = read_safetensors(params)
    worst, param_abs, param_rel = "", 0.0, 0.0
    for name, p in model.p.items():
        name = name.replace("__", ".")
        ref = model.compare_slices(name, p.detach().numpy())
        mine = model.compare_slices(name, got[name].astype(np.float64))
        diff = np.abs(mine - ref)
        scale = max(np.abs(ref).max(), 1e-12)
        if diff.max() / scale > param_rel:
            worst, param_rel = name, diff.max() / scale
        param_abs = max(param_abs, diff.max())
    print(json.dumps({"steps": len(steps), "ranks": ranks, "loss_rel": loss_rel, "param_abs": param_abs,
                      "param_rel": param_rel, "worst": worst, "compared": len(model.p), "excluded": model.excluded()}))


if __name__ == "__main__":
    main()

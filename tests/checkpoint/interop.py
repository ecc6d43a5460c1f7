"""The Python side of python_interop_test: reads a dtrain checkpoint's
model.safetensors with safetensors (numpy, and torch when importable), and
writes pretrained weights for dtrain to load.

  interop.py read FILE            prints {"numpy": {name: {shape, dtype, values}}, "torch": ... or null}
  interop.py write FILE SPEC      SPEC: JSON {name: [shape, dtype]}; writes values 0.001 * (i + 1) * sign
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def read(path):
    out = {"numpy": {}, "torch": None}
    for name, a in load_file(path).items():
        out["numpy"][name] = {"shape": list(a.shape), "dtype": str(a.dtype), "values": a.ravel().tolist()}
    try:
        from safetensors.torch import load_file as torch_load
    except ImportError:
        return out
    out["torch"] = {}
    for name, t in torch_load(path).items():
        out["torch"][name] = {"shape": list(t.shape), "dtype": str(t.dtype), "values": t.double().ravel().tolist()}
    return out


def pattern(n):
    i = np.arange(n, dtype=np.float64)
    return 0.001 * (i + 1) * np.where(i % 2 == 0, 1.0, -1.0)


def write(path, spec):
    tensors = {}
    halves = {}
    for name, (shape, dtype) in spec.items():
        values = pattern(int(np.prod(shape))).reshape(shape)
        if dtype == "F32":
            tensors[name] = values.astype(np.float32)
        elif dtype == "F16":
            tensors[name] = values.astype(np.float16)
        else:
            halves[name] = values
    if halves:  # bf16 has no numpy dtype: torch writes the file
        import torch
        from safetensors.torch import save_file as torch_save
        data = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
        data.update({k: torch.tensor(v, dtype=torch.float64).to(torch.bfloat16) for k, v in halves.items()})
        torch_save(data, path)
    else:
        save_file(tensors, path)


if __name__ == "__main__":
    if sys.argv[1] == "read":
        print(json.dumps(read(sys.argv[2])))
    else:
        write(sys.argv[2], json.loads(sys.argv[3]))

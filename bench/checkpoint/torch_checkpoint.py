"""PyTorch's side of the checkpoint benchmark: the same stack of Linear layers
and AdamW state (one step taken), saved with torch.save and loaded with
torch.load, as a DDP user saves on rank 0. Prints one JSON object.
torch.save does not fsync; the 'fsync' figures add it, as dtrain always does.

Variants, each timed --repeat times (medians), in this order:
  default  torch.save(state, path) and torch.load(path) as the torch ships
           them (torch.load's weights_only defaults to False before 2.6,
           True from 2.6).
  fast     only on a torch that has the options (2.6 and later): the save
           without the archive's CRC-32 (torch.utils.serialization.config
           .save.compute_crc32 = False), the load memory-mapped
           (torch.load(path, mmap=True, weights_only=True)); the model's
           load_state_dict copies into its parameters, while torch 2.x's
           optimizer adopts the loaded state tensors without a copy (in
           either variant; 1.13's deep-copies them), so after an mmap load
           its state stays in the file's mapping and the first optimizer
           step pays the copy-on-write faults. After each
           timed load of this variant the optimizer's state is copied into
           ordinary memory, untimed, so the next save reads what a training
           job's save reads.
The top-level save_s, save_fsync_s and load_s are the default variant's."""
import argparse
import json
import os
import statistics
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--hidden", type=int, default=2048)
p.add_argument("--layers", type=int, default=6)
p.add_argument("--repeat", type=int, default=3)
a = p.parse_args()

layers = [torch.nn.Linear(a.hidden, a.hidden if i + 1 < a.layers else 10) for i in range(a.layers)]
model = torch.nn.Sequential(*layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss = torch.nn.functional.cross_entropy(model(torch.full((4, a.hidden), 0.5)), torch.tensor([1, 2, 3, 4]))
loss.backward()
opt.step()

try:
    from torch.utils.serialization import config as serialization_config
    has_fast = hasattr(serialization_config.save, "compute_crc32")
except ImportError:  # torch before 2.6
    serialization_config, has_fast = None, False


def measure(name, load_kwargs, save_options):
    """Median seconds of --repeat save / fsync / load rounds with these options."""
    save, save_fsync, load = [], [], []
    path = os.path.join(a.dir, "torch.pt")
    saved = {}
    if save_options:
        saved = {k: getattr(serialization_config.save, k) for k in save_options}
        for k, v in save_options.items():
            setattr(serialization_config.save, k, v)
    try:
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
            t1 = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            t2 = time.perf_counter()
            state = torch.load(path, **load_kwargs)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            t3 = time.perf_counter()
            del state
            if load_kwargs.get("mmap"):  # untimed: out of the file's mapping (see the module doc)
                for values in opt.state.values():
                    for k, v in values.items():
                        if torch.is_tensor(v):
                            values[k] = v.clone()
            save.append(t1 - t0)
            save_fsync.append(t2 - t0)
            load.append(t3 - t2)
            nbytes = os.path.getsize(path)
            os.remove(path)
    finally:
        for k, v in saved.items():
            setattr(serialization_config.save, k, v)
    return {"variant": name, "save_options": save_options, "load_kwargs": load_kwargs,
            "save_s": statistics.median(save), "save_fsync_s": statistics.median(save_fsync),
            "load_s": statistics.median(load), "runs_save_s": save, "runs_load_s": load, "bytes": nbytes}


variants = [measure("default", {}, {})]
if has_fast:
    variants.append(measure("fast", {"mmap": True, "weights_only": True}, {"compute_crc32": False}))
default = variants[0]
print(json.dumps({"strategy": "torch.save", "ranks": 1,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "save_s": default["save_s"], "save_fsync_s": default["save_fsync_s"],
                  "load_s": default["load_s"], "bytes": default["bytes"], "torch": torch.__version__,
                  "variants": variants}))

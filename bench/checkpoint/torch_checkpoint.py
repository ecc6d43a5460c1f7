"""PyTorch's side of the checkpoint benchmark: the same stack of Linear layers
and AdamW state (one step taken), saved with torch.save and loaded with
torch.load, as a DDP user saves on rank 0. Prints one JSON object.
torch.save does not fsync; the 'fsync' figures add it, as dtrain always does."""
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

save, save_fsync, load = [], [], []
path = os.path.join(a.dir, "torch.pt")
for _ in range(a.repeat):
    t0 = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    t1 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    t2 = time.perf_counter()
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    t3 = time.perf_counter()
    save.append(t1 - t0)
    save_fsync.append(t2 - t0)
    load.append(t3 - t2)
    nbytes = os.path.getsize(path)
    os.remove(path)
print(json.dumps({"strategy": "torch.save", "ranks": 1,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "save_s": statistics.median(save), "save_fsync_s": statistics.median(save_fsync),
                  "load_s": statistics.median(load), "bytes": nbytes, "torch": torch.__version__}))

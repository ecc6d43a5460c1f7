"""PyTorch (torch.distributed, gloo backend) host collective bandwidth.

The same measurements as bench/comm_bandwidth.cpp, so the two compare
directly: fp32 all_reduce, reduce_scatter, all_gather and broadcast from
1 MiB to 256 MiB (x4 steps); message size = the larger buffer; a barrier
before every timed iteration; per rank the median; reported, the slowest
rank's median. A collective this torch's gloo backend lacks (reduce_scatter in
torch 1.13) is reported as not available, with torch's reason.

all_gather and reduce_scatter are the list forms, which every torch has. A
torch whose gloo also runs the single-tensor forms FSDP calls (2.x:
all_gather_into_tensor, reduce_scatter_tensor) has them measured too, as rows
of their own with those names; torch 1.13's gloo rejects them, and they are
left out there.

Launch one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set,
e.g. `dtrain-run --nproc-per-node 2 /usr/bin/python3 bench/torch_gloo_bandwidth.py`.
"""

import argparse
import json
import os
import time

# Debian's OpenBLAS starts one thread per core in every process; two ranks
# on a small machine would fight over the cores (torch.set_num_threads does
# not reach OpenBLAS). Must be set before torch loads it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def iterations(nbytes):
    """Same rule as the C++ bench: depends only on the size."""
    return max(5, min(20, (512 << 20) // nbytes))


def time_collective(iters, issue):
    issue()  # warm-up
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        issue()
        times.append((time.perf_counter() - t0) * 1e6)
    return sorted(times)[len(times) // 2]  # the C++ bench's median, also for even counts


def bus_factor(coll, n):
    coll = coll.replace("_into_tensor", "").replace("_tensor", "")
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll == "broadcast":
        return 1.0
    return (n - 1) / n


def has_tensor_forms():
    """Whether this torch's gloo runs all_gather_into_tensor and reduce_scatter_tensor (not 1.13's)."""
    n = dist.get_world_size()
    try:
        dist.all_gather_into_tensor(torch.empty(4 * n), torch.ones(4))
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * n))
    except (AttributeError, RuntimeError):  # gloo rejects it on every rank alike, before communicating
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-mib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--json", help="rank 0 writes the results here (default: stdout)")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    tensor_forms = has_tensor_forms()
    total_max = (args.max_mib << 20) // 4
    buf = torch.ones(total_max, dtype=torch.float32)
    out = torch.zeros(total_max, dtype=torch.float32)

    rows = []
    nbytes = args.min_mib << 20
    while nbytes <= args.max_mib << 20:
        total = nbytes // 4
        chunk = total // n
        whole = buf[:total]
        gathered = list(out[:total].chunk(n))
        iters = iterations(nbytes)
        cases = {
            "all_reduce": lambda: dist.all_reduce(whole, op=dist.ReduceOp.SUM),
            "reduce_scatter": lambda: dist.reduce_scatter(out[:chunk], list(whole.chunk(n)), op=dist.ReduceOp.SUM),
            "all_gather": lambda: dist.all_gather(gathered, buf[:chunk]),
            "broadcast": lambda: dist.broadcast(whole, src=0),
        }
        if tensor_forms:
            cases["all_gather_into_tensor"] = lambda: dist.all_gather_into_tensor(out[:total], buf[:chunk])
            cases["reduce_scatter_tensor"] = lambda: dist.reduce_scatter_tensor(out[:chunk], whole,
                                                                                op=dist.ReduceOp.SUM)
        for coll, issue in cases.items():
            try:
                rows.append({"collective": coll, "bytes": nbytes, "iters": iters,
                             "time_us": time_collective(iters, issue)})
            except RuntimeError as e:  # the backend lacks it; every rank raises alike
                rows.append({"collective": coll, "bytes": nbytes, "iters": 0, "time_us": None,
                             "unavailable": str(e).splitlines()[0]})
        nbytes *= 4

    # The slowest rank's median.
    measured = [r for r in rows if r["time_us"] is not None]
    t = torch.tensor([r["time_us"] for r in measured], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    for r, v in zip(measured, t.tolist()):
        r["time_us"] = round(v, 1)
        r["algbw_gbps"] = round(r["bytes"] / v / 1e3, 4)
        r["busbw_gbps"] = round(r["algbw_gbps"] * bus_factor(r["collective"], n), 4)

    dist.barrier()
    # gloo can deadlock at exit while tensors it registered are alive.
    del buf, out, whole, gathered, cases, t
    dist.destroy_process_group()
    if rank == 0:
        result = {"implementation": f"PyTorch {torch.__version__} gloo", "world_size": n, "dtype": "fp32",
                  "results": rows}
        text = json.dumps(result, indent=1)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        else:
            print(text)


if __name__ == "__main__":
    main()

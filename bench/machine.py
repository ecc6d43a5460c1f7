"""What the bench/*/summarize.py scripts record about the run: the CPU and
the commit measured. Imported by path (each script puts bench/ first on
sys.path)."""

import os
import platform
import subprocess
import time


def cpu_info():
    """The CPU's model name and the vector flags that decide which GEMM kernels run."""
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    flags = info.get("flags", "").split()
    return {"cpu": info.get("model name", platform.machine()),
            "cpu_flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]}


def commit():
    """The checkout's short commit, or None outside a git checkout."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def gpu_info():
    """The GPUs nvidia-smi lists (name and driver), or "none"."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return {"gpu": "none"}
    gpus = [line.split(",") for line in out.strip().splitlines() if line.strip()]
    if not gpus:
        return {"gpu": "none"}
    return {"gpu": f"{len(gpus)} x {gpus[0][0].strip()}", "driver": gpus[0][1].strip()}


def run_record(cores, **machine):
    """The date, commit and machine (CPU, cores, GPU and driver, kernel, load,
    and `machine`'s extra fields) every results JSON starts with."""
    return {"date": time.strftime("%Y-%m-%d"), "commit": commit(),
            "machine": {**cpu_info(), "cores": cores, **gpu_info(), "kernel": platform.release(),
                        "load_average_at_end": os.getloadavg(), **machine}}

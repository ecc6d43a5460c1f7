#!/usr/bin/env bash
# Host collective bandwidth: dtrain's HostCommunicator over shared memory and
# over Gloo against PyTorch's gloo backend (bench/torch_gloo_bandwidth.py) on
# two torches in the same run: the release users install today (the peer:
# PyPI, pinned in bench/lib.sh, in a venv bench_peer_python makes once; its
# gloo also runs reduce_scatter and the single-tensor forms FSDP calls) and,
# for history, Debian's torch 1.13, which is all a --smoke run uses; 2
# processes each, launched by dtrain-run. Then how ranks wait in shared
# memory (spin, futex, auto) at 2 and 3 ranks on this machine's cores.
# Installs what is missing (python3-torch) and builds its targets through
# scripts/setup.sh first.
# usage: bench/run_comm_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
# Runs the four implementations alternately N times (default 3); each run
# reports per-row medians over its iterations (slowest rank), and the tables
# show the median of the N runs (the JSON keeps every run, and both torch
# versions). Writes bench/results/comm_bandwidth.json (or --json PATH): key
# torch is Debian's torch, torch_peer the PyPI release. About 1.5 minutes on
# 2 cores with the peer. --no-setup: use BUILD_DIR as it is. --smoke
# (bench/lib.sh): 1 and 4 MiB messages, one run, no peer, the JSON in a
# temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_comm_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/comm_bandwidth.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
launcher=$build/tools/dtrain-run
bench=$build/bench/bench_comm_bandwidth
python=/usr/bin/python3  # Debian's torch lives there; another python3 may come first on PATH
max_mib=64
((smoke)) && max_mib=4
sizes=(--min-mib 1 --max-mib "$max_mib")

bench_build python3-torch dtrain-run bench_comm_bandwidth
bench_need "$launcher" "$bench"
bench_need_torch "$python"
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for ((i = 1; i <= repeat; i++)); do
  echo "run $i/$repeat: dtrain shm, dtrain gloo, PyTorch gloo (Debian${peer_python:+, PyPI}); 2 processes each..."
  "$launcher" --nproc-per-node 2 "$bench" --transport shm --json "$work/shm.$i.json" "${sizes[@]}"
  "$launcher" --nproc-per-node 2 "$bench" --transport gloo --json "$work/gloo.$i.json" "${sizes[@]}"
  "$launcher" --nproc-per-node 2 "$python" "$repo/bench/torch_gloo_bandwidth.py" --json "$work/torch.$i.json" "${sizes[@]}"
  if [[ -n $peer_python ]]; then
    "$launcher" --nproc-per-node 2 "$peer_python" "$repo/bench/torch_gloo_bandwidth.py" --json "$work/peer.$i.json" \
      "${sizes[@]}"
  fi
done
for wait in spin futex auto; do
  for n in 2 3; do
    echo "waiting: $wait, $n processes..."
    for ((i = 1; i <= repeat; i++)); do
      DTRAIN_SHM_WAIT=$wait "$launcher" --nproc-per-node "$n" "$bench" --transport shm \
        --json "$work/wait_${wait}_$n.$i.json" "${sizes[@]}"
    done
  done
done

mkdir -p "$(dirname "$json")"
DTRAIN_BENCH_DIR="$repo/bench" "$python" - "$work" "$repeat" "$json" "$max_mib" <<'EOF'
import json, os, platform, statistics, sys, time
sys.path.insert(0, os.environ["DTRAIN_BENCH_DIR"])
from machine import run_record  # noqa: E402  (bench/machine.py)

work, repeat, target, big = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

def median_of(name):
    runs = [json.load(open(os.path.join(work, f"{name}.{i}.json"))) for i in range(1, repeat + 1)]
    merged = runs[0]
    for i, row in enumerate(merged["results"]):
        if row["time_us"] is None:
            continue
        times = [run["results"][i]["time_us"] for run in runs]
        row["runs_time_us"] = times
        row["time_us"] = statistics.median(times)
        algbw = row["bytes"] / row["time_us"] / 1e3
        row["busbw_gbps"] = round(row["busbw_gbps"] / row["algbw_gbps"] * algbw, 4)
        row["algbw_gbps"] = round(algbw, 4)
    if "copy_gbps_per_rank" in merged:
        merged["runs_copy_gbps_per_rank"] = [r["copy_gbps_per_rank"] for r in runs]
        merged["copy_gbps_per_rank"] = statistics.median(merged["runs_copy_gbps_per_rank"])
    return merged

def row(result, coll, mib):
    return next(r for r in result["results"] if r["collective"] == coll and r["bytes"] == mib << 20)

shm, gloo, torch = median_of("shm"), median_of("gloo"), median_of("torch")
peer = median_of("peer") if os.path.exists(os.path.join(work, "peer.1.json")) else None
torches = {"torch": torch, **({"peer": peer} if peer else {})}
version = {k: t["implementation"].split()[1] for k, t in torches.items()}
short = {k: ".".join(v.split(".")[:2]) for k, v in version.items()}
waits = {f"{w}_{n}": median_of(f"wait_{w}_{n}") for w in ("spin", "futex", "auto") for n in (2, 3)}
# A 2-rank all-reduce of S bytes must move about 4S through memory: each rank
# reads its S-byte buffer and writes S bytes of result (the slots in between
# are 2 x 2 x 256 KiB per rank and stay in cache). A memcpy of S bytes moves
# 2S (read + write), so with both ranks copying at once at C bytes/s each the
# all-reduce cannot take less than S / C: algbw <= C, and for 2 ranks busbw =
# algbw. The bound is the measured concurrent copy bandwidth C.
copy = shm["copy_gbps_per_rank"]
bound = copy
ar_big = row(shm, "all_reduce", big)
merged = {
    **run_record(os.cpu_count()),
    "method": "2 processes on one node, fp32, size = larger buffer, barrier before each iteration, median per "
              f"rank, slowest rank; median of {repeat} alternating runs; busbw as nccl-tests",
    "shm_bound": {"copy_gbps_per_rank": copy, "all_reduce_busbw_bound_gbps": bound,
                  f"all_reduce_{big}mib_busbw_gbps": ar_big["busbw_gbps"],
                  "fraction_of_bound": ar_big["busbw_gbps"] / bound},
    "torch_versions": {"debian": version["torch"], "peer": version.get("peer"),
                       "peer_source": "PyPI (bench/lib.sh's bench_peer_python), CPU side" if peer else None},
    "dtrain_shm": shm, "dtrain_gloo": gloo, "torch": torch, "waiting": waits,
}
if peer:
    merged["torch_peer"] = peer
with open(target, "w") as f:
    json.dump(merged, f, indent=1)
    f.write("\n")

def key(r):
    return r["collective"], r["bytes"]

by = {name: {key(r): r for r in res["results"]} for name, res in (("gloo", gloo), *torches.items())}
head = f"{'collective':<15}{'size':>7}  {'shm us':>8}{'busbw':>7}  {'gloo us':>8}{'busbw':>7}"
for k in torches:
    head += f"  {'torch ' + short[k] + ' us':>15}{'busbw':>7}"
head += "".join(f"  {'shm/' + short[k]:>9}" for k in torches)
print("\n" + head)
for r in shm["results"]:
    g = by["gloo"].get(key(r), {})
    line = f"{r['collective']:<15}{r['bytes'] >> 20:>3} MiB  {r['time_us']:>8.0f}{r['busbw_gbps']:>7.2f}  "
    line += f"{g['time_us']:>8.0f}{g['busbw_gbps']:>7.2f}" if g.get("time_us") else f"{'n/a':>8}{'':>7}"
    ratios = ""
    for k in torches:
        t = by[k].get(key(r), {})
        if t.get("time_us"):
            line += f"  {t['time_us']:>15.0f}{t['busbw_gbps']:>7.2f}"
            ratios += f"  {t['time_us'] / r['time_us']:>8.2f}x"
        else:
            line += f"  {'n/a':>15}{'':>7}"
            ratios += f"  {'':>9}"
    print(line + ratios)
print("(busbw in GB/s; shm/torch > 1: dtrain faster)")
if peer:
    forms = [r for r in peer["results"] if r["collective"].endswith("tensor") and r.get("time_us")]
    if forms:
        print(f"\ntorch {short['peer']}'s single-tensor forms beside its list forms (us):")
        for r in forms:
            listed = by["peer"].get((r["collective"].replace("_into_tensor", "").replace("_tensor", ""), r["bytes"]))
            print(f"{r['collective']:<23}{r['bytes'] >> 20:>3} MiB  {r['time_us']:>8.0f}  list form "
                  f"{listed['time_us']:>8.0f}")
print(f"\ncopy bandwidth {copy:.2f} GB/s per rank (both ranks copying) -> all_reduce busbw bound {bound:.2f} GB/s; "
      f"{big} MiB all_reduce reaches {ar_big['busbw_gbps']:.2f} GB/s = {100 * ar_big['busbw_gbps'] / bound:.0f}% of it; "
      + ", ".join(f"{name} {100 * row(res, 'all_reduce', big)['busbw_gbps'] / bound:.0f}%"
                  for name, res in (("Gloo", gloo), *((f"torch {short[k]}", t) for k, t in torches.items()))))
print(f"\nwaiting in shared memory ({os.cpu_count()} cores): all_reduce")
print(f"{'wait':<7}{'ranks':>6}  {'1 MiB us':>9}  {f'{big} MiB busbw':>13}")
for name, res in waits.items():
    w, n = name.split("_")
    print(f"{w:<7}{n:>6}  {row(res, 'all_reduce', 1)['time_us']:>9.0f}  {row(res, 'all_reduce', big)['busbw_gbps']:>13.2f}")
for k, t in torches.items():
    for r in t["results"]:
        if r.get("unavailable"):
            print(f"torch {version[k]} {r['collective']}: n/a ({r['unavailable']})")
            break
shown = os.path.relpath(target)
print(f"written: {target if shown.startswith('..') else shown}")
EOF
bench_check_json

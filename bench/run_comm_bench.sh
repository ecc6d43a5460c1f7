#!/usr/bin/env bash
# Host collective bandwidth: dtrain's HostCommunicator over shared memory and
# over Gloo against PyTorch's gloo backend, 2 processes each, launched by
# dtrain-run; then how ranks wait in shared memory (spin, futex, auto) at 2
# and 3 ranks on this machine's cores. Installs what is missing
# (python3-torch) and builds its targets through scripts/setup.sh first.
# usage: bench/run_comm_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
# Runs the three implementations alternately N times (default 3); each run
# reports per-row medians over its iterations (slowest rank), and the tables
# show the median of the N runs (the JSON keeps every run). Writes
# bench/results/comm_bandwidth.json (or --json PATH). --no-setup: use
# BUILD_DIR as it is. --smoke (bench/lib.sh): 1 and 4 MiB messages, one
# run, the JSON in a temporary folder.
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

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for ((i = 1; i <= repeat; i++)); do
  echo "run $i/$repeat: dtrain shm, dtrain gloo, PyTorch gloo; 2 processes each..."
  "$launcher" --nproc-per-node 2 "$bench" --transport shm --json "$work/shm.$i.json" "${sizes[@]}"
  "$launcher" --nproc-per-node 2 "$bench" --transport gloo --json "$work/gloo.$i.json" "${sizes[@]}"
  "$launcher" --nproc-per-node 2 "$python" "$repo/bench/torch_gloo_bandwidth.py" --json "$work/torch.$i.json" "${sizes[@]}"
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
"$python" - "$work" "$repeat" "$json" "$max_mib" <<'EOF'
import json, os, platform, statistics, sys, time

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
    "date": time.strftime("%Y-%m-%d"),
    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                "kernel": platform.release(), "load_average_at_end": os.getloadavg()},
    "method": "2 processes on one node, fp32, size = larger buffer, barrier before each iteration, median per "
              f"rank, slowest rank; median of {repeat} alternating runs; busbw as nccl-tests",
    "shm_bound": {"copy_gbps_per_rank": copy, "all_reduce_busbw_bound_gbps": bound,
                  f"all_reduce_{big}mib_busbw_gbps": ar_big["busbw_gbps"],
                  "fraction_of_bound": ar_big["busbw_gbps"] / bound},
    "dtrain_shm": shm, "dtrain_gloo": gloo, "torch": torch, "waiting": waits,
}
with open(target, "w") as f:
    json.dump(merged, f, indent=1)
    f.write("\n")

def key(r):
    return r["collective"], r["bytes"]

by = {name: {key(r): r for r in res["results"]} for name, res in (("gloo", gloo), ("torch", torch))}
print(f"\n{'collective':<15}{'size':>7}  {'shm us':>8}{'busbw':>7}  {'gloo us':>8}{'busbw':>7}"
      f"  {'torch us':>9}{'busbw':>7}  {'shm/torch':>9}")
for r in shm["results"]:
    g, t = by["gloo"].get(key(r), {}), by["torch"].get(key(r), {})
    size = f"{r['bytes'] >> 20} MiB"
    gl = f"{g['time_us']:>8.0f}{g['busbw_gbps']:>7.2f}" if g.get("time_us") else f"{'n/a':>8}{'':>7}"
    if t.get("time_us"):
        to = f"{t['time_us']:>9.0f}{t['busbw_gbps']:>7.2f}  {t['time_us'] / r['time_us']:>8.2f}x"
    else:
        to = f"{'n/a':>9}{'':>7}  {'':>9}"
    print(f"{r['collective']:<15}{size:>7}  {r['time_us']:>8.0f}{r['busbw_gbps']:>7.2f}  {gl}  {to}")
print("(busbw in GB/s; shm/torch > 1: dtrain faster)")
print(f"\ncopy bandwidth {copy:.2f} GB/s per rank (both ranks copying) -> all_reduce busbw bound {bound:.2f} GB/s; "
      f"{big} MiB all_reduce reaches {ar_big['busbw_gbps']:.2f} GB/s = {100 * ar_big['busbw_gbps'] / bound:.0f}% of it")
print(f"\nwaiting in shared memory ({os.cpu_count()} cores): all_reduce")
print(f"{'wait':<7}{'ranks':>6}  {'1 MiB us':>9}  {f'{big} MiB busbw':>13}")
for name, res in waits.items():
    w, n = name.split("_")
    print(f"{w:<7}{n:>6}  {row(res, 'all_reduce', 1)['time_us']:>9.0f}  {row(res, 'all_reduce', big)['busbw_gbps']:>13.2f}")
for r in torch["results"]:
    if r.get("unavailable"):
        print(f"torch {r['collective']}: n/a ({r['unavailable']})")
        break
shown = os.path.relpath(target)
print(f"written: {target if shown.startswith('..') else shown}")
EOF
bench_check_json

#!/usr/bin/env bash
# Many ranks on one machine: rendezvous, every host collective and a short
# training run at 8, 16 and 32 ranks, on shared memory (one node, one
# dtrain-run) and on Gloo over TCP between two "nodes" (two network
# namespaces joined by a veth pair, one dtrain-run --nnodes 2 in each with
# half the ranks); then the rendezvous store under 256 concurrent clients.
# usage: bench/run_scale_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
#
# Per world size N and transport, bench_scale_probe (bench/scale_probe.cpp)
# reports each rank's rendezvous time (process start to World, and to its
# HostCommunicator ready: every rank connected), checks all_reduce,
# reduce_scatter, all_gather and broadcast against one rank's result, and
# times them at 4 KiB and 4 MiB (fp32) and barrier (the slowest rank's
# median over iterations); then train_mlp (examples/configs/ddp_host.yaml:
# DDP, fp32, hidden [128, 128]) runs 4 steps of momentum SGD at a global
# batch of 64 (64 / N per rank) and its final parameters must equal world
# 1's within the strategy tests' bound for momentum SGD over 4 steps
# (tests/strategy/ddp_test.cpp: |a - b| <= 2e-5 x max(1, |b|)), else the
# bench fails. A run that does not finish in its time limit (a hang) fails
# it too. Store: bench_scale_probe store, 256 threads each with its own
# TcpStore connection doing set / get / add rounds against one server.
#
# Oversubscription (32 ranks on 2 cores): one BLAS / OpenMP thread per rank
# and DTRAIN_SHM_WAIT=futex (a waiting rank sleeps in the kernel at once
# instead of spinning on a core another rank needs); both are overridable
# from the environment. DTRAIN_JOB_TOKEN: one per run (openssl rand) unless
# set, the same in both launchers of the two-node runs.
#
# The two-node part needs root (ip netns); where `ip netns add` is not
# permitted (an unprivileged container) it is skipped with a message and the
# JSON says why. --repeat N (default 1) repeats each probe N times; the JSON
# keeps every run and reports medians. Writes bench/results/scale.json (or
# --json PATH). About 4 minutes on 2 cores. --smoke (bench/lib.sh): 4 and 8
# ranks, the store at 64 clients, in well under a minute.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_scale_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
json=$repo/bench/results/scale.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
launcher=$build/tools/dtrain-run
probe=$build/bench/bench_scale_probe
mlp=$build/examples/train_mlp
python=/usr/bin/python3

worlds=(8 16 32)
store_clients=256
store_ops=50
sizes=4096,4194304
limit=600  # seconds one launch may take before it counts as a hang
if ((smoke)); then
  worlds=(4 8)
  store_clients=64
  store_ops=20
  sizes=4096,262144
  limit=60
fi
global_batch=64
steps=4
bound=2e-5

bench_build "" dtrain-run bench_scale_probe train_mlp
bench_need "$launcher" "$probe" "$mlp"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export DTRAIN_SHM_WAIT=${DTRAIN_SHM_WAIT:-futex}
export DTRAIN_COMM_TIMEOUT_S=${DTRAIN_COMM_TIMEOUT_S:-$limit}
if [[ -z ${DTRAIN_JOB_TOKEN:-} ]]; then
  DTRAIN_JOB_TOKEN=$(openssl rand -hex 32 2> /dev/null || "$python" -c "import secrets; print(secrets.token_hex(32))")
fi
export DTRAIN_JOB_TOKEN

work=$(mktemp -d)
ns0="" ns1=""
cleanup() {
  [[ -n $ns0 ]] && ip netns del "$ns0" 2> /dev/null
  [[ -n $ns1 ]] && ip netns del "$ns1" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

since() {  # since T0: seconds from $EPOCHREALTIME T0 to now
  awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f\n", b - a }'
}

free_port() {
  "$python" -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
}

# The two-node setup: two namespaces, a veth pair 10.77.<k>.1 <-> .2.
netns=""
if true; then
  tag=$$
  k=$((tag % 200 + 20))
  if ip netns add "dts$tag-0" 2> "$work/netns.err"; then
    ns0=dts$tag-0
    if ip netns add "dts$tag-1" 2>> "$work/netns.err" && ns1=dts$tag-1 &&
      ip link add "dtsv$tag-0" type veth peer name "dtsv$tag-1" 2>> "$work/netns.err" &&
      ip link set "dtsv$tag-0" netns "$ns0" && ip link set "dtsv$tag-1" netns "$ns1" &&
      ip -n "$ns0" addr add "10.77.$k.1/24" dev "dtsv$tag-0" && ip -n "$ns1" addr add "10.77.$k.2/24" dev "dtsv$tag-1" &&
      ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
      ip -n "$ns0" link set "dtsv$tag-0" up && ip -n "$ns1" link set "dtsv$tag-1" up 2>> "$work/netns.err"; then
      master0=10.77.$k.1
    else
      netns="skipped: cannot set up the veth pair between two network namespaces: $(tr '\n' ' ' < "$work/netns.err")"
    fi
  else
    netns="skipped: ip netns add is not permitted here (needs root / CAP_SYS_ADMIN): $(tr '\n' ' ' < "$work/netns.err")"
  fi
  if [[ -n $netns ]]; then
    echo "$(basename "$0"): two-node (TCP) runs $netns" >&2
  fi
fi

# on_nodes LOG N_PER_NODE PROGRAM ARGS...: the two-node launch (Gloo over the
# veth pair), one dtrain-run per namespace; fails when either does.
on_nodes() {
  local log=$1 n=$2 port
  shift 2
  port=$(free_port)
  local common=(--nnodes 2 --nproc-per-node "$n" --master-addr "$master0" --master-port "$port")
  DTRAIN_HOST_TRANSPORT=gloo timeout "$limit" ip netns exec "$ns0" "$launcher" "${common[@]}" --node-rank 0 "$@" \
    > "$log.0" 2>&1 &
  local p0=$!
  DTRAIN_HOST_TRANSPORT=gloo timeout "$limit" ip netns exec "$ns1" "$launcher" "${common[@]}" --node-rank 1 "$@" \
    > "$log.1" 2>&1 &
  local p1=$! rc0=0 rc1=0
  wait "$p0" || rc0=$?
  wait "$p1" || rc1=$?
  if ((rc0 || rc1)); then
    cat "$log.0" "$log.1" >&2
    echo "$(basename "$0"): two-node run failed (node 0: $rc0, node 1: $rc1; 124: no end within ${limit}s): $*" >&2
    exit 1
  fi
}

# on_one_node LOG N PROGRAM ARGS...: N ranks under one dtrain-run on shared memory.
on_one_node() {
  local log=$1 n=$2
  shift 2
  DTRAIN_HOST_TRANSPORT=shm logged "$log" timeout "$limit" "$launcher" --nproc-per-node "$n" \
    --master-port "$(free_port)" "$@"
}

train_args=(--config "$repo/examples/configs/ddp_host.yaml" "steps=$steps" optimizer=sgd lr=0.05 momentum=0.9
  num_workers=0 log_every=100)

echo "world 1: train_mlp, $steps steps at batch $global_batch..."
logged "$work/train1.log" timeout "$limit" "$launcher" --nproc-per-node 1 "$mlp" "${train_args[@]}" \
  "batch_size=$global_batch" "save_params=$work/params1.safetensors"

transports=(shm)
[[ -z $netns ]] && transports+=(tcp)
for n in "${worlds[@]}"; do
  for t in "${transports[@]}"; do
    for ((i = 1; i <= repeat; i++)); do
      echo "$n ranks, $t: probe ($i/$repeat)..."
      s=$EPOCHREALTIME
      if [[ $t == shm ]]; then
        on_one_node "$work/probe.log" "$n" "$probe" ranks --transport shm --sizes "$sizes" \
          --json "$work/probe_${t}_$n.$i.json"
      else
        on_nodes "$work/probe.log" $((n / 2)) "$probe" ranks --transport gloo --sizes "$sizes" \
          --json "$work/probe_${t}_$n.$i.json"
      fi
      since "$s" > "$work/probe_${t}_$n.$i.wall"
    done
    echo "$n ranks, $t: train_mlp, $steps steps at batch $((global_batch / n)) per rank..."
    s=$EPOCHREALTIME
    out=$work/params_${t}_$n.safetensors
    if [[ $t == shm ]]; then
      on_one_node "$work/train.log" "$n" "$mlp" "${train_args[@]}" "batch_size=$((global_batch / n))" \
        "save_params=$out"
    else
      on_nodes "$work/train.log" $((n / 2)) "$mlp" "${train_args[@]}" "batch_size=$((global_batch / n))" \
        "save_params=$out"
    fi
    since "$s" > "$work/train_${t}_$n.wall"
    "$probe" compare "$out" "$work/params1.safetensors" > "$work/train_${t}_$n.diff"
  done
done

echo "store: $store_clients clients x $store_ops rounds of set/get/add..."
logged "$work/store.log" timeout "$limit" "$probe" store --clients "$store_clients" --ops "$store_ops" \
  --json "$work/store.json"

mkdir -p "$(dirname "$json")"
DTRAIN_BENCH_DIR="$repo/bench" "$python" - "$work" "$json" "$repeat" "$bound" "$netns" "$steps" "$global_batch" \
  "${worlds[*]}" "${transports[*]}" <<'EOF'
import json, os, statistics, sys
sys.path.insert(0, os.environ["DTRAIN_BENCH_DIR"])
from machine import run_record  # noqa: E402  (bench/machine.py)

work, target, repeat, bound, netns, steps, batch = sys.argv[1:8]
repeat, bound, steps, batch = int(repeat), float(bound), int(steps), int(batch)
worlds = [int(w) for w in sys.argv[8].split()]
transports = sys.argv[9].split()
names = {"shm": "shared memory, 1 node", "tcp": "Gloo over TCP, 2 nodes (network namespaces, veth)"}

def read(path):
    with open(path) as f:
        return f.read().strip()

runs, failed = [], []
for n in worlds:
    for t in transports:
        probes = [json.loads(read(os.path.join(work, f"probe_{t}_{n}.{i}.json"))) for i in range(1, repeat + 1)]
        rdv = {k: {"median_ms": statistics.median(p["rendezvous"][k]["median_ms"] for p in probes),
                   "max_ms": statistics.median(p["rendezvous"][k]["max_ms"] for p in probes)}
               for k in probes[0]["rendezvous"]}
        colls = []
        for j, c in enumerate(probes[0]["collectives"]):
            times = [p["collectives"][j]["time_ms"] for p in probes]
            colls.append({"collective": c["collective"], "bytes": c["bytes"], "iters": c["iters"],
                          "time_ms": statistics.median(times), "runs_time_ms": times})
        diff_line = read(os.path.join(work, f"train_{t}_{n}.diff")).split()
        diff = float(diff_line[1])
        ok = diff <= bound and all(p["wrong_elements"] == 0 for p in probes)
        if not ok:
            failed.append(f"{n} ranks {t}: max_rel_diff {diff:.3e} (bound {bound:.0e}), wrong collective elements "
                          f"{sum(p['wrong_elements'] for p in probes)}")
        runs.append({
            "transport": t, "setting": names[t], "nodes": 1 if t == "shm" else 2, "world_size": n,
            "communicator": probes[0]["description"],
            "rendezvous": rdv, "collectives": colls,
            "collective_results_wrong_elements": sum(p["wrong_elements"] for p in probes),
            "probe_wall_s": [float(read(os.path.join(work, f"probe_{t}_{n}.{i}.wall"))) for i in range(1, repeat + 1)],
            "train": {"max_rel_diff_vs_world1": diff, "at": diff_line[3], "bound": bound, "within_bound": diff <= bound,
                      "per_rank_batch": batch // n, "wall_s": float(read(os.path.join(work, f"train_{t}_{n}.wall")))},
            "probe_runs": probes,
        })
store = json.loads(read(os.path.join(work, "store.json")))
result = {
    **run_record(os.cpu_count()),
    "method": "bench/run_scale_bench.sh: per world size and transport, bench_scale_probe (bench/scale_probe.cpp) "
              "under dtrain-run: rendezvous = each rank's process start (/proc, 10 ms ticks) to init()'s World "
              "(start_to_world) and to its HostCommunicator ready (start_to_communicator), median and max over "
              "ranks; each collective checked against one rank's result, then timed (fp32, size = the larger "
              "buffer, barrier before each iteration, median per rank, slowest rank); "
              f"train_mlp ddp_host.yaml, {steps} steps of SGD lr 0.05 momentum 0.9 at global batch {batch}, "
              "final parameters vs world 1 as max |a - b| / max(1, |b|); "
              f"median of {repeat} probe run(s)",
    "settings": {"threads_per_rank": os.environ.get("OPENBLAS_NUM_THREADS"),
                 "shm_wait": os.environ.get("DTRAIN_SHM_WAIT"),
                 "comm_timeout_s": os.environ.get("DTRAIN_COMM_TIMEOUT_S")},
    "two_nodes": netns or "ran: two network namespaces joined by a veth pair, one dtrain-run --nnodes 2 each, "
                          "DTRAIN_HOST_TRANSPORT=gloo",
    "runs": runs,
    "store": store,
}
with open(target, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")

def size(b):
    return "-" if b == 0 else f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

print(f"\nrendezvous (ms; process start to communicator ready, median / max over ranks) and collectives "
      f"(ms, slowest rank's median)")
head = f"{'transport':<10}{'ranks':>6}{'rdv med':>9}{'rdv max':>9}"
cols = [(c["collective"], c["bytes"]) for c in runs[0]["collectives"]] if runs else []
short = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC", "barrier": "barrier"}
for c, b in cols:
    head += f"{short[c] + (' ' + size(b) if b else ''):>12}"
print(head + f"{'train Δ':>11}{'train s':>9}")
for r in runs:
    rd = r["rendezvous"]["start_to_communicator"]
    line = f"{r['transport']:<10}{r['world_size']:>6}{rd['median_ms']:>9.0f}{rd['max_ms']:>9.0f}"
    for c in r["collectives"]:
        line += f"{c['time_ms']:>12.3f}"
    print(line + f"{r['train']['max_rel_diff_vs_world1']:>11.1e}{r['train']['wall_s']:>9.1f}")
print(f"(train Δ: max |a - b| / max(1, |b|) of the final parameters vs world 1; bound {bound:.0e})")
if netns:
    print(f"two nodes: {netns}")
print(f"\nstore: {store['clients']} clients x {store['rounds_per_client']} rounds (set, get, add): "
      f"{store['operations']} operations in {store['wall_ms']:.0f} ms ({store['ops_per_s']:.0f}/s), "
      f"latency p50 {store['latency_us']['p50']:.0f} us, p99 {store['latency_us']['p99']:.0f} us; "
      f"connecting all {store['connect_all_ms']:.0f} ms; errors {store['errors']}")
shown = os.path.relpath(target)
print(f"written: {target if shown.startswith('..') else shown}")
if failed:
    print("FAILED: " + "; ".join(failed), file=sys.stderr)
    sys.exit(1)
EOF
bench_check_json

#!/usr/bin/env bash
# Soak: training jobs (train_mlp, 3 CPU ranks by default) driven to their
# last step through a stream of faults, one after another for a bounded
# time, as a cluster inflicts them. Each attempt at a job draws one fault:
#   kill     a random rank kills itself (SIGKILL) at a random point: forward,
#            backward, inside a collective, or during a save between its
#            shard and the commit; dtrain-run --max-restarts 1 restarts the
#            ranks, which resume from the newest checkpoint
#   preempt  dtrain-run gets SIGUSR1 or SIGTERM at a random moment: the job
#            saves, exits 75, and this script requeues it (runs it again)
#   disk     the checkpoint file system (a tmpfs of its own) is full when the
#            attempt starts and is freed at a random moment; saves fail in
#            between (on_save_error=continue trains on)
# Every attempt that has not finished the job ends on a preemption notice,
# so a job takes several attempts. Every launch of the ranks (an attempt, or
# a restart within one) is a segment; the steps a fault cost are those its
# segment trained beyond the step the next one resumed from. The script
# checks that a kill loses at most save_every steps, a preemption none, and
# that every job's final parameters equal an uninterrupted run's bit for bit
# (each recovery resumes from a checkpoint that holds the data position);
# it reports the checkpoint bytes left (keep_last=2) and writes a JSON
# summary. It fails when a bound or an equality fails, or a job ends with an
# unexpected status.
#
# The disk faults need a mount namespace (root, or unprivileged user
# namespaces: the script re-runs itself under `unshare -rm`); without one
# they are left out and the summary says so.
#
# usage: tests/reliability/run_soak.sh [BUILD_DIR] [--minutes M | --seconds S] [--ranks N] [--seed S]
#                                      [--json PATH] [--record]
# Defaults: build, 30 minutes, 3 ranks, a random seed (printed; --seed
# repeats the draws). --json writes the summary to PATH; --record also puts
# it into bench/results/faults.json ("soak"). CTest runs a 2-minute version
# (reliability_soak).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$repo/build
seconds=1800
ranks=3
seed=$RANDOM$RANDOM
json=""
record=""
usage="usage: tests/reliability/run_soak.sh [BUILD_DIR] [--minutes M | --seconds S] [--ranks N] [--seed S] [--json PATH] [--record]"
args=("$@")
if [[ $# -gt 0 && $1 != --* ]]; then build=$1; shift; fi
while [[ $# -gt 0 ]]; do
  if [[ $1 == --record ]]; then record=$repo/bench/results/faults.json; shift; continue; fi
  [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
  case $1 in
    --minutes) [[ $2 =~ ^[0-9]+$ ]] || { echo "run_soak.sh: --minutes takes whole minutes" >&2; exit 2; }; seconds=$(($2 * 60)) ;;
    --seconds) [[ $2 =~ ^[0-9]+$ ]] || { echo "run_soak.sh: --seconds takes whole seconds" >&2; exit 2; }; seconds=$2 ;;
    --ranks) [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "run_soak.sh: --ranks takes a positive count" >&2; exit 2; }; ranks=$2 ;;
    --seed) [[ $2 =~ ^[0-9]+$ ]] || { echo "run_soak.sh: --seed takes a number" >&2; exit 2; }; seed=$2 ;;
    --json) json=$(realpath -m "$2") ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift 2
done
build=$(realpath -m "$build")
launcher=$build/tools/dtrain-run
train=$build/examples/train_mlp
for f in "$launcher" "$train"; do
  [[ -x $f ]] || { echo "run_soak.sh: $f is missing: build the project first (cmake --build $build)" >&2; exit 1; }
done

# A private mount namespace for the checkpoint tmpfs: re-run inside one.
if [[ -z ${DTRAIN_SOAK_NAMESPACE:-} ]]; then
  if unshare -rm true 2> /dev/null; then
    DTRAIN_SOAK_NAMESPACE=1 exec unshare -rm "$0" "${args[@]}" --seed "$seed"
  fi
  DTRAIN_SOAK_NAMESPACE=none
fi

echo "soak: ${seconds} s, $ranks ranks, seed $seed (--seed $seed repeats the draws)"
RANDOM=$seed
work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-soak.XXXXXX")
disk=$work/disk
mkdir -p "$disk"
disk_faults=1
if [[ $DTRAIN_SOAK_NAMESPACE != 1 ]] || ! mount -t tmpfs -o size=4m tmpfs "$disk" 2> /dev/null; then
  disk_faults=0
  echo "soak: no mount namespace here (unshare -rm failed): the disk faults are left out"
fi
cleanup() {
  [[ $disk_faults == 1 ]] && umount "$disk" 2> /dev/null
  if [[ -n ${DTRAIN_SOAK_KEEP:-} ]]; then echo "soak: logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

save_every=20
steps=240
common=(hidden=64,64 samples=4096 features=16 classes=4 batch_size=16 num_workers=0 log_every=1
        save_every=$save_every keep_last=2 timeout_s=20 on_save_error=continue)

# The uninterrupted run every job must equal. Its wall time (start-up
# included) scales the moments the faults are drawn at, so they land inside
# a job on a quiet machine and a loaded one alike.
started=$(date +%s%N)
"$launcher" --nproc-per-node "$ranks" "$train" steps=$steps "${common[@]}" checkpoint_dir="$work/ref" \
  save_params="$work/ref.safetensors" > "$work/ref.log" 2>&1 || { cat "$work/ref.log" >&2; exit 1; }
job_ms=$((($(date +%s%N) - started) / 1000000))
echo "soak: an uninterrupted job takes $job_ms ms"
# A moment within the first `percent` % of a job's wall time, in seconds.
moment() { local ms=$((1 + RANDOM % (job_ms * $1 / 100 + 1))); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

# Fills the checkpoint disk but 8 KiB (less than a shard file).
fill_disk() {
  local free
  free=$(df -B1 --output=avail "$disk" | tail -1)
  head -c $((free - 8192)) /dev/zero > "$disk/ballast" 2> /dev/null || true
}

attempt=0   # attempts over all jobs
jobs=0
equal_jobs=0
records=()  # "job attempt kind status" per attempt
left_bytes=0
deadline=$((SECONDS + seconds))
while ((SECONDS < deadline)); do
  jobs=$((jobs + 1))
  ck=$disk/job.$jobs
  final=$work/final.$jobs.safetensors
  tries=0
  while :; do
    attempt=$((attempt + 1))
    tries=$((tries + 1))
    kinds=(kill preempt)
    [[ $disk_faults == 1 ]] && kinds+=(disk)
    kind=${kinds[$((RANDOM % ${#kinds[@]}))]}
    ((tries > 40)) && kind=none
    cmd=("$launcher" --nproc-per-node "$ranks" --grace-period 30)
    [[ $kind == kill ]] && cmd+=(--max-restarts 1)
    cmd+=("$train" steps=$steps "${common[@]}" checkpoint_dir="$ck" resume=latest save_params="$final")
    fault=()
    if [[ $kind == kill ]]; then
      points=(forward backward collective save)
      point=${points[$((RANDOM % 4))]}
      most=200
      [[ $point == save ]] && most=3
      fault=(DTRAIN_FAULT_INJECT="$point:$((RANDOM % ranks)):$((1 + RANDOM % most))")
    fi
    [[ $kind == disk ]] && fill_disk
    set +e
    env "${fault[@]}" "${cmd[@]}" > "$work/a.$attempt.log" 2>&1 &
    pid=$!
    freer=""
    if [[ $kind == disk ]]; then
      # Freed at a moment drawn apart from the notice's: a notice that
      # comes first meets the full disk, its checkpoint fails, and the
      # requeue goes back to the last one that was written.
      free_at=$(moment 80)
      (sleep "$free_at"; rm -f "$disk/ballast") &
      freer=$!
    fi
    if [[ $kind != none ]]; then
      # A kill attempt restarts its ranks first: its notice comes later.
      if [[ $kind == kill ]]; then sleep "$(moment 80)"; sleep "$(moment 100)"; else sleep "$(moment 80)"; fi
      signals=(USR1 TERM)
      kill -"${signals[$((RANDOM % 2))]}" "$pid" 2> /dev/null
    fi
    wait "$pid"
    status=$?
    [[ -n $freer ]] && wait "$freer"
    set -e
    rm -f "$disk/ballast"
    records+=("$jobs $attempt $kind $status")
    # 0: the job finished. 75: preempted, saved, requeue. 128 + N: the
    # notice came while no run loop watched (the ranks starting up, or
    # restarting after a kill) and ended them as the signal does; the
    # requeue resumes from the newest checkpoint all the same.
    if [[ $status -eq 0 && -f $final ]]; then break; fi
    if [[ $status -ne 75 && $status -lt 128 ]]; then
      echo "run_soak.sh: job $jobs attempt $tries ($kind) ended with status $status:" >&2
      tail -20 "$work/a.$attempt.log" >&2
      exit 1
    fi
  done
  if cmp -s "$work/ref.safetensors" "$final"; then equal_jobs=$((equal_jobs + 1)); fi
  left_bytes=$(du -sb "$ck" | cut -f1)
  echo "job $jobs: $tries attempt(s), final parameters $(cmp -s "$work/ref.safetensors" "$final" && echo equal || echo DIFFERENT), $left_bytes bytes of checkpoints left"
  rm -rf "$ck" "$final"
done

SOAK_STEPS=$steps /usr/bin/python3 - "$work" "$jobs" "$equal_jobs" "$left_bytes" "$save_every" "$json" "$seed" "$seconds" "$ranks" \
  "$disk_faults" "$record" "${records[@]}" <<'PY'
import json, os, re, sys
work, jobs, equal_jobs, left, save_every, out, seed, seconds, ranks, disk_faults, record = sys.argv[1:12]
records = [r.split() for r in sys.argv[12:]]  # job, attempt, kind, exit status
save_every = int(save_every)

def segments(attempt):
    """Per launch of the ranks: the step rank 0 resumed from (None: it never
    got that far), the highest step it trained, and whether a rank killed
    itself (the injected fault) in it."""
    segs = [[None, None, False]]
    for line in open(f"{work}/a.{attempt}.log", errors="replace"):
        if "restarting all" in line:
            segs.append([None, None, False])
        seg = segs[-1]
        if "fault injection: SIGKILL" in line:
            seg[2] = True
        if not line.startswith("[rank 0]"):
            continue
        m = re.search(r"resumed from \S+ at step (\d+)", line)
        if m:
            seg[0] = int(m.group(1))
        if "no checkpoint in" in line:
            seg[0] = 0
        m = re.search(r"\bstep +(\d+)/\d+ \|", line) or re.search(r"preempted.* after step (\d+)", line)
        if m:
            seg[1] = max(seg[1] or 0, int(m.group(1)))
    return segs

# A launch ends by the injected kill, or by its attempt's end: on a disk
# attempt, whatever ended it, the disk's cost (saves failed until it was
# freed); else 75 is a preemption, 128 + N a notice outside the run loop, 0
# the job done. A launch that never got to resume trained nothing and is
# left out.
causes = ("kill", "preempt", "disk", "notice outside the loop")
lost = {c: [] for c in causes}
faults = {"kill": 0, "preempt": 0, "disk": 0}
by_job = {}
for job, attempt, kind, status in records:
    by_job.setdefault(job, []).append((attempt, kind, int(status)))
for job, attempts in by_job.items():
    chain = []  # (resumed from, reached, cause, where) in order
    for attempt, kind, status in attempts:
        segs = segments(attempt)
        for i, (r, m, killed) in enumerate(segs):
            where = f"job {job} attempt {attempt} ({kind}, exit {status}) launch {i + 1}"
            if r is None:
                if m is not None:
                    sys.exit(f"run_soak.sh: {where} trained without saying where it started")
                continue
            if killed:
                cause = "kill"
            elif kind == "disk" and status != 0:
                cause = "disk"
            elif status == 75:
                cause = "preempt"
            elif status >= 128:
                cause = "notice outside the loop"
            else:
                cause = None
            chain.append((r, m if m is not None else r, cause, where))
        if kind in faults:
            faults[kind] += 1
    for (r, m, cause, where), (r_next, _, _, where_next) in zip(chain, chain[1:]):
        lost[cause].append(max(0, m - r_next))
        if m - r_next > (save_every if cause == "kill" else 0) and cause != "disk":
            print(f"run_soak.sh: {where} resumed at step {r} and reached step {m}; "
                  f"{where_next} resumed at step {r_next}", file=sys.stderr)
result = {
    "seed": int(seed), "seconds": int(seconds), "ranks": int(ranks), "jobs": int(jobs),
    "steps_per_job": int(os.environ["SOAK_STEPS"]), "save_every": save_every,
    "attempts": len(records), "attempts_by_fault": faults,
    "disk_faults": "tmpfs filled and freed" if disk_faults == "1" else "left out: no mount namespace",
    "recoveries": {c: len(v) for c, v in lost.items()},
    "steps_lost_max": {c: max(v, default=0) for c, v in lost.items()},
    "steps_lost_mean": {c: round(sum(v) / len(v), 2) if v else 0 for c, v in lost.items()},
    "steps_lost_total": {c: sum(v) for c, v in lost.items()},
    "jobs_equal_to_uninterrupted": int(equal_jobs),
    "checkpoint_bytes_left": int(left),
}
print(json.dumps(result, indent=1))
if out:
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
if record:
    # The soak's own provenance, and the file's as the newest run's (bench/machine.py).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(record))), ""))
    import machine
    stamp = machine.run_record(os.cpu_count())
    faults = json.load(open(record)) if os.path.exists(record) else {}
    faults["soak"] = {**stamp, **result}
    faults.update(stamp)
    with open(record, "w") as f:
        json.dump(faults, f, indent=1)
        f.write("\n")
problems = []
if int(jobs) < 1:
    problems.append("no job finished")
if int(equal_jobs) != int(jobs):
    problems.append(f"{int(jobs) - int(equal_jobs)} job(s) ended with parameters unlike the uninterrupted run's")
if max(lost["kill"], default=0) > save_every:
    problems.append(f"a kill lost {max(lost['kill'])} steps, more than save_every = {save_every}")
for c in ("preempt", "notice outside the loop"):
    if max(lost[c], default=0) != 0:
        problems.append(f"a {c} lost {max(lost[c])} steps (it must lose none)")
for p in problems:
    print("run_soak.sh: " + p, file=sys.stderr)
sys.exit(1 if problems else 0)
PY

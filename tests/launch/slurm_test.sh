#!/usr/bin/env bash
# A real Slurm cluster on this machine, and the examples' batch scripts run
# through it with nothing simulated: munged with a generated key, slurmctld
# and one slurmd (this host, all its cores), in a scratch folder, on free
# ports; every daemon is stopped by its process id at the end.
#
#   1. examples/slurm/srun.sbatch: train_mlp as 2 srun tasks (dtrain::init
#      reading Slurm's own variables) ends bit-identical to dtrain-run's job.
#   2. examples/slurm/requeue.sbatch: `scancel --signal=USR1 --batch` (what
#      `#SBATCH --signal=B:USR1@N` sends) makes the job save, exit 75 and
#      requeue itself; the requeued job resumes and ends bit-identical to an
#      uninterrupted run.
#   3. `scancel` of a running srun job leaves a checkpoint that a new run
#      resumes from, bit-identical again.
#   4. Mismatches are one line: the program started in the batch script
#      instead of by srun, and dtrain-run --nnodes above the job's nodes.
#   5. The notice on Slurm's own timer: requeue.sbatch submitted with
#      --time=3 --signal=B:USR1@100 gets USR1 100 s before its limit (Slurm
#      may send it up to 60 s earlier), saves, exits 75, is requeued and
#      ends bit-identical, never reaching the limit.
#
# usage: slurm_test.sh TRAIN_MLP DTRAIN_RUN SOURCE_DIR
# Exits 77 (CTest: skipped) when Slurm or munge is not installed or this is
# not root (slurmd starts job steps as their user); scripts/test.sh installs
# the packages (slurm-wlm, munge).
set -euo pipefail
train_mlp=$1 dtrain_run=$2 src=$3
skip() { echo "slurm_test: SKIPPED: $*"; exit 77; }
for tool in munged munge slurmctld slurmd sbatch srun scontrol scancel sinfo python3; do
  command -v "$tool" > /dev/null || skip "$tool is missing (apt-get install slurm-wlm munge)"
done
[[ $(id -u) == 0 ]] || skip "slurmd must run as root to start job steps"

work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-slurm.XXXXXX")
pids=()
cleanup() {
  set +e
  if [[ -f $work/slurm.conf ]]; then
    SLURM_CONF=$work/slurm.conf scancel --full --quiet --user="$(id -un)" 2> /dev/null
    for _ in $(seq 50); do
      [[ -z $(SLURM_CONF=$work/slurm.conf squeue -h -o %i 2> /dev/null) ]] && break
      sleep 0.2
    done
  fi
  for f in slurmd slurmctld munged; do
    [[ -f $work/$f.pid ]] && pids+=("$(cat "$work/$f.pid")")
  done
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2> /dev/null
  done
  rm -rf -- "$work"
}
trap cleanup EXIT
fail() {
  echo "slurm_test: FAILED: $*" >&2
  for f in "$work"/*.out "$work"/slurmctld.log "$work"/slurmd.log; do
    [[ -f $f ]] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }
  done
  exit 1
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }

# --- the cluster ----------------------------------------------------------
host=$(hostname -s)
mkdir -p "$work/state" "$work/spool" "$work/jobs"
head -c 1024 /dev/urandom > "$work/munge.key"
chmod 400 "$work/munge.key"
munged --force --socket="$work/munge.sock" --key-file="$work/munge.key" --log-file="$work/munged.log" \
  --pid-file="$work/munged.pid" --seed-file="$work/munged.seed" || fail "munged did not start"
# cred_expire: a requeued job waits this long (default 120 s) before it may
# start again.
cat > "$work/slurm.conf" <<EOF
ClusterName=dtraintest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 100); do
  [[ $(sinfo -h -o %T 2> /dev/null) == idle ]] && break
  sleep 0.2
done
[[ $(sinfo -h -o %T) == idle ]] || fail "the node did not come up: $(sinfo -h -o '%T %E')"
echo "slurm_test: $(slurmctld -V) on $host, $(nproc) CPUs"

# --- helpers ----------------------------------------------------------------
# job_field ID NAME: a field of `scontrol show job`.
job_field() { scontrol -o show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# wait_done ID SECONDS: until the job has ended for good; prints its state.
wait_done() {
  local id=$1 state
  for _ in $(seq $(($2 * 5))); do
    state=$(job_field "$id" JobState)
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) echo "$state"; return ;; esac
    sleep 0.2
  done
  fail "job $id did not end within $2 s (state $state)"
}
# wait_checkpoint DIR SECONDS: until DIR holds a committed checkpoint.
wait_checkpoint() {
  for _ in $(seq $(($2 * 10))); do
    compgen -G "$1/step-*/index.json" > /dev/null && return
    sleep 0.1
  done
  fail "no checkpoint in $1 within $2 s"
}
same_params() { cmp -s "$1" "$2" || fail "$3: $1 and $2 differ"; }

config=$src/examples/configs/ddp_host.yaml
job=("$train_mlp" --config "$config" num_workers=0 log_every=100 timeout_s=60)
short=(steps=30)
long=(steps=600 save_every=20)
# The interrupted jobs: rank 0 sleeps 10 ms in every forward (no change to
# the arithmetic), so that they run for seconds, not a fraction of one, and
# the notice arrives mid-run.
slow=DTRAIN_FAULT_DELAY=0:10
# The uninterrupted runs through dtrain-run.
"$dtrain_run" --nproc-per-node 2 "${job[@]}" "${short[@]}" save_params="$work/ref_short.safetensors" \
  > "$work/ref_short.out" 2>&1 || fail "dtrain-run's reference run failed"
"$dtrain_run" --nproc-per-node 2 "${job[@]}" "${long[@]}" save_params="$work/ref_long.safetensors" \
  checkpoint_dir="$work/ref_ck" > "$work/ref_long.out" 2>&1 || fail "dtrain-run's long reference run failed"

# --- 1. srun tasks --------------------------------------------------------------
id=$(sbatch --parsable --nodes=1 --ntasks-per-node=2 --chdir="$work/jobs" -o "$work/srun.out" \
  "$src/examples/slurm/srun.sbatch" "${job[@]}" "${short[@]}" save_params="$work/srun.safetensors")
[[ $(wait_done "$id" 120) == COMPLETED ]] || fail "the srun job ended $(job_field "$id" JobState)"
grep -q "train_mlp: 2 rank(s)" "$work/srun.out" || fail "the srun job did not train on 2 ranks"
same_params "$work/srun.safetensors" "$work/ref_short.safetensors" "srun's job against dtrain-run's"
echo "slurm_test: 1. srun.sbatch, 2 tasks: parameters bit-identical to dtrain-run's"

# --- 2. preemption notice, exit 75, requeue ------------------------------------------
id=$(sbatch --parsable --nodes=1 --chdir="$work/jobs" -o "$work/requeue.out" \
  --export=ALL,DTRAIN_NPROC=2,$slow,PATH="$(dirname "$dtrain_run"):$PATH" \
  "$src/examples/slurm/requeue.sbatch" "${job[@]}" "${long[@]}" save_params="$work/requeue.safetensors" \
  checkpoint_dir="$work/requeue_ck")
wait_checkpoint "$work/requeue_ck" 120
scancel --signal=USR1 --batch "$id"
[[ $(wait_done "$id" 300) == COMPLETED ]] || fail "the requeued job ended $(job_field "$id" JobState)"
restarts=$(job_field "$id" Restarts)
[[ $restarts == 1 ]] || fail "the job ran $((restarts + 1)) times, not twice (once preempted, once requeued)"
grep -q "exiting with code 75" "$work/requeue.out" || fail "dtrain-run did not exit with 75 on the notice"
grep -q "preempted (SIGUSR1)" "$work/requeue.out" || fail "no rank reported the SIGUSR1 notice"
same_params "$work/requeue.safetensors" "$work/ref_long.safetensors" "the requeued job against an uninterrupted run"
echo "slurm_test: 2. requeue.sbatch: USR1 to the batch shell, exit 75, requeued once, resumed: bit-identical"

# --- 3. scancel leaves a checkpoint -------------------------------------------------
id=$(sbatch --parsable --nodes=1 --ntasks-per-node=2 --chdir="$work/jobs" -o "$work/cancel.out" --export=ALL,$slow \
  "$src/examples/slurm/srun.sbatch" "${job[@]}" "${long[@]}" checkpoint_dir="$work/cancel_ck")
wait_checkpoint "$work/cancel_ck" 120
scancel "$id"
state=$(wait_done "$id" 120)
[[ $state == CANCELLED ]] || fail "the cancelled job ended $state"
"$dtrain_run" --nproc-per-node 2 "${job[@]}" "${long[@]}" checkpoint_dir="$work/cancel_ck" resume=latest \
  save_params="$work/cancel.safetensors" > "$work/resume.out" 2>&1 || fail "resuming the cancelled job failed"
grep -q "resumed from $work/cancel_ck/step-" "$work/resume.out" || fail "the run after scancel did not resume from a checkpoint"
same_params "$work/cancel.safetensors" "$work/ref_long.safetensors" "the job resumed after scancel"
echo "slurm_test: 3. scancel: the checkpoint it left resumes to bit-identical parameters"

# --- 4. mismatches --------------------------------------------------------------------
id=$(sbatch --parsable --nodes=1 --ntasks=2 --chdir="$work/jobs" -o "$work/batch.out" \
  --wrap "$(printf '%q ' "${job[@]}" "${short[@]}")")
wait_done "$id" 120 > /dev/null
grep -q "runs in the Slurm job's batch script, not as a task of srun" "$work/batch.out" ||
  fail "train_mlp in the batch script did not stop with the one line"
id=$(sbatch --parsable --nodes=1 --chdir="$work/jobs" -o "$work/nnodes.out" \
  --wrap "$(printf '%q ' "$dtrain_run" --nnodes 2 --node-rank 0 --master-addr "$host" --master-port 29511 \
    "${job[@]}" "${short[@]}")")
wait_done "$id" 120 > /dev/null
grep -q -- "--nnodes 2, but this Slurm job has 1 node(s)" "$work/nnodes.out" ||
  fail "dtrain-run --nnodes 2 in a 1-node job did not stop with the one line"
echo "slurm_test: 4. a program in the batch script and --nnodes above the job's nodes: one line each"

# --- 5. the notice on Slurm's timer (--signal=B:USR1@N) ---------------------------------
# The first attempt is slow (rank 0 sleeps 200 ms a step: 600 steps would
# take 2 minutes, past the notice), the requeued one runs at full speed.
cat > "$work/slow_first_attempt.sh" <<'EOF2'
#!/bin/bash
[[ ${SLURM_RESTART_COUNT:-0} == 0 ]] && export DTRAIN_FAULT_DELAY=0:200
exec "$@"
EOF2
chmod +x "$work/slow_first_attempt.sh"
id=$(sbatch --parsable --nodes=1 --chdir="$work/jobs" -o "$work/timed.out" --time=3 --signal=B:USR1@100 \
  --export=ALL,DTRAIN_NPROC=2,PATH="$(dirname "$dtrain_run"):$PATH" \
  "$src/examples/slurm/requeue.sbatch" "$work/slow_first_attempt.sh" "${job[@]}" "${long[@]}" \
  save_params="$work/timed.safetensors" checkpoint_dir="$work/timed_ck")
# When the first attempt starts, and when it stops running (saved, exit 75).
for _ in $(seq 600); do [[ $(job_field "$id" JobState) == RUNNING ]] && break; sleep 0.2; done
started=$(date +%s)
for _ in $(seq 1000); do [[ $(job_field "$id" JobState) == RUNNING ]] || break; sleep 0.2; done
stopped=$(date +%s)
[[ $(wait_done "$id" 300) == COMPLETED ]] || fail "the timed job ended $(job_field "$id" JobState)"
[[ $(job_field "$id" Restarts) == 1 ]] || fail "the timed job ran $(($(job_field "$id" Restarts) + 1)) times, not twice"
grep -q "preempted (SIGUSR1)" "$work/timed.out" || fail "no rank of the timed job reported the SIGUSR1 notice"
ran=$((stopped - started))
# Due at 180 - 100 = 80 s, possibly up to 60 s early; then the save and exit.
((ran >= 15 && ran <= 100)) || fail "the first attempt ran $ran s: the notice was due 20 to 80 s after its start"
same_params "$work/timed.safetensors" "$work/ref_long.safetensors" "the job requeued by Slurm's timed notice"
echo "slurm_test: 5. --time=3 --signal=B:USR1@100: the notice came after $ran s, requeued once: bit-identical"

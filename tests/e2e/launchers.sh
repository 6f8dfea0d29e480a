#!/bin/sh
# The launchers in contrib/launch, as far as this machine can check them:
#   - shell syntax (bash -n) and shellcheck where it is installed, the
#     SkyPilot setup/run blocks included;
#   - the Slurm script run against stand-in srun and scontrol: rank 0's
#     address from the node list, the trainrun command, requeue on exit 75
#     (and not on 0 or a failure), USR1 passed on to the ranks;
#   - node-ranks.sh: rank arithmetic, signals, exit codes, a failing rank
#     stopping the others, and a real 2-node job over TCP on this machine;
#   - the YAML files parsed (PyYAML) and checked for the command, the
#     environment, spot recovery and gang scheduling.
. "$(dirname "$0")/lib.sh"
L="$TR_SRCDIR/contrib/launch"
PY=${PYTHON:-python3}

# --- syntax -----------------------------------------------------------------
for f in slurm.sbatch node-ranks.sh; do
  bash -n "$L/$f" || fail "$f: bash syntax"
done
if command -v "$PY" > /dev/null && "$PY" -c 'import yaml' 2> /dev/null; then
  have_yaml=1
else
  have_yaml=0
  echo "SKIP (part): PyYAML is not installed: the YAML files are not parsed"
fi
if [ "$have_yaml" = 1 ]; then
  # SkyPilot's setup and run blocks are bash scripts too
  for block in setup run; do
    "$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])' \
      "$L/skypilot.yaml" "$block" > "sky-$block.sh" || fail "skypilot.yaml: no $block"
    bash -n "sky-$block.sh" || fail "skypilot.yaml: $block is not valid bash"
  done
fi
if command -v shellcheck > /dev/null; then
  shellcheck -s bash "$L/slurm.sbatch" "$L/node-ranks.sh" || fail "shellcheck"
  if [ "$have_yaml" = 1 ]; then
    # SKYPILOT_* and the envs come from SkyPilot (SC2154: referenced, not assigned)
    shellcheck -s bash -e SC2154 sky-setup.sh sky-run.sh || fail "shellcheck: skypilot.yaml blocks"
  fi
else
  echo "SKIP (part): shellcheck is not installed"
fi

# --- Slurm, with stand-ins for srun and scontrol --------------------------------------
mkdir bin
cat > bin/scontrol << 'EOF'
#!/bin/sh
case "$1 $2" in
  "show hostnames") printf 'gpu-a01\ngpu-a02\n' ;;
  "requeue "*) echo "$2" >> "$WORK/requeued" ;;
  *) echo "scontrol stand-in: unexpected $*" >&2; exit 1 ;;
esac
EOF
# srun runs the task in its own place (exec), so a signal sent to srun
# reaches the task as real srun forwards it
cat > bin/srun << 'EOF'
#!/bin/sh
echo "$*" > "$WORK/srun.args"
echo "$TRAINRUN_MASTER $CUDA_DEVICE_ORDER" > "$WORK/srun.env"
while [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done
exec "$@"
EOF
# trainrun stand-in: exits $STATUS, or with "wait" waits for USR1 and then
# exits 75 as a preempted trainrun does
cat > bin/fake-trainrun << 'EOF'
#!/bin/sh
if [ "$STATUS" = wait ]; then
  trap 'exit 75' USR1
  touch "$WORK/started"
  while :; do sleep 0.1; done
fi
exit "$STATUS"
EOF
chmod +x bin/*
WORK=$(pwd)
export WORK

sbatch_run() { # STATUS [extra env...]: run the batch script as Slurm would
  status=$1
  shift
  rm -f requeued
  env PATH="$WORK/bin:$PATH" TRAINRUN=fake-trainrun STATUS="$status" SLURM_JOB_ID=4242 \
    SLURM_JOB_NODELIST='gpu-a[01-02]' SLURM_NTASKS=16 "$@" \
    bash "$L/slurm.sbatch" recipe.lua train.steps=10 > sbatch.out 2>&1
}

sbatch_run 0 || { cat sbatch.out; fail "slurm: a finished run should exit 0"; }
[ "$(cat srun.env)" = "gpu-a01:24242 PCI_BUS_ID" ] ||
  fail "slurm: TRAINRUN_MASTER/CUDA_DEVICE_ORDER are '$(cat srun.env)', expected gpu-a01:24242 PCI_BUS_ID"
grep -q -- "--cpu-bind=none" srun.args || fail "slurm: srun should leave placement to trainrun"
grep -q "fake-trainrun recipe.lua train.steps=10 device=cuda comm=nccl --resume auto$" srun.args ||
  fail "slurm: trainrun command is '$(cat srun.args)'"
[ ! -f requeued ] || fail "slurm: a finished run was requeued"

sbatch_run 75 || { cat sbatch.out; fail "slurm: a preempted run should requeue and exit 0"; }
[ "$(cat requeued)" = 4242 ] || fail "slurm: exit 75 did not requeue job 4242"

if sbatch_run 3; then fail "slurm: a failed run exited 0"; fi
grep -q "failed with status 3" sbatch.out || { cat sbatch.out; fail "slurm: failure not reported"; }
[ ! -f requeued ] || fail "slurm: a failed run was requeued"

sbatch_run 75 SLURM_RESTART_COUNT=20 && fail "slurm: requeued past MAX_REQUEUES"
[ ! -f requeued ] || fail "slurm: requeued past MAX_REQUEUES"

# the time-limit signal: Slurm sends USR1 to the batch shell (B:), which passes it on
rm -f requeued started
env PATH="$WORK/bin:$PATH" TRAINRUN=fake-trainrun STATUS=wait SLURM_JOB_ID=4242 \
  SLURM_JOB_NODELIST='gpu-a[01-02]' SLURM_NTASKS=16 bash "$L/slurm.sbatch" recipe.lua > usr1.out 2>&1 &
batch=$!
i=0
while [ ! -f started ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -f started ] || fail "slurm: the task never started"
kill -USR1 $batch
wait $batch || { cat usr1.out; fail "slurm: USR1 should end in a requeue and exit 0"; }
grep -q "time limit near" usr1.out || fail "slurm: USR1 not handled"
[ "$(cat requeued)" = 4242 ] || fail "slurm: USR1 -> exit 75 did not requeue"

# the signal comes early enough for trainrun's checkpoint deadline
lead=$(sed -n 's/^#SBATCH --signal=B:USR1@\([0-9]*\)$/\1/p' "$L/slurm.sbatch")
deadline=$("$TRAINRUN" show "$TR_SRCDIR/tests/config/tiny.lua" | sed -n 's/^checkpoint.deadline = \([0-9]*\).*/\1/p')
[ -n "$lead" ] && [ -n "$deadline" ] || fail "slurm: no --signal=B:USR1@N line, or no checkpoint.deadline"
[ "$lead" -gt "$deadline" ] || fail "slurm: USR1 comes $lead s before the end, the checkpoint may take $deadline s"
grep -q '^#SBATCH --requeue$' "$L/slurm.sbatch" || fail "slurm: no --requeue"

# --- node-ranks.sh --------------------------------------------------------------------
cat > bin/rank << 'EOF'
#!/bin/sh
echo "$TRAINRUN_RANK $TRAINRUN_WORLD_SIZE $TRAINRUN_LOCAL_RANK $TRAINRUN_LOCAL_WORLD_SIZE $*" > "$WORK/rank-$TRAINRUN_RANK"
case "${MODE:-ok}" in
  ok) exit 0 ;;
  preempted) exit 75 ;;
  # rank FAIL fails at once; the others run until told to stop, then save and exit 75
  fail) [ "$TRAINRUN_RANK" = "$FAIL" ] && exit 3 ;;
  # ... or ignore SIGTERM, hung
  hung) [ "$TRAINRUN_RANK" = "$FAIL" ] && exit 3; trap '' TERM; while :; do sleep 0.1; done ;;
esac
trap 'exit 75' TERM USR1
touch "$WORK/up-$TRAINRUN_RANK"
while :; do sleep 0.1; done
EOF
chmod +x bin/rank
NR="$L/node-ranks.sh"
export TRAINRUN_MASTER=gpu-a01:29500

bash "$NR" 1 2 3 bin/rank recipe.lua device=cuda || fail "node-ranks: ranks that finish should exit 0"
for r in 3 4 5; do
  [ "$(cat rank-$r)" = "$r 6 $((r - 3)) 3 recipe.lua device=cuda" ] ||
    fail "node-ranks: rank $r saw '$(cat rank-$r)'"
done
[ ! -f rank-2 ] && [ ! -f rank-6 ] || fail "node-ranks: node 1 of 2 started another node's rank"

code=0
MODE=preempted bash "$NR" 0 1 2 bin/rank || code=$?
[ $code = 75 ] || fail "node-ranks: preempted ranks gave $code, expected 75"

start=$(date +%s)
code=0
MODE=fail FAIL=1 bash "$NR" 0 1 4 bin/rank 2> fail.err || code=$?
[ $code = 3 ] || { cat fail.err; fail "node-ranks: a failing rank gave $code, expected its 3"; }
[ $(($(date +%s) - start)) -lt 30 ] || fail "node-ranks: the other ranks were not stopped"
grep -q "ended with status 3: stopping the others" fail.err || fail "node-ranks: the failure is not reported"
start=$(date +%s)
code=0
MODE=hung FAIL=0 STOP_GRACE=1 bash "$NR" 0 1 2 bin/rank 2> /dev/null || code=$?
[ $code = 3 ] || fail "node-ranks: with a hung rank, got $code, expected 3"
[ $(($(date +%s) - start)) -lt 20 ] || fail "node-ranks: a rank ignoring SIGTERM was not killed"

rm -f up-*
MODE=signal bash "$NR" 0 1 2 bin/rank &
pid=$!
i=0
while { [ ! -f up-0 ] || [ ! -f up-1 ]; } && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -USR1 $pid
code=0
wait $pid || code=$?
[ $code = 75 ] || fail "node-ranks: USR1 should reach every rank (exit 75), got $code"

code=0
(unset TRAINRUN_MASTER; bash "$NR" 0 1 1 bin/rank 2> nomaster.err) || code=$?
[ $code = 2 ] && grep -q TRAINRUN_MASTER nomaster.err || fail "node-ranks: runs without a rendezvous"
bash "$NR" 2 2 1 bin/rank 2> /dev/null && fail "node-ranks: node 2 of 2 accepted"

# a real job: two "nodes" of one rank each on this machine, over TCP, ends
# with the same weights as the local launcher's procs=2
if "$TRAINRUN" plugins comm 2> /dev/null | grep -q '^  tcp '; then
  R="$TR_SRCDIR/tests/config/tiny.lua"
  set -- train.steps=6 train.batch=8 train.micro_batch=2 comm=tcp
  port=$(free_port)
  export TRAINRUN_MASTER="127.0.0.1:$port"
  bash "$NR" 1 2 1 "$TRAINRUN" "$R" "$@" run_dir=nodes --quiet > node1.log 2>&1 &
  other=$!
  bash "$NR" 0 2 1 "$TRAINRUN" "$R" "$@" run_dir=nodes --quiet > node0.log 2>&1 || {
    cat node0.log node1.log; fail "node-ranks: rank 0 of a 2-node job failed"; }
  wait $other || { cat node1.log; fail "node-ranks: rank 1 of a 2-node job failed"; }
  unset TRAINRUN_MASTER
  "$TRAINRUN" "$R" "$@" run_dir=local procs=2 --quiet || fail "procs=2 failed"
  cmp "nodes/checkpoints/$(cat nodes/checkpoints/LATEST)/model.safetensors" \
    "local/checkpoints/$(cat local/checkpoints/LATEST)/model.safetensors" ||
    fail "node-ranks: 2 nodes x 1 rank trained other weights than procs=2"
else
  echo "SKIP (part): no tcp comm plugin built: no real multi-rank job"
fi

# --- YAML -----------------------------------------------------------------------------
if [ "$have_yaml" = 0 ]; then
  # without a parser, at least no tabs (YAML forbids them in indentation)
  for f in skypilot.yaml volcano-job.yaml; do
    ! grep -q "$(printf '\t')" "$L/$f" || fail "$f: tab in YAML"
  done
  exit 0
fi
"$PY" - "$L" << 'EOF' || fail "YAML launchers"
import sys, yaml

launch = sys.argv[1]
def check(ok, what):
    if not ok:
        sys.exit("FAIL: " + what)

sky = yaml.safe_load(open(launch + "/skypilot.yaml"))
res = sky["resources"]
check(res.get("use_spot") is True, "skypilot: not on spot instances")
check(":" in str(res.get("accelerators", "")), "skypilot: no accelerators")
check(res["job_recovery"].get("max_restarts_on_errors", 0) > 0,
      "skypilot: exit 75 (preempted) would not be restarted")
run = sky["run"]
for word in ("node-ranks.sh", "trainrun \"$RECIPE\"", "device=cuda", "comm=nccl", "--resume auto",
             "checkpoint.plugin=s3", "checkpoint.bucket=", "TRAINRUN_MASTER=",
             "$SKYPILOT_NODE_RANK", "$SKYPILOT_NUM_NODES", "$SKYPILOT_NUM_GPUS_PER_NODE"):
    check(word in run, "skypilot: run lacks " + word)
check("BUCKET" in sky["envs"] and "RECIPE" in sky["envs"], "skypilot: envs lack RECIPE/BUCKET")

vc = yaml.safe_load(open(launch + "/volcano-job.yaml"))
check(vc["apiVersion"].startswith("batch.volcano.sh/") and vc["kind"] == "Job", "volcano: not a Volcano Job")
spec = vc["spec"]
check(spec.get("schedulerName") == "volcano", "volcano: not scheduled by volcano")
replicas = sum(t["replicas"] for t in spec["tasks"])
check(spec["minAvailable"] == replicas, "volcano: minAvailable %s != replicas %d (no gang)"
      % (spec["minAvailable"], replicas))
check({"exitCode": 75, "action": "RestartJob"} in spec["policies"], "volcano: exit 75 does not restart the job")
check(any(p.get("event") == "PodEvicted" and p["action"] == "RestartJob" for p in spec["policies"]),
      "volcano: an evicted pod does not restart the job")
check("svc" in spec["plugins"] and "env" in spec["plugins"], "volcano: svc/env plugins missing")
task = spec["tasks"][0]
pod = task["template"]["spec"]
check(pod["restartPolicy"] == "Never", "volcano: pods must not restart alone (the ring would break)")
check(pod["terminationGracePeriodSeconds"] > 120, "volcano: no time to checkpoint after SIGTERM")
c = pod["containers"][0]
env = {e["name"]: e.get("value") for e in c["env"]}
check(env["TRAINRUN_NODES"] == str(task["replicas"]), "volcano: TRAINRUN_NODES != replicas")
check(env["TRAINRUN_MASTER"] == "%s-%s-0.%s:29500" % (vc["metadata"]["name"], task["name"],
      vc["metadata"]["name"]), "volcano: TRAINRUN_MASTER is not pod 0 of the job")
check(str(c["resources"]["limits"]["nvidia.com/gpu"]) == env["GPUS_PER_NODE"], "volcano: GPUs != GPUS_PER_NODE")
argv = c["command"] + c["args"]
check(argv[1].endswith("node-ranks.sh") and argv[2:5] == ["$(VC_TASK_INDEX)", "$(TRAINRUN_NODES)",
      "$(GPUS_PER_NODE)"], "volcano: node-ranks.sh arguments: %s" % argv[:5])
check(argv[5] == "trainrun" and "device=cuda" in argv and "comm=nccl" in argv, "volcano: command %s" % argv)
check(argv[-2:] == ["--resume", "auto"], "volcano: a restarted job must resume (--resume auto): %s" % argv)
EOF

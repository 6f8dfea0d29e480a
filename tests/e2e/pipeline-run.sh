#!/bin/sh
# Pipeline stages, run (parallel.pipeline, docs/scale-out.md): ranks over
# TCP on this machine, one thread each.  Checks that
#   - P = 2 stages train to the weights of one process within 1e-5 over 20
#     steps for a GPT (tied embeddings: the first and the last stage sum the
#     table's gradient) and a Llama, under gpipe, 1f1b and interleaved (2
#     chunks a stage), and P = 3 and 4 (1f1b, a Llama of 4 blocks);
#   - 2 stages x 2 data-parallel replicas (procs = 4): a Llama under 1f1b
#     bit-identical to 2 data-parallel ranks without stages (each stage's
#     gradients summed between its two ranks only: allreduce_group), a
#     tied GPT interleaved within 1e-5 of one process; its checkpoint
#     resumes on 2 stages;
#   - 3 stages x 2 replicas of a tied GPT over tcp (stage s of the replicas
#     are ranks s and 3 + s, no ring neighbours; the tied table summed
#     among ranks 0, 2, 3 and 5) within 1e-5 of one process, its trace
#     showing group all-reduces;
#   - over tcp and over mpi, 3 interleaved stages x 2 replicas (stage 2
#     sends to stage 0 of its replica, no ring neighbour) within 1e-5 of
#     one process;
#   - a model.from model (each stage loads only the weights its chunks
#     read) on 2 stages trains to one process's weights, bit for bit, and
#     LoRA adapters on it to one process's adapter;
#   - recompute with clipping, and bf16 (within 1e-3: the stages add the
#     tied and accumulated gradients in another order, as data parallelism
#     does) keep that agreement;
#   - an evaluation during the run gives the one process's validation loss;
#   - a checkpoint saved by a pipeline run (each stage writes its own
#     tensors, in parallel: layout.json and a blob a rank) holds the whole
#     model: resumed on one process and on 2 stages it ends within 1e-5 of
#     the run that kept going;
#   - micro_batch = "auto" with stages takes a smaller micro-batch than fits
#     so that 2 stages share 8 micro-batches of the batch of 8;
#   - metrics.jsonl has the share of each step the stages sat idle, and
#     each stage's trace (trace.json, trace-rank1.json) its forwards,
#     backwards and sends/receives per micro-batch;
#   - each of 2 stages of a 27 M Llama keeps less than 70% of what one
#     process holds resident (its share of the weights, gradients and
#     optimizer state: about 55%), at its peak too (initialised, evaluated,
#     saved and resumed as stages);
#   - --smoke of a recipe with stages (interleaved, 4 stages) runs its 2
#     steps on 2 CPU ranks as 2 stages, and one with sharded parameters on
#     2 ranks, each ending with the checkpoint round trip; one whose stages
#     cannot cut the model, or whose step has too few micro-batches to
#     interleave, fails before its steps, as the run would;
#   - early stopping stops 2 stages at the step one process stops at (the
#     best checkpoint kept), the JSON logger writes its lines, and a resume
#     with another model is refused;
#   - a stage killed, or stopped (comm.timeout), ends the job within a
#     bounded time with a message naming it (also on 2 x 2 ranks with the
#     gradients reduce-scattered during the backward); SIGTERM saves a checkpoint of
#     the whole model (exit 75) that resumes on 2 stages;
#   - parallel.shard = "optimizer" with 2 stages x 2 replicas (each
#     replica of a stage keeps its part of the stage's optimizer state, the
#     updated parts then summed among the replicas): the same weights bit
#     for bit as the replicas keeping the whole state, for the Llama and
#     the tied GPT interleaved, in pieces of 2,622 floats (bucket_mb 0.01);
#     its checkpoint resumes with and without the level bit for bit, and
#     a checkpoint without it resumes under it; over tcp the gradients
#     are reduce-scattered among a stage's replicas and the parts
#     all-gathered (plugin ABI 2.7), the same bits as the group all-reduces
#     a plugin without those slots gets (tcp behind a 2.6 vtable);
#   - parallel.shard = "gradients" with 2 x 2 (ZeRO-2 inside the stages:
#     the gradients reduce-scattered among a stage's replicas during the
#     backward, the parts other replicas own given back): the Llama and
#     the tied GPT interleaved within 1e-5 of one process, resumed bit for
#     bit, and over mpi on 3 interleaved stages x 2 replicas; refused with
#     a comm plugin without the group slots;
#   - a pipeline whose ranks are not its stages, and one with the shard
#     level "parameters", are refused naming the recipe line.
. "$(dirname "$0")/lib.sh"
# discarded memory faults until committed, as on the cuda backend
# (docs/testing.md): a rank touching what it gave back fails here
export TRAINRUN_CPU_DISCARD=strict
READ="$TR_SRCDIR/tests/e2e/read_safetensors.py"
GPT="$TR_SRCDIR/tests/config/tiny_gpt.lua"
LLAMA="$TR_SRCDIR/tests/config/tiny_llama.lua"
# a run's latest weights as one safetensors file (stages write a checkpoint
# each its own tensors: checkpoint_shard.h)
weights() {
  "$TRAINRUN" export "$1/checkpoints/$(cat "$1/checkpoints/LATEST")" --dtype fp32 -o "$1.st" \
    > "$1.export.log" 2>&1 || { cat "$1.export.log"; fail "export of $1"; }
  echo "$1.st"
}
# c_attn.bias left out as in shard.sh: its key part's gradient is exactly
# zero up to rounding noise, which AdamW turns into full steps
close() {
  python3 "$READ" close "$(weights "$1")" "$(weights "$2")" "$3" c_attn.bias >/dev/null || fail "$4"
}
base="train.steps=20 train.batch=8 train.micro_batch=1 train.log_every=5 train.threads=1
      checkpoint.every=10 optimizer.clip=0"
run() { # RUN_DIR RECIPE overrides...
  dir=$1 recipe=$2
  shift 2
  # shellcheck disable=SC2086
  "$TRAINRUN" "$recipe" $base "$@" run_dir="$dir" --quiet > "$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "$dir failed"; }
}

for model in gpt llama; do
  recipe=$GPT
  [ "$model" = llama ] && recipe=$LLAMA
  run "$model-one" "$recipe"
  for schedule in gpipe 1f1b interleaved; do
    extra=
    [ "$schedule" = interleaved ] && extra="parallel.virtual_stages=2"
    # shellcheck disable=SC2086
    run "$model-$schedule" "$recipe" procs=2 parallel.pipeline=2 parallel.schedule=$schedule $extra
    close "$model-one" "$model-$schedule" 1e-5 "$model: 2 stages, $schedule"
  done
done
grep -q 'pipeline: 2 stages, schedule 1f1b, 8 micro-batches a step' llama-1f1b.log ||
  { cat llama-1f1b.log; fail "the stages are not reported"; }
ck=llama-1f1b/checkpoints/step-0000000020
[ -f $ck/layout.json ] && [ -f $ck/shard-00000-of-00002.bin ] && [ -f $ck/shard-00001-of-00002.bin ] ||
  { ls $ck; fail "the stages did not each write their part of the checkpoint"; }

# 3 and 4 stages of a Llama of 4 blocks
wide="model.layers=4"
# shellcheck disable=SC2086
run deep-one "$LLAMA" $wide
for p in 3 4; do
  # shellcheck disable=SC2086
  run "deep-$p" "$LLAMA" $wide procs=$p parallel.pipeline=$p
  close deep-one "deep-$p" 1e-5 "llama: $p stages"
done

# stages x replicas: 2 x 2
run llama-dp "$LLAMA" procs=2
run llama-2x2 "$LLAMA" procs=4 parallel.pipeline=2
close llama-one llama-2x2 1e-5 "llama: 2 stages x 2 replicas"
cmp "$(weights llama-dp)" "$(weights llama-2x2)" > /dev/null ||
  fail "llama: 2 stages x 2 replicas differ from 2 data-parallel ranks"
run gpt-2x2 "$GPT" procs=4 parallel.pipeline=2 parallel.schedule=interleaved parallel.virtual_stages=2
close gpt-one gpt-2x2 1e-5 "gpt: 2 stages x 2 replicas, interleaved"
cp -r llama-2x2 resume-2x2
rm -rf resume-2x2/checkpoints/step-0000000020
echo step-0000000010 > resume-2x2/checkpoints/LATEST
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base procs=2 parallel.pipeline=2 run_dir=resume-2x2 --resume auto \
  > resume-2x2.log 2>&1 || { cat resume-2x2.log; fail "2 x 2 resumed on 2 stages"; }
close llama-2x2 resume-2x2 1e-5 "saved by 2 x 2, resumed on 2 stages"

# shard = "optimizer" inside the stages: each replica of a stage keeps its
# part of the stage's state (each run of the stage's parameters cut in
# pieces of at most 2,622 floats, each piece in 2 parts)
z="parallel.shard=optimizer parallel.bucket_mb=0.01"
run llama-2x2u "$LLAMA" procs=4 parallel.pipeline=2 parallel.bucket_mb=0.01
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base procs=4 parallel.pipeline=2 $z train.trace_every=10 run_dir=llama-2x2z \
  > llama-2x2z.log 2>&1 || { cat llama-2x2z.log; fail "llama-2x2z failed"; }
grep -q "optimizer state sharded over each stage's 2 replicas: rank 0 keeps 1272 of its stage's 2544 parameters' (parallel.shard = optimizer)" \
  llama-2x2z.log || { cat llama-2x2z.log; fail "llama-2x2z: the stage's state is not parted"; }
cmp "$(weights llama-2x2u)" "$(weights llama-2x2z)" > /dev/null ||
  fail "llama: 2 stages x 2 replicas, state parted, differ from the whole state"
# tcp has a group's reduce-scatter and all-gather (plugin ABI 2.7): the
# gradients are reduce-scattered among a stage's replicas, the updated
# parts all-gathered; a plugin without them (tcp behind a 2.6 vtable)
# sums them whole and shares the parts by group all-reduces: the same bits
for k in "group reduce-scatter" "group all-gather"; do
  grep -q "\"$k " llama-2x2z/trace.json || fail "llama-2x2z: no $k in rank 0's trace"
done
# shellcheck disable=SC2086
"$TRAINRUN" --plugin-path "$TR_TEST_PLUGIN_DIR" "$LLAMA" $base procs=4 parallel.pipeline=2 $z \
  comm=old_tcp train.trace_every=10 run_dir=llama-2x2o > llama-2x2o.log 2>&1 ||
  { cat llama-2x2o.log; fail "llama-2x2o failed"; }
! grep -q '"group reduce-scatter ' llama-2x2o/trace.json ||
  fail "llama-2x2o: a group reduce-scatter through a 2.6 vtable"
cmp "$(weights llama-2x2z)" "$(weights llama-2x2o)" > /dev/null ||
  fail "llama: 2 x 2, state parted: reduce-scatter and all-gather differ from group all-reduces"
# shellcheck disable=SC2086
run gpt-2x2z "$GPT" procs=4 parallel.pipeline=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2 $z
run gpt-2x2u "$GPT" procs=4 parallel.pipeline=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2 parallel.bucket_mb=0.01
cmp "$(weights gpt-2x2u)" "$(weights gpt-2x2z)" > /dev/null ||
  fail "gpt: 2 stages x 2 replicas interleaved, state parted, differ from the whole state"
for to in z u; do # the parted state's checkpoint, resumed with the level and without
  cp -r llama-2x2z "resume-z-$to"
  rm -rf "resume-z-$to/checkpoints/step-0000000020"
  echo step-0000000010 > "resume-z-$to/checkpoints/LATEST"
  args="parallel.bucket_mb=0.01"
  [ "$to" = z ] && args=$z
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base procs=4 parallel.pipeline=2 $args run_dir="resume-z-$to" --resume auto \
    > "resume-z-$to.log" 2>&1 || { cat "resume-z-$to.log"; fail "resume-z-$to"; }
  cmp "$(weights llama-2x2z)" "$(weights "resume-z-$to")" > /dev/null ||
    fail "the parted state's checkpoint resumed ($to) trains other weights"
done
# shard = "gradients" inside the stages (ZeRO-2): each piece's gradients
# reduce-scattered among the stage's replicas as the backward finishes it,
# the parts other replicas own given back; within 1e-5 of one process (the
# sums add in another order), for the Llama and the tied GPT interleaved,
# and resumed bit for bit; a plugin without the group slots is refused
zg="parallel.shard=gradients parallel.bucket_mb=0.01"
# shellcheck disable=SC2086
run llama-2x2g "$LLAMA" procs=4 parallel.pipeline=2 $zg train.trace_every=10
close llama-one llama-2x2g 1e-5 "llama: 2 stages x 2 replicas, gradients parted"
# AdamW forgives gradients off by a factor (its update divides it out), so
# the logged norms too: a part summed twice would show there
python3 - llama-one/metrics.jsonl llama-2x2g/metrics.jsonl <<'PY' || fail "llama-2x2g: the gradient norms differ from one process"
import json, sys
norms = [{r["step"]: r["grad_norm"] for r in map(json.loads, open(p)) if "grad_norm" in r}
         for p in sys.argv[1:]]
assert norms[0] and norms[0].keys() == norms[1].keys(), norms
for k, v in norms[0].items():
    assert abs(norms[1][k] - v) <= 1e-4 * v, (k, v, norms[1][k])
PY
grep -q '"group reduce-scatter ' llama-2x2g/trace.json ||
  fail "llama-2x2g: no group reduce-scatter in rank 0's trace"
# shellcheck disable=SC2086
run gpt-2x2g "$GPT" procs=4 parallel.pipeline=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2 $zg
close gpt-one gpt-2x2g 1e-5 "gpt: 2 stages x 2 replicas interleaved, gradients parted"
cp -r llama-2x2g resume-g
rm -rf resume-g/checkpoints/step-0000000020
echo step-0000000010 > resume-g/checkpoints/LATEST
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base procs=4 parallel.pipeline=2 $zg train.trace_every=10 run_dir=resume-g \
  --resume auto > resume-g.log 2>&1 || { cat resume-g.log; fail "resume-g"; }
cmp "$(weights llama-2x2g)" "$(weights resume-g)" > /dev/null ||
  fail "gradients parted: the checkpoint resumed trains other weights"
# shellcheck disable=SC2086
if "$TRAINRUN" --plugin-path "$TR_TEST_PLUGIN_DIR" "$LLAMA" $base procs=4 parallel.pipeline=2 \
     $zg comm=old_tcp run_dir=old-g > old-g.log 2>&1; then
  fail "gradients parted through a 2.6 comm plugin was taken"
fi
grep -q "comm 'old_tcp' has no reduce_scatter_group and allgather_group (plugin ABI 2.7)" old-g.log ||
  { cat old-g.log; fail "old-g: the refusal does not name the slots"; }

# ... and what it saves: the 27.3 M-parameter Llama on 2 stages x 2 replicas
# (a stage's gradients 52 MiB in fp32): each stage's peak falls by half its
# gradients less the two 2 MiB pieces in flight (22 MiB when written)
for l in optimizer gradients; do
  "$TRAINRUN" "$TR_SRCDIR/contrib/bench/shard-bench.lua" train.steps=2 procs=4 parallel.pipeline=2 \
    parallel.shard=$l run_dir=big-$l > big-$l.log 2>&1 || { cat big-$l.log; fail "big-$l"; }
done
python3 - big-optimizer.log big-gradients.log <<'PY' || { cat big-*.log; fail "gradients parted: memory"; }
import re, sys
def peaks(path):
    found = re.findall(r"pipeline stage (\d) \(replica (\d)\): \d+ MiB resident after training "
                       r"\(peak (\d+) MiB", open(path).read())
    return {(int(s), int(r)): float(p) for s, r, p in found}
one, two = peaks(sys.argv[1]), peaks(sys.argv[2])
assert len(one) == 4 and one.keys() == two.keys(), (one, two)
assert all(one[k] - two[k] >= 15 for k in one), (one, two)
print("gradients parted: stage peaks %s MiB, against %s with the state alone parted" %
      (sorted(two.values()), sorted(one.values())))
PY

cp -r llama-2x2u resume-u-z # the whole state's checkpoint, resumed parted
rm -rf resume-u-z/checkpoints/step-0000000020
echo step-0000000010 > resume-u-z/checkpoints/LATEST
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base procs=4 parallel.pipeline=2 $z run_dir=resume-u-z --resume auto \
  > resume-u-z.log 2>&1 || { cat resume-u-z.log; fail "resume-u-z"; }
cmp "$(weights llama-2x2u)" "$(weights resume-u-z)" > /dev/null ||
  fail "the whole state's checkpoint resumed parted trains other weights"

# tcp: 3 stages x 2 replicas of a tied GPT.  Stage s of the two replicas
# (ranks s and 3 + s, no ring neighbours) sum their gradients among
# themselves on links of their own; the tied embedding, read by the first
# and last stages, among ranks 0, 2, 3 and 5
run gpt4-one "$GPT" model.layers=4
run gpt-3x2 "$GPT" model.layers=4 procs=6 parallel.pipeline=3 train.trace_every=10
close gpt4-one gpt-3x2 1e-5 "gpt: 3 stages x 2 replicas over tcp"
grep -q '"group all-reduce ' gpt-3x2/trace.json ||
  fail "gpt: 3 stages x 2 replicas: no group all-reduce in rank 0's trace"
# tcp: 3 interleaved stages x 2 replicas (stage 2 sends to stage 0 of its
# replica, no ring neighbour: a point-to-point link of their own)
six="model.layers=6 train.batch=6"
# shellcheck disable=SC2086
run six-one "$LLAMA" $six
# shellcheck disable=SC2086
run six-tcp "$LLAMA" $six procs=6 parallel.pipeline=3 parallel.schedule=interleaved \
  parallel.virtual_stages=2
close six-one six-tcp 1e-5 "tcp: 3 interleaved stages x 2 replicas"

# mpi: 3 interleaved stages x 2 replicas
if command -v mpirun > /dev/null; then
  # shellcheck disable=SC2086
  # as mpi.sh runs it: root in containers, more ranks than cores, no pinning,
  # no cross-memory attach; the ranks come from mpirun
  env -u TRAINRUN_RANK -u TRAINRUN_WORLD_SIZE -u TRAINRUN_MASTER timeout 300 \
    mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca btl_vader_single_copy_mechanism none -np 6 "$TRAINRUN" "$LLAMA" $base $six comm=mpi \
    parallel.pipeline=3 parallel.schedule=interleaved parallel.virtual_stages=2 run_dir=six-mpi \
    --quiet > six-mpi.log 2>&1 || { cat six-mpi.log; fail "mpi: 3 interleaved stages x 2 replicas"; }
  close six-one six-mpi 1e-5 "mpi: 3 interleaved stages x 2 replicas"
  # and with the gradients parted among the replicas (MPI_Ireduce_scatter_block
  # on each stage's communicator, during the backward)
  # shellcheck disable=SC2086
  env -u TRAINRUN_RANK -u TRAINRUN_WORLD_SIZE -u TRAINRUN_MASTER timeout 300 \
    mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca btl_vader_single_copy_mechanism none -np 6 "$TRAINRUN" "$LLAMA" $base $six comm=mpi \
    parallel.pipeline=3 parallel.schedule=interleaved parallel.virtual_stages=2 $zg \
    run_dir=six-mpi-g --quiet > six-mpi-g.log 2>&1 ||
    { cat six-mpi-g.log; fail "mpi: 3 interleaved stages x 2 replicas, gradients parted"; }
  close six-one six-mpi-g 1e-5 "mpi: 3 interleaved stages x 2 replicas, gradients parted"
else
  echo "pipeline-run: mpirun is not installed: the mpi case is skipped"
fi

# a Hugging Face directory, fully and with LoRA
FROM="$TR_SRCDIR/tests/fixtures/hf/tiny-llama.lua"
for what in full lora; do
  extra=
  [ "$what" = lora ] && extra="lora.rank=4 lora.targets=all-linear"
  # shellcheck disable=SC2086
  run "from-$what-one" "$FROM" train.batch=4 $extra
  # shellcheck disable=SC2086
  run "from-$what-2" "$FROM" train.batch=4 $extra procs=2 parallel.pipeline=2
done
cmp "$(weights from-full-one)" "$(weights from-full-2)" > /dev/null ||
  fail "a model.from model on 2 stages differs from one process"
for d in from-lora-one from-lora-2; do
  "$TRAINRUN" export "$d/checkpoints/$(cat "$d/checkpoints/LATEST")" --format peft -o "$d.peft" \
    > "$d.peft.log" 2>&1 || { cat "$d.peft.log"; fail "export --format peft of $d"; }
done
cmp from-lora-one.peft/adapter_model.safetensors from-lora-2.peft/adapter_model.safetensors ||
  fail "LoRA on 2 stages trains another adapter than one process"

# levers: recompute with clipping (1e-5); bf16 (1e-3)
for lever in "model.recompute=1 optimizer.clip=0.5" "precision=bf16"; do
  name=$(echo "$lever" | tr ' =.' '---')
  tol=1e-5
  case $lever in precision=*) tol=1e-3 ;; esac
  # shellcheck disable=SC2086
  run "lever-$name-one" "$LLAMA" $lever
  # shellcheck disable=SC2086
  run "lever-$name-2" "$LLAMA" $lever procs=2 parallel.pipeline=2
  close "lever-$name-one" "lever-$name-2" $tol "$lever on 2 stages"
done

# evaluation while training: the one process's validation loss
run eval-one "$LLAMA" train.eval_every=10 train.eval_batches=5
run eval-2 "$LLAMA" train.eval_every=10 train.eval_batches=5 procs=2 parallel.pipeline=2
close eval-one eval-2 1e-5 "evaluation on 2 stages"
python3 - eval-one/metrics.jsonl eval-2/metrics.jsonl <<'PY' || fail "evaluation on 2 stages"
import json, sys
def vals(p):
    return [json.loads(l)["val_loss"] for l in open(p) if '"val_loss"' in l]
a, b = vals(sys.argv[1]), vals(sys.argv[2])
assert len(a) == 2 and len(b) == 2, (a, b)
assert all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)), (a, b)
PY

# resume: the checkpoint of step 10 continued on one process and on 2 stages
for procs in 1 2; do
  dir="resume-$procs"
  cp -r llama-1f1b "$dir"
  rm -rf "$dir/checkpoints/step-0000000020"
  echo step-0000000010 > "$dir/checkpoints/LATEST"
  pipe=
  [ "$procs" = 2 ] && pipe="procs=2 parallel.pipeline=2"
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base $pipe run_dir="$dir" --resume auto > "$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "resume on $procs"; }
  grep -q "resumed from checkpoint step-0000000010" "$dir.log" || { cat "$dir.log"; fail "no resume on $procs"; }
  close llama-1f1b "$dir" 1e-5 "saved by 2 stages, resumed on $procs process(es)"
done

# auto micro-batch: the stages get micro-batches to share
run auto "$LLAMA" procs=2 parallel.pipeline=2 train.micro_batch=auto train.steps=2
grep -q 'auto micro-batch: 1 (8 fits in .*2 pipeline stages share 8 micro-batches a step' auto.log ||
  { cat auto.log; fail "auto micro-batch with stages"; }

# the idle share in metrics.jsonl, the stage's ops in the trace
run traced "$LLAMA" procs=2 parallel.pipeline=2 parallel.schedule=gpipe train.trace_every=10
python3 - traced/metrics.jsonl traced/trace.json traced/trace-rank1.json <<'PY' || fail "idle share or trace"
import json, sys
idle = [json.loads(l)["pipeline_idle_pct"] for l in open(sys.argv[1]) if '"pipeline_idle_pct"' in l]
assert idle and all(0 <= v < 100 for v in idle), idle
for path, chunk in ((sys.argv[2], 0), (sys.argv[3], 1)):  # each stage its own trace
    names = [e["name"] for e in json.load(open(path))["traceEvents"]]
    assert any(n.startswith("forward micro-batch 7 chunk %d" % chunk) for n in names), (path, names)
    assert any(n.startswith("backward micro-batch 0 chunk %d" % chunk) for n in names), (path, names)
    assert any(n.startswith("send/recv before") for n in names), (path, names)
PY

# memory: each stage's share resident, not the whole model
BIG="$TR_SRCDIR/contrib/bench/shard-bench.lua"
"$TRAINRUN" "$BIG" train.steps=2 run_dir=big-one > big-one.log 2>&1 || { cat big-one.log; fail "big-one"; }
"$TRAINRUN" "$BIG" train.steps=2 procs=2 parallel.pipeline=2 run_dir=big-2 > big-2.log 2>&1 ||
  { cat big-2.log; fail "big-2"; }
"$TRAINRUN" "$BIG" train.steps=3 procs=2 parallel.pipeline=2 run_dir=big-2 --resume auto \
  > big-2r.log 2>&1 || { cat big-2r.log; fail "big-2 resumed"; }
grep -q "every rank read its own parts" big-2r.log || { cat big-2r.log; fail "big-2: not resumed by stage"; }
for log in big-2.log big-2r.log; do
python3 - big-one.log $log <<'PY' || { cat big-one.log $log; fail "stage memory ($log)"; }
import re, sys
one = float(re.search(r"peak RSS (\d+) MiB training", open(sys.argv[1]).read()).group(1))
text = open(sys.argv[2]).read()
stages = [float(v) for v in re.findall(r"pipeline stage \d \(replica 0\): (\d+) MiB resident", text)]
peaks = [float(v) for v in re.findall(r"MiB resident after training \(peak (\d+) MiB", text)]
assert len(stages) == 2 and len(peaks) == 2, (stages, peaks)
# the peaks too: initialising, evaluating and saving never bring the whole model over
assert all(v < 0.7 * one for v in stages + peaks), (one, stages, peaks)
print("stage memory: one process %.0f MiB, stages %s MiB (peaks %s)" % (one, stages, peaks))
PY
done

# --smoke: ranks for a recipe of ranks
for lever in "parallel.pipeline=4 model.layers=8 parallel.schedule=interleaved parallel.virtual_stages=2 train.batch=8 train.micro_batch=1" \
             "parallel.shard=parameters procs=4"; do
  # shellcheck disable=SC2086
  "$TRAINRUN" --smoke "$LLAMA" $lever > smoke.log 2>&1 || { cat smoke.log; fail "--smoke $lever"; }
  case $lever in
    parallel.pipeline*) want="2 steps on 2 CPU ranks (2 pipeline stages)" ;;
    *) want="2 steps on 2 CPU ranks" ;;
  esac
  grep -qF "smoke: $want" smoke.log && grep -q "rank 0 of 2" smoke.log &&
    grep -q "checkpoint round trip ok" smoke.log && grep -q "ready to launch" smoke.log ||
    { cat smoke.log; fail "--smoke $lever: not on 2 ranks"; }
done

# a layout the model cannot be cut into (4 x 2 chunks, 6 pieces) fails the
# smoke as it would fail the run, before any step
if "$TRAINRUN" --smoke "$LLAMA" parallel.pipeline=4 model.layers=4 parallel.schedule=interleaved \
     parallel.virtual_stages=2 > smoke-cut.log 2>&1; then
  cat smoke-cut.log; fail "--smoke passed 8 chunks of a 6-piece model"
fi
grep -q "smoke: FAILED: pipeline: 8 stages (x virtual stages) but the model has 6 pieces" smoke-cut.log ||
  { cat smoke-cut.log; fail "--smoke: the message for a layout that cannot be cut"; }
# and interleaving 4 stages over the one micro-batch a step of that recipe
if "$TRAINRUN" --smoke "$LLAMA" parallel.pipeline=4 model.layers=8 parallel.schedule=interleaved \
     parallel.virtual_stages=2 > smoke-m.log 2>&1; then
  cat smoke-m.log; fail "--smoke passed an interleaved schedule of 4 stages over 1 micro-batch"
fi
grep -q "smoke: FAILED: the interleaved schedule takes micro-batches in groups of the 4 stages, and a step has 1" smoke-m.log ||
  { cat smoke-m.log; fail "--smoke: the message for too few micro-batches to interleave"; }

# early stopping (lr 0 never improves: patience 2 stops after the 3rd
# evaluation), the metrics logger, and a resume that changes the model
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base train.steps=100 train.eval_every=5 optimizer.lr=0 early_stop.patience=2 \
  procs=2 parallel.pipeline=2 run_dir=es > es.log 2>&1 || { cat es.log; fail "early stop on 2 stages"; }
grep -q "early stop at step 15" es.log || { cat es.log; fail "2 stages did not stop at step 15"; }
[ "$(grep -c '"val_loss"' es/metrics.jsonl)" -eq 3 ] || fail "2 stages: expected 3 evaluations"
ls es/checkpoints | grep -q step-0000000005 || fail "2 stages: the best checkpoint was not kept"
# shellcheck disable=SC2086
if "$TRAINRUN" "$LLAMA" $base train.steps=30 model.layers=4 procs=2 parallel.pipeline=2 run_dir=llama-1f1b \
     --resume auto > changed.log 2>&1; then
  fail "2 stages resumed a checkpoint of another model"
fi
grep -q "no checkpoint could be loaded; the newest, step-0000000020: .*lacks 18 of the model.s tensors" changed.log || { cat changed.log; fail "the changed model is not named"; }

# faults: the job's launcher ($1 of "start"); its ranks are its children
start() { # NAME overrides...: a long run in the background; $pid, $r1 (rank 1)
  name=$1
  shift
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base procs=2 parallel.pipeline=2 train.steps=1000000 run_dir="$name" "$@" \
    > "$name.log" 2>&1 &
  pid=$! n=0
  until grep -q '^step' "$name.log" 2>/dev/null; do
    n=$((n + 1))
    [ $n -gt 600 ] && { cat "$name.log"; fail "$name: no step within 30 s"; }
    sleep 0.05
  done
  r1=$(pgrep -P $pid | sort -n | tail -1)
  [ -n "$r1" ] || fail "$name: no ranks under the launcher"
}
start killed
kill -9 "$r1"
ended_within $pid 20 || { cat killed.log; fail "a killed stage left the job running 20 s"; }
grep -q 'rank 1' killed.log || { cat killed.log; fail "the killed stage is not named"; }
start stopped comm.timeout=2
kill -STOP "$r1"
ended_within $pid 30 || { kill -9 "$r1"; cat stopped.log; fail "a stopped stage left the job running 30 s"; }
kill -9 "$r1" 2>/dev/null || true
grep -q 'rank 1 did not answer' stopped.log || { cat stopped.log; fail "the stopped stage is not named"; }
# ... also with 2 replicas reduce-scattering their gradients during the
# backward (the last rank, stage 1 of replica 1, killed or stopped)
for fault in KILL STOP; do
  start g$fault procs=4 parallel.shard=gradients parallel.bucket_mb=0.01 comm.timeout=2
  kill -$fault "$r1"
  ended_within $pid 30 || { kill -9 "$r1"; cat g$fault.log; fail "SIG$fault: a stage of 2 x 2 with gradients parted left the job running 30 s"; }
  kill -9 "$r1" 2>/dev/null || true
  grep -q 'rank 3' g$fault.log || { cat g$fault.log; fail "SIG$fault: the stage is not named (gradients parted)"; }
done
start termed
kill -TERM $pid
ended_within $pid 20 || { cat termed.log; fail "SIGTERM did not end 2 stages within 20 s"; }
wait $pid && code=0 || code=$?
[ "$code" = 75 ] || { cat termed.log; fail "SIGTERM: exit $code, not 75"; }
saved=$(sed 's/step-0*//' termed/checkpoints/LATEST)
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base procs=2 parallel.pipeline=2 train.steps=$((saved + 5)) run_dir=termed \
  --resume auto > termed2.log 2>&1 || { cat termed2.log; fail "resume after SIGTERM"; }
grep -q "resumed from checkpoint step-0*$saved" termed2.log || { cat termed2.log; fail "no resume after SIGTERM"; }

# refusals, naming the recipe line
cat > piped.lua <<EOF
return {
  extends = "$LLAMA",
  parallel = { pipeline = 2 },
}
EOF
export TRAINRUN_RECIPE_PATH
TRAINRUN_RECIPE_PATH=$(dirname "$LLAMA")
if "$TRAINRUN" piped.lua run_dir=piped3 procs=3 > piped3.log 2>&1; then fail "3 ranks ran 2 stages"; fi
grep -q 'piped.lua:3: parallel.pipeline = 2 runs one stage a rank: start it with procs = 2 x the data-parallel replicas' piped3.log ||
  { cat piped3.log; fail "the ranks/stages refusal"; }
if "$TRAINRUN" piped.lua run_dir=pipedz procs=2 parallel.shard=parameters > pipedz.log 2>&1; then
  fail "a pipeline with sharded parameters ran"
fi
grep -q 'piped.lua:3: parallel.pipeline with parallel.shard = "parameters": a stage.s parameters are not sharded: they would be gathered again for every micro-batch.s forward and backward; use shard = "gradients"' pipedz.log ||
  { cat pipedz.log; fail "the shard refusal"; }
echo "pipeline-run: ok"

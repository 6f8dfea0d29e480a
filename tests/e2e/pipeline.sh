#!/bin/sh
# Pipeline stages planned (docs/scale-out.md): the recipe line, the plan's
# partition, memory and bubble, and the refusals.
# Checks that
#   - `trainrun plan` with parallel.pipeline = 2 cuts a Llama of 8 blocks
#     into stages at block boundaries (the embedding on the first, the head
#     on the last), says how many micro-batches each holds (1f1b: P - s),
#     and gives the bubble in theory and simulated (1f1b, 8 micro-batches:
#     (2-1)/(8+2-1) = 11.1%);
#   - interleaved with virtual stages gives each stage two chunks and a
#     smaller theoretical bubble; gpus=4 makes 2 replicas of 2 stages;
#   - with 2 replicas, shard = "gradients" plans each stage smaller than
#     "optimizer" and says what it cuts;
#   - the memory fit is the largest stage's (what one device holds), not
#     the whole model's: a budget between the two fits, one below the
#     stage does not, and the warning says whose estimate it is (--smoke
#     makes the same check, from the same estimate, and micro_batch =
#     "auto" searches by it: plan and a 2-stage run pick one); CPU
#     ranks on one machine get what they hold together; each stage's
#     estimate holds all of LoRA's frozen base, as each stage does;
#   - virtual stages without interleaving and interleaved micro-batches
#     the stages do not divide are refused (running stages:
#     pipeline-run.sh).
. "$(dirname "$0")/lib.sh"
LLAMA="$TR_SRCDIR/tests/config/tiny_llama.lua"
set -- model.layers=8 train.batch=8 train.micro_batch=1

"$TRAINRUN" plan "$LLAMA" "$@" parallel.pipeline=2 > p2.txt 2>&1 || { cat p2.txt; fail "plan pipeline 2"; }
grep -q '^pipeline  (parallel.pipeline = 2 stages, schedule 1f1b, 8 micro-batches a step' p2.txt &&
  grep -q '^  stage 0 .*embedding, blocks 0-[0-9] .*(activations of 2 micro-batches)' p2.txt &&
  grep -q '^  stage 1 .*blocks [0-9]-7, head .*(activations of 1 micro-batch)' p2.txt &&
  grep -q '^  bubble .*11.1% of the devices.* idle in theory' p2.txt ||
  { cat p2.txt; fail "plan's pipeline section"; }

"$TRAINRUN" plan "$LLAMA" "$@" parallel.pipeline=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2 gpus=4 > p2v.txt 2>&1 || { cat p2v.txt; fail "plan interleaved"; }
grep -q 'schedule interleaved, 4 micro-batches a step through each of 2 replicas' p2v.txt &&
  grep -q '^  stage 0 .*embedding, blocks [0-9-]*, [0-9-]* ' p2v.txt &&
  grep -q 'each stage runs 2 chunks of the model' p2v.txt &&
  grep -q '^  bubble .*11.1% of the devices.* idle in theory ((P-1)/(V·M+P-1))' p2v.txt ||
  { cat p2v.txt; fail "plan's interleaved pipeline"; }

# 2 stages x 2 replicas: shard = "gradients" cuts each stage's gradients
# over its replicas as well as its state, so each stage needs less
stage0() { sed -n 's/^  stage 0 .* parameters  *\([0-9.]*\) KiB .*/\1/p' "$1"; }
for l in optimizer gradients; do
  "$TRAINRUN" plan "$LLAMA" "$@" parallel.pipeline=2 gpus=4 parallel.shard=$l parallel.bucket_mb=0.01 \
    > p2$l.txt 2>&1 ||
    { cat p2$l.txt; fail "plan 2 x 2, $l"; }
done
grep -q "(the state and gradients of each stage cut over its 2 replicas: parallel.shard = \"gradients\")" \
  p2gradients.txt && grep -q "(the state of each stage cut over its 2 replicas: parallel.shard = \"optimizer\")" \
  p2optimizer.txt && grep -q "(pipeline stages: these rows are the whole model, the optimizer state and gradients cut over a stage's replicas" \
  p2gradients.txt && ! grep -q "^  shard levels" p2gradients.txt ||
  { cat p2optimizer.txt p2gradients.txt; fail "plan 2 x 2: what the levels cut"; }
awk -v a="$(stage0 p2optimizer.txt)" -v b="$(stage0 p2gradients.txt)" 'BEGIN { exit !(a > 0 && b > 0 && b < a) }' ||
  { cat p2optimizer.txt p2gradients.txt; fail "plan 2 x 2: gradients parted do not make stage 0 smaller"; }

# A device holds one stage: a budget between the largest stage's estimate
# and the whole model's fits, and the plan says whose estimate it compared;
# a budget below the largest stage does not fit, and the warning says so.
kib() { awk -v v="$1" -v u="$2" 'BEGIN { print (u == "MiB" ? v * 1024 : u == "GiB" ? v * 1048576 : v) }'; }
whole=$(sed -n 's/^  total  *\([0-9.]*\) \([KMG]iB\).*/\1 \2/p' p2.txt)
most=$(sed -n 's/^  stage [0-9] .* parameters  *\([0-9.]*\) \([KMG]iB\) .*/\1 \2/p' p2.txt |
  while read -r v u; do kib "$v" "$u"; done | sort -g | tail -1)
whole=$(kib $whole)
awk -v a="$most" -v b="$whole" 'BEGIN { exit !(a > 0 && a < b) }' ||
  { cat p2.txt; fail "plan: the largest stage ($most KiB) is not below the whole model ($whole KiB)"; }
# GiB of budget whose usable 90% lies halfway between them, then a tenth of the stage
between=$(awk -v a="$most" -v b="$whole" 'BEGIN { printf "%.9f", (a + b) / 2 / 0.9 / 1048576 }')
below=$(awk -v a="$most" 'BEGIN { printf "%.9f", a / 10 / 0.9 / 1048576 }')
"$TRAINRUN" plan "$LLAMA" "$@" parallel.pipeline=2 train.memory_budget="$between" > fit.txt 2>&1 ||
  { cat fit.txt; fail "plan with a budget between a stage and the model"; }
grep -q '^  on train.memory_budget *fits: ' fit.txt &&
  grep -q "(stage [01]'s estimate, the largest: below)" fit.txt && ! grep -q '^warning: the model does not fit' fit.txt ||
  { cat fit.txt; fail "plan: a budget that holds the largest stage does not fit it"; }
"$TRAINRUN" plan "$LLAMA" "$@" parallel.pipeline=2 train.memory_budget="$below" > nofit.txt 2>&1 ||
  { cat nofit.txt; fail "plan with a budget below a stage"; }
grep -q '^  on train.memory_budget *DOES NOT FIT: ' nofit.txt &&
  grep -q '^warning: the model does not fit on train.memory_budget: .* needed per device (the largest stage)' nofit.txt ||
  { cat nofit.txt; fail "plan: a budget below the largest stage fits"; }
# --smoke makes the same check from the same estimate (procs = 2 stages)
"$TRAINRUN" --smoke "$LLAMA" "$@" parallel.pipeline=2 procs=2 train.memory_budget="$between" \
  run_dir=smoke-fit > sfit.txt 2>&1 || { cat sfit.txt; fail "smoke with a budget between a stage and the model"; }
grep -q "^smoke: fits train.memory_budget (.* stage [01]'s, the largest)" sfit.txt &&
  grep -q '^smoke: ready to launch' sfit.txt || { cat sfit.txt; fail "smoke: the largest stage's fit"; }
if "$TRAINRUN" --smoke "$LLAMA" "$@" parallel.pipeline=2 procs=2 train.memory_budget="$below" \
     run_dir=smoke-nofit > snofit.txt 2>&1; then
  cat snofit.txt; fail "smoke passed a budget below the largest stage"
fi
grep -q "^smoke: FAILED: won't fit: .* per device (stage [01]'s, the largest) .*more stages" snofit.txt ||
  { cat snofit.txt; fail "smoke: the message for a stage that does not fit"; }

# micro_batch = "auto" searches the same way: under that budget the whole
# model does not fit at micro-batch 1 but its largest stage does, so plan
# picks one and 2 stages train with it (2 steps)
"$TRAINRUN" plan "$LLAMA" model.layers=8 train.batch=8 train.micro_batch=auto parallel.pipeline=2 \
  train.memory_budget="$between" > pauto.txt 2>&1 || { cat pauto.txt; fail "plan auto under stages"; }
grep -q '^  largest micro-batch  *[1-9][0-9]* (measured' pauto.txt &&
  grep -q 'that fits (its largest stage)' pauto.txt || { cat pauto.txt; fail "plan: auto under stages"; }
"$TRAINRUN" "$LLAMA" model.layers=8 train.batch=8 train.micro_batch=auto parallel.pipeline=2 procs=2 \
  train.memory_budget="$between" train.steps=2 train.threads=1 run_dir=auto-run > rauto.txt 2>&1 ||
  { cat rauto.txt; fail "2 stages with micro_batch = auto under a budget their largest stage fits"; }
grep -q 'auto micro-batch: [1-9]' rauto.txt || { cat rauto.txt; fail "run: no auto micro-batch said"; }
if "$TRAINRUN" "$LLAMA" model.layers=8 train.batch=8 train.micro_batch=auto parallel.pipeline=2 procs=2 \
     train.memory_budget="$below" train.steps=2 train.threads=1 run_dir=auto-none > nauto.txt 2>&1; then
  cat nauto.txt; fail "2 stages with micro_batch = auto ran under a budget no stage fits"
fi
grep -q 'auto micro-batch: even a micro-batch of 1 needs .* (the largest pipeline stage), .*more stages' nauto.txt ||
  { cat nauto.txt; fail "run: the message when no stage fits"; }

# LoRA's frozen base stays whole on every stage (its own arena): each
# stage's estimate holds all of it, not its share
# (4 stages of a base wide enough to outweigh the activations: their
# estimates add up to at least 4 times the base)
"$TRAINRUN" plan "$LLAMA" "$@" model.dim=64 parallel.pipeline=4 lora.rank=2 lora.targets=all-linear > plora.txt 2>&1 ||
  { cat plora.txt; fail "plan 4 stages with adapters"; }
frozen=$(kib $(sed -n 's/^  frozen weights  *\([0-9.]*\) \([KMG]iB\).*/\1 \2/p' plora.txt))
sum=$(sed -n 's/^  stage [0-9] .* parameters  *\([0-9.]*\) \([KMG]iB\) .*/\1 \2/p' plora.txt |
  while read -r v u; do kib "$v" "$u"; done | awk '{ s += $1 } END { print s }')
awk -v f="$frozen" -v s="$sum" 'BEGIN { exit !(f > 0 && s >= 4 * f) }' ||
  { cat plora.txt; fail "plan: 4 stages' estimates ($sum KiB) leave out part of the frozen base ($frozen KiB each)"; }
# 2 x 2 CPU ranks on one machine: the plan adds up what the four hold
"$TRAINRUN" plan "$LLAMA" "$@" parallel.pipeline=2 cost.count=4 > ranks.txt 2>&1 ||
  { cat ranks.txt; fail "plan 2 x 2 CPU ranks"; }
grep -q '(4 CPU ranks on one machine share its memory: .* together)' ranks.txt ||
  { cat ranks.txt; fail "plan: 4 CPU ranks' memory together"; }

if "$TRAINRUN" plan "$LLAMA" parallel.pipeline=2 parallel.virtual_stages=2 > v.log 2>&1; then
  fail "virtual stages under 1f1b were planned"
fi
grep -q 'virtual_stages = 2 needs schedule = "interleaved"' v.log || { cat v.log; fail "virtual stages message"; }
if "$TRAINRUN" plan "$LLAMA" parallel.pipeline=4 parallel.schedule=interleaved \
     parallel.micro_batches=6 > m.log 2>&1; then
  fail "interleaved with 6 micro-batches over 4 stages was planned"
fi
grep -q 'micro_batches = 6: the interleaved schedule takes micro-batches in groups of the 4 stages' m.log ||
  { cat m.log; fail "interleaved micro-batches message"; }
if "$TRAINRUN" plan "$LLAMA" parallel.pipeline=8 > many.log 2>&1; then fail "8 stages of 2 blocks"; fi
grep -q 'use fewer stages' many.log || { cat many.log; fail "too many stages message"; }
echo "pipeline: ok"

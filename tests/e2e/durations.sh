#!/bin/sh
# The run's length in the units people plan in (train.tokens, train.epochs,
# train.time), the report's n/a cases, and the progress bar of export and
# prepare: drawn on a terminal, absent elsewhere.
. "$(dirname "$0")/lib.sh"

cat > d.lua <<'L'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 100 },
  train = { batch = 4, log_every = 1 },
}
L
steps_of() { last_metric "$1/metrics.jsonl" step; } # log_every = 1: the last step run

# --- tokens: steps = ceil(tokens / (batch x seq_len)) = ceil(1000 / 32) ---------------------
"$TRAINRUN" d.lua train.tokens=1k run_dir=tok --quiet 2> tok.txt || { cat tok.txt; fail "tokens run"; }
[ "$(steps_of tok)" = 32 ] || { cat tok.txt; fail "train.tokens=1k ran $(steps_of tok) steps, not 32"; }
# a recipe's string, and a number with no suffix
sed 's/log_every = 1 }/log_every = 1, tokens = "0.0032M" }/' d.lua > tokm.lua
"$TRAINRUN" tokm.lua run_dir=tokm --quiet 2> tokm.txt || { cat tokm.txt; fail "tokens in a recipe"; }
[ "$(steps_of tokm)" = 100 ] || { cat tokm.txt; fail "tokens = \"0.0032M\" is not 100 steps"; }
"$TRAINRUN" d.lua train.tokens=64 run_dir=tokn --quiet 2> tokn.txt || { cat tokn.txt; fail "plain count"; }
[ "$(steps_of tokn)" = 2 ] || { cat tokn.txt; fail "train.tokens=64 is not 2 steps"; }
# the schedule's end follows: a linear decay reaches 0 lr at the derived last step
"$TRAINRUN" d.lua train.tokens=320 schedule=linear run_dir=lin --quiet 2> lin.txt || { cat lin.txt; fail "linear"; }
[ "$(last_metric lin/metrics.jsonl step)" = 10 ] || fail "the linear run did not end at step 10"
less_than "$(last_metric lin/metrics.jsonl lr)" 1e-9 || fail "the schedule did not end with the derived steps (lr $(last_metric lin/metrics.jsonl lr))"

# --- epochs: 100 training samples in micro-batches of 4 are 25 steps an epoch ---------------
"$TRAINRUN" d.lua train.epochs=2 run_dir=ep --quiet 2> ep.txt || { cat ep.txt; fail "epochs run"; }
[ "$(steps_of ep)" = 50 ] || { cat ep.txt; fail "train.epochs=2 ran $(steps_of ep) steps, not 50"; }
"$TRAINRUN" d.lua train.epochs=0.5 train.batch=8 train.micro_batch=2 run_dir=ep2 --quiet 2> ep2.txt \
  || { cat ep2.txt; fail "half an epoch"; }
[ "$(steps_of ep2)" = 7 ] || { cat ep2.txt; fail "half of 50 micro-batches in steps of 4 is 7 steps, got $(steps_of ep2)"; }

# --- one length; two in one place, or bad text, are named --------------------------------------
sed 's/log_every = 1 }/log_every = 1, steps = 5,\n    epochs = 2 }/' d.lua > both.lua
if "$TRAINRUN" both.lua run_dir=both 2> both.txt; then fail "steps and epochs together must fail"; fi
grep -q "both.lua:5: train.epochs and train.steps (.*both.lua:4) both set the run's length" both.txt \
  || { cat both.txt; fail "both lengths: message"; }
# the most specific place wins, with a note: the command line over the recipe, the recipe
# over the base it extends
sed 's/log_every = 1 }/log_every = 1, steps = 5 }/' d.lua > steps5.lua
"$TRAINRUN" steps5.lua train.tokens=320 run_dir=cli --quiet 2> cli.txt || { cat cli.txt; fail "cli over recipe"; }
[ "$(steps_of cli)" = 10 ] || { cat cli.txt; fail "train.tokens on the command line did not replace the recipe's steps"; }
grep -q "note: train.tokens (command line) sets the run's length; train.steps (.*steps5.lua:4) is not used" cli.txt \
  || { cat cli.txt; fail "no note on the replaced steps"; }
printf 'return {\n  extends = "steps5.lua",\n  train = { epochs = 1 },\n}\n' > child.lua
"$TRAINRUN" child.lua run_dir=child --quiet 2> child.txt || { cat child.txt; fail "child over base"; }
[ "$(steps_of child)" = 25 ] || { cat child.txt; fail "the child's epochs did not replace the base's steps"; }
grep -q "note: train.epochs (.*child.lua:3) sets the run's length; train.steps (.*steps5.lua:4) is not used" child.txt \
  || { cat child.txt; fail "no note on the base's steps"; }
# --smoke runs 2 steps whatever the length
sed 's/log_every = 1 }/log_every = 1, tokens = "1k", time = "1h" }/' d.lua > dt.lua
"$TRAINRUN" --smoke dt.lua > smoke.txt 2>&1 || { cat smoke.txt; fail "smoke with train.tokens"; }
if "$TRAINRUN" d.lua train.tokens=1k train.epochs=1 run_dir=both 2> both2.txt; then fail "tokens and epochs"; fi
grep -q "train.epochs and train.tokens (command line) both set" both2.txt || { cat both2.txt; fail "tokens and epochs: message"; }
if "$TRAINRUN" d.lua train.tokens=2X 2> bad.txt; then fail "a bad count must fail"; fi
grep -q "train.tokens: '2X' is not a token count" bad.txt || { cat bad.txt; fail "bad count message"; }
if "$TRAINRUN" d.lua train.time=6y 2> bad.txt; then fail "a bad duration must fail"; fi
grep -q "train.time: '6y' is not a duration" bad.txt || { cat bad.txt; fail "bad duration message"; }
if "$TRAINRUN" d.lua train.tokens=1e30 2> bad.txt; then fail "a huge count must fail"; fi
grep -q "option 'tokens'" bad.txt || { cat bad.txt; fail "huge count message"; }

# --- time: a wall-clock limit that stops with a checkpoint, alone or with steps -------------
"$TRAINRUN" d.lua train.time=1.5s run_dir=t1 2> t1.txt || { cat t1.txt; fail "time alone"; }
grep -q "stopping at step [0-9]*: train.time (2 s) reached; checkpoint saved" t1.txt \
  || { cat t1.txt; fail "no time stop"; }
stop=$(sed -n 's/.*stopping at step \([0-9]*\): train.time.*/\1/p' t1.txt)
[ "$(cat t1/checkpoints/LATEST)" = "step-$(printf %010d "$stop")" ] || fail "no checkpoint at the time stop"
grep -q "^step  *[0-9]* | loss" t1.txt || { cat t1.txt; fail "time alone: the progress line has no total"; }
"$TRAINRUN" d.lua train.steps=100000000 train.time=1s run_dir=t2 2> t2.txt \
  || { cat t2.txt; fail "time with steps"; }
grep -q "train.time (1 s) reached" t2.txt || { cat t2.txt; fail "time with steps did not stop"; }
# the ETA is the time left, not the 100 million steps'
grep -q "^step .*ETA" t2.txt || { cat t2.txt; fail "time with steps: no progress line"; }
eta=$(grep "^step .*ETA" t2.txt | sed 's/.*ETA \([0-9]*\)s/\1/' | sort -n | tail -n 1)
[ "$eta" -le 1 ] || { cat t2.txt; fail "the ETA ($eta s) does not follow train.time"; }
"$TRAINRUN" d.lua train.steps=3 train.time=1h run_dir=t3 --quiet 2> t3.txt || { cat t3.txt; fail "far time"; }
[ "$(steps_of t3)" = 3 ] || { cat t3.txt; fail "a far time limit changed the steps"; }

# --- plan shows the derived steps -------------------------------------------------------------
"$TRAINRUN" plan d.lua train.tokens=1M > plan.txt || fail "plan tokens"
grep -q "the recipe's run  *31,250 steps = 1.00 M tokens" plan.txt || { cat plan.txt; fail "plan: steps from tokens"; }
grep -q "from train.tokens = 1.00 M" plan.txt || { cat plan.txt; fail "plan: names train.tokens"; }
"$TRAINRUN" plan d.lua train.epochs=3 > plan.txt || fail "plan epochs"
grep -q "the recipe's run  *75 steps" plan.txt || { cat plan.txt; fail "plan: steps from epochs"; }
"$TRAINRUN" plan d.lua train.time=2h > plan.txt || fail "plan time"
grep -q "train.time alone: the steps in it need a step time" plan.txt || { cat plan.txt; fail "plan: time alone, no peak"; }
"$TRAINRUN" plan d.lua train.time=2h cost.hardware=cpu cost.peak_tflops=0.001 > plan.txt || fail "plan time cpu"
grep -q "from train.time = 2.0 h at the estimated step time" plan.txt || { cat plan.txt; fail "plan: time alone"; }
"$TRAINRUN" plan d.lua train.steps=100000000 train.time=1h cost.hardware=cpu cost.peak_tflops=0.001 > plan.txt \
  || fail "plan time limit"
grep -q "train.time = 1.0 h stops it first: about .* steps" plan.txt || { cat plan.txt; fail "plan: time stops first"; }

# --- report: no peak, no price: n/a, not -100% or $0.00 ---------------------------------------
"$TRAINRUN" report tok > rep.txt || fail "report"
grep -q "^mfu  *n/a (no peak FLOP/s known" rep.txt || { cat rep.txt; fail "report: mfu n/a"; }
grep -q "^cost  *n/a (no price known" rep.txt || { cat rep.txt; fail "report: cost n/a"; }
if grep -q -- "-100" rep.txt; then cat rep.txt; fail "report prints -100%"; fi

# --- the progress bar: on a terminal (script(1) gives one), never in a pipe -------------------
"$TRAINRUN" export t1 --dtype fp32 -o w.safetensors 2> exp.txt || { cat exp.txt; fail "export"; }
if grep -q "exporting" exp.txt; then cat exp.txt; fail "a bar on a pipe"; fi
if command -v script > /dev/null; then
  script -qec "'$TRAINRUN' export t1 --dtype fp32 -o w2.safetensors" /dev/null > tty.txt || { cat tty.txt; fail "export on a tty"; }
  grep -q "exporting 100% \[#*\] [0-9.]*/[0-9.]* kB  .*B/s  ETA 0:00:00" tty.txt || { cat tty.txt; fail "no export bar on a terminal"; }
  grep -q "exporting: [0-9.]* kB in" tty.txt || { cat tty.txt; fail "no summary line"; }
  cmp w.safetensors w2.safetensors || fail "the bar changed the export"
  script -qec "'$TRAINRUN' export t1 --format hf -o hfdir" /dev/null > tty.txt || { cat tty.txt; fail "hf export on a tty"; }
  grep -q "exporting 100%" tty.txt || { cat tty.txt; fail "no hf export bar"; }
  printf 'In the beginning God created the heaven and the earth.\n' > in.txt
  for i in 1 2 3 4 5 6; do cat in.txt in.txt in.txt > in2.txt; cat in2.txt >> in.txt; done
  "$TRAINRUN" prepare in.txt -o prep1 --tokenizer "$TR_SRCDIR/tests/fixtures/tokenizer/bpe_gpt2.json" \
    > prep.txt 2>&1 || { cat prep.txt; fail "prepare"; }
  if grep -q "tokenizing " prep.txt; then cat prep.txt; fail "a prepare bar on a pipe"; fi
  script -qec "'$TRAINRUN' prepare in.txt -o prep2 --tokenizer '$TR_SRCDIR/tests/fixtures/tokenizer/bpe_gpt2.json'" \
    /dev/null > tty.txt || { cat tty.txt; fail "prepare on a tty"; }
  grep -q "tokenizing 100% \[#*\]" tty.txt || { cat tty.txt; fail "no prepare bar on a terminal"; }
fi
# --- help recipe lists every key: the core's tables, every plugin's options, the builders' ---
"$TRAINRUN" help recipe > help.txt
has() { grep -Eq "(^|[ ,{])$1( |,|$)" help.txt || fail "help recipe does not list $2 '$1'"; }
# everything show resolves (the core's options, the chosen plugins' options, model keys)
for r in "$TR_SRCDIR/recipes/kjv-char.lua" "$TR_SRCDIR/recipes/llama-kjv.lua" d.lua; do
  "$TRAINRUN" show "$r" > show.txt || fail "show $r"
  for k in $(sed -n 's/^\([a-z_0-9.]*\) = .*/\1/p' show.txt | grep -v '^logger\.' | sed 's/.*\.//' | sort -u); do
    [ "$k" = type ] || has "$k" "the key"
  done
done
# every option of every plugin on the search path
"$TRAINRUN" plugins > plugins.txt
for k in $(sed -n 's/^    \([a-z_0-9]*\)  *= .*/\1/p' plugins.txt | sort -u); do has "$k" "the plugin option"; done
for slot in precision data checkpoint schedule comm logger; do
  grep -q "^  $slot = {" help.txt || fail "help recipe has no $slot section"
done
grep -q "^    windows\|, windows" help.txt || fail "help recipe does not list data.windows"
# every builder option models.lua declares (recompute, activation, ...)
for k in $(grep -E '^  [a-z_]+ *= *(\{ *(int|num|bool|default)|gpt_schema\.)' "$TR_SRCDIR/lua/trainrun/models.lua" \
           | sed 's/^  \([a-z_]*\).*/\1/' | sort -u); do
  grep -Eq "^      $k  *= " help.txt || fail "help recipe does not list the model option '$k'"
done
grep -Eq "^      recompute  *= 0 " help.txt || fail "help recipe: recompute's default"
echo "durations: ok"

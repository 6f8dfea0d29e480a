#!/bin/sh
# logger = { "jsonl", "csv", "tensorboard" }: metrics.jsonl as without it,
# metrics.csv and the TensorBoard event file holding the same numbers
# (tests/tfevents_check reads the event file apart from the plugin), a
# resumed run appending to the CSV and adding an event file, the list's
# refusals, and `trainrun plugins` listing the loggers.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
CHECK="$TR_BUILDDIR/tests/tfevents_check"
set -- train.steps=6 train.eval_every=3 train.log_every=1 checkpoint.every=3 --quiet

# the default writes metrics.jsonl alone, and the same lines as jsonl named
"$TRAINRUN" "$R" "$@" run_dir=plain
"$TRAINRUN" "$R" "$@" run_dir=all logger=jsonl,csv,tensorboard
[ ! -e plain/metrics.csv ] && [ ! -e plain/tb ] || fail "the default logger wrote more than metrics.jsonl"
# the same lines but for their timings
strip() { sed -e 's/"tokens_per_s": [^,]*,//; s/"data_wait_pct": [^,]*,//; s/"elapsed_s": [^}]*//' "$1"; }
strip plain/metrics.jsonl > a.txt
strip all/metrics.jsonl > b.txt
cmp a.txt b.txt || fail "metrics.jsonl differs with the loggers added"
[ "$(grep -c '"loss"' all/metrics.jsonl)" -eq 6 ] || fail "6 training lines expected"

# csv: a header and one row per metrics.jsonl line, the same losses
head -n 1 all/metrics.csv | grep -q '^step,loss,lr,grad_norm,' || fail "metrics.csv header: $(head -n 1 all/metrics.csv)"
[ "$(wc -l < all/metrics.csv)" -eq $(( $(wc -l < all/metrics.jsonl) + 1 )) ] ||
  fail "metrics.csv has $(wc -l < all/metrics.csv) lines for $(wc -l < all/metrics.jsonl) in metrics.jsonl"
awk -F, 'NR > 1 && $2 != "" { printf "%d %.5e\n", $1, $2 }' all/metrics.csv > csv.loss
grep '"loss"' all/metrics.jsonl | sed -e 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/' |
  awk '{ printf "%d %.5e\n", $1, $2 }' > jsonl.loss
cmp csv.loss jsonl.loss || fail "metrics.csv's losses differ from metrics.jsonl's"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "val_loss") c = i }
         NR > 1 && $c != "" { n++ } END { exit n != 2 }' all/metrics.csv || fail "2 validation rows expected"

# tensorboard: one event file holding what metrics.jsonl holds
n=$(ls all/tb | grep -c '^events\.out\.tfevents\.')
[ "$n" -eq 1 ] || fail "$n event files in all/tb"
"$CHECK" all/tb/events.out.tfevents.* all/metrics.jsonl || fail "the event file differs from metrics.jsonl"

# resumed with more steps: the CSV goes on below its rows, a second event file
"$TRAINRUN" "$R" "$@" run_dir=all logger=jsonl,csv,tensorboard train.steps=9 --resume auto
[ "$(grep -c '^step,' all/metrics.csv)" -eq 1 ] || fail "the resumed run wrote a second header"
[ "$(awk -F, 'NR > 1 && $2 != ""' all/metrics.csv | wc -l)" -eq 9 ] || fail "9 training rows expected after the resume"
n=$(ls all/tb | grep -c '^events\.out\.tfevents\.')
[ "$n" -eq 2 ] || fail "$n event files in all/tb after the resume, expected 2"
second=$(ls all/tb/events.out.tfevents.* | sort | tail -n 1)
grep -v '"step": [1-6],' all/metrics.jsonl > resumed.jsonl
"$CHECK" "$second" resumed.jsonl || fail "the resumed run's event file differs from its metrics.jsonl lines"

# refusals, naming the recipe line or the command line
out=$("$TRAINRUN" "$R" "$@" run_dir=bad logger=jsonl,tensorbord 2>&1) && fail "an unknown logger ran"
echo "$out" | grep -q "did you mean 'tensorboard'" || fail "no suggestion: $out"
out=$("$TRAINRUN" "$R" "$@" run_dir=bad logger=csv,csv 2>&1) && fail "a logger listed twice ran"
echo "$out" | grep -q "listed twice" || fail "$out"
cat > bad.lua <<'LUA'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  train = { steps = 4, batch = 4 },
  logger = { "jsonl", { plugin = "csv", colums = "loss" } },
}
LUA
out=$("$TRAINRUN" show bad.lua 2>&1) && fail "show took an unknown csv option"
echo "$out" | grep -q "bad.lua:5" && echo "$out" | grep -q "colums" || fail "$out"
# an out-of-tree logger (the docs/plugins.md example): metadata, then a loss per logged step
"$TRAINRUN" "$R" "$@" run_dir=mine logger=jsonl,stdout --plugin-path "$TR_TEST_PLUGIN_DIR" > mine.out
grep -q '^logging a new run$' mine.out || fail "the stdout logger was not opened: $(cat mine.out)"
grep -q "^recipe = $R\$" mine.out && grep -q '^trainrun_version = ' mine.out && grep -q '^run = tiny$' mine.out ||
  fail "the stdout logger got no metadata: $(cat mine.out)"
[ "$(grep -c '^step [0-9]* loss ' mine.out)" -eq 6 ] || fail "the stdout logger got $(grep -c '^step' mine.out) losses, not 6"
grep '^step 6 loss ' mine.out | grep -q " $(last_metric mine/metrics.jsonl loss)\$" || fail "step 6's loss differs: $(grep '^step 6' mine.out)"
# a logger that cannot write stops the run, naming its recipe line and the file
cat > full.lua <<'LUA'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  train = { steps = 4, batch = 4 },
  logger = { "jsonl", { plugin = "csv", file = "/dev/full" } },
}
LUA
out=$("$TRAINRUN" full.lua run_dir=full --quiet 2>&1) && fail "a run whose logger cannot write went on"
echo "$out" | grep -q "full.lua:5: logger 'csv'" && echo "$out" | grep -q "cannot write /dev/full" ||
  fail "the logger's error does not name its line and file: $out"
"$TRAINRUN" plugins | grep -q '^logger plugins' || fail "trainrun plugins lists no loggers"
"$TRAINRUN" plugins | grep -q '^  tensorboard ' || fail "trainrun plugins lists no tensorboard"
echo "logger: ok"

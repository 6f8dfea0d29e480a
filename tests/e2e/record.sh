#!/bin/sh
# What a run records of its recipe, and what show and a resume check:
#   - a run writes RUN/recipe.resolved (show's listing) and
#     RUN/recipe.resolved.json (values, origins, trainrun's and the plugins'
#     versions);
#   - --resume auto refuses a change that alters training (optimizer.lr),
#     naming it "key: old -> new", and leaves the run untouched; a harmless
#     change (train.log_every) passes with a note; --allow-changes passes an
#     altering one with a warning; each changed record keeps the earlier one
#     as recipe.resolved.N;
#   - show runs the model builder's checks (an unknown model option fails at
#     the command line or the recipe line that set it, as the run fails) and
#     prints derived values (scaled lr, accumulation, tokens);
#   - replacing a plugin (schedule.plugin=constant, or a child recipe naming
#     another plugin) drops the old plugin's options with a note, while an
#     unknown option set beside the new plugin is still an error.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
set -- train.steps=10 checkpoint.every=5

# --- the record ------------------------------------------------------------------------
"$TRAINRUN" "$R" "$@" run_dir=a --quiet
[ -s a/recipe.resolved ] && [ -s a/recipe.resolved.json ] || fail "no recipe record in the run directory"
"$TRAINRUN" show "$R" "$@" run_dir=a > show.txt
sed '/^-- derived/,$d' show.txt > show-part.txt
cmp show-part.txt a/recipe.resolved || { diff show-part.txt a/recipe.resolved; fail "recipe.resolved is not what show prints"; }
version=$("$TRAINRUN" version | sed -n 's/^trainrun \([^ ]*\) .*/\1/p')
grep -q "\"trainrun\": \"$version\"" a/recipe.resolved.json || fail "no trainrun version in the record"
grep -q '"optimizer.lr": {"value": "1e-3", "origin": "default"}' a/recipe.resolved.json \
  || { cat a/recipe.resolved.json; fail "no optimizer.lr with its origin in the record"; }
grep -q '"train.steps": {"value": "10", "origin": "command line"}' a/recipe.resolved.json \
  || fail "no command-line origin in the record"
grep -q '{"slot": "schedule", "name": "cosine", "version": "[^"]*", "path": "[^"]*schedule_cosine[^"]*"}' \
  a/recipe.resolved.json || fail "no schedule plugin with version and path in the record"
# a logger plugin is one of the run's plugins too
# (lg.lua and child.lua extend $R by its absolute path: it lies outside the
# directory of the recipe run, so its directory goes on TRAINRUN_RECIPE_PATH)
printf 'return {\n  extends = "%s",\n  logger = { "jsonl", "csv" },\n}\n' "$R" > lg.lua
TRAINRUN_RECIPE_PATH=$(dirname "$R") "$TRAINRUN" lg.lua "$@" run_dir=lg --quiet || fail "a run with the csv logger"
grep -q '{"slot": "logger", "name": "csv", "version": "[^"]*", "path": "[^"]*logger_csv[^"]*"}' \
  lg/recipe.resolved.json || { cat lg/recipe.resolved.json; fail "no csv logger plugin in the record"; }
grep -q "^logger     = csv " lg/recipe.resolved || fail "no csv logger in recipe.resolved"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' a/recipe.resolved.json 2>/dev/null \
  || { command -v python3 >/dev/null && fail "recipe.resolved.json is not JSON"; }

# --- resume: an altering change is refused ----------------------------------------------
cp a/metrics.jsonl metrics-before.jsonl
cp a/recipe.resolved.json record-before.json
if "$TRAINRUN" "$R" "$@" run_dir=a optimizer.lr=0.01 --resume auto --quiet 2> lr.txt; then
  fail "a resume with another optimizer.lr was not refused"
fi
grep -q "^  optimizer.lr: 1e-3 -> 0.01$" lr.txt || { cat lr.txt; fail "the refusal does not name optimizer.lr: 1e-3 -> 0.01"; }
grep -q -- "--allow-changes" lr.txt || { cat lr.txt; fail "the refusal does not say how to allow the change"; }
cmp a/metrics.jsonl metrics-before.jsonl || fail "a refused resume changed metrics.jsonl"
cmp a/recipe.resolved.json record-before.json || fail "a refused resume changed the record"
[ ! -e a/recipe.resolved.1.json ] || fail "a refused resume kept a record"
# model and data changes too
if "$TRAINRUN" "$R" "$@" run_dir=a data.samples=256 --resume auto --quiet 2> data.txt; then
  fail "a resume with other data was not refused"
fi
grep -q "^  data.samples: 512 -> 256$" data.txt || { cat data.txt; fail "data.samples not named"; }

# --- resume: a harmless change passes with a note, the earlier record kept --------------
"$TRAINRUN" "$R" "$@" run_dir=a train.log_every=2 --resume auto --quiet 2> log.txt \
  || { cat log.txt; fail "a resume with another log_every was refused"; }
grep -q "note: resuming with changes that do not alter training" log.txt || { cat log.txt; fail "no note"; }
grep -q "^  train.log_every: 1 -> 2$" log.txt || { cat log.txt; fail "the note does not name train.log_every"; }
cmp a/recipe.resolved.1.json record-before.json || fail "the earlier record was not kept as recipe.resolved.1.json"
[ -s a/recipe.resolved.1 ] || fail "the earlier listing was not kept as recipe.resolved.1"
grep -q '"train.log_every": {"value": "2"' a/recipe.resolved.json || fail "the new record lacks log_every 2"

# --- resume: --allow-changes ------------------------------------------------------------
"$TRAINRUN" "$R" "$@" run_dir=a train.log_every=2 optimizer.lr=0.01 --resume auto --allow-changes \
  --quiet 2> allow.txt || { cat allow.txt; fail "--allow-changes did not resume"; }
grep -q "warning: resuming with changes that alter training" allow.txt || { cat allow.txt; fail "no warning"; }
grep -q '"optimizer.lr": {"value": "0.01"' a/recipe.resolved.json || fail "the record lacks the allowed lr"
grep -q '"optimizer.lr": {"value": "1e-3"' a/recipe.resolved.2.json || fail "the record before --allow-changes was not kept"
# the same recipe again: nothing to note, nothing more kept
"$TRAINRUN" "$R" "$@" run_dir=a train.log_every=2 optimizer.lr=0.01 --resume auto --quiet 2> same.txt \
  || { cat same.txt; fail "resuming with the recorded recipe"; }
if grep -q "resuming with changes" same.txt; then cat same.txt; fail "an unchanged recipe reported changes"; fi
[ ! -e a/recipe.resolved.3.json ] || fail "an unchanged recipe kept another record"

# --- show validates what the run validates ----------------------------------------------
if "$TRAINRUN" show "$R" model.dropuot=0.1 > /dev/null 2> show-err.txt; then
  fail "show passed model.dropuot=0.1"
fi
grep -q "error: command line: gpt: unknown option 'dropuot'" show-err.txt || { cat show-err.txt; fail "show's error"; }
if "$TRAINRUN" "$R" model.dropuot=0.1 run_dir=b --quiet 2> run-err.txt; then fail "the run passed model.dropuot"; fi
cmp show-err.txt run-err.txt || { cat show-err.txt run-err.txt; fail "show and the run fail differently"; }
cat > child.lua <<'EOF2'
return {
  extends = "TINY",
  model = { dropuot = 0.1 },
}
EOF2
sed -i "s|TINY|$R|" child.lua
if TRAINRUN_RECIPE_PATH=$(dirname "$R") "$TRAINRUN" show child.lua > /dev/null 2> child-err.txt; then fail "show passed a child's model.dropuot"; fi
grep -q "child.lua:3: gpt: unknown option 'dropuot'" child-err.txt || { cat child-err.txt; fail "not the child's line"; }
if "$TRAINRUN" show "$R" model.layers=0 > /dev/null 2> layers.txt; then fail "show passed model.layers=0"; fi
grep -q "option 'layers' must be an integer" layers.txt || { cat layers.txt; fail "show: layers=0"; }
# derived values
"$TRAINRUN" show "$R" train.batch=8 train.micro_batch=2 optimizer.reference_batch=4 > derived.txt
grep -q "^lr (scaled)     = 0.002 " derived.txt || { cat derived.txt; fail "no scaled lr"; }
grep -q "^accumulation    = 4 micro-batch(es) of 2 per step" derived.txt || { cat derived.txt; fail "no accumulation"; }
grep -q "^tokens/step     = 64 " derived.txt || { cat derived.txt; fail "no tokens per step"; }
grep -q "^tokens in all   = 256 " derived.txt || { cat derived.txt; fail "no total tokens"; }

# train.tokens: the steps it gives, as the run derives them
cat > tok.lua <<'EOF2'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  train = { tokens = "10k", batch = 4 },
}
EOF2
"$TRAINRUN" show tok.lua > tok.txt || fail "show with train.tokens"
grep -q "^steps           = 313 " tok.txt || { cat tok.txt; fail "no steps from train.tokens (ceil(10000 / 32))"; }
grep -q "^tokens in all   = 10016 " tok.txt || { cat tok.txt; fail "no total tokens from train.tokens"; }

# --- replacing a plugin -----------------------------------------------------------------
sed 's/schedule = { plugin = "cosine", warmup = 2 }/schedule = { plugin = "cosine", warmup = 2, min_lr_ratio = 0.2 }/' \
  "$R" > base.lua
grep -q min_lr_ratio base.lua || fail "base.lua: tiny.lua's schedule line changed"
if "$TRAINRUN" show base.lua schedule.plugin=constant > switch-out.txt 2> switch.txt; then :; else
  cat switch.txt; fail "schedule.plugin=constant"
fi
grep -q "note: schedule: dropped min_lr_ratio (set for cosine at base.lua:5; constant, named at the command line (schedule.plugin=constant), has no such option); kept warmup, which it takes too" \
  switch.txt || { cat switch.txt; fail "no note naming the dropped and the kept option"; }
grep -q "^schedule.warmup = 2 *-- base.lua:5" switch-out.txt || fail "warmup, which constant takes, was not kept"
"$TRAINRUN" base.lua schedule.plugin=constant train.steps=2 run_dir=c --quiet 2> switch-run.txt \
  || { cat switch-run.txt; fail "a run with schedule.plugin=constant"; }
grep -q '"schedule.plugin": {"value": "\\"constant\\""' c/recipe.resolved.json || fail "the record lacks the switched plugin"
if grep -q "schedule.min_lr_ratio" c/recipe.resolved.json; then fail "the dropped option is in the record"; fi
# an option set beside the new plugin is still checked against it
if "$TRAINRUN" show base.lua schedule.plugin=constant schedule.min_lr_ratio=0.5 > /dev/null 2> beside.txt; then
  fail "an option the new plugin lacks, set beside it, passed"
fi
grep -q "command line: schedule 'constant': unknown option 'min_lr_ratio'" beside.txt || { cat beside.txt; fail "no error for the option beside the new plugin"; }
# a child recipe naming another plugin
cat > child2.lua <<'EOF2'
return {
  extends = "base.lua",
  schedule = { plugin = "constant" },
}
EOF2
"$TRAINRUN" show child2.lua > /dev/null 2> child2.txt || { cat child2.txt; fail "a child switching the schedule"; }
grep -q "note: schedule: dropped min_lr_ratio (set for cosine at base.lua:5; constant, named at child2.lua:3, has no such option)" child2.txt \
  || { cat child2.txt; fail "no note for the child's switch"; }
# ...whose own options are still checked
cat > child3.lua <<'EOF2'
return {
  extends = "base.lua",
  schedule = { plugin = "constant", min_lr_ratio = 0.3 },
}
EOF2
if "$TRAINRUN" show child3.lua > /dev/null 2> child3.txt; then fail "a child's unknown option beside its plugin passed"; fi
grep -q "child3.lua:3: schedule 'constant': unknown option 'min_lr_ratio'" child3.txt || { cat child3.txt; fail "child3's error"; }
echo "record: ok"

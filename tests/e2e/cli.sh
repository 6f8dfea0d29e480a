#!/bin/sh
# The command line as a user meets it: help, plugins, show, and the errors.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/recipes"

"$TRAINRUN" help | grep -q "usage: trainrun" || fail "help"
"$TRAINRUN" help recipe | grep -q "micro_batch" || fail "help recipe lists train options"
"$TRAINRUN" version | grep -q "plugin ABI 1" || fail "version"

# plugins: every kind, options with defaults and help
"$TRAINRUN" plugins > plugins.txt
for k in precision data checkpoint schedule; do
  grep -q "^$k plugins" plugins.txt || fail "plugins lists no $k plugins"
done
grep -q 'warmup *= 0 ' plugins.txt || fail "plugins shows the cosine warmup default"
grep -q "min_lr_ratio" plugins.txt || fail "plugins shows cosine options"
"$TRAINRUN" plugins schedule | grep -q "^data plugins" && fail "plugins KIND filters"

# show: resolved values with their origin
"$TRAINRUN" show "$R/kjv-char.lua" train.steps=7 > show.txt
grep -q '^train.steps *= 7 *-- command line$' show.txt || fail "show: override origin"
grep -Eq "^optimizer.lr *= 2e-3 *-- .*recipes/base/gpt-char.lua:5$" show.txt || fail "show: inherited value names base file:line"
grep -Eq "^data.path *= \"data/kjv.txt\" *-- .*recipes/kjv-char.lua:7$" show.txt || fail "show: own value names file:line"
grep -Eq '^train.workers *= 1 *-- default$' show.txt || fail "show: defaults"
grep -Eq '^schedule.min_lr_ratio *= 0.1 *-- .*gpt-char.lua:6$' show.txt || fail "show: plugin option"
TRAINRUN_PRECISION=bf16 "$TRAINRUN" show "$R/kjv-char.lua" | grep -Eq '^precision.plugin *= "bf16" *-- env TRAINRUN_PRECISION$' \
  || fail "show: precision from the environment"

# errors name the file and line, and exit 1
cat > typo.lua <<'L'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64 },
  schedule = { plugin = "cosine", warmpu = 10 },
}
L
if "$TRAINRUN" typo.lua 2> err.txt; then fail "a typo must fail"; fi
grep -q "typo.lua:4: schedule 'cosine': unknown option 'warmpu' (did you mean 'warmup'?)" err.txt \
  || { cat err.txt; fail "typo message"; }
if "$TRAINRUN" "$R/kjv-char.lua" train.steps=abc 2> err.txt; then fail "bad override must fail"; fi
grep -q "command line: train: option 'steps' expects an integer, got \"abc\"" err.txt || { cat err.txt; fail "override message"; }
if "$TRAINRUN" "$R/kjv-char.lua" data.path=missing.txt train.steps=1 2> err.txt; then fail "missing data must fail"; fi
grep -q "missing.txt" err.txt || { cat err.txt; fail "missing data file named"; }
set +e
"$TRAINRUN" --no-such-flag 2>/dev/null; [ $? -eq 2 ] || fail "usage errors exit 2"
set -e

# an inline model on synthetic data trains
"$TRAINRUN" "$R/inline-model.lua" train.steps=60 --quiet run_dir=inline || fail "inline model"
acc=$(last_metric inline/metrics.jsonl val_accuracy)
less_than 0.5 "$acc" || fail "inline model accuracy $acc"
echo "cli: ok"

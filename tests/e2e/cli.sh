#!/bin/sh
# The command line as a user meets it: help, plugins, show, and the errors.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/recipes"

"$TRAINRUN" help | grep -q "usage: trainrun" || fail "help"
"$TRAINRUN" help recipe | grep -q "micro_batch" || fail "help recipe lists train options"
"$TRAINRUN" version | grep -q "plugin ABI 2" || fail "version"

# OpenMP's idle threads: trainrun asks for a short spin unless the user chose
# (main.c, prefer_short_spin_openmp); doctor shows what the run got
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u KMP_BLOCKTIME "$TRAINRUN" doctor > wait.txt 2>&1
grep -q '^  OpenMP waiting  *GOMP_SPINCOUNT=10000 KMP_BLOCKTIME=1 ' wait.txt || fail "doctor: the default short spin"
OMP_WAIT_POLICY=passive "$TRAINRUN" doctor 2>&1 | grep -q '^  OpenMP waiting  *OMP_WAIT_POLICY=passive (' \
  || fail "doctor: a wait policy from the environment is kept, and nothing added to it"

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
# usage errors exit 2, with a message saying what was expected
usage_error() { # usage_error "expected message" trainrun-args...
  want=$1
  shift
  set +e
  "$TRAINRUN" "$@" > out.txt 2> err.txt
  code=$?
  set -e
  [ $code -eq 2 ] || { cat err.txt; fail "trainrun $*: exit $code, expected 2 (usage)"; }
  grep -q -- "$want" err.txt || { cat err.txt; fail "trainrun $*: no '$want'"; }
}
usage_error "unknown flag '--no-such-flag'" --no-such-flag
usage_error "resume needs a value: --resume auto or --resume never" "$R/kjv-char.lua" --resume
usage_error "takes auto or never, not 'sometimes'" "$R/kjv-char.lua" --resume sometimes
usage_error "goes after the recipe: trainrun RECIPE.lua --resume auto" --resume auto "$R/kjv-char.lua"
usage_error "unknown flag '--bogus'" show "$R/kjv-char.lua" --bogus
usage_error "unknown command 'shwo' (did you mean 'show'?)" shwo "$R/kjv-char.lua"
usage_error "neither a command nor a recipe file" frobnicate
usage_error "no recipe comes before it" train.steps=5
usage_error "the key before '=' is empty" "$R/kjv-char.lua" =5
usage_error "the key has an empty part" show "$R/kjv-char.lua" train..steps=5
usage_error "starts or ends with '.'" plan "$R/kjv-char.lua" train.steps.=5
usage_error "gpus=N takes an integer from 1 to 1048576, not 'abc'" plan "$R/kjv-char.lua" gpus=abc
usage_error "is not an override" "$R/kjv-char.lua" steps
usage_error "smoke needs a recipe" --smoke
usage_error "takes at most one KIND" plugins schedule data
usage_error "doctor takes no arguments" doctor now
usage_error "plugin-path needs a directory" plugins --plugin-path
usage_error "is not a directory" plugins --plugin-path "$work/nowhere"
# sample: numbers are parsed strictly (atoi read "abc" as 0 and "10x" as 10)
usage_error "tokens takes an integer from 0 to 1000000, not 'abc'" sample runs/x --tokens abc
usage_error "tokens takes an integer from 0 to 1000000, not '10x'" sample runs/x --tokens 10x
usage_error "tokens takes an integer from 0 to 1000000, not '-1'" sample runs/x --tokens -1
usage_error "temperature takes a number of 0 or more (0: greedy, the likeliest token each time), not 'hot'" sample runs/x --temperature hot
usage_error "temperature takes a number of 0 or more (0: greedy, the likeliest token each time), not 'nan'" sample runs/x --temperature nan
usage_error "top-k takes an integer" sample runs/x --top-k 3.5
usage_error "seed takes an integer from 0 to" sample runs/x --seed -1
usage_error "seed takes an integer from 0 to" sample runs/x --seed 99999999999999999999
usage_error "tokens needs a value" sample runs/x --tokens
usage_error "-o needs a value" export runs/x -o
usage_error "threads takes an integer" topo --threads abc
usage_error "workers takes an integer" topo --workers 2x

# ---- a shared recipe runs no code: no .so beside it is loaded, whatever it says
cc=${CC:-cc}
if command -v "$cc" > /dev/null 2>&1; then
  mkdir shared
  # a shared object whose constructor runs at dlopen, before any check
  cat > shared/evil.c << 'C'
#include <stdio.h>
__attribute__((constructor)) static void evil(void)
{
    FILE *f = fopen(MARKER, "a");
    if (f) { fputs("loaded\n", f); fclose(f); }
}
C
  "$cc" -shared -fPIC -DMARKER="\"$work/marker\"" -o shared/evil.so shared/evil.c || fail "building evil.so"
  for f in schedule_evil data_evil precision_evil checkpoint_evil comm_evil backend_cuda backend_evil \
           schedule_cosine data_synthetic; do
    cp shared/evil.so "shared/$f.so"
  done
  cat > shared/by-name.lua << 'L'
return {
  model = mlp { inputs = 8, hidden = { 16 }, classes = 3 },
  data = { plugin = "synthetic", kind = "features", features = 8, classes = 3, samples = 64 },
  schedule = "evil",
  train = { steps = 2, batch = 8 },
}
L
  sed 's/schedule = "evil"/schedule = "cosine", comm = "evil"/' shared/by-name.lua > shared/comm.lua
  sed 's/schedule = "evil"/precision = "evil"/' shared/by-name.lua > shared/precision.lua
  sed "s|schedule = \"evil\"|schedule = \"../shared/evil\"|" shared/by-name.lua > shared/path.lua
  sed "s|schedule = \"evil\"|data = { plugin = \"$work/shared/data_evil\" }|" shared/by-name.lua > shared/abs.lua
  sed 's/schedule = "evil"/checkpoint = { plugin = "evil" }/' shared/by-name.lua > shared/ckpt.lua
  for r in by-name comm precision path abs ckpt; do
    for cmd in show plan run; do
      set +e
      (cd shared && "$TRAINRUN" $cmd "$r.lua" run_dir="$work/runs-$r" > "$work/$r-$cmd.out" 2>&1)
      code=$?
      set -e
      [ ! -e marker ] || { cat "$r-$cmd.out"; fail "trainrun $cmd $r.lua loaded a shared object beside the recipe"; }
      [ $code -ne 0 ] || { cat "$r-$cmd.out"; fail "trainrun $cmd $r.lua: a plugin beside the recipe was used"; }
    done
  done
  # device = "cuda" names a backend: backend_cuda.so beside the recipe is not it
  sed 's/schedule = "evil"/device = "cuda"/' shared/by-name.lua > shared/device.lua
  (cd shared && "$TRAINRUN" device.lua run_dir="$work/runs-device" > "$work/device.out" 2>&1) || true
  [ ! -e marker ] || { cat device.out; fail "device = \"cuda\" loaded backend_cuda.so beside the recipe"; }
  grep -q "plugins never load from a recipe's directory" by-name-show.out || { cat by-name-show.out; fail "no hint for a plugin beside the recipe"; }
  grep -q 'invalid schedule plugin name "../shared/evil"' path-run.out || { cat path-run.out; fail "a plugin path was not refused"; }
  grep -q "never by a path" abs-show.out || { cat abs-show.out; fail "an absolute plugin path was not refused"; }
  (cd shared && "$TRAINRUN" plugins > "$work/plugins-here.out" 2>&1 && "$TRAINRUN" doctor > /dev/null 2>&1) || true
  [ ! -e marker ] || fail "plugins or doctor loaded a shared object from the current directory"
  # the user can still choose to trust a directory: the flag is what loads it
  set +e
  (cd shared && "$TRAINRUN" show by-name.lua --plugin-path "$work/shared" > "$work/trusted.out" 2>&1)
  set -e
  [ -e marker ] || { cat trusted.out; fail "--plugin-path DIR did not search DIR"; }
  rm -f marker
  echo "cli: no code beside a recipe ran (show, plan, run; plugins by name, by path, comm, device)"
else
  echo "cli: no C compiler ($cc): the shared-object checks were skipped"
fi

# an inline model on synthetic data trains
"$TRAINRUN" "$R/inline-model.lua" train.steps=60 --quiet run_dir=inline || fail "inline model"
acc=$(last_metric inline/metrics.jsonl val_accuracy)
less_than 0.5 "$acc" || fail "inline model accuracy $acc"
echo "cli: ok"

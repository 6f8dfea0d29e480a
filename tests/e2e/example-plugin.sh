#!/bin/sh
# A plugin written outside the tree builds against the installed header with
# pkg-config and is loaded through a recipe, from a directory the user names
# (never from the recipe's own directory).
. "$(dirname "$0")/lib.sh"
: "${TR_BUILDDIR:?}"
# a staged install: the binary finds its plugins and Lua relative to itself
make -C "$TR_BUILDDIR" install DESTDIR="$work/root" > install.log 2>&1 || { tail install.log; fail "make install"; }
prefix_dir=$(sed -n 's/^prefix = //p' "$TR_BUILDDIR/Makefile")
prefix="$work/root$prefix_dir"
# PKG_CONFIG_PATH alone: trainrun.pc names its directories relative to
# itself, so the staged copy points into the staging, not at $prefix_dir
unset PKG_CONFIG_SYSROOT_DIR
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
inc=$(pkg-config --cflags trainrun | sed 's/^-I//; s/ *$//')
[ -f "$inc/trainrun/plugin.h" ] || fail "trainrun.pc: $(pkg-config --cflags trainrun) is not the staged header"
[ "$(cd "$inc" && pwd -P)" = "$(cd "$prefix/include" && pwd -P)" ] || fail "trainrun.pc: $inc is not $prefix/include"
plugins=$(pkg-config --variable=plugindir trainrun)
[ -f "$plugins/schedule_cosine.so" ] || fail "trainrun.pc: plugindir $plugins holds no plugins"
cp "$TR_SRCDIR/contrib/example-plugin/schedule_invsqrt.c" "$TR_SRCDIR/contrib/example-plugin/Makefile" .
make > build.log 2>&1 || { cat build.log; fail "building the example plugin"; }
[ -f schedule_invsqrt.so ] || fail "no schedule_invsqrt.so"
cat > recipe.lua <<'L'
return {
  model = mlp { inputs = 8, hidden = { 16 }, classes = 3 },
  data = { plugin = "synthetic", kind = "features", features = 8, classes = 3, samples = 512 },
  schedule = { plugin = "invsqrt", warmup = 5 },
  train = { steps = 20, batch = 8, log_every = 1 },
}
L
# beside the recipe it is not loaded: a recipe's directory is not trusted
set +e
"$prefix/bin/trainrun" recipe.lua --quiet > beside.log 2>&1
code=$?
set -e
[ $code -eq 1 ] || { cat beside.log; fail "a plugin beside the recipe was loaded (exit $code)"; }
grep -q "no schedule plugin 'invsqrt'.*never load from a recipe's directory" beside.log ||
  { cat beside.log; fail "the refusal does not say where plugins load from"; }
# the user names the directory: --plugin-path, or TRAINRUN_PLUGIN_PATH
"$prefix/bin/trainrun" recipe.lua --plugin-path "$work" --quiet || fail "installed trainrun with --plugin-path"
grep -q '"lr"' runs/recipe/metrics.jsonl || fail "no metrics"
# the rates the core got from the plugin (docs/plugins.md, Testing a plugin):
# base 1e-3, warmup 5: 1/5 of it at the first step, sqrt(5/20) at the last
grep -q '^{"step": 1, .*"lr": 0.0002,' runs/recipe/metrics.jsonl &&
  grep -q '^{"step": 5, .*"lr": 0.001,' runs/recipe/metrics.jsonl &&
  grep -q '^{"step": 20, .*"lr": 0.0005,' runs/recipe/metrics.jsonl ||
  { cat runs/recipe/metrics.jsonl; fail "the example plugin's rates"; }
mkdir elsewhere && mv schedule_invsqrt.so elsewhere/
TRAINRUN_PLUGIN_PATH="$work/elsewhere" "$prefix/bin/trainrun" plugins schedule | grep -q "invsqrt" \
  || fail "TRAINRUN_PLUGIN_PATH"
"$prefix/bin/trainrun" --plugin-path "$work/elsewhere" show recipe.lua | grep -q "^schedule *= invsqrt *-- $work/elsewhere/schedule_invsqrt.so" \
  || fail "--plugin-path before the command"
echo "example-plugin: ok"

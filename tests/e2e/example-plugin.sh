#!/bin/sh
# A plugin written outside the tree builds against the installed header with
# pkg-config and is loaded through a recipe.
. "$(dirname "$0")/lib.sh"
: "${TR_BUILDDIR:?}"
# a staged install: the binary finds its plugins and Lua relative to itself
make -C "$TR_BUILDDIR" install DESTDIR="$work/root" > install.log 2>&1 || { tail install.log; fail "make install"; }
prefix_dir=$(sed -n 's/^prefix = //p' "$TR_BUILDDIR/Makefile")
prefix="$work/root$prefix_dir"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$work/root"
pkg-config --cflags trainrun | grep -q "$prefix/include" || fail "trainrun.pc: $(pkg-config --cflags trainrun)"
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
# found next to the recipe, and through TRAINRUN_PLUGIN_PATH by the installed binary
"$prefix/bin/trainrun" recipe.lua --quiet || fail "installed trainrun with the example plugin"
grep -q '"lr"' runs/recipe/metrics.jsonl || fail "no metrics"
mkdir elsewhere && mv schedule_invsqrt.so elsewhere/
TRAINRUN_PLUGIN_PATH="$work/elsewhere" "$prefix/bin/trainrun" plugins schedule | grep -q "invsqrt" \
  || fail "TRAINRUN_PLUGIN_PATH"
echo "example-plugin: ok"

#!/bin/sh
# Shared recipes are data: a recipe whose code loops, recurses or allocates
# without end is stopped by `trainrun show`, `plan`, `--smoke` and a run
# within seconds, with an error naming its file:line and exit status 1 --
# never a hang, a crash or the machine's memory.  The address space is
# capped well below what the recipes ask for: a recipe that got past the
# heap limit of recipe code would fail differently here.
. "$(dirname "$0")/lib.sh"
L="$TR_SRCDIR/tests/recipes/limits"
cp "$L"/*.lua .

ulimit -v 3145728 2>/dev/null || true # 3 GiB: the 1 GiB heap limit plus the process

# expect_stop WHAT: runs "$@" (after WHAT), wants exit 1 within 60 s and
# stderr containing $want
expect_stop() {
  what=$1
  shift
  start=$(date +%s)
  set +e
  timeout 60 "$@" > out.txt 2> err.txt
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  [ "$rc" -eq 1 ] || { cat err.txt >&2; fail "$what: exit status $rc, want 1 (124: hung, 134/139: crashed)"; }
  grep -qF "$want" err.txt || { cat err.txt >&2; fail "$what: no \"$want\" in the error"; }
  [ "$took" -lt 30 ] || fail "$what: took $took s to stop"
}

loop="loop_in_plan.lua:6: recipe took too long (infinite loop?)"
want=$loop; expect_stop "plan, looping model" "$TRAINRUN" plan loop_in_plan.lua
want=$loop; expect_stop "--smoke, looping model" "$TRAINRUN" --smoke loop_in_plan.lua
want=$loop; expect_stop "run, looping model" "$TRAINRUN" loop_in_plan.lua run_dir=runs/loop

alloc="alloc_in_plan.lua:6: recipe code needs more than 1024 MiB of memory"
want=$alloc; expect_stop "plan, allocating model" "$TRAINRUN" plan alloc_in_plan.lua
want=$alloc; expect_stop "--smoke, allocating model" "$TRAINRUN" --smoke alloc_in_plan.lua

want="loop_base.lua:3: recipe took too long (infinite loop?)"
expect_stop "show, loop in an include" "$TRAINRUN" show loop_include.lua
want="recursion.lua:1: stack overflow"
expect_stop "show, runaway recursion" "$TRAINRUN" show recursion.lua
want="recursion_gsub.lua:2: recipe code is nested too deeply"
expect_stop "show, recursion through string.gsub" "$TRAINRUN" show recursion_gsub.lua
want="alloc_rep.lua:2: recipe code needs more than 1024 MiB of memory"
expect_stop "show, string.rep of a gigabyte" "$TRAINRUN" show alloc_rep.lua
want="alloc_concat.lua:3: recipe code needs more than 1024 MiB of memory"
expect_stop "show, a string doubling without end" "$TRAINRUN" show alloc_concat.lua
want="pattern.lua:2: string.find: matching"
expect_stop "show, a backtracking pattern" "$TRAINRUN" show pattern.lua
want="bad_graph.lua:33: model: the loss is 2147483648"
expect_stop "plan, a model graph with a bad id" "$TRAINRUN" plan bad_graph.lua model.case=loss_past_end \
  data.plugin=synthetic data.kind=features data.features=16 data.classes=4 train.batch=4
echo "ok"

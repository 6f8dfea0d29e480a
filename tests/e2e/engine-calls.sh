#!/bin/sh
# No circle of calls among the engine's files (core/engine): a file that
# calls a function of another never has that file, directly or through
# others, call back into it.  The run loop (run.c) calls the session, the
# policies, the journal and the run state; none of them calls run.c.  The
# calls are read from the built objects (nm: what each defines and what it
# needs), so a cycle cannot hide in a macro or a header.  The check first
# proves it can fail, on a planted pair.
. "$(dirname "$0")/lib.sh"
: "${TR_BUILDDIR:?run through make check}"
command -v nm > /dev/null || skip "nm is not installed"
command -v tsort > /dev/null || skip "tsort is not installed"

objs=$(ls "$TR_BUILDDIR"/core/engine/.libs/libtrcore_la-*.o 2>/dev/null || true)
[ -n "$objs" ] || objs=$(ls "$TR_BUILDDIR"/core/engine/libtrcore_la-*.o 2>/dev/null || true)
[ -n "$objs" ] || skip "no engine objects in $TR_BUILDDIR/core/engine"

# symbol -> the file that defines it; then "caller callee" per cross-file call
for o in $objs; do
  f=$(basename "$o" .o | sed 's/^libtrcore_la-//')
  nm -g --defined-only "$o" | awk -v f="$f" '$2 ~ /^[TD]$/ { print $3, f }'
done | sort > defs.txt
for o in $objs; do
  f=$(basename "$o" .o | sed 's/^libtrcore_la-//')
  nm -u "$o" | awk -v f="$f" '{ print $NF, f }'
done | sort > uses.txt
join defs.txt uses.txt | awk '$2 != $3 { print $3, $2 }' | sort -u > edges.txt
[ -s edges.txt ] || fail "no calls between the engine's files were found: the check reads nothing"

# tsort says "input contains a loop" and names the files when there is a cycle
cycle() { tsort "$1" 2>&1 > /dev/null | grep -v "input contains a loop" || true; }
printf 'run.c session.c\nsession.c run.c\n' | sed 's/\.c//g' > planted.txt
[ -n "$(cycle planted.txt)" ] || fail "the check cannot see a planted cycle"
loop=$(cycle edges.txt)
if [ -n "$loop" ]; then
  echo "the engine's files call each other in a circle:" >&2
  files=$(echo "$loop" | sed 's/^tsort: //' | sort -u)
  echo "$files" | sed 's/^/  /' >&2
  echo "their calls among themselves (caller callee):" >&2
  pattern=$(echo "$files" | tr '\n' '|' | sed 's/|$//')
  grep -E "^($pattern) ($pattern)\$" edges.txt | sed 's/^/  /' >&2 || true
  fail "a circle of calls among core/engine's files"
fi
echo "engine calls: $(wc -l < edges.txt) edges between $(cut -d' ' -f1 edges.txt | sort -u | wc -l) files, no circle"

#!/bin/sh
# The contracts run one way (kernels/backend.h): nothing under kernels/
# includes a core/ header, and nothing under core/ or plugins/ includes a
# backend's private header (kernels/cpu/, kernels/cuda/); the core reaches
# the backends through kernels/backend.h and kernels/host.h only.  The core
# and the plugins include nothing of each other: what both need (the TRTOKENS
# format, the mixers, the CSV reading) is an installed header under
# include/trainrun/.  The check first proves it can fail, on a copy of the
# tree with a bad include put in.
. "$(dirname "$0")/lib.sh"

# Quoted includes are resolved against the including file's directory (the
# build adds no core/ or kernels/ directory to the include path); an include
# that does not resolve there is looked up by name in the forbidden
# directory, so a future -I cannot hide one.
# check ROOT: prints each offending "file: #include" and fails if any.
check() {
  root=$1
  bad=0
  for f in $(cd "$root" && find kernels core plugins -type f \
               \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort); do
    case $f in
      kernels/*) forbidden="core" ;;
      core/*) forbidden="kernels/cpu kernels/cuda plugins" ;;
      *) forbidden="kernels/cpu kernels/cuda core" ;;
    esac
    dir=$(dirname "$f")
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' \
                   "$root/$f"); do
      if [ -e "$root/$dir/$inc" ]; then
        target=$(realpath -m --relative-to="$root" "$root/$dir/$inc")
      else
        target=
        for d in $forbidden; do
          [ -e "$root/$d/$(basename "$inc")" ] && target="$d/$(basename "$inc")"
        done
      fi
      for d in $forbidden; do
        case $target in
          "$d"/*) echo "$f: #include \"$inc\" ($target): $(why "$f" "$d")"; bad=1 ;;
        esac
      done
    done
  done
  return $bad
}

why() {
  case $1:$2 in
    kernels/*) echo "kernels may not include core headers; what a backend needs belongs in kernels/backend.h" ;;
    *:plugins|plugins/*:core) echo "the core and the plugins include nothing of each other; what both need belongs in an installed header under include/trainrun/" ;;
    *) echo "the core and plugins reach a backend through kernels/backend.h (and kernels/host.h) only" ;;
  esac
}

# the check can fail: a copy with one bad include of each kind
for case in "kernels/cpu/gemm.c ../../core/util/util.h" "kernels/cuda/ops.cu ../../core/engine/graph.h" \
            "core/engine/graph.c ../kernels/cpu/kernels.h" "plugins/data/csv.c ../../kernels/cuda/common.cuh" \
            "core/dataset/prepare_csv.c ../../plugins/data/common.h" "plugins/data/csv.c ../../core/util/util.h"; do
  set -- $case
  rm -rf tree && mkdir tree
  cp -R "$TR_SRCDIR/kernels" "$TR_SRCDIR/core" "$TR_SRCDIR/plugins" tree/
  [ -f "tree/$1" ] || fail "$1 is missing from the source tree"
  { echo "#include \"$2\""; cat "tree/$1"; } > tree/new && mv tree/new "tree/$1"
  if check tree > out 2>&1; then
    fail "the layering check missed #include \"$2\" in $1"
  fi
  grep -q "^$1: #include \"$2\"" out || { cat out; fail "the check did not name $1"; }
done
rm -rf tree

# The core's rooms (core/README.md) and what each may include besides itself;
# the lists point one way, so no room reaches one that reaches it back.
ROOMS="util tokenizer plot config dataset engine commands"
room_of() {
  case $1 in
    core/*/*) r=${1#core/}; r=${r%%/*} ;;
    *) r=- ;;
  esac
  case " $ROOMS " in *" $r "*) echo "$r" ;; esac
}
may_include() {
  case $1 in
    util) echo "" ;;
    tokenizer|plot|config) echo "util" ;;
    dataset) echo "util tokenizer" ;;
    engine) echo "util tokenizer config" ;;
    commands) echo "util tokenizer plot config dataset engine" ;;
  esac
}
# What of kernels/ each room may include: the engine drives the backends
# (backend.h, host.h), checks graphs against the op table (ops.h) and
# sizes frozen NF4 weights in the memory plan (nf4.h's layout);
# config asks the op table for the shapes a recipe's builders make
# (config/recipe_ops.c), and nothing else of kernels/; no other room
# reaches kernels/ (commands through the engine).
may_include_kernels() {
  case $1 in
    engine) echo "kernels/backend.h kernels/host.h kernels/ops.h kernels/nf4.h" ;;
    config) echo "kernels/ops.h" ;;
  esac
}
check_rooms() {
  root=$1
  bad=0
  for f in $(cd "$root" && find core -type f \( -name '*.c' -o -name '*.h' \) | sort); do
    mine=$(room_of "$f")
    [ -n "$mine" ] || { echo "$f: not in a room of core/ ($ROOMS)"; bad=1; continue; }
    allowed=$(may_include "$mine")
    dir=$(dirname "$f")
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' \
                   "$root/$f"); do
      [ -e "$root/$dir/$inc" ] || continue
      target=$(realpath -m --relative-to="$root" "$root/$dir/$inc")
      case $target in
        kernels/*)
          kernels=$(may_include_kernels "$mine")
          case " $kernels " in
            *" $target "*) ;;
            *) echo "$f: #include \"$inc\" ($target): of kernels/, $mine includes ${kernels:-nothing} (core/README.md)"
               bad=1 ;;
          esac
          continue ;;
      esac
      theirs=$(room_of "$target")
      [ -n "$theirs" ] && [ "$theirs" != "$mine" ] || continue
      case " $allowed " in
        *" $theirs "*) ;;
        *) echo "$f: #include \"$inc\" ($target): $mine includes only itself${allowed:+ and }$(echo $allowed | sed 's/ /, /g') (core/README.md)"
           bad=1 ;;
      esac
    done
  done
  return $bad
}
for case in "core/util/util.c ../config/options.h" "core/util/json.c ../tokenizer/tokenizer.h" \
            "core/tokenizer/bpe_train.c ../config/options.h" "core/config/recipe.c ../engine/graph.h" \
            "core/config/recipe.c ../tokenizer/tokenizer.h" "core/engine/run.c ../commands/plan.h" \
            "core/plot/plot.c ../config/options.h" "core/engine/run.c ../plot/plot.h" \
            "core/dataset/prepare_text.c ../engine/run.h" "core/dataset/dedup.c ../commands/prepare.h" \
            "core/engine/run.c ../dataset/dataset.h" "core/config/recipe.c ../../kernels/backend.h" \
            "core/tokenizer/tokenizer.c ../../kernels/ops.h" "core/commands/plan.c ../../kernels/host.h"; do
  set -- $case
  rm -rf tree && mkdir tree
  cp -R "$TR_SRCDIR/core" "$TR_SRCDIR/kernels" tree/
  { echo "#include \"$2\""; cat "tree/$1"; } > tree/new && mv tree/new "tree/$1"
  if check_rooms tree > out 2>&1; then
    fail "the room check missed #include \"$2\" in $1"
  fi
  grep -q "^$1: #include \"$2\"" out || { cat out; fail "the room check did not name $1"; }
done
# and a file outside every room
rm -rf tree && mkdir tree
cp -R "$TR_SRCDIR/core" tree/
mkdir tree/core/misc && echo 'int x;' > tree/core/misc/stray.c
if check_rooms tree > out 2>&1; then
  fail "the room check missed core/misc/stray.c, in no room"
fi
grep -q "^core/misc/stray.c: not in a room" out || { cat out; fail "the room check did not name core/misc/stray.c"; }
rm -rf tree

# the tree itself
check "$TR_SRCDIR" || fail "includes cross the backend contract (above)"
check_rooms "$TR_SRCDIR" || fail "includes cross the core's rooms (above)"
echo "layering: kernels include no core header; core and plugins no backend-private header nor each other's; core rooms include only the rooms (and of kernels/, the headers) they build on"

#!/bin/sh
# Every integer option (tests/config/limits.tsv) through the command line as a
# user runs it: -1, 0, 2^31, 2^32+1, 2^62, 1e18 and 1.5, on the command line
# and in a recipe, for `trainrun --smoke`, and the exit codes of `show` and
# `plan`.  Out of range: exit 1 with an error naming the key and where it was
# set; in range: success; never a signal.  (tests/test_plan.c checks show and
# plan in-process for every row.)
. "$(dirname "$0")/lib.sh"

# a huge allocation attempt fails, never swaps; a hang fails too
ulimit -v 4194304 2>/dev/null || true
run() { if command -v timeout > /dev/null; then timeout 60 "$TRAINRUN" "$@"; else "$TRAINRUN" "$@"; fi; }

values_cli="-1 0 2147483648 4294967297 4611686018427387904 1e18 1.5"
# the same values as a recipe writes them, in the same order
lua_value() {
  case "$1" in
    2147483648) echo "2^31" ;;
    4294967297) echo "2^32+1" ;;
    4611686018427387904) echo "2^62" ;;
    *) echo "$1" ;;
  esac
}

# in range: an integer within [min, max] (awk's doubles hold all of these exactly
# enough: the bounds are far from the values tried)
legal() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v == int(v) && v >= lo && v <= hi) }'; }

# recipe KEY LINE VALUE: the row's line on line 7, the base line of its section out
recipe() {
  section=${1%%.*}
  {
    echo "-- one integer option at a time (tests/config/limits.tsv)"
    echo "return {"
    for base in 'model = gpt { vocab = 64, ctx = 16, layers = 2, heads = 2, dim = 32 },' \
                'data = { plugin = "synthetic", kind = "tokens", classes = 64 },' \
                'train = { steps = 10, batch = 32, micro_batch = 8 },' \
                'cost = { hardware = "h100-80gb", count = 2 },'; do
      case "$base" in
        "$section "*) echo "  -- (set below)" ;;
        *) echo "  $base" ;;
      esac
    done
    printf '  %s\n}\n' "$(printf "$2" "$3")"
  }
}

# check WHAT RC LEGAL SMOKE-KIND NAME WHERE: one run's outcome
check() {
  what=$1 rc=$2 ok=$3 kind=$4 name=$5 where=$6
  [ "$rc" -lt 124 ] || fail "$what: killed by a signal or hung (exit $rc): $(tail -n 3 err.txt)"
  if [ "$ok" = yes ]; then
    [ "$rc" = 0 ] || [ "$kind" = load ] || fail "$what: a legal value failed (exit $rc): $(tail -n 3 err.txt)"
  else
    [ "$rc" = 1 ] || fail "$what: exit $rc, not 1: $(tail -n 3 err.txt)"
    grep -q "'$name'" err.txt && grep -q "$where" err.txt || fail "$what: the error names neither '$name' nor $where: $(cat err.txt)"
    # an integer out of range says the range (1e18 steps is too many, not "not an integer")
    [ "$v" = 1.5 ] || grep -q "must be" err.txt || fail "$what: the error gives no range: $(cat err.txt)"
  fi
}

tab=$(printf '\t')
rows=0
while IFS="$tab" read -r key min max fallback checked smoke line; do
  case "$key" in ''|'#'*) continue ;; esac
  rows=$((rows + 1))
  name=${key##*.}
  ran_legal=no
  for v in $values_cli; do
    if legal "$v" "$min" "$max"; then ok=yes; else ok=no; fi
    for form in recipe cli; do
      # a legal value trains for real: once per option is enough (0.2 s each)
      [ $ok = yes ] && [ $ran_legal = yes ] && continue
      [ $ok = yes ] && ran_legal=yes
      if [ $form = recipe ]; then
        recipe "$key" "$line" "$(lua_value "$v")" > limit.lua
        set -- ; where="limit.lua:7"
      else
        recipe "$key" "$line" "$fallback" > limit.lua
        set -- "$key=$v"; where="command line"
      fi
      # a model's options too: the builder's error names where the option was set
      rc=0; run --smoke limit.lua "$@" > out.txt 2> err.txt || rc=$?
      check "--smoke $key = $v ($form)" $rc $ok "$smoke" "$name" "$where"
    done
  done
done < "$TR_SRCDIR/tests/config/limits.tsv"
[ "$rows" -gt 40 ] || fail "read only $rows rows of limits.tsv"

# show and plan: the same checks in-process for every row (tests/test_plan.c);
# here their exit codes, for an option of the core, a plugin's, and a model's
for row in "train.steps${tab}train = { batch = 32, micro_batch = 8, steps = %s },${tab}10${tab}1${tab}1000000000000" \
           "schedule.warmup${tab}schedule = { plugin = \"cosine\", warmup = %s },${tab}0${tab}0${tab}1000000000000" \
           "model.ctx${tab}model = gpt { vocab = 64, layers = 2, heads = 2, dim = 32, ctx = %s },${tab}16${tab}1${tab}1048576"; do
  IFS="$tab" read -r key line fallback min max <<EOF
$row
EOF
  name=${key##*.}
  for v in $values_cli; do
    if legal "$v" "$min" "$max"; then ok=yes; else ok=no; fi
    recipe "$key" "$line" "$fallback" > limit.lua
    where="command line" # the model's options too: where the option was set
    rc=0; run plan limit.lua "$key=$v" > out.txt 2> err.txt || rc=$?
    check "plan $key = $v" $rc $ok run "$name" "$where"
    # show builds the model as the run does, so it refuses what the run refuses
    rc=0; run show limit.lua "$key=$v" > out.txt 2> err.txt || rc=$?
    check "show $key = $v" $rc $ok run "$name" "$where"
  done
done

# numbers on the command line are the numbers a recipe can write
recipe train.steps "train = { batch = 32, micro_batch = 8, steps = %s }," 10 > limit.lua
"$TRAINRUN" show limit.lua train.steps=1e3 | grep -q '^train.steps *= 1000 ' || fail "1e3 is 1000"
"$TRAINRUN" show limit.lua train.steps=0x10 | grep -q '^train.steps *= 16 ' || fail "0x10 is 16"
for bad in inf nan 0x1p4 " 7" 1e 10k; do
  rc=0; run show limit.lua "train.steps=$bad" > out.txt 2> err.txt || rc=$?
  [ $rc = 1 ] && grep -q "option 'steps' expects an integer" err.txt || fail "train.steps=$bad: $(cat err.txt)"
done
rc=0; run show limit.lua train.steps=1e999 > out.txt 2> err.txt || rc=$?
[ $rc = 1 ] && grep -q "option 'steps' is 1e999, must be between 1 and 1000000000000" err.txt \
  || fail "train.steps=1e999: $(cat err.txt)"
echo "limits: $rows options, 7 values each, 2 ways, show/plan/--smoke: ok"

#!/usr/bin/env bash
# trainrun against llm.c's CPU reference trainer, train_gpt2.c, on the shape
# that trainer is written for: GPT-2 124M (vocab 50257, 12 layers, 12 heads,
# dim 768), batch 4 of 64 tokens, fp32, AdamW.  The target it checks:
# trainrun's fp32 peak RSS must not exceed llm.c's on this shape.  ROUNDS
# rounds of [llm.c, trainrun], one after the other, so that load from anything
# else on the machine falls on both alike; each run's ms/step and peak RSS, the
# medians and the ratios.
#
#   LLMC=/path/to/llm.c contrib/bench/llmc.sh       # a checkout, or a bare git dir
#   LLMC=... TRAINRUN=build/trainrun ROUNDS=3 STEPS=8 contrib/bench/llmc.sh
#
# Nothing is downloaded and no llm.c code is kept in this repository: LLMC
# names the user's copy of https://github.com/karpathy/llm.c.  From it the
# script copies Makefile, train_gpt2.c and llmc/ into a scratch directory,
# patches the copy (below) and builds it with llm.c's own Makefile (`make
# train_gpt2`: on Linux with OpenMP, cc -Ofast -march=native -fopenmp -DOMP
# ... -lm -lgomp; the command is printed).  Its inputs are made up by
# llmc_inputs.py in the same scratch directory: a randomly initialised GPT-2
# 124M in llm.c's checkpoint format (gpt2_124M.bin) and token files in its
# dataloader format (TEXT's bytes as tokens); no gpt2_tokenizer.bin, without
# which train_gpt2.c warns and trains.
#
# The patch (sed, on the scratch copy only): train_gpt2.c's main() runs a
# hard-coded 41-step loop, with 5 validation batches every 10 steps and 64
# tokens of sampling every 20.  The loop is cut to WARMUP + STEPS steps and
# the sampling switched off (`if (0 && ...)`): sampling needs the tokenizer
# (without it the prompt token is uninitialised) and is no part of training.
# Validation stays: it runs at step 0, before the timed steps, in the same
# activation buffers, so it changes neither the times nor the peak.
#
# Environment (and lib.sh's: THREADS, TRAINRUN):
#   LLMC     llm.c's source: a checkout (train_gpt2.c at its top) or its bare
#            git directory (HEAD is used); required
#   TEXT     a file whose bytes become llm.c's tokens (default build/data/kjv.txt
#            if it exists, made by `make data/kjv.txt` in a build dir; else
#            llm.c's train_gpt2.c); trainrun trains on synthetic tokens
#            (gpt-bench.lua): the tokens do not change a step's work
#   WARMUP   untimed steps first (default 1), STEPS timed steps (default 5)
#   ROUNDS   rounds of [llm.c, trainrun] (default 2)
#   CC       compiler for llm.c's Makefile (default: make's, cc)
#
# What each figure is:
#   ms/step        the median of the timed steps' wall times.  llm.c: its own
#                  "step N: ... (took X ms)" lines, steps WARMUP.. (step 0 is
#                  the first); trainrun: differences of elapsed_s between
#                  consecutive steps in metrics.jsonl, steps WARMUP+1..
#                  Both cover the batch's loading, forward, backward and the
#                  update.  Wall time: on a shared machine it measures the
#                  load as well; both arms run under the same load, one after
#                  the other.
#   peak RSS       GNU time's maximum resident set of the whole run.  trainrun's
#                  includes its end-of-run checkpoint (gpt-bench.lua saves
#                  synchronously; a run always writes its last checkpoint, and
#                  no recipe option turns it off), which llm.c does not write.
#   through steps  trainrun: VmHWM of its process read when the last step's
#                  metrics line appears, before the evaluation and the
#                  checkpoint that follow it: the peak of the training steps
#                  alone, the figure comparable to llm.c's.  llm.c: the same
#                  as its peak RSS (after its loop it only frees and exits).
# Peak RSS does not depend on the machine's load; the times do.
set -euo pipefail

name=llmc.sh
WARMUP=${WARMUP:-1}
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
STEPS=${STEPS:-5}
ROUNDS=${ROUNDS:-2}
LLMC=${LLMC:-}
TEXT=${TEXT:-}
if [ "$STEPS" -lt 1 ] || [ "$WARMUP" -lt 1 ]; then die "WARMUP and STEPS must be at least 1"; fi
[ -n "$LLMC" ] || die "set LLMC to a copy of llm.c (a checkout or its bare git directory)"
[ -x /usr/bin/time ] || die "needs GNU time at /usr/bin/time"
PY=$(command -v python3 || echo /usr/bin/python3)

# llm.c's sources into the scratch directory
src=$tmp/llmc
mkdir -p "$src"
if [ -f "$LLMC/train_gpt2.c" ]; then
    cp -r "$LLMC/Makefile" "$LLMC/train_gpt2.c" "$LLMC/llmc" "$src/" || die "cannot copy llm.c's sources from $LLMC"
    llmc_rev=$(git -C "$LLMC" rev-parse --short HEAD 2>/dev/null || echo '?')
elif git --git-dir="$LLMC" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    git --git-dir="$LLMC" archive HEAD Makefile train_gpt2.c llmc | tar -x -C "$src" ||
        die "cannot read llm.c's sources from the git directory $LLMC"
    llmc_rev=$(git --git-dir="$LLMC" rev-parse --short HEAD)
else
    die "LLMC=$LLMC holds no train_gpt2.c and is no git directory"
fi

# the patch: WARMUP + STEPS steps, no sampling (see the header)
sed -i -e "s/for (int step = 0; step <= 40; step++)/for (int step = 0; step < $((WARMUP + STEPS)); step++)/" \
       -e 's/if (step > 0 && step % 20 == 0)/if (0 \&\& step > 0 \&\& step % 20 == 0)/' "$src/train_gpt2.c"
if ! grep -q "step < $((WARMUP + STEPS)); step++" "$src/train_gpt2.c" ||
    ! grep -q 'if (0 && step > 0' "$src/train_gpt2.c"; then
    die "train_gpt2.c's main loop is not the one this script patches (40 steps, sampling every 20)"
fi
make -C "$src" ${CC:+CC="$CC"} train_gpt2 >"$tmp/make.log" 2>&1 || { cat "$tmp/make.log" >&2; die "building llm.c's train_gpt2 failed"; }
build_cmd=$(grep -- '-o train_gpt2$' "$tmp/make.log" | tail -n 1)

# its inputs
if [ -z "$TEXT" ]; then
    TEXT=$root/build/data/kjv.txt
    [ -f "$TEXT" ] || TEXT=$src/train_gpt2.c
fi
"$PY" "$here/llmc_inputs.py" "$tmp/in" "$TEXT" >"$tmp/inputs.txt" || die "llmc_inputs.py failed"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
     "(family $(awk -F': *' '/^cpu family/ { print $2; exit }' /proc/cpuinfo), model $(awk -F': *' '/^model[ \t]*:/ { print $2; exit }' /proc/cpuinfo))," \
     "$(nproc) cores online;" \
     "threads: $THREADS; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "trainrun: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') ($TRAINRUN); llm.c: $llmc_rev"
echo "llm.c built with: ${build_cmd:-?}"
echo "llm.c's inputs: $(cat "$tmp/inputs.txt"), tokens from $(basename "$TEXT")"
echo "GPT-2 124M, batch 4 x 64 tokens, fp32; $WARMUP warm-up + $STEPS timed steps a run, $ROUNDS rounds"

# llmc_arm: "ms_per_step rss_mib"
llmc_arm() {
    if ! (cd "$tmp/in" && OMP_NUM_THREADS=$THREADS /usr/bin/time -f "%M" -o "$tmp/time" \
        "$src/train_gpt2" >"$tmp/llmc.log" 2>&1); then
        cat "$tmp/llmc.log" >&2
        die "llm.c's train_gpt2 failed"
    fi
    local ms
    ms=$(awk -v w="$WARMUP" '/^step [0-9]+: train loss .*took [0-9.]+ ms/ {
            s = $2; sub(/:/, "", s)
            if (s + 0 >= w) { match($0, /took [0-9.]+/); printf "%s ", substr($0, RSTART + 5, RLENGTH - 5) }
        }' "$tmp/llmc.log" | median %.1f)
    [ -n "$ms" ] || { cat "$tmp/llmc.log" >&2; die "no timed steps in llm.c's output"; }
    echo "$ms $(awk '{ printf "%.0f", $1 / 1024 }' "$tmp/time")"
}

# trainrun_arm: "ms_per_step rss_mib steps_rss_mib"
trainrun_arm() {
    local last=$((WARMUP + STEPS)) dir=$tmp/run pid="" hwm="" line
    rm -rf "$dir"
    /usr/bin/time -f "%M" -o "$tmp/time" "$TRAINRUN" "$here/gpt-bench.lua" \
        model.vocab=50257 model.ctx=64 model.layers=12 model.heads=12 model.dim=768 \
        train.batch=4 train.steps="$last" train.threads="$THREADS" precision=fp32 \
        run_dir="$dir" >"$tmp/log" 2>&1 &
    local timer=$!
    # poll with shell builtins (one sleep a turn), so as to take little CPU from the run
    while kill -0 "$timer" 2>/dev/null; do
        [ -n "$pid" ] || pid=$(pgrep -P "$timer" | head -n 1 || true)
        if [ -n "$pid" ] && [ -z "$hwm" ] && [ -f "$dir/metrics.jsonl" ]; then
            while IFS= read -r line; do
                case $line in
                *"\"step\": $last,"*'"loss"'*)
                    while IFS=$' \t' read -r key val _; do
                        [ "$key" = VmHWM: ] && hwm=$val
                    done 2>/dev/null <"/proc/$pid/status" || true
                    [ -n "$hwm" ] || hwm=none
                    ;;
                esac
            done <"$dir/metrics.jsonl"
        fi
        sleep 0.05
    done
    if ! wait "$timer"; then
        cat "$tmp/log" >&2
        die "trainrun failed"
    fi
    awk -v w="$WARMUP" -v last="$last" '
        function field(key,   v) {
            if (!match($0, "\"" key "\": -?[0-9.]+")) return ""
            v = substr($0, RSTART, RLENGTH); sub(/.*: /, "", v); return v + 0
        }
        /"loss"/ && /"elapsed_s"/ { e[field("step")] = field("elapsed_s") }
        END { for (s = w + 1; s <= last; s++) if ((s in e) && ((s - 1) in e)) printf "%.1f ", 1000 * (e[s] - e[s - 1]) }' \
        "$dir/metrics.jsonl" | median %.1f | tr -d '\n'
    awk -v h="$hwm" '{ printf " %.0f %s\n", $1 / 1024, (h ~ /^[0-9]+$/) ? sprintf("%.0f", h / 1024) : "n/a" }' "$tmp/time"
}

echo
echo "| round | arm | ms/step | peak RSS MiB | through the steps MiB |"
echo "|---:|---|---:|---:|---:|"
: >"$tmp/rows"
for r in $(seq 1 "$ROUNDS"); do
    res=$(llmc_arm)
    read -r ms rss <<<"$res"
    echo "llm.c $ms $rss $rss" >>"$tmp/rows"
    echo "| $r | llm.c train_gpt2 | $ms | $rss | $rss |"
    res=$(trainrun_arm)
    read -r ms rss steps_rss <<<"$res"
    echo "trainrun $ms $rss $steps_rss" >>"$tmp/rows"
    echo "| $r | trainrun fp32 | $ms | $rss | $steps_rss |"
done

# col ARM K: the median of column K of ARM's rows
col() { awk -v a="$1" -v k="$2" '$1 == a && $k != "n/a" { printf "%s ", $k }' "$tmp/rows" | median %.1f; }
ms_llmc=$(col llm.c 2) rss_llmc=$(col llm.c 3)
ms_trainrun=$(col trainrun 2) rss_trainrun=$(col trainrun 3) steps_trainrun=$(col trainrun 4)
echo
echo "| median | ms/step | peak RSS MiB | through the steps MiB |"
echo "|---|---:|---:|---:|"
echo "| llm.c train_gpt2 | $ms_llmc | $rss_llmc | $rss_llmc |"
echo "| trainrun fp32 | $ms_trainrun | $rss_trainrun | ${steps_trainrun:-n/a} |"

ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2fx", a / b; else printf "n/a" }'; }
verdict() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "") print "n/a"; else print (a <= b) ? "met" : "not met" }'; }
echo
echo "- peak RSS, trainrun / llm.c (target <= 1): $(ratio "$rss_trainrun" "$rss_llmc") over the whole run" \
     "($(verdict "$rss_trainrun" "$rss_llmc"); trainrun's end-of-run checkpoint included)," \
     "$(ratio "${steps_trainrun:-}" "$rss_llmc") through the steps ($(verdict "${steps_trainrun:-}" "$rss_llmc"))"
echo "- speed, llm.c ms / trainrun ms: $(ratio "$ms_llmc" "$ms_trainrun")"
awk '/^num_parameters:/ { p = $2 } /^num_activations:/ { a = $2 }
     END { if (p && a) printf "- llm.c, its arrays: %d parameters x 4 (parameters, gradients, AdamW m and v) x 4 bytes = %.0f MiB; %d activations x 2 (activations, their gradients) x 4 bytes = %.0f MiB; sum %.0f MiB\n",
           p, 16 * p / 2^20, a, 8 * a / 2^20, (16 * p + 8 * a) / 2^20 }' "$tmp/llmc.log"
"$TRAINRUN" plan "$here/gpt-bench.lua" model.vocab=50257 model.ctx=64 model.layers=12 model.heads=12 \
    model.dim=768 train.batch=4 precision=fp32 >"$tmp/plan" 2>&1 &&
    echo "- trainrun's plan: $(awk '/parameters P/ { printf "%s parameters; ", $3 }
        /^  (parameters|gradients|optimizer state|activations|saved for backward|activation gradients|total) / && $NF ~ /iB$/ {
            n = NF; printf "%s%s %s %s", sep, substr($0, 3, index(substr($0, 3), "  ") - 1), $(n - 1), $n; sep = ", " }' "$tmp/plan")"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

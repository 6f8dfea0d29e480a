#!/usr/bin/env bash
# Greedy generation on the CPU: trainrun sample (its key/value cache) against
# transformers' generate (its cache), and trainrun without the cache
# (--no-cache: each token re-runs the whole context, as sample did before).
#
#   PYTHON=venv/bin/python contrib/bench/sample.sh      # needs build/trainrun
#   MODELS=135m PRECISIONS=fp32 REPS=1 TOKENS=30 contrib/bench/sample.sh   # quick
#
# For each model (SmolLM-135M's and SmolLM-360M's shapes, random weights made
# once by torch_lora.py make, as lora.sh does: nothing is downloaded) and
# precision, in one interleaved run of REPS rounds: trainrun sample --ids
# --temperature 0 --ignore-eos, transformers (torch_generate.py: do_sample=False,
# min_new_tokens), and, with NOCACHE_TOKENS > 0, trainrun --no-cache for that
# many tokens; the same PROMPT_LEN-token prompt, TOKENS new tokens and THREADS
# threads.  Each reports the seconds to its first new token (the prompt's
# forward) and its tokens/s after it; the whole command's wall time and peak
# RSS are GNU time's.  Prints the medians, and whether trainrun's fp32 ids are
# transformers'.
#
# Environment: THREADS (2), PYTHON (torch, transformers), TRAINRUN, REPS (3),
# MODELS (135m,360m), PRECISIONS (fp32,bf16), TOKENS (100), PROMPT_LEN (20),
# NOCACHE_TOKENS (0), CACHE (where the model directories are kept; contrib/bench/.cache).
set -euo pipefail

name=sample.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
REPS=${REPS:-3}
MODELS=${MODELS:-135m,360m}
PRECISIONS=${PRECISIONS:-fp32,bf16}
TOKENS=${TOKENS:-100}
PROMPT_LEN=${PROMPT_LEN:-20}
NOCACHE_TOKENS=${NOCACHE_TOKENS:-0}
CACHE=${CACHE:-$here/.cache}
find_python "torch, transformers"
[ -n "$PYTHON" ] || die "no Python with torch and transformers (set PYTHON=)"
[ -x /usr/bin/time ] || die "GNU time is needed for peak RSS (apt-get install time)"
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
say "$("$PYTHON" -c 'import torch, transformers; print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))')"

prompt=$(seq 1 "$PROMPT_LEN" | tr '\n' ' ' | sed 's/ $//')
rows=$tmp/rows
: >"$rows"

# peak RSS in MiB and wall seconds of a process GNU time measured into $1
rss() { awk '/Maximum resident set size/ { printf "%.0f", $NF / 1024 }' "$1"; }
wall() { awk '/Elapsed \(wall clock\)/ { n = split($NF, p, ":"); s = 0
                                         for (i = 1; i <= n; i++) s = s * 60 + p[i]; printf "%.2f", s }' "$1"; }

run_trainrun() { # MODEL PREC KIND(cache|no-cache) REP TOKENS
    local out=$tmp/tr-$1-$2-$3-$4 flag=
    [ "$3" = no-cache ] && flag=--no-cache
    if ! /usr/bin/time -v "$TRAINRUN" sample "$here/sample-bench.lua" model.from="$CACHE/$1" \
        precision="$2" train.threads="$THREADS" --ids --prompt "$prompt" --tokens "$5" \
        --temperature 0 --ignore-eos $flag >"$out.ids" 2>"$out.log"; then
        cat "$out.log" >&2
        die "trainrun $3 $1 $2 failed"
    fi
    # "N tokens in S s: the prompt's P and the first in F s, then R tokens/s"
    local first rate
    first=$(sed -n 's/.*and the first in \([0-9.]*\) s, then.*/\1/p' "$out.log")
    rate=$(sed -n 's/.*, then \([0-9.]*\) tokens\/s.*/\1/p' "$out.log")
    printf '%s\t%s\ttrainrun-%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$first" "$rate" \
        "$(wall "$out.log")" "$(rss "$out.log")" >>"$rows"
    [ "$3" = cache ] && cp "$out.ids" "$tmp/ids-tr-$1-$2"
    return 0
}

run_hf() { # MODEL PREC REP
    local out=$tmp/hf-$1-$2-$3 flag=
    [ "$2" = bf16 ] && flag=--bf16
    if ! /usr/bin/time -v "$PYTHON" "$here/torch_generate.py" "$CACHE/$1" --prompt "$prompt" \
        --tokens "$TOKENS" --threads "$THREADS" $flag >"$out.log" 2>"$out.time"; then
        cat "$out.log" "$out.time" >&2
        die "transformers $1 $2 failed"
    fi
    printf '%s\t%s\ttransformers\t%s\t%s\t%s\t%s\n' "$1" "$2" \
        "$(sed -n 's/^RESULT .*first_s=\([^ ]*\).*/\1/p' "$out.log")" \
        "$(sed -n 's/^RESULT .*tokens_per_s=\([^ ]*\).*/\1/p' "$out.log")" \
        "$(wall "$out.time")" "$(rss "$out.time")" >>"$rows"
    head -1 "$out.log" >"$tmp/ids-hf-$1-$2"
}

IFS=, read -ra models <<<"$MODELS"
IFS=, read -ra precs <<<"$PRECISIONS"
make_models "${models[@]}"
for rep in $(seq 1 "$REPS"); do
    for m in "${models[@]}"; do
        for p in "${precs[@]}"; do
            say "round $rep: $m $p"
            run_trainrun "$m" "$p" cache "$rep" "$TOKENS"
            run_hf "$m" "$p" "$rep"
            [ "$NOCACHE_TOKENS" -gt 0 ] && run_trainrun "$m" "$p" no-cache "$rep" "$NOCACHE_TOKENS"
        done
    done
done

printf '| model | precision | | first token (s) | tokens/s after it | whole command (s) | peak RSS (MiB) |\n'
printf '|---|---|---|---:|---:|---:|---:|\n'
for m in "${models[@]}"; do
    for p in "${precs[@]}"; do
        for k in trainrun-cache transformers trainrun-no-cache; do
            grep -q "^$m	$p	$k	" "$rows" || continue
            med() { awk -F'\t' -v m="$m" -v p="$p" -v k="$k" -v c="$1" '$1 == m && $2 == p && $3 == k { print $c }' "$rows" | median "$2"; }
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$m" "$p" "$k" "$(med 4 %.3f)" \
                "$(med 5 %.1f)" "$(med 6 %.2f)" "$(med 7 %.0f)"
        done
        tr=$(awk -F'\t' -v m="$m" -v p="$p" '$1 == m && $2 == p && $3 == "trainrun-cache" { print $5 }' "$rows" | median)
        hf=$(awk -F'\t' -v m="$m" -v p="$p" '$1 == m && $2 == p && $3 == "transformers" { print $5 }' "$rows" | median)
        same=no
        cmp -s "$tmp/ids-tr-$m-$p" "$tmp/ids-hf-$m-$p" && same=yes
        printf '| %s | %s | trainrun / transformers | | %.2fx | | | ids the same: %s |\n' "$m" "$p" \
            "$(awk -v a="$tr" -v b="$hf" 'BEGIN { print a / b }')" "$same"
    done
done
printf '\nprompt %s tokens, %s new (greedy, EOS ignored), %s threads, %s rounds (medians); %s\n' \
    "$PROMPT_LEN" "$TOKENS" "$THREADS" "$REPS" "$(lscpu | sed -n 's/^Model name: *//p')"

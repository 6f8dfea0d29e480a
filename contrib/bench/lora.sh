#!/usr/bin/env bash
# LoRA fine-tuning: trainrun against PEFT + transformers, and against its own
# full fine-tune, on the CPU.
#
#   PYTHON=venv/bin/python contrib/bench/lora.sh        # needs build/trainrun
#   MODELS=135m PRECISIONS=fp32 REPS=1 STEPS=4 contrib/bench/lora.sh   # quick
#
# For each model (SmolLM-135M's and SmolLM-360M's shapes, random weights made
# once by torch_lora.py make: nothing is downloaded) and precision, in one
# interleaved run of REPS rounds: trainrun LoRA (lora-bench-adapters.lua), PEFT
# LoRA (torch_lora.py train: rank 16, alpha 32, "all-linear", AdamW, bf16 as
# torch.autocast), trainrun full fine-tune (lora-bench.lua); the same batch (4 x
# 256 tokens), THREADS threads, WARMUP steps untimed then STEPS timed.  Peak RSS
# is GNU time's "Maximum resident set size" of each whole process.  Prints the
# median tokens/s and the peak RSS of each, and the ratios against the
# targets (>= 1.5x PEFT's tokens/s, <= its peak RSS, LoRA >= 1.3x the full
# fine-tune).
#
# A second table gives the same medians as FLOP rates (trainrun plan's
# training FLOPs per token times tokens/s) against the CPU's GEMM ceiling
# (gemm_ceiling.c, best of its runs between the rounds), and the rate 1.5x
# PEFT's tokens/s would take.
#
# Environment: THREADS (2), PYTHON (torch, transformers, peft), TRAINRUN,
# WARMUP (3), STEPS (8), REPS (2), MODELS (135m,360m), PRECISIONS (fp32,bf16),
# CACHE (where the model directories are kept; contrib/bench/.cache).
set -euo pipefail

name=lora.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
STEPS=${STEPS:-8}
REPS=${REPS:-2}
MODELS=${MODELS:-135m,360m}
PRECISIONS=${PRECISIONS:-fp32,bf16}
CACHE=${CACHE:-$here/.cache}
find_python "torch, transformers, peft"
[ -n "$PYTHON" ] || die "no Python with torch, transformers and peft (set PYTHON=)"
[ -x /usr/bin/time ] || die "GNU time is needed for peak RSS (apt-get install time)"
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
say "$("$PYTHON" -c 'import torch, transformers, peft; print("torch %s, transformers %s, peft %s" % (torch.__version__, transformers.__version__, peft.__version__))')"

rows=$tmp/rows
: >"$rows"

# peak RSS in MiB of a process GNU time measured into $1
rss() { awk '/Maximum resident set size/ { printf "%.0f", $NF / 1024 }' "$1"; }

# tokens/s of a trainrun run's timed steps (metrics.jsonl: elapsed at the last
# step minus at the last warm-up step)
tokens_per_s() {
    awk -v w="$WARMUP" -v last="$2" -v tok="$3" '
        /"loss"/ && /"elapsed_s"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
            if (s == w) e0 = e; if (s == last) e1 = e
        }
        END { printf "%.1f", tok * (last - w) / (e1 - e0) }' "$1"
}

run_trainrun() { # MODEL PREC KIND(lora|full) REP
    local dir=$tmp/tr-$1-$2-$3-$4 recipe=$here/lora-bench.lua
    [ "$3" = lora ] && recipe=$here/lora-bench-adapters.lua
    if ! /usr/bin/time -v "$TRAINRUN" "$recipe" model.from="$CACHE/$1" precision="$2" \
        train.threads="$THREADS" train.steps=$((WARMUP + STEPS)) run_dir="$dir" \
        >"$dir.log" 2>"$dir.time"; then
        cat "$dir.log" "$dir.time" >&2
        die "trainrun $3 $1 $2 failed"
    fi
    printf '%s\t%s\ttrainrun-%s\t%s\t%s\n' "$1" "$2" "$3" \
        "$(tokens_per_s "$dir/metrics.jsonl" $((WARMUP + STEPS)) 1024)" "$(rss "$dir.time")" >>"$rows"
}

run_peft() { # MODEL PREC REP
    local out=$tmp/peft-$1-$2-$3 flag=
    [ "$2" = bf16 ] && flag=--bf16
    if ! /usr/bin/time -v "$PYTHON" "$here/torch_lora.py" train "$CACHE/$1" --rank 16 --batch 4 \
        --ctx 256 --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" $flag \
        >"$out.log" 2>"$out.time"; then
        cat "$out.log" "$out.time" >&2
        die "PEFT $1 $2 failed"
    fi
    printf '%s\t%s\tPEFT\t%s\t%s\n' "$1" "$2" \
        "$(sed -n 's/^RESULT .*tokens_per_s=\([^ ]*\).*/\1/p' "$out.log")" "$(rss "$out.time")" >>"$rows"
}

IFS=, read -ra models <<<"$MODELS"
IFS=, read -ra precs <<<"$PRECISIONS"
make_models "${models[@]}"
# the machine's GEMM ceilings (gemm_ceiling.c: oneDNN at 2048^3, fp32 and
# bf16), measured between the rounds, best kept: what a step's FLOP rate is
# held against
gcc -O2 -fopenmp "$here/gemm_ceiling.c" -o "$tmp/gemm_ceiling" -ldnnl ||
    die "cannot build gemm_ceiling.c (needs gcc and libdnnl-dev)"
ceiling() { OMP_NUM_THREADS=$THREADS "$tmp/gemm_ceiling" "$THREADS" 2>/dev/null >>"$tmp/ceilings"; }
: >"$tmp/ceilings"
ceiling
for rep in $(seq 1 "$REPS"); do
    for m in "${models[@]}"; do
        for p in "${precs[@]}"; do
            say "round $rep: $m $p"
            run_trainrun "$m" "$p" lora "$rep"
            run_peft "$m" "$p" "$rep"
            run_trainrun "$m" "$p" full "$rep"
        done
    done
    ceiling
done

printf '| model | precision | trainrun LoRA tok/s | PEFT tok/s | speed-up (target >= 1.5) | trainrun full tok/s | LoRA / full (target >= 1.3) | peak RSS trainrun LoRA | PEFT | trainrun full |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
for m in "${models[@]}"; do
    for p in "${precs[@]}"; do
        med() { awk -F'\t' -v m="$m" -v p="$p" -v k="$1" -v c="$2" '$1 == m && $2 == p && $3 == k { print $c }' "$rows" | median "$3"; }
        lt=$(med trainrun-lora 4 %.1f) pt=$(med PEFT 4 %.1f) ft=$(med trainrun-full 4 %.1f)
        lr=$(med trainrun-lora 5 %.0f) pr=$(med PEFT 5 %.0f) fr=$(med trainrun-full 5 %.0f)
        printf '| %s | %s | %s | %s | %.2fx | %s | %.2fx | %s MiB | %s MiB | %s MiB |\n' "$m" "$p" \
            "$lt" "$pt" "$(awk -v a="$lt" -v b="$pt" 'BEGIN { print a / b }')" "$ft" \
            "$(awk -v a="$lt" -v b="$ft" 'BEGIN { print a / b }')" "$lr" "$pr" "$fr"
    done
done
printf '\n%s threads, batch 4 x 256 tokens, rank 16, alpha 32, all linears but the head; %s rounds (medians); %s\n' \
    "$THREADS" "$REPS" "$(lscpu | sed -n 's/^Model name: *//p')"

# The same medians as FLOP rates: trainrun plan's training FLOPs per token
# (LoRA: 4 per frozen weight, 6 per trained one, attention; PEFT does the
# same products) times tokens/s, against the best GEMM ceiling measured: how
# far the LoRA target (1.5x PEFT) lies from what this CPU's GEMMs reach.
flops() { # RECIPE MODEL: training FLOPs per token
    "$TRAINRUN" plan "$here/$1" model.from="$CACHE/$2" 2>/dev/null |
        sed -n 's/^ *training FLOPs\/token .*= \([0-9,]*\) *(.*/\1/p' | tr -d ,
}
read -r c32 c16 < <(awk '{ if ($1 > a) a = $1; if ($2 + 0 > b) b = $2 + 0 } END { print a, b }' "$tmp/ceilings")
printf '\n| model | precision | GFLOP/token LoRA / full | GEMM ceiling GFLOP/s | trainrun LoRA | PEFT | trainrun full | 1.5x PEFT would need |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for m in "${models[@]}"; do
    fl=$(flops lora-bench-adapters.lua "$m") ff=$(flops lora-bench.lua "$m")
    for p in "${precs[@]}"; do
        med() { awk -F'\t' -v m="$m" -v p="$p" -v k="$1" '$1 == m && $2 == p && $3 == k { print $4 }' "$rows" | median %.1f; }
        c=$c32
        [ "$p" = bf16 ] && c=$c16
        awk -v fl="$fl" -v ff="$ff" -v c="$c" -v lt="$(med trainrun-lora)" -v pt="$(med PEFT)" \
            -v ft="$(med trainrun-full)" -v m="$m" -v p="$p" '
            # a rate and its share of the ceiling (none measured: no bf16 GEMM
            # in oneDNN on CPUs without AVX-512, gemm_ceiling says n/a)
            function rate(r) { return (c > 0 ? sprintf("%.0f (%.0f%%)", r, 100 * r / c) : sprintf("%.0f", r)) }
            BEGIN {
            printf "| %s | %s | %.3f / %.3f | %s | %s | %s | %s | %s |\n",
                m, p, fl / 1e9, ff / 1e9, (c > 0 ? sprintf("%.0f", c) : "n/a"), rate(lt * fl / 1e9),
                rate(pt * fl / 1e9), rate(ft * ff / 1e9), rate(1.5 * pt * fl / 1e9) }'
    done
done
printf '\nGFLOP/s of the whole step (percent of the ceiling); the ceiling is the best of %s gemm_ceiling runs between rounds\n' \
    "$((REPS + 1))"

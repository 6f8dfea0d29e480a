#!/usr/bin/env bash
# bf16 against fp32 on this CPU, in trainrun alone: the GEMM ceiling, then
# training steps of one GPT shape with precision fp32 and bf16, alternating,
# ROUNDS times, so that load from anything else running on the machine falls
# on both alike; each round's ms/step and the medians.
#
#   contrib/bench/cpu_bf16.sh                    # needs build/trainrun
#   ROUNDS=5 SHAPE="256 256 6 6 384 8" TRAINRUN=build/trainrun contrib/bench/cpu_bf16.sh
#
# Environment (and lib.sh's: THREADS, TRAINRUN, WARMUP):
#   SHAPE    "vocab ctx layers heads dim batch" (default the 6 x 384 GPT:
#            "256 256 6 6 384 8")
#   STEPS    timed steps per run (default 5), after WARMUP untimed ones
#   ROUNDS   fp32/bf16 pairs (default 3)
#   ISA      run bf16 with ONEDNN_MAX_CPU_ISA=$ISA too (e.g. AVX2: the
#            emulated path on the same machine); default: not
#   CLOCK    wall (default) or cpu: CPU seconds per step instead, for a
#            machine others are loading: each precision runs WARMUP steps
#            and WARMUP + STEPS steps, and the difference of the processes'
#            user + system time (GNU time) is divided by STEPS; OpenMP threads
#            sleep instead of spinning while they wait (OMP_WAIT_POLICY=
#            passive), so the figure counts work, not waiting.  Divide by
#            THREADS for a step's time on an idle machine (roughly: memory
#            and cache contention still count).
#
# ms/step is elapsed_s at the last step minus elapsed_s at the last warm-up
# step, over the steps between (runs/<name>/metrics.jsonl), as cpu_gpt.sh
# computes it.  The first line is what the run printed first: which bf16
# GEMMs ran.
set -euo pipefail

name=cpu_bf16.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
read -r V T L H C B <<<"${SHAPE:-256 256 6 6 384 8}"
STEPS=${STEPS:-5}
ROUNDS=${ROUNDS:-3}
ISA=${ISA:-}

gcc -O2 -fopenmp "$here/gemm_ceiling.c" -o "$tmp/gemm_ceiling" -ldnnl ||
    die "cannot build gemm_ceiling.c (needs gcc and libdnnl-dev)"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores online;" \
     "threads: $THREADS; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "trainrun: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
read -r ceil_fp32 ceil_bf16 < <("$tmp/gemm_ceiling" "$THREADS" 2>"$tmp/ceiling.txt")
echo "GEMM ceiling (oneDNN, 2048^3): fp32 $ceil_fp32 GFLOP/s, bf16 $ceil_bf16 GFLOP/s ($(cat "$tmp/ceiling.txt"))"
echo "shape: vocab $V, ctx $T, $L layers, $H heads, dim $C, batch $B; $WARMUP warm-up + $STEPS timed steps"

# CPU ms/step: PRECISION [ONEDNN_MAX_CPU_ISA]
cpu_ms_per_step() {
    local prec=$1 isa=${2:-} n t0 t1
    for n in "$WARMUP" $((WARMUP + STEPS)); do
        rm -rf "$tmp/run"
        if ! env ${isa:+ONEDNN_MAX_CPU_ISA=$isa} OMP_WAIT_POLICY=passive /usr/bin/time -f "%U %S" \
            -o "$tmp/time" "$TRAINRUN" "$here/gpt-bench.lua" \
            model.vocab="$V" model.ctx="$T" model.layers="$L" model.heads="$H" model.dim="$C" \
            train.batch="$B" train.steps="$n" train.threads="$THREADS" \
            precision="$prec" run_dir="$tmp/run" >"$tmp/log" 2>&1; then
            cat "$tmp/log" >&2
            die "trainrun $prec failed"
        fi
        if [ "$n" = "$WARMUP" ]; then t0=$(awk '{ print $1 + $2 }' "$tmp/time"); else t1=$(awk '{ print $1 + $2 }' "$tmp/time"); fi
    done
    head -n 1 "$tmp/log" >"$tmp/first-$prec$isa"
    awk -v a="$t0" -v b="$t1" -v s="$STEPS" 'BEGIN { printf "%.1f", 1000 * (b - a) / s }'
}

# ms/step of one run: PRECISION [ONEDNN_MAX_CPU_ISA]
ms_per_step() {
    if [ "${CLOCK:-wall}" = cpu ]; then
        cpu_ms_per_step "$@"
        return
    fi
    local prec=$1 isa=${2:-} dir=$tmp/run
    rm -rf "$dir"
    if ! env ${isa:+ONEDNN_MAX_CPU_ISA=$isa} "$TRAINRUN" "$here/gpt-bench.lua" \
        model.vocab="$V" model.ctx="$T" model.layers="$L" model.heads="$H" model.dim="$C" \
        train.batch="$B" train.steps=$((WARMUP + STEPS)) train.threads="$THREADS" \
        precision="$prec" run_dir="$dir" >"$tmp/log" 2>&1; then
        cat "$tmp/log" >&2
        die "trainrun $prec failed"
    fi
    head -n 1 "$tmp/log" >"$tmp/first-$prec$isa"
    awk -v w="$WARMUP" -v last=$((WARMUP + STEPS)) '
        /"loss"/ && /"elapsed_s"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
            if (s == w) e0 = e
            if (s == last) e1 = e
        }
        END { printf "%.1f", 1000 * (e1 - e0) / (last - w) }' "$dir/metrics.jsonl"
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

all32="" all16="" allem=""
echo
unit="ms/step"
[ "${CLOCK:-wall}" != cpu ] || unit="CPU ms/step"
echo "| round | fp32 $unit | bf16 $unit | bf16 speed-up |${ISA:+ bf16 ($ISA) $unit |}"
echo "|---:|---:|---:|---:|${ISA:+---:|}"
for r in $(seq 1 "$ROUNDS"); do
    a=$(ms_per_step fp32)
    b=$(ms_per_step bf16)
    all32="$all32 $a" all16="$all16 $b"
    em=""
    if [ -n "$ISA" ]; then
        em=$(ms_per_step bf16 "$ISA")
        allem="$allem $em"
    fi
    awk -v r="$r" -v a="$a" -v b="$b" -v e="$em" 'BEGIN { printf "| %d | %s | %s | %.2fx |%s\n", r, a, b, a / b, e != "" ? " " e " |" : "" }'
done
m32=$(echo "$all32" | median) m16=$(echo "$all16" | median)
awk -v a="$m32" -v b="$m16" -v e="$( [ -n "$ISA" ] && echo "$allem" | median)" \
    'BEGIN { printf "| median | %s | %s | %.2fx |%s\n", a, b, a / b, e != "" ? " " e " |" : "" }'
echo
echo "bf16 run's first line: $(cat "$tmp/first-bf16")"
[ -z "$ISA" ] || echo "bf16 ($ISA) run's first line: $(cat "$tmp/first-bf16$ISA")"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

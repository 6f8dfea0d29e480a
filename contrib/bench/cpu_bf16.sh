#!/usr/bin/env bash
# bf16 against fp32 on this CPU, trainrun against PyTorch: the figures of the
# CPU half-precision targets in one run.  For each shape (default the 6 x 384
# GPT and GPT-2 124M at T 64, batch 4), ROUNDS rounds of four arms one after
# the other -- trainrun fp32, trainrun bf16, PyTorch fp32, PyTorch bf16
# autocast -- so that load from anything else on the machine falls on every
# arm alike; each arm's wall ms/step, CPU ms/step and peak RSS, the medians,
# and the ratios the targets name.
#
#   contrib/bench/cpu_bf16.sh                          # needs build/trainrun
#   PYTHON=venv/bin/python ROUNDS=3 contrib/bench/cpu_bf16.sh
#   SHAPES="6x384:256,256,6,6,384,8" ARMS="trainrun-fp32 trainrun-bf16" contrib/bench/cpu_bf16.sh
#
# Environment (and lib.sh's: THREADS, TRAINRUN, PYTHON):
#   SHAPES   "name:vocab,ctx,layers,heads,dim,batch ..." (default
#            "6x384:256,256,6,6,384,8 gpt2-124m-t64:50257,64,12,12,768,4")
#   ARMS     any of trainrun-fp32 trainrun-bf16 torch-fp32 torch-bf16 (default
#            all four; the torch arms are skipped, saying so, without PyTorch)
#   WARMUP   untimed steps first (default 1), STEPS timed steps (default 3)
#   ROUNDS   rounds of the arms (default 2)
#   ISA      also run trainrun bf16 with ONEDNN_MAX_CPU_ISA=$ISA (e.g. AVX2:
#            the emulated path on the same machine); default: not
#   WAIT_POLICY  OMP_WAIT_POLICY for every arm (default: unset, each program
#            as a user runs it: trainrun asks its OpenMP for a short spin
#            between parallel regions, GOMP_SPINCOUNT=10000 KMP_BLOCKTIME=1,
#            about 0.2-0.5 ms, unless OMP_WAIT_POLICY, GOMP_SPINCOUNT or
#            KMP_BLOCKTIME is set; PyTorch's OpenMP spins longer, some ms,
#            before it sleeps).  "passive" for every arm makes waiting cost
#            no CPU time in either: the setting for CPU-time figures on a
#            loaded machine, where spinning threads of one process steal the
#            cores the others work on (it slows both down; docs/results.md,
#            "How idle threads wait").
#
# What each figure is:
#   wall ms/step  trainrun: elapsed_s in metrics.jsonl at the last step minus
#                 at the last warm-up step, over STEPS; PyTorch: torch_gpt.py's
#                 clock around its timed steps.
#   CPU ms/step   user + system time per timed step, what a step costs the
#                 cores it gets rather than how long it waited for them: the
#                 figure to read on a loaded machine (with WAIT_POLICY=passive;
#                 unset, threads spinning between regions count too).
#                 trainrun: cpu_s in metrics.jsonl (the process's CPU time) at
#                 the same two steps as the wall time; PyTorch: process_time()
#                 around its timed steps.  On an idle machine, wall ~ CPU /
#                 THREADS.
#   peak RSS      GNU time's maximum resident set of trainrun's run
#                 (its end-of-run checkpoint included: gpt-bench.lua saves
#                 synchronously, one blob of the weights in memory at a time),
#                 getrusage of the Python process for PyTorch (the interpreter
#                 and torch's libraries included).
#   of ceiling    fp32: FLOPs per step (trainrun plan) over the step's time,
#                 against the fp32 GEMM ceiling (gemm_ceiling.c, 2048^3,
#                 THREADS threads): in CPU time, FLOPs / (CPU s / THREADS)
#                 against the ceiling timed by CPU time the same way
#                 (GEMM_CEILING_CLOCK=cpu), and in wall time against the
#                 wall-time ceiling.  The ceiling is measured again in every
#                 round, just before its arms (a virtual machine's speed can
#                 change by half from one minute to the next, and a ceiling
#                 taken once at the start then says nothing about a step
#                 timed later), and each round's fp32 step is set against its
#                 own round's ceiling; the figure is the median over rounds.
#   ratios        each target ratio is given two ways: of the arms' medians,
#                 and the median of the per-round ratios (arms of one round
#                 ran within a minute of each other: the steadier figure on a
#                 machine whose speed drifts).
set -euo pipefail

name=cpu_bf16.sh
WARMUP=${WARMUP:-1}
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
SHAPES=${SHAPES:-"6x384:256,256,6,6,384,8 gpt2-124m-t64:50257,64,12,12,768,4"}
ARMS=${ARMS:-"trainrun-fp32 trainrun-bf16 torch-fp32 torch-bf16"}
STEPS=${STEPS:-3}
ROUNDS=${ROUNDS:-2}
ISA=${ISA:-}
[ -z "$ISA" ] || ARMS="$ARMS trainrun-bf16-$ISA"
WAIT_POLICY=${WAIT_POLICY:-}
if [ -n "$WAIT_POLICY" ]; then export OMP_WAIT_POLICY=$WAIT_POLICY; else unset OMP_WAIT_POLICY; fi

case " $ARMS " in
*" torch-"*)
    find_python torch
    [ -n "$PYTHON" ] || say "$name: PyTorch is not importable (set PYTHON=): its arms are skipped"
    ;;
*) PYTHON= ;;
esac

gcc -O2 -fopenmp "$here/gemm_ceiling.c" -o "$tmp/gemm_ceiling" -ldnnl ||
    die "cannot build gemm_ceiling.c (needs gcc and libdnnl-dev)"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores online;" \
     "threads: $THREADS; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "trainrun: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')${PYTHON:+; PyTorch: $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)}"
# ceiling: "wall_fp32 wall_bf16 cpu_fp32 cpu_bf16" (GFLOP/s), the bf16 detail in $tmp/ceiling.txt
ceiling() {
    local w c
    w=$("$tmp/gemm_ceiling" "$THREADS" 2>"$tmp/ceiling.txt") || die "gemm_ceiling failed"
    c=$(GEMM_CEILING_CLOCK=cpu "$tmp/gemm_ceiling" "$THREADS" 2>/dev/null) || die "gemm_ceiling failed"
    echo "$w $c"
}
read -r ceil_fp32 ceil_bf16 cpu_ceil_fp32 cpu_ceil_bf16 < <(ceiling)
echo "GEMM ceiling (oneDNN, 2048^3, $THREADS threads), wall time: fp32 $ceil_fp32 GFLOP/s, bf16 $ceil_bf16 GFLOP/s ($(cat "$tmp/ceiling.txt"))"
echo "GEMM ceiling, CPU time over $THREADS threads: fp32 $cpu_ceil_fp32 GFLOP/s, bf16 $cpu_ceil_bf16 GFLOP/s"
echo "(measured again in every round, before its arms: the rows 'gemm-ceiling', in GFLOP/s)"
echo "$WARMUP warm-up + $STEPS timed steps an arm, $ROUNDS rounds; OMP_WAIT_POLICY: ${WAIT_POLICY:-unset}"

# trainrun_arm PRECISION ISA V T L H C B: "wall_ms cpu_ms rss_mib"
trainrun_arm() {
    local prec=$1 isa=$2 V=$3 T=$4 L=$5 H=$6 C=$7 B=$8
    rm -rf "$tmp/run"
    if ! env ${isa:+ONEDNN_MAX_CPU_ISA=$isa} /usr/bin/time -f "%M" -o "$tmp/time" \
        "$TRAINRUN" "$here/gpt-bench.lua" \
        model.vocab="$V" model.ctx="$T" model.layers="$L" model.heads="$H" model.dim="$C" \
        train.batch="$B" train.steps=$((WARMUP + STEPS)) train.threads="$THREADS" \
        precision="$prec" run_dir="$tmp/run" >"$tmp/log" 2>&1; then
        cat "$tmp/log" >&2
        die "trainrun $prec failed"
    fi
    head -n 1 "$tmp/log" >"$tmp/first-$prec$isa"
    awk -v w="$WARMUP" -v last=$((WARMUP + STEPS)) -v s="$STEPS" -v rss="$(cat "$tmp/time")" '
        function field(key,   v) {
            if (!match($0, "\"" key "\": -?[0-9.]+")) return ""
            v = substr($0, RSTART, RLENGTH); sub(/.*: /, "", v); return v + 0
        }
        /"loss"/ && /"elapsed_s"/ {
            st = field("step")
            if (st == w) { e0 = field("elapsed_s"); c0 = field("cpu_s") }
            if (st == last) { e1 = field("elapsed_s"); c1 = field("cpu_s") }
        }
        END { printf "%.1f %.1f %.0f\n", 1000 * (e1 - e0) / s, 1000 * (c1 - c0) / s, rss / 1024 }' \
        "$tmp/run/metrics.jsonl"
}

# torch_arm FLAG V T L H C B (FLAG: --bf16 or empty): "wall_ms cpu_ms rss_mib"
torch_arm() {
    local flag=$1 V=$2 T=$3 L=$4 H=$5 C=$6 B=$7
    if ! "$PYTHON" "$here/torch_gpt.py" --vocab "$V" --ctx "$T" --layers "$L" --heads "$H" \
        --dim "$C" --batch "$B" --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" \
        ${flag:+"$flag"} >"$tmp/torch.out" 2>"$tmp/torch.err"; then
        cat "$tmp/torch.err" >&2
        die "torch_gpt.py ${flag:-(fp32)} failed"
    fi
    sed -n 's/^RESULT ms_per_step=\([^ ]*\) .*peak_rss_mib=\([^ ]*\) .*cpu_ms_per_step=\([^ ]*\).*/\1 \3 \2/p' \
        "$tmp/torch.out"
}

for shape in $SHAPES; do
    sname=${shape%%:*}
    IFS=, read -r V T L H C B <<<"${shape#*:}"
    # FLOPs per step and the memory plan, as trainrun plan counts them
    "$TRAINRUN" plan "$here/gpt-bench.lua" model.vocab="$V" model.ctx="$T" model.layers="$L" \
        model.heads="$H" model.dim="$C" train.batch="$B" precision=bf16 >"$tmp/plan" 2>&1 ||
        { cat "$tmp/plan" >&2; die "trainrun plan failed"; }
    flops_token=$(awk '/training FLOPs\/token/ { n = split($0, w, "= "); v = w[n]; sub(/ .*/, "", v); gsub(/,/, "", v); print v }' "$tmp/plan")
    plan_bf16=$(awk '$1 == "total" { print $2, $3; exit }' "$tmp/plan")
    "$TRAINRUN" plan "$here/gpt-bench.lua" model.vocab="$V" model.ctx="$T" model.layers="$L" \
        model.heads="$H" model.dim="$C" train.batch="$B" precision=fp32 >"$tmp/plan" 2>&1 ||
        { cat "$tmp/plan" >&2; die "trainrun plan failed"; }
    plan_fp32=$(awk '$1 == "total" { print $2, $3; exit }' "$tmp/plan")
    flops_step=$(awk -v f="$flops_token" -v t=$((B * T)) 'BEGIN { printf "%.0f", f * t }')

    echo
    echo "## $sname: vocab $V, ctx $T, $L layers, $H heads, dim $C, batch $B" \
         "($(awk -v f="$flops_step" 'BEGIN { printf "%.1f", f / 1e9 }') GFLOP a step;" \
         "trainrun's memory plan: fp32 $plan_fp32, bf16 $plan_bf16)"
    echo
    echo "| round | arm | wall ms/step | CPU ms/step | peak RSS MiB |"
    echo "|---:|---|---:|---:|---:|"
    : >"$tmp/rows"
    for r in $(seq 1 "$ROUNDS"); do
        read -r cw32 cw16 cc32 cc16 < <(ceiling)
        echo "gemm-ceiling $cw32 $cc32 - $r" >>"$tmp/rows"
        echo "| $r | gemm-ceiling fp32 (GFLOP/s; bf16 $cw16 wall, $cc16 CPU) | $cw32 | $cc32 | |"
        for arm in $ARMS; do
            case $arm in
            trainrun-fp32) res=$(trainrun_arm fp32 "" "$V" "$T" "$L" "$H" "$C" "$B") ;;
            trainrun-bf16) res=$(trainrun_arm bf16 "" "$V" "$T" "$L" "$H" "$C" "$B") ;;
            trainrun-bf16-*) res=$(trainrun_arm bf16 "${arm#trainrun-bf16-}" "$V" "$T" "$L" "$H" "$C" "$B") ;;
            torch-fp32 | torch-bf16)
                [ -n "$PYTHON" ] || continue
                flag=
                [ "$arm" = torch-fp32 ] || flag=--bf16
                res=$(torch_arm "$flag" "$V" "$T" "$L" "$H" "$C" "$B")
                ;;
            *) die "unknown arm $arm (trainrun-fp32 trainrun-bf16 torch-fp32 torch-bf16)" ;;
            esac
            read -r wall cpu rss <<<"$res"
            echo "$arm $wall $cpu $rss $r" >>"$tmp/rows"
            echo "| $r | $arm | $wall | $cpu | $rss |"
        done
    done
    echo
    echo "| median | wall ms/step | CPU ms/step | peak RSS MiB |"
    echo "|---|---:|---:|---:|"
    for arm in $ARMS; do
        grep -q "^$arm " "$tmp/rows" || continue
        for k in 2 3 4; do
            eval "m_${k}=$(awk -v a="$arm" -v k="$k" '$1 == a { printf "%s ", $k }' "$tmp/rows" | median)"
        done
        key=${arm//-/_}
        eval "wall_$key=$m_2 cpu_$key=$m_3 rss_$key=$m_4"
        echo "| $arm | $m_2 | $m_3 | $m_4 |"
    done
    echo
    ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2fx", a / b; else printf "n/a" }'; }
    # round_ratio SLOW FAST COLUMN: the median over rounds of SLOW / FAST
    # (column 2 wall, 3 CPU), each round's two arms against each other
    round_ratio() {
        awk -v a="$1" -v b="$2" -v k="$3" '$1 == a { x[$5] = $k } $1 == b { y[$5] = $k }
            END { for (r in x) if ((r in y) && y[r] > 0) printf "%s ", x[r] / y[r] }' "$tmp/rows" |
            median "%.2fx" | grep . || echo n/a
    }
    both() { echo "CPU $(ratio "${3:-}" "${4:-}"), wall $(ratio "${5:-}" "${6:-}") (median of rounds: CPU $(round_ratio "$1" "$2" 3), wall $(round_ratio "$1" "$2" 2))"; }
    echo "- trainrun bf16 speed-up over trainrun fp32 (target >= 1.7x): $(both trainrun-fp32 trainrun-bf16 "${cpu_trainrun_fp32:-}" "${cpu_trainrun_bf16:-}" "${wall_trainrun_fp32:-}" "${wall_trainrun_bf16:-}")"
    echo "- trainrun bf16 over PyTorch bf16 autocast (target >= 1.4x): $(both torch-bf16 trainrun-bf16 "${cpu_torch_bf16:-}" "${cpu_trainrun_bf16:-}" "${wall_torch_bf16:-}" "${wall_trainrun_bf16:-}")"
    echo "- trainrun fp32 over PyTorch fp32: $(both torch-fp32 trainrun-fp32 "${cpu_torch_fp32:-}" "${cpu_trainrun_fp32:-}" "${wall_torch_fp32:-}" "${wall_trainrun_fp32:-}")"
    echo "- peak RSS under bf16 (target: trainrun <= PyTorch): trainrun ${rss_trainrun_bf16:-n/a} MiB, PyTorch ${rss_torch_bf16:-n/a} MiB"
    # each round's fp32 step against that round's ceiling: "cpu% wall%" a round
    awk -v f="$flops_step" -v th="$THREADS" '
        $1 == "gemm-ceiling" { cw[$5] = $2; cc[$5] = $3 }
        $1 == "trainrun-fp32" { w[$5] = $2; c[$5] = $3 }
        END { for (r in c) if ((r in cc) && cc[r] > 0 && cw[r] > 0)
                  printf "%.1f %.1f\n", 100 * f / (c[r] / 1000 / th) / 1e9 / cc[r],
                                        100 * f / (w[r] / 1000) / 1e9 / cw[r] }' "$tmp/rows" >"$tmp/of_ceiling"
    if [ -s "$tmp/of_ceiling" ]; then
        c_med=$(cut -d' ' -f1 "$tmp/of_ceiling" | tr '\n' ' ' | median "%.1f")
        w_med=$(cut -d' ' -f2 "$tmp/of_ceiling" | tr '\n' ' ' | median "%.1f")
        c_all=$(cut -d' ' -f1 "$tmp/of_ceiling" | sort -g | tr '\n' ' ')
        cc_med=$(awk '$1 == "gemm-ceiling" { printf "%s ", $3 }' "$tmp/rows" | median "%.1f")
        cw_med=$(awk '$1 == "gemm-ceiling" { printf "%s ", $2 }' "$tmp/rows" | median "%.1f")
        echo "- trainrun fp32 of the fp32 GEMM ceiling of its own round (median of rounds): $c_med% in CPU time, $w_med% in wall time (rounds, CPU time: ${c_all% }; the ceiling's medians: $cc_med GFLOP/s CPU over $THREADS threads, $cw_med wall)"
    else
        echo "- trainrun fp32 of the fp32 GEMM ceiling: n/a"
    fi
    unset wall_trainrun_fp32 wall_trainrun_bf16 wall_torch_fp32 wall_torch_bf16 \
          cpu_trainrun_fp32 cpu_trainrun_bf16 cpu_torch_fp32 cpu_torch_bf16 rss_trainrun_bf16 rss_torch_bf16
done
echo
for f in "$tmp"/first-bf16*; do
    [ -e "$f" ] && echo "trainrun ${f#"$tmp/first-"} run's first line: $(cat "$f")"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

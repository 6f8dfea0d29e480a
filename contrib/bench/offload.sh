#!/usr/bin/env bash
# parallel.offload = "optimizer" on the CUDA-on-CPU harness: what the step
# costs with the optimizer on the device, offloaded within the step, and
# offloaded overlapping the next forward, interleaved: the host's update
# time a step (metrics.jsonl's offload_update_s) and what of it the forward
# still waited for (offload_wait_s), so how much of it the overlap hid.
#
#   contrib/bench/offload.sh            # needs build/trainrun and make check's harness
#
# No GPU here: the "device" is the harness (tests/cudacpu), whose kernels
# run on the trainer's thread, one core; the host's AdamW runs on the
# offload worker's thread with THREADS threads (1: the other core).  So the
# figures show what the overlap hides when host and device compute at once,
# not a GPU's speed: there the device is far faster and the host's pass,
# PCIe included, a larger share of the step.  The model: tests/config/
# tiny_llama.lua widened (MODEL, about 12 M parameters by default) at
# micro-batch 1 of 8 tokens, so that the update is a visible share of the
# step.
#
# Environment: TRAINRUN, CUDACPU (the harness's backend directory,
# build/tests/cudacpu/.libs), THREADS (1), STEPS (12, after WARMUP 3),
# REPS (3), MODEL (overrides of the widened Llama).
set -euo pipefail
name=offload.sh
THREADS=${THREADS:-1}
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
STEPS=${STEPS:-12}
REPS=${REPS:-3}
CUDACPU=${CUDACPU:-$root/build/tests/cudacpu/.libs}
MODEL=${MODEL:-model.dim=512 model.ffn_dim=1408 model.layers=4 model.heads=8 model.kv_heads=4}
[ -f "$CUDACPU/backend_cuda.so" ] || die "no harness at $CUDACPU (make check builds it; set CUDACPU=)"
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"

modes="device in_step overlapped"
args() {
    case $1 in
    device) echo "" ;;
    in_step) echo "parallel.offload=optimizer parallel.offload_overlap=false" ;;
    overlapped) echo "parallel.offload=optimizer" ;;
    esac
}
# seconds per timed step of a run (elapsed_s after the last step minus after
# the warm-up), and the median offload_wait_s of the timed steps
per_step() {
    awk -v w="$WARMUP" -v last=$((WARMUP + STEPS)) '/"loss"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
            if (s == w) e0 = e; if (s == last) e1 = e }
        END { printf "%.4f", (e1 - e0) / (last - w) }' "$1"
}
# the median of a metrics.jsonl key over the timed steps ("-": none)
timed() {
    v=$(awk -v w="$WARMUP" -v k="\"$2\": " 'index($0, k) {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            v = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", v)
            if (s > w) print v }' "$1" | median "%.4f")
    echo "${v:--}"
}
for rep in $(seq "$REPS"); do
    for m in $modes; do
        # shellcheck disable=SC2046,SC2086
        TRAINRUN_BACKEND_PATH=$CUDACPU "$TRAINRUN" "$root/tests/config/tiny_llama.lua" device=cuda \
            $MODEL train.batch=1 train.micro_batch=1 train.threads="$THREADS" \
            train.steps=$((WARMUP + STEPS)) train.log_every=1 train.eval_every=0 checkpoint.every=0 \
            run_dir="$tmp/$m-$rep" $(args $m) >"$tmp/$m-$rep.log" 2>&1 ||
            { cat "$tmp/$m-$rep.log" >&2; die "$m failed"; }
        mj=$tmp/$m-$rep/metrics.jsonl
        echo "$m $(per_step "$mj") $(timed "$mj" offload_update_s) $(timed "$mj" offload_wait_s)" \
            >>"$tmp/rows"
        say "round $rep: $m $(tail -1 "$tmp/rows" | cut -d' ' -f2-)"
    done
done
echo "offload on the CUDA-on-CPU harness ($MODEL, micro-batch 1 x 8 tokens, $THREADS host"
echo "thread(s)): $REPS rounds of $STEPS timed steps, medians"
echo
echo "| mode | s / step | vs device | host update s / step | forward waited s / step | update hidden |"
echo "|---|---|---|---|---|---|"
col() { awk -v m="$1" -v c="$2" '$1 == m && $c != "-" { print $c }' "$tmp/rows" | median "%.4f"; }
dev=$(col device 2)
for m in $modes; do
    s=$(col "$m" 2) u=$(col "$m" 3) w=$(col "$m" 4)
    awk -v m="$m" -v s="$s" -v d="$dev" -v u="${u:--}" -v w="${w:--}" 'BEGIN {
        h = u == "-" ? "-" : w == "-" ? "0% (within the step)" : sprintf("%.0f%%", 100 * (1 - w / u))
        printf "| %s | %.4f | %.2fx | %s | %s | %s |\n", m, s, s / d, u, w, h }'
done

#!/usr/bin/env bash
# trainrun vs PyTorch: training steps of the same ResNet-18 on the CPU, one table.
#
#   contrib/bench/cpu_resnet.sh                    # from anywhere; needs build/trainrun
#   THREADS=2 OUT=table.md PYTHON=/path/to/venv/bin/python contrib/bench/cpu_resnet.sh
#
# The model (contrib/bench/resnet-bench.lua, torch_resnet.py): ResNet-18,
# basic blocks [2,2,2,2] at widths 64/128/256/512, the small stem (one 3x3
# stride-1 convolution, no max pool), batch 32 of 64x64x3 images, 10
# classes, SGD with momentum 0.9; the same on both sides.  Engines run one
# after another, interleaved (trainrun, then each PyTorch variant, ROUNDS
# times), so a change in the machine's load hits all of them alike.
#
# Two times per step: wall clock, and CPU time (user + system of all the
# process's threads).  On a machine others share, wall time measures the
# load; CPU time per step is what the engine costs, and is the figure to
# compare there (the load average is printed before and after).
#
# Environment:
#   THREADS      compute threads for every engine (default 2)
#   OUT          also write the table to this file
#   PYTHON       the Python with torch (default: the first of python3,
#                /usr/bin/python3 that imports it; none: PyTorch rows skipped)
#   TRAINRUN     the binary (default: build/trainrun of this checkout)
#   WARMUP       untimed steps before the timed ones (default 2)
#   STEPS        timed steps (default 3)
#   BATCH        images per step (default 32)
#   ROUNDS       how many times each engine runs (default 1)
#   BF16=0       skip the bf16 rows (default: run them where the CPU has bf16 instructions)
#
# trainrun's wall ms/step comes from runs/<name>/metrics.jsonl (elapsed_s at
# the last step minus elapsed_s at the last warm-up step); its CPU time from
# /proc/PID/stat read when each of those two steps' metrics line appears
# (polled every 50 ms).  PyTorch's from torch_resnet.py's own clocks
# (perf_counter, process_time) around the timed steps.  Peak RSS: GNU
# time's maximum resident set for trainrun, getrusage for PyTorch.
set -euo pipefail

name=cpu_resnet.sh
WARMUP=${WARMUP:-2}
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
STEPS=${STEPS:-3}
BATCH=${BATCH:-32}
ROUNDS=${ROUNDS:-1}

find_python torch
torch_info="not importable: PyTorch rows skipped (set PYTHON= to a Python with torch)"
if [ -n "$PYTHON" ]; then
    torch_info=$("$PYTHON" -c '
import re, torch
onednn = re.search(r"(?:oneDNN|MKL-DNN) v([0-9.]+)", torch.__config__.show())
print("%s (convolutions: oneDNN %s, CPU capability %s)" % (torch.__version__.split("+")[0],
      onednn.group(1) if onednn else "?", torch.backends.cpu.get_cpu_capability()))' 2>/dev/null ||
        echo "?")
fi

bf16=no
if [ "${BF16:-1}" != 0 ] && grep -qw avx512_bf16 /proc/cpuinfo; then
    bf16=yes
fi

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
say "load average before starting: $load_before (2-core machine: near 0 for honest wall times)"
tick=$(getconf CLK_TCK)
rows=$tmp/rows
: >"$rows"

# cpu_seconds PID: user + system time of the process so far
cpu_seconds() {
    awk -v t="$tick" '{ print ($14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || echo ""
}

# last_step FILE: the step of the last line of metrics.jsonl with a loss
last_step() {
    [ -f "$1" ] || { echo -1; return; }
    awk '/"loss"/ { match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) } END { print s == "" ? -1 : s }' "$1"
}

# trainrun PRECISION ROUND
trainrun_row() {
    local prec=$1 round=$2 last=$((WARMUP + STEPS))
    local dir=$tmp/run-$prec-$round
    say "trainrun $prec: $WARMUP + $STEPS steps"
    /usr/bin/time -v -o "$tmp/time.txt" "$TRAINRUN" "$here/resnet-bench.lua" \
        train.batch="$BATCH" train.steps="$last" train.threads="$THREADS" precision="$prec" \
        run_dir="$dir" >"$tmp/log" 2>&1 &
    local timer=$! pid="" c0="" c1="" s
    while kill -0 "$timer" 2>/dev/null; do
        [ -n "$pid" ] || pid=$(pgrep -P "$timer" | head -n1 || true)
        if [ -n "$pid" ]; then
            s=$(last_step "$dir/metrics.jsonl")
            [ -z "$c0" ] && [ "$s" -ge "$WARMUP" ] && c0=$(cpu_seconds "$pid")
            [ -z "$c1" ] && [ "$s" -ge "$last" ] && c1=$(cpu_seconds "$pid")
        fi
        sleep 0.05
    done
    if ! wait "$timer"; then
        cat "$tmp/log" >&2
        printf 'trainrun\t%s\tfailed\n' "$prec" >>"$rows"
        return
    fi
    [ "$WARMUP" -eq 0 ] && c0=0
    awk -v w="$WARMUP" -v last="$last" -v prec="$prec" -v c0="$c0" -v c1="$c1" -v b="$BATCH" \
        -v rss="$(awk '/Maximum resident/ {print $NF}' "$tmp/time.txt")" '
        /"loss"/ && /"elapsed_s"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
            if (s == w) e0 = e
            if (s == last) e1 = e
        }
        END {
            if (w == 0) e0 = 0
            ms = 1000 * (e1 - e0) / (last - w)
            cpu = (c0 == "" || c1 == "") ? "?" : sprintf("%.0f", 1000 * (c1 - c0) / (last - w))
            printf "trainrun\t%s\t%.0f\t%s\t%.1f\t%.0f\n", prec, ms, cpu, b * 1000 / ms, rss / 1024
        }' "$dir/metrics.jsonl" >>"$rows"
}

# torch LABEL PRECISION FLAGS...
torch_row() {
    local label=$1 prec=$2
    shift 2
    if [ -z "$PYTHON" ]; then
        printf '%s\t%s\tskipped: torch not importable\n' "$label" "$prec" >>"$rows"
        return
    fi
    say "$label $prec: $WARMUP + $STEPS steps"
    if ! "$PYTHON" "$here/torch_resnet.py" --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS" \
        --threads "$THREADS" "$@" >"$tmp/torch.out" 2>"$tmp/torch.err"; then
        cat "$tmp/torch.err" >&2
        printf '%s\t%s\tfailed\n' "$label" "$prec" >>"$rows"
        return
    fi
    sed -n 's/^RESULT ms_per_step=\([^ ]*\) cpu_ms_per_step=\([^ ]*\) images_per_s=\([^ ]*\) peak_rss_mib=\([^ ]*\).*/\1 \2 \3 \4/p' \
        "$tmp/torch.out" | while read -r ms cpu ips rss; do
        printf '%s\t%s\t%.0f\t%.0f\t%s\t%s\n' "$label" "$prec" "$ms" "$cpu" "$ips" "$rss"
    done >>"$rows"
}

for round in $(seq 1 "$ROUNDS"); do
    trainrun_row fp32 "$round"
    torch_row "PyTorch NCHW" fp32
    torch_row "PyTorch channels_last" fp32 --channels-last
    if [ "$bf16" = yes ]; then
        trainrun_row bf16 "$round"
        torch_row "PyTorch channels_last" bf16 --channels-last --bf16
    fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "?")
[ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ] && rev="$rev + local changes"
{
    echo "CPU: $cpu, $(nproc) cores online; threads: $THREADS"
    echo "trainrun: $rev; PyTorch: $torch_info"
    echo "ResNet-18 (small stem), batch $BATCH of 64x64x3, 10 classes, SGD momentum 0.9;"
    echo "$WARMUP warm-up steps (untimed), then $STEPS timed; $ROUNDS round(s), interleaved"
    echo "load average: $load_before before, $load_after after"
    echo
    echo "| engine | precision | wall ms/step | CPU ms/step | images/s (wall) | peak RSS MiB |"
    echo "|---|---|---:|---:|---:|---:|"
    awk -F'\t' '
        NF < 6 { printf "| %s | %s | %s | | | |\n", $1, $2, $3; next }
        { printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }' "$rows"
    echo
    echo "CPU ms/step: user + system time of all threads per timed step; with other work on"
    echo "the machine it is the fair comparison (wall time then mostly measures the load)."
} >"$tmp/table"

cat "$tmp/table"
[ -z "$OUT" ] || cp "$tmp/table" "$OUT"

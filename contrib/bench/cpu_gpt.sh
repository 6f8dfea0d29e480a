#!/usr/bin/env bash
# trainrun vs PyTorch: training steps of the same GPT on the CPU, one table.
#
#   contrib/bench/cpu_gpt.sh                       # from anywhere; needs build/trainrun
#   THREADS=2 OUT=table.md PYTHON=python3 contrib/bench/cpu_gpt.sh
#
# Measures, in order, one thing at a time (timings on a busy machine are
# worthless, so the load average is printed first):
#   1. the GEMM ceiling: oneDNN fp32 and bf16 GEMM GFLOP/s at 2048^3;
#   2. for each shape, trainrun fp32 (bf16 when trainrun accepts it), PyTorch
#      fp32 and PyTorch bf16 autocast, all with THREADS threads.
#
# Environment:
#   THREADS      compute threads for every engine (default 2)
#   OUT          also write the table to this file
#   PYTHON       the Python with torch (default: the first of python3,
#                /usr/bin/python3 that imports it; none: PyTorch rows skipped)
#   TRAINRUN     the binary (default: build/trainrun of this checkout)
#   WARMUP       untimed steps before the timed ones (default 3)
#   SMALL_STEPS  timed steps of the small shape (default 20)
#   LARGE_STEPS  timed steps of the large shape, and of emulated bf16 (default 5)
#   BF16_ALL=1   run PyTorch bf16 on the large shape even when the CPU has no
#                bf16 GEMM (it is emulated there: hours, not minutes)
#   PROFILE=0    skip the per-op profile of trainrun on the small shape (from
#                its own trace, run_dir/trace.json; default on, ~10 s)
#
# ms/step of trainrun comes from runs/<name>/metrics.jsonl (elapsed_s at the
# last step minus elapsed_s at the last warm-up step); PyTorch's from
# torch_gpt.py's own clock around the same number of steps.  Peak RSS: GNU
# time's maximum resident set for trainrun, getrusage for PyTorch.
set -euo pipefail

name=cpu_gpt.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"

# ---------------------------------------------------------------- the peer
find_python torch
torch_info="not importable: PyTorch rows skipped (apt-get install python3-torch, or pip install torch; set PYTHON=)"
if [ -n "$PYTHON" ]; then
    # the BLAS matters: Debian's python3-torch uses the reference BLAS for fp32
    torch_info=$("$PYTHON" -c '
import torch
cfg = torch.__config__.show()
blas = "MKL" if torch.backends.mkl.is_available() else next(
    (w.split("=")[1].rstrip(",") for w in cfg.split() if w.startswith("BLAS_INFO=")), "?")
cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
print("%s (fp32 GEMM: %s, CPU capability %s)" % (torch.__version__, blas, cap))' 2>/dev/null)
else
    PYTHON=
    say "cpu_gpt.sh: PyTorch is not importable; its rows are skipped"
fi

# ---------------------------------------------------------------- ceiling
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
gcc -O2 -fopenmp "$here/gemm_ceiling.c" -o "$tmp/gemm_ceiling" -ldnnl ||
    die "cannot build gemm_ceiling.c (needs gcc and libdnnl-dev)"
read -r ceil_fp32 ceil_bf16 < <("$tmp/gemm_ceiling" "$THREADS")
say "GEMM ceiling, $THREADS threads: fp32 $ceil_fp32 GFLOP/s, bf16 $ceil_bf16 GFLOP/s"

# ---------------------------------------------------------------- rows
# rows: config engine precision ms/step tokens/s peak-RSS-MiB (or a note)
rows=$tmp/rows
: >"$rows"

# trainrun CONFIG PRECISION V T L H C B STEPS
trainrun_row() {
    local cfg=$1 prec=$2 V=$3 T=$4 L=$5 H=$6 C=$7 B=$8 steps=$9
    local dir=$tmp/run-$cfg-$prec
    say "trainrun $prec, $cfg: $WARMUP + $steps steps"
    if ! /usr/bin/time -v -o "$tmp/time.txt" "$TRAINRUN" "$here/gpt-bench.lua" \
        model.vocab="$V" model.ctx="$T" model.layers="$L" model.heads="$H" model.dim="$C" \
        train.batch="$B" train.steps=$((WARMUP + steps)) train.threads="$THREADS" \
        precision="$prec" run_dir="$dir" >"$tmp/log" 2>&1; then
        cat "$tmp/log" >&2
        printf '%s\ttrainrun\t%s\tfailed\n' "$cfg" "$prec" >>"$rows"
        return
    fi
    # the memory trainrun planned for the graph, optimizer and data (bytes)
    local plan
    plan=$(awk '/^ *total / {gsub(/[()]/, "", $(NF-1)); print $(NF-1)}' "$tmp/log")
    # elapsed_s of the last warm-up step (0 with no warm-up) and of the last step
    awk -v w="$WARMUP" -v plan="${plan:-0}" -v last=$((WARMUP + steps)) -v cfg="$cfg" -v prec="$prec" \
        -v tokens=$((B * T)) -v rss="$(awk '/Maximum resident/ {print $NF}' "$tmp/time.txt")" '
        /"loss"/ && /"elapsed_s"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
            if (s == w) e0 = e
            if (s == last) e1 = e
        }
        END {
            if (w == 0) e0 = 0
            ms = 1000 * (e1 - e0) / (last - w)
            printf "%s\ttrainrun\t%s\t%.1f\t%.0f\t%.0f\t%.0f\n", cfg, prec, ms, tokens * 1000 / ms,
                rss / 1024, plan / 1048576
        }' "$dir/metrics.jsonl" >>"$rows"
}

# torch CONFIG PRECISION V T L H C B STEPS
torch_row() {
    local cfg=$1 prec=$2 V=$3 T=$4 L=$5 H=$6 C=$7 B=$8 steps=$9
    if [ -z "$PYTHON" ]; then
        printf '%s\tPyTorch\t%s\tskipped: torch not importable\n' "$cfg" "$prec" >>"$rows"
        return
    fi
    say "PyTorch $prec, $cfg: $WARMUP + $steps steps"
    local flag=
    [ "$prec" = bf16 ] && flag=--bf16
    if ! "$PYTHON" "$here/torch_gpt.py" --vocab "$V" --ctx "$T" --layers "$L" --heads "$H" \
        --dim "$C" --batch "$B" --warmup "$WARMUP" --steps "$steps" --threads "$THREADS" \
        $flag >"$tmp/torch.out" 2>"$tmp/torch.err"; then
        cat "$tmp/torch.err" >&2
        printf '%s\tPyTorch\t%s\tfailed\n' "$cfg" "$prec" >>"$rows"
        return
    fi
    sed -n 's/^RESULT ms_per_step=\([^ ]*\) tokens_per_s=\([^ ]*\) peak_rss_mib=\([^ ]*\).*/\1 \2 \3/p' \
        "$tmp/torch.out" | while read -r ms tps rss; do
        printf '%s\tPyTorch\t%s\t%s\t%.0f\t%s\n' "$cfg" "$prec" "$ms" "$tps" "$rss"
    done >>"$rows"
}

# Does trainrun accept precision=bf16?  One step of a one-layer model tells.
trainrun_bf16=yes
if ! "$TRAINRUN" "$here/gpt-bench.lua" --quiet model.layers=1 train.steps=1 \
    train.threads="$THREADS" precision=bf16 run_dir="$tmp/probe" >"$tmp/probe.log" 2>&1; then
    trainrun_bf16=no
    say "trainrun refuses precision=bf16: $(grep -m1 error "$tmp/probe.log" || true)"
fi

# name vocab ctx layers heads dim batch timed-steps
configs="small 256 128 4 4 128 32 $SMALL_STEPS
large 256 256 12 12 768 8 $LARGE_STEPS"

while read -r cfg V T L H C B steps; do
    trainrun_row "$cfg" fp32 "$V" "$T" "$L" "$H" "$C" "$B" "$steps"
    if [ "$trainrun_bf16" = yes ]; then
        trainrun_row "$cfg" bf16 "$V" "$T" "$L" "$H" "$C" "$B" "$steps"
    else
        printf '%s\ttrainrun\tbf16\tn/a (not supported yet)\n' "$cfg" >>"$rows"
    fi
    torch_row "$cfg" fp32 "$V" "$T" "$L" "$H" "$C" "$B" "$steps"
    # Without a bf16 GEMM in the CPU, bf16 is emulated and ~50x slower than
    # fp32: a few steps of the small shape show it; the large one would take hours.
    if [ "$ceil_bf16" != n/a ] || [ "$cfg" = small ] || [ "${BF16_ALL:-0}" = 1 ]; then
        bf16_steps=$steps
        [ "$ceil_bf16" = n/a ] && bf16_steps=$LARGE_STEPS
        torch_row "$cfg" bf16 "$V" "$T" "$L" "$H" "$C" "$B" "$bf16_steps"
    else
        printf '%s\tPyTorch\tbf16\tskipped: no bf16 GEMM in this CPU (BF16_ALL=1 runs it)\n' \
            "$cfg" >>"$rows"
    fi
done <<<"$configs"

# ---------------------------------------------------------------- table
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "?")
[ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ] && rev="$rev + local changes"
{
    echo "CPU: $cpu, $(nproc) cores online; threads: $THREADS"
    echo "trainrun: $rev; PyTorch: $torch_info"
    echo "GEMM ceiling (oneDNN, 2048^3): fp32 $ceil_fp32 GFLOP/s, bf16 $ceil_bf16 GFLOP/s"
    echo "Steps: $WARMUP warm-up (untimed), then $SMALL_STEPS timed (small) / $LARGE_STEPS timed (large, and PyTorch bf16 where the CPU has no bf16 GEMM)"
    echo "Shapes: small = vocab 256, ctx 128, 4 layers, 4 heads, dim 128, batch 32 (recipes/kjv-char.lua);"
    echo "        large = vocab 256, ctx 256, 12 layers, 12 heads, dim 768, batch 8"
    echo "FLOPs per token = 6*P + 12*L*T*C: P = all parameters (the embedding counted once: it is"
    echo "also the output head), 12*L*T*C = attention scores and weighted sum, forward and backward."
    echo
    echo "| config | engine | precision | ms/step | tokens/s | GFLOP/s | of GEMM ceiling | peak RSS MiB |"
    echo "|---|---|---|---:|---:|---:|---:|---:|"
    awk -F'\t' -v c32="$ceil_fp32" -v c16="$ceil_bf16" -v cfgs="$configs" '
        BEGIN {
            n = split(cfgs, lines, "\n")
            for (i = 1; i <= n; i++) {
                split(lines[i], f, " ")
                V = f[2]; T = f[3]; L = f[4]; C = f[6]
                P = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
                flops[f[1]] = 6 * P + 12 * L * T * C
                params[f[1]] = P
            }
        }
        NF < 6 { printf "| %s | %s | %s | %s | | | | |\n", $1, $2, $3, $4; next }
        {
            gf = flops[$1] * $5 / 1e9
            ceil = $3 == "bf16" ? c16 : c32
            frac = ceil == "n/a" ? "n/a" : sprintf("%.0f%%", 100 * gf / ceil)
            printf "| %s | %s | %s | %.1f | %.0f | %.1f | %s | %s |\n", $1, $2, $3, $4, $5, gf, frac, $6
            ms[$1 "," $2 "," $3] = $4
            if (NF > 6) plan[$1 "," $3] = $7
        }
        END {
            print ""
            for (i = 1; i <= n; i++) {
                split(lines[i], f, " ")
                c = f[1]
                printf "%s: P = %d parameters, %.2f MFLOP per token", c, params[c], flops[c] / 1e6
                if (plan[c ",fp32"] != "")
                    printf "; trainrun memory plan %s MiB", plan[c ",fp32"]
                print "."
                sep = "  speedup of trainrun (PyTorch ms/step / trainrun ms/step):"
                for (k = 1; k <= 2; k++) {
                    p = k == 1 ? "fp32" : "bf16"
                    t = ms[c ",trainrun," p]; o = ms[c ",PyTorch," p]
                    if (t != "" && o != "") {
                        printf "%s %s %.2fx", sep, p, o / t
                        sep = ","
                    }
                }
                if (sep == ",") print ""
            }
            print ""
            print "trainrun peak RSS includes its end-of-run checkpoint, written synchronously"
            print "(gpt-bench.lua: checkpoint.async = false), one 4-byte-per-parameter blob at a time;"
            print "PyTorch writes none."
        }' "$rows"
} >"$tmp/table"

# ---------------------------------------------------------------- profile
# trainrun times each op's forward and backward on sampled steps
# (train.trace_every); the sampled steps after the warm-up give ms per step.
if [ "${PROFILE:-1}" != 0 ]; then
    say "trainrun fp32 per-op profile, small: $WARMUP + $SMALL_STEPS steps"
    if "$TRAINRUN" "$here/gpt-bench.lua" --quiet train.steps=$((WARMUP + SMALL_STEPS)) \
        train.threads="$THREADS" train.trace_every=5 run_dir="$tmp/profile" >"$tmp/log" 2>&1 &&
        [ -s "$tmp/profile/trace.json" ]; then
        awk -v w="$WARMUP" '
            function field(key, re) { match($0, re); return substr($0, RSTART + length(key), RLENGTH - length(key)) }
            /"step": / {
                step = field("\"step\": ", "\"step\": [0-9]+") + 0
                if (step < w) next
                name = field("\"name\": \"", "\"name\": \"[^\"]*"); dur = field("\"dur\": ", "\"dur\": [0-9.]+") / 1000
            }
            /"cat": "phase"/ && step >= w { phase[step, name] += dur }
            /"cat": "(forward|backward)"/ && step >= w {
                sampled[step] = 1
                dir = sub(/ \(backward\)$/, "", name) ? "b" : "f"
                gsub(/transformer\.h\.[0-9]+\./, "", name)   # all blocks together
                sub(/ transformer\./, " ", name)
                op[name] = 1; t[name, dir] += dur; ops += dur
            }
            END {
                for (s in sampled) {
                    n++
                    fb += phase[s, "forward+backward"]; opt += phase[s, "optimizer"]
                    wait += phase[s, "data wait"]
                }
                if (!n) { print "(no sampled steps after the warm-up)"; exit }
                total = (fb + opt + wait) / n
                printf "trainrun fp32, small shape: per-op time, mean of %d sampled steps after the warm-up\n", n
                printf "(%.1f ms per step; ops of all blocks summed; linear and attention include their GEMMs)\n\n", total
                print "| op | forward ms | backward ms | total ms | of step |"
                print "|---|---:|---:|---:|---:|"
                for (o in op) line[o] = sprintf("%.1f|%s", (t[o, "f"] + t[o, "b"]) / n, o)
                k = 0
                for (o in op) keys[++k] = line[o]
                # insertion sort, largest first (no gawk asort in mawk)
                for (i = 2; i <= k; i++) {
                    v = keys[i]; j = i - 1
                    while (j > 0 && keys[j] + 0 < v + 0) { keys[j + 1] = keys[j]; j-- }
                    keys[j + 1] = v
                }
                for (i = 1; i <= k; i++) {
                    o = substr(keys[i], index(keys[i], "|") + 1)
                    f = t[o, "f"] / n; b = t[o, "b"] / n
                    printf "| %s | %.1f | %.1f | %.1f | %.1f%% |\n", o, f, b, f + b, 100 * (f + b) / total
                }
                printf "| (between ops) | | | %.1f | %.1f%% |\n", (fb - ops) / n, 100 * (fb - ops) / n / total
                printf "| optimizer (clip + AdamW) | | | %.1f | %.1f%% |\n", opt / n, 100 * opt / n / total
                printf "| data wait | | | %.1f | %.1f%% |\n", wait / n, 100 * wait / n / total
            }' "$tmp/profile/trace.json" >"$tmp/profile.md"
        { echo; cat "$tmp/profile.md"; } >>"$tmp/table"
    else
        say "no per-op profile: this trainrun writes no trace.json (train.trace_every)"
    fi
fi

cat "$tmp/table"
if [ -n "$OUT" ]; then
    cp "$tmp/table" "$OUT"
fi

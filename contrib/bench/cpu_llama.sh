#!/usr/bin/env bash
# trainrun's Llama against its GPT and against PyTorch's Llama, on the CPU.
#
#   contrib/bench/cpu_llama.sh                    # needs build/trainrun
#   THREADS=2 OUT=table.md PYTHON=venv/bin/python contrib/bench/cpu_llama.sh
#
# For each shape, in one run and interleaved: trainrun gpt fp32 (the
# reference speed), trainrun llama fp32 and bf16, PyTorch llama fp32 and
# bf16 autocast (transformers' LlamaForCausalLM, sdpa attention), all with
# THREADS threads.  GFLOP/s counts the GEMMs and attention only, the same way
# for every engine and both families:
#   FLOPs per token = 6 * (weights that multiply) + 12 * layers * ctx * dim
# (GPT: 12*dim^2 per block + the tied head; Llama: q, k, v, o, gate, up, down
# + the untied head; embeddings are lookups, norms and biases are not GEMMs),
# so "llama/gpt" compares how fast each family's step runs its arithmetic.
# Each Llama's ffn width is chosen so that its FLOPs per token match the GPT
# of the same width and depth (within 3%): the same work, in other ops.
#
# Environment: THREADS (2), OUT, PYTHON (a Python with torch + transformers;
# none: PyTorch rows skipped), TRAINRUN, WARMUP (3), SMALL_STEPS (20),
# LARGE_STEPS (5).
set -euo pipefail

name=cpu_llama.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
find_python "torch, transformers"
torch_info="not importable: PyTorch rows skipped (pip install torch transformers; set PYTHON=)"
if [ -n "$PYTHON" ]; then
    torch_info=$("$PYTHON" -c 'import torch, transformers; print("torch %s, transformers %s, CPU capability %s" % (torch.__version__, transformers.__version__, torch.backends.cpu.get_cpu_capability()))')
fi
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"

rows=$tmp/rows
: >"$rows"

# ms per step from a run's metrics.jsonl: elapsed at the last step minus at the last warm-up step
ms_per_step() {
    awk -v w="$WARMUP" -v last="$2" '
        /"loss"/ && /"elapsed_s"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
            if (s == w) e0 = e; if (s == last) e1 = e
        }
        END { if (w == 0) e0 = 0; printf "%.1f", 1000 * (e1 - e0) / (last - w) }' "$1"
}

# trainrun FAMILY CONFIG PRECISION STEPS OVERRIDES...
trainrun_row() {
    local fam=$1 cfg=$2 prec=$3 steps=$4
    shift 4
    local dir=$tmp/run-$fam-$cfg-$prec
    say "trainrun $fam $prec, $cfg: $WARMUP + $steps steps"
    if ! "$TRAINRUN" "$here/$fam-bench.lua" "$@" train.steps=$((WARMUP + steps)) \
        train.threads="$THREADS" precision="$prec" run_dir="$dir" >"$tmp/log" 2>&1; then
        cat "$tmp/log" >&2
        printf '%s\t%s\ttrainrun\t%s\tfailed\n' "$cfg" "$fam" "$prec" >>"$rows"
        return
    fi
    printf '%s\t%s\ttrainrun\t%s\t%s\n' "$cfg" "$fam" "$prec" \
        "$(ms_per_step "$dir/metrics.jsonl" $((WARMUP + steps)))" >>"$rows"
}

# torch CONFIG PRECISION STEPS V T L H KV C F B
torch_row() {
    local cfg=$1 prec=$2 steps=$3
    if [ -z "$PYTHON" ]; then
        printf '%s\tllama\tPyTorch\t%s\tskipped\n' "$cfg" "$prec" >>"$rows"; return
    fi
    say "PyTorch llama $prec, $cfg: $WARMUP + $steps steps"
    local flag=
    [ "$prec" = bf16 ] && flag=--bf16
    if ! "$PYTHON" "$here/torch_llama.py" --vocab "$4" --ctx "$5" --layers "$6" --heads "$7" \
        --kv-heads "$8" --dim "$9" --ffn "${10}" --batch "${11}" --warmup "$WARMUP" \
        --steps "$steps" --threads "$THREADS" $flag >"$tmp/torch.out" 2>"$tmp/torch.err"; then
        cat "$tmp/torch.err" >&2
        printf '%s\tllama\tPyTorch\t%s\tfailed\n' "$cfg" "$prec" >>"$rows"; return
    fi
    printf '%s\tllama\tPyTorch\t%s\t%s\n' "$cfg" "$prec" \
        "$(sed -n 's/^RESULT ms_per_step=\([^ ]*\) .*/\1/p' "$tmp/torch.out")" >>"$rows"
}

# name vocab ctx layers heads kv_heads dim ffn batch timed-steps
configs="small 256 128 4 4 2 128 400 32 $SMALL_STEPS
large 256 256 12 12 4 768 2400 8 $LARGE_STEPS"

while read -r cfg V T L H KV C F B steps; do
    shape="model.vocab=$V model.ctx=$T model.layers=$L model.heads=$H model.dim=$C train.batch=$B"
    # shellcheck disable=SC2086
    for prec in fp32 bf16; do
        trainrun_row gpt "$cfg" "$prec" "$steps" $shape
        trainrun_row llama "$cfg" "$prec" "$steps" $shape model.kv_heads="$KV" model.ffn_dim="$F"
        torch_row "$cfg" "$prec" "$steps" "$V" "$T" "$L" "$H" "$KV" "$C" "$F" "$B"
    done
done <<<"$configs"

cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "?")
[ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ] && rev="$rev + local changes"
{
    echo "CPU: $cpu ($(grep -o -m1 'avx512_bf16' /proc/cpuinfo || echo 'no avx512_bf16')), $(nproc) cores online; threads: $THREADS"
    echo "trainrun: $rev; PyTorch: $torch_info"
    echo "Steps: $WARMUP warm-up (untimed), then $SMALL_STEPS timed (small) / $LARGE_STEPS timed (large)"
    echo
    echo "| config | model | engine | precision | ms/step | tokens/s | GFLOP/s | llama/gpt GFLOP/s |"
    echo "|---|---|---|---|---:|---:|---:|---:|"
    awk -F'\t' -v cfgs="$configs" '
        BEGIN {
            n = split(cfgs, lines, "\n")
            for (i = 1; i <= n; i++) {
                split(lines[i], f, " ")
                V = f[2]; T = f[3]; L = f[4]; H = f[5]; KV = f[6]; C = f[7]; F = f[8]
                D = C / H
                gpt = L * 12 * C * C + V * C
                llama = L * (2 * C * C + 2 * C * KV * D + 3 * C * F) + V * C
                flops[f[1] ",gpt"] = 6 * gpt + 12 * L * T * C
                flops[f[1] ",llama"] = 6 * llama + 12 * L * T * C
                tokens[f[1]] = f[9] * T
            }
        }
        $5 !~ /^[0-9.]+$/ { printf "| %s | %s | %s | %s | %s | | | |\n", $1, $2, $3, $4, $5; next }
        {
            tps = tokens[$1] * 1000 / $5
            gf = flops[$1 "," $2] * tps / 1e9
            key = $1 "," $3 "," $4
            if ($2 == "gpt") ref[key] = gf
            ratio = ($2 == "llama" && ref[key] > 0) ? sprintf("%.2f", gf / ref[key]) : ""
            printf "| %s | %s | %s | %s | %.1f | %.0f | %.1f | %s |\n", $1, $2, $3, $4, $5, tps, gf, ratio
        }
        END {
            print ""
            for (i = 1; i <= n; i++) {
                split(lines[i], f, " ")
                printf "%s: vocab %d, ctx %d, %d layers, %d heads (%d kv heads), dim %d, ffn %d, batch %d; MFLOP per token: gpt %.2f, llama %.2f\n",
                    f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], flops[f[1] ",gpt"] / 1e6, flops[f[1] ",llama"] / 1e6
            }
        }' "$rows"
} >"$tmp/table"
cat "$tmp/table"
[ -n "$OUT" ] && cp "$tmp/table" "$OUT"
exit 0

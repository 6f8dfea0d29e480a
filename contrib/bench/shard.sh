#!/usr/bin/env bash
# Sharded data parallel on this machine: peak RSS per rank and the exposed
# communication of procs = 1, 2 and 4 at each shard level, next to what
# `trainrun plan` says each rank needs.
#
#   contrib/bench/shard.sh              # needs build/trainrun
#   PROCS=2 LEVELS=none,gradients contrib/bench/shard.sh
#
# The model is shard-bench.lua (a 27 M-parameter Llama: parameters,
# gradients and AdamW's state are most of a rank's memory).  Every rank
# runs one thread (2 cores: ranks beyond 2 share them, so step times at
# procs=4 measure contention, not scaling).  "training" is rank 0's peak
# RSS before the final checkpoint (the run summary's memory line);
# "with checkpoint" its peak at the end, after the final checkpoint (each
# rank writing its own parts; a trainrun before ABI 2.5, or a checkpoint
# plugin without begin_shared, gathers the whole state on rank 0 to save
# it); "save" is the share of the run the summary counts as checkpointing
# times the run's seconds (the gather of the old path counted as "other",
# so "run", the whole run's seconds, is the fairer comparison); "plan" is `trainrun plan`'s total
# for one device at that world size and level;
# communication is the share of the run the summary counts as waiting for
# collectives (after backward, the parameter all-gather after a sharded
# update, and under "parameters" the nodes' waits for their units'
# gathers), i.e. what is not overlapped with compute.  The recipe's units
# are 2 MiB (parallel.bucket_mb): "parameters" holds a few units at once.
# "gathered" is the bytes the sharded parameters' gathers moved in the last
# step on rank 0 (metrics.jsonl's gathered_bytes; "-" where a level has
# none or the trainrun predates the figure); under PRECISION=bf16 or fp16
# the GEMM weights travel in 16 bits.
#
# Environment: TRAINRUN, PROCS (1,2,4), LEVELS (none,optimizer,gradients,parameters),
# STEPS (6), PRECISION (the recipe's: fp32).
set -euo pipefail
name=shard.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
PROCS=${PROCS:-1,2,4}
LEVELS=${LEVELS:-none,optimizer,gradients,parameters}
STEPS=${STEPS:-6}
PRECISION=${PRECISION:-fp32}
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
recipe=$here/shard-bench.lua

plan_mib() { # PROCS LEVEL: plan's total memory per device in MiB
    "$TRAINRUN" plan "$recipe" cost.hardware=h100-80gb gpus="$1" parallel.shard="$2" \
        precision="$PRECISION" 2>/dev/null |
        awk '/^  total / { v = $2; u = $3 } END {
            if (u == "GiB") v *= 1024; else if (u == "KiB") v /= 1024; printf "%.0f", v }'
}

printf '| ranks | shard | plan per rank | peak RSS training | with checkpoint | save | run | step time | communication | gathered |\n'
printf '|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
IFS=, read -ra procs <<<"$PROCS"
IFS=, read -ra levels <<<"$LEVELS"
for p in "${procs[@]}"; do
    for level in "${levels[@]}"; do
        [ "$p" = 1 ] && [ "$level" != none ] && continue
        dir=$tmp/run-$p-$level
        if ! "$TRAINRUN" "$recipe" procs="$p" parallel.shard="$level" precision="$PRECISION" \
            train.steps="$STEPS" run_dir="$dir" >"$dir.log" 2>"$dir.time"; then
            cat "$dir.log" "$dir.time" >&2
            die "procs=$p shard=$level failed"
        fi
        comm=$(sed -n 's/.*communication \([0-9.]*\)%.*/\1/p' "$dir.time" | tail -1)
        step=$(awk -v n="$STEPS" '/"loss"/ && /"elapsed_s"/ {
                   match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
                   match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
                   if (s == 1) e1 = e; if (s == n) en = e }
                 END { printf "%.2f s", (en - e1) / (n - 1) }' "$dir/metrics.jsonl")
        train=$(sed -n 's/.*memory: peak RSS \([0-9]*\) MiB training, \([0-9]*\) MiB.*/\1/p' "$dir.time")
        final=$(sed -n 's/.*memory: peak RSS \([0-9]*\) MiB training, \([0-9]*\) MiB.*/\2/p' "$dir.time")
        secs=$(sed -n 's/^run .*: [0-9]* steps in \([0-9.]*\) s.*/\1/p' "$dir.time" | tail -1)
        ckpt=$(sed -n 's/.*checkpoint \([0-9.]*\)%.*/\1/p' "$dir.time" | tail -1)
        save=$(awk -v s="${secs:-0}" -v c="${ckpt:-0}" 'BEGIN { printf "%.2f s", s * c / 100 }')
        gathered=$(awk '/"gathered_bytes"/ { match($0, /"gathered_bytes": [0-9]+/)
                       v = substr($0, RSTART + 18, RLENGTH - 18) }
                     END { if (v == "") print "-"; else printf "%.1f MiB", v / 1048576 }' \
                   "$dir/metrics.jsonl")
        printf '| %s | %s | %s MiB | %s MiB | %s MiB | %s | %s s | %s | %s%% | %s |\n' "$p" "$level" \
            "$(plan_mib "$p" "$level")" "${train:-?}" "${final:-?}" "$save" "${secs:-?}" "$step" \
            "${comm:-?}" "$gathered"
    done
done
printf '\none thread per rank, %s steps of batch 4 x 64 tokens, precision %s; %s\n' "$STEPS" \
    "$PRECISION" "$(lscpu | sed -n 's/^Model name: *//p')"

#!/usr/bin/env bash
# Pipeline stages on this machine: the share of the step the stages sit
# idle (the bubble), measured, beside the theory and the schedule
# simulator's prediction from the same step's measured chunk times.
#
#   contrib/bench/pipeline.sh            # needs build/trainrun
#   SCHEDULES=1f1b MICRO=4,8 contrib/bench/pipeline.sh
#
# P = 2 stages (procs=2, one thread each on the 2 cores) of a Llama of 4
# blocks (dim 128, ctx 128; micro-batch 1).  "measured" is the median over
# steps 2..STEPS of metrics.jsonl's pipeline_idle_pct: 1 - (the seconds
# the stages computed) / (stages x the step's forward-backward), so it
# includes the sends and receives and any wait for the other stage;
# "simulated" is pipeline_idle_sim_pct: tr_pipe_simulate played against
# each chunk's mean measured forward and backward time of that step
# (communication free); "theory" is (P-1)/(M+P-1), and (P-1)/(V*M+P-1)
# interleaved (V = 2).  A micro-batch in flight whose activations another
# forward would overwrite has them copied aside and back (host memory):
# those copies count as the stage's compute.
#
# Then P = 4 and 8 predicted two ways: the plan's simulator fed with each
# chunk's FLOPs, and the simulator fed with measured times (2 stages of 2 or
# 4 interleaved chunks measure the chunk times of a 4- or 8-stage cut:
# pipeline_idle_sim_chunks_pct).
#
# Environment: TRAINRUN, SCHEDULES (gpipe,1f1b,interleaved), MICRO (2,4,8,16), MODEL (the
# model overrides), DEEP_MODEL (the 8-block model of the predictions), DEEP_ONLY (set: the
# predictions alone), STEPS (8).
set -euo pipefail
name=pipeline.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
SCHEDULES=${SCHEDULES:-gpipe,1f1b,interleaved}
MICRO=${MICRO:-2,4,8,16}
STEPS=${STEPS:-8}
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
model=${MODEL:-"model.dim=128 model.ffn_dim=384 model.layers=4 model.ctx=128"}

if [ -z "${DEEP_ONLY:-}" ]; then
printf '| schedule | M | measured idle | simulated (measured times) | theory | step time |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
IFS=, read -ra schedules <<<"$SCHEDULES"
IFS=, read -ra micro <<<"$MICRO"
for sch in "${schedules[@]}"; do
    for m in "${micro[@]}"; do
        extra="" v=1
        if [ "$sch" = interleaved ]; then
            extra="parallel.virtual_stages=2"
            v=2
        fi
        dir=$tmp/run-$sch-$m
        # shellcheck disable=SC2086
        if ! "$TRAINRUN" "$root/tests/config/tiny_llama.lua" $model procs=2 parallel.pipeline=2 \
            parallel.schedule="$sch" $extra train.batch="$m" train.micro_batch=1 \
            train.steps="$STEPS" train.log_every=1 train.threads=1 run_dir="$dir" --quiet \
            >"$dir.log" 2>&1; then
            cat "$dir.log" >&2
            die "$sch M=$m failed"
        fi
        col() { # KEY: the median of the key over steps 2..
            python3 - "$dir/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
v = [json.loads(l) for l in open(sys.argv[1]) if sys.argv[2] in l]
print("%.1f%%" % statistics.median(x[sys.argv[2]] for x in v[1:]))
PY
        }
        step=$(python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
v = [json.loads(l) for l in open(sys.argv[1]) if '"elapsed_s"' in l]
print("%.3f s" % ((v[-1]["elapsed_s"] - v[0]["elapsed_s"]) / (len(v) - 1)))
PY
)
        theory=$(awk -v m="$m" -v v="$v" 'BEGIN { printf "%.1f%%", 100 / (v * m + 1) }')
        printf '| %s | %d | %s | %s | %s | %s |\n' "$sch" "$m" "$(col pipeline_idle_pct)" \
            "$(col pipeline_idle_sim_pct)" "$theory" "$step"
    done
done
say "CPU: $(lscpu | sed -n 's/^Model name: *//p'), 2 stages, one thread each"

# more stages than this machine has cores: the plan's simulator, fed with
# the chunks' FLOPs (the run's, above, is fed with measured times)
printf '\n| stages | schedule | M | simulated idle (plan, FLOPs) | theory |\n|---:|---|---:|---:|---:|\n'
for p in 4 8; do
    for sch in "${schedules[@]}"; do
        extra="" v=1
        if [ "$sch" = interleaved ]; then
            extra="parallel.virtual_stages=2"
            v=2
        fi
        m=$((4 * p))
        # shellcheck disable=SC2086
        line=$("$TRAINRUN" plan "$root/tests/config/tiny_llama.lua" model.dim=128 model.ffn_dim=384 \
            model.layers=16 model.ctx=128 parallel.pipeline=$p parallel.schedule="$sch" $extra \
            train.batch=$m train.micro_batch=1 2>/dev/null | grep '^  bubble')
        sim=$(echo "$line" | sed -n 's/.*; \([0-9.]*%\) simulated.*/\1/p')
        theory=$(echo "$line" | sed -n 's/.* \([0-9.]*%\) of the devices.*/\1/p')
        printf '| %d | %s | %d | %s | %s |\n' "$p" "$sch" "$m" "${sim:-?}" "${theory:-?}"
    done
done
say "(a Llama of 16 blocks, dim 128, for the plan; its head and embedding make the cut uneven)"
fi

# more stages than cores, from measured times: 2 stages of V chunks each
# (interleaved) measure the times of 2V chunks of the model, one a stage of a
# pipeline 2V deep; metrics.jsonl's pipeline_idle_sim_chunks_pct is the 1F1B
# simulation of that pipeline (the same micro-batches), beside the plan's
# FLOPs simulation of the same cut and the theory
printf '\n| stages | from | M | simulated idle (measured chunk times) | simulated idle (plan, FLOPs) | theory |\n'
printf '|---:|---|---:|---:|---:|---:|\n'
deep=${DEEP_MODEL:-"model.dim=128 model.ffn_dim=384 model.layers=8 model.ctx=128"}
for p in 4 8; do
    v=$((p / 2))
    for m in 16 32; do
        dir=$tmp/deep-$p-$m
        # shellcheck disable=SC2086
        if ! "$TRAINRUN" "$root/tests/config/tiny_llama.lua" $deep procs=2 parallel.pipeline=2 \
            parallel.schedule=interleaved parallel.virtual_stages=$v train.batch="$m" \
            train.micro_batch=1 train.steps="$STEPS" train.log_every=1 train.threads=1 \
            run_dir="$dir" --quiet >"$dir.log" 2>&1; then
            cat "$dir.log" >&2
            die "2 stages x $v chunks, M=$m failed"
        fi
        measured=$(python3 - "$dir/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [json.loads(l) for l in open(sys.argv[1]) if "pipeline_idle_sim_chunks_pct" in l]
print("%.1f%%" % statistics.median(x["pipeline_idle_sim_chunks_pct"] for x in v[1:]))
PY
)
        # shellcheck disable=SC2086
        line=$("$TRAINRUN" plan "$root/tests/config/tiny_llama.lua" $deep parallel.pipeline=$p \
            parallel.schedule=1f1b train.batch=$m train.micro_batch=1 2>/dev/null | grep '^  bubble')
        sim=$(echo "$line" | sed -n 's/.*; \([0-9.]*%\) simulated.*/\1/p')
        theory=$(echo "$line" | sed -n 's/.* \([0-9.]*%\) of the devices.*/\1/p')
        printf '| %d | 2 stages x %d chunks | %d | %s | %s | %s |\n' "$p" "$v" "$m" "$measured" \
            "${sim:-?}" "${theory:-?}"
    done
done
say "(1F1B; the Llama of $deep, cut into as many chunks as stages)"

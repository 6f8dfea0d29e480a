#!/usr/bin/env bash
# Shard levels inside pipeline stages: 2 stages x 2 replicas (procs = 4) of
# shard-bench.lua's 27 M-parameter Llama, three ways, interleaved over REPS
# rounds:
#   optimizer, tcp      the gradients reduce-scattered among a stage's
#                       replicas, the updated parts all-gathered (comm
#                       plugin ABI 2.7)
#   optimizer, old_tcp  the same level through tcp behind a 2.6 vtable
#                       (tests/plugins/comm_old_tcp.c): the gradients
#                       all-reduced whole a tensor at a time, the parts
#                       shared by all-reduces with zeros
#   gradients, tcp      each piece reduce-scattered after every backward
#                       of its chunk, the parts other replicas own given
#                       back
# and prints the medians: seconds a step (steps 3.. of STEPS), rank 0's
# time in the group collectives of the two sampled steps (the trace:
# train.trace_every), and rank 0's peak resident memory (the run's stage
# line).  Every rank runs one thread: on 2 cores the 4 ranks share them, so
# the step times measure contention as much as the collectives.
#
#   contrib/bench/pipeline-shard.sh    # needs build/trainrun and make check's test plugins
#   REPS=3 STEPS=10 contrib/bench/pipeline-shard.sh
set -euo pipefail
name=pipeline-shard.sh
# shellcheck source=contrib/bench/lib.sh
. "$(dirname "$0")/lib.sh"
REPS=${REPS:-2}
STEPS=${STEPS:-8}
PLUGINS=${PLUGINS:-$root/build/tests/plugins/.libs}
export TR_PLUGIN_BUILD_DIR=${TR_PLUGIN_BUILD_DIR:-$root/build/plugins/.libs}
export OMP_NUM_THREADS=1
[ -f "$PLUGINS/comm_old_tcp.so" ] || die "no $PLUGINS/comm_old_tcp.so (run make check TESTS= in build/)"
say "load average before starting: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
recipe=$here/shard-bench.lua
rows=$tmp/rows
arms="optimizer:tcp optimizer:old_tcp gradients:tcp"
for rep in $(seq 1 "$REPS"); do
    for arm in $arms; do
        level=${arm%%:*} comm=${arm##*:} dir=$tmp/run-$level-$comm-$rep
        if ! "$TRAINRUN" --plugin-path "$PLUGINS" "$recipe" procs=4 parallel.pipeline=2 \
            parallel.shard="$level" comm="$comm" train.steps="$STEPS" \
            train.trace_every=$((STEPS - 1)) run_dir="$dir" >"$dir.log" 2>&1; then
            cat "$dir.log" >&2
            die "$level over $comm failed"
        fi
        python3 - "$dir" "$level" "$comm" >>"$rows" <<'PY'
import json, re, sys
d, level, comm = sys.argv[1:]
steps = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"elapsed_s"' in l]
e = [r["elapsed_s"] for r in steps]
ev = json.load(open(d + "/trace.json"))["traceEvents"]
group = sum(x["dur"] for x in ev if x.get("ph") == "X" and x["name"].startswith("group ")) / 1e3
peak = re.search(r"stage 0 \(replica 0\): \d+ MiB resident after training \(peak (\d+) MiB",
                 open(d + ".log").read())
print("%s\t%s\t%.3f\t%.1f\t%s" % (level, comm, (e[-1] - e[2]) / (len(e) - 3), group,
                                  peak.group(1) if peak else "?"))
PY
    done
done
printf '| shard | comm | s / step | group collectives, 2 sampled steps (rank 0) | peak RSS, stage 0 replica 0 |\n'
printf '|---|---|---:|---:|---:|\n'
for arm in $arms; do
    level=${arm%%:*} comm=${arm##*:}
    col() { awk -F'\t' -v l="$level" -v c="$comm" -v k="$1" '$1 == l && $2 == c { print $k }' "$rows" |
        median "$2"; }
    printf '| %s | %s | %s | %s ms | %s MiB |\n' "$level" "$comm" "$(col 3 %.3f)" "$(col 4 %.1f)" \
        "$(col 5 %.0f)"
done

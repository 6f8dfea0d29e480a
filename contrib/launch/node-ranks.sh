#!/usr/bin/env bash
# Start one node's ranks of a multi-node trainrun job, for engines that run
# one command per node (SkyPilot, a Kubernetes pod per node) instead of one
# per GPU (Slurm's srun, mpirun), which set the ranks themselves.
#
#   node-ranks.sh NODE_RANK NODES RANKS_PER_NODE trainrun RECIPE.lua [key=value ...]
#
# Rank i of this node (0 <= i < RANKS_PER_NODE) runs the command with
#   TRAINRUN_RANK=NODE_RANK*RANKS_PER_NODE+i  TRAINRUN_WORLD_SIZE=NODES*RANKS_PER_NODE
#   TRAINRUN_LOCAL_RANK=i                      TRAINRUN_LOCAL_WORLD_SIZE=RANKS_PER_NODE
# and TRAINRUN_MASTER (rank 0's host:port), which the caller sets.  Each rank
# places itself on the cores nearest its GPU (docs/scale-out.md).
#
# SIGTERM, SIGUSR1 and SIGINT are passed to every rank.  When a rank fails,
# the others get SIGTERM, and SIGKILL STOP_GRACE seconds later (default 180).
# Exit status: 0 when every rank finished, 75 when they stopped for a
# preemption (a checkpoint was saved: rerun the same command to resume), else
# the first failed rank's status.
set -u

usage() {
  echo "usage: node-ranks.sh NODE_RANK NODES RANKS_PER_NODE COMMAND [ARG ...]" >&2
  exit 2
}
is_count() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }

[ $# -ge 4 ] || usage
node_rank=$1 nodes=$2 per_node=$3
shift 3
if ! is_count "$node_rank" || ! is_count "$nodes" || ! is_count "$per_node"; then usage; fi
if [ "$nodes" -lt 1 ] || [ "$per_node" -lt 1 ] || [ "$node_rank" -ge "$nodes" ]; then
  echo "node-ranks.sh: node $node_rank of $nodes nodes with $per_node ranks each does not exist" >&2
  exit 2
fi
if [ -z "${TRAINRUN_MASTER:-}" ] && [ -z "${TRAINRUN_RENDEZVOUS_FILE:-}" ]; then
  echo "node-ranks.sh: set TRAINRUN_MASTER=host:port (the first node) or TRAINRUN_RENDEZVOUS_FILE" >&2
  exit 2
fi
running=()
for ((i = 0; i < per_node; i++)); do
  TRAINRUN_RANK=$((node_rank * per_node + i)) TRAINRUN_WORLD_SIZE=$((nodes * per_node)) \
    TRAINRUN_LOCAL_RANK=$i TRAINRUN_LOCAL_WORLD_SIZE=$per_node "$@" &
  running+=("$!")
done

forward() { [ ${#running[@]} -eq 0 ] || kill "-$1" "${running[@]}" 2>/dev/null; }
trap 'forward TERM' TERM
trap 'forward USR1' USR1
trap 'forward INT' INT

# Poll rather than `wait -n`: bash forgets which job `wait -n` was waiting
# for when a trapped signal interrupts it, while `wait PID` on a rank that
# has ended always returns its status.
result=0 killer=
while [ ${#running[@]} -gt 0 ]; do
  still=() failed=0
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$pid")
      continue
    fi
    code=0
    wait "$pid" || code=$?
    case $code in
      0) ;;
      75) [ "$result" -ne 0 ] || result=75 ;;
      *)
        if [ "$result" -eq 0 ] || [ "$result" -eq 75 ]; then
          result=$code failed=1
          echo "node-ranks.sh: a rank of node $node_rank ended with status $code: stopping the others" >&2
        fi
        ;;
    esac
  done
  running=("${still[@]+"${still[@]}"}")
  if [ "$failed" = 1 ] && [ ${#running[@]} -gt 0 ]; then
    forward TERM
    # SIGKILL after the grace period; when all end sooner, the timer goes
    # away with its sleep
    (
      trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
      sleep "${STOP_GRACE:-180}" &
      sleeper=$!
      wait "$sleeper" && kill -KILL "${running[@]}" 2>/dev/null
    ) &
    killer=$!
  fi
  [ ${#running[@]} -eq 0 ] || sleep 0.2
done
[ -z "$killer" ] || kill "$killer" 2>/dev/null
exit "$result"

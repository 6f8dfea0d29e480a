# Shared by the end-to-end scripts: a scratch directory and small checks.
# make check sets TRAINRUN (the binary), TR_SRCDIR and TR_BUILDDIR.
set -eu
: "${TRAINRUN:?run through make check}"
: "${TR_SRCDIR:?run through make check}"
work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

# the last value of a metric in a metrics.jsonl file
last_metric() {
  grep "\"$2\"" "$1" | tail -n 1 | sed -e "s/.*\"$2\": *\([-0-9.e+]*\).*/\1/"
}

# a < b for decimal numbers
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# wait for pid $1 to end within $2 seconds; else kill it (-9) and return 1
ended_within() {
  n=0
  while kill -0 "$1" 2>/dev/null; do
    n=$((n + 1))
    if [ $n -gt $(($2 * 20)) ]; then
      kill -9 "$1" 2>/dev/null
      return 1
    fi
    sleep 0.05
  done
}

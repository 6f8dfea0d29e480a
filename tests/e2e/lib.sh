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

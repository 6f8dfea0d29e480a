# What the CPU benchmark scripts share (sourced by cpu_gpt.sh, cpu_llama.sh,
# cpu_resnet.sh, cpu_bf16.sh, llmc.sh, lora.sh, sample.sh ...): their defaults, a scratch
# directory removed on exit, messages, a median, and finding the peer's
# Python, and the random models lora.sh and sample.sh share.  Set `name`
# before sourcing, for messages.
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
THREADS=${THREADS:-2}
TRAINRUN=${TRAINRUN:-$root/build/trainrun}
WARMUP=${WARMUP:-3}
SMALL_STEPS=${SMALL_STEPS:-20}
LARGE_STEPS=${LARGE_STEPS:-5}
OUT=${OUT:-}
export OMP_NUM_THREADS=$THREADS

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

say() { echo "$*" >&2; }
# median [FORMAT]: the median of the numbers on standard input (any
# whitespace between them), as awk prints a number or in a printf FORMAT
# ("%.1f"); nothing for none
median() {
    tr ' ' '\n' | sed '/^$/d' | sort -g | awk -v f="${1:-}" '{ v[NR] = $1 }
        END { if (!NR) exit; m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              if (f == "") print m; else printf f "\n", m }'
}
die() { say "$name: $*"; exit 1; }

[ -x "$TRAINRUN" ] || die "no trainrun binary at $TRAINRUN (build it, or set TRAINRUN=)"

# find_python "MODULE, ...": PYTHON as given, or the first of python3 and
# /usr/bin/python3 that imports the modules; empty when none does.
find_python() {
    if [ -z "${PYTHON:-}" ]; then
        for py in python3 /usr/bin/python3; do
            if command -v "$py" >/dev/null && "$py" -c "import $1" 2>/dev/null; then
                PYTHON=$py
                break
            fi
        done
    fi
    if [ -n "${PYTHON:-}" ] && ! "$PYTHON" -c "import $1" 2>/dev/null; then
        PYTHON=
    fi
    PYTHON=${PYTHON:-}
}

# make_models NAME...: the random Llama-shaped model directories NAME (135m,
# 360m: SmolLM's shapes) in $CACHE, made once by torch_lora.py make with
# $PYTHON (lora.sh and sample.sh share them; nothing is downloaded)
make_models() {
    for m in "$@"; do
        if [ ! -f "$CACHE/$m/model.safetensors" ]; then
            say "making the $m model in $CACHE/$m"
            mkdir -p "$CACHE"
            "$PYTHON" "$here/torch_lora.py" make "$CACHE/$m" --config "$m" >/dev/null 2>&1 ||
                die "could not make the $m model"
        fi
    done
}

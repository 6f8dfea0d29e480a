#!/usr/bin/env bash
# Loader throughput of the text data plugin on the King James Bible, with
# 0, 1, 2 and 4 loader workers, against the rate the KJV GPT recipe
# (recipes/kjv-char.lua) consumes tokens.
#
#   contrib/bench/loader.sh [CONSUMED_TOKENS_PER_S] [BUILD_DIR]
#
# CONSUMED_TOKENS_PER_S defaults to 11000, what the recipe trains at on the
# reference machine; measure yours with `trainrun recipes/kjv-char.lua` (the
# "tokens/s" of its summary) and pass it.  BUILD_DIR defaults to build/.
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
consume=${1:-11000}
build=${2:-$src/build}
cd "$build"

make -s contrib/bench/loader_bench plugins/data_text.la
if [ ! -s data/kjv.txt ]; then
    make -s data/kjv.txt # needs bible-kjv: bible -f "Gen1:1-Rev22:21" > data/kjv.txt
fi
export TRAINRUN_PLUGIN_PATH="$build/plugins/.libs"

for tokenizer in byte char; do
    ./contrib/bench/loader_bench --data data/kjv.txt --consume "$consume" \
        --tokenizer "$tokenizer" --seq-len 128 --batch 32 --prefetch 4 --seconds 2
    echo
done

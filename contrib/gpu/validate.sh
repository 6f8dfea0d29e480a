#!/bin/sh
# Validate the CUDA backend on a machine with an NVIDIA GPU (docs/cuda.md):
#
#   1. configure and build (the CUDA backend is built when configure finds
#      nvcc), and check backend_cuda.so opens on this GPU;
#   2. tests/test_backend_ops: every op, forward and backward, against the
#      CPU backend, plus the tiny GPT as a whole (it must PASS here: a SKIP
#      means the GPU was not usable, and fails this script);
#   3. compute-sanitizer memcheck over short training runs on the GPU, of a
#      small GPT, a small Llama (grouped-query attention, RoPE, RMSNorm,
#      SwiGLU) and a small CNN (conv2d on cuDNN, batch norm, pooling);
#   4. throughput of the GPT-2 124M shape (synthetic tokens) under fp32 and
#      bf16: tokens/s and MFU in a markdown table.
#
# Usage: contrib/gpu/validate.sh            (from anywhere in the source tree)
# Environment: BUILD (build directory, default <src>/build-gpu), HARDWARE
# (the hardware-table entry MFU is computed against, default h100-80gb; see
# `trainrun plan`), MICRO_BATCH (default 16), STEPS (benchmark steps, 30),
# JOBS (make -j, default nproc).
set -eu

src=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$src/build-gpu}
hardware=${HARDWARE:-h100-80gb}
micro_batch=${MICRO_BATCH:-16}
steps=${STEPS:-30}
jobs=${JOBS:-$(nproc)}
report=$build/gpu-validate.md

say() { printf '\n=== %s\n' "$*"; }
fail() { printf 'validate.sh: FAILED: %s\n' "$*" >&2; exit 1; }

say "build in $build"
mkdir -p "$build"
cd "$build"
test -f config.status || "$src/configure"
make -j"$jobs"
test -f plugins/.libs/backend_cuda.so ||
    fail "configure did not build the CUDA backend (no nvcc under /usr/local/cuda? use --with-cuda=DIR)"
nvidia-smi -L || true

say "1/3 test_backend_ops: every op against the CPU"
make -j"$jobs" tests/test_backend_ops
status=0
TR_PLUGIN_BUILD_DIR="$build/plugins/.libs" OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} \
    ./tests/test_backend_ops --verbose || status=$?
case $status in
0) ;;
77) fail "test_backend_ops skipped every GPU case: the GPU is not usable (reason above)" ;;
*) fail "test_backend_ops (exit $status)" ;;
esac

say "2/3 compute-sanitizer memcheck on a short training run"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
recipe=$build/gpu-validate-small.lua
cat > "$recipe" <<LUA
-- written by contrib/gpu/validate.sh: a small GPT on synthetic tokens
return {
  model = gpt { vocab = 256, ctx = 64, layers = 2, heads = 4, dim = 128 },
  data = { plugin = "synthetic", kind = "tokens", classes = 256 },
  device = "cuda",
  optimizer = { type = "adamw", lr = 1e-3 },
  train = { steps = 4, batch = 8, micro_batch = 4, log_every = 1, eval_every = 0, eval_batches = 1 },
  checkpoint = { every = 0, keep = 1, async = false },
}
LUA
if test -x "$sanitizer"; then
    "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no \
        ./trainrun "$recipe" run_dir="$build/runs/gpu-validate-small" ||
        fail "compute-sanitizer memcheck reported errors (exit $?)"
    "$sanitizer" --tool memcheck --error-exitcode 99 \
        ./trainrun "$recipe" precision=bf16 run_dir="$build/runs/gpu-validate-small-bf16" ||
        fail "compute-sanitizer memcheck (bf16) reported errors"
    llama=$build/gpu-validate-llama.lua
    sed 's/model = gpt {[^}]*}/model = llama { vocab = 256, ctx = 64, layers = 2, heads = 8, kv_heads = 2, dim = 128, ffn_dim = 352 }/' \
        "$recipe" > "$llama"
    grep -q 'model = llama' "$llama" || fail "could not write $llama"
    "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no \
        ./trainrun "$llama" run_dir="$build/runs/gpu-validate-llama" ||
        fail "compute-sanitizer memcheck (llama) reported errors"
    "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no \
        ./trainrun "$llama" precision=bf16 model.recompute=1 run_dir="$build/runs/gpu-validate-llama-bf16" ||
        fail "compute-sanitizer memcheck (llama, bf16, recompute) reported errors"
    # a small CNN: conv2d on cuDNN, batch norm, pooling
    cnn=$build/gpu-validate-cnn.lua
    sed -e 's/model = gpt {[^}]*}/model = cnn { input = { 16, 16, 3 }, channels = { 16, 32 }, classes = 10 }/' \
        -e 's/kind = "tokens", classes = 256/kind = "features", features = 768, classes = 10/' \
        "$recipe" > "$cnn"
    grep -q 'model = cnn' "$cnn" && grep -q 'features = 768' "$cnn" || fail "could not write $cnn"
    "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no \
        ./trainrun "$cnn" run_dir="$build/runs/gpu-validate-cnn" ||
        fail "compute-sanitizer memcheck (cnn) reported errors"
    "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no \
        ./trainrun "$cnn" precision=bf16 model.recompute=1 run_dir="$build/runs/gpu-validate-cnn-bf16" ||
        fail "compute-sanitizer memcheck (cnn, bf16, recompute) reported errors"
else
    fail "compute-sanitizer not found (it ships with the CUDA toolkit)"
fi

say "3/3 throughput, GPT-2 124M shape, synthetic tokens, micro-batch $micro_batch"
printf '| precision | tokens/s | MFU (vs %s) | steps timed |\n|---|---|---|---|\n' "$hardware" > "$report"
for precision in fp32 bf16; do
    bench=$build/gpu-validate-gpt2-$precision.lua
    cat > "$bench" <<LUA
-- written by contrib/gpu/validate.sh: recipes/gpt2-124m.lua's model on synthetic tokens
return {
  model = gpt { vocab = 50304, ctx = 1024, layers = 12, heads = 12, dim = 768 },
  data = { plugin = "synthetic", kind = "tokens", classes = 50304 },
  device = "cuda",
  precision = "$precision",
  optimizer = { type = "adamw", lr = 6e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, clip = 1.0 },
  train = { steps = $steps, batch = $micro_batch, micro_batch = $micro_batch, log_every = 1,
            eval_every = 0, eval_batches = 1 },
  checkpoint = { every = 0, keep = 1, async = false },
  cost = { hardware = "$hardware", count = 1 },
}
LUA
    run=$build/runs/gpu-validate-gpt2-$precision
    rm -rf "$run"
    ./trainrun "$bench" run_dir="$run" || fail "the $precision benchmark run failed"
    # steady state: from step 10 (after cuBLASLt's first-call setup) to the last
    awk -v tokens_per_step=$((micro_batch * 1024)) -v precision=$precision '
        { step = 0; el = -1; tps = 0; mfu = -1
          n = split($0, kv, ",")
          for (i = 1; i <= n; i++) {
              split(kv[i], p, ":"); key = p[1]; gsub(/[{}" ]/, "", key); val = p[2] + 0
              if (key == "step") step = val; else if (key == "elapsed_s") el = val
              else if (key == "tokens_per_s") tps = val; else if (key == "mfu") mfu = val
          }
          if (el < 0) next  # an evaluation line
          if (step == 10) { s0 = step; e0 = el }
          last = step; elast = el
          if (tps > 0 && mfu > 0) ratio = mfu / tps
        }
        END {
          if (!s0 || last <= s0) { print "| " precision " | (too few steps) | | |"; exit }
          rate = (last - s0) * tokens_per_step / (elast - e0)
          m = ratio > 0 ? sprintf("%.1f%%", 100 * rate * ratio) : "n/a"
          printf "| %s | %.0f | %s | %d-%d |\n", precision, rate, m, s0, last
        }' "$run/metrics.jsonl" >> "$report"
done

say "results ($report)"
cat "$report"

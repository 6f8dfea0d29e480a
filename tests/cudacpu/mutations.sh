#!/bin/sh
# The CUDA-on-CPU harness proves it can fail (docs/cuda.md): ways to break a
# kernel, each applied to a copy of one kernels/cuda file, built into a
# backend_cuda.so with the build's other harness objects, and run through
# test_backend_ops's cases of that kernel (test_nf4's for nf4.cu).  Each must
# fail, and the output must say why.  Bugs the harness itself must report (attention.cu):
#   lanes_exit        lanes with no work return before a warp shuffle
#   no_syncthreads    the barrier after a shared-memory tile load is gone
#   smem_too_small    the launch asks for less dynamic shared memory than used
#   no_func_attribute cudaFuncSetAttribute is not called for > 48 KiB
#   narrow_mask       a shuffle's mask leaves out half the warp
# and wrong arithmetic the op cases must catch:
#   rope_sin_sign     rope turns the wrong way (ops.cu)
#   gqa_head_map      query head h reads key/value head h % KV, not h / (H/KV)
#   gqa_one_head      dk, dv add only the first query head of each group
#   conv_pad_swapped  conv2d hands cuDNN its padding as (w, h) (conv.cu; the fake
#                     cuDNN, tests/cudacpu/cudnn.cpp, refuses the shapes)
#   conv_dx_overwrite backward data with beta 0: dx overwritten, not accumulated
#   conv_any_algo     backward filter takes a non-deterministic algorithm
#   bn_biased_running batch norm's running variance left biased (pool.cu)
#   nf4_fused_scale   NF4's block scale as one fused multiply-add, not a
#                     rounded product and a rounded sum (nf4.cu): a bit off
#                     bitsandbytes' in some blocks
#   nf4_nibbles_swapped  the two codes of a byte dequantised in swapped places
# and missing stream synchronisation, which the harness's queued streams
# (runtime.cpp, "streams: queues") turn into wrong results:
#   upload_no_compute_wait  compute does not wait for the upload's copy stream
#   upload_no_copy_wait     the copy stream does not wait for the compute
#                           queued before it (an earlier zeroing lands last)
#   upload_no_compute_mark  the event the copy stream waits for is not recorded
#   upload_slot_reused      a staging slot is refilled before its DMA ran
#   download_no_sync        download returns before its copy ran
#   sum_squares_no_sync     the host reads the pinned sum before its copy ran
#   count_correct_no_sync   the same for the accuracy counts (step.cu)
#   conv_no_set_stream      cuDNN is left on the legacy default stream, which
#                           the non-blocking compute stream does not join
#   gemm_legacy_stream      cuBLASLt given stream 0 instead of the compute
#                           stream (gemm.cu, through tests/cudacpu/gemm_lt_check)
# and memory given back (backend.cu's discard and commit, ops.cu's convert),
# caught by test_backend_ops's backend_memory cases:
#   commit_takeback_no_zero  a pending chunk taken back keeps its old bytes
#   commit_remap_no_zero     a chunk mapped again keeps the fresh memory's
#                            (the harness fills it with NaN bytes)
#   discard_partial_chunk    the chunk at a discard's start is given back
#                            whole, though only its end was discarded
#   discard_mark_on_legacy   the discard's event on the legacy stream: the
#                            chunks are unmapped while an upload queued
#                            before still writes them (SIGSEGV)
#   convert_canonical_nan    convert's bf16 NaN as the GPU's cvt makes it
#                            (0x7fff), not the CPU's
# and the first three of those and conv_no_set_stream again with every
# operation run when queued (CUDACPU_STREAM_ORDER=immediate, in which the
# wrong order never shows): the harness's stream hazard check (runtime.cpp)
# must name the two streams
#   *_immediate             a kernel, copy or cuDNN call touching what the
#                           other stream writes, with no wait between them
. "$TR_SRCDIR/tests/e2e/lib.sh"
: "${TR_CXX:?run through make check}" "${TR_PERL:?run through make check}"
gen=$TR_BUILDDIR/tests/cudacpu/gen
objects=$(ls "$gen"/.libs/*.o "$TR_BUILDDIR"/tests/cudacpu/.libs/*runtime.o \
  "$TR_BUILDDIR"/kernels/.libs/tests_cudacpu_backend_cuda_la-nf4.o)
# one object a kernels/cuda/*.cu (gemm.cu's is gemm_ref.cu's), the runtime,
# and kernels/nf4.c (NF4 quantisation at load, which nf4.cu calls)
count=$(($(ls "$TR_SRCDIR"/kernels/cuda/*.cu | wc -l) + 2))
[ "$(echo "$objects" | wc -l)" -eq "$count" ] || fail "harness objects not found in $gen/.libs: build first"

# mutate NAME FILE PERL-SUBSTITUTION TEST-FILTER EXPECTED-REGEX [TEST-PROGRAM]
# (FILE: one of kernels/cuda/*.cu, replacing its object among the others;
# TEST-PROGRAM: of tests/, test_backend_ops unless named)
mutate() {
  name=$1 file=$2 program=${6:-test_backend_ops}
  src=$TR_SRCDIR/kernels/cuda/$file
  others=$(echo "$objects" | grep -v -- "-$file\.o\$")
  [ "$(echo "$others" | wc -l)" -eq $((count - 1)) ] || fail "$name: no harness object of $file in $gen/.libs"
  mkdir "$name"
  "$TR_PERL" -0pe "$3" "$src" > "$name/$file"
  cmp -s "$src" "$name/$file" && fail "$name: the mutation does not apply to $src any more"
  "$TR_PERL" "$TR_SRCDIR/tests/cudacpu/cu2cpp.pl" "$name/$file" "$name/$file.cpp"
  "$TR_CXX" -std=c++17 -O1 -fPIC -fvisibility=hidden -I"$TR_SRCDIR/tests/cudacpu/include" \
    -I"$TR_SRCDIR/include" -I"$TR_BUILDDIR" -I"$gen" -DTR_CUDNN_HOME="\"$TR_BUILDDIR/tests/cudacpu/dnn\"" \
    -c "$name/$file.cpp" -o "$name/mutated.o"
  # shellcheck disable=SC2086 # $others is a list of paths without spaces
  "$TR_CXX" -shared -o "$name/backend_cuda.so" "$name/mutated.o" $others -ldl -lpthread
  if CUDACPU_STREAM_ORDER=${mutate_order:-${CUDACPU_STREAM_ORDER:-lazy}} \
       TR_CUDACPU_DIR=$PWD/$name "$TR_BUILDDIR/tests/$program" --filter "$4" \
       > "$name/log" 2>&1; then
    cat "$name/log"
    fail "$name: the broken kernel passed $program"
  fi
  grep -E "$5" "$name/log" > "$name/why" || { cat "$name/log"; fail "$name: not reported as expected ($5)"; }
  echo "caught $name: $(head -n 1 "$name/why" | sed 's/^\[----\] *//')"
}

mutate lanes_exit attention.cu \
  's/\n(    )(sum = warp_sum\(sum\);)/\n$1if (lane >= D) \/\* no dimension left for this lane \*\/\n$1    return;\n$1$2/' \
  'backend_ops/attention_head16_f32' 'exited, but lanes|lane [0-9]+ of its mask has exited'
mutate no_syncthreads attention.cu \
  's/(Vs\[j \* D \+ d\] = load_or_zero\(v_base, at, tk < q_end\);\n        \}\n)        __syncthreads\(\);\n/$1/' \
  'backend_ops/attention_head16_f32' 'forward output.*(on the GPU|differs from the CPU)'
mutate smem_too_small attention.cu \
  's/(forward_smem\(int D\) \{ return .*?) \+ \(size_t\)TILE \* D; \}/$1; }/' \
  'backend_ops/attention_head64_f32' 'past the end of its [0-9]+ bytes of dynamic shared memory'
mutate no_func_attribute attention.cu \
  's/e = cudaFuncSetAttribute\(attention_forward_kernel<T, DMAX>,[^;]*;/e = cudaSuccess;/' \
  'backend_ops/attention_head256_f32' 'cudaFuncSetAttribute.* was not called'
mutate narrow_mask attention.cu \
  's/float pj = __shfl_sync\(0xffffffffu, p, j\);/float pj = __shfl_sync(0x0000ffffu, p, j);/' \
  'backend_ops/attention_head64_f32' 'a mask without its own lane'
mutate rope_sin_sign ops.cu \
  's/out\[at\] = from_f32<T>\(x1 \* cs - x2 \* sn\);/out[at] = from_f32<T>(x1 * cs + x2 * sn);/' \
  'backend_ops/rope_f32' 'rope_f32.*forward output differs from the CPU'
mutate gqa_head_map attention.cu \
  's/(const int bh = blockIdx.y, b = bh \/ NH, h = bh % NH, kvh = )h \/ \(NH \/ KV\);/$1h % KV;/' \
  'backend_ops/attention_gqa_group4_f32' 'group4_f32.*forward output differs from the CPU'
mutate gqa_one_head attention.cu \
  's/for \(int h = kvh \* group; h < \(kvh \+ 1\) \* group; h\+\+\)/for (int h = kvh * group; h < kvh * group + 1; h++)/' \
  'backend_ops/attention_gqa_group2_f32' 'group2_f32.*gradient of (k|v) differs from the CPU'
mutate conv_pad_swapped conv.cu \
  's/a->conv_set\(p->conv, k->PH, k->PW,/a->conv_set(p->conv, k->PW, k->PH,/' \
  'backend_ops/conv2d_strided_asymmetric_f32' 'strided_asymmetric_f32.*forward output'
mutate conv_dx_overwrite conv.cu \
  's/const float one = 1.0f;\n(    if \(a->dx\) \{)/const float one = 1.0f, overwrite = 0.0f;\n$1/; s/p->workspace, &one, p->x, a->dx\)/p->workspace, &overwrite, p->x, a->dx)/' \
  'backend_ops/conv2d_3x3_f32' 'conv2d_3x3_f32.*gradient of x differs from the CPU'
mutate conv_any_algo conv.cu \
  's/filter\[i\]\.determinism == CUDNN_DETERMINISTIC && //' \
  'backend_ops/conv2d_backward_bitwise_deterministic' 'different bits in the gradient of w'
mutate bn_biased_running pool.cu \
  's/double unbiased = N > 1 \? var \* N \/ \(N - 1\) : var;/double unbiased = var;/' \
  'backend_ops/batchnorm_train_f32' 'batchnorm_train_f32.*running differs from the CPU'
mutate nf4_fused_scale nf4.cu \
  's/__fadd_rn\(__fmul_rn\(t\.map\[blob\[l\.qabsmax \+ b\]\], absmax2\), offset\)/fmaf(t.map[blob[l.qabsmax + b]], absmax2, offset)/' \
  'frozen_cuda/store_and_load' 'stored nf4 on cuda: loaded \[[0-9]+\]' test_nf4
mutate nf4_nibbles_swapped nf4.cu \
  's/t\.nf4\[c >> 4\], scale/t.nf4[c \& 15u], scale/; s/t\.nf4\[c \& 15u\], scale\)\);\n    \}/t.nf4[c >> 4], scale));\n    }/' \
  'frozen_cuda/linear_fp32' 'nf4 weight.*against a parameter|differs from the CPU' test_nf4

mutate upload_no_compute_wait backend.cu \
  's/\n    CUDA_NOTE\(c, cudaStreamWaitEvent\(c->compute, c->stage_done\[last\], 0\)\);//' \
  'backend_ops/gelu_f32' 'gelu_f32.*differs from the CPU'
mutate upload_no_copy_wait backend.cu \
  's/\n    CUDA_NOTE\(c, cudaStreamWaitEvent\(c->copy, c->compute_mark, 0\)\);//' \
  'backend_ops/gelu_f32' 'gelu_f32.*forward output differs from the CPU'
mutate upload_no_compute_mark backend.cu \
  's/\n    CUDA_NOTE\(c, cudaEventRecord\(c->compute_mark, c->compute\)\);//' \
  'backend_ops/gelu_f32' 'gelu_f32.*forward output differs from the CPU'
mutate upload_slot_reused backend.cu \
  's/\n        CUDA_NOTE\(c, cudaEventSynchronize\(c->stage_done\[slot\]\)\);[^\n]*//' \
  'backend_ops/gelu_f32' 'gelu_f32.*forward output differs from the CPU'
mutate download_no_sync backend.cu \
  's/(cudaMemcpyDeviceToHost, c->compute\)\);)\n    CUDA_NOTE\(c, cudaStreamSynchronize\(c->compute\)\);/$1/' \
  'backend_ops/gelu_f32' 'gelu_f32.*nan on the GPU'
mutate sum_squares_no_sync step.cu \
  's/(c->sum_partials \+ SUM_BLOCKS, sizeof\(double\),\n\s*cudaMemcpyDeviceToHost, c->compute\)\);)\n    CUDA_NOTE\(c, cudaStreamSynchronize\(c->compute\)\);/$1/' \
  'backend_ops/sum_squares_deterministic_and_non_finite' 'sum of squares -?nan vs CPU'
mutate count_correct_no_sync step.cu \
  's/(cudaMemcpyDeviceToHost, c->compute\)\);)\n    CUDA_NOTE\(c, cudaStreamSynchronize\(c->compute\)\);(\n[^\n]*counts_host)/$1$2/' \
  'backend_ops/count_correct_ties_and_ignored_rows' 'valid rows on the GPU'
# the order that hides them: the hazard check must still see the two
# streams touch the same bytes unordered
mutate_order=immediate
mutate upload_no_compute_wait_immediate backend.cu \
  's/\n    CUDA_NOTE\(c, cudaStreamWaitEvent\(c->compute, c->stage_done\[last\], 0\)\);//' \
  'backend_ops/gelu_f32' 'stream hazard: .* stream [0-9]+ \(non-blocking\).* stream [0-9]+ \(non-blocking\)'
mutate upload_no_copy_wait_immediate backend.cu \
  's/\n    CUDA_NOTE\(c, cudaStreamWaitEvent\(c->copy, c->compute_mark, 0\)\);//' \
  'backend_ops/gelu_f32' 'stream hazard: .* stream [0-9]+ \(non-blocking\).* stream [0-9]+ \(non-blocking\)'
mutate upload_no_compute_mark_immediate backend.cu \
  's/\n    CUDA_NOTE\(c, cudaEventRecord\(c->compute_mark, c->compute\)\);//' \
  'backend_ops/gelu_f32' 'stream hazard: .* stream [0-9]+ \(non-blocking\).* stream [0-9]+ \(non-blocking\)'
mutate_order=

mutate conv_no_set_stream conv.cu \
  's/s = a->set_stream\(d->h, c->compute\);/s = CUDNN_STATUS_SUCCESS;/' \
  'backend_ops/conv2d_3x3_f32' 'conv2d_3x3_f32.*forward output differs from the CPU'
mutate_order=immediate
mutate conv_no_set_stream_immediate conv.cu \
  's/s = a->set_stream\(d->h, c->compute\);/s = CUDNN_STATUS_SUCCESS;/' \
  'backend_ops/conv2d_3x3_f32' 'stream hazard: .*cudnnConvolution.*legacy default stream'
mutate_order=

mutate commit_takeback_no_zero backend.cu \
  's/(v->n_pending--;\n)\s*zero_add\(c, &z, r->base \+ j \* v->chunk, r->base \+ \(j \+ 1\) \* v->chunk\);\n/$1/' \
  'backend_memory/commit_right_after_discard_takes_chunks_back_as_zeros' 'committed right after the discard: byte [0-9]+ .* want 0x00'
mutate commit_remap_no_zero backend.cu \
  's/\n\s*zero_add\(c, &z, at, at \+ v->chunk\);//' \
  'backend_memory/discard_gives_chunks_back_and_commit_makes_them_zeros' 'part of chunk 1 committed: byte [0-9]+ .* is 0xff, want 0x00'
mutate discard_partial_chunk backend.cu \
  's/size_t first = \(\(size_t\)\(lo - r->base\) \+ v->chunk - 1\) \/ v->chunk;/size_t first = (size_t)(lo - r->base) \/ v->chunk;/' \
  'backend_memory/discard_gives_chunks_back_and_commit_makes_them_zeros' 'all committed: byte 0 .* is 0x00, want 0x01'
mutate discard_mark_on_legacy backend.cu \
  's/cudaEventRecord\(e, c->compute\)/cudaEventRecord(e, 0)/' \
  'backend_memory/discard_gives_chunks_back_and_commit_makes_them_zeros' 'discard_gives_chunks_back_and_commit_makes_them_zeros: CRASH'
mutate convert_canonical_nan ops.cu \
  's/return \(uint16_t\)\(\(u >> 16\) \| 0x40u\);/return (uint16_t)0x7fffu;/' \
  'backend_memory/convert_gives_the_cpu_bits' 'convert fp32 -> bf16.* gives 0x7fff on cuda'

# gemm.cu is not in the harness's backend (gemm_ref.cu is): its mutation is
# linked into tests/cudacpu/gemm_lt_check instead
name=gemm_legacy_stream
mkdir "$name"
"$TR_PERL" -0pe 's/LT_WORKSPACE_BYTES,\s*c->compute\);/LT_WORKSPACE_BYTES, 0);/' \
  "$TR_SRCDIR/kernels/cuda/gemm.cu" > "$name/gemm.cu"
cmp -s "$TR_SRCDIR/kernels/cuda/gemm.cu" "$name/gemm.cu" && fail "$name: the mutation does not apply any more"
"$TR_PERL" "$TR_SRCDIR/tests/cudacpu/cu2cpp.pl" "$name/gemm.cu" "$name/gemm.cu.cpp"
"$TR_CXX" -std=c++17 -O1 -I"$TR_SRCDIR/tests/cudacpu/include" -I"$TR_SRCDIR/include" \
  -I"$TR_BUILDDIR" -I"$gen" -DTR_CUDA_HOME="\"$TR_BUILDDIR/tests/cudacpu/lt\"" \
  -c "$name/gemm.cu.cpp" -o "$name/gemm.o"
"$TR_CXX" -rdynamic -o "$name/gemm_lt_check" "$name/gemm.o" \
  "$TR_BUILDDIR/tests/cudacpu/gemm_lt_check-gemm_lt_check.o" \
  "$TR_BUILDDIR/tests/cudacpu/gemm_lt_check-runtime.o" -ldl -lpthread
if "./$name/gemm_lt_check" > "$name/log" 2>&1; then
  cat "$name/log"
  fail "$name: the broken gemm.cu passed gemm_lt_check"
fi
grep -E 'fp32 GEMM .*relative error' "$name/log" > "$name/why" || { cat "$name/log"; fail "$name: not reported as expected"; }
echo "caught $name: $(head -n 1 "$name/why")"
echo "mutations: all 32 caught"

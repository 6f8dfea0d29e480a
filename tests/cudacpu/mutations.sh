#!/bin/sh
# The CUDA-on-CPU harness proves it can fail (docs/cuda.md): five ways to
# break a kernel, each applied to a copy of kernels/cuda/attention.cu, built
# into a backend_cuda.so with the build's other harness objects, and run
# through test_backend_ops's attention cases.  Each must fail, and the output
# must say why:
#   lanes_exit        lanes with no work return before a warp shuffle
#   no_syncthreads    the barrier after a shared-memory tile load is gone
#   smem_too_small    the launch asks for less dynamic shared memory than used
#   no_func_attribute cudaFuncSetAttribute is not called for > 48 KiB
#   narrow_mask       a shuffle's mask leaves out half the warp
. "$TR_SRCDIR/tests/e2e/lib.sh"
: "${TR_CXX:?run through make check}" "${TR_PERL:?run through make check}"
gen=$TR_BUILDDIR/tests/cudacpu/gen
src=$TR_SRCDIR/kernels/cuda/attention.cu
others=$(ls "$gen"/.libs/*.o "$TR_BUILDDIR"/tests/cudacpu/.libs/*runtime.o | grep -v attention)
[ "$(echo "$others" | wc -l)" -eq 4 ] || fail "harness objects not found in $gen/.libs: build first"

# mutate NAME PERL-SUBSTITUTION TEST-FILTER EXPECTED-REGEX
mutate() {
  name=$1
  mkdir "$name"
  "$TR_PERL" -0pe "$2" "$src" > "$name/attention.cu"
  cmp -s "$src" "$name/attention.cu" && fail "$name: the mutation does not apply to $src any more"
  "$TR_PERL" "$TR_SRCDIR/tests/cudacpu/cu2cpp.pl" "$name/attention.cu" "$name/attention.cu.cpp"
  "$TR_CXX" -std=c++17 -O1 -fPIC -fvisibility=hidden -I"$TR_SRCDIR/tests/cudacpu/include" \
    -I"$TR_SRCDIR/include" -I"$TR_BUILDDIR" -I"$gen" -c "$name/attention.cu.cpp" -o "$name/attention.o"
  # shellcheck disable=SC2086 # $others is a list of paths without spaces
  "$TR_CXX" -shared -o "$name/backend_cuda.so" "$name/attention.o" $others -ldl -lpthread
  if TR_CUDACPU_DIR=$PWD/$name "$TR_BUILDDIR/tests/test_backend_ops" --filter "$3" \
       > "$name/log" 2>&1; then
    cat "$name/log"
    fail "$name: the broken kernel passed test_backend_ops"
  fi
  grep -E "$4" "$name/log" > "$name/why" || { cat "$name/log"; fail "$name: not reported as expected ($4)"; }
  echo "caught $name: $(head -n 1 "$name/why" | sed 's/^\[----\] *//')"
}

mutate lanes_exit \
  's/\n(    )(sum = warp_sum\(sum\);)/\n$1if (lane >= D) \/\* no dimension left for this lane \*\/\n$1    return;\n$1$2/' \
  'backend_ops/attention_head16_f32' 'exited, but lanes|lane [0-9]+ of its mask has exited'
mutate no_syncthreads \
  's/(Vs\[j \* D \+ d\] = load_or_zero\(v_base, at, tk < T_\);\n        \}\n)        __syncthreads\(\);\n/$1/' \
  'backend_ops/attention_head16_f32' 'forward output.*(on the GPU|differs from the CPU)'
mutate smem_too_small \
  's/(forward_smem\(int D\) \{ return .*?) \+ \(size_t\)TILE \* D; \}/$1; }/' \
  'backend_ops/attention_head64_f32' 'past the end of its [0-9]+ bytes of dynamic shared memory'
mutate no_func_attribute \
  's/e = cudaFuncSetAttribute\(attention_forward_kernel<T, DMAX>,[^;]*;/e = cudaSuccess;/' \
  'backend_ops/attention_head256_f32' 'cudaFuncSetAttribute.* was not called'
mutate narrow_mask \
  's/float pj = __shfl_sync\(0xffffffffu, p, j\);/float pj = __shfl_sync(0x0000ffffu, p, j);/' \
  'backend_ops/attention_head64_f32' 'a mask without its own lane'
echo "mutations: all 5 caught"

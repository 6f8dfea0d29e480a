#!/bin/sh
# The sanitizer job (docs/testing.md): the tree configured and built again
# with AddressSanitizer and UndefinedBehaviorSanitizer in sanitizers/ of the
# build tree, then its unit tests (the fuzzer among them) and the end-to-end
# tests that feed trainrun bad input, run there.  Any sanitizer report, in any
# process of any test, fails this test, even where the test itself only
# looked at an exit code or a message: reports go to files (log_path), and
# the job fails when one exists.
#
# TR_SANITIZERS=0 skips the job (e.g. for a quick make check); the build is
# reused by the next run (make only rebuilds what changed).
. "$(dirname "$0")/lib.sh"
: "${TR_BUILDDIR:?run through make check}"
test "${TR_SANITIZERS:-1}" != 0 || skip "TR_SANITIZERS=0"
# the nested make check must not start this job again
test -z "${TR_IN_SANITIZER_JOB:-}" || skip "already inside the sanitizer job"
export TR_IN_SANITIZER_JOB=1

# a make of its own: not the jobserver, nor the TESTS=..., of the make
# check that runs this script
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES
cc=${CC:-cc}
echo 'int main(void) { return 0; }' > probe.c
$cc -fsanitize=address,undefined probe.c -o probe 2>/dev/null && ./probe ||
  skip "$cc cannot build and run programs with -fsanitize=address,undefined"

san_flags="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
dir="$TR_BUILDDIR/sanitizers"
mkdir -p "$dir"
cd "$dir"
# configure once; later runs rebuild incrementally
if ! test -f Makefile || ! grep -q -e "-fsanitize=address,undefined" Makefile; then
  "$TR_SRCDIR/configure" -q --without-cuda --disable-native \
    CFLAGS="$san_flags" LDFLAGS="-fsanitize=address,undefined" > configure.log 2>&1 ||
    { cat configure.log; fail "configure with sanitizers (see $dir/config.log)"; }
fi
jobs=$(nproc 2> /dev/null || echo 2)
make -j"$jobs" > build.log 2>&1 || { tail -n 40 build.log; fail "build with sanitizers"; }

# The tests: every unit test program (tests/fuzz included), and the e2e
# tests that give trainrun bad recipes, data and checkpoints (and Hugging Face
# directories: hf.sh; prompts past the vocabulary: sample.sh; bad JSONL records,
# text that is not UTF-8 and encoding threads: prepare-tokenizer.sh; prompts a
# tokenizer cannot encode, tokenizer files beside a run: sample-tokenizer.sh; the key/value
# cache's views of rows, to the end of each context and past it: sample-cache.sh; and one short
# case of sharded parameters over 2 and 3 ranks, whose gather schedule indexes units
# and pages by hand: shard-gather.sh).  The others
# (training runs to a loss, MPI, S3) are slow under ASan and add no input.
# limits.sh and recipe-limits.sh cap the address space (ulimit -v), which
# leaves ASan no room for its shadow memory; they can join once they skip
# that cap when TR_IN_SANITIZER_JOB is set.
units=$(printf 'print-units:\n\t@echo $(check_PROGRAMS)\n' | make -s -f Makefile -f - print-units)
e2e=
for t in cli.sh checkpoints.sh checkpoint-trust.sh rundir.sh hf.sh sample.sh prepare-tokenizer.sh \
    sample-tokenizer.sh sample-cache.sh fifo.sh shard-gather.sh; do
  test -f "$TR_SRCDIR/tests/e2e/$t" && e2e="$e2e tests/e2e/$t"
done

# abort_on_error makes every report fatal to its process, so no test can
# continue past one.  ASan's reports also go to files under reports/
# (log_path); UBSan's, in the combined runtime, go to stderr only, so the
# tests' logs are searched for them too.
# detect_leaks=0: a leak on the way out of a command-line run loses no data
# and is no memory error; the reports would come mostly from libraries
# (libcurl's global state, plugins unloaded with their allocations) and from
# the tests' own fixtures.  TR_SANITIZER_LEAKS=1 turns leak checking on.
# LuaJIT needs nothing here: it allocates through its own mmap-based
# allocator, which ASan does not instrument.
reports="$dir/reports"
rm -rf "$reports"
mkdir -p "$reports"
leaks=0
test "${TR_SANITIZER_LEAKS:-0}" = 0 || leaks=1
# verify_asan_link_order=0: tests preload shims (tests/shims/enospc.so, a
# full disk) into trainrun, ahead of the ASan runtime the binary links.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=$leaks:check_initialization_order=1:strict_init_order=1:verify_asan_link_order=0:log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$reports/ubsan"
# Criterion runs each test in a child process; let it not ask for more
# threads than the machine has.
export CRITERION_JOBS="$jobs"

start=$(date +%s)
status=0
make -j"$jobs" check TESTS="$units$e2e" > check.log 2>&1 || status=$?
took=$(( $(date +%s) - start ))
grep -E "^(PASS|FAIL|XFAIL|XPASS|SKIP|ERROR):" check.log || true
grep -E "^fuzz: [0-9]+ mutated cases" tests/fuzz.log 2> /dev/null || true
echo "sanitizer job: $(echo $units$e2e | wc -w) tests in ${took} s (build in $dir)"

found=$(find "$reports" -type f | head -n 20)
found="$found $(grep -l -E "runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer" \
  tests/*.log tests/e2e/*.log 2> /dev/null | head -n 20)"
found=$(echo $found)
if test -n "$found"; then
  for f in $found; do
    echo "=== $f"
    head -n 60 "$f"
  done
  fail "sanitizer reports (above; all of them in $reports)"
fi
if test "$status" != 0; then
  for log in $(grep -l -E "^(FAIL|ERROR)" tests/*.log tests/e2e/*.log 2> /dev/null); do
    echo "=== $log"
    tail -n 40 "$log"
  done
  fail "tests failed under the sanitizers (logs in $dir/tests)"
fi

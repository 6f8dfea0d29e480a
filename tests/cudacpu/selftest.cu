/*
 * The harness on small kernels of its own: warp-synchronous code that is
 * correct gives a GPU's results (shuffles of every kind and width, ballots,
 * two half-warps shuffling with their own masks at once, a block reduction),
 * and each kind of mistake it reports is reported, with the words a user
 * would search for.  Then the streams: work runs when a synchronisation
 * needs it and not before, events order two streams (and a missing wait
 * shows), blocking and non-blocking streams against a blocking cudaMemcpy,
 * when copies read their sources, and the reverse order; then the stream
 * hazard check, which reports two streams touching the same bytes with
 * nothing ordering them, in any order.  The kernels of kernels/cuda are checked by
 * tests/test_backend_ops and tests/cudacpu/mutations.sh; this is the
 * harness's own regression test.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- correct kernels ------------------------------------------------------ */

__global__ void shuffles_kernel(int *out)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int *o = out + (size_t)w * 32 * 8 + lane * 8;
    o[0] = __shfl_sync(0xffffffffu, lane * 10, 31 - lane);
    o[1] = __shfl_xor_sync(0xffffffffu, lane, 5);
    o[2] = __shfl_down_sync(0xffffffffu, lane, 3);
    o[3] = __shfl_up_sync(0xffffffffu, lane, 2, 8); /* within segments of 8 */
    o[4] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[5] = __all_sync(0xffffffffu, lane < 32) + 2 * __any_sync(0xffffffffu, lane == 7);
    /* the two half-warps shuffle with their own masks, interleaved */
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    o[6] = __shfl_sync(half, lane + 100, (lane & 16) + 15 - (lane & 15));
    double d = __shfl_sync(0xffffffffu, 0.5 * lane, 0); /* 8-byte values */
    o[7] = (int)(d * 2);
}

__global__ void block_sum_kernel(float *out, const float *in, int n)
{
    __shared__ float partial[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        v += in[i];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0)
            out[blockIdx.x] = v;
    }
}

/* ---- broken kernels ---------------------------------------------------------- */

__global__ void deadlock_kernel(float *out)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x == 0)
        __syncthreads(); /* thread 0 waits here, its warp below for it */
    else
        v = __shfl_sync(0xffffffffu, v, 0);
    out[threadIdx.x] = v;
}

__global__ void read_outside_mask_kernel(float *out)
{
    int lane = threadIdx.x & 31;
    if (lane < 16)
        out[lane] = __shfl_sync(0x0000ffffu, (float)lane, 20); /* lane 20 is not in the mask */
}

__global__ void disagree_kernel(float *out)
{
    int lane = threadIdx.x & 31;
    if (lane < 16)
        out[lane] = __shfl_sync(0xffffffffu, 1.0f, 0);
    else
        out[lane] = (float)__ballot_sync(0xffffffffu, 1);
}

__global__ void missing_lanes_kernel(float *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1); /* 16-thread block */
}

__global__ void shared_read_before_write_kernel(float *out)
{
    __shared__ float tile[64];
    if (threadIdx.x < 32)
        tile[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x]; /* threads 32..63 read what nobody wrote */
}

__global__ void dynamic_shared_kernel(float *out, int n)
{
    extern __shared__ float buf[];
    buf[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buf[(threadIdx.x + 1) % n];
}

__global__ void empty_kernel(void) {}

/* ---- kernels for the stream checks ----------------------------------------------- */

__global__ void fill_kernel(float *x, float v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = v;
}

__global__ void add_one_kernel(float *y, const float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = x[i] + 1.0f;
}

/* ---- running them, with stderr captured ----------------------------------------- */

static char report[8192];

/* runs f with stderr going to report[] */
template <typename F> static cudaError_t captured(F f)
{
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 2);
    f();
    /* a refused launch fails when launched, a kernel when its stream runs */
    cudaError_t sync = cudaDeviceSynchronize();
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = sync;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(report, 1, sizeof report - 1, tmp);
    report[n] = 0;
    fclose(tmp);
    return e;
}

static void expect_report(cudaError_t e, cudaError_t want, const char *words, const char *what)
{
    printf("%s\n  reported: %s", what, report[0] ? report : "nothing\n");
    CHECK(e == want, "%s: error %s, expected %s", what, cudaGetErrorName(e), cudaGetErrorName(want));
    CHECK(strstr(report, words) != NULL, "%s: the report does not say \"%s\"", what, words);
    cudaDeviceReset();
}

/* ---- streams are queues ---------------------------------------------------------- */

enum { SN = 64 };

static float *device_buffer(void)
{
    float *p = NULL;
    cudaMalloc((void **)&p, SN * sizeof(float)); /* NaN bytes */
    return p;
}

/* the first element as the host reads it from pinned memory (NaN as -1) */
static float first(const float *h) { return h[0] == h[0] ? h[0] : -1.0f; }

/* a device value as a blocking cudaMemcpy reads it (stream 0) */
static float read_back(const float *d)
{
    float v;
    cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost);
    return v == v ? v : -1.0f;
}

static void stream_checks(void)
{
    /* these checks race on purpose, to see what each order runs first */
    bool was = cudacpu::set_hazard_check(false);
    cudaStream_t a, b, blocking_stream;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaStreamCreate(&blocking_stream);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    float *x = device_buffer(), *y = device_buffer(), *h = NULL;
    cudaHostAlloc((void **)&h, SN * sizeof(float), cudaHostAllocPortable);

    printf("a stream's work runs when it is synchronised, not before\n");
    fill_kernel<<<1, SN, 0, a>>>(x, 1.0f, SN);
    cudaMemcpyAsync(h, x, SN * sizeof(float), cudaMemcpyDeviceToHost, a);
    /* the harness's device memory is host memory: look without a copy */
    CHECK(x[0] != x[0], "the kernel ran when launched: x[0] = %g", (double)x[0]);
    CHECK(first(h) == -1.0f, "pinned memory holds %g before the copy ran (NaN expected)",
          (double)first(h));
    CHECK(cudaStreamSynchronize(a) == cudaSuccess, "cudaStreamSynchronize failed");
    CHECK(first(h) == 1.0f && h[SN - 1] == 1.0f, "after cudaStreamSynchronize: %g", (double)first(h));

    printf("cudaStreamWaitEvent orders two streams; without it the consumer runs first\n");
    fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    add_one_kernel<<<1, SN, 0, b>>>(y, x, SN);
    cudaMemcpyAsync(h, y, SN * sizeof(float), cudaMemcpyDeviceToHost, b);
    cudaStreamSynchronize(b);
    CHECK(first(h) == 3.0f, "with the wait, b read x = %g (2 expected)", (double)first(h) - 1);
    fill_kernel<<<1, SN, 0, a>>>(x, 4.0f, SN);
    add_one_kernel<<<1, SN, 0, b>>>(y, x, SN); /* no wait */
    cudaMemcpyAsync(h, y, SN * sizeof(float), cudaMemcpyDeviceToHost, b);
    cudaStreamSynchronize(b);
    CHECK(first(h) == 3.0f, "without the wait, b read x = %g: a's fill ran first", (double)first(h) - 1);
    cudaStreamSynchronize(a);

    printf("a wait takes the event's record at the time of the wait\n");
    fill_kernel<<<1, SN, 0, a>>>(x, 5.0f, SN);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    fill_kernel<<<1, SN, 0, a>>>(x, 6.0f, SN);
    cudaEventRecord(e, a); /* re-recorded after the wait: b does not wait for it */
    add_one_kernel<<<1, SN, 0, b>>>(y, x, SN);
    cudaStreamSynchronize(b);
    CHECK(read_back(y) == 6.0f, "b read x = %g, not the 5 of the record it waited for",
          (double)read_back(y) - 1);
    CHECK(cudaEventQuery(e) == cudaSuccess, "cudaEventQuery failed");
    CHECK(read_back(x) == 6.0f, "cudaEventQuery did not run the work before the record: %g",
          (double)read_back(x));

    printf("a blocking cudaMemcpy synchronises the legacy stream and the blocking streams, not "
           "the non-blocking ones\n");
    fill_kernel<<<1, SN, 0, a>>>(x, 7.0f, SN);
    CHECK(read_back(x) == 6.0f, "cudaMemcpy waited for a non-blocking stream: x = %g",
          (double)read_back(x));
    cudaStreamSynchronize(a);
    CHECK(read_back(x) == 7.0f, "after cudaStreamSynchronize: x = %g", (double)read_back(x));
    fill_kernel<<<1, SN, 0, blocking_stream>>>(x, 8.0f, SN);
    CHECK(read_back(x) == 8.0f, "cudaMemcpy did not wait for a blocking stream: x = %g",
          (double)read_back(x));
    fill_kernel<<<1, SN>>>(x, 9.0f, SN); /* stream 0, then a blocking stream reads */
    add_one_kernel<<<1, SN, 0, blocking_stream>>>(y, x, SN);
    cudaStreamSynchronize(blocking_stream);
    CHECK(y[0] == 10.0f, "a blocking stream did not wait for stream 0: y = %g", (double)y[0]);

    printf("cudaMemcpyAsync reads its source when it runs; cudaMemcpy from pageable memory "
           "stages it at once\n");
    for (int i = 0; i < SN; i++)
        h[i] = 11.0f;
    cudaMemcpyAsync(x, h, SN * sizeof(float), cudaMemcpyHostToDevice, a);
    h[0] = 12.0f; /* the host writes the source before the copy ran: a race */
    cudaStreamSynchronize(a);
    CHECK(read_back(x) == 12.0f, "the copy read its source when queued: %g", (double)read_back(x));
    float pageable[SN];
    for (int i = 0; i < SN; i++)
        pageable[i] = 13.0f;
    cudaMemcpy(x, pageable, sizeof pageable, cudaMemcpyHostToDevice);
    pageable[0] = 14.0f; /* legal: the source was staged */
    CHECK(read_back(x) == 13.0f, "cudaMemcpy did not stage its pageable source: %g",
          (double)read_back(x));

    printf("cudaFree and cudaDeviceSynchronize run every queue\n");
    fill_kernel<<<1, SN, 0, b>>>(x, 15.0f, SN);
    float *scratch = device_buffer();
    cudaFree(scratch);
    CHECK(x[0] == 15.0f, "cudaFree did not synchronise: x = %g", (double)x[0]);
    fill_kernel<<<1, SN, 0, a>>>(x, 16.0f, SN);
    cudaDeviceSynchronize();
    CHECK(x[0] == 16.0f, "cudaDeviceSynchronize did not run stream a: x = %g", (double)x[0]);

    printf("a kernel that fails reports it at the synchronisation\n");
    cudaError_t launched = captured([&] {
        deadlock_kernel<<<1, 64, 0, a>>>(x);
        CHECK(cudaGetLastError() == cudaSuccess, "the launch itself failed");
    });
    CHECK(launched == cudaErrorLaunchFailure, "the synchronisation said %s",
          cudaGetErrorName(launched));
    CHECK(strstr(report, "deadlock") != NULL, "no report of the deadlock");
    cudaDeviceReset();

    printf("CUDACPU_STREAM_ORDER=reverse runs the newest stream first: a producer that does not "
           "wait for its consumer shows\n");
    for (int order = 0; order < 2; order++) {
        cudacpu::set_stream_order(order ? "reverse" : "lazy");
        fill_kernel<<<1, SN, 0, a>>>(x, 17.0f, SN);
        cudaStreamSynchronize(a);
        add_one_kernel<<<1, SN, 0, a>>>(y, x, SN); /* the consumer of x = 17 */
        fill_kernel<<<1, SN, 0, b>>>(x, 20.0f, SN); /* overwrites x without waiting */
        cudaStreamSynchronize(a);
        float got = read_back(y);
        if (order)
            CHECK(got == 21.0f, "reverse: the consumer read x = %g, not the producer's 20",
                  (double)got - 1);
        else
            CHECK(got == 18.0f, "lazy: the consumer read x = %g, not 17", (double)got - 1);
        cudaDeviceSynchronize();
    }
    cudacpu::set_stream_order("lazy");

    cudaFreeHost(h);
    cudaFree(x);
    cudaFree(y);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaStreamDestroy(blocking_stream);
    cudacpu::set_hazard_check(was);
}

/* ---- stream hazards ---------------------------------------------------------------- */

/* runs f with the check on, expects no report and no error */
template <typename F> static void expect_no_hazard(F f, const char *what)
{
    cudaError_t e = captured(f);
    printf("%s\n  reported: %s", what, report[0] ? report : "nothing\n");
    CHECK(e == cudaSuccess && !report[0], "%s: %s", what, cudaGetErrorName(e));
    cudaDeviceReset();
}

static void hazard_checks(void)
{
    cudaStream_t a, b, blocking_stream;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaStreamCreate(&blocking_stream);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    float *x = device_buffer(), *y = device_buffer(), *z = device_buffer(), *h = NULL;
    cudaHostAlloc((void **)&h, SN * sizeof(float), cudaHostAllocPortable);
    for (int i = 0; i < SN; i++)
        h[i] = 1.0f;

    cudaError_t err = captured([&] {
        fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
        add_one_kernel<<<1, SN, 0, b>>>(y, x, SN); /* no wait */
    });
    expect_report(err, cudaErrorLaunchFailure, "stream hazard: kernel add_one_kernel",
                  "a kernel reads what another stream's kernel writes, without a wait");
    CHECK(strstr(report, "reads") && strstr(report, "kernel fill_kernel") &&
              strstr(report, "(non-blocking)") && strstr(report, "wrote with nothing ordering"),
          "the report does not name both kernels, their streams and what they do");

    expect_no_hazard([&] {
        fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
        cudaEventRecord(e, a);
        cudaStreamWaitEvent(b, e, 0);
        add_one_kernel<<<1, SN, 0, b>>>(y, x, SN);
    }, "the same with cudaStreamWaitEvent between them");
    CHECK(read_back(y) == 3.0f, "after the wait, y = %g", (double)read_back(y));

    expect_no_hazard([&] {
        fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
        cudaStreamSynchronize(a);
        add_one_kernel<<<1, SN, 0, b>>>(y, x, SN);
        cudaEventRecord(e, a); /* a stale wait: nothing queued on a since */
        fill_kernel<<<1, SN, 0, b>>>(z, 0.0f, SN);
    }, "the same with the host synchronising the producer first");

    expect_no_hazard([&] {
        fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
        cudaStreamSynchronize(a);
        add_one_kernel<<<1, SN, 0, a>>>(y, x, SN);
        add_one_kernel<<<1, SN, 0, b>>>(z, x, SN);
    }, "two streams reading the same bytes");

    err = captured([&] {
        cudaMemcpyAsync(x, h, SN * sizeof(float), cudaMemcpyHostToDevice, b);
        add_one_kernel<<<1, SN, 0, a>>>(y, x, SN);
    });
    expect_report(err, cudaErrorLaunchFailure, "stream hazard",
                  "a kernel reads the destination of another stream's copy, without a wait");
    CHECK(strstr(report, "a copy of 256 bytes") && strstr(report, "kernel add_one_kernel"),
          "the report does not name the copy and the kernel");

    err = captured([&] {
        add_one_kernel<<<1, SN, 0, a>>>(y, x, SN);
        cudaMemcpyAsync(x, h, SN * sizeof(float), cudaMemcpyHostToDevice, b);
    });
    expect_report(err, cudaErrorLaunchFailure, "a copy of 256 bytes",
                  "a copy overwrites what another stream's kernel still reads");
    CHECK(strstr(report, "writes") && strstr(report, "read with nothing ordering"),
          "the report does not say the copy writes what the kernel read");

    err = captured([&] {
        cudaMemsetAsync(x, 0, SN * sizeof(float), a);
        cudaMemcpyAsync(x + 8, h, 8 * sizeof(float), cudaMemcpyHostToDevice, b);
    });
    expect_report(err, cudaErrorLaunchFailure, "a memset of 256 bytes",
                  "a copy into part of what another stream sets");

    expect_no_hazard([&] {
        fill_kernel<<<1, SN>>>(x, 2.0f, SN); /* stream 0 */
        add_one_kernel<<<1, SN, 0, blocking_stream>>>(y, x, SN);
        fill_kernel<<<1, SN>>>(x, 4.0f, SN);
    }, "the legacy stream and a blocking stream join each other");

    err = captured([&] {
        fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
        read_back(x); /* a blocking cudaMemcpy does not wait for a non-blocking stream */
    });
    expect_report(err, cudaErrorLaunchFailure, "(the legacy default stream)",
                  "a blocking cudaMemcpy reads what a non-blocking stream writes");

    cudacpu::set_stream_order("immediate");
    err = captured([&] {
        fill_kernel<<<1, SN, 0, a>>>(x, 2.0f, SN);
        add_one_kernel<<<1, SN, 0, b>>>(y, x, SN);
    });
    expect_report(err, cudaErrorLaunchFailure, "stream hazard",
                  "CUDACPU_STREAM_ORDER=immediate: the missing wait is still reported");
    cudacpu::set_stream_order("lazy");

    cudaFreeHost(h);
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaStreamDestroy(blocking_stream);
}

/* ---- a copy's direction against its pointers ---------------------------------------- */

/* On a GPU a host pointer where the call's direction says device memory
 * (or the reverse) is undefined behaviour; here all memory is the host's,
 * so the harness refuses such a call, naming it (runtime.cpp, misdirected). */
static void direction_checks(void)
{
    printf("a copy whose direction does not match its pointers is refused\n");
    float *d = device_buffer(), *h = NULL, pageable[SN] = {0};
    cudaHostAlloc((void **)&h, SN * sizeof(float), 0);
    cudaError_t e = cudaSuccess;
    captured([&] { e = cudaMemcpy(pageable, h, sizeof pageable, cudaMemcpyDeviceToHost); });
    CHECK(e == cudaErrorInvalidValue, "device to host from pinned memory: %s", cudaGetErrorName(e));
    CHECK(strstr(report, "is pinned host memory where the call's direction says device memory"),
          "device to host from pinned memory: the report says \"%s\"", report);
    captured([&] { e = cudaMemcpyAsync(d, d + 1, 4 * sizeof(float), cudaMemcpyHostToDevice, 0); });
    CHECK(e == cudaErrorInvalidValue, "host to device from device memory: %s", cudaGetErrorName(e));
    CHECK(strstr(report, "is device memory where the call's direction says host memory"),
          "host to device from device memory: the report says \"%s\"", report);
    captured([&] { e = cudaMemsetAsync(pageable, 0, sizeof pageable, 0); });
    CHECK(e == cudaErrorInvalidValue, "a memset of pageable memory: %s", cudaGetErrorName(e));
    CHECK(strstr(report, "is pageable host memory"), "a memset of pageable memory: \"%s\"", report);
    /* what a GPU takes: cudaMemcpyDefault (unified addressing), pinned memory set */
    CHECK(cudaMemcpy(h, d, SN * sizeof(float), cudaMemcpyDefault) == cudaSuccess,
          "cudaMemcpyDefault was refused");
    CHECK(cudaMemset(h, 0, SN * sizeof(float)) == cudaSuccess,
          "a memset of pinned memory was refused");
    cudaDeviceReset();
    cudaFreeHost(h);
    cudaFree(d);
}

int main(void)
{
    direction_checks(); /* first: the harness prints a bounded number of reports */
    float *f = NULL;
    int *ints = NULL;
    cudaMalloc((void **)&f, 4096 * sizeof(float));
    cudaMalloc((void **)&ints, 64 * 8 * sizeof(int));

    printf("shuffles, ballots and votes give a GPU's results\n");
    shuffles_kernel<<<1, 64>>>(ints);
    CHECK(cudaGetLastError() == cudaSuccess, "shuffles_kernel failed");
    static int shuffled[64 * 8];
    cudaMemcpy(shuffled, ints, sizeof shuffled, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) {
        int lane = t & 31, *o = shuffled + t * 8;
        CHECK(o[0] == (31 - lane) * 10, "thread %d: __shfl_sync gave %d", t, o[0]);
        CHECK(o[1] == (lane ^ 5), "thread %d: __shfl_xor_sync gave %d", t, o[1]);
        CHECK(o[2] == (lane + 3 < 32 ? lane + 3 : lane), "thread %d: __shfl_down_sync gave %d", t, o[2]);
        CHECK(o[3] == (lane % 8 >= 2 ? lane - 2 : lane), "thread %d: __shfl_up_sync gave %d", t, o[3]);
        CHECK((unsigned)o[4] == 0x49249249u, "thread %d: __ballot_sync gave 0x%08x", t, (unsigned)o[4]);
        CHECK(o[5] == 3, "thread %d: __all_sync + 2 __any_sync gave %d", t, o[5]);
        CHECK(o[6] == (lane & 16) + 15 - (lane & 15) + 100, "thread %d: half-warp shuffle gave %d", t, o[6]);
        CHECK(o[7] == 0, "thread %d: double shuffle gave %d", t, o[7]);
    }

    printf("a block reduction over 256 threads, 3 blocks\n");
    float in[1000];
    double want = 0;
    for (int i = 0; i < 1000; i++) {
        in[i] = (float)(i % 17) - 8.0f;
        want += in[i];
    }
    cudaMemcpy(f, in, sizeof in, cudaMemcpyHostToDevice);
    block_sum_kernel<<<3, 256>>>(f + 2048, f, 1000);
    float sums[3];
    cudaMemcpy(sums, f + 2048, sizeof sums, cudaMemcpyDeviceToHost);
    for (int b = 0; b < 3; b++)
        CHECK(sums[b] == (float)want, "block %d: sum %g, expected %g", b, (double)sums[b], want);

    printf("dynamic shared memory within the launch's size\n");
    dynamic_shared_kernel<<<1, 128, 128 * sizeof(float)>>>(f, 128);
    CHECK(cudaGetLastError() == cudaSuccess, "dynamic_shared_kernel failed");

    cudaError_t e;
    e = captured([&] { deadlock_kernel<<<1, 64>>>(f); });
    expect_report(e, cudaErrorLaunchFailure, "deadlock: lanes 0xfffffffe of warp 0 wait in __shfl_sync",
                  "a warp waiting for a lane held at __syncthreads is a deadlock");
    e = captured([&] { read_outside_mask_kernel<<<1, 32>>>(f); });
    expect_report(e, cudaErrorLaunchFailure, "reads lane 20 in __shfl_sync(0x0000ffff)",
                  "a shuffle reading a lane outside its mask");
    e = captured([&] { disagree_kernel<<<1, 32>>>(f); });
    expect_report(e, cudaErrorLaunchFailure, "lanes disagree",
                  "lanes calling different warp operations with one mask");
    e = captured([&] { missing_lanes_kernel<<<1, 16>>>(f); });
    expect_report(e, cudaErrorLaunchFailure, "names lanes that do not exist",
                  "a full mask in a 16-thread block");
    e = captured([&] { dynamic_shared_kernel<<<1, 128, 64 * sizeof(float)>>>(f, 128); });
    expect_report(e, cudaErrorLaunchFailure, "wrote past the end of its 256 bytes of dynamic shared memory",
                  "dynamic shared memory smaller than the kernel uses");
    e = captured([&] { empty_kernel<<<1, 2048>>>(); });
    expect_report(e, cudaErrorInvalidConfiguration, "blocks have 1 to 1024 threads", "a block of 2048 threads");
    e = captured([&] { empty_kernel<<<0, 32>>>(); });
    expect_report(e, cudaErrorInvalidConfiguration, "grid (0,1,1)", "an empty grid");
    e = captured([&] { dynamic_shared_kernel<<<1, 32, 64 * 1024>>>(f, 32); });
    expect_report(e, cudaErrorInvalidValue, "was not called", "64 KiB of dynamic shared memory unasked");
    printf("cudaFuncSetAttribute above the device's opt-in limit is refused\n");
    CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               200 * 1024) == cudaErrorInvalidValue, "200 KiB was allowed");
    cudaGetLastError();
    CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               64 * 1024) == cudaSuccess, "64 KiB was refused");
    e = captured([&] { dynamic_shared_kernel<<<1, 32, 80 * 1024>>>(f, 32); });
    expect_report(e, cudaErrorInvalidValue, "above the 65536 that cudaFuncSetAttribute allowed",
                  "more dynamic shared memory than cudaFuncSetAttribute allowed");

    printf("shared memory starts as NaN in each block\n");
    shared_read_before_write_kernel<<<2, 64>>>(f);
    float got[64];
    cudaMemcpy(got, f, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(got[0] == 1.0f && got[63] != got[63], "threads 0 and 63 read %g and %g", (double)got[0],
          (double)got[63]);

    printf("after a failed kernel nothing runs until the error is cleared\n");
    captured([&] { deadlock_kernel<<<1, 64>>>(f); });
    e = captured([&] { empty_kernel<<<1, 32>>>(); });
    CHECK(e == cudaErrorLaunchFailure, "the error is not sticky: %s", cudaGetErrorName(e));
    cudaDeviceReset();

    cudaFree(f);
    cudaFree(ints);

    stream_checks();
    hazard_checks();
    if (failures) {
        printf("cudacpu selftest: %d checks failed\n", failures);
        return 1;
    }
    printf("cudacpu selftest: ok\n");
    return 0;
}

/*
 * The fake NCCL (tests/cudacpu/nccl.cpp) on its own: for each case three
 * (or two) forked ranks, each with this program's cudacpu runtime, a
 * communicator of their own and a non-blocking stream, and 1 KiB chunks
 * (CUDACPU_NCCL_CHUNK), so every buffer here crosses several.  Checks
 *   - results: all-reduce, reduce-scatter and all-gather in place, a
 *     broadcast from rank 1, sends and receives around the ring in one
 *     group; sums of inexact floats bit for bit the rank-order sum on
 *     every rank;
 *   - the stream: a collective a peer has not reached leaves
 *     cudaStreamQuery and cudaEventQuery cudaErrorNotReady, and a
 *     non-blocking initialisation ncclInProgress until all ranks joined;
 *   - its reports: ranks calling different collectives, a receive of
 *     another size than the send, a peer that exited (a zombie: not reaped
 *     yet) and one that aborted each fail the communicator, named in
 *     ncclGetLastError; a cudaStreamSynchronize waiting for a collective
 *     is released when another thread aborts the communicator.
 * Prints "nccl_check: CASE: ok" per case; exits 1 at the first failure.
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace {

int my_rank = -1;
const char *current_case = "";

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nccl_check: %s: rank %d: FAIL: ", current_case, my_rank);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    _exit(1);
}

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define NCCL_OK(call)                                                                              \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            die("%s: %s (%s)", #call, ncclGetErrorString(r_), ncclGetLastError(NULL));             \
    } while (0)
#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die("%s: %s", #call, cudaGetErrorString(e_));                                          \
    } while (0)

struct rank_ctx {
    int rank, world;
    ncclComm_t comm;
    cudaStream_t stream;
};

/* the communicator, initialised without blocking as the plugin does */
rank_ctx join(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x{rank, world, NULL, NULL};
    CUDA_OK(cudaSetDevice(rank));
    CUDA_OK(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&x.comm, world, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        die("ncclCommInitRankConfig: %s", ncclGetErrorString(r));
    double t0 = now();
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
        NCCL_OK(ncclCommGetAsyncError(x.comm, &state));
        if (now() - t0 > 10)
            die("the communicator was not set up within 10 s");
        usleep(100);
    }
    if (state != ncclSuccess)
        die("setting up: %s: %s", ncclGetErrorString(state), ncclGetLastError(x.comm));
    return x;
}

void leave(rank_ctx &x)
{
    ncclResult_t r = ncclCommFinalize(x.comm);
    if (r != ncclSuccess && r != ncclInProgress)
        die("ncclCommFinalize: %s", ncclGetErrorString(r));
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress)
        NCCL_OK(ncclCommGetAsyncError(x.comm, &state));
    if (state != ncclSuccess)
        die("finalize: %s", ncclGetErrorString(state));
    NCCL_OK(ncclCommDestroy(x.comm));
}

/* polls the stream and the communicator as the plugin does: the
 * collective's completion, or the communicator's error (then its message) */
ncclResult_t wait(rank_ctx &x, double limit, int *not_ready = NULL)
{
    double t0 = now();
    for (;;) {
        cudaError_t q = cudaStreamQuery(x.stream);
        if (q == cudaSuccess)
            return ncclSuccess;
        if (q != cudaErrorNotReady)
            die("cudaStreamQuery: %s", cudaGetErrorString(q));
        if (not_ready)
            ++*not_ready;
        ncclResult_t state;
        NCCL_OK(ncclCommGetAsyncError(x.comm, &state));
        if (state != ncclSuccess && state != ncclInProgress)
            return state;
        if (now() - t0 > limit)
            die("nothing happened within %.0f s", limit);
        usleep(50);
    }
}

float value(int rank, size_t i) /* inexact: sums round, and their order shows */
{
    return (float)((rank + 1) * 0.1 + i * 1.37e-3) * (rank % 2 ? -1.0f : 1.0f) + 1.0f / (3 + i);
}

float rank_order_sum(int world, size_t i)
{
    float s = value(0, i);
    for (int r = 1; r < world; r++)
        s += value(r, i);
    return s;
}

float *device_floats(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n * sizeof(float)));
    return (float *)p;
}

void upload(void *dst, const void *src, size_t bytes)
{
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
}

void download(void *dst, const void *src, size_t bytes)
{
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

/* ---- the cases --------------------------------------------------------------------------- */

void results(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x = join(id, rank, world);
    /* all-reduce in place: 1000 floats, 4 chunks */
    const size_t n = 1000;
    float *buf = device_floats(world * 700);
    float host[3 * 700], got[3 * 700];
    for (size_t i = 0; i < n; i++)
        host[i] = value(rank, i);
    upload(buf, host, n * sizeof(float));
    if (rank == world - 1)
        usleep(200 * 1000); /* the others find the stream not ready meanwhile */
    cudaEvent_t after;
    CUDA_OK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    NCCL_OK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, x.comm, x.stream));
    CUDA_OK(cudaEventRecord(after, x.stream));
    if (rank == 0 && cudaEventQuery(after) != cudaErrorNotReady)
        die("cudaEventQuery after an all-reduce the last rank has not called: not "
            "cudaErrorNotReady");
    int not_ready = 0;
    if (wait(x, 10, &not_ready) != ncclSuccess)
        die("all-reduce: %s", ncclGetLastError(x.comm));
    if (rank == 0 && not_ready == 0)
        die("cudaStreamQuery never said cudaErrorNotReady while the last rank slept");
    CUDA_OK(cudaEventQuery(after));
    download(got, buf, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float want = rank_order_sum(world, i);
        if (memcmp(&got[i], &want, sizeof want) != 0)
            die("all-reduce [%zu] = %.9g, want %.9g (the ranks' values added in rank order)", i,
                got[i], want);
    }
    /* reduce-scatter in place: 700 floats a rank, 85 of them a chunk */
    const size_t per = 700;
    for (int q = 0; q < world; q++)
        for (size_t i = 0; i < per; i++)
            host[q * per + i] = value(rank, q * per + i);
    upload(buf, host, world * per * sizeof(float));
    NCCL_OK(ncclReduceScatter(buf, buf + rank * per, per, ncclFloat, ncclSum, x.comm, x.stream));
    if (wait(x, 10) != ncclSuccess)
        die("reduce-scatter: %s", ncclGetLastError(x.comm));
    download(got, buf + rank * per, per * sizeof(float));
    for (size_t i = 0; i < per; i++) {
        float want = rank_order_sum(world, rank * per + i);
        if (memcmp(&got[i], &want, sizeof want) != 0)
            die("reduce-scatter [%zu] = %.9g, want %.9g", i, got[i], want);
    }
    /* all-gather in place: 333 floats a rank */
    const size_t ag = 333;
    for (size_t i = 0; i < ag; i++)
        host[i] = value(rank, i);
    upload(buf + rank * ag, host, ag * sizeof(float));
    NCCL_OK(ncclAllGather(buf + rank * ag, buf, ag, ncclFloat, x.comm, x.stream));
    if (wait(x, 10) != ncclSuccess)
        die("all-gather: %s", ncclGetLastError(x.comm));
    download(got, buf, world * ag * sizeof(float));
    for (int q = 0; q < world; q++)
        for (size_t i = 0; i < ag; i++)
            if (got[q * ag + i] != value(q, i))
                die("all-gather: rank %d's [%zu] = %.9g, want %.9g", q, i, got[q * ag + i],
                    value(q, i));
    /* broadcast of 5000 bytes from rank 1, in place */
    unsigned char bytes[5000], back[5000];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)(rank * 31 + i * 7);
    upload(buf, bytes, sizeof bytes);
    NCCL_OK(ncclBroadcast(buf, buf, sizeof bytes, ncclUint8, 1, x.comm, x.stream));
    if (wait(x, 10) != ncclSuccess)
        die("broadcast: %s", ncclGetLastError(x.comm));
    download(back, buf, sizeof back);
    for (size_t i = 0; i < sizeof back; i++)
        if (back[i] != (unsigned char)(31 + i * 7))
            die("broadcast: byte %zu is %d, want rank 1's %d", i, back[i], (31 + (int)i * 7) & 255);
    /* around the ring in one group: 10000 bytes to the next rank, from the
     * previous; every rank sends and receives at once */
    unsigned char *out = (unsigned char *)device_floats(2500);
    unsigned char *in = (unsigned char *)device_floats(2500);
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)(rank * 13 + i);
    upload(out, bytes, sizeof bytes);
    upload(out + 5000, bytes, sizeof bytes);
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(out, 10000, ncclUint8, next, x.comm, x.stream));
    NCCL_OK(ncclRecv(in, 10000, ncclUint8, prev, x.comm, x.stream));
    NCCL_OK(ncclGroupEnd());
    if (wait(x, 10) != ncclSuccess)
        die("sendrecv: %s", ncclGetLastError(x.comm));
    download(back, in + 5000, sizeof back);
    for (size_t i = 0; i < sizeof back; i++)
        if (back[i] != (unsigned char)(prev * 13 + i))
            die("received byte %zu is %d, want %d", 5000 + i, back[i], (prev * 13 + (int)i) & 255);
    leave(x);
}

/* ranks that call different collectives: each names the other's call */
void mismatch(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x = join(id, rank, world);
    float *buf = device_floats(300);
    if (rank == 1)
        NCCL_OK(ncclAllGather(buf + rank * 100, buf, 100, ncclFloat, x.comm, x.stream));
    else
        NCCL_OK(ncclAllReduce(buf, buf, 100, ncclFloat, ncclSum, x.comm, x.stream));
    ncclResult_t r = wait(x, 10);
    if (r != ncclInvalidUsage || !strstr(ncclGetLastError(x.comm), "mismatched collectives"))
        die("%s: %s, want ncclInvalidUsage naming the mismatched collectives",
            ncclGetErrorString(r), ncclGetLastError(x.comm));
    if (rank == 0 &&
        !strstr(ncclGetLastError(x.comm), "rank 1 calls ncclAllGather #1 (100 float a rank)"))
        die("the message does not name rank 1's call: %s", ncclGetLastError(x.comm));
    NCCL_OK(ncclCommAbort(x.comm));
    CUDA_OK(cudaStreamSynchronize(x.stream)); /* the aborted call is gone */
}

/* a receive of another size than the send */
void sizes(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x = join(id, rank, world);
    float *buf = device_floats(100);
    if (rank == 0)
        NCCL_OK(ncclSend(buf, 100, ncclUint8, 1, x.comm, x.stream));
    else
        NCCL_OK(ncclRecv(buf, 200, ncclUint8, 0, x.comm, x.stream));
    ncclResult_t r = wait(x, 10);
    if (rank == 1 && (r != ncclInvalidUsage ||
                      !strstr(ncclGetLastError(x.comm), "message 1 of 100 bytes")))
        die("%s: %s, want ncclInvalidUsage naming the 100 bytes sent", ncclGetErrorString(r),
            ncclGetLastError(x.comm));
    NCCL_OK(ncclCommAbort(x.comm));
}

/* a rank that exits: the others fail naming it (it is a zombie until the
 * parent reaps it, after every rank of the case has ended) */
void dead(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x = join(id, rank, world);
    if (rank == 1)
        _exit(0);
    float *buf = device_floats(100);
    double t0 = now();
    NCCL_OK(ncclAllReduce(buf, buf, 100, ncclFloat, ncclSum, x.comm, x.stream));
    ncclResult_t r = wait(x, 10);
    char want[64];
    snprintf(want, sizeof want, "rank 1 (pid ");
    if (r != ncclRemoteError || !strstr(ncclGetLastError(x.comm), want) ||
        !strstr(ncclGetLastError(x.comm), "exited or was killed"))
        die("%s: %s, want ncclRemoteError naming rank 1", ncclGetErrorString(r),
            ncclGetLastError(x.comm));
    if (now() - t0 > 5)
        die("took %.1f s to see that rank 1 had exited", now() - t0);
    NCCL_OK(ncclCommAbort(x.comm));
}

/* a rank that aborts while the others wait for it */
void aborted(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x = join(id, rank, world);
    if (rank == 1) {
        usleep(100 * 1000);
        NCCL_OK(ncclCommAbort(x.comm));
        return;
    }
    float *buf = device_floats(100);
    NCCL_OK(ncclAllReduce(buf, buf, 100, ncclFloat, ncclSum, x.comm, x.stream));
    ncclResult_t r = wait(x, 10);
    if (r != ncclRemoteError || !strstr(ncclGetLastError(x.comm), "rank 1 aborted"))
        die("%s: %s, want ncclRemoteError: rank 1 aborted", ncclGetErrorString(r),
            ncclGetLastError(x.comm));
    NCCL_OK(ncclCommAbort(x.comm));
}

/* a synchronisation waiting for a collective a peer never calls lets the
 * other threads in: one aborts the communicator, which ends the wait */
struct abort_later {
    ncclComm_t comm;
};
void *abort_after(void *arg)
{
    usleep(300 * 1000);
    NCCL_OK(ncclCommAbort(((abort_later *)arg)->comm));
    return NULL;
}
void sync_released(const ncclUniqueId &id, int rank, int world)
{
    rank_ctx x = join(id, rank, world);
    if (rank == 1) { /* alive, and never calls */
        usleep(1500 * 1000);
        NCCL_OK(ncclCommAbort(x.comm));
        return;
    }
    float *buf = device_floats(100);
    NCCL_OK(ncclAllReduce(buf, buf, 100, ncclFloat, ncclSum, x.comm, x.stream));
    abort_later a{x.comm};
    pthread_t t;
    pthread_create(&t, NULL, abort_after, &a);
    double t0 = now();
    CUDA_OK(cudaStreamSynchronize(x.stream));
    double took = now() - t0;
    pthread_join(t, NULL);
    if (took < 0.25 || took > 5)
        die("cudaStreamSynchronize returned after %.2f s, want the abort's 0.3 s", took);
}

struct test_case {
    const char *name;
    void (*run)(const ncclUniqueId &, int, int);
    int world;
};
const test_case cases[] = {
    {"results", results, 3},   {"mismatch", mismatch, 3},  {"sizes", sizes, 2},
    {"dead", dead, 3},         {"aborted", aborted, 2},    {"sync_released", sync_released, 2},
};

} // namespace

int main(void)
{
    setenv("CUDACPU_NCCL_CHUNK", "1024", 0);
    setenv("CUDACPU_DEVICES", "3", 0);
    int failed = 0;
    for (const test_case &c : cases) {
        current_case = c.name;
        ncclUniqueId id;
        NCCL_OK(ncclGetUniqueId(&id));
        pid_t pids[3];
        for (int r = 0; r < c.world; r++) {
            fflush(NULL);
            pids[r] = fork();
            if (pids[r] < 0) {
                perror("fork");
                return 1;
            }
            if (pids[r] == 0) {
                my_rank = r;
                alarm(30);
                c.run(id, r, c.world);
                _exit(0);
            }
        }
        int ok = 1;
        for (int r = 0; r < c.world; r++) {
            int status = 0;
            waitpid(pids[r], &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                ok = 0;
                if (WIFSIGNALED(status))
                    fprintf(stderr, "nccl_check: %s: rank %d killed by signal %d\n", c.name, r,
                            WTERMSIG(status));
            }
        }
        printf("nccl_check: %s: %s\n", c.name, ok ? "ok" : "FAILED");
        failed |= !ok;
    }
    return failed;
}

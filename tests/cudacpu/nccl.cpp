/*
 * A fake NCCL for the CUDA-on-CPU harness: the calls of include/nccl.h
 * (what plugins/comm/nccl.c makes) for ranks that are processes on one
 * machine, each with its own cudacpu runtime, so that the nccl comm plugin
 * runs real multi-process collectives without a GPU.
 *
 * The communicator is a shared-memory segment (shm_open), named in the
 * unique id by ncclGetUniqueId (a random name), created by rank 0 when it
 * initialises and unlinked once every rank has mapped it.  It holds a
 * slot per rank (its pid, whether it joined or left, its counters, one
 * chunk of data: CUDACPU_NCCL_CHUNK bytes, 256 KiB by default) and a
 * channel per ordered pair of ranks for ncclSend/ncclRecv (counters and a
 * chunk).  Counters only grow; acquire/release atomics order the data.
 *
 * Collectives move their data chunk by chunk: each rank writes its chunk
 * into its slot (after every rank has read the slots' previous chunk),
 * announces it with its call (which collective, how many of what, root,
 * its number among the communicator's collectives), and once every rank
 * has announced the same chunk reads every slot and computes its result;
 * so a collective completes only when all ranks have called it, and
 * ranks calling different collectives (or the same with other counts or
 * roots) are reported: the communicator then fails with ncclInvalidUsage.
 * Sums add the ranks' values in rank order, so every rank gets the same
 * bits, run after run.  ncclSend and ncclRecv move a message through the
 * pair's channel, the receiver checking that the sender sent as many
 * bytes as it receives; the calls of one group progress together.
 *
 * Each call is queued on the caller's stream as a library call that polls
 * (the runtime's launch_library_poll): it runs in stream order when a
 * synchronisation reaches it, moves what it can and, while a peer has not
 * caught up, leaves the stream "not ready" (cudaStreamQuery,
 * cudaEventQuery) or makes the synchronisation wait, as an NCCL kernel
 * waiting for its peers does.  While it waits it watches the peers it
 * waits for: one that has exited or been killed (its pid gone, or a
 * zombie), has destroyed its communicator, or has aborted it
 * (ncclCommAbort sets a flag in the segment) makes the communicator fail
 * with ncclRemoteError, naming the rank, for ncclCommGetAsyncError to
 * report; the call itself stays pending, as a kernel does, until this
 * rank aborts the communicator.  A peer that is merely stopped (SIGSTOP)
 * or slow is waited for without end, as NCCL does: the caller's timeout
 * (the plugin's) has to abort.
 *
 * Initialisation follows the config: blocking (the default) returns when
 * every rank has joined; not blocking returns ncclInProgress, and
 * ncclCommGetAsyncError progresses it.  ncclCommFinalize (not blocking:
 * ncclInProgress) completes once the communicator's queued calls have
 * run; ncclCommGetAsyncError runs their streams for that.
 *
 * What it does not model: NCCL's algorithms (rings, trees), their
 * summation order and its rounding, channels, bandwidth and timing, any
 * device memory or CUDA stream semantics beyond the harness's queues,
 * ncclCommSplit, registration, reductions other than ncclSum, 16-bit
 * and 8-bit float reductions, and ranks on more than one machine.
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <errno.h>
#include <fcntl.h>
#include <mutex>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <vector>

extern "C" const cudacpu_runtime_table *cudacpu_cudart_table(void); /* cudart.c */

namespace {

/* ---- the shared segment ----------------------------------------------------------------- */

constexpr uint64_t SEG_MAGIC = 0x6363707563636c31ull; /* "ccpuccl1" */
constexpr char ID_TAG[] = "cudacpu-nccl";
constexpr size_t HEADER_BYTES = 256;
constexpr size_t SLOT_HEADER = 256;
constexpr size_t CHANNEL_HEADER = 128;
constexpr size_t DEFAULT_CHUNK = 256 * 1024;

enum coll_kind : uint32_t { ALLREDUCE = 1, BROADCAST, REDUCE_SCATTER, ALLGATHER, SEND, RECV };

const char *kind_name(uint32_t k)
{
    switch (k) {
    case ALLREDUCE: return "ncclAllReduce";
    case BROADCAST: return "ncclBroadcast";
    case REDUCE_SCATTER: return "ncclReduceScatter";
    case ALLGATHER: return "ncclAllGather";
    case SEND: return "ncclSend";
    case RECV: return "ncclRecv";
    }
    return "?";
}

/* what a rank announces with each chunk it writes */
struct call_desc {
    uint32_t kind, dtype, op;
    int32_t root;
    uint64_t count, seq;
};

struct seg_header {
    uint64_t magic; /* written last by rank 0 */
    int32_t nranks;
    int32_t abort_rank; /* -1, or the first rank that called ncclCommAbort */
    uint64_t chunk;     /* bytes of data in a slot and in a channel */
};

struct rank_slot {
    int32_t pid;
    int32_t joined;
    int32_t left; /* 1: destroyed its communicator, 2: aborted it */
    int32_t set_up; /* it saw every rank join: everyone's set-up can end (as NCCL's
                     * bootstrap, which no rank leaves before all have joined) */
    uint64_t written; /* collective chunks written into the slot, ever */
    uint64_t read;    /* collective chunks read from every slot, ever */
    call_desc call;   /* of the chunk written last */
    /* chunk bytes of data follow, at SLOT_HEADER */
};

struct channel { /* from one rank to another */
    uint64_t sent;  /* chunks written by the sender, ever */
    uint64_t taken; /* chunks read by the receiver, ever */
    uint64_t message, bytes; /* of the chunk written last: its message's number and size */
    /* chunk bytes of data follow, at CHANNEL_HEADER */
};

template <typename T> T load(const T *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
template <typename T> void store(T *p, T v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

const char *type_name(uint32_t t)
{
    static const char *names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                  "half", "float", "double", "bfloat16", "fp8e4m3", "fp8e5m2"};
    return t < 12 ? names[t] : "?";
}

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* a process that has exited or was killed: gone, or a zombie its parent
 * has not reaped yet */
bool process_gone(pid_t pid)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = 0;
    const char *paren = strrchr(line, ')');
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

std::mutex global_lock;
char global_error[1024]; /* ncclGetLastError(NULL), and errors before a communicator */

} // namespace

/* ---- the communicator --------------------------------------------------------------------- */

struct ncclComm {
    std::atomic<int> refs{1}; /* the handle, and each queued call */
    int rank = 0, nranks = 0, device = 0;
    bool blocking = true;
    char name[NCCL_UNIQUE_ID_BYTES] = "";
    /* the segment, once mapped */
    char *base = NULL;
    size_t size = 0;
    size_t chunk = 0;
    bool joined = false, all_joined = false, unlinked = false;
    /* ncclInProgress while initialising (or finalizing), then ncclSuccess
     * or the first error */
    std::atomic<int> state{ncclInProgress};
    std::atomic<bool> aborted{false}, destroyed{false}, finalizing{false};
    std::atomic<int> outstanding{0}; /* calls queued and not done */
    std::mutex lock;                 /* last_error, streams */
    char last_error[1024] = "";
    std::vector<cudaStream_t> streams; /* that calls were queued on */
    /* the ranks' positions: run on the stream (under the runtime's lock) */
    uint64_t coll_chunks = 0, coll_seq = 0;
    std::vector<uint64_t> sent_chunks, sent_messages, taken_chunks, taken_messages;

    seg_header *header() const { return (seg_header *)base; }
    rank_slot *slot(int r) const
    {
        return (rank_slot *)(base + HEADER_BYTES + (size_t)r * (SLOT_HEADER + chunk));
    }
    char *slot_data(int r) const { return (char *)slot(r) + SLOT_HEADER; }
    channel *chan(int from, int to) const
    {
        return (channel *)(base + HEADER_BYTES + (size_t)nranks * (SLOT_HEADER + chunk) +
                           ((size_t)from * nranks + to) * (CHANNEL_HEADER + chunk));
    }
    char *chan_data(int from, int to) const { return (char *)chan(from, to) + CHANNEL_HEADER; }
};

namespace {

size_t segment_bytes(int nranks, size_t chunk)
{
    size_t page = (size_t)getpagesize();
    size_t b = HEADER_BYTES + (size_t)nranks * (SLOT_HEADER + chunk) +
               (size_t)nranks * nranks * (CHANNEL_HEADER + chunk);
    return (b + page - 1) / page * page;
}

void set_global_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void set_global_error(const char *fmt, ...)
{
    std::lock_guard<std::mutex> hold(global_lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(global_error, sizeof global_error, fmt, ap);
    va_end(ap);
}

/* a message for ncclGetLastError; returns r */
ncclResult_t note(ncclComm *c, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ncclResult_t note(ncclComm *c, ncclResult_t r, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c) {
        std::lock_guard<std::mutex> hold(c->lock);
        snprintf(c->last_error, sizeof c->last_error, "%s", msg);
    }
    set_global_error("%s", msg);
    return r;
}

/* the communicator failed (asynchronously): the first error stays */
void fail(ncclComm *c, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fail(ncclComm *c, ncclResult_t r, const char *fmt, ...)
{
    int expected = c->state.load();
    if (expected != ncclSuccess && expected != ncclInProgress)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    note(c, r, "%s", msg);
    if (getenv("CUDACPU_NCCL_DEBUG"))
        fprintf(stderr, "cudacpu nccl: rank %d: %s\n", c->rank, msg);
    while (!c->state.compare_exchange_weak(expected, r))
        if (expected != ncclSuccess && expected != ncclInProgress)
            return;
}

bool failed(const ncclComm *c)
{
    int s = c->state.load();
    return s != ncclSuccess && s != ncclInProgress;
}

void unmap(ncclComm *c)
{
    if (c->base) {
        munmap(c->base, c->size);
        c->base = NULL;
    }
}

void release(ncclComm *c)
{
    if (c->refs.fetch_sub(1) == 1) {
        unmap(c);
        delete c;
    }
}

/* A rank this one waits for that will never come: gone or left (its
 * communicator destroyed or aborted).  Sets the communicator's error
 * naming it, and returns true. */
bool rank_gone(ncclComm *c, int r, const char *waiting_in)
{
    rank_slot *s = c->slot(r);
    int left = load(&s->left);
    if (left) {
        fail(c, ncclRemoteError, "rank %d %s its communicator while rank %d waited for it in %s",
             r, left == 2 ? "aborted" : "destroyed", c->rank, waiting_in);
        return true;
    }
    pid_t pid = load(&s->pid);
    if (load(&s->joined) && process_gone(pid)) {
        fail(c, ncclRemoteError, "rank %d (pid %d) exited or was killed while rank %d waited for "
             "it in %s", r, (int)pid, c->rank, waiting_in);
        return true;
    }
    return false;
}

/* Waiting for rank r (-1: not known which) in waiting_in: whether it (or
 * any rank) has gone, or another rank has aborted (it lost a peer of its
 * own, or its caller timed out): then the communicator has failed, saying
 * so.  Only the rank waited for counts: others may have finished and
 * left. */
bool peer_lost(ncclComm *c, int r, const char *waiting_in)
{
    if (r >= 0 && r != c->rank) {
        if (rank_gone(c, r, waiting_in))
            return true;
    } else {
        for (int q = 0; q < c->nranks; q++)
            if (q != c->rank && rank_gone(c, q, waiting_in))
                return true;
    }
    int aborter = load(&c->header()->abort_rank);
    if (aborter >= 0 && aborter != c->rank) {
        if (r >= 0 && r != c->rank)
            fail(c, ncclRemoteError, "rank %d aborted the communicator (ncclCommAbort) while "
                 "rank %d waited for rank %d in %s", aborter, c->rank, r, waiting_in);
        else
            fail(c, ncclRemoteError, "rank %d aborted the communicator (ncclCommAbort) while "
                 "rank %d waited in %s", aborter, c->rank, waiting_in);
        return true;
    }
    return false;
}

/* Whether any other rank has gone, left or aborted, without failing the
 * communicator: a snapshot taken before a poll's steps.  A rank writes what
 * it sends before it leaves, so a loss seen before the steps ran cannot hide
 * a message the steps would have found (a size mismatch is then reported
 * as such, not as the sender's abort that followed it). */
bool any_peer_lost(ncclComm *c)
{
    int aborter = load(&c->header()->abort_rank);
    if (aborter >= 0 && aborter != c->rank)
        return true;
    for (int q = 0; q < c->nranks; q++) {
        if (q == c->rank)
            continue;
        rank_slot *s = c->slot(q);
        if (load(&s->left) || (load(&s->joined) && process_gone(load(&s->pid))))
            return true;
    }
    return false;
}

/* ---- initialisation ------------------------------------------------------------------------ */

size_t chunk_setting(int nranks)
{
    size_t chunk = DEFAULT_CHUNK;
    const char *v = getenv("CUDACPU_NCCL_CHUNK");
    if (v && *v) {
        char *end = NULL;
        unsigned long long k = strtoull(v, &end, 10);
        if (*end || k < 64 || k > (64ull << 20)) {
            fprintf(stderr, "cudacpu nccl: CUDACPU_NCCL_CHUNK=%s: expected bytes from 64 to "
                    "64 MiB\n", v);
            abort();
        }
        chunk = (size_t)k;
    }
    /* a reduce-scatter's chunk holds an element for every rank, 8 bytes at most */
    size_t least = 8 * (size_t)nranks;
    chunk = chunk < least ? least : chunk;
    return (chunk + 63) / 64 * 64;
}

/* One step of joining; ncclSuccess once every rank has joined,
 * ncclInProgress before, or an error. */
ncclResult_t progress_init(ncclComm *c)
{
    if (!c->base) {
        int fd;
        if (c->rank == 0) {
            fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
            if (fd < 0)
                return note(c, ncclSystemError, "rank 0 cannot create the shared memory %s: %s",
                            c->name, strerror(errno));
            c->chunk = chunk_setting(c->nranks);
            c->size = segment_bytes(c->nranks, c->chunk);
            if (ftruncate(fd, (off_t)c->size) != 0) {
                int e = errno;
                close(fd);
                shm_unlink(c->name);
                return note(c, ncclSystemError, "cannot size the shared memory %s to %zu "
                            "bytes: %s", c->name, c->size, strerror(e));
            }
        } else {
            fd = shm_open(c->name, O_RDWR, 0600);
            if (fd < 0)
                return errno == ENOENT ? ncclInProgress
                                       : note(c, ncclSystemError, "cannot open the shared "
                                              "memory %s: %s", c->name, strerror(errno));
            struct stat st;
            if (fstat(fd, &st) != 0 || st.st_size < (off_t)HEADER_BYTES) {
                close(fd);
                return ncclInProgress; /* rank 0 has not sized it yet */
            }
            c->size = (size_t)st.st_size;
        }
        void *p = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
            return note(c, ncclSystemError, "cannot map the shared memory %s: %s", c->name,
                        strerror(errno));
        c->base = (char *)p;
        if (c->rank == 0) {
            seg_header *h = c->header();
            h->nranks = c->nranks;
            h->abort_rank = -1;
            h->chunk = c->chunk;
            store(&h->magic, SEG_MAGIC);
        }
    }
    seg_header *h = c->header();
    if (!c->joined) {
        if (load(&h->magic) != SEG_MAGIC)
            return ncclInProgress;
        if (h->nranks != c->nranks)
            return note(c, ncclInvalidUsage, "rank %d was told %d ranks, rank 0 %d", c->rank,
                        c->nranks, h->nranks);
        c->chunk = h->chunk;
        if (segment_bytes(c->nranks, c->chunk) != c->size)
            return note(c, ncclInternalError, "the shared memory %s has %zu bytes, not the %zu "
                        "of %d ranks", c->name, c->size, segment_bytes(c->nranks, c->chunk),
                        c->nranks);
        rank_slot *s = c->slot(c->rank);
        if (load(&s->joined))
            return note(c, ncclInvalidUsage, "two processes joined the communicator as rank %d",
                        c->rank);
        store(&s->pid, (int32_t)getpid());
        store(&s->joined, 1);
        c->joined = true;
    }
    if (load(&h->abort_rank) >= 0)
        return note(c, ncclRemoteError, "rank %d aborted the communicator while it was being "
                    "set up", load(&h->abort_rank));
    /* a rank gone before it saw every rank join fails the set-up; one gone
     * after (its set-up ended) fails the first call that needs it */
    for (int r = 0; r < c->nranks; r++)
        if (!load(&c->slot(r)->joined))
            return ncclInProgress;
        else if (r != c->rank && !load(&c->slot(r)->set_up) &&
                 (load(&c->slot(r)->left) || process_gone(c->slot(r)->pid)))
            return note(c, ncclRemoteError, "rank %d left or died while the communicator was "
                        "being set up", r);
    store(&c->slot(c->rank)->set_up, 1);
    c->all_joined = true;
    if (c->rank == 0 && !c->unlinked) { /* every rank has it mapped */
        shm_unlink(c->name);
        c->unlinked = true;
    }
    return ncclSuccess;
}

/* ---- the calls, queued ---------------------------------------------------------------- */

struct call {
    uint32_t kind;
    const void *send;
    void *recv;
    size_t count; /* elements: all-reduce, broadcast, send, recv; per rank: reduce-scatter
                     (received), all-gather (sent) */
    ncclDataType_t dtype;
    int root;     /* broadcast's root; send's and recv's peer */
    cudaStream_t stream;
    /* on the stream: */
    bool started = false, done = false;
    uint64_t base = 0, chunks = 0, next = 0, seq = 0;
    int phase = 0; /* collectives: 0 to write chunk `next`, 1 to read it */
    size_t per_chunk = 0; /* elements */
};

struct queued {
    ncclComm *comm;
    std::vector<call> calls;
    double since = 0, checked = 0;
    char what[160];
};

bool is_collective(uint32_t k) { return k != SEND && k != RECV; }

void describe(const call &k, char *buf, size_t size)
{
    if (k.kind == BROADCAST)
        snprintf(buf, size, "%s #%llu (%zu %s from rank %d)", kind_name(k.kind),
                 (unsigned long long)k.seq + 1, k.count, type_name(k.dtype), k.root);
    else if (is_collective(k.kind))
        snprintf(buf, size, "%s #%llu (%zu %s%s)", kind_name(k.kind),
                 (unsigned long long)k.seq + 1, k.count, type_name(k.dtype),
                 k.kind == REDUCE_SCATTER || k.kind == ALLGATHER ? " a rank" : "");
    else
        snprintf(buf, size, "%s of %zu %s %s rank %d (message %llu on the pair)",
                 kind_name(k.kind), k.count, type_name(k.dtype), k.kind == SEND ? "to" : "from",
                 k.root, (unsigned long long)k.seq + 1);
}

/* where each call starts among the communicator's chunks and messages:
 * given in stream order, when the first of a queued group runs */
void assign(ncclComm *c, queued *q)
{
    for (call &k : q->calls) {
        size_t esz = type_size(k.dtype);
        if (is_collective(k.kind)) {
            k.per_chunk = c->chunk / esz / (k.kind == REDUCE_SCATTER ? (size_t)c->nranks : 1);
            k.chunks = (k.count + k.per_chunk - 1) / k.per_chunk;
            k.base = c->coll_chunks;
            k.seq = c->coll_seq++;
            c->coll_chunks += k.chunks;
        } else {
            k.per_chunk = c->chunk; /* bytes */
            k.chunks = (k.count * esz + c->chunk - 1) / c->chunk;
            std::vector<uint64_t> &chunks = k.kind == SEND ? c->sent_chunks : c->taken_chunks;
            std::vector<uint64_t> &messages = k.kind == SEND ? c->sent_messages : c->taken_messages;
            k.base = chunks[k.root];
            k.seq = messages[k.root]++;
            chunks[k.root] += k.chunks;
        }
        k.started = true;
    }
}

template <typename T> void sum_into(T *out, ncclComm *c, size_t offset, size_t n)
{
    /* rank order: every rank adds the same numbers the same way */
    const T *first = (const T *)(c->slot_data(0) + offset);
    for (size_t i = 0; i < n; i++)
        out[i] = first[i];
    for (int r = 1; r < c->nranks; r++) {
        const T *v = (const T *)(c->slot_data(r) + offset);
        for (size_t i = 0; i < n; i++)
            out[i] += v[i];
    }
}

void sum_chunk(ncclDataType_t t, void *out, ncclComm *c, size_t offset, size_t n)
{
    switch (t) {
    case ncclInt8: sum_into((int8_t *)out, c, offset, n); break;
    case ncclUint8: sum_into((uint8_t *)out, c, offset, n); break;
    case ncclInt32: sum_into((int32_t *)out, c, offset, n); break;
    case ncclUint32: sum_into((uint32_t *)out, c, offset, n); break;
    case ncclInt64: sum_into((int64_t *)out, c, offset, n); break;
    case ncclUint64: sum_into((uint64_t *)out, c, offset, n); break;
    case ncclFloat32: sum_into((float *)out, c, offset, n); break;
    case ncclFloat64: sum_into((double *)out, c, offset, n); break;
    default: break; /* refused when called */
    }
}

/* The first rank not yet at `value` in the field of every slot, or -1. */
int lagging(ncclComm *c, uint64_t rank_slot::*field, uint64_t value)
{
    for (int r = 0; r < c->nranks; r++)
        if (load(&(c->slot(r)->*field)) < value)
            return r;
    return -1;
}

/* One collective chunk's step; false: waiting for rank *wait. */
bool collective_step(ncclComm *c, call &k, int *wait)
{
    uint64_t g = k.base + k.next;
    size_t esz = type_size(k.dtype);
    size_t first = k.next * k.per_chunk;
    size_t n = k.count - first < k.per_chunk ? k.count - first : k.per_chunk;
    rank_slot *mine = c->slot(c->rank);
    char *data = c->slot_data(c->rank);
    call_desc d = {k.kind, (uint32_t)k.dtype, 0, k.kind == BROADCAST ? k.root : -1, k.count, k.seq};
    if (k.phase == 0) {
        /* every rank has read the slots' previous chunk */
        if ((*wait = lagging(c, &rank_slot::read, g)) >= 0)
            return false;
        switch (k.kind) {
        case ALLREDUCE:
        case ALLGATHER:
            memcpy(data, (const char *)k.send + first * esz, n * esz);
            break;
        case BROADCAST:
            if (c->rank == k.root)
                memcpy(data, (const char *)k.send + first * esz, n * esz);
            break;
        case REDUCE_SCATTER: /* a piece for each rank, at r * per_chunk */
            for (int r = 0; r < c->nranks; r++)
                memcpy(data + (size_t)r * k.per_chunk * esz,
                       (const char *)k.send + ((size_t)r * k.count + first) * esz, n * esz);
            break;
        }
        mine->call = d;
        store(&mine->written, g + 1);
        k.phase = 1;
    }
    if ((*wait = lagging(c, &rank_slot::written, g + 1)) >= 0)
        return false;
    for (int r = 0; r < c->nranks; r++) {
        const call_desc &o = c->slot(r)->call;
        if (o.kind != d.kind || o.dtype != d.dtype || o.root != d.root || o.count != d.count ||
            o.seq != d.seq) {
            char mine_s[200], theirs_s[200];
            call theirs = k;
            theirs.kind = o.kind;
            theirs.dtype = (ncclDataType_t)o.dtype;
            theirs.root = o.root;
            theirs.count = o.count;
            theirs.seq = o.seq;
            describe(k, mine_s, sizeof mine_s);
            describe(theirs, theirs_s, sizeof theirs_s);
            fail(c, ncclInvalidUsage, "mismatched collectives: rank %d calls %s while rank %d "
                 "calls %s (every rank must make the same collective calls in the same order)",
                 c->rank, mine_s, r, theirs_s);
            *wait = r;
            return false;
        }
    }
    switch (k.kind) {
    case ALLREDUCE:
        sum_chunk(k.dtype, (char *)k.recv + first * esz, c, 0, n);
        break;
    case BROADCAST:
        if (c->rank != k.root || k.send != k.recv)
            memcpy((char *)k.recv + first * esz, c->slot_data(k.root), n * esz);
        break;
    case ALLGATHER:
        for (int r = 0; r < c->nranks; r++)
            memcpy((char *)k.recv + ((size_t)r * k.count + first) * esz, c->slot_data(r),
                   n * esz);
        break;
    case REDUCE_SCATTER:
        sum_chunk(k.dtype, (char *)k.recv + first * esz, c,
                  (size_t)c->rank * k.per_chunk * esz, n);
        break;
    }
    store(&mine->read, g + 1);
    k.phase = 0;
    k.next++;
    return true;
}

/* One chunk of a send or a receive; false: waiting for the peer. */
bool p2p_step(ncclComm *c, call &k, int *wait)
{
    uint64_t g = k.base + k.next;
    size_t bytes = k.count * type_size(k.dtype);
    size_t first = k.next * c->chunk;
    size_t n = bytes - first < c->chunk ? bytes - first : c->chunk;
    *wait = k.root;
    if (k.kind == SEND) {
        channel *ch = c->chan(c->rank, k.root);
        if (load(&ch->taken) < g)
            return false;
        memcpy(c->chan_data(c->rank, k.root), (const char *)k.send + first, n);
        ch->message = k.seq;
        ch->bytes = bytes;
        store(&ch->sent, g + 1);
    } else {
        channel *ch = c->chan(k.root, c->rank);
        if (load(&ch->sent) < g + 1)
            return false;
        if (ch->message != k.seq || ch->bytes != bytes) {
            char mine_s[200];
            describe(k, mine_s, sizeof mine_s);
            fail(c, ncclInvalidUsage, "rank %d calls %s, but rank %d sent message %llu of %llu "
                 "bytes there (a send and its receive must move as many bytes)", c->rank, mine_s,
                 k.root, (unsigned long long)ch->message + 1, (unsigned long long)ch->bytes);
            return false;
        }
        memcpy((char *)k.recv + first, c->chan_data(k.root, c->rank), n);
        store(&ch->taken, g + 1);
    }
    k.next++;
    return true;
}

void call_done(ncclComm *c, queued *q)
{
    c->outstanding--;
    release(c);
    delete q;
}

/* the runtime's poll: 1 when done (q freed) */
int poll_calls(void *arg)
{
    queued *q = (queued *)arg;
    ncclComm *c = q->comm;
    if (c->aborted || c->destroyed) { /* the kernel is gone with the communicator */
        call_done(c, q);
        return 1;
    }
    if (failed(c)) /* waits, as a kernel would, until the communicator is aborted */
        return 0;
    if (!q->calls[0].started) {
        assign(c, q);
        q->since = now();
    }
    /* every 10 ms: is the rank waited for still coming?  Looked at before
     * the steps (any_peer_lost), judged after them */
    double t0 = now();
    bool probe = t0 - q->checked > 0.01 && any_peer_lost(c);
    bool moved = false, all = true;
    int wait = -1;
    const call *blocked = NULL;
    bool collective_blocked = false;
    for (call &k : q->calls) {
        if (k.done)
            continue;
        /* the collectives of a group one after another; its sends and
         * receives all at once */
        if (is_collective(k.kind) && collective_blocked) {
            all = false;
            continue;
        }
        int w = -1;
        while (k.next < k.chunks && !failed(c)) {
            bool ok = is_collective(k.kind) ? collective_step(c, k, &w) : p2p_step(c, k, &w);
            if (!ok)
                break;
            moved = true;
        }
        if (failed(c))
            return 0;
        if (k.next == k.chunks) {
            k.done = true;
        } else {
            all = false;
            if (!blocked)
                blocked = &k, wait = w;
            if (is_collective(k.kind))
                collective_blocked = true;
        }
    }
    if (all) {
        call_done(c, q);
        return 1;
    }
    double t = now();
    if (moved)
        q->since = t;
    else if (t0 - q->checked > 0.01) {
        q->checked = t0;
        if (probe) {
            char what[200];
            describe(*blocked, what, sizeof what);
            peer_lost(c, wait, what);
        }
    }
    return 0;
}

/* ---- groups --------------------------------------------------------------------------------- */

thread_local int group_depth;
thread_local std::vector<std::pair<ncclComm *, call>> group_calls;
thread_local ncclResult_t group_error;

ncclResult_t queue_calls(ncclComm *c, cudaStream_t stream, std::vector<call> &&calls)
{
    const cudacpu_runtime_table *rt = cudacpu_cudart_table();
    if (!rt)
        return note(c, ncclUnhandledCudaError, "no cudacpu runtime in this process to queue %s "
                    "on", kind_name(calls[0].kind));
    queued *q = new queued();
    q->comm = c;
    q->calls = std::move(calls);
    snprintf(q->what, sizeof q->what, "%s%s", kind_name(q->calls[0].kind),
             q->calls.size() > 1 ? " (a group)" : "");
    /* what it reads and writes, for the runtime's stream hazard check */
    std::vector<cudacpu_touch> touch;
    for (const call &k : q->calls) {
        size_t esz = type_size(k.dtype), n = (size_t)c->nranks;
        size_t in = k.count * esz * (k.kind == REDUCE_SCATTER ? n : 1);
        size_t out = k.count * esz * (k.kind == ALLGATHER ? n : 1);
        if (k.send && k.kind != RECV && (k.kind != BROADCAST || c->rank == k.root))
            touch.push_back(cudacpu_touch{k.send, in, false});
        if (k.recv && k.kind != SEND)
            touch.push_back(cudacpu_touch{k.recv, out, true});
    }
    c->refs++;
    c->outstanding++;
    {
        std::lock_guard<std::mutex> hold(c->lock);
        bool known = false;
        for (cudaStream_t s : c->streams)
            known |= s == stream;
        if (!known)
            c->streams.push_back(stream);
    }
    cudaError_t e = rt->launch_library_poll(stream, poll_calls, q, q->what, touch.data(),
                                            (int)touch.size());
    if (e != cudaSuccess) {
        c->outstanding--;
        c->refs--;
        uint32_t kind = q->calls[0].kind;
        delete q;
        return note(c, ncclUnhandledCudaError, "queueing %s on the stream: %s", kind_name(kind),
                    rt->get_error_string(e));
    }
    return ncclSuccess;
}

/* a communicator that can take calls */
ncclResult_t usable(ncclComm *c, const char *what)
{
    if (!c)
        return note(NULL, ncclInvalidArgument, "%s: the communicator is NULL", what);
    if (c->aborted || c->destroyed)
        return note(c, ncclInvalidArgument, "%s: the communicator was %s", what,
                    c->aborted ? "aborted" : "destroyed");
    if (failed(c))
        return note(c, ncclInvalidUsage, "%s: the communicator has failed: %s", what,
                    c->last_error);
    if (!c->all_joined)
        return note(c, ncclInvalidUsage, "%s: the communicator is still being set up (wait "
                    "until ncclCommGetAsyncError says ncclSuccess)", what);
    return ncclSuccess;
}

bool overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

ncclResult_t submit(ncclComm *c, call k)
{
    const char *what = kind_name(k.kind);
    ncclResult_t r = usable(c, what);
    if (r != ncclSuccess)
        return group_depth ? (group_error = r) : r;
    size_t esz = type_size(k.dtype), n = (size_t)c->nranks;
    bool sums = k.kind == ALLREDUCE || k.kind == REDUCE_SCATTER;
    if (!esz)
        r = note(c, ncclInvalidArgument, "%s: unknown data type %d", what, (int)k.dtype);
    else if (sums && (k.dtype == ncclFloat16 || k.dtype == ncclBfloat16 ||
                      (esz == 1 && k.dtype > ncclUint8)))
        r = note(c, ncclInvalidArgument, "%s: the fake NCCL sums integers, float and double, "
                 "not %s", what, type_name(k.dtype));
    else if (k.count && ((k.kind != RECV && !k.send &&
                          !(k.kind == BROADCAST && c->rank != k.root)) ||
                         (k.kind != SEND && !k.recv)))
        r = note(c, ncclInvalidArgument, "%s of %zu elements: a NULL buffer", what, k.count);
    else if ((k.kind == BROADCAST || k.kind == SEND || k.kind == RECV) &&
             (k.root < 0 || k.root >= c->nranks))
        r = note(c, ncclInvalidArgument, "%s: rank %d of %d ranks", what, k.root, c->nranks);
    else if ((k.kind == SEND || k.kind == RECV) && k.root == c->rank)
        r = note(c, ncclInvalidUsage, "%s: rank %d to itself (the fake NCCL moves messages "
                 "between ranks only)", what, c->rank);
    else if (k.kind == ALLREDUCE && k.send != k.recv &&
             overlap(k.send, k.count * esz, k.recv, k.count * esz))
        r = note(c, ncclInvalidArgument, "ncclAllReduce: the buffers overlap without being the "
                 "same (in place is sendbuff == recvbuff)");
    else if (k.kind == ALLGATHER &&
             (const char *)k.send != (const char *)k.recv + c->rank * k.count * esz &&
             overlap(k.send, k.count * esz, k.recv, n * k.count * esz))
        r = note(c, ncclInvalidArgument, "ncclAllGather: the buffers overlap, but sendbuff is "
                 "not recvbuff + rank * sendcount (in place)");
    else if (k.kind == REDUCE_SCATTER &&
             (const char *)k.recv != (const char *)k.send + c->rank * k.count * esz &&
             overlap(k.send, n * k.count * esz, k.recv, k.count * esz))
        r = note(c, ncclInvalidArgument, "ncclReduceScatter: the buffers overlap, but recvbuff "
                 "is not sendbuff + rank * recvcount (in place)");
    if (r != ncclSuccess)
        return group_depth ? (group_error = r) : r;
    if (k.count == 0) /* nothing moves, as in NCCL */
        return ncclSuccess;
    if (group_depth) {
        group_calls.emplace_back(c, k);
        return ncclSuccess;
    }
    std::vector<call> one{k};
    return queue_calls(c, k.stream, std::move(one));
}

call make_call(uint32_t kind, const void *send, void *recv, size_t count, ncclDataType_t dtype,
               int root, cudaStream_t stream)
{
    call k;
    k.kind = kind;
    k.send = send;
    k.recv = recv;
    k.count = count;
    k.dtype = dtype;
    k.root = root;
    k.stream = stream;
    return k;
}

ncclResult_t sum_only(ncclComm *c, ncclRedOp_t op, const char *what)
{
    return op == ncclSum ? ncclSuccess
                         : note(c, ncclInvalidArgument, "%s: the fake NCCL reduces with ncclSum "
                                "only, not op %d", what, (int)op);
}

} // namespace

/* ---- the API --------------------------------------------------------------------------- */

#define API extern "C" __attribute__((visibility("default")))

API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    unsigned char random[8];
    if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random)
        return note(NULL, ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_TAG, sizeof ID_TAG);
    char *name = id->internal + sizeof ID_TAG;
    int n = snprintf(name, sizeof id->internal - sizeof ID_TAG, "/cudacpu-nccl-%d-", (int)getpid());
    for (unsigned char b : random)
        n += snprintf(name + n, 3, "%02x", b);
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                        ncclConfig_t *config)
{
    if (!comm)
        return note(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > 256 || rank < 0 || rank >= nranks)
        return note(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d ranks "
                    "(the fake NCCL takes 1 to 256)", rank, nranks);
    if (memcmp(id.internal, ID_TAG, sizeof ID_TAG) != 0 ||
        !memchr(id.internal + sizeof ID_TAG, 0, sizeof id.internal - sizeof ID_TAG) ||
        id.internal[sizeof ID_TAG] != '/')
        return note(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: the id is not one "
                    "ncclGetUniqueId made (was it shared with this rank?)");
    bool blocking = true;
    if (config) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t))
            return note(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: the config was not "
                        "initialised with NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
            config->blocking != 1)
            return note(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: blocking = %d",
                        config->blocking);
        blocking = config->blocking != 0;
    }
    const cudacpu_runtime_table *rt = cudacpu_cudart_table();
    int device = 0;
    if (!rt || rt->get_device(&device) != cudaSuccess)
        return note(NULL, ncclUnhandledCudaError, "ncclCommInitRankConfig: no cudacpu runtime "
                    "in this process");
    ncclComm *c = new ncclComm();
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->blocking = blocking;
    snprintf(c->name, sizeof c->name, "%s", id.internal + sizeof ID_TAG);
    c->sent_chunks.assign(nranks, 0);
    c->sent_messages.assign(nranks, 0);
    c->taken_chunks.assign(nranks, 0);
    c->taken_messages.assign(nranks, 0);
    *comm = c;
    for (;;) {
        ncclResult_t r = progress_init(c);
        if (r == ncclSuccess) {
            c->state = ncclSuccess;
            return ncclSuccess;
        }
        if (r != ncclInProgress) {
            c->state = r;
            return r;
        }
        if (!blocking)
            return ncclInProgress; /* ncclCommGetAsyncError goes on with it */
        usleep(1000);
    }
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async)
{
    if (!c || !async)
        return ncclInvalidArgument;
    if (c->state == ncclInProgress && !c->all_joined && !c->aborted) {
        ncclResult_t r = progress_init(c);
        if (r == ncclSuccess)
            c->state = ncclSuccess;
        else if (r != ncclInProgress)
            fail(c, r, "%s", c->last_error);
    } else if (c->finalizing && !failed(c)) {
        /* flushing: the queued calls run when their streams do */
        if (c->outstanding > 0) {
            std::vector<cudaStream_t> streams;
            {
                std::lock_guard<std::mutex> hold(c->lock);
                streams = c->streams;
            }
            const cudacpu_runtime_table *rt = cudacpu_cudart_table();
            for (cudaStream_t s : streams)
                if (rt)
                    rt->stream_query(s);
        }
        if (c->outstanding == 0) {
            c->finalizing = false;
            int expected = ncclInProgress;
            c->state.compare_exchange_strong(expected, ncclSuccess);
        }
    }
    *async = (ncclResult_t)c->state.load();
    return ncclSuccess;
}

API ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    if (!c)
        return note(NULL, ncclInvalidArgument, "ncclCommFinalize: the communicator is NULL");
    if (c->aborted || c->destroyed)
        return note(c, ncclInvalidArgument, "ncclCommFinalize: the communicator is gone");
    if (failed(c))
        return (ncclResult_t)c->state.load();
    if (!c->all_joined)
        return note(c, ncclInvalidUsage, "ncclCommFinalize: the communicator is still being "
                    "set up");
    int expected = ncclSuccess;
    c->state.compare_exchange_strong(expected, ncclInProgress);
    c->finalizing = true;
    if (!c->blocking)
        return ncclInProgress;
    ncclResult_t state;
    while (ncclCommGetAsyncError(c, &state) == ncclSuccess && state == ncclInProgress)
        usleep(100);
    return state;
}

namespace {
void leave(ncclComm *c, int how)
{
    if (c->base && c->joined)
        store(&c->slot(c->rank)->left, how);
    if (c->rank == 0 && c->base && !c->unlinked) {
        shm_unlink(c->name);
        c->unlinked = true;
    } else if (c->rank == 0 && !c->base && !c->unlinked) {
        shm_unlink(c->name); /* created and not mapped: nothing to lose */
    }
}
} // namespace

API ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    if (c->outstanding > 0 && !failed(c) && !c->aborted && getenv("CUDACPU_NCCL_DEBUG"))
        fprintf(stderr, "cudacpu nccl: rank %d destroys its communicator with %d calls still "
                "queued: they will not run\n", c->rank, c->outstanding.load());
    c->destroyed = true;
    leave(c, 1);
    release(c);
    return ncclSuccess;
}

API ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    c->aborted = true;
    if (c->base && c->joined) {
        int32_t none = -1;
        __atomic_compare_exchange_n(&c->header()->abort_rank, &none, (int32_t)c->rank, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    leave(c, 2);
    release(c);
    return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (cudacpu's NCCL: ncclGetLastError says which)";
    case ncclSystemError:
        return "unhandled system error (cudacpu's NCCL: ncclGetLastError says which)";
    case ncclInternalError: return "internal error (cudacpu's NCCL)";
    case ncclInvalidArgument:
        return "invalid argument (cudacpu's NCCL: ncclGetLastError says which)";
    case ncclInvalidUsage: return "invalid usage (cudacpu's NCCL: ncclGetLastError says which)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

API const char *ncclGetLastError(ncclComm_t c)
{
    if (c && c->last_error[0])
        return c->last_error;
    return global_error;
}

API ncclResult_t ncclCommCount(const ncclComm_t c, int *count)
{
    if (!c || !count)
        return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}
API ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device)
{
    if (!c || !device)
        return ncclInvalidArgument;
    *device = c->device;
    return ncclSuccess;
}
API ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank)
{
    if (!c || !rank)
        return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    ncclResult_t r = sum_only(comm, op, "ncclAllReduce");
    if (r != ncclSuccess)
        return group_depth ? (group_error = r) : r;
    return submit(comm, make_call(ALLREDUCE, sendbuff, recvbuff, count, datatype, -1, stream));
}

API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream)
{
    return submit(comm, make_call(BROADCAST, sendbuff, recvbuff, count, datatype, root, stream));
}

API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream)
{
    ncclResult_t r = sum_only(comm, op, "ncclReduceScatter");
    if (r != ncclSuccess)
        return group_depth ? (group_error = r) : r;
    return submit(comm, make_call(REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, -1,
                                  stream));
}

API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                               ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return submit(comm, make_call(ALLGATHER, sendbuff, recvbuff, sendcount, datatype, -1, stream));
}

API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                          ncclComm_t comm, cudaStream_t stream)
{
    return submit(comm, make_call(SEND, sendbuff, NULL, count, datatype, peer, stream));
}

API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                          ncclComm_t comm, cudaStream_t stream)
{
    return submit(comm, make_call(RECV, NULL, recvbuff, count, datatype, peer, stream));
}

API ncclResult_t ncclGroupStart(void)
{
    if (group_depth++ == 0) {
        group_calls.clear();
        group_error = ncclSuccess;
    }
    return ncclSuccess;
}

/* The group's calls, queued: one poll per communicator and stream, the
 * calls in the order they were made. */
API ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return note(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0)
        return ncclSuccess;
    std::vector<std::pair<ncclComm *, call>> calls;
    calls.swap(group_calls);
    if (group_error != ncclSuccess)
        return group_error; /* what the call that failed said; nothing is queued */
    std::vector<bool> queued_already(calls.size(), false);
    for (size_t i = 0; i < calls.size(); i++) {
        if (queued_already[i])
            continue;
        ncclComm *c = calls[i].first;
        cudaStream_t s = calls[i].second.stream;
        std::vector<call> same;
        for (size_t j = i; j < calls.size(); j++)
            if (!queued_already[j] && calls[j].first == c && calls[j].second.stream == s) {
                same.push_back(calls[j].second);
                queued_already[j] = true;
            }
        ncclResult_t r = queue_calls(c, s, std::move(same));
        if (r != ncclSuccess)
            return r;
    }
    return ncclSuccess;
}

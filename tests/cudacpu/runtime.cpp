/*
 * cudacpu's runtime: memory, streams as queues that run when a
 * synchronisation needs them (the model and its order: "streams: queues"
 * below), events, a check for two streams touching the same bytes with
 * nothing ordering them ("stream hazards"), kernel launches that run
 * each CUDA thread of a block as a fiber, and the driver's virtual memory
 * management on host pages, where unmapped memory faults ("virtual memory").
 *
 * Scheduling: the threads of one block are fibers on this OS thread; the
 * blocks of a grid run one after another.  A fiber runs until it exits or
 * waits: at __syncthreads (until every thread of the block that has not
 * exited is there) or in a warp operation (until every lane its mask names
 * has made the same call).  The last thread to arrive completes the
 * operation for all and carries on; the scheduler then resumes the others in
 * thread order.  Because lanes are not lock-stepped, code that relies on
 * implicit warp synchrony instead of a mask is not given it: that is the
 * behaviour CUDA promises since Volta, and what catches a missing sync.
 *
 * What stops a kernel (it reports once, names the kernel, the launch site
 * and the block, and the launch error is sticky, as a device fault is):
 * a lane that exited while its warp waits for it in a warp operation, a
 * mask that leaves out its own lane or names lanes that do not exist, a
 * shuffle that reads a lane outside its mask, lanes of one mask calling
 * different operations, a deadlock, a write past the dynamic shared memory, and launch
 * configurations a GPU refuses (block size, grid size, dynamic shared memory
 * above the default 48 KiB or above what cudaFuncSetAttribute allowed).
 *
 * Fibers: ucontext creates them; on x86-64 a register-only switch replaces
 * swapcontext, which makes a signal-mask system call per switch (a warp
 * shuffle switches every lane twice); -DCUDACPU_UCONTEXT keeps swapcontext,
 * the path other machines take.  Stacks are 64 KiB with a guard page.
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <errno.h>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

namespace cudacpu {
thread_slot *current;
uint3 block_idx;
dim3 block_dim, grid_dim;
} // namespace cudacpu

using namespace cudacpu;

namespace {

/* the GPU emulated: sm_80 limits (A100), the oldest the backend targets */
constexpr size_t SMEM_DEFAULT = 48 * 1024;
constexpr size_t SMEM_OPTIN = 166912;
constexpr size_t SMEM_REGION = 256 * 1024; /* >= SMEM_OPTIN, a page multiple */
constexpr size_t SMEM_GUARD = 64 * 1024;
constexpr size_t STACK_BYTES = 64 * 1024;
constexpr int MAX_THREADS = 1024;
constexpr int MAX_REPORTS = 20;

/* ---- errors ---------------------------------------------------------------- */

cudaError_t last_error = cudaSuccess;
cudaError_t sticky_error = cudaSuccess; /* a kernel failed: the context is unusable */
int reports;

void set_error(cudaError_t e)
{
    if (last_error == cudaSuccess)
        last_error = e;
}

/* ---- fibers ------------------------------------------------------------------ */

enum fiber_state { IDLE, RUNNABLE, AT_BARRIER, AT_WARP, EXITED };

struct fiber {
    thread_slot slot;
    int state, tid;
    const char *file; /* where it waits */
    int line;
    warp_kind kind;
    unsigned mask;
    uint64_t result;
    char *stack; /* lowest address, the guard page */
#if defined(__x86_64__) && !defined(CUDACPU_UCONTEXT)
    void *sp;
#else
    ucontext_t uc;
#endif
};

fiber *pool[MAX_THREADS];
int pool_size;
fiber *running;
#if defined(__x86_64__) && !defined(CUDACPU_UCONTEXT)
void *scheduler_sp;
#else
ucontext_t scheduler_uc;
#endif

void fiber_main(void);

#if defined(__x86_64__) && !defined(CUDACPU_UCONTEXT)
/* switch(save, to): push the callee-saved registers, store the stack
 * pointer in *save, load `to`, pop and return into the other context */
extern "C" void cudacpu_switch(void **save, void *to);
asm(".text\n"
    ".p2align 4\n"
    ".type cudacpu_switch,@function\n"
    "cudacpu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cudacpu_switch, .-cudacpu_switch\n");

void fiber_reset(fiber *f)
{
    /* a kernel stopped mid-way leaves its frames' redzones poisoned */
    ASAN_UNPOISON_MEMORY_REGION(f->stack + getpagesize(), STACK_BYTES - getpagesize());
    /* a fresh stack that "returns" into fiber_main with the ABI's alignment */
    uintptr_t top = ((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;                     /* fiber_main's return address: never used */
    *--sp = (void *)fiber_main;       /* popped by ret */
    for (int i = 0; i < 6; i++)
        *--sp = NULL;                 /* rbp, rbx, r12-r15 */
    f->sp = sp;
    f->state = IDLE;
}
void enter(fiber *f) { cudacpu_switch(&scheduler_sp, f->sp); }
void leave(fiber *f) { cudacpu_switch(&f->sp, scheduler_sp); }
#else
void fiber_reset(fiber *f)
{
    ASAN_UNPOISON_MEMORY_REGION(f->stack + getpagesize(), STACK_BYTES - getpagesize());
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack + getpagesize();
    f->uc.uc_stack.ss_size = STACK_BYTES - getpagesize();
    f->uc.uc_link = NULL;
    makecontext(&f->uc, fiber_main, 0);
    f->state = IDLE;
}
void enter(fiber *f) { swapcontext(&scheduler_uc, &f->uc); }
void leave(fiber *f) { swapcontext(&f->uc, &scheduler_uc); }
#endif

fiber *fiber_new(int tid)
{
    fiber *f = (fiber *)calloc(1, sizeof *f);
    void *stack = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!f || stack == MAP_FAILED) {
        fprintf(stderr, "cudacpu: cannot allocate a fiber stack: %s\n", strerror(errno));
        abort();
    }
    mprotect(stack, (size_t)getpagesize(), PROT_NONE); /* an overflow faults */
    f->stack = (char *)stack;
    f->tid = tid;
    fiber_reset(f);
    return f;
}

/* ---- the launch running now ------------------------------------------------ */

struct warp_group {
    unsigned mask, arrived;
    warp_kind kind;
    const char *file;
    int line;
    uint64_t value[32];
    int arg[32], width[32];
};
enum { GROUPS = 8 };
struct warp_state {
    warp_group group[GROUPS];
    int n;
};

struct launch_state {
    const char *name, *file;
    int line;
    void (*body)(void *);
    void *closure;
    int threads, exited, at_barrier;
    warp_state warps[MAX_THREADS / 32];
    bool failed;
    unsigned long generation; /* of the block, for shared memory */
} L;

std::recursive_mutex api_lock; /* every runtime call; queued work runs under it */
char *smem_arena;           /* SMEM_REGION + SMEM_GUARD + a PROT_NONE page */
size_t smem_bytes;          /* of this launch, rounded up to 16 */
unsigned long smem_generation; /* the block that filled it */

const char *kind_name(warp_kind k)
{
    static const char *names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_up_sync",
                                  "__shfl_down_sync", "__ballot_sync", "__any_sync",
                                  "__all_sync", "__syncwarp"};
    return names[k];
}

/* Stops the kernel: reports, makes the error sticky, and (from a fiber)
 * returns to the scheduler for good. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...)
{
    if (reports++ < MAX_REPORTS) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fprintf(stderr, "cudacpu: %s (launched at %s:%d), block (%u,%u,%u): %s\n", L.name, L.file,
                L.line, block_idx.x, block_idx.y, block_idx.z, msg);
    }
    L.failed = true;
    sticky_error = cudaErrorLaunchFailure;
    set_error(cudaErrorLaunchFailure);
    if (running) {
        fiber *f = running;
        leave(f); /* never resumed: the launch resets its fibers */
    }
}

/* the launch being checked, for refuse() */
struct launch_site {
    const char *name, *file;
    int line;
};

/* a refused launch: reported, not sticky (as on a GPU) */
void refuse(const launch_site &at, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void refuse(const launch_site &at, cudaError_t e, const char *fmt, ...)
{
    if (reports++ < MAX_REPORTS) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fprintf(stderr, "cudacpu: %s (launched at %s:%d): launch refused: %s\n", at.name, at.file,
                at.line, msg);
    }
    set_error(e);
}

void release_barrier(void)
{
    for (int t = 0; t < L.threads; t++)
        if (pool[t]->state == AT_BARRIER)
            pool[t]->state = RUNNABLE;
    L.at_barrier = 0;
}

void fiber_main(void)
{
    for (;;) {
        L.body(L.closure);
        fiber *f = running;
        f->state = EXITED;
        L.exited++;
        /* lanes of its warp that wait for it never get it */
        int lane = f->tid & 31;
        warp_state *w = &L.warps[f->tid >> 5];
        for (int g = 0; g < w->n; g++)
            if ((w->group[g].mask >> lane & 1u) && !(w->group[g].arrived >> lane & 1u))
                fail("thread %d (lane %d of warp %d) exited, but lanes 0x%08x of its warp wait "
                     "for it in %s(0x%08x) at %s:%d", f->tid, lane, f->tid >> 5,
                     w->group[g].arrived, kind_name(w->group[g].kind), w->group[g].mask,
                     w->group[g].file, w->group[g].line);
        if (L.at_barrier > 0 && L.at_barrier + L.exited == L.threads)
            release_barrier();
        leave(f);
    }
}

/* what thread t is doing, for reports */
void describe(int t, char *buf, size_t size)
{
    const fiber *f = pool[t];
    switch (f->state) {
    case EXITED:
        snprintf(buf, size, "thread %d has exited", t);
        break;
    case AT_BARRIER:
        snprintf(buf, size, "thread %d waits at __syncthreads at %s:%d", t, f->file, f->line);
        break;
    case AT_WARP:
        snprintf(buf, size, "thread %d waits in %s(0x%08x) at %s:%d", t, kind_name(f->kind),
                 f->mask, f->file, f->line);
        break;
    default:
        snprintf(buf, size, "thread %d is runnable", t);
    }
}

void report_deadlock(void)
{
    char a[256], b[256];
    /* a warp operation missing a lane that waits elsewhere */
    for (int w = 0; w * 32 < L.threads; w++)
        for (int g = 0; g < L.warps[w].n; g++) {
            const warp_group *grp = &L.warps[w].group[g];
            unsigned missing = grp->mask & ~grp->arrived;
            int lane = __builtin_ctz(missing);
            describe(w * 32 + lane, b, sizeof b);
            fail("deadlock: lanes 0x%08x of warp %d wait in %s(0x%08x) at %s:%d for lane %d, "
                 "but %s", grp->arrived, w, kind_name(grp->kind), grp->mask, grp->file,
                 grp->line, lane, b);
            return;
        }
    for (int t = 0; t < L.threads; t++)
        if (pool[t]->state == AT_BARRIER)
            for (int u = 0; u < L.threads; u++)
                if (pool[u]->state != AT_BARRIER && pool[u]->state != EXITED) {
                    describe(t, a, sizeof a);
                    describe(u, b, sizeof b);
                    fail("deadlock: %s, but %s", a, b);
                    return;
                }
    fail("deadlock: no thread can run");
}

void check_guard(void)
{
    const unsigned char *g = (const unsigned char *)smem_arena + SMEM_REGION;
    for (size_t i = 0; i < SMEM_GUARD; i++)
        if (g[i] != 0xff) {
            fail("wrote past the end of its %zu bytes of dynamic shared memory (first at byte "
                 "%zu after it): the launch's smem argument is smaller than what the kernel uses",
                 smem_bytes, i);
            return;
        }
}

void run_block(void)
{
    L.generation++;
    L.exited = 0;
    L.at_barrier = 0;
    for (int w = 0; w * 32 < L.threads; w++)
        L.warps[w].n = 0;
    for (int t = 0; t < L.threads; t++) {
        fiber *f = pool[t];
        f->slot.idx.x = (unsigned)t % block_dim.x;
        f->slot.idx.y = (unsigned)t / block_dim.x % block_dim.y;
        f->slot.idx.z = (unsigned)t / (block_dim.x * block_dim.y);
        f->state = RUNNABLE;
    }
    while (L.exited < L.threads && !L.failed) {
        bool progress = false;
        for (int t = 0; t < L.threads && !L.failed; t++)
            if (pool[t]->state == RUNNABLE) {
                running = pool[t];
                current = &pool[t]->slot;
                pool[t]->state = IDLE; /* until it waits or exits */
                enter(pool[t]);
                progress = true;
            }
        running = NULL;
        if (!progress && !L.failed)
            report_deadlock();
    }
    running = NULL;
    if (!L.failed && smem_generation == L.generation)
        check_guard();
    for (int t = 0; t < L.threads; t++) /* IDLE after an exit; mid-kernel after a failure */
        if (pool[t]->state != EXITED || L.failed)
            fiber_reset(pool[t]);
        else
            pool[t]->state = IDLE;
}

int lane_of(const fiber *f) { return f->tid & 31; }

} // namespace

/* ---- synchronisation ------------------------------------------------------------ */

void cudacpu::syncthreads(const char *file, int line)
{
    fiber *f = running;
    f->file = file;
    f->line = line;
    L.at_barrier++;
    if (L.at_barrier + L.exited == L.threads) {
        release_barrier();
        return;
    }
    f->state = AT_BARRIER;
    leave(f);
}

uint64_t cudacpu::warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width,
                          const char *file, int line)
{
    fiber *f = running;
    int lane = lane_of(f), w = f->tid >> 5;
    int lanes = L.threads - w * 32 < 32 ? L.threads - w * 32 : 32;
    unsigned exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
    const char *op = kind_name(kind);
    if (!(mask >> lane & 1u))
        fail("thread %d (lane %d of warp %d) calls %s(0x%08x) at %s:%d, a mask without its own "
             "lane", f->tid, lane, w, op, mask, file, line);
    if (mask & ~exist)
        fail("%s(0x%08x) at %s:%d names lanes that do not exist (warp %d has %d lanes: blocks "
             "of %d threads)", op, mask, file, line, w, lanes, L.threads);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s at %s:%d: width %d is not a power of two up to 32", op, file, line, width);
    for (int l = 0; l < lanes; l++)
        if ((mask >> l & 1u) && pool[w * 32 + l]->state == EXITED)
            fail("thread %d (lane %d of warp %d) calls %s(0x%08x) at %s:%d, but lane %d of its "
                 "mask has exited", f->tid, lane, w, op, mask, file, line, l);
    warp_state *ws = &L.warps[w];
    warp_group *g = NULL;
    /* Masks may overlap: lanes of this mask may still wait in another
     * operation (two half-warps shuffling, then one whole-warp shuffle) and
     * arrive here once it completes.  Lanes that never arrive show up as
     * an exit or a deadlock. */
    for (int i = 0; i < ws->n && !g; i++)
        if (ws->group[i].mask == mask)
            g = &ws->group[i];
    if (!g) {
        if (ws->n == GROUPS)
            fail("more than %d warp operations with different masks wait at once", GROUPS);
        g = &ws->group[ws->n++];
        g->mask = mask;
        g->arrived = 0;
        g->kind = kind;
        g->file = file;
        g->line = line;
    } else if (g->kind != kind) {
        fail("lanes disagree: lanes 0x%08x of warp %d wait in %s at %s:%d, while lane %d calls "
             "%s at %s:%d", g->arrived, w, kind_name(g->kind), g->file, g->line, lane, op, file,
             line);
    }
    g->value[lane] = value;
    g->arg[lane] = arg;
    g->width[lane] = width;
    g->arrived |= 1u << lane;
    if (g->arrived != mask) {
        f->state = AT_WARP;
        f->kind = kind;
        f->mask = mask;
        f->file = file;
        f->line = line;
        leave(f);
        return f->result;
    }
    /* every lane is here: compute all the results */
    unsigned votes = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && g->value[l])
            votes |= 1u << l;
    uint64_t mine = 0;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1u))
            continue;
        uint64_t r = 0;
        int wd = g->width[l], seg = l & ~(wd - 1), src = l;
        switch (kind) {
        case W_SHFL: src = seg + (g->arg[l] & (wd - 1)); break;
        case W_SHFL_XOR: src = l ^ g->arg[l]; src = src >= seg + wd || src < seg ? l : src; break;
        case W_SHFL_UP: src = l - g->arg[l]; src = src < seg ? l : src; break;
        case W_SHFL_DOWN: src = l + g->arg[l]; src = src >= seg + wd ? l : src; break;
        case W_BALLOT: r = votes; break;
        case W_ANY: r = votes != 0; break;
        case W_ALL: r = votes == mask; break;
        case W_SYNCWARP: break;
        }
        if (kind <= W_SHFL_DOWN) {
            if (src != l && !(mask >> src & 1u))
                fail("thread %d (lane %d of warp %d) reads lane %d in %s(0x%08x) at %s:%d: "
                     "lane %d is outside the mask, so its value is undefined", w * 32 + l, l, w,
                     src, kind_name(kind), mask, g->file, g->line, src);
            r = g->value[src];
        }
        if (l == lane)
            mine = r;
        else {
            pool[w * 32 + l]->result = r;
            pool[w * 32 + l]->state = RUNNABLE;
        }
    }
    *g = ws->group[--ws->n]; /* remove it */
    return mine;
}

/* ---- shared memory --------------------------------------------------------------- */

void *cudacpu::dynamic_shared(void)
{
    char *base = smem_arena + SMEM_REGION - smem_bytes;
    if (smem_generation != L.generation) {
        memset(base, 0xff, smem_bytes + SMEM_GUARD); /* NaN as float and double */
        smem_generation = L.generation;
    }
    return base;
}

void cudacpu::shared_static(void *p, size_t bytes, unsigned long *generation)
{
    if (*generation != L.generation) {
        memset(p, 0xff, bytes);
        *generation = L.generation;
    }
}

/* ---- launches ---------------------------------------------------------------------- */

namespace {
struct attribute {
    const void *fn;
    int max_dynamic_smem;
};
attribute attributes[256];
int n_attributes;

int smem_allowed(const void *fn)
{
    for (int i = 0; i < n_attributes; i++)
        if (attributes[i].fn == fn)
            return attributes[i].max_dynamic_smem;
    return -1;
}
} // namespace

cudaError_t cudacpu::func_set_attribute(const void *fn, cudaFuncAttribute attr, int value)
{
    std::lock_guard<std::recursive_mutex> hold(api_lock);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaSuccess;
    if (value < 0 || (size_t)value > SMEM_OPTIN) {
        set_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    for (int i = 0; i < n_attributes; i++)
        if (attributes[i].fn == fn) {
            attributes[i].max_dynamic_smem = value;
            return cudaSuccess;
        }
    if (n_attributes == 256)
        return cudaErrorNotSupported;
    attributes[n_attributes++] = attribute{fn, value};
    return cudaSuccess;
}

/* ---- streams: queues -------------------------------------------------------------------- */

/*
 * A stream is a queue.  Kernel launches, cudaMemcpyAsync, cudaMemsetAsync,
 * host functions (cudaLaunchHostFunc: the fake cuDNN and cuBLASLt queue
 * their work so), event records and cudaStreamWaitEvent are queued on their
 * stream when called and run only when a synchronisation needs them:
 *
 *   cudaStreamSynchronize(s),
 *   cudaStreamQuery(s)          s's queue, up to its end;
 *   cudaEventSynchronize(e),
 *   cudaEventQuery(e)           e's stream, up to e's latest record;
 *   cudaDeviceSynchronize,
 *   cudaFree, cudaFreeHost      every queue (their implicit device sync);
 *   cudaMemcpy                  the legacy default stream, as CUDA's
 *                               "API synchronization behavior" says
 *                               (below), and so the blocking streams'
 *                               work queued before it, not the
 *                               cudaStreamNonBlocking streams';
 *   a queued cudaStreamWaitEvent, when its own stream reaches it: the
 *                               event's stream up to the record first.
 *
 * Running a queue runs its operations in order; a wait runs the other
 * stream's prefix then and there.  Nothing else runs: work no
 * synchronisation asked for stays queued, so it happens as late as a GPU
 * may do it, after the host and the other streams have moved on.  That
 * order (CUDACPU_STREAM_ORDER=lazy, the default) is deterministic, and it
 * is the adversarial one for a missing wait: a consumer that does not wait
 * for its producer's stream runs before the producer.  The opposite
 * mistake, a producer that does not wait for the consumers still reading
 * its destination, shows when the producer's stream is synchronised first;
 * CUDACPU_STREAM_ORDER=reverse makes every synchronisation first run every
 * queue to its end, newest stream first (the copy stream before the
 * compute stream it was made after), for stress runs.
 * CUDACPU_STREAM_ORDER=immediate runs everything when it is queued (the
 * harness's old behaviour): a test that fails lazily and passes
 * immediately has a stream bug.
 *
 * The legacy default stream (stream 0) and the blocking streams
 * (cudaStreamCreate, flags 0) wait for each other: work queued on the
 * legacy stream first waits for all work queued before it on every
 * blocking stream, and work queued on a blocking stream for the legacy
 * stream's.  cudaStreamNonBlocking streams (the backend's) wait for
 * neither.  Events capture their stream's queue when recorded; a wait or
 * synchronisation uses the latest record at the time of the call, and an
 * event never recorded is complete.
 *
 * Copies.  Memory is device memory (cudaMalloc), pinned host memory
 * (cudaHostAlloc, cudaMallocHost) or pageable (anything else).
 * cudaMemcpyAsync is always treated as fully asynchronous, pageable memory
 * included (CUDA says it "might be synchronous" there, so nothing may rely
 * on it): the source is read, and the destination written, when the queue
 * runs it.  The host destination of a device-to-host copy is filled with
 * NaN bytes when the copy is queued (unless a queued copy still reads it),
 * so a host read before the synchronisation sees NaN, not a plausible
 * older value (a GPU would show the older value).  cudaMemcpy runs
 * on the legacy stream and returns when CUDA says it does: device to host
 * and host to host after the copy, pinned host to device after it too,
 * pageable host to device once the legacy stream is synchronised and the
 * source staged (the copy itself stays queued), device to device at once.
 * cudaMemset is queued on the legacy stream (synchronous only for pinned
 * host memory).
 *
 * A library call that waits for other processes (launch_library_poll: the
 * fake NCCL's collectives, tests/cudacpu/nccl.cpp) is polled when its
 * stream reaches it and stays at the front of the queue until it says it
 * is done: cudaStreamQuery and cudaEventQuery (and the immediate order's
 * runs) stop there and answer cudaErrorNotReady, as a GPU does while a
 * kernel waits for its peers; every other synchronisation waits for it,
 * letting go of the runtime's lock between polls so that the process's
 * other threads go on (one of them may abort the communicator, which ends
 * the wait).  Another thread's query of a stream being run meanwhile
 * answers cudaErrorNotReady; its synchronisation waits.
 *
 * Errors: a refused launch is reported when launched; a kernel that fails
 * does so when its queue runs, and the error is sticky, returned by the
 * synchronisations and cudaGetLastError from then on.
 */

namespace cudacpu {
/* A vector clock ("stream hazards", below): for each stream id, how many
 * of that stream's operations are ordered before this point; sparse, as
 * few streams are in play between two device-wide synchronisations. */
struct vclock {
    std::vector<std::pair<int, uint64_t>> v; /* by stream id */
    uint64_t of(int id) const
    {
        for (const auto &e : v)
            if (e.first == id)
                return e.second;
        return 0;
    }
    void raise(int id, uint64_t n)
    {
        for (auto &e : v)
            if (e.first == id) {
                e.second = std::max(e.second, n);
                return;
            }
        v.emplace_back(id, n);
    }
    void join(const vclock &o)
    {
        for (const auto &e : o.v)
            raise(e.first, e.second);
    }
};

enum op_kind { OP_KERNEL, OP_COPY, OP_SET, OP_HOST, OP_WAIT, OP_MARK };
struct queued_op {
    op_kind kind;
    /* OP_KERNEL */
    const void *fn;
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t smem;
    void (*body)(void *);
    void *closure;
    void (*release)(void *);
    std::vector<kernel_arg> args; /* its pointer arguments */
    /* OP_COPY, OP_SET */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    void *owned; /* the staged source of a blocking copy, freed after it */
    /* OP_HOST */
    cudaHostFn_t host;
    void *arg;
    /* a library call that waits (the fake NCCL's collectives): called
     * until it says it is done, instead of host(arg) once */
    int (*poll)(void *);
    bool started; /* polled once already: what it touches recorded */
    const char *what;                 /* a library call's name */
    std::vector<cudacpu_touch> touch; /* the bytes it reads and writes */
    /* OP_WAIT: `on` up to its operation number `upto` */
    cudacpu_stream *on;
    uint64_t upto;
    /* what is ordered before it (an OP_WAIT: what it waits for) */
    vclock clock;
};

/* what an operation that ran touched, for the hazard check: [lo, hi) of
 * device or pinned memory (a kernel's pointer argument: its one address) */
struct touch {
    uintptr_t lo, hi;
    bool write;
};
struct ran_op {
    uint64_t pos; /* its operation number on its stream, from 1 */
    op_kind kind;
    const char *name, *file; /* a kernel's */
    int line;
    size_t bytes; /* a copy's or memset's */
    std::vector<touch> touched;
};
} // namespace cudacpu

struct cudacpu_stream {
    unsigned flags;
    int id; /* creation order; 0 is the legacy default stream */
    bool legacy, destroyed, running;
    const void *runner; /* the thread running it (its thread_self), while running */
    std::deque<queued_op> queue;
    uint64_t issued, done; /* operations queued and run so far */
    cudacpu::vclock clock; /* of its latest queued operation */
    std::deque<cudacpu::ran_op> history; /* ran, and not yet ordered before everything */
};
struct cudacpu_event {
    unsigned flags;
    cudacpu_stream *stream; /* of its latest record; NULL before the first */
    uint64_t at;            /* complete once stream->done reaches it */
    cudacpu::vclock clock;  /* what its latest record is ordered after */
};

namespace {

/* how deep this thread holds api_lock: a wait for a library call that
 * polls (the fake NCCL waiting for its peers) lets go of it entirely, as
 * a GPU's host thread does not stop the others while a kernel waits */
thread_local int hold_depth;
struct api_hold {
    api_hold() { api_lock.lock(), hold_depth++; }
    ~api_hold() { hold_depth--, api_lock.unlock(); }
};
#define HOLD api_hold hold

/* this thread, for cudacpu_stream::runner */
thread_local char thread_self;

/* Set while this thread answers cudaStreamQuery or cudaEventQuery (or runs
 * what the immediate order queued): a library call that polls and is not
 * done yet stops the run there, and the query says cudaErrorNotReady.
 * Any other synchronisation waits for it. */
thread_local int querying;
struct query_scope {
    query_scope() { querying++; }
    ~query_scope() { querying--; }
};

/* a moment outside api_lock, so that the other threads of the process
 * (the one that will abort the communicator, say) get to run their calls */
void wait_outside_lock(void)
{
    int depth = hold_depth;
    for (int i = 0; i < depth; i++)
        api_lock.unlock();
    usleep(50);
    for (int i = 0; i < depth; i++)
        api_lock.lock();
}

enum order_mode { ORDER_LAZY, ORDER_REVERSE, ORDER_IMMEDIATE };

int order_set = -1; /* CUDACPU_STREAM_ORDER, read once, or set_stream_order's */

int order_named(const char *v)
{
    if (!v || !*v || !strcmp(v, "lazy"))
        return ORDER_LAZY;
    if (!strcmp(v, "reverse"))
        return ORDER_REVERSE;
    if (!strcmp(v, "immediate"))
        return ORDER_IMMEDIATE;
    return -1;
}

order_mode stream_order(void)
{
    if (order_set < 0) {
        const char *v = getenv("CUDACPU_STREAM_ORDER");
        order_set = order_named(v);
        if (order_set < 0) {
            fprintf(stderr, "cudacpu: CUDACPU_STREAM_ORDER=%s: expected lazy, reverse or "
                    "immediate\n", v);
            abort();
        }
    }
    return (order_mode)order_set;
}

/* every stream ever created, in creation order (destroyed ones run their
 * queued work to the end, as on a GPU, and are kept: events may name them) */
std::vector<cudacpu_stream *> streams;

cudacpu_stream *legacy_stream(void)
{
    static cudacpu_stream *legacy = [] {
        cudacpu_stream *s = new cudacpu_stream();
        s->legacy = true;
        streams.insert(streams.begin(), s);
        return s;
    }();
    return legacy;
}

cudacpu_stream *stream_of(cudaStream_t s) { return s ? s : legacy_stream(); }

bool blocking(const cudacpu_stream *s) { return !s->legacy && !(s->flags & cudaStreamNonBlocking); }

bool run_until(cudacpu_stream *s, uint64_t upto);

/* what the host knows has completed (synchronisations it returned from):
 * work queued from now on is ordered after it */
vclock host_clock;

void push(cudacpu_stream *s, queued_op &&o)
{
    s->issued++;
    s->clock.join(host_clock);
    if (o.kind == OP_WAIT)
        s->clock.join(o.clock);
    s->clock.raise(s->id, s->issued);
    o.clock = s->clock;
    s->queue.push_back(std::move(o));
}

queued_op wait_op(cudacpu_stream *on, uint64_t upto, const vclock &clock)
{
    queued_op o{};
    o.kind = OP_WAIT;
    o.on = on;
    o.upto = upto;
    o.clock = clock;
    return o;
}

queued_op mark_op(void)
{
    queued_op o{};
    o.kind = OP_MARK;
    return o;
}

void enqueue(cudacpu_stream *s, queued_op &&o)
{
    /* the legacy stream and the blocking streams wait for each other */
    if (s->legacy) {
        for (cudacpu_stream *t : streams)
            if (blocking(t) && t->done < t->issued)
                push(s, wait_op(t, t->issued, t->clock));
    } else if (blocking(s)) {
        cudacpu_stream *l = legacy_stream();
        if (l->done < l->issued)
            push(s, wait_op(l, l->issued, l->clock));
    }
    push(s, std::move(o));
    if (stream_order() == ORDER_IMMEDIATE) {
        query_scope q; /* a call that waits for its peers is left queued */
        run_until(s, s->issued);
    }
}

void run_kernel(const queued_op &o);
bool hazard_free(cudacpu_stream *s, const queued_op &o);

void execute(queued_op &o)
{
    switch (o.kind) {
    case OP_KERNEL:
        if (sticky_error == cudaSuccess) /* a kernel failed earlier: nothing runs any more */
            run_kernel(o);
        o.release(o.closure);
        break;
    case OP_COPY:
        if (o.bytes)
            memmove(o.dst, o.src, o.bytes);
        free(o.owned);
        break;
    case OP_SET:
        memset(o.dst, o.value, o.bytes);
        break;
    case OP_HOST:
        o.host(o.arg);
        break;
    case OP_WAIT:
        run_until(o.on, o.upto);
        break;
    case OP_MARK:
        break;
    }
}

/* Runs s's queue until `upto` operations have run.  A wait runs the other
 * stream's prefix; that prefix can only wait for work queued before the
 * wait was, which has run, so no stream re-enters itself.
 *
 * A library call that polls (launch_library_poll) stays at the front of
 * the queue until it says it is done: while querying, the run stops there
 * and returns false (the query answers cudaErrorNotReady); otherwise it
 * polls again after a moment outside api_lock, during which other threads
 * may queue work, query (a stream another thread runs is not ready) or
 * wait for the same stream (they wait for that thread to finish it). */
bool run_until(cudacpu_stream *s, uint64_t upto)
{
    if (s->done >= upto)
        return true;
    while (s->running) {
        if (s->runner == &thread_self) {
            fprintf(stderr, "cudacpu: internal error: stream %d waits for its own later work\n",
                    s->id);
            abort();
        }
        if (querying)
            return false;
        wait_outside_lock();
        if (s->done >= upto)
            return true;
    }
    s->running = true;
    s->runner = &thread_self;
    while (s->done < upto) {
        queued_op &front = s->queue.front();
        if (front.kind == OP_WAIT) { /* left queued until the other stream got there */
            if (!run_until(front.on, front.upto)) {
                s->running = false;
                return false;
            }
        } else if (front.kind == OP_HOST && front.poll) {
            if (!front.started) {
                front.started = true;
                hazard_free(s, front); /* a hazard is reported, and sticky; it still runs */
            }
            while (!s->queue.front().poll(s->queue.front().arg)) {
                if (querying) {
                    s->running = false;
                    return false;
                }
                wait_outside_lock();
            }
        }
        queued_op o = std::move(s->queue.front());
        s->queue.pop_front();
        if (o.kind == OP_WAIT || (o.kind == OP_HOST && o.poll)) { /* done above */
            s->done++;
            continue;
        }
        if (!hazard_free(s, o) && o.kind == OP_KERNEL) { /* stopped: the error is sticky */
            o.release(o.closure);
            s->done++;
            continue;
        }
        execute(o);
        s->done++;
    }
    s->running = false;
    return true;
}

/* every queue to its end: oldest stream first, or newest first */
void run_all(bool newest_first)
{
    for (size_t i = 0; i < streams.size(); i++) {
        cudacpu_stream *t = streams[newest_first ? streams.size() - 1 - i : i];
        run_until(t, t->issued);
    }
}

void forget_history(void);

/* a synchronisation that needs s's first `upto` operations, which are
 * ordered after `clock`: the host knows that much has completed */
bool synchronize(cudacpu_stream *s, uint64_t upto, const vclock &clock)
{
    if (stream_order() == ORDER_REVERSE)
        run_all(true);
    if (!run_until(s, upto))
        return false; /* querying, and a library call still waits */
    host_clock.join(clock);
    return true;
}

void synchronize_device(void)
{
    run_all(stream_order() == ORDER_REVERSE);
    forget_history(); /* everything queued has completed */
}

/* the legacy stream, with the blocking streams' work queued before now */
bool synchronize_legacy(void)
{
    cudacpu_stream *l = legacy_stream();
    enqueue(l, mark_op());
    return synchronize(l, l->issued, l->clock);
}

/* ---- what memory is what ----------------------------------------------------------------- */

enum memory_kind { PAGEABLE, DEVICE, PINNED };
struct allocation {
    size_t bytes;
    memory_kind kind;
};
std::map<uintptr_t, allocation> allocations;

memory_kind memory_of(const void *p)
{
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it == allocations.begin())
        return PAGEABLE;
    --it;
    return (uintptr_t)p < it->first + it->second.bytes ? it->second.kind : PAGEABLE;
}

/* a queued copy still reads [p, p + n) */
bool queued_read(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (const cudacpu_stream *t : streams)
        for (const queued_op &o : t->queue)
            if (o.kind == OP_COPY && (uintptr_t)o.src < a + n && a < (uintptr_t)o.src + o.bytes)
                return true;
    return false;
}

bool host_side(const void *p, cudaMemcpyKind kind, bool is_dst)
{
    switch (kind) {
    case cudaMemcpyHostToHost: return true;
    case cudaMemcpyHostToDevice: return !is_dst;
    case cudaMemcpyDeviceToHost: return is_dst;
    case cudaMemcpyDeviceToDevice: return false;
    default: return memory_of(p) != DEVICE;
    }
}

queued_op copy_op(void *dst, const void *src, size_t bytes)
{
    queued_op o{};
    o.kind = OP_COPY;
    o.dst = dst;
    o.src = src;
    o.bytes = bytes;
    return o;
}

/* ---- stream hazards ------------------------------------------------------------------------ */

/*
 * Queued streams make a missing wait give a wrong result in the order the
 * harness picks; the hazard check makes it an error in any order.  Each
 * operation gets a vector clock when queued: for every stream, how many of
 * its operations are ordered before this one, by queue order, a queued
 * cudaStreamWaitEvent (the event's clock when recorded), the legacy
 * stream's joins with the blocking streams, and what the host had
 * synchronised before queueing it (cudaStreamSynchronize,
 * cudaEventSynchronize, a blocking cudaMemcpy, cudaDeviceSynchronize,
 * cudaFree).  When an operation runs, what it touches is compared with
 * what the other streams' operations that ran before it touched and that
 * its clock does not order before it: the same bytes, one of them writing,
 * is a hazard, reported with both operations and their streams, and the
 * error is sticky as a failed kernel's (nothing runs after it).
 *
 * What is known of what an operation touches: a copy its source and
 * destination, a memset its destination (device and pinned memory only),
 * a kernel the addresses of its pointer arguments (written unless a
 * pointer to const), not their extent: a kernel's argument that points
 * into bytes another stream copies or sets is seen, two kernels whose
 * pointer arguments differ are never compared.  Host functions (the fake
 * cuDNN and cuBLASLt) and the host's own reads and writes are not seen;
 * queued streams and the NaN fill of a device-to-host copy catch those.
 */

bool hazard_check = true; /* set_hazard_check */

bool tracked(const void *p) { return p && memory_of(p) != PAGEABLE; }

void touched_by(const queued_op &o, std::vector<touch> &out)
{
    auto add = [&](const void *p, size_t n, bool write) {
        if (n && tracked(p))
            out.push_back(touch{(uintptr_t)p, (uintptr_t)p + n, write});
    };
    switch (o.kind) {
    case OP_KERNEL:
        for (const kernel_arg &a : o.args)
            add(a.p, 1, a.writes);
        break;
    case OP_COPY:
        if (!o.owned) /* a staged pageable source is the harness's own */
            add(o.src, o.bytes, false);
        add(o.dst, o.bytes, true);
        break;
    case OP_SET:
        add(o.dst, o.bytes, true);
        break;
    case OP_HOST:
        for (const cudacpu_touch &t : o.touch)
            add(t.p, t.bytes, t.writes);
        break;
    default:
        break;
    }
}

/* streams whose history is not empty */
std::vector<cudacpu_stream *> recording;

void forget_history(void)
{
    /* every queue has run: an operation queued from now on comes after
     * all that ran, whatever the clocks said, so they start afresh */
    for (cudacpu_stream *t : recording)
        t->history.clear();
    recording.clear();
    for (cudacpu_stream *t : streams)
        t->clock = vclock();
    host_clock = vclock();
}

/* Drops what t ran that every operation still to run is ordered after. */
void prune(cudacpu_stream *t)
{
    uint64_t bound = UINT64_MAX;
    for (const cudacpu_stream *u : streams) {
        if (u == t || (u->destroyed && u->queue.empty()))
            continue;
        const vclock &c = u->queue.empty() ? u->clock : u->queue.front().clock;
        bound = std::min(bound, std::max(c.of(t->id), host_clock.of(t->id)));
    }
    while (!t->history.empty() && t->history.front().pos <= bound)
        t->history.pop_front();
}

void describe_op(const cudacpu_stream *s, const ran_op &r, char *buf, size_t size)
{
    char stream[64];
    snprintf(stream, sizeof stream, "stream %d%s", s->id,
             s->legacy ? " (the legacy default stream)"
                       : (s->flags & cudaStreamNonBlocking) ? " (non-blocking)" : " (blocking)");
    switch (r.kind) {
    case OP_KERNEL:
        snprintf(buf, size, "kernel %s (launched at %s:%d, operation %llu of %s)", r.name, r.file,
                 r.line, (unsigned long long)r.pos, stream);
        break;
    case OP_COPY:
        snprintf(buf, size, "a copy of %zu bytes (operation %llu of %s)", r.bytes,
                 (unsigned long long)r.pos, stream);
        break;
    case OP_HOST:
        snprintf(buf, size, "%s (operation %llu of %s)", r.name, (unsigned long long)r.pos,
                 stream);
        break;
    default:
        snprintf(buf, size, "a memset of %zu bytes (operation %llu of %s)", r.bytes,
                 (unsigned long long)r.pos, stream);
    }
}

/* Checks o, about to run on s, against what other streams ran unordered
 * with it, and records what it touches.  False: a hazard, reported. */
bool hazard_free(cudacpu_stream *s, const queued_op &o)
{
    if (!hazard_check || sticky_error != cudaSuccess ||
        (o.kind != OP_KERNEL && o.kind != OP_COPY && o.kind != OP_SET && o.kind != OP_HOST))
        return true;
    ran_op me{o.clock.of(s->id), o.kind, o.kind == OP_HOST ? o.what : o.name, o.file, o.line,
              o.bytes, {}};
    touched_by(o, me.touched);
    if (me.touched.empty())
        return true;
    for (cudacpu_stream *t : recording) {
        if (t == s)
            continue;
        uint64_t ordered = o.clock.of(t->id);
        for (auto r = t->history.rbegin(); r != t->history.rend() && r->pos > ordered; ++r)
            for (const touch &a : me.touched)
                for (const touch &b : r->touched)
                    if (a.lo < b.hi && b.lo < a.hi && (a.write || b.write)) {
                        if (reports++ < MAX_REPORTS) {
                            char mine[512], theirs[512];
                            describe_op(s, me, mine, sizeof mine);
                            describe_op(t, *r, theirs, sizeof theirs);
                            uintptr_t at = std::max(a.lo, b.lo);
                            fprintf(stderr, "cudacpu: stream hazard: %s %s %p, which %s %s "
                                    "with nothing ordering the two (no "
                                    "cudaStreamWaitEvent, synchronisation or legacy-stream "
                                    "join between stream %d and stream %d)\n", mine,
                                    a.write ? "writes" : "reads", (void *)at, theirs,
                                    b.write ? "wrote" : "read", t->id, s->id);
                        }
                        sticky_error = cudaErrorLaunchFailure;
                        set_error(cudaErrorLaunchFailure);
                        return false;
                    }
    }
    if (s->history.empty())
        recording.push_back(s);
    s->history.push_back(std::move(me));
    if (s->history.size() % 256 == 0)
        prune(s);
    return true;
}

} // namespace

/* ---- launches ---------------------------------------------------------------------------- */

bool cudacpu::set_hazard_check(bool on)
{
    HOLD;
    bool was = hazard_check;
    synchronize_device();
    hazard_check = on;
    return was;
}

int cudacpu::set_stream_order(const char *name)
{
    HOLD;
    int mode = order_named(name);
    if (mode < 0)
        return -1;
    synchronize_device(); /* in the order it was */
    order_set = mode;
    return 0;
}

void cudacpu::launch_grid(const void *fn, const char *name, const char *file, int line,
                          const config &c, void (*body)(void *), void *closure,
                          void (*release)(void *), const kernel_arg *args, int n_args)
{
    HOLD;
    launch_site at{name, file, line};
    if (sticky_error != cudaSuccess) { /* a kernel failed earlier: nothing runs any more */
        release(closure);
        return;
    }
    if (running) {
        refuse(at, cudaErrorNotSupported, "a launch from inside a kernel");
        release(closure);
        return;
    }
    const dim3 &g = c.grid, &b = c.block;
    unsigned long threads = (unsigned long)b.x * b.y * b.z;
    bool ok = false;
    if (threads == 0 || threads > MAX_THREADS || b.z > 64)
        refuse(at, cudaErrorInvalidConfiguration, "block (%u,%u,%u): blocks have 1 to 1024 "
               "threads, z at most 64", b.x, b.y, b.z);
    else if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
        refuse(at, cudaErrorInvalidConfiguration, "grid (%u,%u,%u): each dimension must be at "
               "least 1 (x at most 2^31-1, y and z at most 65535)", g.x, g.y, g.z);
    else {
        int allowed = smem_allowed(fn);
        if (c.smem > SMEM_DEFAULT && allowed < 0)
            refuse(at, cudaErrorInvalidValue, "%zu bytes of dynamic shared memory, above the "
                   "default 48 KiB: cudaFuncSetAttribute(kernel, "
                   "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) was not called for this "
                   "kernel", c.smem);
        else if (c.smem > SMEM_DEFAULT && c.smem > (size_t)allowed)
            refuse(at, cudaErrorInvalidValue, "%zu bytes of dynamic shared memory, above the %d "
                   "that cudaFuncSetAttribute allowed for this kernel", c.smem, allowed);
        else
            ok = true;
    }
    if (ok && !smem_arena) {
        void *p = mmap(NULL, SMEM_REGION + SMEM_GUARD + (size_t)getpagesize(),
                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            refuse(at, cudaErrorMemoryAllocation, "no memory for shared memory");
            ok = false;
        } else {
            smem_arena = (char *)p;
            mprotect(smem_arena + SMEM_REGION + SMEM_GUARD, (size_t)getpagesize(), PROT_NONE);
        }
    }
    if (!ok) {
        release(closure);
        return;
    }
    queued_op o{};
    o.kind = OP_KERNEL;
    o.fn = fn;
    o.name = name;
    o.file = file;
    o.line = line;
    o.grid = g;
    o.block = b;
    o.smem = c.smem;
    o.body = body;
    o.closure = closure;
    o.release = release;
    o.args.assign(args, args + n_args);
    enqueue(stream_of(c.stream), std::move(o));
}

namespace {
/* a queued grid, when its stream runs it: every block in turn */
void run_kernel(const queued_op &o)
{
    L.name = o.name;
    L.file = o.file;
    L.line = o.line;
    smem_bytes = (o.smem + 15) & ~(size_t)15;
    int threads = (int)(o.block.x * o.block.y * o.block.z);
    while (pool_size < threads) {
        pool[pool_size] = fiber_new(pool_size);
        pool_size++;
    }
    L.body = o.body;
    L.closure = o.closure;
    L.threads = threads;
    L.failed = false;
    block_dim = o.block;
    grid_dim = o.grid;
    for (unsigned z = 0; z < o.grid.z && !L.failed; z++)
        for (unsigned y = 0; y < o.grid.y && !L.failed; y++)
            for (unsigned x = 0; x < o.grid.x && !L.failed; x++) {
                block_idx.x = x;
                block_idx.y = y;
                block_idx.z = z;
                run_block();
            }
    current = NULL;
}
} // namespace

/* ---- the runtime API ------------------------------------------------------------------ */

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = sticky_error;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: break;
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure (cudacpu stopped a kernel: see its message above)";
    case cudaErrorNotSupported: return "operation not supported";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = 12080;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = 12080;
    return cudaSuccess;
}
/* CUDACPU_DEVICES=N (1 to 64; 1 when unset): N devices, every one the
 * same emulated GPU, so that local rank r of a job on one machine drives
 * device r as on a node of N GPUs (the nccl comm plugin through the fake
 * NCCL, tests/cudacpu/nccl.cpp).  Memory is not per device. */
static int device_count(void)
{
    static int n = [] {
        const char *v = getenv("CUDACPU_DEVICES");
        char *end = NULL;
        long k = v && *v ? strtol(v, &end, 10) : 1;
        if (v && *v && (*end || k < 1 || k > 64)) {
            fprintf(stderr, "cudacpu: CUDACPU_DEVICES=%s: expected a number of devices from 1 "
                    "to 64\n", v);
            abort();
        }
        return (int)k;
    }();
    return n;
}
static thread_local int current_device; /* cudaSetDevice's, per host thread as in CUDA */

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (device < 0 || device >= device_count())
        return cudaErrorInvalidValue;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudacpu (CUDA kernels on the CPU, sm_80 limits)");
    p->totalGlobalMem = (size_t)16 << 30;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->warpSize = 32;
    p->maxThreadsPerBlock = MAX_THREADS;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 1;
    p->major = 8;
    p->minor = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count())
        return cudaErrorInvalidValue;
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    HOLD;
    synchronize_device();
    return sticky_error;
}
/* clears a failed kernel's sticky error; queued work is dropped, as a
 * reset destroys it */
cudaError_t cudaDeviceReset(void)
{
    HOLD;
    for (cudacpu_stream *t : streams) {
        for (queued_op &o : t->queue) {
            if (o.kind == OP_KERNEL)
                o.release(o.closure);
            if (o.kind == OP_COPY)
                free(o.owned);
        }
        t->queue.clear();
        t->done = t->issued;
    }
    forget_history();
    sticky_error = last_error = cudaSuccess;
    n_attributes = 0;
    return cudaSuccess;
}

static cudaError_t allocate(void **p, size_t bytes, memory_kind kind)
{
    HOLD;
    *p = NULL;
    if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) {
        *p = NULL;
        set_error(cudaErrorMemoryAllocation);
        return cudaErrorMemoryAllocation;
    }
    memset(*p, 0xff, bytes); /* cudaMalloc does not zero: NaN shows a read before a write */
    allocations[(uintptr_t)*p] = allocation{bytes ? bytes : 1, kind};
    return cudaSuccess;
}
static cudaError_t release_memory(void *p)
{
    HOLD;
    if (!p)
        return cudaSuccess;
    synchronize_device(); /* cudaFree's implicit synchronisation */
    allocations.erase((uintptr_t)p);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) { return allocate(p, bytes, DEVICE); }
cudaError_t cudaFree(void *p) { return release_memory(p); }
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    (void)flags;
    return allocate(p, bytes, PINNED);
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return allocate(p, bytes, PINNED); }
cudaError_t cudaFreeHost(void *p) { return release_memory(p); }

/* ---- virtual memory (include/cuda.h) -------------------------------------------------------
 *
 * The driver's virtual memory management on host pages, as the backend
 * gets it through cudaGetDriverEntryPointByVersion:
 *
 *   cuMemAddressReserve  an anonymous PROT_NONE mapping, aligned to the
 *                        granularity (2 MiB), counted as device memory
 *                        (memory_of: the hazard check, cudaMemcpyDefault);
 *   cuMemCreate          a memfd of the size, filled with 0xff bytes (NaN:
 *                        physical memory comes uninitialised, as
 *                        cudaMalloc's does here), within CUDACPU_VMM_LIMIT
 *                        bytes of live cuMemCreate memory when the
 *                        environment sets one (else CUDA_ERROR_OUT_OF_MEMORY);
 *   cuMemMap             the memfd mapped MAP_FIXED | MAP_SHARED at the
 *                        address, PROT_NONE until cuMemSetAccess;
 *   cuMemSetAccess       mprotect read/write (or read, or none);
 *   cuMemUnmap           PROT_NONE anonymous memory mapped over the range
 *                        again: the pages go, and a touch faults;
 *   cuMemRelease         the handle closed; its memory lives while mapped;
 *   cuMemAddressFree     the reservation unmapped.
 *
 * So memory the backend unmapped faults when anything touches it -- a
 * kernel, a copy or memset when its queue runs, the host -- with SIGSEGV
 * where a GPU reports an illegal address.  Misuse the driver refuses is
 * refused and reported (`cudacpu: cuMemMap: ...`): sizes and addresses not
 * multiples of the granularity, mapping over a mapping or outside a
 * reservation, unmapping or setting access on a range that is not wholly
 * mapped (an unmap must cover whole mappings), a released or unknown handle,
 * freeing a reservation that still has mappings.  Not modelled: several
 * devices, exporting handles, access from other devices, and any
 * implicit synchronisation (none is documented; unmapping what queued work
 * still reads is the caller's bug, and faults here when the queue runs).
 */
namespace {
constexpr size_t VMM_GRANULARITY = (size_t)2 << 20;

struct vmm_handle {
    int fd;
    size_t bytes;
    int maps;      /* mappings of it */
    bool released; /* cuMemRelease'd: gone once unmapped */
};
struct vmm_mapping {
    size_t bytes;
    CUmemGenericAllocationHandle handle;
};
struct vmm_reservation {
    size_t bytes;
    std::map<uintptr_t, vmm_mapping> maps; /* by address */
};
std::map<CUmemGenericAllocationHandle, vmm_handle> vmm_handles;
CUmemGenericAllocationHandle vmm_next_handle = 1;
std::map<uintptr_t, vmm_reservation> vmm_reserved; /* by base */
size_t vmm_live; /* bytes of cuMemCreate memory not given back yet */

CUresult vmm_refuse(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
CUresult vmm_refuse(CUresult r, const char *fmt, ...)
{
    if (reports++ < MAX_REPORTS) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fprintf(stderr, "cudacpu: %s\n", msg);
    }
    return r;
}

bool vmm_device_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < device_count();
}

/* the reservation holding [p, p + n), or vmm_reserved.end() */
std::map<uintptr_t, vmm_reservation>::iterator vmm_reservation_of(uintptr_t p, size_t n)
{
    auto it = vmm_reserved.upper_bound(p);
    if (it == vmm_reserved.begin())
        return vmm_reserved.end();
    --it;
    return p + n <= it->first + it->second.bytes ? it : vmm_reserved.end();
}

/* [p, p + n) wholly covered by mappings that start at p and end at p + n */
bool vmm_whole_mappings(const vmm_reservation &r, uintptr_t p, size_t n)
{
    uintptr_t at = p;
    for (auto it = r.maps.find(p); it != r.maps.end() && it->first == at && at < p + n; ++it)
        at += it->second.bytes;
    return at == p + n;
}

/* [p, p + n) has no byte unmapped (mappings may start before p, end after) */
bool vmm_fully_mapped(const vmm_reservation &r, uintptr_t p, size_t n)
{
    auto it = r.maps.upper_bound(p);
    if (it == r.maps.begin())
        return false;
    --it;
    uintptr_t at = p;
    for (; it != r.maps.end() && it->first <= at && at < p + n; ++it)
        at = std::max(at, it->first + it->second.bytes);
    return at >= p + n;
}

void vmm_handle_done(CUmemGenericAllocationHandle h)
{
    auto it = vmm_handles.find(h);
    if (it != vmm_handles.end() && it->second.released && it->second.maps == 0) {
        vmm_live -= it->second.bytes;
        vmm_handles.erase(it);
    }
}

size_t vmm_limit(void)
{
    const char *v = getenv("CUDACPU_VMM_LIMIT");
    return v && *v ? (size_t)strtoull(v, NULL, 0) : 0;
}

CUresult vmm_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                         CUmemAllocationGranularity_flags option)
{
    if (!granularity || !vmm_device_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: not a pinned "
                          "allocation on device 0, or an unknown option");
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                     unsigned long long flags)
{
    HOLD;
    (void)addr; /* a hint */
    if (!ptr || size == 0 || size % VMM_GRANULARITY || flags ||
        (alignment & (alignment - 1)))
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: %zu bytes, alignment "
                          "%zu, flags %llu: the size must be a nonzero multiple of the "
                          "granularity (%zu), the alignment 0 or a power of two, flags 0", size,
                          alignment, flags, VMM_GRANULARITY);
    size_t align = std::max(alignment, VMM_GRANULARITY);
    void *p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t raw = (uintptr_t)p, base = (raw + align - 1) & ~(uintptr_t)(align - 1);
    if (base > raw)
        munmap(p, base - raw);
    if (raw + align > base)
        munmap((void *)(base + size), raw + align - base);
    vmm_reserved[base] = vmm_reservation{size, {}};
    allocations[base] = allocation{size, DEVICE};
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

CUresult vmm_address_free(CUdeviceptr ptr, size_t size)
{
    HOLD;
    auto it = vmm_reserved.find((uintptr_t)ptr);
    if (it == vmm_reserved.end() || it->second.bytes != size)
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(%p, %zu): not a reservation "
                          "of that size", (void *)(uintptr_t)ptr, size);
    if (!it->second.maps.empty())
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(%p, %zu): %zu mappings "
                          "are still in it (cuMemUnmap them first)", (void *)(uintptr_t)ptr, size,
                          it->second.maps.size());
    munmap((void *)(uintptr_t)ptr, size);
    vmm_reserved.erase(it);
    allocations.erase((uintptr_t)ptr);
    return CUDA_SUCCESS;
}

CUresult vmm_create(CUmemGenericAllocationHandle *handle, size_t size,
                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    HOLD;
    if (!handle || !vmm_device_prop(prop) || size == 0 || size % VMM_GRANULARITY || flags)
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: %zu bytes: not a pinned "
                          "allocation on device 0, or not a nonzero multiple of the granularity "
                          "(%zu)", size, VMM_GRANULARITY);
    size_t limit = vmm_limit();
    if (limit && vmm_live + size > limit)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("cudacpu-vmm", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = ftruncate(fd, (off_t)size) == 0
                  ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    if (p == MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(p, 0xff, size); /* uninitialised: NaN shows a read before a write */
    munmap(p, size);
    *handle = vmm_next_handle++;
    vmm_handles[*handle] = vmm_handle{fd, size, 0, false};
    vmm_live += size;
    return CUDA_SUCCESS;
}

CUresult vmm_release(CUmemGenericAllocationHandle handle)
{
    HOLD;
    auto it = vmm_handles.find(handle);
    if (it == vmm_handles.end() || it->second.released)
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemRelease(%llu): not a live handle",
                          handle);
    close(it->second.fd); /* its mappings keep the memory */
    it->second.released = true;
    vmm_handle_done(handle);
    return CUDA_SUCCESS;
}

CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags)
{
    HOLD;
    uintptr_t p = (uintptr_t)ptr;
    auto h = vmm_handles.find(handle);
    if (h == vmm_handles.end() || h->second.released)
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p): handle %llu is not live",
                          (void *)p, handle);
    if (size == 0 || p % VMM_GRANULARITY || size % VMM_GRANULARITY || offset || flags ||
        size > h->second.bytes)
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p, %zu, offset %zu): address and "
                          "size must be multiples of the granularity, offset and flags 0, the "
                          "size at most the allocation's %zu", (void *)p, size, offset,
                          h->second.bytes);
    auto r = vmm_reservation_of(p, size);
    if (r == vmm_reserved.end())
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p, %zu): not inside a reservation "
                          "(cuMemAddressReserve)", (void *)p, size);
    auto &maps = r->second.maps;
    auto next = maps.lower_bound(p);
    bool overlaps = (next != maps.end() && next->first < p + size);
    if (next != maps.begin()) {
        auto prev = std::prev(next);
        overlaps = overlaps || prev->first + prev->second.bytes > p;
    }
    if (overlaps)
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p, %zu): over memory already "
                          "mapped (cuMemUnmap it first)", (void *)p, size);
    if (mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd, 0) == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    maps[p] = vmm_mapping{size, handle};
    h->second.maps++;
    return CUDA_SUCCESS;
}

CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    HOLD;
    uintptr_t p = (uintptr_t)ptr;
    auto r = vmm_reservation_of(p, size);
    if (size == 0 || !desc || count == 0 || r == vmm_reserved.end() ||
        !vmm_fully_mapped(r->second, p, size))
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess(%p, %zu): not a range that "
                          "is wholly mapped (cuMemMap)", (void *)p, size);
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= device_count())
            return vmm_refuse(CUDA_ERROR_INVALID_DEVICE, "cuMemSetAccess: a location other "
                              "than a device (device 0, or one below CUDACPU_DEVICES)");
        prot = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                   : PROT_NONE;
    }
    if (mprotect((void *)p, size, prot) != 0)
        return CUDA_ERROR_UNKNOWN;
    return CUDA_SUCCESS;
}

CUresult vmm_unmap(CUdeviceptr ptr, size_t size)
{
    HOLD;
    uintptr_t p = (uintptr_t)ptr;
    auto r = vmm_reservation_of(p, size);
    if (size == 0 || r == vmm_reserved.end() || !vmm_whole_mappings(r->second, p, size))
        return vmm_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap(%p, %zu): not a range of whole "
                          "mappings", (void *)p, size);
    if (mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
             -1, 0) == MAP_FAILED)
        return CUDA_ERROR_UNKNOWN;
    auto &maps = r->second.maps;
    for (auto it = maps.find(p); it != maps.end() && it->first < p + size;) {
        CUmemGenericAllocationHandle h = it->second.handle;
        it = maps.erase(it);
        auto hh = vmm_handles.find(h);
        if (hh != vmm_handles.end())
            hh->second.maps--;
        vmm_handle_done(h);
    }
    return CUDA_SUCCESS;
}
} // namespace

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
    (void)flags;
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuMemAddressReserve", (void *)vmm_reserve},
        {"cuMemAddressFree", (void *)vmm_address_free},
        {"cuMemCreate", (void *)vmm_create},
        {"cuMemRelease", (void *)vmm_release},
        {"cuMemMap", (void *)vmm_map},
        {"cuMemUnmap", (void *)vmm_unmap},
        {"cuMemSetAccess", (void *)vmm_set_access},
        {"cuMemGetAllocationGranularity", (void *)vmm_granularity},
    };
    if (!symbol || !funcPtr)
        return cudaErrorInvalidValue;
    int driver = 0;
    cudaDriverGetVersion(&driver);
    if (cudaVersion > (unsigned)driver)
        return cudaErrorInvalidValue;
    *funcPtr = NULL;
    enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    const char *off = getenv("CUDACPU_NO_VMM");
    if (!(off && *off && strcmp(off, "0") != 0))
        for (const auto &e : table)
            if (!strcmp(e.name, symbol)) {
                /* every one of them came with CUDA 10.2 */
                status = cudaVersion >= 10020 ? cudaDriverEntryPointSuccess
                                              : cudaDriverEntryPointVersionNotSufficent;
                if (status == cudaDriverEntryPointSuccess)
                    *funcPtr = e.fn;
            }
    if (driverStatus)
        *driverStatus = status;
    return cudaSuccess;
}

/* A copy whose direction says one thing and whose pointers another is
 * undefined behaviour on a GPU (a host pointer read as device memory, or
 * the reverse: a fault, or other memory).  Here every pointer is host
 * memory, so such a call would run: refused instead, naming it.  The
 * device side must lie in a device allocation, the host side outside one;
 * a memset needs memory the device can write (device or pinned). */
namespace {
bool misdirected(const char *call, const void *p, size_t bytes, bool device_side)
{
    if (!bytes)
        return false;
    memory_kind k = memory_of(p);
    if (device_side ? k == DEVICE : k != DEVICE)
        return false;
    if (reports++ < MAX_REPORTS)
        fprintf(stderr, "cudacpu: %s: %p (%zu bytes) is %s memory where the call's direction "
                "says %s memory\n", call, p, bytes,
                k == DEVICE ? "device" : k == PINNED ? "pinned host" : "pageable host",
                device_side ? "device" : "host");
    return true;
}

/* the copy's direction against its pointers (cudaMemcpyDefault: any) */
bool copy_misdirected(const char *call, void *dst, const void *src, size_t bytes,
                      cudaMemcpyKind kind)
{
    if (kind == cudaMemcpyDefault)
        return false;
    return misdirected(call, dst, bytes, !host_side(dst, kind, true)) ||
           misdirected(call, src, bytes, !host_side(src, kind, false));
}
} // namespace

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    HOLD;
    if (bytes && !p)
        return cudaErrorInvalidValue;
    if (memory_of(p) == PAGEABLE && misdirected("cudaMemsetAsync", p, bytes, true))
        return cudaErrorInvalidValue;
    queued_op o{};
    o.kind = OP_SET;
    o.dst = p;
    o.value = value;
    o.bytes = bytes;
    enqueue(stream_of(s), std::move(o));
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    HOLD;
    cudaError_t e = cudaMemsetAsync(p, value, bytes, 0);
    if (e == cudaSuccess && memory_of(p) == PINNED)
        synchronize(legacy_stream(), legacy_stream()->issued, legacy_stream()->clock);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    HOLD;
    if (bytes && (!dst || !src))
        return cudaErrorInvalidValue;
    if (copy_misdirected("cudaMemcpyAsync", dst, src, bytes, kind))
        return cudaErrorInvalidValue;
    bool host_dst = host_side(dst, kind, true), host_src = host_side(src, kind, false);
    /* a host read before the synchronisation sees NaN, not an older value */
    if (host_dst && !host_src && bytes && stream_order() != ORDER_IMMEDIATE &&
        !queued_read(dst, bytes))
        memset(dst, 0xff, bytes);
    cudacpu_stream *t = stream_of(s);
    enqueue(t, copy_op(dst, src, bytes));
    if (host_dst && host_src) /* host to host: synchronous */
        synchronize(t, t->issued, t->clock);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    HOLD;
    if (bytes && (!dst || !src))
        return cudaErrorInvalidValue;
    if (copy_misdirected("cudaMemcpy", dst, src, bytes, kind))
        return cudaErrorInvalidValue;
    cudacpu_stream *l = legacy_stream();
    bool host_dst = host_side(dst, kind, true), host_src = host_side(src, kind, false);
    if (host_src && !host_dst && memory_of(src) != PINNED) {
        /* pageable to device: the stream is synchronised, the source
         * staged, and the function returns with the DMA still to run */
        synchronize_legacy();
        queued_op o = copy_op(dst, NULL, bytes);
        o.owned = malloc(bytes ? bytes : 1);
        if (!o.owned)
            return cudaErrorMemoryAllocation;
        memcpy(o.owned, src, bytes);
        o.src = o.owned;
        enqueue(l, std::move(o));
        return sticky_error;
    }
    enqueue(l, copy_op(dst, src, bytes));
    if (host_dst || host_src) /* to the host, or from pinned memory: returns when done */
        synchronize(l, l->issued, l->clock);
    return sticky_error;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData)
{
    HOLD;
    if (!fn)
        return cudaErrorInvalidValue;
    queued_op o{};
    o.kind = OP_HOST;
    o.host = fn;
    o.arg = userData;
    enqueue(stream_of(s), std::move(o));
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    HOLD;
    legacy_stream();
    cudacpu_stream *t = new cudacpu_stream();
    t->flags = flags;
    t->id = (int)streams.size();
    streams.push_back(t);
    *s = t;
    return cudaSuccess;
}
/* its queued work still runs when something needs it, as on a GPU */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    HOLD;
    if (!s)
        return cudaErrorInvalidResourceHandle;
    s->destroyed = true;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    HOLD;
    cudacpu_stream *t = stream_of(s);
    if (t->legacy)
        synchronize_legacy();
    else
        synchronize(t, t->issued, t->clock);
    return sticky_error;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    HOLD;
    (void)flags;
    if (!e)
        return cudaErrorInvalidResourceHandle;
    if (e->stream) /* an event never recorded is complete */
        enqueue(stream_of(s), wait_op(e->stream, e->at, e->clock));
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = new cudacpu_event{flags, NULL, 0, vclock()};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e; /* waits queued on it keep what they captured */
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    HOLD;
    if (!e)
        return cudaErrorInvalidResourceHandle;
    cudacpu_stream *t = stream_of(s);
    enqueue(t, mark_op()); /* on the legacy stream: after the blocking streams' work */
    e->stream = t;
    e->at = t->issued;
    e->clock = t->clock;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    HOLD;
    if (!e)
        return cudaErrorInvalidResourceHandle;
    if (e->stream)
        synchronize(e->stream, e->at, e->clock);
    return sticky_error;
}
/* A query that answered cudaErrorNotReady would leave a host polling it
 * waiting for work that runs only when something synchronises: it runs
 * that work, and says whether it succeeded.  Only a library call that
 * waits for something outside the process (the fake NCCL's collectives,
 * launch_library_poll) makes it cudaErrorNotReady: the work up to that
 * call has run, and the call stays queued. */
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    HOLD;
    if (!e)
        return cudaErrorInvalidResourceHandle;
    query_scope q;
    if (e->stream && !synchronize(e->stream, e->at, e->clock))
        return sticky_error != cudaSuccess ? sticky_error : cudaErrorNotReady;
    return sticky_error;
}
/* the same for the whole queue of s */
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    HOLD;
    query_scope q;
    cudacpu_stream *t = stream_of(s);
    bool done = t->legacy ? synchronize_legacy() : synchronize(t, t->issued, t->clock);
    if (!done)
        return sticky_error != cudaSuccess ? sticky_error : cudaErrorNotReady;
    return sticky_error;
}

/* for the stand-in libraries: include/cuda_runtime.h, cudacpu_runtime_table.
 * A library call runs fn(arg) once when its stream gets there; one that
 * waits for something outside the process runs poll(arg) then, and again
 * until it returns nonzero (then it has freed arg); meanwhile
 * cudaStreamQuery and cudaEventQuery answer cudaErrorNotReady, and the
 * other synchronisations wait */
static cudaError_t queue_library_op(cudaStream_t s, cudaHostFn_t fn, int (*poll)(void *),
                                    void *arg, const char *what, const cudacpu_touch *touch,
                                    int n)
{
    HOLD;
    if (!fn && !poll)
        return cudaErrorInvalidValue;
    queued_op o{};
    o.kind = OP_HOST;
    o.host = fn;
    o.poll = poll;
    o.arg = arg;
    o.what = what ? what : "a library call";
    o.touch.assign(touch, touch + n);
    enqueue(stream_of(s), std::move(o));
    return cudaSuccess;
}

static cudaError_t launch_library_call(cudaStream_t s, cudaHostFn_t fn, void *userData,
                                       const char *what, const cudacpu_touch *touch, int n)
{
    return fn ? queue_library_op(s, fn, NULL, userData, what, touch, n) : cudaErrorInvalidValue;
}

static cudaError_t launch_library_poll(cudaStream_t s, int (*poll)(void *), void *arg,
                                       const char *what, const cudacpu_touch *touch, int n)
{
    return poll ? queue_library_op(s, NULL, poll, arg, what, touch, n) : cudaErrorInvalidValue;
}

extern "C" __attribute__((visibility("default"))) const cudacpu_runtime_table cudacpu_runtime = {
    CUDACPU_RUNTIME_VERSION, cudaLaunchHostFunc, launch_library_call,
    /* version 3 */
    launch_library_poll, cudaGetErrorString, cudaGetErrorName, cudaGetLastError,
    cudaGetDeviceCount, cudaGetDeviceProperties, cudaSetDevice, cudaGetDevice,
    cudaStreamCreateWithFlags, cudaStreamDestroy, cudaStreamQuery, cudaStreamSynchronize,
    cudaDeviceSynchronize,
    /* version 4 */
    cudaMalloc, cudaFree, cudaMemcpy};

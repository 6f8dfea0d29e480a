/*
 * The CUDA backend module, backend_cuda.so: the iface of kernels/backend.h
 * on one GPU, every op of the CPU backend on the device.
 *
 * Streams: every node, optimizer step and reduction runs on one compute
 * stream, in the order the core calls them.  Uploads go through a second
 * stream via two pinned staging slots: the host copies into a slot and
 * returns while the DMA runs; the copy waits for the compute queued before it
 * (the destination may still be read) and the compute queued after it waits
 * for the copy, so ordering is exactly that of the calls.  Downloads run on
 * the compute stream and wait (the host reads the result at once).
 * convert, discard and commit come from the core's communication thread
 * while the compute thread launches nodes: they queue on the compute stream
 * too (after their own cudaSetDevice, which is per host thread), so they are
 * ordered with the nodes and with the collectives a comm plugin queues there
 * (the stream slot); convert does not wait for its kernel.
 *
 * Memory: the core plans all device memory (g->scratch included, sized by
 * scratch_floats); the backend's own buffers (staging, cuBLASLt workspace,
 * reduction cells) are allocated once in open().  forward, backward, adamw
 * and sgd neither allocate nor wait for the device.
 *
 * Memory that can be given back (discard, commit; kernels/backend.h): an
 * allocation of at least the granularity of the driver's virtual memory
 * management (cuMemGetAllocationGranularity, 2 MiB on current GPUs) is a
 * reserved address range backed chunk by chunk, one physical allocation a
 * granularity-sized chunk (cuMemCreate, cuMemMap, then cuMemRelease at once:
 * the mapping keeps it, and unmapping a chunk gives its memory back); a
 * smaller one stays cudaMalloc.  The driver functions come from the runtime
 * (cudaGetDriverEntryPointByVersion) at open(), so the module still links
 * no libcuda; where one is missing, or a probe mapping fails, the module
 * opens without discard and commit (cuda_iface) and allocates with
 * cudaMalloc only.  A registry (struct vmm, under its mutex: discard,
 * commit and convert come from the core's communication thread while the
 * compute thread allocates, frees and launches) holds each region, sorted
 * by address, with a state per chunk:
 *   mapped    usable;
 *   pending   discarded, still mapped, because work queued before the
 *             discard may still read it: an event recorded on the compute
 *             stream at the discard (a "mark", numbered by a ticket) says
 *             when it is safe to unmap;
 *   released  unmapped: touching it faults, on the GPU (an illegal address,
 *             a sticky error) as in the harness (SIGSEGV).
 * discard moves the mapped chunks wholly inside its range to pending and
 * zeroes the parts of mapped chunks at its ends (cudaMemsetAsync on
 * compute); outside a region it only zeroes.  Pending chunks whose mark has
 * completed (cudaEventQuery: no wait) are unmapped at the next discard,
 * commit, alloc, free or synchronize, and all at close.  commit takes a
 * pending chunk back as it is (still mapped) or maps a released one anew,
 * and zeroes either on compute; mapped chunks keep their contents.  free
 * waits for the device (as cudaFree does) and gives the whole region back.
 * Out of device memory while mapping (commit, alloc) waits for the pending
 * chunks first and tries again; a commit that still fails is a sticky
 * error (cuda_note), so the run stops at its step's end.  All of this has
 * run through tests/cudacpu only (its emulation of the driver calls), never
 * on a GPU: the cost of mapping chunk by chunk there is UNMEASURED.
 *
 * Errors: a failed CUDA call is printed once and kept; sum_squares then
 * returns NaN, so the run loop sees a non-finite step instead of training on.
 *
 * This file holds the module's memory, streams, open/close and describe;
 * nodes.cu turns each graph node into kernel launches (conv2d into cuDNN
 * calls, conv.cu).
 */
#include "common.cuh"

#include <cuda.h> /* the driver's types; its functions come through the runtime */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TR_CUDA_HOME
#define TR_CUDA_HOME "/usr/local/cuda"
#endif

/* the first error and its message: the compute and communication threads
 * may both fail at once (convert, discard and commit run on the latter) */
static pthread_mutex_t note_lock = PTHREAD_MUTEX_INITIALIZER;

void cuda_note(struct cuda_context *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return;
    pthread_mutex_lock(&note_lock);
    if (c->first_error == cudaSuccess) {
        c->first_error = e;
        fprintf(stderr, "trainrun: cuda: %s: %s (later CUDA errors are not shown)\n", what,
                cudaGetErrorString(e));
    }
    pthread_mutex_unlock(&note_lock);
}

/* ---- memory: virtual memory management (the header's "Memory") ------------------------ */

/* The driver's functions, through cudaGetDriverEntryPointByVersion (types
 * from cuda.h: decltype names them without linking libcuda). */
struct vmm_driver {
    decltype(&cuMemAddressReserve) reserve;
    decltype(&cuMemAddressFree) address_free;
    decltype(&cuMemCreate) create;
    decltype(&cuMemRelease) release;
    decltype(&cuMemMap) map;
    decltype(&cuMemUnmap) unmap;
    decltype(&cuMemSetAccess) set_access;
    decltype(&cuMemGetAllocationGranularity) granularity;
};

enum { CHUNK_MAPPED = 0, CHUNK_PENDING, CHUNK_RELEASED };

struct vmm_chunk {
    uint64_t ticket; /* pending: the mark of the discard that gave it up */
    unsigned char state;
};

/* one allocation of at least a chunk */
struct vmm_region {
    char *base;    /* reserved, aligned to the chunk size */
    size_t bytes;  /* reserved: chunks * the chunk size */
    size_t asked;  /* what alloc was asked for, <= bytes */
    size_t chunks;
    struct vmm_chunk *chunk;
};

/* a discard's event on the compute stream: pending chunks of tickets up to
 * this one may be unmapped once it has completed */
struct vmm_mark {
    uint64_t ticket;
    cudaEvent_t done;
};

struct vmm {
    pthread_mutex_t lock; /* everything below */
    struct vmm_driver cu;
    CUmemAllocationProp prop;  /* pinned device memory on c->device */
    CUmemAccessDesc access;    /* read/write from c->device */
    size_t chunk;              /* the granularity: the unit mapped and given back */
    struct vmm_region **region; /* sorted by base */
    size_t n_regions, cap_regions;
    struct vmm_mark *mark;     /* in record order, so in completion order */
    size_t n_marks, cap_marks;
    cudaEvent_t *spare;        /* events of completed marks, for the next ones */
    size_t n_spare, cap_spare;
    uint64_t tickets;          /* the last mark's */
    uint64_t done;             /* every mark up to this ticket has completed */
    uint64_t swept;            /* pending chunks of tickets <= swept are unmapped */
    size_t n_pending;          /* chunks pending, over all regions */
};

/* room for `need` items in *items (capacity *cap); -1: out of host memory */
template <typename T> static int vmm_room(T **items, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    T *p = (T *)realloc(*items, n * sizeof(T));
    if (!p)
        return -1;
    *items = p;
    *cap = n;
    return 0;
}

/* the region holding p (NULL: memory of cudaMalloc, or none of ours) */
static struct vmm_region *vmm_find(const struct vmm *v, const void *p)
{
    size_t lo = 0, hi = v->n_regions; /* the first region whose base is above p */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v->region[mid]->base <= (const char *)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    struct vmm_region *r = v->region[lo - 1];
    return (const char *)p < r->base + r->bytes ? r : NULL;
}

static cudaError_t runtime_error_of(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
    }
}

/* a failed driver call as a sticky error, its CUresult in the message */
static void note_driver(struct cuda_context *c, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return;
    char msg[200];
    snprintf(msg, sizeof msg, "%s (CUresult %d)", what, (int)r);
    cuda_note(c, runtime_error_of(r), msg);
}

/* cudaEventQuery's "not yet" is an answer, not an error: it must not
 * reach the next launch's cudaGetLastError (LAUNCHED) as one */
static void forget_not_ready(void)
{
    if (cudaPeekAtLastError() == cudaErrorNotReady)
        cudaGetLastError();
}

/* Physical memory for the chunk at `at`: created, mapped, handle released
 * (the mapping keeps the memory; unmapping gives it back), read/write. */
static CUresult vmm_map_chunk(struct vmm *v, char *at)
{
    CUmemGenericAllocationHandle h;
    CUresult r = v->cu.create(&h, v->chunk, &v->prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUresult mapped = v->cu.map((CUdeviceptr)(uintptr_t)at, v->chunk, 0, h, 0);
    r = v->cu.release(h);
    if (mapped != CUDA_SUCCESS)
        return mapped;
    if (r == CUDA_SUCCESS)
        r = v->cu.set_access((CUdeviceptr)(uintptr_t)at, v->chunk, &v->access, 1);
    if (r != CUDA_SUCCESS)
        v->cu.unmap((CUdeviceptr)(uintptr_t)at, v->chunk);
    return r;
}

/* Unmaps the pending chunks whose mark has completed.  wait: waits for
 * every mark first (close, out of memory).  v->lock held. */
static void vmm_reap(struct cuda_context *c, struct vmm *v, int wait)
{
    if (wait && v->n_marks)
        CUDA_NOTE(c, cudaEventSynchronize(v->mark[v->n_marks - 1].done));
    size_t k = 0;
    for (; k < v->n_marks; k++) {
        cudaError_t e = cudaEventQuery(v->mark[k].done);
        if (e == cudaErrorNotReady) {
            forget_not_ready();
            break;
        }
        if (e != cudaSuccess) { /* a device error: its chunks stay mapped until close */
            cuda_note(c, e, "discard: cudaEventQuery");
            break;
        }
        v->done = v->mark[k].ticket;
        if (vmm_room(&v->spare, &v->cap_spare, v->n_spare + 1) == 0)
            v->spare[v->n_spare++] = v->mark[k].done;
        else
            cudaEventDestroy(v->mark[k].done);
    }
    memmove(v->mark, v->mark + k, (v->n_marks - k) * sizeof *v->mark);
    v->n_marks -= k;
    if (v->n_pending == 0 || v->done == v->swept)
        return;
    for (size_t i = 0; i < v->n_regions; i++) {
        struct vmm_region *r = v->region[i];
        for (size_t j = 0; j < r->chunks; j++) {
            struct vmm_chunk *ch = &r->chunk[j];
            if (ch->state != CHUNK_PENDING || ch->ticket > v->done)
                continue;
            CUresult res = v->cu.unmap((CUdeviceptr)(uintptr_t)(r->base + j * v->chunk), v->chunk);
            if (res != CUDA_SUCCESS) {
                note_driver(c, res, "discard: cuMemUnmap");
                continue;
            }
            ch->state = CHUNK_RELEASED;
            v->n_pending--;
        }
    }
    v->swept = v->done;
}

/* maps the chunk at `at`; out of memory: once more after the pending
 * chunks are given back.  v->lock held. */
static CUresult vmm_map_chunk_or_wait(struct cuda_context *c, struct vmm *v, char *at)
{
    CUresult r = vmm_map_chunk(v, at);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && v->n_pending) {
        vmm_reap(c, v, 1);
        r = vmm_map_chunk(v, at);
    }
    return r;
}

/* Zeroes on compute, merging neighbouring ranges into one memset: add
 * [lo, hi), then flush. */
struct zero_run {
    char *lo, *hi;
};
static void zero_flush(struct cuda_context *c, struct zero_run *z)
{
    if (z->hi > z->lo)
        CUDA_NOTE(c, cudaMemsetAsync(z->lo, 0, (size_t)(z->hi - z->lo), c->compute));
    z->lo = z->hi = NULL;
}
static void zero_add(struct cuda_context *c, struct zero_run *z, char *lo, char *hi)
{
    if (hi <= lo)
        return;
    if (z->hi != lo)
        zero_flush(c, z);
    if (!z->lo)
        z->lo = lo;
    z->hi = hi;
}

/* zeroes what of [lo, hi) lies in mapped chunks of r (pending and released
 * ones read as zeros once committed: commit zeroes them whole) */
static void vmm_zero_mapped(struct cuda_context *c, const struct vmm *v,
                            const struct vmm_region *r, char *lo, char *hi)
{
    if (hi <= lo)
        return;
    struct zero_run z = {NULL, NULL};
    for (size_t j = (size_t)(lo - r->base) / v->chunk; j * v->chunk < (size_t)(hi - r->base); j++) {
        char *a = r->base + j * v->chunk, *b = a + v->chunk;
        if (r->chunk[j].state == CHUNK_MAPPED)
            zero_add(c, &z, a > lo ? a : lo, b < hi ? b : hi);
    }
    zero_flush(c, &z);
}

/* A region of whole chunks, every one mapped, zeroed on compute.  NULL
 * when out of memory (the caller's to report). */
static void *vmm_alloc(struct cuda_context *c, struct vmm *v, size_t bytes)
{
    size_t chunks = (bytes + v->chunk - 1) / v->chunk;
    struct vmm_region *r = (struct vmm_region *)calloc(1, sizeof *r);
    struct vmm_chunk *chunk = (struct vmm_chunk *)calloc(chunks, sizeof *chunk); /* mapped */
    if (!r || !chunk) {
        free(r);
        free(chunk);
        return NULL;
    }
    r->bytes = chunks * v->chunk;
    r->asked = bytes;
    r->chunks = chunks;
    r->chunk = chunk;
    pthread_mutex_lock(&v->lock);
    vmm_reap(c, v, 0);
    CUdeviceptr base = 0;
    CUresult res = vmm_room(&v->region, &v->cap_regions, v->n_regions + 1)
                       ? CUDA_ERROR_OUT_OF_MEMORY
                       : v->cu.reserve(&base, r->bytes, v->chunk, 0, 0);
    size_t mapped = 0;
    if (res == CUDA_SUCCESS) {
        r->base = (char *)(uintptr_t)base;
        for (; mapped < chunks; mapped++)
            if ((res = vmm_map_chunk_or_wait(c, v, r->base + mapped * v->chunk)) != CUDA_SUCCESS)
                break;
    }
    if (res != CUDA_SUCCESS) {
        if (res != CUDA_ERROR_OUT_OF_MEMORY) /* not the caller's "out of memory": say what */
            note_driver(c, res, "alloc: cuMemAddressReserve or cuMemCreate/cuMemMap");
        for (size_t j = 0; j < mapped; j++)
            v->cu.unmap((CUdeviceptr)(uintptr_t)(r->base + j * v->chunk), v->chunk);
        if (base)
            v->cu.address_free(base, r->bytes);
        pthread_mutex_unlock(&v->lock);
        free(chunk);
        free(r);
        return NULL;
    }
    size_t at = v->n_regions;
    while (at > 0 && v->region[at - 1]->base > r->base)
        at--;
    memmove(v->region + at + 1, v->region + at, (v->n_regions - at) * sizeof *v->region);
    v->region[at] = r;
    v->n_regions++;
    CUDA_NOTE(c, cudaMemsetAsync(r->base, 0, r->bytes, c->compute));
    pthread_mutex_unlock(&v->lock);
    return r->base;
}

/* Unmaps what of r is mapped and frees its addresses.  The device is done
 * with it.  v->lock held, r out of the registry. */
static void vmm_region_free(struct cuda_context *c, struct vmm *v, struct vmm_region *r)
{
    for (size_t j = 0; j < r->chunks; j++) {
        if (r->chunk[j].state == CHUNK_RELEASED)
            continue;
        if (r->chunk[j].state == CHUNK_PENDING)
            v->n_pending--;
        note_driver(c, v->cu.unmap((CUdeviceptr)(uintptr_t)(r->base + j * v->chunk), v->chunk),
                    "free: cuMemUnmap");
    }
    note_driver(c, v->cu.address_free((CUdeviceptr)(uintptr_t)r->base, r->bytes),
                "free: cuMemAddressFree");
    free(r->chunk);
    free(r);
}

static void *cuda_alloc(void *ctx, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    struct vmm *v = c->vmm;
    cudaSetDevice(c->device);
    if (v && bytes >= v->chunk)
        return vmm_alloc(c, v, bytes);
    size_t rounded = (bytes + 255) & ~(size_t)255;
    void *p = NULL;
    if (v) {
        pthread_mutex_lock(&v->lock);
        vmm_reap(c, v, 0);
        pthread_mutex_unlock(&v->lock);
    }
    cudaError_t e = cudaMalloc(&p, rounded ? rounded : 256);
    if (e == cudaErrorMemoryAllocation && v) { /* once more with the pending chunks given back */
        cudaGetLastError();
        pthread_mutex_lock(&v->lock);
        vmm_reap(c, v, 1);
        pthread_mutex_unlock(&v->lock);
        e = cudaMalloc(&p, rounded ? rounded : 256);
    }
    if (e != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report, not sticky */
        return NULL;
    }
    CUDA_NOTE(c, cudaMemsetAsync(p, 0, rounded ? rounded : 256, c->compute));
    return p;
}

static void cuda_free(void *ctx, void *p)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    struct vmm *v = c->vmm;
    if (!p)
        return;
    cudaSetDevice(c->device);
    struct vmm_region *r = NULL;
    if (v) {
        pthread_mutex_lock(&v->lock);
        r = vmm_find(v, p);
        pthread_mutex_unlock(&v->lock);
    }
    if (!r) {
        CUDA_NOTE(c, cudaFree(p));
        return;
    }
    /* what cudaFree does implicitly: nothing queued may touch it after */
    CUDA_NOTE(c, cudaDeviceSynchronize());
    pthread_mutex_lock(&v->lock);
    size_t at = 0;
    while (at < v->n_regions && v->region[at] != r)
        at++;
    if (at < v->n_regions) {
        memmove(v->region + at, v->region + at + 1, (v->n_regions - at - 1) * sizeof *v->region);
        v->n_regions--;
        vmm_region_free(c, v, r);
    }
    vmm_reap(c, v, 0);
    pthread_mutex_unlock(&v->lock);
}

/* kernels/backend.h's discard: see the header's "Memory" */
static void cuda_discard(void *ctx, void *ptr, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    struct vmm *v = c->vmm;
    if (!ptr || !bytes)
        return;
    cudaSetDevice(c->device); /* the communication thread's too */
    if (!v) { /* not in this iface; reads as zeros all the same */
        CUDA_NOTE(c, cudaMemsetAsync(ptr, 0, bytes, c->compute));
        return;
    }
    pthread_mutex_lock(&v->lock);
    /* before this discard's mark exists: the harness runs the queue up to
     * a mark it is asked about */
    vmm_reap(c, v, 0);
    struct vmm_region *r = vmm_find(v, ptr);
    if (!r) { /* cudaMalloc memory: it only reads as zeros */
        CUDA_NOTE(c, cudaMemsetAsync(ptr, 0, bytes, c->compute));
        pthread_mutex_unlock(&v->lock);
        return;
    }
    char *lo = (char *)ptr, *end = r->base + r->bytes;
    char *hi = bytes < (size_t)(end - lo) ? lo + bytes : end;
    if (hi >= r->base + r->asked) /* the padding past what alloc was asked goes too */
        hi = end;
    size_t first = ((size_t)(lo - r->base) + v->chunk - 1) / v->chunk; /* whole chunks */
    size_t last = (size_t)(hi - r->base) / v->chunk;
    if (first >= last) { /* within one chunk or across one boundary: zeroes only */
        vmm_zero_mapped(c, v, r, lo, hi);
        pthread_mutex_unlock(&v->lock);
        return;
    }
    vmm_zero_mapped(c, v, r, lo, r->base + first * v->chunk);
    vmm_zero_mapped(c, v, r, r->base + last * v->chunk, hi);
    size_t given = 0;
    for (size_t j = first; j < last; j++)
        given += r->chunk[j].state == CHUNK_MAPPED;
    if (given) {
        /* a mark after everything queued so far: the work that may still
         * read these chunks */
        cudaEvent_t e = v->n_spare ? v->spare[--v->n_spare] : NULL;
        if (!e && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            e = NULL;
        }
        if (e && vmm_room(&v->mark, &v->cap_marks, v->n_marks + 1) == 0 &&
            cudaEventRecord(e, c->compute) == cudaSuccess) {
            v->mark[v->n_marks].ticket = ++v->tickets;
            v->mark[v->n_marks++].done = e;
            for (size_t j = first; j < last; j++)
                if (r->chunk[j].state == CHUNK_MAPPED) {
                    r->chunk[j].state = CHUNK_PENDING;
                    r->chunk[j].ticket = v->tickets;
                }
            v->n_pending += given;
        } else { /* no mark, no unmapping: the chunks stay, zeroed */
            cudaGetLastError();
            if (e)
                cudaEventDestroy(e);
            vmm_zero_mapped(c, v, r, r->base + first * v->chunk, r->base + last * v->chunk);
        }
    }
    pthread_mutex_unlock(&v->lock);
}

/* kernels/backend.h's commit: see the header's "Memory" */
static void cuda_commit(void *ctx, void *ptr, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    struct vmm *v = c->vmm;
    if (!ptr || !bytes || !v)
        return;
    cudaSetDevice(c->device);
    pthread_mutex_lock(&v->lock);
    struct vmm_region *r = vmm_find(v, ptr);
    size_t first = 0, last = 0; /* chunks [first, last) touch the range */
    if (r) {
        char *lo = (char *)ptr, *end = r->base + r->bytes;
        char *hi = bytes < (size_t)(end - lo) ? lo + bytes : end;
        first = (size_t)(lo - r->base) / v->chunk;
        last = ((size_t)(hi - r->base) + v->chunk - 1) / v->chunk;
        /* pending chunks first, before reaping could unmap them: taken
         * back as they are, zeroed after whatever read them */
        struct zero_run z = {NULL, NULL};
        for (size_t j = first; j < last; j++)
            if (r->chunk[j].state == CHUNK_PENDING) {
                r->chunk[j].state = CHUNK_MAPPED;
                v->n_pending--;
                zero_add(c, &z, r->base + j * v->chunk, r->base + (j + 1) * v->chunk);
            }
        zero_flush(c, &z);
    }
    vmm_reap(c, v, 0);
    if (r) {
        struct zero_run z = {NULL, NULL};
        for (size_t j = first; j < last; j++) {
            if (r->chunk[j].state != CHUNK_RELEASED)
                continue;
            char *at = r->base + j * v->chunk;
            CUresult res = vmm_map_chunk_or_wait(c, v, at);
            if (res != CUDA_SUCCESS) {
                /* the chunk stays unmapped: a kernel touching it faults, and
                 * the error noted here stops the run at its step's end */
                note_driver(c, res, "commit: mapping memory a discard gave back "
                                    "(cuMemCreate, cuMemMap, cuMemSetAccess)");
                break;
            }
            r->chunk[j].state = CHUNK_MAPPED;
            zero_add(c, &z, at, at + v->chunk);
        }
        zero_flush(c, &z);
    }
    pthread_mutex_unlock(&v->lock);
}

/* The driver functions, or NULL (then no discard or commit): missing from
 * the driver, or a probe of one chunk reserved, mapped, unmapped and freed
 * failed. */
static struct vmm *vmm_open(struct cuda_context *c)
{
    struct vmm_driver cu;
    memset(&cu, 0, sizeof cu);
    struct {
        const char *name;
        void *slot; /* a function pointer of cu */
    } want[] = {
        {"cuMemAddressReserve", &cu.reserve},   {"cuMemAddressFree", &cu.address_free},
        {"cuMemCreate", &cu.create},            {"cuMemRelease", &cu.release},
        {"cuMemMap", &cu.map},                  {"cuMemUnmap", &cu.unmap},
        {"cuMemSetAccess", &cu.set_access},     {"cuMemGetAllocationGranularity", &cu.granularity},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        /* the ABI of CUDA 12.0: every one of these dates from 10.2 */
        cudaError_t e = cudaGetDriverEntryPointByVersion(want[i].name, &fn, 12000,
                                                         cudaEnableDefault, &status);
#else
        cudaError_t e = cudaGetDriverEntryPoint(want[i].name, &fn, cudaEnableDefault, &status);
#endif
        if (e != cudaSuccess || !fn || status != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            return NULL;
        }
        memcpy(want[i].slot, &fn, sizeof fn);
    }
    struct vmm *v = (struct vmm *)calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->cu = cu;
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    v->prop.location.id = c->device;
    v->access.location = v->prop.location;
    v->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUdeviceptr probe = 0;
    CUresult r = cu.granularity(&v->chunk, &v->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r == CUDA_SUCCESS && v->chunk == 0)
        r = CUDA_ERROR_NOT_SUPPORTED;
    if (r == CUDA_SUCCESS)
        r = cu.reserve(&probe, v->chunk, v->chunk, 0, 0);
    if (r == CUDA_SUCCESS) {
        r = vmm_map_chunk(v, (char *)(uintptr_t)probe);
        if (r == CUDA_SUCCESS)
            r = cu.unmap(probe, v->chunk);
        CUresult freed = cu.address_free(probe, v->chunk);
        r = r == CUDA_SUCCESS ? freed : r;
    }
    if (r != CUDA_SUCCESS || pthread_mutex_init(&v->lock, NULL) != 0) {
        free(v);
        return NULL;
    }
    return v;
}

/* At close: the device is idle; everything given back. */
static void vmm_close(struct cuda_context *c, struct vmm *v)
{
    pthread_mutex_lock(&v->lock);
    vmm_reap(c, v, 1);
    for (size_t i = 0; i < v->n_regions; i++) /* not freed by the caller */
        vmm_region_free(c, v, v->region[i]);
    for (size_t k = 0; k < v->n_marks; k++) /* a device error kept them */
        cudaEventDestroy(v->mark[k].done);
    for (size_t k = 0; k < v->n_spare; k++)
        cudaEventDestroy(v->spare[k]);
    free(v->region);
    free(v->mark);
    free(v->spare);
    pthread_mutex_unlock(&v->lock);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

/* ---- memory: copies, zeroing, conversion ------------------------------------ */

static void cuda_zero(void *ctx, void *p, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    if (p && bytes)
        CUDA_NOTE(c, cudaMemsetAsync(p, 0, bytes, c->compute));
}

static void cuda_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    if (!bytes)
        return;
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->upload_lock);
    /* the destination may still be read by compute queued earlier */
    CUDA_NOTE(c, cudaEventRecord(c->compute_mark, c->compute));
    CUDA_NOTE(c, cudaStreamWaitEvent(c->copy, c->compute_mark, 0));
    int last = 0;
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < STAGE_BYTES ? bytes - done : STAGE_BYTES;
        int slot = c->stage_next;
        c->stage_next = (slot + 1) % STAGE_SLOTS;
        CUDA_NOTE(c, cudaEventSynchronize(c->stage_done[slot])); /* its last DMA is over */
        memcpy(c->stage[slot], (const char *)src + done, n);
        CUDA_NOTE(c, cudaMemcpyAsync((char *)dst + done, c->stage[slot], n, cudaMemcpyHostToDevice,
                                     c->copy));
        CUDA_NOTE(c, cudaEventRecord(c->stage_done[slot], c->copy));
        last = slot;
        done += n;
    }
    /* compute queued from now on sees the data */
    CUDA_NOTE(c, cudaStreamWaitEvent(c->compute, c->stage_done[last], 0));
    pthread_mutex_unlock(&c->upload_lock);
}

static void cuda_download(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    if (!bytes)
        return;
    cudaSetDevice(c->device);
    CUDA_NOTE(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->compute));
    CUDA_NOTE(c, cudaStreamSynchronize(c->compute));
}

static void cuda_synchronize(void *ctx)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    CUDA_NOTE(c, cudaStreamSynchronize(c->compute));
    if (c->vmm) { /* every mark has completed: the pending chunks go */
        pthread_mutex_lock(&c->vmm->lock);
        vmm_reap(c, c->vmm, 0);
        pthread_mutex_unlock(&c->vmm->lock);
    }
}

/* kernels/backend.h's convert: queued on the compute stream, so ordered
 * with the collectives a comm plugin queues there around it (the caller
 * does not wait for it: what it queues next is ordered after) */
static void cuda_convert_iface(void *ctx, void *dst, enum tr_dtype to, const void *src,
                               enum tr_dtype from, size_t n)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    if (n == 0)
        return;
    if ((to != TR_F32 && to != TR_BF16 && to != TR_F16) ||
        (from != TR_F32 && from != TR_BF16 && from != TR_F16)) {
        cuda_note(c, cudaErrorInvalidValue, "convert: a type other than fp32, bf16 or fp16");
        return;
    }
    cudaSetDevice(c->device); /* called from the communication thread */
    cuda_convert_bits(c, dst, (int)to, src, (int)from, n);
}

static void *cuda_host_alloc(void *ctx, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    void *p = NULL;
    cudaSetDevice(c->device);
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *ctx, void *p)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    if (p)
        CUDA_NOTE(c, cudaFreeHost(p));
}

static void *cuda_stream(void *ctx) { return (void *)((struct cuda_context *)ctx)->compute; }

/* ---- optimizers and reductions ---------------------------------------------------- */

static double iface_sum_squares(void *ctx, const float *x, size_t n)
{
    return cuda_sum_squares((struct cuda_context *)ctx, x, n);
}

static void iface_adamw(void *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                        const struct tr_adamw_args *a)
{
    cuda_adamw((struct cuda_context *)ctx, p, grad, m, v, n, a);
}

static void iface_sgd(void *ctx, float *p, const float *grad, float *buf, size_t n,
                      const struct tr_sgd_args *a)
{
    cuda_sgd((struct cuda_context *)ctx, p, grad, buf, n, a);
}

static int64_t iface_count_correct(void *ctx, const float *logits, const int32_t *targets, int N,
                                   int V, int ignore_index, int64_t *n_valid)
{
    return cuda_count_correct((struct cuda_context *)ctx, logits, targets, N, V, ignore_index,
                              n_valid);
}

/* vmm: with discard and commit (virtual memory management works here) */
static struct tr_backend_iface make_iface(int vmm)
{
    struct tr_backend_iface f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof(struct tr_backend_iface);
    f.name = "cuda";
    f.alloc = cuda_alloc;
    f.free = cuda_free;
    f.zero = cuda_zero;
    f.upload = cuda_upload;
    f.download = cuda_download;
    f.scratch_floats = cuda_scratch_floats;
    f.forward = cuda_forward;
    f.backward = cuda_backward;
    f.sum_squares = iface_sum_squares;
    f.adamw = iface_adamw;
    f.sgd = iface_sgd;
    f.synchronize = cuda_synchronize;
    f.count_correct = iface_count_correct;
    f.host_alloc = cuda_host_alloc;
    f.host_free = cuda_host_free;
    f.stream = cuda_stream;
    f.supports_op = cuda_supports_op;
    f.store_frozen = cuda_store_frozen;
    f.load_frozen = cuda_load_frozen;
    f.supports_rows = cuda_supports_rows;
    f.convert = cuda_convert_iface;
    if (vmm) {
        f.discard = cuda_discard;
        f.commit = cuda_commit;
    }
    return f;
}

/* chosen at open: the core asks whether discard is there (tr_be_can_discard) */
static const struct tr_backend_iface cuda_iface = make_iface(0);
static const struct tr_backend_iface cuda_iface_vmm = make_iface(1);

/* ---- open, close, describe -------------------------------------------------------- */

static void context_free(struct cuda_context *c)
{
    if (!c)
        return;
    if (c->compute)
        cudaStreamSynchronize(c->compute);
    if (c->copy)
        cudaStreamSynchronize(c->copy);
    if (c->vmm)
        vmm_close(c, c->vmm);
    cuda_gemm_close(c);
    cuda_dnn_close(c);
    for (int i = 0; i < STAGE_SLOTS; i++) {
        if (c->stage[i])
            cudaFreeHost(c->stage[i]);
        if (c->stage_done[i])
            cudaEventDestroy(c->stage_done[i]);
    }
    if (c->compute_mark)
        cudaEventDestroy(c->compute_mark);
    pthread_mutex_destroy(&c->upload_lock);
    if (c->sum_partials)
        cudaFree(c->sum_partials);
    if (c->sum_result)
        cudaFreeHost(c->sum_result);
    if (c->counts)
        cudaFree(c->counts);
    if (c->counts_host)
        cudaFreeHost(c->counts_host);
    if (c->lt_workspace)
        cudaFree(c->lt_workspace);
    if (c->compute)
        cudaStreamDestroy(c->compute);
    if (c->copy)
        cudaStreamDestroy(c->copy);
    free(c);
}

static void say(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

/* This process's rank on its node, from trainrun's launcher, Slurm or Open
 * MPI (the order the core reads them in); 0 when alone. */
static int local_rank(void)
{
    const char *names[] = {"TRAINRUN_LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v && *v)
            return atoi(v);
    }
    return 0;
}

/* Why no GPU can be used, or 0 when *device can: local rank r drives GPU r,
 * or GPU 0 when each rank sees only its own (CUDA_VISIBLE_DEVICES) -- the
 * rule the nccl comm plugin follows too. */
static int device_check(char *why, size_t why_size, cudaDeviceProp *prop, int *device)
{
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (driver == 0) {
        say(why, why_size, "no CUDA driver (libcuda.so.1 is not installed: install the NVIDIA "
            "driver)");
        return -1;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver) {
        say(why, why_size, "the NVIDIA driver supports CUDA up to %d.%d but this trainrun was "
            "built with CUDA %d.%d: update the driver", driver / 1000, driver % 1000 / 10,
            runtime / 1000, runtime % 1000 / 10);
        return -1;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        say(why, why_size, "no GPU visible%s%s%s", visible ? " (CUDA_VISIBLE_DEVICES=" : "",
            visible ? visible : "", visible ? ")" : "");
        return -1;
    }
    if (e != cudaSuccess) {
        say(why, why_size, "CUDA does not start: %s", cudaGetErrorString(e));
        return -1;
    }
    int rank = local_rank();
    *device = count == 1 ? 0 : rank;
    if (*device >= count) {
        say(why, why_size, "local rank %d needs GPU %d, but only %d are visible: start at most "
            "%d ranks per node (gpus=%d)", rank, *device, count, count, count);
        return -1;
    }
    e = cudaGetDeviceProperties(prop, *device);
    if (e != cudaSuccess) {
        say(why, why_size, "cannot query GPU %d: %s", *device, cudaGetErrorString(e));
        return -1;
    }
    if (prop->major < 8) {
        say(why, why_size, "GPU %d (%s) has compute capability %d.%d; this build runs on 8.0 or "
            "newer (A100, RTX 30xx, H100 and later)", *device, prop->name, prop->major,
            prop->minor);
        return -1;
    }
    return 0;
}

static int cuda_open(struct tr_backend *be, int threads, char *why, size_t why_size)
{
    (void)threads; /* the host side is single-threaded */
    cudaDeviceProp prop;
    int device = 0;
    if (device_check(why, why_size, &prop, &device) != 0) {
        cudaGetLastError();
        return -1;
    }
    struct cuda_context *c = (struct cuda_context *)calloc(1, sizeof *c);
    if (!c) {
        say(why, why_size, "out of host memory");
        return -1;
    }
    c->device = device;
    c->prop = prop;
    pthread_mutex_init(&c->upload_lock, NULL); /* before anything context_free undoes */
    cudaError_t e = cudaSetDevice(c->device);
    const char *step = "cudaSetDevice";
#define STEP(call)                                                                                 \
    do {                                                                                           \
        if (e == cudaSuccess) {                                                                    \
            e = (call);                                                                            \
            step = #call;                                                                          \
        }                                                                                          \
    } while (0)
    STEP(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
    STEP(cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking));
    STEP(cudaEventCreateWithFlags(&c->compute_mark, cudaEventDisableTiming));
    for (int i = 0; i < STAGE_SLOTS; i++) {
        STEP(cudaEventCreateWithFlags(&c->stage_done[i], cudaEventDisableTiming));
        STEP(cudaHostAlloc(&c->stage[i], STAGE_BYTES, cudaHostAllocPortable));
    }
    STEP(cudaMalloc((void **)&c->sum_partials, (SUM_BLOCKS + 1) * sizeof(double)));
    STEP(cudaHostAlloc((void **)&c->sum_result, sizeof(double), cudaHostAllocPortable));
    STEP(cudaMalloc((void **)&c->counts, 2 * sizeof(unsigned long long)));
    STEP(cudaHostAlloc((void **)&c->counts_host, 2 * sizeof(unsigned long long),
                       cudaHostAllocPortable));
    STEP(cudaMalloc(&c->lt_workspace, LT_WORKSPACE_BYTES));
    STEP(cuda_attention_init());
#undef STEP
    if (e != cudaSuccess) {
        say(why, why_size, "GPU %d (%s) does not start: %s: %s", device, prop.name, step,
            cudaGetErrorString(e));
        cudaGetLastError();
        context_free(c);
        return -1;
    }
    size_t lt_version = 0;
    const char *lt_why = cuda_gemm_open(c, &lt_version);
    if (lt_why) {
        say(why, why_size, "%s", lt_why);
        context_free(c);
        return -1;
    }
    /* optional: without cuDNN every op but conv2d runs (supports_op says why not) */
    cuda_dnn_open(c);
    /* optional: without virtual memory management nothing is given back
     * (no discard: the core keeps sharded data parallelism off) */
    c->vmm = vmm_open(c);
    be->iface = c->vmm ? &cuda_iface_vmm : &cuda_iface;
    be->context = c;
    return 0;
}

static void cuda_close(struct tr_backend *be)
{
    context_free((struct cuda_context *)be->context);
    be->context = NULL;
    be->iface = NULL;
}

/* A library's version function, if the library loads: dlopen, call, close. */
static void *open_library(const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return NULL;
}

static int cuda_describe(char *buf, size_t size)
{
    if (!buf || size == 0)
        return -1;
    size_t len = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (len < size)                                                                            \
            len += (size_t)snprintf(buf + len, size - len, __VA_ARGS__);                           \
    } while (0)
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (driver)
        ADD("CUDA driver: supports CUDA %d.%d\n", driver / 1000, driver % 1000 / 10);
    else
        ADD("CUDA driver: none (libcuda.so.1 not found)\n");
    ADD("CUDA runtime: %d.%d (linked statically), kernels for sm_80, sm_90 and PTX compute_90\n",
        runtime / 1000, runtime % 1000 / 10);

    const char *lt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12",
                              TR_CUDA_HOME "/lib64/libcublasLt.so", "libcublasLt.so"};
    void *h = open_library(lt_names, sizeof lt_names / sizeof *lt_names);
    size_t (*lt_version)(void) = h ? (size_t(*)(void))dlsym(h, "cublasLtGetVersion") : NULL;
    if (lt_version) { /* major*10000 + minor*100 + patch */
        size_t v = lt_version();
        ADD("cuBLASLt: %zu.%zu.%zu\n", v / 10000, v / 100 % 100, v % 100);
    }
    else
        ADD("cuBLASLt: not found (GEMMs need it: install the CUDA toolkit's cuBLAS)\n");
    if (h)
        dlclose(h);

    char dnn_line[400];
    cuda_dnn_describe(dnn_line, sizeof dnn_line);
    ADD("%s", dnn_line);

    const char *nccl_names[] = {"libnccl.so.2", TR_CUDA_HOME "/lib64/libnccl.so.2", "libnccl.so"};
    h = open_library(nccl_names, sizeof nccl_names / sizeof *nccl_names);
    int (*nccl_version)(int *) = h ? (int (*)(int *))dlsym(h, "ncclGetVersion") : NULL;
    int nv = 0;
    if (nccl_version && nccl_version(&nv) == 0) /* >= 2.9: major*10000 + minor*100 + patch */
        ADD("NCCL: %d.%d.%d\n", nv / 10000, nv / 100 % 100, nv % 100);
    else
        ADD("NCCL: not found\n");
    if (h)
        dlclose(h);

    int count = 0;
    cudaError_t e = driver ? cudaGetDeviceCount(&count) : cudaErrorInsufficientDriver;
    if (e != cudaSuccess || count == 0) {
        char why[256];
        cudaDeviceProp prop;
        int device;
        device_check(why, sizeof why, &prop, &device);
        ADD("GPUs: no GPU (%s)\n", e == cudaSuccess ? "none visible" : why);
        cudaGetLastError();
        return 0;
    }
    for (int i = 0; i < count; i++) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
            ADD("GPU %d: cannot be queried\n", i);
            continue;
        }
        ADD("GPU %d: %s, %.1f GiB, %d SMs, compute capability %d.%d%s\n", i, prop.name,
            (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.multiProcessorCount,
            prop.major, prop.minor, prop.major < 8 ? " (too old for this build: needs 8.0)" : "");
    }
#undef ADD
    cudaGetLastError();
    return 0;
}

static const struct tr_backend_module cuda_module = {
    TR_BACKEND_ABI, sizeof(struct tr_backend_module), "cuda", cuda_open, cuda_close, cuda_describe,
};

extern "C" __attribute__((visibility("default"))) const struct tr_backend_module *
trainrun_backend_entry(void)
{
    return &cuda_module;
}

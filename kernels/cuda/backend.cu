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
 *
 * Memory: the core plans all device memory (g->scratch included, sized by
 * scratch_floats); the backend's own buffers (staging, cuBLASLt workspace,
 * reduction cells) are allocated once in open().  forward, backward, adamw
 * and sgd neither allocate nor wait for the device.
 *
 * Errors: a failed CUDA call is printed once and kept; sum_squares then
 * returns NaN, so the run loop sees a non-finite step instead of training on.
 *
 * This file holds the module's memory, streams, open/close and describe;
 * nodes.cu turns each graph node into kernel launches (conv2d into cuDNN
 * calls, conv.cu).
 */
#include "common.cuh"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TR_CUDA_HOME
#define TR_CUDA_HOME "/usr/local/cuda"
#endif

void cuda_note(struct cuda_context *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return;
    if (c->first_error == cudaSuccess) {
        c->first_error = e;
        fprintf(stderr, "trainrun: cuda: %s: %s (later CUDA errors are not shown)\n", what,
                cudaGetErrorString(e));
    }
}

/* ---- memory ----------------------------------------------------------------- */

static void *cuda_alloc(void *ctx, size_t bytes)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    void *p = NULL;
    cudaSetDevice(c->device);
    if (cudaMalloc(&p, rounded ? rounded : 256) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report, not sticky */
        return NULL;
    }
    CUDA_NOTE(c, cudaMemsetAsync(p, 0, rounded ? rounded : 256, c->compute));
    return p;
}

static void cuda_free(void *ctx, void *p)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    if (p)
        CUDA_NOTE(c, cudaFree(p));
}

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

static struct tr_backend_iface make_iface(void)
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
    return f;
}

static const struct tr_backend_iface cuda_iface = make_iface();

/* ---- open, close, describe -------------------------------------------------------- */

static void context_free(struct cuda_context *c)
{
    if (!c)
        return;
    if (c->compute)
        cudaStreamSynchronize(c->compute);
    if (c->copy)
        cudaStreamSynchronize(c->copy);
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
    be->iface = &cuda_iface;
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

/*
 * cudacpu: a stand-in for the CUDA runtime header, so the CUDA backend's
 * kernels (the .cu files of kernels/cuda, rewritten by tests/cudacpu/cu2cpp.pl)
 * compile with g++ and run on the CPU (docs/cuda.md, "Without a GPU").
 *
 * Each CUDA thread of a block is a fiber; blocks run one after another.
 * __syncthreads is a block barrier, and a warp operation (shuffle, ballot,
 * __syncwarp) completes only when every lane its mask names has arrived,
 * so warp-synchronous code behaves as on a GPU and the mistakes a GPU does
 * not report (a lane that exited, a lane outside the mask, a deadlock) stop
 * the kernel with a message naming it and its block.  Shared memory starts
 * as NaN; dynamic shared memory has a guard band after it and is checked
 * against the launch limits cudaFuncSetAttribute sets.
 *
 * Streams are queues: a launch, an async copy or memset, a host function
 * and an event record are queued on their stream and run only when a
 * synchronisation needs them (runtime.cpp says which calls and in what
 * order), so a missing cudaStreamWaitEvent or an unsynchronised host read
 * gives a wrong result instead of passing; and two streams touching the
 * same bytes with nothing ordering them stop the run in any order (the
 * stream hazard check: launches tell it their pointer arguments).
 *
 * Only what the backend uses is here: a kernel that needs more fails to
 * compile, which is the point.
 *
 * C sees the types and the few runtime calls the nccl comm plugin makes
 * (plugins/comm/nccl.c, built against the harness with the fake NCCL:
 * tests/cudacpu/cudart.c forwards them to the runtime's table below).
 */
#ifndef CUDACPU_CUDA_RUNTIME_H
#define CUDACPU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#include <tuple>
#include <type_traits>
#include <utility>
#else
#include <stdbool.h>
#endif

#define __CUDACPU__ 1
#define CUDART_VERSION 12080 /* what cudaRuntimeGetVersion says */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict

/* ---- types --------------------------------------------------------------- */

#ifdef __cplusplus
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
#endif

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};
typedef enum cudaError_t cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct cudacpu_stream;
struct cudacpu_event;
typedef struct cudacpu_stream *cudaStream_t;
typedef struct cudacpu_event *cudaEvent_t;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01

typedef void (*cudaHostFn_t)(void *userData);

/* cudaGetDriverEntryPointByVersion (driver_types.h's values) */
enum cudaGetDriverEntryPointFlags {
    cudaEnableDefault = 0x0,
    cudaEnableLegacyStream = 0x1,
    cudaEnablePerThreadDefaultStream = 0x2,
};
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2, /* sic, as CUDA spells it */
};

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;      /* without cudaFuncSetAttribute */
    size_t sharedMemPerBlockOptin; /* the most cudaFuncSetAttribute may allow */
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int multiProcessorCount;
    int major, minor;
};

#ifndef __cplusplus
typedef enum cudaError_t cudaError_t;
typedef enum cudaMemcpyKind cudaMemcpyKind;
typedef struct cudaDeviceProp cudaDeviceProp;
typedef struct cudacpu_touch cudacpu_touch;
typedef struct cudacpu_runtime_table cudacpu_runtime_table;
#endif

#ifdef __cplusplus
constexpr int warpSize = 32;

/* ---- the runtime API (tests/cudacpu/runtime.cpp) ------------------------- */

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void); /* clears a failed kernel's sticky error */
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
/* runs the work queued on s; cudaErrorNotReady only where a library call
 * that waits for other processes (the fake NCCL) is not done yet */
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e); /* runs the work it waits for: then cudaSuccess */
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData);
/* The driver functions of include/cuda.h the harness emulates (runtime.cpp,
 * "virtual memory"), by their base names; any other symbol gives NULL and
 * cudaDriverEntryPointSymbolNotFound, as does every symbol when the
 * environment has CUDACPU_NO_VMM=1 (a driver without virtual memory
 * management).  A cudaVersion above the emulated driver's (12080) is
 * cudaErrorInvalidValue, as on a GPU. */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus = NULL);
#else
/* C: what plugins/comm/nccl.c calls, defined by tests/cudacpu/cudart.c,
 * which forwards each to the runtime instance the process holds (through
 * cudacpu_runtime below) */
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
#endif

/* The stand-in libraries (tests/cudacpu/cudnn.cpp, cublaslt.cpp) are shared
 * objects of their own that get only a cudaStream_t, as the real ones do;
 * they find this table (the symbol cudacpu_runtime, exported by whatever
 * holds runtime.cpp: include/cudacpu_library.h) and queue their work on the
 * stream through it, where the real libraries launch their kernels. */
#define CUDACPU_RUNTIME_VERSION 4
/* bytes a library call reads or writes, for the stream hazard check */
struct cudacpu_touch {
    const void *p;
    size_t bytes;
    bool writes;
};
struct cudacpu_runtime_table {
    int version;
    cudaError_t (*launch_host_func)(cudaStream_t s, cudaHostFn_t fn, void *userData);
    /* the same, naming the call and what it touches (touch[0..n)) */
    cudaError_t (*launch_library_call)(cudaStream_t s, cudaHostFn_t fn, void *userData,
                                       const char *what, const cudacpu_touch *touch, int n);
    /* version 3 */
    /* a library call that waits for other processes (the fake NCCL's
     * collectives): poll(arg) when the stream gets there, and again until
     * it returns nonzero (having freed arg); until then cudaStreamQuery
     * and cudaEventQuery say cudaErrorNotReady and the other
     * synchronisations wait, letting the process's other threads in */
    cudaError_t (*launch_library_poll)(cudaStream_t s, int (*poll)(void *), void *arg,
                                       const char *what, const cudacpu_touch *touch, int n);
    /* the runtime's own calls, for code in another shared object that
     * must reach this instance (tests/cudacpu/cudart.c) */
    const char *(*get_error_string)(cudaError_t e);
    const char *(*get_error_name)(cudaError_t e);
    cudaError_t (*get_last_error)(void);
    cudaError_t (*get_device_count)(int *n);
    cudaError_t (*get_device_properties)(cudaDeviceProp *p, int device);
    cudaError_t (*set_device)(int device);
    cudaError_t (*get_device)(int *device);
    cudaError_t (*stream_create_with_flags)(cudaStream_t *s, unsigned flags);
    cudaError_t (*stream_destroy)(cudaStream_t s);
    cudaError_t (*stream_query)(cudaStream_t s);
    cudaError_t (*stream_synchronize)(cudaStream_t s);
    cudaError_t (*device_synchronize)(void);
    /* version 4: device memory, for the comm plugin's group ids */
    cudaError_t (*malloc_device)(void **p, size_t bytes);
    cudaError_t (*free_device)(void *p);
    cudaError_t (*memcpy_sync)(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
};

#ifdef __cplusplus
namespace cudacpu {

/* ---- the thread running now, and its block ------------------------------ */

struct thread_slot {
    uint3 idx; /* threadIdx */
};
extern thread_slot *current;
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

cudaError_t func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);

/* The order streams run in (runtime.cpp, "streams: queues"): "lazy" (the
 * default), "reverse" or "immediate", as CUDACPU_STREAM_ORDER names them;
 * for tests/cudacpu/selftest.  Runs all queued work first; -1 for an
 * unknown name. */
int set_stream_order(const char *name);

/* Whether an access of one stream that nothing orders with another
 * stream's access to the same bytes stops the work (runtime.cpp, "stream
 * hazards"; on unless switched off here); for tests/cudacpu/selftest,
 * whose checks of the stream order race on purpose.  Returns the old
 * setting. */
bool set_hazard_check(bool on);

/* ---- synchronisation ------------------------------------------------------ */

enum warp_kind { W_SHFL, W_SHFL_XOR, W_SHFL_UP, W_SHFL_DOWN, W_BALLOT, W_ANY, W_ALL, W_SYNCWARP };
void syncthreads(const char *file, int line);
uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width,
                 const char *file, int line);

inline void syncwarp(const char *file, int line, unsigned mask = 0xffffffffu)
{
    warp_op(W_SYNCWARP, mask, 0, 0, 32, file, line);
}

template <typename T>
inline T shfl(warp_kind kind, const char *file, int line, unsigned mask, T v, int arg,
              int width = 32)
{
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = warp_op(kind, mask, bits, arg, width, file, line);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

/* ---- shared memory (declarations rewritten by cu2cpp.pl) ----------------- */

/* `extern __shared__ T x[];`: this block's dynamic shared memory */
void *dynamic_shared(void);
/* a function-scope `__shared__` variable: NaN-filled once per block */
void shared_static(void *p, size_t bytes, unsigned long *generation);

/* ---- launches (`k<<<grid, block, smem, stream>>>(args)`) ------------------ */

struct config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s), stream(st) {}
};

/* a pointer a kernel is given: what the stream hazard check knows of what
 * it touches (the address, not the extent; a pointer to const is read) */
struct kernel_arg {
    const void *p;
    bool writes;
};
template <typename T> inline void note_arg(kernel_arg *, int &, const T &) {}
template <typename T> inline void note_arg(kernel_arg *a, int &n, T *const &p)
{
    a[n++] = kernel_arg{(const void *)p, !std::is_const<T>::value};
}

/* Checks the launch configuration (a refused launch sets the error
 * cudaGetLastError returns, at once, as on a GPU) and queues the grid on
 * c.stream: when the stream runs it, body(closure) runs as every thread of
 * every block, and release(closure) follows.  A kernel that fails then
 * makes the error sticky: later calls and synchronisations return it.
 * args[0..n_args) are its pointer arguments, for the hazard check. */
void launch_grid(const void *fn, const char *name, const char *file, int line, const config &c,
                 void (*body)(void *), void *closure, void (*release)(void *),
                 const kernel_arg *args, int n_args);

template <typename... P> struct kernel_call {
    void (*fn)(P...);
    std::tuple<std::decay_t<P>...> args; /* converted when launched, as CUDA does */
};

template <typename... P> struct launcher {
    void (*fn)(P...);
    const char *name, *file;
    int line;
    config cfg;
    template <typename... A> void operator()(A &&...args) const
    {
        /* the arguments are copied now: the grid runs later, when its
         * stream does; each thread gets its own copies of them */
        auto *call = new kernel_call<P...>{fn, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
        kernel_arg pointers[sizeof...(P) + 1];
        int n = 0;
        std::apply([&](const auto &...a) { (note_arg(pointers, n, a), ...); }, call->args);
        launch_grid((const void *)fn, name, file, line, cfg,
                    [](void *c) {
                        auto *k = static_cast<kernel_call<P...> *>(c);
                        std::apply(k->fn, k->args);
                    },
                    call, [](void *c) { delete static_cast<kernel_call<P...> *>(c); }, pointers, n);
    }
};

template <typename... P>
launcher<P...> launch(void (*fn)(P...), const char *name, const char *file, int line,
                      const config &c)
{
    return launcher<P...>{fn, name, file, line, c};
}

} /* namespace cudacpu */

template <typename F> cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute attr, int value)
{
    return cudacpu::func_set_attribute((const void *)fn, attr, value);
}

/* ---- built-in variables and functions ----------------------------------- */

#define threadIdx (cudacpu::current->idx)
#define blockIdx (cudacpu::block_idx)
#define blockDim (cudacpu::block_dim)
#define gridDim (cudacpu::grid_dim)

#define __syncthreads() cudacpu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) cudacpu::syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_sync(mask, ...) cudacpu::shfl(cudacpu::W_SHFL, __FILE__, __LINE__, mask, __VA_ARGS__)
#define __shfl_xor_sync(mask, ...) \
    cudacpu::shfl(cudacpu::W_SHFL_XOR, __FILE__, __LINE__, mask, __VA_ARGS__)
#define __shfl_up_sync(mask, ...) cudacpu::shfl(cudacpu::W_SHFL_UP, __FILE__, __LINE__, mask, __VA_ARGS__)
#define __shfl_down_sync(mask, ...) \
    cudacpu::shfl(cudacpu::W_SHFL_DOWN, __FILE__, __LINE__, mask, __VA_ARGS__)
#define __ballot_sync(mask, p) \
    ((unsigned)cudacpu::warp_op(cudacpu::W_BALLOT, mask, (p) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, p) \
    ((int)cudacpu::warp_op(cudacpu::W_ANY, mask, (p) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, p) \
    ((int)cudacpu::warp_op(cudacpu::W_ALL, mask, (p) != 0, 0, 32, __FILE__, __LINE__))

/* Fibers switch only inside the synchronisation calls above, so a
 * read-modify-write here is atomic with respect to every other thread. */
template <typename T> inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T> inline T atomicMax(T *p, T v)
{
    T old = *p;
    *p = old < v ? v : old;
    return old;
}
template <typename T> inline T atomicMin(T *p, T v)
{
    T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <typename T> inline T atomicExch(T *p, T v)
{
    T old = *p;
    *p = v;
    return old;
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __fdividef(float a, float b) { return a / b; }
/* rounded on their own, never fused (volatile: whatever -ffp-contract says) */
inline float __fmul_rn(float a, float b)
{
    volatile float r = a * b;
    return r;
}
inline float __fadd_rn(float a, float b)
{
    volatile float r = a + b;
    return r;
}

#endif /* __cplusplus */

#endif

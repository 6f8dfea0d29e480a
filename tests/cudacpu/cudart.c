/*
 * cudacpu's libcudart for code in a shared object of its own: the CUDA
 * runtime calls the nccl comm plugin makes (plugins/comm/nccl.c, built
 * against the harness with the fake NCCL into tests/cudacpu/comm).
 *
 * A process holds one runtime: the one linked into the harness's
 * backend_cuda.so (or a test program), with its streams, memory and
 * current device.  Code in another object must reach that instance, so
 * each call here forwards through the runtime's exported table
 * (cudacpu_runtime, include/cuda_runtime.h), found as the stand-in
 * libraries find it (include/cudacpu_library.h).  Without one the calls
 * say cudaErrorNoDevice, and the first says why on stderr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr */
#endif
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>

/* the runtime's table, and the process's count of loaded and unloaded
 * objects when it was found: while they stand, so does the table */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const cudacpu_runtime_table *cached;
static unsigned long long cached_adds, cached_subs;
static int warned;

struct generation {
    int known;
    unsigned long long adds, subs;
};

static int first_object(struct dl_phdr_info *info, size_t size, void *data)
{
    struct generation *g = data;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        g->known = 1;
        g->adds = info->dlpi_adds;
        g->subs = info->dlpi_subs;
    }
    return 1;
}

static int runtime_in(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    void *h = dlopen(info->dlpi_name && *info->dlpi_name ? info->dlpi_name : NULL,
                     RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *table = dlsym(h, "cudacpu_runtime");
    dlclose(h);
    if (!table)
        return 0;
    *(const cudacpu_runtime_table **)found = table;
    return 1;
}

/* also for tests/cudacpu/nccl.cpp, linked beside it */
const cudacpu_runtime_table *cudacpu_cudart_table(void)
{
    struct generation g = {0, 0, 0};
    dl_iterate_phdr(first_object, &g);
    pthread_mutex_lock(&lock);
    if (cached && g.known && g.adds == cached_adds && g.subs == cached_subs) {
        const cudacpu_runtime_table *t = cached;
        pthread_mutex_unlock(&lock);
        return t;
    }
    const cudacpu_runtime_table *t = NULL;
    dl_iterate_phdr(runtime_in, &t);
    if (t && t->version != CUDACPU_RUNTIME_VERSION) {
        if (!warned++)
            fprintf(stderr, "cudacpu: this process's runtime has table version %d, this "
                    "libcudart needs %d: rebuild tests/cudacpu\n", t->version,
                    CUDACPU_RUNTIME_VERSION);
        t = NULL;
    } else if (!t && !warned++) {
        fprintf(stderr, "cudacpu: no cudacpu runtime in this process (the harness's "
                "backend_cuda.so, TRAINRUN_BACKEND_PATH=tests/cudacpu/.libs, or LD_PRELOAD "
                "of it): the CUDA calls of this object have no device\n");
    }
    cached = g.known ? t : NULL;
    cached_adds = g.adds;
    cached_subs = g.subs;
    pthread_mutex_unlock(&lock);
    return t;
}

#define RT(call, ...)                                                                             \
    do {                                                                                           \
        const cudacpu_runtime_table *t = cudacpu_cudart_table();                                   \
        return t ? t->call(__VA_ARGS__) : cudaErrorNoDevice;                                       \
    } while (0)

const char *cudaGetErrorString(cudaError_t e)
{
    const cudacpu_runtime_table *t = cudacpu_cudart_table();
    return t ? t->get_error_string(e) : "no CUDA-capable device is detected (no cudacpu runtime)";
}
const char *cudaGetErrorName(cudaError_t e)
{
    const cudacpu_runtime_table *t = cudacpu_cudart_table();
    return t ? t->get_error_name(e) : "cudaErrorNoDevice";
}
cudaError_t cudaGetLastError(void) { RT(get_last_error); }
cudaError_t cudaGetDeviceCount(int *n)
{
    const cudacpu_runtime_table *t = cudacpu_cudart_table();
    if (!t) {
        *n = 0;
        return cudaErrorNoDevice;
    }
    return t->get_device_count(n);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    RT(get_device_properties, p, device);
}
cudaError_t cudaSetDevice(int device) { RT(set_device, device); }
cudaError_t cudaGetDevice(int *device) { RT(get_device, device); }
cudaError_t cudaStreamCreate(cudaStream_t *s) { RT(stream_create_with_flags, s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    RT(stream_create_with_flags, s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { RT(stream_destroy, s); }
cudaError_t cudaStreamQuery(cudaStream_t s) { RT(stream_query, s); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { RT(stream_synchronize, s); }
cudaError_t cudaDeviceSynchronize(void) { RT(device_synchronize); }
cudaError_t cudaMalloc(void **p, size_t bytes) { RT(malloc_device, p, bytes); }
cudaError_t cudaFree(void *p) { RT(free_device, p); }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    RT(memcpy_sync, dst, src, bytes, kind);
}

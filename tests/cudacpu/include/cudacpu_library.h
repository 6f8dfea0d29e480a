/*
 * For cudacpu's stand-in libraries (cudnn.cpp, cublaslt.cpp): queue work on
 * the stream a caller gave, as the real libraries launch their kernels
 * there, so it runs in the stream's order, when a synchronisation needs it
 * (runtime.cpp, "streams: queues").
 *
 * A stand-in library is a shared object of its own, opened with dlopen by a
 * backend that holds the runtime (tests/cudacpu/runtime.cpp, linked into
 * backend_cuda.so or a test program), so it cannot link to it: it looks
 * for the runtime's exported table, cudacpu_runtime, in every object of the
 * process.  A program holding the runtime itself must export it
 * (libtool's -export-dynamic).
 */
#ifndef CUDACPU_LIBRARY_H
#define CUDACPU_LIBRARY_H

#include <cuda_runtime.h>

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>

static int cudacpu_runtime_in(struct dl_phdr_info *info, size_t, void *found)
{
    void *h = dlopen(info->dlpi_name && *info->dlpi_name ? info->dlpi_name : NULL,
                     RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *table = dlsym(h, "cudacpu_runtime");
    dlclose(h);
    if (!table)
        return 0;
    *(const cudacpu_runtime_table **)found = (const cudacpu_runtime_table *)table;
    return 1;
}

/* Queues run(arg) on stream s (0: the legacy default stream); run frees
 * arg.  Looked up on each call: the backend holding the runtime may be
 * closed and opened again while this library stays loaded.  `what` names
 * the call and touch[0..n) are the bytes it reads and writes, for the
 * runtime's stream hazard check (n = 0: not known). */
static cudaError_t cudacpu_queue(cudaStream_t s, void (*run)(void *), void *arg,
                                 const char *what = NULL, const cudacpu_touch *touch = NULL,
                                 int n = 0)
{
    const cudacpu_runtime_table *rt = NULL;
    dl_iterate_phdr(cudacpu_runtime_in, &rt);
    if (!rt || rt->version != CUDACPU_RUNTIME_VERSION) {
        fprintf(stderr, "cudacpu: a stand-in library finds no cudacpu runtime (version %d) in "
                "this process to queue its work on\n", CUDACPU_RUNTIME_VERSION);
        return cudaErrorNotSupported;
    }
    return rt->launch_library_call(s, run, arg, what, touch, n);
}

#endif

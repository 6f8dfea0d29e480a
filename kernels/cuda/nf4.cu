/*
 * Frozen weights on the device (TR_ROLE_FROZEN, kernels/backend.h): a
 * linear's weight in fp32, bf16, fp16 or NF4 (kernels/nf4.h) and an
 * embedding's table in fp32, bf16 or fp16, each stored in its own type.
 *
 * Before a linear node's GEMM the weight becomes the GEMM's input type in
 * scratch (nodes.cu): NF4 through the kernel here, straight into fp32, bf16
 * or fp16, the others through cuda_convert.  A value is NF4[code] * scale
 * with the block's scale map[q] * absmax2 + offset, each operation rounded
 * on its own (__fmul_rn, __fadd_rn: nvcc would otherwise fuse them), so the
 * fp32 values are tr_nf4_dequantize's, bit for bit, and a 16-bit GEMM input
 * is their rounding as the CPU's.
 *
 * store_frozen quantises NF4 on the host (tr_nf4_quantize, kernels/nf4.c,
 * linked into the module) and copies the blob up, or copies fp32 up and
 * rounds it on the device (cuda_convert: nearest even); load_frozen widens
 * or dequantises on the device, NF4 with the kernel the GEMMs' inputs come
 * from, and copies fp32 down.
 */
#include "common.cuh" /* and kernels/nf4.h */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const unsigned THREADS = 256;

/* The two tables, passed by value to each launch (1088 bytes of kernel
 * parameters): read from kernels/nf4.c, so there is one copy of them. */
struct nf4_tables {
    float nf4[16];
    float map[256];
};

static struct nf4_tables tables(void)
{
    struct nf4_tables t;
    memcpy(t.nf4, tr_nf4_table, sizeof t.nf4);
    memcpy(t.map, tr_nf4_dynamic_map, sizeof t.map);
    return t;
}

/* Where a blob's parts start, for the kernel. */
struct nf4_layout {
    size_t n, qabsmax, absmax2, offset;
};

/* One thread per code byte (two values, of one block); floats read byte-wise,
 * as the blob need not be 4-byte aligned. */
template <typename T>
__global__ void nf4_dequantize_kernel(T *out, const unsigned char *blob, struct nf4_layout l,
                                      struct nf4_tables t)
{
    float offset;
    memcpy(&offset, blob + l.offset, sizeof offset);
    size_t bytes = l.n / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t b = i / (TR_NF4_BLOCK / 2);
        float absmax2;
        memcpy(&absmax2, blob + l.absmax2 + b / TR_NF4_BLOCK2 * sizeof(float), sizeof absmax2);
        float scale = __fadd_rn(__fmul_rn(t.map[blob[l.qabsmax + b]], absmax2), offset);
        unsigned c = blob[i];
        out[2 * i] = from_f32<T>(__fmul_rn(t.nf4[c >> 4], scale));
        out[2 * i + 1] = from_f32<T>(__fmul_rn(t.nf4[c & 15u], scale));
    }
}

template <typename T>
static void nf4_dequantize(struct cuda_context *c, void *out, const void *blob, size_t n)
{
    struct tr_nf4_parts p = tr_nf4_parts(n);
    struct nf4_layout l = {n, p.qabsmax, p.absmax2, p.offset};
    nf4_dequantize_kernel<T><<<grid_for(n / 2, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const unsigned char *)blob, l, tables());
    LAUNCHED(c, "nf4 dequantize");
}

void cuda_frozen_convert(struct cuda_context *c, void *out, int to, const struct tr_tensor *t)
{
    if (t->numel == 0)
        return;
    if ((int)t->dtype == DT_NF4)
        DISPATCH_STORAGE(to, nf4_dequantize, c, out, t->data, t->numel);
    else
        cuda_convert(c, out, to, t->data, (int)t->dtype, t->numel);
}

/* ---- embedding from a frozen 16-bit table into another storage type ------- */

template <typename Out, typename Table>
__global__ void frozen_embedding_kernel(Out *out, const int32_t *idx, const Table *table, int N,
                                        int C, int V)
{
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, col = i % C;
        int id = idx[n];
        out[i] = from_f32<Out>(id >= 0 && id < V ? to_f32(table[(size_t)id * C + col]) : 0.0f);
    }
}

template <typename Table>
static void frozen_embedding(struct cuda_context *c, int out_dt, void *out, const int32_t *idx,
                             const void *table, int N, int C, int V)
{
    unsigned blocks = grid_for((size_t)N * C, THREADS);
    const Table *tb = (const Table *)table;
    switch (out_dt) {
    case DT_BF16:
        frozen_embedding_kernel<__nv_bfloat16, Table><<<blocks, THREADS, 0, c->compute>>>(
            (__nv_bfloat16 *)out, idx, tb, N, C, V);
        break;
    case DT_F16:
        frozen_embedding_kernel<__half, Table><<<blocks, THREADS, 0, c->compute>>>(
            (__half *)out, idx, tb, N, C, V);
        break;
    default:
        frozen_embedding_kernel<float, Table><<<blocks, THREADS, 0, c->compute>>>(
            (float *)out, idx, tb, N, C, V);
        break;
    }
    LAUNCHED(c, "embedding forward (frozen table)");
}

void cuda_frozen_embedding_forward(struct cuda_context *c, int out_dt, void *out,
                                   const int32_t *idx, const void *table, int table_dt, int N,
                                   int C, int V)
{
    DISPATCH_STORAGE(table_dt, frozen_embedding, c, out_dt, out, idx, table, N, C, V);
}

/* ---- store_frozen and load_frozen ------------------------------------------ */

static int frozen_fail(tr_err *err, const struct tr_tensor *t, const char *why)
{
    return tr_fail(err, "frozen weight '%s' (%zu values): %s", t->name ? t->name : "?", t->numel,
                   why);
}

/* bytes copied to the device, and the CUDA error of the copy */
static cudaError_t copy_up(struct cuda_context *c, void *dst, const void *src, size_t bytes)
{
    cudaSetDevice(c->device);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->compute);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->compute);
    return e;
}

static cudaError_t copy_down(struct cuda_context *c, void *dst, const void *src, size_t bytes)
{
    cudaSetDevice(c->device);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->compute);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->compute);
    return e;
}

/* n floats of device memory for a conversion at load or export, or NULL */
static float *device_floats(struct cuda_context *c, size_t n)
{
    float *d = NULL;
    cudaSetDevice(c->device);
    if (cudaMalloc((void **)&d, n * sizeof(float) + 4) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return d;
}

int cuda_store_frozen(void *ctx, const struct tr_tensor *t, const float *host, tr_err *err)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    size_t n = t->numel;
    cudaError_t e;
    switch ((int)t->dtype) {
    case DT_F32:
        e = copy_up(c, t->data, host, n * sizeof(float));
        break;
    case DT_BF16:
    case DT_F16: { /* rounded to nearest even on the device (cuda_convert) */
        float *d = device_floats(c, n);
        if (!d)
            return frozen_fail(err, t, "out of GPU memory to round it");
        e = copy_up(c, d, host, n * sizeof(float));
        if (e == cudaSuccess) {
            cuda_convert(c, t->data, (int)t->dtype, d, DT_F32, n);
            e = cudaStreamSynchronize(c->compute);
        }
        cudaFree(d);
        break;
    }
    case DT_NF4: { /* quantised on the host: kernels/nf4.c */
        if (n % TR_NF4_BLOCK != 0)
            return frozen_fail(err, t, "no whole number of NF4 blocks of 64");
        size_t bytes = tr_nf4_bytes(n);
        void *blob = malloc(bytes);
        if (!blob)
            return frozen_fail(err, t, "out of host memory to quantise it");
        if (tr_nf4_quantize(blob, host, n) != 0) {
            free(blob);
            return frozen_fail(err, t, "out of host memory to quantise it");
        }
        e = copy_up(c, t->data, blob, bytes);
        free(blob);
        break;
    }
    default:
        return frozen_fail(err, t, "no frozen storage of this dtype on cuda");
    }
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e != cudaSuccess)
        return tr_fail(err, "frozen weight '%s': storing it on the GPU: %s",
                       t->name ? t->name : "?", cudaGetErrorString(e));
    return TR_OK;
}

int cuda_load_frozen(void *ctx, const struct tr_tensor *t, float *host, tr_err *err)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    size_t n = t->numel;
    cudaError_t e;
    if ((int)t->dtype == DT_F32) {
        e = copy_down(c, host, t->data, n * sizeof(float));
    } else if ((int)t->dtype == DT_BF16 || (int)t->dtype == DT_F16 || (int)t->dtype == DT_NF4) {
        /* widened, or dequantised by the kernel the GEMMs' inputs come from,
         * on the device */
        if ((int)t->dtype == DT_NF4 && n % TR_NF4_BLOCK != 0)
            return frozen_fail(err, t, "no whole number of NF4 blocks of 64");
        float *d = device_floats(c, n);
        if (!d)
            return frozen_fail(err, t, "out of GPU memory to widen it");
        cuda_frozen_convert(c, d, DT_F32, t);
        e = cudaGetLastError();
        if (e == cudaSuccess)
            e = copy_down(c, host, d, n * sizeof(float));
        cudaFree(d);
    } else {
        return frozen_fail(err, t, "no frozen storage of this dtype on cuda");
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tr_fail(err, "frozen weight '%s': reading it from the GPU: %s",
                       t->name ? t->name : "?", cudaGetErrorString(e));
    }
    return TR_OK;
}

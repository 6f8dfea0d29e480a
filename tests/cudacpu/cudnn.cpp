/*
 * A fake libcudnn for the CUDA-on-CPU harness: kernels/cuda/conv.cu dlopens
 * it as the real one (tests/cudacpu/dnn/lib64/libcudnn.so.99) and drives it
 * through the same calls; device pointers are host memory there, so it
 * computes each convolution on the CPU with reference loops.
 *
 * It implements exactly the calls conv.cu makes (descriptors, the *_v7
 * heuristics, workspace sizes, forward, backward data and backward filter)
 * and is as strict as cuDNN where a mistake would otherwise pass unseen:
 *
 *  - tensors and filters must be described as they are stored (NHWC /
 *    KRSC, fp32): anything else is CUDNN_STATUS_NOT_SUPPORTED;
 *  - the shapes must agree (input channels = filter channels x groups, the
 *    output size that of the padding, stride and dilation), else
 *    CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, as cuDNN refuses them;
 *  - alpha and beta as cuDNN: out = alpha conv + beta out, out not read when
 *    beta is 0;
 *  - the algorithms the heuristics list need workspace: a call with less
 *    than GetWorkspaceSize said fails, and the workspace is filled with NaN
 *    bytes before the inputs are read, so a workspace overlapping an
 *    operand shows up as a wrong result;
 *  - the non-deterministic algorithms (backward data ALGO_0, backward
 *    filter ALGO_0 and ALGO_3, ranked first as they often are on a GPU)
 *    add their terms in an order that changes from call to call, like
 *    atomics: a backend that picks them trains different bits each run;
 *  - CUDNN_DEFAULT_MATH and CUDNN_TENSOR_OP_MATH round the inputs to tf32 as
 *    an Ampere GPU's tensor cores do; only CUDNN_FMA_MATH computes in fp32;
 *  - a convolution is checked when called (its status comes back at once)
 *    and computed when the stream of cudnnSetStream runs it (without one,
 *    the legacy default stream, which the backend's non-blocking streams
 *    do not wait for): with the descriptors as they were at the call, and
 *    alpha and beta read then (cudacpu_library.h).
 */
#include <cudacpu_library.h>
#include <cudnn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API extern "C" __attribute__((visibility("default")))

struct cudacpu_dnn_context {
    cudaStream_t stream;
};
struct cudacpu_dnn_tensor {
    cudnnTensorFormat_t format;
    cudnnDataType_t type;
    int n, c, h, w, set;
};
struct cudacpu_dnn_filter {
    cudnnTensorFormat_t format;
    cudnnDataType_t type;
    int k, c, h, w, set;
};
struct cudacpu_dnn_conv {
    int ph, pw, sh, sw, dh, dw, groups, set;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};

static unsigned long long calls; /* reorders the non-deterministic algorithms' sums */

/* CUDACPU_CUDNN_VERSION=N makes it report version N, so that the tests see
 * the backend refuse a cuDNN of another major version (tests/e2e/cudacpu.sh) */
API size_t cudnnGetVersion(void)
{
    const char *v = getenv("CUDACPU_CUDNN_VERSION");
    if (v && *v)
        return (size_t)strtoul(v, NULL, 10);
    return CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL;
}

API const char *cudnnGetErrorString(cudnnStatus_t s)
{
    switch (s) {
    case CUDNN_STATUS_SUCCESS:
        return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
        return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
        return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
        return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
        return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_INITIALIZED:
        return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_INTERNAL_ERROR:
        return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED:
        return "CUDNN_STATUS_EXECUTION_FAILED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}

API cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    *handle = (cudnnHandle_t)calloc(1, sizeof **handle);
    return *handle ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR;
}
API cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

template <typename D> static cudnnStatus_t create(D **desc)
{
    *desc = (D *)calloc(1, sizeof **desc);
    return *desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR;
}

API cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) { return create(d); }
API cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                             cudnnDataType_t type, int n, int c, int h, int w)
{
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    *d = {format, type, n, c, h, w, 1};
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) { return create(d); }
API cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                             cudnnTensorFormat_t format, int k, int c, int h, int w)
{
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    *d = {format, type, k, c, h, w, 1};
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d)
{
    cudnnStatus_t s = create(d);
    if (s == CUDNN_STATUS_SUCCESS) {
        (*d)->groups = 1;
        (*d)->math = CUDNN_DEFAULT_MATH;
    }
    return s;
}
API cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h,
                                                  int pad_w, int u, int v, int dilation_h,
                                                  int dilation_w, cudnnConvolutionMode_t mode,
                                                  cudnnDataType_t compute)
{
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (compute != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE; /* all this fake computes in */
    d->ph = pad_h;
    d->pw = pad_w;
    d->sh = u;
    d->sw = v;
    d->dh = dilation_h;
    d->dw = dilation_w;
    d->mode = mode;
    d->compute = compute;
    d->set = 1;
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups)
{
    if (groups <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    d->groups = groups;
    return CUDNN_STATUS_SUCCESS;
}
API cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math)
{
    if (math < CUDNN_DEFAULT_MATH || math > CUDNN_FMA_MATH)
        return CUDNN_STATUS_BAD_PARAM;
    d->math = math;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the shapes: what cuDNN checks before it runs anything ---------------------- */

static cudnnStatus_t check(const cudacpu_dnn_tensor *x, const cudacpu_dnn_filter *w,
                           const cudacpu_dnn_conv *c, const cudacpu_dnn_tensor *y)
{
    if (!x || !w || !c || !y || !x->set || !w->set || !c->set || !y->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (x->format != CUDNN_TENSOR_NHWC || y->format != CUDNN_TENSOR_NHWC ||
        w->format != CUDNN_TENSOR_NHWC)
        return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT; /* the fake reads channel-last only */
    if (x->type != CUDNN_DATA_FLOAT || y->type != CUDNN_DATA_FLOAT || w->type != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    if (x->c != w->c * c->groups || w->k % c->groups != 0 || y->c != w->k || y->n != x->n)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    int oh = (x->h + 2 * c->ph - c->dh * (w->h - 1) - 1) / c->sh + 1;
    int ow = (x->w + 2 * c->pw - c->dw * (w->w - 1) - 1) / c->sw + 1;
    if (oh <= 0 || ow <= 0 || y->h != oh || y->w != ow)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    return CUDNN_STATUS_SUCCESS;
}

/* workspace each algorithm asks for: some, depending on the shapes */
static size_t fwd_workspace(const cudacpu_dnn_tensor *x, const cudacpu_dnn_filter *w, int algo)
{
    return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
               ? (size_t)x->n * 64 + (size_t)w->h * w->w * 4 * 32
               : 0;
}
static size_t data_workspace(const cudacpu_dnn_tensor *dx, int algo)
{
    return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 ? (size_t)dx->n * dx->c * 4 + 512 : 0;
}
static size_t filter_workspace(const cudacpu_dnn_filter *dw, int algo)
{
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ? (size_t)dw->k * dw->c * dw->h * dw->w * 4
           : algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 ? 4096
                                                        : 0;
}

API cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, const int requested,
    int *returned, cudnnConvolutionFwdAlgoPerf_t *results)
{
    cudnnStatus_t s = check(x, w, conv, y);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    const cudnnConvolutionFwdAlgo_t algos[] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                               CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM};
    int n = 0;
    for (int i = 0; i < 2 && n < requested; i++, n++) {
        memset(&results[n], 0, sizeof results[n]);
        results[n].algo = algos[i];
        results[n].status = CUDNN_STATUS_SUCCESS;
        results[n].memory = fwd_workspace(x, w, algos[i]);
        results[n].determinism = CUDNN_DETERMINISTIC;
        results[n].mathType = conv->math;
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested,
    int *returned, cudnnConvolutionBwdDataAlgoPerf_t *results)
{
    cudnnStatus_t s = check(dx, w, conv, dy);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    const cudnnConvolutionBwdDataAlgo_t algos[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
                                                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
    int n = 0;
    for (int i = 0; i < 2 && n < requested; i++, n++) {
        memset(&results[n], 0, sizeof results[n]);
        results[n].algo = algos[i];
        results[n].status = CUDNN_STATUS_SUCCESS;
        results[n].memory = data_workspace(dx, algos[i]);
        results[n].determinism = i == 0 ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
        results[n].mathType = conv->math;
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested,
    int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *results)
{
    cudnnStatus_t s = check(x, dw, conv, dy);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    const cudnnConvolutionBwdFilterAlgo_t algos[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                                                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
                                                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};
    int n = 0;
    for (int i = 0; i < 3 && n < requested; i++, n++) {
        memset(&results[n], 0, sizeof results[n]);
        results[n].algo = algos[i];
        results[n].status = CUDNN_STATUS_SUCCESS;
        results[n].memory = filter_workspace(dw, algos[i]);
        results[n].determinism = i < 2 ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
        results[n].mathType = conv->math;
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t,
                                                          const cudnnTensorDescriptor_t x,
                                                          const cudnnFilterDescriptor_t w,
                                                          const cudnnConvolutionDescriptor_t conv,
                                                          const cudnnTensorDescriptor_t y,
                                                          cudnnConvolutionFwdAlgo_t algo,
                                                          size_t *bytes)
{
    cudnnStatus_t s = check(x, w, conv, y);
    if (s == CUDNN_STATUS_SUCCESS)
        *bytes = fwd_workspace(x, w, algo);
    return s;
}
API cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes)
{
    cudnnStatus_t s = check(dx, w, conv, dy);
    if (s == CUDNN_STATUS_SUCCESS)
        *bytes = data_workspace(dx, algo);
    return s;
}
API cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes)
{
    cudnnStatus_t s = check(x, dw, conv, dy);
    if (s == CUDNN_STATUS_SUCCESS)
        *bytes = filter_workspace(dw, algo);
    return s;
}

/* ---- the arithmetic ------------------------------------------------------------- */

/* fp32 to tf32, round to nearest, ties away from zero (cvt.rna.tf32.f32) */
static float tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* an operand as the math type reads it: tf32 on tensor cores */
static float *load(const void *p, size_t n, cudnnMathType_t math)
{
    float *v = (float *)malloc(n * sizeof *v);
    if (!v)
        return NULL;
    memcpy(v, p, n * sizeof *v);
    if (math != CUDNN_FMA_MATH)
        for (size_t i = 0; i < n; i++)
            v[i] = tf32(v[i]);
    return v;
}

static cudnnStatus_t check_workspace(void *ws, size_t have, size_t need)
{
    if (need > have || (need && !ws))
        return CUDNN_STATUS_BAD_PARAM; /* cuDNN: insufficient workspace */
    return CUDNN_STATUS_SUCCESS;
}

/* One convolution call as it was made: the descriptors as they were then,
 * alpha and beta read from the host then (as cuDNN does), the pointers.
 * It is checked at once and computed when the handle's stream runs it. */
struct conv_call {
    void (*compute)(const conv_call *k);
    cudacpu_dnn_tensor x, y; /* backward data: dx and dy */
    cudacpu_dnn_filter w;
    cudacpu_dnn_conv conv;
    float alpha, beta;
    const void *in1, *in2; /* forward x, w; backward data w, dy; backward filter x, dy */
    void *out;
    void *ws;
    size_t ws_need;
    int algo; /* the backward ones: which order the sums take */
};

static void run_conv(void *arg)
{
    const conv_call *k = (const conv_call *)arg;
    if (k->ws_need)
        memset(k->ws, 0xff, k->ws_need); /* NaN: an operand overlapping it is ruined */
    k->compute(k);
    free(arg);
}

static void out_of_memory(void)
{
    fprintf(stderr, "cudacpu: the fake cuDNN is out of host memory: a convolution's output is "
            "left unwritten\n");
}

/* The geometry of one convolution and the index helpers of its NHWC/KRSC
 * operands: output (b, oh, ow, k) reads input (b, ih, iw, g*Cg + c) times
 * filter (k, r, s, c) for ih = oh*sh - ph + r*dh (filter flipped for
 * CUDNN_CONVOLUTION). */
struct geom {
    int N, H, W, C, K, R, S, Cg, Kg, OH, OW, ph, pw, sh, sw, dh, dw, flip;
    size_t x(int b, int h, int w, int c) const { return (((size_t)b * H + h) * W + w) * C + c; }
    size_t y(int b, int h, int w, int k) const { return (((size_t)b * OH + h) * OW + w) * K + k; }
    size_t f(int k, int r, int s, int c) const { return (((size_t)k * R + r) * S + s) * Cg + c; }
    int fr(int r) const { return flip ? R - 1 - r : r; }
    int fs(int s) const { return flip ? S - 1 - s : s; }
};

static geom geom_of(const cudacpu_dnn_tensor *x, const cudacpu_dnn_filter *w,
                    const cudacpu_dnn_conv *c, const cudacpu_dnn_tensor *y)
{
    geom g;
    g.N = x->n, g.H = x->h, g.W = x->w, g.C = x->c, g.K = w->k, g.R = w->h, g.S = w->w;
    g.Cg = w->c, g.Kg = w->k / c->groups, g.OH = y->h, g.OW = y->w;
    g.ph = c->ph, g.pw = c->pw, g.sh = c->sh, g.sw = c->sw, g.dh = c->dh, g.dw = c->dw;
    g.flip = c->mode == CUDNN_CONVOLUTION;
    return g;
}

static void blend(float *out, const double *v, size_t n, float a, float b)
{
    for (size_t i = 0; i < n; i++)
        out[i] = b == 0.0f ? (float)(a * v[i]) : (float)(a * v[i]) + b * out[i];
}

static void forward_now(const conv_call *call);
static void backward_data_now(const conv_call *call);

static cudnnStatus_t queue_conv(cudnnHandle_t handle, const conv_call &k)
{
    /* what it reads and writes, for the runtime's stream hazard check */
    geom g = geom_of(&k.x, &k.w, &k.conv, &k.y);
    size_t xb = (size_t)g.N * g.H * g.W * g.C * sizeof(float);
    size_t wb = (size_t)g.K * g.R * g.S * g.Cg * sizeof(float);
    size_t yb = (size_t)g.N * g.OH * g.OW * g.K * sizeof(float);
    const char *what = "cudnnConvolutionBackwardFilter";
    size_t in1 = xb, in2 = yb, out = wb; /* x, dy -> dw */
    if (k.compute == forward_now)
        what = "cudnnConvolutionForward", in1 = xb, in2 = wb, out = yb; /* x, w -> y */
    else if (k.compute == backward_data_now)
        what = "cudnnConvolutionBackwardData", in1 = wb, in2 = yb, out = xb; /* w, dy -> dx */
    const cudacpu_touch touch[] = {
        {k.in1, in1, false}, {k.in2, in2, false}, {k.out, out, true}, {k.ws, k.ws_need, true}};
    conv_call *call = (conv_call *)malloc(sizeof *call);
    if (!call)
        return CUDNN_STATUS_INTERNAL_ERROR;
    *call = k;
    if (cudacpu_queue(handle->stream, run_conv, call, what, touch, 4) != cudaSuccess) {
        free(call);
        return CUDNN_STATUS_EXECUTION_FAILED;
    }
    return CUDNN_STATUS_SUCCESS;
}

static void forward_now(const conv_call *call)
{
    const cudacpu_dnn_tensor *xd = &call->x, *yd = &call->y;
    const cudacpu_dnn_filter *wd = &call->w;
    const cudacpu_dnn_conv *cd = &call->conv;
    const void *x = call->in1, *w = call->in2;
    void *y = call->out;
    geom g = geom_of(xd, wd, cd, yd);
    size_t xn = (size_t)g.N * g.H * g.W * g.C, wn = (size_t)g.K * g.R * g.S * g.Cg;
    size_t yn = (size_t)g.N * g.OH * g.OW * g.K;
    float *xv = load(x, xn, cd->math), *wv = load(w, wn, cd->math);
    double *out = (double *)calloc(yn, sizeof *out);
    if (!xv || !wv || !out) {
        free(xv), free(wv), free(out);
        out_of_memory();
        return;
    }
    for (int b = 0; b < g.N; b++)
        for (int oh = 0; oh < g.OH; oh++)
            for (int ow = 0; ow < g.OW; ow++)
                for (int k = 0; k < g.K; k++) {
                    int grp = k / g.Kg;
                    double sum = 0.0;
                    for (int r = 0; r < g.R; r++) {
                        int ih = oh * g.sh - g.ph + g.fr(r) * g.dh;
                        if (ih < 0 || ih >= g.H)
                            continue;
                        for (int q = 0; q < g.S; q++) {
                            int iw = ow * g.sw - g.pw + g.fs(q) * g.dw;
                            if (iw < 0 || iw >= g.W)
                                continue;
                            for (int c = 0; c < g.Cg; c++)
                                sum += (double)xv[g.x(b, ih, iw, grp * g.Cg + c)] *
                                       wv[g.f(k, r, q, c)];
                        }
                    }
                    out[g.y(b, oh, ow, k)] = sum;
                }
    blend((float *)y, out, yn, call->alpha, call->beta);
    free(xv), free(wv), free(out);
}

API cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                          const cudnnTensorDescriptor_t xd, const void *x,
                                          const cudnnFilterDescriptor_t wd, const void *w,
                                          const cudnnConvolutionDescriptor_t cd,
                                          cudnnConvolutionFwdAlgo_t algo, void *ws, size_t ws_bytes,
                                          const void *beta, const cudnnTensorDescriptor_t yd,
                                          void *y)
{
    cudnnStatus_t s = check(xd, wd, cd, yd);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    if (!handle || !x || !w || !y || !alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM &&
        algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        return CUDNN_STATUS_NOT_SUPPORTED;
    size_t need = fwd_workspace(xd, wd, algo);
    if ((s = check_workspace(ws, ws_bytes, need)) != CUDNN_STATUS_SUCCESS)
        return s;
    conv_call k = {forward_now, *xd, *yd, *wd, *cd, *(const float *)alpha, *(const float *)beta,
                   x, w, y, ws, need, 0};
    return queue_conv(handle, k);
}

static void backward_data_now(const conv_call *call)
{
    const cudacpu_dnn_tensor *dxd = &call->x, *dyd = &call->y;
    const cudacpu_dnn_filter *wd = &call->w;
    const cudacpu_dnn_conv *cd = &call->conv;
    const void *w = call->in1, *dy = call->in2;
    void *dx = call->out;
    int algo = call->algo;
    geom g = geom_of(dxd, wd, cd, dyd);
    size_t xn = (size_t)g.N * g.H * g.W * g.C, wn = (size_t)g.K * g.R * g.S * g.Cg;
    size_t yn = (size_t)g.N * g.OH * g.OW * g.K;
    float *wv = load(w, wn, cd->math), *dyv = load(dy, yn, cd->math);
    float *acc = (float *)calloc(xn, sizeof *acc);
    double *out = (double *)malloc(xn * sizeof *out);
    if (!wv || !dyv || !acc || !out) {
        free(wv), free(dyv), free(acc), free(out);
        out_of_memory();
        return;
    }
    /* scatter in fp32 over the outputs, forwards or (odd calls of the
     * non-deterministic algorithm) backwards: the rounding differs */
    int reverse = algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 && (calls++ & 1);
    size_t positions = (size_t)g.N * g.OH * g.OW;
    for (size_t at = 0; at < positions; at++) {
        size_t p = reverse ? positions - 1 - at : at;
        int ow = (int)(p % g.OW), oh = (int)(p / g.OW % g.OH), b = (int)(p / g.OW / g.OH);
        for (int k = 0; k < g.K; k++) {
            int grp = k / g.Kg;
            float d = dyv[g.y(b, oh, ow, k)];
            for (int r = 0; r < g.R; r++) {
                int ih = oh * g.sh - g.ph + g.fr(r) * g.dh;
                if (ih < 0 || ih >= g.H)
                    continue;
                for (int q = 0; q < g.S; q++) {
                    int iw = ow * g.sw - g.pw + g.fs(q) * g.dw;
                    if (iw < 0 || iw >= g.W)
                        continue;
                    for (int c = 0; c < g.Cg; c++)
                        acc[g.x(b, ih, iw, grp * g.Cg + c)] += d * wv[g.f(k, r, q, c)];
                }
            }
        }
    }
    for (size_t i = 0; i < xn; i++)
        out[i] = acc[i];
    blend((float *)dx, out, xn, call->alpha, call->beta);
    free(wv), free(dyv), free(acc), free(out);
}

API cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                               const cudnnFilterDescriptor_t wd, const void *w,
                                               const cudnnTensorDescriptor_t dyd, const void *dy,
                                               const cudnnConvolutionDescriptor_t cd,
                                               cudnnConvolutionBwdDataAlgo_t algo, void *ws,
                                               size_t ws_bytes, const void *beta,
                                               const cudnnTensorDescriptor_t dxd, void *dx)
{
    cudnnStatus_t s = check(dxd, wd, cd, dyd);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    if (!handle || !w || !dy || !dx || !alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 && algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)
        return CUDNN_STATUS_NOT_SUPPORTED;
    size_t need = data_workspace(dxd, algo);
    if ((s = check_workspace(ws, ws_bytes, need)) != CUDNN_STATUS_SUCCESS)
        return s;
    conv_call k = {backward_data_now, *dxd, *dyd, *wd, *cd, *(const float *)alpha,
                   *(const float *)beta, w, dy, dx, ws, need, algo};
    return queue_conv(handle, k);
}

static void backward_filter_now(const conv_call *call)
{
    const cudacpu_dnn_tensor *xd = &call->x, *dyd = &call->y;
    const cudacpu_dnn_filter *dwd = &call->w;
    const cudacpu_dnn_conv *cd = &call->conv;
    const void *x = call->in1, *dy = call->in2;
    void *dw = call->out;
    int algo = call->algo;
    geom g = geom_of(xd, dwd, cd, dyd);
    size_t xn = (size_t)g.N * g.H * g.W * g.C, wn = (size_t)g.K * g.R * g.S * g.Cg;
    size_t yn = (size_t)g.N * g.OH * g.OW * g.K;
    float *xv = load(x, xn, cd->math), *dyv = load(dy, yn, cd->math);
    float *acc = (float *)calloc(wn, sizeof *acc);
    double *out = (double *)malloc(wn * sizeof *out);
    if (!xv || !dyv || !acc || !out) {
        free(xv), free(dyv), free(acc), free(out);
        out_of_memory();
        return;
    }
    int reverse = algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 && (calls++ & 1);
    size_t positions = (size_t)g.N * g.OH * g.OW;
    for (size_t at = 0; at < positions; at++) {
        size_t p = reverse ? positions - 1 - at : at;
        int ow = (int)(p % g.OW), oh = (int)(p / g.OW % g.OH), b = (int)(p / g.OW / g.OH);
        for (int k = 0; k < g.K; k++) {
            int grp = k / g.Kg;
            float d = dyv[g.y(b, oh, ow, k)];
            for (int r = 0; r < g.R; r++) {
                int ih = oh * g.sh - g.ph + g.fr(r) * g.dh;
                if (ih < 0 || ih >= g.H)
                    continue;
                for (int q = 0; q < g.S; q++) {
                    int iw = ow * g.sw - g.pw + g.fs(q) * g.dw;
                    if (iw < 0 || iw >= g.W)
                        continue;
                    for (int c = 0; c < g.Cg; c++)
                        acc[g.f(k, r, q, c)] += d * xv[g.x(b, ih, iw, grp * g.Cg + c)];
                }
            }
        }
    }
    for (size_t i = 0; i < wn; i++)
        out[i] = acc[i];
    blend((float *)dw, out, wn, call->alpha, call->beta);
    free(xv), free(dyv), free(acc), free(out);
}

API cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                                 const cudnnTensorDescriptor_t xd, const void *x,
                                                 const cudnnTensorDescriptor_t dyd, const void *dy,
                                                 const cudnnConvolutionDescriptor_t cd,
                                                 cudnnConvolutionBwdFilterAlgo_t algo, void *ws,
                                                 size_t ws_bytes, const void *beta,
                                                 const cudnnFilterDescriptor_t dwd, void *dw)
{
    cudnnStatus_t s = check(xd, dwd, cd, dyd);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    if (!handle || !x || !dy || !dw || !alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 && algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 &&
        algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3)
        return CUDNN_STATUS_NOT_SUPPORTED;
    size_t need = filter_workspace(dwd, algo);
    if ((s = check_workspace(ws, ws_bytes, need)) != CUDNN_STATUS_SUCCESS)
        return s;
    conv_call k = {backward_filter_now, *xd, *dyd, *dwd, *cd, *(const float *)alpha,
                   *(const float *)beta, x, dy, dw, ws, need, algo};
    return queue_conv(handle, k);
}

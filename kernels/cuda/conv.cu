/*
 * Convolutions through cuDNN's convolution API (cudnnConvolutionForward,
 * BackwardData, BackwardFilter), channel-last: x[B,H,W,IC] and y as
 * CUDNN_TENSOR_NHWC tensors, w[OC,KH,KW,IC/groups] as an NHWC (KRSC)
 * filter, groups through cudnnSetConvolutionGroupCount.
 *
 * Why these calls and not the graph (frontend) API: they are stable in
 * cuDNN 9, take the three directions one call each, and are few enough for
 * the CUDA-on-CPU harness to stand in for them (tests/cudacpu/cudnn.cpp), so
 * every line here runs in `make check`; the graph API is the route to fused
 * conv + bias + activation later.
 *
 * Arithmetic: cuDNN always runs in fp32 (CUDNN_DATA_FLOAT tensors, fp32
 * accumulation).  Under a 16-bit compute dtype x, w (and dy in backward)
 * are first rounded to it, into fp32 copies in scratch, and the math type
 * allows tensor cores (TF32): a bf16 or fp16 value is exact in tf32, so the
 * products are those of the 16-bit inputs, accumulated in fp32, as the
 * contract asks; plain fp32 runs with CUDNN_FMA_MATH (no TF32) unless the
 * policy allows tf32.  16-bit storage is converted to fp32 the same way and
 * the output converted back after the bias is added in fp32.  Gradients are
 * fp32 and accumulate through cuDNN's beta = 1.
 *
 * Algorithms: each distinct convolution (shapes, attributes, math type) gets
 * its descriptors and three algorithms once, from the *_v7 heuristics: the
 * first the heuristics rank that succeeds, is deterministic (backward data
 * and filter ALGO_0 and filter ALGO_3 add with atomics) and needs at most
 * CONV_WORKSPACE_MAX bytes.  The workspace is part of the node's scratch
 * (scratch_floats), so a step allocates nothing.
 *
 * cuDNN is opened with dlopen when the backend opens, like cuBLASLt: the
 * module loads where cuDNN is missing, GPT-style models run, and a model
 * with a convolution is refused when its run starts, saying why.
 */
#include "common.cuh"

#include <stdio.h>

#ifndef TR_CUDA_NO_CUDNN
#include <cudnn.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#ifndef TR_CUDA_HOME
#define TR_CUDA_HOME "/usr/local/cuda"
#endif
/* where libcudnn.so.<major> is looked for after the library path */
#ifndef TR_CUDNN_HOME
#define TR_CUDNN_HOME TR_CUDA_HOME
#endif

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const unsigned THREADS = 256;
#define CONV_WORKSPACE_MAX ((size_t)256 << 20) /* per algorithm */
enum { CONV_PLANS = 128, CONV_ALGOS = 16 };

struct dnn_api {
    void *handle;
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnCreateTensorDescriptor) tensor_create;
    decltype(&cudnnSetTensor4dDescriptor) tensor_set;
    decltype(&cudnnDestroyTensorDescriptor) tensor_destroy;
    decltype(&cudnnCreateFilterDescriptor) filter_create;
    decltype(&cudnnSetFilter4dDescriptor) filter_set;
    decltype(&cudnnDestroyFilterDescriptor) filter_destroy;
    decltype(&cudnnCreateConvolutionDescriptor) conv_create;
    decltype(&cudnnSetConvolution2dDescriptor) conv_set;
    decltype(&cudnnSetConvolutionGroupCount) conv_groups;
    decltype(&cudnnSetConvolutionMathType) conv_math;
    decltype(&cudnnDestroyConvolutionDescriptor) conv_destroy;
    decltype(&cudnnGetConvolutionForwardAlgorithm_v7) fwd_algos;
    decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) data_algos;
    decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) filter_algos;
    decltype(&cudnnGetConvolutionForwardWorkspaceSize) fwd_workspace;
    decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) data_workspace;
    decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize) filter_workspace;
    decltype(&cudnnConvolutionForward) forward;
    decltype(&cudnnConvolutionBackwardData) backward_data;
    decltype(&cudnnConvolutionBackwardFilter) backward_filter;
};

/* one convolution as cuDNN sees it; compared bytewise */
struct conv_key {
    int B, H, W, IC, OC, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, groups;
    int math; /* cudnnMathType_t */
};

struct conv_plan {
    struct conv_key key;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t data;
    cudnnConvolutionBwdFilterAlgo_t filter;
    size_t workspace; /* bytes: the largest of the three algorithms' */
    int ok;           /* 0: cuDNN refused it; why says how */
    char why[160];
};

struct dnn_state {
    struct dnn_api api;
    cudnnHandle_t h;
    struct conv_plan plans[CONV_PLANS];
    int n, next_evict;
};

/* The library names tried, in order: the soname of this build's major
 * version on the library path, then under TR_CUDNN_HOME. */
static const char *const dnn_names[] = {
    "libcudnn.so." STRINGIFY(CUDNN_MAJOR),
    TR_CUDNN_HOME "/lib64/libcudnn.so." STRINGIFY(CUDNN_MAJOR),
    TR_CUDNN_HOME "/lib/libcudnn.so." STRINGIFY(CUDNN_MAJOR),
};

static void *dnn_dlopen(void)
{
    void *h = NULL;
    for (size_t i = 0; i < sizeof dnn_names / sizeof *dnn_names && !h; i++)
        h = dlopen(dnn_names[i], RTLD_NOW | RTLD_LOCAL);
    return h;
}

int cuda_dnn_describe(char *buf, size_t size)
{
    void *h = dnn_dlopen();
    size_t (*version)(void) = h ? (size_t(*)(void))dlsym(h, "cudnnGetVersion") : NULL;
    if (!version)
        return snprintf(buf, size, "cuDNN: not found (%s; convolutions need it)\n", dnn_names[0]);
    size_t v = version(); /* 9.x: major*10000 + minor*100 + patch */
    /* the library stays mapped: cuDNN's sub-libraries are not safe to unload */
    if (v / 10000 != CUDNN_MAJOR)
        return snprintf(buf, size, "cuDNN: %zu (not used: this build needs cuDNN %d)\n", v,
                        CUDNN_MAJOR);
    return snprintf(buf, size, "cuDNN: %zu.%zu.%zu (convolutions)\n", v / 10000, v / 100 % 100,
                    v % 100);
}

void cuda_dnn_open(struct cuda_context *c)
{
    void *h = dnn_dlopen();
    if (!h) {
        snprintf(c->dnn_why, sizeof c->dnn_why,
                 "cuDNN (%s) is not installed or not on the library path: install cuDNN %d for "
                 "CUDA or add its lib directory to LD_LIBRARY_PATH",
                 dnn_names[0], CUDNN_MAJOR);
        return;
    }
    struct dnn_state *d = (struct dnn_state *)calloc(1, sizeof *d);
    if (!d) {
        snprintf(c->dnn_why, sizeof c->dnn_why, "out of host memory");
        return;
    }
    struct dnn_api *a = &d->api;
    a->handle = h;
    const char *missing = NULL;
#define LOAD(field, symbol)                                                                        \
    do {                                                                                           \
        a->field = (decltype(a->field))dlsym(h, #symbol);                                          \
        if (!a->field && !missing)                                                                 \
            missing = #symbol;                                                                     \
    } while (0)
    LOAD(get_version, cudnnGetVersion);
    LOAD(error_string, cudnnGetErrorString);
    LOAD(create, cudnnCreate);
    LOAD(destroy, cudnnDestroy);
    LOAD(set_stream, cudnnSetStream);
    LOAD(tensor_create, cudnnCreateTensorDescriptor);
    LOAD(tensor_set, cudnnSetTensor4dDescriptor);
    LOAD(tensor_destroy, cudnnDestroyTensorDescriptor);
    LOAD(filter_create, cudnnCreateFilterDescriptor);
    LOAD(filter_set, cudnnSetFilter4dDescriptor);
    LOAD(filter_destroy, cudnnDestroyFilterDescriptor);
    LOAD(conv_create, cudnnCreateConvolutionDescriptor);
    LOAD(conv_set, cudnnSetConvolution2dDescriptor);
    LOAD(conv_groups, cudnnSetConvolutionGroupCount);
    LOAD(conv_math, cudnnSetConvolutionMathType);
    LOAD(conv_destroy, cudnnDestroyConvolutionDescriptor);
    LOAD(fwd_algos, cudnnGetConvolutionForwardAlgorithm_v7);
    LOAD(data_algos, cudnnGetConvolutionBackwardDataAlgorithm_v7);
    LOAD(filter_algos, cudnnGetConvolutionBackwardFilterAlgorithm_v7);
    LOAD(fwd_workspace, cudnnGetConvolutionForwardWorkspaceSize);
    LOAD(data_workspace, cudnnGetConvolutionBackwardDataWorkspaceSize);
    LOAD(filter_workspace, cudnnGetConvolutionBackwardFilterWorkspaceSize);
    LOAD(forward, cudnnConvolutionForward);
    LOAD(backward_data, cudnnConvolutionBackwardData);
    LOAD(backward_filter, cudnnConvolutionBackwardFilter);
#undef LOAD
    if (missing) {
        snprintf(c->dnn_why, sizeof c->dnn_why, "%s lacks %s: install cuDNN %d", dnn_names[0],
                 missing, CUDNN_MAJOR);
        free(d);
        return;
    }
    size_t v = a->get_version();
    if (v / 10000 != CUDNN_MAJOR) {
        snprintf(c->dnn_why, sizeof c->dnn_why,
                 "cuDNN %zu is loaded but this build needs major version %d", v, CUDNN_MAJOR);
        free(d);
        return;
    }
    cudnnStatus_t s = a->create(&d->h);
    if (s == CUDNN_STATUS_SUCCESS)
        s = a->set_stream(d->h, c->compute);
    if (s != CUDNN_STATUS_SUCCESS) {
        snprintf(c->dnn_why, sizeof c->dnn_why, "cuDNN does not start: %s", a->error_string(s));
        if (d->h)
            a->destroy(d->h);
        free(d);
        return;
    }
    c->dnn = d;
    c->dnn_version = v;
}

static void plan_release(struct dnn_api *a, struct conv_plan *p)
{
    if (p->x)
        a->tensor_destroy(p->x);
    if (p->y)
        a->tensor_destroy(p->y);
    if (p->w)
        a->filter_destroy(p->w);
    if (p->conv)
        a->conv_destroy(p->conv);
    memset(p, 0, sizeof *p);
}

void cuda_dnn_close(struct cuda_context *c)
{
    struct dnn_state *d = c->dnn;
    if (!d)
        return;
    for (int i = 0; i < d->n; i++)
        plan_release(&d->api, &d->plans[i]);
    d->api.destroy(d->h);
    free(d);
    c->dnn = NULL;
}

/* ---- plans: descriptors and algorithms, once per convolution ------------------ */

static int is_half_dt(int dt) { return dt == DT_BF16 || dt == DT_F16; }

static int math_of(const struct conv_args *a)
{
    /* 16-bit inputs are exact in tf32: tensor cores give their products */
    return is_half_dt(a->compute) || a->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

#define TRY(what, call)                                                                            \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            snprintf(p->why, sizeof p->why, "%s: %s", what, a->error_string(s_));                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void plan_build(struct dnn_state *d, struct conv_plan *p)
{
    struct dnn_api *a = &d->api;
    const struct conv_key *k = &p->key;
    TRY("cudnnCreateTensorDescriptor", a->tensor_create(&p->x));
    TRY("cudnnCreateTensorDescriptor", a->tensor_create(&p->y));
    TRY("cudnnCreateFilterDescriptor", a->filter_create(&p->w));
    TRY("cudnnCreateConvolutionDescriptor", a->conv_create(&p->conv));
    TRY("input descriptor",
        a->tensor_set(p->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, k->B, k->IC, k->H, k->W));
    TRY("output descriptor",
        a->tensor_set(p->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, k->B, k->OC, k->OH, k->OW));
    TRY("filter descriptor", a->filter_set(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, k->OC,
                                           k->IC / k->groups, k->KH, k->KW));
    TRY("convolution descriptor",
        a->conv_set(p->conv, k->PH, k->PW, k->SH, k->SW, k->DH, k->DW, CUDNN_CROSS_CORRELATION,
                    CUDNN_DATA_FLOAT));
    TRY("group count", a->conv_groups(p->conv, k->groups));
    TRY("math type", a->conv_math(p->conv, (cudnnMathType_t)k->math));

    int n = 0, found = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CONV_ALGOS];
    TRY("forward heuristics", a->fwd_algos(d->h, p->x, p->w, p->conv, p->y, CONV_ALGOS, &n, fwd));
    for (int i = 0; i < n && !found; i++)
        if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].determinism == CUDNN_DETERMINISTIC &&
            fwd[i].memory <= CONV_WORKSPACE_MAX) {
            p->fwd = fwd[i].algo;
            found = 1;
        }
    if (!found) {
        snprintf(p->why, sizeof p->why, "cuDNN has no deterministic forward algorithm for it");
        return;
    }
    cudnnConvolutionBwdDataAlgoPerf_t data[CONV_ALGOS];
    TRY("backward data heuristics",
        a->data_algos(d->h, p->w, p->y, p->conv, p->x, CONV_ALGOS, &n, data));
    found = 0;
    for (int i = 0; i < n && !found; i++)
        if (data[i].status == CUDNN_STATUS_SUCCESS && data[i].determinism == CUDNN_DETERMINISTIC &&
            data[i].memory <= CONV_WORKSPACE_MAX) {
            p->data = data[i].algo;
            found = 1;
        }
    if (!found) {
        snprintf(p->why, sizeof p->why,
                 "cuDNN has no deterministic backward-data algorithm for it");
        return;
    }
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CONV_ALGOS];
    TRY("backward filter heuristics",
        a->filter_algos(d->h, p->x, p->y, p->conv, p->w, CONV_ALGOS, &n, filter));
    found = 0;
    for (int i = 0; i < n && !found; i++)
        if (filter[i].status == CUDNN_STATUS_SUCCESS &&
            filter[i].determinism == CUDNN_DETERMINISTIC && filter[i].memory <= CONV_WORKSPACE_MAX) {
            p->filter = filter[i].algo;
            found = 1;
        }
    if (!found) {
        snprintf(p->why, sizeof p->why,
                 "cuDNN has no deterministic backward-filter algorithm for it");
        return;
    }
    size_t ws[3] = {0, 0, 0};
    TRY("forward workspace", a->fwd_workspace(d->h, p->x, p->w, p->conv, p->y, p->fwd, &ws[0]));
    TRY("backward data workspace",
        a->data_workspace(d->h, p->w, p->y, p->conv, p->x, p->data, &ws[1]));
    TRY("backward filter workspace",
        a->filter_workspace(d->h, p->x, p->y, p->conv, p->w, p->filter, &ws[2]));
    p->workspace = ws[0] > ws[1] ? ws[0] : ws[1];
    if (ws[2] > p->workspace)
        p->workspace = ws[2];
    p->ok = 1;
}
#undef TRY

static struct conv_plan *plan_for(struct dnn_state *d, const struct conv_args *ca)
{
    struct conv_key key;
    memset(&key, 0, sizeof key);
    key.B = ca->B;
    key.H = ca->H;
    key.W = ca->W;
    key.IC = ca->IC;
    key.OC = ca->OC;
    key.KH = ca->KH;
    key.KW = ca->KW;
    key.OH = ca->OH;
    key.OW = ca->OW;
    key.SH = ca->SH;
    key.SW = ca->SW;
    key.PH = ca->PH;
    key.PW = ca->PW;
    key.DH = ca->DH;
    key.DW = ca->DW;
    key.groups = ca->groups;
    key.math = math_of(ca);
    for (int i = 0; i < d->n; i++)
        if (memcmp(&d->plans[i].key, &key, sizeof key) == 0)
            return &d->plans[i];
    struct conv_plan *p;
    if (d->n < CONV_PLANS) {
        p = &d->plans[d->n++];
    } else { /* more distinct convolutions than slots: reuse the oldest */
        p = &d->plans[d->next_evict];
        d->next_evict = (d->next_evict + 1) % CONV_PLANS;
        plan_release(&d->api, p);
    }
    p->key = key;
    plan_build(d, p);
    return p;
}

/* ---- scratch: fp32 operands, then the workspace ----------------------------------- */

static size_t round_floats(size_t n) { return (n + 63) & ~(size_t)63; }

struct conv_scratch {
    size_t x, w, y, bias, workspace, total; /* float offsets */
};

static struct conv_scratch scratch_layout(const struct conv_args *a, size_t workspace_bytes)
{
    struct conv_scratch s;
    int convert = a->dt != DT_F32 || is_half_dt(a->compute);
    size_t x_n = (size_t)a->B * a->H * a->W * a->IC;
    size_t w_n = (size_t)a->OC * a->KH * a->KW * (a->IC / a->groups);
    size_t y_n = (size_t)a->B * a->OH * a->OW * a->OC;
    size_t at = 0;
    s.x = at;
    at += convert ? round_floats(x_n) : 0;
    s.w = at;
    at += convert ? round_floats(w_n) : 0;
    s.y = at; /* forward: the fp32 output; backward: dy rounded to the compute dtype */
    at += convert ? round_floats(y_n) : 0;
    s.bias = at; /* forward: the fp32 bias; backward: the bias gradient's parts */
    if (a->has_bias) {
        size_t parts = cuda_bias_scratch_floats(a->B * a->OH * a->OW, a->OC);
        at += round_floats(parts > (size_t)a->OC ? parts : (size_t)a->OC);
    }
    s.workspace = at;
    at += round_floats((workspace_bytes + 3) / 4);
    s.total = at;
    return s;
}

const char *cuda_conv_check(struct cuda_context *c, const struct conv_args *a)
{
    if (!c->dnn)
        return c->dnn_why;
    struct conv_plan *p = plan_for(c->dnn, a);
    return p->ok ? NULL : p->why;
}

size_t cuda_conv_scratch_floats(struct cuda_context *c, const struct conv_args *a)
{
    if (!c->dnn)
        return 0;
    struct conv_plan *p = plan_for(c->dnn, a);
    return scratch_layout(a, p->ok ? p->workspace : 0).total;
}

/* out[i] = in[i] in fp32, rounded to `round_to` when that is a 16-bit dtype */
template <typename T>
__global__ void to_f32_rounded_kernel(float *out, const T *in, size_t n, int round_to)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = to_f32(in[i]);
        if (round_to == DT_BF16)
            v = __bfloat162float(__float2bfloat16_rn(v));
        else if (round_to == DT_F16)
            v = __half2float(__float2half_rn(v));
        out[i] = v;
    }
}

template <typename T>
static void to_f32_rounded(struct cuda_context *c, float *out, const void *in, size_t n,
                           int round_to)
{
    to_f32_rounded_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        out, (const T *)in, n, round_to);
    LAUNCHED(c, "conv2d operand to fp32");
}

/* An operand as cuDNN takes it: fp32 and rounded to the compute dtype;
 * itself when it is that already, else a copy in scratch. */
static const float *operand(struct cuda_context *c, const void *x, int dt, int compute, size_t n,
                            float *scratch_at)
{
    int round_to = is_half_dt(compute) ? compute : DT_F32;
    if (dt == DT_F32 && round_to == DT_F32)
        return (const float *)x;
    DISPATCH_STORAGE(dt, to_f32_rounded, c, scratch_at, x, n, round_to);
    return scratch_at;
}

/* the plan of a node about to run, or NULL after noting why not */
static struct conv_plan *ready_plan(struct cuda_context *c, const struct conv_args *a,
                                    size_t scratch_floats, struct conv_scratch *s)
{
    if (!c->dnn) {
        cuda_note(c, cudaErrorNotSupported, "conv2d without cuDNN");
        return NULL;
    }
    struct conv_plan *p = plan_for(c->dnn, a);
    if (!p->ok) {
        cuda_note(c, cudaErrorNotSupported, "cuDNN refuses a conv2d of this graph");
        return NULL;
    }
    *s = scratch_layout(a, p->workspace);
    if (s->total > scratch_floats) {
        cuda_note(c, cudaErrorInvalidValue, "conv2d: scratch smaller than scratch_floats said");
        return NULL;
    }
    return p;
}

static void dnn_note(struct cuda_context *c, cudnnStatus_t s, const char *call)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return;
    char what[200];
    snprintf(what, sizeof what, "%s failed: %s", call, c->dnn->api.error_string(s));
    cuda_note(c, cudaErrorLaunchFailure, what);
}

void cuda_conv_forward(struct cuda_context *c, const struct conv_args *a, float *scratch,
                       size_t scratch_floats)
{
    struct conv_scratch s;
    struct conv_plan *p = ready_plan(c, a, scratch_floats, &s);
    if (!p)
        return;
    struct dnn_api *api = &c->dnn->api;
    size_t x_n = (size_t)a->B * a->H * a->W * a->IC;
    size_t w_n = (size_t)a->OC * a->KH * a->KW * (a->IC / a->groups);
    size_t y_n = (size_t)a->B * a->OH * a->OW * a->OC;
    const float *x = operand(c, a->x, a->dt, a->compute, x_n, scratch + s.x);
    const float *w = operand(c, a->w, a->dt, a->compute, w_n, scratch + s.w);
    float *y = a->dt == DT_F32 ? (float *)a->out : scratch + s.y;
    const float one = 1.0f, zero = 0.0f;
    dnn_note(c,
             api->forward(c->dnn->h, &one, p->x, x, p->w, w, p->conv, p->fwd,
                          scratch + s.workspace, p->workspace, &zero, p->y, y),
             "cudnnConvolutionForward");
    if (a->b) { /* in fp32, before the output's one rounding */
        const float *b = operand(c, a->b, a->dt, DT_F32, (size_t)a->OC, scratch + s.bias);
        cuda_add_bias(c, DT_F32, y, b, a->B * a->OH * a->OW, a->OC, a->OC);
    }
    if (a->dt != DT_F32)
        cuda_convert(c, a->out, a->dt, y, DT_F32, y_n);
}

void cuda_conv_backward(struct cuda_context *c, const struct conv_args *a, float *scratch,
                        size_t scratch_floats)
{
    if (!a->dx && !a->dw && !a->db)
        return;
    struct conv_scratch s;
    struct conv_plan *p = ready_plan(c, a, scratch_floats, &s);
    if (!p)
        return;
    struct dnn_api *api = &c->dnn->api;
    int M = a->B * a->OH * a->OW;
    /* the bias gradient from the fp32 dout, as linear's */
    if (a->db)
        cuda_bias_backward(c, a->db, a->dout, M, a->OC, scratch + s.bias);
    if (!a->dx && !a->dw)
        return;
    size_t x_n = (size_t)a->B * a->H * a->W * a->IC;
    size_t w_n = (size_t)a->OC * a->KH * a->KW * (a->IC / a->groups);
    size_t y_n = (size_t)M * a->OC;
    const float *dy = operand(c, a->dout, DT_F32, a->compute, y_n, scratch + s.y);
    const float one = 1.0f;
    if (a->dx) {
        const float *w = operand(c, a->w, a->dt, a->compute, w_n, scratch + s.w);
        dnn_note(c,
                 api->backward_data(c->dnn->h, &one, p->w, w, p->y, dy, p->conv, p->data,
                                    scratch + s.workspace, p->workspace, &one, p->x, a->dx),
                 "cudnnConvolutionBackwardData");
    }
    if (a->dw) {
        const float *x = operand(c, a->x, a->dt, a->compute, x_n, scratch + s.x);
        dnn_note(c,
                 api->backward_filter(c->dnn->h, &one, p->x, x, p->y, dy, p->conv, p->filter,
                                      scratch + s.workspace, p->workspace, &one, p->w, a->dw),
                 "cudnnConvolutionBackwardFilter");
    }
}

#else /* TR_CUDA_NO_CUDNN: configure found no cudnn.h; every op but conv2d runs */

static const char no_cudnn[] = "this trainrun was built without cuDNN (configure found no cudnn.h "
                               "beside the CUDA toolkit): install cuDNN 9 and rebuild";

void cuda_dnn_open(struct cuda_context *c) { snprintf(c->dnn_why, sizeof c->dnn_why, "%s", no_cudnn); }

void cuda_dnn_close(struct cuda_context *c) { (void)c; }

int cuda_dnn_describe(char *buf, size_t size)
{
    return snprintf(buf, size, "cuDNN: not used (%s)\n", no_cudnn);
}

const char *cuda_conv_check(struct cuda_context *c, const struct conv_args *a)
{
    (void)a;
    return c->dnn_why;
}

size_t cuda_conv_scratch_floats(struct cuda_context *c, const struct conv_args *a)
{
    (void)c;
    (void)a;
    return 0;
}

void cuda_conv_forward(struct cuda_context *c, const struct conv_args *a, float *scratch,
                       size_t scratch_floats)
{
    (void)a;
    (void)scratch;
    (void)scratch_floats;
    cuda_note(c, cudaErrorNotSupported, "conv2d without cuDNN");
}

void cuda_conv_backward(struct cuda_context *c, const struct conv_args *a, float *scratch,
                        size_t scratch_floats)
{
    cuda_conv_forward(c, a, scratch, scratch_floats);
}
#endif

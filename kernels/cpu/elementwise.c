/*
 * Elementwise ops: add, GELU (tanh form), ReLU, SwiGLU, scale.
 *
 * One file past 700 lines because it is one pattern: each op's portable,
 * AVX2 and AVX-512 block, the shared exp polynomials, the one choice of
 * lanes (tr_cpu_elementwise_path) and the one way blocks are spread over
 * threads (ew_run_blocks), all static and shared; a split would put them
 * in a header every piece includes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GELU_HAVE_AVX2 1
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GELU_HAVE_AVX512 1 /* where convert.c's tr_cpu_avx512f() asks cpuid */
#endif

#include "kernels.h"

void tr_cpu_add_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* Elements of a 16-bit operand widened at a time, on the stack (the *_act
 * kernels); a multiple of GELU_VEC, so a tile of GELU's blocks stays whole. */
enum { ACT_TILE = 512 };

void tr_cpu_add_forward_act(struct tr_cpu_act out, struct tr_cpu_act a, struct tr_cpu_act b,
                            size_t n)
{
    if (out.dtype == TR_F32 && a.dtype == TR_F32 && b.dtype == TR_F32) {
        tr_cpu_add_forward(out.data, a.data, b.data, n);
        return;
    }
    size_t tiles = (n + ACT_TILE - 1) / ACT_TILE;
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < tiles; t++) {
        float abuf[ACT_TILE], bbuf[ACT_TILE], ybuf[ACT_TILE];
        size_t i0 = t * ACT_TILE, len = n - i0 < ACT_TILE ? n - i0 : ACT_TILE;
        const float *x = tr_cpu_act_read(a, i0, len, abuf), *z = tr_cpu_act_read(b, i0, len, bbuf);
        float *y = tr_cpu_act_dst(out, i0, ybuf);
        for (size_t i = 0; i < len; i++)
            y[i] = x[i] + z[i];
        tr_cpu_act_write(out, i0, len, y);
    }
}

/* da and db may be the same buffer (x + x): both updates then land in it
 * (the core never asks to write a gradient that an op reads twice).  One
 * that is dout's own buffer (the plan gives an input nothing else reads the
 * output's gradient: graph_plan.c's grad_alias) already holds it. */
void tr_cpu_add_backward(float *da, float *db, const float *dout, size_t n, unsigned write)
{
    if (da == dout)
        da = NULL;
    if (db == dout)
        db = NULL;
    if (da != NULL) {
        int w = (write & 1u) != 0;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            da[i] = w ? dout[i] : da[i] + dout[i];
    }
    if (db != NULL) {
        int w = (write & 2u) != 0;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            db[i] = w ? dout[i] : db[i] + dout[i];
    }
}

/*
 * GELU, tanh form: gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 *
 * Computed as x * s with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): one exp
 * and one division per element, and no cancellation in 1 + tanh(u) for
 * negative x.  The derivative uses the same s:
 *   d/dx = s + x * s (1 - s) * 2 u',   1 - s = exp(-2u) s,
 *   u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
 *
 * exp is a Cephes-style polynomial (about 1 ulp on the reduced range), written
 * for 16 floats with AVX-512F, for 8 with AVX2+FMA and once in portable C.
 * The vector paths are chosen at run time (cpuid), so a binary built for
 * plain x86-64 still uses them where the CPU has them, and still runs where
 * it does not.  The AVX-512 path is the AVX2 path's arithmetic lane for lane
 * (the same operations in the same order, FMA in the same places), so the
 * two give the same bits for every element.  Every element of a call goes
 * through the same path (a short tail is padded to a full block), so the
 * result never depends on how the threads split the array.
 */
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBIC 0.044715f
#define GELU_SCALE_CUBIC (GELU_SCALE * GELU_CUBIC)
#define GELU_SCALE_CUBIC3 (3.0f * GELU_SCALE * GELU_CUBIC)
/* exp's argument is clamped here: exp stays finite and normal, and s stays
 * exact at the ends (s = 1 below -87; s ~ 6e-39, i.e. gelu ~ 0, above 88) */
#define EXP_ARG_MIN -87.0f
#define EXP_ARG_MAX 88.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f       /* ln 2 = LN2_HI - LN2_LO, LN2_HI exact in 9 bits */
#define LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f   /* exp(r) = 1 + r + r^2 P(r), |r| <= ln2/2 */
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

/* Elements per vector block: the unit every path works in (the AVX-512 path
 * runs two at a time, and a last odd one masked). */
enum { GELU_VEC = 8 };

/* ---- portable path ---- */

static inline float exp_poly(float a)
{
    a = a < EXP_ARG_MIN ? EXP_ARG_MIN : (a > EXP_ARG_MAX ? EXP_ARG_MAX : a);
    float n = floorf(a * LOG2E + 0.5f);
    float r = a - n * LN2_HI;
    r = r - n * LN2_LO;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

static void gelu_forward_block_portable(float *out, const float *inp)
{
    for (int i = 0; i < GELU_VEC; i++) {
        float x = inp[i];
        float u = x * (GELU_SCALE + GELU_SCALE_CUBIC * x * x);
        out[i] = x / (1.0f + exp_poly(-2.0f * u));
    }
}

static void gelu_backward_block_portable(float *dinp, const float *inp, const float *dout)
{
    for (int i = 0; i < GELU_VEC; i++) {
        float x = inp[i];
        float x2 = x * x;
        float u = x * (GELU_SCALE + GELU_SCALE_CUBIC * x2);
        float e = exp_poly(-2.0f * u);
        float s = 1.0f / (1.0f + e);
        float du = GELU_SCALE + GELU_SCALE_CUBIC3 * x2;
        float local = s + 2.0f * x * du * (e * s) * s;
        dinp[i] += local * dout[i];
    }
}

/* ---- AVX2 + FMA path ---- */

#ifdef GELU_HAVE_AVX2

#define AVX2 __attribute__((target("avx2,fma")))

static inline AVX2 __m256 exp_poly8(__m256 a)
{
    a = _mm256_min_ps(_mm256_max_ps(a, _mm256_set1_ps(EXP_ARG_MIN)), _mm256_set1_ps(EXP_ARG_MAX));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(a, _mm256_set1_ps(LOG2E), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), a);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* u = x (S + S c x^2), given x^2 */
static inline AVX2 __m256 gelu_u8(__m256 x, __m256 x2)
{
    return _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_set1_ps(GELU_SCALE_CUBIC), x2,
                                            _mm256_set1_ps(GELU_SCALE)));
}

static AVX2 void gelu_forward_avx2(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i += GELU_VEC) {
        __m256 x = _mm256_loadu_ps(inp + i);
        __m256 u = gelu_u8(x, _mm256_mul_ps(x, x));
        __m256 e = exp_poly8(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f)));
        _mm256_storeu_ps(out + i, _mm256_div_ps(x, _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    }
}

static AVX2 void gelu_backward_avx2(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i += GELU_VEC) {
        __m256 x = _mm256_loadu_ps(inp + i);
        __m256 x2 = _mm256_mul_ps(x, x);
        __m256 u = gelu_u8(x, x2);
        __m256 e = exp_poly8(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f)));
        __m256 s = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
        __m256 du = _mm256_fmadd_ps(_mm256_set1_ps(GELU_SCALE_CUBIC3), x2, _mm256_set1_ps(GELU_SCALE));
        /* 2 x u' (e s) s + s */
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(x, x), du), _mm256_mul_ps(e, s));
        __m256 local = _mm256_fmadd_ps(t, s, s);
        __m256 d = _mm256_fmadd_ps(local, _mm256_loadu_ps(dout + i), _mm256_loadu_ps(dinp + i));
        _mm256_storeu_ps(dinp + i, d);
    }
}
#endif

/* ---- AVX-512F path: the AVX2 path's operations, 16 lanes wide ----
 * Each function below mirrors the 8-lane one above it statement for
 * statement; keep them in step.  n is a multiple of GELU_VEC: the blocks go
 * 16 at a time and a last odd block with the upper 8 lanes masked off (their
 * zeros are computed and dropped). */

#ifdef GELU_HAVE_AVX512

#define AVX512 __attribute__((target("avx512f")))

static inline AVX512 __m512 exp_poly16(__m512 a)
{
    a = _mm512_min_ps(_mm512_max_ps(a, _mm512_set1_ps(EXP_ARG_MIN)), _mm512_set1_ps(EXP_ARG_MAX));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(a, _mm512_set1_ps(LOG2E), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_FLOOR);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), a);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

static inline AVX512 __m512 gelu_u16(__m512 x, __m512 x2)
{
    return _mm512_mul_ps(x, _mm512_fmadd_ps(_mm512_set1_ps(GELU_SCALE_CUBIC), x2,
                                            _mm512_set1_ps(GELU_SCALE)));
}

/* the mask of a last odd block's 8 lanes */
#define LOW8 ((__mmask16)0x00ff)

static inline AVX512 __m512 gelu_forward16(__m512 x)
{
    __m512 u = gelu_u16(x, _mm512_mul_ps(x, x));
    __m512 e = exp_poly16(_mm512_mul_ps(u, _mm512_set1_ps(-2.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

static AVX512 void gelu_forward_avx512(float *out, const float *inp, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, gelu_forward16(_mm512_loadu_ps(inp + i)));
    if (i < n)
        _mm512_mask_storeu_ps(out + i, LOW8, gelu_forward16(_mm512_maskz_loadu_ps(LOW8, inp + i)));
}

/* dinp + gelu'(x) dout */
static inline AVX512 __m512 gelu_backward16(__m512 x, __m512 dout, __m512 dinp)
{
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 u = gelu_u16(x, x2);
    __m512 e = exp_poly16(_mm512_mul_ps(u, _mm512_set1_ps(-2.0f)));
    __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
    __m512 du = _mm512_fmadd_ps(_mm512_set1_ps(GELU_SCALE_CUBIC3), x2, _mm512_set1_ps(GELU_SCALE));
    __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(x, x), du), _mm512_mul_ps(e, s));
    __m512 local = _mm512_fmadd_ps(t, s, s);
    return _mm512_fmadd_ps(local, dout, dinp);
}

static AVX512 void gelu_backward_avx512(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dinp + i, gelu_backward16(_mm512_loadu_ps(inp + i),
                                                   _mm512_loadu_ps(dout + i),
                                                   _mm512_loadu_ps(dinp + i)));
    if (i < n)
        _mm512_mask_storeu_ps(dinp + i, LOW8,
                              gelu_backward16(_mm512_maskz_loadu_ps(LOW8, inp + i),
                                              _mm512_maskz_loadu_ps(LOW8, dout + i),
                                              _mm512_maskz_loadu_ps(LOW8, dinp + i)));
}
#endif

/* Whether this CPU runs the AVX2 path; decided once. */
static int gelu_use_avx2(void)
{
#ifdef GELU_HAVE_AVX2
    static int cached = -1;
    int use = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (use < 0) {
        __builtin_cpu_init();
        use = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        __atomic_store_n(&cached, use, __ATOMIC_RELAXED);
    }
    return use;
#else
    return 0;
#endif
}

/* The path the kernels of a call take: the widest the CPU runs, at most the
 * cap tests set (tr_cpu_elementwise_cap). */
static int ew_cap = TR_CPU_EW_AVX512;

int tr_cpu_elementwise_path(void)
{
    int path = TR_CPU_EW_PORTABLE;
    if (gelu_use_avx2()) {
        path = TR_CPU_EW_AVX2;
#ifdef GELU_HAVE_AVX512
        if (tr_cpu_avx512f())
            path = TR_CPU_EW_AVX512;
#endif
    }
    int cap = __atomic_load_n(&ew_cap, __ATOMIC_RELAXED);
    return path < cap ? path : cap;
}

int tr_cpu_elementwise_cap(int path)
{
    if (path < TR_CPU_EW_PORTABLE || path > TR_CPU_EW_AVX512)
        path = TR_CPU_EW_AVX512;
    return __atomic_exchange_n(&ew_cap, path, __ATOMIC_RELAXED);
}

/* ---- exp of a short row (softmax) ---- */

#ifdef GELU_HAVE_AVX2
static AVX2 float exp_shifted_avx2(float *x, int n, float shift)
{
    __m256 sum = _mm256_setzero_ps(), sh = _mm256_set1_ps(shift);
    for (int i = 0; i < n; i += GELU_VEC) {
        __m256 e = exp_poly8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float lanes[GELU_VEC];
    _mm256_storeu_ps(lanes, sum);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}
#endif

#ifdef GELU_HAVE_AVX512
/* exp 16 lanes at a time, and the AVX2 path's 8-lane sums in its order: the
 * low half of each 16 (the earlier block), then the high half */
static AVX512 float exp_shifted_avx512(float *x, int n, float shift)
{
    __m256 sum = _mm256_setzero_ps();
    __m512 sh = _mm512_set1_ps(shift);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp_poly16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
        _mm512_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
        sum = _mm256_add_ps(sum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    if (i < n) {
        __m512 e = exp_poly16(_mm512_sub_ps(_mm512_maskz_loadu_ps(LOW8, x + i), sh));
        _mm512_mask_storeu_ps(x + i, LOW8, e);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
    }
    float lanes[GELU_VEC];
    _mm256_storeu_ps(lanes, sum);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}
#endif

/* The same sums in the same order as the vector path. */
static float exp_shifted_portable(float *x, int n, float shift)
{
    float lanes[GELU_VEC] = {0};
    for (int i = 0; i < n; i += GELU_VEC)
        for (int l = 0; l < GELU_VEC; l++) {
            x[i + l] = exp_poly(x[i + l] - shift);
            lanes[l] += x[i + l];
        }
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/* x[0..n) for n a multiple of GELU_VEC, on the given path */
static float exp_shifted_blocks(float *x, int n, float shift, int path)
{
#ifdef GELU_HAVE_AVX512
    if (path == TR_CPU_EW_AVX512)
        return exp_shifted_avx512(x, n, shift);
#endif
#ifdef GELU_HAVE_AVX2
    if (path >= TR_CPU_EW_AVX2)
        return exp_shifted_avx2(x, n, shift);
#endif
    (void)path;
    return exp_shifted_portable(x, n, shift);
}

float tr_cpu_exp_shifted(float *x, int n, float shift)
{
    int path = tr_cpu_elementwise_path();
    int full = n / GELU_VEC * GELU_VEC;
    float sum = 0.0f;
    if (full > 0)
        sum = exp_shifted_blocks(x, full, shift, path);
    if (full < n) { /* the tail, padded with -inf-like values that give exp 0 */
        float tail[GELU_VEC];
        for (int i = 0; i < GELU_VEC; i++)
            tail[i] = full + i < n ? x[full + i] : shift + 2.0f * EXP_ARG_MIN;
        float tail_sum = exp_shifted_blocks(tail, GELU_VEC, shift, path);
        for (int i = full; i < n; i++)
            x[i] = tail[i - full];
        /* the padding's exp is the clamp's 1.6e-38 each: nothing next to
         * a sum of at least 1 */
        sum += tail_sum;
    }
    return sum;
}

/*
 * The driver every vectorised elementwise op shares: the arrays of one call,
 * and a kernel that runs a span of them, n elements from i0 (n a multiple of
 * GELU_VEC) on the path chosen once per call.
 */
struct ew_arrays {
    unsigned write; /* backward: bits 0, 1 for out, out2 written (=), not added to */
    float *out, *out2;
    const float *in, *in2, *in3;
    struct tr_cpu_act act_out, act_in; /* the *_act kernels' operands as stored */
};
typedef void ew_blocks_fn(const struct ew_arrays *a, size_t i0, size_t n, int path);

/* Work is split in whole blocks of this many elements (a multiple of
 * GELU_VEC), so every thread's share starts on a vector boundary. */
enum { GELU_CHUNK = 4096 };

/* Runs the first `full` elements (a multiple of GELU_VEC) in parallel; the
 * caller pads and runs the tail, which each op treats its own way. */
static void ew_run_blocks(ew_blocks_fn *blocks, const struct ew_arrays *a, size_t full, int path)
{
    size_t chunks = (full + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t i0 = c * GELU_CHUNK;
        size_t len = full - i0 < GELU_CHUNK ? full - i0 : GELU_CHUNK;
        blocks(a, i0, len, path);
    }
}

/* out = gelu(in) */
static void gelu_forward_blocks(const struct ew_arrays *a, size_t i0, size_t n, int path)
{
    float *out = a->out + i0;
    const float *inp = a->in + i0;
#ifdef GELU_HAVE_AVX512
    if (path == TR_CPU_EW_AVX512) {
        gelu_forward_avx512(out, inp, n);
        return;
    }
#endif
#ifdef GELU_HAVE_AVX2
    if (path >= TR_CPU_EW_AVX2) {
        gelu_forward_avx2(out, inp, n);
        return;
    }
#endif
    (void)path;
    for (size_t i = 0; i < n; i += GELU_VEC)
        gelu_forward_block_portable(out + i, inp + i);
}

/* out += gelu'(in) * in2; with a->write, out = (the block zeroed first, in
 * cache: the same sums onto zeros, without a pass of its own) */
static void gelu_backward_blocks(const struct ew_arrays *a, size_t i0, size_t n, int path)
{
    float *dinp = a->out + i0;
    const float *inp = a->in + i0, *dout = a->in2 + i0;
    if (a->write & 1u)
        memset(dinp, 0, n * sizeof(float));
#ifdef GELU_HAVE_AVX512
    if (path == TR_CPU_EW_AVX512) {
        gelu_backward_avx512(dinp, inp, dout, n);
        return;
    }
#endif
#ifdef GELU_HAVE_AVX2
    if (path >= TR_CPU_EW_AVX2) {
        gelu_backward_avx2(dinp, inp, dout, n);
        return;
    }
#endif
    (void)path;
    for (size_t i = 0; i < n; i += GELU_VEC)
        gelu_backward_block_portable(dinp + i, inp + i, dout + i);
}

void tr_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
    int path = tr_cpu_elementwise_path();
    size_t full = n / GELU_VEC * GELU_VEC;
    ew_run_blocks(gelu_forward_blocks, &(struct ew_arrays){.out = out, .in = inp}, full, path);
    if (full < n) { /* the tail, padded to one block */
        float x[GELU_VEC] = {0}, y[GELU_VEC];
        for (size_t i = full; i < n; i++)
            x[i - full] = inp[i];
        gelu_forward_blocks(&(struct ew_arrays){.out = y, .in = x}, 0, GELU_VEC, path);
        for (size_t i = full; i < n; i++)
            out[i] = y[i - full];
    }
}

void tr_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, int write)
{
    if (dinp == NULL)
        return;
    int path = tr_cpu_elementwise_path();
    size_t full = n / GELU_VEC * GELU_VEC;
    struct ew_arrays all = {.write = write ? 1u : 0u, .out = dinp, .in = inp, .in2 = dout};
    ew_run_blocks(gelu_backward_blocks, &all, full, path);
    if (full < n) {
        float x[GELU_VEC] = {0}, g[GELU_VEC] = {0}, d[GELU_VEC] = {0};
        for (size_t i = full; i < n; i++) {
            x[i - full] = inp[i];
            g[i - full] = dout[i];
            d[i - full] = write ? 0.0f : dinp[i];
        }
        gelu_backward_blocks(&(struct ew_arrays){.out = d, .in = x, .in2 = g}, 0, GELU_VEC, path);
        for (size_t i = full; i < n; i++)
            dinp[i] = d[i - full];
    }
}

/* GELU on activations as stored: each span of the fp32 driver runs in
 * tiles, the 16-bit input widened into a stack buffer and a 16-bit output
 * narrowed from one, through the same blocks (the same vector path, and the
 * tail padded the same way), so every value is the fp32 kernel's. */
static void gelu_forward_act_blocks(const struct ew_arrays *a, size_t i0, size_t n, int path)
{
    float x[ACT_TILE], y[ACT_TILE];
    for (size_t i = i0; i < i0 + n; i += ACT_TILE) {
        size_t len = i0 + n - i < ACT_TILE ? i0 + n - i : ACT_TILE;
        struct ew_arrays t = {.out = tr_cpu_act_dst(a->act_out, i, y),
                              .in = tr_cpu_act_read(a->act_in, i, len, x)};
        gelu_forward_blocks(&t, 0, len, path);
        tr_cpu_act_write(a->act_out, i, len, t.out);
    }
}

static void gelu_backward_act_blocks(const struct ew_arrays *a, size_t i0, size_t n, int path)
{
    float x[ACT_TILE];
    for (size_t i = i0; i < i0 + n; i += ACT_TILE) {
        size_t len = i0 + n - i < ACT_TILE ? i0 + n - i : ACT_TILE;
        struct ew_arrays t = {.write = a->write, .out = a->out + i,
                              .in = tr_cpu_act_read(a->act_in, i, len, x), .in2 = a->in2 + i};
        gelu_backward_blocks(&t, 0, len, path);
    }
}

void tr_cpu_gelu_forward_act(struct tr_cpu_act out, struct tr_cpu_act inp, size_t n)
{
    if (out.dtype == TR_F32 && inp.dtype == TR_F32) {
        tr_cpu_gelu_forward(out.data, inp.data, n);
        return;
    }
    int path = tr_cpu_elementwise_path();
    size_t full = n / GELU_VEC * GELU_VEC;
    ew_run_blocks(gelu_forward_act_blocks, &(struct ew_arrays){.act_out = out, .act_in = inp},
                  full, path);
    if (full < n) { /* the tail, padded to one block as tr_cpu_gelu_forward pads it */
        float x[GELU_VEC] = {0}, y[GELU_VEC];
        const float *tail = tr_cpu_act_read(inp, full, n - full, y);
        for (size_t i = full; i < n; i++)
            x[i - full] = tail[i - full];
        gelu_forward_blocks(&(struct ew_arrays){.out = y, .in = x}, 0, GELU_VEC, path);
        tr_cpu_act_write(out, full, n - full, y);
    }
}

void tr_cpu_gelu_backward_act(float *dinp, struct tr_cpu_act inp, const float *dout, size_t n,
                              int write)
{
    if (inp.dtype == TR_F32) {
        tr_cpu_gelu_backward(dinp, inp.data, dout, n, write);
        return;
    }
    if (dinp == NULL)
        return;
    int path = tr_cpu_elementwise_path();
    size_t full = n / GELU_VEC * GELU_VEC;
    struct ew_arrays all = {.write = write ? 1u : 0u, .out = dinp, .in2 = dout, .act_in = inp};
    ew_run_blocks(gelu_backward_act_blocks, &all, full, path);
    if (full < n) {
        float x[GELU_VEC] = {0}, g[GELU_VEC] = {0}, d[GELU_VEC] = {0};
        const float *tail = tr_cpu_act_read(inp, full, n - full, d);
        for (size_t i = full; i < n; i++)
            x[i - full] = tail[i - full];
        for (size_t i = full; i < n; i++) {
            g[i - full] = dout[i];
            d[i - full] = write ? 0.0f : dinp[i];
        }
        gelu_backward_blocks(&(struct ew_arrays){.out = d, .in = x, .in2 = g}, 0, GELU_VEC, path);
        for (size_t i = full; i < n; i++)
            dinp[i] = d[i - full];
    }
}

void tr_cpu_relu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void tr_cpu_relu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (dinp == NULL)
        return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

/*
 * SwiGLU's gate: out = silu(gate) * up, silu(g) = g * sig(g), sig(g) =
 * 1 / (1 + exp(-g)).  Backward, with the same sig:
 *   dgate += dout * up * sig (1 + g (1 - sig)),   dup += dout * g * sig.
 * Built like GELU: the same exp polynomial (its clamp keeps sig exact at
 * the ends), the same run-time choice of path, the same padded tail.
 */
static void swiglu_forward_block_portable(float *out, const float *gate, const float *up)
{
    for (int i = 0; i < GELU_VEC; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + exp_poly(-g)) * up[i];
    }
}

static void swiglu_backward_block_portable(float *dgate, float *dup, const float *gate,
                                           const float *up, const float *dout)
{
    for (int i = 0; i < GELU_VEC; i++) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + exp_poly(-g));
        float silu = g * sig;
        if (dgate != NULL)
            dgate[i] += dout[i] * up[i] * (sig + silu * (1.0f - sig));
        if (dup != NULL)
            dup[i] += dout[i] * silu;
    }
}

#ifdef GELU_HAVE_AVX2
static AVX2 void swiglu_forward_avx2(float *out, const float *gate, const float *up, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += GELU_VEC) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp_poly8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 silu = _mm256_div_ps(g, _mm256_add_ps(e, one));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
}

static AVX2 void swiglu_backward_avx2(float *dgate, float *dup, const float *gate,
                                      const float *up, const float *dout, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += GELU_VEC) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp_poly8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 sig = _mm256_div_ps(one, _mm256_add_ps(e, one));
        __m256 silu = _mm256_mul_ps(g, sig);
        __m256 dy = _mm256_loadu_ps(dout + i);
        if (dgate != NULL) {
            /* sig + silu (1 - sig) */
            __m256 local = _mm256_fmadd_ps(silu, _mm256_sub_ps(one, sig), sig);
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dy, _mm256_loadu_ps(up + i)), local);
            _mm256_storeu_ps(dgate + i, _mm256_add_ps(_mm256_loadu_ps(dgate + i), t));
        }
        if (dup != NULL)
            _mm256_storeu_ps(dup + i, _mm256_fmadd_ps(dy, silu, _mm256_loadu_ps(dup + i)));
    }
}
#endif

#ifdef GELU_HAVE_AVX512
/* 16 lanes of swiglu_forward_avx2's loop */
static inline AVX512 __m512 swiglu_forward16(__m512 g, __m512 up)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = exp_poly16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 silu = _mm512_div_ps(g, _mm512_add_ps(e, one));
    return _mm512_mul_ps(silu, up);
}

static AVX512 void swiglu_forward_avx512(float *out, const float *gate, const float *up, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, swiglu_forward16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
    if (i < n)
        _mm512_mask_storeu_ps(out + i, LOW8,
                              swiglu_forward16(_mm512_maskz_loadu_ps(LOW8, gate + i),
                                               _mm512_maskz_loadu_ps(LOW8, up + i)));
}

/* 16 lanes (m: which) of swiglu_backward_avx2's loop */
static inline AVX512 void swiglu_backward16(float *dgate, float *dup, const float *gate,
                                            const float *up, const float *dout, __mmask16 m)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 g = _mm512_maskz_loadu_ps(m, gate);
    __m512 e = exp_poly16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 sig = _mm512_div_ps(one, _mm512_add_ps(e, one));
    __m512 silu = _mm512_mul_ps(g, sig);
    __m512 dy = _mm512_maskz_loadu_ps(m, dout);
    if (dgate != NULL) {
        __m512 local = _mm512_fmadd_ps(silu, _mm512_sub_ps(one, sig), sig);
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(dy, _mm512_maskz_loadu_ps(m, up)), local);
        _mm512_mask_storeu_ps(dgate, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dgate), t));
    }
    if (dup != NULL)
        _mm512_mask_storeu_ps(dup, m, _mm512_fmadd_ps(dy, silu, _mm512_maskz_loadu_ps(m, dup)));
}

static AVX512 void swiglu_backward_avx512(float *dgate, float *dup, const float *gate,
                                         const float *up, const float *dout, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        swiglu_backward16(dgate ? dgate + i : NULL, dup ? dup + i : NULL, gate + i, up + i,
                          dout + i, (__mmask16)0xffff);
    if (i < n)
        swiglu_backward16(dgate ? dgate + i : NULL, dup ? dup + i : NULL, gate + i, up + i,
                          dout + i, LOW8);
}
#endif

/* out = silu(in) * in2 */
static void swiglu_forward_blocks(const struct ew_arrays *a, size_t i0, size_t n, int path)
{
    float *out = a->out + i0;
    const float *gate = a->in + i0, *up = a->in2 + i0;
#ifdef GELU_HAVE_AVX512
    if (path == TR_CPU_EW_AVX512) {
        swiglu_forward_avx512(out, gate, up, n);
        return;
    }
#endif
#ifdef GELU_HAVE_AVX2
    if (path >= TR_CPU_EW_AVX2) {
        swiglu_forward_avx2(out, gate, up, n);
        return;
    }
#endif
    (void)path;
    for (size_t i = 0; i < n; i += GELU_VEC)
        swiglu_forward_block_portable(out + i, gate + i, up + i);
}

/* out (dgate) and out2 (dup), either NULL; in gate, in2 up, in3 dout */
/* with a->write (bits 0, 1: dgate, dup), those blocks zeroed first, in cache */
static void swiglu_backward_blocks(const struct ew_arrays *a, size_t i0, size_t n, int path)
{
    float *dgate = a->out ? a->out + i0 : NULL, *dup = a->out2 ? a->out2 + i0 : NULL;
    const float *gate = a->in + i0, *up = a->in2 + i0, *dout = a->in3 + i0;
    if (dgate != NULL && (a->write & 1u))
        memset(dgate, 0, n * sizeof(float));
    if (dup != NULL && (a->write & 2u))
        memset(dup, 0, n * sizeof(float));
#ifdef GELU_HAVE_AVX512
    if (path == TR_CPU_EW_AVX512) {
        swiglu_backward_avx512(dgate, dup, gate, up, dout, n);
        return;
    }
#endif
#ifdef GELU_HAVE_AVX2
    if (path >= TR_CPU_EW_AVX2) {
        swiglu_backward_avx2(dgate, dup, gate, up, dout, n);
        return;
    }
#endif
    (void)path;
    for (size_t i = 0; i < n; i += GELU_VEC)
        swiglu_backward_block_portable(dgate ? dgate + i : NULL, dup ? dup + i : NULL, gate + i,
                                       up + i, dout + i);
}

void tr_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    int path = tr_cpu_elementwise_path();
    size_t full = n / GELU_VEC * GELU_VEC;
    ew_run_blocks(swiglu_forward_blocks, &(struct ew_arrays){.out = out, .in = gate, .in2 = up},
                  full, path);
    if (full < n) { /* the tail, padded to one block */
        float g[GELU_VEC] = {0}, u[GELU_VEC] = {0}, y[GELU_VEC];
        for (size_t i = full; i < n; i++) {
            g[i - full] = gate[i];
            u[i - full] = up[i];
        }
        swiglu_forward_blocks(&(struct ew_arrays){.out = y, .in = g, .in2 = u}, 0, GELU_VEC, path);
        for (size_t i = full; i < n; i++)
            out[i] = y[i - full];
    }
}

void tr_cpu_swiglu_backward(float *dgate, float *dup, const float *gate, const float *up,
                            const float *dout, size_t n, unsigned write)
{
    if (dgate == NULL && dup == NULL)
        return;
    int path = tr_cpu_elementwise_path();
    size_t full = n / GELU_VEC * GELU_VEC;
    struct ew_arrays all = {.write = write, .out = dgate, .out2 = dup, .in = gate, .in2 = up,
                            .in3 = dout};
    ew_run_blocks(swiglu_backward_blocks, &all, full, path);
    if (full < n) {
        /* the tail's contributions, added one gradient after the other, so
         * they both land when dgate and dup are one buffer (silu(x) * x) */
        float g[GELU_VEC] = {0}, u[GELU_VEC] = {0}, dy[GELU_VEC] = {0};
        float dg[GELU_VEC] = {0}, du[GELU_VEC] = {0};
        for (size_t i = full; i < n; i++) {
            g[i - full] = gate[i];
            u[i - full] = up[i];
            dy[i - full] = dout[i];
        }
        struct ew_arrays tail = {.out = dgate ? dg : NULL, .out2 = dup ? du : NULL,
                                 .in = g, .in2 = u, .in3 = dy};
        swiglu_backward_blocks(&tail, 0, GELU_VEC, path);
        for (size_t i = full; i < n; i++) {
            if (dgate != NULL)
                dgate[i] = write & 1u ? dg[i - full] : dgate[i] + dg[i - full];
            if (dup != NULL)
                dup[i] = write & 2u ? du[i - full] : dup[i] + du[i - full];
        }
    }
}

void tr_cpu_scale_forward(float *out, const float *inp, float scale, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = scale * inp[i];
}

void tr_cpu_scale_backward(float *dinp, const float *dout, float scale, size_t n, int write)
{
    if (dinp == NULL)
        return;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        dinp[i] = write ? scale * dout[i] : dinp[i] + scale * dout[i];
}

/* Dropout (backend.h: the mask is tr_dropout_hash's, the same on every
 * backend).  in and out may not alias. */
void tr_cpu_dropout_forward(float *out, const float *inp, size_t n, float p, uint64_t seed,
                            uint64_t node)
{
    uint32_t threshold = tr_dropout_threshold(p);
    float keep = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = (uint32_t)(tr_dropout_hash(seed, node, i) >> 32) >= threshold ? inp[i] * keep : 0.0f;
}

void tr_cpu_dropout_backward(float *dinp, const float *dout, size_t n, float p, uint64_t seed,
                             uint64_t node, int write)
{
    if (dinp == NULL)
        return;
    uint32_t threshold = tr_dropout_threshold(p);
    float keep = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = (uint32_t)(tr_dropout_hash(seed, node, i) >> 32) >= threshold ? dout[i] * keep : 0.0f;
        dinp[i] = write ? d : dinp[i] + d;
    }
}

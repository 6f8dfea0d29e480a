/*
 * Optimizer updates and the squared norm used for gradient clipping.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

/*
 * AdamW runs over every parameter once a step, reading the parameter, its
 * gradient and both moments and writing three of them back: memory-bound
 * when vectorised, but the scalar loop (three divisions and a square root an
 * element, which the compiler keeps scalar because sqrtf may set errno) ran
 * at a third of that (GPT-2 124M: 0.4-0.6 s of a 1.3-2.7 s step on 2 cores).
 * So it runs 16 lanes at a time where the CPU has AVX-512 and 8 where it has
 * AVX2 (the elementwise kernels' path, tr_cpu_elementwise_path: checked once,
 * at run time), the same operations in the same order as the scalar path,
 * with the last part-vector run as a whole vector (masked, or padded copies)
 * instead of a scalar tail: every element of a call goes through one path, so
 * no element depends on where the threads split.
 * The two vector paths are one expression lane for lane, so they give the
 * same bits (tested).
 *
 * With param_bf16, the update also writes its new parameters rounded to bf16
 * (tr_cpu_to_bf16's bits): the copy the native bf16 GEMMs read (param16.c),
 * refreshed in the same pass instead of converted again by every GEMM.  The
 * vector paths round each vector in registers as they store it, so the
 * copy costs only its bytes in this memory-bound pass (2 written a
 * parameter, which the cache reads first: 4 more on fp32's 28), not a second
 * pass over each block (docs/results.md has step_floor's figures).  The
 * scalar path converts each block after updating it.
 */
struct adamw_consts {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, grad_scale;
    float correction1, correction2;
};

/* Elements per block: a thread's share is whole blocks; 64 KiB of each array. */
enum { OPTIM_BLOCK = 16384 };

static void adamw_scalar(float *param, const float *grad, float *m, float *v, size_t n,
                         const struct adamw_consts *c)
{
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * c->grad_scale;
        float m_new = c->beta1 * m[i] + c->one_minus_beta1 * g;
        float v_new = c->beta2 * v[i] + c->one_minus_beta2 * g * g;
        m[i] = m_new;
        v[i] = v_new;
        float m_hat = m_new / c->correction1;
        float v_hat = v_new / c->correction2;
        float p = param[i];
        param[i] = p - c->lr * (m_hat / (sqrtf(v_hat) + c->eps) + c->weight_decay * p);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "bf16_lanes.h"
#define OPTIM_HAVE_VECTOR 1

static __attribute__((target("avx512f"))) void adamw_avx512(float *param, uint16_t *param16,
                                                              const float *grad, float *m,
                                                              float *v, size_t n,
                                                              const struct adamw_consts *c)
{
    const __m512 lr = _mm512_set1_ps(c->lr), beta1 = _mm512_set1_ps(c->beta1);
    const __m512 beta2 = _mm512_set1_ps(c->beta2), omb1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 omb2 = _mm512_set1_ps(c->one_minus_beta2), eps = _mm512_set1_ps(c->eps);
    const __m512 wd = _mm512_set1_ps(c->weight_decay), scale = _mm512_set1_ps(c->grad_scale);
    const __m512 c1 = _mm512_set1_ps(c->correction1), c2 = _mm512_set1_ps(c->correction2);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, grad + i), scale);
        __m512 m_new = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_maskz_loadu_ps(k, m + i)),
                                     _mm512_mul_ps(omb1, g));
        __m512 v_new = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_maskz_loadu_ps(k, v + i)),
                                     _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        _mm512_mask_storeu_ps(m + i, k, m_new);
        _mm512_mask_storeu_ps(v + i, k, v_new);
        __m512 m_hat = _mm512_div_ps(m_new, c1);
        /* masked-off lanes hold 0: sqrt(0) + eps, no fault, never stored */
        __m512 v_hat = _mm512_div_ps(v_new, c2);
        __m512 p = _mm512_maskz_loadu_ps(k, param + i);
        __m512 step = _mm512_add_ps(_mm512_div_ps(m_hat, _mm512_add_ps(_mm512_sqrt_ps(v_hat), eps)),
                                    _mm512_mul_ps(wd, p));
        __m512 p_new = _mm512_sub_ps(p, _mm512_mul_ps(lr, step));
        _mm512_mask_storeu_ps(param + i, k, p_new);
        if (param16 != NULL && k == (__mmask16)0xffff)
            tr_bf16_store16(param16 + i, p_new);
        else if (param16 != NULL)
            _mm512_mask_cvtepi32_storeu_epi16(param16 + i, k,
                                              tr_bf16_lanes16(_mm512_castps_si512(p_new)));
    }
}

#define AVX2 __attribute__((target("avx2,fma")))

/* adamw_avx512's operations, 8 lanes wide, on 8 elements at p, g, m, v
 * (and the parameters' bf16 copy, unless param16 is NULL) */
static inline AVX2 void adamw8(float *param, uint16_t *param16, const float *grad, float *m,
                               float *v, const struct adamw_consts *c)
{
    const __m256 lr = _mm256_set1_ps(c->lr), beta1 = _mm256_set1_ps(c->beta1);
    const __m256 beta2 = _mm256_set1_ps(c->beta2), omb1 = _mm256_set1_ps(c->one_minus_beta1);
    const __m256 omb2 = _mm256_set1_ps(c->one_minus_beta2), eps = _mm256_set1_ps(c->eps);
    const __m256 wd = _mm256_set1_ps(c->weight_decay), scale = _mm256_set1_ps(c->grad_scale);
    const __m256 c1 = _mm256_set1_ps(c->correction1), c2 = _mm256_set1_ps(c->correction2);
    __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad), scale);
    __m256 m_new = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(m)), _mm256_mul_ps(omb1, g));
    __m256 v_new = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(v)),
                                 _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    _mm256_storeu_ps(m, m_new);
    _mm256_storeu_ps(v, v_new);
    __m256 m_hat = _mm256_div_ps(m_new, c1);
    __m256 v_hat = _mm256_div_ps(v_new, c2);
    __m256 p = _mm256_loadu_ps(param);
    __m256 step = _mm256_add_ps(_mm256_div_ps(m_hat, _mm256_add_ps(_mm256_sqrt_ps(v_hat), eps)),
                                _mm256_mul_ps(wd, p));
    __m256 p_new = _mm256_sub_ps(p, _mm256_mul_ps(lr, step));
    _mm256_storeu_ps(param, p_new);
    if (param16 != NULL)
        tr_bf16_store8(param16, p_new);
}

/* Whole vectors in place; the last part-vector through zero-padded copies
 * (the padding's sqrt(0) + eps: no fault, never stored).  No masked loads
 * or stores: AVX2's (VMASKMOVPS) are microcoded on AMD Zen, and three masked
 * stores a vector made this loop compute-bound (Zen 3: 6 GB/s on one core). */
static AVX2 void adamw_avx2(float *param, uint16_t *param16, const float *grad, float *m,
                            float *v, size_t n, const struct adamw_consts *c)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        adamw8(param + i, param16 != NULL ? param16 + i : NULL, grad + i, m + i, v + i, c);
    if (i < n) {
        float tp[8] = {0}, tg[8] = {0}, tm[8] = {0}, tv[8] = {0};
        uint16_t t16[8];
        size_t left = n - i;
        memcpy(tp, param + i, left * sizeof *tp);
        memcpy(tg, grad + i, left * sizeof *tg);
        memcpy(tm, m + i, left * sizeof *tm);
        memcpy(tv, v + i, left * sizeof *tv);
        adamw8(tp, param16 != NULL ? t16 : NULL, tg, tm, tv, c);
        memcpy(param + i, tp, left * sizeof *tp);
        if (param16 != NULL)
            memcpy(param16 + i, t16, left * sizeof *t16);
        memcpy(m + i, tm, left * sizeof *tm);
        memcpy(v + i, tv, left * sizeof *tv);
    }
}
#endif

void tr_cpu_adamw_update_bf16(float *param, uint16_t *param_bf16, const float *grad, float *m,
                              float *v, size_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, float grad_scale, int64_t t)
{
    /* bias corrections in double: beta2^t is close to 1 for small t */
    struct adamw_consts c = {lr, beta1, beta2, 1.0f - beta1, 1.0f - beta2, eps, weight_decay,
                             grad_scale, (float)(1.0 - pow((double)beta1, (double)t)),
                             (float)(1.0 - pow((double)beta2, (double)t))};
    size_t blocks = (n + OPTIM_BLOCK - 1) / OPTIM_BLOCK;
    int path = tr_cpu_elementwise_path();
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * OPTIM_BLOCK, len = n - i0 < OPTIM_BLOCK ? n - i0 : OPTIM_BLOCK;
        uint16_t *p16 = param_bf16 != NULL ? param_bf16 + i0 : NULL;
#ifdef OPTIM_HAVE_VECTOR
        if (path == TR_CPU_EW_AVX512) {
            adamw_avx512(param + i0, p16, grad + i0, m + i0, v + i0, len, &c);
            continue;
        }
        if (path == TR_CPU_EW_AVX2) {
            adamw_avx2(param + i0, p16, grad + i0, m + i0, v + i0, len, &c);
            continue;
        }
#endif
        adamw_scalar(param + i0, grad + i0, m + i0, v + i0, len, &c);
        if (p16 != NULL) /* one block: converted on this thread */
            tr_cpu_to_bf16_serial(p16, param + i0, len);
    }
    (void)path;
}

void tr_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int64_t t)
{
    tr_cpu_adamw_update_bf16(param, NULL, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                             grad_scale, t);
}

/* momentum_buf may be NULL when momentum == 0 (plain SGD). */
void tr_cpu_sgd_update(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                       float momentum, float weight_decay, float grad_scale)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float p = param[i];
        float g = grad[i] * grad_scale + weight_decay * p;
        if (momentum_buf != NULL) {
            /* the buffer starts at zero, so the first step stores g itself */
            float buf = momentum * momentum_buf[i] + g;
            momentum_buf[i] = buf;
            g = buf;
        }
        param[i] = p - lr * g;
    }
}

enum {
    SUM_CHUNK_MIN = 1 << 14, /* below this a chunk is not worth a thread */
    SUM_MAX_CHUNKS = 256,
    SUM_LANES = 8, /* independent partial sums in a chunk, so the loop vectorises */
};

/* Sum of squares of x[0..n), in a fixed order. */
static double chunk_sum_squares(const float *x, size_t n)
{
    double lane[SUM_LANES] = {0};
    size_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            lane[j] += (double)x[i + j] * x[i + j];
    double sum = 0.0;
    for (; i < n; i++)
        sum += (double)x[i] * x[i];
    for (int j = 0; j < SUM_LANES; j++)
        sum += lane[j];
    return sum;
}

double tr_cpu_sum_squares(const float *x, size_t n)
{
    /* The split into chunks depends on n only, and the chunk sums are added
     * in order, so the result does not depend on the thread count.  Squares of
     * floats cannot overflow a double; inf or NaN inputs propagate. */
    size_t chunks = (n + SUM_CHUNK_MIN - 1) / SUM_CHUNK_MIN;
    if (chunks > SUM_MAX_CHUNKS)
        chunks = SUM_MAX_CHUNKS;
    if (chunks <= 1)
        return chunk_sum_squares(x, n);
    size_t chunk = (n + chunks - 1) / chunks;
    double partial[SUM_MAX_CHUNKS];
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * chunk;
        size_t end = begin + chunk < n ? begin + chunk : n;
        partial[c] = begin < end ? chunk_sum_squares(x + begin, end - begin) : 0.0;
    }
    double sum = 0.0;
    for (size_t c = 0; c < chunks; c++)
        sum += partial[c];
    return sum;
}

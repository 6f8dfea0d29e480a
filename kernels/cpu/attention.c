/*
 * Causal multi-head self-attention, flash style: the T x T probabilities are
 * never stored.
 *
 * Two input forms, one implementation: packed qkv[B,T,3C] (q, k, v side by
 * side, leading dimension 3C), or separate q[B,T,H*D], k and v [B,T,KV*D]
 * where query head h reads key/value head h / (H/KV) (grouped-query
 * attention; KV = H is plain multi-head).  Each head reads its rows straight
 * out of the inputs through a leading dimension, so nothing is gathered or
 * repeated.  Queries go in blocks of Q_BLOCK rows, keys in
 * blocks of FWD_K_BLOCK (forward) or K_BLOCK (backward); a query block
 * [r0, r1) only visits keys 0..r1-1.
 *
 * Forward: for each key block, scores S = scale q k^T (a small GEMM), then an
 * online softmax: the running row maximum m and sum l are updated, the output
 * rows so far are rescaled by exp(m_old - m_new), and exp(S - m_new) @ v is
 * added.  At the end out /= l and lse = m + log(l) is kept for backward.
 *
 * Backward: P = exp(scale q k^T - lse) is recomputed block by block, and with
 * D = rowsum(dout * out) (= rowsum(P * dP)):
 *   dv += P^T dout,  dP = dout v^T,  dS = scale P (dP - D),
 *   dq += dS k,      dk += dS^T q.
 *
 * Every block is computed by the same sequence of serial GEMMs and loops
 * whatever the thread that runs it, so results do not depend on the thread
 * count.  In backward, the query heads that share a key/value head sum into
 * its dk and dv, so one thread takes a (batch, kv head) pair and runs its
 * query heads in order; with few pairs for many threads, backward_split
 * gives the same bits with more parallelism.  The score blocks live on the
 * stack (backward: 16 KiB each, and 8 KiB for each bf16 rounding; forward:
 * 64 and 32 KiB).
 *
 * Under native bf16 (tr_cpu_attention_*_bf16) q, k and v are read as stored
 * in bf16 and every product is a bf16 one with fp32 sums
 * (tr_cpu_gemm_bf16_block): the probabilities and dS are rounded to bf16 for
 * the products that take them, and dout once for the whole backward, while
 * the softmax, its running maximum and sum, lse, D and the output and the
 * gradients accumulate in fp32 -- the division of labour of bf16 flash
 * attention kernels, and what a bf16 step spends its attention time on (the
 * products run about twice as fast as fp32 ones on AVX512-BF16).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "kernels.h"

/* Backward's key blocks are as wide as its query blocks; forward's are
 * wider (a multiple of Q_BLOCK): each key block is one scores product and
 * one probabilities-times-v product, and each one after a row's first
 * rescales that row's output so far, so at T <= FWD_K_BLOCK a row takes one
 * of each and no rescaling (one layer of the 6 x 384 GPT, T 256, batch 8,
 * one thread on a Zen 3: forward 9.7-10.1 -> 8.4-9.2 ms; T 1024, batch 2,
 * 2 threads: 19.2 -> 16.4 ms).  Both widths are multiples of Q_BLOCK, so a
 * key block starts at or before the query block that visits it and every
 * query row sees at least one key of every block it visits. */
enum { Q_BLOCK = 64, K_BLOCK = 64, FWD_K_BLOCK = 256 };

static int min_int(int a, int b) { return a < b ? a : b; }

/* Where one call's tensors live.  Row t of batch b, head h of q is at
 * q + (b*T + t)*ldq + h*D; of k and v (head h / group) at ld ldkv.  The
 * gradients have the layouts of their inputs; out and dout are [B,T,H*D]. */
struct att_layout {
    int B, T, H, KV, D;
    int ldq, ldkv;
    const float *q, *k, *v;          /* fp32 inputs, or NULL on the bf16 path */
    const uint16_t *q16, *k16, *v16; /* bf16 inputs (the bf16 path), else NULL */
    float *dq, *dk, *dv;
    const uint16_t *dout16; /* backward on the bf16 path: dout rounded to bf16 */
    unsigned write; /* bits 0, 1, 2: dq, dk, dv are written (their first blocks with beta 0) */
    int q0, q1;     /* forward: query rows [q0, q1) alone, out holding those rows
                     * ([B, q1 - q0, H*D]); q1 0: every row */
};

/* beta of a gradient block's product: 0 for its first contribution when the
 * gradient is written (every row of dq, dk and dv has one: a query block's
 * first key block is 0, a key block's first query block is itself, in the
 * group's first head), else 1 */
static float block_beta(const struct att_layout *L, unsigned bit, int first)
{
    return first && (L->write & bit) ? 0.0f : 1.0f;
}

/* Scores S = q k^T of query rows [r0, r0+rows) against keys [k0, k0+cols)
 * (ld ld), times scale: in the GEMM in fp32, after it in bf16 (the
 * bf16 GEMM takes no alpha). */
static void block_scores(const struct att_layout *L, size_t q_at, size_t kv_at, int r0, int rows,
                         int k0, int cols, float scale, float *scores, int ld)
{
    if (L->q16 != NULL) {
        tr_cpu_gemm_bf16_block(0, 1, rows, cols, L->D, L->q16 + q_at + (size_t)r0 * L->ldq,
                               L->ldq, L->k16 + kv_at + (size_t)k0 * L->ldkv, L->ldkv, 0.0f,
                               scores, ld);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++)
                scores[(size_t)i * ld + j] *= scale;
        return;
    }
    tr_cpu_sgemm_serial(0, 1, rows, cols, L->D, scale, L->q + q_at + (size_t)r0 * L->ldq, L->ldq,
                        L->k + kv_at + (size_t)k0 * L->ldkv, L->ldkv, 0.0f, scores, ld);
}

/* rows x cols of a block (ld ld) rounded to bf16, for a bf16 product:
 * a full-width block is one contiguous span, converted in one call */
static void block_to_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    if (cols == ld) {
        tr_cpu_to_bf16_serial(dst, src, (size_t)rows * ld);
        return;
    }
    for (int i = 0; i < rows; i++)
        tr_cpu_to_bf16_serial(dst + (size_t)i * ld, src + (size_t)i * ld, (size_t)cols);
}

static void attention_forward(const struct att_layout *L, float *out, float *lse)
{
    int B = L->B, T = L->T, NH = L->H, hs = L->D, group = L->H / L->KV;
    int ldq = L->ldq, ldkv = L->ldkv, ldo = NH * hs;
    float scale = 1.0f / sqrtf((float)hs);
    /* a window of query rows (sample's key/value cache): its blocks start at
     * q0, each still visiting every key up to its own rows */
    int q0 = L->q1 > 0 ? L->q0 : 0, q1 = L->q1 > 0 ? L->q1 : T;
    int row_blocks = (q1 - q0 + Q_BLOCK - 1) / Q_BLOCK;
    /* query-row blocks are independent in the forward pass */
    int items = B * NH * row_blocks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int item = 0; item < items; item++) {
        int blk = item % row_blocks;
        int h = (item / row_blocks) % NH;
        int b = item / (row_blocks * NH);
        int r0 = q0 + blk * Q_BLOCK;
        int r1 = min_int(r0 + Q_BLOCK, q1);
        int rows = r1 - r0;
        size_t q_at = (size_t)b * T * ldq + h * hs, kv_at = (size_t)b * T * ldkv + (h / group) * hs;
        /* rows x hs, ld ldo; out holds the window's rows alone */
        float *o = out + ((size_t)b * (q1 - q0) + (r0 - q0)) * ldo + h * hs;
        float *lse_rows = lse + ((size_t)b * NH + h) * T + r0;
        float scores[Q_BLOCK * FWD_K_BLOCK]; /* rows x cols, ld FWD_K_BLOCK */
        uint16_t probs16[Q_BLOCK * FWD_K_BLOCK];
        float row_max[Q_BLOCK], row_sum[Q_BLOCK];

        for (int k0 = 0; k0 < r1; k0 += FWD_K_BLOCK) {
            int cols = min_int(FWD_K_BLOCK, r1 - k0);
            block_scores(L, q_at, kv_at, r0, rows, k0, cols, scale, scores, FWD_K_BLOCK);
            for (int i = 0; i < rows; i++) {
                float *s = scores + (size_t)i * FWD_K_BLOCK;
                int valid = min_int(cols, r0 + i - k0 + 1); /* causal: keys <= query */
                float m = s[0];
#pragma omp simd reduction(max : m)
                for (int j = 1; j < valid; j++)
                    m = s[j] > m ? s[j] : m;
                if (k0 > 0 && row_max[i] > m)
                    m = row_max[i];
                float sum = tr_cpu_exp_shifted(s, valid, m);
                for (int j = valid; j < cols; j++)
                    s[j] = 0.0f;
                if (k0 == 0) {
                    row_sum[i] = sum;
                } else {
                    /* the output so far was weighted for the old maximum */
                    float correction = expf(row_max[i] - m);
                    row_sum[i] = row_sum[i] * correction + sum;
                    float *o_row = o + (size_t)i * ldo;
                    for (int d = 0; d < hs; d++)
                        o_row[d] *= correction;
                }
                row_max[i] = m;
            }
            /* o (+)= exp(S - m) @ v[k0:k0+cols] */
            if (L->v16 != NULL) {
                block_to_bf16(probs16, scores, rows, cols, FWD_K_BLOCK);
                tr_cpu_gemm_bf16_block(0, 0, rows, hs, cols, probs16, FWD_K_BLOCK,
                                       L->v16 + kv_at + (size_t)k0 * ldkv, ldkv,
                                       k0 == 0 ? 0.0f : 1.0f, o, ldo);
            } else {
                tr_cpu_sgemm_serial(0, 0, rows, hs, cols, 1.0f, scores, FWD_K_BLOCK,
                                    L->v + kv_at + (size_t)k0 * ldkv, ldkv, k0 == 0 ? 0.0f : 1.0f,
                                    o, ldo);
            }
        }
        for (int i = 0; i < rows; i++) {
            float inv = 1.0f / row_sum[i];
            float *o_row = o + (size_t)i * ldo;
            for (int d = 0; d < hs; d++)
                o_row[d] *= inv;
            lse_rows[i] = row_max[i] + logf(row_sum[i]);
        }
    }
}

/* One head's place for backward: the offsets of its rows in q and in k/v,
 * the gradients (NULL when not wanted), dout and out rows (ld H*D), lse and
 * D = rowsum(dout * out). */
struct att_head {
    size_t q_at, kv_at, o_at;
    float *dq, *dk, *dv;
    const float *dout, *out, *lse;
    float *D;
};

static struct att_head head_of(const struct att_layout *L, int b, int h, float *scratch,
                               const float *dout, const float *out, const float *lse)
{
    int T = L->T, NH = L->H, hs = L->D, group = L->H / L->KV, ldo = NH * hs;
    size_t q_offset = (size_t)b * T * L->ldq + h * hs;
    size_t kv_offset = (size_t)b * T * L->ldkv + (h / group) * hs;
    size_t o_offset = (size_t)b * T * ldo + h * hs;
    struct att_head a = {
        .q_at = q_offset,
        .kv_at = kv_offset,
        .o_at = o_offset,
        .dq = L->dq ? L->dq + q_offset : NULL,
        .dk = L->dk ? L->dk + kv_offset : NULL,
        .dv = L->dv ? L->dv + kv_offset : NULL,
        .dout = dout + o_offset,
        .out = out + o_offset,
        .lse = lse + ((size_t)b * NH + h) * T,
        .D = scratch + ((size_t)b * NH + h) * T,
    };
    return a;
}

/* D = rowsum(dout * out); on the bf16 path from the rounded dout that dP
 * is made of, so that rowsum(P * dP) = D holds as it does in fp32 (with one
 * key, dS is then zero rather than dout's rounding error).  Widened a block
 * of a row at a time; the dot runs in vector lanes (a serial chain was a
 * twentieth of the bf16 attention), the same order for every thread. */
static void head_rowsum(const struct att_layout *L, const struct att_head *a)
{
    int hs = L->D, ldo = L->H * L->D;
    float wide[K_BLOCK];
    for (int t = 0; t < L->T; t++) {
        const float *g = a->dout + (size_t)t * ldo, *y = a->out + (size_t)t * ldo;
        float dot = 0.0f;
        for (int d0 = 0; d0 < hs; d0 += K_BLOCK) {
            int n = min_int(K_BLOCK, hs - d0);
            const float *gd = g + d0;
            if (L->dout16 != NULL) {
                tr_cpu_from_half_serial(wide, L->dout16 + a->o_at + (size_t)t * ldo + d0,
                                        (size_t)n, 1);
                gd = wide;
            }
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < n; d++)
                dot += gd[d] * y[d0 + d];
        }
        a->D[t] = dot;
    }
}

/* A block's probabilities and dS (ld K_BLOCK), and on the bf16 path their
 * bf16 roundings, which the products take. */
struct att_block {
    float probs[Q_BLOCK * K_BLOCK], dscores[Q_BLOCK * K_BLOCK];
    uint16_t probs16[Q_BLOCK * K_BLOCK], dscores16[Q_BLOCK * K_BLOCK];
};

/* P = exp(scale q k^T - lse) of query rows [r0, r0+rows) against keys
 * [k0, k0+cols), zero above the diagonal */
static void block_probs(const struct att_layout *L, const struct att_head *a, int r0, int rows,
                        int k0, int cols, struct att_block *blk)
{
    float scale = 1.0f / sqrtf((float)L->D);
    block_scores(L, a->q_at, a->kv_at, r0, rows, k0, cols, scale, blk->probs, K_BLOCK);
    for (int i = 0; i < rows; i++) {
        float *p = blk->probs + (size_t)i * K_BLOCK;
        int valid = min_int(cols, r0 + i - k0 + 1);
        tr_cpu_exp_shifted(p, valid, a->lse[r0 + i]);
        for (int j = valid; j < cols; j++)
            p[j] = 0.0f;
    }
    if (L->q16 != NULL)
        block_to_bf16(blk->probs16, blk->probs, rows, cols, K_BLOCK);
}

/* dP = dout v^T, then dS = scale P (dP - D) */
static void block_dscores(const struct att_layout *L, const struct att_head *a, int r0, int rows,
                          int k0, int cols, struct att_block *blk)
{
    int ldo = L->H * L->D;
    float scale = 1.0f / sqrtf((float)L->D);
    if (L->v16 != NULL)
        tr_cpu_gemm_bf16_block(0, 1, rows, cols, L->D, L->dout16 + a->o_at + (size_t)r0 * ldo,
                               ldo, L->v16 + a->kv_at + (size_t)k0 * L->ldkv, L->ldkv, 0.0f,
                               blk->dscores, K_BLOCK);
    else
        tr_cpu_sgemm_serial(0, 1, rows, cols, L->D, 1.0f, a->dout + (size_t)r0 * ldo, ldo,
                            L->v + a->kv_at + (size_t)k0 * L->ldkv, L->ldkv, 0.0f, blk->dscores,
                            K_BLOCK);
    for (int i = 0; i < rows; i++) {
        const float *p = blk->probs + (size_t)i * K_BLOCK;
        float *ds = blk->dscores + (size_t)i * K_BLOCK;
        float Di = a->D[r0 + i];
        for (int j = 0; j < cols; j++)
            ds[j] = scale * p[j] * (ds[j] - Di);
    }
    if (L->q16 != NULL)
        block_to_bf16(blk->dscores16, blk->dscores, rows, cols, K_BLOCK);
}

/* dv[k0:] (+)= P^T dout[r0:]; first: dv's first contribution to this block */
static void block_dv(const struct att_layout *L, const struct att_head *a, int r0, int rows,
                     int k0, int cols, const struct att_block *blk, int first)
{
    int ldo = L->H * L->D;
    float *dv = a->dv + (size_t)k0 * L->ldkv;
    float beta = block_beta(L, 4u, first);
    if (L->q16 != NULL)
        tr_cpu_gemm_bf16_block(1, 0, cols, L->D, rows, blk->probs16, K_BLOCK,
                               L->dout16 + a->o_at + (size_t)r0 * ldo, ldo, beta, dv, L->ldkv);
    else
        tr_cpu_sgemm_serial(1, 0, cols, L->D, rows, 1.0f, blk->probs, K_BLOCK,
                            a->dout + (size_t)r0 * ldo, ldo, beta, dv, L->ldkv);
}

/* dq[r0:] (+)= dS k[k0:] */
static void block_dq(const struct att_layout *L, const struct att_head *a, int r0, int rows,
                     int k0, int cols, const struct att_block *blk)
{
    float *dq = a->dq + (size_t)r0 * L->ldq;
    size_t k_at = a->kv_at + (size_t)k0 * L->ldkv;
    float beta = block_beta(L, 1u, k0 == 0);
    if (L->k16 != NULL)
        tr_cpu_gemm_bf16_block(0, 0, rows, L->D, cols, blk->dscores16, K_BLOCK, L->k16 + k_at,
                               L->ldkv, beta, dq, L->ldq);
    else
        tr_cpu_sgemm_serial(0, 0, rows, L->D, cols, 1.0f, blk->dscores, K_BLOCK, L->k + k_at,
                            L->ldkv, beta, dq, L->ldq);
}

/* dk[k0:] (+)= dS^T q[r0:]; first: dk's first contribution to this block */
static void block_dk(const struct att_layout *L, const struct att_head *a, int r0, int rows,
                     int k0, int cols, const struct att_block *blk, int first)
{
    float *dk = a->dk + (size_t)k0 * L->ldkv;
    size_t q_at = a->q_at + (size_t)r0 * L->ldq;
    float beta = block_beta(L, 2u, first);
    if (L->q16 != NULL)
        tr_cpu_gemm_bf16_block(1, 0, cols, L->D, rows, blk->dscores16, K_BLOCK, L->q16 + q_at,
                               L->ldq, beta, dk, L->ldkv);
    else
        tr_cpu_sgemm_serial(1, 0, cols, L->D, rows, 1.0f, blk->dscores, K_BLOCK, L->q + q_at,
                            L->ldq, beta, dk, L->ldkv);
}

/* One query head's backward: dq of that head, and its share of dk and dv
 * (added to what the group's earlier heads left there; first_in_group: no
 * earlier head did). */
static void backward_head(const struct att_layout *L, const struct att_head *a, int first_in_group)
{
    int T = L->T;
    struct att_block blk;
    head_rowsum(L, a);
    for (int r0 = 0; r0 < T; r0 += Q_BLOCK) {
        int r1 = min_int(r0 + Q_BLOCK, T);
        int rows = r1 - r0;
        for (int k0 = 0; k0 < r1; k0 += K_BLOCK) {
            int cols = min_int(K_BLOCK, r1 - k0);
            int first = first_in_group && r0 == k0; /* key block k0's first query block */
            block_probs(L, a, r0, rows, k0, cols, &blk);
            if (a->dv != NULL)
                block_dv(L, a, r0, rows, k0, cols, &blk, first);
            if (a->dq == NULL && a->dk == NULL)
                continue;
            block_dscores(L, a, r0, rows, k0, cols, &blk);
            if (a->dq != NULL)
                block_dq(L, a, r0, rows, k0, cols, &blk);
            if (a->dk != NULL)
                block_dk(L, a, r0, rows, k0, cols, &blk, first);
        }
    }
}

/*
 * Backward, split for parallelism when there are at most a quarter as many
 * (batch, kv head) pairs as threads (one sequence of a model with few kv
 * heads, on many cores): dq by
 * (batch, head, query block), then dk and dv by (batch, kv head, key
 * block).  Every block recomputes P and dS as backward_head does (the same
 * serial GEMMs on the same numbers), and every gradient block receives its
 * additions in backward_head's order (dq[r0] over key blocks ascending; dk
 * and dv [k0] over the group's heads, then query blocks ascending), so the
 * two ways give the same bits: the choice may depend on the thread count.
 * The price is P and dS computed twice where dq and dk are both wanted.
 */
static void backward_split(const struct att_layout *L, float *scratch, const float *dout,
                           const float *out, const float *lse)
{
    int B = L->B, T = L->T, NH = L->H, KV = L->KV, group = L->H / L->KV;
    int blocks = (T + Q_BLOCK - 1) / Q_BLOCK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            struct att_head a = head_of(L, b, h, scratch, dout, out, lse);
            head_rowsum(L, &a);
        }
    if (L->dq != NULL) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int item = 0; item < B * NH * blocks; item++) {
            int r0 = (item % blocks) * Q_BLOCK;
            int h = (item / blocks) % NH;
            int b = item / (blocks * NH);
            struct att_head a = head_of(L, b, h, scratch, dout, out, lse);
            struct att_block blk;
            int r1 = min_int(r0 + Q_BLOCK, T);
            for (int k0 = 0; k0 < r1; k0 += K_BLOCK) {
                int cols = min_int(K_BLOCK, r1 - k0);
                block_probs(L, &a, r0, r1 - r0, k0, cols, &blk);
                block_dscores(L, &a, r0, r1 - r0, k0, cols, &blk);
                block_dq(L, &a, r0, r1 - r0, k0, cols, &blk);
            }
        }
    }
    if (L->dk == NULL && L->dv == NULL)
        return;
#pragma omp parallel for schedule(dynamic, 1)
    for (int item = 0; item < B * KV * blocks; item++) {
        int k0 = (item % blocks) * K_BLOCK;
        int kvh = (item / blocks) % KV;
        int b = item / (blocks * KV);
        struct att_block blk;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            struct att_head a = head_of(L, b, h, scratch, dout, out, lse);
            /* query blocks whose rows reach key k0 (blocks are aligned) */
            for (int r0 = k0; r0 < T; r0 += Q_BLOCK) {
                int r1 = min_int(r0 + Q_BLOCK, T);
                int cols = min_int(K_BLOCK, r1 - k0);
                int first = h == kvh * group && r0 == k0;
                block_probs(L, &a, r0, r1 - r0, k0, cols, &blk);
                if (a.dv != NULL)
                    block_dv(L, &a, r0, r1 - r0, k0, cols, &blk, first);
                if (a.dk != NULL) {
                    block_dscores(L, &a, r0, r1 - r0, k0, cols, &blk);
                    block_dk(L, &a, r0, r1 - r0, k0, cols, &blk, first);
                }
            }
        }
    }
}

static void attention_backward(const struct att_layout *L, float *scratch, const float *dout,
                               const float *out, const float *lse)
{
    if (L->dq == NULL && L->dk == NULL && L->dv == NULL)
        return;
    int B = L->B, KV = L->KV, group = L->H / L->KV;
    /* The split costs about 1.45x the work (P and dS twice: 80 vs 55 ms on
     * one thread for T = 1024, H = 8, KV = 1, D = 64), so it is taken only
     * where it spreads the work over at least 4x as many threads. */
    if (4 * B * KV <= omp_get_max_threads() && L->T > Q_BLOCK) {
        backward_split(L, scratch, dout, out, lse);
        return;
    }
    /* dk and dv sum over all query blocks and over the group's query heads,
     * so one (batch, kv head) pair is one thread's work, run in order */
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < KV; kvh++) {
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                struct att_head a = head_of(L, b, h, scratch, dout, out, lse);
                backward_head(L, &a, h == kvh * group);
            }
        }
    }
}

/* q, k, v side by side in qkv (fp32) or qkv16 (bf16: the other is NULL) */
static struct att_layout packed_layout(const float *qkv, const uint16_t *qkv16, float *dqkv, int B,
                                       int T, int C, int NH)
{
    struct att_layout L = {.B = B, .T = T, .H = NH, .KV = NH, .D = C / NH, .ldq = 3 * C,
                           .ldkv = 3 * C};
    if (qkv != NULL) {
        L.q = qkv;
        L.k = qkv + C;
        L.v = qkv + 2 * C;
    } else {
        L.q16 = qkv16;
        L.k16 = qkv16 + C;
        L.v16 = qkv16 + 2 * C;
    }
    if (dqkv != NULL) {
        L.dq = dqkv;
        L.dk = dqkv + C;
        L.dv = dqkv + 2 * C;
    }
    return L;
}

void tr_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                              int NH)
{
    struct att_layout L = packed_layout(qkv, NULL, NULL, B, T, C, NH);
    attention_forward(&L, out, lse);
}

void tr_cpu_attention_forward_rows(float *out, float *lse, const float *qkv,
                                   const uint16_t *qkv16, int B, int T, int C, int NH, int q0,
                                   int q1)
{
    struct att_layout L = packed_layout(qkv16 ? NULL : qkv, qkv16, NULL, B, T, C, NH);
    L.q0 = q0, L.q1 = q1;
    attention_forward(&L, out, lse);
}

size_t tr_cpu_attention_scratch_floats(int B, int T, int C, int NH)
{
    (void)C;
    return (size_t)B * NH * T;
}

void tr_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                               const float *qkv, const float *lse, int B, int T, int C, int NH,
                               int write)
{
    if (dqkv == NULL)
        return;
    struct att_layout L = packed_layout(qkv, NULL, dqkv, B, T, C, NH);
    L.write = write ? 7u : 0u;
    attention_backward(&L, scratch, dout, out, lse);
}

static struct att_layout gqa_layout(const float *q, const float *k, const float *v, float *dq,
                                    float *dk, float *dv, int B, int T, int H, int KV, int D)
{
    struct att_layout L = {.B = B, .T = T, .H = H, .KV = KV, .D = D, .ldq = H * D,
                           .ldkv = KV * D, .q = q, .k = k, .v = v, .dq = dq, .dk = dk, .dv = dv};
    return L;
}

void tr_cpu_attention_gqa_forward(float *out, float *lse, const float *q, const float *k,
                                  const float *v, int B, int T, int H, int KV, int D)
{
    struct att_layout L = gqa_layout(q, k, v, NULL, NULL, NULL, B, T, H, KV, D);
    attention_forward(&L, out, lse);
}

void tr_cpu_attention_gqa_forward_rows(float *out, float *lse, const float *q, const float *k,
                                       const float *v, const uint16_t *q16, const uint16_t *k16,
                                       const uint16_t *v16, int B, int T, int H, int KV, int D,
                                       int q0, int q1)
{
    struct att_layout L = gqa_layout(q16 ? NULL : q, q16 ? NULL : k, q16 ? NULL : v, NULL, NULL,
                                     NULL, B, T, H, KV, D);
    if (q16)
        L.q16 = q16, L.k16 = k16, L.v16 = v16;
    L.q0 = q0, L.q1 = q1;
    attention_forward(&L, out, lse);
}

size_t tr_cpu_attention_gqa_scratch_floats(int B, int T, int H, int KV, int D)
{
    (void)KV, (void)D;
    return (size_t)B * H * T;
}

void tr_cpu_attention_gqa_backward(float *dq, float *dk, float *dv, float *scratch,
                                   const float *dout, const float *out, const float *q,
                                   const float *k, const float *v, const float *lse, int B, int T,
                                   int H, int KV, int D, unsigned write)
{
    struct att_layout L = gqa_layout(q, k, v, dq, dk, dv, B, T, H, KV, D);
    L.write = write;
    attention_backward(&L, scratch, dout, out, lse);
}

/* ---- native bf16: q, k, v as stored in bf16, bf16 products ---- */

/* Backward scratch on the bf16 path: D (B*H*T floats), then dout rounded to
 * bf16 (B*T*H*D values), on a whole 64-byte line. */
static size_t d_floats(int B, int T, int H) { return ((size_t)B * H * T + 15) & ~(size_t)15; }

static size_t bf16_scratch_floats(int B, int T, int H, int D)
{
    return d_floats(B, T, H) + ((size_t)B * T * H * D + 1) / 2;
}

/* dout in bf16 into the scratch after D, then the backward */
static void backward_bf16(struct att_layout *L, float *scratch, const float *dout,
                          const float *out, const float *lse)
{
    uint16_t *dout16 = (uint16_t *)(void *)(scratch + d_floats(L->B, L->T, L->H));
    tr_cpu_to_bf16(dout16, dout, (size_t)L->B * L->T * L->H * L->D);
    L->dout16 = dout16;
    attention_backward(L, scratch, dout, out, lse);
}

void tr_cpu_attention_forward_bf16(float *out, float *lse, const uint16_t *qkv, int B, int T,
                                   int C, int NH)
{
    struct att_layout L = packed_layout(NULL, qkv, NULL, B, T, C, NH);
    attention_forward(&L, out, lse);
}

size_t tr_cpu_attention_bf16_scratch_floats(int B, int T, int C, int NH)
{
    return bf16_scratch_floats(B, T, NH, C / NH);
}

void tr_cpu_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                    const float *out, const uint16_t *qkv, const float *lse, int B,
                                    int T, int C, int NH, int write)
{
    if (dqkv == NULL)
        return;
    struct att_layout L = packed_layout(NULL, qkv, dqkv, B, T, C, NH);
    L.write = write ? 7u : 0u;
    backward_bf16(&L, scratch, dout, out, lse);
}

void tr_cpu_attention_gqa_forward_bf16(float *out, float *lse, const uint16_t *q,
                                       const uint16_t *k, const uint16_t *v, int B, int T, int H,
                                       int KV, int D)
{
    struct att_layout L = gqa_layout(NULL, NULL, NULL, NULL, NULL, NULL, B, T, H, KV, D);
    L.q16 = q, L.k16 = k, L.v16 = v;
    attention_forward(&L, out, lse);
}

size_t tr_cpu_attention_gqa_bf16_scratch_floats(int B, int T, int H, int KV, int D)
{
    (void)KV;
    return bf16_scratch_floats(B, T, H, D);
}

void tr_cpu_attention_gqa_backward_bf16(float *dq, float *dk, float *dv, float *scratch,
                                        const float *dout, const float *out, const uint16_t *q,
                                        const uint16_t *k, const uint16_t *v, const float *lse,
                                        int B, int T, int H, int KV, int D, unsigned write)
{
    if (dq == NULL && dk == NULL && dv == NULL)
        return;
    struct att_layout L = gqa_layout(NULL, NULL, NULL, dq, dk, dv, B, T, H, KV, D);
    L.q16 = q, L.k16 = k, L.v16 = v;
    L.write = write;
    backward_bf16(&L, scratch, dout, out, lse);
}

/* `trainrun plan` and the hardware table: lookups with did-you-mean, the
 * GPT parameter and FLOP counts, the Chinchilla token count, memory fit on
 * two devices, and time and dollars from the cost section.
 *
 * Covers: core/commands/plan.c, core/config/hardware.c and precision.c, with
 * core/engine/graph.c's counts.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include "capture.h"

#include "config/hardware.h"
#include "commands/plan.h"
#include "config/precision.h"
#include "engine/run.h"
#include "util/util.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define RECIPE TR_TEST_SRCDIR "/config/plan_gpt.lua"
#define GIB (1024.0 * 1024 * 1024)

static void environment(void)
{
    const char *built = getenv("TR_PLUGIN_BUILD_DIR");
    cr_assert_not_null(built, "TR_PLUGIN_BUILD_DIR must name the built plugins (make check sets it)");
    setenv("TRAINRUN_PLUGIN_PATH", built, 1);
    setenv("TRAINRUN_LUA_DIR", TR_TEST_SRCDIR "/../lua", 1);
    unsetenv("TRAINRUN_PRECISION");
}

static void build(struct tr_plan *p, const char *const *overrides, int n)
{
    tr_err err = {{0}};
    int rc = tr_plan_build(p, RECIPE, overrides, n, &err);
    cr_assert_eq(rc, TR_OK, "plan failed: %s", err.msg);
}

static char *run_plan(int argc, char **argv, int *code)
{
    return capture_stdout(tr_plan_main, argc, argv, code);
}

/* ---- the hardware table ------------------------------------------------- */

Test(hardware, finds_entries_by_name)
{
    const struct tr_hardware *h = tr_hardware_find("h100-80gb");
    cr_assert_not_null(h);
    cr_assert_eq(h->memory_bytes, 80ull << 30);
    cr_assert(h->tflops_bf16 > h->tflops_fp32 && h->tflops_fp32 > 0);
    cr_assert(h->nvlink_gbps > h->pcie_gbps);
    cr_assert(h->price_hour > h->spot_price_hour && h->spot_price_hour > 0);
    cr_assert_eq(tr_hardware_find("H100-80GB"), h, "names are case-insensitive");
    cr_assert_null(tr_hardware_find("h100"));
    cr_assert_null(tr_hardware_find(""));
}

Test(hardware, lists_every_entry_and_describes_this_machine)
{
    const char *want[] = {"h100-80gb", "h200-141gb", "a100-80gb", "a100-40gb",
                          "l4-24gb",   "a10g-24gb",  "cpu"};
    size_t n = tr_hardware_count();
    cr_assert_eq(n, sizeof want / sizeof *want);
    for (size_t i = 0; i < n; i++) {
        const struct tr_hardware *h = tr_hardware_at(i);
        cr_assert_str_eq(h->name, want[i]);
        cr_assert(h->memory_bytes > 0, "%s has no memory", h->name);
        cr_assert(h->spot_price_hour <= h->price_hour, "%s: spot above on-demand", h->name);
    }
    cr_assert_null(tr_hardware_at(n));
    const struct tr_hardware *cpu = tr_hardware_find("cpu");
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    cr_assert_eq((double)cpu->memory_bytes, ram);
    cr_assert_eq(cpu->price_hour, 0);
    cr_assert_eq(cpu->tflops_fp32, 0, "the cpu's peak comes from cost.peak_tflops");
}

Test(hardware, suggests_a_close_name)
{
    const struct tr_hardware *h;
    tr_err err = {{0}};
    cr_assert_eq(tr_hardware_lookup("h100-80g", &h, &err), TR_ERROR);
    cr_assert_null(h);
    cr_assert(strstr(err.msg, "unknown hardware 'h100-80g' (did you mean 'h100-80gb'?); known: "
                              "h100-80gb, h200-141gb,"), "%s", err.msg);
    cr_assert_eq(tr_hardware_lookup("a100", &h, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "(did you mean 'a100-80gb' or 'a100-40gb'?)"), "%s", err.msg);
    cr_assert_eq(tr_hardware_lookup("tpu-v5e", &h, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "unknown hardware 'tpu-v5e'; known: "), "%s", err.msg);
    cr_assert_eq(tr_hardware_lookup("l4-24gb", &h, &err), TR_OK);
    cr_assert_str_eq(h->name, "l4-24gb");
}

/* The cuda backend opens only on compute capability 8.0 and newer, so a
 * T4 (7.5, and no bf16) runs nothing: a plan for it, bf16 or fp32, would
 * price a run that cannot execute.  It is refused, saying why; every
 * device the table lists is priced at its tensor-core peak in bf16 and
 * fp16 and at its CUDA-core peak in fp32. */
Test(plan, prices_only_devices_a_run_can_use, .init = environment)
{
    const char *precisions[] = {"precision=bf16", "precision=fp16", "precision=fp32"};
    for (int k = 0; k < 3; k++) {
        const char *o[] = {"cost.hardware=t4-16gb", precisions[k]};
        struct tr_plan p;
        tr_err err = {{0}};
        cr_assert_eq(tr_plan_build(&p, RECIPE, o, 2, &err), TR_ERROR, "%s", precisions[k]);
        cr_assert(strstr(err.msg, "unknown hardware 't4-16gb'"), "%s", err.msg);
        cr_assert(strstr(err.msg, "compute capability 8.0 or newer, so a T4"), "%s", err.msg);
        tr_plan_free(&p);
    }
    for (size_t i = 0; i < tr_hardware_count(); i++) {
        const struct tr_hardware *hw = tr_hardware_at(i);
        if (strcmp(hw->name, "cpu") == 0)
            continue;
        char name[64];
        snprintf(name, sizeof name, "cost.hardware=%s", hw->name);
        for (int k = 0; k < 3; k++) {
            const char *o[] = {name, precisions[k]};
            struct tr_plan p;
            build(&p, o, 2);
            double want = k < 2 ? hw->tflops_bf16 : hw->tflops_fp32;
            cr_assert(want > 0, "%s has no %s peak", hw->name, precisions[k]);
            cr_assert_eq(p.peak_flops, want * 1e12, "%s %s", hw->name, precisions[k]);
            cr_assert_str_eq(p.peak_kind, k == 0 ? "bf16" : k == 1 ? "fp16" : "fp32");
            tr_plan_free(&p);
        }
    }
}

/* ---- the plan ------------------------------------------------------------ */

Test(plan, counts_gpt_parameters_and_flops, .init = environment)
{
    struct tr_plan p;
    build(&p, NULL, 0);
    const int64_t V = 64, T = 16, L = 2, C = 32;
    int64_t P = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    cr_assert_eq(p.params, P, "params %lld, GPT-2 count %lld", (long long)p.params, (long long)P);
    cr_assert_eq(p.embedding_params, V * C + T * C);
    cr_assert_eq(p.layers, L);
    cr_assert_eq(p.seq_len, T);
    cr_assert_eq(p.width, C);
    cr_assert_eq(p.flops_per_token, (double)(6 * P + 12 * L * T * C));
    cr_assert_eq(p.tokens_per_step, 32.0 * T);
    cr_assert_eq(p.flops, 1000.0 * 32 * T * p.flops_per_token);
    cr_assert_eq(p.optimal_tokens, 20.0 * P, "Chinchilla: 20 tokens per parameter");
    cr_assert_eq(p.trained_factor, 1000.0 * 32 * T / (20.0 * P));
    tr_plan_free(&p);
}

/* ---- a Llama: parameters and FLOPs in closed form ------------------------ */

#define LLAMA TR_TEST_SRCDIR "/config/plan_llama.lua"

static void build_llama(struct tr_plan *p, const char *const *overrides, int n)
{
    tr_err err = {{0}};
    int rc = tr_plan_build(p, LLAMA, overrides, n, &err);
    cr_assert_eq(rc, TR_OK, "plan failed: %s", err.msg);
}

/* Llama's parameters: the embedding, per layer two norms, q and o (C x H*D),
 * k and v (C x KV*D, their biases with qkv_bias), the SwiGLU's three
 * C x F matrices, the final norm, and the lm_head unless tied. */
static int64_t llama_params(int64_t V, int64_t L, int64_t C, int64_t H, int64_t KV, int64_t F,
                            int tied, int qkv_bias)
{
    int64_t D = C / H;
    int64_t layer = 2 * C + 2 * C * H * D + 2 * C * KV * D + 3 * C * F;
    if (qkv_bias)
        layer += H * D + 2 * KV * D;
    return V * C + L * layer + C + (tied ? 0 : V * C);
}

struct llama_case {
    char overrides[3][40]; /* arrays, not pointers: each test runs in a fresh process */
    int n;
    int64_t H, KV;
    int tied, qkv_bias;
};

ParameterizedTestParameters(plan, counts_llama_parameters_and_flops)
{
    static struct llama_case cases[] = {
        {{""}, 0, 4, 2, 0, 0},                                             /* GQA, untied */
        {{"model.tie_embeddings=true"}, 1, 4, 2, 1, 0},                    /* GQA, tied */
        {{"model.kv_heads=4"}, 1, 4, 4, 0, 0},                             /* multi-head */
        {{"model.kv_heads=1", "model.tie_embeddings=true"}, 2, 4, 1, 1, 0}, /* multi-query */
        {{"model.qkv_bias=true", "model.heads=2", "model.kv_heads=1"}, 3, 2, 1, 0, 1}, /* Qwen2 */
    };
    return cr_make_param_array(struct llama_case, cases, sizeof cases / sizeof *cases);
}

ParameterizedTest(struct llama_case *c, plan, counts_llama_parameters_and_flops, .init = environment)
{
    struct tr_plan p;
    const char *ov[3] = {c->overrides[0], c->overrides[1], c->overrides[2]};
    build_llama(&p, ov, c->n);
    const int64_t V = 64, T = 16, L = 2, C = 32, F = 48;
    int64_t P = llama_params(V, L, C, c->H, c->KV, F, c->tied, c->qkv_bias);
    cr_assert_eq(p.params, P, "params %lld, closed form %lld (H %lld, KV %lld, tied %d)",
                 (long long)p.params, (long long)P, (long long)c->H, (long long)c->KV, c->tied);
    cr_assert_eq(p.embedding_params, V * C);
    /* untied, the input embedding is only looked up: no multiply-adds */
    int64_t lookup = c->tied ? 0 : V * C;
    cr_assert_eq(p.lookup_params, lookup);
    cr_assert_eq(p.layers, L);
    cr_assert_eq(p.seq_len, T);
    cr_assert_eq(p.width, C, "attention's width is the query's heads x D, whatever kv_heads");
    /* grouped-query heads share k and v but every query head scores and
     * mixes on its own: the attention term is the same for any kv_heads */
    cr_assert_eq(p.attention_flops, (double)(12 * L * T * C));
    cr_assert_eq(p.flops_per_token, (double)(6 * (P - lookup) + 12 * L * T * C),
                 "%.0f", p.flops_per_token);
    cr_assert_eq(p.optimal_tokens, 20.0 * P);
    tr_plan_free(&p);
}

Test(plan, gpt_counts_no_lookup_only_parameters, .init = environment)
{
    /* GPT's token embedding is also its output head (tied), and its
     * positions are added, not looked up by id: 6·P as before */
    struct tr_plan p;
    build(&p, NULL, 0);
    cr_assert_eq(p.lookup_params, 0);
    cr_assert_eq(p.flops_per_token, 6.0 * (double)p.params + p.attention_flops);
    tr_plan_free(&p);
}

Test(plan, prints_a_llama_report, .init = environment)
{
    char *argv[] = {"plan", LLAMA};
    int code;
    char *out = run_plan(2, argv, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);
    const char *want[] = {
        "  parameters P              19,616  (19.6 K; 17.6 K without embeddings)\n",
        "L = 2 attention layers, T = 16 tokens, C = 32 wide",
        "6·(P - E) + 12·L·T·C = 105,408 + 12,288 = 117,696  (118 kFLOP)",
        "(E = 2,048 untied input-embedding parameters, looked up, not multiplied)",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(out, want[i]), "missing \"%s\" in:\n%s", want[i], out);
    free(out);
}

Test(plan, fits_on_one_device_and_not_on_another, .init = environment)
{
    /* ~1.2 B parameters: 16 bytes each with AdamW (weights, gradients, two
     * moments) is about 18 GiB — under an H100's 72 GiB usable; ~1.6 B
     * (32 layers) is about 24 GiB, over an L4's 21.6 */
    const char *big[] = {"model.dim=2048", "model.layers=24", "model.heads=16", NULL};
    struct tr_plan p;
    build(&p, NULL, 0);
    cr_assert(p.fits, "the tiny GPT fits an H100");
    tr_plan_free(&p);

    build(&p, big, 3);
    cr_assert(p.params > 1200000000 && p.params < 1250000000, "%lld", (long long)p.params);
    cr_assert_str_eq(p.hardware->name, "h100-80gb");
    cr_assert_eq(p.usable_bytes, 0.9 * 80 * GIB);
    cr_assert(p.fits && p.memory_total > 16 * GIB, "%.0f bytes", p.memory_total);
    cr_assert(p.max_micro_batch >= p.micro_batch);
    tr_plan_free(&p);

    big[1] = "model.layers=32";
    big[3] = "cost.hardware=l4-24gb";
    build(&p, big, 4);
    cr_assert_not(p.fits);
    cr_assert_eq(p.max_micro_batch, 0, "weights, gradients and moments alone overflow an L4");
    tr_plan_free(&p);
}

Test(plan, the_largest_micro_batch_is_measured_as_auto_picks_it, .init = environment)
{
    /* long sequences, a wider model and a large micro-batch: the activations
     * saved for backward overflow an L4 */
    const char *o[] = {"model.ctx=1024", "model.heads=8", "train.batch=1024", "train.micro_batch=512",
                       "cost.hardware=l4-24gb", "model.dim=384"};
    struct tr_plan p;
    build(&p, o, 6);
    cr_assert_not(p.fits);
    cr_assert(p.bytes_per_sample > 0);
    cr_assert_eq(p.memory_total, p.fixed_bytes + 512 * p.bytes_per_sample);
    /* 2 devices share the batch of 1024: micro-batches divide 512 */
    int64_t mb = p.max_micro_batch;
    cr_assert(mb > 0 && mb < 512 && 512 % mb == 0, "%lld", (long long)mb);
    tr_plan_free(&p);

    char at[64], twice[64];
    snprintf(at, sizeof at, "train.micro_batch=%lld", (long long)mb);
    o[3] = at;
    build(&p, o, 6);
    cr_assert(p.fits, "micro-batch %lld was measured to fit", (long long)mb);
    cr_assert_eq(p.max_micro_batch, mb, "the search does not depend on the recipe's micro-batch");
    tr_plan_free(&p);
    /* the next divisor of 512 up does not fit */
    snprintf(twice, sizeof twice, "train.micro_batch=%lld", (long long)(2 * mb));
    o[3] = twice;
    build(&p, o, 6);
    cr_assert_not(p.fits, "the largest micro-batch was %lld, yet twice it fits", (long long)mb);
    tr_plan_free(&p);
    /* micro_batch = "auto" picks it by the same search: one algorithm */
    o[3] = "train.micro_batch=auto";
    build(&p, o, 6);
    cr_assert_eq(p.micro_batch, mb, "auto picked %lld, the plan's search %lld",
                 (long long)p.micro_batch, (long long)mb);
    cr_assert(p.fits);
    tr_plan_free(&p);
}

Test(plan, projects_hours_and_dollars, .init = environment)
{
    struct tr_plan p;
    build(&p, NULL, 0);
    /* fp32 without tf32: the H100's CUDA-core peak */
    cr_assert_str_eq(p.peak_kind, "fp32");
    cr_assert_eq(p.peak_flops, 67.0e12);
    /* a step: its FLOPs on 2 devices at peak x MFU, plus the exposed all-reduce */
    double compute = p.flops_per_step / (67.0e12 * 0.4 * 2);
    cr_assert_float_eq(p.scale[0].compute_seconds, compute, 1e-12 * compute);
    cr_assert(p.scale[0].exposed_seconds > 0);
    double hours = 1000 * (compute + p.scale[0].exposed_seconds) / 3600;
    cr_assert_float_eq(p.hours, hours, 1e-12 * hours);
    cr_assert_eq(p.price, 2.5, "cost.price overrides the table");
    cr_assert_eq(p.spot_price, 1.5);
    cr_assert_float_eq(p.dollars, p.hours * 2.5 * 2, 1e-12);
    cr_assert_float_eq(p.spot_dollars, p.hours * 1.5 * 2, 1e-12);
    cr_assert_float_eq(p.optimal_dollars, p.optimal_hours * 2.5 * 2, 1e-12);
    tr_plan_free(&p);

    /* the table's prices, the bf16 tensor-core peak, 8 devices */
    const char *o[] = {"precision=bf16", "cost.price=-1", "cost.spot_price=-1", "cost.count=8"};
    build(&p, o, 4);
    const struct tr_hardware *h = tr_hardware_find("h100-80gb");
    cr_assert_str_eq(p.peak_kind, "bf16");
    cr_assert_eq(p.peak_flops, h->tflops_bf16 * 1e12);
    cr_assert_eq(p.price, h->price_hour);
    cr_assert_float_eq(p.scale[0].compute_seconds, p.flops_per_step / (h->tflops_bf16 * 1e12 * 0.4 * 8),
                       1e-15);
    cr_assert_float_eq(p.hours, 1000 * p.scale[0].step_seconds / 3600, 1e-12);
    cr_assert_float_eq(p.dollars, p.hours * h->price_hour * 8, 1e-12);
    cr_assert_float_eq(p.spot_dollars, p.hours * h->spot_price_hour * 8, 1e-12);
    cr_assert(p.allreduce_seconds > 0);
    tr_plan_free(&p);
}

/* ---- the precision policy: what runs is what is priced ------------------ */

/* The cpu backend runs no tf32 GEMMs, so a plan for device=cpu (like a
 * run) refuses the flag instead of pricing a tf32 peak. */
Test(plan, refuses_tf32_rather_than_price_it, .init = environment)
{
    struct tr_plan p;
    tr_err err = {{0}};
    const char *o[] = {"precision.plugin=fp32", "precision.allow_tf32=true"};
    cr_assert_eq(tr_plan_build(&p, RECIPE, o, 2, &err), TR_ERROR, "tf32 was priced");
    cr_assert(strstr(err.msg, "command line: precision 'fp32' asks for allow_tf32 = true, which "
                              "device 'cpu' cannot honour"), "%s", err.msg);
    cr_assert(strstr(err.msg, "remove allow_tf32"), "%s", err.msg);
}

/* device=cuda runs fp32 GEMMs in tf32 when the policy allows it: the plan
 * prices the tf32 tensor-core peak, not the CUDA-core fp32 one. */
Test(plan, prices_the_tf32_peak_on_cuda, .init = environment)
{
    const struct tr_hardware *h = tr_hardware_find("h100-80gb");
    cr_assert(h->tflops_tf32 > h->tflops_fp32 && h->tflops_tf32 < h->tflops_bf16);
    struct tr_plan p;
    const char *o[] = {"device=cuda", "precision.plugin=fp32", "precision.tf32=true"};
    build(&p, o, 3);
    cr_assert_str_eq(p.peak_kind, "tf32");
    cr_assert_eq(p.peak_flops, h->tflops_tf32 * 1e12);
    double compute = p.flops_per_step / (h->tflops_tf32 * 1e12 * 0.4 * 2);
    cr_assert_float_eq(p.scale[0].compute_seconds, compute, 1e-12 * compute);
    tr_plan_free(&p);
    /* tf32 = false (the default) on cuda: the fp32 peak */
    const char *f[] = {"device=cuda", "precision.plugin=fp32"};
    build(&p, f, 2);
    cr_assert_str_eq(p.peak_kind, "fp32");
    cr_assert_eq(p.peak_flops, h->tflops_fp32 * 1e12);
    tr_plan_free(&p);
}

/* Half GEMMs round their inputs into scratch, and a 16-bit compute dtype
 * stores the activations in it: every activation but the logits (fp32, the
 * loss reads them) takes half the bytes.  The plan counts both, as the
 * run's memory plan does; gradients and parameters stay fp32. */
Test(plan, half_precision_halves_the_activations, .init = environment)
{
    struct tr_plan f32, b16, f16;
    build(&f32, NULL, 0);
    const char *o[] = {"precision=bf16"}, *o16[] = {"precision=fp16"};
    build(&b16, o, 1);
    build(&f16, o16, 1);
    cr_assert_gt(b16.memory.scratch, f32.memory.scratch);
    double logits = 8.0 * 16 * 64 * 4; /* micro-batch x ctx x vocab, fp32 */
    double want = (double)(f32.memory.activations - (size_t)logits) / 2 + logits;
    /* each tensor starts on a 64-byte line: a few lines of slack */
    cr_assert_float_eq((double)b16.memory.activations, want, 4 * 64.0,
                       "bf16 activations %zu bytes, fp32 %zu: not half but the logits",
                       b16.memory.activations, f32.memory.activations);
    cr_assert_eq(f16.memory.activations, b16.memory.activations);
    cr_assert_eq(b16.memory.activation_grads, f32.memory.activation_grads, "gradients stay fp32");
    cr_assert_eq(b16.memory.saved, f32.memory.saved, "saved statistics stay fp32");
    cr_assert_eq(b16.memory.params, f32.memory.params);
    cr_assert_lt(b16.memory_total, f32.memory_total);
    tr_plan_free(&f32);
    tr_plan_free(&b16);
    tr_plan_free(&f16);
}

Test(precision, refuses_each_field_no_backend_honours)
{
    struct tr_precision_policy ok = {sizeof ok, TR_F32, TR_BF16, TR_F32, 0};
    tr_err err = {{0}};
    cr_assert_eq(tr_precision_check(&ok, "bf16", "r.lua:3", "cpu", &err), TR_OK, "%s", err.msg);
    ok.compute = TR_F16;
    cr_assert_eq(tr_precision_check(&ok, "fp16", "r.lua:3", "cuda", &err), TR_OK, "%s", err.msg);

    struct {
        struct tr_precision_policy pol;
        const char *says;
    } bad[] = {
        {{sizeof ok, TR_BF16, TR_BF16, TR_F32, 0},
         "r.lua:3: precision 'mine' asks for master = bf16, which device 'cuda' cannot honour"},
        {{sizeof ok, TR_F32, TR_BF16, TR_F16, 0},
         "r.lua:3: precision 'mine' asks for grad = fp16, which device 'cuda' cannot honour"},
        {{sizeof ok, TR_F32, TR_I32, TR_F32, 0},
         "r.lua:3: precision 'mine' asks for compute = i32, which device 'cuda' cannot honour"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        cr_assert_eq(tr_precision_check(&bad[i].pol, "mine", "r.lua:3", "cuda", &err), TR_ERROR,
                     "case %zu accepted", i);
        cr_assert(strstr(err.msg, bad[i].says), "case %zu: %s", i, err.msg);
    }
    /* tf32: the cuda backend runs it, the cpu backend has none */
    struct tr_precision_policy tf32 = {sizeof tf32, TR_F32, TR_F32, TR_F32, 1};
    memset(&err, 0, sizeof err);
    cr_assert_eq(tr_precision_check(&tf32, "fp32", "r.lua:3", "cuda", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_precision_check(&tf32, "mine", "r.lua:3", "cpu", &err), TR_ERROR);
    cr_assert(strstr(err.msg, "r.lua:3: precision 'mine' asks for allow_tf32 = true, which device "
                              "'cpu' cannot honour: only the cuda backend runs GEMMs in tf32"),
              "%s", err.msg);
}

Test(precision, the_peak_is_that_of_the_gemms_that_run)
{
    const struct tr_hardware *h = tr_hardware_find("a100-80gb");
    const char *kind;
    struct tr_precision_policy pol = {sizeof pol, TR_F32, TR_F32, TR_F32, 0};
    cr_assert_eq(tr_precision_peak_tflops(h, &pol, &kind), h->tflops_fp32);
    cr_assert_str_eq(kind, "fp32");
    pol.compute = TR_F16;
    cr_assert_eq(tr_precision_peak_tflops(h, &pol, &kind), h->tflops_bf16);
    cr_assert_str_eq(kind, "fp16");
    pol.compute = TR_BF16;
    cr_assert_eq(tr_precision_peak_tflops(h, &pol, &kind), h->tflops_bf16);
    cr_assert_str_eq(kind, "bf16");
    /* allow_tf32 does not change 16-bit GEMMs; fp32 ones run at the tf32 peak */
    pol.allow_tf32 = 1;
    cr_assert_eq(tr_precision_peak_tflops(h, &pol, &kind), h->tflops_bf16);
    cr_assert_str_eq(kind, "bf16");
    pol.compute = TR_F32;
    cr_assert_eq(tr_precision_peak_tflops(h, &pol, &kind), h->tflops_tf32);
    cr_assert_str_eq(kind, "tf32");
    cr_assert_eq(h->tflops_tf32, 156.0, "A100: 156 dense tf32 TFLOP/s");
    cr_assert_eq(tr_precision_peak_tflops(NULL, &pol, NULL), 0);
}

Test(plan, prints_the_report, .init = environment)
{
    char *argv[] = {"plan", RECIPE, "gpus=4", "cost.hardware=a100-80gb", "precision=bf16",
                    "cost.price=-1", "cost.spot_price=-1", "train.steps=1000000000", "cost.budget=0.1"};
    int argc = sizeof argv / sizeof *argv, code;
    char *out = run_plan(argc, argv, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);

    /* the same numbers, from the plan itself */
    const char *o[] = {"cost.count=4", "cost.hardware=a100-80gb", "precision=bf16", "cost.price=-1",
                       "cost.spot_price=-1", "train.steps=1000000000", "cost.budget=0.1"};
    struct tr_plan p;
    build(&p, o, 7);
    cr_assert_float_eq(p.dollars, 4 * p.hours * 1.80, 1e-12);
    char dollars[64], spot[64];
    snprintf(dollars, sizeof dollars, "$%.2f", p.dollars);
    snprintf(spot, sizeof spot, "$%.2f", p.spot_dollars);
    tr_plan_free(&p);

    const char *want[] = {
        "  parameters P              28,032  (28.0 K; 25.5 K without embeddings)\n",
        "the cpu backend's plan, activations in bf16 storage)",
        "(precision bf16: activations in bf16 storage on every backend, half the bytes;",
        "L = 2 attention layers, T = 16 tokens, C = 32 wide",
        "6·P + 12·L·T·C = 168,192 + 12,288 = 180,480  (180 kFLOP)",
        "  tokens per step           512  (batch 32 × 16 tokens)\n",
        "20 × P = 560,640",
        "  on a100-80gb              fits:",
        "projection on 4 × a100-80gb",
        "bf16 peak 312 TFLOP/s × MFU 0.40 × 4 = 499 TFLOP/s",
        "  prices per device-hour    $1.80 on-demand, $1.10 spot\n",
        "(typical list prices",
        dollars,
        spot,
        "  batch 64 (×2)             lr 0.002\n",
        "  batch 256 (×8)            lr 0.008\n",
        "warning: the recipe's run (",
        ") is over the budget (cost.budget = $0.10)",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(out, want[i]), "missing \"%s\" in:\n%s", want[i], out);
    free(out);
}

Test(plan, warns_when_the_model_does_not_fit, .init = environment)
{
    char *argv[] = {"plan", RECIPE, "model.ctx=1024", "model.heads=8", "train.batch=1024",
                    "train.micro_batch=512", "cost.hardware=l4-24gb", "model.dim=384"};
    int code;
    char *out = run_plan(8, argv, &code);
    cr_assert_eq(code, TR_EXIT_OK);
    cr_assert(strstr(out, "on l4-24gb                DOES NOT FIT"), "%s", out);
    cr_assert(strstr(out, "warning: the model does not fit on l4-24gb"), "%s", out);
    cr_assert(strstr(out, "Lower train.micro_batch (256 fits and divides the batch)"), "%s", out);
    cr_assert(strstr(out, "precision = \"bf16\""), "%s", out);
    cr_assert(strstr(out, "model.dim, model.layers"), "%s", out);
    free(out);
}

Test(plan, names_an_unknown_device_and_where_it_was_set, .init = environment)
{
    struct tr_plan p;
    tr_err err = {{0}};
    const char *o[] = {"cost.hardware=h100"};
    cr_assert_eq(tr_plan_build(&p, RECIPE, o, 1, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "command line: cost: unknown hardware 'h100' (did you mean "
                              "'h100-80gb'?)"), "%s", err.msg);
}

Test(plan, refuses_what_is_not_an_override, .init = environment)
{
    char *argv[] = {"plan", RECIPE, "--fast"};
    int code;
    char *out = run_plan(3, argv, &code);
    cr_assert_eq(code, TR_EXIT_USAGE);
    free(out);
    char *none[] = {"plan"};
    out = run_plan(1, none, &code);
    cr_assert_eq(code, TR_EXIT_USAGE);
    free(out);
}

/* ---- scaling: the all-reduce, its overlap with backward, fewer devices ----- */

Test(hardware, ring_links_and_the_all_reduce_by_hand)
{
    const struct tr_hardware *h100 = tr_hardware_find("h100-80gb");
    struct tr_link l = tr_hardware_ring_link(h100, 8);
    cr_assert_eq(l.kind, TR_LINK_NVLINK, "8 H100s: one node, NVLink");
    cr_assert_eq(l.bytes_per_second, 450e9, "900 GB/s both ways: 450 each");
    cr_assert_eq(l.latency_seconds, 3.4e-6);
    l = tr_hardware_ring_link(h100, 9);
    cr_assert_eq(l.kind, TR_LINK_NETWORK, "9 H100s span two nodes");
    cr_assert_eq(l.bytes_per_second, 50e9, "400 Gb/s per GPU");
    cr_assert_eq(l.latency_seconds, 14e-6);
    l = tr_hardware_ring_link(tr_hardware_find("l4-24gb"), 4);
    cr_assert_eq(l.kind, TR_LINK_PCIE, "L4s have no NVLink");
    cr_assert_eq(l.bytes_per_second, 32e9);
    cr_assert_eq(tr_hardware_ring_link(tr_hardware_find("cpu"), 4).kind, TR_LINK_NONE);

    /* 1 GB over 8 GPUs on NVLink: 2*7/8 * 1e9 / 450e9 + 14 * 3.4 us */
    l = tr_hardware_ring_link(h100, 8);
    cr_assert_float_eq(tr_ring_allreduce_seconds(1e9, 8, &l), 1.75 / 450 + 47.6e-6, 1e-12);
    cr_assert_eq(tr_ring_allreduce_seconds(1e9, 1, &l), 0, "one device has nothing to reduce");
}

Test(plan, overlap_with_backward_by_hand)
{
    const struct tr_hardware *h100 = tr_hardware_find("h100-80gb");
    struct tr_plan_scale s;
    /* 6e13 FLOPs per step at 1 PFLOP/s x 0.5 on 4 devices: 30 ms compute,
     * 20 ms of it backward; 1 GB of gradients in 4 buckets of 250 MB */
    tr_plan_scale_step(&s, h100, 4, 6e13, 1e15, 0.5, 1e9, 250e6);
    cr_assert_eq(s.nodes, 1);
    cr_assert_eq(s.link.kind, TR_LINK_NVLINK);
    cr_assert_float_eq(s.compute_seconds, 0.030, 1e-15);
    cr_assert_eq(s.buckets, 4);
    double bucket = 2 * 3.0 / 4 * 250e6 / 450e9 + 6 * 3.4e-6; /* 0.8537 ms */
    cr_assert_float_eq(s.bucket_seconds, bucket, 1e-15);
    cr_assert_float_eq(s.allreduce_seconds, 4 * bucket, 1e-15);
    /* 3.4 ms of ring against 20 ms of backward: only the last bucket shows */
    cr_assert_float_eq(s.exposed_seconds, bucket, 1e-15);
    cr_assert_float_eq(s.step_seconds, 0.030 + bucket, 1e-15);
    cr_assert_float_eq(s.efficiency, 0.030 / (0.030 + bucket), 1e-12);

    /* 16 devices: two nodes, the ring crosses the network; 7.5 ms compute
     * (5 ms backward) against 4 buckets of 2*15/16 * 250e6 / 50e9 + 30 * 14 us */
    tr_plan_scale_step(&s, h100, 16, 6e13, 1e15, 0.5, 1e9, 250e6);
    cr_assert_eq(s.nodes, 2);
    cr_assert_eq(s.link.kind, TR_LINK_NETWORK);
    bucket = 9.375e-3 + 420e-6;
    cr_assert_float_eq(s.bucket_seconds, bucket, 1e-15);
    /* comm-bound: the first bucket starts 1/4 into backward and the other
     * three queue behind it: exposed = 4 * bucket - 5 ms * 3/4 */
    cr_assert_float_eq(s.exposed_seconds, 4 * bucket - 3.75e-3, 1e-15);
    cr_assert_float_eq(s.step_seconds, 7.5e-3 + 4 * bucket - 3.75e-3, 1e-15);

    /* one device: no all-reduce at all */
    tr_plan_scale_step(&s, h100, 1, 6e13, 1e15, 0.5, 1e9, 250e6);
    cr_assert_eq(s.exposed_seconds, 0);
    cr_assert_eq(s.efficiency, 1);
}

Test(plan, compares_fewer_devices_and_suggests_the_cheap_one, .init = environment)
{
    /* the tiny GPT on 8 H100s: 112 KiB of gradients, microseconds of compute
     * a step: the ring's latency dominates, so one device is cheapest */
    const char *o[] = {"cost.count=8", "cost.price=-1", "cost.spot_price=-1"};
    struct tr_plan p;
    build(&p, o, 3);
    cr_assert_eq(p.gradient_bytes, 28032.0 * 4, "fp32 gradients");
    cr_assert_eq(p.bucket_bytes, 25.0 * 1024 * 1024, "parallel.bucket_mb defaults to 25");
    cr_assert_eq(p.n_scale, 4);
    const struct tr_hardware *h = tr_hardware_find("h100-80gb");
    for (int i = 0; i < 4; i++) {
        const struct tr_plan_scale *s = &p.scale[i];
        cr_assert_eq(s->devices, 8 >> i);
        cr_assert_float_eq(s->hours, 1000 * s->step_seconds / 3600, 1e-15);
        cr_assert_float_eq(s->dollars, (double)s->devices * s->hours * h->price_hour, 1e-12);
        cr_assert_eq(s->even, 32 % ((8 >> i) * 8) == 0, "batch 32, micro-batch 8");
    }
    cr_assert_eq(p.scale[0].buckets, 1);
    struct tr_link nvlink = tr_hardware_ring_link(h, 8);
    cr_assert_float_eq(p.allreduce_seconds, tr_ring_allreduce_seconds(28032.0 * 4, 8, &nvlink), 1e-15);
    cr_assert_eq(p.suggested, 3, "one device: no ring to wait for");
    tr_plan_free(&p);

    /* a batch of 2^20 sequences: 14 ms of compute a step hides the ring,
     * and 8 devices cost within 5% of one */
    const char *big[] = {"cost.count=8", "train.batch=1048576", "train.micro_batch=2"};
    build(&p, big, 3);
    cr_assert_gt(p.scale[0].efficiency, 0.99);
    cr_assert_eq(p.suggested, 0);
    tr_plan_free(&p);
}

Test(plan, prints_the_scaling_table, .init = environment)
{
    char *argv[] = {"plan", RECIPE, "gpus=16", "precision=bf16", "train.steps=100000000"};
    int code;
    char *out = run_plan(5, argv, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);
    const char *want[] = {
        "  gradient all-reduce       ≈ ",
        "of fp32 gradients in 1 bucket(s) of 25.00 MiB",
        "each a ring over network at 50 GB/s each way and 14 µs",
        "scaling efficiency",
        "scaling  (the recipe's run on fewer devices, at on-demand prices)\n",
        "       16      2  network ",
        "        8      1  NVLink  ",
        "        1      1  -       ",
        "  * train.batch does not split evenly over these devices",
        "  fewer devices per job would be cheaper: 1 device(s) cost $",
        "over the network\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(out, want[i]), "missing \"%s\" in:\n%s", want[i], out);
    free(out);
}

/* ---- every integer option is range-checked ------------------------------- */

/* tests/config/limits.tsv: one row per integer option of the core and the
 * shipped plugins.  Each gets the values below on the command line and in a
 * recipe; show (tr_config_load) and plan must accept it exactly when it is
 * in range, and otherwise refuse it with an error naming the key and where
 * it was set.  Every row runs in its own process under a 4 GiB address
 * space limit, so a crash or a huge allocation attempt fails the row. */
#define LIMITS TR_TEST_SRCDIR "/config/limits.tsv"

struct limit_row {
    char key[64], min[32], max[32], fallback[32], checked[8], line[160];
};

static const struct {
    const char *cli, *lua; /* as typed on the command line; as a recipe writes it */
    double value;
} limit_values[] = {
    {"-1", "-1", -1},
    {"0", "0", 0},
    {"2147483648", "2^31", 2147483648.0},
    {"4294967297", "2^32+1", 4294967297.0},
    {"4611686018427387904", "2^62", 4611686018427387904.0},
    {"1e18", "1e18", 1e18},
    {"1.5", "1.5", 1.5},
};

static int read_limit_rows(struct limit_row *rows, int max)
{
    FILE *f = fopen(LIMITS, "r");
    cr_assert_not_null(f, "cannot open %s", LIMITS);
    char text[512];
    int n = 0;
    while (n < max && fgets(text, sizeof text, f)) {
        if (text[0] == '#' || text[0] == '\n')
            continue;
        text[strcspn(text, "\n")] = 0;
        char *field[7];
        int k = 0;
        for (char *p = text; k < 7 && p; k++) {
            field[k] = p;
            p = strchr(p, '\t');
            if (p)
                *p++ = 0;
        }
        cr_assert_eq(k, 7, "%s: a row needs 7 tab-separated fields", LIMITS);
        struct limit_row *r = &rows[n++];
        snprintf(r->key, sizeof r->key, "%s", field[0]);
        snprintf(r->min, sizeof r->min, "%s", field[1]);
        snprintf(r->max, sizeof r->max, "%s", field[2]);
        snprintf(r->fallback, sizeof r->fallback, "%s", field[3]);
        snprintf(r->checked, sizeof r->checked, "%s", field[4]);
        snprintf(r->line, sizeof r->line, "%s", field[6]);
    }
    fclose(f);
    return n;
}

/* A recipe with the row's line (its value filled in) on line 7; the base
 * line of the same section gives way to it. */
static void write_limit_recipe(const char *path, const struct limit_row *r, const char *value)
{
    static const char *const base[] = {
        "  model = gpt { vocab = 64, ctx = 16, layers = 2, heads = 2, dim = 32 },",
        "  data = { plugin = \"synthetic\", kind = \"tokens\", classes = 64 },",
        "  train = { steps = 10, batch = 32, micro_batch = 8 },",
        "  cost = { hardware = \"h100-80gb\", count = 2 },",
    };
    char section[64];
    snprintf(section, sizeof section, "%.*s", (int)strcspn(r->key, "."), r->key);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "-- one integer option at a time (tests/config/limits.tsv)\nreturn {\n");
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) {
        size_t len = strlen(section);
        int same = strncmp(base[i] + 2, section, len) == 0 && base[i][2 + len] == ' ';
        fprintf(f, "%s\n", same ? "  -- (set below)" : base[i]);
    }
    fprintf(f, "  ");
    fprintf(f, r->line, value);
    fprintf(f, "\n}\n");
    fclose(f);
}

static void limits_environment(void)
{
    environment();
    struct rlimit as = {4ull << 30, 4ull << 30};
#ifndef __SANITIZE_ADDRESS__ /* ASan's shadow memory alone needs terabytes of address space */
    setrlimit(RLIMIT_AS, &as);
#else
    (void)as;
#endif
}

/* One way of giving the value: the error, if any, must name the key's last
 * part and `where`, and for an integer say what range it must be in (1e18
 * steps is too many, not "not an integer"). */
static int names_the_key(const char *msg, const char *quoted, const char *where, int integral)
{
    return strstr(msg, quoted) && strstr(msg, where) && (!integral || strstr(msg, "must be"));
}

static void expect_limit(const struct limit_row *r, const char *recipe, const char *override,
                         int legal, int integral, const char *where, const char *shown)
{
    const char *name = strrchr(r->key, '.') ? strrchr(r->key, '.') + 1 : r->key;
    char quoted[80];
    snprintf(quoted, sizeof quoted, "'%s'", name);
    const char *o[] = {override};
    int n = override ? 1 : 0;
    int model = strcmp(r->checked, "model") == 0;
    tr_err err = {{0}};

    struct tr_config cfg;
    int rc = tr_config_load(&cfg, recipe, o, n, &err);
    tr_config_free(&cfg);
    if (legal || model) {
        cr_expect_eq(rc, TR_OK, "show %s = %s: %s", r->key, shown, err.msg);
    } else {
        cr_expect_eq(rc, TR_ERROR, "show %s = %s was accepted", r->key, shown);
        cr_expect(names_the_key(err.msg, quoted, where, integral),
                  "show %s = %s: the error does not name %s, %s and its range: %s", r->key, shown,
                  quoted, where, err.msg);
    }

    struct tr_plan p;
    memset(&err, 0, sizeof err);
    rc = tr_plan_build(&p, recipe, o, n, &err);
    if (rc == TR_OK) {
        cr_expect(legal, "plan %s = %s was accepted", r->key, shown);
        cr_expect_geq(p.params, 0);
        cr_expect(p.memory_total > 0 && isfinite(p.flops) && p.flops > 0,
                  "plan %s = %s: memory %g, FLOPs %g", r->key, shown, p.memory_total, p.flops);
        tr_plan_free(&p);
    } else {
        cr_expect(!legal, "plan %s = %s: %s", r->key, shown, err.msg);
        cr_expect(names_the_key(err.msg, quoted, where, integral),
                  "plan %s = %s: the error does not name %s, %s and its range: %s", r->key, shown,
                  quoted, where, err.msg);
    }
}

ParameterizedTestParameters(limits, every_integer_option)
{
    static int index[64];
    for (int i = 0; i < 64; i++)
        index[i] = i;
    struct limit_row rows[64];
    return cr_make_param_array(int, index, (size_t)read_limit_rows(rows, 64));
}

ParameterizedTest(int *row, limits, every_integer_option, .init = limits_environment)
{
    struct limit_row rows[64];
    int n = read_limit_rows(rows, 64);
    cr_assert_lt(*row, n);
    const struct limit_row *r = &rows[*row];
    char dir[] = "/tmp/trainrun-limits.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char *recipe = tr_xasprintf("%s/limit.lua", dir);
    char *line7 = tr_xasprintf("%s:7", recipe);
    double lo = strtod(r->min, NULL), hi = strtod(r->max, NULL);
    for (size_t i = 0; i < sizeof limit_values / sizeof *limit_values; i++) {
        double v = limit_values[i].value;
        int integral = v == floor(v), legal = integral && v >= lo && v <= hi;
        /* in the recipe */
        write_limit_recipe(recipe, r, limit_values[i].lua);
        expect_limit(r, recipe, NULL, legal, integral, line7, limit_values[i].lua);
        /* on the command line, over a legal value in the recipe; a model's
         * options too are named where they were set, the command line */
        write_limit_recipe(recipe, r, r->fallback);
        char *override = tr_xasprintf("%s=%s", r->key, limit_values[i].cli);
        expect_limit(r, recipe, override, legal, integral, "command line", limit_values[i].cli);
        free(override);
    }
    unlink(recipe);
    rmdir(dir);
    free(line7);
    free(recipe);
}

/* The largest model and run every range allows: every figure of the plan is
 * finite and positive (no wrap to a negative count, no inf). */
Test(limits, the_largest_legal_plan_is_finite, .init = limits_environment)
{
    char *argv[] = {"plan", RECIPE, "model.ctx=1048576", "model.dim=16384", "model.heads=2",
                    "model.layers=1024", "train.batch=16777216", "train.micro_batch=1",
                    "train.steps=1000000000000", "cost.count=1048576", "cost.price=1000000",
                    "cost.spot_price=1000000"};
    int code;
    char *out = run_plan(12, argv, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);
    cr_assert(strstr(out, "parameters P              3,315,933,937,664"), "%s", out);
    for (const char *word[] = {"inf", "nan"}, **w = word; w < word + 2; w++)
        for (const char *c = out; (c = strstr(c, *w)) != NULL; c++) /* not "inference" */
            cr_assert((c > out && isalpha((unsigned char)c[-1])) || isalpha((unsigned char)c[3]),
                      "%s in: %.60s", *w, c > out + 20 ? c - 20 : out);
    for (const char *c = out + 1; (c = strchr(c, '-')) != NULL; c++) /* not h100-80gb */
        cr_assert(isalnum((unsigned char)c[-1]) || !isdigit((unsigned char)c[1]),
                  "a negative figure: %.40s", c - 10);
    free(out);
}

/* The graph refuses sizes the kernels and the memory plan cannot hold,
 * before forming any product, whoever built it. */
Test(limits, the_graph_refuses_sizes_past_its_limits)
{
    struct {
        int ndim;
        int64_t shape[4];
        const char *want;
    } cases[] = {
        {2, {4, 2147483648LL}, "dimension 2 is 2147483648, must be between 1 and 2147483647"},
        {2, {0, 8}, "dimension 1 is 0, must be between 1 and 2147483647"},
        {1, {-1}, "dimension 1 is -1"},
        /* 2^124 elements: the product wraps size_t without the check */
        {4, {2147483647, 2147483647, 2147483647, 2147483647}, "has more than 1099511627776 elements"},
        {3, {1024, 1024, 2097152}, "has more than 1099511627776 elements"},
        {3, {65536, 65536, 2}, "has 4294967296 rows, more than the kernels' 2147483647"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct tr_graph *g = tr_graph_new(1);
        tr_graph_add_tensor(g, "x", TR_ROLE_INPUT, TR_F32, cases[i].ndim, cases[i].shape);
        tr_err err = {{0}};
        cr_expect_eq(tr_graph_check(g, &err), TR_ERROR, "case %zu was accepted", i);
        cr_expect(strstr(err.msg, cases[i].want), "case %zu: %s", i, err.msg);
        tr_graph_free(g, NULL);
    }
    /* parameters add up past 2^44: 17 tensors of 2^40 */
    struct tr_graph *g = tr_graph_new(1);
    int64_t big[2] = {1048576, 1048576};
    for (int i = 0; i < 17; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        tr_graph_add_tensor(g, name, TR_ROLE_PARAM, TR_F32, 2, big);
    }
    tr_err err = {{0}};
    cr_expect_eq(tr_graph_check(g, &err), TR_ERROR);
    cr_expect(strstr(err.msg, "more than 17592186044416 parameters (2^44) by tensor 'w16'"), "%s",
              err.msg);
    tr_graph_free(g, NULL);
}

/* ---- image models: FLOPs per sample from the shapes ------------------------ */

#define CNN TR_TEST_SRCDIR "/config/plan_cnn.lua"

/* A convolution's weights multiply at every output position: the count is
 * 6 x the multiply-adds per sample, OH x OW x OC x KH x KW x IC/groups per
 * convolution and rows x IC x OC per linear layer, not 6 x the parameters. */
Test(plan, counts_conv_flops_per_sample_from_the_shapes, .init = environment)
{
    struct tr_plan p;
    tr_err err = {{0}};
    cr_assert_eq(tr_plan_build(&p, CNN, NULL, 0, &err), TR_OK, "%s", err.msg);
    /* 6x6 at 4 channels: 2->4 and 4->4; after the pool 3x3 at 8: 4->8, 8->8 */
    double macs = 36.0 * 4 * 9 * 2 + 36.0 * 4 * 9 * 4 + 9.0 * 8 * 9 * 4 + 9.0 * 8 * 9 * 8;
    double head = 8.0 * 5;
    cr_assert_eq(p.convs, 4);
    cr_assert_eq(p.conv_flops, 6 * macs, "conv FLOPs %.0f, by hand %.0f", p.conv_flops, 6 * macs);
    cr_assert_eq(p.dense_flops, 6 * head);
    cr_assert_eq(p.flops_per_token, 6 * (macs + head), "per sample");
    cr_assert_eq(p.sequence_model, 0);
    cr_assert_eq(p.tokens_per_step, 16.0, "a sample is the unit: train.batch of them per step");
    /* parameters: convs without bias, batch norm scale and shift, the head */
    int64_t P = (4 * 9 * 2 + 4 * 9 * 4 + 8 * 9 * 4 + 8 * 9 * 8) + 2 * (4 + 4 + 8 + 8) + 8 * 5 + 5;
    cr_assert_eq(p.params, P, "params %lld, by hand %lld", (long long)p.params, (long long)P);
    /* the running statistics (2 x C floats per batch norm) ride in the
     * parameters row; gradients and optimizer state have none */
    size_t buffers = 2 * (4 + 4 + 8 + 8);
    cr_assert_eq(p.memory.params, ((size_t)P + buffers) * 4);
    cr_assert_eq(p.memory.grads, (size_t)P * 4);
    cr_assert_eq(p.memory.optimizer, 2 * (size_t)P * 4);
    tr_plan_free(&p);

    /* strides and groups change the count as the shapes do */
    const char *ov[] = {"model.kernel=5"};
    cr_assert_eq(tr_plan_build(&p, CNN, ov, 1, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(p.conv_flops, 6 * macs * 25 / 9);
    tr_plan_free(&p);
}

/* ResNet-18 and -50 at 224x224: the multiply-adds every paper quotes
 * (1.814 G and 4.09 G forward), and torchvision's parameter counts. */
Test(plan, resnet_flops_and_parameters_match_the_published_counts, .init = environment)
{
    struct { const char *depth; double conv_macs, fc_macs; int64_t params; } cases[] = {
        {"model.depth=18", 1813561344.0, 512000.0, 11689512},
        {"model.depth=50", 4087136256.0, 2048000.0, 25557032},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *ov[] = {cases[i].depth};
        struct tr_plan p;
        tr_err err = {{0}};
        cr_assert_eq(tr_plan_build(&p, TR_TEST_SRCDIR "/config/plan_resnet.lua", ov, 1, &err), TR_OK,
                     "%s", err.msg);
        cr_assert_eq(p.params, cases[i].params, "%s: %lld parameters", cases[i].depth, (long long)p.params);
        cr_assert_eq(p.conv_flops, 6 * cases[i].conv_macs, "%s: %.0f", cases[i].depth, p.conv_flops / 6);
        cr_assert_eq(p.dense_flops, 6 * cases[i].fc_macs);
        tr_plan_free(&p);
    }
}

/* The engine end to end below the run loop: trainrun's tiny GPT against
 * PyTorch fixtures, gradient accumulation, the memory plan, and the bytes
 * of a checkpoint.
 *
 * Covers: core/engine/graph.c, graph_plan.c and graph_exec.c (forward, backward, the
 * memory plan, recompute, half activations, loss masks, first-writer gradients, batch norm's buffers), model.c (the
 * GPT, Llama and CNN graphs), optim.c (optimizer state and step) and checkpoint.c
 * (streamed blobs), configured through core/config/run_config.c and optimizers.c, on
 * kernels/cpu/.  The session, the fit and the policies are tests/test_session.c's; the
 * run loop (core/engine/run.c, journal.c, run_state.c) is covered end to end by
 * tests/e2e/.
 */
#include <criterion/criterion.h>

#include "engine/checkpoint.h"
#include "engine/comm.h"
#include "engine/gather.h"
#include "engine/optim.h"
#include "engine_harness.h"
#include "remove_tree.h"
#include "../kernels/host.h" /* tr_cpu_to_half */

#include <trainrun/tokens.h>

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CONFIG_DIR TR_TEST_SRCDIR "/config/"

static void engine_open_with(struct engine *e, const char *recipe, int batch,
                             const char *const *overrides, int n)
{
    tr_err err = {{0}};
    cr_assert_eq(engine_build(e, recipe, overrides, n, batch, 0, &err), TR_OK, "%s", err.msg);
}

static void engine_open(struct engine *e, const char *recipe, int batch)
{
    engine_open_with(e, recipe, batch, NULL, 0);
}

Test(pytorch_agreement, loss_gradients_and_ten_adamw_steps, .init = environment)
{
    struct st_file fixture = st_open(TR_TEST_SRCDIR "/fixtures/tiny_gpt.safetensors");
    const struct tr_st_file *f = fixture.st;
    tr_err err = {{0}};
    struct engine e;
    engine_open(&e, CONFIG_DIR "tiny_gpt.lua", 3);
    struct tr_graph *g = e.g;
    int params = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        const struct tr_st_entry *p = need(f, "param.", t->name);
        cr_assert_eq(p->bytes, t->numel * sizeof(float), "%s: shape differs from the fixture", t->name);
        memcpy(t->data, p->data, p->bytes);
        params++;
    }
    cr_assert_eq(params, 28, "the fixture has 28 parameters");
    set_inputs(g, f);

    /* loss and every gradient */
    memset(g->grads, 0, g->n_params * sizeof(float));
    tr_graph_forward(g, &e.be);
    float want = *(const float *)need(f, "", "loss")->data;
    cr_assert_float_eq(loss_of(g), want, 1e-4 * fabsf(want), "loss %.7f vs PyTorch %.7f", loss_of(g), want);
    g->loss_grad = 1.0f;
    tr_graph_backward(g, &e.be);
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        const struct tr_st_entry *r = need(f, "grad.", t->name);
        double error = tensor_error(t->grad, r->data, t->numel);
        cr_assert_leq(error, 1e-4, "gradient of %s: relative error %.3g", t->name, error);
    }

    /* ten AdamW steps on the same batch, constant lr */
    struct tr_optimizer opt;
    cr_assert_eq(tr_optimizer_init(&opt, &e.cfg.optimizer, g, &e.be, NULL, &err), TR_OK, "%s", err.msg);
    engine_steps_agree(&e, &opt, need(f, "", "adamw_losses")->data, 10, "tiny_gpt (reference: PyTorch)");
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        const float *r = need(f, "final.", t->name)->data;
        size_t n = t->numel;
        if (strstr(t->name, "attn.c_attn.bias")) {
            /* the key bias has an exactly-zero gradient: fp32 noise moves it
             * under AdamW in any implementation, so only q and v are compared */
            size_t C = n / 3;
            const float *got = t->data;
            double eq = tensor_error(got, r, C), ev = tensor_error(got + 2 * C, r + 2 * C, C);
            cr_assert_leq(fmax(eq, ev), 1e-4, "%s after 10 steps: relative error %.3g", t->name, fmax(eq, ev));
            continue;
        }
        double error = tensor_error(t->data, r, n);
        cr_assert_leq(error, 1e-4, "%s after 10 steps: relative error %.3g", t->name, error);
    }
    tr_optimizer_free(&opt, &e.be);
    engine_close(&e);
    st_close(&fixture);
}

/* N micro-batches of b give the same gradients (and update) as one batch of
 * N*b: the loss of each micro-batch is scaled by 1/N. */
Test(accumulation, micro_batches_match_one_big_batch, .init = environment)
{
    enum { N = 4, b = 2, T = 8, V = 37 };
    struct engine big, small;
    engine_open(&big, CONFIG_DIR "tiny_gpt.lua", N * b);
    engine_open(&small, CONFIG_DIR "tiny_gpt.lua", b);
    tr_graph_init_params(big.g, &big.be, 5);
    tr_graph_init_params(small.g, &small.be, 5);
    cr_assert_arr_eq(big.g->params, small.g->params, big.g->n_params * sizeof(float));
    int32_t tokens[N * b * T], targets[N * b * T];
    for (int i = 0; i < N * b * T; i++) {
        tokens[i] = (i * 7 + 3) % V;
        targets[i] = (i * 11 + 5) % V;
    }
    memset(big.g->grads, 0, big.g->n_params * sizeof(float));
    memcpy(big.g->tensors[big.g->inputs[0]].data, tokens, sizeof tokens);
    memcpy(big.g->tensors[big.g->inputs[1]].data, targets, sizeof targets);
    tr_graph_forward(big.g, &big.be);
    big.g->loss_grad = 1.0f;
    tr_graph_backward(big.g, &big.be);

    memset(small.g->grads, 0, small.g->n_params * sizeof(float));
    small.g->loss_grad = 1.0f / N;
    double loss_sum = 0;
    for (int k = 0; k < N; k++) {
        memcpy(small.g->tensors[small.g->inputs[0]].data, tokens + k * b * T, sizeof(int32_t) * b * T);
        memcpy(small.g->tensors[small.g->inputs[1]].data, targets + k * b * T, sizeof(int32_t) * b * T);
        tr_graph_forward(small.g, &small.be);
        loss_sum += loss_of(small.g);
        tr_graph_backward(small.g, &small.be);
    }
    cr_assert_float_eq(loss_sum / N, loss_of(big.g), 1e-5, "mean loss %.7f vs %.7f", loss_sum / N, loss_of(big.g));
    double error = tensor_error(small.g->grads, big.g->grads, big.g->n_params);
    cr_assert_leq(error, 1e-5, "accumulated gradients differ: relative error %.3g", error);

    /* and the AdamW update that follows */
    struct tr_optimizer ob, os;
    tr_err err = {{0}};
    tr_optimizer_init(&ob, &big.cfg.optimizer, big.g, &big.be, NULL, &err);
    tr_optimizer_init(&os, &small.cfg.optimizer, small.g, &small.be, NULL, &err);
    tr_optimizer_step(&ob, big.g, &big.be, 1.0, 1e-2);
    tr_optimizer_step(&os, small.g, &small.be, 1.0, 1e-2);
    error = tensor_error(small.g->params, big.g->params, big.g->n_params);
    cr_assert_leq(error, 1e-5, "updated weights differ: relative error %.3g", error);
    tr_optimizer_free(&ob, &big.be);
    tr_optimizer_free(&os, &small.be);
    engine_close(&big);
    engine_close(&small);
}

Test(memory_plan, counts_every_class_and_shares_gradient_buffers, .init = environment)
{
    struct engine e;
    engine_open(&e, CONFIG_DIR "tiny_gpt.lua", 3);
    const struct tr_memory_report *m = &e.g->memory;
    /* GPT-2 parameter count: V*C + T*C + L*(12*C*C + 13*C) + 2*C */
    size_t V = 37, T = 8, L = 2, C = 16;
    size_t expect = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    cr_assert_eq(e.g->n_params, expect);
    cr_assert_eq(m->params, expect * 4);
    cr_assert_eq(m->grads, expect * 4);
    cr_assert_eq(m->optimizer, 2 * expect * 4);
    cr_assert_gt(m->activations, 0);
    cr_assert_gt(m->saved, 0);
    /* gradient buffers are reused once their tensor's producer has run */
    cr_assert_lt(m->activation_grads, m->activations);
    /* decayed tensors (matrices, embeddings) come first in the flat buffer */
    for (int i = 0; i < e.g->n_tensors; i++) {
        const struct tr_tensor *t = &e.g->tensors[i];
        if (t->role == TR_ROLE_PARAM)
            cr_assert_eq(t->offset < e.g->n_decay, t->ndim >= 2, "%s", t->name);
    }
    engine_close(&e);
}


/* The gradients of fixed tokens (n of them, in a vocabulary of V) from
 * parameters initialised with seed 11: the same in every engine given. */
static void fixed_token_gradients(struct engine *e, int n, int V)
{
    struct tr_graph *g = e->g;
    int32_t *tokens = g->tensors[g->inputs[0]].data, *targets = g->tensors[g->inputs[1]].data;
    tr_graph_init_params(g, &e->be, 11);
    memset(g->grads, 0, g->n_params * sizeof(float));
    for (int i = 0; i < n; i++) {
        tokens[i] = (i * 5 + 1) % V;
        targets[i] = (i * 13 + 2) % V;
    }
    tr_graph_forward(g, &e->be);
    g->loss_grad = 1.0f;
    tr_graph_backward(g, &e->be);
}
/* Recomputing every block's activations in backward changes memory, never
 * the gradients: they are bitwise identical. */
Test(recompute, gradients_are_bitwise_identical_and_memory_falls, .init = environment)
{
    enum { B = 3, T = 8, V = 37 };
    const char *every_block[] = {"model.recompute=1"};
    const char *every_other[] = {"model.recompute=2"};
    struct engine plain, all, half;
    engine_open(&plain, CONFIG_DIR "tiny_gpt.lua", B);
    engine_open_with(&all, CONFIG_DIR "tiny_gpt.lua", B, every_block, 1);
    engine_open_with(&half, CONFIG_DIR "tiny_gpt.lua", B, every_other, 1);
    struct engine *runs[] = {&plain, &all, &half};
    for (int r = 0; r < 3; r++)
        fixed_token_gradients(runs[r], B * T, V);
    cr_assert_arr_eq(all.g->grads, plain.g->grads, plain.g->n_params * sizeof(float),
                     "gradients with every block recomputed differ");
    cr_assert_arr_eq(half.g->grads, plain.g->grads, plain.g->n_params * sizeof(float),
                     "gradients with every other block recomputed differ");
    size_t m_plain = tr_graph_memory_total(&plain.g->memory);
    size_t m_all = tr_graph_memory_total(&all.g->memory);
    size_t m_half = tr_graph_memory_total(&half.g->memory);
    cr_assert_lt(m_all, m_plain, "recomputation must shrink the plan (%zu vs %zu)", m_all, m_plain);
    cr_assert_lt(m_all, m_half);
    /* one recomputed block of two: its arena is the size of what it drops */
    cr_assert_leq(m_half, m_plain);
    cr_assert_gt(all.g->memory.recompute_saved, all.g->memory.recompute);
    for (int r = 0; r < 3; r++)
        engine_close(runs[r]);
}

/* The same for a Llama (tests/config/tiny_llama.lua): RMSNorm, rotary
 * embeddings, grouped-query attention and SwiGLU recomputed in backward
 * give bitwise the gradients of the plain graph, with less memory. */
Test(recompute, llama_gradients_are_bitwise_identical_and_memory_falls, .init = environment)
{
    enum { B = 3, T = 8, V = 37 };
    const char *every_block[] = {"model.recompute=1"};
    struct engine plain, all;
    engine_open(&plain, CONFIG_DIR "tiny_llama.lua", B);
    engine_open_with(&all, CONFIG_DIR "tiny_llama.lua", B, every_block, 1);
    struct engine *runs[] = {&plain, &all};
    for (int r = 0; r < 2; r++)
        fixed_token_gradients(runs[r], B * T, V);
    double norm = 0;
    for (size_t i = 0; i < plain.g->n_params; i++)
        norm += (double)plain.g->grads[i] * plain.g->grads[i];
    cr_assert_gt(norm, 0, "the llama's gradients are all zero");
    cr_assert_arr_eq(all.g->grads, plain.g->grads, plain.g->n_params * sizeof(float),
                     "llama gradients with every block recomputed differ");
    cr_assert_lt(tr_graph_memory_total(&all.g->memory), tr_graph_memory_total(&plain.g->memory));
    for (int r = 0; r < 2; r++)
        engine_close(runs[r]);
}

/* A backend that runs every op but attention, as a device lacking one would
 * say through supports_op. */
static int no_attention(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    (void)g;
    return n->op != TR_OP_ATTENTION;
}

/* The graph is checked against the backend before anything is planned: an op
 * the device does not run is refused with the op, the node and the device. */
Test(engine, plan_refuses_an_op_the_backend_does_not_support, .init = environment)
{
    tr_err err = {{0}};
    struct tr_config cfg;
    cr_assert_eq(tr_config_load(&cfg, CONFIG_DIR "tiny_gpt.lua", NULL, 0, &err), TR_OK, "%s",
                 err.msg);
    struct tr_backend be;
    cr_assert_eq(tr_cpu_backend_init(&be, 1), 0);
    cr_assert_not_null(be.iface->supports_op, "the cpu backend answers supports_op");
    struct tr_backend_iface partial = *be.iface;
    partial.name = "partial";
    partial.supports_op = no_attention;
    const struct tr_backend_iface *cpu = be.iface;

    struct tr_graph *g = tr_model_build(cfg.recipe, 2, &err);
    cr_assert_not_null(g, "%s", err.msg);
    be.iface = &partial;
    cr_assert_eq(tr_graph_plan(g, &be, 2, &err), TR_ERROR);
    cr_assert_not_null(strstr(err.msg, "device \"partial\" cannot run attention '"), "%s", err.msg);
    cr_assert_null(g->params, "nothing is allocated for a refused graph");
    tr_graph_free(g, NULL);

    /* the CPU kernels read fp32 parameters (activations may be 16-bit, the
     * planner decides): a parameter stored in bf16 is refused, not misread */
    g = tr_model_build(cfg.recipe, 2, &err);
    cr_assert_not_null(g, "%s", err.msg);
    be.iface = cpu;
    cr_assert_eq(g->tensors[g->nodes[0].in[0]].role, TR_ROLE_PARAM);
    g->tensors[g->nodes[0].in[0]].dtype = TR_BF16;
    cr_assert_eq(tr_graph_plan(g, &be, 2, &err), TR_ERROR);
    cr_assert_not_null(strstr(err.msg, "device \"cpu\" cannot run "), "%s", err.msg);
    tr_graph_free(g, NULL);

    tr_cpu_backend_free(&be);
    tr_config_free(&cfg);
}

/* Optimizers are described once: the state tr_optimizer_init allocates, the
 * memory plan counts and checkpoints name is the descriptor's. */
Test(engine, optimizer_state_follows_its_descriptor)
{
    cr_assert_eq(tr_optimizer_find("adamw")->state_slots, 2);
    cr_assert_eq(tr_optimizer_find("sgd")->state_slots, 1);
    cr_assert_null(tr_optimizer_find("lion"));
    struct tr_backend be;
    cr_assert_eq(tr_cpu_backend_init(&be, 1), 0);
    struct tr_graph g = {0};
    for (int i = 0; tr_optimizers[i]; i++) {
        const struct tr_optimizer_desc *d = tr_optimizers[i];
        cr_assert(d->state_slots >= 1 && d->state_slots <= TR_OPTIMIZER_MAX_SLOTS, "%s", d->name);
        struct tr_optimizer_config cfg = {.type = d->name};
        struct tr_optimizer o;
        tr_err err = {{0}};
        struct tr_shard shard;
        tr_shard_init(&shard, 40, 40, 1, 2, TR_SHARD_OPTIMIZER); /* parameters [20, 40) */
        cr_assert_eq(tr_optimizer_init(&o, &cfg, &g, &be, &shard, &err), TR_OK, "%s", err.msg);
        cr_assert_eq(o.owned, 20);
        cr_assert_eq(o.desc, d);
        for (int k = 0; k < TR_OPTIMIZER_MAX_SLOTS; k++) {
            cr_assert_eq(o.state[k] != NULL, k < d->state_slots, "%s slot %d", d->name, k);
            cr_assert_eq(k >= d->state_slots || d->state_names[k] != NULL, 1);
        }
        tr_optimizer_free(&o, &be);
    }
    struct tr_optimizer_config lion = {.type = "lion"};
    struct tr_optimizer o;
    tr_err err = {{0}};
    cr_assert_eq(tr_optimizer_init(&o, &lion, &g, &be, NULL, &err), TR_ERROR);
    cr_assert_not_null(strstr(err.msg, "lion"), "%s", err.msg);
    /* the choices named are the table's, and optimizer.type's are too */
    int n = 0;
    for (; tr_optimizers[n]; n++) {
        cr_assert_not_null(strstr(err.msg, tr_optimizers[n]->name), "%s", err.msg);
        cr_assert_eq(tr_optimizer_names[n], tr_optimizers[n]->name);
    }
    cr_assert_null(tr_optimizer_names[n]);
    tr_optimizer_free(&o, &be);
    tr_cpu_backend_free(&be);
}

/* The step hands each descriptor's state slots to its update, at the
 * offset of each run it updates: rank 1 of 2 in units of 4 of 8
 * parameters owns [2, 4) and [6, 8) (shard.h), the first within the
 * decayed ones [0, 4), the second not; its state holds them one after the
 * other.  After one step from zero state, AdamW's slot 0 is (1 - beta1) g
 * and slot 1 (1 - beta2) g^2; SGD's slot 0 is g + weight_decay p;
 * parameters of other ranks stay put. */
Test(engine, optimizer_step_updates_the_descriptors_slots)
{
    struct tr_backend be;
    cr_assert_eq(tr_cpu_backend_init(&be, 1), 0);
    for (int i = 0; tr_optimizers[i]; i++) {
        const struct tr_optimizer_desc *d = tr_optimizers[i];
        float params[8], grads[8];
        for (int k = 0; k < 8; k++) {
            params[k] = 1.0f + 0.125f * (float)k;
            grads[k] = 0.5f - 0.25f * (float)k;
        }
        struct tr_graph g = {.params = params, .grads = grads, .n_params = 8, .n_decay = 4};
        struct tr_optimizer_config cfg = {.type = d->name, .lr = 0.01, .weight_decay = 0.5,
                                          .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                          .momentum = 0.9};
        struct tr_optimizer o;
        tr_err err = {{0}};
        struct tr_shard shard;
        tr_shard_init(&shard, 8, 4, 1, 2, TR_SHARD_GRADIENTS);
        cr_assert_eq(tr_optimizer_init(&o, &cfg, &g, &be, &shard, &err), TR_OK, "%s", err.msg);
        cr_assert_eq(o.owned, 4);
        tr_optimizer_step(&o, &g, &be, 2.0, cfg.lr);
        for (int k = 0; k < 8; k++) {
            float p0 = 1.0f + 0.125f * (float)k, gk = 2.0f * grads[k];
            int at = k < 4 ? k - 2 : k - 6 + 2; /* where the state of parameter k is */
            if (k < 2 || (k >= 4 && k < 6)) {
                cr_assert_eq(params[k], p0, "%s: parameter %d is rank 0's", d->name, k);
                continue;
            }
            cr_assert_neq(params[k], p0, "%s: parameter %d", d->name, k);
            const float *s0 = o.state[0] + at;
            if (d->update == TR_UPDATE_ADAMW) {
                cr_assert_float_eq(*s0, 0.1f * gk, 1e-6, "%s slot 0 at %d", d->name, k);
                cr_assert_float_eq(o.state[1][at], 0.01f * gk * gk, 1e-6, "%s slot 1 at %d",
                                   d->name, k);
            } else {
                float wd = k < 4 ? 0.5f : 0.0f;
                cr_assert_float_eq(*s0, gk + wd * p0, 1e-6, "%s slot 0 at %d", d->name, k);
            }
        }
        tr_optimizer_free(&o, &be);
    }
    tr_cpu_backend_free(&be);
}

/* Two optimizers of one kind over equal parameters (1 + k/8, the first 4
 * decayed) and the same gradients: a updates in place, b offloaded to the
 * host backend in chunks of 3 floats (so chunks end inside and at the
 * decay boundary at 4, and the worker has several in flight). */
enum { PAIR_MAX = 12 };
struct offload_pair {
    int n;
    float pa[PAIR_MAX], pb[PAIR_MAX], grads[PAIR_MAX];
    struct tr_graph ga, gb;
    struct tr_optimizer_config cfg;
    struct tr_optimizer a, b;
};

static void pair_init(struct offload_pair *p, const struct tr_optimizer_desc *d, int n,
                      const struct tr_shard *shard, struct tr_backend *be, struct tr_backend *host)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    for (int k = 0; k < n; k++)
        p->pa[k] = p->pb[k] = 1.0f + 0.125f * (float)k;
    p->ga = (struct tr_graph){.params = p->pa, .grads = p->grads, .n_params = (size_t)n,
                              .n_decay = 4};
    p->gb = (struct tr_graph){.params = p->pb, .grads = p->grads, .n_params = (size_t)n,
                              .n_decay = 4};
    p->cfg = (struct tr_optimizer_config){.type = d->name, .lr = 0.01, .weight_decay = 0.5,
                                          .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                          .momentum = 0.9};
    tr_err err = {{0}};
    cr_assert_eq(tr_optimizer_init(&p->a, &p->cfg, &p->ga, be, shard, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_optimizer_init(&p->b, &p->cfg, &p->gb, be, shard, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_optimizer_offload(&p->b, be, host, 3, &err), TR_OK, "%s", err.msg);
}

/* Step `step`'s gradients, one update of each: the same parameters after. */
static void pair_step(struct offload_pair *p, struct tr_backend *be, int step, double lr,
                      const char *what)
{
    for (int k = 0; k < p->n; k++)
        p->grads[k] = 0.5f - 0.25f * (float)k + 0.1f * (float)step;
    tr_optimizer_step(&p->a, &p->ga, be, 2.0, lr);
    tr_optimizer_step(&p->b, &p->gb, be, 2.0, lr);
    cr_assert_eq(memcmp(p->pa, p->pb, (size_t)p->n * sizeof(float)), 0,
                 "%s: parameters after step %d", what, step + 1);
}

static void pair_free(struct offload_pair *p, struct tr_backend *be)
{
    tr_optimizer_free(&p->a, be);
    tr_optimizer_free(&p->b, be);
}

/* parallel.offload = "optimizer": the state on the host, updated there by a
 * second backend in chunks (offload_pair), gives the same parameters and
 * state, bit for bit, as the update in place when both backends are the
 * CPU's; a resume's new weights (params_changed) are read back before the
 * next update. */
Test(engine, offloaded_optimizer_matches_the_one_in_place)
{
    struct tr_backend be, host;
    cr_assert_eq(tr_cpu_backend_init(&be, 1), 0);
    cr_assert_eq(tr_cpu_backend_init(&host, 1), 0);
    static struct offload_pair p;
    for (int i = 0; tr_optimizers[i]; i++) {
        const struct tr_optimizer_desc *d = tr_optimizers[i];
        enum { N = 10 };
        pair_init(&p, d, N, NULL, &be, &host);
        cr_assert_eq(tr_optimizer_state_backend(&p.b, &be), &host);
        cr_assert_eq(tr_optimizer_state_backend(&p.a, &be), &be);
        for (int step = 0; step < 4; step++) {
            if (step == 2) { /* a resume writes other weights into both */
                for (int k = 0; k < N; k++)
                    p.pa[k] = p.pb[k] = 2.0f - 0.0625f * (float)k;
                tr_optimizer_params_changed(&p.b);
            }
            pair_step(&p, &be, step, p.cfg.lr * (step + 1), d->name);
            for (int s = 0; s < d->state_slots; s++)
                cr_assert_eq(memcmp(p.a.state[s], p.b.state[s], N * sizeof(float)), 0,
                             "%s: slot %d after step %d", d->name, s, step + 1);
        }
        cr_assert_eq(p.a.applied, p.b.applied);
        pair_free(&p, &be);
    }
    /* under a shard level each rank offloads its own parts: 2 ranks, units
     * of 4 over 10 floats (the last rank's last part shorter), the host
     * keeping the packed state and master copy of the owned floats only */
    for (int i = 0; tr_optimizers[i]; i++) {
        const struct tr_optimizer_desc *d = tr_optimizers[i];
        for (int rank = 0; rank < 2; rank++) {
            enum { N = 10 };
            struct tr_shard shard;
            tr_shard_init(&shard, N, 4, rank, 2, TR_SHARD_GRADIENTS);
            pair_init(&p, d, N, &shard, &be, &host);
            char what[64];
            snprintf(what, sizeof what, "%s rank %d", d->name, rank);
            for (int step = 0; step < 3; step++) {
                pair_step(&p, &be, step, p.cfg.lr, what);
                for (int s = 0; s < d->state_slots; s++)
                    cr_assert_eq(memcmp(p.a.state[s], p.b.state[s], p.a.owned * sizeof(float)), 0,
                                 "%s: slot %d after step %d", what, s, step + 1);
            }
            int owned[N] = {0}; /* this rank's parameters change, the other's do not */
            for (size_t u = 0; u < shard.n_units; u++) {
                struct tr_shard_run r = tr_shard_part(&shard, u, rank);
                for (size_t k = r.begin; k < r.end; k++)
                    owned[k] = 1;
            }
            for (int k = 0; k < N; k++)
                cr_assert_eq(p.pb[k] != 1.0f + 0.125f * (float)k, owned[k], "%s: parameter %d",
                             what, k);
            pair_free(&p, &be);
        }
    }
    /* a pipeline stage's optimizer (runs of its own, across the decay
     * boundary at 4): offloaded, the same update of those runs as in place,
     * and nothing else written, the host's state included */
    for (int i = 0; tr_optimizers[i]; i++) {
        const struct tr_optimizer_desc *d = tr_optimizers[i];
        enum { N = 12 };
        struct tr_shard_run runs[2] = {{2, 6}, {9, 11}};
        tr_err err = {{0}};
        pair_init(&p, d, N, NULL, &be, &host);
        cr_assert_eq(tr_optimizer_only(&p.a, runs, 2, &err), TR_OK, "%s", err.msg);
        cr_assert_eq(tr_optimizer_only(&p.b, runs, 2, &err), TR_OK, "%s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "%s stage", d->name);
        for (int step = 0; step < 3; step++)
            pair_step(&p, &be, step, p.cfg.lr, what);
        for (int k = 0; k < N; k++) {
            int mine = (k >= 2 && k < 6) || (k >= 9 && k < 11);
            cr_assert_eq(p.pb[k] != 1.0f + 0.125f * (float)k, mine, "%s: parameter %d", what, k);
            for (int s = 0; s < d->state_slots; s++)
                cr_assert_eq(p.b.state[s][k] != 0.0f, mine, "%s: slot %d at %d", what, s, k);
        }
        pair_free(&p, &be);
    }
    tr_cpu_backend_free(&host);
    tr_cpu_backend_free(&be);
}

/* parallel.offload overlapped with the next forward: after the step the
 * device's parameters are still the old ones (the worker updates on the
 * host; only the trainer's thread uploads); the forward's node hook brings
 * up what each node reads before it runs; after the forward, and after
 * tr_optimizer_settle, every parameter is what the update within the step
 * gives, bit for bit.  Chunks of 7 floats: hundreds, read in the forward's
 * order (the embeddings first, the tied head's last). */
Test(engine, offload_overlapped_with_the_forward_matches_the_step, .init = environment)
{
    struct engine a, b;
    engine_open(&a, CONFIG_DIR "tiny_gpt.lua", 2);
    engine_open(&b, CONFIG_DIR "tiny_gpt.lua", 2);
    struct tr_backend host;
    cr_assert_eq(tr_cpu_backend_init(&host, 1), 0);
    tr_graph_init_params(a.g, &a.be, 5);
    tr_graph_init_params(b.g, &b.be, 5);
    size_t n = a.g->n_params;
    struct tr_optimizer oa, ob;
    tr_err err = {{0}};
    cr_assert_eq(tr_optimizer_init(&oa, &a.cfg.optimizer, a.g, &a.be, NULL, &err), TR_OK);
    cr_assert_eq(tr_optimizer_init(&ob, &b.cfg.optimizer, b.g, &b.be, NULL, &err), TR_OK);
    cr_assert_eq(tr_optimizer_offload(&oa, &a.be, &host, 7, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_optimizer_offload(&ob, &b.be, &host, 7, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_optimizer_offload_overlap(&ob, b.g, &b.be, NULL, &err), TR_OK, "%s", err.msg);
    cr_assert(isnan(tr_optimizer_offload_waited(&oa)));
    float *before = malloc(n * sizeof(float));
    for (int step = 0; step < 4; step++) {
        struct engine *e[2] = {&a, &b};
        for (int k = 0; k < 2; k++) {
            struct tr_graph *g = e[k]->g;
            int32_t *tok = g->tensors[g->inputs[0]].data, *tg = g->tensors[g->inputs[1]].data;
            for (size_t i = 0; i < g->tensors[g->inputs[0]].numel; i++) {
                tok[i] = (int32_t)((i * 7 + (size_t)step * 3) % 37);
                tg[i] = (int32_t)((i * 5 + 1 + (size_t)step) % 37);
            }
            memset(g->grads, 0, n * sizeof(float));
            tr_graph_forward(g, &e[k]->be);
        }
        cr_assert_eq(memcmp(a.g->params, b.g->params, n * sizeof(float)), 0,
                     "step %d: the forward read other parameters", step);
        cr_assert_eq(loss_of(a.g), loss_of(b.g), "step %d: loss %.9g against %.9g", step,
                     loss_of(a.g), loss_of(b.g));
        tr_graph_backward(a.g, &a.be);
        tr_graph_backward(b.g, &b.be);
        tr_optimizer_step(&oa, a.g, &a.be, 1.0, a.cfg.optimizer.lr);
        memcpy(before, b.g->params, n * sizeof(float));
        tr_optimizer_step(&ob, b.g, &b.be, 1.0, b.cfg.optimizer.lr);
        cr_assert_eq(memcmp(before, b.g->params, n * sizeof(float)), 0,
                     "step %d: parameters uploaded before the next forward asked", step);
        cr_assert_neq(memcmp(a.g->params, b.g->params, n * sizeof(float)), 0);
        if (step == 3) { /* what a checkpoint does: every part up */
            tr_optimizer_settle(&ob);
            cr_assert_eq(memcmp(a.g->params, b.g->params, n * sizeof(float)), 0,
                         "settled: other parameters than the step's");
        }
    }
    cr_assert_geq(tr_optimizer_offload_waited(&ob), 0);
    cr_assert_gt(tr_optimizer_offload_busy(&ob), 0);
    free(before);
    tr_optimizer_free(&oa, &a.be);
    tr_optimizer_free(&ob, &b.be);
    cr_assert_null(b.g->before_node, "the hook outlived the optimizer");
    tr_cpu_backend_free(&host);
    engine_close(&a);
    engine_close(&b);
}

/* The shard layout (shard.h): units a multiple of the world, equal parts,
 * the last rank the leftover of the last unit; every float owned once. */
Test(engine, shard_layout_covers_each_float_once)
{
    size_t ns[] = {0, 1, 7, 8, 1885, 4096, 10007};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int world = 1; world <= 4; world++)
            for (size_t unit = 1; unit <= 5000; unit = unit * 3 + 1) {
                struct tr_shard s;
                tr_shard_init(&s, ns[a], unit, 0, world, TR_SHARD_GRADIENTS);
                cr_assert_eq(s.unit % (size_t)world, 0);
                size_t total = 0, next = 0;
                for (size_t u = 0; u < s.n_units; u++)
                    for (int q = 0; q < world; q++) {
                        struct tr_shard_run p = tr_shard_part(&s, u, q);
                        cr_assert_eq(p.begin, next, "n %zu world %d unit %zu: u %zu q %d", ns[a],
                                     world, unit, u, q);
                        next = p.end;
                        total += p.end - p.begin;
                        if (q < world - 1)
                            cr_assert_eq(p.end - p.begin, tr_shard_part_len(&s, u));
                    }
                cr_assert_eq(total, ns[a]);
                cr_assert_eq(next, ns[a]);
                size_t owned = 0;
                for (int q = 0; q < world; q++)
                    owned += tr_shard_owned(&s, q);
                cr_assert_eq(owned, ns[a]);
            }
}

/* ---- loss masks (instruction data) ----------------------------------------- */

/* B one-sample shards DIR/NAME_b.bin of T + 1 tokens each (tokens b*T ..
 * b*T + T - 1, then `last`, which a window of T reads only as a target),
 * TRTOKENS version 2 with the loss mask trained[] or version 1 without. */
static void write_sample_shards(const char *dir, const char *name, int B, int T,
                                const int32_t *tokens, const int *trained, int32_t last,
                                int masked)
{
    for (int b = 0; b < B; b++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s_%d.bin", dir, name, b);
        unsigned char h[TR_TOKENS_HEADER_BYTES], mask[16] = {0};
        struct tr_tokens_header th = {masked ? TR_TOKENS_VERSION_FLAGS : TR_TOKENS_VERSION, 2,
                                      (uint64_t)T + 1, 37, masked ? TR_TOKENS_LOSS_MASK : 0, 0};
        tr_tokens_header_write(h, &th);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f, "cannot write %s", path);
        cr_assert_eq(fwrite(h, 1, sizeof h, f), sizeof h);
        for (int i = 0; i <= T; i++) {
            int32_t id = i == T ? last : tokens[b * T + i];
            unsigned char le[2] = {(unsigned char)(id & 0xff), (unsigned char)(id >> 8)};
            cr_assert_eq(fwrite(le, 1, 2, f), 2);
            if (trained[b * (T + 1) + i])
                mask[i / 8] |= (unsigned char)(1u << (i % 8));
        }
        if (masked)
            cr_assert_eq(fwrite(mask, 1, tr_tokens_mask_bytes((uint64_t)T + 1), f),
                         tr_tokens_mask_bytes((uint64_t)T + 1));
        fclose(f);
    }
}

/* tiny_gpt's model reading DIR/NAME_*.bin through the tokens data plugin:
 * one batch of all B samples, forward and backward; the gradients (n_params
 * floats, malloc'd) and the targets the plugin gave. */
static float *masked_batch_gradients(const char *dir, const char *name, int B, int T,
                                     int32_t *targets, float *loss)
{
    char recipe[512], text[1024];
    snprintf(recipe, sizeof recipe, "%s/%s.lua", dir, name);
    snprintf(text, sizeof text,
             "return {\n"
             "  model = gpt { vocab = 37, ctx = %d, layers = 2, heads = 2, dim = 16 },\n"
             "  data = { plugin = \"tokens\", train = \"%s/%s_*.bin\", val_fraction = 0 },\n"
             "}\n", T, dir, name);
    FILE *f = fopen(recipe, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, recipe, NULL, 0, B, 1, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_config_create_slot(&e.cfg, &e.cfg.data, (uint32_t)T, &err), TR_OK, "%s",
                 err.msg);
    const struct tr_data_vtable *vt = e.cfg.data.plugin->info->vtable;
    uint64_t indices[16];
    cr_assert_leq(B, 16);
    for (int b = 0; b < B; b++)
        indices[b] = (uint64_t)b;
    struct tr_graph *g = e.g;
    cr_assert_eq(vt->read(e.cfg.data.self, TR_SPLIT_TRAIN, indices, (size_t)B,
                          g->tensors[g->inputs[0]].data, g->tensors[g->inputs[1]].data, &err),
                 TR_OK, "%s", err.msg);
    memcpy(targets, g->tensors[g->inputs[1]].data, sizeof(int32_t) * (size_t)(B * T));
    tr_graph_init_params(g, &e.be, 11);
    memset(g->grads, 0, g->n_params * sizeof(float));
    tr_graph_forward(g, &e.be);
    *loss = loss_of(g);
    g->loss_grad = 1.0f;
    tr_graph_backward(g, &e.be);
    float *grads = malloc(g->n_params * sizeof(float));
    memcpy(grads, g->grads, g->n_params * sizeof(float));
    engine_close(&e);
    return grads;
}

/* A target the loss mask does not train on contributes nothing to the
 * gradient: through the tokens plugin (which reads it as -1) and the
 * cross-entropy (which ignores -1), the gradients with token A or token B
 * there are bitwise identical.  Unmasked, A and B give different gradients,
 * and so does the mask itself. */
Test(loss_mask, masked_targets_contribute_nothing_to_the_gradient, .init = environment)
{
    enum { B = 3, T = 8, V = 37, A = 5, Bt = 29 };
    const char *base = getenv("TMPDIR");
    char dirbuf[512];
    snprintf(dirbuf, sizeof dirbuf, "%s/trmask-XXXXXX", base ? base : "/tmp");
    cr_assert_not_null(mkdtemp(dirbuf), "mkdtemp: %s", strerror(errno));
    int32_t tokens[B * T];
    int trained[B * (T + 1)];
    for (int i = 0; i < B * T; i++)
        tokens[i] = (i * 7 + 3) % V;
    for (int i = 0; i < B * (T + 1); i++)
        trained[i] = i % (T + 1) >= 2 + i / (T + 1); /* a prompt of 2, 3, 4 tokens */
    for (int b = 0; b < B; b++)
        trained[b * (T + 1) + T] = 0; /* the last target of every sample: masked */

    write_sample_shards(dirbuf, "ma", B, T, tokens, trained, A, 1);
    write_sample_shards(dirbuf, "mb", B, T, tokens, trained, Bt, 1);
    write_sample_shards(dirbuf, "ua", B, T, tokens, trained, A, 0);
    write_sample_shards(dirbuf, "ub", B, T, tokens, trained, Bt, 0);
    int32_t tma[B * T], tmb[B * T], tua[B * T], tub[B * T];
    float lma, lmb, lua, lub;
    float *gma = masked_batch_gradients(dirbuf, "ma", B, T, tma, &lma);
    float *gmb = masked_batch_gradients(dirbuf, "mb", B, T, tmb, &lmb);
    float *gua = masked_batch_gradients(dirbuf, "ua", B, T, tua, &lua);
    float *gub = masked_batch_gradients(dirbuf, "ub", B, T, tub, &lub);

    /* the plugin's targets: -1 exactly where the mask says, else the next token */
    for (int b = 0; b < B; b++)
        for (int k = 0; k < T; k++) {
            int i = b * T + k;
            int32_t next = k + 1 < T ? tokens[i + 1] : A;
            cr_assert_eq(tma[i], trained[b * (T + 1) + k + 1] ? next : -1, "target %d", i);
            cr_assert_eq(tua[i], next, "unmasked target %d", i);
        }
    struct engine probe;
    engine_open(&probe, CONFIG_DIR "tiny_gpt.lua", B);
    size_t n = probe.g->n_params;
    engine_close(&probe);

    cr_assert_eq(lma, lmb, "the masked token changed the loss: %.9g vs %.9g", lma, lmb);
    cr_assert_arr_eq(gma, gmb, n * sizeof(float),
                     "the masked target token changed the gradient");
    cr_assert_neq(lua, lub, "unmasked, the last target counts");
    cr_assert_gt(tensor_error(gua, gub, n), 1e-3, "unmasked, A and B give other gradients");
    cr_assert_gt(tensor_error(gma, gua, n), 1e-3, "the mask changes the gradient");
    free(gma);
    free(gmb);
    free(gua);
    free(gub);
    tr_test_remove_tree(dirbuf);
}

/* ---- 16-bit activation storage ------------------------------------------------- */

/* recipe's model planned with `compute` as the precision policy's GEMM
 * dtype: a 16-bit one stores the activations in it (graph.c) */
static void engine_open_compute_with(struct engine *e, const char *recipe, int batch,
                                     enum tr_dtype compute, const char *const *overrides, int n)
{
    tr_err err = {{0}};
    memset(e, 0, sizeof *e);
    cr_assert_eq(tr_config_load(&e->cfg, recipe, overrides, n, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_cpu_backend_init(&e->be, 0), 0);
    e->g = tr_model_build(e->cfg.recipe, batch, &err);
    cr_assert_not_null(e->g, "%s", err.msg);
    e->g->compute = compute;
    cr_assert_eq(tr_graph_plan(e->g, &e->be, 2, &err), TR_OK, "%s", err.msg);
}

static void engine_open_compute(struct engine *e, const char *recipe, int batch,
                                enum tr_dtype compute)
{
    engine_open_compute_with(e, recipe, batch, compute, NULL, 0);
}

/* the tensor cross-entropy reads (the logits) */
static int loss_input(const struct tr_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TR_OP_CROSS_ENTROPY)
            return g->nodes[i].in[0];
    return -1;
}

/* Every activation but the logits and the loss is stored in `half`, the
 * rest keeps its dtype, and the plan counts 2 bytes for each. */
static void expect_half_storage(const struct engine *e16, const struct engine *e32,
                                enum tr_dtype half, const char *who)
{
    const struct tr_graph *g = e16->g;
    size_t bytes16 = 0, bytes32 = 0;
    int halves = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i], *t32 = &e32->g->tensors[i];
        cr_assert_eq(t32->dtype, t->role == TR_ROLE_INPUT ? t32->dtype : TR_F32,
                     "%s: fp32 plan stores %s in 16 bits", who, t->name);
        if (t->role != TR_ROLE_ACTIVATION) {
            cr_assert_eq(t->dtype, t32->dtype, "%s: %s changed dtype", who, t->name);
            continue;
        }
        int fp32 = i == g->loss || i == g->logits || i == loss_input(g);
        cr_assert_eq(t->dtype, fp32 ? TR_F32 : half, "%s: activation %s stored as dtype %d", who,
                     t->name, (int)t->dtype);
        halves += !fp32;
        bytes16 += (t->numel * (fp32 ? 4 : 2) + 63) & ~(size_t)63;
        bytes32 += (t->numel * 4 + 63) & ~(size_t)63;
    }
    cr_assert_gt(halves, 10, "%s: only %d activations in 16 bits", who, halves);
    /* at most each activation's own slot: those no backward reads share
     * memory along their forward spans (graph_plan.c) */
    cr_assert_leq(g->memory.activations, bytes16, "%s: plan counts %zu activation bytes, over %zu",
                  who, g->memory.activations, bytes16);
    cr_assert_leq(e32->g->memory.activations, bytes32);
    cr_assert_lt(g->memory.activations, e32->g->memory.activations, "%s: 16-bit storage saves "
                 "nothing", who);
    /* gradients stay fp32: their arena does not shrink */
    cr_assert_eq(g->memory.activation_grads, e32->g->memory.activation_grads, "%s", who);
    /* the CPU backend's bf16 copy of the parameters, which its native bf16
     * GEMMs read, is counted where it will exist (2 bytes a parameter, whole
     * 64-byte lines) and nowhere else */
    size_t copy = half == TR_BF16 && tr_cpu_bf16_native_isa() != NULL
                      ? (g->n_params * 2 + 63) & ~(size_t)63
                      : 0;
    cr_assert_eq(g->memory.param_copies, copy, "%s: plan counts %zu bytes of parameter copies, "
                 "not %zu", who, g->memory.param_copies, copy);
    cr_assert_eq(e32->g->memory.param_copies, 0, "%s: an fp32 plan counts parameter copies", who);
}

/* Gradients of the tiny GPT and the tiny Llama with activations stored in
 * bf16 (and fp16), against the same models in fp32: within what rounding
 * every stored activation to 8 (11) significant bits allows, and not equal
 * (the rounding happened). */
static void half_gradients(const char *recipe, enum tr_dtype half, double tolerance, const char *who)
{
    enum { B = 3, T = 8, V = 37 };
    struct engine e32, e16;
    engine_open_compute(&e32, recipe, B, TR_F32);
    engine_open_compute(&e16, recipe, B, half);
    expect_half_storage(&e16, &e32, half, who);
    fixed_token_gradients(&e32, B * T, V);
    fixed_token_gradients(&e16, B * T, V);
    float l32 = *(float *)e32.g->tensors[e32.g->loss].data;
    float l16 = *(float *)e16.g->tensors[e16.g->loss].data;
    cr_assert(fabsf(l16 - l32) <= tolerance * fabsf(l32), "%s: loss %.6f, fp32 %.6f", who,
              (double)l16, (double)l32);
    double worst = 0;
    for (int i = 0; i < e32.g->n_tensors; i++) {
        const struct tr_tensor *t = &e32.g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        double err = tensor_error(e16.g->tensors[i].grad, t->grad, t->numel);
        cr_assert_leq(err, tolerance, "%s: gradient of %s: relative error %.3g > %.3g", who,
                      t->name, err, tolerance);
        worst = fmax(worst, err);
    }
    cr_log_info("%s: worst relative gradient error %.3g (tolerance %.3g)", who, worst, tolerance);
    cr_assert_gt(worst, 0, "%s: gradients bitwise fp32's: nothing was rounded", who);
    engine_close(&e32);
    engine_close(&e16);
}

Test(half_activations, gpt_gradients_within_bf16_of_fp32, .init = environment)
{
    half_gradients(CONFIG_DIR "tiny_gpt.lua", TR_BF16, 3e-2, "tiny GPT, bf16");
}

Test(half_activations, llama_gradients_within_bf16_of_fp32, .init = environment)
{
    half_gradients(CONFIG_DIR "tiny_llama.lua", TR_BF16, 3e-2, "tiny Llama, bf16");
}

Test(half_activations, gpt_gradients_within_fp16_of_fp32, .init = environment)
{
    half_gradients(CONFIG_DIR "tiny_gpt.lua", TR_F16, 5e-3, "tiny GPT, fp16");
}

/* What a stored activation holds: the fp32 result of its op on the stored
 * (16-bit) inputs, rounded once.  The embedding's rows and the first layer
 * norm's output, recomputed by hand with the fp32 kernel, bit for bit. */
Test(half_activations, stores_the_fp32_result_rounded_once, .init = environment)
{
    enum { B = 3, T = 8, V = 37 };
    struct engine e;
    engine_open_compute(&e, CONFIG_DIR "tiny_gpt.lua", B, TR_BF16);
    fixed_token_gradients(&e, B * T, V);
    struct tr_graph *g = e.g;
    int checked = 0;
    for (int i = 0; i < g->n_nodes && checked < 2; i++) {
        const struct tr_node *n = &g->nodes[i];
        const struct tr_tensor *out = &g->tensors[n->out];
        if (n->op != TR_OP_EMBEDDING && n->op != TR_OP_LAYERNORM)
            continue;
        if (n->op == TR_OP_EMBEDDING && i > 0)
            continue;
        cr_assert_eq(out->dtype, TR_BF16, "%s stored as dtype %d", out->name, (int)out->dtype);
        size_t C = (size_t)out->shape[out->ndim - 1], rows = out->numel / C;
        float *want = calloc(out->numel, sizeof *want);
        if (n->op == TR_OP_EMBEDDING) {
            const float *table = g->tensors[n->in[0]].data;
            const int32_t *ids = g->tensors[n->in[1]].data;
            for (size_t r = 0; r < rows; r++)
                memcpy(want + r * C, table + (size_t)ids[r] * C, C * sizeof *want);
        } else {
            const struct tr_tensor *x = &g->tensors[n->in[0]];
            cr_assert_eq(x->dtype, TR_BF16);
            float *x32 = calloc(x->numel, sizeof *x32), *stats = calloc(2 * rows, sizeof *stats);
            tr_cpu_from_half(x32, x->data, x->numel, 1);
            tr_cpu_layernorm_forward(want, stats, stats + rows, x32, g->tensors[n->in[1]].data,
                                     g->tensors[n->in[2]].data, (int)rows, (int)C, n->eps);
            free(x32);
            free(stats);
        }
        uint16_t *rounded = calloc(out->numel, sizeof *rounded);
        tr_cpu_to_half(rounded, want, out->numel, 1);
        cr_assert_arr_eq(rounded, out->data, out->numel * 2,
                         "%s: the stored values are not the fp32 result rounded to bf16",
                         out->name);
        free(rounded);
        free(want);
        checked++;
    }
    cr_assert_eq(checked, 2, "found no embedding and layer norm to check");
    engine_close(&e);
}

/* The native bf16 GEMMs (oneDNN on AVX512-BF16 or AMX) read bf16
 * activations as stored; the emulation (ONEDNN_MAX_CPU_ISA=AVX2) widens
 * them and multiplies in fp32.  Same numbers in, so the linears' products
 * differ only in the order of the sums; but the native path's attention
 * also multiplies in bf16 (P, dS and dout rounded for its products), where
 * the emulation keeps them fp32.  The gradients differ by 7.9e-3 of their
 * scale (2e-7 while attention was fp32 on both): 2e-2, inside the 3e-2 that
 * bf16 gradients keep to fp32's.  The emulated side runs in a child forked
 * before anything here asked oneDNN which path runs (it decides once per
 * process). */
Test(half_activations, emulated_bf16_gemms_agree_with_native, .init = environment)
{
    enum { B = 3, T = 8, V = 37, MAX_PARAMS = 1 << 16 };
    float *shared = mmap(NULL, (MAX_PARAMS + 1) * sizeof(float), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(shared, MAP_FAILED);
    shared[0] = -1;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        struct engine e;
        engine_open_compute(&e, CONFIG_DIR "tiny_gpt.lua", B, TR_BF16);
        if (tr_cpu_bf16_native_isa() == NULL && e.g->n_params <= MAX_PARAMS) {
            fixed_token_gradients(&e, B * T, V);
            memcpy(shared + 1, e.g->grads, e.g->n_params * sizeof(float));
            shared[0] = (float)e.g->n_params;
        }
        engine_close(&e);
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the emulated side failed");
    cr_assert_geq(shared[0], 0, "ONEDNN_MAX_CPU_ISA=AVX2 did not turn the emulation on");
    if (tr_cpu_bf16_native_isa() == NULL) {
        munmap(shared, (MAX_PARAMS + 1) * sizeof(float));
        cr_skip_test("this CPU has no native bf16 GEMMs to compare the emulation with");
    }
    struct engine e;
    engine_open_compute(&e, CONFIG_DIR "tiny_gpt.lua", B, TR_BF16);
    cr_assert_eq((size_t)shared[0], e.g->n_params);
    fixed_token_gradients(&e, B * T, V);
    double worst = 0;
    for (int i = 0; i < e.g->n_tensors; i++) {
        const struct tr_tensor *t = &e.g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        double err = tensor_error(shared + 1 + t->offset, t->grad, t->numel);
        cr_assert_leq(err, 2e-2, "gradient of %s: emulated and native differ by %.3g", t->name,
                      err);
        worst = fmax(worst, err);
    }
    cr_log_info("bf16 storage: emulated against native GEMMs: worst relative gradient error %.3g",
                worst);
    engine_close(&e);
    munmap(shared, (MAX_PARAMS + 1) * sizeof(float));
}

/* ---- batch norm's running statistics (tests/config/tiny_cnn.lua) ------------ */

/* Fixed images and labels in the graph's inputs. */
static void cnn_inputs(struct tr_graph *g, int salt)
{
    struct tr_tensor *x = &g->tensors[g->inputs[0]], *y = &g->tensors[g->inputs[1]];
    float *px = x->data;
    int32_t *py = y->data;
    for (size_t i = 0; i < x->numel; i++)
        px[i] = (float)(((i * 37 + (size_t)salt * 11) % 29) / 7.0 - 2.0);
    for (size_t i = 0; i < y->numel; i++)
        py[i] = (int32_t)((i + (size_t)salt) % 3);
}

static const struct tr_node *first_batchnorm(const struct tr_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TR_OP_BATCHNORM)
            return &g->nodes[i];
    cr_assert_fail("the tiny CNN has no batch norm");
    return NULL;
}

/* Training forward moves running[2,C] by momentum toward the batch's mean
 * and unbiased variance (PyTorch's rule); an eval forward normalises with
 * running and changes nothing; a second training forward moves it again
 * (each micro-batch of an accumulated step counts, as in PyTorch). */
Test(batchnorm, running_statistics_train_and_eval, .init = environment)
{
    struct engine e;
    engine_open(&e, CONFIG_DIR "tiny_cnn.lua", 4);
    struct tr_graph *g = e.g;
    cr_assert_eq(g->n_buffers, 2 * (3 + 5), "running[2,C] of both batch norms");
    tr_graph_init_params(g, &e.be, 3);
    const struct tr_node *bn = first_batchnorm(g);
    const struct tr_tensor *x = &g->tensors[bn->in[0]], *out = &g->tensors[bn->out];
    float *running = g->tensors[bn->buffer].data;
    int C = 3;
    for (int c = 0; c < C; c++)
        cr_assert(running[c] == 0.0f && running[C + c] == 1.0f, "running starts at mean 0, variance 1");
    cnn_inputs(g, 0);
    cr_assert_eq(g->training, 1, "a graph starts in training mode");
    tr_graph_forward(g, &e.be);

    /* the batch's statistics by hand, over B x H x W rows */
    size_t rows = x->numel / (size_t)C;
    const float *px = x->data;
    double mean[3] = {0}, var[3] = {0};
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++)
            mean[c] += px[r * (size_t)C + (size_t)c] / (double)rows;
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            double d = px[r * (size_t)C + (size_t)c] - mean[c];
            var[c] += d * d;
        }
    float after_one[6];
    for (int c = 0; c < C; c++) {
        double m = 0.1 * mean[c], v = 0.9 + 0.1 * var[c] / (double)(rows - 1);
        cr_assert_float_eq(running[c], m, 1e-5 + 1e-5 * fabs(m), "running mean %d: %g, by hand %g", c,
                           running[c], m);
        cr_assert_float_eq(running[C + c], v, 1e-5 * v, "running variance %d: %g, by hand %g (unbiased)", c,
                           running[C + c], v);
    }
    memcpy(after_one, running, sizeof after_one);

    /* eval: normalised with running, which does not move */
    g->training = 0;
    tr_graph_forward(g, &e.be);
    cr_assert_arr_eq(running, after_one, sizeof after_one, "an eval forward changed the running statistics");
    const float *w = g->tensors[bn->in[1]].data, *b = g->tensors[bn->in[2]].data;
    const float *py = out->data;
    for (size_t r = 0; r < rows; r += 5)
        for (int c = 0; c < C; c++) {
            size_t i = r * (size_t)C + (size_t)c;
            double want = (px[i] - after_one[c]) / sqrt(after_one[C + c] + bn->eps) * w[c] + b[c];
            cr_assert_float_eq(py[i], want, 1e-5 + 1e-5 * fabs(want), "eval output %zu: %g, by hand %g", i,
                               py[i], want);
        }

    /* training again: a second update on the same batch */
    g->training = 1;
    tr_graph_forward(g, &e.be);
    for (int c = 0; c < C; c++) {
        double m = 0.9 * after_one[c] + 0.1 * mean[c];
        cr_assert_float_eq(running[c], m, 1e-5 + 1e-5 * fabs(m), "second update of mean %d", c);
    }
    engine_close(&e);
}

/* Backward re-runs a recomputed segment's forward with g->recomputing set:
 * the running statistics move once per forward, exactly as without
 * recomputation, and the gradients are the same bits. */
Test(batchnorm, recompute_updates_the_running_statistics_once, .init = environment)
{
    const char *every_stage[] = {"model.recompute=1"};
    struct engine plain, again;
    engine_open(&plain, CONFIG_DIR "tiny_cnn.lua", 4);
    engine_open_with(&again, CONFIG_DIR "tiny_cnn.lua", 4, every_stage, 1);
    cr_assert_gt(again.g->memory.recompute, 0, "the stages are recomputed");
    struct engine *both[] = {&plain, &again};
    for (int k = 0; k < 2; k++) {
        struct tr_graph *g = both[k]->g;
        tr_graph_init_params(g, &both[k]->be, 9);
        for (int step = 0; step < 2; step++) {
            memset(g->grads, 0, g->n_params * sizeof(float));
            cnn_inputs(g, step);
            tr_graph_forward(g, &both[k]->be);
            g->loss_grad = 1.0f;
            tr_graph_backward(g, &both[k]->be);
            cr_assert_eq(g->recomputing, 0, "recomputing is cleared after the segment");
        }
    }
    cr_assert_eq(plain.g->n_buffers, again.g->n_buffers);
    cr_assert_arr_eq(again.g->buffers, plain.g->buffers, plain.g->n_buffers * sizeof(float),
                     "recomputation moved the running statistics a second time");
    cr_assert_arr_eq(again.g->grads, plain.g->grads, plain.g->n_params * sizeof(float),
                     "recomputation changed the gradients");
    engine_close(&plain);
    engine_close(&again);
}

/* Recomputed blocks rebuild their 16-bit activations in backward from the
 * same stored inputs, rounded the same way: the gradients are bitwise those
 * of the plain bf16 graph, and the plan smaller. */
Test(half_activations, recomputed_bf16_gradients_are_bitwise_identical, .init = environment)
{
    enum { B = 3, T = 8, V = 37 };
    const char *every_block[] = {"model.recompute=1"};
    const char *recipes[] = {CONFIG_DIR "tiny_gpt.lua", CONFIG_DIR "tiny_llama.lua"};
    for (int r = 0; r < 2; r++) {
        struct engine plain, again;
        engine_open_compute(&plain, recipes[r], B, TR_BF16);
        engine_open_compute_with(&again, recipes[r], B, TR_BF16, every_block, 1);
        cr_assert_gt(again.g->memory.recompute, 0, "%s: nothing recomputed", recipes[r]);
        fixed_token_gradients(&plain, B * T, V);
        fixed_token_gradients(&again, B * T, V);
        cr_assert_arr_eq(again.g->grads, plain.g->grads, plain.g->n_params * sizeof(float),
                         "%s: bf16 gradients with every block recomputed differ", recipes[r]);
        cr_assert_lt(tr_graph_memory_total(&again.g->memory),
                     tr_graph_memory_total(&plain.g->memory));
        engine_close(&plain);
        engine_close(&again);
    }
}

/* ---- checkpoints: the same bytes through put and put_stream ---------------- */

/* A checkpoint plugin in memory: the blobs of one save.  piece: the buffer
 * put_stream fills (0: the plugin has no put_stream: its vtable ends before
 * the slot, as one built before the slot existed).  put_stream's write
 * fails past byte fail_at (0: never); it stops short_by bytes early, or
 * asks for `over` bytes past the end. */
struct mem_ckpt {
    size_t piece, fail_at, short_by, over;
    int puts, streams, committed, aborted;
    int n;
    char names[8][64];
    unsigned char *data[8];
    size_t size[8];
};

static void mem_keep(struct mem_ckpt *m, const char *blob, unsigned char *data, size_t size)
{
    cr_assert_lt(m->n, 8);
    snprintf(m->names[m->n], sizeof m->names[0], "%s", blob);
    m->data[m->n] = data;
    m->size[m->n++] = size;
}

static void mem_free(struct mem_ckpt *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->data[i]);
    m->n = 0;
}

static int mem_begin(void *self, const char *name, tr_err *err)
{
    (void)self, (void)name, (void)err;
    return TR_OK;
}

static int mem_put(void *self, const char *blob, const void *data, size_t size, tr_err *err)
{
    (void)err;
    struct mem_ckpt *m = self;
    unsigned char *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    mem_keep(m, blob, copy, size);
    m->puts++;
    return TR_OK;
}

static int mem_put_stream(void *self, const char *blob, size_t size, tr_blob_fill_fn fill,
                          void *ud, tr_err *err)
{
    struct mem_ckpt *m = self;
    cr_assert_neq(m->piece, 0, "put_stream called beyond the vtable's struct_size");
    m->streams++;
    unsigned char *out = malloc(size + m->over + 1), *buf = malloc(m->piece);
    size_t done = 0, end = size - m->short_by + m->over;
    int rc = TR_OK;
    while (rc == TR_OK && done < end) {
        size_t want = end - done < m->piece ? end - done : m->piece, got = 0;
        rc = fill(ud, buf, want, &got, err);
        if (rc != TR_OK)
            break;
        cr_assert_eq(got, size - done < want ? size - done : want, "fill gave %zu of %zu at %zu",
                     got, want, done);
        if (m->fail_at && done + got > m->fail_at)
            rc = tr_fail(err, "memory checkpoint: cannot write %s: disk full", blob);
        else
            memcpy(out + done, buf, got);
        done += got;
    }
    free(buf);
    if (rc == TR_OK)
        mem_keep(m, blob, out, done);
    else
        free(out);
    return rc;
}

static int mem_commit(void *self, tr_err *err)
{
    (void)err;
    ((struct mem_ckpt *)self)->committed = 1;
    return TR_OK;
}

static void mem_abort(void *self)
{
    struct mem_ckpt *m = self;
    m->aborted = 1;
    mem_free(m);
}

static int mem_list(void *self, void (*each)(void *ud, const char *name), void *ud, tr_err *err)
{
    (void)self, (void)each, (void)ud, (void)err;
    return TR_OK;
}

static int mem_get(void *self, const char *name, const char *blob, void **data, size_t *size,
                   tr_err *err)
{
    (void)self, (void)name, (void)blob, (void)data, (void)size;
    return tr_fail(err, "not kept");
}

static int mem_remove(void *self, const char *name, tr_err *err)
{
    (void)self, (void)name, (void)err;
    return TR_OK;
}

static const struct tr_checkpoint_vtable mem_put_only = {
    .struct_size = offsetof(struct tr_checkpoint_vtable, put_stream),
    .begin = mem_begin, .put = mem_put, .commit = mem_commit, .abort = mem_abort,
    .list = mem_list, .get = mem_get, .remove = mem_remove,
    .put_stream = mem_put_stream, /* beyond struct_size: absent */
};

static const struct tr_checkpoint_vtable mem_streaming = {
    .struct_size = sizeof(struct tr_checkpoint_vtable),
    .begin = mem_begin, .put = mem_put, .commit = mem_commit, .abort = mem_abort,
    .list = mem_list, .get = mem_get, .remove = mem_remove, .put_stream = mem_put_stream,
};

/* A synchronous save of e's parameters, buffers and the AdamW slots into m */
static int mem_save(struct engine *e, enum tr_dtype weights, float *const *slots,
                    struct mem_ckpt *m, tr_err *err)
{
    struct tr_checkpointer_config cc = {
        .vt = m->piece ? &mem_streaming : &mem_put_only, .self = m, .g = e->g, .be = &e->be,
        .optimizer = tr_optimizer_find("adamw"), .keep = 2, .weights_dtype = weights,
        .recipe = "/recipes/tiny.lua", .seed = 5,
    };
    struct tr_checkpointer *c = tr_checkpointer_open(&cc, err);
    cr_assert_not_null(c, "%s", err->msg);
    struct tr_run_state st = {.step = 3, .applied = 3, .loader_position = 6, .loss = 2.5,
                              .val_loss = NAN, .best_val_loss = NAN};
    int rc = tr_checkpointer_save_now(c, e->g->params, slots, &st, err);
    tr_checkpointer_close(c);
    return rc;
}

static const unsigned char *mem_blob(const struct mem_ckpt *m, const char *name, size_t *size)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->names[i], name) == 0) {
            *size = m->size[i];
            return m->data[i];
        }
    cr_assert_fail("no blob %s", name);
    return NULL;
}

/* The blob of g's parameters (and buffers) in base as tr_safetensors_write
 * lays it out, made here from host memory */
static void *expected_blob(const struct tr_graph *g, const float *base, enum tr_dtype dtype,
                           const char *prefix, int buffers, size_t *size)
{
    struct tr_st_entry *e = calloc((size_t)g->n_tensors, sizeof *e);
    char (*names)[128] = calloc((size_t)g->n_tensors, sizeof *names);
    uint16_t **halves = calloc((size_t)g->n_tensors, sizeof *halves);
    size_t n = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        int buffer = t->role == TR_ROLE_BUFFER;
        if (t->role != TR_ROLE_PARAM && !(buffers && buffer))
            continue;
        snprintf(names[n], sizeof names[0], "%s%s", prefix, t->name);
        const float *data = (buffer ? g->buffers : base) + t->offset;
        e[n] = (struct tr_st_entry){names[n], TR_F32, t->ndim, {0}, data, t->numel * 4};
        memcpy(e[n].shape, t->shape, sizeof t->shape);
        if (!buffer && dtype != TR_F32) {
            halves[n] = malloc(t->numel * 2 + 2);
            tr_cpu_to_half(halves[n], data, t->numel, dtype == TR_BF16);
            e[n].dtype = dtype;
            e[n].data = halves[n];
            e[n].bytes = t->numel * 2;
        }
        n++;
    }
    void *blob = tr_safetensors_write(e, n, "{\"format\":\"pt\",\"producer\":\"trainrun\"}", size);
    for (size_t i = 0; i < n; i++)
        free(halves[i]);
    free(halves);
    free(names);
    free(e);
    return blob;
}

/* A synchronous save streamed to put_stream, in pieces of 4 KiB or of 3
 * bytes (16-bit weights split across pieces), is byte for byte the save
 * put() receives whole, for weights in fp32, bf16 and fp16 and a model
 * with buffers; and the weights and moments are tr_safetensors_write's
 * layout of what the backend holds. */
Test(checkpoint, streamed_blobs_are_the_bytes_put_gets, .init = environment)
{
    const char *recipes[] = {CONFIG_DIR "tiny_gpt.lua", CONFIG_DIR "tiny_cnn.lua"};
    const enum tr_dtype weights[] = {TR_F32, TR_BF16, TR_F16};
    const char *blobs[] = {"model.safetensors", "optimizer.safetensors",
                           "optimizer2.safetensors", "state.json"};
    const struct tr_optimizer_desc *adamw = tr_optimizer_find("adamw");
    for (int r = 0; r < 2; r++) {
        struct engine e;
        engine_open(&e, recipes[r], 2);
        struct tr_graph *g = e.g;
        tr_graph_init_params(g, &e.be, 11);
        cr_assert_eq(g->n_buffers > 0, r == 1, "the CNN, and only it, has buffers");
        for (size_t i = 0; i < g->n_buffers; i++)
            g->buffers[i] = 0.25f + 0.001f * (float)i;
        float *slots[2];
        for (int k = 0; k < 2; k++) {
            slots[k] = malloc(g->n_params * sizeof(float));
            for (size_t i = 0; i < g->n_params; i++)
                slots[k][i] = (float)(k + 1) * 1e-3f * (float)((i * 7919) % 1000) - 0.3f;
        }
        for (int w = 0; w < 3; w++) {
            struct mem_ckpt whole = {0}, pieces = {.piece = 4096}, bytes = {.piece = 3};
            struct mem_ckpt *streamed[] = {&pieces, &bytes};
            tr_err err = {{0}};
            cr_assert_eq(mem_save(&e, weights[w], slots, &whole, &err), TR_OK, "%s", err.msg);
            cr_assert(whole.committed && whole.puts == 4 && whole.streams == 0);
            for (int s = 0; s < 2; s++) {
                cr_assert_eq(mem_save(&e, weights[w], slots, streamed[s], &err), TR_OK, "%s",
                             err.msg);
                cr_assert(streamed[s]->committed && streamed[s]->streams == 3 &&
                          streamed[s]->puts == 1, "the three blobs streamed, state.json put");
                for (int b = 0; b < 4; b++) {
                    size_t want_size, got_size;
                    const unsigned char *want = mem_blob(&whole, blobs[b], &want_size);
                    const unsigned char *got = mem_blob(streamed[s], blobs[b], &got_size);
                    cr_assert_eq(got_size, want_size, "%s %s", recipes[r], blobs[b]);
                    cr_assert(memcmp(got, want, want_size) == 0, "%s: %s (weights %d, pieces "
                              "of %zu) streamed differs from put's", recipes[r], blobs[b], w,
                              streamed[s]->piece);
                }
            }
            for (int b = 0; b < 3; b++) {
                size_t want_size, got_size;
                void *want = b == 0 ? expected_blob(g, g->params, weights[w], "", 1, &want_size)
                                    : expected_blob(g, slots[b - 1], TR_F32,
                                                    adamw->state_names[b - 1], 0, &want_size);
                const unsigned char *got = mem_blob(&whole, blobs[b], &got_size);
                cr_assert_eq(got_size, want_size, "%s %s", recipes[r], blobs[b]);
                cr_assert(memcmp(got, want, want_size) == 0, "%s: %s is not the safetensors "
                          "of the backend's tensors", recipes[r], blobs[b]);
                free(want);
            }
            mem_free(&whole);
            mem_free(&pieces);
            mem_free(&bytes);
        }
        for (int k = 0; k < 2; k++)
            free(slots[k]);
        engine_close(&e);
    }
}

/* A streamed save whose write fails, that stops early or reads past a
 * blob's end is not committed: aborted, with the plugin's or the core's
 * reason. */
Test(checkpoint, a_failed_stream_publishes_nothing, .init = environment)
{
    struct engine e;
    engine_open(&e, CONFIG_DIR "tiny_gpt.lua", 2);
    tr_graph_init_params(e.g, &e.be, 11);
    float *slots[2] = {calloc(e.g->n_params, sizeof(float)), calloc(e.g->n_params, sizeof(float))};
    struct {
        struct mem_ckpt m;
        const char *why;
    } cases[] = {
        {{.piece = 4096, .fail_at = 5000}, "memory checkpoint: cannot write model.safetensors: disk full"},
        {{.piece = 4096, .short_by = 1}, "the checkpoint plugin stored model.safetensors after "},
        {{.piece = 4096, .over = 1}, "the checkpoint plugin asked for more than the blob's "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tr_err err = {{0}};
        struct mem_ckpt *m = &cases[i].m;
        cr_assert_eq(mem_save(&e, TR_F32, slots, m, &err), TR_ERROR, "case %zu", i);
        cr_assert(strstr(err.msg, cases[i].why), "%s", err.msg);
        cr_assert(strstr(err.msg, "checkpoint step-0000000003 not saved (the previous one is "
                                  "still the latest)"), "%s", err.msg);
        cr_assert(!m->committed && m->aborted && m->n == 0, "case %zu", i);
    }
    free(slots[0]);
    free(slots[1]);
    engine_close(&e);
}

/* ---- gradients written by their first writer (g->grads_fresh) -------------
 * A step's first micro-batch starts its parameter gradients fresh: each
 * one's first writer in backward writes it (or the core zeroes it first),
 * and every activation gradient's first writer writes it too, so neither
 * the parameter gradients nor the activation-gradient arena are cleared
 * beforehand.  Filled with NaN first, they must come out as the zeroed-and-
 * accumulated gradients do, and a second micro-batch must add onto them. */
static void two_micro_batches(struct engine *e, int fresh, const char *recipe)
{
    struct tr_graph *g = e->g;
    tr_graph_init_params(g, &e->be, 17);
    if (fresh) {
        memset(g->grads, 0xff, g->n_params * sizeof(float)); /* NaN */
        memset(g->grad_arena, 0xff, g->memory.activation_grads);
    } else {
        memset(g->grads, 0, g->n_params * sizeof(float));
    }
    for (int k = 0; k < 2; k++) {
        if (strstr(recipe, "cnn")) {
            cnn_inputs(g, k);
        } else {
            int32_t *tokens = g->tensors[g->inputs[0]].data, *targets = g->tensors[g->inputs[1]].data;
            size_t n = g->tensors[g->inputs[0]].numel;
            for (size_t i = 0; i < n; i++) {
                tokens[i] = (int32_t)((i * 5 + 1 + (size_t)k) % 37);
                targets[i] = (int32_t)((i * 13 + 2 + 3 * (size_t)k) % 37);
            }
        }
        tr_graph_forward(g, &e->be);
        g->loss_grad = 0.5f;
        g->grads_fresh = fresh && k == 0;
        tr_graph_backward(g, &e->be);
    }
}

Test(fresh_gradients, first_writers_write_what_zeroed_buffers_accumulate, .init = environment)
{
    const char *recipes[] = {CONFIG_DIR "tiny_gpt.lua", CONFIG_DIR "tiny_llama.lua",
                             CONFIG_DIR "tiny_cnn.lua"};
    const enum tr_dtype computes[] = {TR_F32, TR_BF16};
    int written = 0;
    for (size_t r = 0; r < sizeof recipes / sizeof *recipes; r++)
        for (size_t c = 0; c < sizeof computes / sizeof *computes; c++) {
            struct engine zeroed, fresh;
            int batch = strstr(recipes[r], "cnn") ? 4 : 3;
            engine_open_compute(&zeroed, recipes[r], batch, computes[c]);
            engine_open_compute(&fresh, recipes[r], batch, computes[c]);
            for (int i = 0; i < fresh.g->n_nodes; i++)
                written += fresh.g->nodes[i].act_write_mask != 0 ||
                           fresh.g->nodes[i].param_write_mask != 0;
            two_micro_batches(&zeroed, 0, recipes[r]);
            two_micro_batches(&fresh, 1, recipes[r]);
            for (size_t i = 0; i < zeroed.g->n_params; i++)
                cr_assert(fresh.g->grads[i] == zeroed.g->grads[i],
                          "%s, %s: gradient %zu is %.9g written fresh, %.9g zeroed first",
                          recipes[r], computes[c] == TR_F32 ? "fp32" : "bf16", i,
                          (double)fresh.g->grads[i],
                          (double)zeroed.g->grads[i]);
            engine_close(&zeroed);
            engine_close(&fresh);
        }
    cr_assert_gt(written, 0, "no node writes a gradient: the CPU backend's writes_grad is unused");
}

/* An add's input that nothing else reads shares the add's output gradient
 * (graph_plan.c's grad_alias): the branch of each residual add here.  The
 * same graph on a backend that only adds gradients (its iface cut short
 * before writes_grad: the core zeroes them, so nothing can share) gets the
 * same parameter gradients, bit for bit, over two micro-batches. */
Test(fresh_gradients, an_adds_sole_reader_input_shares_its_output_gradient, .init = environment)
{
    const char *recipes[] = {CONFIG_DIR "tiny_gpt.lua", CONFIG_DIR "tiny_llama.lua"};
    const enum tr_dtype computes[] = {TR_F32, TR_BF16};
    for (size_t r = 0; r < sizeof recipes / sizeof *recipes; r++)
        for (size_t c = 0; c < sizeof computes / sizeof *computes; c++) {
            struct engine shared, apart;
            struct tr_backend_iface adds_only;
            tr_err err = {{0}};
            engine_open_compute(&shared, recipes[r], 3, computes[c]);
            memset(&apart, 0, sizeof apart);
            cr_assert_eq(tr_config_load(&apart.cfg, recipes[r], NULL, 0, &err), TR_OK, "%s",
                         err.msg);
            cr_assert_eq(tr_cpu_backend_init(&apart.be, 0), 0);
            const struct tr_backend_iface *cpu = apart.be.iface;
            adds_only = *cpu;
            adds_only.struct_size = offsetof(struct tr_backend_iface, writes_grad);
            apart.be.iface = &adds_only;
            apart.g = tr_model_build(apart.cfg.recipe, 3, &err);
            cr_assert_not_null(apart.g, "%s", err.msg);
            apart.g->compute = computes[c];
            cr_assert_eq(tr_graph_plan(apart.g, &apart.be, 2, &err), TR_OK, "%s", err.msg);
            int aliased = 0, aliased_apart = 0;
            for (int i = 0; i < shared.g->n_nodes; i++) {
                const struct tr_node *n = &shared.g->nodes[i], *m = &apart.g->nodes[i];
                for (int k = 0; n->op == TR_OP_ADD && k < n->n_in; k++) {
                    const struct tr_tensor *x = &shared.g->tensors[n->in[k]];
                    int readers = 0;
                    for (int j = 0; j < shared.g->n_nodes; j++)
                        for (int k2 = 0; k2 < shared.g->nodes[j].n_in; k2++)
                            readers += shared.g->nodes[j].in[k2] == n->in[k];
                    int same = x->grad != NULL && x->grad == shared.g->tensors[n->out].grad;
                    cr_assert_eq(same, x->grad != NULL && readers == 1,
                                 "%s: input %s (%d readers) %s its output's gradient", n->name,
                                 x->name, readers, same ? "shares" : "does not share");
                    aliased += same;
                    aliased_apart += apart.g->tensors[m->in[k]].grad != NULL &&
                                     apart.g->tensors[m->in[k]].grad ==
                                         apart.g->tensors[m->out].grad;
                }
            }
            cr_assert_gt(aliased, 0, "%s: no add's input shares a gradient", recipes[r]);
            cr_assert_eq(aliased_apart, 0, "gradients shared where the backend only adds");
            two_micro_batches(&shared, 1, recipes[r]);
            two_micro_batches(&apart, 0, recipes[r]);
            for (size_t i = 0; i < shared.g->n_params; i++)
                cr_assert(shared.g->grads[i] == apart.g->grads[i],
                          "%s, %s: gradient %zu is %.9g shared, %.9g apart", recipes[r],
                          computes[c] == TR_F32 ? "fp32" : "bf16", i,
                          (double)shared.g->grads[i], (double)apart.g->grads[i]);
            engine_close(&shared);
            tr_graph_free(apart.g, &apart.be);
            apart.g = NULL;
            apart.be.iface = cpu;
            engine_close(&apart);
        }
}

/* ---- tr_comm_sendrecv over a comm plugin made here ------------------------- */

static struct {
    int calls;
    size_t send_bytes, recv_bytes;
    int to, from;
    unsigned char first; /* the first byte sent */
} fake_p2p;

static int fake_comm_create(const struct tr_host *host, const void *config,
                            const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host, (void)config, (void)args, (void)err;
    *self = &fake_p2p;
    return TR_OK;
}

/* what the fake plugin's all-reduces saw */
static struct {
    int allreduce_calls, group_calls;
    size_t count;
    float first; /* buf[0] when called */
    int n, ranks[4];
} fake_sums;

static int fake_allreduce(void *self, float *buf, size_t count, tr_err *err)
{
    (void)self, (void)err;
    fake_sums.allreduce_calls++;
    fake_sums.count = count;
    fake_sums.first = count ? buf[0] : 0;
    return TR_OK;
}

static int fake_allreduce_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                tr_err *err)
{
    (void)self, (void)err;
    fake_sums.group_calls++;
    fake_sums.count = count;
    fake_sums.first = count ? buf[0] : 0;
    fake_sums.n = n;
    for (int i = 0; i < n && i < 4; i++)
        fake_sums.ranks[i] = ranks[i];
    return TR_OK;
}

static int fake_broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    (void)self, (void)buf, (void)bytes, (void)root, (void)err;
    return TR_OK;
}

/* Records the call, fills what is received with 0x5A; 3 bytes to rank 2
 * fail as a dead peer would. */
static int fake_sendrecv(void *self, const void *send_buf, size_t send_bytes, int to,
                         void *recv_buf, size_t recv_bytes, int from, tr_err *err)
{
    (void)self;
    fake_p2p.calls++;
    fake_p2p.send_bytes = send_bytes, fake_p2p.to = to;
    fake_p2p.recv_bytes = recv_bytes, fake_p2p.from = from;
    fake_p2p.first = send_bytes ? *(const unsigned char *)send_buf : 0;
    memset(recv_buf ? recv_buf : (void *)&fake_p2p.first, 0x5A, recv_buf ? recv_bytes : 0);
    if (to == 2 && send_bytes == 3)
        return tr_fail(err, "comm fake: rank 2 lost (it has stopped or died)");
    return TR_OK;
}

static const struct tr_comm_vtable fake_comm_vt = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = fake_allreduce, .broadcast = fake_broadcast, .sendrecv = fake_sendrecv,
    .allreduce_group = fake_allreduce_group,
};

/* what the fake plugin's group reduce-scatters and all-gathers saw */
static struct {
    int scatters, gathers;
    size_t count;
    int n, ranks[4];
    float seen[8]; /* buf's first 8 floats when called */
} fake_parts;

static void fake_parts_saw(float *buf, size_t count, const int *ranks, int n)
{
    fake_parts.count = count;
    fake_parts.n = n;
    for (int i = 0; i < n && i < 4; i++)
        fake_parts.ranks[i] = ranks[i];
    for (size_t i = 0; i < 8 && i < count * (size_t)n; i++)
        fake_parts.seen[i] = buf[i];
}

static int fake_reduce_scatter_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                     tr_err *err)
{
    (void)self, (void)err;
    fake_parts.scatters++;
    fake_parts_saw(buf, count, ranks, n);
    return TR_OK;
}

static int fake_allgather_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                tr_err *err)
{
    (void)self, (void)err;
    fake_parts.gathers++;
    fake_parts_saw(buf, count, ranks, n);
    return TR_OK;
}

/* A plugin of ABI 2.7: a group's reduce-scatter and all-gather too */
static const struct tr_comm_vtable fake_comm_vt_27 = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = fake_allreduce, .broadcast = fake_broadcast, .sendrecv = fake_sendrecv,
    .allreduce_group = fake_allreduce_group, .reduce_scatter_group = fake_reduce_scatter_group,
    .allgather_group = fake_allgather_group,
};

/* A plugin of ABI 2.5: its vtable ends before allreduce_group */
static const struct tr_comm_vtable fake_comm_vt_25 = {
    .struct_size = offsetof(struct tr_comm_vtable, allreduce_group),
    .allreduce_sum = fake_allreduce, .broadcast = fake_broadcast, .sendrecv = fake_sendrecv,
    .allreduce_group = fake_allreduce_group, /* beyond struct_size: absent */
};

/* A plugin of ABI 2.3: its vtable ends before sendrecv */
static const struct tr_comm_vtable fake_comm_vt_23 = {
    .struct_size = offsetof(struct tr_comm_vtable, sendrecv),
    .allreduce_sum = fake_allreduce, .broadcast = fake_broadcast,
    .sendrecv = fake_sendrecv, /* beyond struct_size: absent */
};

/* e's config with a comm plugin of vtable vt on rank 1 of 3, opened */
static struct tr_comm *fake_comm_open(struct engine *e, struct tr_plugin_info *info,
                                      const struct tr_comm_vtable *vt)
{
    *info = (struct tr_plugin_info){.abi_major = TR_ABI_MAJOR,
                                    .struct_size = sizeof *info,
                                    .kind = TR_KIND_COMM,
                                    .name = "fake",
                                    .version = "0",
                                    .description = "sendrecv recorded",
                                    .create = fake_comm_create,
                                    .vtable = vt};
    tr_plugin_close(e->cfg.comm.plugin);
    free(e->cfg.comm.config);
    e->cfg.comm.config = NULL;
    e->cfg.comm.plugin = calloc(1, sizeof *e->cfg.comm.plugin);
    e->cfg.comm.plugin->info = info;
    e->cfg.rank.rank = 1;
    e->cfg.rank.world = 3;
    tr_err err = {{0}};
    struct tr_comm *c = tr_comm_open(&e->cfg, &e->be, &err);
    cr_assert_not_null(c, "%s", err.msg);
    return c;
}

Test(comm, sendrecv_through_the_communication_thread, .init = environment)
{
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, CONFIG_DIR "tiny_gpt.lua", NULL, 0, 1, 1, &err), TR_OK, "%s",
                 err.msg);
    struct tr_plugin_info info;
    struct tr_comm *c = fake_comm_open(&e, &info, &fake_comm_vt);
    cr_assert(tr_comm_has_sendrecv(c));
    unsigned char out[100], in[50];
    memset(out, 7, sizeof out);
    memset(in, 0, sizeof in);
    tr_comm_record(c, 1);
    /* both ways, then send only, receive only (the other side's size is
     * not passed on), nothing */
    cr_assert_eq(tr_comm_sendrecv(c, out, 100, 2, in, 50, 0, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_p2p.calls == 1 && fake_p2p.send_bytes == 100 && fake_p2p.to == 2 &&
              fake_p2p.recv_bytes == 50 && fake_p2p.from == 0 && fake_p2p.first == 7);
    cr_assert(in[0] == 0x5A && in[49] == 0x5A);
    cr_assert_eq(tr_comm_sendrecv(c, out, 100, 2, in, 50, -1, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_p2p.calls == 2 && fake_p2p.from == -1 && fake_p2p.recv_bytes == 0);
    cr_assert_eq(tr_comm_sendrecv(c, out, 100, -1, in, 50, 0, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_p2p.calls == 3 && fake_p2p.to == -1 && fake_p2p.send_bytes == 0);
    cr_assert_eq(tr_comm_sendrecv(c, out, 0, 2, in, 0, 0, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(fake_p2p.calls, 3, "zero bytes both ways reached the plugin");
    /* the trace: what each moved, sent plus received */
    const struct tr_comm_span *spans;
    cr_assert_eq(tr_comm_spans(c, &spans), 3);
    cr_assert(strcmp(spans[0].kind, "sendrecv") == 0 && spans[0].bytes == 150);
    cr_assert(strcmp(spans[1].kind, "send") == 0 && spans[1].bytes == 100);
    cr_assert(strcmp(spans[2].kind, "recv") == 0 && spans[2].bytes == 50);
    cr_assert(spans[0].t1 >= spans[0].t0);
    tr_comm_record(c, 0);
    /* ranks that do not exist: refused before the plugin */
    cr_assert_eq(tr_comm_sendrecv(c, out, 1, 3, in, 1, 0, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "3 ranks"), "%s", err.msg);
    cr_assert_eq(tr_comm_sendrecv(c, out, 1, 2, in, 1, -2, &err), TR_ERROR);
    cr_assert_eq(fake_p2p.calls, 3);
    /* the plugin's failure comes back, and later calls fail with it */
    cr_assert_eq(tr_comm_sendrecv(c, out, 3, 2, in, 0, -1, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "rank 2 lost"), "%s", err.msg);
    cr_assert_eq(tr_comm_sendrecv(c, out, 100, 2, in, 50, 0, &err), TR_ERROR);
    cr_assert_eq(fake_p2p.calls, 4, "a call ran after a failure");
    tr_comm_close(c);
    e.cfg.comm.self = NULL;
    engine_close(&e);
}

Test(comm, sendrecv_refused_without_the_slot, .init = environment)
{
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, CONFIG_DIR "tiny_gpt.lua", NULL, 0, 1, 1, &err), TR_OK, "%s",
                 err.msg);
    struct tr_plugin_info info;
    struct tr_comm *c = fake_comm_open(&e, &info, &fake_comm_vt_23);
    cr_assert_not(tr_comm_has_sendrecv(c));
    unsigned char b[4] = {0};
    int before = fake_p2p.calls;
    cr_assert_eq(tr_comm_sendrecv(c, b, 4, 2, b, 4, 0, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "comm 'fake' has no sendrecv (plugin ABI 2.4)"), "%s", err.msg);
    cr_assert_eq(fake_p2p.calls, before);
    tr_comm_close(c);
    e.cfg.comm.self = NULL;
    engine_close(&e);
}

/* ---- tr_comm_allreduce_group: the plugin's slot, or the world with zeros -- */

Test(comm, group_sums_reach_the_plugin_members_only, .init = environment)
{
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, CONFIG_DIR "tiny_gpt.lua", NULL, 0, 1, 1, &err), TR_OK, "%s",
                 err.msg);
    struct tr_plugin_info info;
    struct tr_comm *c = fake_comm_open(&e, &info, &fake_comm_vt); /* rank 1 of 3 */
    cr_assert(tr_comm_has_groups(c));
    memset(&fake_sums, 0, sizeof fake_sums);
    float buf[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    tr_comm_record(c, 1);
    /* not a member: nothing moves, buf left alone */
    const int outside[] = {0, 2};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, outside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.group_calls == 0 && fake_sums.allreduce_calls == 0 && buf[0] == 5);
    /* a member: the plugin's slot, with the list */
    const int inside[] = {1, 2};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, inside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.group_calls == 1 && fake_sums.n == 2 && fake_sums.ranks[0] == 1 &&
              fake_sums.ranks[1] == 2 && fake_sums.count == 8 && fake_sums.first == 5);
    /* alone: nothing to sum */
    const int alone[] = {1};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, alone, 1, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(fake_sums.group_calls, 1);
    /* the whole world: the plain all-reduce */
    const int all[] = {0, 1, 2};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, all, 3, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.group_calls == 1 && fake_sums.allreduce_calls == 1);
    const struct tr_comm_span *spans;
    cr_assert_eq(tr_comm_spans(c, &spans), 2);
    cr_assert(strcmp(spans[0].kind, "group all-reduce") == 0 && spans[0].bytes == 32);
    cr_assert(strcmp(spans[1].kind, "all-reduce") == 0);
    tr_comm_record(c, 0);
    /* lists out of order, repeated or beyond the world: refused before the plugin */
    const int unsorted[] = {2, 1}, repeated[] = {1, 1}, beyond[] = {1, 3};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, unsorted, 2, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "ascend"), "%s", err.msg);
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, repeated, 2, &err), TR_ERROR);
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, beyond, 2, &err), TR_ERROR);
    cr_assert_eq(fake_sums.group_calls, 1);
    tr_comm_close(c);
    e.cfg.comm.self = NULL;
    engine_close(&e);
}

Test(comm, group_sums_fall_back_to_the_world_without_the_slot, .init = environment)
{
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, CONFIG_DIR "tiny_gpt.lua", NULL, 0, 1, 1, &err), TR_OK, "%s",
                 err.msg);
    struct tr_plugin_info info;
    struct tr_comm *c = fake_comm_open(&e, &info, &fake_comm_vt_25); /* rank 1 of 3 */
    cr_assert_not(tr_comm_has_groups(c));
    memset(&fake_sums, 0, sizeof fake_sums);
    float buf[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    /* a member: its own gradient into the world's all-reduce */
    const int inside[] = {1, 2};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, inside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.allreduce_calls == 1 && fake_sums.first == 5 && fake_sums.count == 8);
    /* not a member: zeros, still in the world's all-reduce */
    const int outside[] = {0, 2};
    cr_assert_eq(tr_comm_allreduce_group(c, buf, 8, outside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.allreduce_calls == 2 && fake_sums.first == 0);
    cr_assert_eq(fake_sums.group_calls, 0, "a slot beyond struct_size was called");
    tr_comm_close(c);
    e.cfg.comm.self = NULL;
    engine_close(&e);
}

/* ---- a group's reduce-scatter and all-gather (plugin ABI 2.7) ------------ */

Test(comm, group_parts_reach_the_plugin_or_go_through_group_sums, .init = environment)
{
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, CONFIG_DIR "tiny_gpt.lua", NULL, 0, 1, 1, &err), TR_OK, "%s",
                 err.msg);
    struct tr_plugin_info info;
    const int inside[] = {1, 2}, outside[] = {0, 2};
    float buf[8];
    /* with the slots: the members' calls reach them with the list, a
     * count per member, buf as given; a rank outside calls nothing */
    struct tr_comm *c = fake_comm_open(&e, &info, &fake_comm_vt_27); /* rank 1 of 3 */
    cr_assert(tr_comm_has_group_parts(c));
    memset(&fake_parts, 0, sizeof fake_parts);
    memset(&fake_sums, 0, sizeof fake_sums);
    for (int i = 0; i < 8; i++)
        buf[i] = (float)(i + 1);
    tr_comm_record(c, 1);
    cr_assert_eq(tr_comm_reduce_scatter_group(c, buf, 4, inside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_parts.scatters == 1 && fake_parts.count == 4 && fake_parts.n == 2 &&
              fake_parts.ranks[0] == 1 && fake_parts.ranks[1] == 2 && fake_parts.seen[7] == 8);
    cr_assert_eq(tr_comm_allgather_group(c, buf, 4, inside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_parts.gathers == 1 && fake_parts.count == 4 && fake_parts.seen[7] == 8);
    cr_assert_eq(tr_comm_allgather_group(c, buf, 4, outside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_parts.gathers == 1 && fake_sums.group_calls == 0 && fake_sums.allreduce_calls == 0);
    const struct tr_comm_span *spans;
    cr_assert_eq(tr_comm_spans(c, &spans), 2);
    cr_assert(strcmp(spans[0].kind, "group reduce-scatter") == 0 && spans[0].bytes == 32);
    cr_assert(strcmp(spans[1].kind, "group all-gather") == 0 && spans[1].bytes == 32);
    tr_comm_record(c, 0);
    /* the queued form: the hook runs after the plugin's call */
    size_t ticket = tr_comm_group_start(c, 1, buf, 4, inside, 2, NULL, NULL, 0);
    cr_assert_eq(tr_comm_wait(c, ticket, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(fake_parts.scatters, 2);
    tr_comm_close(c);
    e.cfg.comm.self = NULL;
    /* without them (a 2.6 plugin): allreduce_group over all n*count
     * floats, the all-gather's other members' parts zeroed first */
    c = fake_comm_open(&e, &info, &fake_comm_vt);
    cr_assert_not(tr_comm_has_group_parts(c));
    memset(&fake_parts, 0, sizeof fake_parts);
    memset(&fake_sums, 0, sizeof fake_sums);
    for (int i = 0; i < 8; i++)
        buf[i] = (float)(i + 1);
    cr_assert_eq(tr_comm_reduce_scatter_group(c, buf, 4, inside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.group_calls == 1 && fake_sums.count == 8 && fake_sums.first == 1);
    cr_assert_eq(tr_comm_allgather_group(c, buf, 4, inside, 2, &err), TR_OK, "%s", err.msg);
    cr_assert(fake_sums.group_calls == 2 && fake_sums.count == 8);
    for (int i = 0; i < 8; i++) /* member 0 (rank 1): its part kept, the other zeroed */
        cr_assert(buf[i] == (i < 4 ? (float)(i + 1) : 0.0f), "buf[%d] = %g", i, (double)buf[i]);
    cr_assert_eq(fake_parts.scatters + fake_parts.gathers, 0, "a slot the plugin lacks was called");
    tr_comm_close(c);
    e.cfg.comm.self = NULL;
    engine_close(&e);
}

/* ---- sharded parameters gathered in bf16 (gather.h), three ranks in threads -- */

enum { GW = 3 };

/* An all-gather among GW threads: each copies its slot to a board, all
 * copy every slot back. */
static struct {
    pthread_barrier_t barrier;
    float *board;
    size_t board_floats;
} gboard;

static int gb_create(const struct tr_host *host, const void *config,
                     const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host, (void)config, (void)err;
    *self = (void *)(intptr_t)(args->rank + 1);
    return TR_OK;
}

static int gb_allgather(void *self, float *buf, size_t count, tr_err *err)
{
    int r = (int)(intptr_t)self - 1;
    if (GW * count > gboard.board_floats)
        return tr_fail(err, "board: %zu floats a rank is more than it holds", count);
    memcpy(gboard.board + (size_t)r * count, buf + (size_t)r * count, count * sizeof(float));
    pthread_barrier_wait(&gboard.barrier);
    memcpy(buf, gboard.board, GW * count * sizeof(float));
    pthread_barrier_wait(&gboard.barrier);
    return TR_OK;
}

static const struct tr_comm_vtable gb_vt = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = fake_allreduce, .broadcast = fake_broadcast, .allgather = gb_allgather,
};

struct grank {
    struct engine e;
    struct tr_plugin_info info;
    struct tr_comm *comm;
    struct tr_shard s;
    const float *ref; /* every parameter, as every rank initialised it */
    int bad16, bad32, leaked; /* values found wrong: in params16, in params; fp32 held */
    double bytes;
};

/* Whether float i of the flat buffer is rank r's (shard.h). */
static int owns(const struct tr_shard *s, size_t i, int r)
{
    struct tr_shard_run p = tr_shard_part(s, i / s->unit, r);
    return i >= p.begin && i < p.end;
}

/* Rank r: every node's units gathered in turn (forward order); after each
 * node's gathers, what it reads is checked: its GEMM weight in bf16, the
 * parameters other ops read in fp32, and the fp32 values of parameters
 * only GEMMs read held only where the rank owns them. */
static void *grank_run(void *arg)
{
    struct grank *k = arg;
    struct tr_graph *g = k->e.g;
    struct tr_gather *gt = tr_gather_new(g, &k->e.be, k->comm, &k->s);
    tr_gather_release_all(gt);
    const uint16_t *p16 = g->params16;
    for (int i = 0; i < g->n_nodes && p16; i++) {
        g->before_node(g->before_node_ctx, i, TR_PHASE_FORWARD);
        const struct tr_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            const struct tr_tensor *t = &g->tensors[n->in[j]];
            if (t->role != TR_ROLE_PARAM)
                continue;
            int gemm = tr_gather_gemm_weight(g, n->in[j]);
            int weight = (n->op == TR_OP_LINEAR || n->op == TR_OP_MATMUL) && j == 1;
            for (size_t x = t->offset; x < t->offset + t->numel; x++) {
                if (weight)
                    k->bad16 += p16[x] != tr_f32_to_bf16(k->ref[x]);
                if (!gemm)
                    k->bad32 += memcmp(&g->params[x], &k->ref[x], sizeof(float)) != 0;
                else if (!owns(&k->s, x, k->s.rank))
                    k->leaked += g->params[x] != 0;
            }
        }
    }
    tr_gather_release_all(gt);
    k->bytes = tr_gather_take_bytes(gt);
    if (!p16)
        k->bad16 = -1;
    tr_gather_free(gt);
    return NULL;
}

/* The Llama's units over GW ranks, overrides applied (NULL: none); its
 * parameters are to leave a leftover in the last unit where leftover is set. */
static void gather_in_bf16(const char *const *overrides, int n_overrides, int leftover)
{
    struct grank *rk = calloc(GW, sizeof *rk);
    tr_err err = {{0}};
    for (int r = 0; r < GW; r++) {
        struct grank *k = &rk[r];
        cr_assert_eq(engine_build(&k->e, CONFIG_DIR "tiny_llama.lua", overrides, n_overrides, 1,
                                  1, &err),
                     TR_OK, "%s", err.msg);
        struct tr_graph *g = k->e.g;
        g->compute = TR_BF16; /* nothing runs: only the gathers read it */
        tr_graph_init_params(g, &k->e.be, 7);
        if (r == 0) {
            float *ref = malloc(g->n_params * sizeof(float));
            memcpy(ref, g->params, g->n_params * sizeof(float));
            for (int q = 0; q < GW; q++)
                rk[q].ref = ref;
        }
        /* units of 111 floats: parts of 37, odd, so packed parts end in a
         * padding half; the last unit shorter, with a leftover */
        tr_shard_init(&k->s, g->n_params, 111, r, GW, TR_SHARD_PARAMETERS);
        k->info = (struct tr_plugin_info){.abi_major = TR_ABI_MAJOR, .struct_size = sizeof k->info,
                                          .kind = TR_KIND_COMM, .name = "board", .version = "0",
                                          .description = "threads", .create = gb_create,
                                          .vtable = &gb_vt};
        tr_plugin_close(k->e.cfg.comm.plugin);
        free(k->e.cfg.comm.config);
        k->e.cfg.comm.config = NULL;
        k->e.cfg.comm.plugin = calloc(1, sizeof *k->e.cfg.comm.plugin);
        k->e.cfg.comm.plugin->info = &k->info;
        k->e.cfg.rank.rank = r;
        k->e.cfg.rank.world = GW;
        k->comm = tr_comm_open(&k->e.cfg, &k->e.be, &err);
        cr_assert_not_null(k->comm, "%s", err.msg);
    }
    size_t n = rk[0].e.g->n_params;
    cr_assert_gt(n % 111, 0, "the last unit is to be short");
    if (leftover)
        cr_assert_neq((n % 111) % GW, 0, "the last unit is to leave a leftover");
    gboard.board_floats = n; /* more than any unit's packed parts */
    gboard.board = calloc(n, sizeof(float));
    pthread_barrier_init(&gboard.barrier, NULL, GW);
    pthread_t th[GW];
    for (int r = 0; r < GW; r++)
        pthread_create(&th[r], NULL, grank_run, &rk[r]);
    for (int r = 0; r < GW; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < GW; r++) {
        cr_assert_eq(rk[r].bad16, 0, "rank %d: %d bf16 values not the owner's rounding", r,
                     rk[r].bad16);
        cr_assert_eq(rk[r].bad32, 0, "rank %d: %d fp32 values of non-GEMM parameters wrong", r,
                     rk[r].bad32);
        cr_assert_eq(rk[r].leaked, 0, "rank %d: %d fp32 values of others' GEMM weights held", r,
                     rk[r].leaked);
        cr_assert_gt(rk[r].bytes, 0);
        cr_assert_eq(rk[r].bytes, rk[0].bytes);
    }
    pthread_barrier_destroy(&gboard.barrier);
    free(gboard.board);
    free((void *)rk[0].ref);
    for (int r = 0; r < GW; r++) {
        tr_comm_close(rk[r].comm);
        engine_close(&rk[r].e);
    }
    free(rk);
}

/* the input embedding in fp32 units gathered in place, the rest packed */
Test(gather, bf16_gathers_give_every_rank_the_owners_rounding, .init = environment)
{
    gather_in_bf16(NULL, 0, 1);
}

/* a tied embedding, looked up in fp32 and multiplied by the head: gathered
 * in fp32 and rounded into params16 where it arrives */
Test(gather, a_tied_embedding_arrives_in_fp32_and_bf16, .init = environment)
{
    const char *const tied[] = {"model.tie_embeddings=true"};
    gather_in_bf16(tied, 1, 0); /* 4,512 parameters: no leftover over 3 ranks */
}

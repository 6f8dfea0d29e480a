/*
 * Pipeline schedules (core/engine/pipeline.c): every schedule runs each
 * micro-batch's forward and backward through every chunk exactly once, in
 * an order the stages can follow without waiting on each other for ever;
 * 1F1B holds at most P - s micro-batches on stage s; with equal chunks the
 * simulated bubble is the textbook (P - 1) / (M + P - 1) (interleaved:
 * (P - 1) / (V M + P - 1)); and the partition cuts the GPT and Llama
 * builders' graphs at block boundaries with balanced FLOPs.
 */
#include "engine/pipeline.h"
#include "engine_harness.h"

static void check_complete(enum tr_pipe_kind kind, int P, int V, int M)
{
    int C = P * V;
    struct tr_pipe_op *ops = calloc((size_t)(2 * M * V), sizeof *ops);
    char *seen = calloc((size_t)(2 * M * C), 1);
    for (int s = 0; s < P; s++) {
        int n = tr_pipe_schedule(kind, P, V, M, s, ops);
        cr_assert_eq(n, 2 * M * V, "%s P%d V%d M%d stage %d: %d ops", tr_pipe_kinds[kind], P, V,
                     M, s, n);
        int held = 0, most = 0;
        for (int i = 0; i < n; i++) {
            cr_assert_eq(ops[i].chunk % P, s, "a chunk of another stage");
            cr_assert(ops[i].micro >= 0 && ops[i].micro < M);
            size_t at = (size_t)ops[i].backward * (size_t)(M * C) + (size_t)ops[i].micro * (size_t)C +
                        (size_t)ops[i].chunk;
            cr_assert_eq(seen[at], 0, "an op twice");
            seen[at] = 1;
            if (ops[i].backward) /* its own forward ran first on this stage */
                cr_assert_eq(seen[(size_t)ops[i].micro * (size_t)C + (size_t)ops[i].chunk], 1);
            held += ops[i].backward ? -1 : 1;
            most = held > most ? held : most;
        }
        if (kind == TR_PIPE_1F1B)
            cr_assert_leq(most, P - s < M ? P - s : M, "1f1b stage %d holds %d micro-batches", s, most);
        if (kind == TR_PIPE_GPIPE)
            cr_assert_eq(most, M);
    }
    for (size_t i = 0; i < (size_t)(2 * M * C); i++)
        cr_assert_eq(seen[i], 1, "an op missing");
    free(ops);
    free(seen);
}

Test(pipeline, schedules_are_complete)
{
    for (int P = 1; P <= 8; P *= 2)
        for (int M = 1; M <= 16; M++) {
            check_complete(TR_PIPE_GPIPE, P, 1, M);
            check_complete(TR_PIPE_1F1B, P, 1, M);
            for (int V = 1; V <= 3; V++)
                if (M % P == 0)
                    check_complete(TR_PIPE_INTERLEAVED, P, V, M);
        }
    struct tr_pipe_op ops[64];
    cr_assert_eq(tr_pipe_schedule(TR_PIPE_INTERLEAVED, 4, 2, 6, 0, ops), -1, "M not a multiple of P");
    cr_assert_eq(tr_pipe_schedule(TR_PIPE_1F1B, 4, 2, 8, 0, ops), -1, "virtual stages without interleaving");
}

Test(pipeline, equal_chunks_give_the_textbook_bubble)
{
    for (int P = 2; P <= 8; P *= 2)
        for (int M = P; M <= 32; M += P)
            for (int kind = TR_PIPE_GPIPE; kind <= TR_PIPE_INTERLEAVED; kind++)
                for (int V = 1; V <= (kind == TR_PIPE_INTERLEAVED ? 4 : 1); V++) {
                    double f[64], b[64];
                    for (int c = 0; c < P * V; c++) {
                        f[c] = 1.0 / V;
                        b[c] = 2.0 / V; /* backward twice the forward */
                    }
                    struct tr_pipe_sim sim;
                    tr_err err;
                    cr_assert_eq(tr_pipe_simulate((enum tr_pipe_kind)kind, P, V, M, f, b, &sim, &err),
                                 TR_OK, "%s", err.msg);
                    double theory = tr_pipe_bubble_theory((enum tr_pipe_kind)kind, P, V, M);
                    cr_assert_float_eq(sim.bubble, theory, 1e-9, "%s P%d V%d M%d: %g vs %g",
                                       tr_pipe_kinds[kind], P, V, M, sim.bubble, theory);
                }
    /* the target of the background, >= 85% busy at P = 4 with M >= 16:
     * interleaved (V = 2) has it at M = 16 (91.4%), 1F1B from M = 18 (85.7%;
     * 84.2% at 16), holding at most P micro-batches on a stage */
    double f[8] = {.5, .5, .5, .5, .5, .5, .5, .5}, b[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    struct tr_pipe_sim sim;
    tr_err err;
    cr_assert_eq(tr_pipe_simulate(TR_PIPE_INTERLEAVED, 4, 2, 16, f, b, &sim, &err), TR_OK);
    cr_assert_lt(sim.bubble, 0.15);
    for (int c = 0; c < 4; c++)
        f[c] = 1, b[c] = 2;
    cr_assert_eq(tr_pipe_simulate(TR_PIPE_1F1B, 4, 1, 18, f, b, &sim, &err), TR_OK);
    cr_assert_lt(sim.bubble, 0.15);
    cr_assert_leq(sim.max_in_flight, 4);
}

Test(pipeline, an_uneven_stage_sets_the_pace)
{
    /* stage 1 twice as slow: the step is bounded by M x its time */
    double f[2] = {1, 2}, b[2] = {2, 4};
    struct tr_pipe_sim sim;
    tr_err err;
    cr_assert_eq(tr_pipe_simulate(TR_PIPE_1F1B, 2, 1, 8, f, b, &sim, &err), TR_OK);
    cr_assert_geq(sim.makespan, 8 * 6.0);
    cr_assert_lt(sim.makespan, 8 * 6.0 + 3.0 + 1e-9);
}

static void check_partition(const char *recipe, const char *const *overrides, int n, int chunks)
{
    environment();
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, recipe, overrides, n, 1, 1, &err), TR_OK, "%s", err.msg);
    struct tr_pipe_chunk c[16];
    cr_assert_eq(tr_pipe_partition(e.g, chunks, c, &err), TR_OK, "%s", err.msg);
    struct tr_flops fl;
    tr_graph_count_flops(e.g, &fl);
    double total = 0, params = 0, largest = 0;
    for (int k = 0; k < chunks; k++) {
        cr_assert(c[k].first_node <= c[k].last_node);
        cr_assert_eq(c[k].first_node, k == 0 ? 0 : c[k - 1].last_node + 1, "not contiguous");
        total += c[k].flops;
        params += c[k].param_floats;
        largest = c[k].flops > largest ? c[k].flops : largest;
    }
    cr_assert_eq(c[chunks - 1].last_node, e.g->n_nodes - 1);
    cr_assert(c[0].has_embedding && c[chunks - 1].has_head);
    /* every FLOP and parameter in exactly one chunk, as the whole-model count has them */
    cr_assert_float_eq(total, fl.per_token, 1e-6 * fl.per_token, "%g vs %g", total, fl.per_token);
    cr_assert_float_eq(params, fl.params, 0.5);
    /* balanced: no chunk above the mean by more than the largest piece */
    cr_assert_lt(largest, total / chunks * 2.0, "largest chunk %g of %g", largest, total);
    engine_close(&e);
}

Test(pipeline, partitions_cut_at_blocks)
{
    const char *llama[] = {"model.layers=8", "model.dim=64", "model.ffn_dim=128"};
    check_partition(TR_TEST_SRCDIR "/config/tiny_llama.lua", llama, 3, 2);
    check_partition(TR_TEST_SRCDIR "/config/tiny_llama.lua", llama, 3, 4);
    const char *gpt[] = {"model.layers=6"};
    check_partition(TR_TEST_SRCDIR "/config/tiny_gpt.lua", gpt, 1, 3);
    environment();
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_build(&e, TR_TEST_SRCDIR "/config/tiny_llama.lua", NULL, 0, 1, 1, &err), TR_OK);
    struct tr_pipe_chunk c[16];
    cr_assert_eq(tr_pipe_partition(e.g, 8, c, &err), TR_ERROR, "2 blocks cannot make 8 stages");
    cr_assert(strstr(err.msg, "use fewer stages"), "%s", err.msg);
    engine_close(&e);
}

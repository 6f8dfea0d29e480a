/* The printed report of `trainrun plan` (tr_plan_print): the model, memory,
 * compute-optimal size, the step, scaling, the projection, the learning
 * rate and warnings, in aligned rows. The plan itself is built in plan.c. */
#include "plan.h"

#include "../engine/fit.h"

#include "../config/precision.h"
#include "../config/run_config.h"
#include "../util/util.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define LABEL_WIDTH 26

/* Display columns of UTF-8 text (labels use ×, ≈, ·). */
static int display_width(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* One line of the report: an indented label padded to a column, then the value. */
static void row(FILE *out, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row(FILE *out, const char *label, const char *fmt, ...)
{
    int pad = LABEL_WIDTH - display_width(label);
    fprintf(out, "  %s%*s", label, pad > 1 ? pad : 1, "");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

/* 1234567 -> "1,234,567" */
static const char *fmt_int(double x, char *buf, size_t size)
{
    if (!isfinite(x) || fabs(x) >= 1e21) { /* past what digit groups help to read */
        snprintf(buf, size, "%.3g", x);
        return buf;
    }
    char digits[64];
    snprintf(digits, sizeof digits, "%.0f", fabs(x));
    size_t n = strlen(digits), o = 0;
    if (x <= -0.5 && o + 1 < size)
        buf[o++] = '-';
    for (size_t i = 0; i < n && o + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

/* Three significant digits with a prefix: "28.0 K", "10.0 B" for counts
 * (short scale, as model sizes are quoted), "860 MFLOP" with SI units. */
static const char *fmt_scaled(double x, const char *const *prefix, int n_prefix, const char *unit,
                              char *buf, size_t size)
{
    int k = 0;
    while (fabs(x) >= 999.5 && k < n_prefix - 1) {
        x /= 1000;
        k++;
    }
    if (k == 0 && x == floor(x))
        snprintf(buf, size, "%.0f%s%s", x, *unit ? " " : "", unit);
    else
        snprintf(buf, size, "%.*f %s%s", fabs(x) < 9.995 ? 2 : fabs(x) < 99.95 ? 1 : 0, x,
                 prefix[k], unit);
    return buf;
}

static const char *fmt_count(double x, char *buf, size_t size)
{
    static const char *const prefix[] = {"", "K", "M", "B", "T"};
    return fmt_scaled(x, prefix, 5, "", buf, size);
}

static const char *fmt_flops(double x, const char *unit, char *buf, size_t size)
{
    static const char *const prefix[] = {"", "k", "M", "G", "T", "P", "E", "Z", "Y"};
    return fmt_scaled(x, prefix, 9, unit, buf, size);
}

static const char *fmt_bytes(double x, char *buf, size_t size)
{
    tr_format_bytes(x, buf, size);
    return buf;
}

static const char *fmt_dollars(double x, char *buf, size_t size)
{
    char n[48];
    if (x > 0 && x < 0.005)
        snprintf(buf, size, "< $0.01");
    else if (x < 1000)
        snprintf(buf, size, "$%.2f", x);
    else
        snprintf(buf, size, "$%s", fmt_int(x, n, sizeof n));
    return buf;
}

static const char *fmt_seconds(double s, char *buf, size_t size)
{
    if (s < 1e-3)
        snprintf(buf, size, "%.3g µs", s * 1e6);
    else if (s < 1)
        snprintf(buf, size, "%.3g ms", s * 1e3);
    else
        snprintf(buf, size, "%.3g s", s);
    return buf;
}

/* "0.0003 h (1.1 s)", "0.76 h (45 min)", "12.4 h", "77 h (3.2 days)" */
static const char *fmt_hours(double h, char *buf, size_t size)
{
    char n[48];
    if (h < 1.0 / 60)
        snprintf(buf, size, "%.2g h (%s)", h, fmt_seconds(h * 3600, n, sizeof n));
    else if (h < 1)
        snprintf(buf, size, "%.2f h (%.0f min)", h, h * 60);
    else if (h < 48)
        snprintf(buf, size, "%.1f h", h);
    else
        snprintf(buf, size, "%s h (%.1f days)", fmt_int(h, n, sizeof n), h / 24);
    return buf;
}

static const char *fmt_device_hours(double h, char *buf, size_t size)
{
    if (h < 0.01)
        snprintf(buf, size, "< 0.01");
    else if (h < 1000)
        snprintf(buf, size, "%.2f", h);
    else
        fmt_int(h, buf, size);
    return buf;
}

static void print_model(const struct tr_plan *p, FILE *out)
{
    char a[64], b[64], c[64], d[64], label[64];
    const char *per = p->sequence_model ? "token" : "sample";
    fprintf(out, "model\n");
    row(out, "parameters P", "%s  (%s; %s without embeddings)",
        fmt_int((double)p->params, a, sizeof a), fmt_count((double)p->params, b, sizeof b),
        fmt_count((double)(p->params - p->embedding_params), c, sizeof c));
    if (p->frozen_params) {
        int64_t trained = p->params - p->frozen_params;
        row(out, "trained", "%s  (%.3g%%: low-rank adapters, rank %lld, and modules_to_save)",
            fmt_int((double)trained, a, sizeof a), 100.0 * (double)trained / (double)p->params,
            (long long)p->lora_rank);
        row(out, "frozen base", "%s  (%s stored%s%s%s)", fmt_int((double)p->frozen_params, a, sizeof a),
            fmt_bytes(p->frozen_bytes, b, sizeof b), p->quantized_bytes > 0 ? ", of which " : "",
            p->quantized_bytes > 0 ? fmt_bytes(p->quantized_bytes, c, sizeof c) : "",
            p->quantized_bytes > 0 ? " NF4" : "");
    }
    if (p->layers)
        row(out, "shape", "L = %lld attention layers, T = %lld tokens, C = %lld wide",
            (long long)p->layers, (long long)p->seq_len, (long long)p->width);
    snprintf(label, sizeof label, "training FLOPs/%s", per);
    if (p->convs) {
        /* a conv's weights multiply at every output position: from the shapes */
        row(out, label, "6·(conv + linear multiply-adds) = %s + %s = %s  (%s)",
            fmt_int(p->conv_flops, a, sizeof a), fmt_int(p->dense_flops, b, sizeof b),
            fmt_int(p->flops_per_token, c, sizeof c), fmt_flops(p->flops_per_token, "FLOP", d, sizeof d));
        row(out, "", "(%lld convolutions, OH·OW·OC·KH·KW·IC/groups each; 2 forward + 4 backward "
            "per multiply-add; norms and pooling not counted)", (long long)p->convs);
    } else if (p->layers && p->frozen_params) {
        /* a frozen weight forward and its input's gradient: no weight gradient */
        double trained = (double)(p->params - p->lookup_params - p->frozen_multiplied);
        char e[64];
        row(out, label, "6·(P - F - E) + 4·F + 12·L·T·C = %s + %s + %s = %s  (%s)",
            fmt_int(6.0 * trained, a, sizeof a), fmt_int(4.0 * (double)p->frozen_multiplied, b, sizeof b),
            fmt_int(p->attention_flops, c, sizeof c), fmt_int(p->flops_per_token, d, sizeof d),
            fmt_flops(p->flops_per_token, "FLOP", e, sizeof e));
        row(out, "", "(F = %s frozen base weights multiplied: 2 forward + 2 for their input's "
            "gradient; E = %s looked up, not multiplied)",
            fmt_int((double)p->frozen_multiplied, a, sizeof a), fmt_int((double)p->lookup_params, b, sizeof b));
    } else if (p->layers && p->lookup_params) {
        /* an untied input embedding is gathered, not multiplied */
        row(out, label, "6·(P - E) + 12·L·T·C = %s + %s = %s  (%s)",
            fmt_int(6.0 * (double)(p->params - p->lookup_params), a, sizeof a),
            fmt_int(p->attention_flops, b, sizeof b), fmt_int(p->flops_per_token, c, sizeof c),
            fmt_flops(p->flops_per_token, "FLOP", d, sizeof d));
        row(out, "", "(E = %s untied input-embedding parameters, looked up, not multiplied)",
            fmt_int((double)p->lookup_params, a, sizeof a));
        row(out, "", "(2 forward + 4 backward per other parameter, plus attention scores and mixing)");
    } else if (p->layers) {
        row(out, label, "6·P + 12·L·T·C = %s + %s = %s  (%s)",
            fmt_int(6.0 * (double)p->params, a, sizeof a), fmt_int(p->attention_flops, b, sizeof b),
            fmt_int(p->flops_per_token, c, sizeof c), fmt_flops(p->flops_per_token, "FLOP", d, sizeof d));
        row(out, "", "(2·P forward + 4·P backward, plus attention scores and mixing)");
    } else {
        row(out, label, "6·P = %s  (%s; 2·P forward + 4·P backward)",
            fmt_int(p->flops_per_token, a, sizeof a), fmt_flops(p->flops_per_token, "FLOP", b, sizeof b));
    }
    snprintf(label, sizeof label, "%ss per step", per);
    if (p->sequence_model)
        row(out, label, "%s  (batch %lld × %lld tokens)", fmt_int(p->tokens_per_step, a, sizeof a),
            (long long)p->batch, (long long)p->tokens_per_sample);
    else
        row(out, label, "%s  (train.batch)", fmt_int(p->tokens_per_step, a, sizeof a));
    row(out, "FLOPs per step", "%s", fmt_flops(p->flops_per_step, "FLOP", a, sizeof a));
    if (p->length_from == TR_LENGTH_TIME && p->steps == 0)
        row(out, "the recipe's run", "train.time alone: the steps in it need a step time "
            "(cost.hardware, or cost.peak_tflops for cpu)");
    else
        row(out, "the recipe's run", "%s steps = %s %ss, %s", fmt_int((double)p->steps, a, sizeof a),
            fmt_count(p->tokens, b, sizeof b), per, fmt_flops(p->flops, "FLOP", c, sizeof c));
    if (p->length_from == TR_LENGTH_TOKENS)
        row(out, "", "from train.tokens = %s: ceil(tokens / %s %ss per step)",
            fmt_count(p->length_value, a, sizeof a), fmt_int(p->tokens_per_step, b, sizeof b), per);
    else if (p->length_from == TR_LENGTH_EPOCHS)
        row(out, "", "from train.epochs = %g of the training split", p->length_value);
    else if (p->length_from == TR_LENGTH_TIME && p->steps > 0)
        row(out, "", "from train.time = %s at the estimated step time (the schedule sees no end)",
            fmt_hours(p->time_limit / 3600.0, a, sizeof a));
    if (p->time_limit > 0 && p->length_from != TR_LENGTH_TIME) {
        if (p->hours > 0 && p->hours * 3600.0 > p->time_limit)
            row(out, "", "train.time = %s stops it first: about %s steps at the estimated step time",
                fmt_hours(p->time_limit / 3600.0, a, sizeof a),
                fmt_int(floor(p->time_limit / (p->hours * 3600.0 / (double)p->steps)), b, sizeof b));
        else
            row(out, "", "train.time = %s: a limit%s", fmt_hours(p->time_limit / 3600.0, a, sizeof a),
                p->hours > 0 ? " the estimate stays within" : " (no step time to compare it with)");
    }
    if (p->memory.recompute_saved) {
        row(out, "", "activation recomputation adds up to one more forward (2·P) of the");
        row(out, "", "recomputed blocks, not counted above (MFU counts model FLOPs only)");
    }
}

/* What one device holds: the whole model's plan, or under pipeline stages
 * the largest stage's estimate. */
static double device_need(const struct tr_plan *p)
{
    return p->pipe.stages > 1 ? p->pipe.stage[p->pipe.largest].bytes : p->memory_total;
}

/* CPU ranks of one machine together: each holds its device's plan (under
 * stages, its own stage's, for each of the stage's replicas) */
static double ranks_need(const struct tr_plan *p)
{
    if (p->pipe.stages <= 1)
        return p->memory_total * (double)p->cost.count;
    double sum = 0;
    for (int st = 0; st < p->pipe.stages; st++)
        sum += p->pipe.stage[st].bytes;
    return sum * (double)p->pipe.replicas;
}

static void print_memory(const struct tr_plan *p, FILE *out)
{
    const struct tr_memory_report *m = &p->memory;
    char a[64], b[64], c[64], label[160];
    /* the planner stores activations in a 16-bit compute dtype (graph.c) */
    fprintf(out, "\nmemory per device  (micro-batch %lld; the cpu backend's plan, activations in "
            "%s storage)\n", (long long)p->micro_batch,
            tr_dtype_name(p->compute));
    struct tr_memory_row rows[TR_MEMORY_ROWS];
    size_t n_rows = tr_memory_rows(m, rows);
    for (size_t i = 0; i < n_rows; i++)
        row(out, rows[i].what, "%12s", fmt_bytes((double)rows[i].bytes, a, sizeof a));
    row(out, "total", "%12s", fmt_bytes(p->memory_total, a, sizeof a));
    if (p->host_bytes > 0) {
        int parts = (p->cost.count > 1 && p->shard_level != TR_SHARD_NONE) || p->host_stage;
        row(out, "host (offload)", "%12s  (parallel.offload: the optimizer state%s, %s, moved off",
            fmt_bytes(p->host_bytes, a, sizeof a),
            p->host_stage ? " of the largest stage's parameters"
            : parts      ? " of a device's parts"
                         : "",
            fmt_bytes(p->offloaded_bytes, b, sizeof b));
        row(out, "", "the device, and an fp32 master copy of %s, %s%s",
            parts ? "those parameters" : "the parameters",
            fmt_bytes(p->host_bytes - p->offloaded_bytes - p->host_grad_bytes, c, sizeof c),
            p->host_grad_bytes > 0 ? "," : ")");
        if (p->host_grad_bytes > 0)
            row(out, "", "and their gradients, %s, for the update overlapping the next forward)",
                fmt_bytes(p->host_grad_bytes, a, sizeof a));
    }
    row(out, "grows as", "%s + %s per sample of micro-batch", fmt_bytes(p->fixed_bytes, a, sizeof a),
        fmt_bytes(p->bytes_per_sample, b, sizeof b));
    row(out, "eval", "%12s  (forward only: no gradients or optimizer state, activations "
        "reused; sample: one sequence)", fmt_bytes(p->forward_bytes, a, sizeof a));
    if (p->compute != TR_F32) {
        row(out, "", "(precision %s: activations in %s storage on every backend, half the "
            "bytes;", p->precision, tr_dtype_name(p->compute));
        row(out, "", " the logits, gradients and saved statistics stay fp32; GEMM inputs "
            "in %s)", tr_dtype_name(p->compute));
        row(out, "", "(device=cpu on this machine: %s)", tr_cpu_gemm_path(p->compute));
    }
    static const char *const held[] = {
        [TR_SHARD_OPTIMIZER] = "1/%lld of the optimizer state, all of the rest",
        [TR_SHARD_GRADIENTS] = "1/%lld of the optimizer state and of the gradients (plus the "
                               "buckets in flight), all of the parameters",
        [TR_SHARD_PARAMETERS] = "1/%lld of the optimizer state, gradients and parameters (plus "
                                "the units gathered or summing at once)"};
    int staged = p->pipe.stages > 1; /* per device: the stages' rows below */
    if (staged)
        row(out, "", "(pipeline stages: these rows are the whole model%s; each device holds its "
            "stage's share: below)", p->shard_level == TR_SHARD_NONE ? ""
            : p->shard_level == TR_SHARD_OPTIMIZER ? ", the optimizer state cut over a stage's "
                                                     "replicas"
                                                   : ", the optimizer state and gradients cut "
                                                     "over a stage's replicas");
    else if (p->cost.count > 1 && p->host_bytes > 0 && p->shard_level == TR_SHARD_NONE)
        row(out, "", "(data parallel: each of the %lld devices holds all of this; offload with "
            "several ranks needs parallel.shard: each rank's host then keeps 1/%lld of the state)",
            (long long)p->cost.count, (long long)p->cost.count);
    else if (p->cost.count > 1 && p->shard_level == TR_SHARD_NONE)
        row(out, "", "(data parallel: each of the %lld devices holds all of this; "
            "parallel.shard = \"optimizer\" keeps 1/%lld of the optimizer state on each)",
            (long long)p->cost.count, (long long)p->cost.count);
    else if (p->cost.count > 1) {
        char what[200];
        snprintf(what, sizeof what, held[p->shard_level], (long long)p->cost.count);
        row(out, "", "(data parallel, parallel.shard = \"%s\": each of the %lld devices holds",
            tr_shard_levels[p->shard_level], (long long)p->cost.count);
        row(out, "", " %s)", what);
        if (p->shard_level == TR_SHARD_PARAMETERS && p->compute != TR_F32)
            row(out, "", "(the GEMM weights gathered in %s, 2 bytes a value; the other "
                "parameters in fp32)", tr_dtype_name(p->compute));
    }
    snprintf(label, sizeof label, "on %s", p->device);
    if (p->cost.count > 1 && !staged) {
        char t[4][32];
        for (int k = 0; k < 4; k++)
            fmt_bytes(p->level_total[k], t[k], sizeof t[k]);
        row(out, "shard levels", "on each of %lld devices: none %s, optimizer %s, gradients %s, "
            "parameters %s (parallel.shard)", (long long)p->cost.count, t[0], t[1], t[2], t[3]);
        if (p->level_fits_first >= 0)
            row(out, "", "the smallest level that fits: \"%s\"%s%s",
                tr_shard_levels[p->level_fits_first],
                p->level_fits_first == p->shard_level ? " (the recipe's)" : "",
                p->host_bytes > 0 ? " (offload on several devices needs a level)" : "");
        else
            row(out, "", "no shard level fits: more devices, a smaller micro-batch, recompute, "
                "or adapters (lora)");
        char need[4][32];
        for (int k = 1; k < 4; k++)
            if (p->level_devices[k] > 0)
                snprintf(need[k], sizeof need[k], "%lld", (long long)p->level_devices[k]);
            else
                snprintf(need[k], sizeof need[k], "more than 4096");
        row(out, "devices needed", "the fewest that fit: optimizer %s, gradients %s, parameters %s",
            need[1], need[2], need[3]);
        if (p->level_fits_first == TR_SHARD_PARAMETERS && !p->cpu_ranks)
            row(out, "", "(\"parameters\" on cuda needs the driver's virtual memory management "
                "to give memory back; not yet run on a GPU: docs/scale-out.md)");
    }
    row(out, label, "%s: %s of %s usable (%s less a %.0f%% margin)",
        p->fits ? "fits" : "DOES NOT FIT", fmt_bytes(device_need(p), a, sizeof a),
        fmt_bytes(p->usable_bytes, b, sizeof b), fmt_bytes(p->device_bytes, c, sizeof c),
        TR_MEMORY_MARGIN * 100);
    if (staged)
        row(out, "", "(stage %d's estimate, the largest: below)", p->pipe.largest);
    if (p->cpu_ranks && p->cost.count > 1)
        row(out, "", "(%lld CPU ranks on one machine share its memory: %s together)",
            (long long)p->cost.count, fmt_bytes(ranks_need(p), a, sizeof a));
    if (p->max_micro_batch > 0) {
        row(out, "largest micro-batch", "%lld (measured; what micro_batch = \"auto\" picks):",
            (long long)p->max_micro_batch);
        row(out, "", "the largest dividing the %lld samples per device per step that fits%s",
            (long long)p->search_samples, staged ? " (its largest stage)" : "");
    } else
        row(out, "largest micro-batch", "none: even one sample does not fit");
}

static void print_pipeline(const struct tr_plan *p, FILE *out)
{
    const struct tr_plan_pipe *pp = &p->pipe;
    char a[64], b[64], what[160];
    fprintf(out, "\npipeline  (parallel.pipeline = %d stages, schedule %s, %d micro-batch%s a "
            "step through each of %d replica%s)\n", pp->stages, tr_pipe_kinds[pp->kind],
            pp->micro_batches, pp->micro_batches == 1 ? "" : "es", pp->replicas,
            pp->replicas == 1 ? "" : "s");
    if (pp->virtual_stages > 1)
        row(out, "", "each stage runs %d chunks of the model (virtual stages)", pp->virtual_stages);
    if (pp->devices_assumed)
        row(out, "", "(%d devices assumed, one a stage: set gpus=N, a multiple of %d, for "
            "data-parallel replicas)", pp->stages, pp->stages);
    for (int st = 0; st < pp->stages; st++) {
        const struct tr_plan_stage *g = &pp->stage[st];
        char label[32];
        size_t used = 0;
        what[0] = 0;
        if (g->has_embedding)
            used += (size_t)snprintf(what + used, sizeof what - used, "embedding");
        for (int c = 0, said = 0; c < g->chunks && used < sizeof what; c++)
            if (g->block_from[c] >= 0) {
                const char *lead = said ? ", " : used ? ", blocks " : "blocks ";
                if (g->block_from[c] == g->block_to[c]) /* "blocks 3" reads as one */
                    used += (size_t)snprintf(what + used, sizeof what - used, "%s%d", lead,
                                             g->block_from[c]);
                else
                    used += (size_t)snprintf(what + used, sizeof what - used, "%s%d-%d", lead,
                                             g->block_from[c], g->block_to[c]);
                said = 1;
            }
        if (g->has_head && used < sizeof what)
            snprintf(what + used, sizeof what - used, "%shead", used ? ", " : "");
        snprintf(label, sizeof label, "stage %d", st);
        row(out, label, "%-28s %5.1f%% of the FLOPs  %8s parameters  %10s  (activations of %.0f "
            "micro-batch%s)", what, 100 * g->flops_share, fmt_count(g->params, a, sizeof a),
            fmt_bytes(g->bytes, b, sizeof b), g->in_flight, g->in_flight == 1 ? "" : "es");
    }
    row(out, "bubble", "%.1f%% of the devices' time idle in theory ((P-1)/(%sM+P-1)); %.1f%% "
        "simulated with the stages' FLOPs as their times", 100 * pp->bubble_theory,
        pp->kind == TR_PIPE_INTERLEAVED ? "V·" : "", 100 * pp->bubble_simulated);
    row(out, "", "(memory per stage estimated: its share of the weights and their state, the "
        "activations of the micro-batches it holds; communication not counted)");
    if (p->frozen_bytes > 0)
        row(out, "", "(and the whole frozen base, %s: every stage keeps all of it)",
            fmt_bytes(p->frozen_bytes, a, sizeof a));
    if (pp->state_parted)
        row(out, "", "(the state%s of each stage cut over its %d replicas: parallel.shard = "
            "\"%s\")", p->shard_level == TR_SHARD_GRADIENTS ? " and gradients" : "",
            pp->replicas, tr_shard_levels[p->shard_level]);
    row(out, "", "(a stage keeps its share resident where the backend gives memory back (cpu); "
        "the activations of the micro-batches in flight wait in host memory)");
}

static void print_optimal(const struct tr_plan *p, FILE *out)
{
    char a[64], b[64], c[64], d[64];
    fprintf(out, "\ncompute-optimal  (Chinchilla: about %.0f tokens per parameter)\n", TOKENS_PER_PARAM);
    if (!p->sequence_model) {
        row(out, "", "not applied: the rule is for language models, and this model reads samples");
        return;
    }
    row(out, "tokens", "%.0f × P = %s  (%s; %s steps at this batch, %s)", TOKENS_PER_PARAM,
        fmt_int(p->optimal_tokens, a, sizeof a), fmt_count(p->optimal_tokens, b, sizeof b),
        fmt_int(ceil(p->optimal_steps), c, sizeof c), fmt_flops(p->optimal_flops, "FLOP", d, sizeof d));
    row(out, "the recipe's run", "%s tokens = %.2f × compute-optimal", fmt_count(p->tokens, a, sizeof a),
        p->trained_factor);
    if (p->trained_factor > 1.25) {
        row(out, "", "over-trained: more data than compute-optimal for this size (a good");
        row(out, "", "trade when inference cost matters more than training cost)");
    } else if (p->trained_factor < 0.8) {
        row(out, "", "under-trained: for this compute a smaller model, or more steps for");
        row(out, "", "this one, would reach a lower loss");
    } else {
        row(out, "", "about compute-optimal");
    }
}

/* Text right-aligned in `width` display columns (µ is two bytes, one column). */
static void cell(FILE *out, const char *text, int width)
{
    int pad = width - display_width(text);
    fprintf(out, "%*s%s", pad > 0 ? pad : 0, "", text);
}

/* The all-reduce of one step on cost.count devices, and what it adds. */
static void print_step(const struct tr_plan *p, FILE *out)
{
    const struct tr_plan_scale *s = &p->scale[0];
    char a[64], b[64], c[64];
    if (s->link.kind == TR_LINK_NONE) {
        row(out, "gradient all-reduce", "not estimated: no link speeds for %s (not counted below)",
            p->hardware->name);
        return;
    }
    row(out, "gradient all-reduce", "≈ %s per step: %s of %s gradients in %lld bucket(s) of %s",
        fmt_seconds(s->allreduce_seconds, a, sizeof a), fmt_bytes(p->gradient_bytes, b, sizeof b),
        tr_dtype_name(p->grad), (long long)s->buckets, fmt_bytes(p->bucket_bytes, c, sizeof c));
    row(out, "", "(parallel.bucket_mb), each a ring over %s at %.3g GB/s each way and %.2g µs",
        s->link.name, s->link.bytes_per_second / 1e9, s->link.latency_seconds * 1e6);
    row(out, "", "a hop: 2(n-1)/n × bytes / bandwidth + 2(n-1) × latency%s",
        s->link.kind == TR_LINK_NETWORK ? " (the ring spans nodes)" : "");
    row(out, "overlap with backward", "backward (2/3 of the %s compute) hides all but %s",
        fmt_seconds(s->compute_seconds, a, sizeof a), fmt_seconds(s->exposed_seconds, b, sizeof b));
    row(out, "step", "%s compute + %s exposed = %s: scaling efficiency %.1f%%",
        fmt_seconds(s->compute_seconds, a, sizeof a), fmt_seconds(s->exposed_seconds, b, sizeof b),
        fmt_seconds(s->step_seconds, c, sizeof c), 100 * s->efficiency);
}

/* The same run on fewer devices: time, cost, and which count to use. */
static void print_scaling(const struct tr_plan *p, FILE *out)
{
    char a[64], b[64], c[64], d[64], e[64];
    int uneven = 0;
    fprintf(out, "\nscaling  (the recipe's run on fewer devices, at %s prices)\n",
            p->cost.spot ? "spot" : "on-demand");
    fprintf(out, "  %7s %6s  %-8s %12s %12s %12s %10s %21s %13s\n", "devices", "nodes", "link",
            "all-reduce", "exposed", "step", "efficiency", "time", "cost");
    for (int i = 0; i < p->n_scale; i++) {
        const struct tr_plan_scale *s = &p->scale[i];
        int none = s->devices == 1 || s->link.kind == TR_LINK_NONE;
        fprintf(out, "  %7lld %6lld  %-8s", (long long)s->devices, (long long)s->nodes,
                s->devices == 1 ? "-" : s->link.name);
        cell(out, none ? "-" : fmt_seconds(s->allreduce_seconds, a, sizeof a), 12);
        cell(out, none ? "-" : fmt_seconds(s->exposed_seconds, b, sizeof b), 12);
        cell(out, fmt_seconds(s->step_seconds, c, sizeof c), 12);
        fprintf(out, " %9.1f%%", 100 * s->efficiency);
        cell(out, fmt_hours(s->hours, d, sizeof d), 21);
        cell(out, fmt_dollars(s->dollars, e, sizeof e), 13);
        fprintf(out, "%s%s\n", s->even ? "" : " *", i == p->suggested ? "  <-" : "");
        uneven |= !s->even;
    }
    if (uneven)
        fprintf(out, "  * train.batch does not split evenly over these devices (and micro-batches)\n");
    const struct tr_plan_scale *now = &p->scale[0], *best = &p->scale[p->suggested];
    if (p->suggested > 0) {
        fprintf(out, "  fewer devices per job would be cheaper: %lld device(s) cost %s instead of %s (%.0f%% less)\n"
                "  and take %s instead of %s; at %lld, %.0f%% of each step waits for the all-reduce%s\n",
                (long long)best->devices, fmt_dollars(best->dollars, a, sizeof a),
                fmt_dollars(now->dollars, b, sizeof b), 100 * (1 - best->dollars / now->dollars),
                fmt_hours(best->hours, c, sizeof c), fmt_hours(now->hours, d, sizeof d),
                (long long)now->devices, 100 * (1 - now->efficiency),
                now->link.kind == TR_LINK_NETWORK && best->link.kind != TR_LINK_NETWORK
                    ? " over the network" : "");
    } else {
        fprintf(out, "  %lld devices cost within %.0f%% of the cheapest count: fewer would only take "
                "longer\n", (long long)now->devices, 100 * (CHEAP_ENOUGH - 1));
    }
}

static void print_projection(const struct tr_plan *p, FILE *out)
{
    const struct tr_hardware *hw = p->hardware;
    char a[64], b[64], c[64], d[64];
    fprintf(out, "\nprojection on %lld × %s  (%s)\n", (long long)p->cost.count, hw->name,
            hw->description);
    if (p->peak_flops <= 0) {
        row(out, "time and cost", "no known %s peak for %s: set cost.peak_tflops (dense TFLOP/s per "
            "device)", p->peak_kind, hw->name);
        return;
    }
    double sustained = p->peak_flops * p->cost.mfu * (double)p->cost.count;
    row(out, "compute", "%s peak %s/s%s × MFU %.2f × %lld = %s/s", p->peak_kind,
        fmt_flops(p->peak_flops, "FLOP", a, sizeof a),
        p->cost.peak_tflops > 0 ? " (cost.peak_tflops)" : "", p->cost.mfu, (long long)p->cost.count,
        fmt_flops(sustained, "FLOP", b, sizeof b));
    row(out, "throughput", "%s %ss/s; a step computes in %s",
        fmt_count(sustained / p->flops_per_token, a, sizeof a), p->sequence_model ? "token" : "sample",
        fmt_seconds(p->flops_per_step / sustained, b, sizeof b));
    if (p->cost.count > 1)
        print_step(p, out);
    row(out, "prices per device-hour", "%s on-demand, %s spot", fmt_dollars(p->price, a, sizeof a),
        fmt_dollars(p->spot_price, b, sizeof b));
    if (p->cost.price < 0 || p->cost.spot_price < 0)
        row(out, "", "%s", strcmp(hw->name, "cpu") == 0
                         ? "(this machine: set cost.price to what it costs you)"
                         : "(typical list prices; set yours with cost.price, cost.spot_price)");
    fprintf(out, "\n");
    row(out, "", "%-20s%14s%14s%14s", "time", "device-hours", "on-demand", "spot");
    struct {
        const char *what;
        double hours, dollars, spot;
    } rows[] = {
        {"the recipe's run", p->hours, p->dollars, p->spot_dollars},
        {"compute-optimal", p->optimal_hours, p->optimal_dollars, p->optimal_spot_dollars},
    };
    size_t n_rows = p->sequence_model ? 2 : 1; /* compute-optimal: language models only */
    for (size_t i = 0; i < n_rows; i++)
        row(out, rows[i].what, "%-20s%14s%14s%14s%s", fmt_hours(rows[i].hours, a, sizeof a),
            fmt_device_hours(rows[i].hours * (double)p->cost.count, b, sizeof b),
            fmt_dollars(rows[i].dollars, c, sizeof c), fmt_dollars(rows[i].spot, d, sizeof d),
            p->cost.spot ? " *" : "");
    row(out, "", "cost = devices × hours × price per device-hour");
    if (p->cost.spot)
        row(out, "", "* planned at spot prices (cost.spot)");
    if (p->cost.budget > 0) {
        double planned = p->cost.spot ? p->spot_dollars : p->dollars;
        row(out, "budget", "%s: the recipe's run is %s, %.0f%% of it",
            fmt_dollars(p->cost.budget, a, sizeof a), fmt_dollars(planned, b, sizeof b),
            100 * planned / p->cost.budget);
    }
    if (p->cost.count > 1)
        print_scaling(p, out);
}

static void print_learning_rate(const struct tr_plan *p, FILE *out)
{
    char a[64], label[64];
    fprintf(out, "\nlearning rate  (linear scaling: lr × (batch / B0), B0 = %lld at lr %g)\n",
            (long long)p->batch, p->lr);
    for (int k = 2; k <= 8; k *= 2) {
        snprintf(label, sizeof label, "batch %s (×%d)", fmt_int((double)p->batch * k, a, sizeof a), k);
        row(out, label, "lr %.3g", p->lr * k);
    }
    row(out, "", "a starting point, not a law: lengthen the warmup with the batch, and");
    row(out, "", "expect it to break down past the critical batch size (for Adam,");
    row(out, "", "lr × √k is often the safer guess)");
}

static void print_warnings(const struct tr_plan *p, FILE *out)
{
    char a[64], b[64];
    if (!p->fits) {
        fprintf(out, "\nwarning: the model does not fit on %s: %s needed per device%s, %s "
                "usable.\n", p->device, fmt_bytes(device_need(p), a, sizeof a),
                p->pipe.stages > 1 ? " (the largest stage)" : "",
                fmt_bytes(p->usable_bytes, b, sizeof b));
        if (p->max_micro_batch > 0)
            fprintf(out, "  Lower train.micro_batch (%lld fits and divides the batch), ",
                    (long long)p->max_micro_batch);
        else
            fprintf(out, "  Parameters, gradients and optimizer state alone need %s: ",
                    fmt_bytes(p->fixed_bytes, a, sizeof a));
        /* activations grow with the context: the first lever of a long one */
        if (p->sequence_model && p->fixed_bytes < p->memory_total)
            fprintf(out, "shorten the context\n  (model.ctx, now %lld tokens a sample), ",
                    (long long)p->tokens_per_sample);
        if (p->compute == TR_F32)
            fprintf(out, "use a lower\n  precision (precision = \"bf16\"), a smaller model "
                    "(model.dim, model.layers)\n");
        else
            fprintf(out, "use a smaller\n  model (model.dim, model.layers)");
        fprintf(out, "%sor a device with more memory (cost.hardware).\n",
                p->compute == TR_F32 ? "  " : " ");
    }
    if (p->batch % (p->cost.count * p->micro_batch) != 0)
        fprintf(out, "\nwarning: train.batch (%lld) is not a multiple of cost.count × "
                "train.micro_batch (%lld × %lld):\n  the devices cannot share it evenly.\n",
                (long long)p->batch, (long long)p->cost.count, (long long)p->micro_batch);
    if (p->hardware && p->cost.budget > 0 && p->peak_flops > 0) {
        double planned = p->cost.spot ? p->spot_dollars : p->dollars;
        if (planned > p->cost.budget)
            fprintf(out, "\nwarning: the recipe's run (%s) is over the budget (cost.budget = %s).\n",
                    fmt_dollars(planned, a, sizeof a), fmt_dollars(p->cost.budget, b, sizeof b));
        else if (planned >= p->cost.warn_at * p->cost.budget)
            fprintf(out, "\nwarning: the recipe's run (%s) would spend %.0f%% of the budget "
                    "(cost.warn_at = %.2f).\n", fmt_dollars(planned, a, sizeof a),
                    100 * planned / p->cost.budget, p->cost.warn_at);
    }
}

void tr_plan_print(const struct tr_plan *p, FILE *out)
{
    fprintf(out, "plan for %s (%s), precision %s\n\n", p->recipe, p->name, p->precision);
    print_model(p, out);
    print_memory(p, out);
    if (p->pipe.stages > 1)
        print_pipeline(p, out);
    print_optimal(p, out);
    if (p->hardware) {
        print_projection(p, out);
    } else {
        fprintf(out, "\nno hardware: set cost.hardware for memory fit, time and dollars, e.g.\n"
                "  trainrun plan %s cost.hardware=h100-80gb gpus=8\n  known:", p->recipe);
        for (size_t i = 0; i < tr_hardware_count(); i++)
            fprintf(out, " %s", tr_hardware_at(i)->name);
        fprintf(out, "\n");
    }
    print_learning_rate(p, out);
    print_warnings(p, out);
}

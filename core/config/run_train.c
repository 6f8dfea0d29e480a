/*
 * The train section's resolution: the run's length from steps, tokens,
 * epochs or time (the step count derived once the data is known), and the
 * micro-batch in effect with the batch's rules across sections
 * (run_parts.h, run_config.h).
 */
#include "run_parts.h"

#include "../util/util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

double tr_parse_count(const char *text)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || errno || !(x >= 0))
        return -1;
    static const char suffix[] = "kMBT";
    if (*end) {
        const char *at = strchr(suffix, end[0]);
        if (end[0] == 'K')
            at = suffix;
        if (!at || end[1])
            return -1;
        for (long i = 0; i <= at - suffix; i++)
            x *= 1000;
    }
    return x;
}

double tr_parse_duration(const char *text)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || errno || !(x >= 0))
        return -1;
    double unit = !*end ? 1 : strcmp(end, "s") == 0 ? 1 : strcmp(end, "m") == 0 ? 60
                : strcmp(end, "h") == 0 ? 3600 : strcmp(end, "d") == 0 ? 86400 : -1;
    return unit < 0 ? -1 : x * unit;
}

/* How specific a length's place is: the command line 3, the recipe named
 * on it 2, a file it extends or includes 1. */
static int length_rank(struct tr_config *cfg, const struct tr_value *v)
{
    if (v->origin.kind != TR_FROM_RECIPE)
        return v->origin.kind == TR_FROM_DEFAULT ? 0 : 3;
    char a[PATH_MAX], b[PATH_MAX];
    const char *recipe = tr_recipe_path(cfg->recipe);
    if (v->origin.file && realpath(v->origin.file, a) && realpath(recipe, b))
        return strcmp(a, b) == 0 ? 2 : 1;
    return v->origin.file && strcmp(v->origin.file, recipe) == 0 ? 2 : 1;
}

/* train.tokens = "2B" and train.time = "6h" are read here into numbers
 * (the option table checks their ranges); one of steps, tokens and epochs
 * sets the length: the one in the most specific place, with a note, and
 * two in one place are an error naming both. */
int tr_train_length(struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    static const char *const keys[] = {"train.steps", "train.tokens", "train.epochs"};
    char where[600], other[600];
    struct tr_value *vals[3] = {NULL, NULL, NULL};
    int rank[3] = {0, 0, 0}, best = -1;
    for (int i = 0; i < 3; i++) {
        struct tr_value *v = tr_value_get(root, keys[i]);
        if (!v)
            continue;
        if (i == 1 && v->type == TR_V_STRING) {
            double n = tr_parse_count(v->string);
            tr_value_where(v, where, sizeof where);
            if (n < 0)
                return tr_fail(err, "%strain.tokens: '%s' is not a token count; write e.g. "
                               "\"2B\", \"500M\", \"12k\" or 2e9", where, v->string);
            v->type = TR_V_NUMBER;
            v->number = n;
            tr_value_set_text(v, NULL); /* the options read a number now */
        }
        if (v->type == TR_V_NUMBER && v->number == 0 && i > 0)
            continue; /* tokens = 0, epochs = 0: not set */
        vals[i] = v;
        rank[i] = length_rank(cfg, v);
        if (best < 0 || rank[i] > rank[best])
            best = i;
    }
    /* The most specific place wins, as with any key: the command line over
     * the recipe, the recipe over a base it extends (train.tokens=2B on the
     * command line replaces a base's train.steps); two lengths in one place
     * are a contradiction. */
    for (int i = 0; i < 3 && best >= 0; i++) {
        if (!vals[i] || i == best)
            continue;
        tr_value_where(vals[i], where, sizeof where);
        tr_value_where(vals[best], other, sizeof other);
        if (rank[i] == rank[best])
            return tr_fail(err, "%s%s and %s (%.*s) both set the run's length; keep one of "
                           "train.steps, train.tokens and train.epochs (train.time may go "
                           "with any)", where, keys[i], keys[best],
                           (int)(strlen(other) > 2 ? strlen(other) - 2 : 0), other);
        if (cfg->rank.rank == 0)
            tr_log(TR_LOG_INFO, NULL, "note: %s (%.*s) sets the run's length; %s (%.*s) is "
                   "not used", keys[best], (int)(strlen(other) > 2 ? strlen(other) - 2 : 0),
                   other, keys[i], (int)(strlen(where) > 2 ? strlen(where) - 2 : 0), where);
        if (i > 0)
            vals[i]->number = 0; /* show prints it as not set */
    }
    if (best >= 0)
        cfg->train.length_from = best == 0 ? TR_LENGTH_STEPS : best == 1 ? TR_LENGTH_TOKENS
                                                                          : TR_LENGTH_EPOCHS;
    struct tr_value *t = tr_value_get(root, "train.time");
    if (t && t->type == TR_V_STRING) {
        double s = tr_parse_duration(t->string);
        tr_value_where(t, where, sizeof where);
        if (s < 0)
            return tr_fail(err, "%strain.time: '%s' is not a duration; write e.g. \"90s\", "
                           "\"45m\", \"1.5h\", \"2d\" or seconds", where, t->string);
        t->type = TR_V_NUMBER;
        t->number = s;
        tr_value_set_text(t, NULL);
    }
    if (best < 0 && t && t->type == TR_V_NUMBER && t->number > 0)
        cfg->train.length_from = TR_LENGTH_TIME;
    return TR_OK;
}

int tr_train_resolve_steps(struct tr_config *cfg, uint64_t tokens_per_sample, uint64_t samples,
                           uint64_t micro_batch, tr_err *err)
{
    struct tr_train_config *t = &cfg->train;
    char where[600];
    double steps;
    switch (t->length_from) {
    case TR_LENGTH_STEPS:
        return TR_OK;
    case TR_LENGTH_TIME:
        t->steps = (int64_t)STEPS_MAX; /* the clock ends it */
        return TR_OK;
    case TR_LENGTH_TOKENS:
        tr_config_where(cfg, "train.tokens", where, sizeof where);
        if (!tokens_per_sample)
            return tr_fail(err, "%strain.tokens: the model reads no token sequence; give "
                           "train.steps or train.epochs", where);
        steps = ceil(t->tokens / ((double)t->batch * (double)tokens_per_sample));
        break;
    default: { /* epochs */
        tr_config_where(cfg, "train.epochs", where, sizeof where);
        uint64_t per_epoch = micro_batch ? samples / micro_batch : 0;
        uint64_t per_step = micro_batch ? (uint64_t)t->batch / micro_batch : 0;
        if (!per_epoch || !per_step)
            return tr_fail(err, "%strain.epochs: the training split has %llu samples, fewer than "
                           "a micro-batch of %llu; give train.steps", where,
                           (unsigned long long)samples, (unsigned long long)micro_batch);
        steps = ceil(t->epochs * (double)per_epoch / (double)per_step);
        break;
    }
    }
    if (!(steps <= STEPS_MAX))
        return tr_fail(err, "%s%s gives %.3g steps, more than %.0g; is it a typo?", where,
                       t->length_from == TR_LENGTH_TOKENS ? "train.tokens" : "train.epochs",
                       steps, STEPS_MAX);
    /* only here: the recipe's tree is not written after load (show and
     * the record print the steps in effect from the config, record.c) */
    t->steps = steps < 1 ? 1 : (int64_t)steps;
    return TR_OK;
}

/* Cross-section rules: the micro-batch in effect (unset: the whole batch,
 * or each rank's even share; "auto": the whole batch until the run chooses
 * it), the linear scaling of lr, and a micro-batch that divides the batch
 * into shares every rank runs alike. */
int tr_train_resolve_batch(struct tr_config *cfg, tr_err *err)
{
    struct tr_train_config *t = &cfg->train;
    int64_t ranks = tr_config_ranks(cfg);
    /* pipeline stages share no data: the replicas (ranks / stages) do; ranks
     * that are no multiple of the stages are refused by the session, which
     * says how many to start */
    if (cfg->parallel.pipeline > 1)
        ranks = ranks % cfg->parallel.pipeline == 0 ? ranks / cfg->parallel.pipeline : 1;
    if (t->micro_batch == 0 && !t->auto_micro_batch) {
        /* unset: the whole batch, split evenly among the ranks when they can */
        t->micro_batch = ranks > 1 && t->batch % ranks == 0 ? t->batch / ranks : t->batch;
    }
    if (t->auto_micro_batch) /* chosen at run time; show says so */
        t->micro_batch = t->batch;
    if (cfg->optimizer.reference_batch > 0)
        cfg->optimizer.lr *= (double)t->batch / (double)cfg->optimizer.reference_batch;
    if (t->batch % t->micro_batch != 0) {
        char where[600];
        tr_config_where(cfg, "train.micro_batch", where, sizeof where);
        return tr_fail(err, "%s: train: micro_batch (%lld) must divide batch (%lld)", where,
                       (long long)t->micro_batch, (long long)t->batch);
    }
    /* every rank runs the same number of micro-batches of each global batch */
    if (ranks > 1 && (t->batch / t->micro_batch) % ranks != 0 && !t->auto_micro_batch) {
        char where[600];
        tr_config_where(cfg, "train.batch", where, sizeof where);
        return tr_fail(err, "%s: train: batch %lld is %lld micro-batch(es) of %lld, which %lld ranks "
                       "cannot share evenly; make batch / micro_batch a multiple of %lld (e.g. "
                       "micro_batch = %lld)", where, (long long)t->batch,
                       (long long)(t->batch / t->micro_batch), (long long)t->micro_batch,
                       (long long)ranks, (long long)ranks,
                       t->batch % ranks == 0 ? (long long)(t->batch / ranks) : 1LL);
    }
    return TR_OK;
}

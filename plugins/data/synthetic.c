/*
 * data = { plugin = "synthetic", kind = "tokens" }: generated data for
 * benchmarks and smoke runs; no files, any size, learnable.
 *
 * Every sample is a pure function of (seed, split, index), computed with a
 * counter-based hash, so reads are deterministic, thread-safe and cost no
 * memory.
 *
 *   tokens:   a random first token, then token[t+1] = (a * token[t] + c) mod
 *             classes with a, c fixed by the seed: a model that learns the
 *             map drives the loss towards zero.
 *   features: x ~ U(-1, 1) per feature, label = argmax_k (W x)_k for a fixed
 *             random W: a linear classifier can reach 100% accuracy.
 */
#include <trainrun/mix.h>
#include <trainrun/plugin.h>

#include <stdlib.h>
#include <string.h>

static const char *const synthetic_kinds[] = {"tokens", "features", NULL};

struct synthetic_config {
    const char *kind;
    int64_t classes;
    int64_t features;
    int64_t samples;
    int64_t val_samples;
    int64_t seed;
};

static const struct tr_option synthetic_options[] = {
    {TR_OPT_ENUM, "kind", "tokens", 0, 0, synthetic_kinds,
     "tokens: sequences for language models (needs a sequence model); features: "
     "fixed-length float vectors with a class label",
     offsetof(struct synthetic_config, kind)},
    {TR_OPT_INT, "classes", "256", 2, INT32_MAX, NULL,
     "vocabulary size (kind = tokens) or number of classes (kind = features)",
     offsetof(struct synthetic_config, classes)},
    {TR_OPT_INT, "features", "64", 1, 1 << 20, NULL,
     "floats per sample for kind = features",
     offsetof(struct synthetic_config, features)},
    {TR_OPT_INT, "samples", "65536", 1, 1e12, NULL,
     "training samples", offsetof(struct synthetic_config, samples)},
    {TR_OPT_INT, "val_samples", "1024", 1, 1e12, NULL,
     "validation samples (drawn independently of the training ones)",
     offsetof(struct synthetic_config, val_samples)},
    {TR_OPT_INT, "seed", "0", -9007199254740991.0, 9007199254740991.0, NULL,
     "selects the data set; independent of the run's seed, so runs with different seeds "
     "see the same data",
     offsetof(struct synthetic_config, seed)},
    {.type = TR_OPT_END},
};

/* Teacher weights above this many floats would cost too much memory. */
#define MAX_TEACHER_WEIGHTS (1u << 26)

struct synthetic {
    int tokens;             /* kind = tokens, else features */
    uint32_t classes;
    uint32_t features;
    uint32_t seq_len;
    uint64_t samples[TR_SPLIT_COUNT];
    uint64_t seed;
    uint64_t a, c;          /* tokens: the next-token map */
    float *teacher;         /* features: classes x features */
};

/* A random 64-bit value for (seed, stream, counter). */
static uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t counter)
{
    return tr_splitmix64(tr_splitmix64(tr_splitmix64(seed) ^ stream) ^ counter);
}

/* Uniform in [-1, 1), from the top 24 bits (exactly representable in float). */
static float uniform_pm1(uint64_t h)
{
    return (float)(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* Distinct streams for the teacher, the token map and each split. */
enum { STREAM_TEACHER = 1, STREAM_MAP = 2, STREAM_SPLIT0 = 16 };

static void synthetic_destroy(void *self)
{
    struct synthetic *s = self;
    if (!s)
        return;
    free(s->teacher);
    free(s);
}

static int synthetic_create(const struct tr_host *host, const void *config,
                            const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    const struct synthetic_config *cfg = config;
    int tokens = strcmp(cfg->kind, "tokens") == 0;
    if (tokens && args->seq_len == 0)
        return tr_fail(err,
                       "synthetic data: kind = \"tokens\" needs a sequence model (the model "
                       "reports seq_len = 0); use kind = \"features\" for this model");
    if (!tokens && (uint64_t)cfg->classes * (uint64_t)cfg->features > MAX_TEACHER_WEIGHTS)
        return tr_fail(err,
                       "synthetic data: classes * features = %lld is too large for the "
                       "teacher matrix (limit %u); lower classes or features",
                       (long long)(cfg->classes * cfg->features), MAX_TEACHER_WEIGHTS);

    struct synthetic *s = calloc(1, sizeof *s);
    if (!s)
        return tr_fail(err, "synthetic data: out of memory");
    s->tokens = tokens;
    s->classes = (uint32_t)cfg->classes;
    s->features = (uint32_t)cfg->features;
    s->seq_len = args->seq_len;
    s->samples[TR_SPLIT_TRAIN] = (uint64_t)cfg->samples;
    s->samples[TR_SPLIT_VAL] = (uint64_t)cfg->val_samples;
    s->seed = (uint64_t)cfg->seed;

    if (tokens) {
        /* a = 1 (mod 4) and c odd: for power-of-two vocabularies the map
         * then visits every token (full-period LCG), so all tokens occur */
        uint64_t quarter = s->classes / 4 ? s->classes / 4 : 1;
        s->a = (4 * (hash3(s->seed, STREAM_MAP, 0) % quarter) + 1) % s->classes;
        s->c = (hash3(s->seed, STREAM_MAP, 1) | 1) % s->classes;
    } else {
        size_t n = (size_t)s->classes * s->features;
        s->teacher = malloc(n * sizeof *s->teacher);
        if (!s->teacher) {
            free(s);
            return tr_fail(err, "synthetic data: out of memory for the teacher matrix");
        }
        for (size_t i = 0; i < n; i++)
            s->teacher[i] = uniform_pm1(hash3(s->seed, STREAM_TEACHER, i));
    }
    *self = s;
    return TR_OK;
}

static int synthetic_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct synthetic *s = self;
    out->struct_size = sizeof *out;
    out->samples[TR_SPLIT_TRAIN] = s->samples[TR_SPLIT_TRAIN];
    out->samples[TR_SPLIT_VAL] = s->samples[TR_SPLIT_VAL];
    out->input_dtype = s->tokens ? TR_I32 : TR_F32;
    out->input_len = s->tokens ? s->seq_len : s->features;
    out->target_len = s->tokens ? s->seq_len : 1;
    out->classes = s->classes;
    return TR_OK;
}

static void token_sample(const struct synthetic *s, uint64_t stream, uint64_t index,
                         int32_t *in, int32_t *target)
{
    uint64_t tok = hash3(s->seed, stream, index) % s->classes;
    for (uint32_t t = 0; t < s->seq_len; t++) {
        in[t] = (int32_t)tok;
        tok = (s->a * tok + s->c) % s->classes;
        target[t] = (int32_t)tok;
    }
}

static void feature_sample(const struct synthetic *s, uint64_t stream, uint64_t index,
                           float *x, int32_t *label)
{
    /* each sample draws its features from its own counter range */
    uint64_t base = hash3(s->seed, stream, index);
    for (uint32_t f = 0; f < s->features; f++)
        x[f] = uniform_pm1(tr_splitmix64(base + f));
    int32_t best = 0;
    double best_score = -HUGE_VAL;
    for (uint32_t k = 0; k < s->classes; k++) {
        const float *w = s->teacher + (size_t)k * s->features;
        double score = 0;
        for (uint32_t f = 0; f < s->features; f++)
            score += (double)w[f] * x[f];
        if (score > best_score) {
            best_score = score;
            best = (int32_t)k;
        }
    }
    *label = best;
}

static int synthetic_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                          void *inputs, int32_t *targets, tr_err *err)
{
    const struct synthetic *s = self;
    if ((unsigned)split >= TR_SPLIT_COUNT)
        return tr_fail(err, "synthetic data: unknown split %d", (int)split);
    uint64_t stream = STREAM_SPLIT0 + (uint64_t)split;
    for (size_t i = 0; i < n; i++) {
        if (indices[i] >= s->samples[split])
            return tr_fail(err, "synthetic data: sample %llu out of range (split has %llu)",
                           (unsigned long long)indices[i],
                           (unsigned long long)s->samples[split]);
        if (s->tokens)
            token_sample(s, stream, indices[i], (int32_t *)inputs + i * s->seq_len,
                         targets + i * s->seq_len);
        else
            feature_sample(s, stream, indices[i], (float *)inputs + i * s->features,
                           targets + i);
    }
    return TR_OK;
}

static const struct tr_data_vtable synthetic_vtable = {
    .struct_size = sizeof(struct tr_data_vtable),
    .info = synthetic_info,
    .read = synthetic_read,
};

static const struct tr_plugin_info synthetic_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "synthetic",
    .version = "0.1.0",
    .description = "generated token sequences or labelled feature vectors for benchmarks and "
                   "smoke runs",
    .options = synthetic_options,
    .config_size = sizeof(struct synthetic_config),
    .create = synthetic_create,
    .destroy = synthetic_destroy,
    .vtable = &synthetic_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &synthetic_plugin_info;
}

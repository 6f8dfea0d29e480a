/*
 * data = { plugin = "text", path = "corpus.txt" }: a raw text file read as
 * bytes (vocabulary 256), for character-level language models.
 *
 * The file is split by position: the first (1 - val_fraction) of its bytes
 * train, the rest validate.  Sample j of a split is the window of seq_len
 * bytes starting at j * seq_len inside that split; its targets are the same
 * window shifted by one byte.  The file is mapped read-only, so concurrent
 * reads need no locking.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs under strict C11 */

#include <trainrun/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct text_config {
    const char *path;
    double val_fraction;
};

static const struct tr_option text_options[] = {
    {TR_OPT_STRING, "path", NULL, 0, 0, NULL,
     "required: the text file (any bytes; relative paths are relative to the current "
     "directory)",
     offsetof(struct text_config, path)},
    {TR_OPT_FLOAT, "val_fraction", "0.1", 0, 0.5, NULL,
     "fraction of the file, taken from its end, used for validation (0: no validation)",
     offsetof(struct text_config, val_fraction)},
    {.type = TR_OPT_END},
};

struct text {
    const unsigned char *bytes; /* the mapped file */
    size_t size;
    uint32_t seq_len;
    uint64_t start[TR_SPLIT_COUNT];   /* first byte of each split */
    uint64_t samples[TR_SPLIT_COUNT];
};

static void text_destroy(void *self)
{
    struct text *t = self;
    if (!t)
        return;
    if (t->bytes)
        munmap((void *)t->bytes, t->size);
    free(t);
}

static int fail_open(tr_err *err, const char *path, int errnum)
{
    if (path[0] == '/')
        return tr_fail(err, "text data: cannot open %s: %s; check data.path", path,
                       strerror(errnum));
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        snprintf(cwd, sizeof cwd, "?");
    return tr_fail(err,
                   "text data: cannot open %s: %s (a relative path is relative to the current "
                   "directory, %s); check data.path",
                   path, strerror(errnum), cwd);
}

/* Each split needs seq_len + 1 bytes for one (input, target) window. */
static int check_split(tr_err *err, const char *path, const char *split, uint64_t have,
                       uint32_t seq_len, double val_fraction)
{
    uint64_t need = (uint64_t)seq_len + 1;
    if (have >= need)
        return TR_OK;
    return tr_fail(err,
                   "text data: the %s split of %s has %llu bytes but one sample of seq_len %u "
                   "needs %llu (val_fraction = %g); use a longer file, a shorter sequence%s",
                   split, path, (unsigned long long)have, seq_len, (unsigned long long)need,
                   val_fraction,
                   split[0] == 'v' ? ", a larger val_fraction, or val_fraction = 0" : "");
}

static int text_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    const struct text_config *cfg = config;
    if (args->seq_len == 0)
        return tr_fail(err,
                       "text data: the text source needs a sequence model (the model reports "
                       "seq_len = 0); use a sequence model or another data plugin");

    int fd = open(cfg->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail_open(err, cfg->path, errno);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tr_fail(err, "text data: cannot stat %s: %s", cfg->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tr_fail(err, "text data: %s is not a regular file; check data.path", cfg->path);
    }
    if (st.st_size == 0) {
        close(fd);
        return tr_fail(err, "text data: %s is empty; point data.path at a text file",
                       cfg->path);
    }

    size_t size = (size_t)st.st_size;
    uint64_t val_len = (uint64_t)((double)size * cfg->val_fraction);
    uint64_t train_len = size - val_len;
    if (check_split(err, cfg->path, "training", train_len, args->seq_len, cfg->val_fraction) ||
        (cfg->val_fraction > 0 &&
         check_split(err, cfg->path, "validation", val_len, args->seq_len, cfg->val_fraction))) {
        close(fd);
        return TR_ERROR;
    }

    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return tr_fail(err, "text data: cannot map %s: %s", cfg->path, strerror(map_errno));

    struct text *t = calloc(1, sizeof *t);
    if (!t) {
        munmap(map, size);
        return tr_fail(err, "text data: out of memory");
    }
    t->bytes = map;
    t->size = size;
    t->seq_len = args->seq_len;
    t->start[TR_SPLIT_TRAIN] = 0;
    t->start[TR_SPLIT_VAL] = train_len;
    t->samples[TR_SPLIT_TRAIN] = (train_len - 1) / args->seq_len;
    t->samples[TR_SPLIT_VAL] = val_len > 0 ? (val_len - 1) / args->seq_len : 0;
    *self = t;
    return TR_OK;
}

static int text_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct text *t = self;
    out->struct_size = sizeof *out;
    out->samples[TR_SPLIT_TRAIN] = t->samples[TR_SPLIT_TRAIN];
    out->samples[TR_SPLIT_VAL] = t->samples[TR_SPLIT_VAL];
    out->input_dtype = TR_I32;
    out->input_len = t->seq_len;
    out->target_len = t->seq_len;
    out->classes = 256;
    return TR_OK;
}

static int text_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                     void *inputs, int32_t *targets, tr_err *err)
{
    const struct text *t = self;
    if ((unsigned)split >= TR_SPLIT_COUNT)
        return tr_fail(err, "text data: unknown split %d", (int)split);
    int32_t *in = inputs;
    const size_t T = t->seq_len;
    for (size_t i = 0; i < n; i++) {
        if (indices[i] >= t->samples[split])
            return tr_fail(err, "text data: sample %llu out of range (split has %llu)",
                           (unsigned long long)indices[i],
                           (unsigned long long)t->samples[split]);
        const unsigned char *w = t->bytes + t->start[split] + indices[i] * T;
        for (size_t k = 0; k < T; k++) {
            in[i * T + k] = w[k];
            targets[i * T + k] = w[k + 1];
        }
    }
    return TR_OK;
}

static const struct tr_data_vtable text_vtable = {
    .version = 1,
    .struct_size = sizeof(struct tr_data_vtable),
    .info = text_info,
    .read = text_read,
};

static const struct tr_plugin_info text_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "text",
    .version = "0.1.0",
    .description = "a raw text file as byte tokens (vocabulary 256) for character-level models",
    .options = text_options,
    .config_size = sizeof(struct text_config),
    .create = text_create,
    .destroy = text_destroy,
    .vtable = &text_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &text_plugin_info;
}

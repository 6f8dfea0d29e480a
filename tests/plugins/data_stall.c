/*
 * A data plugin for the SIGTERM tests: features of 8 numbers and 3 classes,
 * whose reads block for good (stall_after) or fail (fail_after) once that
 * many reads were made, as a read from a hung network filesystem or a
 * broken file would; with both, failing wins from fail_after on, so one
 * worker can be stuck while another fails; fail_val makes every read of
 * the validation split fail (an evaluation that breaks after training).
 * data = { plugin = "stall", stall_after = 5 }
 */
#define _POSIX_C_SOURCE 200809L
#include <trainrun/plugin.h>

#include <stddef.h>
#include <stdio.h>
#include <time.h>

struct stall_config {
    int64_t stall_after, fail_after;
    int fail_val;
};

static const struct tr_option options[] = {
    {TR_OPT_INT, "stall_after", "0", 0, 1000000000, NULL,
     "reads after which every read blocks forever; 0: never", offsetof(struct stall_config, stall_after)},
    {TR_OPT_INT, "fail_after", "0", 0, 1000000000, NULL,
     "reads after which every read fails; 0: never", offsetof(struct stall_config, fail_after)},
    {TR_OPT_BOOL, "fail_val", "false", 0, 0, NULL, "every read of the validation split fails",
     offsetof(struct stall_config, fail_val)},
    {.type = TR_OPT_END},
};

struct stall {
    struct stall_config cfg;
    long reads; /* atomically counted: workers read concurrently */
};

static int create(const struct tr_host *h, const void *c, const struct tr_create_args *a,
                  void **self, tr_err *err)
{
    (void)h, (void)a;
    static struct stall s;
    s.cfg = *(const struct stall_config *)c;
    s.reads = 0;
    *self = &s;
    (void)err;
    return TR_OK;
}

static int info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)self, (void)err;
    out->samples[TR_SPLIT_TRAIN] = 512;
    out->samples[TR_SPLIT_VAL] = 64;
    out->input_dtype = TR_F32;
    out->input_len = 8;
    out->target_len = 1;
    out->classes = 3;
    return TR_OK;
}

static int read_samples(void *self, enum tr_split split, const uint64_t *idx, size_t n,
                        void *inputs, int32_t *targets, tr_err *err)
{
    struct stall *s = self;
    long k = __atomic_add_fetch(&s->reads, 1, __ATOMIC_SEQ_CST);
    int fails = s->cfg.fail_after && k > s->cfg.fail_after;
    if (split == TR_SPLIT_TRAIN && s->cfg.stall_after && k > s->cfg.stall_after && !fails) {
        FILE *f = fopen("stalled", "w"); /* tells the test the loader is stuck now */
        if (f)
            fclose(f);
        for (;;) {
            struct timespec t = {3600, 0};
            nanosleep(&t, NULL);
        }
    }
    if (split == TR_SPLIT_VAL && s->cfg.fail_val) {
        snprintf(err->msg, sizeof err->msg, "stall: a validation read fails (fail_val)");
        return TR_ERROR;
    }
    if (split == TR_SPLIT_TRAIN && fails) {
        snprintf(err->msg, sizeof err->msg, "stall: read %ld fails (fail_after)", k);
        return TR_ERROR;
    }
    float *x = inputs;
    for (size_t i = 0; i < n; i++) {
        for (int j = 0; j < 8; j++)
            x[i * 8 + (size_t)j] = (float)((idx[i] * 7 + (uint64_t)j * 3) % 11) / 11.0f;
        targets[i] = (int32_t)(idx[i] % 3);
    }
    return TR_OK;
}

static const struct tr_data_vtable vt = {sizeof vt, info, read_samples};
static const struct tr_plugin_info plugin = {
    .abi_major = TR_ABI_MAJOR, .struct_size = sizeof plugin, .kind = TR_KIND_DATA,
    .name = "stall", .version = "1", .description = "reads that block or fail (tests)",
    .options = options, .config_size = sizeof(struct stall_config), .create = create,
    .vtable = &vt};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &plugin; }

/*
 * logger = { "tensorboard" }: the run's scalars as TensorBoard event files,
 * RUN/tb/events.out.tfevents.<unix time>.<host>, which `tensorboard
 * --logdir RUN/tb` (and `wandb sync --sync-tensorboard RUN/tb`) read.
 *
 * The format, as TensorBoard's own writer produces it:
 *   - a TFRecord file: each record is a little-endian u64 length, the
 *     masked CRC32C of those 8 bytes, the data, the masked CRC32C of the
 *     data (mask: rotate right by 15, add 0xa282ead8);
 *   - each record's data is a serialized tensorflow.Event protobuf: the
 *     first carries file_version "brain.Event:2", then one per logged step
 *     with a Summary of Value { tag, simple_value } per scalar.
 * The protobuf is written by hand: a dozen fields of three messages do not
 * warrant a protobuf library in the build (Debian's protobuf-c would also
 * need the .proto compiled in).  Field numbers (tensorflow/core/util/
 * event.proto, summary.proto): Event.wall_time 1 (double), Event.step 2
 * (int64), Event.file_version 3 (string), Event.summary 5 (Summary);
 * Summary.value 1 (repeated Value); Value.tag 1 (string),
 * Value.simple_value 2 (float).
 *
 * A resumed run writes a new file beside the earlier ones: TensorBoard
 * reads every events file in the directory and orders them by step.
 */
#include <trainrun/plugin.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

struct tb_config {
    const char *dir;
};

static const struct tr_option tb_options[] = {
    {TR_OPT_STRING, "dir", "tb", 0, 0, NULL,
     "directory of the event files, relative to the run directory (tensorboard --logdir RUN/tb)",
     offsetof(struct tb_config, dir)},
    {.type = TR_OPT_END},
};

struct tb {
    const struct tr_host *host;
    char dir[4096];
    char path[4400];
    FILE *f;
};

/* ---- CRC32C (Castagnoli), reflected, the table built once -------------- */

static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c(const unsigned char *p, size_t n)
{
    if (!crc_table[1])
        crc_init();
    uint32_t c = 0xffffffffu;
    while (n--)
        c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked_crc(const unsigned char *p, size_t n)
{
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf, the few wire types used --------------------------------- */

struct buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
};

static void put(struct buf *b, const void *data, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void varint(struct buf *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, tmp, n);
}

static void key(struct buf *b, unsigned field, unsigned wire) { varint(b, (uint64_t)field << 3 | wire); }

static void le(struct buf *b, uint64_t v, size_t bytes)
{
    unsigned char tmp[8];
    for (size_t i = 0; i < bytes; i++)
        tmp[i] = (unsigned char)(v >> (8 * i));
    put(b, tmp, bytes);
}

static void bytes_field(struct buf *b, unsigned field, const void *data, size_t n)
{
    key(b, field, 2);
    varint(b, n);
    put(b, data, n);
}

/* Event { wall_time, step } and, after it, either file_version or summary */
static void event_head(struct buf *b, uint64_t step)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double wall = (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
    uint64_t bits;
    memcpy(&bits, &wall, sizeof bits);
    key(b, 1, 1);
    le(b, bits, 8);
    key(b, 2, 0);
    varint(b, step); /* int64 as a varint: steps are never negative */
}

/* One TFRecord, flushed so that TensorBoard sees whole records during the run. */
static int record(struct tb *t, const struct buf *data, tr_err *err)
{
    if (data->oom)
        return tr_fail(err, "out of memory encoding a TensorBoard event");
    unsigned char head[12];
    for (int i = 0; i < 8; i++)
        head[i] = (unsigned char)((uint64_t)data->n >> (8 * i));
    uint32_t lc = masked_crc(head, 8), dc = masked_crc(data->p, data->n);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (unsigned char)(lc >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++)
        tail[i] = (unsigned char)(dc >> (8 * i));
    if (fwrite(head, 1, 12, t->f) != 12 || fwrite(data->p, 1, data->n, t->f) != data->n ||
        fwrite(tail, 1, 4, t->f) != 4 || fflush(t->f) != 0)
        return tr_fail(err, "cannot write %s: %s; free space on its disk, or drop \"tensorboard\" "
                       "from logger", t->path, strerror(errno));
    return TR_OK;
}

/* ---- the plugin ---------------------------------------------------------- */

static int tb_create(const struct tr_host *host, const void *config,
                     const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct tb_config *cfg = config;
    if (!*cfg->dir || strstr(cfg->dir, ".."))
        return tr_fail(err, "dir \"%s\" must name a directory inside the run directory",
                       cfg->dir);
    struct tb *t = calloc(1, sizeof *t);
    if (!t)
        return tr_fail(err, "out of memory");
    t->host = host;
    if (cfg->dir[0] == '/')
        snprintf(t->dir, sizeof t->dir, "%s", cfg->dir);
    else
        snprintf(t->dir, sizeof t->dir, "%s/%s", args->run_dir, cfg->dir);
    *self = t;
    return TR_OK;
}

static int tb_open(void *self, int resume, tr_err *err)
{
    struct tb *t = self;
    (void)resume; /* a new file either way: TensorBoard merges the directory's files */
    if (mkdir(t->dir, 0777) != 0 && errno != EEXIST)
        return tr_fail(err, "cannot create %s: %s", t->dir, strerror(errno));
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    /* the name TensorBoard's writer gives; a second file in the same second
     * (a quick resume) gets a suffix instead of replacing the first */
    for (int i = 0; i < 1000; i++) {
        if (i == 0)
            snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%lld.%s", t->dir,
                     (long long)tv.tv_sec, host);
        else
            snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%lld.%s.%d", t->dir,
                     (long long)tv.tv_sec, host, i);
        if (access(t->path, F_OK) != 0)
            break;
    }
    t->f = fopen(t->path, "wbx");
    if (!t->f)
        return tr_fail(err, "cannot create %s: %s", t->path, strerror(errno));
    struct buf b = {0};
    event_head(&b, 0);
    bytes_field(&b, 3, "brain.Event:2", strlen("brain.Event:2"));
    int rc = record(t, &b, err);
    free(b.p);
    return rc;
}

static int tb_scalars(void *self, uint64_t step, const struct tr_scalar *v, size_t n, tr_err *err)
{
    struct tb *t = self;
    struct buf summary = {0}, value = {0}, ev = {0};
    for (size_t i = 0; i < n; i++) {
        value.n = 0;
        bytes_field(&value, 1, v[i].name, strlen(v[i].name));
        float f = (float)v[i].value;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        key(&value, 2, 5);
        le(&value, bits, 4);
        if (value.oom)
            summary.oom = 1;
        else
            bytes_field(&summary, 1, value.p, value.n);
    }
    event_head(&ev, step);
    if (summary.oom)
        ev.oom = 1;
    else
        bytes_field(&ev, 5, summary.p, summary.n);
    int rc = record(t, &ev, err);
    free(summary.p);
    free(value.p);
    free(ev.p);
    return rc;
}

static int tb_close(void *self, tr_err *err)
{
    struct tb *t = self;
    if (!t->f)
        return TR_OK;
    int bad = 0, e = 0;
    if (fflush(t->f) != 0 || fsync(fileno(t->f)) != 0) {
        bad = 1;
        e = errno;
    }
    if (fclose(t->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    t->f = NULL;
    return bad ? tr_fail(err, "cannot write %s: %s", t->path, strerror(e)) : TR_OK;
}

static void tb_destroy(void *self)
{
    struct tb *t = self;
    if (t && t->f)
        fclose(t->f);
    free(t);
}

static const struct tr_logger_vtable tb_vtable = {
    .struct_size = sizeof(struct tr_logger_vtable),
    .open = tb_open,
    .scalars = tb_scalars,
    .close = tb_close,
};

static const struct tr_plugin_info tb_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_LOGGER,
    .name = "tensorboard",
    .version = "0.1.0",
    .description = "TensorBoard event files of the run's scalars in RUN/tb (tensorboard --logdir)",
    .options = tb_options,
    .config_size = sizeof(struct tb_config),
    .create = tb_create,
    .destroy = tb_destroy,
    .vtable = &tb_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &tb_info;
}

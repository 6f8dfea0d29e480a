/*
 * data = { plugin = "idx", images = "train-images-idx3-ubyte",
 *          labels = "train-labels-idx1-ubyte" }: the IDX format of MNIST and
 * its relatives.  Files may be gzip-compressed (.gz) or plain.
 *
 * IDX: bytes 0,0, an element type (0x08 unsigned byte, 0x0D float32), the
 * number of dimensions, then each dimension as a big-endian uint32, then the
 * elements, big-endian, row-major.  The first dimension counts the items.
 *
 * Both files are loaded into memory at create and kept in their stored
 * element type; read() converts to float and applies `scale`.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs under strict C11 */

#include <trainrun/plugin.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"

enum { IDX_UBYTE = 0x08, IDX_FLOAT32 = 0x0D };

struct idx_config {
    const char *images;
    const char *labels;
    const char *val_images;
    const char *val_labels;
    double val_fraction;
    double scale;
};

static const struct tr_option idx_options[] = {
    {TR_OPT_STRING, "images", NULL, 0, 0, NULL,
     "required: IDX file of training inputs (e.g. train-images-idx3-ubyte, optionally .gz; "
     "relative paths are relative to the current directory)",
     offsetof(struct idx_config, images)},
    {TR_OPT_STRING, "labels", NULL, 0, 0, NULL,
     "required: IDX file of training labels, one integer class per image",
     offsetof(struct idx_config, labels)},
    {TR_OPT_STRING, "val_images", "", 0, 0, NULL,
     "IDX file of validation inputs; empty: validate on the last val_fraction of the "
     "training files",
     offsetof(struct idx_config, val_images)},
    {TR_OPT_STRING, "val_labels", "", 0, 0, NULL,
     "IDX file of validation labels; set together with val_images",
     offsetof(struct idx_config, val_labels)},
    {TR_OPT_FLOAT, "val_fraction", "0.1", 0, 0.5, NULL,
     "fraction of the training files, from their end, used for validation when "
     "val_images is empty",
     offsetof(struct idx_config, val_fraction)},
    {TR_OPT_FLOAT, "scale", "0", 0, 0, NULL,
     "inputs are multiplied by this; 0: 1/255 for unsigned-byte files (pixels in [0, 1]) "
     "and 1 for float32 files",
     offsetof(struct idx_config, scale)},
    {.type = TR_OPT_END},
};

/* One loaded images+labels pair. */
struct idx_set {
    unsigned char *file;        /* the whole (decompressed) images file */
    const unsigned char *elems; /* first element, inside file */
    int dtype;
    uint64_t count;
    int32_t *labels;            /* count */
    float max_abs;              /* largest |element| */
};

struct idx {
    struct idx_set train, val;  /* val.count == 0: validation comes from train */
    uint32_t features;          /* elements per image */
    uint32_t classes;
    float scale;
    const struct idx_set *set[TR_SPLIT_COUNT];
    uint64_t start[TR_SPLIT_COUNT];
    uint64_t samples[TR_SPLIT_COUNT];
};

/* A parsed IDX header. */
struct idx_header {
    int dtype;
    uint32_t ndims;
    uint64_t count;   /* first dimension */
    uint64_t per_item;/* product of the other dimensions */
    size_t header_size;
};

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static float be_float(const unsigned char *p)
{
    uint32_t bits = be32(p);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* *acc *= factor; returns 1 if that overflowed. */
static int mul_overflows(uint64_t *acc, uint64_t factor)
{
    if (factor != 0 && *acc > UINT64_MAX / factor)
        return 1;
    *acc *= factor;
    return 0;
}

/* Read a whole file, decompressing it if it is gzip'd. */
static int read_all(const char *option, const char *path, unsigned char **out, size_t *size,
                    tr_err *err)
{
    int errnum = 0;
    gzFile f = data_gzopen(path, &errnum);
    if (!f)
        return errnum ? data_fail_open(err, "idx", option, path, errnum)
                      : tr_fail(err, "idx data: out of memory opening %s", path);
    gzbuffer(f, 1 << 17);
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < (1u << 20)) {
            size_t grown = cap ? cap * 2 : (4u << 20);
            unsigned char *p = realloc(buf, grown);
            if (!p) {
                free(buf);
                gzclose(f);
                return tr_fail(err, "idx data: out of memory reading %s", path);
            }
            buf = p;
            cap = grown;
        }
        int got = gzread(f, buf + len, (unsigned)(cap - len > INT_MAX ? INT_MAX : cap - len));
        if (got <= 0) {
            int zerr;
            const char *zmsg = data_gz_message(f, path, &zerr);
            if (got < 0 || zerr != Z_OK) {
                int rc = tr_fail(err, "idx data: cannot read %s: %s (is the file complete?)",
                                 path, zerr == Z_ERRNO ? strerror(errno) : zmsg);
                free(buf);
                gzclose(f);
                return rc;
            }
            break;
        }
        len += (size_t)got;
    }
    gzclose(f);
    *out = buf;
    *size = len;
    return TR_OK;
}

static int parse_header(const char *path, const unsigned char *b, size_t size,
                        struct idx_header *h, tr_err *err)
{
    if (size < 4 || b[0] != 0 || b[1] != 0)
        return tr_fail(err,
                       "idx data: %s: wrong magic number (%s): not an IDX file, which starts "
                       "with two zero bytes, a type byte and a dimension count",
                       path, size < 4 ? "file shorter than 4 bytes" : "first bytes not 00 00");
    h->dtype = b[2];
    h->ndims = b[3];
    if (h->dtype != IDX_UBYTE && h->dtype != IDX_FLOAT32)
        return tr_fail(err,
                       "idx data: %s: element type 0x%02X is not supported; this plugin reads "
                       "0x08 (unsigned byte) and 0x0D (float32)",
                       path, h->dtype);
    if (h->ndims == 0)
        return tr_fail(err, "idx data: %s: wrong magic number: zero dimensions", path);
    h->header_size = 4 + 4 * (size_t)h->ndims;
    if (size < h->header_size)
        return tr_fail(err,
                       "idx data: %s is truncated: %zu bytes, but its header alone needs %zu; "
                       "download it again",
                       path, size, h->header_size);
    h->count = be32(b + 4);
    h->per_item = 1;
    int overflow = 0;
    for (uint32_t d = 1; d < h->ndims; d++)
        overflow |= mul_overflows(&h->per_item, be32(b + 4 + 4 * d));
    uint64_t payload = h->count;
    overflow |= mul_overflows(&payload, h->per_item);
    overflow |= mul_overflows(&payload, h->dtype == IDX_UBYTE ? 1 : 4);
    if (overflow || payload > SIZE_MAX - h->header_size)
        return tr_fail(err, "idx data: %s: the header's dimensions are implausibly large; the "
                       "file is damaged or not IDX", path);
    uint64_t expected = h->header_size + payload;
    if (size < expected)
        return tr_fail(err,
                       "idx data: %s is truncated: %zu bytes, but its header (%llu items of "
                       "%llu elements) needs %llu; download it again",
                       path, size, (unsigned long long)h->count,
                       (unsigned long long)h->per_item, (unsigned long long)expected);
    if (size > expected)
        return tr_fail(err,
                       "idx data: %s has %zu bytes, but its header promises %llu items in "
                       "%llu bytes; the file is damaged or not IDX",
                       path, size, (unsigned long long)h->count, (unsigned long long)expected);
    return TR_OK;
}

static void free_set(struct idx_set *s)
{
    free(s->file);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

/* Load one images+labels pair; *features is set by the first call and
 * checked by later ones. */
/* The images of a set: the file read, its items' size matching the
 * training images', float elements finite (their largest magnitude kept). */
static int load_images(struct idx_set *s, const char *img_option, const char *img_path,
                       const char *lbl_option, uint32_t *features, struct idx_header *ih,
                       tr_err *err)
{
    size_t img_size;
    if (read_all(img_option, img_path, &s->file, &img_size, err) ||
        parse_header(img_path, s->file, img_size, ih, err))
        return TR_ERROR;
    if (ih->ndims < 2)
        return tr_fail(err,
                       "idx data: %s has one dimension, like a labels file; check that data.%s "
                       "and data.%s are not swapped",
                       img_path, img_option, lbl_option);
    if (ih->per_item == 0 || ih->per_item > UINT32_MAX)
        return tr_fail(err, "idx data: %s: %llu elements per item is not supported", img_path,
                       (unsigned long long)ih->per_item);
    if (*features && ih->per_item != *features)
        return tr_fail(err,
                       "idx data: %s has %llu elements per item but the training images have "
                       "%u; use matching files",
                       img_path, (unsigned long long)ih->per_item, *features);
    *features = (uint32_t)ih->per_item;
    s->dtype = ih->dtype;
    s->elems = s->file + ih->header_size;
    s->count = ih->count;
    /* NaN or infinity in the inputs would train on garbage without a word;
     * the largest magnitude also bounds what `scale` may multiply */
    s->max_abs = 255;
    if (s->dtype == IDX_FLOAT32) {
        s->max_abs = 0;
        for (uint64_t i = 0; i < ih->count * ih->per_item; i++) {
            float v = be_float(s->elems + 4 * i);
            if (!isfinite(v))
                return tr_fail(err, "idx data: %s: element %llu of item %llu is %g; inputs "
                               "must be finite numbers", img_path,
                               (unsigned long long)(i % ih->per_item),
                               (unsigned long long)(i / ih->per_item), v);
            if (fabsf(v) > s->max_abs)
                s->max_abs = fabsf(v);
        }
    }
    return TR_OK;
}

/* The labels of a set, one per image, each a class index; *max_label
 * raised to the largest. */
static int load_labels(struct idx_set *s, const char *img_option, const char *img_path,
                       const char *lbl_option, const char *lbl_path, const struct idx_header *ih,
                       uint32_t *max_label, tr_err *err)
{
    size_t lbl_size;
    struct idx_header lh;
    unsigned char *lbl_file = NULL;
    int rc = TR_ERROR;
    if (read_all(lbl_option, lbl_path, &lbl_file, &lbl_size, err) ||
        parse_header(lbl_path, lbl_file, lbl_size, &lh, err))
        goto out;
    if (lh.ndims != 1) {
        tr_fail(err,
                "idx data: %s has %u dimensions, but labels have one; check that data.%s and "
                "data.%s are not swapped",
                lbl_path, lh.ndims, img_option, lbl_option);
        goto out;
    }
    if (lh.count != ih->count) {
        tr_fail(err,
                "idx data: %s holds %llu images but %s holds %llu labels; the counts must "
                "match (are they from the same set?)",
                img_path, (unsigned long long)ih->count, lbl_path, (unsigned long long)lh.count);
        goto out;
    }
    s->labels = malloc((lh.count ? lh.count : 1) * sizeof *s->labels);
    if (!s->labels) {
        tr_fail(err, "idx data: out of memory loading %s", lbl_path);
        goto out;
    }
    const unsigned char *p = lbl_file + lh.header_size;
    for (uint64_t i = 0; i < lh.count; i++) {
        double v = lh.dtype == IDX_UBYTE ? p[i] : be_float(p + 4 * i);
        if (!(v >= 0 && v == floor(v) && v <= INT32_MAX)) {
            tr_fail(err, "idx data: %s: label %llu is %g, not a class index 0, 1, 2, ...",
                    lbl_path, (unsigned long long)i, v);
            goto out;
        }
        s->labels[i] = (int32_t)v;
        if ((uint32_t)v > *max_label)
            *max_label = (uint32_t)v;
    }
    rc = TR_OK;
out:
    free(lbl_file);
    return rc;
}

static int load_set(struct idx_set *s, const char *img_option, const char *img_path,
                    const char *lbl_option, const char *lbl_path, uint32_t *features,
                    uint32_t *max_label, tr_err *err)
{
    struct idx_header ih;
    if (load_images(s, img_option, img_path, lbl_option, features, &ih, err) != TR_OK ||
        load_labels(s, img_option, img_path, lbl_option, lbl_path, &ih, max_label, err) != TR_OK) {
        free_set(s);
        return TR_ERROR;
    }
    return TR_OK;
}

static void idx_destroy(void *self)
{
    struct idx *d = self;
    if (!d)
        return;
    free_set(&d->train);
    free_set(&d->val);
    free(d);
}

static int idx_create(const struct tr_host *host, const void *config,
                      const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    const struct idx_config *cfg = config;
    int own_val = cfg->val_images[0] != '\0';
    if (own_val != (cfg->val_labels[0] != '\0'))
        return tr_fail(err,
                       "idx data: set both val_images and val_labels, or neither (then the "
                       "last val_fraction of the training files validates)");

    struct idx *d = calloc(1, sizeof *d);
    if (!d)
        return tr_fail(err, "idx data: out of memory");
    uint32_t max_label = 0;
    if (load_set(&d->train, "images", cfg->images, "labels", cfg->labels, &d->features,
                 &max_label, err) ||
        (own_val && load_set(&d->val, "val_images", cfg->val_images, "val_labels",
                             cfg->val_labels, &d->features, &max_label, err))) {
        idx_destroy(d);
        return TR_ERROR;
    }
    if (d->train.count == 0) {
        idx_destroy(d);
        return tr_fail(err, "idx data: %s holds no images", cfg->images);
    }
    if (own_val && d->val.dtype != d->train.dtype) {
        idx_destroy(d);
        return tr_fail(err,
                       "idx data: %s and %s store different element types; convert one so "
                       "both use the same scale",
                       cfg->images, cfg->val_images);
    }

    d->classes = max_label + 1;
    d->scale = (float)(cfg->scale != 0 ? cfg->scale
                       : d->train.dtype == IDX_UBYTE ? 1.0 / 255.0 : 1.0);
    float largest = d->train.max_abs > d->val.max_abs ? d->train.max_abs : d->val.max_abs;
    if (!isfinite(d->scale) || !isfinite(largest * d->scale)) {
        idx_destroy(d);
        return tr_fail(err,
                       "idx data: scale = %g times the largest input, %g, is beyond what a "
                       "float holds (|x| <= 3.4e38); lower data.scale",
                       cfg->scale, (double)largest);
    }
    d->set[TR_SPLIT_TRAIN] = &d->train;
    d->start[TR_SPLIT_TRAIN] = 0;
    if (own_val) {
        d->samples[TR_SPLIT_TRAIN] = d->train.count;
        d->set[TR_SPLIT_VAL] = &d->val;
        d->start[TR_SPLIT_VAL] = 0;
        d->samples[TR_SPLIT_VAL] = d->val.count;
    } else {
        uint64_t val = (uint64_t)((double)d->train.count * cfg->val_fraction);
        d->samples[TR_SPLIT_TRAIN] = d->train.count - val;
        d->set[TR_SPLIT_VAL] = &d->train;
        d->start[TR_SPLIT_VAL] = d->train.count - val;
        d->samples[TR_SPLIT_VAL] = val;
    }
    *self = d;
    return TR_OK;
}

static int idx_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct idx *d = self;
    return data_info(out, d->samples, TR_F32, d->features, 1, d->classes);
}

static int idx_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                    void *inputs, int32_t *targets, tr_err *err)
{
    const struct idx *d = self;
    if (data_check_read(err, "idx", split, d->samples, indices, n) != TR_OK)
        return TR_ERROR;
    const struct idx_set *s = d->set[split];
    const size_t F = d->features;
    float *x = inputs;
    for (size_t i = 0; i < n; i++) {
        uint64_t item = d->start[split] + indices[i];
        float *row = x + i * F;
        if (s->dtype == IDX_UBYTE) {
            const unsigned char *src = s->elems + item * F;
            for (size_t k = 0; k < F; k++)
                row[k] = src[k] * d->scale;
        } else {
            const unsigned char *src = s->elems + item * F * 4;
            for (size_t k = 0; k < F; k++)
                row[k] = be_float(src + 4 * k) * d->scale;
        }
        targets[i] = s->labels[item];
    }
    return TR_OK;
}

static const struct tr_data_vtable idx_vtable = {
    .struct_size = sizeof(struct tr_data_vtable),
    .info = idx_info,
    .read = idx_read,
};

static const struct tr_plugin_info idx_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "idx",
    .version = "0.1.0",
    .description = "MNIST-style IDX image and label files (unsigned byte or float32, .gz ok)",
    .options = idx_options,
    .config_size = sizeof(struct idx_config),
    .create = idx_create,
    .destroy = idx_destroy,
    .vtable = &idx_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &idx_plugin_info;
}

/*
 * data = { plugin = "images", dir = "data/glyphs-32" }: the TRIMAGES shards
 * `trainrun prepare --format images` writes (include/trainrun/images.h),
 * memory-mapped; each sample is one image as float HWC (x[H,W,C], the
 * layout the convolutional ops take) and its class.
 *
 * In the loader workers, per training sample: a random crop of the image
 * padded by `pad` zeros (torchvision's RandomCrop(size, padding=pad)), a
 * random horizontal flip when `flip` (RandomHorizontalFlip), then
 * per-channel x = (pixel / 255 - mean) / std (ToTensor, Normalize).
 * Validation samples are only normalized.
 *
 * The read() contract gives a sample's index and nothing else (no epoch):
 * the same (split, index) must give the same sample.  So that a run sees
 * other crops of an image as it trains on, the training split offers each
 * image as `views` samples: sample i is view i / N of image i % N (N
 * images), its crop and flip drawn from (seed, image, view) alone, and the
 * loader's shuffle over N x views samples picks among them.  The same
 * seed gives the same batches for any number of loader workers.  The
 * engine counts train.epochs in images, not views (tr_data_info's
 * train_views).
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs under strict C11 */

#include <trainrun/images.h>
#include <trainrun/plugin.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

struct images_config {
    const char *dir;
    int64_t pad;
    int flip;
    const char *mean;
    const char *std;
    int64_t views;
    int verify;
};

static const struct tr_option images_options[] = {
    {TR_OPT_STRING, "dir", NULL, 0, 0, NULL,
     "required: the directory `trainrun prepare --format images` wrote (train_NNNNNN.bin, "
     "val_NNNNNN.bin; relative to the current directory)",
     offsetof(struct images_config, dir)},
    {TR_OPT_INT, "pad", "0", 0, 1024, NULL,
     "training images are padded by this many zero pixels on every side and a random "
     "crop of the original size taken (RandomCrop(size, padding=pad)); 0: no crop",
     offsetof(struct images_config, pad)},
    {TR_OPT_BOOL, "flip", "false", 0, 0, NULL,
     "training images are mirrored left-right at random (RandomHorizontalFlip); off by "
     "default: digits, letters and other sets are not mirror-invariant",
     offsetof(struct images_config, flip)},
    {TR_OPT_STRING, "mean", "0.5", 0, 0, NULL,
     "per-channel mean subtracted from pixel / 255: one number for every channel, one per "
     "channel (\"0.485,0.456,0.406\"), or \"imagenet\"",
     offsetof(struct images_config, mean)},
    {TR_OPT_STRING, "std", "0.5", 0, 0, NULL,
     "per-channel standard deviation divided by, after the mean: one number, one per "
     "channel, or \"imagenet\" (0.229,0.224,0.225)",
     offsetof(struct images_config, std)},
    {TR_OPT_INT, "views", "0", 0, 1000000, NULL,
     "augmented views offered per training image (sample i is view i / N of image i % N); "
     "0: 16 when pad or flip is set, else 1.  Setting it to train.epochs shows each image "
     "exactly that many times, each time in another view",
     offsetof(struct images_config, views)},
    {TR_OPT_BOOL, "verify", "true", 0, 0, NULL,
     "check each shard's checksum when the run starts (reads every shard once)",
     offsetof(struct images_config, verify)},
    {.type = TR_OPT_END},
};

struct shard {
    void *map;
    size_t size;
    const unsigned char *pixels;
    const unsigned char *labels;
    uint64_t first; /* index of its first image in the split */
    uint64_t count;
};

struct split {
    struct shard *v;
    int n;
    uint64_t count;
};

struct images {
    struct split split[TR_SPLIT_COUNT];
    struct tr_images_header head; /* of the first shard: every shard's shape */
    uint64_t samples[TR_SPLIT_COUNT];
    uint64_t views;
    int pad, flip;
    uint64_t seed;
    float scale[3], bias[3]; /* x = pixel * scale + bias */
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "<prefix>_NNNNNN.bin" */
static int is_shard_name(const char *name, const char *prefix)
{
    size_t p = strlen(prefix);
    if (strncmp(name, prefix, p) != 0 || name[p] != '_' || strlen(name) != p + 11 ||
        strcmp(name + p + 7, ".bin") != 0)
        return 0;
    for (size_t i = p + 1; i < p + 7; i++)
        if (name[i] < '0' || name[i] > '9')
            return 0;
    return 1;
}

/* The names of dir's shards of one split, "<prefix>_NNNNNN.bin", sorted,
 * in *names (the caller frees them, even on failure); dir is closed. */
static int list_shards(DIR *dir, const char *prefix, char ***names_out, size_t *n_out,
                       tr_err *err)
{
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = TR_OK;
    while (rc == TR_OK && (e = readdir(dir))) {
        if (!is_shard_name(e->d_name, prefix))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) {
                rc = tr_fail(err, "images data: out of memory");
                break;
            }
            names = grown;
        }
        names[n] = strdup(e->d_name);
        if (!names[n])
            rc = tr_fail(err, "images data: out of memory");
        else
            n++;
    }
    closedir(dir);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    *names_out = names;
    *n_out = n;
    return rc;
}

/* A mapped shard's content: the same image shape as the first, its
 * checksum when verified, every label below its classes. */
static int check_shard(struct images *d, const struct images_config *cfg, struct split *s,
                       struct shard *sh, const char *path, tr_err *err)
{
    struct tr_images_header h;
    char why[256];
    if (tr_images_header_read(sh->map, sh->size, &h, why, sizeof why) != 0)
        return tr_fail(err, "images data: %s: %s; run trainrun prepare --format images "
                       "again", path, why);
    if (d->head.version == 0) {
        d->head = h;
    } else if (h.height != d->head.height || h.width != d->head.width ||
               h.channels != d->head.channels || h.classes != d->head.classes) {
        return tr_fail(err, "images data: %s holds %ux%ux%u images of %u classes, but the "
                       "first shard %ux%ux%u of %u; shards of one directory come from one "
                       "prepare", path, h.height, h.width, h.channels, h.classes,
                       d->head.height, d->head.width, d->head.channels, d->head.classes);
    }
    uint64_t bytes = tr_images_image_bytes(&h);
    sh->pixels = (const unsigned char *)sh->map + TR_IMAGES_HEADER_BYTES;
    sh->labels = sh->pixels + h.count * bytes;
    sh->count = h.count;
    sh->first = s->count;
    s->count += h.count;
    if (cfg->verify) {
        uint64_t sum = tr_images_checksum(sh->pixels, sh->size - TR_IMAGES_HEADER_BYTES);
        if (sum != h.checksum)
            return tr_fail(err, "images data: %s: the checksum does not match its content "
                           "(the file was damaged or changed after prepare wrote it); run "
                           "trainrun prepare --format images again", path);
    }
    for (uint64_t k = 0; k < h.count; k++) {
        uint32_t label = tr_images_le32(sh->labels + 4 * k);
        if (label >= h.classes)
            return tr_fail(err, "images data: %s: image %llu has class %u, but the shard "
                           "has %u classes", path, (unsigned long long)k, label, h.classes);
    }
    return TR_OK;
}

/* Shard `name` of dir mapped as the split's next shard, and checked. */
static int map_shard(struct images *d, const struct images_config *cfg, struct split *s,
                     const char *name, tr_err *err)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", cfg->dir, name);
    struct shard *sh = &s->v[s->n];
    int errnum = 0;
    enum data_map_result m = data_map_file(path, &sh->map, &sh->size, &errnum);
    if (m == DATA_CANNOT_OPEN)
        return data_fail_open(err, "images", "dir", path, errnum);
    if (m != DATA_MAPPED)
        return tr_fail(err, "images data: %s: %s; run trainrun prepare --format images "
                       "again", path,
                       m == DATA_EMPTY ? "empty file" : tr_input_strerror(errnum));
    s->n++;
    return check_shard(d, cfg, s, sh, path, err);
}

static int map_split(struct images *d, const struct images_config *cfg, enum tr_split which,
                     const char *prefix, tr_err *err)
{
    DIR *dir = opendir(cfg->dir);
    if (!dir)
        return data_fail_open(err, "images", "dir", cfg->dir, errno);
    char **names;
    size_t n;
    int rc = list_shards(dir, prefix, &names, &n, err);
    struct split *s = &d->split[which];
    s->v = calloc(n ? n : 1, sizeof *s->v);
    if (!s->v && rc == TR_OK)
        rc = tr_fail(err, "images data: out of memory");
    for (size_t i = 0; i < n && rc == TR_OK; i++)
        rc = map_shard(d, cfg, s, names[i], err);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* "0.5", "0.485,0.456,0.406" or "imagenet" into out[channels]. */
static int parse_channels(const char *option, const char *text, const double imagenet[3],
                          int channels, float out[3], tr_err *err)
{
    double v[3];
    int n = 0;
    if (strcmp(text, "imagenet") == 0) {
        memcpy(v, imagenet, sizeof v);
        n = 3;
    } else {
        const char *p = text;
        for (;;) {
            char *end;
            errno = 0;
            double x = strtod(p, &end);
            if (end == p || errno || !isfinite(x) || n == 3)
                return tr_fail(err, "images data: %s = \"%s\" is not one number or one per "
                               "channel separated by commas (or \"imagenet\")", option, text);
            v[n++] = x;
            p = end;
            while (*p == ' ')
                p++;
            if (!*p)
                break;
            if (*p++ != ',')
                return tr_fail(err, "images data: %s = \"%s\": numbers are separated by "
                               "commas", option, text);
        }
    }
    if (n != 1 && n != channels)
        return tr_fail(err, "images data: %s has %d values, but the images have %d channel%s; "
                       "give one value or %d", option, n, channels, channels == 1 ? "" : "s",
                       channels);
    for (int c = 0; c < channels; c++)
        out[c] = (float)v[n == 1 ? 0 : c];
    return TR_OK;
}

static void images_destroy(void *self)
{
    struct images *d = self;
    if (!d)
        return;
    for (int k = 0; k < TR_SPLIT_COUNT; k++) {
        for (int i = 0; i < d->split[k].n; i++)
            munmap(d->split[k].v[i].map, d->split[k].v[i].size);
        free(d->split[k].v);
    }
    free(d);
}

static int images_create(const struct tr_host *host, const void *config,
                         const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    const struct images_config *cfg = config;
    struct images *d = calloc(1, sizeof *d);
    if (!d)
        return tr_fail(err, "images data: out of memory");
    if (map_split(d, cfg, TR_SPLIT_TRAIN, "train", err) != TR_OK ||
        map_split(d, cfg, TR_SPLIT_VAL, "val", err) != TR_OK) {
        images_destroy(d);
        return TR_ERROR;
    }
    if (d->split[TR_SPLIT_TRAIN].count == 0) {
        images_destroy(d);
        return tr_fail(err, "images data: %s holds no training images (train_000000.bin, ...); "
                       "make them with trainrun prepare --format images FOLDER --size N -o %s",
                       cfg->dir, cfg->dir);
    }
    static const double mean_in[3] = {0.485, 0.456, 0.406}, std_in[3] = {0.229, 0.224, 0.225};
    float mean[3], std[3];
    int C = (int)d->head.channels;
    if (parse_channels("mean", cfg->mean, mean_in, C, mean, err) != TR_OK ||
        parse_channels("std", cfg->std, std_in, C, std, err) != TR_OK) {
        images_destroy(d);
        return TR_ERROR;
    }
    for (int c = 0; c < C; c++) {
        if (!(std[c] > 0)) {
            images_destroy(d);
            return tr_fail(err, "images data: std must be positive, not %g", (double)std[c]);
        }
        d->scale[c] = 1.0f / (255.0f * std[c]);
        d->bias[c] = -mean[c] / std[c];
    }
    d->pad = (int)cfg->pad;
    d->flip = cfg->flip;
    if (d->pad >= (int)d->head.height || d->pad >= (int)d->head.width) {
        int side = (int)d->head.height;
        images_destroy(d);
        return tr_fail(err, "images data: pad = %d is not smaller than the images' side (%d); "
                       "a few pixels (4 for 32x32) is usual", (int)cfg->pad, side);
    }
    d->views = cfg->views ? (uint64_t)cfg->views : (d->pad || d->flip) ? 16 : 1;
    d->seed = args->seed;
    d->samples[TR_SPLIT_TRAIN] = d->split[TR_SPLIT_TRAIN].count * d->views;
    d->samples[TR_SPLIT_VAL] = d->split[TR_SPLIT_VAL].count;
    *self = d;
    return TR_OK;
}

static int images_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct images *d = self;
    /* before data_info sets struct_size to ours: a core without the field
     * counts train.epochs in views */
    int has_views = TR_HAS_FIELD(out, struct tr_data_info, train_views);
    data_info(out, d->samples, TR_F32,
              (uint32_t)(tr_images_image_bytes(&d->head)), 1, d->head.classes);
    if (has_views)
        out->train_views = d->views;
    return TR_OK;
}

static const struct shard *find(const struct split *s, uint64_t image)
{
    int lo = 0, hi = s->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->v[mid].first <= image)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &s->v[lo];
}

static int images_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                       void *inputs, int32_t *targets, tr_err *err)
{
    const struct images *d = self;
    if (data_check_read(err, "images", split, d->samples, indices, n) != TR_OK)
        return TR_ERROR;
    const struct split *s = &d->split[split];
    const int H = (int)d->head.height, W = (int)d->head.width, C = (int)d->head.channels;
    const size_t per = (size_t)H * W * C;
    int augment = split == TR_SPLIT_TRAIN && (d->pad || d->flip);
    float *x = inputs;
    for (size_t i = 0; i < n; i++) {
        uint64_t image = indices[i] % s->count, view = indices[i] / s->count;
        const struct shard *sh = find(s, image);
        const unsigned char *src = sh->pixels + (image - sh->first) * per;
        float *out = x + i * per;
        targets[i] = (int32_t)tr_images_le32(sh->labels + 4 * (image - sh->first));
        if (!augment) {
            for (size_t k = 0; k < per; k += (size_t)C)
                for (int c = 0; c < C; c++)
                    out[k + c] = src[k + c] * d->scale[c] + d->bias[c];
            continue;
        }
        struct tr_images_view v = tr_images_draw(tr_images_key(d->seed, image, view), d->pad,
                                                 d->flip);
        for (int y = 0; y < H; y++) {
            int sy = y + v.dy - d->pad;
            for (int xx = 0; xx < W; xx++) {
                int sx = tr_images_src_x(&v, xx, W, d->pad);
                float *o = out + ((size_t)y * W + xx) * C;
                if (sy < 0 || sy >= H || sx < 0 || sx >= W) {
                    for (int c = 0; c < C; c++)
                        o[c] = d->bias[c]; /* a padding pixel: 0, normalized */
                } else {
                    const unsigned char *p = src + ((size_t)sy * W + sx) * C;
                    for (int c = 0; c < C; c++)
                        o[c] = p[c] * d->scale[c] + d->bias[c];
                }
            }
        }
    }
    return TR_OK;
}

static const struct tr_data_vtable images_vtable = {
    .struct_size = sizeof(struct tr_data_vtable),
    .info = images_info,
    .read = images_read,
};

static const struct tr_plugin_info images_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "images",
    .version = "0.1.0",
    .description = "image shards from trainrun prepare --format images (folders, WebDataset "
                   "tars): random crop, flip, normalize in the loader",
    .options = images_options,
    .config_size = sizeof(struct images_config),
    .create = images_create,
    .destroy = images_destroy,
    .vtable = &images_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &images_plugin_info;
}

/* The TRIMAGES shards of `prepare --format images` (include/trainrun/images.h): images and
 * their labels appended shard by shard to temporary files, each shard's header written last
 * (when the number of classes is known) and the shards published whole. */
#include "dataset.h"

#include "prepare_images_internal.h"
#include "prepare_internal.h"

#include "../util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int writer_finish_shard(struct image_writer *w)
{
    if (!w->f)
        return 0;
    struct shard *s = &w->shards[w->n_shards - 1];
    unsigned char b[4];
    int rc = 0;
    for (uint64_t i = 0; i < w->count && rc == 0; i++) {
        tr_images_put32(b, w->labels[i]);
        tr_images_sum_update(&w->sum, b, 4);
        if (fwrite(b, 1, 4, w->f) != 4)
            rc = -1;
    }
    s->count = w->count;
    s->checksum = tr_images_sum_final(&w->sum);
    if (rc != 0 || fflush(w->f) != 0 || ferror(w->f))
        rc = tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
    if (fclose(w->f) != 0 && rc == 0)
        rc = tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
    w->f = NULL;
    w->count = 0;
    return rc;
}

int image_writer_put(struct image_writer *w, const unsigned char *pixels, uint32_t label)
{
    size_t bytes = (size_t)w->size * (size_t)w->size * (size_t)w->channels;
    if (w->f && w->count == w->per_shard && writer_finish_shard(w) != 0)
        return -1;
    if (!w->f) {
        w->shards = realloc(w->shards, (size_t)(w->n_shards + 1) * sizeof *w->shards);
        if (!w->shards)
            return tr_prepare_fail("out of memory");
        struct shard *s = &w->shards[w->n_shards++];
        memset(s, 0, sizeof *s);
        s->path = tr_xasprintf("%s/%s_%06d.bin", w->dir, w->prefix, w->n_shards - 1);
        s->tmp = tr_xasprintf("%s.tmp-%ld", s->path, (long)getpid());
        w->f = fopen(s->tmp, "w+b");
        if (!w->f)
            return tr_prepare_fail("cannot create %s: %s", s->tmp, strerror(errno));
        /* the header is written last, once the classes of every input are known */
        unsigned char zero[TR_IMAGES_HEADER_BYTES] = {0};
        if (fwrite(zero, 1, sizeof zero, w->f) != sizeof zero)
            return tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
        tr_images_sum_init(&w->sum);
        if (!w->labels)
            w->labels = tr_xcalloc((size_t)w->per_shard, sizeof *w->labels);
    }
    if (fwrite(pixels, 1, bytes, w->f) != bytes)
        return tr_prepare_fail("cannot write %s: %s", w->shards[w->n_shards - 1].tmp,
                               strerror(errno));
    tr_images_sum_update(&w->sum, pixels, bytes);
    w->labels[w->count++] = label;
    w->total++;
    return 0;
}

int image_writer_publish(struct image_writer *w, uint32_t classes)
{
    if (writer_finish_shard(w) != 0)
        return -1;
    for (int i = 0; i < w->n_shards; i++) {
        struct shard *s = &w->shards[i];
        struct tr_images_header h = {.version = TR_IMAGES_VERSION,
                                     .height = (uint32_t)w->size,
                                     .width = (uint32_t)w->size,
                                     .channels = (uint32_t)w->channels,
                                     .count = s->count,
                                     .classes = classes,
                                     .checksum = s->checksum};
        unsigned char head[TR_IMAGES_HEADER_BYTES];
        tr_images_header_write(head, &h);
        FILE *f = fopen(s->tmp, "r+b");
        if (!f)
            return tr_prepare_fail("cannot reopen %s: %s", s->tmp, strerror(errno));
        if (fwrite(head, 1, sizeof head, f) != sizeof head) {
            fclose(f);
            return tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
        }
        if (tr_prepare_publish(s->tmp, s->path, f) != 0)
            return -1;
        free(s->tmp);
        s->tmp = NULL;
    }
    return 0;
}

void image_writer_free(struct image_writer *w)
{
    if (w->f)
        fclose(w->f);
    for (int i = 0; i < w->n_shards; i++) {
        if (w->shards[i].tmp) /* not published: an error stopped prepare */
            unlink(w->shards[i].tmp);
        free(w->shards[i].tmp);
        free(w->shards[i].path);
    }
    free(w->shards);
    free(w->labels);
}

/*
 * trainrun's image shard format ("TRIMAGES"), written by `trainrun prepare`
 * from image folders and WebDataset tar shards, read by the images data
 * source; and the random crop and flip both apply, so that prepare's offline
 * copies (--augment-copies) and the loader's on-the-fly views are the same
 * transform.  Header-only: include it to write shards from your own
 * pipeline.
 *
 *   byte  0  magic "TRIMAGES"            byte 24  u64 number of images
 *   byte  8  u32 version (1)             byte 32  u32 number of classes
 *   byte 12  u32 height                  byte 36  u32 flags (0)
 *   byte 16  u32 width                   byte 40  u64 checksum of the body
 *   byte 20  u32 channels (1 or 3)       bytes 48..63  zero
 *
 * All little-endian.  The body follows the 64-byte header: `count` images
 * of height x width x channels uint8, each row-major and channel-last (HWC:
 * R, G, B of pixel (0,0), then of (0,1), ...), the layout models take; then
 * `count` u32 labels, each below `classes` (after the pixels, so that a
 * writer streams images out and appends the labels it kept).  The checksum is
 * tr_images_checksum over the whole body: a shard cut short or changed
 * after prepare wrote it is refused rather than trained on.
 */
#ifndef TRAINRUN_IMAGES_H
#define TRAINRUN_IMAGES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mix.h"

#define TR_IMAGES_MAGIC "TRIMAGES"
#define TR_IMAGES_HEADER_BYTES 64
#define TR_IMAGES_VERSION 1
#define TR_IMAGES_MAX_SIDE 4096     /* height and width */
#define TR_IMAGES_MAX_CLASSES 1000000

struct tr_images_header {
    uint32_t version;
    uint32_t height, width, channels;
    uint64_t count;
    uint32_t classes;
    uint32_t flags;
    uint64_t checksum;
};

static inline uint32_t tr_images_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t tr_images_le64(const unsigned char *p)
{
    return (uint64_t)tr_images_le32(p) | (uint64_t)tr_images_le32(p + 4) << 32;
}

static inline void tr_images_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void tr_images_put64(unsigned char *p, uint64_t v)
{
    tr_images_put32(p, (uint32_t)v);
    tr_images_put32(p + 4, (uint32_t)(v >> 32));
}

/* The checksum: four FNV-1a-style lanes over little-endian 64-bit words
 * (word i into lane i % 4), the tail bytes into lane 0, the lanes and the
 * length mixed at the end.  Four independent lanes run at several bytes a
 * cycle, where byte-wise FNV-1a would make checking a large set slow.
 * Feed it in pieces of any length with _update, or whole with
 * tr_images_checksum: the result is the same. */
struct tr_images_sum {
    uint64_t lane[4];
    uint64_t length;
    unsigned char carry[32]; /* the bytes of an unfinished 32-byte block */
    size_t used;
};

static inline void tr_images_sum_init(struct tr_images_sum *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 4; i++)
        s->lane[i] = 0xcbf29ce484222325ULL + (uint64_t)i;
}

static inline void tr_images_sum_block(struct tr_images_sum *s, const unsigned char *p)
{
    for (int k = 0; k < 4; k++)
        s->lane[k] = (s->lane[k] ^ tr_images_le64(p + 8 * k)) * 0x100000001b3ULL;
}

static inline void tr_images_sum_update(struct tr_images_sum *s, const unsigned char *p, size_t n)
{
    s->length += n;
    if (s->used) {
        size_t take = 32 - s->used < n ? 32 - s->used : n;
        memcpy(s->carry + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used < 32)
            return;
        tr_images_sum_block(s, s->carry);
        s->used = 0;
    }
    for (; n >= 32; p += 32, n -= 32)
        tr_images_sum_block(s, p);
    memcpy(s->carry, p, n);
    s->used = n;
}

static inline uint64_t tr_images_sum_final(const struct tr_images_sum *s)
{
    uint64_t lane[4];
    memcpy(lane, s->lane, sizeof lane);
    size_t i = 0;
    for (; i + 8 <= s->used; i += 8)
        lane[i / 8] = (lane[i / 8] ^ tr_images_le64(s->carry + i)) * 0x100000001b3ULL;
    for (; i < s->used; i++)
        lane[0] = (lane[0] ^ s->carry[i]) * 0x100000001b3ULL;
    uint64_t h = tr_mix64(s->length);
    for (int k = 0; k < 4; k++)
        h = tr_mix64(h ^ lane[k]);
    return h;
}

static inline uint64_t tr_images_checksum(const unsigned char *p, size_t n)
{
    struct tr_images_sum s;
    tr_images_sum_init(&s);
    tr_images_sum_update(&s, p, n);
    return tr_images_sum_final(&s);
}

static inline void tr_images_header_write(unsigned char out[TR_IMAGES_HEADER_BYTES],
                                          const struct tr_images_header *h)
{
    memset(out, 0, TR_IMAGES_HEADER_BYTES);
    memcpy(out, TR_IMAGES_MAGIC, 8);
    tr_images_put32(out + 8, h->version);
    tr_images_put32(out + 12, h->height);
    tr_images_put32(out + 16, h->width);
    tr_images_put32(out + 20, h->channels);
    tr_images_put64(out + 24, h->count);
    tr_images_put32(out + 32, h->classes);
    tr_images_put32(out + 36, h->flags);
    tr_images_put64(out + 40, h->checksum);
}

/* Bytes of one image. */
static inline uint64_t tr_images_image_bytes(const struct tr_images_header *h)
{
    return (uint64_t)h->height * h->width * h->channels;
}

/* Parse and check the header of a shard of `size` bytes (the whole file):
 * 0, or -1 with why[] saying what is wrong (the checksum is not checked
 * here: that reads the whole body).  Every size comes from the file, so
 * each is bounded before it is multiplied. */
static inline int tr_images_header_read(const unsigned char *p, uint64_t size,
                                        struct tr_images_header *h, char *why, size_t why_size)
{
    if (size < TR_IMAGES_HEADER_BYTES || memcmp(p, TR_IMAGES_MAGIC, 8) != 0) {
        snprintf(why, why_size, "%s",
                 size < TR_IMAGES_HEADER_BYTES ? "shorter than the 64-byte header"
                                               : "no TRIMAGES magic: not an image shard");
        return -1;
    }
    h->version = tr_images_le32(p + 8);
    h->height = tr_images_le32(p + 12);
    h->width = tr_images_le32(p + 16);
    h->channels = tr_images_le32(p + 20);
    h->count = tr_images_le64(p + 24);
    h->classes = tr_images_le32(p + 32);
    h->flags = tr_images_le32(p + 36);
    h->checksum = tr_images_le64(p + 40);
    if (h->version != TR_IMAGES_VERSION) {
        snprintf(why, why_size, "version %u, but this trainrun reads version %d", h->version,
                 TR_IMAGES_VERSION);
        return -1;
    }
    if (h->height < 1 || h->height > TR_IMAGES_MAX_SIDE || h->width < 1 ||
        h->width > TR_IMAGES_MAX_SIDE || (h->channels != 1 && h->channels != 3)) {
        snprintf(why, why_size,
                 "images of %ux%ux%u; height and width must be 1 to %d and channels 1 or 3",
                 h->height, h->width, h->channels, TR_IMAGES_MAX_SIDE);
        return -1;
    }
    if (h->classes < 1 || h->classes > TR_IMAGES_MAX_CLASSES || h->flags != 0) {
        snprintf(why, why_size, "%s %u", h->flags ? "unknown flags" : "number of classes",
                 h->flags ? h->flags : h->classes);
        return -1;
    }
    uint64_t per = 4 + tr_images_image_bytes(h); /* at most 4 + 3 * 2^24 */
    if (h->count > (size - TR_IMAGES_HEADER_BYTES) / per) {
        snprintf(why, why_size,
                 "truncated: its header promises %llu images of %ux%ux%u, more than its %llu "
                 "bytes hold",
                 (unsigned long long)h->count, h->height, h->width, h->channels,
                 (unsigned long long)size);
        return -1;
    }
    if (size != TR_IMAGES_HEADER_BYTES + h->count * per) {
        snprintf(why, why_size,
                 "%llu bytes, but its header's %llu images of %ux%ux%u take %llu",
                 (unsigned long long)size, (unsigned long long)h->count, h->height, h->width,
                 h->channels, (unsigned long long)(TR_IMAGES_HEADER_BYTES + h->count * per));
        return -1;
    }
    return 0;
}

/* ---- augmentation: RandomCrop(size, padding=pad) then RandomHorizontalFlip ---- */

/* The random draw of one view, from a 64-bit key (the seed and which image
 * and view, mixed by the caller): the crop's top-left corner (dy, dx) in
 * the image padded by `pad` zeros on every side, each uniform in [0, 2 pad],
 * and whether it is mirrored (only when `flip`). */
struct tr_images_view {
    int dy, dx, mirror;
};

static inline struct tr_images_view tr_images_draw(uint64_t key, int pad, int flip)
{
    uint64_t r = tr_splitmix64(key);
    uint64_t span = 2 * (uint64_t)(pad > 0 ? pad : 0) + 1;
    struct tr_images_view v;
    v.dy = (int)((r & 0x1fffff) % span);
    v.dx = (int)(((r >> 21) & 0x1fffff) % span);
    v.mirror = flip ? (int)((r >> 63) & 1) : 0;
    return v;
}

/* The key of view `view` of image `image` under `seed`. */
static inline uint64_t tr_images_key(uint64_t seed, uint64_t image, uint64_t view)
{
    return tr_mix64(seed * TR_GOLDEN64 ^ tr_mix64(image * 0x2545f4914f6cdd1dULL ^
                                                 tr_mix64(view + 1)));
}

/* Source column of output column x of a view (may be outside [0, W): a
 * padding pixel, 0).  Rows: y + dy - pad. */
static inline int tr_images_src_x(const struct tr_images_view *v, int x, int width, int pad)
{
    return (v->mirror ? width - 1 - x : x) + v->dx - pad;
}

/* The view of src (H x W x C uint8) into dst (same shape, uint8). */
static inline void tr_images_apply_u8(const unsigned char *src, unsigned char *dst, int height,
                                      int width, int channels, int pad,
                                      const struct tr_images_view *v)
{
    for (int y = 0; y < height; y++) {
        int sy = y + v->dy - pad;
        for (int x = 0; x < width; x++) {
            int sx = tr_images_src_x(v, x, width, pad);
            unsigned char *o = dst + ((size_t)y * width + x) * channels;
            if (sy < 0 || sy >= height || sx < 0 || sx >= width)
                memset(o, 0, (size_t)channels);
            else
                memcpy(o, src + ((size_t)sy * width + sx) * channels, (size_t)channels);
        }
    }
}

#endif

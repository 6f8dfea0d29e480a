/* Decoding PNG, JPEG and WebP images (libpng, libjpeg-turbo, libwebp) into
 * 8-bit RGB or grey, and the resize to a fixed square that `trainrun prepare`
 * applies to each (prepare_images.c).  Private to the dataset room; the
 * tests call it directly. */
#ifndef TR_IMAGE_CODEC_H
#define TR_IMAGE_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* Larger images are refused before their pixels are allocated: a header
 * can claim any size, and a recipe's data is untrusted. */
#define TR_IMAGE_MAX_PIXELS (1u << 28)

struct tr_image {
    int width, height, channels; /* channels: 1 (grey) or 3 (RGB) */
    unsigned char *pixels;       /* height x width x channels, malloc'd */
};

/* What the first bytes say the file is: "png", "jpeg", "webp" or NULL. */
const char *tr_image_kind(const unsigned char *data, size_t size);

/* Decode an image file held in memory into `channels` (1 or 3) 8-bit
 * channels: RGB, or grey as ITU-R BT.601 luma; alpha is composited onto
 * black, 16-bit samples are rounded to 8 bits.  The format is told by the
 * content, not the name.  0, or -1 with why[] saying what is wrong (never
 * a crash: a truncated or damaged file is an error). */
int tr_image_decode(const unsigned char *data, size_t size, int channels, struct tr_image *out,
                    char *why, size_t why_size);

void tr_image_free(struct tr_image *img);

/* Scale `in` so that its shorter side is `size` and cut the centre
 * size x size square into out (size * size * in->channels bytes), as
 * torchvision's Resize(size) then CenterCrop(size).  Shrinking averages
 * each output pixel's footprint in the input (area resampling: no
 * aliasing at any ratio); enlarging interpolates bilinearly between pixel
 * centres. */
void tr_image_resize_crop(const struct tr_image *in, int size, unsigned char *out);

#endif

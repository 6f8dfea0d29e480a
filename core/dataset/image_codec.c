/*
 * Image decoding (see image_codec.h): each format through the library
 * Debian maintains for it, libpng (its simplified API), libjpeg-turbo and
 * libwebp, into 8-bit RGB or grey; then the resize prepare applies.
 *
 * The resize is written here rather than taken from a library: the ones at
 * hand are either far larger than the 80 lines it needs (libswscale,
 * ImageMagick, libvips) or not in Debian's -dev packages; and a resize of
 * our own gives the same pixels on every machine and library version, so a
 * prepared set and a recorded accuracy do not move under a package upgrade.
 */
#include "image_codec.h"

#include "../util/util.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

const char *tr_image_kind(const unsigned char *d, size_t n)
{
    if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
        return "png";
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF)
        return "jpeg";
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
        return "webp";
    return NULL;
}

void tr_image_free(struct tr_image *img)
{
    free(img->pixels);
    img->pixels = NULL;
}

static int too_large(unsigned long w, unsigned long h, char *why, size_t n)
{
    if (w == 0 || h == 0 || w > 65535 || h > 65535 || (uint64_t)w * h > TR_IMAGE_MAX_PIXELS) {
        snprintf(why, n, "%lux%lu pixels is outside what prepare decodes (1 to %u pixels, sides "
                 "up to 65535)", w, h, TR_IMAGE_MAX_PIXELS);
        return 1;
    }
    return 0;
}

/* RGBA (8 bits each) into `channels` channels: alpha composited onto black
 * in the stored (sRGB) values, grey as BT.601 luma, the same arithmetic for
 * every format (libpng's own conversions work in linear light and differ
 * from libjpeg's and PIL's). */
static void from_rgba(const unsigned char *rgba, size_t n, int channels, unsigned char *px)
{
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = rgba + 4 * i;
        unsigned a = p[3];
        unsigned r = (p[0] * a + 127) / 255, g = (p[1] * a + 127) / 255,
                 b = (p[2] * a + 127) / 255;
        if (channels == 3) {
            px[3 * i] = (unsigned char)r;
            px[3 * i + 1] = (unsigned char)g;
            px[3 * i + 2] = (unsigned char)b;
        } else {
            px[i] = (unsigned char)((299 * r + 587 * g + 114 * b + 500) / 1000);
        }
    }
}

/* ---- PNG ------------------------------------------------------------------- */

static int decode_png(const unsigned char *data, size_t size, int channels, struct tr_image *out,
                      char *why, size_t why_size)
{
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, data, size)) {
        snprintf(why, why_size, "PNG: %s", im.message);
        return -1;
    }
    if (too_large(im.width, im.height, why, why_size)) {
        png_image_free(&im);
        return -1;
    }
    /* RGBA out: libpng expands palettes, grey and 16-bit samples; the alpha
     * and grey conversions are from_rgba's */
    im.format = PNG_FORMAT_RGBA;
    size_t n = (size_t)im.width * im.height;
    unsigned char *rgba = malloc(PNG_IMAGE_SIZE(im));
    unsigned char *px = malloc(n * (size_t)channels);
    if (!rgba || !px) {
        free(rgba);
        free(px);
        png_image_free(&im);
        snprintf(why, why_size, "out of memory for %ux%u pixels", im.width, im.height);
        return -1;
    }
    if (!png_image_finish_read(&im, NULL, rgba, 0, NULL)) {
        snprintf(why, why_size, "PNG: %s", im.message);
        free(rgba);
        free(px);
        png_image_free(&im);
        return -1;
    }
    from_rgba(rgba, n, channels, px);
    free(rgba);
    out->width = (int)im.width;
    out->height = (int)im.height;
    out->channels = channels;
    out->pixels = px;
    return 0;
}

/* ---- JPEG ------------------------------------------------------------------ */

struct jpeg_fail {
    struct jpeg_error_mgr mgr;
    jmp_buf back;
    int truncated;
    char msg[JMSG_LENGTH_MAX];
};

static void jpeg_fail_exit(j_common_ptr c)
{
    struct jpeg_fail *f = (struct jpeg_fail *)c->err;
    f->mgr.format_message(c, f->msg);
    longjmp(f->back, 1);
}

/* Warnings are not printed; the one that matters, data that ends early
 * (libjpeg then fills the rest with grey), makes the image an error, as
 * PIL does with a truncated file. */
static void jpeg_fail_message(j_common_ptr c, int level)
{
    struct jpeg_fail *f = (struct jpeg_fail *)c->err;
    if (level < 0 && f->mgr.msg_code == JWRN_JPEG_EOF)
        f->truncated = 1;
}

static int decode_jpeg(const unsigned char *data, size_t size, int channels, struct tr_image *out,
                       char *why, size_t why_size)
{
    struct jpeg_decompress_struct cinfo;
    struct jpeg_fail fail;
    unsigned char *volatile px = NULL;
    memset(&fail, 0, sizeof fail);
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = jpeg_fail_exit;
    fail.mgr.emit_message = jpeg_fail_message;
    if (setjmp(fail.back)) {
        snprintf(why, why_size, "JPEG: %s", fail.msg);
        jpeg_destroy_decompress(&cinfo);
        free(px);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    if (too_large(cinfo.image_width, cinfo.image_height, why, why_size)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    /* libjpeg converts YCbCr and grey either way; CMYK has no conversion
     * here and fails in jpeg_start_decompress with its own message */
    cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_start_decompress(&cinfo);
    size_t stride = (size_t)cinfo.output_width * (size_t)cinfo.output_components;
    if (cinfo.output_components != channels) {
        snprintf(why, why_size, "JPEG: decoded into %d channels, not %d",
                 cinfo.output_components, channels);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    px = malloc(stride * cinfo.output_height);
    if (!px) {
        snprintf(why, why_size, "out of memory for %ux%u pixels", cinfo.output_width,
                 cinfo.output_height);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = px + stride * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    if (fail.truncated) {
        snprintf(why, why_size, "JPEG: the data ends before the image does (a truncated file)");
        jpeg_destroy_decompress(&cinfo);
        free(px);
        return -1;
    }
    jpeg_finish_decompress(&cinfo);
    out->width = (int)cinfo.output_width;
    out->height = (int)cinfo.output_height;
    out->channels = channels;
    out->pixels = px;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* ---- WebP ------------------------------------------------------------------ */

static int decode_webp(const unsigned char *data, size_t size, int channels, struct tr_image *out,
                       char *why, size_t why_size)
{
    int w, h;
    if (!WebPGetInfo(data, size, &w, &h)) {
        snprintf(why, why_size, "WebP: not a WebP bitstream libwebp can read (damaged?)");
        return -1;
    }
    if (too_large((unsigned long)w, (unsigned long)h, why, why_size))
        return -1;
    size_t n = (size_t)w * (size_t)h;
    unsigned char *rgba = malloc(n * 4);
    unsigned char *px = malloc(n * (size_t)channels);
    if (!rgba || !px) {
        free(rgba);
        free(px);
        snprintf(why, why_size, "out of memory for %dx%d pixels", w, h);
        return -1;
    }
    if (!WebPDecodeRGBAInto(data, size, rgba, n * 4, w * 4)) {
        free(rgba);
        free(px);
        snprintf(why, why_size, "WebP: the image data does not decode (truncated or damaged)");
        return -1;
    }
    from_rgba(rgba, n, channels, px);
    free(rgba);
    out->width = w;
    out->height = h;
    out->channels = channels;
    out->pixels = px;
    return 0;
}

int tr_image_decode(const unsigned char *data, size_t size, int channels, struct tr_image *out,
                    char *why, size_t why_size)
{
    memset(out, 0, sizeof *out);
    if (channels != 1 && channels != 3) {
        snprintf(why, why_size, "channels must be 1 or 3, not %d", channels);
        return -1;
    }
    const char *kind = tr_image_kind(data, size);
    if (!kind) {
        snprintf(why, why_size, "not a PNG, JPEG or WebP file (its first bytes are none of "
                 "theirs)");
        return -1;
    }
    if (strcmp(kind, "png") == 0)
        return decode_png(data, size, channels, out, why, why_size);
    if (strcmp(kind, "jpeg") == 0)
        return decode_jpeg(data, size, channels, out, why, why_size);
    return decode_webp(data, size, channels, out, why, why_size);
}

/* ---- resize ---------------------------------------------------------------- */

/* Along one axis: output position j (0..size-1) reads taps[j * max + t] of
 * the input, weighted by w[j * max + t], for t < count[j]. */
struct axis {
    int max;
    int *count, *taps;
    float *w;
};

/* in_len input pixels scaled to `scaled`, of which positions off .. off +
 * size - 1 are kept. */
static void axis_plan(struct axis *a, int in_len, int scaled, int off, int size)
{
    double s = (double)in_len / scaled; /* input pixels per output pixel */
    a->max = s > 1 ? (int)ceil(s) + 1 : 2;
    a->count = tr_xcalloc((size_t)size, sizeof *a->count);
    a->taps = tr_xcalloc((size_t)size * (size_t)a->max, sizeof *a->taps);
    a->w = tr_xcalloc((size_t)size * (size_t)a->max, sizeof *a->w);
    for (int j = 0; j < size; j++) {
        int u = j + off, *tap = a->taps + (size_t)j * a->max, n = 0;
        float *w = a->w + (size_t)j * a->max;
        if (s > 1) { /* area: the footprint [u s, (u + 1) s) */
            double lo = u * s, hi = (u + 1) * s;
            for (int k = (int)floor(lo); k < hi && k < in_len && n < a->max; k++) {
                double cover = fmin(hi, k + 1.0) - fmax(lo, (double)k);
                if (cover <= 0)
                    continue;
                tap[n] = k;
                w[n++] = (float)(cover / s);
            }
        } else { /* bilinear between the two nearest input centres */
            double c = (u + 0.5) * s - 0.5;
            int k0 = (int)floor(c);
            double t = c - k0;
            int a0 = k0 < 0 ? 0 : k0 > in_len - 1 ? in_len - 1 : k0;
            int a1 = k0 + 1 < 0 ? 0 : k0 + 1 > in_len - 1 ? in_len - 1 : k0 + 1;
            tap[n] = a0;
            w[n++] = (float)(1 - t);
            tap[n] = a1;
            w[n++] = (float)t;
        }
        a->count[j] = n;
    }
}

static void axis_free(struct axis *a)
{
    free(a->count);
    free(a->taps);
    free(a->w);
}

void tr_image_resize_crop(const struct tr_image *in, int size, unsigned char *out)
{
    int w = in->width, h = in->height, c = in->channels;
    /* the shorter side becomes size; the longer one size * long / short,
     * rounded down, as torchvision's Resize(int) */
    int sw, sh;
    if (w <= h) {
        sw = size;
        sh = (int)((int64_t)size * h / w);
    } else {
        sh = size;
        sw = (int)((int64_t)size * w / h);
    }
    if (sw < size)
        sw = size;
    if (sh < size)
        sh = size;
    struct axis ax, ay;
    axis_plan(&ax, w, sw, (sw - size) / 2, size);
    axis_plan(&ay, h, sh, (sh - size) / 2, size);
    float *row = tr_xcalloc((size_t)w * (size_t)c, sizeof *row);
    for (int j = 0; j < size; j++) {
        /* the rows this output row reads, weighted, then along x */
        memset(row, 0, (size_t)w * (size_t)c * sizeof *row);
        for (int t = 0; t < ay.count[j]; t++) {
            const unsigned char *src = in->pixels + (size_t)ay.taps[j * ay.max + t] * w * c;
            float wt = ay.w[j * ay.max + t];
            for (size_t k = 0; k < (size_t)w * c; k++)
                row[k] += wt * src[k];
        }
        for (int i = 0; i < size; i++)
            for (int ch = 0; ch < c; ch++) {
                float v = 0;
                for (int t = 0; t < ax.count[i]; t++)
                    v += ax.w[i * ax.max + t] * row[(size_t)ax.taps[i * ax.max + t] * c + ch];
                int q = (int)lrintf(v);
                out[((size_t)j * size + i) * c + ch] = (unsigned char)(q < 0 ? 0 : q > 255 ? 255 : q);
            }
    }
    free(row);
    axis_free(&ax);
    axis_free(&ay);
}

/* safetensors: 8-byte little-endian header length, a JSON header naming
 * each tensor's dtype, shape and byte range, then the raw data.  Readable
 * as is by the usual Python tooling. */
#ifndef TR_SAFETENSORS_H
#define TR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <trainrun/plugin.h>

struct tr_st_entry {
    const char *name;
    enum tr_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* host memory */
    size_t bytes;
};

/* Serialise entries into one malloc'd buffer. */
void *tr_safetensors_write(const struct tr_st_entry *entries, size_t n, const char *metadata_json,
                           size_t *size);
/* What tr_safetensors_write's buffer starts with, for writers that produce
 * the data themselves (a checkpoint streamed to its plugin): the 8-byte
 * length and the padded header, malloc'd, *header_size bytes.  The entries'
 * data is not read, only their bytes.  The data follows the header: every
 * entry's bytes back to back in the entries' order, *size bytes in all with
 * the header.  NULL when out of memory. */
void *tr_safetensors_header(const struct tr_st_entry *entries, size_t n, const char *metadata_json,
                            size_t *header_size, size_t *size);

struct tr_st_file; /* a parsed buffer; entries point into it */
struct tr_st_file *tr_safetensors_read(const void *buf, size_t size, const char *what, tr_err *err);
/* NULL when absent */
const struct tr_st_entry *tr_safetensors_find(const struct tr_st_file *f, const char *name);
size_t tr_safetensors_count(const struct tr_st_file *f);
const struct tr_st_entry *tr_safetensors_at(const struct tr_st_file *f, size_t i);
void tr_safetensors_free(struct tr_st_file *f);

#endif

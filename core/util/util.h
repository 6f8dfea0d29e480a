/* Small shared utilities of the core: logging, allocation, time, strings. */
#ifndef TR_UTIL_H
#define TR_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <trainrun/mix.h> /* the 64-bit mixers, shared with the plugins */
/* The core's error type (tr_err, TR_OK, TR_ERROR, tr_fail) and its dtypes (enum tr_dtype)
 * are the plugin ABI's: plugins return errors and declare dtypes through them, so they are
 * defined once, in the installed <trainrun/plugin.h>, and the core uses them from there.
 * A header of their own would be one more installed file to keep byte for byte in step
 * with the ABI, and every file of the core that reports an error also reaches plugin.h. */
#include <trainrun/plugin.h>

/* TR_HAS_SLOT / TR_HAS_FIELD (optional slots of structs that carry their
 * `struct_size`: plugin vtables, backend ifaces and modules) come from the
 * installed <trainrun/plugin.h>, so core and plugins test sizes one way. */

#define TR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

extern enum tr_log_level tr_log_threshold;

void tr_log(enum tr_log_level level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 64-byte aligned, zeroed; NULL on failure (large buffers: callers report). */
void *tr_alloc(size_t size);
void tr_free(void *ptr);

/* Small bookkeeping allocations: these abort with a message on OOM, which
 * only happens when the machine is already lost. */
void *tr_xcalloc(size_t n, size_t size);
void *tr_xrealloc(void *p, size_t size);
char *tr_xstrdup(const char *s);
char *tr_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* order[0..n) := 0..n-1 sorted by key[i], ties by i (a stable order of
 * things by a rank the caller computed). */
void tr_order_by_key(size_t *order, size_t n, const long *key);

/* Monotonic seconds. */
double tr_now(void);
/* This process's peak resident set size so far, in MiB (getrusage). */
double tr_peak_rss_mib(void);
/* The memory resident now, in MiB (/proc/self/statm; 0 where there is none). */
double tr_rss_mib(void);

/* The services every plugin receives. */
const struct tr_host *tr_host_services(void);

/* Prefix err->msg with "prefix: " (keeps it within the buffer). */
void tr_err_prefix(tr_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Human sizes: "1.50 MiB". */
void tr_format_bytes(double bytes, char *buf, size_t size);

/* Directory of a path ("." when none), newly allocated. */
char *tr_dirname(const char *path);
/* Create a directory and its parents; 0 or -1 with errno. */
int tr_mkdir_p(const char *path);

/* The whole of a small regular file, NUL-terminated (*len its bytes), or
 * NULL with err naming the file: missing, not a regular file (a FIFO or a
 * device is refused without blocking: opened O_NONBLOCK, then fstat), or
 * larger than max bytes (`what` says what the file should be). */
char *tr_read_small_file(const char *path, size_t max, const char *what, size_t *len,
                         tr_err *err);

/* The UTF-8 bytes of code point cp (< 0x110000) into out (room for the 1 to 4
 * it returns: 2 below 0x800). */
int tr_utf8_encode(uint32_t cp, char *out);

#endif

#include "util.h"

#include <trainrun/input.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum tr_log_level tr_log_threshold = TR_LOG_INFO;

static const char *level_names[] = {"debug", "info", "warning", "error"};

static void vlog(enum tr_log_level level, const char *who, const char *fmt, va_list ap)
{
    if (level < tr_log_threshold)
        return;
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    tr_err_clean(line, sizeof line); /* text from files (names, recipe messages) included */
    if (level == TR_LOG_INFO)
        fprintf(stderr, "trainrun: %s%s%s\n", who ? who : "", who ? ": " : "", line);
    else
        fprintf(stderr, "trainrun: %s: %s%s%s\n", level_names[level], who ? who : "",
                who ? ": " : "", line);
}

void tr_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, who, fmt, ap);
    va_end(ap);
}

void *tr_alloc(size_t size)
{
    void *p = NULL;
    size_t rounded = (size + 63) & ~(size_t)63;
    if (rounded == 0)
        rounded = 64;
    if (posix_memalign(&p, 64, rounded) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

void tr_free(void *ptr) { free(ptr); }

static void out_of_memory(size_t size)
{
    fprintf(stderr, "trainrun: error: out of memory allocating %zu bytes\n", size);
    abort();
}

void *tr_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        out_of_memory(n * size);
    return p;
}

void *tr_xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    if (!q)
        out_of_memory(size);
    return q;
}

static int by_key(const void *a, const void *b, void *ctx)
{
    const long *key = ctx;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (key[x] != key[y])
        return key[x] < key[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

void tr_order_by_key(size_t *order, size_t n, const long *key)
{
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof *order, by_key, (void *)key);
}

char *tr_xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d)
        out_of_memory(strlen(s));
    return d;
}

char *tr_xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        out_of_memory(0);
    return s;
}

double tr_peak_rss_mib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0.0; /* KiB */
}

double tr_rss_mib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    int ok = f && fscanf(f, "%lu %lu", &size, &resident) == 2;
    if (f)
        fclose(f);
    return ok ? (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0) : 0.0;
}

double tr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void host_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, who, fmt, ap);
    va_end(ap);
}

static const struct tr_host host = {
    .struct_size = sizeof(struct tr_host),
    .log = host_log,
    .alloc = tr_alloc,
    .free = tr_free,
};

const struct tr_host *tr_host_services(void) { return &host; }

void tr_err_prefix(tr_err *err, const char *fmt, ...)
{
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix - 2, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t plen = strlen(prefix);
    memcpy(prefix + plen, ": ", 3);
    plen += 2;
    size_t cap = sizeof err->msg - 1;
    size_t old = strnlen(err->msg, cap);
    if (plen + old > cap)
        old = cap - plen; /* keep the start of the old message */
    memmove(err->msg + plen, err->msg, old);
    memcpy(err->msg, prefix, plen);
    err->msg[plen + old] = 0;
    tr_err_clean(err->msg, sizeof err->msg);
}

void tr_format_bytes(double bytes, char *buf, size_t size)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%.0f B", bytes);
    else
        snprintf(buf, size, "%.2f %s", bytes, units[u]);
}

char *tr_dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return tr_xstrdup(".");
    if (slash == path)
        return tr_xstrdup("/");
    return tr_xasprintf("%.*s", (int)(slash - path), path);
}

char *tr_read_small_file(const char *path, size_t max, const char *what, size_t *len,
                         tr_err *err)
{
    int fd = tr_input_open(path);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        tr_fail(err, "cannot read %s: %s", path, tr_input_strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if ((size_t)st.st_size > max) {
        close(fd);
        tr_fail(err, "%s is %lld bytes; %s has far less than %zu", path, (long long)st.st_size,
                what, max);
        return NULL;
    }
    char *text = tr_xcalloc(1, (size_t)st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, text + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != (size_t)st.st_size) {
        free(text);
        tr_fail(err, "cannot read %s: it changed while being read", path);
        return NULL;
    }
    if (len)
        *len = got;
    return text;
}

int tr_mkdir_p(const char *path)
{
    char *p = tr_xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                free(p);
                return -1;
            }
            *s = '/';
        }
    }
    int rc = mkdir(p, 0777);
    free(p);
    return (rc != 0 && errno != EEXIST) ? -1 : 0;
}

int tr_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#include "trace.h"

#include "../util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Events collect in a buffer written with write(2) when it fills: each
 * write's error is seen where it happens (a full disk), with its errno. */
struct tr_trace {
    int fd;
    char *path;
    double origin; /* tr_now() of time zero */
    int events;
    int errnum;    /* errno of the first failed write, 0 while all is well */
    size_t len;
    char buf[1 << 16];
};

static void flush(struct tr_trace *t)
{
    size_t done = 0;
    while (!t->errnum && done < t->len) {
        ssize_t n = write(t->fd, t->buf + done, t->len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            t->errnum = n < 0 ? errno : EIO;
        else
            done += (size_t)n;
    }
    t->len = 0;
}

static void append(struct tr_trace *t, const char *s, size_t n)
{
    if (t->len + n > sizeof t->buf)
        flush(t);
    memcpy(t->buf + t->len, s, n);
    t->len += n;
}

static void put(struct tr_trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct tr_trace *t, const char *fmt, ...)
{
    char piece[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(piece, sizeof piece, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof piece)
        n = (int)sizeof piece - 1; /* callers keep pieces short; names are escaped separately */
    append(t, piece, (size_t)n);
}

/* s as a JSON string literal (names come from recipes: anything goes) */
static void put_string(struct tr_trace *t, const char *s)
{
    append(t, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            put(t, "\\%c", c);
        else if (c == '\n')
            put(t, "\\n");
        else if (c < 0x20)
            put(t, "\\u%04x", c);
        else
            append(t, s, 1);
    }
    append(t, "\"", 1);
}

struct tr_trace *tr_trace_open(const char *path, double origin)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        tr_log(TR_LOG_WARN, "trace", "cannot write %s: %s; no trace this run", path, strerror(errno));
        return NULL;
    }
    struct tr_trace *t = tr_xcalloc(1, sizeof *t);
    t->fd = fd;
    t->path = tr_xstrdup(path);
    t->origin = origin;
    put(t, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    put(t, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": \"step phases\"}},\n");
    put(t, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 2, \"args\": {\"name\": \"ops (sampled steps)\"}},\n");
    put(t, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 3, \"args\": {\"name\": \"collectives (sampled steps)\"}}");
    return t;
}

static void event(struct tr_trace *t, const char *name, const char *cat, int tid, uint64_t step,
                  double start, double seconds)
{
    put(t, ",\n{\"name\": ");
    put_string(t, name);
    put(t, ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.1f, "
           "\"dur\": %.1f, \"args\": {\"step\": %llu}}",
        cat, tid, 1e6 * (start - t->origin), 1e6 * seconds, (unsigned long long)step);
    t->events++;
}

void tr_trace_phase(struct tr_trace *t, const char *name, uint64_t step, double t0, double t1)
{
    if (t)
        event(t, name, "phase", 1, step, t0, t1 - t0);
}

void tr_trace_comm(struct tr_trace *t, const char *name, uint64_t step, double t0, double t1)
{
    if (t)
        event(t, name, "comm", 3, step, t0, t1 - t0);
}

void tr_trace_ops(struct tr_trace *t, const struct tr_graph *g, uint64_t step)
{
    if (!t || !g->op_start)
        return;
    char name[256];
    for (int i = 0; i < 2 * g->n_nodes; i++) {
        if (g->op_seconds[i] <= 0)
            continue;
        const struct tr_node *n = &g->nodes[i % g->n_nodes];
        snprintf(name, sizeof name, "%s %s%s", tr_op_name(n->op), n->name,
                 i < g->n_nodes ? "" : " (backward)");
        event(t, name, i < g->n_nodes ? "forward" : "backward", 2, step, g->op_start[i],
              g->op_seconds[i]);
    }
}

int tr_trace_error(const struct tr_trace *t) { return t ? t->errnum : 0; }

int tr_trace_close(struct tr_trace *t)
{
    if (!t)
        return 0;
    put(t, "\n]}\n");
    flush(t);
    /* written once, at the end: make it durable like the checkpoints */
    if (!t->errnum && fsync(t->fd) != 0)
        t->errnum = errno;
    if (close(t->fd) != 0 && !t->errnum)
        t->errnum = errno;
    int e = t->errnum;
    free(t->path);
    free(t);
    return e;
}

#include "trace.h"

#include "json.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>

struct tr_trace {
    FILE *f;
    double origin; /* tr_now() of time zero */
    int events;
};

struct tr_trace *tr_trace_open(const char *path, double origin)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        tr_log(TR_LOG_WARN, "trace", "cannot write %s; no trace this run", path);
        return NULL;
    }
    struct tr_trace *t = tr_xcalloc(1, sizeof *t);
    t->f = f;
    t->origin = origin;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": \"step phases\"}},\n");
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 2, \"args\": {\"name\": \"ops (sampled steps)\"}}");
    return t;
}

static void event(struct tr_trace *t, const char *name, const char *cat, int tid, uint64_t step,
                  double start, double seconds)
{
    fprintf(t->f, ",\n{\"name\": ");
    tr_json_write_string(t->f, name);
    fprintf(t->f, ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.1f, "
                  "\"dur\": %.1f, \"args\": {\"step\": %llu}}",
            cat, tid, 1e6 * (start - t->origin), 1e6 * seconds, (unsigned long long)step);
    t->events++;
}

void tr_trace_phase(struct tr_trace *t, const char *name, uint64_t step, double t0, double t1)
{
    if (t)
        event(t, name, "phase", 1, step, t0, t1 - t0);
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

void tr_trace_close(struct tr_trace *t)
{
    if (!t)
        return;
    fprintf(t->f, "\n]}\n");
    fclose(t->f);
    free(t);
}

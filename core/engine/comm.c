#include "comm.h"

#include "backend.h"
#include "../util/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum job_kind {
    JOB_ALLREDUCE,
    JOB_BROADCAST,
    JOB_ALLGATHER,
    JOB_REDUCE_SCATTER,
    JOB_SENDRECV,
    JOB_ALLREDUCE_GROUP,
    JOB_REDUCE_SCATTER_GROUP,
    JOB_ALLGATHER_GROUP
};

struct job {
    enum job_kind kind;
    void *buf;
    size_t size; /* floats (all-reduce; all-gather, reduce-scatter: per rank) or bytes (broadcast) */
    int root;
    /* a gradient bucket's reduce-scatter: 1 + its unit, whose parts other
     * ranks own are then discarded (0: none) */
    size_t discard;
    /* sendrecv: buf and size are what is sent to `root`; these, what is
     * received from `from` */
    void *recv_buf;
    size_t recv_bytes;
    int from;
    /* a group's all-reduce: its members (the caller's list, alive until it
     * has waited) */
    const int *ranks;
    int n_ranks;
    /* run on this thread before the collective (an all-gather's packed
     * values, tr_comm_gather_packed; a unit's updated part, ..._around) and
     * after it succeeded (any job's) */
    void (*pack)(void *ctx, size_t arg);
    void (*unpack)(void *ctx, size_t arg);
    void *hook_ctx;
    size_t hook_arg;
};

struct bucket {
    size_t begin, end; /* floats of the flat gradient buffer */
    int need;          /* parameters overlapping it that backward finishes */
    int left;          /* of those, not yet finished in this backward */
};

struct tr_comm {
    const struct tr_comm_vtable *vt;
    void *self;
    /* the job queue: a ring of submitted jobs, run in order by the thread */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    struct job *jobs;
    size_t cap, head, tail; /* tail - head jobs pending */
    size_t finished;        /* jobs completed, ever */
    size_t submitted;
    int failed, quit;
    tr_err err;             /* the first failure */
    /* buckets */
    struct bucket *buckets;
    size_t n_buckets;
    /* for each node: the parameters whose gradient is final after its backward */
    int *final_start, *final_params; /* CSR: node i's are final_params[final_start[i] .. [i+1]) */
    struct tr_shard layout; /* the buckets are its units */
    int scatter;            /* buckets reduce-scatter (shard level gradients) */
    int discard;            /* and the parts other ranks own are then discarded */
    float *grads;           /* the armed graph's gradient buffer */
    struct tr_graph *armed; /* the graph whose backward submits buckets */
    /* host data (scalars, the run state) travel through backend memory
     * where the plugin reads device memory (every device but "cpu") */
    const struct tr_backend *be;
    int stage;
    void *staging;
    size_t staging_bytes;
    int world, rank;
    const char *name; /* the plugin's, for messages */
    /* spans of the collectives run while recording (the thread appends,
     * under lock; read after wait_all) */
    int recording;
    size_t n_spans;
    struct tr_comm_span spans[TR_COMM_SPANS];
};

static const char *const job_names[] = {
    [JOB_ALLREDUCE] = "all-reduce", [JOB_BROADCAST] = "broadcast",
    [JOB_ALLGATHER] = "all-gather", [JOB_REDUCE_SCATTER] = "reduce-scatter",
    [JOB_SENDRECV] = "sendrecv", [JOB_ALLREDUCE_GROUP] = "group all-reduce",
    [JOB_REDUCE_SCATTER_GROUP] = "group reduce-scatter", [JOB_ALLGATHER_GROUP] = "group all-gather"};

/* A point-to-point job's name in the trace: what it moved. */
static const char *job_name(const struct job *j)
{
    if (j->kind != JOB_SENDRECV)
        return job_names[j->kind];
    int sends = j->root >= 0 && j->size, receives = j->from >= 0 && j->recv_bytes;
    return sends && receives ? "sendrecv" : sends ? "send" : "recv";
}

/* the bytes of the buffer a job reads or fills, on each rank */
static size_t job_bytes(const struct tr_comm *c, const struct job *j)
{
    if (j->kind == JOB_BROADCAST)
        return j->size;
    if (j->kind == JOB_SENDRECV) /* sent plus received */
        return (j->root >= 0 ? j->size : 0) + (j->from >= 0 ? j->recv_bytes : 0);
    size_t floats = j->kind == JOB_ALLREDUCE || j->kind == JOB_ALLREDUCE_GROUP ? j->size
                    : j->kind == JOB_REDUCE_SCATTER_GROUP || j->kind == JOB_ALLGATHER_GROUP
                        ? j->size * (size_t)j->n_ranks
                        : j->size * (size_t)c->world;
    return floats * sizeof(float);
}

static void *comm_thread(void *arg)
{
    struct tr_comm *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (c->head == c->tail && !c->quit)
            pthread_cond_wait(&c->wake, &c->lock);
        if (c->head == c->tail && c->quit)
            break;
        struct job j = c->jobs[c->head % c->cap];
        int skip = c->failed; /* after a failure the collectives are out of step: drop */
        pthread_mutex_unlock(&c->lock);
        tr_err e = {{0}};
        int rc = TR_OK;
        double t0 = tr_now();
        /* mandatory slots: the loader refused any vtable without them;
         * allgather, reduce_scatter, sendrecv and the group slots are
         * submitted only where tr_comm_has_allgather / _reduce_scatter /
         * _sendrecv / _groups / _group_parts said so */
        if (!skip && j.pack) /* the caller's step before the collective */
            j.pack(j.hook_ctx, j.hook_arg);
        if (!skip && j.kind == JOB_ALLREDUCE)
            rc = c->vt->allreduce_sum(c->self, j.buf, j.size, &e);
        else if (!skip && j.kind == JOB_BROADCAST)
            rc = c->vt->broadcast(c->self, j.buf, j.size, j.root, &e);
        else if (!skip && j.kind == JOB_REDUCE_SCATTER)
            rc = c->vt->reduce_scatter(c->self, j.buf, j.size, &e);
        else if (!skip && j.kind == JOB_ALLREDUCE_GROUP)
            rc = c->vt->allreduce_group(c->self, j.buf, j.size, j.ranks, j.n_ranks, &e);
        else if (!skip && j.kind == JOB_REDUCE_SCATTER_GROUP)
            rc = c->vt->reduce_scatter_group(c->self, j.buf, j.size, j.ranks, j.n_ranks, &e);
        else if (!skip && j.kind == JOB_ALLGATHER_GROUP)
            rc = c->vt->allgather_group(c->self, j.buf, j.size, j.ranks, j.n_ranks, &e);
        else if (!skip && j.kind == JOB_SENDRECV)
            rc = c->vt->sendrecv(c->self, j.buf, j.size, j.root, j.recv_buf, j.recv_bytes, j.from,
                                 &e);
        else if (!skip)
            rc = c->vt->allgather(c->self, j.buf, j.size, &e);
        if (!skip && rc == TR_OK && j.unpack)
            j.unpack(j.hook_ctx, j.hook_arg);
        /* a bucket summed: the parts (and leftover) other ranks own go */
        if (!skip && rc == TR_OK && j.discard)
            tr_shard_discard_others(c->be, c->grads, &c->layout, j.discard - 1);
        pthread_mutex_lock(&c->lock);
        if (c->recording && !skip && c->n_spans < TR_COMM_SPANS)
            c->spans[c->n_spans++] = (struct tr_comm_span){job_name(&j), job_bytes(c, &j), t0,
                                                            tr_now()};
        if (rc != TR_OK && !c->failed) {
            c->failed = 1;
            c->err = e;
        }
        c->head++;
        c->finished++;
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Returns the job's ticket: it has run once c->finished exceeds it. */
static size_t submit(struct tr_comm *c, struct job j)
{
    pthread_mutex_lock(&c->lock);
    if (c->tail - c->head == c->cap) { /* grow the ring (rare: sized at plan time) */
        size_t cap = c->cap * 2;
        struct job *jobs = tr_xcalloc(cap, sizeof *jobs);
        for (size_t i = c->head; i < c->tail; i++)
            jobs[i % cap] = c->jobs[i % c->cap];
        free(c->jobs);
        c->jobs = jobs;
        c->cap = cap;
    }
    c->jobs[c->tail % c->cap] = j;
    c->tail++;
    size_t ticket = c->submitted++;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    return ticket;
}

/* Waits until at most `pending` submitted jobs have not run. */
static void wait_pending(struct tr_comm *c, size_t pending)
{
    pthread_mutex_lock(&c->lock);
    while (c->submitted - c->finished > pending)
        pthread_cond_wait(&c->done, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

int tr_comm_wait(struct tr_comm *c, size_t ticket, tr_err *err)
{
    pthread_mutex_lock(&c->lock);
    while (c->finished <= ticket)
        pthread_cond_wait(&c->done, &c->lock);
    int failed = c->failed;
    if (failed)
        *err = c->err;
    pthread_mutex_unlock(&c->lock);
    return failed ? TR_ERROR : TR_OK;
}

static int wait_all(struct tr_comm *c, tr_err *err)
{
    pthread_mutex_lock(&c->lock);
    while (c->finished < c->submitted)
        pthread_cond_wait(&c->done, &c->lock);
    int failed = c->failed;
    if (failed)
        *err = c->err;
    pthread_mutex_unlock(&c->lock);
    return failed ? TR_ERROR : TR_OK;
}

struct tr_comm *tr_comm_open(struct tr_config *cfg, const struct tr_backend *be, tr_err *err)
{
    if (!cfg->comm.plugin)
        return tr_fail(err, "no comm plugin configured"), NULL;
    if (tr_config_create_slot(cfg, &cfg->comm, 0, err) != TR_OK)
        return NULL;
    struct tr_comm *c = tr_xcalloc(1, sizeof *c);
    c->vt = cfg->comm.plugin->info->vtable;
    c->self = cfg->comm.self;
    c->be = be;
    c->stage = strcmp(cfg->device, "cpu") != 0;
    c->world = cfg->rank.world;
    c->rank = cfg->rank.rank;
    c->name = cfg->comm.plugin->info->name;
    c->cap = 64;
    c->jobs = tr_xcalloc(c->cap, sizeof *c->jobs);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->done, NULL);
    if (pthread_create(&c->thread, NULL, comm_thread, c) != 0) {
        free(c->jobs);
        free(c);
        return tr_fail(err, "cannot start the communication thread"), NULL;
    }
    return c;
}

void tr_comm_close(struct tr_comm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->quit = 1;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done);
    free(c->jobs);
    if (c->staging)
        tr_be_free(c->be, c->staging);
    free(c->buckets);
    free(c->final_start);
    free(c->final_params);
    free(c);
}

void tr_comm_record(struct tr_comm *c, int on)
{
    pthread_mutex_lock(&c->lock);
    c->recording = on;
    if (on)
        c->n_spans = 0;
    pthread_mutex_unlock(&c->lock);
}

size_t tr_comm_spans(const struct tr_comm *c, const struct tr_comm_span **spans)
{
    *spans = c->spans;
    return c->n_spans;
}

const char *tr_comm_describe(const struct tr_comm *c)
{
    if (TR_HAS_SLOT(c->vt, struct tr_comm_vtable, describe))
        return c->vt->describe(c->self);
    return "";
}

int tr_comm_allreduce(struct tr_comm *c, float *buf, size_t count, tr_err *err)
{
    submit(c, (struct job){.kind = JOB_ALLREDUCE, .buf = buf, .size = count});
    return wait_all(c, err);
}

int tr_comm_has_allgather(const struct tr_comm *c)
{
    return TR_HAS_SLOT(c->vt, struct tr_comm_vtable, allgather);
}

int tr_comm_allgather(struct tr_comm *c, float *buf, size_t count, tr_err *err)
{
    submit(c, (struct job){.kind = JOB_ALLGATHER, .buf = buf, .size = count});
    return wait_all(c, err);
}

int tr_comm_has_reduce_scatter(const struct tr_comm *c)
{
    return TR_HAS_SLOT(c->vt, struct tr_comm_vtable, reduce_scatter);
}

/* The shard's unit u: its parameters from their owners, the equal parts in
 * one all-gather, the last rank's leftover in a broadcast. */
static size_t submit_gather(struct tr_comm *c, float *buf, const struct tr_shard *s, size_t u,
                            void (*before)(void *ctx, size_t arg),
                            void (*after)(void *ctx, size_t arg), void *ctx)
{
    struct tr_shard_run r = tr_shard_unit(s, u);
    size_t per = tr_shard_part_len(s, u), rest = r.end - r.begin - per * (size_t)s->world;
    size_t ticket = 0;
    if (per)
        ticket = submit(c, (struct job){.kind = JOB_ALLGATHER, .buf = buf + r.begin, .size = per,
                                        .pack = before, .unpack = rest ? NULL : after,
                                        .hook_ctx = ctx, .hook_arg = u});
    if (rest)
        ticket = submit(c, (struct job){.kind = JOB_BROADCAST, .buf = buf + r.end - rest,
                                        .size = rest * sizeof(float), .root = s->world - 1,
                                        .pack = per ? NULL : before, .unpack = after,
                                        .hook_ctx = ctx, .hook_arg = u});
    return ticket;
}

size_t tr_comm_gather_unit(struct tr_comm *c, float *buf, const struct tr_shard *s, size_t u)
{
    return submit_gather(c, buf, s, u, NULL, NULL, NULL);
}

size_t tr_comm_gather_unit_then(struct tr_comm *c, float *buf, const struct tr_shard *s, size_t u,
                                void (*after)(void *ctx, size_t u), void *ctx)
{
    return submit_gather(c, buf, s, u, NULL, after, ctx);
}

size_t tr_comm_gather_unit_around(struct tr_comm *c, float *buf, const struct tr_shard *s,
                                  size_t u, void (*before)(void *ctx, size_t u),
                                  void (*after)(void *ctx, size_t u), void *ctx)
{
    return submit_gather(c, buf, s, u, before, after, ctx);
}

size_t tr_comm_gather_packed(struct tr_comm *c, float *buf, size_t count,
                             void (*pack)(void *ctx, size_t arg),
                             void (*unpack)(void *ctx, size_t arg), void *ctx, size_t arg)
{
    return submit(c, (struct job){.kind = JOB_ALLGATHER, .buf = buf, .size = count, .pack = pack,
                                  .unpack = unpack, .hook_ctx = ctx, .hook_arg = arg});
}

int tr_comm_gather_shards(struct tr_comm *c, float *buf, const struct tr_shard *s, tr_err *err)
{
    for (size_t u = 0; u < s->n_units; u++)
        submit_gather(c, buf, s, u, NULL, NULL, NULL);
    return wait_all(c, err);
}

int tr_comm_broadcast(struct tr_comm *c, void *buf, size_t bytes, int root, tr_err *err)
{
    submit(c, (struct job){.kind = JOB_BROADCAST, .buf = buf, .size = bytes, .root = root});
    return wait_all(c, err);
}

/* ---- point to point (pipeline stages) ------------------------------------ */

int tr_comm_has_sendrecv(const struct tr_comm *c)
{
    return TR_HAS_SLOT(c->vt, struct tr_comm_vtable, sendrecv);
}

int tr_comm_sendrecv(struct tr_comm *c, const void *send_buf, size_t send_bytes, int to,
                     void *recv_buf, size_t recv_bytes, int from, tr_err *err)
{
    if (!tr_comm_has_sendrecv(c))
        return tr_fail(err, "comm '%s' has no sendrecv (plugin ABI 2.4), which pipeline stages "
                       "need to pass activations; use a comm plugin that has one (tcp, mpi, nccl)",
                       c->name);
    if (to < -1 || to >= c->world || from < -1 || from >= c->world)
        return tr_fail(err, "sendrecv on rank %d: to rank %d, from rank %d, but there are %d ranks "
                       "(-1: none)", c->rank, to, from, c->world);
    if (to == -1)
        send_bytes = 0;
    if (from == -1)
        recv_bytes = 0;
    if (!send_bytes && !recv_bytes) /* nothing to move: still waits, as the ABI says */
        return wait_all(c, err);
    submit(c, (struct job){.kind = JOB_SENDRECV, .buf = (void *)send_buf, .size = send_bytes,
                           .root = send_bytes ? to : -1, .recv_buf = recv_buf,
                           .recv_bytes = recv_bytes, .from = recv_bytes ? from : -1});
    return wait_all(c, err);
}

/* ---- sums among some ranks (pipeline replicas) ----------------------------- */

int tr_comm_has_groups(const struct tr_comm *c)
{
    return TR_HAS_SLOT(c->vt, struct tr_comm_vtable, allreduce_group);
}

/* A group's list: ascending world ranks without repeats. */
static int group_check(const struct tr_comm *c, const int *ranks, int n, tr_err *err)
{
    for (int i = 0; i < n; i++)
        if (ranks[i] < 0 || ranks[i] >= c->world || (i && ranks[i] <= ranks[i - 1]))
            return tr_fail(err, "a collective among a group: its ranks must ascend from 0 to %d "
                           "without repeats (rank %d at position %d)", c->world - 1, ranks[i], i);
    return TR_OK;
}

int tr_comm_allreduce_group(struct tr_comm *c, float *buf, size_t count, const int *ranks, int n,
                            tr_err *err)
{
    if (group_check(c, ranks, n, err) != TR_OK)
        return TR_ERROR;
    int member = 0;
    for (int i = 0; i < n; i++)
        member |= ranks[i] == c->rank;
    /* the whole world: the plain all-reduce, whose bits the runs without
     * groups had */
    if (n == c->world)
        return tr_comm_allreduce(c, buf, count, err);
    if (!tr_comm_has_groups(c)) {
        /* every rank joins the world's all-reduce, non-members with zeros
         * (the same sums, every rank moving the bytes) */
        if (!member)
            tr_be_zero(c->be, buf, count * sizeof(float));
        int rc = tr_comm_allreduce(c, buf, count, err);
        if (!member && tr_be_can_discard(c->be))
            tr_be_discard(c->be, buf, count * sizeof(float));
        return rc;
    }
    if (!member || n < 2 || !count) /* nothing to sum here; still waits, like the others */
        return wait_all(c, err);
    submit(c, (struct job){.kind = JOB_ALLREDUCE_GROUP, .buf = buf, .size = count,
                           .ranks = ranks, .n_ranks = n});
    return wait_all(c, err);
}

int tr_comm_has_group_parts(const struct tr_comm *c)
{
    return tr_comm_has_groups(c) &&
           TR_HAS_SLOT(c->vt, struct tr_comm_vtable, reduce_scatter_group) &&
           c->vt->reduce_scatter_group && TR_HAS_SLOT(c->vt, struct tr_comm_vtable, allgather_group) &&
           c->vt->allgather_group;
}

/* reduce-scatter (scatter = 1) or all-gather (0) among a group of ranks,
 * n*count floats at buf, this rank member `me`; through allreduce_group
 * where the plugin lacks the slots (an all-gather's other parts zeroed
 * first, so each float is one member's value plus zeros). */
static int group_parts(struct tr_comm *c, float *buf, size_t count, const int *ranks, int n,
                       int scatter, tr_err *err)
{
    int me = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == c->rank)
            me = i;
    size_t total = count * (size_t)n;
    int world = n == c->world; /* the world's own collectives (the bits runs without groups had) */
    int slot = world ? (scatter ? tr_comm_has_reduce_scatter(c) : tr_comm_has_allgather(c))
                     : tr_comm_has_group_parts(c);
    if (!slot) {
        if (!scatter && me >= 0) {
            tr_be_zero(c->be, buf, (size_t)me * count * sizeof(float));
            tr_be_zero(c->be, buf + (size_t)(me + 1) * count, (total - (size_t)(me + 1) * count) *
                                                                   sizeof(float));
        }
        return tr_comm_allreduce_group(c, buf, total, ranks, n, err);
    }
    if (group_check(c, ranks, n, err) != TR_OK)
        return TR_ERROR;
    if (me < 0 || n < 2 || !count) /* nothing here; still waits, like the others */
        return wait_all(c, err);
    if (world)
        submit(c, (struct job){.kind = scatter ? JOB_REDUCE_SCATTER : JOB_ALLGATHER, .buf = buf,
                               .size = count});
    else
        submit(c, (struct job){.kind = scatter ? JOB_REDUCE_SCATTER_GROUP : JOB_ALLGATHER_GROUP,
                               .buf = buf, .size = count, .ranks = ranks, .n_ranks = n});
    return wait_all(c, err);
}

int tr_comm_reduce_scatter_group(struct tr_comm *c, float *buf, size_t count, const int *ranks,
                                 int n, tr_err *err)
{
    return group_parts(c, buf, count, ranks, n, 1, err);
}

int tr_comm_allgather_group(struct tr_comm *c, float *buf, size_t count, const int *ranks, int n,
                            tr_err *err)
{
    return group_parts(c, buf, count, ranks, n, 0, err);
}

size_t tr_comm_group_start(struct tr_comm *c, int scatter, float *buf, size_t count,
                           const int *ranks, int n, void (*after)(void *ctx, size_t arg),
                           void *ctx, size_t arg)
{
    return submit(c, (struct job){.kind = scatter ? JOB_REDUCE_SCATTER_GROUP : JOB_ALLREDUCE_GROUP,
                                  .buf = buf, .size = count, .ranks = ranks, .n_ranks = n,
                                  .unpack = after, .hook_ctx = ctx, .hook_arg = arg});
}

size_t tr_comm_send_start(struct tr_comm *c, const void *send_buf, size_t send_bytes, int to)
{
    return submit(c, (struct job){.kind = JOB_SENDRECV, .buf = (void *)send_buf,
                                  .size = send_bytes, .root = to, .recv_buf = NULL,
                                  .recv_bytes = 0, .from = -1});
}

/* ---- host data ---------------------------------------------------------- */

/* A collective on host memory: straight through for host plugins, else
 * through a staging buffer in backend memory (grown on first use of a
 * size, then kept: the per-step scalars allocate nothing). */
static int host_job(struct tr_comm *c, struct job j, size_t bytes, tr_err *err)
{
    if (!c->stage) {
        submit(c, j);
        return wait_all(c, err);
    }
    if (bytes > c->staging_bytes) {
        if (c->staging)
            tr_be_free(c->be, c->staging);
        c->staging_bytes = 0;
        if (!(c->staging = tr_be_alloc(c->be, bytes)))
            return tr_fail(err, "out of %s memory for a collective's %zu bytes", tr_be_name(c->be),
                           bytes);
        c->staging_bytes = bytes;
    }
    void *host = j.buf;
    tr_be_upload(c->be, c->staging, host, bytes);
    j.buf = c->staging;
    submit(c, j);
    int rc = wait_all(c, err);
    if (rc == TR_OK)
        tr_be_download(c->be, host, c->staging, bytes);
    return rc;
}

int tr_comm_allreduce_host(struct tr_comm *c, float *buf, size_t count, tr_err *err)
{
    return host_job(c, (struct job){.kind = JOB_ALLREDUCE, .buf = buf, .size = count},
                    count * sizeof(float), err);
}

int tr_comm_broadcast_host(struct tr_comm *c, void *buf, size_t bytes, int root, tr_err *err)
{
    return host_job(c, (struct job){.kind = JOB_BROADCAST, .buf = buf, .size = bytes, .root = root},
                    bytes, err);
}

int tr_comm_allgather_host(struct tr_comm *c, float *buf, size_t count, tr_err *err)
{
    return host_job(c, (struct job){.kind = JOB_ALLGATHER, .buf = buf, .size = count},
                    (size_t)c->world * count * sizeof(float), err);
}

/* ---- gradient buckets ------------------------------------------------------ */

int tr_comm_plan_buckets(struct tr_comm *c, struct tr_graph *g, const struct tr_shard *layout,
                         tr_err *err)
{
    c->layout = *layout;
    c->scatter = layout->level >= TR_SHARD_GRADIENTS && layout->world > 1;
    /* after each reduce-scatter the rest of the bucket goes (zeroed where
     * the backend cannot give it back): the next micro-batch's backward
     * adds into this rank's part only what is new */
    c->discard = c->scatter;
    if (c->scatter && !tr_comm_has_reduce_scatter(c))
        return tr_fail(err, "parallel.shard = \"gradients\": comm '%s' has no reduce_scatter "
                       "(plugin ABI 2.3), which sharded gradients need; use a comm plugin that "
                       "has one (tcp, mpi, nccl) or shard = \"optimizer\"", c->name);
    c->n_buckets = layout->n_units;
    c->buckets = tr_xcalloc(c->n_buckets ? c->n_buckets : 1, sizeof *c->buckets);
    for (size_t b = 0; b < c->n_buckets; b++) {
        struct tr_shard_run r = tr_shard_unit(layout, b);
        c->buckets[b].begin = r.begin;
        c->buckets[b].end = r.end;
    }
    /* a parameter's gradient is final after the earliest node (backward runs
     * last to first) that adds into it */
    int *final_node = tr_xcalloc((size_t)g->n_tensors, sizeof *final_node);
    for (int t = 0; t < g->n_tensors; t++)
        final_node[t] = -1;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const struct tr_node *n = &g->nodes[i];
        if (!tr_graph_runs_backward(g, n))
            continue;
        for (int k = 0; k < n->n_in; k++) {
            const struct tr_tensor *t = &g->tensors[n->in[k]];
            if (t->role == TR_ROLE_PARAM && t->grad)
                final_node[n->in[k]] = i;
        }
    }
    c->final_start = tr_xcalloc((size_t)g->n_nodes + 1, sizeof *c->final_start);
    int total = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (final_node[t] >= 0) {
            c->final_start[final_node[t] + 1]++;
            total++;
        }
    for (int i = 0; i < g->n_nodes; i++)
        c->final_start[i + 1] += c->final_start[i];
    c->final_params = tr_xcalloc(total ? (size_t)total : 1, sizeof *c->final_params);
    int *fill = tr_xcalloc((size_t)g->n_nodes, sizeof *fill);
    for (int t = 0; t < g->n_tensors; t++)
        if (final_node[t] >= 0) {
            int i = final_node[t];
            c->final_params[c->final_start[i] + fill[i]++] = t;
            const struct tr_tensor *p = &g->tensors[t];
            for (size_t b = p->offset / c->layout.unit;
                 b < c->n_buckets && c->buckets[b].begin < p->offset + p->numel; b++)
                c->buckets[b].need++;
        }
    free(fill);
    free(final_node);
    return TR_OK;
}

size_t tr_comm_bucket_count(const struct tr_comm *c) { return c->n_buckets; }

/* A finished bucket's gradients summed over the ranks: all of it on every
 * rank, or (shard level gradients) each rank's part on that rank, the
 * leftover of the last bucket all-reduced (the last rank's). */
static void submit_bucket(struct tr_comm *c, struct tr_graph *g, struct bucket *b)
{
    size_t u = (size_t)(b - c->buckets);
    size_t per = c->scatter ? tr_shard_part_len(&c->layout, u) : 0;
    size_t rest = b->end - b->begin - per * (size_t)c->layout.world;
    /* the discard follows the bucket's last collective */
    if (per)
        submit(c, (struct job){.kind = JOB_REDUCE_SCATTER, .buf = g->grads + b->begin, .size = per,
                               .discard = c->discard && !rest ? u + 1 : 0});
    if (rest)
        submit(c, (struct job){.kind = JOB_ALLREDUCE, .buf = g->grads + b->end - rest, .size = rest,
                               .discard = c->discard ? u + 1 : 0});
    /* discarding: a bounded number of buckets summing at once, so a rank's
     * gradients stay its part plus what the plan counts in flight */
    if (c->discard)
        wait_pending(c, TR_COMM_BUCKETS_IN_FLIGHT);
}

static void bucket_hook(void *ctx, int node)
{
    struct tr_comm *c = ctx;
    struct tr_graph *g = c->armed;
    for (int k = c->final_start[node]; k < c->final_start[node + 1]; k++) {
        const struct tr_tensor *p = &g->tensors[c->final_params[k]];
        for (size_t b = p->offset / c->layout.unit;
             b < c->n_buckets && c->buckets[b].begin < p->offset + p->numel; b++)
            if (--c->buckets[b].left == 0)
                submit_bucket(c, g, &c->buckets[b]);
    }
}

void tr_comm_arm(struct tr_comm *c, struct tr_graph *g)
{
    for (size_t b = 0; b < c->n_buckets; b++)
        c->buckets[b].left = c->buckets[b].need;
    c->armed = g;
    c->grads = g->grads;
    g->on_backward = bucket_hook;
    g->on_backward_ctx = c;
}

int tr_comm_finish(struct tr_comm *c, struct tr_graph *g, tr_err *err)
{
    if (c->armed) {
        g->on_backward = NULL;
        g->on_backward_ctx = NULL;
        c->armed = NULL;
        /* buckets no parameter finishes (only untouched gradients) go now */
        for (size_t b = 0; b < c->n_buckets; b++)
            if (c->buckets[b].left > 0 || c->buckets[b].need == 0)
                submit_bucket(c, g, &c->buckets[b]);
    }
    return wait_all(c, err);
}

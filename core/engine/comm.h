/*
 * Data parallelism's plumbing: the comm plugin behind one communication
 * thread, and gradient buckets that start all-reducing while backward is
 * still running.
 *
 * Every collective goes through the thread, in submission order, so the
 * plugin sees calls from one thread only and every rank issues the same
 * calls in the same order (the graph, and so the bucket order, is the same
 * on every rank).
 */
#ifndef TR_COMM_H
#define TR_COMM_H

#include "graph.h"
#include "shard.h"
#include "../config/run_config.h"

struct tr_comm;
struct tr_backend;

/* Create cfg->comm's plugin instance (cfg->device_stream set first) and
 * start the thread; be: the backend whose memory the buffers are in. */
struct tr_comm *tr_comm_open(struct tr_config *cfg, const struct tr_backend *be, tr_err *err);
void tr_comm_close(struct tr_comm *c);
const char *tr_comm_describe(const struct tr_comm *c);

/* Blocking collectives (they wait for everything submitted before them),
 * on backend memory. */
int tr_comm_allreduce(struct tr_comm *c, float *buf, size_t count, tr_err *err);
int tr_comm_broadcast(struct tr_comm *c, void *buf, size_t bytes, int root, tr_err *err);
/* Rank r's count floats at buf + r*count to every rank; only when
 * tr_comm_has_allgather (the plugin's slot is optional). */
int tr_comm_allgather(struct tr_comm *c, float *buf, size_t count, tr_err *err);
int tr_comm_has_allgather(const struct tr_comm *c);
/* The same on host memory (scalars, the run state): a plugin that reads
 * device memory (nccl) gets a copy in backend memory. */
int tr_comm_allreduce_host(struct tr_comm *c, float *buf, size_t count, tr_err *err);
int tr_comm_broadcast_host(struct tr_comm *c, void *buf, size_t bytes, int root, tr_err *err);
int tr_comm_allgather_host(struct tr_comm *c, float *buf, size_t count, tr_err *err);
int tr_comm_has_reduce_scatter(const struct tr_comm *c);
/* Every rank's parts of buf (shard.h) to every rank: unit by unit, an
 * all-gather of the equal parts and a broadcast of the last rank's
 * leftover (the parameters after a sharded update). */
int tr_comm_gather_shards(struct tr_comm *c, float *buf, const struct tr_shard *s, tr_err *err);
/* The same for one unit u, not waited for: returns a ticket for
 * tr_comm_wait, which waits until that (and everything submitted before
 * it) has run and says whether every collective so far succeeded. */
size_t tr_comm_gather_unit(struct tr_comm *c, float *buf, const struct tr_shard *s, size_t u);
/* The same, and then after(ctx, u) on the communication thread once the
 * unit has arrived (if every collective of it succeeded). */
size_t tr_comm_gather_unit_then(struct tr_comm *c, float *buf, const struct tr_shard *s, size_t u,
                                void (*after)(void *ctx, size_t u), void *ctx);
/* The same with before(ctx, u) too, on the communication thread just
 * before the unit's first collective (before and after may be NULL): this
 * rank's part made current there (an offloaded update's, optim.h). */
size_t tr_comm_gather_unit_around(struct tr_comm *c, float *buf, const struct tr_shard *s,
                                  size_t u, void (*before)(void *ctx, size_t u),
                                  void (*after)(void *ctx, size_t u), void *ctx);
/* An all-gather of count floats a rank at buf (rank r's at buf + r*count),
 * not waited for (a ticket, as above), with two steps of the caller's on
 * the communication thread: pack(ctx, arg) just before the collective
 * (fill this rank's count floats) and unpack(ctx, arg) after it, if it
 * succeeded.  Jobs run one at a time in order, so one buffer serves every
 * such gather (sharded parameters in 16 bits, gather.c). */
size_t tr_comm_gather_packed(struct tr_comm *c, float *buf, size_t count,
                             void (*pack)(void *ctx, size_t arg),
                             void (*unpack)(void *ctx, size_t arg), void *ctx, size_t arg);
int tr_comm_wait(struct tr_comm *c, size_t ticket, tr_err *err);
/* Where the backend can discard (shard level gradients and up), each
 * bucket's reduce-scatter is followed by the discard of the parts other
 * ranks own, and backward waits while more than this many collectives are
 * queued: the gradients held at once are this rank's parts plus a bounded
 * number of buckets (fit.c plans them). */
enum { TR_COMM_BUCKETS_IN_FLIGHT = 2 };

/* Point to point, for pipeline stages (blocking: it waits for everything
 * submitted before it), on backend memory: send_bytes of send_buf to rank
 * `to` and recv_bytes into recv_buf from rank `from`, both at once (-1:
 * nothing that way).  Only when tr_comm_has_sendrecv (the plugin's slot is
 * optional; every plugin takes ring neighbours, the shipped ones any
 * rank).  Each
 * send needs its peer's matching receive of the same size: a send may wait
 * for it. */
int tr_comm_sendrecv(struct tr_comm *c, const void *send_buf, size_t send_bytes, int to,
                     void *recv_buf, size_t recv_bytes, int from, tr_err *err);
int tr_comm_has_sendrecv(const struct tr_comm *c);
/* buf summed among the ranks listed (ascending world ranks, n of them):
 * every rank calls it, in the same order, with the same list and count.
 * Members get the sum over the members (the same bits on each); a rank not
 * listed moves nothing and its buf is left alone, where the plugin has
 * allreduce_group (tr_comm_has_groups, plugin ABI 2.6).  Without it the
 * world all-reduces, the ranks not listed adding zeros from their buf
 * (count floats of backend memory each rank has), which is then given
 * back (tr_be_discard): the same sums, every rank moving the bytes.  All
 * ranks listed: the plain all-reduce. */
int tr_comm_allreduce_group(struct tr_comm *c, float *buf, size_t count, const int *ranks, int n,
                            tr_err *err);
int tr_comm_has_groups(const struct tr_comm *c);
/* Among the same kind of group (every rank calls, the same list and
 * count): n*count floats at buf, member i (the one at ranks[i]) owning
 * buf + i*count.  reduce_scatter_group: afterwards member i's part holds
 * the sum over the members (the rest of its buf undefined);
 * allgather_group: afterwards every member holds every member's part.
 * Through the plugin's reduce_scatter_group / allgather_group
 * (tr_comm_has_group_parts, plugin ABI 2.7), the world's own slots when
 * the group is the world, else tr_comm_allreduce_group (the all-gather's
 * other parts zeroed first): the same results, twice the bytes.  A rank
 * not listed moves nothing (or zeros, as tr_comm_allreduce_group says). */
int tr_comm_reduce_scatter_group(struct tr_comm *c, float *buf, size_t count, const int *ranks,
                                 int n, tr_err *err);
int tr_comm_allgather_group(struct tr_comm *c, float *buf, size_t count, const int *ranks, int n,
                            tr_err *err);
int tr_comm_has_group_parts(const struct tr_comm *c);
/* A group's reduce-scatter (scatter = 1, count floats a member, as
 * tr_comm_reduce_scatter_group) or all-reduce (0, count floats), queued
 * without waiting: returns a ticket for tr_comm_wait; after(ctx, arg)
 * runs on the communication thread once it succeeded.  Only the members
 * call it (2 <= n < world), where the plugin has the group slots
 * (tr_comm_has_group_parts); buf is the caller's until it has waited. */
size_t tr_comm_group_start(struct tr_comm *c, int scatter, float *buf, size_t count,
                           const int *ranks, int n, void (*after)(void *ctx, size_t arg),
                           void *ctx, size_t arg);
/* A send alone (send_bytes > 0 to a rank), queued on the communication
 * thread without waiting: returns a ticket for tr_comm_wait.  The caller
 * computes on while it goes, and must not touch send_buf until it has
 * waited (any blocking call waits for it first). */
size_t tr_comm_send_start(struct tr_comm *c, const void *send_buf, size_t send_bytes, int to);

/* What the communication thread ran while recording: each collective's
 * kind ("all-reduce", "group all-reduce", "reduce-scatter", "all-gather",
 * "broadcast"; "send",
 * "recv" or "sendrecv" point to point, its bytes sent plus received), its
 * size and when it ran (tr_now()), for the trace of a sampled step. */
struct tr_comm_span {
    const char *kind;
    size_t bytes;
    double t0, t1;
};
enum { TR_COMM_SPANS = 1024 }; /* a step's spans kept; later ones are dropped */
/* Start recording (forgetting what was recorded), or stop. */
void tr_comm_record(struct tr_comm *c, int on);
/* The spans recorded since recording started (after the calls finished:
 * call once the step's collectives have been waited for). */
size_t tr_comm_spans(const struct tr_comm *c, const struct tr_comm_span **spans);

/* Gradient buckets over g's flat gradient buffer: the units of layout.
 * After tr_comm_arm(), the graph's backward submits each bucket's
 * all-reduce (shard level gradients: reduce-scatter, each rank's part
 * summed on that rank only) as soon as the last node writing into it has
 * run; tr_comm_finish() submits any left and waits for all of them.  A
 * plugin without reduce_scatter is refused here under level gradients. */
int tr_comm_plan_buckets(struct tr_comm *c, struct tr_graph *g, const struct tr_shard *layout,
                         tr_err *err);
void tr_comm_arm(struct tr_comm *c, struct tr_graph *g);
int tr_comm_finish(struct tr_comm *c, struct tr_graph *g, tr_err *err);
size_t tr_comm_bucket_count(const struct tr_comm *c);

#endif

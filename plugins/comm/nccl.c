/*
 * comm = "nccl": collectives among GPU ranks (one process per GPU) over NCCL.
 *
 * Rank 0 makes NCCL's unique id and hands it to the others: through
 * MPI_Bcast when the job runs under Open MPI's mpirun (libmpi is loaded at
 * run time, so this plugin does not depend on MPI), otherwise through
 * TRAINRUN_MASTER=host:port or TRAINRUN_RENDEZVOUS_FILE=path
 * (rendezvous.h).
 *
 * Every call is blocking, as the comm ABI says: the collective is queued on
 * the backend's stream (or this plugin's own when the core gives none) and
 * the calling thread polls the stream and NCCL's asynchronous error state.
 * A peer that dies shows up as an NCCL error or, where NCCL cannot see it
 * (a kernel waiting for data that never comes), as the `timeout` running
 * out; either way the communicator is aborted and the call fails instead
 * of hanging.
 *
 * sendrecv (point to point, for pipeline stages) is ncclSend and ncclRecv
 * in one group, so both directions progress together, on the same stream
 * and waited for the same way.  NCCL takes any peer.
 *
 * The group slots (allreduce_group, ABI 2.6; reduce_scatter_group and
 * allgather_group, 2.7) run on a communicator of the members, made the
 * first time a group is used and kept, by rank set, until destroy.  Not
 * with ncclCommSplit, which every rank of the parent must call, while the
 * slots are called by the members only: the group's first member makes a
 * unique id and sends it to the others with ncclSend on the world's
 * communicator (only the members take part), and the members then
 * initialise the group's communicator, nonblocking, waited for against
 * the timeout.  Any failure aborts every communicator of the plugin.
 */
#include <trainrun/plugin.h>

#include "rendezvous.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

struct nccl_config {
    double timeout;
    double rendezvous_timeout;
};

static const struct tr_option nccl_options[] = {
    {TR_OPT_FLOAT, "timeout", "600", 0, 604800, NULL,
     "seconds a collective (or setting up the communicator) may take before the communicator "
     "is aborted and the run stops, so a dead or hung rank cannot stall the others forever "
     "(NCCL cannot say which rank it was); 0 waits forever",
     offsetof(struct nccl_config, timeout)},
    {TR_OPT_FLOAT, "rendezvous_timeout", "300", 1, 86400, NULL,
     "seconds ranks wait for rank 0 through TRAINRUN_MASTER or TRAINRUN_RENDEZVOUS_FILE",
     offsetof(struct nccl_config, rendezvous_timeout)},
    {.type = TR_OPT_END},
};

/* A group's communicator, by its members (world ranks, ascending). */
struct group {
    int n, *ranks;
    ncclComm_t comm;
};

struct nccl_comm {
    ncclComm_t comm;   /* NULL once aborted */
    struct group *groups;
    int n_groups;
    void *id_buf;      /* device memory a unique id travels through (groups) */
    cudaStream_t stream;
    int own_stream;    /* created here, destroyed here */
    int device;        /* CUDA device of this rank */
    int rank, world;
    double timeout;
    char description[512];
};

static int cuda_fail(tr_err *err, const char *what, cudaError_t e)
{
    return tr_fail(err, "comm nccl: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Seconds from now until the timeout; +inf when there is none. */
static double deadline_after(double timeout)
{
    return timeout > 0 ? rdv_now() + timeout : HUGE_VAL;
}

/* Aborting is the only way to release ranks stuck in a collective; the
 * communicator is gone afterwards and later calls fail at once. */
static void abort_comm(struct nccl_comm *c)
{
    for (int g = 0; g < c->n_groups; g++)
        if (c->groups[g].comm) {
            ncclCommAbort(c->groups[g].comm);
            c->groups[g].comm = NULL;
        }
    if (c->comm) {
        ncclCommAbort(c->comm);
        c->comm = NULL;
    }
}

/* on `comm` (the world's, or a group's) */
static int nccl_fail_on(struct nccl_comm *c, ncclComm_t comm, tr_err *err, const char *what,
                        ncclResult_t r)
{
    const char *detail = ncclGetLastError(comm);
    tr_fail(err, "comm nccl: %s failed on rank %d: %s%s%s (the communicator is aborted; a rank "
                 "that died or was killed makes its peers fail this way)",
            what, c->rank, ncclGetErrorString(r), detail && detail[0] ? ": " : "",
            detail ? detail : "");
    abort_comm(c);
    return TR_ERROR;
}

static int nccl_fail(struct nccl_comm *c, tr_err *err, const char *what, ncclResult_t r)
{
    return nccl_fail_on(c, c->comm, err, what, r);
}

static int timed_out(struct nccl_comm *c, tr_err *err, const char *what)
{
    tr_fail(err,
            "comm nccl: %s did not complete within %.0f s on rank %d (timeout option): a rank "
            "died or hangs; NCCL cannot tell which, see the other ranks' logs",
            what, c->timeout, c->rank);
    abort_comm(c);
    return TR_ERROR;
}

/* A nonblocking communicator may still be working on the last call
 * (ncclInProgress); wait until that settles. */
static int settle_on(struct nccl_comm *c, ncclComm_t comm, const char *what, double deadline,
                     tr_err *err)
{
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return nccl_fail_on(c, comm, err, what, r);
        if (state == ncclSuccess)
            return TR_OK;
        if (state != ncclInProgress)
            return nccl_fail_on(c, comm, err, what, state);
        if (rdv_now() > deadline)
            return timed_out(c, err, what);
        sched_yield();
    }
}

static int settle(struct nccl_comm *c, const char *what, double deadline, tr_err *err)
{
    return settle_on(c, c->comm, what, deadline, err);
}

/* Blocks until the collective queued on `comm` is done, watching NCCL's
 * error state. */
static int finish_on(struct nccl_comm *c, ncclComm_t comm, const char *what, ncclResult_t queued,
                     tr_err *err)
{
    double start = rdv_now(), deadline = deadline_after(c->timeout);
    if (queued != ncclSuccess && queued != ncclInProgress)
        return nccl_fail_on(c, comm, err, what, queued);
    if (settle_on(c, comm, what, deadline, err) != TR_OK)
        return TR_ERROR;
    for (;;) {
        cudaError_t q = cudaStreamQuery(c->stream);
        if (q == cudaSuccess)
            return TR_OK;
        if (q != cudaErrorNotReady) {
            cuda_fail(err, what, q);
            abort_comm(c);
            return TR_ERROR;
        }
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return nccl_fail_on(c, comm, err, what, r);
        if (state != ncclSuccess && state != ncclInProgress)
            return nccl_fail_on(c, comm, err, what, state);
        double now = rdv_now();
        if (now > deadline)
            return timed_out(c, err, what);
        /* spin for short collectives, then stop burning a core */
        if (now - start > 0.002)
            rdv_sleep(20e-6);
    }
}

static int finish(struct nccl_comm *c, const char *what, ncclResult_t queued, tr_err *err)
{
    return finish_on(c, c->comm, what, queued, err);
}

/* The core's communication thread is not the thread that created the
 * plugin, and the current CUDA device is per thread. */
static int enter(struct nccl_comm *c, tr_err *err)
{
    if (!c->comm)
        return tr_fail(err, "comm nccl: the communicator was aborted after an earlier error");
    cudaError_t e = cudaSetDevice(c->device);
    return e == cudaSuccess ? TR_OK : cuda_fail(err, "cudaSetDevice", e);
}

/* The in-place collectives, on `comm` (the world's or a group's) as member
 * `me` of it: rank r's part of an all-gather or a reduce-scatter sits at
 * buf + r*count, where NCCL's in-place forms take it. */
enum nccl_op { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER };

static int run_op(struct nccl_comm *c, ncclComm_t comm, int me, enum nccl_op op, float *buf,
                  size_t count, const char *what, tr_err *err)
{
    float *mine = buf + (size_t)me * count;
    ncclResult_t queued =
        op == OP_ALLREDUCE ? ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, c->stream)
        : op == OP_REDUCE_SCATTER
            ? ncclReduceScatter(buf, mine, count, ncclFloat, ncclSum, comm, c->stream)
            : ncclAllGather(mine, buf, count, ncclFloat, comm, c->stream);
    return finish_on(c, comm, what, queued, err);
}

static int nccl_allreduce_sum(void *self, float *buf, size_t count, tr_err *err)
{
    struct nccl_comm *c = self;
    if (enter(c, err) != TR_OK)
        return TR_ERROR;
    return run_op(c, c->comm, c->rank, OP_ALLREDUCE, buf, count, "allreduce", err);
}

static int nccl_broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    struct nccl_comm *c = self;
    if (root < 0 || root >= c->world)
        return tr_fail(err, "comm nccl: broadcast from rank %d, but there are %d ranks", root,
                       c->world);
    if (enter(c, err) != TR_OK)
        return TR_ERROR;
    return finish(c, "broadcast",
                  ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->comm, c->stream), err);
}

static int nccl_allgather(void *self, float *buf, size_t count, tr_err *err)
{
    struct nccl_comm *c = self;
    if (enter(c, err) != TR_OK)
        return TR_ERROR;
    return run_op(c, c->comm, c->rank, OP_ALLGATHER, buf, count, "allgather", err);
}

static int nccl_reduce_scatter(void *self, float *buf, size_t count, tr_err *err)
{
    struct nccl_comm *c = self;
    if (enter(c, err) != TR_OK)
        return TR_ERROR;
    if (count == 0) /* every rank passes the same count: all skip it alike */
        return TR_OK;
    return run_op(c, c->comm, c->rank, OP_REDUCE_SCATTER, buf, count, "reduce_scatter", err);
}

static int nccl_sendrecv(void *self, const void *send_buf, size_t send_bytes, int to,
                         void *recv_buf, size_t recv_bytes, int from, tr_err *err)
{
    struct nccl_comm *c = self;
    if (to < -1 || to >= c->world || from < -1 || from >= c->world)
        return tr_fail(err, "comm nccl: sendrecv on rank %d to rank %d and from rank %d, but "
                       "there are %d ranks (-1: none)", c->rank, to, from, c->world);
    if (enter(c, err) != TR_OK)
        return TR_ERROR;
    int sends = to >= 0 && send_bytes, receives = from >= 0 && recv_bytes;
    if (!sends && !receives)
        return TR_OK;
    char what[128];
    snprintf(what, sizeof what, "sendrecv (%zu bytes to rank %d, %zu from rank %d)",
             sends ? send_bytes : 0, sends ? to : -1, receives ? recv_bytes : 0,
             receives ? from : -1);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess && sends)
        r = ncclSend(send_buf, send_bytes, ncclUint8, to, c->comm, c->stream);
    if (r == ncclSuccess && receives)
        r = ncclRecv(recv_buf, recv_bytes, ncclUint8, from, c->comm, c->stream);
    /* the group is closed whatever happened inside it */
    ncclResult_t end = ncclGroupEnd();
    return finish(c, what, r != ncclSuccess ? r : end, err);
}

/* ---- groups: a communicator of the members ---------------------------------- */

/* The communicator of the group `ranks` (n world ranks, ascending, this
 * rank at *me) for a call of `what`: the world's for the whole world,
 * else the group's, made now on its first use. */
static int group_comm(struct nccl_comm *c, const int *ranks, int n, const char *what, int *me,
                      ncclComm_t *out, tr_err *err)
{
    *me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->world || (i && ranks[i] <= ranks[i - 1]))
            return tr_fail(err, "comm nccl: %s on rank %d: the ranks must ascend from 0 to %d "
                           "without repeats (rank %d at position %d)",
                           what, c->rank, c->world - 1, ranks[i], i);
        if (ranks[i] == c->rank)
            *me = i;
    }
    if (*me < 0)
        return tr_fail(err, "comm nccl: %s called on rank %d, which is not among its %d ranks: "
                       "only the members call it", what, c->rank, n);
    if (enter(c, err) != TR_OK)
        return TR_ERROR;
    *out = c->comm;
    if (n == c->world)
        return TR_OK;
    for (int g = 0; g < c->n_groups; g++)
        if (c->groups[g].n == n && memcmp(c->groups[g].ranks, ranks, sizeof *ranks * (size_t)n) == 0) {
            if (!(*out = c->groups[g].comm))
                return tr_fail(err, "comm nccl: the communicator was aborted after an earlier "
                               "error");
            return TR_OK;
        }
    struct group *more = realloc(c->groups, sizeof *more * (size_t)(c->n_groups + 1));
    int *copy = malloc(sizeof *copy * (size_t)n);
    if (more)
        c->groups = more;
    if (!more || !copy) {
        free(copy);
        return tr_fail(err, "comm nccl: out of memory for a group");
    }
    memcpy(copy, ranks, sizeof *copy * (size_t)n);
    /* the first member's unique id to the others, point to point on the world's */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    cudaError_t e = c->id_buf ? cudaSuccess : cudaMalloc(&c->id_buf, sizeof id);
    if (e == cudaSuccess && *me == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        free(copy);
        return tr_fail(err, "comm nccl: ncclGetUniqueId for a group of %d ranks failed", n);
    }
    if (e == cudaSuccess && *me == 0)
        e = cudaMemcpy(c->id_buf, &id, sizeof id, cudaMemcpyHostToDevice);
    /* from pageable memory the copy may return before it has run, on the
     * legacy stream, which a non-blocking stream does not wait for */
    if (e == cudaSuccess && *me == 0)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        free(copy);
        return cuda_fail(err, "a group's unique id", e);
    }
    char making[160];
    snprintf(making, sizeof making, "making the communicator of %d ranks from rank %d for %s", n,
             ranks[0], what);
    ncclResult_t r = ncclGroupStart();
    for (int i = 1; r == ncclSuccess && i < n; i++)
        if (*me == 0)
            r = ncclSend(c->id_buf, sizeof id, ncclUint8, ranks[i], c->comm, c->stream);
        else if (i == *me)
            r = ncclRecv(c->id_buf, sizeof id, ncclUint8, ranks[0], c->comm, c->stream);
    ncclResult_t end = ncclGroupEnd();
    if (finish(c, making, r != ncclSuccess ? r : end, err) != TR_OK) {
        free(copy);
        return TR_ERROR;
    }
    if (*me > 0 && (e = cudaMemcpy(&id, c->id_buf, sizeof id, cudaMemcpyDeviceToHost)) != cudaSuccess) {
        free(copy);
        return cuda_fail(err, "a group's unique id", e);
    }
    ncclConfig_t ncfg = NCCL_CONFIG_INITIALIZER;
    ncfg.blocking = 0; /* a member that never joins costs a timeout, not a hang */
    ncclComm_t comm = NULL;
    r = ncclCommInitRankConfig(&comm, n, id, *me, &ncfg);
    c->groups[c->n_groups++] = (struct group){n, copy, comm};
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_fail_on(c, comm, err, making, r);
    if (settle_on(c, comm, making, deadline_after(c->timeout), err) != TR_OK)
        return TR_ERROR;
    *out = comm;
    return TR_OK;
}

/* op among the group's members, on its communicator */
static int group_op(void *self, enum nccl_op op, float *buf, size_t count, const int *ranks, int n,
                    const char *what, tr_err *err)
{
    struct nccl_comm *c = self;
    int me;
    ncclComm_t comm;
    if (group_comm(c, ranks, n, what, &me, &comm, err) != TR_OK)
        return TR_ERROR;
    if (n == 1 || count == 0)
        return TR_OK;
    return run_op(c, comm, me, op, buf, count, what, err);
}

static int nccl_allreduce_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                tr_err *err)
{
    return group_op(self, OP_ALLREDUCE, buf, count, ranks, n, "allreduce_group", err);
}

static int nccl_reduce_scatter_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                     tr_err *err)
{
    return group_op(self, OP_REDUCE_SCATTER, buf, count, ranks, n, "reduce_scatter_group", err);
}

static int nccl_allgather_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                tr_err *err)
{
    return group_op(self, OP_ALLGATHER, buf, count, ranks, n, "allgather_group", err);
}

static const char *nccl_describe(void *self)
{
    return ((struct nccl_comm *)self)->description;
}

/* ---- the unique id through Open MPI, loaded only when the job runs under it ---- */

struct mpi_calls {
    int (*initialized)(int *);
    int (*finalized)(int *);
    int (*init)(int *, char ***);
    int (*comm_rank)(void *, int *);
    int (*comm_size)(void *, int *);
    int (*bcast)(void *, int, void *, int, void *);
    int (*finalize)(void);
    void *comm_world, *byte; /* MPI_COMM_WORLD and MPI_BYTE are these symbols' addresses */
};

/* 1: shared through MPI; 0: not under MPI (use the other routes); TR_ERROR. */
static int share_via_mpi(ncclUniqueId *id, int rank, int world, char *via, size_t via_cap,
                         tr_err *err)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE"))
        return 0;
    void *lib = dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        lib = dlopen("libmpi.so", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return 0;
    struct mpi_calls m;
    *(void **)&m.initialized = dlsym(lib, "MPI_Initialized");
    *(void **)&m.finalized = dlsym(lib, "MPI_Finalized");
    *(void **)&m.init = dlsym(lib, "MPI_Init");
    *(void **)&m.comm_rank = dlsym(lib, "MPI_Comm_rank");
    *(void **)&m.comm_size = dlsym(lib, "MPI_Comm_size");
    *(void **)&m.bcast = dlsym(lib, "MPI_Bcast");
    *(void **)&m.finalize = dlsym(lib, "MPI_Finalize");
    m.comm_world = dlsym(lib, "ompi_mpi_comm_world");
    m.byte = dlsym(lib, "ompi_mpi_byte");
    if (!m.initialized || !m.finalized || !m.init || !m.comm_rank || !m.comm_size || !m.bcast ||
        !m.finalize || !m.comm_world || !m.byte)
        return 0; /* not Open MPI: fall back to TRAINRUN_MASTER / the file */
    int inited = 0, finalized = 0;
    m.initialized(&inited);
    m.finalized(&finalized);
    if (finalized)
        return 0;
    if (!inited && m.init(NULL, NULL) != 0)
        return tr_fail(err, "comm nccl: MPI_Init failed; set TRAINRUN_MASTER or "
                            "TRAINRUN_RENDEZVOUS_FILE to exchange the NCCL id without MPI");
    int mpi_rank = -1, mpi_world = -1;
    m.comm_rank(m.comm_world, &mpi_rank);
    m.comm_size(m.comm_world, &mpi_world);
    if (mpi_rank != rank || mpi_world != world)
        return tr_fail(err,
                       "comm nccl: MPI says this process is rank %d of %d, but trainrun was told "
                       "rank %d of %d: unset TRAINRUN_RANK/TRAINRUN_WORLD_SIZE under mpirun, or "
                       "make them agree",
                       mpi_rank, mpi_world, rank, world);
    if (m.bcast(id, (int)sizeof *id, m.byte, 0, m.comm_world) != 0)
        return tr_fail(err, "comm nccl: MPI_Bcast of the NCCL id failed");
    /* MPI was needed for this one broadcast; a rank may finalise early and
     * mpirun still expects every rank to finalise before it exits. */
    if (!inited)
        m.finalize();
    snprintf(via, via_cap, "MPI_Bcast");
    return 1;
}

/* ---- create / destroy ---------------------------------------------------- */

static void nccl_destroy(void *self);

/* The GPU of this rank: one per rank on the node, or the one a rank sees
 * when each sees a single GPU (CUDA_VISIBLE_DEVICES set per rank, as Slurm
 * does); made current. */
static int choose_device(const struct tr_create_args *args, int *device, tr_err *err)
{
    if (!TR_HAS_FIELD(args, struct tr_create_args, device_stream))
        return tr_fail(err, "comm nccl: this trainrun is too old for GPU ranks (it passes no "
                            "device stream)");
    if (!args->device || strcmp(args->device, "cuda") != 0)
        return tr_fail(err,
                       "comm nccl: buffers live on '%s', but nccl moves GPU memory: run on "
                       "GPUs, or use comm = \"mpi\" for CPU ranks",
                       args->device ? args->device : "(none)");
    int gpus = 0;
    cudaError_t e = cudaGetDeviceCount(&gpus);
    if (e != cudaSuccess || gpus == 0)
        return tr_fail(err,
                       "comm nccl: no usable GPU on this host (%s): run on a GPU node, or use "
                       "comm = \"mpi\" for CPU ranks",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 CUDA devices");
    *device = args->local_rank;
    if (gpus == 1)
        *device = 0;
    else if (*device < 0 || *device >= gpus)
        return tr_fail(err,
                       "comm nccl: local rank %d needs GPU %d, but this host shows %d GPUs: "
                       "start at most one rank per GPU",
                       args->local_rank, args->local_rank, gpus);
    e = cudaSetDevice(*device);
    if (e != cudaSuccess)
        return cuda_fail(err, "cudaSetDevice", e);
    return TR_OK;
}

/* Rank 0's unique id shared with every rank, through MPI when the ranks
 * were started by it, else the rendezvous; `via` says which. */
static int share_id(struct nccl_comm *c, const struct nccl_config *cfg, ncclUniqueId *id,
                    char *via, size_t via_size, tr_err *err)
{
    memset(id, 0, sizeof *id);
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0 && (r = ncclGetUniqueId(id)) != ncclSuccess)
        return nccl_fail(c, err, "ncclGetUniqueId", r);
    int mpi = share_via_mpi(id, c->rank, c->world, via, via_size, err);
    if (mpi == TR_ERROR)
        return TR_ERROR;
    if (mpi == 0 && rdv_share("comm nccl", id, sizeof *id, c->rank, c->world,
                              cfg->rendezvous_timeout, via, via_size, err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

/* The engine's stream when it gives one, else a stream of our own. */
static int choose_stream(struct nccl_comm *c, const struct tr_create_args *args, tr_err *err)
{
    if (args->device_stream) {
        c->stream = (cudaStream_t)args->device_stream;
        return TR_OK;
    }
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cuda_fail(err, "cudaStreamCreate", e);
    c->own_stream = 1;
    return TR_OK;
}

/* Nonblocking, so a rank that never joins costs a timeout, not a hang. */
static int init_communicator(struct nccl_comm *c, ncclUniqueId id, tr_err *err)
{
    ncclConfig_t ncfg = NCCL_CONFIG_INITIALIZER;
    ncfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, c->world, id, c->rank, &ncfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_fail(c, err, "ncclCommInitRankConfig", r);
    return settle(c, "setting up the communicator", deadline_after(c->timeout), err);
}

static int nccl_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    const struct nccl_config *cfg = config;
    int device = 0;
    if (choose_device(args, &device, err) != TR_OK)
        return TR_ERROR;

    struct nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return tr_fail(err, "comm nccl: out of memory");
    c->device = device;
    c->rank = args->rank;
    c->world = args->world;
    c->timeout = cfg->timeout;

    ncclUniqueId id;
    char via[200];
    if (share_id(c, cfg, &id, via, sizeof via, err) != TR_OK ||
        choose_stream(c, args, err) != TR_OK || init_communicator(c, id, err) != TR_OK) {
        nccl_destroy(c);
        return TR_ERROR;
    }

    int version = 0;
    ncclGetVersion(&version);
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
        snprintf(prop.name, sizeof prop.name, "?");
    snprintf(c->description, sizeof c->description,
             "nccl %d.%d.%d, rank %d of %d on GPU %d (%.64s), id via %.200s", version / 10000,
             version / 100 % 100, version % 100, c->rank, c->world, device, prop.name, via);
    *self = c;
    return TR_OK;
}

static void nccl_destroy(void *self)
{
    struct nccl_comm *c = self;
    if (!c)
        return;
    cudaSetDevice(c->device);
    for (int g = 0; g < c->n_groups; g++) { /* as the world's below */
        if (c->groups[g].comm) {
            ncclResult_t r = ncclCommFinalize(c->groups[g].comm);
            tr_err ignored;
            if ((r != ncclSuccess && r != ncclInProgress) ||
                settle_on(c, c->groups[g].comm, "finalize", deadline_after(c->timeout),
                          &ignored) != TR_OK)
                abort_comm(c);
            if (c->groups[g].comm)
                ncclCommDestroy(c->groups[g].comm);
        }
        free(c->groups[g].ranks);
    }
    free(c->groups);
    if (c->id_buf)
        cudaFree(c->id_buf);
    if (c->comm) {
        /* Finalize flushes outstanding work; if that fails or stalls, abort. */
        tr_err ignored;
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (r != ncclSuccess && r != ncclInProgress)
            abort_comm(c);
        else
            settle(c, "finalize", deadline_after(c->timeout), &ignored); /* aborts on failure */
        if (c->comm)
            ncclCommDestroy(c->comm);
    }
    if (c->own_stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

static const struct tr_comm_vtable nccl_vtable = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = nccl_allreduce_sum,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .describe = nccl_describe,
    .reduce_scatter = nccl_reduce_scatter,
    .sendrecv = nccl_sendrecv,
    .allreduce_group = nccl_allreduce_group,
    .reduce_scatter_group = nccl_reduce_scatter_group,
    .allgather_group = nccl_allgather_group,
};

static const struct tr_plugin_info nccl_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_COMM,
    .name = "nccl",
    .version = "0.1.0",
    .description = "collectives among GPU ranks over NCCL, one process per GPU",
    .options = nccl_options,
    .config_size = sizeof(struct nccl_config),
    .create = nccl_create,
    .destroy = nccl_destroy,
    .vtable = &nccl_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &nccl_info; }

/*
 * comm = "mpi": collectives among CPU ranks over MPI (built against Open MPI).
 *
 *   mpirun -np 4 trainrun train recipe.lua
 *
 * Buffers are host memory.  MPI is initialised here with
 * MPI_THREAD_SERIALIZED because the core calls collectives from its
 * communication thread, not from the thread that created the plugin.
 *
 * When a rank dies, mpirun itself aborts the whole job (every other rank is
 * killed and mpirun exits non-zero), so no rank hangs on a dead peer.  The
 * communicator also returns errors (MPI_ERRORS_RETURN) instead of aborting
 * inside the library, so a failure that MPI reports reaches the core as an
 * error message.  A rank that hangs without dying is caught only with the
 * `timeout` option: collectives then run nonblocking and fail after that
 * many seconds without completing.
 */
#include <trainrun/plugin.h>

#include <mpi.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mpi_config {
    double timeout;
};

static const struct tr_option mpi_options[] = {
    {TR_OPT_FLOAT, "timeout", "0", 0, 604800, NULL,
     "seconds a collective may take before it fails, so a hung (not dead) rank stops the job; "
     "0 waits forever (mpirun already aborts the job when a rank dies)",
     offsetof(struct mpi_config, timeout)},
    {.type = TR_OPT_END},
};

struct mpi_comm {
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD, so instances never mix */
    int rank, world, local_world;
    double timeout;
    int broken; /* a collective timed out and is still pending: the comm is unusable */
    char description[256];
};

/* MPI can be initialised and finalised once per process, so this much
 * state is process-wide: whether this plugin called MPI_Init_thread (and so
 * owns MPI_Finalize) and how many instances are alive. */
static int initialized_here;
static int live_instances;

/* Largest element count one MPI call takes (its counts are int). */
#define MPI_CHUNK ((size_t)1 << 30)

static int mpi_error(tr_err *err, const char *what, int code)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", code);
    return tr_fail(err, "comm mpi: %s failed: %s (mpirun names the rank that died, if one did)",
                   what, text);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for a nonblocking collective until the instance's timeout. */
static int wait_request(struct mpi_comm *m, MPI_Request *req, const char *what, tr_err *err)
{
    double deadline = now_seconds() + m->timeout;
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_error(err, what, rc);
        if (done)
            return TR_OK;
        /* MPI makes progress inside MPI_Test; read the clock only now and then */
        if ((spins & 1023) == 0 && now_seconds() > deadline) {
            m->broken = 1;
            return tr_fail(err,
                           "comm mpi: %s did not complete within %.0f s (timeout option): a rank "
                           "hangs or died; MPI cannot tell which, see the other ranks' logs",
                           what, m->timeout);
        }
    }
}

static int usable(const struct mpi_comm *m, tr_err *err)
{
    if (m->broken)
        return tr_fail(err, "comm mpi: the communicator is unusable after an earlier timeout");
    return TR_OK;
}

static int mpi_allreduce_sum(void *self, float *buf, size_t count, tr_err *err)
{
    struct mpi_comm *m = self;
    if (usable(m, err) != TR_OK)
        return TR_ERROR;
    for (size_t done = 0; done < count; done += MPI_CHUNK) {
        int n = (int)(count - done < MPI_CHUNK ? count - done : MPI_CHUNK);
        int rc;
        if (m->timeout > 0) {
            MPI_Request req;
            rc = MPI_Iallreduce(MPI_IN_PLACE, buf + done, n, MPI_FLOAT, MPI_SUM, m->comm, &req);
            if (rc == MPI_SUCCESS && wait_request(m, &req, "allreduce", err) != TR_OK)
                return TR_ERROR;
        } else {
            rc = MPI_Allreduce(MPI_IN_PLACE, buf + done, n, MPI_FLOAT, MPI_SUM, m->comm);
        }
        if (rc != MPI_SUCCESS)
            return mpi_error(err, "allreduce", rc);
    }
    return TR_OK;
}

static int mpi_broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    struct mpi_comm *m = self;
    if (usable(m, err) != TR_OK)
        return TR_ERROR;
    if (root < 0 || root >= m->world)
        return tr_fail(err, "comm mpi: broadcast from rank %d, but there are %d ranks", root,
                       m->world);
    char *p = buf;
    for (size_t done = 0; done < bytes; done += MPI_CHUNK) {
        int n = (int)(bytes - done < MPI_CHUNK ? bytes - done : MPI_CHUNK);
        int rc;
        if (m->timeout > 0) {
            MPI_Request req;
            rc = MPI_Ibcast(p + done, n, MPI_BYTE, root, m->comm, &req);
            if (rc == MPI_SUCCESS && wait_request(m, &req, "broadcast", err) != TR_OK)
                return TR_ERROR;
        } else {
            rc = MPI_Bcast(p + done, n, MPI_BYTE, root, m->comm);
        }
        if (rc != MPI_SUCCESS)
            return mpi_error(err, "broadcast", rc);
    }
    return TR_OK;
}

static int mpi_allgather(void *self, float *buf, size_t count, tr_err *err)
{
    struct mpi_comm *m = self;
    if (usable(m, err) != TR_OK)
        return TR_ERROR;
    if (count > INT_MAX)
        return tr_fail(err,
                       "comm mpi: allgather of %zu floats per rank exceeds MPI's %d; gather in "
                       "smaller pieces",
                       count, INT_MAX);
    int rc;
    if (m->timeout > 0) {
        MPI_Request req;
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)count, MPI_FLOAT,
                            m->comm, &req);
        if (rc == MPI_SUCCESS && wait_request(m, &req, "allgather", err) != TR_OK)
            return TR_ERROR;
    } else {
        rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)count, MPI_FLOAT,
                           m->comm);
    }
    return rc == MPI_SUCCESS ? TR_OK : mpi_error(err, "allgather", rc);
}

static const char *mpi_describe(void *self)
{
    return ((struct mpi_comm *)self)->description;
}

/* Open MPI loads its components with dlopen and they expect libmpi's
 * symbols in the global namespace; the core loads plugins RTLD_LOCAL, so
 * promote the already-loaded libmpi to global. */
static void make_libmpi_global(void)
{
    static const char *const names[] = {"libmpi.so.40", "libmpi.so.12", "libmpi.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (dlopen(names[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD))
            return;
}

static void describe_library(char *out, size_t cap)
{
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(version, &len) != MPI_SUCCESS)
        snprintf(version, sizeof version, "MPI");
    version[strcspn(version, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
    snprintf(out, cap, "%.100s", version);
}

static void mpi_destroy(void *self);

/* MPI started here at MPI_THREAD_SERIALIZED, or already started by someone
 * else at that level at least; never after it was finalised. */
static int start_mpi(tr_err *err)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return tr_fail(err, "comm mpi: MPI was already finalised in this process and cannot start "
                            "again; create the mpi comm once per process");
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        make_libmpi_global();
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_error(err, "MPI_Init_thread", rc);
        initialized_here = 1;
        if (provided < MPI_THREAD_SERIALIZED)
            return tr_fail(err,
                           "comm mpi: this MPI library gives thread level %d, below "
                           "MPI_THREAD_SERIALIZED that the core's communication thread needs; "
                           "use an MPI built with thread support",
                           provided);
    } else {
        int provided = 0;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_SERIALIZED)
            return tr_fail(err,
                           "comm mpi: MPI was initialised by someone else at thread level %d, "
                           "below the MPI_THREAD_SERIALIZED the core's communication thread needs",
                           provided);
    }
    return TR_OK;
}

/* m's own communicator, a duplicate of the world's returning errors, and
 * the ranks on this node. */
static int dup_communicator(struct mpi_comm *m, tr_err *err)
{
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm node = MPI_COMM_NULL;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) {
        MPI_Comm_size(node, &m->local_world);
        MPI_Comm_free(&node);
    }
    if (rc != MPI_SUCCESS)
        return mpi_error(err, "creating the communicator", rc);
    return TR_OK;
}

static int mpi_create(const struct tr_host *host, const void *config,
                      const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    const struct mpi_config *cfg = config;
    if (TR_HAS_SLOT(args, struct tr_create_args, device) && strcmp(args->device, "cpu") != 0)
        return tr_fail(err,
                       "comm mpi: buffers on device '%s' need comm = \"nccl\"; mpi moves host "
                       "memory only",
                       args->device);
    if (start_mpi(err) != TR_OK)
        return TR_ERROR;

    int mpi_rank = -1, mpi_world = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_world);
    /* On failure MPI stays initialised: the core stops this process, and
     * mpirun ends the job when a rank exits without MPI_Finalize. */
    if (mpi_rank != args->rank || mpi_world != args->world)
        return tr_fail(err,
                       "comm mpi: MPI says this process is rank %d of %d, but trainrun was told "
                       "rank %d of %d (from TRAINRUN_RANK/TRAINRUN_WORLD_SIZE, SLURM_PROCID/"
                       "SLURM_NTASKS or OMPI_COMM_WORLD_*): launch with mpirun and unset the "
                       "TRAINRUN_* ones, or make them agree",
                       mpi_rank, mpi_world, args->rank, args->world);

    struct mpi_comm *m = calloc(1, sizeof *m);
    if (!m)
        return tr_fail(err, "comm mpi: out of memory");
    m->rank = mpi_rank;
    m->world = mpi_world;
    m->timeout = cfg->timeout;
    m->comm = MPI_COMM_NULL;
    live_instances++;
    if (dup_communicator(m, err) != TR_OK) {
        m->broken = 1; /* the other ranks may be elsewhere: do not wait in MPI_Finalize */
        mpi_destroy(m);
        return TR_ERROR;
    }

    char library[128];
    describe_library(library, sizeof library);
    char timeout[64] = "no timeout";
    if (m->timeout > 0)
        snprintf(timeout, sizeof timeout, "timeout %.0f s", m->timeout);
    snprintf(m->description, sizeof m->description, "mpi (%s), rank %d of %d, %d on this node, %s",
             library, m->rank, m->world, m->local_world, timeout);
    *self = m;
    return TR_OK;
}

static void mpi_destroy(void *self)
{
    struct mpi_comm *m = self;
    if (!m)
        return;
    int broken = m->broken;
    if (m->comm != MPI_COMM_NULL && !broken)
        MPI_Comm_free(&m->comm);
    free(m);
    /* Finalising waits for every rank; after a timeout some never come, so
     * the process exits without it and mpirun ends the job. */
    if (--live_instances == 0 && initialized_here && !broken) {
        MPI_Finalize();
        initialized_here = 0;
    }
}

static const struct tr_comm_vtable mpi_vtable = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = mpi_allreduce_sum,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .describe = mpi_describe,
};

static const struct tr_plugin_info mpi_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_COMM,
    .name = "mpi",
    .version = "0.1.0",
    .description = "collectives among CPU ranks over MPI; launch with mpirun",
    .options = mpi_options,
    .config_size = sizeof(struct mpi_config),
    .create = mpi_create,
    .destroy = mpi_destroy,
    .vtable = &mpi_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &mpi_info; }

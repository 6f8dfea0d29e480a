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
 * killed and mpirun exits non-zero, naming the rank), so no rank hangs on a
 * dead peer.  The communicator also returns errors (MPI_ERRORS_RETURN)
 * instead of aborting inside the library, so a failure that MPI reports
 * reaches the core as an error message.  A rank that stops without dying
 * (SIGSTOP, a debugger, a hung driver, a loop outside the collectives)
 * would leave Open MPI's blocking collectives waiting forever, so with the
 * `timeout` option (300 s by default) collectives run nonblocking
 * (MPI_Iallreduce, ...) and are polled against a deadline.  When it passes,
 * the rank asks every other rank, point to point on a second communicator,
 * which collective it is in: ranks that are waiting in a collective answer
 * from their polling loop, and those that do not answer within a short
 * grace are named as the ones that did not arrive.  The call then fails;
 * the core stops, and mpirun ends the job when this rank exits without
 * MPI_Finalize.
 *
 * reduce_scatter is MPI_Reduce_scatter_block in place.  Under Open MPI
 * 4.1.4 its sums equal MPI_Allreduce's bit for bit on 2, 3 and 4 ranks when
 * both run nonblocking (the default, with a timeout: libnbc reduces both
 * along the same binomial tree), but not when timeout = 0 picks the
 * blocking ones, whose tuned algorithms add in another order on 3 ranks
 * and more (a few 1e-7 of the sum of magnitudes apart; tests/comm_check
 * prints what it finds).  MPI promises neither.
 *
 * sendrecv (point to point, for pipeline stages) is MPI_Isend and
 * MPI_Irecv on the collectives' communicator under a tag of its own
 * (collectives never match point-to-point messages, and the roll call has
 * its own communicator), waited for as the collectives are: against the
 * timeout, answering roll calls meanwhile.  Any peer is taken, this rank
 * included.  Its calls count among the call numbers the roll call reports,
 * which then differ between ranks by design (each stage makes its own).
 *
 * allreduce_group (a sum among some ranks, for pipeline replicas) is
 * MPI_Iallreduce, reduce_scatter_group and allgather_group are
 * MPI_Ireduce_scatter_block and MPI_Iallgather (in place), on a
 * communicator of the members, made the first time a
 * group is used (MPI_Comm_create_group: only the members take part) and
 * kept, by rank set, until the plugin is destroyed.  Making one blocks in
 * MPI with no timeout, so the members first meet point to point (each
 * tells the group's first rank it is here, and hears back once all are),
 * waited for like any call: a member that stopped is named by the roll
 * call instead of hanging the others.
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
    {TR_OPT_FLOAT, "timeout", "300", 0, 604800, NULL,
     "seconds a collective may take before it fails naming the ranks that did not arrive, so a "
     "stopped or hung (not dead) rank ends the job; 0 waits forever in MPI's blocking "
     "collectives (mpirun still ends the job when a rank dies)",
     offsetof(struct mpi_config, timeout)},
    {.type = TR_OPT_END},
};

struct mpi_comm {
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD, so instances never mix */
    MPI_Comm roll; /* another one, for the roll call after a timeout */
    int rank, world, local_world;
    double timeout;
    int broken; /* a collective timed out and is still pending: the comm is unusable */
    int calls;  /* collectives started so far: where a rank is, for the roll call */
    /* send buffers of the roll call, alive until the process ends once used */
    int *answers;       /* world: what this rank told each asking rank */
    int answered;       /* a roll call was answered: answers may still be in use */
    int asked;          /* the call this rank asked about */
    char verdict[512];  /* what its roll call found, sent to every rank */
    char description[256];
    struct group *groups; /* allreduce_group's communicators so far */
    int n_groups;
};

/* The roll call, on m->roll: a rank whose collective timed out sends
 * TAG_ASK (its call number) to every other rank; a rank polling in a
 * collective answers TAG_HERE with its own.  What the asking rank finds
 * goes to every rank as TAG_VERDICT, and a rank that receives one while it
 * waits gives up its collective at once with that message. */
#define TAG_ASK 1
#define TAG_HERE 2
#define TAG_VERDICT 3
/* sendrecv's messages, on m->comm (collectives use no tags) */
#define TAG_P2P 4
/* the members' meeting before a group's communicator is made, on m->comm */
#define TAG_GROUP 5
/* MPI_Comm_create_group's own messages on m->comm: a tag nothing else
 * sends with, so that a member already meeting for the next group cannot
 * match them */
#define TAG_GROUP_CREATE 6

/* A group's communicator, by its members. */
struct group {
    int n;
    int *ranks;
    MPI_Comm comm;
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

/* Answers the roll calls of ranks whose collective timed out: "I am in
 * collective number m->calls".  The send is left to complete on its own;
 * its buffer, answers[asker], outlives it. */
static void answer_roll_calls(struct mpi_comm *m)
{
    for (;;) {
        int waiting = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_ASK, m->roll, &waiting, &st) != MPI_SUCCESS || !waiting)
            return;
        int asked = 0;
        MPI_Recv(&asked, 1, MPI_INT, st.MPI_SOURCE, TAG_ASK, m->roll, MPI_STATUS_IGNORE);
        MPI_Request req;
        m->answers[st.MPI_SOURCE] = m->calls;
        m->answered = 1;
        if (MPI_Isend(&m->answers[st.MPI_SOURCE], 1, MPI_INT, st.MPI_SOURCE, TAG_HERE, m->roll,
                      &req) == MPI_SUCCESS)
            MPI_Request_free(&req);
    }
}

/* Another rank's roll call found who is missing: its verdict, or 0. */
static int verdict_from_another(struct mpi_comm *m, char *out, size_t cap, int *from)
{
    int flag = 0, len = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_VERDICT, m->roll, &flag, &st) != MPI_SUCCESS || !flag)
        return 0;
    MPI_Get_count(&st, MPI_CHAR, &len);
    if (len <= 0 || (size_t)len > cap) { /* not one of ours: take it off the queue, say so */
        char skip;
        MPI_Recv(&skip, 0, MPI_CHAR, st.MPI_SOURCE, TAG_VERDICT, m->roll, MPI_STATUS_IGNORE);
        snprintf(out, cap, "(a message this rank cannot read)");
    } else {
        MPI_Recv(out, len, MPI_CHAR, st.MPI_SOURCE, TAG_VERDICT, m->roll, MPI_STATUS_IGNORE);
        out[len - 1] = '\0';
    }
    *from = st.MPI_SOURCE;
    return 1;
}

static void list_ranks(char *out, size_t cap, size_t *used, const int *where, int world,
                       int absent)
{
    *used += (size_t)snprintf(out + *used, cap - *used, "rank%s", absent > 1 ? "s" : "");
    for (int r = 0, k = 0; r < world && *used < cap; r++)
        if (where[r] < 0) {
            k++;
            *used += (size_t)snprintf(out + *used, cap - *used, "%s %d",
                                      k == 1 ? "" : k == absent ? " and" : ",", r);
        }
}

/* After a timeout: asks every other rank where it is and waits `grace`
 * seconds for the answers; says in m->verdict which ranks did not answer
 * (or, when all did, where each is) and sends that to every rank. */
static void roll_call(struct mpi_comm *m, double grace)
{
    int *where = malloc(sizeof *where * (size_t)m->world);
    if (!where) {
        snprintf(m->verdict, sizeof m->verdict, "out of memory for the roll call");
        return;
    }
    m->asked = m->calls;
    int missing = m->world - 1;
    for (int r = 0; r < m->world; r++) {
        where[r] = -1;
        MPI_Request req;
        if (r != m->rank &&
            MPI_Isend(&m->asked, 1, MPI_INT, r, TAG_ASK, m->roll, &req) == MPI_SUCCESS)
            MPI_Request_free(&req);
    }
    where[m->rank] = m->asked;
    double until = now_seconds() + grace;
    while (missing > 0 && now_seconds() < until) {
        answer_roll_calls(m); /* ranks timing out beside this one ask too */
        /* A rank that timed out just before this one has finished its own
         * roll call and may already be gone: its verdict is the one to
         * give, not "it did not answer". */
        char heard[sizeof m->verdict];
        int from = -1;
        if (verdict_from_another(m, heard, sizeof heard, &from)) {
            snprintf(m->verdict, sizeof m->verdict, "rank %d's roll call found: %.460s", from,
                     heard);
            free(where);
            return;
        }
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_HERE, m->roll, &flag, &st) == MPI_SUCCESS && flag) {
            int at = -1;
            MPI_Recv(&at, 1, MPI_INT, st.MPI_SOURCE, TAG_HERE, m->roll, MPI_STATUS_IGNORE);
            if (where[st.MPI_SOURCE] < 0 && at >= 0)
                missing--;
            where[st.MPI_SOURCE] = at;
        }
    }
    char *out = m->verdict;
    size_t cap = sizeof m->verdict, used = 0;
    if (missing > 0) {
        list_ranks(out, cap, &used, where, m->world, missing);
        if (used < cap)
            snprintf(out + used, cap - used,
                     " did not arrive (no answer within %.1f s: stopped, hung, or busy outside "
                     "the collectives)",
                     grace);
    } else {
        used += (size_t)snprintf(out, cap, "every rank answered:");
        for (int r = 0; r < m->world && used < cap; r++)
            used += (size_t)snprintf(out + used, cap - used, " rank %d in #%d%s", r, where[r],
                                     r + 1 < m->world ? "," : "");
        if (used < cap)
            snprintf(out + used, cap - used, " (calls that do not match, or MPI itself stuck)");
    }
    /* The verdict to every rank, seen out of this process (up to a second)
     * before the caller fails: mpirun ends the job as soon as one rank
     * exits, and messages still queued here would die with it. */
    MPI_Request *sent = malloc(sizeof *sent * (size_t)m->world);
    int n = 0;
    for (int r = 0; r < m->world && sent; r++)
        if (r != m->rank && MPI_Isend(m->verdict, (int)strlen(m->verdict) + 1, MPI_CHAR, r,
                                      TAG_VERDICT, m->roll, &sent[n]) == MPI_SUCCESS)
            n++;
    for (double stop = now_seconds() + 1.0; n > 0 && now_seconds() < stop;) {
        int all = 0;
        answer_roll_calls(m);
        if (MPI_Testall(n, sent, &all, MPI_STATUSES_IGNORE) != MPI_SUCCESS || all)
            break;
    }
    /* Ranks whose roll calls started beside this one's ask this rank too
     * before they see its verdict: answer them for one more grace, or they
     * would name this rank, gone by then, as one that did not arrive. */
    for (double stop = now_seconds() + grace; now_seconds() < stop;) {
        answer_roll_calls(m);
        nanosleep(&(struct timespec){0, 1000000}, NULL); /* leave the cores to those still polling */
    }
    for (int i = 0; i < n; i++)
        if (sent[i] != MPI_REQUEST_NULL)
            MPI_Request_free(&sent[i]);
    free(sent);
    free(where);
}

/* Waits for n nonblocking requests (a collective, or sendrecv's sends and
 * receives, statuses filled when not MPI_STATUSES_IGNORE) until the
 * instance's timeout, or until another rank's roll call says the job is
 * lost. */
static int wait_requests(struct mpi_comm *m, int n, MPI_Request *req, MPI_Status *statuses,
                         const char *what, tr_err *err)
{
    double start = now_seconds(), deadline = start + m->timeout, looked = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, req, &done, statuses);
        if (rc != MPI_SUCCESS)
            return mpi_error(err, what, rc);
        if (done)
            return TR_OK;
        /* MPI makes progress inside MPI_Test; look at the roll calls every
         * few milliseconds of the clock, not every so many tests: one test
         * can reduce a whole segment, and on a loaded machine a thousand of
         * them outlast the roll call's grace */
        double t = now_seconds();
        if (t - looked < 0.005)
            continue;
        looked = t;
        answer_roll_calls(m);
        char heard[sizeof m->verdict];
        int from = -1;
        if (verdict_from_another(m, heard, sizeof heard, &from)) {
            m->broken = 1;
            return tr_fail(err,
                           "comm mpi: rank %d: %s (call #%d) abandoned after %.1f s: rank "
                           "%d timed out (timeout option) and reports: %s",
                           m->rank, what, m->calls, now_seconds() - start, from, heard);
        }
        if (now_seconds() > deadline) {
            m->broken = 1;
            /* long enough for a rank that waits in a collective to answer */
            double grace = m->timeout / 10 < 0.5 ? 0.5 : m->timeout / 10 > 5 ? 5 : m->timeout / 10;
            roll_call(m, grace);
            return tr_fail(err,
                           "comm mpi: rank %d: %s (call #%d) did not complete within %.0f "
                           "s (timeout option): %s",
                           m->rank, what, m->calls, m->timeout, m->verdict);
        }
    }
}

static int wait_request(struct mpi_comm *m, MPI_Request *req, const char *what, tr_err *err)
{
    return wait_requests(m, 1, req, MPI_STATUSES_IGNORE, what, err);
}

/* Every collective starts here: it counts the call (every rank makes the
 * same calls in the same order, so the numbers agree across ranks). */
static int usable(struct mpi_comm *m, tr_err *err)
{
    if (m->broken)
        return tr_fail(err, "comm mpi: the communicator is unusable after an earlier timeout");
    m->calls++;
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

/* In place: MPI_Reduce_scatter_block with MPI_IN_PLACE leaves rank r's
 * sums at the start of buf; they move to buf + r*count afterwards. */
static int mpi_reduce_scatter(void *self, float *buf, size_t count, tr_err *err)
{
    struct mpi_comm *m = self;
    if (usable(m, err) != TR_OK)
        return TR_ERROR;
    if (m->world == 1 || count == 0)
        return TR_OK;
    /* Open MPI computes world*count in an int */
    if (count > (size_t)INT_MAX / (size_t)m->world)
        return tr_fail(err,
                       "comm mpi: reduce_scatter of %zu floats per rank on %d ranks exceeds "
                       "MPI's %d floats a call; reduce-scatter in smaller pieces",
                       count, m->world, INT_MAX);
    int rc;
    if (m->timeout > 0) {
        MPI_Request req;
        rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM,
                                       m->comm, &req);
        if (rc == MPI_SUCCESS && wait_request(m, &req, "reduce_scatter", err) != TR_OK)
            return TR_ERROR;
    } else {
        rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, m->comm);
    }
    if (rc != MPI_SUCCESS)
        return mpi_error(err, "reduce_scatter", rc);
    if (m->rank > 0)
        memmove(buf + (size_t)m->rank * count, buf, count * sizeof(float));
    return TR_OK;
}

/* Pending requests of a sendrecv that failed: cancelled and freed, so that
 * nothing lands in the caller's buffers after it has returned. */
static void drop_requests(int n, MPI_Request *req)
{
    for (int i = 0; i < n; i++)
        if (req[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&req[i]);
            MPI_Request_free(&req[i]);
        }
}

/* The bytes of the piece at `at` of a message of `bytes` */
static size_t piece(size_t bytes, size_t at)
{
    return bytes - at < MPI_CHUNK ? bytes - at : MPI_CHUNK;
}

static int mpi_sendrecv(void *self, const void *send_buf, size_t send_bytes, int to,
                        void *recv_buf, size_t recv_bytes, int from, tr_err *err)
{
    struct mpi_comm *m = self;
    if (to < -1 || to >= m->world || from < -1 || from >= m->world)
        return tr_fail(err, "comm mpi: sendrecv on rank %d to rank %d and from rank %d, but there "
                       "are %d ranks (-1: none)", m->rank, to, from, m->world);
    if (usable(m, err) != TR_OK)
        return TR_ERROR;
    if (to < 0)
        send_bytes = 0;
    if (from < 0)
        recv_bytes = 0;
    /* messages over MPI's int counts go in pieces of MPI_CHUNK bytes, in
     * order (MPI keeps messages of one tag between two ranks in order) */
    int n_send = (int)((send_bytes + MPI_CHUNK - 1) / MPI_CHUNK);
    int n_recv = (int)((recv_bytes + MPI_CHUNK - 1) / MPI_CHUNK);
    int n = n_send + n_recv;
    if (n == 0)
        return TR_OK;
    MPI_Request *req = malloc(sizeof *req * (size_t)n);
    MPI_Status *st = malloc(sizeof *st * (size_t)n);
    if (!req || !st) {
        free(req);
        free(st);
        return tr_fail(err, "comm mpi: out of memory for sendrecv");
    }
    char what[128];
    snprintf(what, sizeof what, "sendrecv (%zu bytes to rank %d, %zu from rank %d)", send_bytes,
             to, recv_bytes, from);
    int rc = MPI_SUCCESS, posted = 0;
    /* receives first: a message from `from` finds its buffer waiting */
    for (int i = 0; i < n_recv && rc == MPI_SUCCESS; i++, posted++) {
        size_t at = (size_t)i * MPI_CHUNK, len = piece(recv_bytes, at);
        rc = MPI_Irecv((char *)recv_buf + at, (int)len, MPI_BYTE, from, TAG_P2P, m->comm,
                       &req[posted]);
    }
    for (int i = 0; i < n_send && rc == MPI_SUCCESS; i++, posted++) {
        size_t at = (size_t)i * MPI_CHUNK, len = piece(send_bytes, at);
        rc = MPI_Isend((const char *)send_buf + at, (int)len, MPI_BYTE, to, TAG_P2P, m->comm,
                       &req[posted]);
    }
    if (rc != MPI_SUCCESS) {
        drop_requests(posted - 1, req);
        free(req);
        free(st);
        return mpi_error(err, what, rc);
    }
    if (m->timeout > 0) {
        if (wait_requests(m, n, req, st, what, err) != TR_OK) {
            drop_requests(n, req);
            free(req);
            free(st);
            return TR_ERROR;
        }
    } else if ((rc = MPI_Waitall(n, req, st)) != MPI_SUCCESS) {
        free(req);
        free(st);
        return mpi_error(err, what, rc);
    }
    /* a shorter message than expected completes the receive too: say so
     * (a longer one fails it above, MPI_ERR_TRUNCATE) */
    for (int i = 0; i < n_recv; i++) {
        size_t at = (size_t)i * MPI_CHUNK, len = piece(recv_bytes, at);
        int got = 0;
        MPI_Get_count(&st[i], MPI_BYTE, &got);
        if ((size_t)got != len) {
            free(req);
            free(st);
            return tr_fail(err, "comm mpi: rank %d expected %zu bytes from rank %d, which sent "
                           "%zu: the two disagree on the message's size",
                           m->rank, recv_bytes, from, at + (size_t)got);
        }
    }
    free(req);
    free(st);
    return TR_OK;
}

/* The members meet: each tells the first member it is here, which answers
 * every one once all have.  Waited for against the timeout (a stopped
 * member is named by the roll call), so that MPI_Comm_create_group, which
 * has none, starts only when every member is in this call. */
static int group_meet(struct mpi_comm *m, const int *ranks, int n, tr_err *err)
{
    MPI_Request *req = malloc(sizeof *req * (size_t)n);
    int *token = calloc((size_t)n, sizeof *token);
    if (!req || !token) {
        free(req);
        free(token);
        return tr_fail(err, "comm mpi: out of memory for a group");
    }
    int k = 0, rc = MPI_SUCCESS;
    if (m->rank == ranks[0]) {
        for (int i = 1; i < n && rc == MPI_SUCCESS; i++)
            rc = MPI_Irecv(&token[i], 1, MPI_INT, ranks[i], TAG_GROUP, m->comm, &req[k++]);
    } else {
        rc = MPI_Irecv(&token[0], 1, MPI_INT, ranks[0], TAG_GROUP, m->comm, &req[k++]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(&m->rank, 1, MPI_INT, ranks[0], TAG_GROUP, m->comm, &req[k++]);
    }
    char what[64];
    snprintf(what, sizeof what, "allreduce_group (meeting %d ranks from rank %d)", n, ranks[0]);
    if (rc != MPI_SUCCESS) {
        drop_requests(k - 1, req);
        free(req);
        free(token);
        return mpi_error(err, what, rc);
    }
    int ok = m->timeout > 0 ? wait_requests(m, k, req, MPI_STATUSES_IGNORE, what, err) == TR_OK
                            : MPI_Waitall(k, req, MPI_STATUSES_IGNORE) == MPI_SUCCESS;
    if (ok && m->rank == ranks[0]) { /* all here: let them go */
        k = 0;
        for (int i = 1; i < n && rc == MPI_SUCCESS; i++)
            rc = MPI_Isend(&m->rank, 1, MPI_INT, ranks[i], TAG_GROUP, m->comm, &req[k++]);
        ok = rc == MPI_SUCCESS &&
             (m->timeout > 0 ? wait_requests(m, k, req, MPI_STATUSES_IGNORE, what, err) == TR_OK
                             : MPI_Waitall(k, req, MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    }
    if (!ok && m->timeout > 0)
        drop_requests(k, req);
    free(req);
    free(token);
    if (rc != MPI_SUCCESS)
        return mpi_error(err, what, rc);
    if (!ok && m->timeout <= 0) /* wait_requests said why itself */
        return tr_fail(err, "comm mpi: rank %d: %s failed (mpirun names the rank that died, if "
                       "one did)", m->rank, what);
    return ok ? TR_OK : TR_ERROR;
}

/* The communicator of the members `ranks`: made once, then cached. */
static int group_comm(struct mpi_comm *m, const int *ranks, int n, MPI_Comm *out, tr_err *err)
{
    for (int g = 0; g < m->n_groups; g++)
        if (m->groups[g].n == n && memcmp(m->groups[g].ranks, ranks, sizeof *ranks * (size_t)n) == 0) {
            *out = m->groups[g].comm;
            return TR_OK;
        }
    struct group *more = realloc(m->groups, sizeof *more * (size_t)(m->n_groups + 1));
    int *copy = malloc(sizeof *copy * (size_t)n);
    if (more)
        m->groups = more;
    if (!more || !copy) {
        free(copy);
        return tr_fail(err, "comm mpi: out of memory for a group");
    }
    memcpy(copy, ranks, sizeof *copy * (size_t)n);
    if (group_meet(m, ranks, n, err) != TR_OK) {
        free(copy);
        return TR_ERROR;
    }
    MPI_Group world_group = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
    MPI_Comm comm = MPI_COMM_NULL;
    int rc = MPI_Comm_group(m->comm, &world_group);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_incl(world_group, n, ranks, &members);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_group(m->comm, members, TAG_GROUP_CREATE, &comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (members != MPI_GROUP_NULL)
        MPI_Group_free(&members);
    if (world_group != MPI_GROUP_NULL)
        MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS) {
        free(copy);
        return mpi_error(err, "making a group's communicator", rc);
    }
    m->groups[m->n_groups++] = (struct group){n, copy, comm};
    *out = comm;
    return TR_OK;
}

/* The group's communicator for a call of `what` on rank m->rank, which
 * must be among the members: *comm, or MPI_COMM_NULL where the group is
 * the world (the world's own collectives then) or one rank. */
static int group_for(struct mpi_comm *m, const int *ranks, int n, const char *what,
                     MPI_Comm *comm, tr_err *err)
{
    int me = -1;
    *comm = MPI_COMM_NULL;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= m->world || (i && ranks[i] <= ranks[i - 1]))
            return tr_fail(err, "comm mpi: %s on rank %d: the ranks must ascend from 0 to %d "
                           "without repeats (rank %d at position %d)",
                           what, m->rank, m->world - 1, ranks[i], i);
        if (ranks[i] == m->rank)
            me = i;
    }
    if (me < 0)
        return tr_fail(err, "comm mpi: %s called on rank %d, which is not among its %d ranks: "
                       "only the members call it", what, m->rank, n);
    if (usable(m, err) != TR_OK)
        return TR_ERROR;
    if (n == m->world || n == 1)
        return TR_OK;
    if (group_comm(m, ranks, n, comm, err) != TR_OK) {
        m->broken = 1;
        return TR_ERROR;
    }
    return TR_OK;
}

static int mpi_allreduce_group(void *self, float *buf, size_t count, const int *ranks, int n,
                               tr_err *err)
{
    struct mpi_comm *m = self;
    MPI_Comm comm;
    if (group_for(m, ranks, n, "allreduce_group", &comm, err) != TR_OK)
        return TR_ERROR;
    if (n == m->world) /* the world's communicator (its sums) */
        return mpi_allreduce_sum(self, buf, count, err);
    if (comm == MPI_COMM_NULL || count == 0)
        return TR_OK;
    for (size_t done = 0; done < count; done += MPI_CHUNK) {
        int k = (int)(count - done < MPI_CHUNK ? count - done : MPI_CHUNK);
        int rc;
        if (m->timeout > 0) {
            MPI_Request req;
            rc = MPI_Iallreduce(MPI_IN_PLACE, buf + done, k, MPI_FLOAT, MPI_SUM, comm, &req);
            if (rc == MPI_SUCCESS && wait_request(m, &req, "allreduce_group", err) != TR_OK)
                return TR_ERROR;
        } else {
            rc = MPI_Allreduce(MPI_IN_PLACE, buf + done, k, MPI_FLOAT, MPI_SUM, comm);
        }
        if (rc != MPI_SUCCESS)
            return mpi_error(err, "allreduce_group", rc);
    }
    return TR_OK;
}

/* Member i's sums land at the start of buf (MPI_IN_PLACE), then move to
 * buf + i*count, as the world's reduce_scatter does. */
static int mpi_reduce_scatter_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                    tr_err *err)
{
    struct mpi_comm *m = self;
    MPI_Comm comm;
    if (group_for(m, ranks, n, "reduce_scatter_group", &comm, err) != TR_OK)
        return TR_ERROR;
    if (n == m->world)
        return mpi_reduce_scatter(self, buf, count, err);
    if (comm == MPI_COMM_NULL || count == 0)
        return TR_OK;
    if (count > (size_t)INT_MAX / (size_t)n)
        return tr_fail(err, "comm mpi: reduce_scatter_group of %zu floats per rank on %d ranks "
                       "exceeds MPI's %d floats a call; reduce-scatter in smaller pieces",
                       count, n, INT_MAX);
    int rc, me = 0;
    while (ranks[me] != m->rank)
        me++;
    if (m->timeout > 0) {
        MPI_Request req;
        rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, comm,
                                       &req);
        if (rc == MPI_SUCCESS && wait_request(m, &req, "reduce_scatter_group", err) != TR_OK)
            return TR_ERROR;
    } else {
        rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, comm);
    }
    if (rc != MPI_SUCCESS)
        return mpi_error(err, "reduce_scatter_group", rc);
    if (me > 0)
        memmove(buf + (size_t)me * count, buf, count * sizeof(float));
    return TR_OK;
}

static int mpi_allgather_group(void *self, float *buf, size_t count, const int *ranks, int n,
                               tr_err *err)
{
    struct mpi_comm *m = self;
    MPI_Comm comm;
    if (group_for(m, ranks, n, "allgather_group", &comm, err) != TR_OK)
        return TR_ERROR;
    if (n == m->world)
        return mpi_allgather(self, buf, count, err);
    if (comm == MPI_COMM_NULL || count == 0)
        return TR_OK;
    if (count > INT_MAX)
        return tr_fail(err, "comm mpi: allgather_group of %zu floats per rank exceeds MPI's %d; "
                       "gather in smaller pieces", count, INT_MAX);
    int rc;
    if (m->timeout > 0) {
        MPI_Request req;
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)count, MPI_FLOAT, comm,
                            &req);
        if (rc == MPI_SUCCESS && wait_request(m, &req, "allgather_group", err) != TR_OK)
            return TR_ERROR;
    } else {
        rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)count, MPI_FLOAT, comm);
    }
    return rc == MPI_SUCCESS ? TR_OK : mpi_error(err, "allgather_group", rc);
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
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(m->comm, &m->roll);
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
    m->comm = m->roll = MPI_COMM_NULL;
    live_instances++;
    m->answers = calloc((size_t)mpi_world, sizeof *m->answers);
    if (!m->answers) {
        m->broken = 1;
        mpi_destroy(m);
        return tr_fail(err, "comm mpi: out of memory");
    }
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
    for (int g = 0; g < m->n_groups; g++) {
        if (!broken)
            MPI_Comm_free(&m->groups[g].comm);
        free(m->groups[g].ranks);
    }
    free(m->groups);
    if (m->roll != MPI_COMM_NULL && !broken)
        MPI_Comm_free(&m->roll);
    if (m->comm != MPI_COMM_NULL && !broken)
        MPI_Comm_free(&m->comm);
    if (!broken && !m->answered) /* else answers may still be on their way out of it */
        free(m->answers);
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
    .reduce_scatter = mpi_reduce_scatter,
    .sendrecv = mpi_sendrecv,
    .allreduce_group = mpi_allreduce_group,
    .reduce_scatter_group = mpi_reduce_scatter_group,
    .allgather_group = mpi_allgather_group,
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

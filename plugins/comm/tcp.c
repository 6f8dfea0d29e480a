/*
 * comm = "tcp": collectives over plain TCP sockets, for CPU ranks on one
 * machine or a few (no MPI needed).
 *
 * Rendezvous: rank 0 listens on `master` (host:port, default
 * $TRAINRUN_MASTER); every other rank connects there, says who it is and
 * where its own ring listener is, and gets the table of all ranks back.
 * Then each rank connects to the next rank of the ring and accepts the
 * previous one, and the rendezvous sockets are closed.
 *
 * All-reduce is the bandwidth-optimal ring (reduce-scatter, then
 * all-gather): each chunk is summed on exactly one rank and then copied to
 * the others, so every rank ends with bit-identical sums — ranks whose
 * parameters must stay equal rely on that.  Sends and receives of a ring
 * step run together under poll(), so no pair of ranks waits on each other.
 *
 * A rank that dies closes its sockets: its neighbours' calls fail at once
 * (end of stream, or EPIPE), naming the rank, and their exit closes theirs,
 * so the whole job ends instead of hanging.  A rank that stops answering
 * without dying is caught by `timeout`.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* getaddrinfo flags, usleep */

#include <trainrun/plugin.h>

#include "rendezvous.h" /* host:port parsing and blocking I/O with a deadline */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct tcp_config {
    const char *master;
    double timeout;
};

static const struct tr_option tcp_options[] = {
    {TR_OPT_STRING, "master", "", 0, 0, NULL,
     "host:port where rank 0 listens for the others; empty: $TRAINRUN_MASTER (set by "
     "trainrun's launcher and the contrib/launch scripts)",
     offsetof(struct tcp_config, master)},
    {TR_OPT_FLOAT, "timeout", "300", 1, 86400, NULL,
     "seconds to wait for the other ranks (at start-up, and for any one transfer) before "
     "failing the run",
     offsetof(struct tcp_config, timeout)},
    {.type = TR_OPT_END},
};

#define HELLO_MAGIC 0x74727463u /* "trtc" */

struct peer_addr {
    char host[64];
    uint16_t port;
};

struct tcp {
    const struct tr_host *host;
    int rank, world;
    int next_fd, prev_fd; /* ring: we send to next, receive from prev */
    double timeout;
    float *scratch;       /* one chunk received from prev */
    size_t scratch_floats;
    char describe[160];
};

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Listen on port (0: any free one) of every local address. */
static int listen_on(const char *port, uint16_t *bound, tr_err *err)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai;
    int rc = getaddrinfo(NULL, port, &hints, &ai);
    if (rc != 0)
        return tr_fail(err, "comm tcp: cannot listen on port %s: %s", port, gai_strerror(rc));
    int fd = socket(ai->ai_family, ai->ai_socktype, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 256) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return tr_fail(err, "comm tcp: cannot listen on port %s: %s%s", port, strerror(e),
                       e == EADDRINUSE ? " (another job uses it: pick another master port)" : "");
    }
    freeaddrinfo(ai);
    struct sockaddr_in sin;
    socklen_t len = sizeof sin;
    getsockname(fd, (struct sockaddr *)&sin, &len);
    *bound = ntohs(sin.sin_port);
    return fd;
}

/* Connect, retrying while the other side is not listening yet. */
static int connect_to(const char *host, const char *port, double deadline, const char *what,
                      tr_err *err)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    for (;;) {
        struct addrinfo *ai;
        int rc = getaddrinfo(host, port, &hints, &ai);
        if (rc == 0) {
            int fd = socket(ai->ai_family, ai->ai_socktype, 0);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                freeaddrinfo(ai);
                tune(fd);
                return fd;
            }
            if (fd >= 0)
                close(fd);
            freeaddrinfo(ai);
        }
        if (rdv_now() > deadline)
            return tr_fail(err, "comm tcp: cannot reach %s at %s:%s (%s); is it running, and "
                           "is the address right?", what, host, port,
                           rc ? gai_strerror(rc) : strerror(errno));
        usleep(50 * 1000);
    }
}

static int accept_one(int listen_fd, double deadline, const char *what, tr_err *err)
{
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    int ms = (int)((deadline - rdv_now()) * 1000);
    int rc = poll(&p, 1, ms > 0 ? ms : 0);
    if (rc <= 0)
        return tr_fail(err, "comm tcp: %s did not connect within the timeout", what);
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0)
        return tr_fail(err, "comm tcp: accept: %s", strerror(errno));
    tune(fd);
    return fd;
}

/* One ring step: send `sbytes` to next while receiving `rbytes` from prev. */
static int exchange(struct tcp *t, const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes,
                    tr_err *err)
{
    const char *s = sbuf;
    char *r = rbuf;
    int next = (t->rank + 1) % t->world, prev = (t->rank + t->world - 1) % t->world;
    double deadline = rdv_now() + t->timeout;
    while (sbytes > 0 || rbytes > 0) {
        struct pollfd p[2] = {{.fd = sbytes ? t->next_fd : -1, .events = POLLOUT},
                              {.fd = rbytes ? t->prev_fd : -1, .events = POLLIN}};
        int ms = (int)((deadline - rdv_now()) * 1000);
        int rc = ms > 0 ? poll(p, 2, ms) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return tr_fail(err, "comm tcp: rank %d: no progress with rank %d for %.0f s (comm.timeout); "
                           "it may be stuck", t->rank, rbytes ? prev : next, t->timeout);
        if (sbytes && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = send(t->next_fd, s, sbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return tr_fail(err, "comm tcp: rank %d lost rank %d (%s): it has stopped or died",
                               t->rank, next, strerror(errno));
            if (k > 0) {
                s += k;
                sbytes -= (size_t)k;
            }
        }
        if (rbytes && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t k = recv(t->prev_fd, r, rbytes, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                return tr_fail(err, "comm tcp: rank %d lost rank %d (%s): it has stopped or died",
                               t->rank, prev, k == 0 ? "connection closed" : strerror(errno));
            if (k > 0) {
                r += k;
                rbytes -= (size_t)k;
            }
        }
    }
    return TR_OK;
}

static int ensure_scratch(struct tcp *t, size_t floats, tr_err *err)
{
    if (floats <= t->scratch_floats)
        return TR_OK;
    t->host->free(t->scratch);
    t->scratch = t->host->alloc(floats * sizeof(float));
    t->scratch_floats = t->scratch ? floats : 0;
    if (!t->scratch)
        return tr_fail(err, "comm tcp: out of memory for a %zu-float receive buffer", floats);
    return TR_OK;
}

static size_t chunk_start(size_t count, int world, int i)
{
    return count * (size_t)i / (size_t)world;
}

static int tcp_allreduce_sum(void *self, float *buf, size_t count, tr_err *err)
{
    struct tcp *t = self;
    int W = t->world, r = t->rank;
    if (W == 1 || count == 0)
        return TR_OK;
    if (ensure_scratch(t, count / (size_t)W + 1, err) != TR_OK)
        return TR_ERROR;
    /* reduce-scatter: after W-1 steps rank r holds the sum of chunk r+1 */
    for (int s = 0; s < W - 1; s++) {
        int sc = ((r - s) % W + W) % W, rc = ((r - s - 1) % W + W) % W;
        size_t s0 = chunk_start(count, W, sc), s1 = chunk_start(count, W, sc + 1);
        size_t r0 = chunk_start(count, W, rc), r1 = chunk_start(count, W, rc + 1);
        if (exchange(t, buf + s0, (s1 - s0) * sizeof(float), t->scratch, (r1 - r0) * sizeof(float),
                     err) != TR_OK)
            return TR_ERROR;
        for (size_t i = 0; i < r1 - r0; i++)
            buf[r0 + i] += t->scratch[i];
    }
    /* all-gather: pass the finished chunks around */
    for (int s = 0; s < W - 1; s++) {
        int sc = ((r + 1 - s) % W + W) % W, rc = ((r - s) % W + W) % W;
        size_t s0 = chunk_start(count, W, sc), s1 = chunk_start(count, W, sc + 1);
        size_t r0 = chunk_start(count, W, rc), r1 = chunk_start(count, W, rc + 1);
        if (exchange(t, buf + s0, (s1 - s0) * sizeof(float), buf + r0, (r1 - r0) * sizeof(float),
                     err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

static int tcp_allgather(void *self, float *buf, size_t count, tr_err *err)
{
    struct tcp *t = self;
    int W = t->world, r = t->rank;
    for (int s = 0; s < W - 1; s++) {
        int sc = ((r - s) % W + W) % W, rc = ((r - s - 1) % W + W) % W;
        if (exchange(t, buf + (size_t)sc * count, count * sizeof(float), buf + (size_t)rc * count,
                     count * sizeof(float), err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

static int tcp_broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    struct tcp *t = self;
    if (t->world == 1 || bytes == 0)
        return TR_OK;
    int next = (t->rank + 1) % t->world;
    if (t->rank != root && exchange(t, NULL, 0, buf, bytes, err) != TR_OK)
        return TR_ERROR;
    if (next != root && exchange(t, buf, bytes, NULL, 0, err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

static const char *tcp_describe(void *self)
{
    return ((struct tcp *)self)->describe;
}

struct hello {
    uint32_t magic, rank, world, port;
};

static void tcp_destroy(void *self)
{
    struct tcp *t = self;
    if (!t)
        return;
    if (t->next_fd >= 0)
        close(t->next_fd);
    if (t->prev_fd >= 0)
        close(t->prev_fd);
    t->host->free(t->scratch);
    t->host->free(t);
}

/* Rank 0: collect every rank's ring address, then send the table to all. */
static int rendezvous_root(struct tcp *t, const char *port, struct peer_addr *table,
                           double deadline, tr_err *err)
{
    uint16_t bound;
    int lfd = listen_on(port, &bound, err);
    if (lfd < 0)
        return TR_ERROR;
    int fds[1024];
    int n = 0, rc = TR_OK;
    for (int i = 1; i < t->world && rc == TR_OK; i++) {
        int fd = accept_one(lfd, deadline, "a rank", err);
        if (fd < 0) {
            tr_fail(err, "comm tcp: only %d of %d ranks reached rank 0 on port %s within %.0f s "
                    "(comm.timeout)", i, t->world, port, t->timeout);
            rc = TR_ERROR;
            break;
        }
        fds[n++] = fd;
        struct hello h;
        struct sockaddr_in sin;
        socklen_t len = sizeof sin;
        if (rdv_io(fd, &h, sizeof h, 0, deadline) != 0 || h.magic != HELLO_MAGIC) {
            rc = tr_fail(err, "comm tcp: something that is not a trainrun rank connected to port %s",
                         port);
        } else if ((int)h.world != t->world || h.rank == 0 || (int)h.rank >= t->world ||
                   table[h.rank].port) {
            rc = tr_fail(err, "comm tcp: a rank announced itself as rank %u of %u, but this job "
                         "has %d ranks (or that rank is taken): check TRAINRUN_RANK/WORLD_SIZE",
                         h.rank, h.world, t->world);
        } else {
            getpeername(fd, (struct sockaddr *)&sin, &len);
            inet_ntop(AF_INET, &sin.sin_addr, table[h.rank].host, sizeof table[h.rank].host);
            table[h.rank].port = (uint16_t)h.port;
        }
    }
    for (int i = 0; i < n; i++) {
        if (rc == TR_OK && rdv_io(fds[i], table, sizeof *table * (size_t)t->world, 1, deadline) != 0)
            rc = tr_fail(err, "comm tcp: a rank went away during start-up");
        close(fds[i]);
    }
    close(lfd);
    return rc;
}

static int tcp_create(const struct tr_host *host, const void *config,
                      const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct tcp_config *c = config;
    if (args->world > 1024)
        return tr_fail(err, "comm tcp: at most 1024 ranks (this job has %d); use mpi or nccl",
                       args->world);
    const char *master = *c->master ? c->master : getenv("TRAINRUN_MASTER");
    if (args->world > 1 && (!master || !*master))
        return tr_fail(err, "comm tcp: no rendezvous address: set comm.master or TRAINRUN_MASTER "
                       "to host:port of rank 0 (trainrun's own launcher, procs=N, sets it)");
    char mhost[256] = "", mport[32] = "";
    if (args->world > 1 && rdv_split_master(master, mhost, sizeof mhost, mport, sizeof mport) != 0)
        return tr_fail(err, "comm tcp: master \"%s\" is not host:port", master);

    struct tcp *t = host->alloc(sizeof *t);
    if (!t)
        return tr_fail(err, "comm tcp: out of memory");
    memset(t, 0, sizeof *t);
    t->host = host;
    t->rank = args->rank;
    t->world = args->world;
    t->timeout = c->timeout;
    t->next_fd = t->prev_fd = -1;
    snprintf(t->describe, sizeof t->describe, "tcp ring, %d ranks via %s", t->world,
             t->world > 1 ? master : "(none)");
    *self = t;
    if (t->world == 1)
        return TR_OK;

    double deadline = rdv_now() + c->timeout;
    struct peer_addr *table = host->alloc(sizeof *table * (size_t)t->world);
    if (!table)
        return tr_fail(err, "comm tcp: out of memory");
    memset(table, 0, sizeof *table * (size_t)t->world);
    uint16_t ring_port;
    int ring_fd = listen_on("0", &ring_port, err);
    int rc = ring_fd < 0 ? TR_ERROR : TR_OK;
    if (rc == TR_OK && t->rank == 0) {
        snprintf(table[0].host, sizeof table[0].host, "%s", mhost);
        table[0].port = ring_port;
        rc = rendezvous_root(t, mport, table, deadline, err);
    } else if (rc == TR_OK) {
        int fd = connect_to(mhost, mport, deadline, "rank 0", err);
        struct hello h = {HELLO_MAGIC, (uint32_t)t->rank, (uint32_t)t->world, ring_port};
        if (fd < 0)
            rc = TR_ERROR;
        else if (rdv_io(fd, &h, sizeof h, 1, deadline) != 0 ||
                 rdv_io(fd, table, sizeof *table * (size_t)t->world, 0, deadline) != 0)
            rc = tr_fail(err, "comm tcp: rank 0 at %s closed the connection during start-up "
                         "(see its log)", master);
        if (fd >= 0)
            close(fd);
    }
    if (rc == TR_OK) { /* the ring: connect forward, accept from behind */
        int next = (t->rank + 1) % t->world;
        char port[16];
        snprintf(port, sizeof port, "%u", table[next].port);
        char what[32];
        snprintf(what, sizeof what, "rank %d", next);
        t->next_fd = connect_to(table[next].host, port, deadline, what, err);
        uint32_t me = (uint32_t)t->rank, them = 0;
        if (t->next_fd < 0 || rdv_io(t->next_fd, &me, sizeof me, 1, deadline) != 0)
            rc = TR_ERROR;
        if (rc == TR_OK) {
            snprintf(what, sizeof what, "rank %d", (t->rank + t->world - 1) % t->world);
            t->prev_fd = accept_one(ring_fd, deadline, what, err);
            if (t->prev_fd < 0 || rdv_io(t->prev_fd, &them, sizeof them, 0, deadline) != 0 ||
                (int)them != (t->rank + t->world - 1) % t->world)
                rc = t->prev_fd < 0 ? TR_ERROR
                                    : tr_fail(err, "comm tcp: the ring is miswired (rank %u "
                                              "connected to rank %d)", them, t->rank);
        }
    }
    if (ring_fd >= 0)
        close(ring_fd);
    host->free(table);
    return rc;
}

static const struct tr_comm_vtable tcp_vtable = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = tcp_allreduce_sum,
    .broadcast = tcp_broadcast,
    .allgather = tcp_allgather,
    .describe = tcp_describe,
};

static const struct tr_plugin_info tcp_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_COMM,
    .name = "tcp",
    .version = "0.1.0",
    .description = "collectives over TCP sockets (ring all-reduce); CPU ranks, no MPI needed",
    .options = tcp_options,
    .config_size = sizeof(struct tcp_config),
    .create = tcp_create,
    .destroy = tcp_destroy,
    .vtable = &tcp_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &tcp_info;
}

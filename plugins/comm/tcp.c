/*
 * comm = "tcp": collectives over plain TCP sockets, for CPU ranks on one
 * machine or a few (no MPI needed).
 *
 * Rendezvous: rank 0 listens on `master` (host:port, default
 * $TRAINRUN_MASTER); every other rank connects there, says who it is and
 * where its own ring listener is, and gets the table of all ranks back.
 * Then each rank connects to the next rank of the ring three times (data,
 * control beside it, and point to point) and accepts the previous one's
 * three, and the rendezvous sockets are closed.
 *
 * All-reduce is the bandwidth-optimal ring (reduce-scatter, then
 * all-gather): each segment is summed on exactly one rank and then copied
 * to the others, so every rank ends with bit-identical sums — ranks whose
 * parameters must stay equal rely on that.  reduce_scatter is the first
 * phase alone, with the segments ordered so that rank r ends with segment
 * r: its sums are the very bits allreduce_sum leaves in that segment of the
 * same world*count floats.  Sends and receives of a ring step run together
 * under poll(), received floats are added as they stream in (through a
 * 256 KiB scratch buffer, whatever the size), so no pair of ranks waits on
 * each other.
 *
 * A rank that dies closes its sockets: its neighbours' calls fail at once
 * (end of stream, or EPIPE), naming the rank.  A rank that stops answering
 * without dying is caught by `timeout`: the rank that waited that long
 * calls the roll around the ring on control connections beside the data
 * ones and names the ranks that do not answer.  Either way the rank that
 * gives up tells its neighbours why, they pass it on, and every rank fails
 * with the same message naming the rank at fault, instead of each blaming
 * the neighbour that went quiet because of it.
 *
 * sendrecv (point to point, for pipeline stages) has connections of its
 * own, one with each ring neighbour, used both ways: a message from rank r
 * to r+1 rides the connection r opened to its next rank, one from r to r-1
 * the connection r accepted from its previous one (with 2 ranks, where
 * next and previous are the same rank, each rank sends on the connection
 * it opened and receives on the one it accepted).  So point-to-point bytes
 * never mix with the collectives' on the data connections, whatever the
 * order of the calls.  Each message is preceded by its size, checked
 * against what the receiver expects.  Sending and receiving run together
 * under poll(); a dead or stopped peer fails the call as above.  Any
 * other peer (a pipeline's last stage sending to its replica's first,
 * interleaved) gets a link of the pair's own, opened on first use like the
 * group links below (a point-to-point link is never a group link, so the
 * two never mix their bytes); the higher rank takes it off the listener
 * inside the same poll(), so its other direction goes on meanwhile.
 *
 * allreduce_group (a sum among some ranks, for pipeline replicas) runs the
 * same ring, reduce-scatter then all-gather, over the members in rank
 * order, on links of their own: one connection per pair of ranks, opened
 * the first time a group needs it (the lower rank connects to the higher
 * one's ring listener, which stays open for this, and says who it is; the
 * higher rank accepts whatever links arrive until it has the one it
 * needs) and kept until the end.  Only the members call; calls on groups
 * that share ranks come in one order on every rank (the ABI says so), so
 * each link carries the groups' bytes in the same order at both ends.  A
 * member that died closes its links (the call fails at once, naming it);
 * one that stopped is caught by the timeout and the roll call as above.
 * reduce_scatter_group and allgather_group are that ring's two phases
 * alone.  The whole world as the group is the world's ring itself (the
 * same bits).
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
     "failing the run, naming the ranks that stopped answering",
     offsetof(struct tcp_config, timeout)},
    {.type = TR_OPT_END},
};

#define HELLO_MAGIC 0x74727463u /* "trtc" */

/* Received floats are added in pieces of at most this many bytes. */
#define SCRATCH_BYTES ((size_t)256 << 10)

struct peer_addr {
    char host[64];
    uint16_t port;
};

/* Control frames, on a second connection beside each ring connection and
 * read both ways (the data connections carry nothing but floats):
 *   NOTICE  a rank gives up: its message, naming the rank at fault.  Each
 *           rank that gets one passes it on both ways and gives up too, so
 *           the first failure's message reaches every rank that can hear.
 *   ASK     a rank whose transfer made no progress for `timeout` calls the
 *           roll both ways around the ring: each rank that hears it answers
 *           (HERE) and passes it on, the answers travel back.  A stopped or
 *           hung rank answers nothing and passes nothing on, so the ranks
 *           that did not answer are the ones named.
 * Ranks read control frames while they wait in a collective. */
struct frame {
    uint32_t magic; /* FRAME_MAGIC */
    uint32_t type;  /* FRAME_NOTICE, FRAME_ASK, FRAME_HERE */
    int32_t origin; /* notice: the rank that gave up first; ask, here: the asking rank */
    int32_t rank;   /* here: the answering rank */
    int32_t calls;  /* here: how many collectives the answering rank has started */
    int32_t seq;    /* ask, here: which roll call of the asking rank */
    char text[232]; /* notice: the message */
};

#define FRAME_MAGIC 0x74726e6fu /* "trno" */
#define FRAME_NOTICE 1u
#define FRAME_ASK 2u
#define FRAME_HERE 3u
#define CONTROL_BIT 0x80000000u /* ring hello of a control connection */
#define P2P_BIT 0x40000000u     /* ring hello of a point-to-point connection */
#define GROUP_BIT 0x20000000u   /* hello of a group link (after start-up) */
#define PLINK_BIT 0x10000000u   /* hello of a point-to-point link beyond the neighbours */

/* Before each point-to-point message: its size. */
struct p2p_head {
    uint32_t magic; /* P2P_MAGIC */
    uint32_t zero;
    uint64_t bytes;
};
#define P2P_MAGIC 0x74727032u /* "trp2" */

struct tcp {
    const struct tr_host *host;
    int rank, world;
    int next_fd, prev_fd; /* ring: we send to next, receive from prev */
    int ctl_fd[2];        /* control connections: [0] with prev, [1] with next */
    int p2p_fd[2];        /* point to point, both ways: [0] with prev, [1] with next */
    struct frame ctl_in[2]; /* a frame being read from each */
    size_t ctl_have[2];
    int broken;           /* a collective failed: the ring is out of step */
    int calls;            /* collectives started, for the roll call's answers */
    int asks;             /* roll calls this rank made */
    int rolling;          /* the roll call in progress (its seq), or 0 */
    int *seen;            /* world: the last roll call of each rank answered here */
    int *where;           /* world: answers to this rank's roll call (-1: none yet) */
    double timeout;
    float *scratch;       /* SCRATCH_BYTES: received floats on their way into a sum */
    /* group links: the ring listener, kept open for them, every rank's
     * address, and the link with each rank (-1: none yet) */
    int listen_fd;
    struct peer_addr *table;
    int *link;
    int *plink;           /* sendrecv's links with ranks that are no ring neighbours */
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

static int neighbour(const struct tcp *t, int side)
{
    return side == 0 ? (t->rank + t->world - 1) % t->world : (t->rank + 1) % t->world;
}

/* Best effort: a frame the neighbour cannot take within a second is lost. */
static void send_frame(struct tcp *t, int side, const struct frame *f)
{
    if (t->ctl_fd[side] >= 0)
        (void)rdv_io(t->ctl_fd[side], (void *)f, sizeof *f, 1, rdv_now() + 1.0);
}

/* Reads what control connection `side` has, without blocking: 1 when a
 * whole frame is in ctl_in[side], 0 when not yet, -1 when the connection is
 * closed (its rank has exited) or carries something else. */
static int read_frame(struct tcp *t, int side)
{
    if (t->ctl_fd[side] < 0)
        return -1;
    while (t->ctl_have[side] < sizeof(struct frame)) {
        ssize_t k = recv(t->ctl_fd[side], (char *)&t->ctl_in[side] + t->ctl_have[side],
                         sizeof(struct frame) - t->ctl_have[side], MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return 0;
        if (k <= 0)
            break;
        t->ctl_have[side] += (size_t)k;
    }
    struct frame *f = &t->ctl_in[side];
    if (t->ctl_have[side] < sizeof *f || f->magic != FRAME_MAGIC || f->origin < 0 ||
        f->origin >= t->world || f->rank < 0 || f->rank >= t->world) {
        close(t->ctl_fd[side]);
        t->ctl_fd[side] = -1;
        return -1;
    }
    t->ctl_have[side] = 0; /* the next read starts a new frame */
    f->text[sizeof f->text - 1] = '\0';
    return 1;
}

/* Gives up the ring: tells both neighbours `text` (ours, or passed on from
 * `origin`), so that they stop too and say the same, and fails with it. */
static int give_up(struct tcp *t, tr_err *err, int origin, const char *text)
{
    struct frame f = {.magic = FRAME_MAGIC, .type = FRAME_NOTICE, .origin = origin};
    snprintf(f.text, sizeof f.text, "%s", text);
    for (int side = 0; side < 2; side++)
        send_frame(t, side, &f);
    t->broken = 1;
    if (origin == t->rank)
        return tr_fail(err, "comm tcp: %s", text);
    return tr_fail(err, "comm tcp: rank %d stops: %s", t->rank, text);
}

/* Acts on the frame just read from `side`: TR_ERROR after a notice (this
 * rank gave up too), else TR_OK. */
static int handle_frame(struct tcp *t, int side, tr_err *err)
{
    struct frame f = t->ctl_in[side];
    int onward = 1 - side; /* a frame keeps its direction around the ring */
    switch (f.type) {
    case FRAME_NOTICE:
        return give_up(t, err, f.origin, f.text);
    case FRAME_ASK:
        if (f.origin == t->rank)
            break;
        if (t->seen[f.origin] != f.seq) { /* it may come from both sides: answer once */
            t->seen[f.origin] = f.seq;
            struct frame here = {.magic = FRAME_MAGIC, .type = FRAME_HERE, .origin = f.origin,
                                 .rank = t->rank, .calls = t->calls, .seq = f.seq};
            send_frame(t, side, &here);
        }
        if (neighbour(t, onward) != f.origin)
            send_frame(t, onward, &f);
        break;
    case FRAME_HERE:
        if (f.origin != t->rank)
            send_frame(t, onward, &f);
        else if (t->rolling && f.seq == t->rolling)
            t->where[f.rank] = f.calls;
        break;
    default:
        break;
    }
    return TR_OK;
}

/* Reads and acts on every control frame that has arrived. */
static int pump_control(struct tcp *t, tr_err *err)
{
    for (int side = 0; side < 2; side++)
        while (read_frame(t, side) == 1)
            if (handle_frame(t, side, err) != TR_OK)
                return TR_ERROR;
    return TR_OK;
}

static int roll_complete(const struct tcp *t)
{
    for (int r = 0; r < t->world; r++)
        if (t->where[r] < 0)
            return 0;
    return 1;
}

/* Serves the control connections for up to `seconds`: TR_ERROR as soon as
 * a notice made this rank give up; TR_OK when the time is up, when this
 * rank's roll call has every answer, or when control connection `closing`
 * (0, 1, or -1 for none) has closed. */
static int serve_control(struct tcp *t, double seconds, int closing, tr_err *err)
{
    double until = rdv_now() + seconds;
    for (;;) {
        if (pump_control(t, err) != TR_OK)
            return TR_ERROR;
        if ((t->rolling && roll_complete(t)) || (closing >= 0 && t->ctl_fd[closing] < 0))
            return TR_OK;
        struct pollfd p[2] = {{.fd = t->ctl_fd[0], .events = POLLIN},
                              {.fd = t->ctl_fd[1], .events = POLLIN}};
        int ms = (int)((until - rdv_now()) * 1000);
        if (ms <= 0 || (p[0].fd < 0 && p[1].fd < 0))
            return TR_OK;
        if (poll(p, 2, ms) < 0 && errno != EINTR)
            return TR_OK;
    }
}

/* No progress with `peer` for the timeout: it, or a rank it waits for, is
 * stuck.  Calls the roll and names the ranks that do not answer. */
static int stalled(struct tcp *t, tr_err *err, int peer)
{
    for (int r = 0; r < t->world; r++)
        t->where[r] = -1;
    t->where[t->rank] = t->calls;
    t->rolling = ++t->asks;
    struct frame ask = {.magic = FRAME_MAGIC, .type = FRAME_ASK, .origin = t->rank,
                        .rank = t->rank, .seq = t->rolling};
    for (int side = 0; side < 2; side++)
        send_frame(t, side, &ask);
    /* long enough for the answers to cross the ring */
    double grace = t->timeout / 10 < 0.5 ? 0.5 : t->timeout / 10 > 5 ? 5 : t->timeout / 10;
    int rc = serve_control(t, grace, -1, err);
    t->rolling = 0;
    if (rc != TR_OK) /* another rank gave up first and said why */
        return TR_ERROR;
    char text[sizeof ((struct frame *)0)->text];
    size_t used = 0;
    int missing = 0;
    for (int r = 0; r < t->world; r++)
        missing += t->where[r] < 0;
    if (missing == 0) {
        used += (size_t)snprintf(text, sizeof text,
                                 "rank %d: no progress with rank %d for %.0f s (comm.timeout), "
                                 "yet every rank answered (collectives started:",
                                 t->rank, peer, t->timeout);
        for (int r = 0; r < t->world && used < sizeof text; r++)
            used += (size_t)snprintf(text + used, sizeof text - used, " %d", t->where[r]);
        if (used < sizeof text)
            snprintf(text + used, sizeof text - used, "): do all ranks make the same calls?");
        return give_up(t, err, t->rank, text);
    }
    used += (size_t)snprintf(text, sizeof text, "rank %d: rank%s", t->rank, missing > 1 ? "s" : "");
    for (int r = 0, k = 0; r < t->world && used < sizeof text; r++)
        if (t->where[r] < 0) {
            k++;
            used += (size_t)snprintf(text + used, sizeof text - used, "%s %d",
                                     k == 1 ? "" : k == missing ? " and" : ",", r);
        }
    if (used < sizeof text)
        snprintf(text + used, sizeof text - used,
                 " did not answer after %.0f s without progress (comm.timeout): stopped, hung, "
                 "or busy outside the collectives",
                 t->timeout);
    return give_up(t, err, t->rank, text);
}

/* The data connection on `side` broke: its rank exited.  If it was giving
 * up, its notice came first on the control connection beside it (the same
 * peer, so in order before the end of that stream): pass that on.
 * Otherwise the neighbour itself died. */
static int lost(struct tcp *t, tr_err *err, int side, const char *why)
{
    if (serve_control(t, 2.0, side, err) != TR_OK)
        return TR_ERROR;
    char text[sizeof ((struct frame *)0)->text];
    snprintf(text, sizeof text, "rank %d lost rank %d (%s): it has stopped or died", t->rank,
             neighbour(t, side), why);
    return give_up(t, err, t->rank, text);
}

/* One ring step: send `sbytes` of sbuf to next while receiving `rbytes`
 * from prev.  With add = 0 the bytes land in rbuf; with add = 1 they are
 * floats that are added into rbuf's (rbuf[i] += received[i]) as they
 * arrive, through the fixed-size scratch buffer, so a segment of any size
 * streams through without a receive buffer as large as itself.  Each
 * element gets exactly one addition, so the sums do not depend on how the
 * bytes happened to arrive. */
/* A connection to `peer` broke: the ring's data connections (side 0 or 1)
 * and group links alike.  A ring neighbour's notice, if it was giving up,
 * comes first on the control connection beside (see lost()); from any
 * other rank it travels around the ring, so this waits a moment for it. */
static int lost_peer(struct tcp *t, tr_err *err, int peer, int side, const char *why)
{
    if (side >= 0)
        return lost(t, err, side, why);
    if (serve_control(t, 1.0, -1, err) != TR_OK)
        return TR_ERROR;
    char text[sizeof ((struct frame *)0)->text];
    snprintf(text, sizeof text, "rank %d lost rank %d (%s): it has stopped or died", t->rank, peer,
             why);
    return give_up(t, err, t->rank, text);
}

/* exchange() on any two connections: send on sfd to rank speer, receive on
 * rfd from rank rpeer (the same fd for a group of two).  sside and rside:
 * the ring side of each when it is a ring data connection, else -1. */
static int exchange_on(struct tcp *t, int sfd, int speer, int sside, int rfd, int rpeer, int rside,
                       const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes, int add,
                       tr_err *err)
{
    const char *s = sbuf;
    char *r = rbuf;
    float *sum = rbuf;      /* add: the next float to add into */
    size_t held = 0;        /* add: bytes waiting in scratch */
    double deadline = rdv_now() + t->timeout;
    while (sbytes > 0 || rbytes > 0) {
        struct pollfd p[4] = {{.fd = sbytes ? sfd : -1, .events = POLLOUT},
                              {.fd = rbytes ? rfd : -1, .events = POLLIN},
                              {.fd = t->ctl_fd[0], .events = POLLIN},
                              {.fd = t->ctl_fd[1], .events = POLLIN}};
        int ms = (int)((deadline - rdv_now()) * 1000);
        int rc = ms > 0 ? poll(p, 4, ms) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return stalled(t, err, rbytes ? rpeer : speer);
        if ((p[2].revents | p[3].revents) && pump_control(t, err) != TR_OK)
            return TR_ERROR;
        if (sbytes && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = send(sfd, s, sbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return lost_peer(t, err, speer, sside, strerror(errno));
            if (k > 0) {
                s += k;
                sbytes -= (size_t)k;
            }
        }
        if (rbytes && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
            char *into = add ? (char *)t->scratch + held : r;
            size_t room = add ? SCRATCH_BYTES - held : rbytes;
            ssize_t k = recv(rfd, into, room < rbytes ? room : rbytes, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                return lost_peer(t, err, rpeer, rside,
                                 k == 0 ? "connection closed" : strerror(errno));
            if (k > 0) {
                rbytes -= (size_t)k;
                if (!add) {
                    r += k;
                } else {
                    held += (size_t)k;
                    size_t n = held / sizeof(float);
                    for (size_t i = 0; i < n; i++)
                        sum[i] += t->scratch[i];
                    sum += n;
                    held -= n * sizeof(float);
                    if (held) /* a float split across two reads: keep its first bytes */
                        memmove(t->scratch, (char *)t->scratch + n * sizeof(float), held);
                }
            }
        }
    }
    return TR_OK;
}

static int exchange(struct tcp *t, const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes,
                    int add, tr_err *err)
{
    return exchange_on(t, t->next_fd, neighbour(t, 1), 1, t->prev_fd, neighbour(t, 0), 0, sbuf,
                       sbytes, rbuf, rbytes, add, err);
}

/* Segment i of a ring collective over n floats, its index taken around
 * the ring: floats [n*k/W, n*(k+1)/W) for k = i mod W.  For n = W*count,
 * segment k is exactly buf + k*count. */
static int ring_index(int i, int world)
{
    return ((i % world) + world) % world;
}

static float *seg_ptr(float *buf, size_t n, int world, int i)
{
    size_t k = (size_t)ring_index(i, world);
    return buf + n * k / (size_t)world;
}

static size_t seg_bytes(size_t n, int world, int i)
{
    size_t k = (size_t)ring_index(i, world);
    return (n * (k + 1) / (size_t)world - n * k / (size_t)world) * sizeof(float);
}

/* Ring reduce-scatter over n floats in W segments: in step s (0..W-2) rank r
 * sends segment r-s-1 and adds what it receives into segment r-s-2; after
 * W-1 steps rank r holds the sum of segment r.  Segment c is summed along
 * the ring starting at rank c+1: ((x[c+1] + x[c+2]) + ...) + x[c], indices
 * modulo W, one addition per element and step, on exactly one rank. */
static int ring_reduce_scatter(struct tcp *t, float *buf, size_t n, tr_err *err)
{
    int W = t->world, r = t->rank;
    for (int s = 0; s < W - 1; s++) {
        int sc = r - s - 1, rc = r - s - 2;
        if (exchange(t, seg_ptr(buf, n, W, sc), seg_bytes(n, W, sc), seg_ptr(buf, n, W, rc),
                     seg_bytes(n, W, rc), 1, err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

/* Ring all-gather over n floats in W segments, rank r starting with segment
 * r: in step s rank r sends segment r-s and receives segment r-s-1. */
static int ring_allgather(struct tcp *t, float *buf, size_t n, tr_err *err)
{
    int W = t->world, r = t->rank;
    for (int s = 0; s < W - 1; s++) {
        int sc = r - s, rc = r - s - 1;
        if (exchange(t, seg_ptr(buf, n, W, sc), seg_bytes(n, W, sc), seg_ptr(buf, n, W, rc),
                     seg_bytes(n, W, rc), 0, err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

/* The bandwidth-optimal ring: reduce-scatter, then all-gather.  Each
 * segment is summed on one rank and copied to the others, so every rank
 * ends with the same bits, and rank r's segment holds exactly what
 * tcp_reduce_scatter leaves there for the same W*count floats. */
/* Every collective starts here (every rank makes the same calls, so the
 * counts agree across ranks while all is well). */
static int begin(struct tcp *t, tr_err *err)
{
    if (t->broken)
        return tr_fail(err, "comm tcp: the ring is out of step after an earlier failure");
    t->calls++;
    return TR_OK;
}

static int tcp_allreduce_sum(void *self, float *buf, size_t count, tr_err *err)
{
    struct tcp *t = self;
    if (begin(t, err) != TR_OK)
        return TR_ERROR;
    if (t->world == 1 || count == 0)
        return TR_OK;
    if (ring_reduce_scatter(t, buf, count, err) != TR_OK)
        return TR_ERROR;
    return ring_allgather(t, buf, count, err);
}

/* The first phase of the all-reduce alone: rank r ends with buf + r*count. */
static int tcp_reduce_scatter(void *self, float *buf, size_t count, tr_err *err)
{
    struct tcp *t = self;
    if (begin(t, err) != TR_OK)
        return TR_ERROR;
    if (t->world == 1 || count == 0)
        return TR_OK;
    return ring_reduce_scatter(t, buf, (size_t)t->world * count, err);
}

static int tcp_allgather(void *self, float *buf, size_t count, tr_err *err)
{
    struct tcp *t = self;
    if (begin(t, err) != TR_OK)
        return TR_ERROR;
    if (t->world == 1 || count == 0)
        return TR_OK;
    return ring_allgather(t, buf, (size_t)t->world * count, err);
}

static int tcp_broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    struct tcp *t = self;
    if (begin(t, err) != TR_OK)
        return TR_ERROR;
    if (t->world == 1 || bytes == 0)
        return TR_OK;
    int next = (t->rank + 1) % t->world;
    if (t->rank != root && exchange(t, NULL, 0, buf, bytes, 0, err) != TR_OK)
        return TR_ERROR;
    if (next != root && exchange(t, buf, bytes, NULL, 0, 0, err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

/* ---- groups ---------------------------------------------------------------- */

/* The ring side (0: prev, 1: next) where `peer` is a ring neighbour, else
 * -1: where a broken link's notice would come from. */
static int ring_side(const struct tcp *t, int peer)
{
    return peer == neighbour(t, 0) ? 0 : peer == neighbour(t, 1) ? 1 : -1;
}

/* Takes one link the listener holds and files it by its hello (which
 * rank, group or point-to-point link).  TR_OK also when what connected
 * went away before saying who it is (its own calls fail it). */
static int file_link(struct tcp *t, tr_err *err)
{
    int fd = accept(t->listen_fd, NULL, NULL);
    if (fd < 0)
        return TR_OK;
    tune(fd);
    uint32_t them = 0;
    /* the hello follows the connect at once */
    if (rdv_io(fd, &them, sizeof them, 0, rdv_now() + 5.0) != 0) {
        close(fd);
        return TR_OK;
    }
    int *links = them & GROUP_BIT ? t->link : them & PLINK_BIT ? t->plink : NULL;
    int r = (int)(them & ~(GROUP_BIT | PLINK_BIT));
    if (!links || r < 0 || r >= t->rank || links[r] >= 0) {
        close(fd);
        char text[sizeof ((struct frame *)0)->text];
        snprintf(text, sizeof text, "rank %d: a link from rank %d that is not expected (hello "
                 "%#x): is another job using this port?", t->rank, r, them);
        return give_up(t, err, t->rank, text);
    }
    links[r] = fd;
    return TR_OK;
}

/* Takes links off the listener until links[waiting_for] is there, or
 * fails naming `waiting_for` when it does not come within the timeout. */
static int accept_link(struct tcp *t, const int *links, int waiting_for, double deadline,
                       tr_err *err)
{
    while (links[waiting_for] < 0) {
        struct pollfd p[3] = {{.fd = t->listen_fd, .events = POLLIN},
                              {.fd = t->ctl_fd[0], .events = POLLIN},
                              {.fd = t->ctl_fd[1], .events = POLLIN}};
        int ms = (int)((deadline - rdv_now()) * 1000);
        int rc = ms > 0 ? poll(p, 3, ms) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) /* it never connected: stopped, or not in this call */
            return stalled(t, err, waiting_for);
        if ((p[1].revents | p[2].revents) && pump_control(t, err) != TR_OK)
            return TR_ERROR;
        if ((p[0].revents & POLLIN) && file_link(t, err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

/* The lower rank's side of a new link with `peer`: connect and say who
 * this is (bit: GROUP_BIT or PLINK_BIT).  Never waits for the peer to
 * accept: the kernel queues the connection and the hello. */
static int connect_link(struct tcp *t, int *links, int peer, uint32_t bit, tr_err *err)
{
    /* its listener has been open since start-up: a refusal means it is gone */
    char port[16], what[32];
    snprintf(port, sizeof port, "%u", t->table[peer].port);
    snprintf(what, sizeof what, "rank %d", peer);
    tr_err why = {{0}};
    int fd = connect_to(t->table[peer].host, port, rdv_now() + 1.0, what, &why);
    uint32_t hello = (uint32_t)t->rank | bit;
    if (fd >= 0 && rdv_io(fd, &hello, sizeof hello, 1, rdv_now() + t->timeout) != 0) {
        close(fd);
        fd = -1;
        snprintf(why.msg, sizeof why.msg, "it took no hello");
    }
    if (fd < 0)
        return lost_peer(t, err, peer, ring_side(t, peer), why.msg);
    links[peer] = fd;
    return fd;
}

/* The group link with `peer`, opened now if this is the first group that
 * joins the two: the lower rank connects, the higher accepts. */
static int link_with(struct tcp *t, int peer, tr_err *err)
{
    if (t->link[peer] >= 0)
        return t->link[peer];
    if (t->rank < peer)
        return connect_link(t, t->link, peer, GROUP_BIT, err);
    if (accept_link(t, t->link, peer, rdv_now() + t->timeout, err) != TR_OK)
        return TR_ERROR;
    return t->link[peer];
}

enum { RING_SCATTER = 1, RING_GATHER = 2 };

/* The ring over the members in rank order, on group links, over count
 * floats cut in n segments (member i's is segment i): its reduce-scatter
 * phase (segment i summed on member i), its all-gather phase, or both (an
 * all-reduce), as allreduce_sum runs them over the world, so every member
 * ends with the same bits.  `what` names the slot in messages; the whole
 * world as the group is the world's ring itself (the same bits). */
static int group_ring(struct tcp *t, float *buf, size_t count, const int *ranks, int n,
                      int phases, const char *what, tr_err *err)
{
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= t->world || (i && ranks[i] <= ranks[i - 1]))
            return tr_fail(err, "comm tcp: %s on rank %d: the ranks must ascend from 0 to %d "
                           "without repeats (rank %d at position %d)",
                           what, t->rank, t->world - 1, ranks[i], i);
        if (ranks[i] == t->rank)
            me = i;
    }
    if (me < 0)
        return tr_fail(err, "comm tcp: %s called on rank %d, which is not among its %d ranks: "
                       "only the members call it", what, t->rank, n);
    if (begin(t, err) != TR_OK)
        return TR_ERROR;
    if (n == 1 || count == 0)
        return TR_OK;
    if (n == t->world) /* the ring itself */
        return (phases & RING_SCATTER && ring_reduce_scatter(t, buf, count, err) != TR_OK) ||
                       (phases & RING_GATHER && ring_allgather(t, buf, count, err) != TR_OK)
                   ? TR_ERROR
                   : TR_OK;
    int next = ranks[(me + 1) % n], prev = ranks[(me + n - 1) % n];
    int nfd = link_with(t, next, err);
    if (nfd < 0)
        return TR_ERROR;
    int pfd = link_with(t, prev, err);
    if (pfd < 0)
        return TR_ERROR;
    int ns = ring_side(t, next), ps = ring_side(t, prev);
    for (int s = 0; phases & RING_SCATTER && s < n - 1; s++) { /* reduce-scatter */
        int sc = me - s - 1, rc = me - s - 2;
        if (exchange_on(t, nfd, next, ns, pfd, prev, ps, seg_ptr(buf, count, n, sc),
                        seg_bytes(count, n, sc), seg_ptr(buf, count, n, rc),
                        seg_bytes(count, n, rc), 1, err) != TR_OK)
            return TR_ERROR;
    }
    for (int s = 0; phases & RING_GATHER && s < n - 1; s++) { /* all-gather */
        int sc = me - s, rc = me - s - 1;
        if (exchange_on(t, nfd, next, ns, pfd, prev, ps, seg_ptr(buf, count, n, sc),
                        seg_bytes(count, n, sc), seg_ptr(buf, count, n, rc),
                        seg_bytes(count, n, rc), 0, err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

static int tcp_allreduce_group(void *self, float *buf, size_t count, const int *ranks, int n,
                               tr_err *err)
{
    return group_ring(self, buf, count, ranks, n, RING_SCATTER | RING_GATHER, "allreduce_group",
                      err);
}

/* The ring's phases alone over n*count floats: count is a multiple's
 * share, so the segments are the members' parts. */
static int tcp_reduce_scatter_group(void *self, float *buf, size_t count, const int *ranks, int n,
                                    tr_err *err)
{
    return group_ring(self, buf, count * (size_t)n, ranks, n, RING_SCATTER,
                      "reduce_scatter_group", err);
}

static int tcp_allgather_group(void *self, float *buf, size_t count, const int *ranks, int n,
                               tr_err *err)
{
    return group_ring(self, buf, count * (size_t)n, ranks, n, RING_GATHER, "allgather_group", err);
}

/* The side (0: prev, 1: next) whose point-to-point connection carries a
 * message to rank `to` (sending) or from rank `from` (receiving), or -1 when
 * that rank is no ring neighbour.  With 2 ranks both sides reach the same
 * rank: a rank sends on the connection it opened (next) and receives on
 * the one it accepted (prev), which are the same connection seen from the
 * two ends. */
static int side_to(const struct tcp *t, int to)
{
    return to == neighbour(t, 1) ? 1 : to == neighbour(t, 0) ? 0 : -1;
}

static int side_from(const struct tcp *t, int from)
{
    return from == neighbour(t, 0) ? 0 : from == neighbour(t, 1) ? 1 : -1;
}

/* sendrecv's link with `peer`, no ring neighbour: *fd the link, or -1
 * when this is the higher rank and the peer has not connected yet (the
 * caller takes it off the listener as it comes); the lower rank connects
 * now, which never waits. */
static int far_link(struct tcp *t, int peer, int *fd, tr_err *err)
{
    *fd = t->plink[peer];
    if (*fd >= 0 || t->rank > peer)
        return TR_OK;
    *fd = connect_link(t, t->plink, peer, PLINK_BIT, err);
    return *fd >= 0 ? TR_OK : TR_ERROR;
}

static int tcp_sendrecv(void *self, const void *send_buf, size_t send_bytes, int to,
                        void *recv_buf, size_t recv_bytes, int from, tr_err *err)
{
    struct tcp *t = self;
    if (to < -1 || to >= t->world || from < -1 || from >= t->world)
        return tr_fail(err, "comm tcp: sendrecv on rank %d to rank %d and from rank %d, but there "
                       "are %d ranks (-1: none)", t->rank, to, from, t->world);
    if (to < 0 || !send_bytes)
        to = -1, send_bytes = 0;
    if (from < 0 || !recv_bytes)
        from = -1, recv_bytes = 0;
    if (to == t->rank || from == t->rank)
        return tr_fail(err, "comm tcp: sendrecv on rank %d %s itself: tcp moves messages between "
                       "two ranks; copy within the rank instead", t->rank,
                       to == t->rank ? "to" : "from");
    if (begin(t, err) != TR_OK)
        return TR_ERROR;
    if (!send_bytes && !recv_bytes)
        return TR_OK;
    /* the connections: a ring neighbour's point-to-point one, else a link
     * of the pair's own (-1 until the peer, a lower rank, has connected:
     * it is taken off the listener in the loop, so the other direction
     * goes on meanwhile) */
    int ss = to >= 0 ? side_to(t, to) : -1, rs = from >= 0 ? side_from(t, from) : -1;
    int sfd = ss >= 0 ? t->p2p_fd[ss] : -1, rfd = rs >= 0 ? t->p2p_fd[rs] : -1;
    if ((to >= 0 && ss < 0 && far_link(t, to, &sfd, err) != TR_OK) ||
        (from >= 0 && rs < 0 && far_link(t, from, &rfd, err) != TR_OK))
        return TR_ERROR;
    struct p2p_head out = {P2P_MAGIC, 0, send_bytes}, in = {0, 0, 0};
    /* what is left to send and receive: the header's bytes, then the buffer's */
    size_t shead = to >= 0 ? sizeof out : 0, rhead = from >= 0 ? sizeof in : 0;
    const char *s = send_buf;
    char *r = recv_buf;
    size_t sleft = send_bytes, rleft = recv_bytes;
    double deadline = rdv_now() + t->timeout;
    while (shead + sleft > 0 || rhead + rleft > 0) {
        int sending = shead + sleft > 0, receiving = rhead + rleft > 0;
        if (sending && sfd < 0)
            sfd = t->plink[to];
        if (receiving && rfd < 0)
            rfd = t->plink[from];
        int linking = (sending && sfd < 0) || (receiving && rfd < 0);
        struct pollfd p[5] = {{.fd = sending ? sfd : -1, .events = POLLOUT},
                              {.fd = receiving ? rfd : -1, .events = POLLIN},
                              {.fd = t->ctl_fd[0], .events = POLLIN},
                              {.fd = t->ctl_fd[1], .events = POLLIN},
                              {.fd = linking ? t->listen_fd : -1, .events = POLLIN}};
        int ms = (int)((deadline - rdv_now()) * 1000);
        int rc = ms > 0 ? poll(p, 5, ms) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) /* no progress for the timeout: the peer we wait for */
            return stalled(t, err, receiving ? from : to);
        if ((p[2].revents | p[3].revents) && pump_control(t, err) != TR_OK)
            return TR_ERROR;
        if ((p[4].revents & POLLIN) && file_link(t, err) != TR_OK)
            return TR_ERROR;
        if (sending && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const char *from_here = shead ? (const char *)&out + sizeof out - shead : s;
            size_t n = shead ? shead : sleft;
            ssize_t k = send(sfd, from_here, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return lost_peer(t, err, to, ss, strerror(errno));
            if (k > 0 && shead) {
                shead -= (size_t)k;
            } else if (k > 0) {
                s += k;
                sleft -= (size_t)k;
            }
            if (k > 0)
                deadline = rdv_now() + t->timeout;
        }
        if (receiving && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
            char *into = rhead ? (char *)&in + sizeof in - rhead : r;
            size_t n = rhead ? rhead : rleft;
            ssize_t k = recv(rfd, into, n, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                return lost_peer(t, err, from, rs, k == 0 ? "connection closed" : strerror(errno));
            if (k > 0 && rhead) {
                rhead -= (size_t)k;
                if (!rhead && (in.magic != P2P_MAGIC || in.bytes != recv_bytes)) {
                    char text[sizeof ((struct frame *)0)->text];
                    if (in.magic != P2P_MAGIC)
                        snprintf(text, sizeof text, "rank %d: what rank %d sent point to point "
                                 "is not a trainrun message", t->rank, from);
                    else
                        snprintf(text, sizeof text, "rank %d expected %zu bytes from rank %d, "
                                 "which sent %llu: the two disagree on the message's size",
                                 t->rank, recv_bytes, from, (unsigned long long)in.bytes);
                    return give_up(t, err, t->rank, text);
                }
            } else if (k > 0) {
                r += k;
                rleft -= (size_t)k;
            }
            if (k > 0)
                deadline = rdv_now() + t->timeout;
        }
    }
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
    for (int side = 0; side < 2; side++) {
        if (t->ctl_fd[side] >= 0)
            close(t->ctl_fd[side]);
        if (t->p2p_fd[side] >= 0)
            close(t->p2p_fd[side]);
    }
    for (int r = 0; t->link && r < t->world; r++)
        if (t->link[r] >= 0)
            close(t->link[r]);
    for (int r = 0; t->plink && r < t->world; r++)
        if (t->plink[r] >= 0)
            close(t->plink[r]);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    t->host->free(t->link);
    t->host->free(t->plink);
    t->host->free(t->table);
    t->host->free(t->scratch);
    t->host->free(t->seen);
    t->host->free(t->where);
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
    /* the ring reads and writes buffers with the CPU: host memory only */
    if (TR_HAS_SLOT(args, struct tr_create_args, device) && strcmp(args->device, "cpu") != 0)
        return tr_fail(err, "comm tcp: buffers on device '%s' need comm = \"nccl\"; tcp moves "
                       "host memory (device = \"cpu\")", args->device);
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
    t->next_fd = t->prev_fd = t->ctl_fd[0] = t->ctl_fd[1] = t->p2p_fd[0] = t->p2p_fd[1] = -1;
    t->listen_fd = -1;
    t->scratch = host->alloc(SCRATCH_BYTES);
    t->seen = host->alloc(sizeof *t->seen * (size_t)t->world);
    t->where = host->alloc(sizeof *t->where * (size_t)t->world);
    t->link = host->alloc(sizeof *t->link * (size_t)t->world);
    t->plink = host->alloc(sizeof *t->plink * (size_t)t->world);
    for (int r = 0; r < t->world; r++) { /* before any destroy: it closes what they hold */
        if (t->link)
            t->link[r] = -1;
        if (t->plink)
            t->plink[r] = -1;
    }
    if (!t->scratch || !t->seen || !t->where || !t->link || !t->plink) {
        tcp_destroy(t);
        return tr_fail(err, "comm tcp: out of memory");
    }
    memset(t->seen, 0, sizeof *t->seen * (size_t)t->world);
    snprintf(t->describe, sizeof t->describe, "tcp ring, %d ranks via %s", t->world,
             t->world > 1 ? master : "(none)");
    *self = t;
    if (t->world == 1)
        return TR_OK;

    double deadline = rdv_now() + c->timeout;
    struct peer_addr *table = t->table = host->alloc(sizeof *table * (size_t)t->world);
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
    if (rc == TR_OK) { /* the ring: connect forward (data, control, point to point), accept
                        * the same from behind */
        int next = (t->rank + 1) % t->world, prev = (t->rank + t->world - 1) % t->world;
        char port[16];
        snprintf(port, sizeof port, "%u", table[next].port);
        char what[32];
        snprintf(what, sizeof what, "rank %d", next);
        uint32_t hello[3] = {(uint32_t)t->rank, (uint32_t)t->rank | CONTROL_BIT,
                             (uint32_t)t->rank | P2P_BIT};
        int *out[3] = {&t->next_fd, &t->ctl_fd[1], &t->p2p_fd[1]};
        for (int i = 0; i < 3 && rc == TR_OK; i++) {
            *out[i] = connect_to(table[next].host, port, deadline, what, err);
            if (*out[i] < 0)
                rc = TR_ERROR;
            else if (rdv_io(*out[i], &hello[i], sizeof hello[i], 1, deadline) != 0)
                rc = tr_fail(err, "comm tcp: rank %d closed the connection during start-up "
                             "(see its log)", next);
        }
        snprintf(what, sizeof what, "rank %d", prev);
        for (int i = 0; i < 3 && rc == TR_OK; i++) {
            int fd = accept_one(ring_fd, deadline, what, err);
            uint32_t them = 0;
            if (fd < 0) {
                rc = TR_ERROR;
                break;
            }
            int *slot = &t->prev_fd;
            int heard = rdv_io(fd, &them, sizeof them, 0, deadline) == 0;
            if (them & CONTROL_BIT)
                slot = &t->ctl_fd[0], them &= ~CONTROL_BIT;
            else if (them & P2P_BIT)
                slot = &t->p2p_fd[0], them &= ~P2P_BIT;
            if (!heard) {
                close(fd);
                rc = tr_fail(err, "comm tcp: %s closed the connection during start-up (see its "
                             "log)", what);
            } else if ((int)them != prev || *slot >= 0) {
                close(fd);
                rc = tr_fail(err, "comm tcp: the ring is miswired (rank %u connected to rank %d)",
                             them, t->rank);
            } else {
                *slot = fd;
            }
        }
    }
    /* kept: group links connect to it later (table says where) */
    t->listen_fd = ring_fd;
    return rc;
}

static const struct tr_comm_vtable tcp_vtable = {
    .struct_size = sizeof(struct tr_comm_vtable),
    .allreduce_sum = tcp_allreduce_sum,
    .broadcast = tcp_broadcast,
    .allgather = tcp_allgather,
    .describe = tcp_describe,
    .reduce_scatter = tcp_reduce_scatter,
    .sendrecv = tcp_sendrecv,
    .allreduce_group = tcp_allreduce_group,
    .reduce_scatter_group = tcp_reduce_scatter_group,
    .allgather_group = tcp_allgather_group,
};

static const struct tr_plugin_info tcp_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_COMM,
    .name = "tcp",
    .version = "0.1.0",
    .description = "collectives over TCP sockets (ring all-reduce and reduce-scatter); CPU ranks, no MPI needed",
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

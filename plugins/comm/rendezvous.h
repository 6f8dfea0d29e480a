/*
 * Handing a small blob (NCCL's unique id) from rank 0 to every other rank
 * before any communicator exists, over one of:
 *
 *   TRAINRUN_MASTER=host:port       rank 0 listens on port (all interfaces);
 *                                   the others connect to host:port, retrying
 *                                   until the timeout, and read the blob
 *   TRAINRUN_RENDEZVOUS_FILE=path   rank 0 writes path atomically (rename);
 *                                   the others poll for it on a filesystem
 *                                   all ranks share
 *
 * Both carry a job tag (TRAINRUN_JOB_ID, SLURM_JOB_ID or PBS_JOBID when
 * set): a rank ignores a blob from another job, so a file left by a crashed
 * job is not taken for this one's.  A header-only helper so a plugin stays
 * one self-contained .so; the tcp plugin uses its host:port parsing and
 * deadline-bound socket I/O for its own start-up.
 */
#ifndef TRAINRUN_PLUGINS_COMM_RENDEZVOUS_H
#define TRAINRUN_PLUGINS_COMM_RENDEZVOUS_H

#include <trainrun/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define RDV_MAGIC 0x56524454u /* "TDRV" */
#define RDV_VERSION 1u
#define RDV_MAX_BLOB 4096u
#define RDV_TAG_LEN 64

/* What travels: fixed header, then `blob_len` bytes. */
struct rdv_header {
    uint32_t magic, version;
    int32_t rank, world; /* hello: the sender's; reply and file: rank 0's */
    uint32_t blob_len;
    char tag[RDV_TAG_LEN];
};

static inline double rdv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void rdv_sleep(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The scheduler's job id, so blobs of different jobs never mix. */
static inline void rdv_job_tag(char tag[RDV_TAG_LEN])
{
    static const char *const vars[] = {"TRAINRUN_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID"};
    memset(tag, 0, RDV_TAG_LEN);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && v[0]) {
            snprintf(tag, RDV_TAG_LEN, "%s=%s", vars[i], v);
            return;
        }
    }
}

static inline void rdv_fill_header(struct rdv_header *h, int rank, int world, size_t len)
{
    memset(h, 0, sizeof *h);
    h->magic = RDV_MAGIC;
    h->version = RDV_VERSION;
    h->rank = rank;
    h->world = world;
    h->blob_len = (uint32_t)len;
    rdv_job_tag(h->tag);
}

/* ---- TCP ----------------------------------------------------------------- */

/* Splits "host:port" or "[v6addr]:port".  0 on success. */
static inline int rdv_split_master(const char *master, char *host, size_t host_cap, char *port,
                                   size_t port_cap)
{
    const char *colon;
    if (master[0] == '[') {
        const char *close = strchr(master, ']');
        if (!close || close[1] != ':')
            return -1;
        if ((size_t)(close - master - 1) >= host_cap)
            return -1;
        memcpy(host, master + 1, (size_t)(close - master - 1));
        host[close - master - 1] = '\0';
        colon = close + 1;
    } else {
        colon = strrchr(master, ':');
        if (!colon || colon == master || (size_t)(colon - master) >= host_cap)
            return -1;
        memcpy(host, master, (size_t)(colon - master));
        host[colon - master] = '\0';
    }
    const char *p = colon + 1;
    if (!p[0] || strlen(p) >= port_cap || strspn(p, "0123456789") != strlen(p))
        return -1;
    long n = strtol(p, NULL, 10);
    if (n < 1 || n > 65535)
        return -1;
    snprintf(port, port_cap, "%s", p);
    return 0;
}

/* Moves exactly n bytes, waiting at most until `deadline`.  0, or -1 with
 * errno (ETIMEDOUT, ECONNRESET when the peer closed early). */
static inline int rdv_io(int fd, void *buf, size_t n, int sending, double deadline)
{
    char *p = buf;
    while (n > 0) {
        double left = deadline - rdv_now();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        int r = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            continue;
        ssize_t got = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got < 0)
            return -1;
        if (got == 0) {
            errno = ECONNRESET;
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Rank 0: listen on `port` and serve the blob to each of world-1 ranks. */
static inline int rdv_tcp_serve(const char *who, const char *master, const char *port,
                                const void *blob, size_t len, int world, double timeout_s,
                                tr_err *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(NULL, port, &hints, &res);
    if (gai != 0)
        return tr_fail(err, "%s: TRAINRUN_MASTER=%s: cannot listen on port %s: %s", who, master,
                       port, gai_strerror(gai));
    /* An IPv6 socket that also takes IPv4 covers both kinds of peer; plain
     * IPv4 where the host has no IPv6. */
    int fd = -1, bind_errno = 0;
    for (int want = 0; want < 2 && fd < 0; want++) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            if (ai->ai_family != (want == 0 ? AF_INET6 : AF_INET))
                continue;
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0)
                continue;
            int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (ai->ai_family == AF_INET6)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
                bind_errno = errno;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return tr_fail(err,
                       "%s: rank 0 cannot listen on port %s of TRAINRUN_MASTER=%s: %s (pick a free "
                       "port)",
                       who, port, master, strerror(bind_errno));

    char *served = calloc((size_t)world, 1);
    if (!served) {
        close(fd);
        return tr_fail(err, "%s: out of memory", who);
    }
    struct rdv_header reply;
    rdv_fill_header(&reply, 0, world, len);
    int remaining = world - 1, rc = TR_OK;
    double deadline = rdv_now() + timeout_s;
    while (remaining > 0) {
        double left = deadline - rdv_now();
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = tr_fail(err,
                         "%s: rank 0 waited %g s on port %s (TRAINRUN_MASTER=%s) but %d of %d "
                         "ranks never connected: check that they run, that they reach this host "
                         "at that address, or raise rendezvous_timeout",
                         who, timeout_s, port, master, remaining, world - 1);
            break;
        }
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        /* A stray or half-dead client must not stall the others for long. */
        double client_deadline = rdv_now() + 10.0;
        if (client_deadline > deadline)
            client_deadline = deadline;
        struct rdv_header hello;
        if (rdv_io(c, &hello, sizeof hello, 0, client_deadline) != 0 || hello.magic != RDV_MAGIC ||
            hello.version != RDV_VERSION) {
            close(c); /* not one of ours; a real rank retries */
            continue;
        }
        if (strncmp(hello.tag, reply.tag, RDV_TAG_LEN) != 0) {
            close(c); /* another job's rank on a reused port */
            continue;
        }
        if (hello.world != world || hello.rank < 1 || hello.rank >= world) {
            close(c);
            rc = tr_fail(err,
                         "%s: a rank connected saying it is rank %d of %d, but rank 0 runs with "
                         "%d ranks: every rank must get the same world size",
                         who, hello.rank, hello.world, world);
            break;
        }
        if (rdv_io(c, &reply, sizeof reply, 1, client_deadline) == 0 &&
            rdv_io(c, (void *)blob, len, 1, client_deadline) == 0 && !served[hello.rank]) {
            served[hello.rank] = 1;
            remaining--;
        }
        close(c);
    }
    free(served);
    close(fd);
    return rc;
}

/* Ranks 1..world-1: connect to host:port until the timeout and read the blob. */
static inline int rdv_tcp_fetch(const char *who, const char *master, const char *host,
                                const char *port, void *blob, size_t len, int rank, int world,
                                double timeout_s, tr_err *err)
{
    struct rdv_header hello, reply;
    rdv_fill_header(&hello, rank, world, len);
    double deadline = rdv_now() + timeout_s, pause = 0.05;
    char last[512] = "no attempt made";
    while (rdv_now() < deadline) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(host, port, &hints, &res);
        if (gai != 0) {
            snprintf(last, sizeof last, "cannot resolve %s: %s", host, gai_strerror(gai));
        } else {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int c = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
                if (c < 0)
                    continue;
                if (connect(c, ai->ai_addr, ai->ai_addrlen) != 0) {
                    snprintf(last, sizeof last, "connect: %s", strerror(errno));
                    close(c);
                    continue;
                }
                double io_deadline = rdv_now() + 30.0 < deadline ? rdv_now() + 30.0 : deadline;
                int ok = rdv_io(c, &hello, sizeof hello, 1, io_deadline) == 0 &&
                         rdv_io(c, &reply, sizeof reply, 0, io_deadline) == 0;
                if (ok && (reply.magic != RDV_MAGIC || reply.blob_len != len)) {
                    close(c);
                    freeaddrinfo(res);
                    return tr_fail(err,
                                   "%s: %s answered, but not as trainrun rank 0 of the same "
                                   "kind of job (is another program on that port?)",
                                   who, master);
                }
                ok = ok && rdv_io(c, blob, len, 0, io_deadline) == 0;
                if (!ok)
                    snprintf(last, sizeof last, "connection dropped: %s (rank 0 refused this rank?)",
                             strerror(errno));
                close(c);
                if (ok) {
                    freeaddrinfo(res);
                    return TR_OK;
                }
            }
            freeaddrinfo(res);
        }
        rdv_sleep(pause);
        if (pause < 1.0)
            pause *= 2;
    }
    return tr_fail(err,
                   "%s: rank %d could not get the communicator id from rank 0 at "
                   "TRAINRUN_MASTER=%s within %g s (last: %s): check that rank 0 runs and that "
                   "this host reaches it",
                   who, rank, master, timeout_s, last);
}

/* ---- shared file ---------------------------------------------------------- */

static inline int rdv_file_publish(const char *who, const char *path, const void *blob,
                                   size_t len, int world, tr_err *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    struct rdv_header h;
    rdv_fill_header(&h, 0, world, len);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return tr_fail(err, "%s: cannot create %s (TRAINRUN_RENDEZVOUS_FILE): %s", who, tmp,
                       strerror(errno));
    int ok = write(fd, &h, sizeof h) == (ssize_t)sizeof h && write(fd, blob, len) == (ssize_t)len &&
             fsync(fd) == 0;
    int saved = errno;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) != 0) {
        saved = errno;
        ok = 0;
    }
    if (!ok) {
        unlink(tmp);
        return tr_fail(err, "%s: cannot write %s (TRAINRUN_RENDEZVOUS_FILE): %s", who, path,
                       strerror(saved));
    }
    return TR_OK;
}

/* 1: got this job's blob, 0: not there (yet), -1: unreadable. */
static inline int rdv_file_try_read(const char *path, void *blob, size_t len, int world)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    struct rdv_header h, mine;
    rdv_fill_header(&mine, 0, world, len);
    int got = read(fd, &h, sizeof h) == (ssize_t)sizeof h && h.magic == RDV_MAGIC &&
              h.version == RDV_VERSION && h.blob_len == len && h.world == world &&
              strncmp(h.tag, mine.tag, RDV_TAG_LEN) == 0 && read(fd, blob, len) == (ssize_t)len;
    close(fd);
    return got;
}

static inline void rdv_ack_path(char *out, size_t cap, const char *path, int rank)
{
    snprintf(out, cap, "%s.ack-%d", path, rank);
}

/* Rank 0 removes the file once every rank acknowledged it, so the next job
 * at the same path cannot read it; the others poll until the file is there. */
static inline int rdv_file_exchange(const char *who, const char *path, void *blob, size_t len,
                                    int rank, int world, double timeout_s, tr_err *err)
{
    char ack[4096];
    double deadline = rdv_now() + timeout_s;
    if (rank == 0) {
        if (rdv_file_publish(who, path, blob, len, world, err) != TR_OK)
            return TR_ERROR;
        for (int r = 1; r < world; r++) {
            rdv_ack_path(ack, sizeof ack, path, r);
            while (access(ack, F_OK) != 0) {
                if (rdv_now() > deadline) {
                    unlink(path);
                    return tr_fail(err,
                                   "%s: rank %d did not read %s (TRAINRUN_RENDEZVOUS_FILE) within "
                                   "%g s: check that it runs and sees the same filesystem",
                                   who, r, path, timeout_s);
                }
                rdv_sleep(0.05);
            }
        }
        unlink(path);
        for (int r = 1; r < world; r++) {
            rdv_ack_path(ack, sizeof ack, path, r);
            unlink(ack);
        }
        return TR_OK;
    }
    double pause = 0.02;
    for (;;) {
        int got = rdv_file_try_read(path, blob, len, world);
        if (got == 1)
            break;
        if (got < 0)
            return tr_fail(err, "%s: cannot read %s (TRAINRUN_RENDEZVOUS_FILE): %s", who, path,
                           strerror(errno));
        if (rdv_now() > deadline)
            return tr_fail(err,
                           "%s: rank %d waited %g s for rank 0 to write %s "
                           "(TRAINRUN_RENDEZVOUS_FILE): check that rank 0 runs and that the path "
                           "is on a filesystem all ranks share",
                           who, rank, timeout_s, path);
        rdv_sleep(pause);
        if (pause < 0.5)
            pause *= 2;
    }
    rdv_ack_path(ack, sizeof ack, path, rank);
    int fd = open(ack, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return tr_fail(err, "%s: cannot create %s next to TRAINRUN_RENDEZVOUS_FILE: %s", who, ack,
                       strerror(errno));
    close(fd);
    return TR_OK;
}

/* ---- entry point ---------------------------------------------------------- */

/* Rank 0's `len` bytes at `blob` end up in every rank's `blob`.  `via`
 * receives a short description of the route for logs. */
static inline int rdv_share(const char *who, void *blob, size_t len, int rank, int world,
                            double timeout_s, char *via, size_t via_cap, tr_err *err)
{
    if (len > RDV_MAX_BLOB)
        return tr_fail(err, "%s: rendezvous blob of %zu bytes is too large", who, len);
    if (world <= 1) {
        snprintf(via, via_cap, "single rank");
        return TR_OK;
    }
    const char *master = getenv("TRAINRUN_MASTER");
    const char *file = getenv("TRAINRUN_RENDEZVOUS_FILE");
    if (master && master[0]) {
        char host[256], port[16];
        if (rdv_split_master(master, host, sizeof host, port, sizeof port) != 0)
            return tr_fail(err,
                           "%s: TRAINRUN_MASTER=%s is not host:port (e.g. node01:29500, or "
                           "[fe80::1]:29500)",
                           who, master);
        snprintf(via, via_cap, "TRAINRUN_MASTER %s", master);
        return rank == 0 ? rdv_tcp_serve(who, master, port, blob, len, world, timeout_s, err)
                         : rdv_tcp_fetch(who, master, host, port, blob, len, rank, world,
                                         timeout_s, err);
    }
    if (file && file[0]) {
        snprintf(via, via_cap, "TRAINRUN_RENDEZVOUS_FILE %s", file);
        return rdv_file_exchange(who, file, blob, len, rank, world, timeout_s, err);
    }
    return tr_fail(err,
                   "%s: %d ranks need a rendezvous: set TRAINRUN_MASTER=host:port (rank 0's "
                   "address and a free port) or TRAINRUN_RENDEZVOUS_FILE=path (on a filesystem "
                   "all ranks share), or launch with mpirun",
                   who, world);
}

#endif /* TRAINRUN_PLUGINS_COMM_RENDEZVOUS_H */

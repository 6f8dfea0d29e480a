#include "launch.h"

#include "../engine/run.h"
#include "../util/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Seconds the other ranks get to stop after one died, before SIGKILL. */
#define GRACE_SECONDS 10

static pid_t *children;
static int n_children;
static volatile sig_atomic_t forwarded;

static void forward(int sig)
{
    forwarded = sig;
    for (int i = 0; i < n_children; i++)
        if (children[i] > 0)
            kill(children[i], sig);
}

/* Whether `port` can be bound on the loopback now (it may still be taken
 * before rank 0 binds it: what the range below makes unlikely). */
static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0;
    close(fd);
    return ok;
}

/*
 * A free port on this machine for rank 0's rendezvous.  Not one the kernel
 * hands out itself: a port from the ephemeral range (what binding port 0
 * returns) can be given to any connect() or port-0 listener on the machine
 * -- another job's ranks, the tcp comm's links -- between this check and
 * rank 0's bind, which then fails with "address in use" (seen with two
 * multi-rank jobs started together).  So a port is drawn at random below
 * the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768 on
 * Linux by default), from 20000 up, and checked; port 0's answer is the
 * fallback.
 */
static int free_port(void)
{
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        int a, b;
        if (fscanf(f, "%d %d", &a, &b) == 2 && a > 21024)
            low = a;
        fclose(f);
    }
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 64; tries++) {
        int port = 20000 + (int)(rand_r(&seed) % (unsigned)(low - 20000));
        if (port_free(port))
            return port;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sin;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 &&
        getsockname(fd, (struct sockaddr *)&sin, &len) == 0)
        port = ntohs(sin.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void describe_status(int status, char *buf, size_t size)
{
    if (WIFSIGNALED(status))
        snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, size, "exited with code %d", WEXITSTATUS(status));
}

/* Where the ranks meet: $TRAINRUN_MASTER, else a free local port. */
static int choose_master(char *master, size_t size)
{
    const char *given = getenv("TRAINRUN_MASTER");
    if (given && *given) {
        snprintf(master, size, "%s", given);
        return 0;
    }
    int port = free_port();
    if (port < 0) {
        tr_log(TR_LOG_ERROR, "launch", "cannot find a free local port for the ranks to meet "
               "on (%s); set TRAINRUN_MASTER=127.0.0.1:<port>", strerror(errno));
        return -1;
    }
    snprintf(master, size, "127.0.0.1:%d", port);
    return 0;
}

/* In the child: rank i of `ranks` becomes this command again, with its
 * rank in the environment. */
static void exec_rank(int i, int ranks, const char *master, char *const *argv)
{
    char v[32];
    snprintf(v, sizeof v, "%d", i);
    setenv("TRAINRUN_RANK", v, 1);
    setenv("TRAINRUN_LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", ranks);
    setenv("TRAINRUN_WORLD_SIZE", v, 1);
    setenv("TRAINRUN_LOCAL_WORLD_SIZE", v, 1);
    setenv("TRAINRUN_MASTER", master, 1);
    /* CUDA's GPU r is then the r-th in PCI order, the one placement chose */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "trainrun: error: rank %d: cannot start %s: %s\n", i, argv[0],
            strerror(errno));
    _exit(TR_EXIT_ERROR);
}

/* The job's state while its ranks run. */
struct job {
    int ranks, left, preempted;
    int culprit, culprit_status, announced; /* the rank whose failure is the cause */
    double failed_at, kill_at;
};

/* A moment after the first failure: name the cause, stop the others. */
static void announce_failure(struct job *j)
{
    char how[96];
    describe_status(j->culprit_status, how, sizeof how);
    tr_log(TR_LOG_ERROR, "launch", "rank %d %s; stopping the job (%d other rank%s still "
           "running)", j->culprit, how, j->left, j->left == 1 ? "" : "s");
    j->announced = 1;
    forward(SIGTERM);
    j->kill_at = tr_now() + GRACE_SECONDS;
}

/* Child pid ended with status: a preemption, or a failure that may be the
 * cause (a rank killed by a signal before one that merely lost its peer). */
static void rank_ended(struct job *j, pid_t pid, int status)
{
    int rank = -1;
    for (int i = 0; i < j->ranks; i++)
        if (children[i] == pid)
            rank = i;
    if (rank < 0)
        return;
    children[rank] = -1;
    j->left--;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == TR_EXIT_OK)
        return;
    if (code == TR_EXIT_PREEMPTED) {
        j->preempted = 1;
        return;
    }
    if (!j->announced &&
        (j->culprit < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(j->culprit_status)))) {
        if (j->culprit < 0)
            j->failed_at = tr_now();
        j->culprit = rank;
        j->culprit_status = status;
    }
}

/* When a rank fails, the others soon fail too (their collectives lose it):
 * gather exits for a moment so the message names the cause. */
static void wait_ranks(struct job *j)
{
    for (int i = 0; i < j->ranks; i++)
        j->left += children[i] > 0;
    while (j->left > 0) {
        if (j->culprit >= 0 && !j->announced && tr_now() - j->failed_at >= 0.5)
            announce_failure(j);
        int status;
        pid_t pid = waitpid(-1, &status, j->culprit >= 0 ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) { /* after a failure: escalate when the others linger */
            if (j->announced && tr_now() >= j->kill_at) {
                tr_log(TR_LOG_WARN, "launch", "ranks still running %d s after the failure: "
                       "killing them", GRACE_SECONDS);
                forward(SIGKILL);
                j->kill_at = tr_now() + 3600;
            }
            usleep(20 * 1000);
            continue;
        }
        rank_ended(j, pid, status);
    }
    if (j->culprit >= 0 && !j->announced) { /* every rank ended within the moment */
        char how[96];
        describe_status(j->culprit_status, how, sizeof how);
        tr_log(TR_LOG_ERROR, "launch", "rank %d %s; the job failed", j->culprit, how);
    }
}

int tr_launch(int ranks, char *const *argv)
{
    char master[64];
    if (choose_master(master, sizeof master) != 0)
        return TR_EXIT_ERROR;
    children = tr_xcalloc((size_t)ranks, sizeof *children);
    n_children = ranks;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    fflush(NULL);
    for (int i = 0; i < ranks; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            tr_log(TR_LOG_ERROR, "launch", "cannot start rank %d: %s", i, strerror(errno));
            forward(SIGKILL);
            break;
        }
        if (pid == 0)
            exec_rank(i, ranks, master, argv);
        children[i] = pid;
    }
    tr_log(TR_LOG_INFO, "launch", "%d ranks on this machine, meeting at %s", ranks, master);

    struct job j = {.ranks = ranks, .culprit = -1};
    wait_ranks(&j);
    free(children);
    children = NULL;
    n_children = 0;
    if (j.culprit >= 0)
        return TR_EXIT_ERROR;
    return j.preempted ? TR_EXIT_PREEMPTED : TR_EXIT_OK;
}

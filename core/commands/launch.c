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

/* A free port on this machine for rank 0's rendezvous. */
static int free_port(void)
{
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

int tr_launch(int ranks, char *const *argv)
{
    char master[64];
    const char *given = getenv("TRAINRUN_MASTER");
    if (given && *given) {
        snprintf(master, sizeof master, "%s", given);
    } else {
        int port = free_port();
        if (port < 0) {
            tr_log(TR_LOG_ERROR, "launch", "cannot find a free local port for the ranks to meet "
                   "on (%s); set TRAINRUN_MASTER=127.0.0.1:<port>", strerror(errno));
            return TR_EXIT_ERROR;
        }
        snprintf(master, sizeof master, "127.0.0.1:%d", port);
    }
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
        if (pid == 0) {
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
        children[i] = pid;
    }
    tr_log(TR_LOG_INFO, "launch", "%d ranks on this machine, meeting at %s", ranks, master);

    /* When a rank fails, the others soon fail too (their collectives lose
     * it): gather exits for a moment so the message names the cause, a rank
     * killed by a signal before one that merely lost its peer. */
    int preempted = 0, left = 0, culprit = -1, culprit_status = 0, announced = 0;
    double failed_at = 0, kill_at = 0;
    for (int i = 0; i < ranks; i++)
        left += children[i] > 0;
    while (left > 0) {
        if (culprit >= 0 && !announced && tr_now() - failed_at >= 0.5) {
            char how[96];
            describe_status(culprit_status, how, sizeof how);
            tr_log(TR_LOG_ERROR, "launch", "rank %d %s; stopping the job (%d other rank%s still "
                   "running)", culprit, how, left, left == 1 ? "" : "s");
            announced = 1;
            forward(SIGTERM);
            kill_at = tr_now() + GRACE_SECONDS;
        }
        int status;
        pid_t pid = waitpid(-1, &status, culprit >= 0 ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) { /* after a failure: escalate when the others linger */
            if (announced && tr_now() >= kill_at) {
                tr_log(TR_LOG_WARN, "launch", "ranks still running %d s after the failure: "
                       "killing them", GRACE_SECONDS);
                forward(SIGKILL);
                kill_at = tr_now() + 3600;
            }
            usleep(20 * 1000);
            continue;
        }
        int rank = -1;
        for (int i = 0; i < ranks; i++)
            if (children[i] == pid)
                rank = i;
        if (rank < 0)
            continue;
        children[rank] = -1;
        left--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (code == TR_EXIT_OK)
            continue;
        if (code == TR_EXIT_PREEMPTED) {
            preempted = 1;
            continue;
        }
        if (!announced && (culprit < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(culprit_status)))) {
            if (culprit < 0)
                failed_at = tr_now();
            culprit = rank;
            culprit_status = status;
        }
    }
    if (culprit >= 0 && !announced) { /* every rank ended within the moment */
        char how[96];
        describe_status(culprit_status, how, sizeof how);
        tr_log(TR_LOG_ERROR, "launch", "rank %d %s; the job failed", culprit, how);
    }
    free(children);
    children = NULL;
    n_children = 0;
    if (culprit >= 0)
        return TR_EXIT_ERROR;
    return preempted ? TR_EXIT_PREEMPTED : TR_EXIT_OK;
}

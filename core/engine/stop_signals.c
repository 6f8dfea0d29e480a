#include "stop_signals.h"

#include <string.h>
#include <time.h>

static void stop_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGINT);
}

/* For a thread that has the signals unblocked (one started before
 * tr_stop_signals_start, or the caller after tr_stop_signals_end): the
 * signal still only sets the flag instead of killing the process. */
static volatile sig_atomic_t *handler_flag;

static void on_signal(int sig)
{
    if (handler_flag)
        *handler_flag = sig;
}

static void *take_signals(void *arg)
{
    struct tr_stop_signals *s = arg;
    sigset_t set;
    stop_set(&set);
    for (;;) {
        int sig;
        if (sigwait(&set, &sig) != 0)
            continue;
        /* end's wake-up (or a signal that came with it: the run is over) */
        if (__atomic_load_n(&s->ending, __ATOMIC_ACQUIRE))
            break;
        __atomic_store_n(s->flag, sig, __ATOMIC_RELEASE);
    }
    return NULL;
}

int tr_stop_signals_start(struct tr_stop_signals *s, volatile sig_atomic_t *flag, tr_err *err)
{
    memset(s, 0, sizeof *s);
    s->flag = flag;
    sigset_t set;
    stop_set(&set);
    int rc = pthread_sigmask(SIG_BLOCK, &set, &s->caller_mask);
    if (rc != 0)
        return tr_fail(err, "cannot block the stop signals: %s", strerror(rc));
    /* the disposition must not be SIG_IGN (a shell starts background jobs
     * with SIGINT ignored): a handler, which the run's threads never run */
    handler_flag = flag;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    rc = pthread_create(&s->thread, NULL, take_signals, s);
    if (rc != 0) {
        pthread_sigmask(SIG_SETMASK, &s->caller_mask, NULL);
        return tr_fail(err, "cannot start the thread that takes stop signals: %s", strerror(rc));
    }
    pthread_setname_np(s->thread, "trainrun-signal"); /* top -H, /proc/PID/task/TID/comm */
    s->running = 1;
    return TR_OK;
}

void tr_stop_signals_end(struct tr_stop_signals *s)
{
    if (!s->running)
        return;
    __atomic_store_n(&s->ending, 1, __ATOMIC_RELEASE);
    pthread_kill(s->thread, SIGTERM);
    pthread_join(s->thread, NULL);
    s->running = 0;
    /* signals that came after the thread returned are pending here */
    sigset_t set;
    stop_set(&set);
    struct timespec now = {0, 0};
    int sig;
    while ((sig = sigtimedwait(&set, NULL, &now)) > 0)
        *s->flag = sig;
    pthread_sigmask(SIG_SETMASK, &s->caller_mask, NULL);
}

/*
 * The stop signals of a training run (SIGTERM, SIGUSR1, SIGINT), taken by
 * one thread of their own, so that no signal handler ever runs on a thread
 * that computes.
 *
 * A handler runs on whichever thread the kernel picks, at whatever
 * instruction that thread is, with its frame (the registers and the vector
 * state: about 1 KiB with AVX2, 2.5 KiB and more with AVX-512) written below
 * that thread's stack pointer.  oneDNN's AVX and AVX-512 f32 GEMM kernels
 * point the stack pointer at a workspace on the heap while they run (when
 * K is above 252 on AVX2), so a signal handled there writes into the heap
 * below the workspace: free() aborts later ("corrupted size vs. prev_size",
 * "double free"), or the run dies of SIGSEGV or hangs.  However small the
 * handler, it is the delivery that does the damage.
 *
 * So tr_stop_signals_start blocks the stop signals in the calling thread
 * before the run starts any other, and every thread started after inherits
 * the mask: OpenMP's, the loader's workers, the checkpoint writer, the
 * communication thread, a plugin's.  One thread waits for the signals
 * (sigwait) and only stores the signal's number in the flag, which the
 * step loop and the loader read.  A second signal changes nothing.
 *
 * Threads that exist before the call keep their mask (trainrun's run
 * command has none then).  A process a plugin starts during the run
 * inherits the blocked mask across exec: unblock it in the child.
 */
#ifndef TR_STOP_SIGNALS_H
#define TR_STOP_SIGNALS_H

#include <pthread.h>
#include <signal.h>

#include "../util/util.h"

struct tr_stop_signals {
    volatile sig_atomic_t *flag; /* set to the number of the signal taken */
    sigset_t caller_mask;        /* the calling thread's mask, put back by end */
    pthread_t thread;
    int ending;  /* end asked the thread to return (atomic) */
    int running; /* the thread was started */
};

/* Block SIGTERM, SIGUSR1 and SIGINT in the calling thread (and so in every
 * thread it starts from now on) and start the thread that takes them.
 * TR_OK, or TR_ERROR with the mask as it was. */
int tr_stop_signals_start(struct tr_stop_signals *s, volatile sig_atomic_t *flag, tr_err *err);

/* Stop taking them: the thread returns, a signal that came meanwhile still
 * sets the flag, and the calling thread's mask is what it was before start.
 * Safe on a struct that start failed on or was never given (zeroed). */
void tr_stop_signals_end(struct tr_stop_signals *s);

#endif

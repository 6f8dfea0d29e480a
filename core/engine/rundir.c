/* One writer per run directory: rank 0 holds run_dir/trainrun.lock for as
 * long as it runs, and a fresh run refuses a directory that holds an
 * earlier one instead of mixing their metrics and checkpoints. */
#include "run_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The command line of this process, for the lock's note on who holds it. */
static void command_line(char *buf, size_t size)
{
    snprintf(buf, size, "trainrun");
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f)
        return;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i + 1 < n; i++) /* arguments are NUL-separated */
        if (!buf[i])
            buf[i] = ' ';
}

/* run_dir/trainrun.lock is flock()ed by the one process that writes the run
 * (rank 0) for as long as it runs.  The kernel drops a flock when its holder
 * ends, however it ends, so a crash or a SIGKILL leaves nothing stuck; the
 * file's text only names the holder for the message a second process gets.
 * Readers (report, export, sample) take no lock. */
int tr_run_lock(struct run *r, tr_err *err)
{
    const char *dir = r->cfg->run_dir;
    if (tr_mkdir_p(dir) != 0)
        return tr_fail(err, "cannot create the run directory %s: %s", dir, strerror(errno));
    char *path = tr_xasprintf("%s/trainrun.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        int rc = tr_fail(err, "cannot create %s: %s; check the permissions of %s or set run_dir=",
                         path, strerror(errno), dir);
        free(path);
        return rc;
    }
    /* a holder killed a moment ago (a job restarted right after kill -9)
     * may still be exiting: its lock goes with it within milliseconds, so
     * try for a second before naming it */
    int e = 0;
    for (int tries = 0;; tries++) {
        e = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
        if (e != EWOULDBLOCK || tries == 19)
            break;
        usleep(50 * 1000);
    }
    if (e != 0) {
        if (e == EWOULDBLOCK) {
            char holder[1024];
            ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = 0;
            holder[strcspn(holder, "\n")] = 0;
            close(fd);
            free(path);
            return tr_fail(err, "run directory %s is in use by another trainrun (%s); wait for it "
                           "to finish or stop it, or give this run its own directory (run_dir=...)",
                           dir, *holder ? holder : "its details are not written yet");
        }
        /* a file system without locks (some network mounts): run unguarded */
        tr_log(TR_LOG_WARN, NULL, "cannot lock %s: %s; nothing stops a second run from writing "
               "to %s at the same time", path, strerror(e), dir);
        close(fd);
        free(path);
        return TR_OK;
    }
    char host[256] = "?", started[64] = "?", cmd[512];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S UTC", &tm);
    command_line(cmd, sizeof cmd);
    char *note = tr_xasprintf("pid %ld on %s, started %s: %s\n", (long)getpid(), host, started, cmd);
    /* the note is a courtesy: failing to write it does not stop the run */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, note, strlen(note), 0) < 0)
        tr_log(TR_LOG_WARN, NULL, "cannot write %s: %s", path, strerror(errno));
    free(note);
    free(path);
    r->lock_fd = fd;
    r->have_lock = 1;
    return TR_OK;
}

/* A fresh start in a run directory that holds an earlier run would cut its
 * metrics.jsonl and write new checkpoints among its old ones (a later
 * --resume auto would then pick the newest of either run): refuse, and say
 * how to continue it or where else to start. */
int tr_run_refuse_earlier(const struct run *r, tr_err *err)
{
    char *path = tr_xasprintf("%s/metrics.jsonl", r->cfg->run_dir);
    struct stat st;
    int used = stat(path, &st) == 0 && st.st_size > 0;
    free(path);
    if (!used)
        return TR_OK;
    const char *dir = r->cfg->run_dir;
    return tr_fail(err, "%s holds an earlier run (%s/metrics.jsonl and its checkpoints): continue "
                   "it with --resume auto, or start this one in a directory of its own "
                   "(run_dir=...); to start over here, remove %s first", dir, dir, dir);
}

void tr_run_unlock(struct run *r)
{
    if (!r->have_lock)
        return;
    close(r->lock_fd); /* releases the lock */
    r->have_lock = 0;
}

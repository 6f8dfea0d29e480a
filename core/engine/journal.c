/* What a run writes about itself (journal.h): metrics.jsonl (whole lines
 * or a stop), what the logger plugins write (the same numbers, named as in
 * metrics.jsonl), trace.json, and the progress, validation and summary
 * lines on stderr.  Every number comes from the loop's read-only view. */
#include "journal.h"

#include "plugin_calls.h"
#include "policies.h"
#include "../config/plugin.h"
#include "../config/recipe.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

/* ---- metrics.jsonl: whole lines or a stop ---------------------------------- */

/* A write to the run directory failed: the message names the file, the
 * reason and what to do; checkpoints already written are not touched. */
static int write_failed(const struct tr_journal *j, uint64_t step, const char *path, int errnum,
                        tr_err *err)
{
    int full = errnum == ENOSPC || errnum == EDQUOT;
    return tr_fail(err, "cannot write %s: %s: %s %s or set run_dir= to a disk with room; the run "
                   "stops at step %llu and its last saved checkpoint is kept (--resume auto "
                   "continues from it)", path, strerror(errnum),
                   full ? "free space on the disk of" : "check the disk of", j->cfg->run_dir,
                   (unsigned long long)step);
}

/* write(2) until done: 0, or -1 with errno and *done the bytes that landed. */
static int write_all(int fd, const char *buf, size_t len, size_t *done)
{
    *done = 0;
    while (*done < len) {
        ssize_t n = write(fd, buf + *done, len - *done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            return -1;
        }
        *done += (size_t)n;
    }
    return 0;
}

static void metrics_drop(struct tr_journal *j)
{
    if (j->metrics_open)
        close(j->metrics_fd);
    j->metrics_open = 0;
}

int tr_journal_trace_failed(const struct tr_journal *j, const struct tr_loop *l, int errnum,
                            tr_err *err)
{
    char *path = tr_xasprintf("%s/trace.json", j->cfg->run_dir);
    write_failed(j, l->step, path, errnum, err);
    free(path);
    size_t len = strlen(err->msg); /* the trace alone can be given up */
    snprintf(err->msg + len, sizeof err->msg - len, "; train.trace_every=0 writes no trace");
    return TR_ERROR;
}

/* After a failed write: cut the torn line (readers would take it for
 * damage), close, and say why. */
static int metrics_failed(struct tr_journal *j, uint64_t step, int errnum, tr_err *err)
{
    if (ftruncate(j->metrics_fd, j->metrics_good) != 0)
        tr_log(TR_LOG_WARN, NULL, "%s may end in a torn line: %s", j->metrics_path, strerror(errno));
    metrics_drop(j);
    return write_failed(j, step, j->metrics_path, errnum, err);
}

/* One line of metrics.jsonl, written whole with one write(2) (readers see
 * whole lines during the run; a kill loses nothing written): a full disk
 * stops the run rather than leave a silent gap in its record.  No stdio
 * buffer stands between the line and the error. */
static int metrics_line(struct tr_journal *j, uint64_t step, tr_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int metrics_line(struct tr_journal *j, uint64_t step, tr_err *err, const char *fmt, ...)
{
    if (!j->metrics_open)
        return TR_OK;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line)
        return tr_fail(err, "internal error: a metrics line of %d bytes", n);
    size_t done;
    if (write_all(j->metrics_fd, line, (size_t)n, &done) != 0)
        return metrics_failed(j, step, errno, err);
    j->metrics_good += (off_t)n;
    return TR_OK;
}

/* Appending after a run that died mid-line: drop the torn line (it is no
 * record, and a record after it would make the file unreadable). */
static int end_line(struct tr_journal *j, uint64_t step, tr_err *err)
{
    char tail[65536];
    off_t size = j->metrics_good, from = size > (off_t)sizeof tail ? size - (off_t)sizeof tail : 0;
    ssize_t n = pread(j->metrics_fd, tail, (size_t)(size - from), from);
    if (n <= 0 || tail[n - 1] == '\n')
        return TR_OK;
    ssize_t i = n - 1;
    while (i >= 0 && tail[i] != '\n')
        i--;
    if (i < 0 && from > 0) /* a line longer than the tail: none of ours; end it, keep it */
        return metrics_line(j, step, err, "\n");
    off_t keep = from + i + 1;
    if (ftruncate(j->metrics_fd, keep) != 0)
        return write_failed(j, step, j->metrics_path, errno, err);
    tr_log(TR_LOG_WARN, NULL, "%s ended in a torn line (%lld bytes, from a run that was killed "
           "mid-write); dropped it", j->metrics_path, (long long)(size - keep));
    j->metrics_good = keep;
    return TR_OK;
}


/* ---- the logger plugins ---------------------------------------------------- */

/* A logger's error names it and the recipe line that chose it; the run
 * stops, as it does when metrics.jsonl cannot be written. */
static int logger_failed(uint64_t step, const struct tr_slot *slot, tr_err *err)
{
    char where[600];
    tr_origin_format(&slot->origin, where, sizeof where);
    tr_err_prefix(err, "%s: logger '%s'", where, slot->plugin->info->name);
    size_t len = strlen(err->msg);
    snprintf(err->msg + len, sizeof err->msg - len, " (the run stops at step %llu; its last "
             "checkpoint is kept)", (unsigned long long)step);
    return TR_ERROR;
}

/* rank 0: create and open each logger of the recipe's logger list */
static int open_loggers(struct tr_journal *j, uint64_t step, int resume, tr_err *err)
{
    struct tr_config *cfg = (struct tr_config *)j->cfg; /* creating a slot fills it in */
    for (int i = 0; i < cfg->n_loggers; i++) {
        struct tr_slot *slot = &cfg->loggers[i];
        if (tr_config_create_slot(cfg, slot, 0, err) != TR_OK)
            return TR_ERROR;
        if (tr_logger_open(slot, resume, err) != TR_OK) {
            j->loggers_open = i + 1; /* closed with the others */
            return logger_failed(step, slot, err);
        }
        j->loggers_open = i + 1;
        /* what ran, for loggers that keep run metadata beside the numbers */
        const char *meta[][2] = {{"trainrun_version", PACKAGE_VERSION},
                                 {"run", cfg->name},
                                 {"recipe", tr_recipe_path(cfg->recipe)}};
        for (size_t k = 0; k < TR_ARRAY_LEN(meta); k++)
            if (tr_logger_text(slot, step, meta[k][0], meta[k][1], err) != TR_OK)
                return logger_failed(step, slot, err);
    }
    return TR_OK;
}

/* The same numbers metrics.jsonl's line holds, to every logger. */
static int log_scalars(struct tr_journal *j, uint64_t step, const struct tr_scalar *v, size_t n,
                       tr_err *err)
{
    for (int i = 0; i < j->loggers_open; i++)
        if (tr_logger_scalars(&j->cfg->loggers[i], step, v, n, err) != TR_OK)
            return logger_failed(step, &j->cfg->loggers[i], err);
    return TR_OK;
}

static int flush_loggers(struct tr_journal *j, uint64_t step, tr_err *err)
{
    for (int i = 0; i < j->loggers_open; i++)
        if (tr_logger_flush(&j->cfg->loggers[i], err) != TR_OK)
            return logger_failed(step, &j->cfg->loggers[i], err);
    return TR_OK;
}

/* The end of the run: each logger's close, all of them even after an error
 * (the first error is the one reported). */
static int close_loggers(struct tr_journal *j, uint64_t step, tr_err *err)
{
    int rc = TR_OK;
    for (int i = 0; i < j->loggers_open; i++) {
        tr_err e = {{0}};
        if (tr_logger_close(&j->cfg->loggers[i], &e) != TR_OK && rc == TR_OK) {
            rc = logger_failed(step, &j->cfg->loggers[i], &e);
            *err = e;
        }
    }
    j->loggers_open = 0;
    return rc;
}

/* metrics.jsonl: appended to when resuming, else started afresh */
static int open_jsonl(struct tr_journal *j, uint64_t step, int resume, tr_err *err)
{
    j->metrics_path = tr_xasprintf("%s/metrics.jsonl", j->cfg->run_dir);
    /* read too: a resumed run checks how the file ends */
    int fd = open(j->metrics_path, O_RDWR | O_CREAT | O_CLOEXEC | O_APPEND | (resume ? 0 : O_TRUNC),
                  0666);
    if (fd < 0) {
        tr_log(TR_LOG_WARN, NULL, "cannot write %s: %s; no metrics this run", j->metrics_path,
               strerror(errno));
        return TR_OK;
    }
    j->metrics_fd = fd;
    j->metrics_open = 1;
    off_t end = lseek(fd, 0, SEEK_END);
    j->metrics_good = end > 0 ? end : 0;
    return j->metrics_good > 0 ? end_line(j, step, err) : TR_OK;
}

/* At the end of the run: everything synced and closed, or an error. */
static int metrics_close(struct tr_journal *j, uint64_t step, tr_err *err)
{
    if (!j->metrics_open)
        return TR_OK;
    if (fsync(j->metrics_fd) != 0)
        return metrics_failed(j, step, errno, err);
    j->metrics_open = 0;
    return close(j->metrics_fd) == 0 ? TR_OK : write_failed(j, step, j->metrics_path, errno, err);
}

/* A resumed run writes a trace of its own: the earlier one's trace.json
 * moves aside to trace-1.json, trace-2.json, ... instead of being cut. */
static void keep_earlier_trace(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0)
        return;
    size_t len = strlen(path) - strlen(".json");
    for (int i = 1; i < 10000; i++) {
        char *aside = tr_xasprintf("%.*s-%d.json", (int)len, path, i);
        int taken = stat(aside, &st) == 0;
        if (!taken && rename(path, aside) != 0)
            tr_log(TR_LOG_WARN, "trace", "cannot move %s to %s: %s; it is overwritten", path,
                   aside, strerror(errno));
        free(aside);
        if (!taken)
            return;
    }
}

int tr_journal_open(struct tr_journal *j, const struct tr_loop *l, int resume, tr_err *err)
{
    const struct tr_config *cfg = l->s->cfg;
    memset(j, 0, sizeof *j);
    j->cfg = cfg;
    if (open_jsonl(j, l->step, resume, err) != TR_OK || open_loggers(j, l->step, resume, err) != TR_OK)
        return TR_ERROR;
    if (cfg->train.trace_every > 0) {
        char *path = tr_xasprintf("%s/trace.json", cfg->run_dir);
        if (resume)
            keep_earlier_trace(path);
        j->trace = tr_trace_open(path, l->t_start);
        free(path);
    }
    return TR_OK;
}

int tr_journal_close(struct tr_journal *j, const struct tr_loop *l, tr_err *err)
{
    struct tr_trace *trace = j->trace;
    j->trace = NULL;
    int rc = metrics_close(j, l->step, err);
    tr_err lerr = {{0}};
    if (close_loggers(j, l->step, &lerr) != TR_OK && rc == TR_OK) {
        *err = lerr;
        rc = TR_ERROR;
    }
    int e = tr_trace_close(trace);
    if (e && rc == TR_OK)
        rc = tr_journal_trace_failed(j, l, e, err);
    return rc;
}

void tr_journal_drop(struct tr_journal *j)
{
    metrics_drop(j);
    free(j->metrics_path);
    j->metrics_path = NULL;
    tr_trace_close(j->trace);
    j->trace = NULL;
}

/* The progress line's and metrics.jsonl's numbers. */
struct step_numbers {
    double elapsed, eta, wait, tok_s, mfu, dollars, projected, loss_scale;
    double comm; /* with ranks: % of the step waiting for collectives (not hidden); else NaN */
};

static struct step_numbers step_numbers(const struct tr_loop *l)
{
    const struct tr_session *s = l->s;
    const struct tr_config *cfg = s->cfg;
    struct step_numbers n;
    n.elapsed = tr_now() - l->t_start;
    uint64_t steps = (uint64_t)cfg->train.steps, done = l->step - l->first_step;
    double per_step = n.elapsed / (double)(done ? done : 1);
    n.eta = per_step * (double)(steps - l->step);
    if (cfg->train.time > 0 && cfg->train.time - n.elapsed < n.eta) /* the clock ends it first */
        n.eta = cfg->train.time - n.elapsed > 0 ? cfg->train.time - n.elapsed : 0;
    double total = l->t_data + l->t_compute + l->t_optimizer;
    n.wait = total > 0 ? 100.0 * l->t_data / total : 0;
    n.comm = s->world > 1 && total + l->t_comm > 0 ? 100.0 * l->t_comm / (total + l->t_comm) : NAN;
    n.tok_s = l->tokens / (n.elapsed > 0 ? n.elapsed : 1);
    n.mfu = s->peak_flops > 0 ? n.tok_s * s->flops_per_token / s->peak_flops : NAN;
    n.dollars = l->cost_before + tr_loop_spent(l);
    n.projected = n.dollars + n.eta * s->usd_per_second;
    n.loss_scale = tr_precision_loss_scale(&cfg->precision);
    return n;
}

static void progress_line(const struct tr_loop *l, const struct step_numbers *n)
{
    const struct tr_config *cfg = l->s->cfg;
    char extra[96] = "";
    if (!isnan(n->mfu))
        snprintf(extra, sizeof extra, " | MFU %.1f%%", 100 * n->mfu);
    if (l->s->usd_per_second > 0) {
        size_t len = strlen(extra);
        snprintf(extra + len, sizeof extra - len, " | $%.2f of ~$%.2f", n->dollars, n->projected);
    }
    char of[32] = ""; /* no total when train.time alone sets the length */
    if (cfg->train.length_from != TR_LENGTH_TIME)
        snprintf(of, sizeof of, "/%llu", (unsigned long long)cfg->train.steps);
    fprintf(stderr, "step %6llu%s | loss %.4f | lr %.3g | norm %.3f | %.0f tok/s%s | data wait %.1f%% | ETA %.0fs\n",
            (unsigned long long)l->step, of, l->loss, l->lr, l->grad_norm, n->tok_s, extra, n->wait,
            n->eta);
}

int tr_journal_step(struct tr_journal *j, const struct tr_loop *l, tr_err *err)
{
    struct step_numbers n = step_numbers(l);
    if (!l->quiet)
        progress_line(l, &n);
    /* the loggers get what is known: no MFU without a peak (metrics.jsonl's
     * -1), no dollars without a price (its 0) */
    struct tr_scalar v[20];
    size_t nv = 0;
    v[nv++] = (struct tr_scalar){"loss", l->loss};
    v[nv++] = (struct tr_scalar){"lr", l->lr};
    v[nv++] = (struct tr_scalar){"grad_norm", l->grad_norm};
    v[nv++] = (struct tr_scalar){"tokens_per_s", n.tok_s};
    if (!isnan(n.mfu))
        v[nv++] = (struct tr_scalar){"mfu", n.mfu};
    v[nv++] = (struct tr_scalar){"data_wait_pct", n.wait};
    if (!isnan(n.comm))
        v[nv++] = (struct tr_scalar){"comm_wait_pct", n.comm};
    if (!isnan(l->gathered))
        v[nv++] = (struct tr_scalar){"gathered_bytes", l->gathered};
    if (!isnan(l->offload_update))
        v[nv++] = (struct tr_scalar){"offload_update_s", l->offload_update};
    if (!isnan(l->offload_wait))
        v[nv++] = (struct tr_scalar){"offload_wait_s", l->offload_wait};
    if (!isnan(l->pipe_idle))
        v[nv++] = (struct tr_scalar){"pipeline_idle_pct", 100 * l->pipe_idle};
    if (!isnan(l->pipe_idle_sim))
        v[nv++] = (struct tr_scalar){"pipeline_idle_sim_pct", 100 * l->pipe_idle_sim};
    if (!isnan(l->pipe_idle_chunks))
        v[nv++] = (struct tr_scalar){"pipeline_idle_sim_chunks_pct", 100 * l->pipe_idle_chunks};
    v[nv++] = (struct tr_scalar){"loss_scale", n.loss_scale};
    v[nv++] = (struct tr_scalar){"skipped_steps", (double)l->skipped};
    if (l->s->usd_per_second > 0) {
        v[nv++] = (struct tr_scalar){"cost_usd", n.dollars};
        v[nv++] = (struct tr_scalar){"cost_projected_usd", n.projected};
    }
    v[nv++] = (struct tr_scalar){"elapsed_s", n.elapsed};
    if (log_scalars(j, l->step, v, nv, err) != TR_OK)
        return TR_ERROR;
    /* the process's CPU time, every thread's, beside the wall clock: what a
     * step costs the cores rather than how long it waited for them (the
     * figure to compare on a shared machine) */
    struct timespec cpu;
    double cpu_s = clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0
                       ? (double)cpu.tv_sec + 1e-9 * (double)cpu.tv_nsec
                       : -1;
    char comm[320] = ""; /* with ranks, sharding, stages or offload only */
    if (!isnan(n.comm))
        snprintf(comm, sizeof comm, ", \"comm_wait_pct\": %.2f", n.comm);
    if (!isnan(l->gathered)) {
        size_t len = strlen(comm);
        snprintf(comm + len, sizeof comm - len, ", \"gathered_bytes\": %.0f", l->gathered);
    }
    if (!isnan(l->offload_update)) {
        size_t len = strlen(comm);
        snprintf(comm + len, sizeof comm - len, ", \"offload_update_s\": %.4f", l->offload_update);
    }
    if (!isnan(l->offload_wait)) {
        size_t len = strlen(comm);
        snprintf(comm + len, sizeof comm - len, ", \"offload_wait_s\": %.4f", l->offload_wait);
    }
    if (!isnan(l->pipe_idle)) {
        size_t len = strlen(comm);
        snprintf(comm + len, sizeof comm - len, ", \"pipeline_idle_pct\": %.2f", 100 * l->pipe_idle);
    }
    if (!isnan(l->pipe_idle_sim)) {
        size_t len = strlen(comm);
        snprintf(comm + len, sizeof comm - len, ", \"pipeline_idle_sim_pct\": %.2f",
                 100 * l->pipe_idle_sim);
    }
    if (!isnan(l->pipe_idle_chunks)) {
        size_t len = strlen(comm);
        snprintf(comm + len, sizeof comm - len, ", \"pipeline_idle_sim_chunks_pct\": %.2f",
                 100 * l->pipe_idle_chunks);
    }
    return metrics_line(j, l->step, err,
                "{\"step\": %llu, \"loss\": %.6g, \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f, "
                "\"mfu\": %.4g, \"data_wait_pct\": %.2f%s, \"loss_scale\": %.6g, \"skipped_steps\": %llu, "
                "\"cost_usd\": %.6g, \"cost_projected_usd\": %.6g, \"elapsed_s\": %.3f, \"cpu_s\": %.3f}\n",
                (unsigned long long)l->step, l->loss, l->lr, l->grad_norm, n.tok_s,
                isnan(n.mfu) ? -1.0 : n.mfu, n.wait, comm, n.loss_scale,
                (unsigned long long)l->skipped, n.dollars, n.projected, n.elapsed, cpu_s);
}

int tr_journal_eval(struct tr_journal *j, const struct tr_loop *l, tr_err *err)
{
    /* text data: the loss per byte too, which compares across tokenizers (a token of a
     * larger vocabulary holds more text, so its loss per token is higher) */
    double bpt = l->s->data.info.bytes_per_token[TR_SPLIT_VAL];
    char per_byte[64] = "", per_byte_json[64] = "";
    if (bpt > 0) {
        snprintf(per_byte, sizeof per_byte, " nats/token (%.4f nats/byte)", l->val_loss / bpt);
        snprintf(per_byte_json, sizeof per_byte_json, ", \"val_loss_per_byte\": %.6g",
                 l->val_loss / bpt);
    }
    if (!l->quiet)
        fprintf(stderr, "step %6llu | validation loss %.4f%s | accuracy %.2f%%\n",
                (unsigned long long)l->step, l->val_loss, per_byte, 100 * l->val_accuracy);
    struct tr_scalar v[3] = {{"val_loss", l->val_loss}};
    size_t nv = 1;
    if (!isnan(l->val_accuracy))
        v[nv++] = (struct tr_scalar){"val_accuracy", l->val_accuracy};
    if (bpt > 0)
        v[nv++] = (struct tr_scalar){"val_loss_per_byte", l->val_loss / bpt};
    if (log_scalars(j, l->step, v, nv, err) != TR_OK || flush_loggers(j, l->step, err) != TR_OK)
        return TR_ERROR;
    return metrics_line(j, l->step, err, "{\"step\": %llu, \"val_loss\": %.6g, \"val_accuracy\": %.6g%s}\n",
                        (unsigned long long)l->step, l->val_loss,
                        isnan(l->val_accuracy) ? -1.0 : l->val_accuracy, per_byte_json);
}

/* The summary's advice when the step waited for data: no loader threads
 * yet, or more of them; shards only for text, the one source `trainrun
 * prepare` reads. */
static void data_wait_advice(const struct tr_loop *l)
{
    const struct tr_train_config *t = &l->s->cfg->train;
    char advice[160];
    if (t->workers == 0)
        snprintf(advice, sizeof advice, "train.workers = 0 reads the data in the step loop: "
                 "set train.workers = 2 or more");
    else
        snprintf(advice, sizeof advice, "raise train.workers (now %lld) or train.prefetch "
                 "(now %lld)", (long long)t->workers, (long long)t->prefetch);
    fprintf(stderr, "  warning: the step waited for data %.1f%% of the time: %s%s\n",
            100 * l->t_data / (l->t_data + l->t_compute), advice,
            strcmp(l->s->data.name, "text") == 0 ? ", or prepare the text into token shards "
                                                   "(trainrun prepare)" : "");
}

void tr_journal_summary(const struct tr_loop *l, double elapsed, double t_checkpoint)
{
    const struct tr_config *cfg = l->s->cfg;
    double usd = l->s->usd_per_second;
    double parts = l->t_data + l->t_compute + l->t_optimizer + l->t_comm + l->t_eval + t_checkpoint;
    double other = elapsed > parts ? elapsed - parts : 0;
    fprintf(stderr, "\nrun %s: %llu steps in %.1f s, %.0f tokens/s\n", cfg->name,
            (unsigned long long)l->step, elapsed, l->tokens / (elapsed > 0 ? elapsed : 1));
    fprintf(stderr, "  final train loss %.4f", l->loss);
    if (!isnan(l->val_loss))
        fprintf(stderr, ", validation loss %.4f, accuracy %.2f%%", l->val_loss,
                100 * l->val_accuracy);
    fprintf(stderr, "\n  time: data wait %.1f%%, forward+backward %.1f%%, optimizer %.1f%%, "
                    "communication %.1f%%, evaluation %.1f%%, checkpoint %.1f%%, other %.1f%%\n",
            100 * l->t_data / elapsed, 100 * l->t_compute / elapsed, 100 * l->t_optimizer / elapsed,
            100 * l->t_comm / elapsed, 100 * l->t_eval / elapsed, 100 * t_checkpoint / elapsed,
            100 * other / elapsed);
    if (l->rss_train_mib > 0)
        fprintf(stderr, "  memory: peak RSS %.0f MiB training, %.0f MiB with the final checkpoint "
                        "(this process%s)\n", l->rss_train_mib, tr_peak_rss_mib(),
                l->s->world > 1 ? ", rank 0" : "");
    if (usd > 0)
        fprintf(stderr, "  cost: $%.2f this run, $%.2f in all\n", tr_loop_spent(l),
                l->cost_before + tr_loop_spent(l));
    if (l->skipped)
        fprintf(stderr, "  %llu steps skipped for non-finite gradients\n", (unsigned long long)l->skipped);
    if (l->empty_steps)
        fprintf(stderr, "  %llu steps without an update: every target of their batch was masked\n",
                (unsigned long long)l->empty_steps);
    if (l->best[0])
        fprintf(stderr, "  best validation loss %.4f at step %llu (checkpoint %s)\n", l->best_val,
                (unsigned long long)l->best_step, l->best);
    if (l->stopped_early) {
        uint64_t saved = (uint64_t)cfg->train.steps - l->stopped_early;
        double per_step = elapsed / (double)(l->step ? l->step : 1);
        fprintf(stderr, "  early stopping saved %llu of %lld steps (about %.0f s at %.3f s/step",
                (unsigned long long)saved, (long long)cfg->train.steps, per_step * (double)saved,
                per_step);
        if (usd > 0)
            fprintf(stderr, ", $%.2f", per_step * (double)saved * usd);
        fprintf(stderr, ")\n");
    }
    if (l->t_data > 0.05 * (l->t_data + l->t_compute))
        data_wait_advice(l);
}

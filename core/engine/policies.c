/* The policies at the end of a step, one function each, and what a run
 * writes about itself.  tr_train (run.c) calls them in this order after
 * every optimizer step:
 *
 *   tr_policy_log         progress line, metrics.jsonl and the logger plugins,
 *                         every train.log_every
 *   tr_policy_budget      cost.budget: warn at cost.warn_at, stop at the budget
 *   tr_policy_evaluate    validation every train.eval_every, then the schedule's
 *                         observe, early stopping and keep-best
 *   tr_policy_checkpoint  checkpoint.every, a new best, the run's last step
 *   tr_policy_stop        the budget or early stopping ends the run here
 *
 * Preemption (a signal) and the end of the run are phases of run.c.  The
 * files a run writes: metrics.jsonl (whole lines or a stop), what the logger
 * plugins write (logger = { "csv", "tensorboard" }: the same numbers, named
 * as in metrics.jsonl), trace.json and the summary on stderr. */
#include "run.h"
#include "run_internal.h"

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
static int write_failed(const struct run *r, const char *path, int errnum, tr_err *err)
{
    int full = errnum == ENOSPC || errnum == EDQUOT;
    return tr_fail(err, "cannot write %s: %s: %s %s or set run_dir= to a disk with room; the run "
                   "stops at step %llu and its last saved checkpoint is kept (--resume auto "
                   "continues from it)", path, strerror(errnum),
                   full ? "free space on the disk of" : "check the disk of", r->cfg->run_dir,
                   (unsigned long long)r->step);
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

void tr_run_metrics_drop(struct run *r)
{
    if (r->metrics_open)
        close(r->metrics_fd);
    r->metrics_open = 0;
}

int tr_run_trace_failed(const struct run *r, int errnum, tr_err *err)
{
    char *path = tr_xasprintf("%s/trace.json", r->cfg->run_dir);
    write_failed(r, path, errnum, err);
    free(path);
    size_t len = strlen(err->msg); /* the trace alone can be given up */
    snprintf(err->msg + len, sizeof err->msg - len, "; train.trace_every=0 writes no trace");
    return TR_ERROR;
}

/* After a failed write: cut the torn line (readers would take it for
 * damage), close, and say why. */
static int metrics_failed(struct run *r, int errnum, tr_err *err)
{
    if (ftruncate(r->metrics_fd, r->metrics_good) != 0)
        tr_log(TR_LOG_WARN, NULL, "%s may end in a torn line: %s", r->metrics_path, strerror(errno));
    tr_run_metrics_drop(r);
    return write_failed(r, r->metrics_path, errnum, err);
}

/* One line of metrics.jsonl, written whole with one write(2) (readers see
 * whole lines during the run; a kill loses nothing written): a full disk
 * stops the run rather than leave a silent gap in its record.  No stdio
 * buffer stands between the line and the error. */
static int metrics_line(struct run *r, tr_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int metrics_line(struct run *r, tr_err *err, const char *fmt, ...)
{
    if (!r->metrics_open)
        return TR_OK;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line)
        return tr_fail(err, "internal error: a metrics line of %d bytes", n);
    size_t done;
    if (write_all(r->metrics_fd, line, (size_t)n, &done) != 0)
        return metrics_failed(r, errno, err);
    r->metrics_good += (off_t)n;
    return TR_OK;
}

/* Appending after a run that died mid-line: drop the torn line (it is no
 * record, and a record after it would make the file unreadable). */
static int end_line(struct run *r, tr_err *err)
{
    char tail[65536];
    off_t size = r->metrics_good, from = size > (off_t)sizeof tail ? size - (off_t)sizeof tail : 0;
    ssize_t n = pread(r->metrics_fd, tail, (size_t)(size - from), from);
    if (n <= 0 || tail[n - 1] == '\n')
        return TR_OK;
    ssize_t i = n - 1;
    while (i >= 0 && tail[i] != '\n')
        i--;
    if (i < 0 && from > 0) /* a line longer than the tail: none of ours; end it, keep it */
        return metrics_line(r, err, "\n");
    off_t keep = from + i + 1;
    if (ftruncate(r->metrics_fd, keep) != 0)
        return write_failed(r, r->metrics_path, errno, err);
    tr_log(TR_LOG_WARN, NULL, "%s ended in a torn line (%lld bytes, from a run that was killed "
           "mid-write); dropped it", r->metrics_path, (long long)(size - keep));
    r->metrics_good = keep;
    return TR_OK;
}

static int open_jsonl(struct run *r, int resume, tr_err *err);

/* ---- the logger plugins ---------------------------------------------------- */

/* A logger's error names it and the recipe line that chose it; the run
 * stops, as it does when metrics.jsonl cannot be written. */
static int logger_failed(const struct run *r, const struct tr_slot *slot, tr_err *err)
{
    char where[600];
    tr_origin_format(&slot->origin, where, sizeof where);
    tr_err_prefix(err, "%s: logger '%s'", where, slot->plugin->info->name);
    size_t len = strlen(err->msg);
    snprintf(err->msg + len, sizeof err->msg - len, " (the run stops at step %llu; its last "
             "checkpoint is kept)", (unsigned long long)r->step);
    return TR_ERROR;
}

/* rank 0: create and open each logger of the recipe's logger list */
static int open_loggers(struct run *r, int resume, tr_err *err)
{
    for (int i = 0; i < r->cfg->n_loggers; i++) {
        struct tr_slot *slot = &r->cfg->loggers[i];
        if (tr_config_create_slot(r->cfg, slot, 0, err) != TR_OK)
            return TR_ERROR;
        const struct tr_logger_vtable *vt = slot->plugin->info->vtable;
        if (vt->open(slot->self, resume, err) != TR_OK) {
            r->loggers_open = i + 1; /* closed with the others */
            return logger_failed(r, slot, err);
        }
        r->loggers_open = i + 1;
        /* what ran, for loggers that keep run metadata beside the numbers */
        const char *meta[][2] = {{"trainrun_version", PACKAGE_VERSION},
                                 {"run", r->cfg->name},
                                 {"recipe", tr_recipe_path(r->cfg->recipe)}};
        for (size_t k = 0; k < TR_ARRAY_LEN(meta); k++)
            if (TR_HAS_SLOT(vt, struct tr_logger_vtable, text) &&
                vt->text(slot->self, r->step, meta[k][0], meta[k][1], err) != TR_OK)
                return logger_failed(r, slot, err);
    }
    return TR_OK;
}

/* The same numbers metrics.jsonl's line holds, to every logger. */
static int log_scalars(struct run *r, const struct tr_scalar *v, size_t n, tr_err *err)
{
    for (int i = 0; i < r->loggers_open; i++) {
        struct tr_slot *slot = &r->cfg->loggers[i];
        const struct tr_logger_vtable *vt = slot->plugin->info->vtable;
        if (vt->scalars(slot->self, r->step, v, n, err) != TR_OK)
            return logger_failed(r, slot, err);
    }
    return TR_OK;
}

static int flush_loggers(struct run *r, tr_err *err)
{
    for (int i = 0; i < r->loggers_open; i++) {
        struct tr_slot *slot = &r->cfg->loggers[i];
        const struct tr_logger_vtable *vt = slot->plugin->info->vtable;
        if (TR_HAS_SLOT(vt, struct tr_logger_vtable, flush) && vt->flush(slot->self, err) != TR_OK)
            return logger_failed(r, slot, err);
    }
    return TR_OK;
}

/* The end of the run: each logger's close, all of them even after an error
 * (the first error is the one reported). */
static int close_loggers(struct run *r, tr_err *err)
{
    int rc = TR_OK;
    for (int i = 0; i < r->loggers_open; i++) {
        struct tr_slot *slot = &r->cfg->loggers[i];
        const struct tr_logger_vtable *vt = slot->plugin->info->vtable;
        tr_err e = {{0}};
        if (TR_HAS_SLOT(vt, struct tr_logger_vtable, close) && vt->close(slot->self, &e) != TR_OK &&
            rc == TR_OK) {
            rc = logger_failed(r, slot, &e);
            *err = e;
        }
    }
    r->loggers_open = 0;
    return rc;
}

/* rank 0: metrics.jsonl, appended to when resuming, else started afresh;
 * then the logger plugins */
int tr_run_open_metrics(struct run *r, int resume, tr_err *err)
{
    if (open_jsonl(r, resume, err) != TR_OK)
        return TR_ERROR;
    return open_loggers(r, resume, err);
}

static int open_jsonl(struct run *r, int resume, tr_err *err)
{
    r->metrics_path = tr_xasprintf("%s/metrics.jsonl", r->cfg->run_dir);
    /* read too: a resumed run checks how the file ends */
    int fd = open(r->metrics_path, O_RDWR | O_CREAT | O_CLOEXEC | O_APPEND | (resume ? 0 : O_TRUNC),
                  0666);
    if (fd < 0) {
        tr_log(TR_LOG_WARN, NULL, "cannot write %s: %s; no metrics this run", r->metrics_path,
               strerror(errno));
        return TR_OK;
    }
    r->metrics_fd = fd;
    r->metrics_open = 1;
    off_t end = lseek(fd, 0, SEEK_END);
    r->metrics_good = end > 0 ? end : 0;
    return r->metrics_good > 0 ? end_line(r, err) : TR_OK;
}

/* At the end of the run: everything synced and closed, or an error. */
static int metrics_close(struct run *r, tr_err *err)
{
    if (!r->metrics_open)
        return TR_OK;
    if (fsync(r->metrics_fd) != 0)
        return metrics_failed(r, errno, err);
    r->metrics_open = 0;
    return close(r->metrics_fd) == 0 ? TR_OK : write_failed(r, r->metrics_path, errno, err);
}

/* A resumed run writes a trace of its own: the earlier one's trace.json
 * moves aside to trace-1.json, trace-2.json, ... instead of being cut. */
void tr_run_keep_earlier_trace(const char *path)
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

/* The end of a run: metrics and trace complete on disk, or the reason not. */
int tr_run_close_outputs(struct run *r, tr_err *err)
{
    struct tr_trace *trace = r->trace;
    r->trace = NULL;
    int rc = metrics_close(r, err);
    tr_err lerr = {{0}};
    if (close_loggers(r, &lerr) != TR_OK && rc == TR_OK) {
        *err = lerr;
        rc = TR_ERROR;
    }
    int e = tr_trace_close(trace);
    if (e && rc == TR_OK)
        rc = tr_run_trace_failed(r, e, err);
    return rc;
}

static int progress(struct run *r, double lr, double grad_norm, double elapsed, double tokens,
                    uint64_t steps_this_run, int quiet, tr_err *err)
{
    uint64_t steps = (uint64_t)r->cfg->train.steps;
    double per_step = elapsed / (double)(steps_this_run ? steps_this_run : 1);
    double eta = per_step * (double)(steps - r->step);
    if (r->cfg->train.time > 0 && r->cfg->train.time - elapsed < eta) /* the clock ends it first */
        eta = r->cfg->train.time - elapsed > 0 ? r->cfg->train.time - elapsed : 0;
    double total = r->t_data + r->t_compute + r->t_optimizer;
    double wait = total > 0 ? 100.0 * r->t_data / total : 0;
    double tok_s = tokens / (elapsed > 0 ? elapsed : 1);
    double mfu = r->peak_flops > 0 ? tok_s * r->flops_per_token / r->peak_flops : NAN;
    double dollars = r->cost_before + tr_run_cost(r);
    double projected = dollars + eta * r->usd_per_second;
    if (!quiet) {
        char extra[96] = "";
        if (!isnan(mfu))
            snprintf(extra, sizeof extra, " | MFU %.1f%%", 100 * mfu);
        if (r->usd_per_second > 0) {
            size_t len = strlen(extra);
            snprintf(extra + len, sizeof extra - len, " | $%.2f of ~$%.2f", dollars, projected);
        }
        char of[32] = ""; /* no total when train.time alone sets the length */
        if (r->cfg->train.length_from != TR_LENGTH_TIME)
            snprintf(of, sizeof of, "/%llu", (unsigned long long)steps);
        fprintf(stderr, "step %6llu%s | loss %.4f | lr %.3g | norm %.3f | %.0f tok/s%s | data wait %.1f%% | ETA %.0fs\n",
                (unsigned long long)r->step, of, r->last_loss, lr, grad_norm,
                tok_s, extra, wait, eta);
    }
    /* the loggers get what is known: no MFU without a peak (metrics.jsonl's
     * -1), no dollars without a price (its 0) */
    struct tr_scalar v[12];
    size_t nv = 0;
    v[nv++] = (struct tr_scalar){"loss", r->last_loss};
    v[nv++] = (struct tr_scalar){"lr", lr};
    v[nv++] = (struct tr_scalar){"grad_norm", grad_norm};
    v[nv++] = (struct tr_scalar){"tokens_per_s", tok_s};
    if (!isnan(mfu))
        v[nv++] = (struct tr_scalar){"mfu", mfu};
    v[nv++] = (struct tr_scalar){"data_wait_pct", wait};
    v[nv++] = (struct tr_scalar){"loss_scale", tr_run_loss_scale(r)};
    v[nv++] = (struct tr_scalar){"skipped_steps", (double)r->skipped};
    if (r->usd_per_second > 0) {
        v[nv++] = (struct tr_scalar){"cost_usd", dollars};
        v[nv++] = (struct tr_scalar){"cost_projected_usd", projected};
    }
    v[nv++] = (struct tr_scalar){"elapsed_s", elapsed};
    if (log_scalars(r, v, nv, err) != TR_OK)
        return TR_ERROR;
    /* the process's CPU time, every thread's, beside the wall clock: what a
     * step costs the cores rather than how long it waited for them (the
     * figure to compare on a shared machine) */
    struct timespec cpu;
    double cpu_s = clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0
                       ? (double)cpu.tv_sec + 1e-9 * (double)cpu.tv_nsec
                       : -1;
    return metrics_line(r, err,
                "{\"step\": %llu, \"loss\": %.6g, \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f, "
                "\"mfu\": %.4g, \"data_wait_pct\": %.2f, \"loss_scale\": %.6g, \"skipped_steps\": %llu, "
                "\"cost_usd\": %.6g, \"cost_projected_usd\": %.6g, \"elapsed_s\": %.3f, \"cpu_s\": %.3f}\n",
                (unsigned long long)r->step, r->last_loss, lr, grad_norm, tok_s, isnan(mfu) ? -1.0 : mfu,
                wait, tr_run_loss_scale(r), (unsigned long long)r->skipped, dollars, projected,
                elapsed, cpu_s);
}

void tr_run_summary(struct run *r, double elapsed, double tokens)
{
    double t_checkpoint = r->ckpt ? tr_checkpointer_stall(r->ckpt) : 0;
    double parts = r->t_data + r->t_compute + r->t_optimizer + r->t_comm + r->t_eval + t_checkpoint;
    double other = elapsed > parts ? elapsed - parts : 0;
    fprintf(stderr, "\nrun %s: %llu steps in %.1f s, %.0f tokens/s\n", r->cfg->name,
            (unsigned long long)r->step, elapsed, tokens / (elapsed > 0 ? elapsed : 1));
    fprintf(stderr, "  final train loss %.4f", r->last_loss);
    if (!isnan(r->last_val))
        fprintf(stderr, ", validation loss %.4f, accuracy %.2f%%", r->last_val,
                100 * r->last_accuracy);
    fprintf(stderr, "\n  time: data wait %.1f%%, forward+backward %.1f%%, optimizer %.1f%%, "
                    "communication %.1f%%, evaluation %.1f%%, checkpoint %.1f%%, other %.1f%%\n",
            100 * r->t_data / elapsed, 100 * r->t_compute / elapsed, 100 * r->t_optimizer / elapsed,
            100 * r->t_comm / elapsed, 100 * r->t_eval / elapsed, 100 * t_checkpoint / elapsed, 100 * other / elapsed);
    if (r->usd_per_second > 0)
        fprintf(stderr, "  cost: $%.2f this run, $%.2f in all\n", tr_run_cost(r),
                r->cost_before + tr_run_cost(r));
    if (r->skipped)
        fprintf(stderr, "  %llu steps skipped for non-finite gradients\n", (unsigned long long)r->skipped);
    if (r->empty_steps)
        fprintf(stderr, "  %llu steps without an update: every target of their batch was masked\n",
                (unsigned long long)r->empty_steps);
    if (r->best[0])
        fprintf(stderr, "  best validation loss %.4f at step %llu (checkpoint %s)\n", r->best_val,
                (unsigned long long)r->best_step, r->best);
    if (r->stopped_early) {
        uint64_t saved = (uint64_t)r->cfg->train.steps - r->stopped_early;
        double per_step = elapsed / (double)(r->step ? r->step : 1);
        fprintf(stderr, "  early stopping saved %llu of %lld steps (about %.0f s at %.3f s/step",
                (unsigned long long)saved, (long long)r->cfg->train.steps, per_step * (double)saved,
                per_step);
        if (r->usd_per_second > 0)
            fprintf(stderr, ", $%.2f", per_step * (double)saved * r->usd_per_second);
        fprintf(stderr, ")\n");
    }
    if (r->t_data > 0.05 * (r->t_data + r->t_compute)) {
        /* advice for what the run does: no loader threads yet, or more of
         * them; shards only for text, the one source `trainrun prepare` reads */
        const struct tr_train_config *t = &r->cfg->train;
        char advice[160];
        if (t->workers == 0)
            snprintf(advice, sizeof advice, "train.workers = 0 reads the data in the step loop: "
                     "set train.workers = 2 or more");
        else
            snprintf(advice, sizeof advice, "raise train.workers (now %lld) or train.prefetch "
                     "(now %lld)", (long long)t->workers, (long long)t->prefetch);
        fprintf(stderr, "  warning: the step waited for data %.1f%% of the time: %s%s\n",
                100 * r->t_data / (r->t_data + r->t_compute), advice,
                strcmp(r->data.name, "text") == 0 ? ", or prepare the text into token shards "
                                                    "(trainrun prepare)" : "");
    }
}

/* ---- the policies at the end of a step ----------------------------------- */

static int last_step(const struct run *r) { return r->step == (uint64_t)r->cfg->train.steps; }

/* Logging: a progress line and a metrics line every train.log_every steps. */
int tr_policy_log(struct run *r, tr_err *err)
{
    if (r->step % (uint64_t)r->cfg->train.log_every != 0 && !last_step(r))
        return TR_OK;
    return progress(r, r->lr, r->grad_norm, tr_now() - r->t_start, r->tokens,
                    r->step - r->first_step, r->quiet, err);
}

/* Budget: warn at cost.warn_at of cost.budget, stop (with a checkpoint) at it
 * or at train.time. */
void tr_policy_budget(struct run *r)
{
    const struct tr_cost_config *c = &r->cfg->cost;
    if (c->budget <= 0 && r->cfg->train.time <= 0)
        return;
    double dollars = r->cost_before + tr_run_cost(r);
    if (c->budget > 0 && !r->budget_warned && r->rank == 0 && dollars >= c->warn_at * c->budget) {
        r->budget_warned = 1;
        tr_log(TR_LOG_WARN, "budget", "$%.2f spent, %.0f%% of the $%.2f budget (cost.budget)",
               dollars, 100 * dollars / c->budget, c->budget);
    }
    if (r->world == 1 && tr_run_over_budget(r))
        r->budget_stop = 1; /* with ranks, rank 0's verdict came with the gradients */
    if (last_step(r))
        r->budget_stop = 0;
}

/* Early stopping: early_stop.patience evaluations without an improvement of more
 * than min_delta end the run. */
static void early_stop(struct run *r)
{
    const struct tr_config *cfg = r->cfg;
    if (cfg->early_stop.patience <= 0)
        return;
    if (isnan(r->stop_best) || r->last_val < r->stop_best - cfg->early_stop.min_delta) {
        r->stop_best = r->last_val;
        r->stop_misses = 0;
    } else if (++r->stop_misses >= cfg->early_stop.patience && !last_step(r)) {
        r->stopped_early = r->step;
    }
}

/* Keep-best: 1 when this validation loss is the best yet (checkpoint it). */
static int keep_best(struct run *r)
{
    if (!r->cfg->checkpoint_policy.keep_best || !(isnan(r->best_val) || r->last_val < r->best_val))
        return 0;
    r->best_val = r->last_val;
    r->best_step = r->step;
    snprintf(r->best, sizeof r->best, "step-%010llu", (unsigned long long)r->step);
    return 1;
}

/* Evaluation every train.eval_every steps and at the end, then the policies
 * that read its loss: the schedule's observe, early stopping, keep-best. */
int tr_policy_evaluate(struct run *r, int *improved, tr_err *err)
{
    const struct tr_config *cfg = r->cfg;
    *improved = 0;
    if (!(cfg->train.eval_every && r->step % (uint64_t)cfg->train.eval_every == 0) &&
        !last_step(r))
        return TR_OK;
    double accuracy, te = tr_now();
    if (tr_run_evaluate(r, &r->last_val, &accuracy, err) != TR_OK)
        return TR_ERROR;
    tr_trace_phase(r->trace, "evaluation", r->step, te, tr_now());
    r->last_accuracy = accuracy;
    /* text data: the loss per byte too, which compares across tokenizers (a token of a
     * larger vocabulary holds more text, so its loss per token is higher) */
    double bpt = r->data.info.bytes_per_token[TR_SPLIT_VAL];
    char per_byte[64] = "", per_byte_json[64] = "";
    if (bpt > 0) {
        snprintf(per_byte, sizeof per_byte, " nats/token (%.4f nats/byte)", r->last_val / bpt);
        snprintf(per_byte_json, sizeof per_byte_json, ", \"val_loss_per_byte\": %.6g", r->last_val / bpt);
    }
    if (!r->quiet)
        fprintf(stderr, "step %6llu | validation loss %.4f%s | accuracy %.2f%%\n",
                (unsigned long long)r->step, r->last_val, per_byte, 100 * accuracy);
    struct tr_scalar v[3] = {{"val_loss", r->last_val}};
    size_t nv = 1;
    if (!isnan(accuracy))
        v[nv++] = (struct tr_scalar){"val_accuracy", accuracy};
    if (bpt > 0)
        v[nv++] = (struct tr_scalar){"val_loss_per_byte", r->last_val / bpt};
    if (log_scalars(r, v, nv, err) != TR_OK || flush_loggers(r, err) != TR_OK)
        return TR_ERROR;
    if (metrics_line(r, err, "{\"step\": %llu, \"val_loss\": %.6g, \"val_accuracy\": %.6g%s}\n",
                     (unsigned long long)r->step, r->last_val,
                     isnan(accuracy) ? -1.0 : accuracy, per_byte_json) != TR_OK)
        return TR_ERROR;
    if (TR_HAS_SLOT(r->schedule, struct tr_schedule_vtable, observe))
        r->schedule->observe(cfg->schedule.self, r->step, r->last_val);
    early_stop(r);
    *improved = keep_best(r);
    return TR_OK;
}

/* Checkpoint cadence: every checkpoint.every steps, a new best, and the
 * step the run ends at (last, budget, early stop). */
int tr_policy_checkpoint(struct run *r, int improved, tr_err *err)
{
    const struct tr_config *cfg = r->cfg;
    int due = cfg->checkpoint_policy.every && r->step % (uint64_t)cfg->checkpoint_policy.every == 0;
    int final = last_step(r) || r->budget_stop || r->stopped_early;
    if (!(due || final || improved) || tr_run_stopping(r))
        return TR_OK;
    tr_err cerr = {{0}};
    double tc = tr_now();
    /* the run ends after this one: write it now, and fail if it does not land;
     * any other failed save never stops training */
    if (tr_run_save(r, r->position, final, &cerr) != TR_OK) {
        if (final) {
            *err = cerr;
            return TR_ERROR;
        }
        tr_log(TR_LOG_ERROR, NULL, "%s", cerr.msg);
    }
    tr_trace_phase(r->trace, "checkpoint stall", r->step, tc, tr_now());
    return TR_OK;
}

/* The budget or early stopping ends the run here (its checkpoint is saved). */
int tr_policy_stop(struct run *r)
{
    const struct tr_config *cfg = r->cfg;
    if (r->budget_stop && tr_run_over_time(r)) {
        if (r->rank == 0)
            tr_log(TR_LOG_WARN, NULL, "stopping at step %llu: train.time (%.0f s) reached; "
                   "checkpoint saved (--resume auto goes on, with the time again)",
                   (unsigned long long)r->step, cfg->train.time);
        return 1;
    }
    if (r->budget_stop) {
        if (r->rank == 0)
            tr_log(TR_LOG_WARN, "budget", "stopping at step %llu: $%.2f spent reaches the $%.2f "
                   "budget; checkpoint saved (raise cost.budget and --resume auto to go on)",
                   (unsigned long long)r->step, r->cost_before + tr_run_cost(r), cfg->cost.budget);
        return 1;
    }
    if (r->stopped_early) {
        if (r->rank == 0)
            tr_log(TR_LOG_INFO, NULL, "early stop at step %llu: the validation loss has not "
                   "improved by more than %g for %lld evaluations (best %.4f at step %llu)",
                   (unsigned long long)r->step, cfg->early_stop.min_delta,
                   (long long)cfg->early_stop.patience, r->best_val,
                   (unsigned long long)r->best_step);
        return 1;
    }
    return 0;
}

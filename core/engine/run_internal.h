/* The state of one training run, shared by the files that make up the run:
 * run.c (the phases and the step loop), sample.c (generation from a
 * checkpoint), smoke.c (smoke runs) and evaluate.c (`trainrun eval`).
 * Private to them: nothing else in trainrun includes this header. */
#ifndef TR_RUN_INTERNAL_H
#define TR_RUN_INTERNAL_H

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "graph.h"
#include "loader.h"
#include "optim.h"
#include "../config/run_config.h"
#include "topo.h"
#include "trace.h"
#include "../util/util.h"

#include <sys/types.h>

struct run {
    struct tr_config *cfg;
    struct tr_backend be;
    struct tr_graph *g;
    struct tr_data_source data;
    struct tr_loader *loader;
    struct tr_optimizer opt;
    void *host_inputs;       /* one micro-batch from the loader */
    int32_t *host_targets;
    size_t input_bytes, target_count;
    int accum;               /* micro-batches per optimizer step */
    uint32_t vocab;          /* token ids must be below this */
    uint64_t step;           /* optimizer steps done */
    uint64_t skipped;        /* steps skipped for non-finite gradients */
    /* token-weighted accumulation (run.c, forward_backward): the last step's
     * targets the loss was taken on (all ranks), and the factor that makes
     * its accumulated gradients and loss the mean over them; 1 when every
     * target counted (unmasked data), so those numbers are unchanged */
    double step_targets, loss_norm;
    uint64_t empty_steps;    /* steps whose every target was masked: no update */
    double last_loss, last_val, last_accuracy;
    char best[64];           /* checkpoint of the best validation loss */
    double best_val;
    uint64_t best_step;
    double stop_best;        /* early stopping: best loss by min_delta, and misses since */
    int64_t stop_misses;
    uint64_t stopped_early;  /* the step early stopping ended the run at, 0 if not */
    /* where time goes */
    double t_start, t_data, t_compute, t_optimizer, t_eval;
    int metrics_open, metrics_fd; /* metrics.jsonl, rank 0 only */
    char *metrics_path;
    off_t metrics_good;      /* metrics.jsonl up to here holds whole lines */
    int loggers_open;        /* cfg->loggers[0..loggers_open) created and opened, rank 0 */
    int have_lock, lock_fd;  /* run_dir/trainrun.lock, held while this process writes */
    const struct tr_precision_vtable *precision;
    const struct tr_schedule_vtable *schedule;
    struct tr_checkpointer *ckpt;
    struct tr_topo *topo;
    struct tr_trace *trace;
    struct tr_precision_policy policy;
    /* cost: dollars per second of this run, FLOP/s the devices peak at */
    double usd_per_second, peak_flops, flops_per_token;
    double cost_before;      /* dollars spent by earlier runs this one resumed */
    int budget_warned, budget_stop;
    /* data parallelism: this rank of `world`; comm is NULL when alone */
    int rank, world;
    struct tr_comm *comm;
    double t_comm;           /* waiting for gradients and agreements from other ranks */
    int agreed_stop;         /* the ranks agreed to stop (a signal reached one of them) */
    float *resume_full[2];   /* ZeRO-1 resume on rank 0: the full moments read */
    /* the loop's progress */
    uint64_t position;       /* micro-batches of the whole job consumed */
    uint64_t first_step;     /* the step this process started at */
    double tokens;           /* tokens this process trained on */
    double lr, grad_norm;    /* of the last step */
    int quiet;               /* no progress lines: asked for, or not rank 0 */
    /* `trainrun eval` and `trainrun sample`: setup writes nothing (no run
     * directory, checkpoint plugin or checkpointer) and keeps no optimizer
     * state */
    int eval_only;
};

/* Setup: backend, placement, model, plugins, optimizer and checkpointer,
 * everything a step needs; tr_run_teardown undoes whatever of it was done. */
int tr_run_setup(struct run *r, tr_err *err);
void tr_run_teardown(struct run *r);
/* model = { from = "DIR" }: DIR's weights into the parameters (a fresh
 * run only: a resumed one has its checkpoint's); TR_OK when there is none. */
int tr_run_load_pretrained(struct run *r, tr_err *err);

/* Memory the device offers a plan, in bytes, and the device in words. */
double tr_run_device_memory(const struct tr_config *cfg, char *what, size_t what_size);

/* smoke.c: save the run's checkpoint, load it into fresh buffers, compare. */
int tr_smoke_round_trip(struct run *r, tr_err *err);

/* run.c: the pieces of a step the policies use. */
int tr_run_stopping(const struct run *r);  /* a signal asked the run to stop */
double tr_run_loss_scale(struct run *r);
double tr_run_cost(const struct run *r);   /* dollars this process has spent */
int tr_run_over_budget(const struct run *r);
int tr_run_over_time(const struct run *r); /* train.time reached */
/* A checkpoint at loader_position; now: written before returning, else in
 * the background when checkpoint.async. */
int tr_run_save(struct run *r, uint64_t loader_position, int now, tr_err *err);
int tr_run_evaluate(struct run *r, double *val_loss, double *val_accuracy, tr_err *err);
/* The evaluation itself: the mean loss (and accuracy, NaN when the backend
 * cannot count it) over the first max_batches micro-batches of split in
 * order, or all of them when fewer; *batches (when not NULL) gets how many. */
int tr_run_evaluate_split(struct run *r, enum tr_split split, uint64_t max_batches,
                          double *loss, double *accuracy, uint64_t *batches, tr_err *err);

/* rundir.c: one writer per run directory (rank 0). */
int tr_run_lock(struct run *r, tr_err *err);
int tr_run_refuse_earlier(const struct run *r, tr_err *err); /* a fresh run in a used dir */
void tr_run_unlock(struct run *r);
/* rundir.c: the tokenizer that made the run's data (tr_data_info.tokenizer).
 * Setup: the model has a row for each of its ids, and model = { from = DIR }
 * with a DIR/tokenizer.json was trained with the same one (by content).
 * Start (rank 0, fresh or resumed): copied into run_dir/tokenizer.json. */
int tr_run_check_tokenizer(struct run *r, tr_err *err);
int tr_run_record_tokenizer(struct run *r, int resume, tr_err *err);
/* the resolved recipe into run_dir/recipe.resolved(.json); a resume compares first */
int tr_run_record_recipe(struct run *r, int resumed, int allow_changes, tr_err *err);

/* run_state.c: the run's state in checkpoints, and ZeRO-1 shards. */
int tr_run_resume(struct run *r, tr_err *err); /* from the newest good checkpoint, if any */
int tr_run_sharded(const struct run *r);       /* this rank holds a shard of the state */
void tr_run_shard_of(const struct run *r, int q, size_t *begin, size_t *end);
int tr_run_share_params(struct run *r, tr_err *err); /* every rank gets every shard */

/* policies.c: the end-of-step policies, in the order tr_train calls them. */
int tr_policy_log(struct run *r, tr_err *err);
void tr_policy_budget(struct run *r);
int tr_policy_evaluate(struct run *r, int *improved, tr_err *err);
int tr_policy_checkpoint(struct run *r, int improved, tr_err *err);
int tr_policy_stop(struct run *r);

/* policies.c: what a run writes about itself (rank 0). */
int tr_run_open_metrics(struct run *r, int resume, tr_err *err);
void tr_run_metrics_drop(struct run *r);
void tr_run_keep_earlier_trace(const char *path);
int tr_run_trace_failed(const struct run *r, int errnum, tr_err *err);
int tr_run_close_outputs(struct run *r, tr_err *err);
void tr_run_summary(struct run *r, double elapsed, double tokens);

#endif

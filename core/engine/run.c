/* Training: tr_train and its phases.  The loop, in shape (tr_train, below):
 *
 *   start(r)                        lock run_dir, setup, resume, signals, loader
 *   while (step < steps && !stopping)
 *       train_step(r)               forward_backward, agree (ranks), update
 *       tr_policy_log(r)            progress line, metrics.jsonl
 *       tr_policy_budget(r)         warn, then stop at cost.budget
 *       tr_policy_evaluate(r)       validation, early stop, keep-best
 *       tr_policy_checkpoint(r)     every N steps, a new best, the last step
 *       if (tr_policy_stop(r)) break
 *   stopped by a signal ? preempted(r) (checkpoint, exit 75) : finish(r)
 *
 * Here: the phases and the step.  Around them: setup and teardown (setup.c),
 * the end-of-step policies and metrics.jsonl (policies.c), the run's state in
 * checkpoints, resume and ZeRO-1 shards (run_state.c), the run-directory
 * lock (rundir.c), sampling (sample.c), smoke runs (smoke.c); struct run,
 * which they all share, is in run_internal.h. */
#include "run.h"
#include "run_internal.h"

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "graph.h"
#include "../util/json.h"
#include "loader.h"
#include "model.h"
#include "optim.h"
#include "../config/options.h"
#include "../config/plugin.h"
#include "../config/precision.h"
#include "../config/recipe.h"
#include "../util/safetensors.h"
#include "topo.h"
#include "trace.h"
#include "../util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- signals: finish the step, checkpoint, exit for requeue ----------- */

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

/* A stop was requested: alone, as soon as a signal arrives; with other
 * ranks, only what they all agreed at the last step boundary, so every
 * rank stops after the same step. */
int tr_run_stopping(const struct run *r)
{
    return r->world > 1 ? r->agreed_stop : stop_signal != 0;
}

double tr_run_loss_scale(struct run *r)
{
    if (TR_HAS_SLOT(r->precision, struct tr_precision_vtable, loss_scale))
        return r->precision->loss_scale(r->cfg->precision.self);
    return 1.0;
}

/* What to try when the loss or the gradients are not finite, from what the
 * run is actually doing: no advice to turn on what is already on. */
static void nonfinite_advice(const struct run *r, char *buf, size_t size)
{
    const struct tr_config *cfg = r->cfg;
    const char *precision = cfg->precision.plugin->info->name;
    char fp32[128] = "";
    if (r->policy.compute != TR_F32)
        snprintf(fp32, sizeof fp32, "train in fp32 (precision = \"fp32\") to see whether %s "
                 "overflows, ", precision);
    if (r->opt.applied == 0) { /* the weights are the initial ones: no step size made this */
        snprintf(buf, size, "no update has been applied yet, so the learning rate is not the "
                 "cause: %scheck the data for NaN, inf or huge values (data '%s'), and the "
                 "model's initialisation", fp32, r->data.name);
    } else if (cfg->optimizer.clip > 0) {
        snprintf(buf, size, "gradient clipping is already on (optimizer.clip = %g): lower "
                 "optimizer.lr (now %g) or warm up longer, %sor check the data (data '%s') "
                 "for NaN, inf or outliers", cfg->optimizer.clip, cfg->optimizer.lr, fp32,
                 r->data.name);
    } else {
        snprintf(buf, size, "lower optimizer.lr (now %g), clip the gradients (optimizer.clip "
                 "= 1.0), %sor check the data (data '%s') for NaN, inf or outliers",
                 cfg->optimizer.lr, fp32, r->data.name);
    }
}

/* ---- one step ----------------------------------------------------------- */

static int load_micro_batch(struct run *r, struct tr_loader *loader, double *wait, tr_err *err)
{
    if (tr_loader_next(loader, r->host_inputs, r->host_targets, wait, err) != TR_OK)
        return TR_ERROR;
    struct tr_tensor *in = &r->g->tensors[r->g->inputs[0]];
    struct tr_tensor *tg = &r->g->tensors[r->g->inputs[1]];
    if (r->data.info.input_dtype == TR_I32) {
        /* an id past the embedding table would read out of bounds */
        const int32_t *ids = r->host_inputs;
        for (size_t i = 0; i < in->numel; i++)
            if ((uint32_t)ids[i] >= r->vocab)
                return tr_fail(err, "data '%s': token id %d is outside the model's vocabulary of %u",
                               r->data.name, ids[i], r->vocab);
    }
    r->be.iface->upload(r->be.context, in->data, r->host_inputs, r->input_bytes);
    r->be.iface->upload(r->be.context, tg->data, r->host_targets, r->target_count * sizeof(int32_t));
    return TR_OK;
}

/* Targets of the micro-batch on the host that the loss averages over: all
 * but those equal to the cross-entropy's ignore_index (the masked targets
 * of instruction data); all of them when the loss is not a cross-entropy. */
static double loss_targets(const struct run *r)
{
    const struct tr_graph *g = r->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if (n->op != TR_OP_CROSS_ENTROPY || n->out != g->loss)
            continue;
        size_t valid = 0;
        for (size_t k = 0; k < r->target_count; k++)
            valid += r->host_targets[k] != n->ignore_index;
        return (double)valid;
    }
    return (double)r->target_count;
}

/* A micro-batch's share relative to one whose every target counts: 1.0
 * exactly for unmasked data, so its numbers stay what they were. */
static double micro_batch_weight(const struct run *r, double targets)
{
    double full = (double)r->target_count;
    return targets == full ? 1.0 : targets / full;
}

static float read_loss(struct run *r)
{
    float loss;
    r->be.iface->download(r->be.context, &loss, r->g->tensors[r->g->loss].data, sizeof loss);
    return loss;
}

/* The one evaluation: the first max_batches micro-batches of split, in
 * order (no shuffle), forward only; the ranks share them.  The run calls it
 * through tr_run_evaluate, `trainrun eval` (eval.c) directly. */
int tr_run_evaluate_split(struct run *r, enum tr_split split, uint64_t max_batches,
                          double *loss, double *accuracy, uint64_t *batches, tr_err *err)
{
    double t0 = tr_now();
    struct tr_loader_config lc = {split, (int)r->cfg->train.micro_batch, 0, 1, 0,
                                  (uint64_t)r->cfg->train.seed, NULL, r->rank, r->world, NULL,
                                  /* each token once, with random windows too */
                                  r->data.info.eval_stride[split]};
    struct tr_loader *val = tr_loader_open(&r->data, &lc, 0, err);
    if (!val)
        return TR_ERROR;
    uint64_t n = tr_loader_batches_per_epoch(val);
    if (n > max_batches)
        n = max_batches;
    /* rank r evaluates batches r, r + world, ... of the n */
    uint64_t mine = n / (uint64_t)r->world + ((uint64_t)r->rank < n % (uint64_t)r->world);
    double sum = 0, weights = 0; /* the loss as the mean over every counted target */
    int64_t correct = 0, counted = 0;
    /* eval mode: batch norm normalises with its running statistics and
     * updates nothing (training resumes in training mode) */
    r->g->training = 0;
    for (uint64_t i = 0; i < mine; i++) {
        if (load_micro_batch(r, val, NULL, err) != TR_OK) {
            r->g->training = 1;
            tr_loader_close(val);
            return TR_ERROR;
        }
        tr_graph_forward(r->g, &r->be);
        double w = micro_batch_weight(r, loss_targets(r));
        sum += read_loss(r) * w;
        weights += w;
        if (r->g->logits >= 0 && r->be.iface->count_correct) {
            const struct tr_tensor *lg = &r->g->tensors[r->g->logits];
            int V = (int)lg->shape[lg->ndim - 1];
            int64_t valid = 0;
            correct += r->be.iface->count_correct(r->be.context, lg->data,
                                                  r->g->tensors[r->g->inputs[1]].data,
                                                  (int)(lg->numel / (size_t)V), V, -1, &valid);
            counted += valid;
        }
    }
    r->g->training = 1;
    tr_loader_close(val);
    if (r->comm) {
        float totals[4] = {(float)sum, (float)correct, (float)counted, (float)weights};
        if (tr_comm_allreduce(r->comm, totals, 4, err) != TR_OK)
            return TR_ERROR;
        sum = totals[0];
        correct = (int64_t)totals[1];
        counted = (int64_t)totals[2];
        weights = totals[3];
    }
    /* weights == n unless targets were masked: then sum / n exactly as before */
    *loss = weights == (double)n ? sum / (double)n : weights > 0 ? sum / weights : NAN;
    *accuracy = counted ? (double)correct / (double)counted : NAN;
    if (batches)
        *batches = n;
    r->t_eval += tr_now() - t0;
    return TR_OK;
}

int tr_run_evaluate(struct run *r, double *val_loss, double *val_accuracy, tr_err *err)
{
    return tr_run_evaluate_split(r, TR_SPLIT_VAL, (uint64_t)r->cfg->train.eval_batches, val_loss,
                                 val_accuracy, NULL, err);
}

/* Dollars this process has spent (elapsed time x device price x count). */
double tr_run_cost(const struct run *r) { return (tr_now() - r->t_start) * r->usd_per_second; }

/* train.time reached (this process's wall clock since the run started) */
int tr_run_over_time(const struct run *r)
{
    return r->cfg->train.time > 0 && tr_now() - r->t_start >= r->cfg->train.time;
}

/* cost.budget or train.time reached (this process's view of the dollars
 * spent): both stop the run the same way, with a checkpoint */
int tr_run_over_budget(const struct run *r)
{
    return (r->cfg->cost.budget > 0 && r->cost_before + tr_run_cost(r) >= r->cfg->cost.budget) ||
           tr_run_over_time(r);
}

/* ---- the phases of a run ------------------------------------------------ */

/* Everything before the first step: the run directory, setup, resume, the
 * signal handlers, the loader, metrics.jsonl and the trace. */
static int start(struct run *r, const struct tr_run_flags *flags, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    /* before anything in run_dir is opened (metrics.jsonl is truncated on a
     * fresh start): rank 0 writes for the whole job, so it alone locks */
    if (cfg->rank.rank == 0 && (tr_run_lock(r, err) != TR_OK ||
                                (!flags->resume && tr_run_refuse_earlier(r, err) != TR_OK)))
        return TR_ERROR;
    if (tr_run_setup(r, err) != TR_OK)
        return TR_ERROR;
    if (!flags->quiet && r->rank == 0) {
        /* first: whether half precision is native here or an emulation
         * slower than fp32 (the CPU backend's choice, kernels/cpu/gemm.c) */
        if (strcmp(cfg->device, "cpu") == 0 && r->g->compute != TR_F32)
            fprintf(stderr, "device cpu: %s\n", tr_cpu_gemm_path(r->g->compute));
        if (r->g->allow_tf32) /* only device=cuda gets here (tr_precision_check) */
            fprintf(stderr, "device %s: fp32 GEMMs in tf32 on tensor cores (cuBLASLt "
                            "CUBLAS_COMPUTE_32F_FAST_TF32, fp32 accumulation)\n", cfg->device);
        tr_graph_print_memory(r->g, stderr);
    }
    if (flags->resume && tr_run_resume(r, err) != TR_OK)
        return TR_ERROR;
    /* resumed from a checkpoint: its weights learnt the recorded tokenizer's ids */
    if (r->rank == 0 && tr_run_record_tokenizer(r, r->step > 0, err) != TR_OK)
        return TR_ERROR;
    /* the recipe it runs, compared with the recorded one when it continues one */
    if (r->rank == 0 && tr_run_record_recipe(r, r->step > 0, flags->allow_changes, err) != TR_OK)
        return TR_ERROR;
    if (r->step == 0 && tr_run_load_pretrained(r, err) != TR_OK) /* not resumed */
        return TR_ERROR;
    if (r->position % (uint64_t)r->world != 0)
        return tr_fail(err, "the checkpoint stopped %llu micro-batches into the data, which %d "
                       "ranks cannot share; resume with a world size that divides the "
                       "micro-batches per step", (unsigned long long)r->position, r->world);
    /* before the loader's workers start: from their first read on, a signal
     * ends a wait for data and the run (exit 75) instead of killing it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    struct tr_loader_config lc = {TR_SPLIT_TRAIN, (int)cfg->train.micro_batch,
                                  (int)cfg->train.workers, (int)cfg->train.prefetch, 1,
                                  (uint64_t)cfg->train.seed, r->topo, r->rank, r->world,
                                  &stop_signal, 0}; /* a signal ends a wait for data */
    r->loader = tr_loader_open(&r->data, &lc, r->position / (uint64_t)r->world, err);
    if (!r->loader)
        return TR_ERROR;
    if (r->rank == 0 && tr_run_open_metrics(r, flags->resume, err) != TR_OK) /* one rank reports */
        return TR_ERROR;
    r->quiet = flags->quiet || r->rank != 0;
    r->first_step = r->step;
    r->t_start = tr_now();
    if (cfg->train.trace_every > 0 && r->rank == 0) {
        char *path = tr_xasprintf("%s/trace.json", cfg->run_dir);
        if (flags->resume)
            tr_run_keep_earlier_trace(path);
        r->trace = tr_trace_open(path, r->t_start);
        free(path);
    }
    return TR_OK;
}

/* ---- the step ------------------------------------------------------------ */

#define STEP_ABANDONED 1 /* a signal came mid-step: the step is dropped, not finished */

/* Forward and backward over the micro-batches of one step, the loss summed
 * into *loss_sum and the targets it was taken on into *targets.  Alone, a
 * signal abandons the step (STEP_ABANDONED): the checkpoint written next
 * predates it.  With ranks, every rank finishes it.
 *
 * The step's loss and gradient are the mean over every target trained on in
 * the step (all micro-batches, all ranks), not the mean of the micro-batches'
 * means: with masked targets a micro-batch of 3 response tokens must not
 * count as much as one of 300.  The cross-entropy averages over its own
 * micro-batch's n_k targets, so micro-batch k's loss gradient is scaled by
 * w_k = n_k / (targets of a full micro-batch); what remains, full targets
 * of the step / the step's total, needs the other ranks' counts and is
 * applied once at the update (r->loss_norm).  Unmasked, every w_k and the
 * remaining factor are exactly 1: the numbers are those of a plain mean. */
static int forward_backward(struct run *r, double scale, double *loss_sum, double *targets,
                            tr_err *err)
{
    /* no pass zeroing the parameter gradients: the first micro-batch's
     * backward writes each (or zeroes it right before its first writer) */
    /* the mean over the micro-batches of every rank, each weighted below */
    double mean = scale / (r->accum * r->world);
    int sampled = r->trace && r->step % (uint64_t)r->cfg->train.trace_every == 0;
    for (int k = 0; k < r->accum; k++) {
        if (k > 0 && r->world == 1 && stop_signal)
            return STEP_ABANDONED;
        double td = tr_now();
        if (load_micro_batch(r, r->loader, &r->t_data, err) != TR_OK)
            /* signalled while the loader was blocked: abandon the step too */
            return r->world == 1 && tr_loader_cancelled(r->loader) ? STEP_ABANDONED : TR_ERROR;
        double t0 = tr_now();
        double n = loss_targets(r), w = micro_batch_weight(r, n);
        r->g->loss_grad = (float)(mean * w);
        *targets += n;
        r->g->profile = sampled && k == 0; /* per-op timings of one micro-batch */
        r->g->grads_fresh = k == 0;
        tr_graph_forward(r->g, &r->be);
        *loss_sum += read_loss(r) * w;
        if (r->comm && k == r->accum - 1) /* all-reduce buckets as backward finishes them */
            tr_comm_arm(r->comm, r->g);
        tr_graph_backward(r->g, &r->be);
        double t1 = tr_now();
        r->t_compute += t1 - t0;
        tr_trace_phase(r->trace, "data wait", r->step, td, t0);
        tr_trace_phase(r->trace, "forward+backward", r->step, t0, t1);
        if (r->g->profile)
            tr_trace_ops(r->trace, r->g, r->step);
        r->g->profile = 0;
    }
    return TR_OK;
}

/* With ranks: the last gradient buckets, then one small agreement: the
 * loss, the targets it was taken on, whether any rank was signalled, and
 * rank 0's budget verdict.  The count travels as two floats, n / 4096 and
 * n % 4096, each summed exactly (below 2^24) up to 2^36 targets a step. */
static int agree(struct run *r, double *loss_sum, double *targets, tr_err *err)
{
    double tw = tr_now();
    float agree[5] = {(float)*loss_sum, stop_signal ? 1.0f : 0.0f,
                      r->rank == 0 && tr_run_over_budget(r) ? 1.0f : 0.0f,
                      (float)floor(*targets / 4096), (float)fmod(*targets, 4096)};
    if (tr_comm_finish(r->comm, r->g, err) != TR_OK ||
        tr_comm_allreduce(r->comm, agree, 5, err) != TR_OK)
        return TR_ERROR;
    *loss_sum = agree[0];
    r->agreed_stop = agree[1] > 0;
    r->budget_stop = agree[2] > 0;
    *targets = (double)agree[3] * 4096 + (double)agree[4];
    r->t_comm += tr_now() - tw;
    tr_trace_phase(r->trace, "gradient all-reduce wait", r->step, tw, tr_now());
    return TR_OK;
}

/* Unscale, check, clip, update.  The precision plugin decides whether a step
 * with non-finite gradients is skipped; without that slot it ends the run. */
static int update(struct run *r, double scale, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    double t0 = tr_now();
    if (r->step_targets == 0) {
        /* every target of the step was masked: no gradient, nothing to learn */
        if (r->empty_steps++ == 0)
            tr_log(TR_LOG_WARN, NULL, "step %llu: every target of the step's batch is masked "
                   "(windows of prompt tokens only, no response): no update is applied; "
                   "such steps are counted in the summary (longer sequences or shorter "
                   "prompts avoid them)", (unsigned long long)r->step + 1);
        r->grad_norm = 0;
        r->lr = r->schedule->lr(cfg->schedule.self, r->step, (uint64_t)cfg->train.steps,
                                cfg->optimizer.lr);
        r->t_optimizer += tr_now() - t0;
        return TR_OK;
    }
    double sumsq = r->be.iface->sum_squares(r->be.context, r->g->grads, r->g->n_params);
    int finite = isfinite(sumsq) && isfinite(r->last_loss);
    r->grad_norm = sqrt(sumsq) / scale * r->loss_norm;
    int apply = finite;
    if (TR_HAS_SLOT(r->precision, struct tr_precision_vtable, update)) {
        apply = r->precision->update(cfg->precision.self, finite, err);
        if (apply == TR_ERROR)
            return TR_ERROR;
    } else if (!finite) {
        char advice[512];
        nonfinite_advice(r, advice, sizeof advice);
        return tr_fail(err, "step %llu: the %s not finite (loss %g); %s",
                       (unsigned long long)r->step,
                       isfinite(r->last_loss) ? "gradients are" : "loss is", r->last_loss, advice);
    }
    r->lr = r->schedule->lr(cfg->schedule.self, r->step, (uint64_t)cfg->train.steps,
                            cfg->optimizer.lr);
    if (apply) {
        double clip = cfg->optimizer.clip > 0 && r->grad_norm > cfg->optimizer.clip
                          ? cfg->optimizer.clip / r->grad_norm : 1.0;
        tr_optimizer_step(&r->opt, r->g, &r->be, clip * r->loss_norm / scale, r->lr);
        if (r->comm && tr_run_sharded(r) && tr_run_share_params(r, err) != TR_OK)
            return TR_ERROR;
    } else {
        r->skipped++;
    }
    r->t_optimizer += tr_now() - t0;
    tr_trace_phase(r->trace, "optimizer", r->step, t0, tr_now());
    return TR_OK;
}

/* One optimizer step: TR_OK, STEP_ABANDONED or TR_ERROR. */
static int train_step(struct run *r, tr_err *err)
{
    uint64_t step_start = tr_loader_position(r->loader) * (uint64_t)r->world;
    double scale = tr_run_loss_scale(r), loss_sum = 0, targets = 0;
    int rc = forward_backward(r, scale, &loss_sum, &targets, err);
    if (rc == STEP_ABANDONED)
        r->position = step_start; /* the preemption checkpoint resumes at the step's start */
    if (rc != TR_OK)
        return rc;
    if (r->comm && agree(r, &loss_sum, &targets, err) != TR_OK)
        return TR_ERROR;
    double full = (double)r->target_count * r->accum * r->world;
    r->step_targets = targets;
    r->loss_norm = targets == full ? 1.0 : targets > 0 ? full / targets : 0.0;
    r->last_loss = loss_sum / (r->accum * r->world) * r->loss_norm;
    if (update(r, scale, err) != TR_OK)
        return TR_ERROR;
    r->step++;
    r->tokens += (double)r->cfg->train.batch * r->data.info.target_len;
    r->position = tr_loader_position(r->loader) * (uint64_t)r->world;
    return TR_OK;
}

/* Preemption: a signal stopped the loop before the last step; checkpoint
 * now, within checkpoint.deadline, and exit 75 for the launcher to requeue. */
static int preempted(struct run *r, tr_err *err)
{
    int sig = stop_signal ? (int)stop_signal : SIGTERM;
    double t0 = tr_now();
    if (tr_run_save(r, r->position, 1, err) != TR_OK ||
        (r->ckpt && tr_checkpointer_wait(r->ckpt, err) != TR_OK))
        return TR_ERROR;
    double took = tr_now() - t0;
    if (took > r->cfg->checkpoint_policy.deadline)
        tr_log(TR_LOG_WARN, NULL, "the preemption checkpoint took %.1f s, over the %.0f s "
               "deadline (checkpoint.deadline)", took, r->cfg->checkpoint_policy.deadline);
    tr_log(TR_LOG_WARN, NULL, "received signal %d: checkpoint of step %llu saved in %.2f s; "
           "exiting with code %d (requeue, then --resume auto)", sig,
           (unsigned long long)r->step, took, TR_EXIT_PREEMPTED);
    return tr_run_close_outputs(r, err);
}

/* The end of a finished run: the last checkpoint landed (and, for a smoke
 * run, reads back), metrics and trace on disk, the summary. */
static int finish(struct run *r, const struct tr_run_flags *flags, tr_err *err)
{
    if (r->ckpt && tr_checkpointer_wait(r->ckpt, err) != TR_OK)
        return TR_ERROR; /* the final checkpoint did not land */
    if (flags->smoke && r->ckpt && tr_smoke_round_trip(r, err) != TR_OK)
        return TR_ERROR;
    if (tr_run_close_outputs(r, err) != TR_OK)
        return TR_ERROR;
    if (!r->quiet)
        tr_run_summary(r, tr_now() - r->t_start, r->tokens);
    return TR_OK;
}

/* ---- the training loop ---------------------------------------------------- */

int tr_train(struct tr_config *cfg, const struct tr_run_flags *flags)
{
    struct run run, *r = &run;
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    tr_err err = {{0}};
    int code = TR_EXIT_ERROR, improved;
    if (start(r, flags, &err) != TR_OK)
        goto fail;
    while (r->step < (uint64_t)cfg->train.steps && !tr_run_stopping(r)) {
        int rc = train_step(r, &err); /* forward, backward, update */
        if (rc == STEP_ABANDONED)
            break;
        if (rc != TR_OK || tr_policy_log(r, &err) != TR_OK)
            goto fail;
        tr_policy_budget(r);
        if (tr_policy_evaluate(r, &improved, &err) != TR_OK || /* + early stop, keep-best */
            tr_policy_checkpoint(r, improved, &err) != TR_OK)
            goto fail;
        if (tr_policy_stop(r))
            break;
        if (tr_trace_error(r->trace)) {
            tr_run_trace_failed(r, tr_trace_error(r->trace), &err);
            goto fail;
        }
    }
    if (tr_run_stopping(r) && r->step < (uint64_t)cfg->train.steps) {
        if (preempted(r, &err) != TR_OK)
            goto fail;
        code = TR_EXIT_PREEMPTED;
    } else {
        if (finish(r, flags, &err) != TR_OK)
            goto fail;
        code = TR_EXIT_OK;
    }
    goto out;
fail:
    if (r->world > 1)
        tr_log(TR_LOG_ERROR, NULL, "rank %d: %s", r->rank, err.msg);
    else
        tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    tr_run_teardown(r);
    return code;
}

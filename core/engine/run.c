/* Training: tr_train, its phases and the step.  The loop, in shape:
 *
 *   start(r)                        signals, lock run_dir, session, resume, loader, journal
 *   while (step < steps && !stopping)
 *       train_step(r)               forward_backward, agree (ranks), update
 *       end_of_step(r)              what the policies (policies.h) say is due:
 *                                   log, budget, evaluate (early stop, keep-best),
 *                                   checkpoint, stop
 *   stopped by a signal ? preempted(r) (checkpoint, exit 75) : finish(r)
 *
 * run.c owns the loop's state (struct tr_loop, loop.h) and alone changes
 * it; around it: the session (session.c) the loop steps, the end-of-step
 * policies (policies.c: decisions only), what the run writes about itself
 * (journal.c), the run's state in checkpoints, resume and ZeRO-1 shards
 * (run_state.c), the run directory (rundir.c). */
#include "run.h"
#include <trainrun/mix.h>

#include "journal.h"
#include "loop.h"
#include "pipeline_exec.h"
#include "plugin_calls.h"
#include "policies.h"
#include "run_state.h"
#include "rundir.h"
#include "session.h"
#include "stop_signals.h"
#include "../config/precision.h"
#include "../util/util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A training run: the session it steps, the loop's state, its files. */
struct run {
    struct tr_session s;
    struct tr_loop l;
    struct tr_journal j;          /* rank 0 */
    struct tr_rundir_lock lock;   /* rank 0 */
    struct tr_loader *loader;
    struct tr_pipe_exec *pipe;    /* parallel.pipeline > 1: this rank's stage; else NULL */
    struct tr_trace *stage_trace; /* a stage but rank 0's: its own trace-rank<r>.json */
    const struct tr_run_flags *flags;
};

/* ---- signals: finish the step, checkpoint, exit for requeue ----------- */

/* SIGTERM, SIGUSR1 or SIGINT, as stored by the thread that takes them:
 * they are blocked in every thread of the run, and no handler runs on a
 * thread that computes (stop_signals.h says why) */
static volatile sig_atomic_t stop_signal;
static struct tr_stop_signals stop_signals;

/* A stop was requested: alone, as soon as a signal arrives; with other
 * ranks, only what they all agreed at the last step boundary, so every
 * rank stops after the same step. */
static int stopping(const struct run *r)
{
    return r->s.world > 1 ? r->l.agreed_stop : stop_signal != 0;
}

/* What to try when the loss or the gradients are not finite, from what the
 * run is actually doing: no advice to turn on what is already on. */
static void nonfinite_advice(const struct run *r, char *buf, size_t size)
{
    const struct tr_config *cfg = r->s.cfg;
    const char *precision = cfg->precision.plugin->info->name;
    char fp32[128] = "";
    if (r->s.policy.compute != TR_F32)
        snprintf(fp32, sizeof fp32, "train in fp32 (precision = \"fp32\") to see whether %s "
                 "overflows, ", precision);
    if (r->s.opt.applied == 0) { /* the weights are the initial ones: no step size made this */
        snprintf(buf, size, "no update has been applied yet, so the learning rate is not the "
                 "cause: %scheck the data for NaN, inf or huge values (data '%s'), and the "
                 "model's initialisation", fp32, r->s.data.name);
    } else if (cfg->optimizer.clip > 0) {
        snprintf(buf, size, "gradient clipping is already on (optimizer.clip = %g): lower "
                 "optimizer.lr (now %g) or warm up longer, %sor check the data (data '%s') "
                 "for NaN, inf or outliers", cfg->optimizer.clip, cfg->optimizer.lr, fp32,
                 r->s.data.name);
    } else {
        snprintf(buf, size, "lower optimizer.lr (now %g), clip the gradients (optimizer.clip "
                 "= 1.0), %sor check the data (data '%s') for NaN, inf or outliers",
                 cfg->optimizer.lr, fp32, r->s.data.name);
    }
}

/* ---- the phases of a run ------------------------------------------------ */

/* The first lines: whether half precision is native here or an emulation
 * slower than fp32 (the CPU backend's choice, kernels/cpu/gemm.c), tf32,
 * and the memory plan. */
static void say_plan(const struct run *r)
{
    const struct tr_config *cfg = r->s.cfg;
    const struct tr_graph *g = r->s.g;
    if (strcmp(cfg->device, "cpu") == 0 && g->compute != TR_F32)
        fprintf(stderr, "device cpu: %s\n", tr_cpu_gemm_path(g->compute));
    if (g->allow_tf32) /* only device=cuda gets here (tr_precision_check) */
        fprintf(stderr, "device %s: fp32 GEMMs in tf32 on tensor cores (cuBLASLt "
                        "CUBLAS_COMPUTE_32F_FAST_TF32, fp32 accumulation)\n", cfg->device);
    tr_graph_print_memory(g, stderr);
}

/* The loop's record in a checkpoint, and back. */
static void capture(const struct run *r, uint64_t loader_position, struct tr_run_state *st)
{
    const struct tr_loop *l = &r->l;
    memset(st, 0, sizeof *st);
    st->step = l->step;
    st->loader_position = loader_position;
    st->skipped = l->skipped;
    st->cost_usd = l->cost_before + tr_loop_spent(l);
    st->loss = l->loss;
    st->val_loss = l->val_loss;
    snprintf(st->best, sizeof st->best, "%s", l->best);
    st->best_val_loss = l->best_val;
    st->best_step = l->best_step;
    tr_state_capture(&r->s, st);
}

static void restore(struct run *r, const struct tr_run_state *st)
{
    struct tr_loop *l = &r->l;
    l->step = st->step;
    l->skipped = st->skipped;
    l->cost_before = st->cost_usd;
    l->loss = st->loss;
    l->val_loss = st->val_loss;
    snprintf(l->best, sizeof l->best, "%s", st->best);
    l->best_val = st->best_val_loss;
    l->best_step = st->best_step;
    l->position = st->loader_position;
}

/* A checkpoint at loader_position; now: written before returning, else in
 * the background when checkpoint.async. */
static int save(struct run *r, uint64_t loader_position, int now, tr_err *err)
{
    struct tr_run_state st;
    tr_session_settle(&r->s); /* an offloaded update still running: its parameters up */
    /* a stage's replicas each keep a part of its optimizer state: whole for
     * the save, then parted again */
    for (int k = 0; r->pipe && k < r->s.opt.desc->state_slots; k++)
        if (tr_pipe_exec_share_parts(r->pipe, &r->s, r->s.opt.state[k],
                                     tr_optimizer_state_backend(&r->s.opt, &r->s.be),
                                     err) != TR_OK)
            return TR_ERROR;
    /* pipeline stages: each writes its own parameters where the checkpoint
     * plugin takes one checkpoint from several ranks; else the whole model
     * to rank 0, which writes it, then each keeps its own again */
    if (r->pipe && tr_state_can_save_owned(&r->s)) {
        capture(r, loader_position, &st);
        int rc = tr_state_save_owned(&r->s, &st, tr_pipe_exec_owners(r->pipe), err);
        if (tr_pipe_exec_zero(r->pipe))
            tr_pipe_exec_release(r->pipe, &r->s);
        return rc;
    }
    if (r->pipe && tr_pipe_exec_share(r->pipe, &r->s, TR_PIPE_SHARE_SAVE, err) != TR_OK)
        return TR_ERROR;
    capture(r, loader_position, &st);
    int rc = tr_state_save(&r->s, &st, now, err);
    if (r->pipe)
        tr_pipe_exec_release(r->pipe, &r->s);
    return rc;
}

/* The session, then the state it resumes from (if asked and any), the
 * run directory's records, and the pretrained weights of a fresh run. */
static int open_session(struct run *r, tr_err *err)
{
    struct tr_config *cfg = r->s.cfg;
    const struct tr_run_flags *flags = r->flags;
    if (tr_session_open(&r->s, cfg, flags->smoke ? TR_SESSION_SMOKE : TR_SESSION_TRAIN, err) != TR_OK)
        return TR_ERROR;
    r->l.s = &r->s;
    /* pipeline stages (the session checked the ranks and the micro-batches) */
    if (tr_session_stages(&r->s) && !(r->pipe = tr_pipe_exec_new(&r->s, err)))
        return TR_ERROR;
    if (!flags->quiet && r->s.rank == 0)
        say_plan(r);
    /* an adapter's frozen base is in no checkpoint: it loads first */
    int base_first = tr_session_base_first(&r->s);
    if (base_first && tr_session_load_pretrained(&r->s, err) != TR_OK)
        return TR_ERROR;
    struct tr_run_state st;
    int resumed = flags->resume ? tr_state_resume(&r->s, &st, err) : 0;
    if (resumed == TR_ERROR)
        return TR_ERROR;
    if (resumed == 1 && tr_session_check_base(&r->s, st.base, "the checkpoint resumed", err) != TR_OK)
        return TR_ERROR;
    if (resumed == 1)
        restore(r, &st);
    /* resumed from a checkpoint: its weights learnt the recorded tokenizer's ids */
    if (r->s.rank == 0 && tr_rundir_record_tokenizer(&r->s, r->l.step > 0, err) != TR_OK)
        return TR_ERROR;
    /* the recipe it runs, compared with the recorded one when it continues one */
    if (r->s.rank == 0 &&
        tr_rundir_record_recipe(cfg, r->l.step > 0, flags->allow_changes, err) != TR_OK)
        return TR_ERROR;
    if (!base_first && r->l.step == 0 && tr_session_load_pretrained(&r->s, err) != TR_OK)
        return TR_ERROR;
    if (r->s.gather) /* the weights are whole on every rank until here: keep this rank's parts */
        tr_gather_release_all(r->s.gather);
    if (r->pipe) /* and a stage its chunks' */
        tr_pipe_exec_release(r->pipe, &r->s);
    return TR_OK;
}

/* Everything before the first step: the run directory, the session,
 * resume, the loader, the journal; first the thread that takes the stop
 * signals. */
static int start(struct run *r, tr_err *err)
{
    struct tr_config *cfg = r->s.cfg;
    const struct tr_run_flags *flags = r->flags;
    /* before the run starts any thread (the session's OpenMP, checkpoint
     * writer and communication threads, the loader's workers), which all
     * inherit the blocked signals; from here on a signal ends the run with
     * a checkpoint (exit 75), a wait for data included, instead of killing it */
    if (tr_stop_signals_start(&stop_signals, &stop_signal, err) != TR_OK)
        return TR_ERROR;
    /* before anything in run_dir is opened (metrics.jsonl is truncated on a
     * fresh start): rank 0 writes for the whole job, so it alone locks */
    if (cfg->rank.rank == 0 && (tr_rundir_lock(cfg, &r->lock, err) != TR_OK ||
                                (!flags->resume && tr_rundir_refuse_earlier(cfg, err) != TR_OK)))
        return TR_ERROR;
    if (open_session(r, err) != TR_OK)
        return TR_ERROR;
    struct tr_loop *l = &r->l;
    /* the replicas share the data; a replica's pipeline stages each read all
     * of its share (ranks r P .. r P + P - 1 are replica r's stages) */
    int replicas = r->s.replicas, replica = r->s.rank / (r->s.world / replicas);
    if (l->position % (uint64_t)replicas != 0)
        return tr_fail(err, "the checkpoint stopped %llu micro-batches into the data, which %d "
                       "ranks cannot share; resume with a world size that divides the "
                       "micro-batches per step", (unsigned long long)l->position, replicas);
    struct tr_loader_config lc = {TR_SPLIT_TRAIN, (int)r->s.micro_batch,
                                  (int)cfg->train.workers, (int)cfg->train.prefetch, 1,
                                  (uint64_t)cfg->train.seed, r->s.topo, replica, replicas,
                                  /* alone, a signal ends a wait for data; with other
                                   * ranks the step goes on to the boundary where they
                                   * agree to stop (ending it here would fail the job) */
                                  r->s.world == 1 ? &stop_signal : NULL, 0};
    r->loader = tr_loader_open(&r->s.data, &lc, l->position / (uint64_t)replicas, err);
    if (!r->loader)
        return TR_ERROR;
    l->quiet = flags->quiet || r->s.rank != 0;
    l->first_step = l->step;
    l->t_start = tr_now();
    if (r->pipe && r->s.rank != 0 && cfg->train.trace_every > 0) {
        char *path = tr_xasprintf("%s/trace-rank%d.json", cfg->run_dir, r->s.rank);
        r->stage_trace = tr_trace_open(path, l->t_start);
        free(path);
    }
    /* one rank reports */
    return r->s.rank == 0 ? tr_journal_open(&r->j, l, flags->resume, err) : TR_OK;
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
 * applied once at the update (l->loss_norm).  Unmasked, every w_k and the
 * remaining factor are exactly 1: the numbers are those of a plain mean. */
static int forward_backward(struct run *r, double scale, double *loss_sum, double *targets,
                            tr_err *err)
{
    struct tr_session *s = &r->s;
    struct tr_loop *l = &r->l;
    struct tr_trace *trace = r->j.trace;
    /* no pass zeroing the parameter gradients: the first micro-batch's
     * backward writes each (or zeroes it right before its first writer) */
    /* the mean over the micro-batches of every rank, each weighted below */
    double mean = scale / (s->accum * s->world);
    int sampled = trace && l->step % (uint64_t)s->cfg->train.trace_every == 0;
    if (s->gather) /* this step's gathers from here (not an evaluation's before it) */
        tr_gather_take_bytes(s->gather);
    l->gathered = s->gather ? 0 : NAN;
    for (int k = 0; k < s->accum; k++) {
        if (k > 0 && s->world == 1 && stop_signal)
            return STEP_ABANDONED;
        double td = tr_now();
        if (tr_session_load_batch(s, r->loader, &l->t_data, err) != TR_OK)
            /* signalled while the loader was blocked: abandon the step too */
            return s->world == 1 && tr_loader_cancelled(r->loader) ? STEP_ABANDONED : TR_ERROR;
        double t0 = tr_now();
        double n = tr_session_loss_targets(s), w = tr_session_batch_weight(s, n);
        s->g->loss_grad = (float)(mean * w);
        *targets += n;
        s->g->profile = sampled && k == 0; /* per-op timings of one micro-batch */
        s->g->grads_fresh = k == 0;
        /* dropout's masks: from the seed, the step and the micro-batch's
         * place in the step (k * world + rank, the loader's order), only: a
         * resumed run draws what the uninterrupted one did, and ranks what
         * one process accumulating their micro-batches would */
        s->g->dropout_seed = tr_splitmix64(
            (uint64_t)s->cfg->train.seed ^
            tr_splitmix64(l->step * 65536 + (uint64_t)k * (uint64_t)s->world + (uint64_t)s->rank));
        tr_graph_forward(s->g, &s->be);
        *loss_sum += tr_session_read_loss(s) * w;
        /* all-reduce buckets as backward finishes them, after the last
         * micro-batch; sharded gradients are reduce-scattered after every
         * one (each rank then holds only its parts, summed so far) */
        int scatter = s->comm && s->shard.level >= TR_SHARD_GRADIENTS;
        if (s->comm && (k == s->accum - 1 || scatter))
            tr_comm_arm(s->comm, s->g);
        tr_graph_backward(s->g, &s->be);
        if (scatter && k < s->accum - 1 && tr_comm_finish(s->comm, s->g, err) != TR_OK)
            return TR_ERROR;
        if (s->gather && k == s->accum - 1) /* the update changes this rank's parts only */
            tr_gather_release_all(s->gather);
        double t1 = tr_now();
        /* waits for sharded parameters' gathers (or the updated parts' of an
         * overlapped offload) are communication, not compute */
        double gathering = s->gather ? tr_gather_take_waited(s->gather)
                           : s->share ? tr_gather_take_waited(s->share) : 0;
        if (s->gather)
            l->gathered += tr_gather_take_bytes(s->gather);
        l->t_compute += t1 - t0 - gathering;
        l->t_comm += gathering;
        tr_trace_phase(trace, "data wait", l->step, td, t0);
        tr_trace_phase(trace, "forward+backward", l->step, t0, t1);
        if (s->g->profile)
            tr_trace_ops(trace, s->g, l->step);
        s->g->profile = 0;
    }
    return TR_OK;
}

/* With ranks: the last gradient buckets, then one small agreement: the
 * loss, the targets it was taken on, whether any rank was signalled, and
 * rank 0's budget verdict.  The count travels as two floats, n / 4096 and
 * n % 4096, each summed exactly (below 2^24) up to 2^36 targets a step. */
static int agree(struct run *r, double *loss_sum, double *targets, tr_err *err)
{
    struct tr_loop *l = &r->l;
    double tw = tr_now();
    float agree[5] = {(float)*loss_sum, stop_signal ? 1.0f : 0.0f,
                      r->s.rank == 0 && tr_loop_over_budget(l) ? 1.0f : 0.0f,
                      (float)floor(*targets / 4096), (float)fmod(*targets, 4096)};
    if (tr_comm_finish(r->s.comm, r->s.g, err) != TR_OK ||
        tr_comm_allreduce_host(r->s.comm, agree, 5, err) != TR_OK)
        return TR_ERROR;
    *loss_sum = agree[0];
    l->agreed_stop = agree[1] > 0;
    l->budget_stop = agree[2] > 0;
    *targets = (double)agree[3] * 4096 + (double)agree[4];
    l->t_comm += tr_now() - tw;
    tr_trace_phase(r->j.trace,
                   r->s.shard.level >= TR_SHARD_GRADIENTS ? "gradient reduce-scatter wait"
                                                          : "gradient all-reduce wait",
                   l->step, tw, tr_now());
    return TR_OK;
}

/* Pipeline stages (pipeline_exec.h): the step's micro-batches through
 * this rank's stage, then one agreement as agree()'s: the loss (the last
 * stage's), whether any rank was signalled, rank 0's budget verdict, and
 * the seconds every stage computed and took, whose ratio is the share of
 * the step the stages sat idle (the bubble, communication included).
 * Every stage counted the targets itself. */
static int pipeline_step(struct run *r, double scale, double *loss_sum, double *targets,
                         tr_err *err)
{
    struct tr_session *s = &r->s;
    struct tr_loop *l = &r->l;
    struct tr_pipe_step ps;
    double mean = scale / (s->accum * s->replicas);
    if (tr_pipe_exec_step(r->pipe, s, r->loader, mean, l->step, &ps, err) != TR_OK)
        return TR_ERROR;
    double wall = ps.t1 - ps.t0;
    l->t_compute += ps.busy;
    l->t_comm += ps.waited;
    double tw = tr_now();
    int C = tr_pipe_exec_chunks(r->pipe);
    /* the targets: every stage counted its replica's, the first stages tell */
    int first = tr_pipe_exec_stage(r->pipe) == 0;
    /* the step's length is the slowest rank's: a stage done early waits for
     * the others at the agreement, which is idle too (each rank's wall in a
     * slot of its own, the largest taken) */
    size_t n_agree = 6 + 2 * (size_t)C + (size_t)s->world;
    float *agree = tr_xcalloc(n_agree, sizeof *agree);
    /* the targets in two floats, as agree() sends them: exact past 2^24 */
    double t = first ? ps.targets : 0;
    float head[6] = {(float)ps.loss_sum, stop_signal ? 1.0f : 0.0f,
                     r->s.rank == 0 && tr_loop_over_budget(l) ? 1.0f : 0.0f, (float)ps.busy,
                     (float)floor(t / 4096), (float)fmod(t, 4096)};
    memcpy(agree, head, sizeof head);
    memcpy(agree + 6, ps.forward, (size_t)C * sizeof(float));
    memcpy(agree + 6 + C, ps.backward, (size_t)C * sizeof(float));
    agree[6 + 2 * C + s->rank] = (float)wall;
    if (tr_comm_allreduce_host(s->comm, agree, n_agree, err) != TR_OK) {
        free(agree);
        return TR_ERROR;
    }
    double longest = 0;
    for (int q = 0; q < s->world; q++)
        longest = agree[6 + 2 * C + q] > longest ? agree[6 + 2 * C + q] : longest;
    /* the simulator (pipeline.h) fed with the chunks' measured times: what
     * it predicts for this step's schedule, beside what was measured */
    double fw[TR_PIPE_MAX_CHUNKS], bw[TR_PIPE_MAX_CHUNKS];
    for (int c = 0; c < C; c++) { /* the replicas' mean */
        fw[c] = agree[6 + c] / s->replicas;
        bw[c] = agree[6 + C + c] / s->replicas;
    }
    const struct tr_parallel_config *par = &s->cfg->parallel;
    struct tr_pipe_sim sim;
    tr_err ignored = {{0}};
    l->pipe_idle_sim = tr_pipe_simulate(par->schedule_kind, (int)par->pipeline,
                                        (int)par->virtual_stages, s->accum, fw, bw, &sim,
                                        &ignored) == TR_OK ? sim.bubble : NAN;
    /* and as C stages of one chunk each: a run of P stages x V chunks
     * measures the stage times of a pipeline C deep, so 2 stages x 4
     * predict 8 stages from measured times rather than FLOPs */
    l->pipe_idle_chunks = C > par->pipeline &&
                                  tr_pipe_simulate(TR_PIPE_1F1B, C, 1, s->accum, fw, bw, &sim,
                                                   &ignored) == TR_OK
                              ? sim.bubble : NAN;
    *loss_sum = agree[0];
    *targets = (double)agree[4] * 4096 + (double)agree[5];
    l->agreed_stop = agree[1] > 0;
    l->budget_stop = agree[2] > 0;
    l->pipe_idle = longest > 0 ? 1.0 - agree[3] / (longest * s->world) : NAN;
    free(agree);
    l->t_comm += tr_now() - tw;
    struct tr_trace *trace = r->s.rank == 0 ? r->j.trace : r->stage_trace;
    if (trace && l->step % (uint64_t)s->cfg->train.trace_every == 0) {
        static const char *const kinds[] = {"forward", "backward", "send/recv before"};
        const struct tr_pipe_span *sp;
        size_t n = tr_pipe_exec_spans(r->pipe, &sp);
        char name[64];
        for (size_t i = 0; i < n; i++) {
            if (sp[i].micro < 0)
                snprintf(name, sizeof name, "send/recv after the last op");
            else
                snprintf(name, sizeof name, "%s micro-batch %d chunk %d", kinds[sp[i].kind],
                         sp[i].micro, sp[i].chunk);
            if (sp[i].kind == TR_PIPE_SPAN_SENDRECV)
                tr_trace_comm(trace, name, l->step, sp[i].t0, sp[i].t1);
            else
                tr_trace_phase(trace, name, l->step, sp[i].t0, sp[i].t1);
        }
    }
    return TR_OK;
}

struct sumsq_ctx {
    const struct tr_session *s;
    double sum;
};

static void add_run_sumsq(void *ctx, struct tr_shard_run r, size_t state_at)
{
    struct sumsq_ctx *c = ctx;
    (void)state_at;
    c->sum += tr_be_sum_squares(&c->s->be, c->s->g->grads + r.begin, r.end - r.begin);
}

/* The squared norm of the step's summed gradients: over the whole buffer,
 * or (shard level gradients, where each rank holds only its parts summed)
 * over each rank's parts, every rank's double then gathered (as the bytes
 * of two floats) and added in rank order: the same double on every rank. */
static int gradient_sumsq(const struct run *r, struct tr_session *s, double *sumsq, tr_err *err)
{
    if (r->pipe)
        return tr_pipe_exec_sumsq(r->pipe, s, sumsq, err);
    if (!s->comm || s->shard.level < TR_SHARD_GRADIENTS || s->world < 2) {
        *sumsq = tr_be_sum_squares(&s->be, s->g->grads, s->g->n_params);
        return TR_OK;
    }
    struct sumsq_ctx c = {s, 0};
    tr_optimizer_runs(&s->opt, add_run_sumsq, &c);
    _Static_assert(sizeof(double) == 2 * sizeof(float), "a double travels as two floats");
    double *all = tr_xcalloc((size_t)s->world, sizeof *all);
    all[s->rank] = c.sum;
    int rc = tr_comm_allgather_host(s->comm, (float *)all, 2, err);
    *sumsq = 0;
    for (int q = 0; q < s->world; q++)
        *sumsq += all[q];
    free(all);
    return rc;
}

/* Unscale, check, clip, update.  The precision plugin decides whether a step
 * with non-finite gradients is skipped; without that slot it ends the run. */
static int update(struct run *r, double scale, tr_err *err)
{
    struct tr_session *s = &r->s;
    struct tr_loop *l = &r->l;
    const struct tr_config *cfg = s->cfg;
    double t0 = tr_now();
    if (l->step_targets == 0) {
        /* every target of the step was masked: no gradient, nothing to learn */
        if (l->empty_steps++ == 0)
            tr_log(TR_LOG_WARN, NULL, "step %llu: every target of the step's batch is masked "
                   "(windows of prompt tokens only, no response): no update is applied; "
                   "such steps are counted in the summary (longer sequences or shorter "
                   "prompts avoid them)", (unsigned long long)l->step + 1);
        l->grad_norm = 0;
        l->lr = tr_schedule_lr(&cfg->schedule, l->step, (uint64_t)cfg->train.steps, cfg->optimizer.lr);
        l->t_optimizer += tr_now() - t0;
        return TR_OK;
    }
    double sumsq;
    if (gradient_sumsq(r, s, &sumsq, err) != TR_OK)
        return TR_ERROR;
    int finite = isfinite(sumsq) && isfinite(l->loss);
    l->grad_norm = sqrt(sumsq) / scale * l->loss_norm;
    if (!finite && !tr_precision_decides_steps(&cfg->precision)) {
        char advice[512];
        nonfinite_advice(r, advice, sizeof advice);
        return tr_fail(err, "step %llu: the %s not finite (loss %g); %s",
                       (unsigned long long)l->step,
                       isfinite(l->loss) ? "gradients are" : "loss is", l->loss, advice);
    }
    int apply = tr_precision_update(&cfg->precision, finite, err);
    if (apply == TR_ERROR)
        return TR_ERROR;
    l->lr = tr_schedule_lr(&cfg->schedule, l->step, (uint64_t)cfg->train.steps, cfg->optimizer.lr);
    if (apply) {
        double clip = cfg->optimizer.clip > 0 && l->grad_norm > cfg->optimizer.clip
                          ? cfg->optimizer.clip / l->grad_norm : 1.0;
        tr_optimizer_step(&s->opt, s->g, &s->be, clip * l->loss_norm / scale, l->lr);
    } else {
        l->skipped++;
    }
    double tg = tr_now();
    l->t_optimizer += tg - t0;
    tr_trace_phase(r->j.trace, "optimizer", l->step, t0, tg);
    if (apply && r->pipe && tr_pipe_exec_zero(r->pipe)) { /* a stage's replicas' parts to all */
        if (tr_pipe_exec_share_parts(r->pipe, s, s->g->params, &s->be, err) != TR_OK)
            return TR_ERROR;
        l->t_comm += tr_now() - tg;
        tr_trace_phase(r->j.trace, "parameter all-gather", l->step, tg, tr_now());
    } else if (apply && s->share) /* updated parts to all as the host finishes them (gather.h) */
        tr_gather_refresh(s->share);
    else if (apply && s->comm && tr_state_sharded(s) && !s->gather) { /* updated parts to all */
        if (tr_state_share_params(s, err) != TR_OK)
            return TR_ERROR;
        l->t_comm += tr_now() - tg; /* exposed: nothing computes meanwhile */
        tr_trace_phase(r->j.trace, "parameter all-gather", l->step, tg, tr_now());
    }
    return TR_OK;
}

/* The step's collectives, as the communication thread ran them, on the
 * trace's collectives track; recording stops. */
static void trace_collectives(struct run *r)
{
    const struct tr_comm_span *sp;
    size_t n = tr_comm_spans(r->s.comm, &sp);
    char name[96];
    for (size_t i = 0; i < n; i++) {
        double b = (double)sp[i].bytes;
        if (b >= 1 << 20)
            snprintf(name, sizeof name, "%s %.3g MiB", sp[i].kind, b / (1 << 20));
        else if (b >= 1 << 10)
            snprintf(name, sizeof name, "%s %.3g KiB", sp[i].kind, b / (1 << 10));
        else
            snprintf(name, sizeof name, "%s %.0f B", sp[i].kind, b);
        tr_trace_comm(r->j.trace, name, r->l.step, sp[i].t0, sp[i].t1);
    }
    tr_comm_record(r->s.comm, 0);
}

/* One optimizer step: TR_OK, STEP_ABANDONED or TR_ERROR. */
static int train_step(struct run *r, tr_err *err)
{
    struct tr_session *s = &r->s;
    struct tr_loop *l = &r->l;
    uint64_t step_start = tr_loader_position(r->loader) * (uint64_t)s->replicas;
    double scale = tr_precision_loss_scale(&s->cfg->precision), loss_sum = 0, targets = 0;
    /* a sampled step's collectives go to the trace too */
    int spans = s->comm && r->j.trace && l->step % (uint64_t)s->cfg->train.trace_every == 0;
    if (spans)
        tr_comm_record(s->comm, 1);
    double waited = tr_optimizer_offload_waited(&s->opt);
    int rc = r->pipe ? pipeline_step(r, scale, &loss_sum, &targets, err)
                     : forward_backward(r, scale, &loss_sum, &targets, err);
    l->offload_wait = tr_optimizer_offload_waited(&s->opt) - waited; /* NaN: not overlapped */
    if (rc == STEP_ABANDONED)
        l->position = step_start; /* the preemption checkpoint resumes at the step's start */
    if (rc != TR_OK && spans)
        tr_comm_record(s->comm, 0);
    if (rc != TR_OK)
        return rc;
    if (s->comm && !r->pipe && agree(r, &loss_sum, &targets, err) != TR_OK)
        return TR_ERROR;
    double full = (double)s->target_count * s->accum * s->replicas;
    l->step_targets = targets;
    l->loss_norm = targets == full ? 1.0 : targets > 0 ? full / targets : 0.0;
    l->loss = loss_sum / (s->accum * s->replicas) * l->loss_norm;
    if (update(r, scale, err) != TR_OK)
        return TR_ERROR;
    if (spans)
        trace_collectives(r);
    /* the host's update since the last step: within this step, or (overlapped)
     * the step before's, run beside this forward */
    double busy = tr_optimizer_offload_busy(&s->opt);
    l->offload_update = busy - (isnan(l->offload_busy) ? 0 : l->offload_busy);
    l->offload_busy = busy;
    l->step++;
    l->tokens += (double)s->cfg->train.batch * s->data.info.target_len;
    l->position = tr_loader_position(r->loader) * (uint64_t)s->replicas;
    return TR_OK;
}

/* ---- the end of a step: what the policies say is due --------------------- */

/* Validation, then what reads its loss: the schedule's observe, early
 * stopping, keep-best.  *improved: a new best to checkpoint. */
static int evaluate(struct run *r, int *improved, tr_err *err)
{
    struct tr_loop *l = &r->l;
    double te = tr_now();
    tr_session_settle(&r->s); /* an offloaded update still running: its parameters up */
    /* pipeline stages: each replica's micro-batches through its stages, each
     * stage on its own weights; the last stage counts */
    uint64_t batches = (uint64_t)r->s.cfg->train.eval_batches;
    int rc;
    if (r->pipe) {
        struct tr_eval_pass pass = {tr_pipe_exec_forward, r->pipe, tr_pipe_exec_replica(r->pipe),
                                    r->s.replicas, tr_pipe_exec_has_loss(r->pipe)};
        rc = tr_session_evaluate_pass(&r->s, TR_SPLIT_VAL, batches, &pass, &l->val_loss,
                                      &l->val_accuracy, NULL, err);
    } else {
        rc = tr_session_evaluate(&r->s, TR_SPLIT_VAL, batches, &l->val_loss, &l->val_accuracy,
                                 NULL, err);
    }
    if (rc != TR_OK)
        return TR_ERROR;
    l->t_eval += tr_now() - te;
    tr_trace_phase(r->j.trace, "evaluation", l->step, te, tr_now());
    if (r->s.rank == 0 && tr_journal_eval(&r->j, l, err) != TR_OK)
        return TR_ERROR;
    tr_schedule_observe(&r->s.cfg->schedule, l->step, l->val_loss);
    struct tr_early_stop e = tr_policy_early_stop(l, l->val_loss);
    l->stop_best = e.best;
    l->stop_misses = e.misses;
    l->stopped_early = e.stopped_at;
    if ((*improved = tr_policy_is_best(l, l->val_loss))) {
        l->best_val = l->val_loss;
        l->best_step = l->step;
        snprintf(l->best, sizeof l->best, "step-%010llu", (unsigned long long)l->step);
    }
    return TR_OK;
}

/* A checkpoint the cadence asks for; only the run's last must land (any
 * other failed save is said and training goes on). */
static int checkpoint(struct run *r, enum tr_checkpoint_due due, tr_err *err)
{
    tr_err cerr = {{0}};
    double tc = tr_now();
    int final = due == TR_CHECKPOINT_FINAL;
    if (final)
        r->l.rss_train_mib = tr_peak_rss_mib();
    if (final && r->pipe && !r->flags->quiet) /* each stage holds its share: say what */
        tr_log(TR_LOG_INFO, NULL, "pipeline stage %d (replica %d): %.0f MiB resident after "
               "training (peak %.0f MiB, loading the weights included)",
               tr_pipe_exec_stage(r->pipe), tr_pipe_exec_replica(r->pipe), tr_rss_mib(),
               tr_peak_rss_mib());
    if (save(r, r->l.position, final, &cerr) != TR_OK) {
        if (final) {
            *err = cerr;
            return TR_ERROR;
        }
        tr_log(TR_LOG_ERROR, NULL, "%s", cerr.msg);
    }
    tr_trace_phase(r->j.trace, "checkpoint stall", r->l.step, tc, tr_now());
    return TR_OK;
}

/* After each step, in the policies' order: 1 when the run stops here. */
static int end_of_step(struct run *r, tr_err *err)
{
    struct tr_loop *l = &r->l;
    int improved = 0;
    if (tr_policy_log_due(l) && r->s.rank == 0 && tr_journal_step(&r->j, l, err) != TR_OK)
        return TR_ERROR;
    if (tr_policy_budget_warn(l)) {
        const struct tr_cost_config *c = &r->s.cfg->cost;
        double dollars = l->cost_before + tr_loop_spent(l);
        l->budget_warned = 1;
        tr_log(TR_LOG_WARN, "budget", "$%.2f spent, %.0f%% of the $%.2f budget (cost.budget)",
               dollars, 100 * dollars / c->budget, c->budget);
    }
    l->budget_stop = tr_policy_budget_stop(l, l->budget_stop);
    if (tr_policy_eval_due(l) && evaluate(r, &improved, err) != TR_OK) {
        /* alone, the trained weights are not lost with the evaluation (with
         * ranks the others may be stuck in its collective: no save) */
        tr_err cerr = {{0}};
        if (r->s.world == 1 && r->s.ckpt && save(r, l->position, 1, &cerr) == TR_OK)
            tr_log(TR_LOG_WARN, NULL, "the evaluation at step %llu failed (below); the weights "
                   "it evaluated are saved in checkpoint step-%010llu: fix the validation data "
                   "and --resume auto", (unsigned long long)l->step, (unsigned long long)l->step);
        else if (r->s.world == 1 && r->s.ckpt)
            tr_log(TR_LOG_ERROR, NULL, "%s", cerr.msg);
        return TR_ERROR;
    }
    enum tr_checkpoint_due due = tr_policy_checkpoint_due(l, improved, stopping(r));
    if (due != TR_CHECKPOINT_NONE && checkpoint(r, due, err) != TR_OK)
        return TR_ERROR;
    enum tr_stop_reason why = tr_policy_stop(l);
    if (why != TR_STOP_NONE) {
        tr_policy_say_stop(l, why);
        return 1;
    }
    if (tr_trace_error(r->j.trace))
        return tr_journal_trace_failed(&r->j, l, tr_trace_error(r->j.trace), err);
    return TR_OK;
}

/* ---- the end of a run ------------------------------------------------------- */

/* Preemption: a signal stopped the loop before the last step; checkpoint
 * now, within checkpoint.deadline, and exit 75 for the launcher to requeue. */
static int preempted(struct run *r, tr_err *err)
{
    int sig = stop_signal ? (int)stop_signal : SIGTERM;
    double t0 = tr_now();
    if (save(r, r->l.position, 1, err) != TR_OK ||
        (r->s.ckpt && tr_checkpointer_wait(r->s.ckpt, err) != TR_OK))
        return TR_ERROR;
    double took = tr_now() - t0;
    if (took > r->s.cfg->checkpoint_policy.deadline)
        tr_log(TR_LOG_WARN, NULL, "the preemption checkpoint took %.1f s, over the %.0f s "
               "deadline (checkpoint.deadline)", took, r->s.cfg->checkpoint_policy.deadline);
    tr_log(TR_LOG_WARN, NULL, "received signal %d: checkpoint of step %llu saved in %.2f s; "
           "exiting with code %d (requeue, then --resume auto)", sig,
           (unsigned long long)r->l.step, took, TR_EXIT_PREEMPTED);
    return tr_journal_close(&r->j, &r->l, err);
}

/* The end of a finished run: the last checkpoint landed (and, for a smoke
 * run, reads back), metrics and trace on disk, the summary. */
static int finish(struct run *r, tr_err *err)
{
    struct tr_checkpointer *ckpt = r->s.ckpt;
    if (ckpt && tr_checkpointer_wait(ckpt, err) != TR_OK)
        return TR_ERROR; /* the final checkpoint did not land */
    /* a smoke run's checkpoint reads back what rank 0 holds: with stages,
     * every stage's weights (the others' are given back after training) */
    if (r->flags->smoke && r->pipe &&
        tr_pipe_exec_share(r->pipe, &r->s, TR_PIPE_SHARE_PARAMS, err) != TR_OK)
        return TR_ERROR;
    if (r->flags->smoke && tr_state_gather_params(&r->s, err) != TR_OK) /* sharded parameters */
        return TR_ERROR;
    if (r->flags->smoke && ckpt && tr_state_round_trip(&r->s, r->l.step, err) != TR_OK)
        return TR_ERROR;
    if (tr_journal_close(&r->j, &r->l, err) != TR_OK)
        return TR_ERROR;
    if (!r->l.quiet)
        tr_journal_summary(&r->l, tr_now() - r->l.t_start, ckpt ? tr_checkpointer_stall(ckpt) : 0);
    return TR_OK;
}

/* ---- the training loop ---------------------------------------------------- */

int tr_train(struct tr_config *cfg, const struct tr_run_flags *flags)
{
    struct run *r = tr_xcalloc(1, sizeof *r);
    r->s.cfg = cfg;
    r->l.s = &r->s;
    r->l.val_loss = r->l.best_val = r->l.stop_best = r->l.loss = r->l.pipe_idle = r->l.pipe_idle_sim =
        r->l.pipe_idle_chunks = r->l.gathered = r->l.offload_wait = r->l.offload_update =
        r->l.offload_busy = NAN;
    r->flags = flags;
    tr_err err = {{0}};
    int code = TR_EXIT_ERROR, rc = TR_OK;
    if (start(r, &err) != TR_OK)
        goto fail;
    while (r->l.step < (uint64_t)cfg->train.steps && !stopping(r)) {
        rc = train_step(r, &err); /* forward, backward, update */
        if (rc == STEP_ABANDONED)
            break;
        if (rc != TR_OK || (rc = end_of_step(r, &err)) == TR_ERROR)
            goto fail;
        if (rc == 1) /* a policy stopped the run */
            break;
    }
    if (stopping(r) && r->l.step < (uint64_t)cfg->train.steps) {
        if (preempted(r, &err) != TR_OK)
            goto fail;
        code = TR_EXIT_PREEMPTED;
    } else {
        if (finish(r, &err) != TR_OK)
            goto fail;
        code = TR_EXIT_OK;
    }
    goto out;
fail:
    if (r->s.world > 1)
        tr_log(TR_LOG_ERROR, NULL, "rank %d: %s", r->s.rank, err.msg);
    else
        tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    tr_journal_drop(&r->j);
    tr_loader_close(r->loader);
    if (r->stage_trace && tr_trace_close(r->stage_trace) != 0)
        tr_log(TR_LOG_WARN, "trace", "rank %d: trace-rank%d.json could not be written whole",
               r->s.rank, r->s.rank);
    if (r->pipe)
        tr_pipe_exec_free(r->pipe, &r->s.be);
    tr_session_close(&r->s);
    tr_rundir_unlock(&r->lock); /* last: the run directory is ours until everything is written */
    tr_stop_signals_end(&stop_signals); /* the caller's signal mask back */
    free(r);
    return code;
}

/* A session: everything a command needs to run a recipe's model, built in
 * one place (session.c) for every command that runs one: training, smoke
 * runs, `trainrun eval`, `trainrun sample` and `trainrun plan`.
 *
 *   tr_session_open(s, cfg, mode)     (weights: the graph, plan and initial weights only)
 *       placement (hwloc)           threads pinned, ranks apart        train, smoke
 *       backend                     device=, threads                   all (plan: cpu, measured)
 *       comm                        procs=N / gpus=N                   train, smoke
 *       precision policy            the compute dtype, checked         all
 *       micro-batch                 the recipe's, or "auto" (fit.h)    all
 *       graph + memory plan         allocated (plan: measured only)    all
 *                                   (eval, sample, weights: forward only, no gradients)
 *       data source                 checked against the model          all but plan
 *       steps                       train.tokens / train.epochs        train, smoke (plan: its own)
 *       optimizer state, shards     this rank's parts (parallel.shard) train, smoke
 *       host input buffers, checkpointer (rank 0), prices              train, smoke
 *   tr_session_close(s)             undoes whatever of it was done
 *
 * The session holds no loop state (step, timers, best: run.c) and calls
 * nothing back; the files that use it read it. */
#ifndef TR_SESSION_H
#define TR_SESSION_H

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "gather.h"
#include "fit.h"
#include "graph.h"
#include "loader.h"
#include "optim.h"
#include "../config/run_config.h"
#include "topo.h"
#include "../util/util.h"

enum tr_session_mode {
    TR_SESSION_TRAIN,  /* everything a training run needs */
    TR_SESSION_SMOKE,  /* a training session of a smoke run (the caller made it small) */
    TR_SESSION_EVAL,   /* forward only: a plan without gradients or optimizer state
                        * (tr_graph_plan_forward), no run directory or checkpoints */
    TR_SESSION_SAMPLE, /* as eval */
    TR_SESSION_PLAN,   /* the memory plan measured on the CPU backend, nothing allocated,
                        * no data opened, no plugin but the precision policy's */
    TR_SESSION_WEIGHTS,/* the model and its weights alone (export --merge): planned and
                        * allocated, no data, no plugin but the precision policy's */
};

struct tr_session {
    struct tr_config *cfg;
    enum tr_session_mode mode;
    int rank, world;                    /* this rank of `world` (1 and 0 alone) */
    struct tr_topo *topo;               /* NULL: threads not pinned */
    struct tr_backend be;
    struct tr_comm *comm;               /* NULL when alone */
    struct tr_precision_policy policy;
    int64_t micro_batch;                /* samples per forward: the recipe's or "auto"'s */
    struct tr_fit_device device;        /* the memory the plan must fit */
    struct tr_graph *g;                 /* at micro_batch; planned (plan mode: measured) */
    struct tr_data_source data;         /* not in plan mode */
    struct tr_optimizer opt;            /* train and smoke only */
    /* parallel.offload = "optimizer": the CPU backend that updates the
     * optimizer's host state (opt.offload); iface NULL otherwise */
    struct tr_backend host_be;
    struct tr_shard shard;              /* who keeps which part (parallel.shard; shard.h) */
    struct tr_gather *gather;           /* shard level parameters: the units gathered around
                                         * the nodes that read them (gather.h); else NULL */
    struct tr_gather *share;            /* levels optimizer and gradients under an offloaded
                                         * update overlapping the forward: the updated units
                                         * gathered as the forward needs them; else NULL */
    int replicas;                       /* data-parallel replicas: world, or world / stages */
    /* pipeline stages (tr_session_stages): for each tensor, the stages
     * whose chunks read it as a parameter (tr_pipe_readers), so that a stage
     * initialises and loads only those; NULL without stages or where the
     * backend cannot give memory back */
    uint64_t *stage_readers;
    int accum;                          /* micro-batches per optimizer step on this rank */
    uint32_t vocab;                     /* token ids must be below this */
    void *host_inputs;                  /* one micro-batch from the loader */
    int32_t *host_targets;
    size_t input_bytes, target_count;
    struct tr_checkpointer *ckpt;       /* rank 0 of a train or smoke session */
    /* an adapter run's base (lora): what its checkpoints record and a
     * resume, eval or export must find again: "crc32:<hex> <dir>" of the
     * model.from weights loaded, or "seed:<n>" of a base made from the seed */
    char base_identity[64];
    /* eval --logits FILE: the first micro-batch's ids and logits written
     * there (safetensors) by tr_session_evaluate; NULL: not */
    const char *logits_out;
    /* sample: bytes of the key/value cache its plan keeps (attention's
     * inputs, tr_graph_plan_forward_cached); 0: none, each token re-runs the
     * whole context (the graph or backend cannot run windows of rows) */
    size_t kv_cache;
    /* cost: dollars per second of the job, the FLOP/s its devices peak at */
    double usd_per_second, peak_flops, flops_per_token;
};

/* Build what `mode` needs for cfg's recipe (the rank comes from cfg->rank).
 * On failure err says why; tr_session_close undoes whatever was done. */
int tr_session_open(struct tr_session *s, struct tr_config *cfg, enum tr_session_mode mode,
                    tr_err *err);
void tr_session_close(struct tr_session *s);

/* How the session's model is measured for fit.h: its compute dtype, the
 * training run's optimizer state (in every mode: the micro-batch is the
 * run's decision), the device it plans for. */
struct tr_fit_model tr_session_fit_model(const struct tr_session *s);
/* The same for the micro-batch search (micro_batch = "auto", plan's largest
 * micro-batch), and the samples a device's micro-batches share a step
 * (*per_device): the batch over the run's replicas, or the plan's devices
 * (under stages, over the replicas they make); under stages each measure
 * is the largest stage's (fit.h). */
struct tr_fit_model tr_session_fit_search(const struct tr_session *s, int64_t *per_device);


/* model = { from = "DIR" }: DIR's weights into the parameters (a fresh run
 * only: a resumed one has its checkpoint's); TR_OK when there is none.
 * With adapters (lora) the base is frozen and in no checkpoint: it loads
 * before a resume too (tr_session_base_first), then lora.from's adapter. */
int tr_session_load_pretrained(struct tr_session *s, tr_err *err);
/* Whether the pretrained weights load before any checkpoint (adapters). */
int tr_session_base_first(const struct tr_session *s);
/* A checkpoint's recorded base (`recorded`, "" when none) against the one
 * loaded: a different base is refused, naming the checkpoint (`what`). */
int tr_session_check_base(const struct tr_session *s, const char *recorded, const char *what,
                          tr_err *err);

/* ---- micro-batches on the device (session.c) ------------------------------ */

/* The pipeline stages this session runs (parallel.pipeline, one a rank):
 * a training run's, or a smoke run's on ranks; 0 when none (a process
 * alone runs every stage's arithmetic itself). */
int tr_session_stages(const struct tr_session *s);
/* An offloaded update overlapping the forward: every updated parameter on
 * the device and shared (before a checkpoint or an evaluation reads them). */
void tr_session_settle(struct tr_session *s);
/* Whether this rank keeps tensor t (ctx: the session): a parameter another
 * pipeline stage alone reads, no; anything else, yes. */
int tr_session_stage_keeps(void *ctx, const struct tr_tensor *t);

/* The loader's next micro-batch, checked (token ids inside the vocabulary)
 * and uploaded into the graph's inputs; *wait (when not NULL) adds the
 * seconds spent waiting for it. */
int tr_session_load_batch(struct tr_session *s, struct tr_loader *loader, double *wait,
                          tr_err *err);
/* Targets of the loaded micro-batch the loss averages over: all but the
 * cross-entropy's ignore_index (masked instruction data). */
double tr_session_loss_targets(const struct tr_session *s);
/* A micro-batch's share relative to one whose every target counts: 1.0
 * exactly for unmasked data. */
double tr_session_batch_weight(const struct tr_session *s, double targets);
float tr_session_read_loss(const struct tr_session *s);

/* ---- evaluation (evaluate.c) --------------------------------------------- */

/* The one evaluation: the mean loss (and accuracy, NaN when the backend
 * cannot count it) over the first max_batches micro-batches of split in
 * order, or all of them when fewer, the ranks sharing them; *batches (when
 * not NULL) gets how many.  The run, `trainrun eval` and smoke runs call it. */
int tr_session_evaluate(struct tr_session *s, enum tr_split split, uint64_t max_batches,
                        double *loss, double *accuracy, uint64_t *batches, tr_err *err);

/* The same with another forward: forward(ctx, s, err) runs a micro-batch
 * whose inputs are in the graph; the micro-batches are shared among
 * `parts` groups of ranks, this rank being in group `part` (every rank of a
 * group reads the same ones), and only the ranks that `count` add the
 * loss and accuracy the forward left in the graph (pipeline stages: a
 * replica's stages read the same micro-batches, its last stage counts). */
struct tr_eval_pass {
    int (*forward)(void *ctx, struct tr_session *s, tr_err *err);
    void *ctx;
    int part, parts, count;
};
int tr_session_evaluate_pass(struct tr_session *s, enum tr_split split, uint64_t max_batches,
                             const struct tr_eval_pass *pass, double *loss, double *accuracy,
                             uint64_t *batches, tr_err *err);

/* Before the first step or read: split holds one micro-batch at least (an
 * evaluation needs one), else an error saying which lever gives it one.
 * `for_training`: the validation split a run evaluates on at its end and
 * every train.eval_every steps, checked when the session opens. */
int tr_session_check_split(const struct tr_session *s, enum tr_split split, int for_training,
                           tr_err *err);
/* The samples an evaluation of split reads: those that do not overlap. */
uint64_t tr_session_eval_samples(const struct tr_data_info *di, enum tr_split split);

/* The data against the model and the validation split against the
 * session's micro-batch, in a plan session too (--smoke measures the
 * recipe's own micro-batch in one, then trains at micro-batch 1). */
int tr_session_check_data(struct tr_session *s, tr_err *err);

#endif

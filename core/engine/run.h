/* The commands that run a recipe's model, each a client of the session
 * (session.h): training (run.c, with its policies in policies.c and its
 * files in journal.c), smoke runs (smoke.c), sampling (sample.c) and
 * evaluation (evaluate.c).  `trainrun plan` (commands/plan.c) is one too. */
#ifndef TR_RUN_H
#define TR_RUN_H

#include "../config/run_config.h"

/* Exit codes a launcher can act on. */
#define TR_EXIT_OK 0
#define TR_EXIT_ERROR 1
#define TR_EXIT_USAGE 2
#define TR_EXIT_PREEMPTED 75 /* checkpointed after SIGTERM/SIGUSR1: requeue and --resume auto */

struct tr_run_flags {
    int resume;   /* continue from the newest good checkpoint if any */
    int quiet;    /* no progress lines */
    int smoke;    /* a smoke run: end with a checkpoint save+load round trip */
    int allow_changes; /* a resume may change what the recorded recipe trains */
};

/* `trainrun --smoke`: the recipe's memory at its full micro-batch against the
 * target device, then 2 optimizer steps on the CPU with a tiny batch through
 * the real data source and a checkpoint round trip.  Prints "ready to launch"
 * or the failure.  A recipe of several ranks (procs, gpus, a shard level,
 * pipeline stages) takes its steps on 2 CPU ranks (2 stages), started by
 * launch(ranks, argv) (the command's launcher) as `--smoke` ranks of their
 * own, which find the scratch run directory in TRAINRUN_SMOKE_DIR. */
int tr_smoke(const char *recipe, const char *const *overrides, int n_overrides, int quiet,
             int (*launch)(int ranks, char *const *argv));

/* Train the configured recipe; returns an exit code. */
int tr_train(struct tr_config *cfg, const struct tr_run_flags *flags);

struct tr_sample_flags {
    const char *checkpoint; /* run dir, checkpoints dir, or one checkpoint; NULL: the
                             * recipe's model = { from = DIR } weights */
    const char *prompt;
    int tokens;
    double temperature;
    int top_k;
    uint64_t seed;
    const char *recipe; /* override the recipe recorded in the checkpoint */
    const char *const *overrides; /* key=value, after those the checkpoint's run recorded */
    int n_overrides;
    int ids; /* the prompt and the text as token ids, not text */
    int ignore_eos; /* sample all `tokens`, past the tokenizer's EOS */
    const char *eos; /* --eos: the one token to stop at (its text or id); NULL: the chat
                      * template's end of turn and the tokenizer's EOS */
    int chat;        /* the prompt is a user message rendered with the chat template */
    const char *system; /* with chat: a system message first; NULL: the template's default */
    int no_cache;    /* every token re-runs the whole context (no key/value cache) */
};
/* Text from a model's weights, read-only: a session in sample mode (no run
 * directory, checkpoints or optimizer state), nothing written. */
int tr_sample(const struct tr_sample_flags *flags);

/* `trainrun eval`: the loss of the model a recipe describes on the first
 * micro-batches of a split, through the run's own evaluation
 * (tr_session_evaluate) in an eval session, without training or writing
 * anything. */
enum tr_eval_weights {
    TR_EVAL_FRESH,      /* initialised from train.seed: an untrained model */
    TR_EVAL_FROM,       /* the recipe's model = { from = DIR } */
    TR_EVAL_CHECKPOINT, /* a checkpoint's */
};

struct tr_eval_flags {
    const char *recipe;         /* NULL: the recipe the checkpoint recorded */
    const char *const *overrides;
    int n_overrides;
    const char *checkpoint;     /* run dir, checkpoints dir or one checkpoint; NULL: none */
    int train_split;            /* the training split instead of the validation one */
    uint64_t batches;           /* micro-batches at most; 0: train.eval_batches; UINT64_MAX: all */
    const char *logits;         /* the first micro-batch's ids and logits into this
                                 * safetensors file; NULL: none */
};

struct tr_eval_result {
    char recipe[4096];          /* the recipe evaluated */
    enum tr_eval_weights weights;
    char source[4096];          /* the checkpoint directory, or model.from */
    uint64_t step;              /* the checkpoint's step */
    int recorded_overrides;     /* the run's overrides applied before the command line's */
    int other_recipe;           /* the checkpoint's run used another recipe file */
    uint64_t batches;           /* micro-batches evaluated */
    uint64_t split_batches;     /* micro-batches the split holds */
    int64_t micro_batch;        /* samples per micro-batch */
    uint64_t samples;           /* samples evaluated */
    uint64_t tokens;            /* predictions evaluated: tokens of a sequence model, else
                                 * samples */
    int sequence;               /* the model predicts every position of a token sequence */
    uint32_t classes;           /* width of the logits (vocabulary or classes), 0: none */
    int64_t seed;               /* train.seed (the fresh weights) */
    double loss;                /* mean cross-entropy, nats per prediction */
    double accuracy;            /* NaN when the backend does not count it */
    double seconds;
    char device[32], precision[32];
    double bytes_per_token;     /* text bytes per token of the split evaluated (the data's
                                 * tr_data_info); 0: not text or unknown */
};

int tr_eval(const struct tr_eval_flags *flags, struct tr_eval_result *out, tr_err *err);

#endif

/*
 * Checkpoints of a run: weights (safetensors), optimizer moments
 * (safetensors) and state.json, stored through the checkpoint plugin.
 *
 * Saving stalls the step loop only for a snapshot into host buffers
 * allocated once; a background thread serialises, checksums, writes,
 * commits and prunes.  At most one write is in flight: the next save (or
 * wait/close) waits for it and reports its error.
 */
#ifndef TR_CHECKPOINT_H
#define TR_CHECKPOINT_H

#include "graph.h"
#include <trainrun/plugin.h>

/* Everything a checkpoint holds besides tensors. */
struct tr_run_state {
    uint64_t step;            /* optimizer steps done */
    int64_t applied;          /* updates applied (AdamW bias correction) */
    uint64_t loader_position; /* micro-batches consumed */
    uint64_t skipped;         /* steps skipped for non-finite gradients */
    double cost_usd;          /* dollars spent so far, over every resume */
    double loss, val_loss;    /* NaN when unknown */
    struct tr_state_var precision[32];
    size_t n_precision;
    struct tr_state_var schedule[32];
    size_t n_schedule;
    char best[64];            /* checkpoint with the best val_loss so far, "" if none */
    double best_val_loss;
    uint64_t best_step;
    char base[64];            /* an adapter run's frozen base (session.h), "" if none */
};

struct tr_optimizer_desc; /* optim.h */

struct tr_checkpointer_config {
    const struct tr_checkpoint_vtable *vt;
    void *self;
    const struct tr_graph *g;   /* names, shapes and offsets of the parameters */
    const struct tr_backend *be;
    /* whose state slots the optimizer blobs hold (slot k in blob k + 1),
     * under the slot names of its descriptor */
    const struct tr_optimizer_desc *optimizer;
    /* the backend whose memory the state slots are in (NULL: be): the
     * host's CPU backend under parallel.offload = "optimizer" */
    const struct tr_backend *state_be;
    int64_t keep;               /* newest N kept, plus the best */
    enum tr_dtype weights_dtype;/* dtype of model.safetensors */
    int async;                  /* write in a background thread */
    const char *recipe;         /* absolute path, recorded for `sample` (copied) */
    char *const *overrides;
    int n_overrides;
    int64_t seed;
    uint64_t max_step;          /* resume skips checkpoints past it (train.steps); 0: no limit */
    /* recorded in state.json for `export --format hf` (copied; NULL: none):
     * the model as a Hugging Face config.json, and the directory its
     * pretrained weights came from (model.from) */
    const char *hf_config;
    const char *weights_from;
    /* adapter runs (lora): the adapter_config.json export --format peft
     * writes (copied), and the base's identity, read at each save (the
     * session's buffer: set once the base is loaded) */
    const char *peft_config;
    const char *base_identity;
};

struct tr_checkpointer;

struct tr_checkpointer *tr_checkpointer_open(const struct tr_checkpointer_config *cfg, tr_err *err);
void tr_checkpointer_close(struct tr_checkpointer *c);

/* slots: the optimizer's state buffers, one per state slot of
 * cfg.optimizer (backend memory, each as long as params). */

/* Snapshot params and optimizer state slots (backend memory) and the state,
 * then write them as checkpoint "step-<step>".  Returns once the snapshot
 * is taken (async) or the checkpoint is published (sync).  An error of the
 * previous background write is returned here too. */
int tr_checkpointer_save(struct tr_checkpointer *c, const float *params, float *const *slots,
                         const struct tr_run_state *state, tr_err *err);
/* The same, written and published before returning even with a background
 * writer: for saves the caller would wait for anyway (the last one, a
 * preemption), which then need no snapshot copy in memory. */
int tr_checkpointer_save_now(struct tr_checkpointer *c, const float *params, float *const *slots,
                             const struct tr_run_state *state, tr_err *err);
/* Wait for the write in flight; its error, if any. */
int tr_checkpointer_wait(struct tr_checkpointer *c, tr_err *err);
/* Seconds the caller was blocked by saves (snapshot + waiting). */
double tr_checkpointer_stall(const struct tr_checkpointer *c);

/* Load checkpoint `name` into backend memory; state filled.  The checksums
 * are verified before anything is uploaded. */
int tr_checkpointer_load(struct tr_checkpointer *c, const char *name, float *params,
                         float *const *slots, struct tr_run_state *state, tr_err *err);
/* The newest checkpoint that loads: 1 loaded, 0 none exist, TR_ERROR when
 * all are bad (err says why).  Skipped ones are warned about by name. */
int tr_checkpointer_resume(struct tr_checkpointer *c, float *params, float *const *slots,
                           struct tr_run_state *state, char *loaded, size_t loaded_size,
                           tr_err *err);

/* A local checkpoint named on the command line: a run directory, its
 * checkpoints directory (both through LATEST) or one checkpoint directory.
 * *dir and *name are malloc'd. */
int tr_checkpoint_resolve(const char *path, char **dir, char **name, tr_err *err);

/* A local checkpoint directory as written: state.json's own checksum and
 * fields, and every blob's checksum it lists.  err names what is wrong. */
int tr_checkpoint_verify(const char *checkpoint_dir, tr_err *err);

/* state.json of a local checkpoint directory, its own checksum and fields
 * checked: *state filled, and the parsed document returned (the recipe and
 * overrides the run recorded; free it with tr_json_free), or NULL. */
struct tr_json;
struct tr_json *tr_checkpoint_read_state(const char *checkpoint_dir, struct tr_run_state *state,
                                         tr_err *err);

/* The weights of a local checkpoint directory, verified like
 * tr_checkpoint_verify, into params (backend memory laid out as g's): every
 * parameter of g with its shape, and no tensor g has not.  Reads only. */
int tr_checkpoint_load_weights(const char *checkpoint_dir, const struct tr_graph *g,
                               const struct tr_backend *be, float *params, tr_err *err);

/* `trainrun export`: model.safetensors of a checkpoint directory, in dtype,
 * refused unless the checkpoint verifies. */
int tr_export_weights(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_path,
                      tr_err *err);

/* `trainrun export --format hf`: the checkpoint's weights as a Hugging Face
 * directory (config.json + model.safetensors in dtype), from the model
 * state.json records; refused unless the checkpoint verifies. */
int tr_export_hf(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir, tr_err *err);
/* Beside an export's weights, what from_pretrained and AutoTokenizer read:
 * the run's tokenizer (RUN/tokenizer.json and tokenizer_config.json, the
 * one that made its data), else weights_from's; weights_from's
 * special_tokens_map.json with that same tokenizer; weights_from's
 * generation_config.json, else one with the data's EOS. */
int tr_export_hf_extras(const char *checkpoint_dir, const char *weights_from, const char *out_dir,
                        tr_err *err);
/* A warning on stderr when dtype rounds the checkpoint's weights (stored:
 * state.json's weights_dtype). */
void tr_export_warn_dtype(const char *stored, enum tr_dtype dtype, const char *checkpoint_dir);

#endif

/*
 * Sharded checkpoints: every rank writes its own parts (shard.h) of the
 * fp32 weights and of the optimizer state into a blob of its own,
 * "shard-<rank>-of-<world>.bin", in parallel, into one uncommitted
 * checkpoint (the plugin's begin_shared / detach, ABI 2.5); rank 0 then
 * writes the manifest, layout.json, and state.json (whose checksums vouch
 * for layout.json, whose entries vouch for every range of the blobs) and
 * publishes it once every rank said it had written its blob.
 *
 * layout.json records the layout the run had (world size, shard level,
 * unit, floats) and, tensor by tensor, which blob holds which element
 * range of which slot ("model", then the optimizer's state names) at which
 * byte offset with which CRC-32:
 *
 *   {"format": 1, "world": 2, "level": "parameters", "unit": 2624,
 *    "floats": 30016, "slots": ["model", "exp_avg.", "exp_avg_sq."],
 *    "blobs": [["shard-00000-of-00002.bin", 120064], ...],
 *    "tensors": [{"name": "wte", "shape": [64, 32], "buffer": false,
 *                 "entries": [[0, 0, 1312, 0, 0, 2863311530], ...]}, ...]}
 *
 * Entries never straddle two tensors, so a reader that needs any range
 * reads whole entries (at most a tensor) and nothing else: a run resumed
 * at any world size and level reads only what its rank keeps, and export,
 * eval and sample read tensor by tensor.
 */
#ifndef TR_CHECKPOINT_SHARD_H
#define TR_CHECKPOINT_SHARD_H

#include "checkpoint.h"
#include "comm.h"
#include "shard.h"

#include <stdint.h>
#include <stdio.h>

#define TR_CKPT_LAYOUT_BLOB "layout.json"
#define TR_CKPT_MAX_WORLD 65536
#define TR_CKPT_MAX_SLOTS 3          /* model + TR_OPTIMIZER_MAX_SLOTS */
#define TR_CKPT_MAX_NUMEL ((uint64_t)1 << 40)

struct tr_ckpt_entry {
    uint32_t slot, blob;
    uint64_t begin, end; /* elements of the tensor */
    uint64_t offset;     /* bytes into the blob: (end - begin) fp32 values */
    uint32_t crc;        /* CRC-32 of those bytes */
};

struct tr_ckpt_tensor {
    char *name;
    int ndim;
    int64_t shape[4];
    uint64_t numel;
    int buffer;          /* a buffer (batch norm statistics): slot model only */
    size_t first, n;     /* its entries, sorted by slot and begin */
};

struct tr_ckpt_layout {
    int world;
    char level[16];
    uint64_t unit, floats;
    int n_slots;
    char *slots[TR_CKPT_MAX_SLOTS];
    size_t n_blobs;
    struct { char *name; uint64_t bytes; } *blobs;
    size_t n_tensors;
    struct tr_ckpt_tensor *tensors;
    size_t n_entries;
    struct tr_ckpt_entry *entries;
};

/* layout.json parsed and checked: every slot of every tensor covered
 * exactly once, every entry inside its tensor and its blob.  what: the
 * file, for messages. */
int tr_ckpt_layout_parse(const char *text, size_t size, const char *what,
                         struct tr_ckpt_layout **out, tr_err *err);
void tr_ckpt_layout_write(FILE *f, const struct tr_ckpt_layout *l);
void tr_ckpt_layout_free(struct tr_ckpt_layout *l);

/* Whether the checkpoint plugin can take a checkpoint from several ranks. */
int tr_ckpt_plugin_shared(const struct tr_checkpoint_vtable *vt);

/* What a rank writes and reads of a sharded checkpoint. */
struct tr_ckpt_rank {
    const struct tr_checkpoint_vtable *vt;
    void *self;                       /* this rank's plugin instance */
    const struct tr_graph *g;
    const struct tr_backend *be;
    const struct tr_optimizer_desc *od;
    const struct tr_shard *shard;     /* this run's layout and rank */
    struct tr_comm *comm;
    /* NULL: each rank writes its parts under shard; else (pipeline stages)
     * owner[i] is the rank that writes parameter tensor i whole, in every
     * slot, and the state slots are laid out like the parameters */
    const int *owner;
    /* a reader that keeps only some parameters (a pipeline stage: those its
     * chunks read): keep(keep_ctx, t) says which, in every slot; NULL: all */
    int (*keep)(void *ctx, const struct tr_tensor *t);
    void *keep_ctx;
    /* the state slots' memory (parallel.offload: the host's CPU backend);
     * NULL: be's, as the parameters */
    const struct tr_backend *state_be;
};

/* Every rank calls it: this rank's parts of params (full-size, its parts
 * valid) and of the packed state slots (slots[k]: its parts one after
 * another) written in parallel, and the checkpoint published by rank 0
 * once all have; c: rank 0's checkpointer (state.json, pruning), NULL on
 * the others.  Any rank's failure fails every rank and publishes nothing. */
int tr_ckpt_save_shared(const struct tr_ckpt_rank *r, struct tr_checkpointer *c,
                        const float *params, float *const *slots,
                        const struct tr_run_state *state, tr_err *err);

/* Where a reader wants a slot of a sharded checkpoint: base NULL (not
 * wanted), or backend memory with all of g's flat buffer (parts NULL), or
 * the parts rank parts->rank keeps under layout *parts, at their places in
 * a full-size buffer (packed 0) or one after another (packed 1). */
struct tr_ckpt_dest {
    float *base;
    const struct tr_shard *parts;
    int packed;
    const struct tr_backend *be; /* base's memory; NULL: the reader's backend */
};

/* Where a sharded checkpoint's bytes come from: a plugin (vt, self, name)
 * or a local checkpoint directory (dir). */
struct tr_ckpt_src {
    const struct tr_checkpoint_vtable *vt;
    void *self;
    const char *name;
    const char *dir;
};

/* The ranges dest[0] (weights; g's buffers always, whole) and dest[1 + k]
 * (state slot k of od, od may be NULL without them) want, read entry by
 * entry, each checked against its CRC-32 before it is used.  Every tensor
 * of g must be there with its shape, and no other. */
int tr_ckpt_load_layout(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                        const struct tr_graph *g, const struct tr_backend *be,
                        const struct tr_optimizer_desc *od, const struct tr_ckpt_dest *dest,
                        tr_err *err);
/* The same, reading only the parameters keep(keep_ctx, t) keeps (NULL: all;
 * the others are still required to be there). */
int tr_ckpt_load_layout_some(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                             const struct tr_graph *g, const struct tr_backend *be,
                             const struct tr_optimizer_desc *od, const struct tr_ckpt_dest *dest,
                             int (*keep)(void *ctx, const struct tr_tensor *t), void *keep_ctx,
                             tr_err *err);

/* Every entry of l read and checked against its CRC-32, one at a time. */
int tr_ckpt_layout_check_all(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                             tr_err *err);
/* The weights (slot model) and buffers of l read one tensor at a time
 * (export streams them: it holds one tensor, never the model). */
struct tr_ckpt_reader;
struct tr_ckpt_reader *tr_ckpt_reader_open(const struct tr_ckpt_src *src,
                                           const struct tr_ckpt_layout *l);
/* l->tensors[i] (slot model) into out (its numel fp32 values), each range
 * checked against its CRC-32 before it is used; err names the checkpoint,
 * the blob and the tensor. */
int tr_ckpt_read_tensor(struct tr_ckpt_reader *r, size_t i, float *out, tr_err *err);
void tr_ckpt_reader_close(struct tr_ckpt_reader *r);

/* The weights (slot model) and buffers of l as one fp32 safetensors blob
 * (malloc'd, *size bytes): what an unsharded checkpoint's
 * model.safetensors would hold (export --format peft, whose adapters are
 * small, reads them so).  NULL with err. */
void *tr_ckpt_layout_model(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                           size_t *size, tr_err *err);

/* state.json of checkpoint name (through the plugin) parsed, and its
 * layout when it is sharded (*layout NULL when not). */
int tr_ckpt_read_shared_state(const struct tr_ckpt_src *src, struct tr_run_state *state,
                              struct tr_ckpt_layout **layout, tr_err *err);

/* Rank 0: 1 with *name when the newest checkpoint worth resuming from
 * (state.json sound, step within train.steps) is sharded; 0 when there is
 * none or it is not (tr_checkpointer_resume then does as ever). */
int tr_ckpt_newest_sharded(struct tr_checkpointer *c, char *name, size_t size, tr_err *err);

/* Every rank: resume from checkpoint `name` (rank 0 chose it; a sharded
 * one), each rank reading only what it keeps.  TR_OK when every rank read
 * its parts; 1 on every rank when some rank could not (a blob damaged,
 * truncated or missing: err gives the first such rank's reason, naming
 * the blob), and the caller passes over it (tr_ckpt_skip); TR_ERROR when
 * the ranks cannot agree (a collective failed). */
int tr_ckpt_resume_shared(const struct tr_ckpt_rank *r, const char *name, float *params,
                          float *const *slots, int params_parts, struct tr_run_state *state,
                          tr_err *err);

/* Rank 0: checkpoint `name` could not be read by some rank (why): warn,
 * naming it, and make tr_ckpt_newest_sharded and tr_checkpointer_resume
 * look only at checkpoints older than it, as tr_checkpointer_resume passes
 * over a damaged one; when none is left, the resume fails with why. */
void tr_ckpt_skip(struct tr_checkpointer *c, const char *name, const tr_err *why);

#endif

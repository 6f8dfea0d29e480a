/* What the files of the checkpoint code share, and nothing else includes
 * (checkpoint.h is their public interface):
 *   checkpoint.c         the checkpointer: open, save, the background writer,
 *                        wait, close, and pruning to keep-last-N plus the best;
 *   checkpoint_write.c   one checkpoint written: its blobs serialised from
 *                        backend memory, state.json, and the plugin calls
 *                        that store them;
 *   checkpoint_read.c    the same read back: state.json and the blobs checked,
 *                        the tensors loaded (load, resume), and local
 *                        checkpoint directories found, verified and read;
 *   checkpoint_export.c  `trainrun export`.
 * The writer and the reader must agree byte for byte on the format: what
 * both sides of it use is declared here. */
#ifndef TR_CHECKPOINT_INTERNAL_H
#define TR_CHECKPOINT_INTERNAL_H

#include "checkpoint.h"

#include <pthread.h>
#include <stddef.h>

/* The last member of state.json: the CRC-32 of the bytes before it
 * (written by checkpoint_write.c, checked by checkpoint_read.c). */
#define STATE_CHECKSUM_KEY "  \"state_checksum\":"

/* checkpoint.h's checkpointer */
struct tr_checkpointer {
    struct tr_checkpointer_config cfg;
    /* The snapshot of an asynchronous save: the serialised blobs themselves,
     * taken by save() and freed by tr_ckpt_write as each is written, so nothing
     * is held between saves and no second copy is made.  A synchronous save
     * streams each blob to the plugin instead (or, for a plugin without
     * put_stream, builds, writes and frees one blob at a time). */
    void *blob[3];
    size_t blob_size[3];
    struct tr_run_state state;
    /* the background writer */
    pthread_t thread;
    int has_thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int pending; /* a snapshot waits to be written */
    int busy;    /* the writer is writing */
    int stop;
    int failed;
    tr_err error;
    double stall;
    /* A resume of sharded checkpoints found `skip` (and so every newer
     * one) unreadable by some rank: the ranks agreed to pass over it, so
     * tr_ckpt_newest_sharded and tr_checkpointer_resume look only at older
     * ones ("": none skipped).  newest, newest_why: the first one passed
     * over, and why (what a resume that finds none names). */
    char skip[64];
    char newest[64];
    tr_err newest_why;
};

/* ---- checkpoint.c ---- */

/* "step-" and ten digits: the only names a checkpointer writes. */
int tr_ckpt_is_step_name(const char *name);

/* The checkpoints the plugin lists whose names tr_ckpt_is_step_name takes,
 * in the plugin's order (newest first); free with tr_ckpt_free_names. */
struct name_list {
    char **names;
    size_t n;
};
int tr_ckpt_list(struct tr_checkpointer *c, struct name_list *l, tr_err *err);
void tr_ckpt_free_names(struct name_list *l);
/* Remove what keep and best no longer hold, after c->state.step was
 * written; problems are warnings. */
void tr_ckpt_prune(struct tr_checkpointer *c);


/* ---- checkpoint_write.c ---- */

/* CRC-32 of all of data: the checksums state.json records, of its blobs
 * and of itself (checked by checkpoint_read.c). */
/* Blob i of a checkpoint: 0 the weights, 1 + k optimizer state slot k. */
const char *tr_ckpt_blob_name(int i);
unsigned long tr_ckpt_crc(const void *data, size_t size);

/* Blobs of a checkpoint: the weights, then one per optimizer state slot. */
int tr_ckpt_blob_count(const struct tr_checkpointer *c);
/* Blob i whole in one malloc'd buffer (NULL when out of memory). */
void *tr_ckpt_build_blob(struct tr_checkpointer *c, int i, const float *params,
                         float *const *slots, size_t *size);
/* state.json of c->state vouching for blobs[0..n) with their CRC-32s
 * (malloc'd, *size bytes). */
char *tr_ckpt_state_json(struct tr_checkpointer *c, const char *const *blobs,
                         const unsigned long *checksums, int n_blobs, size_t *size);
/* Free the snapshot's blobs. */
void tr_ckpt_free_blobs(struct tr_checkpointer *c);
/* Write checkpoint "step-<c->state.step>" from the snapshot, or from params
 * and slots where it holds none, and prune; err says why not. */
int tr_ckpt_write(struct tr_checkpointer *c, const float *params, float *const *slots,
                  tr_err *err);

/* ---- checkpoint_read.c ---- */

/* The whole of path in malloc'd memory (one byte more, zeroed); a regular
 * file only. */
int tr_ckpt_read_whole(const char *path, void **data, size_t *size, tr_err *err);

/* state.json of a checkpoint directory and the CRC-32 of each blob it
 * lists (model.safetensors must be among them); *model, when asked for,
 * gets the verified weights' bytes (malloc'd).  A sharded checkpoint's
 * weights are assembled into *model, unless layout is asked for (not
 * NULL): then *layout gets its layout.json, checked, and no range is read
 * (the caller reads each through tr_ckpt_read_tensor, which checks it);
 * *layout stays NULL for a checkpoint that is not sharded. */
struct tr_ckpt_layout;
int tr_ckpt_verify_dir(const char *checkpoint_dir, void **model, size_t *model_size,
                       struct tr_ckpt_layout **layout, tr_err *err);

/* state.json's text checked (its own checksum, every field) into *state;
 * *js: the parsed document; *weights_dtype (NULL: not wanted) the dtype the
 * weights were written in (checkpoint_files.c). */
struct tr_json;
int tr_ckpt_parse_state(const void *text, size_t size, const char *name,
                        struct tr_run_state *state, int *weights_dtype, struct tr_json **js,
                        tr_err *err);
/* The CRC-32 state.json (js) records for blob, or a message when it differs. */
int tr_ckpt_check_blob(const struct tr_json *js, const char *blob, const void *data, size_t size,
                       tr_err *err);
/* A file of a checkpoint directory opened for reading: the descriptor
 * tr_checkpoint_resolve pinned (dup'd), else a fresh one; -1 with errno. */
int tr_ckpt_open_input(const char *path);

#endif

/*
 * trainrun plugin ABI — the one header a plugin author needs.
 *
 *   cc -shared -fPIC $(pkg-config --cflags trainrun) -o schedule_mine.so mine.c
 *
 * The file name is <kind>_<name>.so: the core finds `schedule = "mine"` as
 * schedule_mine.so on its plugin search path, and refuses a file whose info
 * declares another kind or name.
 *
 * A plugin is a shared object exporting one function, TR_PLUGIN_ENTRY, that
 * returns a pointer to a constant `struct tr_plugin_info`.  The info names the
 * plugin, declares its options (the core validates, documents and parses them
 * into a config struct for you) and points at the vtable of its kind.
 *
 * Compatibility rules (the same as SQLite's VFS):
 *   - TR_ABI_MAJOR changes only when an existing field changes meaning or
 *     moves; the core refuses plugins built for another major version.
 *   - Structs only ever grow at the end.  Every struct passed across the
 *     boundary carries its own size (`struct_size`), so neither side reads
 *     past what the other compiled, and a slot beyond that size counts as
 *     absent: test with TR_HAS_SLOT / TR_HAS_FIELD below, never by hand.
 *   - Optional slots may be NULL.
 *
 * Lifetimes: `host`, and the `config` create() receives with the strings it
 * points to, stay valid and unchanged until destroy() returns, so a plugin
 * keeps the pointer instead of copying.  `args` and its strings are valid
 * during create() only: copy what you keep from them.
 *
 * Plugins do not link against trainrun: everything they need from the host
 * comes through `struct tr_host`.  Plugins never call exit(): they return
 * TR_ERROR and describe the problem with tr_fail(), and the core reports it
 * together with the recipe file:line that configured the plugin.
 */
#ifndef TRAINRUN_PLUGIN_H
#define TRAINRUN_PLUGIN_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2.0: the vtables lost their unread leading `version` field (struct_size
 * alone says which slots a vtable has), tr_host its `abi_major` (a loaded
 * plugin's major is the core's: the loader refuses any other), and the comm
 * vtable its `barrier`, which the core never called. */
#define TR_ABI_MAJOR 2
/* 2.1: the checkpoint vtable's optional put_stream.
 * 2.2: TR_NF4, the storage type of 4-bit quantised frozen weights.
 * 2.3: the comm vtable's optional reduce_scatter.
 * 2.4: the comm vtable's optional sendrecv.
 * 2.5: the checkpoint vtable's optional begin_shared, detach and get_range
 *      (several ranks write one checkpoint; ranged reads).
 * 2.6: the comm vtable's optional allreduce_group.
 * 2.7: the comm vtable's optional reduce_scatter_group and allgather_group. */
#define TR_ABI_MINOR 7

/* The one symbol every plugin exports. */
#define TR_PLUGIN_ENTRY trainrun_plugin_entry
#define TR_PLUGIN_ENTRY_NAME "trainrun_plugin_entry"

#define TR_OK 0
#define TR_ERROR (-1)

/* ---- errors ----------------------------------------------------------- */

/* Filled by the plugin, read by the core.  Say what is wrong and what to do. */
typedef struct tr_err {
    char msg[1024];
} tr_err;

/* A message made printable in place: control characters (ESC, CR, BEL, ...,
 * and the C1 controls U+0080 to U+009F) written as \xNN, newlines and tabs
 * kept, so text from a file (a recipe's error(), a tensor name) cannot
 * drive the terminal that shows it.  Cut at cap - 1 bytes. */
static inline void tr_err_clean(char *msg, size_t cap)
{
    char out[4096];
    size_t n = 0, lim = cap < sizeof out ? cap : sizeof out;
    for (size_t i = 0; msg[i] && n + 1 < lim; i++) {
        unsigned char c = (unsigned char)msg[i];
        unsigned char next = (unsigned char)msg[i + 1];
        int c1 = c == 0xc2 && next >= 0x80 && next <= 0x9f;
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f || c1) {
            static const char hex[] = "0123456789abcdef";
            unsigned v = c1 ? next : c;
            if (n + 5 > lim)
                break;
            out[n++] = '\\';
            out[n++] = 'x';
            out[n++] = hex[v >> 4];
            out[n++] = hex[v & 15];
            i += (size_t)c1;
        } else {
            out[n++] = (char)c;
        }
    }
    out[n] = 0;
    memcpy(msg, out, n + 1);
}

static inline int tr_fail(tr_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static inline int tr_fail(tr_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        tr_err_clean(err->msg, sizeof err->msg);
    }
    return TR_ERROR;
}

/* ---- sizes: which fields the other side compiled ---------------------- */

/* Field `f` of *p, a struct of type `type` starting with `uint32_t
 * struct_size`, is present when the struct the other side compiled reaches
 * past it.  Use it for fields that may legitimately be 0 or NULL. */
#define TR_HAS_FIELD(p, type, f)                                                                   \
    ((p)->struct_size >= offsetof(type, f) + sizeof(((type *)0)->f))
/* An optional function slot: present and not NULL.  Call no optional slot
 * without it. */
#define TR_HAS_SLOT(p, type, slot) (TR_HAS_FIELD(p, type, slot) && (p)->slot)

/* ---- data types ------------------------------------------------------- */

enum tr_dtype {
    TR_F32 = 0,
    TR_BF16 = 1,
    TR_F16 = 2,
    TR_I32 = 3,
    /* 2.2: 4-bit NormalFloat, blocks of 64 with double-quantised scales
     * (kernels/nf4.h).  Only frozen weights (an adapter's base) are stored
     * so; no plugin is handed one. */
    TR_NF4 = 4,
    TR_DTYPE_COUNT
};

/* ---- plugin kinds ----------------------------------------------------- */

enum tr_plugin_kind {
    TR_KIND_PRECISION = 1,
    TR_KIND_DATA = 2,
    TR_KIND_CHECKPOINT = 3,
    TR_KIND_SCHEDULE = 4,
    TR_KIND_COMM = 5,
    TR_KIND_LOGGER = 6
};

/* ---- options (declared once: validation, help and parsing) ------------ */

enum tr_option_type {
    TR_OPT_END = 0, /* terminates an option array */
    TR_OPT_INT,     /* stored as int64_t            */
    TR_OPT_FLOAT,   /* stored as double             */
    TR_OPT_BOOL,    /* stored as int (0 or 1)       */
    TR_OPT_STRING,  /* stored as const char *       */
    TR_OPT_ENUM     /* stored as const char *, one of `choices` */
};

struct tr_option {
    enum tr_option_type type;
    const char *name;
    /* Default as recipe text ("0.1", "true", "cosine"); NULL makes it required. */
    const char *default_value;
    /* Inclusive bounds for INT and FLOAT.  min == max == 0 means unbounded;
     * use TR_NO_MIN / TR_NO_MAX for a one-sided range. */
    double min, max;
    const char *const *choices; /* ENUM: NULL-terminated */
    const char *help;
    size_t offset; /* offsetof(your_config, field) */
};

#define TR_NO_MIN (-HUGE_VAL)
#define TR_NO_MAX (HUGE_VAL)

/* ---- services the host lends to plugins -------------------------------- */

enum tr_log_level { TR_LOG_DEBUG = 0, TR_LOG_INFO = 1, TR_LOG_WARN = 2, TR_LOG_ERROR = 3 };

struct tr_host {
    uint32_t struct_size;
    void (*log)(enum tr_log_level level, const char *who, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    void *(*alloc)(size_t size); /* 64-byte aligned; NULL when out of memory */
    void (*free)(void *ptr);
};

/* What the core knows when it creates a plugin instance. */
struct tr_create_args {
    uint32_t struct_size;
    const char *run_dir;   /* this run's output directory (exists) */
    const char *recipe_dir;/* directory of the recipe file named on the command line
                            * ("." when none); relative paths in the shipped
                            * plugins' options are relative to the current
                            * directory, not to this */
    uint32_t seq_len;      /* tokens per sample the model consumes (0: not a sequence model) */
    uint64_t seed;         /* the run's seed */
    int rank, world;       /* this process among the data-parallel group */
    int local_rank, local_world; /* this process among those on its node */
    const char *device;    /* "cpu", "cuda", ...: where comm buffers live */
    void *device_stream;   /* the backend's compute stream (cudaStream_t), or NULL */
};

/* Small named scalars a plugin asks the core to keep in checkpoints
 * (loss scale, plateau best, counters).  Doubles round-trip exactly. */
struct tr_state_var {
    char name[32];
    double value;
};

/* ---- the info struct every plugin returns ------------------------------ */

struct tr_plugin_info {
    uint32_t abi_major;     /* TR_ABI_MAJOR */
    uint32_t struct_size;   /* sizeof(struct tr_plugin_info) */
    enum tr_plugin_kind kind;
    const char *name;       /* what recipes write: precision = "bf16" */
    const char *version;
    const char *description;/* one line for `trainrun plugins` */
    const struct tr_option *options; /* TR_OPT_END-terminated, may be NULL */
    size_t config_size;     /* size of the struct the options are parsed into */
    /* Create an instance from the parsed config.  *self may stay NULL for
     * stateless plugins. */
    int (*create)(const struct tr_host *host, const void *config,
                  const struct tr_create_args *args, void **self, tr_err *err);
    void (*destroy)(void *self); /* optional */
    const void *vtable;          /* the kind's vtable, below */
};

typedef const struct tr_plugin_info *(*tr_plugin_entry_fn)(void);

/* ---- precision --------------------------------------------------------- */

/* Where each class of tensor lives and what GEMMs compute in.
 * Accumulation is always fp32.  What the backends honour (the engine
 * refuses the rest when a run or plan starts, naming the field): master
 * and grad fp32 only; compute fp32, bf16 or fp16: GEMM inputs are rounded to
 * it and, when it is 16-bit, activations are stored in it (all but the
 * logits; gradients and saved statistics stay fp32); allow_tf32 0 only (no
 * backend runs tf32 GEMMs). */
struct tr_precision_policy {
    uint32_t struct_size;
    enum tr_dtype master;     /* weights the optimizer updates, and its state */
    enum tr_dtype compute;    /* inputs of GEMMs; activation storage when 16-bit */
    enum tr_dtype grad;       /* gradients of parameters */
    int allow_tf32;           /* fp32 GEMMs may use tf32: must be 0, see above */
};

struct tr_precision_vtable {
    uint32_t struct_size; /* sizeof(struct tr_precision_vtable) */
    void (*policy)(void *self, struct tr_precision_policy *out);
    /* Factor the loss gradient is multiplied by (NULL: 1). */
    double (*loss_scale)(void *self);
    /* Called once per optimizer step after gradients are unscaled and
     * checked.  Returns 1 to apply the step, 0 to skip it, TR_ERROR to stop
     * the run (e.g. the scale collapsed).  NULL: always apply. */
    int (*update)(void *self, int grads_finite, tr_err *err);
    size_t (*state_save)(void *self, struct tr_state_var *vars, size_t cap);
    int (*state_load)(void *self, const struct tr_state_var *vars, size_t n, tr_err *err);
};

/* ---- data -------------------------------------------------------------- */

enum tr_split { TR_SPLIT_TRAIN = 0, TR_SPLIT_VAL = 1, TR_SPLIT_COUNT = 2 };

struct tr_data_info {
    uint32_t struct_size;
    uint64_t samples[TR_SPLIT_COUNT]; /* samples in each split */
    enum tr_dtype input_dtype;        /* TR_I32 token ids or TR_F32 features */
    uint32_t input_len;               /* elements of one sample's input */
    uint32_t target_len;              /* int32 targets per sample (T for LM, 1 for classes) */
    uint32_t classes;                 /* vocabulary size, or number of classes */
    /* Fields below are read only when struct_size covers them (the core
     * zeroes the struct before info() fills it). */
    const char *tokenizer;            /* the tokenizer.json that made the tokens, or NULL;
                                       * the core copies it into the run directory */
    double bytes_per_token[TR_SPLIT_COUNT]; /* text bytes per token in each split, 0: not
                                       * text or unknown; loss / bytes_per_token is the
                                       * loss in nats per byte */
    uint64_t eval_stride[TR_SPLIT_COUNT]; /* samples j and j + eval_stride are the nearest
                                       * that do not overlap (windows that start at every
                                       * token: seq_len); an in-order pass, an evaluation,
                                       * reads samples 0, s, 2s, ... of the split so that
                                       * it sees each token once.  0 or 1: every sample */
    uint64_t train_views;             /* the training split offers each example as this many
                                       * samples (augmented views of an image: the images
                                       * source); train.epochs counts examples, samples /
                                       * train_views.  0 or 1: a sample is an example */
};

struct tr_data_vtable {
    uint32_t struct_size; /* sizeof(struct tr_data_vtable) */
    int (*info)(void *self, struct tr_data_info *out, tr_err *err);
    /* Fill n samples, chosen by the core, into caller-owned buffers:
     * inputs: n * input_len elements of input_dtype; targets: n * target_len.
     * Must be thread-safe: loader workers call it concurrently.  The same
     * (split, index) must always give the same sample. */
    int (*read)(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                void *inputs, int32_t *targets, tr_err *err);
};

/* ---- checkpoint -------------------------------------------------------- */

/* The bytes of a blob put_stream stores, on demand: writes the next
 * min(cap, bytes still to come) bytes of the blob into buf, sets *got to
 * that count and returns TR_OK, or returns TR_ERROR with err filled (asked
 * for bytes past the blob's end, among others). */
typedef int (*tr_blob_fill_fn)(void *ud, void *buf, size_t cap, size_t *got, tr_err *err);

/* A checkpoint is a set of named blobs published atomically.  Between
 * begin() and commit() nothing is visible; a crash leaves the previous
 * checkpoints untouched. */
struct tr_checkpoint_vtable {
    uint32_t struct_size; /* sizeof(struct tr_checkpoint_vtable) */
    int (*begin)(void *self, const char *name, tr_err *err);
    int (*put)(void *self, const char *blob, const void *data, size_t size, tr_err *err);
    int (*commit)(void *self, tr_err *err);
    void (*abort)(void *self); /* drop an uncommitted checkpoint */
    /* Published checkpoints, newest first. */
    int (*list)(void *self, void (*each)(void *ud, const char *name), void *ud, tr_err *err);
    /* Read one blob; *data comes from host->alloc and the caller frees it. */
    int (*get)(void *self, const char *name, const char *blob, void **data, size_t *size,
               tr_err *err);
    int (*remove)(void *self, const char *name, tr_err *err);
    /* Optional: put() without the blob whole in memory (a model's weights
     * are as large as the model).  The plugin pulls the blob's `size` bytes
     * in order, calling fill(ud, buf, cap, &got, err) with a buffer of its
     * own of cap > 0 bytes, until it has all of them; each call gives
     * min(cap, what is left).  When fill fails, put_stream leaves no trace
     * of the blob and returns TR_ERROR with fill's message in err as it is.
     * Otherwise the contract is put's: the same blob names, the same
     * errors, nothing visible before commit().  Without it (NULL, or
     * beyond struct_size) the core calls put() with the whole blob; put()
     * stays required, and the core may still use it for any blob. */
    int (*put_stream)(void *self, const char *blob, size_t size, tr_blob_fill_fn fill, void *ud,
                      tr_err *err);
    /* Optional (2.5), all three or none: one checkpoint written by several
     * ranks (each its own instance of the plugin, in its own process),
     * published by one of them, the publisher.
     *
     * begin_shared(name, token, token_size, publisher): the publisher calls
     * it first, with publisher 1: begin()'s contract, and it writes into
     * token (a NUL-terminated string shorter than token_size, at least 256)
     * what the other ranks need to find the same uncommitted checkpoint.
     * The core hands that token to every other rank, which then calls
     * begin_shared(name, token, token_size, 0) and so joins the checkpoint:
     * its put() and put_stream() add blobs to it (blob names differ between
     * ranks; the core sees to that).  A joined rank ends with detach():
     * its blobs are durable (as durable as commit() makes them), and the
     * instance forgets the checkpoint without publishing or removing
     * anything; or with abort(), which on a joined rank also removes
     * nothing of the others'.  The core calls the publisher's commit()
     * only after every rank's detach() returned TR_OK, and its abort()
     * when any rank failed: that removes what every rank wrote.  A crash
     * of any rank at any moment leaves the published checkpoints as they
     * were, and what it left is tidied as an interrupted begin()'s is.
     *
     * get_range(name, blob, offset, buf, size): size bytes of a published
     * blob from byte offset into the caller's buf; TR_ERROR naming the blob
     * when it is shorter than offset + size.  Readers of sharded
     * checkpoints read only the ranges they need with it; without it the
     * core reads whole blobs with get(). */
    int (*begin_shared)(void *self, const char *name, char *token, size_t token_size,
                        int publisher, tr_err *err);
    int (*detach)(void *self, tr_err *err);
    int (*get_range)(void *self, const char *name, const char *blob, uint64_t offset, void *buf,
                     size_t size, tr_err *err);
};

/* ---- schedule ---------------------------------------------------------- */

struct tr_schedule_vtable {
    uint32_t struct_size; /* sizeof(struct tr_schedule_vtable) */
    /* Learning rate for optimizer step `step` (0-based) of `total`. */
    double (*lr)(void *self, uint64_t step, uint64_t total, double base_lr);
    /* Optional: a validation metric after an evaluation (plateau schedules). */
    void (*observe)(void *self, uint64_t step, double metric);
    size_t (*state_save)(void *self, struct tr_state_var *vars, size_t cap);
    int (*state_load)(void *self, const struct tr_state_var *vars, size_t n, tr_err *err);
};

/* ---- comm ------------------------------------------------------------- */

/* Collectives among the ranks of a data-parallel job.  Every rank makes the
 * same calls, with the same sizes, in the same order.  Calls block until the
 * result is in `buf`; the core issues them from one communication thread,
 * so a plugin need not be thread-safe.  Buffers live where args->device
 * says (host memory for "cpu", device memory for "cuda").  A rank that dies
 * must make the others' calls fail (TR_ERROR naming the rank), never hang:
 * the core then stops the job. */
struct tr_comm_vtable {
    uint32_t struct_size; /* sizeof(struct tr_comm_vtable) */
    /* buf[i] = sum over ranks of buf[i], for `count` floats */
    int (*allreduce_sum)(void *self, float *buf, size_t count, tr_err *err);
    /* root's `bytes` bytes of buf copied to every rank */
    int (*broadcast)(void *self, void *buf, size_t bytes, int root, tr_err *err);
    /* rank r contributes count floats at buf + r*count; afterwards every
     * rank holds all world*count.  Optional, but ZeRO-1 (parallel.zero)
     * shares the updated parameter shards with it and refuses a plugin
     * without one. */
    int (*allgather)(void *self, float *buf, size_t count, tr_err *err);
    /* Optional: one line for logs ("tcp ring, 2 ranks via 127.0.0.1:29500") */
    const char *(*describe)(void *self);
    /* Optional (2.3): every rank gives world*count floats in buf; afterwards
     * rank r's buf + r*count holds, for those count floats, the sum over
     * ranks (the rest of buf is left undefined: a plugin may use it as
     * room).  Same inputs, same sums (a fixed order of additions); ideally
     * those allreduce_sum gives, so shard levels agree bit for bit.
     * Sharded data parallel (parallel.shard = "gradients" or "parameters")
     * reduce-scatters gradients with it and refuses a plugin without one. */
    int (*reduce_scatter)(void *self, float *buf, size_t count, tr_err *err);
    /* Optional (2.4): point to point, for pipeline stages.  Sends send_bytes
     * of send_buf to rank `to` and receives recv_bytes into recv_buf from
     * rank `from`, both in one call (to = -1 or send_bytes = 0: nothing is
     * sent; from = -1 or recv_bytes = 0: nothing is received), and returns
     * when both are done.  The two directions progress independently (the
     * send never waits for the receive, nor the reverse), so two ranks that
     * exchange in the same call, or a ring of ranks each sending to the
     * next, never deadlock; but a send may wait until its peer receives it
     * (large ones always do), so every send needs a matching receive of the
     * same size on its peer.  Messages between a pair of ranks arrive in
     * the order sent, apart from the collectives'.  Buffers are where
     * args->device says.  Every plugin takes ring neighbours (rank r with
     * r-1 and r+1 modulo world, world-1 with 0 included) and may refuse
     * other peers with a message; a peer that died or stopped answering
     * fails the call, naming it, within the plugin's timeout. */
    int (*sendrecv)(void *self, const void *send_buf, size_t send_bytes, int to, void *recv_buf,
                    size_t recv_bytes, int from, tr_err *err);
    /* Optional (2.6): allreduce_sum among some ranks only.  `ranks` lists
     * the n members (world ranks, ascending, no repeats, 1 <= n <= world,
     * this rank among them); only they call it, with the same list and
     * count, and afterwards each holds in buf the sum over the members, the
     * same bits on every member (a fixed order of additions).  Ranks not
     * listed make no call and are not waited for.  Calls on groups that
     * share ranks are made by every rank in one global order (each member
     * calls the groups it is in in that order: pipeline replicas sum
     * tensor after tensor in index order), so a plugin may run them one at
     * a time without deadlock; point-to-point messages and the world's
     * collectives keep their own order beside them.  A member that died
     * or stopped answering fails the call, naming it, within the plugin's
     * timeout, as every other slot does.  Without it the core all-reduces
     * over every rank, non-members adding zeros: the same sums, every
     * rank moving every group's bytes. */
    int (*allreduce_group)(void *self, float *buf, size_t count, const int *ranks, int n,
                           tr_err *err);
    /* Optional (2.7): reduce_scatter and allgather among some ranks, the
     * members listed as for allreduce_group (the same rules of order and
     * failure), member i being the one at ranks[i].  reduce_scatter_group:
     * every member gives n*count floats in buf; afterwards member i's
     * buf + i*count holds the sum over the members of those count floats
     * (the rest of buf undefined), ideally the bits allreduce_group gives
     * them (as for reduce_scatter).  allgather_group: member i contributes buf + i*count;
     * afterwards every member holds all n*count.  Pipeline replicas of a
     * stage share their parts of it with them (parallel.shard inside
     * stages); without them the core uses allreduce_group: the same
     * results, twice the bytes. */
    int (*reduce_scatter_group)(void *self, float *buf, size_t count, const int *ranks, int n,
                                tr_err *err);
    int (*allgather_group)(void *self, float *buf, size_t count, const int *ranks, int n,
                           tr_err *err);
};

/* ---- logger ----------------------------------------------------------- */

/* One named number of a step: "loss", "lr", "grad_norm", "tokens_per_s",
 * "mfu", "data_wait_pct", "loss_scale", "skipped_steps", "cost_usd",
 * "cost_projected_usd", "elapsed_s" every train.log_every steps; "val_loss",
 * "val_accuracy", "val_loss_per_byte" after each evaluation.  A value the
 * run does not know is left out, never sent as NaN. */
struct tr_scalar {
    const char *name;
    double value;
};

/* Where a run's numbers go besides metrics.jsonl (the run's own record,
 * which report, plot and --resume read and which is always written).
 * Only rank 0 creates loggers.  create() receives the run directory in
 * args->run_dir; open() follows it once the run knows whether it resumes
 * (then a logger appends to, or sits beside, what the earlier run wrote).
 * Every slot returning int returns TR_OK or TR_ERROR with tr_fail(): a
 * logger that cannot write stops the run with its message, as a full disk
 * under metrics.jsonl does, rather than leave a silent gap. */
struct tr_logger_vtable {
    uint32_t struct_size; /* sizeof(struct tr_logger_vtable) */
    int (*open)(void *self, int resume, tr_err *err);
    /* n values of optimizer step `step`; the pointers are valid during the call */
    int (*scalars)(void *self, uint64_t step, const struct tr_scalar *v, size_t n, tr_err *err);
    /* Optional: run metadata once at the start ("trainrun_version", "recipe"). */
    int (*text)(void *self, uint64_t step, const char *key, const char *value, tr_err *err);
    /* Optional: make what was logged readable by others now (called after
     * each evaluation and before a checkpoint). */
    int (*flush)(void *self, tr_err *err);
    /* Optional: the end of the run: everything on disk, or an error.
     * destroy() follows, also after an error. */
    int (*close)(void *self, tr_err *err);
};

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PLUGIN_H */

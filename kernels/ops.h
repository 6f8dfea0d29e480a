/*
 * The op table: each op of enum tr_op (kernels/backend.h) described once --
 * its name in recipes, its inputs and their roles, the attributes it reads,
 * its shape rule, which inputs a gradient flows to, and which backends run
 * it.  The core's graph check, the model reader's attribute names and the
 * device check before a plan (with the CPU's supports_op) all read it;
 * nothing else says what an op is.  Each backend keeps a per-op table of
 * its own for how it runs one (kernels/cpu/nodes.c, kernels/cuda/nodes.cu).
 *
 * It lives in kernels/ beside backend.h, not in core/, because both sides
 * read it and the contract runs one way: kernels include nothing of core
 * (tests/e2e/layering.sh), while the core already includes kernels/backend.h.
 * So a shape rule is plain C over the public graph structs and reports an
 * error as text into a buffer, the way a backend module's open does; the
 * core adds the op's name and the node's name around it.
 *
 * Adding an op (docs/ops.md walks through one): its enum value at the end of
 * enum tr_op, an entry in tr_ops[] (kernels/ops.c) with its shape rule, its
 * forward and backward in each backend's per-op table (kernels/cpu/nodes.c,
 * kernels/cuda/nodes.cu), and a Lua builder in lua/trainrun/nn.lua if
 * recipes may use it.
 */
#ifndef TR_OPS_H
#define TR_OPS_H

#include "backend.h"

#include <stddef.h>
#include <stdint.h>

/* ---- Node attributes.  Every attribute a recipe's node may carry, in the
 * order the model reader reads them (which decides the error a node with
 * two bad attributes gets).  Which of them an op reads is its attrs mask. */
enum tr_attr {
    TR_ATTR_EPS = 0,
    TR_ATTR_HEADS,
    TR_ATTR_IGNORE_INDEX,
    TR_ATTR_TRANS_B,
    TR_ATTR_SEGMENT, /* every node: its recompute segment (not an op's attribute) */
    TR_ATTR_KV_HEADS,
    TR_ATTR_THETA,
    TR_ATTR_SCALE,
    TR_ATTR_KERNEL,
    TR_ATTR_STRIDE,
    TR_ATTR_PAD,
    TR_ATTR_DILATION,
    TR_ATTR_GROUPS,
    TR_ATTR_MOMENTUM,
    TR_ATTR_BUFFER,
    TR_ATTR_P,       /* dropout's probability */
    /* rope's Llama 3.1 frequency scaling (kernels/rope_scaling.h); factor 0: none */
    TR_ATTR_ROPE_FACTOR,
    TR_ATTR_ROPE_LOW_FREQ_FACTOR,
    TR_ATTR_ROPE_HIGH_FREQ_FACTOR,
    TR_ATTR_ROPE_ORIGINAL_CTX,
    TR_ATTR_COUNT
};

#define TR_ATTR(a) (1u << (a))

enum tr_attr_kind {
    TR_ATTR_INT,       /* a whole number in [lo, hi] (a boolean too where hi is 1) */
    TR_ATTR_REAL,      /* a finite number within a float's range; above 0 where lo > 0 */
    TR_ATTR_REAL64,    /* the same, kept as a double */
    TR_ATTR_PAIR,      /* a whole number n (n x n) or a pair {h, w}, each in [lo, hi] */
    TR_ATTR_OPEN_UNIT, /* a number above 0 and below 1 */
    TR_ATTR_HALF_UNIT, /* a number above 0 (as a float) and at most 1 */
    TR_ATTR_TENSOR     /* a tensor id (1-based in Lua); -1 when absent */
};

struct tr_attr_desc {
    const char *name;     /* the node table's field in recipes ("eps") */
    enum tr_attr_kind kind;
    int64_t lo, hi;       /* INT and PAIR: the range */
    double fallback;      /* the value when absent (0: the shape rule's default) */
    size_t offset;        /* the struct tr_node field it fills */
    const char *rule;     /* OPEN_UNIT and HALF_UNIT: what the message says it must be */
};

/* Every attribute, indexed by enum tr_attr. */
extern const struct tr_attr_desc tr_attrs[TR_ATTR_COUNT];

/* ---- Shape rules.  What an op produces from its inputs: the output's shape
 * and the saved tensors (aux) its backward reads, named "<node>.<suffix>". */
struct tr_op_shape {
    int ndim;
    int64_t shape[TR_MAX_DIMS];
    int n_aux;
    struct {
        const char *suffix; /* "lse", "mean", "rstd" */
        int ndim;
        int64_t shape[TR_MAX_DIMS];
    } aux[2];
};

/* The size of the message buffer a shape rule writes into. */
#define TR_OP_WHY_SIZE 600

/* Checks node n's inputs (in[0 .. n->n_in), already the right number and
 * integer-ness) and attributes, fills the attributes left 0 with their
 * defaults, and derives the output shape and aux into *s.  0, or -1 with why
 * (a sentence without the op's or node's name) in why[0 .. TR_OP_WHY_SIZE).
 * g is read only (batch norm's buffer, the nodes before n). */
typedef int (*tr_shape_rule)(const struct tr_graph *g, struct tr_node *n,
                             const struct tr_tensor *const in[3], struct tr_op_shape *s,
                             char *why);

/* The backends the table knows, as bits of an op's backends.  The core
 * refuses a node whose op's bit for the device is clear before it asks the
 * backend's supports_op, which then only adds what depends on the node (its
 * tensors' types, a shape the device's library lacks). */
enum { TR_ON_CPU = 1u << 0, TR_ON_CUDA = 1u << 1 };

/* The bit of the backend named `name` (its iface's name: "cpu", "cuda");
 * 0 for a backend the table does not know, which supports_op alone answers
 * for. */
unsigned tr_op_backend_bit(const char *name);

struct tr_op_desc {
    const char *name;          /* in recipes, messages, profiles: "linear" */
    int min_in, max_in;        /* inputs taken */
    const char *arity;         /* where not every count in [min_in, max_in] is taken: the
                                * message's "takes ..." for the others; NULL: all are */
    unsigned in_counts;        /* with arity: bit k set when k inputs are taken */
    const char *inputs[3];     /* each input's role, for messages and docs: "x", "w", "b" */
    unsigned int_inputs;       /* bit k: in[k] is int32 ids (the rest are floating point) */
    unsigned grad_inputs;      /* bit k: a gradient flows to in[k] when it has one */
    unsigned attrs;            /* TR_ATTR() bits of the attributes it reads */
    tr_shape_rule shape;
    unsigned backends;         /* TR_ON_* */
    const char *lua;           /* the nn.lua builder(s) that emit it: "Graph:linear" */
    /* what its backward does not read, so the plan may reuse that memory
     * once forward is past it: bit k, in[k]; bit 3, its output.  0 (every
     * op not saying otherwise): backward may read them all.  Every backend's
     * backward must keep to it (tests/test_ops checks the CPU's). */
    unsigned bwd_ignores;
};

#define TR_BWD_OUT (1u << 3)

/* How a forward over a window of sequence rows (tr_graph.seq_from,
 * seq_to; core/engine/graph.h, tr_graph_forward_rows) runs an op. */
enum tr_rows_rule {
    TR_ROWS_NONE = 0,  /* not at all: rows depend on other rows in another way */
    TR_ROWS_VIEW,      /* on views of its tensors' window rows: row t of the output
                        * depends on row t of the inputs alone */
    TR_ROWS_POSITION,  /* as VIEW, and the backend turns row t by position
                        * seq_from + t (rope) */
    TR_ROWS_TABLE,     /* as VIEW, and in[1] is a table indexed by position, viewed
                        * from its row seq_from (add_rows' p) */
    TR_ROWS_WHOLE,     /* on its whole inputs and aux, the kernel computing the
                        * window's rows from every earlier row (attention's keys: the
                        * cache) into a view of its output's window rows */
};
enum tr_rows_rule tr_op_rows(enum tr_op op);

/* Whether linear node n's third input is an addend of its output's shape
 * (out = b + x w^T, b's gradient dout itself; a LoRA adapter's update onto
 * its base output, core/engine/adapters.c) rather than a bias [out] (b's
 * gradient the column sums of dout).  A checked node's b is one or the
 * other; a one-row linear's [out] is the bias, which is the same sum. */
static inline int tr_linear_addend(const struct tr_graph *g, const struct tr_node *n)
{
    if (n->op != TR_OP_LINEAR || n->n_in != 3)
        return 0;
    const struct tr_tensor *b = &g->tensors[n->in[2]], *out = &g->tensors[n->out];
    return b->ndim == out->ndim && b->ndim >= 2;
}

/* Whether in[k]'s gradient is node n's output gradient itself, value for
 * value: an add's inputs, a linear's addend.  The memory plan gives such an
 * input read by n alone the output gradient's buffer (graph_plan.c). */
int tr_op_grad_is_dout(const struct tr_graph *g, const struct tr_node *n, int k);

/* Every op, indexed by enum tr_op. */
extern const struct tr_op_desc tr_ops[TR_OP_COUNT];

/* The op's descriptor; NULL for a value outside the vocabulary. */
const struct tr_op_desc *tr_op_desc(enum tr_op op);

/* The op's whole check of node n, whose inputs are in[0 .. n->n_in) (each
 * a tensor within the sizes the graph allows): the number of inputs it
 * takes, which of them are ids, then its shape rule, which fills the
 * attributes left 0 with their defaults and derives *s.  0, or -1 with why
 * as a shape rule writes it.  Asked by the graph check (core/engine/graph.c)
 * and, for each node a recipe's builder adds, by the recipe bridge
 * (core/config/recipe_ops.c), so a builder reports the same sentence at the
 * recipe's line. */
int tr_op_check(const struct tr_graph *g, struct tr_node *n, const struct tr_tensor *const in[3],
                struct tr_op_shape *s, char *why);

#endif

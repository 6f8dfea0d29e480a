/*
 * LoRA as a graph rewrite (adapters.h): which linears are adapted, which
 * parameters freeze and in what storage, and the nodes each adapter adds
 * after its linear (dropout, lora_A, the scale, lora_B onto the base output).
 */
#include "adapters.h"

#include "graph_internal.h"
#include "../util/suggest.h"
#include "../util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int tr_adapter_param(const char *name)
{
    size_t n = strlen(name);
    static const char *const tails[] = {".lora_A.weight", ".lora_B.weight"};
    for (size_t i = 0; i < TR_ARRAY_LEN(tails); i++) {
        size_t k = strlen(tails[i]);
        if (n > k && strcmp(name + n - k, tails[i]) == 0)
            return 1;
    }
    return 0;
}

/* A module's name matches a PEFT target: the whole name, or its trailing
 * components ("q_proj", "self_attn.q_proj"). */
static int matches(const char *module, size_t len, const char *target)
{
    size_t t = strlen(target);
    if (t > len)
        return 0;
    return strncmp(module + len - t, target, t) == 0 && (t == len || module[len - t - 1] == '.');
}

/* A linear node's module: its weight's name without ".weight" (length in
 * *len), or NULL for a linear whose weight is not a parameter so named. */
static const char *module_of(const struct tr_graph *g, const struct tr_node *n, size_t *len)
{
    if (n->op != TR_OP_LINEAR || n->n_in < 2 || n->in[1] < 0 || n->in[1] >= g->n_tensors)
        return NULL;
    const struct tr_tensor *w = &g->tensors[n->in[1]];
    size_t k = strlen(w->name);
    if ((w->role != TR_ROLE_PARAM && w->role != TR_ROLE_FROZEN) || w->ndim != 2 || k <= 7 ||
        strcmp(w->name + k - 7, ".weight") != 0)
        return NULL;
    *len = k - 7;
    return w->name;
}

struct rewrite {
    struct tr_graph *g;
    const struct tr_lora_config *lc;
    tr_err *err;
    unsigned char *adapt;   /* per node: adapted */
    unsigned char *save;    /* per tensor: in modules_to_save (stays trained) */
};

/* The candidates a misspelt target is compared with: each adaptable
 * linear's last component and its whole name. */
static int no_match(struct rewrite *rw, const char *key, const char *word, int linears)
{
    struct tr_graph *g = rw->g;
    const char **cand = tr_xcalloc((size_t)g->n_tensors + (size_t)g->n_nodes + 1, sizeof *cand);
    size_t n = 0;
    if (linears) { /* the weights of linear nodes */
        for (int i = 0; i < g->n_nodes; i++) {
            size_t len;
            const char *m = module_of(g, &g->nodes[i], &len);
            if (m && g->nodes[i].out != g->logits)
                cand[n++] = m;
        }
    } else {
        for (int i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].role == TR_ROLE_PARAM && !tr_adapter_param(g->tensors[i].name))
                cand[n++] = g->tensors[i].name;
    }
    /* last components ("q_proj") come from the names: compare against both */
    char **parts = tr_xcalloc(n + 1, sizeof *parts);
    size_t np = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = cand[i];
        size_t len = strlen(s);
        const char *end = s + len;
        if (len > 7 && strcmp(end - 7, ".weight") == 0)
            end -= 7;
        else if (len > 5 && strcmp(end - 5, ".bias") == 0)
            end -= 5;
        const char *start = end;
        while (start > s && start[-1] != '.')
            start--;
        parts[np++] = tr_xasprintf("%.*s", (int)(end - start), start);
    }
    const char *guess = tr_suggest(word, (const char *const *)parts, np);
    if (!guess)
        guess = tr_suggest(word, cand, n);
    char hint[200] = "";
    if (guess)
        snprintf(hint, sizeof hint, " (did you mean \"%s\"?)", guess);
    const char *example = n ? parts[0] : "q_proj";
    tr_fail(rw->err, "%slora.%s: \"%s\" names no %s of this model%s; names are the model's "
            "modules (as in its Hugging Face checkpoint), whole or by their last part, e.g. \"%s\"",
            rw->lc->where, key, word, linears ? "linear layer" : "module", hint, example);
    for (size_t i = 0; i < np; i++)
        free(parts[i]);
    free(parts);
    free(cand);
    return TR_ERROR;
}

/* Which linears get an adapter: the targets (each must match one), or
 * every linear but the output head. */
static int choose_linears(struct rewrite *rw)
{
    struct tr_graph *g = rw->g;
    const struct tr_lora_config *lc = rw->lc;
    int *hits = tr_xcalloc((size_t)lc->n_targets + 1, sizeof *hits);
    for (int i = 0; i < g->n_nodes; i++) {
        size_t len;
        const char *m = module_of(g, &g->nodes[i], &len);
        if (!m)
            continue;
        if (lc->all_linear && g->nodes[i].out != g->logits)
            rw->adapt[i] = 1;
        for (int k = 0; k < lc->n_targets; k++)
            if (matches(m, len, lc->targets[k])) {
                rw->adapt[i] = 1;
                hits[k]++;
            }
    }
    for (int k = 0; k < lc->n_targets; k++)
        if (!hits[k]) {
            free(hits);
            return no_match(rw, "targets", lc->targets[k], 1);
        }
    free(hits);
    int any = 0;
    for (int i = 0; i < g->n_nodes; i++)
        any |= rw->adapt[i];
    if (!any)
        return tr_fail(rw->err, "%slora: the model has no linear layer to adapt", lc->where);
    /* a weight shared by two adapted linears would need one adapter for both */
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = i + 1; j < g->n_nodes && rw->adapt[i]; j++)
            if (rw->adapt[j] && g->nodes[j].in[1] == g->nodes[i].in[1])
                return tr_fail(rw->err, "%slora: linears '%s' and '%s' share the weight '%s'; "
                               "adapt one of them", lc->where, g->nodes[i].name, g->nodes[j].name,
                               g->tensors[g->nodes[i].in[1]].name);
    return TR_OK;
}

/* modules_to_save: the parameters of each named module stay trained. */
static int choose_saved(struct rewrite *rw)
{
    struct tr_graph *g = rw->g;
    const struct tr_lora_config *lc = rw->lc;
    for (int k = 0; k < lc->n_save; k++) {
        int hit = 0;
        for (int i = 0; i < g->n_tensors; i++) {
            const struct tr_tensor *t = &g->tensors[i];
            const char *dot = strrchr(t->name, '.');
            if (t->role != TR_ROLE_PARAM || !dot)
                continue;
            if (matches(t->name, (size_t)(dot - t->name), lc->modules_to_save[k])) {
                rw->save[i] = 1;
                hit = 1;
            }
        }
        if (!hit)
            return no_match(rw, "modules_to_save", lc->modules_to_save[k], 0);
    }
    return TR_OK;
}

/* The storage of a frozen tensor: a matrix read only as linear weights
 * (NF4 where the base is, but not the output head) or an embedding table
 * takes the base's dtype; anything else stays fp32. */
static int frozen_dtype(struct rewrite *rw, int t, enum tr_dtype wide, enum tr_dtype *out)
{
    struct tr_graph *g = rw->g;
    int linear = 0, head = 0, other = 0, lookup = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] != t)
                continue;
            if (n->op == TR_OP_LINEAR && k == 1 && n->out == g->logits)
                head++;
            else if (n->op == TR_OP_LINEAR && k == 1)
                linear++;
            else if (n->op == TR_OP_EMBEDDING && k == 0)
                lookup++;
            else
                other++;
        }
    }
    const struct tr_tensor *x = &g->tensors[t];
    *out = TR_F32;
    if (other || x->ndim != 2 || (!linear && !head && !lookup))
        return TR_OK;
    *out = wide;
    if (rw->lc->base != TR_LORA_BASE_NF4 || head || lookup)
        return TR_OK;
    if (x->numel % 64 != 0)
        return tr_fail(rw->err, "%slora.base = \"nf4\": '%s' [%lld,%lld] has %zu values, not a "
                       "multiple of the 64 of an NF4 block; use base = \"bf16\" for this model",
                       rw->lc->where, x->name, (long long)x->shape[0], (long long)x->shape[1],
                       x->numel);
    *out = TR_NF4;
    return TR_OK;
}

static int freeze(struct rewrite *rw, enum tr_dtype compute)
{
    struct tr_graph *g = rw->g;
    enum tr_dtype wide = compute;
    switch (rw->lc->base) {
    case TR_LORA_BASE_F32: wide = TR_F32; break;
    case TR_LORA_BASE_BF16: wide = TR_BF16; break;
    case TR_LORA_BASE_F16: wide = TR_F16; break;
    default: break; /* auto and nf4: the compute dtype's width */
    }
    if (wide != TR_BF16 && wide != TR_F16)
        wide = TR_F32;
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM || rw->save[i])
            continue;
        enum tr_dtype d;
        if (frozen_dtype(rw, i, wide, &d) != TR_OK)
            return TR_ERROR;
        t->role = TR_ROLE_FROZEN;
        t->dtype = d;
        t->decay = 0;
    }
    return TR_OK;
}

/* ---- the adapter's nodes ---------------------------------------------------- */

struct nodes {
    struct tr_node *v;
    int n, cap;
};

static void push(struct nodes *ns, const struct tr_node *n)
{
    if (ns->n == ns->cap) {
        ns->cap = ns->cap ? 2 * ns->cap : 64;
        ns->v = tr_xrealloc(ns->v, (size_t)ns->cap * sizeof *ns->v);
    }
    ns->v[ns->n++] = *n;
}

static int activation_like(struct tr_graph *g, const char *name, const struct tr_tensor *like,
                           int64_t last)
{
    int64_t shape[TR_MAX_DIMS];
    memcpy(shape, like->shape, sizeof shape);
    shape[like->ndim - 1] = last;
    return tr_graph_add_tensor(g, name, TR_ROLE_ACTIVATION, TR_F32, like->ndim, shape);
}

static void adapter_node(struct nodes *ns, enum tr_op op, const char *module, const char *suffix,
                         int a, int b, int out, int segment, float scale)
{
    struct tr_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.name = tr_xasprintf("%s%s", module, suffix);
    n.in[0] = a;
    n.in[1] = b;
    n.n_in = b >= 0 ? 2 : 1;
    n.out = out;
    n.segment = segment;
    n.scale = scale;
    push(ns, &n);
}

/* Linear node l (a copy: g->tensors moves as tensors are added) and its
 * adapter, appended to ns. */
static int add_adapter(struct rewrite *rw, struct nodes *ns, struct tr_node l)
{
    struct tr_graph *g = rw->g;
    const struct tr_lora_config *lc = rw->lc;
    size_t len;
    const char *wname = module_of(g, &l, &len);
    char *module = tr_xasprintf("%.*s", (int)len, wname);
    int64_t out_f = g->tensors[l.in[1]].shape[0], in_f = g->tensors[l.in[1]].shape[1];
    int64_t r = lc->rank;
    if (r > out_f || r > in_f) {
        tr_fail(rw->err, "%slora.rank %lld is above the width of '%s' (%lld x %lld); use a rank "
                "of at most %lld", lc->where, (long long)r, module, (long long)out_f,
                (long long)in_f, (long long)(out_f < in_f ? out_f : in_f));
        free(module);
        return TR_ERROR;
    }
    char name[1100];
    snprintf(name, sizeof name, "%s.lora_A.weight", module);
    int A = tr_graph_add_tensor(g, name, TR_ROLE_PARAM, TR_F32, 2, (int64_t[]){r, in_f});
    g->tensors[A].init = TR_INIT_UNIFORM; /* PEFT's kaiming_uniform(a = sqrt(5)): +-1/sqrt(in) */
    g->tensors[A].init_std = 1.0 / sqrt((double)in_f);
    snprintf(name, sizeof name, "%s.lora_B.weight", module);
    int B = tr_graph_add_tensor(g, name, TR_ROLE_PARAM, TR_F32, 2, (int64_t[]){out_f, r});
    g->tensors[B].init = TR_INIT_ZEROS; /* the adapted model starts as the base */
    int x = l.in[0], y = l.out;
    snprintf(name, sizeof name, "%s.base", module);
    int y_base = activation_like(g, name, &g->tensors[y], out_f);
    snprintf(name, sizeof name, "%s.lora_A", module);
    int a = activation_like(g, name, &g->tensors[y], r);
    snprintf(name, sizeof name, "%s.lora_scale", module);
    int a_s = activation_like(g, name, &g->tensors[y], r);
    l.out = y_base;
    push(ns, &l);
    if (lc->dropout > 0) { /* on the adapter's input alone, as PEFT's lora_dropout */
        snprintf(name, sizeof name, "%s.lora_dropout", module);
        int xd = activation_like(g, name, &g->tensors[x], g->tensors[x].shape[g->tensors[x].ndim - 1]);
        adapter_node(ns, TR_OP_DROPOUT, module, ".lora_dropout", x, -1, xd, l.segment, 0);
        ns->v[ns->n - 1].p = (float)lc->dropout;
        x = xd;
    }
    adapter_node(ns, TR_OP_LINEAR, module, ".lora_A", x, A, a, l.segment, 0);
    adapter_node(ns, TR_OP_SCALE, module, ".lora_scale", a, -1, a_s, l.segment,
                 (float)tr_lora_scale(lc));
    /* y = y_base + a_s B^T: the base output is the linear's addend (ops.h,
     * tr_linear_addend), so the product goes onto it tile by tile and its
     * gradient is y's own buffer (graph_plan.c): no add, and no update
     * tensor written for an add to read back */
    adapter_node(ns, TR_OP_LINEAR, module, ".lora_B", a_s, B, y, l.segment, 0);
    ns->v[ns->n - 1].in[2] = y_base;
    ns->v[ns->n - 1].n_in = 3;
    free(module);
    return TR_OK;
}

int tr_adapters_apply(struct tr_graph *g, const struct tr_lora_config *lc, enum tr_dtype compute,
                      tr_err *err)
{
    if (!lc || !lc->enabled)
        return TR_OK;
    struct rewrite rw = {g, lc, err, tr_xcalloc((size_t)g->n_nodes + 1, 1),
                         tr_xcalloc((size_t)g->n_tensors + 1, 1)};
    struct nodes ns = {0};
    int rc = TR_ERROR;
    if (choose_linears(&rw) != TR_OK || choose_saved(&rw) != TR_OK || freeze(&rw, compute) != TR_OK)
        goto done;
    int n_old = g->n_nodes;
    struct tr_node *old = g->nodes;
    for (int i = 0; i < n_old; i++) {
        if (!rw.adapt[i]) {
            push(&ns, &old[i]);
            continue;
        }
        if (add_adapter(&rw, &ns, old[i]) != TR_OK) {
            /* the names pushed so far are the graph's to free: put them back */
            for (int k = i; k < n_old; k++)
                push(&ns, &old[k]);
            free(old);
            g->nodes = ns.v;
            g->n_nodes = ns.n;
            ns.v = NULL;
            goto done;
        }
    }
    free(old);
    g->nodes = ns.v;
    g->n_nodes = ns.n;
    ns.v = NULL;
    rc = TR_OK;
done:
    free(ns.v);
    free(rw.adapt);
    free(rw.save);
    return rc;
}

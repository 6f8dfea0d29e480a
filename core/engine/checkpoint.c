/* The checkpointer: a run's checkpoints through its checkpoint plugin.
 * Opening and closing it, saving (a snapshot for the background writer
 * thread, or a write before returning), waiting for the write in flight,
 * and pruning to the newest `keep` plus the best.  The bytes of one
 * checkpoint are checkpoint_write.c's; loading and resuming are
 * checkpoint_read.c's (checkpoint_internal.h says who holds what). */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include "../util/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the writer thread and saving ------------------------------------------ */


/* One checkpoint written, then what keep and best no longer hold removed
 * (problems pruning are warnings). */
static int write_and_prune(struct tr_checkpointer *c, const float *params, float *const *slots,
                           tr_err *err)
{
    int rc = tr_ckpt_write(c, params, slots, err);
    if (rc == TR_OK)
        tr_ckpt_prune(c);
    return rc;
}

static void *writer(void *arg)
{
    struct tr_checkpointer *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->pending && !c->stop)
            pthread_cond_wait(&c->changed, &c->lock);
        if (!c->pending && c->stop)
            break;
        c->pending = 0;
        c->busy = 1;
        pthread_mutex_unlock(&c->lock);
        tr_err err = {{0}};
        int rc = write_and_prune(c, NULL, NULL, &err);
        pthread_mutex_lock(&c->lock);
        c->busy = 0;
        if (rc != TR_OK && !c->failed) {
            c->failed = 1;
            c->error = err;
        }
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

struct tr_checkpointer *tr_checkpointer_open(const struct tr_checkpointer_config *cfg, tr_err *err)
{
    struct tr_checkpointer *c = tr_xcalloc(1, sizeof *c);
    c->cfg = *cfg;
    c->cfg.recipe = tr_xstrdup(cfg->recipe ? cfg->recipe : ""); /* the caller's may be a stack buffer */
    c->cfg.hf_config = cfg->hf_config ? tr_xstrdup(cfg->hf_config) : NULL;
    c->cfg.weights_from = cfg->weights_from ? tr_xstrdup(cfg->weights_from) : NULL;
    c->cfg.peft_config = cfg->peft_config ? tr_xstrdup(cfg->peft_config) : NULL;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    if (cfg->async) {
        if (pthread_create(&c->thread, NULL, writer, c) != 0) {
            tr_fail(err, "cannot start the checkpoint writer thread");
            tr_checkpointer_close(c);
            return NULL;
        }
        c->has_thread = 1;
    }
    return c;
}

static int wait_locked(struct tr_checkpointer *c, tr_err *err)
{
    while (c->pending || c->busy)
        pthread_cond_wait(&c->changed, &c->lock);
    if (c->failed) {
        c->failed = 0;
        if (err)
            *err = c->error;
        return TR_ERROR;
    }
    return TR_OK;
}

int tr_checkpointer_wait(struct tr_checkpointer *c, tr_err *err)
{
    double t0 = tr_now();
    pthread_mutex_lock(&c->lock);
    int rc = wait_locked(c, err);
    pthread_mutex_unlock(&c->lock);
    c->stall += tr_now() - t0;
    return rc;
}

static int save(struct tr_checkpointer *c, const float *params, float *const *slots,
                const struct tr_run_state *state, int in_background, tr_err *err);

int tr_checkpointer_save(struct tr_checkpointer *c, const float *params, float *const *slots,
                         const struct tr_run_state *state, tr_err *err)
{
    return save(c, params, slots, state, c->has_thread, err);
}

int tr_checkpointer_save_now(struct tr_checkpointer *c, const float *params, float *const *slots,
                             const struct tr_run_state *state, tr_err *err)
{
    return save(c, params, slots, state, 0, err);
}

static int save(struct tr_checkpointer *c, const float *params, float *const *slots,
                const struct tr_run_state *state, int in_background, tr_err *err)
{
    double t0 = tr_now();
    /* one write at a time: the previous one must be done */
    tr_err previous_err = {{0}};
    pthread_mutex_lock(&c->lock);
    int previous = wait_locked(c, &previous_err);
    pthread_mutex_unlock(&c->lock);
    c->state = *state;
    int rc = TR_OK;
    if (in_background) {
        /* the snapshot: training goes on changing params and the slots */
        for (int i = 0; i < tr_ckpt_blob_count(c) && rc == TR_OK; i++) {
            c->blob[i] = tr_ckpt_build_blob(c, i, params, slots, &c->blob_size[i]);
            if (!c->blob[i]) {
                tr_ckpt_free_blobs(c);
                rc = tr_fail(err, "out of memory for the checkpoint snapshot of step %llu "
                                  "(%zu parameters); checkpoint.async = false needs less",
                             (unsigned long long)state->step, c->cfg.g->n_params);
            }
        }
        if (rc == TR_OK) {
            pthread_mutex_lock(&c->lock);
            c->pending = 1;
            pthread_cond_broadcast(&c->changed);
            pthread_mutex_unlock(&c->lock);
        }
    } else {
        rc = write_and_prune(c, params, slots, err);
    }
    c->stall += tr_now() - t0;
    if (previous != TR_OK && rc == TR_OK) {
        *err = previous_err; /* the earlier background write failed */
        return TR_ERROR;
    }
    if (previous != TR_OK) /* both failed: say the earlier one here, err says this one */
        tr_log(TR_LOG_ERROR, NULL, "%s", previous_err.msg);
    return rc;
}

double tr_checkpointer_stall(const struct tr_checkpointer *c) { return c->stall; }

void tr_checkpointer_close(struct tr_checkpointer *c)
{
    if (!c)
        return;
    if (c->has_thread) {
        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->thread, NULL);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    tr_ckpt_free_blobs(c);
    free((char *)c->cfg.recipe);
    free((char *)c->cfg.hf_config);
    free((char *)c->cfg.weights_from);
    free((char *)c->cfg.peft_config);
    free(c);
}

/* ---- listing, and pruning to the newest `keep` plus the best --------------- */

/* "step-" and ten digits: the only names a checkpointer writes.  The backend
 * may hold others (checkpoint.dir shared with other files); those are
 * neither loaded nor pruned. */
int tr_ckpt_is_step_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 15)
        return 0;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

static void collect(void *ud, const char *name)
{
    struct name_list *l = ud;
    if (!tr_ckpt_is_step_name(name))
        return;
    l->names = tr_xrealloc(l->names, (l->n + 1) * sizeof *l->names);
    l->names[l->n++] = tr_xstrdup(name);
}

int tr_ckpt_list(struct tr_checkpointer *c, struct name_list *l, tr_err *err)
{
    return c->cfg.vt->list(c->cfg.self, collect, l, err);
}

void tr_ckpt_free_names(struct name_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

/* Remove what keep and best no longer hold, after c->state.step was
 * written; problems are warnings. */
void tr_ckpt_prune(struct tr_checkpointer *c)
{
    struct name_list l = {0};
    tr_err err = {{0}};
    if (tr_ckpt_list(c, &l, &err) != TR_OK) {
        tr_log(TR_LOG_WARN, "checkpoint", "cannot list checkpoints to prune: %s", err.msg);
        return;
    }
    /* Newer names than the one just written are not this run's line of
     * checkpoints (ones a resume skipped as damaged, or not trainrun's):
     * they neither count towards keep nor go.  Of the rest, newest first,
     * the first `keep` stay. */
    char written[64];
    snprintf(written, sizeof written, "step-%010llu", (unsigned long long)c->state.step);
    size_t kept = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (strcmp(l.names[i], written) > 0 || kept++ < (size_t)c->cfg.keep ||
            strcmp(l.names[i], c->state.best) == 0)
            continue;
        if (c->cfg.vt->remove(c->cfg.self, l.names[i], &err) != TR_OK)
            tr_log(TR_LOG_WARN, "checkpoint", "cannot remove %s: %s", l.names[i], err.msg);
    }
    tr_ckpt_free_names(&l);
}

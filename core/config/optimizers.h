/* The optimizers a recipe may name (optimizer.type), each described once:
 * its update, its state, and the optimizer.* options its update reads.
 * The table lives in config, not next to the update in engine/optim.c,
 * because the run configuration checks optimizer.type against it (with
 * the recipe's file:line and a did-you-mean), parses and checks each
 * optimizer's options by the schema here, and `trainrun help recipe`
 * lists both; config may not include engine headers. */
#ifndef TR_OPTIMIZERS_H
#define TR_OPTIMIZERS_H

#define TR_OPTIMIZER_MAX_SLOTS 2
/* Options of all the optimizers together, each named once. */
#define TR_OPTIMIZER_MAX_OPTIONS 32

struct tr_option;

/* The backend update an optimizer runs: the iface's adamw or sgd slot. */
enum tr_optimizer_update { TR_UPDATE_ADAMW, TR_UPDATE_SGD };

/* An optimizer, described once: everything that sizes, stores or names its
 * state reads this (engine/optim.c, the memory plan and `plan`'s estimate,
 * ZeRO sharding, checkpoints), never "adamw has 2 slots" again. */
struct tr_optimizer_desc {
    const char *name;  /* optimizer.type in recipes */
    enum tr_optimizer_update update;
    int state_slots;   /* floats of state per parameter, each slot one buffer */
    /* the prefix of each slot's tensors in its checkpoint file
     * (tr_optimizer_state_files): PyTorch's names */
    const char *state_names[TR_OPTIMIZER_MAX_SLOTS];
    /* the optimizer.* options its update reads, TR_OPT_END-terminated:
     * each one's type, default, range and help line, and its field of
     * struct tr_optimizer_config (run_config.h).  An option two updates
     * read (lr, weight_decay) is described alike in both. */
    const struct tr_option *options;
};

/* The checkpoint file of each state slot, whatever the optimizer: slot k's
 * tensors are state_names[k] + the parameter's name in file k. */
extern const char *const tr_optimizer_state_files[TR_OPTIMIZER_MAX_SLOTS];

/* Every optimizer, NULL-terminated. */
extern const struct tr_optimizer_desc *const tr_optimizers[];
/* Their names in the same order, NULL-terminated: the choices of
 * optimizer.type (the same strings, tr_optimizer_names[i] ==
 * tr_optimizers[i]->name). */
extern const char *const tr_optimizer_names[];

/* The descriptor of optimizer `type`; NULL when there is none (the run
 * configuration only admits tr_optimizer_names). */
const struct tr_optimizer_desc *tr_optimizer_find(const char *type);

/* Every optimizer's options in out[0 .. cap), in the table's order, each
 * name once (the first optimizer's description of it), TR_OPT_END-
 * terminated: the optimizer.* options the run configuration parses and
 * `trainrun help recipe` lists beside type, reference_batch and clip.
 * Their count, or -1 when cap is too small. */
int tr_optimizer_options(struct tr_option *out, int cap);

#endif

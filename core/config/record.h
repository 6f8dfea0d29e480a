/*
 * What a run records of its recipe, and what a resume compares.
 *
 * A run writes, at its start, RUN/recipe.resolved (the resolved recipe as
 * `trainrun show` prints it: every value with where it came from, then the
 * plugins) and RUN/recipe.resolved.json (the same values, trainrun's version
 * and each loaded plugin's name, version and file).  A resume compares the
 * recipe it was given with the recorded one, key by key: a difference in a
 * key that alters training refuses the resume unless --allow-changes; a
 * difference in a harmless key (tr_record_key_harmless: logging, evaluation,
 * checkpoint cadence, budget, run labels, ...) is only noted.
 */
#ifndef TR_RECORD_H
#define TR_RECORD_H

#include "run_config.h"
#include <stdio.h>

/* The resolved recipe as `show` prints it. */
void tr_record_print(const struct tr_config *cfg, FILE *out);

/* The machine-readable record: {"format": 1, "trainrun": VERSION, "recipe":
 * PATH, "overrides": [...], "values": {"dotted.key": {"value": TEXT,
 * "origin": TEXT}, ...}, "plugins": [{"slot", "name", "version", "path"}]}.
 * Values are as show prints them (strings quoted), so equal text is an equal
 * value. */
void tr_record_write_json(const struct tr_config *cfg, FILE *out);

/* 1 when a change of `dotted_key` does not alter what is trained (the one
 * list of such keys; docs/recipes.md "Resuming" repeats it). */
int tr_record_key_harmless(const char *dotted_key);

/* Compare cfg's resolved recipe with a recorded recipe.resolved.json (text of
 * len bytes): *altering and *harmless get one "  key: old -> new\n" line per
 * difference of each class (malloc'd; NULL when none).  TR_ERROR with err set
 * when the record cannot be read (`what` names it). */
int tr_record_compare(const struct tr_config *cfg, const char *json, size_t len, const char *what,
                      char **altering, char **harmless, tr_err *err);

#endif

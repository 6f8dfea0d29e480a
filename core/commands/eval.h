/* `trainrun eval RECIPE [k=v ...]`: the validation loss, perplexity and
 * accuracy of the model a recipe describes (fresh, `from` a Hugging Face
 * directory, or a checkpoint's weights), without training. */
#ifndef TR_EVAL_H
#define TR_EVAL_H

#include <stdio.h>

/* argv[0] is "eval".  Returns an exit code (0, 1 error, 2 usage); the
 * result goes to stdout (one JSON object with --json), messages to stderr. */
int tr_eval_main(int argc, char **argv);

/* `trainrun help eval`. */
void tr_eval_help(FILE *out);

#endif

/* The generated parts of `trainrun help recipe` (config_help.c). */
#ifndef TR_CONFIG_HELP_H
#define TR_CONFIG_HELP_H

#include <stdio.h>

/* Each model builder's options (gpt, llama, mlp) with default and meaning,
 * read from lua/trainrun/models.lua. */
void tr_model_help(FILE *out);
/* Each plugin on the search path by kind, with its option names (trainrun
 * plugins KIND gives their defaults and meaning). */
void tr_plugins_help(FILE *out);

#endif

/* `trainrun doctor`: what this machine can run — the CPU and its vector
 * units, cores, each device backend on the plugin path (loads? opens? why
 * not?) with its driver and library versions, and the plugins that load. */
#ifndef TR_DOCTOR_H
#define TR_DOCTOR_H

#include "../config/plugin.h"

#include <stdio.h>

/* Prints the report to `out`; returns the number of problems found (a
 * backend or plugin that does not load), 0 when everything present works. */
int tr_doctor(FILE *out, const struct tr_plugin_path *search);

#endif

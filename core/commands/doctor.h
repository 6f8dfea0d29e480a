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

/* The environment variables that choose how OpenMP's idle threads wait
 * between parallel regions, each with the value of trainrun's short spin
 * (NULL: trainrun leaves it unset).  main.c sets the short spin at start-up
 * unless one of them is already set; doctor prints what the run got. */
struct tr_openmp_wait {
    const char *name, *short_spin;
};
enum { TR_OPENMP_WAITS = 3 }; /* doctor's line says "the three" */
extern const struct tr_openmp_wait tr_openmp_waits[TR_OPENMP_WAITS];

#endif

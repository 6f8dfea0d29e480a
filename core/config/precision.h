/*
 * What the engine makes of a precision plugin's policy.  Every backend
 * (cpu, cuda) executes the same subset of it:
 *   master  fp32 only: weights the optimizer updates, and its state;
 *   grad    fp32 only: parameter gradients (and their all-reduce);
 *   compute fp32, bf16 or fp16: the dtype GEMM inputs are rounded to
 *           (accumulation is fp32); every stored tensor, activations
 *           included, stays fp32;
 *   allow_tf32  fp32 GEMMs may run in tf32 (10-bit mantissa inputs, fp32
 *           accumulation): the cuda backend only; elsewhere it must be 0.
 * A run and a plan check the policy before anything else uses it, so a
 * policy no backend honours stops at the start with the field named, and
 * a plan prices only what will execute.
 */
#ifndef TR_PRECISION_H
#define TR_PRECISION_H

#include "hardware.h"

#include <trainrun/plugin.h>

/* TR_OK when every backend honours `pol`; else TR_ERROR with a message
 * naming `where` (the recipe's precision line), the plugin, the field, its
 * value, the device and what to do. */
int tr_precision_check(const struct tr_precision_policy *pol, const char *plugin,
                       const char *where, const char *device, tr_err *err);

/* Peak dense TFLOP/s of `hw` for the GEMMs `pol` runs (checked), and their
 * kind ("bf16", "fp16", "tf32", "fp32") in *kind when kind is not NULL; 0 when the
 * table does not know. */
double tr_precision_peak_tflops(const struct tr_hardware *hw, const struct tr_precision_policy *pol,
                                const char **kind);

const char *tr_dtype_name(enum tr_dtype d);

#endif

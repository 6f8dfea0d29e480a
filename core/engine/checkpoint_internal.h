/* What the files of the checkpoint code share, and nothing else includes:
 * checkpoint.c (the checkpointer and local checkpoint directories) and
 * checkpoint_export.c (`trainrun export`).  checkpoint.h is the public
 * interface. */
#ifndef TR_CHECKPOINT_INTERNAL_H
#define TR_CHECKPOINT_INTERNAL_H

#include "checkpoint.h"

#include <stddef.h>

/* The whole of path in malloc'd memory (one byte more, zeroed); a regular
 * file only. */
int tr_ckpt_read_whole(const char *path, void **data, size_t *size, tr_err *err);

/* state.json of a checkpoint directory and the CRC-32 of each blob it
 * lists (model.safetensors must be among them); *model, when asked for,
 * gets the verified weights' bytes (malloc'd). */
int tr_ckpt_verify_dir(const char *checkpoint_dir, void **model, size_t *model_size, tr_err *err);

#endif

/* `trainrun export --format hf --merge` (merge.c): an adapter run's
 * checkpoint merged into its base, written as a Hugging Face directory. */
#ifndef TR_MERGE_H
#define TR_MERGE_H

#include <trainrun/plugin.h>

int tr_export_merged(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir,
                     tr_err *err);

#endif

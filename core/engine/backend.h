/* Choosing the device backend at run time: "cpu" is built in, any other is
 * a loadable module (see kernels/backend.h).  The core reaches every backend
 * through this, never through a backend's own functions. */
#ifndef TR_CORE_BACKEND_H
#define TR_CORE_BACKEND_H

#include "../../kernels/backend.h"
#include "../config/plugin.h"

/* Open backend `device` ("cpu", "cuda", ...): a built-in one, or
 * backend_<device>.so from TRAINRUN_BACKEND_PATH then `search` (NULL: the
 * built-in backends only). */
int tr_backend_open(struct tr_backend *be, const char *device, int threads,
                    const struct tr_plugin_path *search, tr_err *err);
void tr_backend_close(struct tr_backend *be);

/* Load backend module `path` and check it is one of this ABI; on failure
 * NULL, with why[0..why_size) saying so.  *handle is the dlopen handle. */
const struct tr_backend_module *tr_backend_module_load(const char *path, void **handle, char *why,
                                                       size_t why_size);

#endif

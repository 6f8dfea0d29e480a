#include "backend.h"

#include "../util/util.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const struct tr_backend_module *tr_backend_module_load(const char *path, void **handle, char *why,
                                                       size_t why_size)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, why_size, "%s does not load (%s)", path, dlerror());
        return NULL;
    }
    tr_backend_entry_fn entry = (tr_backend_entry_fn)dlsym(h, TR_BACKEND_ENTRY_NAME);
    const struct tr_backend_module *m = entry ? entry() : NULL;
    /* slots appended after `close` are optional: older modules lack them */
    if (!m || m->abi != TR_BACKEND_ABI || !TR_HAS_FIELD(m, struct tr_backend_module, close)) {
        snprintf(why, why_size, "%s is not a trainrun backend of ABI %d", path, TR_BACKEND_ABI);
        dlclose(h);
        return NULL;
    }
    *handle = h;
    return m;
}

static int tr_backend_open_in(struct tr_backend *be, const char *device, int threads,
                              char *const *dirs, int n_dirs, tr_err *err);

/* Backends linked into trainrun, opened like the loadable ones. */
static const struct tr_backend_module *const builtin[] = {&tr_cpu_backend_module};

int tr_backend_open(struct tr_backend *be, const char *device, int threads,
                    const struct tr_plugin_path *search, tr_err *err)
{
    memset(be, 0, sizeof *be);
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++) {
        if (strcmp(device, builtin[i]->name) != 0)
            continue;
        char why[256] = "";
        if (builtin[i]->open(be, threads, why, sizeof why) != 0)
            return tr_fail(err, "cannot start the %s backend: %s", device,
                           why[0] ? why : "it did not start");
        be->module = builtin[i];
        return TR_OK;
    }
    /* device= comes from the recipe: it names a backend, never a file */
    if (!tr_plugin_name_ok(device))
        return tr_fail(err, "invalid device \"%s\": say cpu, cuda or another backend's name "
                       "(letters, digits, '_' and '-'), never a path", device);
    /* TRAINRUN_BACKEND_PATH, directories before the plugin path: what a user
     * points at a module of their own, and how make check runs device=cuda
     * through tests/cudacpu in a build whose plugins hold the real one */
    const char *first = getenv("TRAINRUN_BACKEND_PATH");
    char *extra = tr_xstrdup(first ? first : ""), *save = NULL;
    size_t n_search = search ? (size_t)search->n : 0;
    char **dirs = tr_xcalloc(strlen(extra) / 2 + 1 + n_search, sizeof *dirs);
    int n_dirs = 0;
    for (char *d = strtok_r(extra, ":", &save); d; d = strtok_r(NULL, ":", &save))
        dirs[n_dirs++] = d;
    for (int i = 0; search && i < search->n; i++)
        dirs[n_dirs++] = search->dirs[i];
    int rc = tr_backend_open_in(be, device, threads, dirs, n_dirs, err);
    free(dirs);
    free(extra);
    return rc;
}

static int tr_backend_open_in(struct tr_backend *be, const char *device, int threads,
                              char *const *dirs, int n_dirs, tr_err *err)
{
    for (int i = 0; i < n_dirs; i++) {
        char *path = tr_xasprintf("%s/backend_%s.so", dirs[i], device);
        struct stat st;
        if (stat(path, &st) != 0) {
            free(path);
            continue;
        }
        void *h;
        char why[512] = "";
        const struct tr_backend_module *m = tr_backend_module_load(path, &h, why, sizeof why);
        if (!m) {
            tr_fail(err, "device \"%s\" is unavailable: %s; run with device=cpu", device, why);
            free(path);
            return TR_ERROR;
        }
        if (m->open(be, threads, why, sizeof why) != 0) {
            tr_fail(err, "device \"%s\" is unavailable on this machine: %s; run with device=cpu",
                    device, why[0] ? why : "the backend did not start");
            free(path);
            return TR_ERROR; /* keep the module mapped: `why` may point into it */
        }
        be->module = m;
        free(path);
        return TR_OK;
    }
    return tr_fail(err, "device \"%s\" is unavailable: this trainrun has no %s backend "
                   "(backend_%s.so is not on the plugin path); run with device=cpu",
                   device, device, device);
}

void tr_backend_close(struct tr_backend *be)
{
    if (be->module)
        be->module->close(be);
    memset(be, 0, sizeof *be);
}

/* Host buffers the loader fills and the backend uploads: page-locked when
 * the backend offers it (faster copies), else ordinary memory. */
void *tr_be_host_alloc(const struct tr_backend *be, size_t bytes)
{
    if (TR_HAS_SLOT(be->iface, struct tr_backend_iface, host_alloc))
        return be->iface->host_alloc(be->context, bytes);
    return tr_alloc(bytes);
}

void tr_be_host_free(const struct tr_backend *be, void *p)
{
    if (!p)
        return;
    if (be->iface && TR_HAS_SLOT(be->iface, struct tr_backend_iface, host_free))
        be->iface->host_free(be->context, p);
    else
        tr_free(p);
}

int tr_be_store_weight(const struct tr_backend *be, const struct tr_tensor *t, const float *host,
                       tr_err *err)
{
    if (t->role != TR_ROLE_FROZEN || t->dtype == TR_F32) {
        tr_be_upload(be, t->data, host, t->numel * sizeof(float));
        return TR_OK;
    }
    if (!tr_be_stores_frozen(be))
        return tr_fail(err, "backend '%s' cannot store the frozen weight '%s' in 16 or 4 bits",
                       tr_be_name(be), t->name);
    return be->iface->store_frozen(be->context, t, host, err);
}

int tr_be_load_weight(const struct tr_backend *be, const struct tr_tensor *t, float *host,
                      tr_err *err)
{
    if (t->role != TR_ROLE_FROZEN || t->dtype == TR_F32) {
        tr_be_download(be, host, t->data, t->numel * sizeof(float));
        return TR_OK;
    }
    if (!tr_be_stores_frozen(be))
        return tr_fail(err, "backend '%s' cannot read the frozen weight '%s' back",
                       tr_be_name(be), t->name);
    return be->iface->load_frozen(be->context, t, host, err);
}

/* The local checkpoint plugin as one built against plugin ABI 2.4 would
 * be: the same plugin (loaded from $TR_PLUGIN_BUILD_DIR/checkpoint_local.so
 * and called through), but its vtable ends before begin_shared, so the core
 * cannot let several ranks write one checkpoint and must fall back on
 * rank 0 gathering the state and writing it alone, saying so once
 * (tests/e2e/shard-checkpoint.sh). */
#include <trainrun/plugin.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static struct tr_checkpoint_vtable vt;
static struct tr_plugin_info info;

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    const char *dir = getenv("TR_PLUGIN_BUILD_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint_local.so", dir ? dir : ".");
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const struct tr_plugin_info *(*entry)(void) =
        lib ? (const struct tr_plugin_info *(*)(void))dlsym(lib, TR_PLUGIN_ENTRY_NAME) : NULL;
    const struct tr_plugin_info *local = entry ? entry() : NULL;
    if (!local)
        return NULL;
    vt = *(const struct tr_checkpoint_vtable *)local->vtable;
    vt.struct_size = offsetof(struct tr_checkpoint_vtable, begin_shared);
    info = *local;
    info.name = "old_local";
    info.description = "the local plugin behind a 2.4 vtable (no begin_shared)";
    info.vtable = &vt;
    return &info;
}

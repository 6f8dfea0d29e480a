/* The tcp comm plugin as one built against plugin ABI 2.6 would be: the
 * same plugin (loaded from $TR_PLUGIN_BUILD_DIR/comm_tcp.so and called
 * through, its options included), but its vtable ends before
 * reduce_scatter_group, so the core must share the parts of a pipeline
 * stage's replicas through allreduce_group instead (tests/e2e/pipeline-run.sh
 * checks both give the same weights). */
#include <trainrun/plugin.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static struct tr_comm_vtable vt;
static struct tr_plugin_info info;

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    const char *dir = getenv("TR_PLUGIN_BUILD_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/comm_tcp.so", dir ? dir : ".");
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const struct tr_plugin_info *(*entry)(void) =
        lib ? (const struct tr_plugin_info *(*)(void))dlsym(lib, TR_PLUGIN_ENTRY_NAME) : NULL;
    const struct tr_plugin_info *tcp = entry ? entry() : NULL;
    if (!tcp)
        return NULL;
    vt = *(const struct tr_comm_vtable *)tcp->vtable;
    vt.struct_size = offsetof(struct tr_comm_vtable, reduce_scatter_group);
    info = *tcp;
    info.name = "old_tcp";
    info.description = "the tcp plugin behind a 2.6 vtable (no group reduce-scatter, all-gather)";
    info.vtable = &vt;
    return &info;
}

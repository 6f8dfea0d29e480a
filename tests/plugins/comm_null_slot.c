/* A comm plugin whose vtable reaches past broadcast but leaves
 * allreduce_sum NULL: the core calls the mandatory comm slots without a
 * NULL check, so the loader must refuse it. */
#include <trainrun/plugin.h>

static int create(const struct tr_host *h, const void *c, const struct tr_create_args *a,
                  void **self, tr_err *err)
{
    (void)h, (void)c, (void)a, (void)err;
    *self = NULL;
    return TR_OK;
}
static int broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    (void)self, (void)buf, (void)bytes, (void)root, (void)err;
    return TR_OK;
}
static const struct tr_comm_vtable vt = {.struct_size = sizeof vt, .broadcast = broadcast};
static const struct tr_plugin_info info = {
    .abi_major = TR_ABI_MAJOR, .struct_size = sizeof info, .kind = TR_KIND_COMM,
    .name = "null_slot", .version = "1", .description = "allreduce_sum missing",
    .create = create, .vtable = &vt};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &info; }

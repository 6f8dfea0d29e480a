/* A schedule plugin whose mandatory lr slot is NULL. */
#include <trainrun/plugin.h>

static int create(const struct tr_host *h, const void *c, const struct tr_create_args *a,
                  void **self, tr_err *err)
{
    (void)h, (void)c, (void)a, (void)err;
    *self = NULL;
    return TR_OK;
}
static const struct tr_schedule_vtable vt = {sizeof vt, NULL, NULL, NULL, NULL};
static const struct tr_plugin_info info = {
    .abi_major = TR_ABI_MAJOR, .struct_size = sizeof info, .kind = TR_KIND_SCHEDULE,
    .name = "null_slot", .version = "1", .description = "lr slot missing", .create = create,
    .vtable = &vt};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &info; }

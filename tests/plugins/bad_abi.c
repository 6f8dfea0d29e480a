/* A plugin built for a future ABI: the loader must refuse it by name. */
#include <trainrun/plugin.h>

static int create(const struct tr_host *h, const void *c, const struct tr_create_args *a,
                  void **self, tr_err *err)
{
    (void)h, (void)c, (void)a, (void)err;
    *self = NULL;
    return TR_OK;
}
static double lr(void *self, uint64_t step, uint64_t total, double base)
{
    (void)self, (void)step, (void)total;
    return base;
}
static const struct tr_schedule_vtable vt = {sizeof vt, lr, NULL, NULL, NULL};
static const struct tr_plugin_info info = {
    .abi_major = 99, .struct_size = sizeof info, .kind = TR_KIND_SCHEDULE, .name = "bad_abi",
    .version = "1", .description = "built for ABI 99", .create = create, .vtable = &vt};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &info; }

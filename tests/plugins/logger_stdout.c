#include <trainrun/plugin.h>
#include <string.h>

static int mine_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host; (void)config; (void)args; (void)err;
    *self = NULL; /* stateless */
    return TR_OK;
}
static int mine_open(void *self, int resume, tr_err *err)
{
    (void)self; (void)err;
    printf("logging %s\n", resume ? "a resumed run" : "a new run");
    return TR_OK;
}
static int mine_text(void *self, uint64_t step, const char *key, const char *value, tr_err *err)
{
    (void)self; (void)step; (void)err;
    printf("%s = %s\n", key, value);
    return TR_OK;
}
static int mine_scalars(void *self, uint64_t step, const struct tr_scalar *v, size_t n,
                        tr_err *err)
{
    (void)self;
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, "loss") == 0 &&
            printf("step %llu loss %g\n", (unsigned long long)step, v[i].value) < 0)
            return tr_fail(err, "cannot write to stdout");
    return fflush(stdout) == 0 ? TR_OK : tr_fail(err, "cannot write to stdout");
}
static const struct tr_logger_vtable mine_vtable = {
    .struct_size = sizeof mine_vtable, .open = mine_open, .scalars = mine_scalars,
    .text = mine_text};
static const struct tr_plugin_info mine_info = {
    .abi_major = TR_ABI_MAJOR, .struct_size = sizeof mine_info, .kind = TR_KIND_LOGGER,
    .name = "stdout", .version = "0.1.0", .description = "each step's loss on stdout",
    .create = mine_create, .vtable = &mine_vtable};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &mine_info; }

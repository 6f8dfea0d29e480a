/* A comm plugin with the mandatory slots and no allgather (optional):
 * loaded like any other, but a ZeRO-1 job (parallel.zero), which shares
 * the updated parameter shards with allgather, must refuse it before
 * training (tests/e2e/parallel.sh).  Its collectives do nothing: the job
 * never gets to call them. */
#include <trainrun/plugin.h>

static int create(const struct tr_host *h, const void *c, const struct tr_create_args *a,
                  void **self, tr_err *err)
{
    (void)h, (void)c, (void)a, (void)err;
    *self = NULL;
    return TR_OK;
}
static int allreduce_sum(void *self, float *buf, size_t count, tr_err *err)
{
    (void)self, (void)buf, (void)count;
    return tr_fail(err, "comm no_allgather: called, though the job should have been refused");
}
static int broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    (void)self, (void)buf, (void)bytes, (void)root;
    return tr_fail(err, "comm no_allgather: called, though the job should have been refused");
}
static const struct tr_comm_vtable vt = {
    .struct_size = sizeof vt, .allreduce_sum = allreduce_sum, .broadcast = broadcast};
static const struct tr_plugin_info info = {
    .abi_major = TR_ABI_MAJOR, .struct_size = sizeof info, .kind = TR_KIND_COMM,
    .name = "no_allgather", .version = "1", .description = "no allgather slot",
    .create = create, .vtable = &vt};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &info; }

/* A comm plugin as one built against plugin ABI 2.2 is: its vtable ends
 * before reduce_scatter (struct_size says so), allgather present.  Loaded
 * like any other, ZeRO-1 could use it, but a job with shard = "gradients",
 * which reduce-scatters the gradients, must refuse it before training,
 * naming the slot (tests/e2e/shard.sh).  Its collectives fail: the job
 * never gets to call them. */
#include <trainrun/plugin.h>

#include <stddef.h>

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
    return tr_fail(err, "comm no_reduce_scatter: called, though the job should have been refused");
}
static int broadcast(void *self, void *buf, size_t bytes, int root, tr_err *err)
{
    (void)self, (void)buf, (void)bytes, (void)root;
    return tr_fail(err, "comm no_reduce_scatter: called, though the job should have been refused");
}
static int allgather(void *self, float *buf, size_t count, tr_err *err)
{
    (void)self, (void)buf, (void)count;
    return tr_fail(err, "comm no_reduce_scatter: called, though the job should have been refused");
}
static const struct tr_comm_vtable vt = {
    .struct_size = offsetof(struct tr_comm_vtable, reduce_scatter),
    .allreduce_sum = allreduce_sum, .broadcast = broadcast, .allgather = allgather};
static const struct tr_plugin_info info = {
    .abi_major = TR_ABI_MAJOR, .struct_size = sizeof info, .kind = TR_KIND_COMM,
    .name = "no_reduce_scatter", .version = "1", .description = "a 2.2 vtable: no reduce_scatter",
    .create = create, .vtable = &vt};
const struct tr_plugin_info *TR_PLUGIN_ENTRY(void) { return &info; }

#include "topo.h"

#include "util.h"

#include <hwloc.h>
#include <omp.h>
#include <string.h>

struct tr_topo {
    hwloc_topology_t topology;
    int is_this_machine;  /* binding only makes sense for the machine we run on */
    hwloc_bitmap_t compute; /* cores used by compute threads */
};

struct tr_topo *tr_topo_open(const char *source, tr_err *err)
{
    struct tr_topo *t = tr_xcalloc(1, sizeof *t);
    if (hwloc_topology_init(&t->topology) != 0) {
        free(t);
        tr_fail(err, "hwloc: cannot initialise a topology");
        return NULL;
    }
    int rc = 0;
    if (source && strncmp(source, "synthetic:", 10) == 0)
        rc = hwloc_topology_set_synthetic(t->topology, source + 10);
    else if (source && strncmp(source, "xml:", 4) == 0)
        rc = hwloc_topology_set_xml(t->topology, source + 4);
    else if (source && *source)
        rc = -1;
    if (rc != 0 || hwloc_topology_load(t->topology) != 0) {
        tr_fail(err, "hwloc: cannot load the topology %s (use synthetic:<description> or "
                "xml:<file>)", source ? source : "of this machine");
        hwloc_topology_destroy(t->topology);
        free(t);
        return NULL;
    }
    t->is_this_machine = !source || !*source;
    t->compute = hwloc_bitmap_alloc();
    return t;
}

void tr_topo_close(struct tr_topo *t)
{
    if (!t)
        return;
    hwloc_bitmap_free(t->compute);
    hwloc_topology_destroy(t->topology);
    free(t);
}

int tr_topo_cores(const struct tr_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_CORE);
    return n > 0 ? n : tr_topo_pus(t);
}

int tr_topo_pus(const struct tr_topo *t) { return hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_PU); }

static hwloc_obj_t core_at(const struct tr_topo *t, int i)
{
    hwloc_obj_t o = hwloc_get_obj_by_type(t->topology, HWLOC_OBJ_CORE, (unsigned)i);
    return o ? o : hwloc_get_obj_by_type(t->topology, HWLOC_OBJ_PU, (unsigned)i);
}

int tr_topo_bind_compute(struct tr_topo *t, int threads)
{
    int cores = tr_topo_cores(t);
    if (threads <= 0 || threads > cores)
        threads = cores;
    hwloc_bitmap_zero(t->compute);
    for (int i = 0; i < threads; i++) {
        hwloc_obj_t core = core_at(t, i);
        if (core)
            hwloc_bitmap_or(t->compute, t->compute, core->cpuset);
    }
    if (!t->is_this_machine)
        return threads;
    int pinned = 0;
#pragma omp parallel num_threads(threads) reduction(+ : pinned)
    {
        hwloc_obj_t core = core_at(t, omp_get_thread_num() % cores);
        if (core) {
            /* one PU of the core: the kernels are not written for SMT siblings */
            hwloc_bitmap_t pu = hwloc_bitmap_dup(core->cpuset);
            hwloc_bitmap_singlify(pu);
            pinned += hwloc_set_cpubind(t->topology, pu, HWLOC_CPUBIND_THREAD) == 0;
            hwloc_bitmap_free(pu);
        }
    }
    return pinned;
}

int tr_topo_bind_loader(struct tr_topo *t)
{
    if (!t->is_this_machine || hwloc_bitmap_iszero(t->compute))
        return 0;
    return hwloc_set_cpubind(t->topology, t->compute, HWLOC_CPUBIND_THREAD) == 0;
}

void tr_topo_print(const struct tr_topo *t, int threads, int workers, FILE *out)
{
    int cores = tr_topo_cores(t);
    if (threads <= 0 || threads > cores)
        threads = cores;
    int packages = hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_PACKAGE);
    int numa = hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_NUMANODE);
    fprintf(out, "topology: %d package(s), %d NUMA node(s), %d core(s), %d PU(s)\n",
            packages, numa, cores, tr_topo_pus(t));
    char set[256];
    for (int i = 0; i < threads; i++) {
        hwloc_obj_t core = core_at(t, i);
        hwloc_bitmap_snprintf(set, sizeof set, core ? core->cpuset : NULL);
        fprintf(out, "  compute thread %d -> core L#%d (cpuset %s)\n", i, i, set);
    }
    hwloc_bitmap_t all = hwloc_bitmap_alloc();
    for (int i = 0; i < threads; i++) {
        hwloc_obj_t core = core_at(t, i);
        if (core)
            hwloc_bitmap_or(all, all, core->cpuset);
    }
    hwloc_bitmap_list_snprintf(set, sizeof set, all);
    fprintf(out, "  %d loader worker(s) -> beside them, PUs %s\n", workers, set);
    hwloc_bitmap_free(all);
}

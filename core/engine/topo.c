#include "topo.h"

#include "run.h"
#include "../util/util.h"

#include <hwloc.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define NVIDIA_PCI_VENDOR 0x10de
#define PCI_CLASS_DISPLAY 0x03 /* VGA (0x0300) and 3D controllers (0x0302) */

struct tr_topo {
    hwloc_topology_t topology;
    int is_this_machine;  /* binding only makes sense for the machine we run on */
    hwloc_bitmap_t compute; /* cores used by compute threads */
    /* NVIDIA GPUs in PCI bus order, and how many PCI devices hwloc saw at all */
    hwloc_obj_t *gpus;
    int n_gpus, n_pci;
    /* this process's rank, after tr_topo_use */
    int placed;
    hwloc_bitmap_t rank_compute, rank_loader;
};

static int by_pci_bus(const void *a, const void *b)
{
    const struct hwloc_pcidev_attr_s *x = &(*(const hwloc_obj_t *)a)->attr->pcidev;
    const struct hwloc_pcidev_attr_s *y = &(*(const hwloc_obj_t *)b)->attr->pcidev;
    unsigned long kx = ((unsigned long)x->domain << 24) | ((unsigned long)x->bus << 16) |
                       ((unsigned long)x->dev << 8) | x->func;
    unsigned long ky = ((unsigned long)y->domain << 24) | ((unsigned long)y->bus << 16) |
                       ((unsigned long)y->dev << 8) | y->func;
    return (kx > ky) - (kx < ky);
}

/* hwloc lists PCI devices in tree order; CUDA (with CUDA_DEVICE_ORDER=
 * PCI_BUS_ID) and nvidia-smi number GPUs by bus id, so sort.  NVSwitches
 * are NVIDIA devices too, but bridges, not display/3D controllers. */
static void find_gpus(struct tr_topo *t)
{
    int capacity = 0;
    for (hwloc_obj_t dev = NULL; (dev = hwloc_get_next_pcidev(t->topology, dev));) {
        t->n_pci++;
        if (dev->attr->pcidev.vendor_id != NVIDIA_PCI_VENDOR ||
            dev->attr->pcidev.class_id >> 8 != PCI_CLASS_DISPLAY)
            continue;
        if (t->n_gpus == capacity) {
            capacity = capacity ? 2 * capacity : 8;
            t->gpus = tr_xrealloc(t->gpus, (size_t)capacity * sizeof *t->gpus);
        }
        t->gpus[t->n_gpus++] = dev;
    }
    if (t->n_gpus > 1)
        qsort(t->gpus, (size_t)t->n_gpus, sizeof *t->gpus, by_pci_bus);
}

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
    /* GPUs are PCI devices: keep the important ones (GPUs, NICs, storage),
     * which hwloc drops by default */
    if (rc == 0)
        rc = hwloc_topology_set_io_types_filter(t->topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (rc != 0 || hwloc_topology_load(t->topology) != 0) {
        tr_fail(err, "hwloc: cannot load the topology %s (use synthetic:<description> or "
                "xml:<file>)", source ? source : "of this machine");
        hwloc_topology_destroy(t->topology);
        free(t);
        return NULL;
    }
    t->is_this_machine = !source || !*source;
    t->compute = hwloc_bitmap_alloc();
    t->rank_compute = hwloc_bitmap_alloc();
    t->rank_loader = hwloc_bitmap_alloc();
    find_gpus(t);
    return t;
}

void tr_topo_close(struct tr_topo *t)
{
    if (!t)
        return;
    hwloc_bitmap_free(t->compute);
    hwloc_bitmap_free(t->rank_compute);
    hwloc_bitmap_free(t->rank_loader);
    free(t->gpus);
    hwloc_topology_destroy(t->topology);
    free(t);
}

int tr_topo_cores(const struct tr_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_CORE);
    return n > 0 ? n : tr_topo_pus(t);
}

int tr_topo_pus(const struct tr_topo *t) { return hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_PU); }

int tr_topo_gpus(const struct tr_topo *t) { return t->n_gpus; }

static hwloc_obj_t core_at(const struct tr_topo *t, int i)
{
    hwloc_obj_t o = hwloc_get_obj_by_type(t->topology, HWLOC_OBJ_CORE, (unsigned)i);
    return o ? o : hwloc_get_obj_by_type(t->topology, HWLOC_OBJ_PU, (unsigned)i);
}

/* The cores compute threads may use: the rank's after tr_topo_use, else
 * all of them.  Returns how many were written to `out` (size: all cores). */
static int usable_cores(const struct tr_topo *t, hwloc_obj_t *out)
{
    int cores = tr_topo_cores(t), n = 0;
    for (int i = 0; i < cores; i++) {
        hwloc_obj_t core = core_at(t, i);
        if (core && (!t->placed || hwloc_bitmap_isincluded(core->cpuset, t->rank_compute)))
            out[n++] = core;
    }
    return n;
}

int tr_topo_bind_compute(struct tr_topo *t, int threads)
{
    hwloc_obj_t *cores = tr_xcalloc((size_t)tr_topo_cores(t) + 1, sizeof *cores);
    int n = usable_cores(t, cores);
    if (n == 0) {
        free(cores);
        return 0;
    }
    if (threads <= 0 || threads > n)
        threads = n;
    hwloc_bitmap_zero(t->compute);
    for (int i = 0; i < threads; i++)
        hwloc_bitmap_or(t->compute, t->compute, cores[i]->cpuset);
    if (!t->is_this_machine) {
        free(cores);
        return threads;
    }
    int pinned = 0;
#pragma omp parallel num_threads(threads) reduction(+ : pinned)
    {
        hwloc_obj_t core = cores[omp_get_thread_num() % n];
        /* one PU of the core: the kernels are not written for SMT siblings */
        hwloc_bitmap_t pu = hwloc_bitmap_dup(core->cpuset);
        hwloc_bitmap_singlify(pu);
        pinned += hwloc_set_cpubind(t->topology, pu, HWLOC_CPUBIND_THREAD) == 0;
        hwloc_bitmap_free(pu);
    }
    free(cores);
    return pinned;
}

int tr_topo_bind_loader(struct tr_topo *t)
{
    hwloc_const_bitmap_t set = t->placed ? t->rank_loader : t->compute;
    if (!t->is_this_machine || hwloc_bitmap_iszero(set))
        return 0;
    return hwloc_set_cpubind(t->topology, set, HWLOC_CPUBIND_THREAD) == 0;
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

/* ---- ranks ----------------------------------------------------------------- */

/* NUMA nodes that have cores, each cpuset once (nodes that only add memory,
 * such as CXL expanders or HBM beside DDR, share or lack a cpuset). */
static int numa_cpusets(const struct tr_topo *t, hwloc_const_cpuset_t *out, int max)
{
    int n = 0;
    hwloc_obj_t node = NULL;
    while (n < max && (node = hwloc_get_next_obj_by_type(t->topology, HWLOC_OBJ_NUMANODE, node))) {
        if (!node->cpuset || hwloc_bitmap_iszero(node->cpuset))
            continue;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++)
            seen = hwloc_bitmap_isequal(out[i], node->cpuset);
        if (!seen)
            out[n++] = node->cpuset;
    }
    return n;
}

/* The cores rank j's share is cut from.  A GPU rank: what hwloc says its
 * GPU is local to (the first non-I/O ancestor of the PCI device).  A CPU
 * rank: whole NUMA nodes when there are at least as many nodes as ranks,
 * else the node of the core at the middle of the rank's even slice, so
 * nodes get ranks in proportion to their cores. */
static void rank_locality(const struct tr_topo *t, enum tr_topo_device device, int world, int j,
                          hwloc_const_cpuset_t *nodes, int n_nodes, hwloc_bitmap_t out)
{
    hwloc_bitmap_zero(out);
    if (device == TR_TOPO_CUDA) {
        hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(t->topology, t->gpus[j]);
        hwloc_bitmap_copy(out, near->cpuset);
    } else if (n_nodes >= world) {
        for (int k = j * n_nodes / world; k < (j + 1) * n_nodes / world; k++)
            hwloc_bitmap_or(out, out, nodes[k]);
    } else {
        int cores = tr_topo_cores(t);
        hwloc_obj_t middle = core_at(t, (int)((2LL * j + 1) * cores / (2LL * world)));
        for (int k = 0; k < n_nodes && hwloc_bitmap_iszero(out); k++)
            if (hwloc_bitmap_intersects(nodes[k], middle->cpuset))
                hwloc_bitmap_copy(out, nodes[k]);
    }
    if (hwloc_bitmap_iszero(out)) /* no NUMA information: the whole machine */
        hwloc_bitmap_copy(out, hwloc_topology_get_topology_cpuset(t->topology));
}

/* Shares of all ranks: ranks with the same locality form a group; groups
 * are served smallest locality first (a GPU attached to the whole machine
 * takes what the others left), each splitting the cores of its locality not
 * yet taken into equal contiguous blocks, in rank order. */
static void share_out(const struct tr_topo *t, enum tr_topo_device device, int world,
                      hwloc_bitmap_t *near, hwloc_bitmap_t *share, int *shared)
{
    int cores = tr_topo_cores(t), n_nodes = hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_NUMANODE);
    hwloc_const_cpuset_t *nodes = tr_xcalloc((size_t)n_nodes + 1, sizeof *nodes);
    n_nodes = numa_cpusets(t, nodes, n_nodes);
    int *group = tr_xcalloc((size_t)world, sizeof *group); /* first rank with the same locality */
    for (int j = 0; j < world; j++) {
        rank_locality(t, device, world, j, nodes, n_nodes, near[j]);
        group[j] = j;
        for (int i = 0; i < j && group[j] == j; i++)
            if (hwloc_bitmap_isequal(near[i], near[j]))
                group[j] = group[i];
    }
    hwloc_bitmap_t taken = hwloc_bitmap_alloc();
    hwloc_obj_t *free_cores = tr_xcalloc((size_t)cores + 1, sizeof *free_cores);
    char *served = tr_xcalloc((size_t)world, 1);
    for (;;) {
        int g = -1; /* the unserved group with the smallest locality */
        for (int j = 0; j < world; j++)
            if (group[j] == j && !served[j] &&
                (g < 0 || hwloc_bitmap_weight(near[j]) < hwloc_bitmap_weight(near[g])))
                g = j;
        if (g < 0)
            break;
        served[g] = 1;
        int members = 0;
        for (int j = 0; j < world; j++)
            members += group[j] == g;
        /* its free cores, else (all taken by smaller groups) all its cores */
        int n = 0;
        for (int pass = 0; pass < 2 && n == 0; pass++)
            for (int i = 0; i < cores; i++) {
                hwloc_obj_t core = core_at(t, i);
                if (hwloc_bitmap_isincluded(core->cpuset, near[g]) &&
                    (pass == 1 || !hwloc_bitmap_intersects(core->cpuset, taken)))
                    free_cores[n++] = core;
            }
        for (int j = 0, q = 0; j < world; j++) {
            if (group[j] != g)
                continue;
            hwloc_bitmap_zero(share[j]);
            if (n >= members) {
                for (int i = q * n / members; i < (q + 1) * n / members; i++)
                    hwloc_bitmap_or(share[j], share[j], free_cores[i]->cpuset);
            } else if (n > 0) {
                hwloc_bitmap_copy(share[j], free_cores[q % n]->cpuset);
                shared[j] = 1;
            }
            hwloc_bitmap_or(taken, taken, share[j]);
            q++;
        }
    }
    free(served);
    free(free_cores);
    hwloc_bitmap_free(taken);
    free(group);
    free(nodes);
}

/* Cores of `set` in logical order, into out[]; returns how many. */
static int cores_in(const struct tr_topo *t, hwloc_const_cpuset_t set, hwloc_obj_t *out)
{
    int n = 0, cores = tr_topo_cores(t);
    for (int i = 0; i < cores; i++) {
        hwloc_obj_t core = core_at(t, i);
        if (hwloc_bitmap_isincluded(core->cpuset, set))
            out[n++] = core;
    }
    return n;
}

int tr_topo_place(const struct tr_topo *t, enum tr_topo_device device, int local_world,
                  int local_rank, struct tr_topo_rank *out, tr_err *err)
{
    memset(out, 0, sizeof *out);
    if (local_world < 1 || local_rank < 0 || local_rank >= local_world)
        return tr_fail(err, "placement: local rank %d of %d ranks does not exist", local_rank,
                       local_world);
    if (device == TR_TOPO_CUDA && t->n_gpus < local_world) {
        if (t->n_pci == 0)
            return tr_fail(err, "placement: %d GPU rank(s), but hwloc sees no PCI devices here "
                           "(is /sys/bus/pci readable in this container?)", local_world);
        if (t->n_gpus == 0)
            return tr_fail(err, "placement: %d GPU rank(s), but hwloc finds no NVIDIA GPU among "
                           "this node's %d PCI devices (vendor 10de): run CPU ranks (procs=N), or "
                           "check that the GPUs are visible in this container", local_world, t->n_pci);
        return tr_fail(err, "placement: %d GPU rank(s), but this node has %d NVIDIA GPU(s): "
                       "start at most %d (gpus=%d), one per GPU", local_world, t->n_gpus,
                       t->n_gpus, t->n_gpus);
    }
    hwloc_bitmap_t *near = tr_xcalloc((size_t)local_world, sizeof *near);
    hwloc_bitmap_t *share = tr_xcalloc((size_t)local_world, sizeof *share);
    int *shared = tr_xcalloc((size_t)local_world, sizeof *shared);
    for (int j = 0; j < local_world; j++) {
        near[j] = hwloc_bitmap_alloc();
        share[j] = hwloc_bitmap_alloc();
    }
    share_out(t, device, local_world, near, share, shared);

    out->local_rank = local_rank;
    out->local_world = local_world;
    out->gpu = -1;
    out->shared = shared[local_rank];
    out->near = hwloc_bitmap_dup(near[local_rank]);
    out->compute = hwloc_bitmap_alloc();
    out->loader = hwloc_bitmap_alloc();
    hwloc_obj_t *mine = tr_xcalloc((size_t)tr_topo_cores(t) + 1, sizeof *mine);
    int n = cores_in(t, share[local_rank], mine);
    if (device == TR_TOPO_CUDA) {
        const struct hwloc_pcidev_attr_s *pci = &t->gpus[local_rank]->attr->pcidev;
        out->gpu = local_rank;
        snprintf(out->gpu_busid, sizeof out->gpu_busid, "%04x:%02x:%02x.%x", pci->domain, pci->bus,
                 pci->dev, pci->func);
        /* The host thread that launches kernels, with the CUDA and NCCL
         * helper threads that follow it, needs a core or two; the loader
         * (reading, collating, pinned copies) gets the rest. */
        int compute = n < 3 ? 1 : 2;
        for (int i = 0; i < n; i++) {
            hwloc_bitmap_t set = i < compute ? out->compute : out->loader;
            hwloc_bitmap_or(set, set, mine[i]->cpuset);
        }
        if (n == 1)
            hwloc_bitmap_copy(out->loader, out->compute);
        out->compute_cores = n < compute ? n : compute;
        out->loader_cores = n == 1 ? 1 : n - out->compute_cores;
    } else {
        /* compute threads one per core; loader workers beside them */
        hwloc_bitmap_copy(out->compute, share[local_rank]);
        hwloc_bitmap_copy(out->loader, share[local_rank]);
        out->compute_cores = out->loader_cores = n;
    }
    free(mine);
    for (int j = 0; j < local_world; j++) {
        hwloc_bitmap_free(near[j]);
        hwloc_bitmap_free(share[j]);
    }
    free(near);
    free(share);
    free(shared);
    return TR_OK;
}

void tr_topo_rank_free(struct tr_topo_rank *r)
{
    if (!r)
        return;
    hwloc_bitmap_free(r->near);
    hwloc_bitmap_free(r->compute);
    hwloc_bitmap_free(r->loader);
    r->near = r->compute = r->loader = NULL;
}

int tr_topo_use(struct tr_topo *t, const struct tr_topo_rank *r)
{
    hwloc_bitmap_copy(t->rank_compute, r->compute);
    hwloc_bitmap_copy(t->rank_loader, r->loader);
    t->placed = 1;
    if (!t->is_this_machine)
        return 0;
    return hwloc_set_cpubind(t->topology, r->compute, HWLOC_CPUBIND_THREAD) == 0;
}

/* "NUMA 0" or "NUMA 0-1": the nodes whose memory is local to a cpuset. */
static void describe_numa(const struct tr_topo *t, hwloc_const_cpuset_t set, char *buf, size_t size)
{
    hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
    hwloc_cpuset_to_nodeset(t->topology, set, nodes);
    char list[64];
    hwloc_bitmap_list_snprintf(list, sizeof list, nodes);
    snprintf(buf, size, "NUMA %s", list);
    hwloc_bitmap_free(nodes);
}

int tr_topo_print_ranks(const struct tr_topo *t, enum tr_topo_device device, int local_world,
                        FILE *out, tr_err *err)
{
    int cuda = device == TR_TOPO_CUDA;
    fprintf(out, "topology: %d package(s), %d NUMA node(s), %d core(s), %d PU(s), %d NVIDIA GPU(s)\n",
            hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_PACKAGE),
            hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_NUMANODE), tr_topo_cores(t),
            tr_topo_pus(t), t->n_gpus);
    fprintf(out, "%d %s rank(s) on this node", local_world, cuda ? "GPU" : "CPU");
    if (cuda)
        fprintf(out, "; local rank r drives GPU r in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)");
    fprintf(out, "\n(sets are PU (OS) indices, as taskset and numactl take them)\n");
    int any_shared = 0, fewest = 0, most = 0;
    for (int r = 0; r < local_world; r++) {
        struct tr_topo_rank p;
        if (tr_topo_place(t, device, local_world, r, &p, err) != TR_OK)
            return TR_ERROR;
        char numa[80], compute[512], loader[512];
        describe_numa(t, p.near, numa, sizeof numa);
        hwloc_bitmap_list_snprintf(compute, sizeof compute, p.compute);
        hwloc_bitmap_list_snprintf(loader, sizeof loader, p.loader);
        fprintf(out, "  rank %d", r);
        if (cuda)
            fprintf(out, "  GPU %d %s", p.gpu, p.gpu_busid);
        fprintf(out, "  %s  compute %d core(s) PUs %s  loader %d core(s) PUs %s%s\n", numa,
                p.compute_cores, compute, p.loader_cores, loader, p.shared ? "  (shared)" : "");
        any_shared |= p.shared;
        int cores = p.compute_cores + (cuda ? p.loader_cores : 0);
        fewest = r == 0 || cores < fewest ? cores : fewest;
        most = cores > most ? cores : most;
        tr_topo_rank_free(&p);
    }
    if (any_shared)
        fprintf(out, "warning: more ranks than cores near them: ranks marked (shared) share cores\n");
    else if (fewest != most && !cuda)
        /* ranks wait for each other at every all-reduce */
        fprintf(out, "note: ranks have %d to %d cores, and the slowest sets the pace: a rank count "
                "that is a multiple of the NUMA nodes (%d) evens them out\n", fewest, most,
                hwloc_get_nbobjs_by_type(t->topology, HWLOC_OBJ_NUMANODE));
    return TR_OK;
}

/* ---- the command ------------------------------------------------------- */

static void topo_usage(FILE *out)
{
    fprintf(out, "usage: trainrun topo [--topology synthetic:DESC|xml:FILE] [--threads N] [--workers N]\n"
                 "       trainrun topo [--topology ...] procs=N|gpus=N\n"
                 "  where compute and loader threads run; with procs=N or gpus=N, each rank's\n"
                 "  cores on this node (docs/scale-out.md)\n");
}

/* A count argument: a whole number in [1, 1024]. */
static int parse_count(const char *text, int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < 1 || v > 1024)
        return -1;
    *out = (int)v;
    return 0;
}

int tr_topo_main(int argc, char **argv)
{
    const char *source = NULL;
    int threads = 0, workers = 1, procs = 0, gpus = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            topo_usage(stdout);
            return TR_EXIT_OK;
        } else if (strcmp(a, "--topology") == 0 && i + 1 < argc) {
            source = argv[++i];
        } else if ((strcmp(a, "--threads") == 0 || strcmp(a, "--workers") == 0) && i + 1 < argc) {
            /* strictly: atoi read "abc" as 0 and "4x" as 4 */
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end || v < 0 || v > 4096) {
                fprintf(stderr, "trainrun: error: topo: %s takes an integer from 0 to 4096, not "
                                "'%s'\n", a, argv[i]);
                return TR_EXIT_USAGE;
            }
            *(strcmp(a, "--threads") == 0 ? &threads : &workers) = (int)v;
        } else if (strncmp(a, "procs=", 6) == 0) {
            bad = parse_count(a + 6, &procs);
        } else if (strncmp(a, "gpus=", 5) == 0) {
            bad = parse_count(a + 5, &gpus);
        } else {
            fprintf(stderr, "trainrun: error: unknown argument '%s' for topo\n", a);
            topo_usage(stderr);
            return TR_EXIT_USAGE;
        }
        if (bad) {
            fprintf(stderr, "trainrun: error: topo: '%s' needs a count from 1 to 1024\n", a);
            return TR_EXIT_USAGE;
        }
    }
    if (procs && gpus) {
        fprintf(stderr, "trainrun: error: topo: procs=N or gpus=N, not both\n");
        return TR_EXIT_USAGE;
    }
    tr_err err = {{0}};
    struct tr_topo *t = tr_topo_open(source, &err);
    if (!t) {
        fprintf(stderr, "trainrun: error: %s\n", err.msg);
        return TR_EXIT_ERROR;
    }
    int code = TR_EXIT_OK;
    if (procs || gpus) {
        if (tr_topo_print_ranks(t, gpus ? TR_TOPO_CUDA : TR_TOPO_CPU, gpus ? gpus : procs, stdout,
                                &err) != TR_OK) {
            fprintf(stderr, "trainrun: error: %s\n", err.msg);
            code = TR_EXIT_ERROR;
        }
    } else {
        tr_topo_print(t, threads, workers, stdout);
    }
    tr_topo_close(t);
    return code;
}

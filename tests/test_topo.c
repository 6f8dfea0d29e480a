/* Placement of ranks on a node, on machines this one is not: hwloc
 * synthetic topologies for CPU ranks, and hand-built XML exports of a
 * two-socket, 8-GPU server (tests/topologies/make-gpu-servers.py) for GPU
 * ranks.  Expected sets are written out in PU (OS) indices; in the XML
 * servers socket s holds cores 16s..16s+15, and core c's two hardware
 * threads are PUs c and c+32.
 *
 * Covers: core/engine/topo.c.
 */
#include <criterion/criterion.h>
#include "capture.h"

#include "engine/run.h"
#include "engine/topo.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SERVER "xml:" TR_TEST_SRCDIR "/topologies/2s-8gpu.xml"
#define SERVER_SNC "xml:" TR_TEST_SRCDIR "/topologies/2s4n-8gpu.xml"

static struct tr_topo *open_topology(const char *source)
{
    tr_err err = {{0}};
    struct tr_topo *t = tr_topo_open(source, &err);
    cr_assert_not_null(t, "%s: %s", source, err.msg);
    return t;
}

static struct tr_topo_rank place(struct tr_topo *t, enum tr_topo_device device, int world, int rank)
{
    struct tr_topo_rank r;
    tr_err err = {{0}};
    cr_assert_eq(tr_topo_place(t, device, world, rank, &r, &err), TR_OK, "rank %d of %d: %s", rank,
                 world, err.msg);
    return r;
}

static hwloc_bitmap_t set_of(const char *list)
{
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    cr_assert_eq(hwloc_bitmap_list_sscanf(b, list), 0, "bad list %s", list);
    return b;
}

static void assert_set(hwloc_const_bitmap_t got, const char *want, const char *what, int rank)
{
    char text[256];
    hwloc_bitmap_list_snprintf(text, sizeof text, got);
    cr_assert_str_eq(text, want, "rank %d: %s is %s, expected %s", rank, what, text, want);
}

/* All of a rank's cores: compute and loader. */
static hwloc_bitmap_t all_of(const struct tr_topo_rank *r)
{
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    hwloc_bitmap_or(b, r->compute, r->loader);
    return b;
}

/* ---- GPU ranks on the XML servers ------------------------------------------ */

static const char *const bus_order[] = {"0000:19:00.0", "0000:2b:00.0", "0000:3b:00.0",
                                        "0000:5e:00.0", "0000:9b:00.0", "0000:ac:00.0",
                                        "0000:bb:00.0", "0000:dc:00.0"};

Test(placement, gpus_in_pci_bus_order_not_nvswitches_or_nics)
{
    struct tr_topo *t = open_topology(SERVER);
    cr_assert_eq(tr_topo_gpus(t), 8, "the XML lists 8 GPUs (and NICs, an NVMe drive, NVSwitches)");
    cr_assert_eq(tr_topo_cores(t), 32);
    cr_assert_eq(tr_topo_pus(t), 64);
    /* the file lists each socket's GPUs highest bus first */
    for (int r = 0; r < 8; r++) {
        struct tr_topo_rank p = place(t, TR_TOPO_CUDA, 8, r);
        cr_assert_eq(p.gpu, r);
        cr_assert_str_eq(p.gpu_busid, bus_order[r], "rank %d", r);
        tr_topo_rank_free(&p);
    }
    tr_topo_close(t);
}

Test(placement, eight_gpu_ranks_sit_on_their_gpus_socket_without_overlap)
{
    struct tr_topo *t = open_topology(SERVER);
    hwloc_bitmap_t socket[2] = {set_of("0-15,32-47"), set_of("16-31,48-63")};
    hwloc_bitmap_t used = hwloc_bitmap_alloc();
    for (int r = 0; r < 8; r++) {
        struct tr_topo_rank p = place(t, TR_TOPO_CUDA, 8, r);
        hwloc_bitmap_t mine = all_of(&p);
        int s = r < 4 ? 0 : 1; /* GPUs 0-3 hang off socket 0, 4-7 off socket 1 */
        cr_assert(hwloc_bitmap_isequal(p.near, socket[s]), "rank %d: near the wrong socket", r);
        cr_assert(hwloc_bitmap_isincluded(mine, socket[s]), "rank %d: cores off its GPU's socket", r);
        cr_assert_not(hwloc_bitmap_intersects(mine, used), "rank %d overlaps an earlier rank", r);
        cr_assert_not(hwloc_bitmap_intersects(p.compute, p.loader), "rank %d: compute/loader overlap", r);
        /* 16 cores shared by 4 ranks: 4 each, 2 drive the GPU, 2 load */
        cr_assert_eq(p.compute_cores, 2);
        cr_assert_eq(p.loader_cores, 2);
        cr_assert_eq(hwloc_bitmap_weight(mine), 8, "4 cores x 2 threads");
        cr_assert_not(p.shared);
        hwloc_bitmap_or(used, used, mine);
        hwloc_bitmap_free(mine);
        tr_topo_rank_free(&p);
    }
    cr_assert_eq(hwloc_bitmap_weight(used), 64, "every core is someone's");

    struct tr_topo_rank p = place(t, TR_TOPO_CUDA, 8, 0);
    assert_set(p.compute, "0-1,32-33", "compute", 0);
    assert_set(p.loader, "2-3,34-35", "loader", 0);
    tr_topo_rank_free(&p);
    p = place(t, TR_TOPO_CUDA, 8, 5);
    assert_set(p.compute, "20-21,52-53", "compute", 5);
    assert_set(p.loader, "22-23,54-55", "loader", 5);
    tr_topo_rank_free(&p);
    hwloc_bitmap_free(used);
    hwloc_bitmap_free(socket[0]);
    hwloc_bitmap_free(socket[1]);
    tr_topo_close(t);
}

Test(placement, fewer_gpu_ranks_share_their_socket)
{
    struct tr_topo *t = open_topology(SERVER);
    /* gpus=2: GPUs 0 and 1, both on socket 0, split its 16 cores */
    struct tr_topo_rank a = place(t, TR_TOPO_CUDA, 2, 0), b = place(t, TR_TOPO_CUDA, 2, 1);
    assert_set(a.compute, "0-1,32-33", "compute", 0);
    assert_set(a.loader, "2-7,34-39", "loader", 0);
    assert_set(b.compute, "8-9,40-41", "compute", 1);
    assert_set(b.loader, "10-15,42-47", "loader", 1);
    cr_assert_eq(a.loader_cores, 6);
    tr_topo_rank_free(&a);
    tr_topo_rank_free(&b);
    /* gpus=1: the whole socket of GPU 0 */
    a = place(t, TR_TOPO_CUDA, 1, 0);
    assert_set(a.compute, "0-1,32-33", "compute", 0);
    assert_set(a.loader, "2-15,34-47", "loader", 0);
    tr_topo_rank_free(&a);
    tr_topo_close(t);
}

Test(placement, gpu_ranks_split_their_numa_node_under_sub_numa_clustering)
{
    struct tr_topo *t = open_topology(SERVER_SNC);
    cr_assert_eq(tr_topo_gpus(t), 8);
    const char *node[] = {"0-7,32-39", "8-15,40-47", "16-23,48-55", "24-31,56-63"};
    hwloc_bitmap_t used = hwloc_bitmap_alloc();
    for (int r = 0; r < 8; r++) {
        struct tr_topo_rank p = place(t, TR_TOPO_CUDA, 8, r);
        cr_assert_str_eq(p.gpu_busid, bus_order[r]);
        assert_set(p.near, node[r / 2], "near", r); /* two GPUs per NUMA node */
        hwloc_bitmap_t mine = all_of(&p), home = set_of(node[r / 2]);
        cr_assert(hwloc_bitmap_isincluded(mine, home), "rank %d: off its GPU's NUMA node", r);
        cr_assert_not(hwloc_bitmap_intersects(mine, used), "rank %d overlaps", r);
        cr_assert_eq(hwloc_bitmap_weight(mine), 8, "8 cores per node, 2 ranks: 4 cores each");
        hwloc_bitmap_or(used, used, mine);
        hwloc_bitmap_free(mine);
        hwloc_bitmap_free(home);
        tr_topo_rank_free(&p);
    }
    hwloc_bitmap_free(used);
    tr_topo_close(t);
}

Test(placement, refuses_more_gpu_ranks_than_gpus)
{
    struct tr_topo *t = open_topology(SERVER);
    struct tr_topo_rank p;
    tr_err err = {{0}};
    cr_assert_eq(tr_topo_place(t, TR_TOPO_CUDA, 9, 0, &p, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "9 GPU rank(s), but this node has 8 NVIDIA GPU(s)"), "%s", err.msg);
    cr_assert_eq(tr_topo_place(t, TR_TOPO_CUDA, 8, 8, &p, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "local rank 8 of 8 ranks does not exist"), "%s", err.msg);
    tr_topo_close(t);

    /* this machine has PCI devices, none of them an NVIDIA GPU */
    t = open_topology(NULL);
    if (tr_topo_gpus(t) == 0) {
        cr_assert_eq(tr_topo_place(t, TR_TOPO_CUDA, 1, 0, &p, &err), TR_ERROR);
        cr_assert(strstr(err.msg, "no NVIDIA GPU") || strstr(err.msg, "no PCI devices"), "%s", err.msg);
    }
    tr_topo_close(t);

    /* a synthetic topology has no PCI devices at all */
    t = open_topology("synthetic:package:2 core:4 pu:1");
    cr_assert_eq(tr_topo_gpus(t), 0);
    cr_assert_eq(tr_topo_place(t, TR_TOPO_CUDA, 1, 0, &p, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "hwloc sees no PCI devices"), "%s", err.msg);
    tr_topo_close(t);
}

/* ---- CPU ranks on synthetic topologies ------------------------------------ */

/* The properties every CPU plan keeps, for `world` ranks: disjoint blocks
 * that cover the machine, each inside one NUMA node when there are at least
 * as many ranks as nodes, and ranks of one node within a core of each other. */
static void check_cpu_plan(const char *source, int world)
{
    struct tr_topo *t = open_topology(source);
    int cores = tr_topo_cores(t), pus_per_core = tr_topo_pus(t) / cores;
    hwloc_bitmap_t used = hwloc_bitmap_alloc();
    int *size = calloc((size_t)world, sizeof *size);
    hwloc_bitmap_t *near = calloc((size_t)world, sizeof *near);
    for (int r = 0; r < world; r++) {
        struct tr_topo_rank p = place(t, TR_TOPO_CPU, world, r);
        cr_assert(hwloc_bitmap_isequal(p.compute, p.loader), "%s: CPU loaders run beside compute", source);
        cr_assert_eq(p.gpu, -1);
        cr_assert_str_eq(p.gpu_busid, "");
        cr_assert_gt(p.compute_cores, 0, "%s rank %d of %d: no cores", source, r, world);
        cr_assert(hwloc_bitmap_isincluded(p.compute, p.near));
        cr_assert_eq(hwloc_bitmap_weight(p.compute), p.compute_cores * pus_per_core);
        cr_assert_not(hwloc_bitmap_intersects(p.compute, used), "%s: rank %d of %d overlaps",
                      source, r, world);
        cr_assert_not(p.shared);
        /* contiguous: the PUs from the first to the last core, nothing skipped */
        int first = hwloc_bitmap_first(p.compute), last = hwloc_bitmap_last(p.compute);
        cr_assert_eq(last - first + 1, hwloc_bitmap_weight(p.compute), "%s: rank %d of %d has a gap",
                     source, r, world);
        hwloc_bitmap_or(used, used, p.compute);
        size[r] = p.compute_cores;
        near[r] = hwloc_bitmap_dup(p.near);
        tr_topo_rank_free(&p);
    }
    cr_assert_eq(hwloc_bitmap_weight(used), tr_topo_pus(t), "%s, %d ranks: cores left idle", source,
                 world);
    for (int a = 0; a < world; a++)
        for (int b = 0; b < world; b++)
            if (hwloc_bitmap_isequal(near[a], near[b]))
                cr_assert_leq(abs(size[a] - size[b]), 1, "%s: ranks %d and %d are uneven", source, a, b);
    for (int r = 0; r < world; r++)
        hwloc_bitmap_free(near[r]);
    free(near);
    free(size);
    hwloc_bitmap_free(used);
    tr_topo_close(t);
}

Test(placement, cpu_ranks_take_contiguous_numa_aware_blocks)
{
    const char *machines[] = {"synthetic:package:2 numa:1 core:8 pu:2",
                              "synthetic:package:2 numa:2 core:6 pu:2",
                              "synthetic:package:4 numa:1 l3:2 core:4 pu:1",
                              "synthetic:numa:1 core:2 pu:1"};
    int worlds[] = {1, 2, 3, 4, 5, 8};
    for (size_t m = 0; m < sizeof machines / sizeof *machines; m++)
        for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
            struct tr_topo *t = open_topology(machines[m]);
            int cores = tr_topo_cores(t);
            tr_topo_close(t);
            if (worlds[w] <= cores)
                check_cpu_plan(machines[m], worlds[w]);
        }
}

Test(placement, cpu_ranks_by_hand)
{
    /* 2 sockets x 8 cores x 2 threads; synthetic PUs are numbered in order */
    struct tr_topo *t = open_topology("synthetic:package:2 numa:1 core:8 pu:2");
    struct tr_topo_rank p = place(t, TR_TOPO_CPU, 2, 1);
    assert_set(p.compute, "16-31", "compute", 1); /* the second socket whole */
    tr_topo_rank_free(&p);
    /* 3 ranks on 2 nodes: rank 0 keeps node 0, ranks 1 and 2 split node 1
     * (no rank straddles the sockets) */
    const char *three[] = {"0-15", "16-23", "24-31"};
    for (int r = 0; r < 3; r++) {
        p = place(t, TR_TOPO_CPU, 3, r);
        assert_set(p.compute, three[r], "compute", r);
        tr_topo_rank_free(&p);
    }
    p = place(t, TR_TOPO_CPU, 1, 0);
    assert_set(p.compute, "0-31", "compute", 0);
    cr_assert_eq(p.compute_cores, 16);
    tr_topo_rank_free(&p);
    tr_topo_close(t);

    /* 4 NUMA nodes, 2 ranks: each rank takes two whole nodes (a socket) */
    t = open_topology("synthetic:package:2 numa:2 core:6 pu:1");
    p = place(t, TR_TOPO_CPU, 2, 1);
    assert_set(p.compute, "12-23", "compute", 1);
    assert_set(p.near, "12-23", "near", 1);
    tr_topo_rank_free(&p);
    tr_topo_close(t);
}

Test(placement, more_ranks_than_cores_share_and_say_so)
{
    struct tr_topo *t = open_topology("synthetic:numa:1 core:2 pu:1");
    struct tr_topo_rank p = place(t, TR_TOPO_CPU, 3, 2);
    cr_assert(p.shared);
    cr_assert_eq(p.compute_cores, 1);
    assert_set(p.compute, "0", "compute", 2); /* wraps around to the first core */
    tr_topo_rank_free(&p);
    tr_topo_close(t);
}

/* ---- binding ------------------------------------------------------------- */

Test(placement, binding_follows_the_rank)
{
    /* another machine: nothing is bound, but the rank's cores are counted */
    struct tr_topo *t = open_topology("synthetic:package:2 numa:1 core:8 pu:2");
    struct tr_topo_rank p = place(t, TR_TOPO_CPU, 4, 1);
    cr_assert_eq(tr_topo_use(t, &p), 0, "a synthetic topology is not bound");
    cr_assert_eq(tr_topo_bind_compute(t, 0), 4, "rank 1 of 4 has 4 of the 16 cores");
    cr_assert_eq(tr_topo_bind_compute(t, 2), 2);
    tr_topo_rank_free(&p);
    tr_topo_close(t);

    /* this machine: the last rank of one per core runs on the last core */
    t = open_topology(NULL);
    int cores = tr_topo_cores(t);
    p = place(t, TR_TOPO_CPU, cores, cores - 1);
    cr_assert_eq(p.compute_cores, 1);
    cr_assert_eq(tr_topo_use(t, &p), 1, "binding to this machine's own core failed");
    cr_assert_eq(tr_topo_bind_compute(t, 0), 1);
    cpu_set_t mask;
    CPU_ZERO(&mask);
    cr_assert_eq(sched_getaffinity(0, sizeof mask, &mask), 0);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &mask))
            cr_assert(hwloc_bitmap_isset(p.compute, (unsigned)cpu), "bound to PU %d, outside the rank",
                      cpu);
    tr_topo_rank_free(&p);
    tr_topo_close(t);
}

/* ---- trainrun topo --------------------------------------------------------- */

static char *run_topo(int argc, char **argv, int *code)
{
    return capture_stdout(tr_topo_main, argc, argv, code);
}

Test(placement, topo_command_prints_each_rank)
{
    char *gpus[] = {"topo", "--topology", SERVER, "gpus=8"};
    int code;
    char *out = run_topo(4, gpus, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);
    const char *want[] = {
        "topology: 2 package(s), 2 NUMA node(s), 32 core(s), 64 PU(s), 8 NVIDIA GPU(s)\n",
        "8 GPU rank(s) on this node; local rank r drives GPU r in PCI bus order",
        "  rank 0  GPU 0 0000:19:00.0  NUMA 0  compute 2 core(s) PUs 0-1,32-33  "
        "loader 2 core(s) PUs 2-3,34-35\n",
        "  rank 7  GPU 7 0000:dc:00.0  NUMA 1  compute 2 core(s) PUs 28-29,60-61  "
        "loader 2 core(s) PUs 30-31,62-63\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(out, want[i]), "missing \"%s\" in:\n%s", want[i], out);
    free(out);

    char *procs[] = {"topo", "--topology", "synthetic:package:2 numa:1 core:8 pu:2", "procs=2"};
    out = run_topo(4, procs, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);
    cr_assert(strstr(out, "  rank 1  NUMA 1  compute 8 core(s) PUs 16-31  loader 8 core(s) PUs 16-31\n"),
              "%s", out);
    free(out);

    /* 6 ranks on 4 NUMA nodes of 6 cores: no rank straddles two nodes, so
     * two nodes keep a rank each and two split theirs, and topo says so */
    char *uneven[] = {"topo", "--topology", "synthetic:package:2 numa:2 core:6 pu:1", "procs=6"};
    out = run_topo(4, uneven, &code);
    cr_assert_eq(code, TR_EXIT_OK, "%s", out);
    cr_assert(strstr(out, "  rank 0  NUMA 0  compute 6 core(s) PUs 0-5"), "%s", out);
    cr_assert(strstr(out, "  rank 2  NUMA 1  compute 3 core(s) PUs 9-11"), "%s", out);
    cr_assert(strstr(out, "note: ranks have 3 to 6 cores, and the slowest sets the pace: a rank "
                          "count that is a multiple of the NUMA nodes (4) evens them out"), "%s", out);
    free(out);

    char *too_many[] = {"topo", "--topology", SERVER, "gpus=16"};
    out = run_topo(4, too_many, &code);
    cr_assert_eq(code, TR_EXIT_ERROR);
    free(out);
    char *both[] = {"topo", "procs=2", "gpus=2"};
    out = run_topo(3, both, &code);
    cr_assert_eq(code, TR_EXIT_USAGE);
    free(out);
    char *zero[] = {"topo", "procs=0"};
    out = run_topo(2, zero, &code);
    cr_assert_eq(code, TR_EXIT_USAGE);
    free(out);
    char *unknown[] = {"topo", "--frobnicate"};
    out = run_topo(2, unknown, &code);
    cr_assert_eq(code, TR_EXIT_USAGE);
    free(out);

    /* without ranks: the thread placement, as before */
    char *plain[] = {"topo", "--topology", "synthetic:package:2 numa:1 core:8 pu:2", "--threads", "4"};
    out = run_topo(5, plain, &code);
    cr_assert_eq(code, TR_EXIT_OK);
    cr_assert(strstr(out, "compute thread 3 -> core L#3"), "%s", out);
    free(out);
}

#include "hardware.h"

#include "../util/suggest.h"
#include "../util/util.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define GIB (1024ull * 1024 * 1024)

/*
 * Peaks are NVIDIA datasheet figures for dense math (the "with sparsity"
 * numbers are twice these).  Memory is the marketed size read as GiB; the
 * driver and context take a few percent of it, which the plan's 10% margin
 * covers.
 *
 * Prices are typical list prices per device-hour as of 2025-2026, rounded:
 * on-demand at specialised GPU clouds (the hyperscalers charge more), spot
 * or preemptible where offered.  They move often and vary by region and
 * contract: recipes should set their own with cost.price and
 * cost.spot_price.
 *
 * NVLink and PCIe are per GPU, both directions together (NVLink 4: 18
 * links x 50 GB/s = 900 GB/s on H100/H200; NVLink 3: 600 GB/s on A100;
 * PCIe 5.0 x16 128 GB/s, 4.0 x16 64 GB/s, 3.0 x16 32 GB/s).  The network is
 * the NIC line rate per GPU on the instance usually rented with 8 of them:
 * one 400 Gb/s NIC per GPU on HGX H100/H200 (AWS p5/p5e: 3200 Gb/s EFA);
 * DGX A100's 200 Gb/s HDR per GPU for a100-80gb; AWS p4d's 400 Gb/s
 * for 8 A100-40GB (50 per GPU); 100 Gb/s for 8 L4 or A10G (g6/g5:
 * 12.5 per GPU).
 *
 * Only devices a run can use are listed: the cuda backend is built for
 * compute capability 8.0 and newer (Ampere, Ada, Hopper), every one of
 * which has bf16 and fp16 tensor cores at the same peak, so the bf16
 * column prices either.  An older GPU (T4, V100) opens no backend, and a
 * plan for it would price a run that cannot execute: it is not in the
 * table, and asking for one says why (TR_HARDWARE_ONLY).
 *
 * The last column is the dense tf32 tensor-core peak (half the datasheets'
 * "with sparsity" figure): H100/H200 SXM 494.7, A100 156, L4 60, A10 62.5.
 * A run or plan with allow_tf32 on device=cuda is priced at it.
 */
static struct tr_hardware table[] = {
    {"h100-80gb", "NVIDIA H100 SXM, 80 GB HBM3", 80 * GIB,
     67.0, 989.4, 900, 128, 3.00, 2.00, 400, 8, 494.7},
    {"h200-141gb", "NVIDIA H200 SXM, 141 GB HBM3e", 141 * GIB,
     67.0, 989.4, 900, 128, 3.80, 2.50, 400, 8, 494.7},
    {"a100-80gb", "NVIDIA A100 SXM, 80 GB HBM2e", 80 * GIB,
     19.5, 312.0, 600, 64, 1.80, 1.10, 200, 8, 156.0},
    {"a100-40gb", "NVIDIA A100 SXM, 40 GB HBM2", 40 * GIB,
     19.5, 312.0, 600, 64, 1.30, 0.80, 50, 8, 156.0},
    {"l4-24gb", "NVIDIA L4, 24 GB GDDR6", 24 * GIB,
     30.3, 121.0, 0, 64, 0.80, 0.30, 12.5, 8, 60.0},
    /* AWS g5's A10G: the A10's GA102 with the A10 datasheet's peaks */
    {"a10g-24gb", "NVIDIA A10G, 24 GB GDDR6", 24 * GIB,
     31.2, 125.0, 0, 64, 1.00, 0.40, 12.5, 8, 62.5},
    /* this machine: memory filled in at first use, peak from cost.peak_tflops */
    {"cpu", "this machine's CPU and memory", 0,
     0, 0, 0, 0, 0, 0, 0, 0, 0},
};

static void describe_this_machine(struct tr_hardware *hw)
{
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0)
        hw->memory_bytes = (uint64_t)pages * (uint64_t)page_size;
}

size_t tr_hardware_count(void) { return TR_ARRAY_LEN(table); }

const struct tr_hardware *tr_hardware_at(size_t i)
{
    if (i >= TR_ARRAY_LEN(table))
        return NULL;
    struct tr_hardware *hw = &table[i];
    if (strcmp(hw->name, "cpu") == 0 && hw->memory_bytes == 0)
        describe_this_machine(hw);
    return hw;
}

const struct tr_hardware *tr_hardware_find(const char *name)
{
    for (size_t i = 0; name && i < tr_hardware_count(); i++)
        if (strcasecmp(table[i].name, name) == 0)
            return tr_hardware_at(i);
    return NULL;
}

int tr_hardware_lookup(const char *name, const struct tr_hardware **out, tr_err *err)
{
    *out = tr_hardware_find(name);
    if (*out)
        return TR_OK;
    const char *names[TR_ARRAY_LEN(table)];
    char known[512] = "";
    for (size_t i = 0; i < tr_hardware_count(); i++) {
        names[i] = table[i].name;
        size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", table[i].name);
    }
    const char *hint = tr_suggest(name, names, tr_hardware_count());
    if (hint)
        return tr_fail(err, "unknown hardware '%s' (did you mean '%s'?); known: %s (%s)", name,
                       hint, known, TR_HARDWARE_ONLY);
    /* "a100" is far from "a100-80gb" by edits but plainly meant one of the
     * entries it starts */
    char starts[256] = "";
    size_t n_starts = 0, name_len = strlen(name);
    for (size_t i = 0; name_len > 0 && i < tr_hardware_count(); i++)
        if (strncasecmp(table[i].name, name, name_len) == 0) {
            size_t len = strlen(starts);
            snprintf(starts + len, sizeof starts - len, "%s'%s'", n_starts++ ? " or " : "",
                     table[i].name);
        }
    if (n_starts)
        return tr_fail(err, "unknown hardware '%s' (did you mean %s?); known: %s (%s)", name,
                       starts, known, TR_HARDWARE_ONLY);
    return tr_fail(err, "unknown hardware '%s'; known: %s (%s)", name, known, TR_HARDWARE_ONLY);
}

/* ---- links ----------------------------------------------------------------- */

/*
 * Per-step latencies of a ring all-reduce are NCCL's own model of them
 * (src/graph/tuning.cc, hwLat for Ring with the Simple protocol, which
 * large gradient buckets use): 3.4 us over NVLink, 5.7 us over PCIe, 14 us
 * over the network.  Bandwidths are datasheet peaks; NCCL's measured bus
 * bandwidth is typically 70-90% of them, so these estimates are a floor.
 */
#define NVLINK_LATENCY 3.4e-6
#define PCIE_LATENCY 5.7e-6
#define NETWORK_LATENCY 14e-6

struct tr_link tr_hardware_ring_link(const struct tr_hardware *hw, int64_t devices)
{
    struct tr_link none = {TR_LINK_NONE, "none", 0, 0};
    if (!hw)
        return none;
    if (hw->devices_per_node > 0 && devices > hw->devices_per_node) {
        if (hw->network_gbits <= 0)
            return none;
        return (struct tr_link){TR_LINK_NETWORK, "network", hw->network_gbits / 8 * 1e9,
                                NETWORK_LATENCY};
    }
    /* both directions together in the table; a ring sends one way per link */
    if (hw->nvlink_gbps > 0)
        return (struct tr_link){TR_LINK_NVLINK, "NVLink", hw->nvlink_gbps / 2 * 1e9, NVLINK_LATENCY};
    if (hw->pcie_gbps > 0)
        return (struct tr_link){TR_LINK_PCIE, "PCIe", hw->pcie_gbps / 2 * 1e9, PCIE_LATENCY};
    return none;
}

double tr_ring_allreduce_seconds(double bytes, int64_t devices, const struct tr_link *link)
{
    if (devices <= 1 || link->bytes_per_second <= 0)
        return 0;
    double n = (double)devices;
    return 2 * (n - 1) / n * bytes / link->bytes_per_second + 2 * (n - 1) * link->latency_seconds;
}

/* ---- the recipe's cost section ------------------------------------------ */

#define COST_OPT(type, name, def, lo, hi, help, field)                                             \
    {type, name, def, lo, hi, NULL, help, offsetof(struct tr_cost_config, field)}

const struct tr_option tr_cost_options[] = {
    COST_OPT(TR_OPT_STRING, "hardware", "", 0, 0,
             "device the projections are for, e.g. h100-80gb, a100-40gb, l4-24gb, cpu "
             "(trainrun plan lists them; empty: none)", hardware),
    COST_OPT(TR_OPT_INT, "count", "1", 1, 1048576, "devices (data parallel)", count),
    COST_OPT(TR_OPT_BOOL, "spot", "false", 0, 0,
             "plan for spot/preemptible prices (resume with --resume auto after preemption)", spot),
    COST_OPT(TR_OPT_FLOAT, "price", "-1", -1, 1e6,
             "USD per device-hour on-demand (-1: the hardware table's typical price)", price),
    COST_OPT(TR_OPT_FLOAT, "spot_price", "-1", -1, 1e6,
             "USD per device-hour spot (-1: the hardware table's typical price)", spot_price),
    COST_OPT(TR_OPT_FLOAT, "mfu", "0.4", 0.01, 1,
             "assumed model FLOPs utilisation (achieved / peak) for time projections", mfu),
    COST_OPT(TR_OPT_FLOAT, "budget", "0", 0, 1e15, "USD for the run (0: no budget)", budget),
    COST_OPT(TR_OPT_FLOAT, "warn_at", "0.8", 0, 1, "warn when spending reaches this fraction of "
             "the budget", warn_at),
    COST_OPT(TR_OPT_FLOAT, "peak_tflops", "0", 0, 1e9,
             "peak dense TFLOP/s per device at the compute precision (0: the hardware table's; "
             "set it for cpu)", peak_tflops),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

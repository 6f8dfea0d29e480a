#include "hardware.h"

#include "suggest.h"
#include "util.h"

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
 */
static struct tr_hardware table[] = {
    {"h100-80gb", "NVIDIA H100 SXM, 80 GB HBM3", 80 * GIB,
     67.0, 494.7, 989.4, 900, 128, 3.00, 2.00},
    {"h200-141gb", "NVIDIA H200 SXM, 141 GB HBM3e", 141 * GIB,
     67.0, 494.7, 989.4, 900, 128, 3.80, 2.50},
    {"a100-80gb", "NVIDIA A100 SXM, 80 GB HBM2e", 80 * GIB,
     19.5, 156.0, 312.0, 600, 64, 1.80, 1.10},
    {"a100-40gb", "NVIDIA A100 SXM, 40 GB HBM2", 40 * GIB,
     19.5, 156.0, 312.0, 600, 64, 1.30, 0.80},
    {"l4-24gb", "NVIDIA L4, 24 GB GDDR6", 24 * GIB,
     30.3, 60.0, 121.0, 0, 64, 0.80, 0.30},
    /* AWS g5's A10G: the A10's GA102 with the A10 datasheet's peaks */
    {"a10g-24gb", "NVIDIA A10G, 24 GB GDDR6", 24 * GIB,
     31.2, 62.5, 125.0, 0, 64, 1.00, 0.40},
    /* Turing has no tf32 or bf16: fp32 runs on CUDA cores, and the
     * bf16/fp16 column is fp16 tensor-core math */
    {"t4-16gb", "NVIDIA T4, 16 GB GDDR6", 16 * GIB,
     8.1, 8.1, 65.0, 0, 32, 0.50, 0.20},
    /* this machine: memory filled in at first use, peak from cost.peak_tflops */
    {"cpu", "this machine's CPU and memory", 0,
     0, 0, 0, 0, 0, 0, 0},
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
        return tr_fail(err, "unknown hardware '%s' (did you mean '%s'?); known: %s", name, hint,
                       known);
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
        return tr_fail(err, "unknown hardware '%s' (did you mean %s?); known: %s", name, starts,
                       known);
    return tr_fail(err, "unknown hardware '%s'; known: %s", name, known);
}

/* ---- the recipe's cost section ------------------------------------------ */

#define COST_OPT(type, name, def, lo, hi, help, field)                                             \
    {type, name, def, lo, hi, NULL, help, offsetof(struct tr_cost_config, field)}

const struct tr_option tr_cost_options[] = {
    COST_OPT(TR_OPT_STRING, "hardware", "", 0, 0,
             "device the projections are for, e.g. h100-80gb, a100-40gb, l4-24gb, cpu "
             "(trainrun plan lists them; empty: none)", hardware),
    COST_OPT(TR_OPT_INT, "count", "1", 1, TR_NO_MAX, "devices (data parallel)", count),
    COST_OPT(TR_OPT_BOOL, "spot", "false", 0, 0,
             "plan for spot/preemptible prices (resume with --resume auto after preemption)", spot),
    COST_OPT(TR_OPT_FLOAT, "price", "-1", -1, TR_NO_MAX,
             "USD per device-hour on-demand (-1: the hardware table's typical price)", price),
    COST_OPT(TR_OPT_FLOAT, "spot_price", "-1", -1, TR_NO_MAX,
             "USD per device-hour spot (-1: the hardware table's typical price)", spot_price),
    COST_OPT(TR_OPT_FLOAT, "mfu", "0.4", 0.01, 1,
             "assumed model FLOPs utilisation (achieved / peak) for time projections", mfu),
    COST_OPT(TR_OPT_FLOAT, "budget", "0", 0, TR_NO_MAX, "USD for the run (0: no budget)", budget),
    COST_OPT(TR_OPT_FLOAT, "warn_at", "0.8", 0, 1, "warn when spending reaches this fraction of "
             "the budget", warn_at),
    COST_OPT(TR_OPT_FLOAT, "peak_tflops", "0", 0, TR_NO_MAX,
             "peak dense TFLOP/s per device at the compute precision (0: the hardware table's; "
             "set it for cpu)", peak_tflops),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

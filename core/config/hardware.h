/*
 * Accelerators and what they cost: a shipped table of common devices
 * (memory, peak dense FLOP/s by precision, interconnect, typical cloud
 * prices) and the recipe's `cost` section, which picks one and overrides
 * its prices with the user's own.  `trainrun plan` projects a recipe's
 * memory, time and dollars from them.
 */
#ifndef TR_HARDWARE_H
#define TR_HARDWARE_H

#include <stddef.h>
#include <stdint.h>
#include <trainrun/plugin.h>

struct tr_hardware {
    const char *name;        /* "h100-80gb" */
    const char *description; /* "NVIDIA H100 SXM 80 GB" */
    uint64_t memory_bytes;   /* device memory */
    /* Peak dense TFLOP/s (no structured sparsity).  fp32: CUDA cores;
     * bf16 (bf16/fp16, the same peak on every listed device): tensor
     * cores.  0: not known.  The tf32 tensor-core peak is tflops_tf32,
     * at the end. */
    double tflops_fp32, tflops_bf16;
    /* GB/s per device, both directions together, as datasheets quote
     * them; nvlink 0: none. */
    double nvlink_gbps, pcie_gbps;
    /* USD per device-hour; typical list prices, see hardware.c. */
    double price_hour, spot_price_hour;
    /* Between nodes: NIC line rate per device in Gbit/s, each way (as NICs
     * are quoted), and devices per node of the usual instance; 0: unknown. */
    double network_gbits;
    int devices_per_node;
    /* Peak dense TFLOP/s of tf32 tensor-core GEMMs: what fp32 GEMMs run at
     * on the cuda backend under allow_tf32 (cuBLASLt's fast-TF32 compute).
     * 0: not known, or no tf32 (the cpu). */
    double tflops_tf32;
};

/* What bounds a ring all-reduce: the slowest link on the ring. */
enum tr_link_kind { TR_LINK_NONE, TR_LINK_NVLINK, TR_LINK_PCIE, TR_LINK_NETWORK };
struct tr_link {
    enum tr_link_kind kind;
    const char *name;        /* "NVLink", "PCIe", "network"; "none" */
    double bytes_per_second; /* per device, each way */
    double latency_seconds;  /* per ring step */
};

/* The link a ring over `devices` of `hw` is bound by: NVLink (PCIe where
 * there is none) while the ring fits in one node, the network once it
 * spans nodes.  kind TR_LINK_NONE when the table does not know. */
struct tr_link tr_hardware_ring_link(const struct tr_hardware *hw, int64_t devices);

/* Ring all-reduce of `bytes` over `devices`: 2(n-1) steps, each moving
 * bytes/n and paying the link's latency,
 *   2(n-1)/n * bytes / bandwidth + 2(n-1) * latency.
 * 0 for one device. */
double tr_ring_allreduce_seconds(double bytes, int64_t devices, const struct tr_link *link);

/* Why a GPU is missing from the table, as unknown-hardware errors say it:
 * the table holds only devices a run can use (see hardware.c). */
#define TR_HARDWARE_ONLY                                                                           \
    "only devices trainrun runs on are listed: its cuda backend needs compute capability 8.0 "    \
    "or newer, so a T4 or V100 runs nothing and is not priced"

/* The entry named `name` (case-insensitive), or NULL.  "cpu" describes
 * this machine: its physical memory, no known peak, price 0. */
const struct tr_hardware *tr_hardware_find(const char *name);

/* The same, with an error that suggests the closest names when unknown. */
int tr_hardware_lookup(const char *name, const struct tr_hardware **out, tr_err *err);

/* Iteration: entries 0 .. tr_hardware_count() - 1, in table order. */
size_t tr_hardware_count(void);
const struct tr_hardware *tr_hardware_at(size_t i);

/* The recipe's `cost` section. */
struct tr_cost_config {
    const char *hardware; /* "" = none */
    int64_t count;        /* devices */
    int spot;             /* plan for spot/preemptible prices */
    double price;         /* USD per device-hour on-demand; < 0: the table's */
    double spot_price;    /* USD per device-hour spot; < 0: the table's */
    double mfu;           /* assumed model FLOPs utilisation for projections */
    double budget;        /* USD; 0 = none */
    double warn_at;       /* fraction of the budget that warns */
    double peak_tflops;   /* peak dense TFLOP/s per device; 0: the table's (set it for cpu) */
};

extern const struct tr_option tr_cost_options[];

#endif

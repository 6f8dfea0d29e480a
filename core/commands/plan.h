/*
 * `trainrun plan RECIPE [key=value ...]`: what a recipe will need and cost
 * before it runs — parameters, FLOPs, memory per device and the largest
 * micro-batch that fits, the compute-optimal token count, time and dollars
 * on the recipe's `cost.hardware`, and learning rates for larger batches.
 * The graph is measured, never allocated, so a plan for a GPU-sized model
 * runs on a laptop.
 */
#ifndef TR_PLAN_H
#define TR_PLAN_H

#include "../engine/graph.h"
#include "../config/hardware.h"
#include "../config/run_config.h" /* enum tr_pipe_kind */

#include <stdio.h>

/* Chinchilla (Hoffmann et al. 2022): compute-optimal training uses about
 * 20 tokens per parameter. */
#define TOKENS_PER_PARAM 20.0
/* Fewer devices are suggested when they cost at most this much more than
 * the cheapest count: among those, the fastest. */
#define CHEAP_ENOUGH 1.05

/* Every number the report prints, for callers and tests. */
struct tr_plan {
    char *recipe, *name, *precision;
    /* model */
    int64_t params, embedding_params;
    int64_t layers;          /* attention nodes (L) */
    int64_t seq_len, width;  /* T and C (the query's heads x D) of the first attention node */
    int64_t lookup_params;   /* read only by embedding lookups (untied input embeddings) */
    /* adapters (lora): parameters frozen (of params), and of those multiplied */
    int64_t frozen_params, frozen_multiplied;
    double frozen_bytes, quantized_bytes; /* their storage */
    int64_t lora_rank;
    double attention_flops;  /* 12 * sum over attention nodes of T * C */
    double flops_per_token;  /* 6 * (params - lookup_params) + attention_flops */
    int64_t convs;           /* conv2d nodes: > 0, an image model counted per sample */
    double conv_flops, dense_flops; /* 6 x the convs' and linears' multiply-adds per sample */
    int64_t tokens_per_sample; /* T for sequence models, else 1 (a sample) */
    int sequence_model;
    /* the recipe's run */
    int64_t batch, micro_batch, steps;
    int length_from;         /* tr_train_config's: steps, tokens, epochs or time alone */
    double length_value;     /* train.tokens or train.epochs as given */
    double time_limit;       /* train.time in seconds; 0: none */
    double tokens_per_step, flops_per_step, tokens, flops;
    double lr;
    /* memory per device at the micro-batch */
    struct tr_memory_report memory;
    double memory_total;
    double bytes_per_sample, fixed_bytes; /* memory ≈ fixed + micro-batch × per sample */
    double forward_bytes;   /* eval's and sample's plan at the micro-batch: forward only */
    /* parallel.offload = "optimizer": the optimizer state moved off the
     * device, and the host memory it and the fp32 master copy take (0, 0
     * without offload) */
    double offloaded_bytes, host_bytes;
    double host_grad_bytes; /* of host_bytes: the gradients of an overlapped offload */
    int host_stage;         /* host_bytes are the largest pipeline stage's */
    /* compute-optimal (Chinchilla) */
    double optimal_tokens, optimal_flops, optimal_steps, trained_factor;
    /* hardware, when cost.hardware is set */
    struct tr_cost_config cost;       /* strings not owned: hardware is the table's name */
    const struct tr_hardware *hardware;
    enum tr_dtype compute, grad;      /* the policy's, checked (core/config/precision.h) */
    int tf32;                         /* the policy's allow_tf32 (fp32 GEMMs in tf32) */
    const char *peak_kind;            /* the GEMMs that run: "bf16", "fp16", "fp32" */
    double peak_flops;                /* per device, FLOP/s; 0: unknown */
    /* the device the plan must fit (engine/fit.h: train.memory_budget, else
     * cost.hardware's memory, else 80 GiB for an unnamed accelerator, else
     * this machine's), less its margin */
    char device[128];
    double device_bytes, usable_bytes;
    int fits;
    /* the largest micro-batch that divides the samples per device per step
     * and fits, measured (what micro_batch = "auto" picks); 0: not even one */
    int64_t max_micro_batch;
    int64_t search_samples;           /* the samples a device's micro-batches share a step,
                                       * which the largest micro-batch divides (under stages,
                                       * a replica's) */
    double price, spot_price;         /* USD per device-hour in effect */
    double hours, dollars, spot_dollars;                         /* the recipe's steps */
    double optimal_hours, optimal_dollars, optimal_spot_dollars; /* compute-optimal tokens */
    /* data parallel: the gradient all-reduce and how much of it backward hides */
    double gradient_bytes, bucket_bytes;
    int shard_level;                  /* parallel.shard's (enum tr_shard_level) */
    int cpu_ranks;                    /* the devices planned for are CPU ranks */
    /* memory per device at each level (none, optimizer, gradients,
     * parameters) on cost.count devices, and the smallest that fits (-1: none) */
    double level_total[4]; /* by enum tr_shard_level */
    int64_t level_devices[4]; /* the fewest devices each level fits on; 0: none up to 4096 */
    int level_fits_first;
    double allreduce_seconds;         /* all buckets of one step, back to back; count > 1 */
    struct tr_plan_scale {
        int64_t devices, nodes;
        struct tr_link link;          /* what bounds the ring */
        int64_t buckets;
        double bucket_seconds;        /* one bucket's ring all-reduce */
        double allreduce_seconds;     /* buckets × bucket_seconds */
        double compute_seconds;       /* a step's FLOPs on one device at peak × MFU */
        double exposed_seconds;       /* the all-reduce that backward does not hide */
        double step_seconds, efficiency; /* compute + exposed; compute / step */
        double hours, dollars;        /* the recipe's steps, at the planned price */
        int even;                     /* the batch splits evenly over the devices */
    } scale[12];                      /* count, count/2, ... 1 */
    int n_scale;
    int suggested;                    /* index in scale[] of the device count to use */
    /* pipeline stages (parallel.pipeline > 1; core/engine/pipeline.h) */
    struct tr_plan_pipe {
        int stages, virtual_stages, replicas, micro_batches;
        enum tr_pipe_kind kind;
        int devices_assumed;          /* cost.count was below the stages: P devices assumed */
        int state_parted;             /* shard = "optimizer"/"gradients": a stage's state
                                       * (and gradients) over its replicas */
        double bubble_theory, bubble_simulated;
        int largest;                  /* the stage holding the most bytes: what one
                                       * device must hold, and the plan's fit */
        struct tr_plan_stage {
            int first_block, last_block, has_embedding, has_head, chunks;
            int block_from[64], block_to[64]; /* each chunk's blocks (-1: none) */
            double flops_share, params, bytes, in_flight;
        } stage[64];
    } pipe;
};

/* One device count's step: compute at peak × MFU, the ring all-reduce of the
 * gradients in buckets, overlapped with backward (2/3 of the compute, the
 * buckets ready one by one as it proceeds):
 *   exposed = max(bucket, buckets × bucket - backward × (buckets - 1) / buckets)
 * Fills everything but hours and dollars. */
void tr_plan_scale_step(struct tr_plan_scale *s, const struct tr_hardware *hw, int64_t devices,
                        double flops_per_step, double peak_flops, double mfu, double gradient_bytes,
                        double bucket_bytes);

/* Load the recipe with overrides and work out the plan (nothing allocated
 * on a device, no data opened). */
int tr_plan_build(struct tr_plan *plan, const char *recipe, const char *const *overrides,
                  int n_overrides, tr_err *err);
void tr_plan_print(const struct tr_plan *plan, FILE *out);
void tr_plan_free(struct tr_plan *plan);

/* argv[0] = "plan", argv[1] = the recipe, then key=value overrides;
 * gpus=N stands for cost.count=N.  Returns the exit code. */
int tr_plan_main(int argc, char **argv);

#endif

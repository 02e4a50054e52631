/* comm_hook.h: how a data-parallel wrapper reduces gradients (PyTorch's communication hooks).
 * Replicate (replicate.h, DDP's register_comm_hook) reduces each gradient bucket and FSDP
 * (wrap.h, FSDP1's register_comm_hook) each unit's flat gradient through one hook: the default
 * average in f32, PyTorch's bf16_compress_hook and fp16_compress_hook (the gradient travels in
 * half the bytes), or a function of the caller's.
 *
 * The built-in hooks, on a rank's f32 gradient g over a group of W ranks: g is divided by the
 * wrapper's pre factor in f32 (replicate: W; FSDP: the pre factor of fsdp_fully_shard's divide
 * factors), rounded once to the hook's dtype (bf16 or f16, round to nearest even), reduced
 * (sum) in that dtype by one collective (the collectives widen to f32, add in rank order
 * 0..W-1 and round the sum once), widened back into the f32 gradient exactly, and divided by
 * the post factor in f32 (FSDP only). PyTorch's hooks cast first and divide in the low dtype;
 * for a power-of-two W the results are the same, otherwise libfsdp's round once less. Each
 * element of the result then lies within
 *     u |avg| + (2u + u^2) (1/W) sum_r |g_r|   (+ (W + 1) 2^-25 for f16 subnormals)
 * of the f32 average avg, with u the unit roundoff of the dtype: 2^-8 for bf16, 2^-11 for f16
 * (one rounding of each rank's term, one of the sum). f16 holds magnitudes up to 65504: a
 * larger term or sum becomes inf, as with PyTorch's fp16 hook (bf16 has f32's range). */
#ifndef FSDP_COMM_HOOK_H
#define FSDP_COMM_HOOK_H

#include "fsdp/comm.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's MixedPrecision for the data-parallel wrappers: FSDP1's (wrap.h, docs/fsdp.md
 * "Mixed precision") and DDP's (replicate.h). Each field is FSDP_DTYPE_F32 (the default, 0),
 * FSDP_DTYPE_BF16 or FSDP_DTYPE_F16. The parameters the optimizer steps (FSDP's flat shards,
 * replicate's parameters), their gradients and the optimizer state stay f32 (the master copy). */
typedef struct fsdp_mixed_precision {
    /* The dtype forward and backward compute with. FSDP: every gather (before forward and
     * backward) rounds this rank's f32 shard once to param_dtype and all_gathers in
     * param_dtype (half the bytes for bf16/f16); the gathered values, widened exactly to f32
     * for the CPU kernels, are the parameters forward and backward use;
     * fsdp_summon_full_params still gathers the f32 values. With param_dtype bf16 and Adam or
     * AdamW over fsdp_sharded_flat_params, the step writes that rounding in the same pass and
     * the gathers send it while the shard is untouched since (the same bits; docs/fsdp.md).
     * Replicate: the root's forward and backward run with every trainable parameter rounded
     * once to param_dtype (widened exactly to f32), and the f32 values are back when each
     * returns. */
    fsdp_dtype param_dtype;
    /* Gradients are reduced in this dtype: the f32 gradient divided by the pre factor, rounded
     * to reduce_dtype, reduce_scatter (all_reduce) in reduce_dtype, widened back, divided by
     * the post factor (the cast-reduce-cast of the bf16/fp16 comm hooks below). Unlike
     * PyTorch, where None follows param_dtype, the default is f32: set both for that. Not
     * together with a comm hook other than the default (both choose the reduction). */
    fsdp_dtype reduce_dtype;
} fsdp_mixed_precision;

typedef enum fsdp_comm_hook_kind {
    FSDP_COMM_HOOK_DEFAULT = 0, /* average in f32 (or FSDP's reduce_dtype): DDP's allreduce */
    FSDP_COMM_HOOK_BF16,        /* bf16_compress_hook: reduce in bf16 */
    FSDP_COMM_HOOK_FP16,        /* fp16_compress_hook: reduce in f16 */
    FSDP_COMM_HOOK_USER,        /* the caller's fn */
    FSDP_COMM_HOOK_KIND_COUNT
} fsdp_comm_hook_kind;

const char *fsdp_comm_hook_kind_to_string(fsdp_comm_hook_kind kind); /* "default", "bf16", ... */

/* What a hook reduces: one bucket of replicate, or one FSDP unit's flat gradient. */
typedef struct fsdp_comm_bucket {
    /* 1-D f32 CPU: this rank's gradients, not yet averaged (no factor applied). The hook may
     * overwrite it. */
    fsdp_tensor *grad;
    /* NULL: an all_reduce (replicate; FSDP's NO_SHARD, or a group of one rank): the hook leaves
     * the average over the group in grad. Otherwise (FSDP's FULL_SHARD and SHARD_GRAD_OP) 1-D
     * f32 of numel(grad) / W elements: the hook writes this rank's chunk of the average (group
     * rank r: elements [r * n, (r + 1) * n) of the averaged grad), as a reduce_scatter does. */
    fsdp_tensor *output;
    fsdp_group *group; /* the data-parallel group to reduce over */
    /* replicate: the bucket, in the order they are reduced (fsdp_replicate_bucket_numel);
     * FSDP: the unit (fsdp_sharded_unit_path). */
    int index;
} fsdp_comm_bucket;

/* A user hook. It runs on every rank of the group for every bucket, in the same order, and must
 * leave the average over the group where fsdp_comm_bucket says (the wrapper then uses it as it
 * would the default's result: replicate copies it back into the parameters' gradients, FSDP
 * adds it to the shard's gradient). It may call collectives on bucket->group (all ranks the
 * same ones), fsdp_comm_hook_run, and keep state in user; it must not run the model or change
 * the wrapper. A status other than FSDP_OK fails the backward with the hook's message. */
typedef fsdp_status (*fsdp_comm_hook_fn)(fsdp_ctx *ctx, const fsdp_comm_bucket *bucket, void *user);

typedef struct fsdp_comm_hook {
    fsdp_comm_hook_kind kind; /* default FSDP_COMM_HOOK_DEFAULT */
    fsdp_comm_hook_fn fn;     /* FSDP_COMM_HOOK_USER only: required there, NULL otherwise */
    void *user;               /* handed to fn; the caller keeps it alive while the model lives */
} fsdp_comm_hook;

/* Runs a built-in hook (DEFAULT in f32, BF16, FP16) on a bucket, as the wrappers do but with
 * the plain average (divide by W before the reduction, nothing after): for a user hook that adds
 * work around a built-in one. Low-precision buffers are allocated for the call. A group of one
 * rank makes no collective (BF16 and FP16 still round). */
fsdp_status fsdp_comm_hook_run(fsdp_ctx *ctx, fsdp_comm_hook_kind kind,
                               const fsdp_comm_bucket *bucket);

#ifdef __cplusplus
}
#endif
#endif

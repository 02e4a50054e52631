/* replicate.h: replicated data parallelism (PyTorch's DistributedDataParallel, or the
 * composable `replicate`): every rank of a data-parallel group holds the whole model (or its
 * tensor-parallel shards), trains on its own slice of the global batch, and in each backward
 * the gradients are averaged over the group with one all_reduce per bucket (started during
 * backward as soon as the bucket's gradients are final), so the replicas stay bitwise equal. Also
 * the batch split by global sample index that every data-parallel mode uses.
 *
 * Ownership, the rule of wrap.h: a wrapper's state is held by the model it wraps and lives as
 * long as something holds it. Here only the model holds it (the handle fsdp_replicate_apply
 * hands back is borrowed, valid until fsdp_module_free(root), and there is nothing to free);
 * so no order of frees can leave it dangling. The group must outlive the module. Tensors
 * returned through `fsdp_tensor **out` belong to the caller.
 *
 * A group that holds ranks of different coordinates along a tensor-parallel mesh dim where a
 * parameter is Shard or Partial is refused with the fix named, before anything changes (the
 * default world group on a TP model too: pass the mesh's dp group). */
#ifndef FSDP_REPLICATE_H
#define FSDP_REPLICATE_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h"
#include "fsdp/comm_hook.h"
#include "fsdp/module.h"
#include "fsdp/tp.h" // defines: FSDP_NO_SRC_RANK

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_replicate fsdp_replicate;

#define FSDP_REPLICATE_DEFAULT_BUCKET_BYTES (25 * 1024 * 1024) /* DDP's bucket_cap_mb = 25 */
#define FSDP_REPLICATE_FIRST_BUCKET_BYTES   (1024 * 1024) /* DDP's _DEFAULT_FIRST_BUCKET_BYTES */

typedef struct fsdp_replicate_options {
    /* The data-parallel group (e.g. a mesh's "dp" group); NULL: the world group, refused
     * when a parameter is distributed by TP across the world's ranks. */
    fsdp_group *group;
    /* Gradients are reduced in buckets of at least this many bytes, as DDP forms them once it
     * has seen a backward (its rebuilt buckets): the trainable parameters in the order their
     * gradients become ready, which for libfsdp's backward (modules in reverse) is reverse
     * registration order; a bucket closes once it holds its limit or more (so one parameter
     * larger than that is a bucket of its own). The limit of the first bucket is
     * FSDP_REPLICATE_FIRST_BUCKET_BYTES (1 MiB) with the default cap, bucket_bytes when one is
     * given; every later bucket's is bucket_bytes. Default 0:
     * FSDP_REPLICATE_DEFAULT_BUCKET_BYTES. (DDP's very first iteration uses one bucket for
     * all; libfsdp uses the rebuilt layout from the first step, which changes no value.) */
    int64_t bucket_bytes;
    /* The group rank whose parameters and buffers every rank takes at setup (DDP's initial
     * sync): one broadcast per bucket of parameters (all, trainable or not) and buffers, in
     * registration order. Default 0; FSDP_NO_SRC_RANK keeps every rank's own values and
     * makes no collective (when all ranks initialised from the same seed already). */
    int src_rank;
    /* How each bucket is reduced (DDP's register_comm_hook; comm_hook.h): default, the
     * average in f32; FSDP_COMM_HOOK_BF16 / _FP16, PyTorch's bf16/fp16_compress_hook (the
     * bucket travels in half the bytes); FSDP_COMM_HOOK_USER, .fn gets each bucket's f32
     * gradients undivided (output NULL, index the bucket) and leaves their average there. */
    fsdp_comm_hook comm_hook;
    /* DDP's mixed_precision (comm_hook.h): param_dtype, the parameters forward and backward
     * compute with (rounded in place around the root's forward and backward, from an f32
     * master copy of the trainable parameters kept here); reduce_dtype, the dtype the buckets
     * are all_reduced in (half the bytes for bf16/f16; started like the f32 all_reduce
     * below). Default: f32 throughout. */
    fsdp_mixed_precision mixed_precision;
    /* When the buckets are reduced. false (the default, DDP's way): each bucket's all_reduce
     * starts during backward, from the post-backward hook of the module that finalises its
     * last gradient (the module that owns a parameter, or an ancestor below root that has a
     * post-backward hook of another wrapper, such as TP's SequenceParallel), in bucket order
     * (a bucket waits for the ones before it); the root's post-backward hook starts those left
     * (the root's own parameters, those of modules that did not run) and waits for all. On the
     * MPI backend the built-in hooks' all_reduces (f32, or bf16/f16 for the bf16 and fp16
     * hooks and a low reduce_dtype) are non-blocking (fsdp_all_reduce_start), so their data
     * moves while the rest of backward runs; on the local backend, and with a user hook, each
     * bucket is reduced whole when it starts. With a built-in hook every bucket has its own
     * part of the flat buffer (as many elements as all trainable gradients; in 16 bits, a
     * second such buffer). A module whose backward runs twice in one backward of the model is an
     * error here. true: every bucket is reduced after backward, one at a time, through one buffer
     * as large as the largest bucket. Both give the same bits and the same collectives. */
    bool reduce_after_backward;
} fsdp_replicate_options;

/* Makes root a replica over the group: broadcasts its parameters and buffers from src_rank
 * (parameters distributed by tensor parallelism broadcast their local shards: apply TP first,
 * then replicate over the other mesh dim), lays out the buckets and allocates the one flat
 * buffer, and installs backward hooks on root (and, unless reduce_after_backward, on the
 * modules whose backward finalises gradients). In every backward of root with sync on, each
 * trainable parameter's gradient is averaged over the group: per bucket, the gradients are
 * copied into the flat buffer times 1/W (as DDP divides them), one all_reduce(sum) in the
 * deterministic rank order (in bf16 or f16 with those comm hooks; a user hook gets the bucket
 * undivided and reduces it), and copied back once it completes (with the default f32 hook
 * during backward the gradients are views of their place in the buffer from setup on, so they
 * are divided in place and nothing is copied); buckets go in the order they
 * were formed (the one holding the last parameters first), as DDP reduces them, during or
 * after backward (reduce_after_backward). When backward returns, the gradients are averaged.
 * A step allocates nothing. Every rank of the group calls it with the same model structure; opts
 * may be NULL for all defaults. *out (may be NULL) is borrowed: it belongs to root. A group of one
 * rank makes no collective. Gradients accumulate across backwards as usual; clear them
 * (fsdp_optimizer_zero_grad) between steps. Buffers are synchronised at setup only (DDP also
 * re-broadcasts them before every forward; no layer of libfsdp changes a buffer in forward).
 * Replicate runs on CPU tensors only in this version: a model with a parameter, gradient or
 * buffer on a device is refused (FSDP_ERR_DEVICE, nothing changed). */
fsdp_status fsdp_replicate_apply(fsdp_ctx *ctx, fsdp_module *root,
                                 const fsdp_replicate_options *opts, fsdp_replicate **out);

/* no_sync: with sync false, backward accumulates gradients locally without communicating;
 * the first backward after sync is set true again averages everything accumulated. Default
 * true. */
void fsdp_replicate_set_sync(fsdp_replicate *r, bool sync);
bool fsdp_replicate_sync(const fsdp_replicate *r);

/* The buckets of the gradient reduction, in the order they were formed and are reduced
 * (reverse parameter registration order: bucket 0 holds the last parameters): their number,
 * how many parameters and elements bucket i holds. */
int fsdp_replicate_num_buckets(const fsdp_replicate *r);
int fsdp_replicate_bucket_num_params(const fsdp_replicate *r, int i);
int64_t fsdp_replicate_bucket_numel(const fsdp_replicate *r, int i);
fsdp_group *fsdp_replicate_group(const fsdp_replicate *r);

/* ---- the batch split ---- */

/* This rank's samples of a global batch of n samples: the torch.chunk split over the
 * group's ranks (fsdp_chunk_range(n, W, group rank)), [*offset, *offset + *length), possibly
 * empty. group NULL: ctx's world group (a context bound to no world is one rank). So a
 * rank's samples follow from their global indices alone: generate or load exactly those. */
void fsdp_batch_range(const fsdp_ctx *ctx, const fsdp_group *group, int64_t n, int64_t *offset,
                      int64_t *length);

/* Copies this rank's slice of a global batch along batch_dim (PyTorch's input_batch_dim;
 * negative counts from the end): the samples fsdp_batch_range gives for that dim's length.
 * global is a tensor of any dtype on the CPU or a device; the slice is made there (on a device
 * by copies queued on the calling thread's current stream). When *out is NULL a new tensor is
 * made on global's device (the caller owns it); otherwise *out, of global's dtype and device,
 * is resized and refilled, so a training loop allocates nothing once shapes are steady. */
fsdp_status fsdp_batch_slice(fsdp_ctx *ctx, const fsdp_tensor *global, int batch_dim,
                             const fsdp_group *group, fsdp_tensor **out);

#ifdef __cplusplus
}
#endif
#endif

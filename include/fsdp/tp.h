/* tp.h: DTensor-style distributed tensors and tensor parallelism: placements (Shard,
 * Replicate, Partial) per mesh dimension, redistribution with its backward, the TP styles
 * (ColwiseParallel, RowwiseParallel, PrepareModuleInput, PrepareModuleOutput,
 * SequenceParallel) and `parallelize` with glob-matched plans.
 *
 * A DTensor is a local tensor plus a spec: the mesh, one placement per mesh dim and the global
 * shape. Uneven sharding follows torch.chunk (fsdp_chunk_range); when several mesh dims shard
 * the same tensor dim, the first mesh dim splits it first and the next splits that chunk.
 * Partial means Partial(sum): the value is the sum over the mesh dim of the local tensors.
 *
 * The local tensor of a DTensor is an ordinary fsdp_tensor that remembers its DTensor
 * (fsdp_dtensor_of): that is how a DTensor passes through modules, whose forward takes plain
 * tensors (a style with use_local_output = FSDP_TP_NO hands the next module such a tensor, and
 * the next style reads its placements from it).
 *
 * Ownership: the caller owns every fsdp_dtensor returned here (fsdp_dtensor_free) and every
 * tensor returned through an `fsdp_tensor **out`. fsdp_dtensor_local is borrowed. Meshes are
 * borrowed by DTensors and styles: a mesh must outlive them. */
#ifndef FSDP_TP_H
#define FSDP_TP_H

#include <stdbool.h>

#include "fsdp/comm.h"
#include "fsdp/llama.h"
#include "fsdp/module.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- placements ---- */

typedef enum fsdp_placement_kind {
    FSDP_PLACEMENT_DEFAULT = 0, /* unset: in option structs, the style's documented default */
    FSDP_PLACEMENT_REPLICATE,
    FSDP_PLACEMENT_SHARD,   /* split along .dim in torch.chunk pieces */
    FSDP_PLACEMENT_PARTIAL, /* each rank holds an addend of the value (sum) */
} fsdp_placement_kind;

typedef struct fsdp_placement {
    fsdp_placement_kind kind;
    int dim; /* Shard: the tensor dim, negative counts from the end */
} fsdp_placement;

#define FSDP_REPLICATE ((fsdp_placement){.kind = FSDP_PLACEMENT_REPLICATE})
#define FSDP_SHARD(d)  ((fsdp_placement){.kind = FSDP_PLACEMENT_SHARD, .dim = (d)})
#define FSDP_PARTIAL   ((fsdp_placement){.kind = FSDP_PLACEMENT_PARTIAL})

/* "Replicate()", "Shard(0)", "Partial(sum)", "default"; buf needs 24 bytes. */
const char *fsdp_placement_to_string(fsdp_placement p, char *buf, size_t size);
bool fsdp_placement_equal(fsdp_placement a, fsdp_placement b); /* Shard dims taken literally */

/* Where this rank's local block lies in the global tensor: offset and length per tensor dim,
 * for `shape` (ndim dims) under one placement per mesh dim. Returns FSDP_ERR_INVALID_ARGUMENT
 * for a Shard dim outside the tensor. */
fsdp_status fsdp_placement_local_block(fsdp_ctx *ctx, const fsdp_mesh *mesh,
                                       const fsdp_placement *placements, int ndim,
                                       const int64_t *shape, int64_t *offset, int64_t *length);

/* ---- DTensor ---- */

typedef struct fsdp_dtensor fsdp_dtensor;

/* The spec of a DTensor: mesh (borrowed), placements (mesh ndim entries, Shard dims
 * normalised to 0..ndim-1) and global shape. */
typedef struct fsdp_dtensor_spec {
    const fsdp_mesh *mesh;
    int mesh_ndim;
    fsdp_placement placements[FSDP_MESH_MAX_DIMS];
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
} fsdp_dtensor_spec;

/* DTensor.from_local: wraps this rank's local tensor (the DTensor shares its storage; no
 * communication). global_shape (ndim entries of local's ndim) may be NULL: then every Shard
 * is taken as even, global = local * mesh size, as PyTorch assumes; pass it for uneven
 * shards. With global_shape, the local shape must be this rank's block; a mismatch is an
 * error naming both. DTensors hold CPU tensors only in this version: a local tensor on a
 * device is refused (FSDP_ERR_DEVICE), as are redistributing and distributing one. */
fsdp_status fsdp_dtensor_from_local(fsdp_ctx *ctx, const fsdp_tensor *local, const fsdp_mesh *mesh,
                                    const fsdp_placement *placements, const int64_t *global_shape,
                                    fsdp_dtensor **out);

#define FSDP_NO_SRC_RANK (-1)

/* distribute_tensor: makes a DTensor of `global` (the whole tensor, same shape on every rank)
 * with the given placements. src_rank is the mesh-global rank whose values count, broadcast
 * over the whole mesh (one broadcast per mesh dim); FSDP_NO_SRC_RANK takes every rank's own
 * `global` as it is (no communication: use when all ranks hold the same values already).
 * Shard takes this rank's chunk; Partial keeps the value on coordinate 0 and zeros elsewhere,
 * so the sum is exact. */
fsdp_status fsdp_distribute_tensor(fsdp_ctx *ctx, const fsdp_tensor *global, const fsdp_mesh *mesh,
                                   const fsdp_placement *placements, int src_rank,
                                   fsdp_dtensor **out);

void fsdp_dtensor_free(fsdp_dtensor *dt); /* NULL does nothing */

/* The local tensor (borrowed; fsdp_dtensor_of(local) == dt) and the spec. */
fsdp_tensor *fsdp_dtensor_local(const fsdp_dtensor *dt);
const fsdp_dtensor_spec *fsdp_dtensor_spec_of(const fsdp_dtensor *dt);
/* The DTensor whose local tensor t is, or NULL for a plain tensor. */
fsdp_dtensor *fsdp_dtensor_of(const fsdp_tensor *t);

/* redistribute: a new DTensor with the same global value under `placements`, with the
 * collectives of the table in docs/tp.md (all_gather, all_reduce, reduce_scatter,
 * all_to_all, or none), one mesh dim at a time; mesh dims of size 1 never communicate. */
fsdp_status fsdp_dtensor_redistribute(fsdp_ctx *ctx, const fsdp_dtensor *dt,
                                      const fsdp_placement *placements, fsdp_dtensor **out);
/* The backward of a redistribution from placements `from` (to whatever placements grad has):
 * moves grad back to `from` with Partial read as Replicate, as autograd does. */
fsdp_status fsdp_dtensor_redistribute_backward(fsdp_ctx *ctx, const fsdp_dtensor *grad,
                                               const fsdp_placement *from, fsdp_dtensor **out);
/* full_tensor: the global value as a plain tensor, the same on every rank. */
fsdp_status fsdp_dtensor_full_tensor(fsdp_ctx *ctx, const fsdp_dtensor *dt, fsdp_tensor **out);

/* ---- tensor-parallel styles ---- */

typedef enum fsdp_tp_style_kind {
    FSDP_TP_COLWISE = 1,
    FSDP_TP_ROWWISE,
    FSDP_TP_PREPARE_INPUT,
    FSDP_TP_PREPARE_OUTPUT,
    FSDP_TP_SEQUENCE_PARALLEL,
} fsdp_tp_style_kind;

/* A boolean option whose zero value means "the style's default". */
typedef enum fsdp_tp_flag { FSDP_TP_DEFAULT = 0, FSDP_TP_YES, FSDP_TP_NO } fsdp_tp_flag;

/* One style. Fields a style does not use must stay FSDP_PLACEMENT_DEFAULT. Defaults:
 *   ColwiseParallel   input Replicate, output Shard(-1), use_local_output yes. Linear: weight
 *                     and bias Shard(0).
 *   RowwiseParallel   input Shard(-1), output Replicate, use_local_output yes. Linear: weight
 *                     Shard(1), bias Replicate (added once to the Partial sum). Embedding
 *                     (PyTorch's rule): the table Shard(0) over the vocabulary, the token ids
 *                     moved to Replicate, zero rows for tokens of other ranks (Partial).
 *   PrepareModuleInput   input_layouts -> desired_input_layouts (both required),
 *                     use_local_output no.
 *   PrepareModuleOutput  output_layouts -> desired_output_layouts (both required),
 *                     use_local_output yes.
 *   SequenceParallel  input_layouts Shard(1) (the sequence dim; Shard(0) shards the batch),
 *                     parameters Replicate, output stays sharded the same way,
 *                     use_local_output no. Parameter gradients (Partial) are all_reduced in
 *                     backward. For modules that act on each row alone (RMSNorm, dropout).
 * A DTensor input (fsdp_dtensor_of) is taken with its own placements instead of input_layouts.
 * Build them with the macros below: FSDP_COLWISE(.output_layouts = FSDP_REPLICATE). */
typedef struct fsdp_tp_style {
    fsdp_tp_style_kind kind;
    fsdp_placement input_layouts;
    fsdp_placement output_layouts;
    fsdp_placement desired_input_layouts;
    fsdp_placement desired_output_layouts;
    fsdp_tp_flag use_local_output;
} fsdp_tp_style;

#define FSDP_COLWISE(...)        ((fsdp_tp_style){.kind = FSDP_TP_COLWISE, __VA_ARGS__})
#define FSDP_ROWWISE(...)        ((fsdp_tp_style){.kind = FSDP_TP_ROWWISE, __VA_ARGS__})
#define FSDP_PREPARE_INPUT(...)  ((fsdp_tp_style){.kind = FSDP_TP_PREPARE_INPUT, __VA_ARGS__})
#define FSDP_PREPARE_OUTPUT(...) ((fsdp_tp_style){.kind = FSDP_TP_PREPARE_OUTPUT, __VA_ARGS__})
#define FSDP_SEQUENCE_PARALLEL(...)                                                                \
    ((fsdp_tp_style){.kind = FSDP_TP_SEQUENCE_PARALLEL, __VA_ARGS__})

const char *fsdp_tp_style_kind_to_string(fsdp_tp_style_kind kind); /* "ColwiseParallel", ... */

typedef struct fsdp_tp_options {
    /* Where parameter values come from when they are distributed: the rank (of the mesh)
     * whose values are broadcast, as PyTorch's src_data_rank; FSDP_NO_SRC_RANK keeps every
     * rank's own values and makes no collective. Default 0. */
    int src_rank;
} fsdp_tp_options;

/* Applies one style to module m over a 1-d mesh (e.g. mesh["tp"]): distributes m's
 * parameters as the style says and installs its hooks. Colwise needs a Linear, Rowwise a
 * Linear or an Embedding. opts may be NULL. Every rank of the mesh calls it (the parameters are
 * broadcast). m's subtree must be on the CPU: a parameter, gradient or buffer on a device is
 * refused (FSDP_ERR_DEVICE, nothing applied), as by fsdp_tp_parallelize for the whole root. */
fsdp_status fsdp_tp_apply(fsdp_ctx *ctx, fsdp_module *m, const fsdp_mesh *mesh,
                          const fsdp_tp_style *style, const fsdp_tp_options *opts);

/* One entry of a plan: a dotted module path whose segments are shell globs ("layers.*.net[1]",
 * "net?", "net[1-2]") matched against child names at each depth (POSIX fnmatch). */
typedef struct fsdp_tp_plan_entry {
    const char *key;
    fsdp_tp_style style;
} fsdp_tp_plan_entry;

/* parallelize_module: applies each entry's style to every module its key matches, in plan
 * order. A key that matches nothing fails with FSDP_ERR_INVALID_ARGUMENT naming the key, the
 * segment that found nothing and the children that exist there; a module matched by two
 * entries is an error too. On failure nothing has been applied (keys are all matched first). */
fsdp_status fsdp_tp_parallelize(fsdp_ctx *ctx, fsdp_module *root, const fsdp_mesh *mesh, int n,
                                const fsdp_tp_plan_entry *plan, const fsdp_tp_options *opts);

/* ---- the Llama plan and loss parallel ---- */

#define FSDP_LLAMA_TP_PLAN_LEN 14

/* torchtitan's plan for fsdp_model_llama (docs/models.md), in Hugging Face's names, into plan
 * (FSDP_LLAMA_TP_PLAN_LEN entries; *n receives the count; the keys are static strings):
 *   model.embed_tokens        RowwiseParallel(input Replicate, output Shard(1))
 *   model.norm, model.layers.*.input_layernorm, .post_attention_layernorm   SequenceParallel
 *   model.layers.*.self_attn, .mlp   PrepareModuleInput(Shard(1) -> Replicate)
 *   q_proj, k_proj, v_proj, gate_proj, up_proj   ColwiseParallel
 *   o_proj, down_proj         RowwiseParallel(output Shard(1))
 *   lm_head                   ColwiseParallel(input Shard(1)); with loss_parallel its output
 *                             stays Shard(-1) as a DTensor (use_local_output false) for
 *                             fsdp_loss_parallel_cross_entropy, else it is Replicate.
 * Refused with FSDP_ERR_INVALID_ARGUMENT naming both counts unless n_heads and n_kv_heads are
 * divisible by tp_size (and ffn_hidden too). The vocabulary may split unevenly. Pass the plan to
 * fsdp_tp_parallelize with the model and mesh["tp"], before fsdp_fully_shard. */
fsdp_status fsdp_llama_tp_plan(fsdp_ctx *ctx, const fsdp_llama_config *cfg, int tp_size,
                               bool loss_parallel, fsdp_tp_plan_entry *plan, int *n);

/* loss_parallel: cross-entropy (mean over the rows whose target is not ignore_index, as
 * fsdp_loss_cross_entropy_ignore) of logits that are the local tensor of a DTensor sharded
 * along the vocabulary (Shard(-1) on a 1-d tp mesh), without gathering them: each row's max is
 * all_reduced (MAX) over tp, then its sum of exponentials together with the target's logit,
 * which the rank holding that class contributes (one SUM of 2 x rows floats). targets (rows
 * = all dims of logits but the last) are global class ids, the same on every tp rank. dlogits
 * (may be NULL) receives this rank's shard of the gradient, shaped as the local logits, with
 * no communication. Plain logits (no DTensor) go to fsdp_loss_cross_entropy_ignore. Every rank
 * of the tp mesh calls it. CPU, f32. */
fsdp_status fsdp_loss_parallel_cross_entropy(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                             const int32_t *targets, int32_t ignore_index,
                                             float *loss, fsdp_tensor *dlogits);

/* ---- parameters ---- */

/* The spec of a parameter that a style distributed, or NULL for a plain parameter. */
const fsdp_dtensor_spec *fsdp_param_dtensor_spec(const fsdp_param *p);
/* The whole (global) value of a parameter, or of its gradient when grad is true, gathered as
 * its placements say (a copy for a plain parameter); the same on every rank. */
fsdp_status fsdp_param_full_tensor(fsdp_ctx *ctx, const fsdp_param *p, bool grad,
                                   fsdp_tensor **out);

#ifdef __cplusplus
}
#endif
#endif

/* tp_impl.h: the body of fsdp_dtensor and the redistribution engine the DTensor API, the TP
 * styles and parameter distribution share. Internal to src/tp. */
#ifndef FSDP_TP_IMPL_H
#define FSDP_TP_IMPL_H

#include "core/tensor_impl.h"
#include "fsdp/tp.h"

struct fsdp_dtensor {
    fsdp_tensor *local; /* owned handle; local->dist == this */
    fsdp_dtensor_spec spec;
};

/* Reusable buffers of one redistribution site (a style hook, a parameter), so a step
 * allocates nothing once shapes are steady. */
typedef struct tp_work {
    fsdp_tensor *buf[2];
} tp_work;

void tp_work_release(tp_work *w);

/* Fills spec from a mesh, mesh-ndim placements and a global shape, checking that every
 * placement is set and every Shard dim is inside the tensor (normalised to 0..ndim-1).
 * `what` names the caller in messages. */
fsdp_status tp_spec_init(fsdp_ctx *ctx, fsdp_dtensor_spec *spec, const fsdp_mesh *mesh,
                         const fsdp_placement *placements, int ndim, const int64_t *shape,
                         const char *what);
/* The local block of spec on this rank: offset and length per tensor dim. */
void tp_spec_block(const fsdp_dtensor_spec *spec, int64_t *offset, int64_t *length);

/* Makes *t a tensor of dtype/shape on device, reusing its storage when it is large enough;
 * otherwise a new tensor, not zeroed, replaces *t (the old handle is freed; storage others
 * still view stays alive through its reference count). The caller writes it whole. */
fsdp_status tp_buffer(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_dtype dtype, fsdp_device device,
                      int ndim, const int64_t *shape);

/* Redistributes the local tensor `in` of spec `from` to placements `to` (mesh-ndim entries,
 * Shard dims may be negative). *result is `in` itself when nothing has to move, else *out
 * (made or reused with tp_buffer); intermediate steps use w's buffers. Mesh dims are handled
 * one collective at a time as docs/tp.md says. */
fsdp_status tp_redistribute(fsdp_ctx *ctx, const fsdp_dtensor_spec *from, const fsdp_tensor *in,
                            const fsdp_placement *to, tp_work *w, fsdp_tensor **out,
                            const fsdp_tensor **result);

/* The placements a gradient goes back to: `from` with Partial read as Replicate. */
void tp_backward_placements(const fsdp_dtensor_spec *from, fsdp_placement *to);

/* Creates a DTensor handle over t's storage (a view of all of t) with spec. */
fsdp_status tp_dtensor_wrap(fsdp_ctx *ctx, const fsdp_tensor *t, const fsdp_dtensor_spec *spec,
                            fsdp_dtensor **out);

/* Checks that style is well formed and fits module m (Colwise needs a Linear, Rowwise a
 * Linear or an Embedding, a module takes one style), without changing anything. */
fsdp_status tp_style_check(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tp_style *style);

/* fsdp_tp_apply; with even_output, a Rowwise output that leaves sharded as a local tensor must
 * split evenly over the tp ranks (the sequence a plan with SequenceParallel shards), or the
 * forward fails there, before it communicates, naming the length, the tp size and the fix. */
fsdp_status tp_style_apply(fsdp_ctx *ctx, fsdp_module *m, const fsdp_mesh *mesh,
                           const fsdp_tp_style *style, const fsdp_tp_options *opts,
                           bool even_output);

#endif

/* style.c: the tensor-parallel styles as module hooks. Every step a style (applied by
 * style_apply.c) redistributes the input before forward and the output after it, and in
 * backward moves the gradients back the same way (Partial read as Replicate), so the module's
 * own forward and backward run on plain local tensors; the readers of a PrepareModuleInput'd
 * block leave their Partial input gradients for the block to reduce once (block_sum.c). */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "nn/nn.h"
#include "tp/style_impl.h"

static void site_release(site *s) {
    tp_work_release(&s->work);
    fsdp_tensor_free(s->buf);
    fsdp_dtensor_free(s->handle);
}

void tp_style_state_free(void *p) {
    style_state *s = p;
    if (!s) return;
    site_release(&s->in_fwd);
    site_release(&s->out_fwd);
    site_release(&s->out_bwd);
    site_release(&s->in_bwd);
    for (int i = 0; i < s->n_params; i++) fsdp_tensor_free(s->scratch[i]);
    free(s->params);
    free(s->scratch);
    free(s->real);
    free(s);
}

const char *fsdp_tp_style_kind_to_string(fsdp_tp_style_kind kind) {
    switch (kind) {
    case FSDP_TP_COLWISE:
        return "ColwiseParallel";
    case FSDP_TP_ROWWISE:
        return "RowwiseParallel";
    case FSDP_TP_PREPARE_INPUT:
        return "PrepareModuleInput";
    case FSDP_TP_PREPARE_OUTPUT:
        return "PrepareModuleOutput";
    case FSDP_TP_SEQUENCE_PARALLEL:
        return "SequenceParallel";
    default:
        return "unknown style";
    }
}

/* ---- moving tensors ---- */

/* The spec of a tensor arriving at a hook: its own when it is a DTensor, else `placement` on
 * the style's mesh with a global shape that takes every Shard as even (PyTorch's from_local). */
static fsdp_status arriving_spec(fsdp_ctx *ctx, const style_state *s, const fsdp_tensor *t,
                                 fsdp_placement placement, fsdp_dtensor_spec *spec) {
    fsdp_dtensor *dt = fsdp_dtensor_of(t);
    if (dt) {
        if (dt->spec.mesh != s->mesh)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: a DTensor on another mesh arrived; redistribute it on this "
                             "style's mesh first",
                             fsdp_tp_style_kind_to_string(s->style.kind));
        *spec = dt->spec;
        return FSDP_OK;
    }
    FSDP_TRY_AT(ctx, tp_spec_init(ctx, spec, s->mesh, &placement, t->ndim, t->shape,
                                  fsdp_tp_style_kind_to_string(s->style.kind)));
    if (spec->placements[0].kind == FSDP_PLACEMENT_SHARD)
        spec->shape[spec->placements[0].dim] *= fsdp_mesh_size(s->mesh, 0);
    return FSDP_OK;
}

/* Moves t (spec `from`) to placement `to` through site st; *io becomes the local result, or a
 * DTensor handle on it when as_dtensor. *to_spec (may be NULL) receives the new spec. */
static fsdp_status site_move(fsdp_ctx *ctx, site *st, const fsdp_dtensor_spec *from,
                             const fsdp_tensor *t, fsdp_placement to, bool as_dtensor,
                             const fsdp_tensor **io, fsdp_dtensor_spec *to_spec) {
    const fsdp_tensor *result;
    FSDP_TRY_AT(ctx, tp_redistribute(ctx, from, t, &to, &st->work, &st->buf, &result));
    fsdp_dtensor_spec spec;
    FSDP_TRY_AT(ctx,
                tp_spec_init(ctx, &spec, from->mesh, &to, from->ndim, from->shape, "redistribute"));
    if (to_spec) *to_spec = spec;
    if (!as_dtensor) {
        *io = result;
        return FSDP_OK;
    }
    if (!st->handle) {
        FSDP_TRY_AT(ctx, tp_dtensor_wrap(ctx, result, &spec, &st->handle));
    } else {
        fsdp_tensor_alias(st->handle->local, result);
        st->handle->spec = spec;
    }
    *io = st->handle->local;
    return FSDP_OK;
}

static fsdp_placement op_input_placement(const style_state *s, const fsdp_dtensor_spec *in) {
    switch (s->style.kind) {
    case FSDP_TP_COLWISE:
        return FSDP_REPLICATE;
    case FSDP_TP_ROWWISE: /* an Embedding looks up every token: its ids are replicated */
        return s->embedding ? FSDP_REPLICATE : FSDP_SHARD(-1);
    case FSDP_TP_PREPARE_INPUT:
        return s->style.desired_input_layouts;
    default:
        return in->placements[0]; /* SequenceParallel, PrepareModuleOutput: as it came */
    }
}

/* ---- the four hooks ---- */

/* An input on another device than the style's parameters is refused before it moves. */
static fsdp_status check_input_device(fsdp_ctx *ctx, const fsdp_module *m, const style_state *s,
                                      const fsdp_tensor *x) {
    const fsdp_param *p = s->weight ? s->weight : s->n_params ? s->params[0] : NULL;
    if (!p) return FSDP_OK; /* PrepareModuleInput/Output own no parameters */
    return fsdp_nn_check_device(ctx, m, fsdp_tp_style_kind_to_string(s->style.kind), p, x, "input");
}

fsdp_status tp_style_pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user) {
    (void)point;
    style_state *s = user;
    const fsdp_tensor *x = *io;
    FSDP_TRY_AT(ctx, check_input_device(ctx, m, s, x));
    s->in_was_dtensor = fsdp_dtensor_of(x) != NULL;
    FSDP_TRY_AT(ctx, arriving_spec(ctx, s, x, s->style.input_layouts, &s->in_spec));
    if (s->style.kind == FSDP_TP_PREPARE_INPUT) tp_block_sum_reset(s);
    if (s->style.kind == FSDP_TP_COLWISE) tp_block_sum_take(s, m, x);
    bool as_dtensor =
        s->style.kind == FSDP_TP_PREPARE_INPUT
            ? s->style.use_local_output == FSDP_TP_NO
            : s->style.kind == FSDP_TP_SEQUENCE_PARALLEL || s->style.kind == FSDP_TP_PREPARE_OUTPUT;
    if (s->style.kind == FSDP_TP_PREPARE_OUTPUT) as_dtensor = s->in_was_dtensor;
    return site_move(ctx, &s->in_fwd, &s->in_spec, x, op_input_placement(s, &s->in_spec),
                     as_dtensor, io, NULL);
}

/* The spec of the output the module computed, before the style redistributes it. */
static fsdp_status op_output_spec(fsdp_ctx *ctx, const style_state *s, const fsdp_tensor *y,
                                  fsdp_dtensor_spec *spec) {
    char what[48];
    snprintf(what, sizeof what, "%s output", fsdp_tp_style_kind_to_string(s->style.kind));
    fsdp_placement p;
    switch (s->style.kind) {
    case FSDP_TP_COLWISE:
        p = FSDP_SHARD(-1);
        break;
    case FSDP_TP_ROWWISE:
        p = FSDP_PARTIAL;
        break;
    case FSDP_TP_SEQUENCE_PARALLEL:
        p = s->in_spec.placements[0];
        break;
    default:
        return arriving_spec(ctx, s, y, s->style.output_layouts, spec);
    }
    FSDP_TRY_AT(ctx, tp_spec_init(ctx, spec, s->mesh, &p, y->ndim, y->shape, what));
    if (p.kind == FSDP_PLACEMENT_SHARD) {
        int d = spec->placements[0].dim;
        /* Colwise: the Linear's global out_features; SequenceParallel: the input's dim. */
        spec->shape[d] = s->style.kind == FSDP_TP_COLWISE
                             ? ((fsdp_dtensor_spec *)fsdp_nn_param_dist(s->weight))->shape[0]
                             : s->in_spec.shape[d];
    }
    return FSDP_OK;
}

/* A sequence that the tp size does not divide would leave uneven local shards, which the
 * SequenceParallel styles downstream read as even ones: refused before anything moves, alike on
 * every rank (the output's global shape is the same everywhere). */
static fsdp_status check_even_output(fsdp_ctx *ctx, const style_state *s, const fsdp_module *m,
                                     fsdp_placement to) {
    if (to.kind != FSDP_PLACEMENT_SHARD) return FSDP_OK;
    int ndim = s->op_out_spec.ndim;
    int d = to.dim < 0 ? to.dim + ndim : to.dim;
    int tp = fsdp_mesh_size(s->mesh, 0);
    if (d < 0 || d >= ndim || s->op_out_spec.shape[d] % tp == 0) return FSDP_OK;
    char where[200];
    long long len = (long long)s->op_out_spec.shape[d];
    return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                     "%s on %s: the sequence length %lld (dim %d of its output) is not divisible "
                     "by the tp size %d, and sequence parallelism (the plan's SequenceParallel "
                     "styles) splits the sequence evenly over the tp ranks; use a sequence "
                     "length that is a multiple of %d (for example %lld), or a tp size that "
                     "divides %lld",
                     fsdp_tp_style_kind_to_string(s->style.kind),
                     fsdp_nn_describe(m, where, sizeof where), len, d, tp, tp, (len / tp + 1) * tp,
                     len);
}

fsdp_status tp_style_post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                  const fsdp_tensor **io, void *user) {
    (void)point;
    style_state *s = user;
    const fsdp_tensor *y = *io;
    if (s->style.kind == FSDP_TP_PREPARE_INPUT) return FSDP_OK;
    FSDP_TRY_AT(ctx, op_output_spec(ctx, s, y, &s->op_out_spec));
    if (s->bias && fsdp_mesh_coordinate(s->mesh, 0) == 0) {
        /* Rowwise: the Replicate bias joins the Partial sum once, on coordinate 0. The output
         * is this module's own buffer (a Linear), so adding in place is safe. */
        int64_t oc = fsdp_tensor_dim(fsdp_param_data(s->bias), 0);
        fsdp_kernels_for(fsdp_tensor_device(y))
            ->bias_add(fsdp_tensor_f32(y), fsdp_tensor_f32(fsdp_param_data(s->bias)),
                       fsdp_tensor_numel(y) / oc, oc);
    }
    fsdp_placement to = s->style.kind == FSDP_TP_PREPARE_OUTPUT ? s->style.desired_output_layouts
                        : s->style.kind == FSDP_TP_SEQUENCE_PARALLEL ? s->op_out_spec.placements[0]
                                                                     : s->style.output_layouts;
    if (s->even_output) FSDP_TRY_AT(ctx, check_even_output(ctx, s, m, to));
    s->out_is_dtensor = s->style.use_local_output == FSDP_TP_NO;
    return site_move(ctx, &s->out_fwd, &s->op_out_spec, y, to, s->out_is_dtensor, io, &s->out_spec);
}

/* Swaps the SequenceParallel parameters' gradients with their zeroed scratch (pre-backward)
 * or, after backward, all_reduces the scratch when it is Partial and adds it to the real
 * gradients, restoring them. */
static fsdp_status sp_grads(fsdp_ctx *ctx, style_state *s, bool before) {
    fsdp_group *g = NULL;
    bool partial = s->in_spec.placements[0].kind == FSDP_PLACEMENT_SHARD;
    if (!before && partial) FSDP_TRY_AT(ctx, fsdp_mesh_get_group(ctx, s->mesh, NULL, &g));
    for (int i = 0; i < s->n_params; i++) {
        fsdp_param *p = s->params[i];
        if (before) {
            s->real[i] = fsdp_param_grad(p);
            FSDP_TRY_AT(ctx, fsdp_tensor_fill(ctx, s->scratch[i], 0.0f));
            fsdp_nn_param_swap_grad(p, s->scratch[i]);
            continue;
        }
        fsdp_nn_param_swap_grad(p, s->real[i]);
        if (partial) FSDP_TRY_AT(ctx, fsdp_all_reduce(ctx, g, s->scratch[i], FSDP_REDUCE_SUM));
        fsdp_tensor *grad = fsdp_param_grad(p);
        fsdp_kernels_for(fsdp_tensor_device(grad))
            ->axpy(fsdp_tensor_f32(grad), 1.0f, fsdp_tensor_f32(s->scratch[i]),
                   fsdp_tensor_numel(grad));
    }
    return FSDP_OK;
}

fsdp_status tp_style_pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                  const fsdp_tensor **io, void *user) {
    (void)point;
    style_state *s = user;
    if (s->style.kind == FSDP_TP_SEQUENCE_PARALLEL) FSDP_TRY_AT(ctx, sp_grads(ctx, s, true));
    if (s->style.kind == FSDP_TP_PREPARE_INPUT) {
        tp_block_sum_decide(s, m); /* before its readers' backward: one decision for all */
        return FSDP_OK;
    }
    if (s->style.kind == FSDP_TP_COLWISE) fsdp_nn_linear_set_dx_partial(m, tp_block_sum_partial(s));
    const fsdp_tensor *dy = *io;
    fsdp_dtensor_spec grad_spec;
    if (fsdp_dtensor_of(dy)) {
        grad_spec = fsdp_dtensor_of(dy)->spec;
    } else {
        grad_spec = s->out_spec; /* the gradient of a local output has the output's layout */
        for (int d = 0; d < dy->ndim && dy->ndim == grad_spec.ndim; d++)
            if (grad_spec.placements[0].kind != FSDP_PLACEMENT_SHARD ||
                grad_spec.placements[0].dim != d)
                grad_spec.shape[d] = dy->shape[d];
    }
    fsdp_placement to;
    tp_backward_placements(&s->op_out_spec, &to);
    bool as_dtensor =
        fsdp_dtensor_of(dy) && s->style.kind != FSDP_TP_COLWISE && s->style.kind != FSDP_TP_ROWWISE;
    FSDP_TRY_AT(ctx, site_move(ctx, &s->out_bwd, &grad_spec, dy, to, as_dtensor, io, NULL));
    if (s->bias && fsdp_param_requires_grad(s->bias)) { /* Rowwise: the gradient is Replicate now */
        int64_t oc = fsdp_tensor_dim(fsdp_param_grad(s->bias), 0);
        fsdp_kernels_for(fsdp_tensor_device(*io))
            ->bias_backward(fsdp_tensor_f32(fsdp_param_grad(s->bias)), fsdp_tensor_f32(*io),
                            fsdp_tensor_numel(*io) / oc, oc);
    }
    return FSDP_OK;
}

fsdp_status tp_style_post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   const fsdp_tensor **io, void *user) {
    (void)point;
    style_state *s = user;
    if (s->style.kind == FSDP_TP_SEQUENCE_PARALLEL) FSDP_TRY_AT(ctx, sp_grads(ctx, s, false));
    if (s->style.kind == FSDP_TP_COLWISE) fsdp_nn_linear_set_dx_partial(m, false); /* this call */
    /* One reduction per block (block_sum.c): a reader's Partial gradient stays local, for its
     * block to sum; the block's sum is Partial, reduced once below. */
    bool partial_sum = s->style.kind == FSDP_TP_PREPARE_INPUT && s->partial;
    s->partial = false; /* decided for this backward only */
    const fsdp_tensor *dx = *io;
    if (!dx || s->style.kind == FSDP_TP_PREPARE_OUTPUT) return FSDP_OK;
    if (s->style.kind == FSDP_TP_COLWISE && tp_block_sum_partial(s)) return FSDP_OK;
    /* The input gradient as the op made it: Colwise's is Partial (a sum over the sharded
     * output features), the others have the layout the op's input had. */
    fsdp_dtensor_spec grad_spec;
    if (fsdp_dtensor_of(dx) && !partial_sum) {
        grad_spec = fsdp_dtensor_of(dx)->spec;
    } else {
        fsdp_placement p = s->style.kind == FSDP_TP_COLWISE || partial_sum
                               ? FSDP_PARTIAL
                               : op_input_placement(s, &s->in_spec);
        FSDP_TRY_AT(ctx, tp_spec_init(ctx, &grad_spec, s->mesh, &p, s->in_spec.ndim,
                                      s->in_spec.shape, "input gradient"));
    }
    fsdp_placement to;
    tp_backward_placements(&s->in_spec, &to);
    return site_move(ctx, &s->in_bwd, &grad_spec, dx, to, s->in_was_dtensor, io, NULL);
}

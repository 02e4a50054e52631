/* style.c: the tensor-parallel styles as module hooks. Each style distributes the module's
 * parameters once and then, every step, redistributes the input before forward and the output
 * after it, and in backward moves the gradients back the same way (Partial read as
 * Replicate), so the module's own forward and backward run on plain local tensors. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "nn/nn.h"
#include "tp/tp_impl.h"

/* One place where a tensor is redistributed every step: its buffers, and the DTensor handle
 * it hands on when the tensor leaves as a DTensor. */
typedef struct site {
    tp_work work;
    fsdp_tensor *buf;
    fsdp_dtensor *handle;
} site;

typedef struct style_state {
    fsdp_tp_style style; /* defaults filled in */
    const fsdp_mesh *mesh;
    fsdp_param *weight, *bias; /* Colwise/Rowwise: the Linear's (or the Embedding's weight) */
    bool embedding;            /* Rowwise on an Embedding: vocabulary-sharded table */
    /* The output leaves sharded as a local tensor into a plan with SequenceParallel, whose
     * styles take local shards as even (PyTorch's from_local): the sharded dim (the sequence)
     * must divide by the tp size (tp_style_apply's even_output). */
    bool even_output;
    site in_fwd, out_fwd, out_bwd, in_bwd;
    /* Forward's record for backward: the input as it came (placements and global shape),
     * whether it came as a DTensor, and the output as the op made it and as it left. */
    fsdp_dtensor_spec in_spec, op_out_spec, out_spec;
    bool in_was_dtensor, out_is_dtensor;
    /* SequenceParallel: parameters whose gradients backward collects in scratch, then
     * all_reduces (they are Partial when the input is sharded) and adds to the real ones. */
    fsdp_param **params;
    fsdp_tensor **scratch, **real;
    int n_params;
} style_state;

static void site_release(site *s) {
    tp_work_release(&s->work);
    fsdp_tensor_free(s->buf);
    fsdp_dtensor_free(s->handle);
}

static void style_state_free(void *p) {
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
    fsdp_device a = fsdp_tensor_device(x), b = fsdp_tensor_device(fsdp_param_data(p));
    if (a.type == b.type && a.index == b.index) return FSDP_OK;
    char where[200];
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "%s on %s: the input is on %s:%d and the parameters on %s:%d; copy the input "
                     "to the model's device (fsdp_tensor_copy) first",
                     fsdp_tp_style_kind_to_string(s->style.kind),
                     fsdp_nn_describe(m, where, sizeof where), fsdp_device_to_string(a), a.index,
                     fsdp_device_to_string(b), b.index);
}

static fsdp_status pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                               const fsdp_tensor **io, void *user) {
    (void)point;
    style_state *s = user;
    const fsdp_tensor *x = *io;
    FSDP_TRY_AT(ctx, check_input_device(ctx, m, s, x));
    s->in_was_dtensor = fsdp_dtensor_of(x) != NULL;
    FSDP_TRY_AT(ctx, arriving_spec(ctx, s, x, s->style.input_layouts, &s->in_spec));
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

static fsdp_status post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
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

static fsdp_status pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)m;
    (void)point;
    style_state *s = user;
    if (s->style.kind == FSDP_TP_SEQUENCE_PARALLEL) FSDP_TRY_AT(ctx, sp_grads(ctx, s, true));
    if (s->style.kind == FSDP_TP_PREPARE_INPUT) return FSDP_OK;
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

static fsdp_status post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user) {
    (void)m;
    (void)point;
    style_state *s = user;
    if (s->style.kind == FSDP_TP_SEQUENCE_PARALLEL) FSDP_TRY_AT(ctx, sp_grads(ctx, s, false));
    const fsdp_tensor *dx = *io;
    if (!dx || s->style.kind == FSDP_TP_PREPARE_OUTPUT) return FSDP_OK;
    /* The input gradient as the op made it: Colwise's is Partial (a sum over the sharded
     * output features), the others have the layout the op's input had. */
    fsdp_dtensor_spec grad_spec;
    if (fsdp_dtensor_of(dx)) {
        grad_spec = fsdp_dtensor_of(dx)->spec;
    } else {
        fsdp_placement p =
            s->style.kind == FSDP_TP_COLWISE ? FSDP_PARTIAL : op_input_placement(s, &s->in_spec);
        FSDP_TRY_AT(ctx, tp_spec_init(ctx, &grad_spec, s->mesh, &p, s->in_spec.ndim,
                                      s->in_spec.shape, "input gradient"));
    }
    fsdp_placement to;
    tp_backward_placements(&s->in_spec, &to);
    return site_move(ctx, &s->in_bwd, &grad_spec, dx, to, s->in_was_dtensor, io, NULL);
}

/* ---- applying a style ---- */

/* Distributes parameter p over mesh with one placement: p's data becomes this rank's block
 * and its gradient a zeroed tensor of that shape; the spec goes into the parameter
 * (fsdp_nn_param_dist). */
static fsdp_status distribute_param(fsdp_ctx *ctx, fsdp_param *p, const fsdp_mesh *mesh,
                                    fsdp_placement placement, int src_rank) {
    if (fsdp_nn_param_dist(p))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "parameter '%s' of '%s' is already distributed; a module takes one TP "
                         "style",
                         fsdp_param_name(p), fsdp_module_fqn(fsdp_param_module(p)));
    fsdp_dtensor *dt;
    FSDP_TRY_AT(ctx,
                fsdp_distribute_tensor(ctx, fsdp_param_data(p), mesh, &placement, src_rank, &dt));
    fsdp_tensor *data = NULL, *grad = NULL;
    fsdp_dtensor_spec *spec = malloc(sizeof *spec);
    fsdp_status st = spec ? fsdp_tensor_create_like(ctx, dt->local, &data)
                          : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a spec");
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, data, dt->local);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, dt->local, &grad);
    if (st != FSDP_OK) {
        fsdp_tensor_free(data);
        fsdp_tensor_free(grad);
        free(spec);
        fsdp_dtensor_free(dt);
        return FSDP_PASS(ctx, st);
    }
    *spec = dt->spec;
    fsdp_dtensor_free(dt);
    fsdp_nn_param_replace(p, data, grad, spec, free);
    return FSDP_OK;
}

static fsdp_status count_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx;
    (void)p;
    (void)name;
    ++*(int *)user;
    return FSDP_OK;
}

static fsdp_status collect_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx;
    (void)name;
    style_state *s = user;
    s->params[s->n_params++] = p;
    return FSDP_OK;
}

/* Fills the style's defaults and checks what it needs; `where` names the module. */
static fsdp_status resolve_style(fsdp_ctx *ctx, const fsdp_tp_style *in, const char *where,
                                 fsdp_tp_style *out) {
    *out = *in;
    const char *name = fsdp_tp_style_kind_to_string(in->kind);
    fsdp_placement *in_l = &out->input_layouts, *out_l = &out->output_layouts;
    bool unused_ok = true;
    switch (in->kind) {
    case FSDP_TP_COLWISE:
    case FSDP_TP_ROWWISE:
        if (in_l->kind == FSDP_PLACEMENT_DEFAULT)
            *in_l = in->kind == FSDP_TP_COLWISE ? FSDP_REPLICATE : FSDP_SHARD(-1);
        if (out_l->kind == FSDP_PLACEMENT_DEFAULT)
            *out_l = in->kind == FSDP_TP_COLWISE ? FSDP_SHARD(-1) : FSDP_REPLICATE;
        if (out->use_local_output == FSDP_TP_DEFAULT) out->use_local_output = FSDP_TP_YES;
        unused_ok = in->desired_input_layouts.kind == FSDP_PLACEMENT_DEFAULT &&
                    in->desired_output_layouts.kind == FSDP_PLACEMENT_DEFAULT;
        break;
    case FSDP_TP_PREPARE_INPUT:
        if (in_l->kind == FSDP_PLACEMENT_DEFAULT ||
            in->desired_input_layouts.kind == FSDP_PLACEMENT_DEFAULT)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s on %s: set both .input_layouts and .desired_input_layouts", name,
                             where);
        if (out->use_local_output == FSDP_TP_DEFAULT) out->use_local_output = FSDP_TP_NO;
        unused_ok = out_l->kind == FSDP_PLACEMENT_DEFAULT &&
                    in->desired_output_layouts.kind == FSDP_PLACEMENT_DEFAULT;
        break;
    case FSDP_TP_PREPARE_OUTPUT:
        if (out_l->kind == FSDP_PLACEMENT_DEFAULT ||
            in->desired_output_layouts.kind == FSDP_PLACEMENT_DEFAULT)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s on %s: set both .output_layouts and .desired_output_layouts", name,
                             where);
        if (out->use_local_output == FSDP_TP_DEFAULT) out->use_local_output = FSDP_TP_YES;
        /* The input passes untouched; its layout is whatever arrives. */
        *in_l = in->output_layouts;
        unused_ok = in->input_layouts.kind == FSDP_PLACEMENT_DEFAULT &&
                    in->desired_input_layouts.kind == FSDP_PLACEMENT_DEFAULT;
        break;
    case FSDP_TP_SEQUENCE_PARALLEL:
        if (in_l->kind == FSDP_PLACEMENT_DEFAULT) *in_l = FSDP_SHARD(1);
        if (in_l->kind != FSDP_PLACEMENT_SHARD)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s on %s: .input_layouts must be a Shard (the sequence or batch "
                             "dim)",
                             name, where);
        if (out->use_local_output == FSDP_TP_DEFAULT) out->use_local_output = FSDP_TP_NO;
        unused_ok = out_l->kind == FSDP_PLACEMENT_DEFAULT &&
                    in->desired_input_layouts.kind == FSDP_PLACEMENT_DEFAULT &&
                    in->desired_output_layouts.kind == FSDP_PLACEMENT_DEFAULT;
        break;
    default:
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "unknown TP style kind %d on %s; build styles with FSDP_COLWISE(), "
                         "FSDP_ROWWISE(), FSDP_PREPARE_INPUT(), FSDP_PREPARE_OUTPUT() or "
                         "FSDP_SEQUENCE_PARALLEL()",
                         (int)in->kind, where);
    }
    if (!unused_ok)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s on %s: a layout option this style does not take is set (see "
                         "fsdp_tp_style in fsdp/tp.h)",
                         name, where);
    const fsdp_placement *all[] = {&out->input_layouts, &out->output_layouts,
                                   &out->desired_input_layouts, &out->desired_output_layouts};
    for (int i = 0; i < 4; i++)
        if (all[i]->kind > FSDP_PLACEMENT_PARTIAL || (int)all[i]->kind < 0)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s on %s: unknown placement kind %d",
                             name, where, (int)all[i]->kind);
    if ((int)out->use_local_output < 0 || out->use_local_output > FSDP_TP_NO)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s on %s: use_local_output is %d; use FSDP_TP_YES or FSDP_TP_NO", name,
                         where, (int)out->use_local_output);
    return FSDP_OK;
}

fsdp_status tp_style_check(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tp_style *style) {
    char where[200];
    fsdp_nn_describe(m, where, sizeof where);
    fsdp_tp_style resolved;
    FSDP_TRY_AT(ctx, resolve_style(ctx, style, where, &resolved));
    bool rowwise_embedding = style->kind == FSDP_TP_ROWWISE && fsdp_nn_is_embedding(m);
    if ((style->kind == FSDP_TP_COLWISE || style->kind == FSDP_TP_ROWWISE) &&
        !fsdp_nn_is_linear(m) && !rowwise_embedding)
        return FSDP_FAIL(
            ctx, FSDP_ERR_INVALID_ARGUMENT, "%s applies to Linear modules%s; %s is a %s",
            fsdp_tp_style_kind_to_string(style->kind),
            style->kind == FSDP_TP_ROWWISE ? " and Embedding" : "", where, fsdp_module_kind(m));
    for (int i = 0; i < fsdp_module_num_params(m); i++)
        if (fsdp_nn_param_dist(fsdp_module_param(m, i)))
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "%s already has a TP style (its parameter '%s' is distributed); a "
                             "module takes one style",
                             where, fsdp_param_name(fsdp_module_param(m, i)));
    /* TP after FSDP: the wrapper holds these parameters in its flat buffers. */
    FSDP_TRY_AT(ctx, fsdp_nn_check_unmanaged(ctx, (fsdp_module *)m, "fsdp_tp_parallelize"));
    return FSDP_OK;
}

/* RowwiseParallel on an Embedding (PyTorch's): the table is Shard(0) over the vocabulary, each
 * rank looks up the tokens of its rows and gives zeros for the others, so the output is Partial
 * and leaves as output_layouts says (all_reduce to Replicate, reduce_scatter to Shard). */
static fsdp_status setup_embedding(fsdp_ctx *ctx, fsdp_module *m, style_state *s, int src_rank) {
    s->embedding = true;
    s->weight = fsdp_module_get_param(m, "weight");
    FSDP_TRY_AT(ctx, distribute_param(ctx, s->weight, s->mesh, FSDP_SHARD(0), src_rank));
    int64_t off[FSDP_MAX_DIMS], len[FSDP_MAX_DIMS];
    tp_spec_block(fsdp_nn_param_dist(s->weight), off, len);
    return fsdp_nn_embedding_shard_vocab(ctx, m, off[0]);
}

/* ColwiseParallel on a Linear whose weight another module owns (tied weights, the output
 * projection over the embedding's table): that module's style has placed it, and a parameter has
 * one placement, so it must already be Shard(0) over this mesh (the embedding's RowwiseParallel
 * over the vocabulary, earlier in the plan); nothing is distributed again. */
static fsdp_status setup_tied(fsdp_ctx *ctx, style_state *s, const char *name, const char *where) {
    const fsdp_dtensor_spec *sp = fsdp_nn_param_dist(s->weight);
    bool ok = s->style.kind == FSDP_TP_COLWISE && sp && sp->mesh == s->mesh &&
              sp->placements[0].kind == FSDP_PLACEMENT_SHARD && sp->placements[0].dim == 0;
    if (ok) return FSDP_OK;
    char owner[200];
    fsdp_nn_describe(fsdp_param_module(s->weight), owner, sizeof owner);
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "%s on %s: its weight is tied to '%s' of %s, which %s; a tied weight has one "
                     "placement: give %s RowwiseParallel (Shard(0) over the vocabulary) earlier "
                     "in the plan and this Linear ColwiseParallel (Shard(0) too), or untie the "
                     "weights",
                     name, where, fsdp_param_name(s->weight), owner,
                     s->style.kind != FSDP_TP_COLWISE ? "would need another placement"
                     : !sp                            ? "no style has distributed yet"
                                                      : "is not Shard(0) over this mesh",
                     owner);
}

/* Distributes the parameters the style owns and prepares its state. */
static fsdp_status setup(fsdp_ctx *ctx, fsdp_module *m, style_state *s, int src_rank,
                         const char *where) {
    const char *name = fsdp_tp_style_kind_to_string(s->style.kind);
    if (s->style.kind == FSDP_TP_ROWWISE && fsdp_nn_is_embedding(m))
        return setup_embedding(ctx, m, s, src_rank);
    if (s->style.kind == FSDP_TP_COLWISE || s->style.kind == FSDP_TP_ROWWISE) {
        if (!fsdp_nn_is_linear(m))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s applies to Linear modules; %s is a %s", name, where,
                             fsdp_module_kind(m));
        bool col = s->style.kind == FSDP_TP_COLWISE;
        s->weight = fsdp_nn_linear_weight(m);
        if (fsdp_param_module(s->weight) != m) return setup_tied(ctx, s, name, where);
        fsdp_param *bias = fsdp_module_get_param(m, "bias");
        FSDP_TRY_AT(ctx, distribute_param(ctx, s->weight, s->mesh,
                                          col ? FSDP_SHARD(0) : FSDP_SHARD(1), src_rank));
        if (bias) {
            FSDP_TRY_AT(ctx, distribute_param(ctx, bias, s->mesh,
                                              col ? FSDP_SHARD(0) : FSDP_REPLICATE, src_rank));
            if (!col) {
                fsdp_nn_param_set_hook_applied(bias, true);
                s->bias = bias;
            }
        }
        return FSDP_OK;
    }
    if (s->style.kind != FSDP_TP_SEQUENCE_PARALLEL) return FSDP_OK;
    /* SequenceParallel: every parameter of the subtree is replicated. */
    int n = 0;
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, m, count_param, &n));
    s->params = calloc((size_t)n + 1, sizeof *s->params);
    s->scratch = calloc((size_t)n + 1, sizeof *s->scratch);
    s->real = calloc((size_t)n + 1, sizeof *s->real);
    if (!s->params || !s->scratch || !s->real)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate %s state", name);
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, m, collect_param, s));
    for (int i = 0; i < s->n_params; i++) {
        FSDP_TRY_AT(ctx, distribute_param(ctx, s->params[i], s->mesh, FSDP_REPLICATE, src_rank));
        FSDP_TRY_AT(ctx,
                    fsdp_tensor_create_like(ctx, fsdp_param_grad(s->params[i]), &s->scratch[i]));
    }
    return FSDP_OK;
}

fsdp_status fsdp_tp_apply(fsdp_ctx *ctx, fsdp_module *m, const fsdp_mesh *mesh,
                          const fsdp_tp_style *style, const fsdp_tp_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, style);
    return tp_style_apply(ctx, m, mesh, style, opts, false);
}

fsdp_status tp_style_apply(fsdp_ctx *ctx, fsdp_module *m, const fsdp_mesh *mesh,
                           const fsdp_tp_style *style, const fsdp_tp_options *opts,
                           bool even_output) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, style);
    char where[200];
    fsdp_nn_describe(m, where, sizeof where);
    if (fsdp_mesh_ndim(mesh) != 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s on %s: tensor parallelism takes a 1-d mesh, this one has %d dims; "
                         "pass the tp dim's sub-mesh (fsdp_mesh_dim(ctx, mesh, \"tp\", &tp))",
                         fsdp_tp_style_kind_to_string(style->kind), where, fsdp_mesh_ndim(mesh));
    fsdp_device dev; /* the module's: the style runs there */
    FSDP_TRY_AT(ctx, fsdp_nn_check_one_device(ctx, m, "fsdp_tp_apply", "tensor parallelism",
                                              "parallelising it", &dev));
    FSDP_TRY_AT(ctx, tp_style_check(ctx, m, style));
    fsdp_tp_options o = opts ? *opts : (fsdp_tp_options){0};
    style_state *s = calloc(1, sizeof *s);
    if (!s) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate TP style state");
    s->mesh = mesh;
    fsdp_status st = resolve_style(ctx, style, where, &s->style);
    /* Rowwise is where a plan splits the sequence (Shard(1) out of the Partial sum). */
    s->even_output =
        even_output && s->style.kind == FSDP_TP_ROWWISE && s->style.use_local_output == FSDP_TP_YES;
    if (st == FSDP_OK) st = setup(ctx, m, s, o.src_rank, where);
    if (st != FSDP_OK) {
        style_state_free(s);
        return FSDP_PASS(ctx, st);
    }
    /* The first hook owns the state (fsdp_module_add_hook frees it if it cannot add it); the
     * others borrow it. */
    int ids[4] = {-1, -1, -1, -1};
    static const fsdp_hook_fn fns[4] = {pre_forward, post_forward, pre_backward, post_backward};
    static const fsdp_hook_point points[4] = {FSDP_HOOK_PRE_FORWARD, FSDP_HOOK_POST_FORWARD,
                                              FSDP_HOOK_PRE_BACKWARD, FSDP_HOOK_POST_BACKWARD};
    for (int i = 0; st == FSDP_OK && i < 4; i++)
        st = fsdp_module_add_hook(ctx, m, points[i], fns[i], s, i == 0 ? style_state_free : NULL,
                                  &ids[i]);
    if (st != FSDP_OK)
        for (int i = 3; i >= 0; i--)
            if (ids[i] >= 0) fsdp_module_remove_hook(ctx, m, ids[i]);
    return FSDP_PASS(ctx, st);
}

/* style_apply.c: applying a tensor-parallel style to a module: its options resolved to their
 * defaults and checked against the module, the parameters it owns distributed, and its four
 * hooks (style.c) installed. */
#include <stdlib.h>

#include "core/error.h"
#include "nn/nn.h"
#include "tp/style_impl.h"

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
        tp_style_state_free(s);
        return FSDP_PASS(ctx, st);
    }
    /* The first hook owns the state (fsdp_module_add_hook frees it if it cannot add it); the
     * others borrow it. */
    int ids[4] = {-1, -1, -1, -1};
    static const fsdp_hook_fn fns[4] = {tp_style_pre_forward, tp_style_post_forward,
                                        tp_style_pre_backward, tp_style_post_backward};
    static const fsdp_hook_point points[4] = {FSDP_HOOK_PRE_FORWARD, FSDP_HOOK_POST_FORWARD,
                                              FSDP_HOOK_PRE_BACKWARD, FSDP_HOOK_POST_BACKWARD};
    for (int i = 0; st == FSDP_OK && i < 4; i++)
        st = fsdp_module_add_hook(ctx, m, points[i], fns[i], s, i == 0 ? tp_style_state_free : NULL,
                                  &ids[i]);
    if (st != FSDP_OK)
        for (int i = 3; i >= 0; i--)
            if (ids[i] >= 0) fsdp_module_remove_hook(ctx, m, ids[i]);
    return FSDP_PASS(ctx, st);
}

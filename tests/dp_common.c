/* dp_common.c: the seed 001 models, data and loss step shared by the data-parallel suites
 * (see dp_common.h). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h" // defines: FSDP_FAIL
#include "dp_common.h"
#include "harness.h"

/* ---- the seed's WrapperModule for a non-0 batch dim: forward(x) = mlp(x.t()).t() ---- */

typedef struct wrapper {
    fsdp_tensor *xt, *out, *dyt, *dx;
} wrapper;

static void wrapper_free(void *impl) {
    wrapper *w = impl;
    fsdp_tensor_free(w->xt);
    fsdp_tensor_free(w->out);
    fsdp_tensor_free(w->dyt);
    fsdp_tensor_free(w->dx);
    free(w);
}

/* *out = in^T for a 2-d tensor, reusing *out. */
static fsdp_status transpose(fsdp_ctx *ctx, const fsdp_tensor *in, fsdp_tensor **out) {
    int64_t r = fsdp_tensor_dim(in, 0), c = fsdp_tensor_dim(in, 1), shape[2] = {c, r};
    if (*out)
        FSDP_TRY(fsdp_tensor_resize(ctx, *out, 2, shape));
    else
        FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, out));
    const float *s = fsdp_tensor_f32(in);
    float *d = fsdp_tensor_f32(*out);
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) d[j * r + i] = s[i * c + j];
    return FSDP_OK;
}

static fsdp_status wrapper_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                   const fsdp_tensor **out) {
    wrapper *w = fsdp_module_impl(m);
    const fsdp_tensor *y;
    FSDP_TRY(transpose(ctx, in, &w->xt));
    FSDP_TRY(fsdp_module_forward(ctx, fsdp_module_child(m, 0), w->xt, &y));
    FSDP_TRY(transpose(ctx, y, &w->out));
    *out = w->out;
    return FSDP_OK;
}

static fsdp_status wrapper_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                    const fsdp_tensor **din) {
    wrapper *w = fsdp_module_impl(m);
    const fsdp_tensor *dx = NULL;
    FSDP_TRY(transpose(ctx, dout, &w->dyt));
    FSDP_TRY(fsdp_module_backward(ctx, fsdp_module_child(m, 0), w->dyt, din ? &dx : NULL));
    if (!din) return FSDP_OK;
    FSDP_TRY(transpose(ctx, dx, &w->dx));
    *din = w->dx;
    return FSDP_OK;
}

static const fsdp_module_ops wrapper_ops = {.kind = "WrapperModule",
                                            .forward = wrapper_forward,
                                            .backward = wrapper_backward,
                                            .free_impl = wrapper_free};

fsdp_status dp_build_model(fsdp_ctx *ctx, int batch_dim, uint64_t seed, fsdp_module **out) {
    fsdp_module *mlp;
    FSDP_TRY(fsdp_model_simple_mlp(ctx, &mlp));
    if (batch_dim == 0) {
        *out = mlp;
    } else {
        wrapper *w = calloc(1, sizeof *w);
        fsdp_status st = w ? fsdp_module_create(ctx, &wrapper_ops, w, out)
                           : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "wrapper");
        if (st != FSDP_OK) {
            free(w);
            fsdp_module_free(mlp);
            return st;
        }
        FSDP_TRY(fsdp_module_add_child(ctx, *out, "mlp", mlp));
    }
    return fsdp_module_reset_parameters(ctx, *out, seed);
}

/* ---- data by global sample index ---- */

fsdp_status dp_batch_block(fsdp_ctx *ctx, int64_t batch, int64_t features, int batch_dim,
                           int64_t off, int64_t len, uint64_t stream, fsdp_tensor **out) {
    int64_t gshape[2] = {batch, features}, shape[2] = {len, features}, start[2] = {off, 0};
    if (batch_dim == 1) {
        gshape[0] = features, gshape[1] = batch;
        shape[0] = features, shape[1] = len;
        start[0] = 0, start[1] = off;
    }
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, out));
    fsdp_init init = {.kind = FSDP_INIT_NORMAL, .a = 0.0f, .b = 1.0f};
    return fsdp_init_block(ctx, *out, &init, DP_DATA_SEED, stream, 2, gshape, start);
}

/* ---- one training step: the seed's loss (out - labels).sum() ---- */

fsdp_status dp_forward_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *x,
                                const fsdp_tensor *labels, float dscale, fsdp_tensor **dout,
                                double *loss) {
    const fsdp_tensor *out;
    FSDP_TRY(fsdp_module_forward(ctx, m, x, &out));
    const float *o = fsdp_tensor_f32(out), *l = fsdp_tensor_f32(labels);
    double sum = 0.0;
    for (int64_t i = 0; i < fsdp_tensor_numel(out); i++) sum += (double)o[i] - l[i];
    *loss = sum;
    if (*dout)
        FSDP_TRY(fsdp_tensor_resize(ctx, *dout, fsdp_tensor_ndim(out), fsdp_tensor_shape(out)));
    else
        FSDP_TRY(fsdp_tensor_create_like(ctx, out, dout));
    FSDP_TRY(fsdp_tensor_fill(ctx, *dout, dscale));
    return fsdp_module_backward(ctx, m, *dout, NULL);
}

fsdp_status dp_check_loss_sum(fsdp_ctx *ctx, fsdp_group *group, double loss, double ref_loss,
                              const char *what) {
    float l = (float)loss;
    fsdp_tensor *lt;
    FSDP_TRY(fsdp_tensor_from_blob(ctx, &l, FSDP_DTYPE_F32, FSDP_CPU, 0, NULL, &lt));
    fsdp_status st = fsdp_all_reduce(ctx, group, lt, FSDP_REDUCE_SUM);
    fsdp_tensor_free(lt);
    FSDP_TRY(st);
    /* Each rank's loss is rounded to float and the W <= 4 of them summed in float: (W + 1) u |L|
     * = 1.7e-4 at |L| = 560; the outputs' own rounding (K = 50 and 32 sums, ~1e-7 each over 1024
     * outputs) adds less. Seen at most 4.3e-5. An Adam step that moved one element by O(lr)
     * (allowed by the parameters' rule, tests/numerics.h) can move the loss beyond this. */
    FSDP_RANK_CHECK(ctx, fabs(l - ref_loss) <= 1e-5 * fabs(ref_loss) + 1e-3,
                    "%s: loss %.7g summed over the ranks, reference %.7g", what, l, ref_loss);
    return FSDP_OK;
}

/* ---- Adam scenarios: the reference's rounding noise ---- */

fsdp_status dp_adam_noise_init(fsdp_ctx *ctx, dp_adam_noise *n, int batch_dim,
                               const fsdp_adam_options *opts, bool adamw) {
    n->opts = *opts;
    FSDP_TRY(dp_build_model(ctx, batch_dim, DP_SEED, &n->model));
    FSDP_TRY(fsdp_test_nudge_params(ctx, n->model, 77));
    return adamw ? fsdp_adamw_create(ctx, n->model, opts, &n->opt)
                 : fsdp_adam_create(ctx, n->model, opts, &n->opt);
}

/* The largest of fsdp_test_adam_step_bound x lr over the groups of the options at step t. */
static double largest_step(const fsdp_adam_options *o, int t, double lr) {
    double b1 = o->beta1 > 0 ? o->beta1 : 0.9, b2 = o->beta2 > 0 ? o->beta2 : 0.999;
    double worst = lr * fsdp_test_adam_step_bound(b1, b2, t);
    for (int g = 0; g < o->n_param_groups; g++) {
        const fsdp_param_group *pg = &o->param_groups[g];
        double glr = pg->lr.set ? pg->lr.value * (lr / o->lr) : lr;
        double gb1 = pg->beta1.set ? pg->beta1.value : b1,
               gb2 = pg->beta2.set ? pg->beta2.value : b2;
        worst = fmax(worst, glr * fsdp_test_adam_step_bound(gb1, gb2, t));
    }
    return worst;
}

fsdp_status dp_adam_noise_step(fsdp_ctx *ctx, dp_adam_noise *n, const fsdp_tensor *x,
                               const fsdp_tensor *labels, float dscale, double lr) {
    double loss;
    fsdp_optimizer_set_lr(n->opt, lr);
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, n->opt));
    FSDP_TRY(dp_forward_backward(ctx, n->model, x, labels, dscale, &n->dout, &loss));
    FSDP_TRY(fsdp_optimizer_step(ctx, n->opt));
    n->move += 2.0 * largest_step(&n->opts, ++n->steps, lr);
    return FSDP_OK;
}

fsdp_status dp_adam_compare(fsdp_ctx *ctx, const dp_adam_noise *n, fsdp_module *ref,
                            fsdp_module *got, const char *stage, fsdp_test_adam_check *out) {
    double noise;
    FSDP_TRY(fsdp_test_param_noise(ctx, ref, n->model, DP_NOISE_Q, &noise));
    fsdp_test_adam_check c = {
        .bulk = DP_NOISE_K * noise, .move = n->move, .max_exceptions = DP_MAX_EXCEPTIONS};
    FSDP_TRY(fsdp_test_adam_add_model(ctx, &c, ref, got));
    if (out) *out = c;
    char why[256];
    FSDP_RANK_CHECK(ctx, fsdp_test_adam_ok(&c, why, sizeof why), "%s: %s", stage, why);
    return FSDP_OK;
}

void dp_adam_noise_release(dp_adam_noise *n) {
    fsdp_optimizer_free(n->opt);
    fsdp_module_free(n->model);
    fsdp_tensor_free(n->dout);
}

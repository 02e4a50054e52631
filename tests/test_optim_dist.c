/* test_optim_dist.c: the optimizer layer over distributed parameters. Gradient clipping of a
 * tensor-parallel model (Colwise + Rowwise MLP on 3 and 4 ranks, uneven shards on 3) against
 * the same model on one rank, for the 2-norm and the max norm, with its collectives pinned
 * (one all_reduce on tp); and the enumeration of optimizer state by parameter name, kind and
 * place in the global parameter that checkpoints use, on one rank and on a TP model. Every
 * rank builds its own reference, so the bodies need no shared memory. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "numerics.h" // defines: fsdp_test_sum_tol, fsdp_test_max_abs

#define SEED 3

typedef struct grad_cmp {
    fsdp_module *tp;
    double max_abs;
} grad_cmp;

/* Compares a reference gradient with the TP model's, gathered: rtol 1e-5 (the norm's own
 * rounding, below) plus fsdp_test_sum_tol(16, 4) = 3.8e-6 of the tensor's largest value
 * (tests/numerics.h): TP reorders MLPModule's sums of at most 16 terms, and d(out) = out takes
 * the gradients through the forward's two and the backward's two. Under the old rtol 1e-5 +
 * atol 1e-7 the smallest elements used up to 0.3 of it; now 0.016 at most. */
static fsdp_status compare_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    grad_cmp *c = user;
    fsdp_param *q = fsdp_module_get_param(c->tp, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "no parameter '%s'", name);
    fsdp_tensor *full;
    FSDP_TRY(fsdp_param_full_tensor(ctx, q, true, &full));
    const fsdp_tensor *want = fsdp_param_grad(p);
    double atol = fsdp_test_sum_tol(16, 4) *
                  fsdp_test_max_abs(fsdp_tensor_f32(want), fsdp_tensor_numel(want));
    fsdp_status st = fsdp_test_rank_close(ctx, name, full, want, 1e-5, atol, &c->max_abs);
    fsdp_tensor_free(full);
    return st;
}

/* MLPModule (net1 Linear(10, 16), relu, net2 Linear(16, 10)) with net1 Colwise and net2
 * Rowwise over a 1-d "tp" mesh of the whole world, or plain when mesh is NULL. */
static fsdp_status mlp_tp(fsdp_ctx *ctx, const fsdp_mesh *mesh, fsdp_module **out) {
    FSDP_TRY(fsdp_model_mlp_module(ctx, out));
    FSDP_TRY(fsdp_module_reset_parameters(ctx, *out, SEED));
    if (!mesh) return FSDP_OK;
    fsdp_tp_plan_entry plan[] = {{"net1", FSDP_COLWISE()}, {"net2", FSDP_ROWWISE()}};
    return fsdp_tp_parallelize(ctx, *out, mesh, 2, plan, NULL);
}

/* Forward of an (8, 10) input and backward of 0.5 * sum(out^2) (d(out) = out), so every
 * gradient element differs. *dout is the caller's buffer. */
static fsdp_status backward_of_square(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *x,
                                      fsdp_tensor **dout) {
    const fsdp_tensor *out;
    FSDP_TRY(fsdp_module_forward(ctx, m, x, &out));
    FSDP_TRY(fsdp_tensor_create_like(ctx, out, dout));
    FSDP_TRY(fsdp_tensor_copy(ctx, *dout, out));
    return fsdp_module_backward(ctx, m, *dout, NULL);
}

/* ---- clip_grad_norm over TP shards ---- */

typedef struct clip_case {
    int world;
    double norm_type;
    double fraction; /* max_norm = fraction * the reference norm: < 1 clips, > 1 does not */
} clip_case;

static fsdp_status clip_tp_run(fsdp_ctx *ctx, const clip_case *c, fsdp_mesh **mesh,
                               fsdp_module **ref, fsdp_module **tp, fsdp_tensor **bufs) {
    FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){c->world}, (const char *[]){"tp"}, mesh));
    FSDP_TRY(mlp_tp(ctx, NULL, ref));
    FSDP_TRY(mlp_tp(ctx, *mesh, tp));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){8, 10}, &bufs[0]));
    fsdp_init init = {.kind = FSDP_INIT_NORMAL, .a = 0.0f, .b = 1.0f};
    FSDP_TRY(fsdp_init_tensor(ctx, bufs[0], &init, SEED, 1));
    FSDP_TRY(backward_of_square(ctx, *ref, bufs[0], &bufs[1]));
    FSDP_TRY(backward_of_square(ctx, *tp, bufs[0], &bufs[2]));
    /* The reference norm (a max_norm this large never clips), then both models clipped. */
    double ref_norm, ref_again, norm;
    FSDP_TRY(fsdp_clip_grad_norm(ctx, *ref, 1e30, c->norm_type, &ref_norm));
    double max_norm = c->fraction * ref_norm;
    FSDP_TRY(fsdp_clip_grad_norm(ctx, *ref, max_norm, c->norm_type, &ref_again));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    FSDP_TRY(fsdp_clip_grad_norm(ctx, *tp, max_norm, c->norm_type, &norm));
    FSDP_TRY(fsdp_comm_debug_end(ctx));
    /* net1.weight, net1.bias (Shard(0)) and net2.weight (Shard(1)) are summed over tp in one
     * all_reduce; net2.bias (Replicate) counts once. */
    fsdp_comm_count ar = fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_REDUCE, "tp");
    FSDP_RANK_CHECK(ctx, ar.calls == 1 && fsdp_comm_debug_total(ctx).calls == 1,
                    "clip made %lld collectives (%lld all_reduce on tp), want 1 all_reduce",
                    (long long)fsdp_comm_debug_total(ctx).calls, (long long)ar.calls);
    /* the norm: one sum over the ~350 gradient elements (their squares, or their maximum),
     * reordered over tp; a sum of positive terms errs by at most gamma_n = 2e-5 relative,
     * typically sqrt(n) u = 1.1e-6; seen 2e-8 */
    FSDP_RANK_CHECK(ctx, fabs(norm - ref_norm) <= 1e-6 * ref_norm,
                    "norm %.9g, reference %.9g (p = %g, %d ranks)", norm, ref_norm, c->norm_type,
                    c->world);
    grad_cmp g = {.tp = *tp};
    FSDP_TRY(fsdp_module_visit_params(ctx, *ref, compare_grad, &g));
    if (fsdp_ctx_rank(ctx) == 0)
        printf("\n    p = %g, %d ranks, max_norm %.3g x norm: norm %.9g vs %.9g, clipped grads max "
               "abs diff %.3g",
               c->norm_type, c->world, c->fraction, norm, ref_norm, g.max_abs);
    return FSDP_OK;
}

static fsdp_status clip_tp_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    fsdp_mesh *mesh = NULL;
    fsdp_module *ref = NULL, *tp = NULL;
    fsdp_tensor *bufs[3] = {NULL, NULL, NULL};
    fsdp_status st = clip_tp_run(ctx, user, &mesh, &ref, &tp, bufs);
    for (int i = 0; i < 3; i++) fsdp_tensor_free(bufs[i]);
    fsdp_module_free(ref);
    fsdp_module_free(tp);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_clip_grad_norm_tp(void) {
    static const double types[] = {2.0, INFINITY};
    static const double fractions[] = {0.25, 2.0};
    for (int w = 3; w <= 4; w++)
        for (int t = 0; t < 2; t++)
            for (int f = 0; f < 2; f++) {
                clip_case c = {w, types[t], fractions[f]};
                FSDP_TEST_OK(fsdp_test_run_world(w, 0, clip_tp_rank, &c));
            }
}

/* ---- optimizer state by parameter ---- */

/* Gives every trainable parameter of m the gradient g[i] = uniform(-1, 1) drawn from its
 * global position (so TP shards get their block of the same values). */
static fsdp_status set_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)user;
    const fsdp_dtensor_spec *spec = fsdp_param_dtensor_spec(p);
    fsdp_tensor *g = fsdp_param_grad(p);
    int nd = fsdp_tensor_ndim(g);
    int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
    const int64_t *shape = spec ? spec->shape : fsdp_tensor_shape(g);
    if (spec)
        FSDP_TRY(
            fsdp_placement_local_block(ctx, spec->mesh, spec->placements, nd, shape, off, len));
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
    return fsdp_init_block(ctx, g, &init, SEED, fsdp_rng_stream(name), nd, shape, off);
}

/* The state after two steps with the gradient g held constant, with the update's f32
 * operations: SGD momentum 0.9: buf = g, then 0.9 buf + g; Adam (0.9, 0.999): m = 0.1 g, then
 * m + 0.1 (g - m); v = 0.001 g^2, then 0.999 v + 0.001 g^2; with amsgrad vmax = v. */
static float expected_state(fsdp_optim_state_kind kind, float g) {
    const float w1 = (float)(1.0 - 0.9), b2 = (float)0.999, w2 = (float)(1.0 - 0.999);
    float m = 0.0f, v = 0.0f, buf = g;
    buf = buf * 0.9f + 1.0f * g;
    for (int s = 0; s < 2; s++) {
        m = m + w1 * (g - m);
        v = v * b2 + w2 * g * g;
    }
    switch (kind) {
    case FSDP_OPTIM_MOMENTUM_BUFFER:
        return buf;
    case FSDP_OPTIM_EXP_AVG:
        return m;
    default:
        return v;
    }
}

/* Checks every state of opt after two steps: order (parameters in named_parameters() order,
 * kinds in enum order), names, kinds, local shapes, specs and values. The values are checked
 * in global coordinates: the state's block is placed with its spec and compared with the
 * expected state of the global gradient there. */
static fsdp_status check_states(fsdp_ctx *ctx, const fsdp_optimizer *opt, const char *const *names,
                                int n_params, const fsdp_optim_state_kind *kinds, int n_kinds) {
    FSDP_RANK_CHECK(ctx, fsdp_optimizer_num_states(opt) == n_params * n_kinds, "%d states, want %d",
                    fsdp_optimizer_num_states(opt), n_params * n_kinds);
    for (int i = 0; i < n_params * n_kinds; i++) {
        fsdp_optim_state s;
        FSDP_TRY(fsdp_optimizer_get_state(ctx, opt, i, &s));
        const char *want_name = names[i / n_kinds];
        FSDP_RANK_CHECK(ctx, strcmp(s.param_name, want_name) == 0 && s.kind == kinds[i % n_kinds],
                        "state %d is %s %s, want %s %s", i, s.param_name,
                        fsdp_optim_state_kind_to_string(s.kind), want_name,
                        fsdp_optim_state_kind_to_string(kinds[i % n_kinds]));
        FSDP_RANK_CHECK(ctx, s.step == 2, "%s: step %lld", s.param_name, (long long)s.step);
        FSDP_RANK_CHECK(ctx, s.spec == fsdp_param_dtensor_spec(s.param),
                        "%s: the spec is not the parameter's", s.param_name);
        const fsdp_tensor *data = fsdp_param_data(s.param);
        FSDP_RANK_CHECK(ctx, fsdp_tensor_same_shape(s.value, data),
                        "%s %s: not the local data's shape", s.param_name,
                        fsdp_optim_state_kind_to_string(s.kind));
        /* The global gradient, and the expected state at this block's place in it. */
        int nd = fsdp_tensor_ndim(data);
        int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
        const int64_t *gshape = s.spec ? s.spec->shape : fsdp_tensor_shape(data);
        for (int d = 0; d < nd; d++) len[d] = gshape[d];
        if (s.spec)
            FSDP_TRY(fsdp_placement_local_block(ctx, s.spec->mesh, s.spec->placements, nd, gshape,
                                                off, len));
        fsdp_tensor *global;
        FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, nd, gshape, &global));
        fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
        fsdp_status st = fsdp_init_tensor(ctx, global, &init, SEED, fsdp_rng_stream(s.param_name));
        const float *gv = fsdp_tensor_f32(global), *got = fsdp_tensor_f32(s.value);
        int64_t cols = nd == 2 ? gshape[1] : 1, lc = nd == 2 ? len[1] : 1;
        for (int64_t k = 0; st == FSDP_OK && k < fsdp_tensor_numel(s.value); k++) {
            int64_t r = k / lc + off[0], c = nd == 2 ? k % lc + off[1] : 0;
            float want = expected_state(s.kind, gv[r * cols + c]);
            if (!(fabsf(got[k] - want) <= 1e-6f * fabsf(want) + 1e-12f))
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s %s: element %lld is %.9g, want %.9g",
                               s.param_name, fsdp_optim_state_kind_to_string(s.kind), (long long)k,
                               got[k], want);
        }
        fsdp_tensor_free(global);
        FSDP_TRY(st);
    }
    fsdp_optim_state s;
    fsdp_status bad = fsdp_optimizer_get_state(ctx, opt, n_params * n_kinds, &s);
    FSDP_RANK_CHECK(
        ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "does not exist"),
        "state out of range: %s", fsdp_last_error(ctx));
    fsdp_clear_error(ctx); /* the refusal asked for; this function succeeds */
    return FSDP_OK;
}

/* Two steps of each optimizer on m with constant gradients, then its states checked. */
static fsdp_status two_steps_and_check(fsdp_ctx *ctx, fsdp_module *m, bool adam,
                                       const char *const *names, int n_params) {
    fsdp_optimizer *opt = NULL;
    fsdp_status st =
        adam ? fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 0.01, .amsgrad = true}, &opt)
             : fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.01, .momentum = 0.9}, &opt);
    for (int step = 0; st == FSDP_OK && step < 2; step++) {
        st = fsdp_module_visit_params(ctx, m, set_grad, NULL);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
    }
    static const fsdp_optim_state_kind sgd[] = {FSDP_OPTIM_MOMENTUM_BUFFER};
    static const fsdp_optim_state_kind adam_kinds[] = {FSDP_OPTIM_EXP_AVG, FSDP_OPTIM_EXP_AVG_SQ,
                                                       FSDP_OPTIM_MAX_EXP_AVG_SQ};
    if (st == FSDP_OK)
        st = check_states(ctx, opt, names, n_params, adam ? adam_kinds : sgd, adam ? 3 : 1);
    if (st == FSDP_OK) {
        fsdp_optimizer_set_steps(opt, 7);
        fsdp_optim_state s;
        st = fsdp_optimizer_get_state(ctx, opt, 0, &s);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, s.step == 7 && fsdp_optimizer_steps(opt) == 7, "set_steps");
    }
    fsdp_optimizer_free(opt);
    return st;
}

static void test_optim_state_names(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &m));
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, SEED));
    /* A frozen parameter has no state. */
    fsdp_param_set_requires_grad(fsdp_module_get_param(m, "layers.0.net2.bias"), false);
    static const char *const names[] = {"layers.0.net1.weight", "layers.0.net1.bias",
                                        "layers.0.net2.weight", "layers.1.net1.weight",
                                        "layers.1.net1.bias",   "layers.1.net2.weight",
                                        "layers.1.net2.bias"};
    FSDP_TEST_OK(two_steps_and_check(ctx, m, false, names, 7));
    FSDP_TEST_OK(two_steps_and_check(ctx, m, true, names, 7));
    /* SGD without momentum keeps no state. */
    fsdp_optimizer *opt;
    FSDP_TEST_OK(fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.1}, &opt));
    CU_ASSERT_EQUAL(fsdp_optimizer_num_states(opt), 0);
    fsdp_optimizer_free(opt);
    /* Names from a subtree are still fully qualified from the root. */
    FSDP_TEST_OK(fsdp_adam_create(ctx, fsdp_module_find(m, "layers.1"),
                                  &(fsdp_adam_options){.lr = 0.1}, &opt));
    fsdp_optim_state s;
    FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt, 1, &s));
    CU_ASSERT_STRING_EQUAL(s.param_name, "layers.1.net1.weight");
    CU_ASSERT_STRING_EQUAL(fsdp_optim_state_kind_to_string(s.kind), "exp_avg_sq");
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
}

/* On a TP model (MLPModule, net1 Colwise, net2 Rowwise, 4 ranks) each state is the local block
 * with the parameter's spec: net1.weight (4, 10) of (16, 10) at Shard(0), net2.weight (10, 4)
 * of (10, 16) at Shard(1), net2.bias (10) Replicate. An optimizer made before parallelize
 * refuses to step. */
static fsdp_status optim_state_tp_run(fsdp_ctx *ctx, fsdp_mesh **mesh, fsdp_module **m,
                                      fsdp_module **early) {
    FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){4}, (const char *[]){"tp"}, mesh));
    FSDP_TRY(mlp_tp(ctx, *mesh, m));
    static const char *const names[] = {"net1.weight", "net1.bias", "net2.weight", "net2.bias"};
    FSDP_TRY(two_steps_and_check(ctx, *m, false, names, 4));
    FSDP_TRY(two_steps_and_check(ctx, *m, true, names, 4));
    fsdp_optimizer *opt;
    FSDP_TRY(fsdp_sgd_create(ctx, *m, &(fsdp_sgd_options){.lr = 0.1, .momentum = 0.9}, &opt));
    fsdp_optim_state s;
    fsdp_status st = fsdp_optimizer_get_state(ctx, opt, 2, &s);
    if (st == FSDP_OK) {
        const fsdp_dtensor_spec *sp = s.spec;
        st = sp && sp->placements[0].kind == FSDP_PLACEMENT_SHARD && sp->placements[0].dim == 1 &&
                     sp->shape[0] == 10 && sp->shape[1] == 16 &&
                     fsdp_tensor_dim(s.value, 0) == 10 && fsdp_tensor_dim(s.value, 1) == 4
                 ? FSDP_OK
                 : FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "net2.weight: spec or local shape");
    }
    fsdp_optimizer_free(opt);
    FSDP_TRY(st);
    /* Made on the whole parameters, then the model is parallelized: the step refuses. */
    fsdp_optimizer *stale = NULL;
    FSDP_TRY(mlp_tp(ctx, NULL, early));
    FSDP_TRY(fsdp_adam_create(ctx, *early, &(fsdp_adam_options){.lr = 0.1}, &stale));
    fsdp_tp_plan_entry plan[] = {{"net1", FSDP_COLWISE()}, {"net2", FSDP_ROWWISE()}};
    st = fsdp_tp_parallelize(ctx, *early, *mesh, 2, plan, NULL);
    if (st == FSDP_OK) {
        fsdp_status bad = fsdp_optimizer_step(ctx, stale);
        if (bad != FSDP_ERR_STATE || !strstr(fsdp_last_error(ctx), "after parallelizing"))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "stale optimizer: %s", fsdp_last_error(ctx));
    }
    fsdp_optimizer_free(stale);
    return st;
}

static fsdp_status optim_state_tp_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *m = NULL, *early = NULL;
    fsdp_status st = optim_state_tp_run(ctx, &mesh, &m, &early);
    fsdp_module_free(m);
    fsdp_module_free(early);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_optim_state_tp(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, optim_state_tp_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"clip_grad_norm_tp", test_clip_grad_norm_tp},
        {"optim_state_names", test_optim_state_names},
        {"optim_state_tp", test_optim_state_tp},
    };
    return fsdp_test_run(argc, argv, "optim_dist", cases, sizeof cases / sizeof cases[0]);
}

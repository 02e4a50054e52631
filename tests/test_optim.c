/* test_optim.c: SGD, Adam and AdamW against 20-step PyTorch trajectories
 * (tests/fixtures/optim_*.bin): the same starting parameters and per-step gradients, and the
 * parameters after every step compared at rtol 1e-6; the options come from the fixture, as
 * PyTorch held them. Also gradient clipping against clip_grad_norm_, and LR schedules. Option
 * groups: PyTorch param_groups trajectories under LambdaLR, one optimizer with groups against
 * separate optimizers (bitwise), a frozen group, and the errors. */
#include <math.h>
#include <string.h>

#include "fixture.h"
#include "harness.h"

#define STEPS 20
/* The trajectories: elementwise float32 updates in both (no BLAS: the same on every machine),
 * the same equations associated differently, so a few u of each parameter per step, carried
 * over 20 steps; atol for the elements that cross zero. Seen at most 0.21 of the bound. */
#define RTOL 1e-6
#define ATOL 1e-7

enum {
    OPT_KIND,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_DAMPENING,
    OPT_WD,
    OPT_NESTEROV,
    OPT_MAXIMIZE,
    OPT_BETA1,
    OPT_BETA2,
    OPT_EPS,
    OPT_AMSGRAD,
    OPT_COUNT
};

static fsdp_status make_optimizer(fsdp_ctx *ctx, fsdp_module *m, const double *o,
                                  fsdp_optimizer **out) {
    if (o[OPT_KIND] == 0)
        return fsdp_sgd_create(ctx, m,
                               &(fsdp_sgd_options){.lr = o[OPT_LR],
                                                   .momentum = o[OPT_MOMENTUM],
                                                   .dampening = o[OPT_DAMPENING],
                                                   .weight_decay = o[OPT_WD],
                                                   .nesterov = o[OPT_NESTEROV] != 0,
                                                   .maximize = o[OPT_MAXIMIZE] != 0},
                               out);
    fsdp_adam_options a = {.lr = o[OPT_LR],
                           .beta1 = o[OPT_BETA1],
                           .beta2 = o[OPT_BETA2],
                           .eps = o[OPT_EPS],
                           .weight_decay = o[OPT_WD],
                           .amsgrad = o[OPT_AMSGRAD] != 0,
                           .maximize = o[OPT_MAXIMIZE] != 0};
    return o[OPT_KIND] == 1 ? fsdp_adam_create(ctx, m, &a, out)
                            : fsdp_adamw_create(ctx, m, &a, out);
}

/* Whether got matches want within RTOL/ATOL; tracks the worst relative difference. */
static bool within(const float *got, const float *want, int64_t n, double *worst) {
    bool ok = true;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > 0) *worst = fmax(*worst, d / fmax(fabs((double)want[i]), 1e-30));
        ok = ok && d <= ATOL + RTOL * fabs((double)want[i]);
    }
    return ok;
}

static void run_trajectory(const char *name) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fixture f;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named(name, &f), 0);
    const fixture_tensor *options = fixture_require(&f, "options", FIXTURE_F64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(options);
    CU_ASSERT_EQUAL_FATAL(options->numel, OPT_COUNT);
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 3, 4, true, &m));
    static const char *const params[] = {"weight", "bias"};
    for (int p = 0; p < 2; p++) {
        char key[64];
        snprintf(key, sizeof key, "init.%s", params[p]);
        CU_ASSERT_EQUAL_FATAL(
            fixture_copy_into(ctx, fixture_require(&f, key, FIXTURE_F32),
                              fsdp_param_data(fsdp_module_get_param(m, params[p]))),
            0);
    }
    fsdp_optimizer *opt;
    FSDP_TEST_OK(make_optimizer(ctx, m, options->data, &opt));
    double worst = 0;
    int bad_steps = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int p = 0; p < 2; p++) {
            char key[64];
            snprintf(key, sizeof key, "grad.%d.%s", step, params[p]);
            fsdp_param *param = fsdp_module_get_param(m, params[p]);
            CU_ASSERT_EQUAL_FATAL(fixture_copy_into(ctx, fixture_require(&f, key, FIXTURE_F32),
                                                    fsdp_param_grad(param)),
                                  0);
        }
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
        for (int p = 0; p < 2; p++) {
            char key[64];
            snprintf(key, sizeof key, "param.%d.%s", step, params[p]);
            const fixture_tensor *want = fixture_require(&f, key, FIXTURE_F32);
            CU_ASSERT_PTR_NOT_NULL_FATAL(want);
            const fsdp_tensor *got = fsdp_param_data(fsdp_module_get_param(m, params[p]));
            if (!within(fsdp_tensor_f32(got), want->data, want->numel, &worst)) bad_steps++;
            if (step == STEPS - 1) /* prints the final max differences */
                FSDP_TEST_CLOSE(key, fsdp_tensor_f32(got), want->data, want->numel, RTOL, ATOL);
        }
    }
    printf("\n    %s: worst relative difference over %d steps %.3g", name, STEPS, worst);
    CU_ASSERT_EQUAL(bad_steps, 0);
    CU_ASSERT_EQUAL(fsdp_optimizer_steps(opt), STEPS);
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
    fixture_free(&f);
}

#define TRAJECTORY(n)                                                                              \
    static void test_##n(void) {                                                                   \
        run_trajectory("optim_" #n);                                                               \
    }
TRAJECTORY(sgd)
TRAJECTORY(sgd_momentum)
TRAJECTORY(sgd_dampening)
TRAJECTORY(sgd_nesterov)
TRAJECTORY(sgd_maximize)
TRAJECTORY(adam)
TRAJECTORY(adam_weight_decay)
TRAJECTORY(adam_amsgrad)
TRAJECTORY(adam_maximize)
TRAJECTORY(adamw)
TRAJECTORY(adamw_amsgrad)

static void test_bad_options(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    fsdp_optimizer *opt = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 3, 4, true, &m));
    FSDP_TEST_FAILS(fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 1e-3, .beta1 = 1.0}, &opt),
                    FSDP_ERR_INVALID_ARGUMENT, "betas (1, 0.999)", "[0, 1)");
    FSDP_TEST_FAILS(fsdp_adamw_create(ctx, m, &(fsdp_adam_options){.lr = -1}, &opt),
                    FSDP_ERR_INVALID_ARGUMENT, "AdamW", "lr is -1");
    FSDP_TEST_FAILS(
        fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 1e-3, .weight_decay = -1}, &opt),
        FSDP_ERR_INVALID_ARGUMENT, "weight_decay -1");
    CU_ASSERT_PTR_NULL(opt);
    /* defaults: zero fields take PyTorch's values, and set_lr reaches the update */
    FSDP_TEST_OK(fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 1e-3}, &opt));
    fsdp_optimizer_set_lr(opt, 0.5);
    CU_ASSERT_DOUBLE_EQUAL(fsdp_optimizer_lr(opt), 0.5, 0);
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
}

/* clip_grad_norm against torch.nn.utils.clip_grad_norm_ (tests/fixtures/clip_*.bin). */
static void run_clip(const char *name) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fixture f;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named(name, &f), 0);
    const fixture_tensor *options = fixture_require(&f, "options", FIXTURE_F64);
    const fixture_tensor *total = fixture_require(&f, "total_norm", FIXTURE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(options);
    CU_ASSERT_PTR_NOT_NULL_FATAL(total);
    const double *o = options->data;
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 3, 4, true, &m));
    static const char *const params[] = {"weight", "bias"};
    for (int p = 0; p < 2; p++) {
        char key[64];
        snprintf(key, sizeof key, "grad.%s", params[p]);
        CU_ASSERT_EQUAL_FATAL(
            fixture_copy_into(ctx, fixture_require(&f, key, FIXTURE_F32),
                              fsdp_param_grad(fsdp_module_get_param(m, params[p]))),
            0);
    }
    double norm = 0;
    FSDP_TEST_OK(fsdp_clip_grad_norm(ctx, m, o[0], o[1], &norm));
    float got = (float)norm;
    /* a norm of 16 gradient elements against torch's (a sum of positive terms: gamma_16 = 1e-6
     * at worst), and the gradients scaled by it: 1e-6 relative (17 u) */
    FSDP_TEST_CLOSE("total_norm", &got, total->data, 1, 1e-6, 0);
    for (int p = 0; p < 2; p++) {
        char key[64];
        snprintf(key, sizeof key, "clipped.%s", params[p]);
        const fixture_tensor *want = fixture_require(&f, key, FIXTURE_F32);
        CU_ASSERT_PTR_NOT_NULL_FATAL(want);
        FSDP_TEST_CLOSE(key, fsdp_tensor_f32(fsdp_param_grad(fsdp_module_get_param(m, params[p]))),
                        want->data, want->numel, 1e-6, 1e-7);
    }
    fsdp_module_free(m);
    fixture_free(&f);
}

static void test_clip_norm2(void) {
    run_clip("clip_norm2");
}
static void test_clip_norm_inf(void) {
    run_clip("clip_norm_inf");
}
static void test_clip_norm2_unclipped(void) {
    run_clip("clip_norm2_unclipped");
}

static void test_clip_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 3, 4, true, &m));
    FSDP_TEST_FAILS(fsdp_clip_grad_norm(ctx, m, 1.0, 1.0, NULL), FSDP_ERR_INVALID_ARGUMENT,
                    "norm_type 1", "2.0 or INFINITY");
    FSDP_TEST_FAILS(fsdp_clip_grad_norm(ctx, m, 0.0, 2.0, NULL), FSDP_ERR_INVALID_ARGUMENT,
                    "max_norm is 0");
    fsdp_module_free(m);
}

static void test_lr_schedules(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const double pi = 3.14159265358979323846;
    fsdp_lr_schedule constant = {.kind = FSDP_LR_CONSTANT, .base_lr = 0.1};
    FSDP_TEST_OK(fsdp_lr_schedule_check(ctx, &constant));
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&constant, 0), 0.1, 0);
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&constant, 1000), 0.1, 0);

    fsdp_lr_schedule warm = {.kind = FSDP_LR_LINEAR_WARMUP, .base_lr = 0.2, .warmup_steps = 4};
    FSDP_TEST_OK(fsdp_lr_schedule_check(ctx, &warm));
    const double warm_want[] = {0.0, 0.05, 0.1, 0.15, 0.2, 0.2, 0.2};
    for (int s = 0; s < 7; s++) CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&warm, s), warm_want[s], 1e-15);

    fsdp_lr_schedule cosine = {.kind = FSDP_LR_COSINE,
                               .base_lr = 1.0,
                               .warmup_steps = 2,
                               .total_steps = 12,
                               .min_lr = 0.1};
    FSDP_TEST_OK(fsdp_lr_schedule_check(ctx, &cosine));
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&cosine, 1), 0.5, 1e-15);  /* warming up */
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&cosine, 2), 1.0, 1e-15);  /* the peak */
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&cosine, 7), 0.55, 1e-15); /* halfway: the mean */
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&cosine, 4), 0.1 + 0.9 * 0.5 * (1 + cos(pi * 0.2)), 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&cosine, 12), 0.1, 1e-15); /* the floor */
    CU_ASSERT_DOUBLE_EQUAL(fsdp_lr_at(&cosine, 50), 0.1, 1e-15); /* and it stays there */
    for (int s = 3; s <= 12; s++)
        CU_ASSERT_TRUE(fsdp_lr_at(&cosine, s) < fsdp_lr_at(&cosine, s - 1));

    FSDP_TEST_FAILS(fsdp_lr_schedule_check(ctx, &(fsdp_lr_schedule){.kind = FSDP_LR_COSINE,
                                                                    .base_lr = 1,
                                                                    .warmup_steps = 5,
                                                                    .total_steps = 5}),
                    FSDP_ERR_INVALID_ARGUMENT, "total_steps (5) > warmup_steps (5)");
    FSDP_TEST_FAILS(fsdp_lr_schedule_check(ctx, &(fsdp_lr_schedule){.base_lr = 0}),
                    FSDP_ERR_INVALID_ARGUMENT, "base_lr is 0");
    FSDP_TEST_FAILS(fsdp_lr_schedule_check(ctx, &(fsdp_lr_schedule){.kind = FSDP_LR_COSINE,
                                                                    .base_lr = 1,
                                                                    .total_steps = 10,
                                                                    .min_lr = 2}),
                    FSDP_ERR_INVALID_ARGUMENT, "min_lr 2");
}

/* ---- option groups (PyTorch's param_groups) ---- */

#define GROUP_STEPS 10

/* Sequential of net1 = Linear(3, 4), norm = RMSNorm(4), net2 = Linear(4, 2): the parameters
 * net1.weight, net1.bias, norm.weight, net2.weight, net2.bias, as gen_fixtures.py's
 * GroupModel. */
static const char *const group_params[] = {"net1.weight", "net1.bias", "norm.weight", "net2.weight",
                                           "net2.bias"};
#define N_GROUP_PARAMS 5

static fsdp_status group_model(fsdp_ctx *ctx, uint64_t seed, fsdp_module **out) {
    fsdp_module *net1, *norm, *net2;
    FSDP_TRY(fsdp_sequential_create(ctx, out));
    FSDP_TRY(fsdp_linear_create(ctx, 3, 4, true, &net1));
    FSDP_TRY(fsdp_module_add_child(ctx, *out, "net1", net1));
    FSDP_TRY(fsdp_rmsnorm_create(ctx, 4, 1e-6f, &norm));
    FSDP_TRY(fsdp_module_add_child(ctx, *out, "norm", norm));
    FSDP_TRY(fsdp_linear_create(ctx, 4, 2, true, &net2));
    FSDP_TRY(fsdp_module_add_child(ctx, *out, "net2", net2));
    return fsdp_module_reset_parameters(ctx, *out, seed);
}

/* gen_fixtures.py's GROUP_CONFIGS. */
static const fsdp_param_group sgd_groups[] = {
    {.pattern = "*.bias", .weight_decay = FSDP_OVERRIDE(0.0), .momentum = FSDP_OVERRIDE(0.0)},
    {.pattern = "norm.*",
     .lr = FSDP_OVERRIDE(0.05),
     .dampening = FSDP_OVERRIDE(0.5),
     .weight_decay = FSDP_OVERRIDE(0.0)},
};
static const fsdp_param_group adamw_groups[] = {
    {.pattern = "*.bias", .weight_decay = FSDP_OVERRIDE(0.0)},
    {.pattern = "norm.*", .lr = FSDP_OVERRIDE(0.003), .weight_decay = FSDP_OVERRIDE(0.0)},
    {.pattern = "net2.*",
     .beta1 = FSDP_OVERRIDE(0.8),
     .beta2 = FSDP_OVERRIDE(0.95),
     .eps = FSDP_OVERRIDE(1e-6)},
};

/* The fixture's trajectory under LambdaLR(1 / (1 + 0.2 step)): each parameter lands in the
 * fixture's group, every group's lr equals PyTorch's at every step (set_lr scales the
 * overridden ones), the parameters match at every step, and the state list skips the SGD
 * biases (their group has momentum 0, so PyTorch keeps no buffer for them either). */
static void run_group_trajectory(const char *name, bool sgd, int want_states) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fixture f;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named(name, &f), 0);
    fsdp_module *m;
    FSDP_TEST_OK(group_model(ctx, 1, &m));
    fsdp_optimizer *opt;
    if (sgd)
        FSDP_TEST_OK(fsdp_sgd_create(ctx, m,
                                     &(fsdp_sgd_options){.lr = 0.1,
                                                         .momentum = 0.9,
                                                         .weight_decay = 0.01,
                                                         .param_groups = sgd_groups,
                                                         .n_param_groups = 2},
                                     &opt));
    else
        FSDP_TEST_OK(fsdp_adamw_create(
            ctx, m,
            &(fsdp_adam_options){
                .lr = 0.01, .weight_decay = 0.1, .param_groups = adamw_groups, .n_param_groups = 3},
            &opt));
    int n_groups = fsdp_optimizer_num_groups(opt);
    CU_ASSERT_EQUAL(n_groups, sgd ? 2 : 3);
    for (int p = 0; p < N_GROUP_PARAMS; p++) {
        char key[64];
        snprintf(key, sizeof key, "group.%s", group_params[p]);
        const fixture_tensor *want = fixture_require(&f, key, FIXTURE_I32);
        CU_ASSERT_PTR_NOT_NULL_FATAL(want);
        int got = -2;
        FSDP_TEST_OK(fsdp_optimizer_param_group(ctx, opt, group_params[p], &got));
        CU_ASSERT_EQUAL(got, *(const int32_t *)want->data);
        snprintf(key, sizeof key, "init.%s", group_params[p]);
        CU_ASSERT_EQUAL_FATAL(
            fixture_copy_into(ctx, fixture_require(&f, key, FIXTURE_F32),
                              fsdp_param_data(fsdp_module_get_param(m, group_params[p]))),
            0);
    }
    double worst = 0;
    int bad_steps = 0;
    for (int step = 0; step < GROUP_STEPS; step++) {
        char key[64];
        snprintf(key, sizeof key, "lr.%d", step);
        const fixture_tensor *lrs = fixture_require(&f, key, FIXTURE_F64);
        CU_ASSERT_PTR_NOT_NULL_FATAL(lrs);
        CU_ASSERT_EQUAL_FATAL(lrs->numel, n_groups + 1);
        const double *lr = lrs->data;
        fsdp_optimizer_set_lr(opt, lr[0]);
        for (int g = FSDP_OPTIM_NO_GROUP; g < n_groups; g++)
            CU_ASSERT_DOUBLE_EQUAL(fsdp_optimizer_group_lr(opt, g), lr[g + 1], 1e-15 * lr[g + 1]);
        for (int p = 0; p < N_GROUP_PARAMS; p++) {
            snprintf(key, sizeof key, "grad.%d.%s", step, group_params[p]);
            CU_ASSERT_EQUAL_FATAL(
                fixture_copy_into(ctx, fixture_require(&f, key, FIXTURE_F32),
                                  fsdp_param_grad(fsdp_module_get_param(m, group_params[p]))),
                0);
        }
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
        for (int p = 0; p < N_GROUP_PARAMS; p++) {
            snprintf(key, sizeof key, "param.%d.%s", step, group_params[p]);
            const fixture_tensor *want = fixture_require(&f, key, FIXTURE_F32);
            CU_ASSERT_PTR_NOT_NULL_FATAL(want);
            const fsdp_tensor *got = fsdp_param_data(fsdp_module_get_param(m, group_params[p]));
            if (!within(fsdp_tensor_f32(got), want->data, want->numel, &worst)) bad_steps++;
            if (step == GROUP_STEPS - 1)
                FSDP_TEST_CLOSE(key, fsdp_tensor_f32(got), want->data, want->numel, RTOL, ATOL);
        }
    }
    printf("\n    %s: worst relative difference over %d steps %.3g", name, GROUP_STEPS, worst);
    CU_ASSERT_EQUAL(bad_steps, 0);
    CU_ASSERT_EQUAL(fsdp_optimizer_num_states(opt), want_states);
    for (int i = 0; i < fsdp_optimizer_num_states(opt); i++) {
        fsdp_optim_state s;
        FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt, i, &s));
        CU_ASSERT_PTR_NULL(strstr(s.param_name, "bias") && sgd ? s.param_name : NULL);
    }
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
    fixture_free(&f);
}

static void test_groups_sgd(void) {
    run_group_trajectory("optim_groups_sgd", true, 3); /* net1.weight, norm.weight, net2.weight */
}
static void test_groups_adamw(void) {
    run_group_trajectory("optim_groups_adamw", false, 2 * N_GROUP_PARAMS);
}

/* ---- groups against separate optimizers ---- */

/* One optimizer with groups, and one optimizer per group (plus one for the unmatched
 * parameters) built with the group's options written out in full, each over only its
 * parameters (the others frozen while it is created), on two copies of a model. */
typedef struct group_case {
    const char *name;
    int kind; /* 0 SGD, 1 Adam, 2 AdamW */
    fsdp_sgd_options sgd;
    fsdp_adam_options adam;
    const fsdp_param_group *groups;
    int n_groups;
    /* for the separate optimizers: the full options of "no group" and of each group */
    fsdp_sgd_options sep_sgd[4];
    fsdp_adam_options sep_adam[4];
} group_case;

static fsdp_status create_kind(fsdp_ctx *ctx, int kind, fsdp_module *m, const fsdp_sgd_options *s,
                               const fsdp_adam_options *a, fsdp_optimizer **out) {
    if (kind == 0) return fsdp_sgd_create(ctx, m, s, out);
    return kind == 1 ? fsdp_adam_create(ctx, m, a, out) : fsdp_adamw_create(ctx, m, a, out);
}

/* Only the parameters with group[p] == g require a gradient. */
static void freeze_except(fsdp_module *m, const int *group, int g) {
    for (int p = 0; p < N_GROUP_PARAMS; p++)
        fsdp_param_set_requires_grad(fsdp_module_get_param(m, group_params[p]), group[p] == g);
}

static bool same_bits(const fsdp_tensor *a, const fsdp_tensor *b) {
    return fsdp_tensor_same_shape(a, b) &&
           memcmp(fsdp_tensor_data(a), fsdp_tensor_data(b), fsdp_tensor_nbytes(a)) == 0;
}

static void run_groups_vs_separate(const group_case *c) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *a, *b;
    FSDP_TEST_OK(group_model(ctx, 5, &a));
    FSDP_TEST_OK(group_model(ctx, 5, &b));
    fsdp_optimizer *grouped, *sep[4] = {NULL};
    fsdp_sgd_options so = c->sgd;
    fsdp_adam_options ao = c->adam;
    so.param_groups = ao.param_groups = c->groups;
    so.n_param_groups = ao.n_param_groups = c->n_groups;
    FSDP_TEST_OK(create_kind(ctx, c->kind, a, &so, &ao, &grouped));
    int group[N_GROUP_PARAMS];
    for (int p = 0; p < N_GROUP_PARAMS; p++)
        FSDP_TEST_OK(fsdp_optimizer_param_group(ctx, grouped, group_params[p], &group[p]));
    for (int g = -1; g < c->n_groups; g++) {
        freeze_except(b, group, g);
        FSDP_TEST_OK(
            create_kind(ctx, c->kind, b, &c->sep_sgd[g + 1], &c->sep_adam[g + 1], &sep[g + 1]));
    }
    freeze_except(b, group, -2); /* all frozen: no effect on the optimizers made */
    const double base_lr = fsdp_optimizer_lr(grouped);
    int mismatches = 0;
    for (int step = 0; step < 6; step++) {
        double lr = base_lr * (step < 3 ? 1.0 : 0.37 / step); /* a schedule */
        fsdp_optimizer_set_lr(grouped, lr);
        for (int g = 0; g <= c->n_groups; g++) {
            double init = c->kind ? c->sep_adam[g].lr : c->sep_sgd[g].lr;
            bool own = g > 0 && c->groups[g - 1].lr.set;
            fsdp_optimizer_set_lr(sep[g], own ? init * (lr / base_lr) : lr);
        }
        for (int p = 0; p < N_GROUP_PARAMS; p++) {
            fsdp_param *pa = fsdp_module_get_param(a, group_params[p]);
            fsdp_tensor *g = fsdp_test_random(fsdp_tensor_ndim(fsdp_param_grad(pa)),
                                              fsdp_tensor_shape(fsdp_param_grad(pa)), -2.0f, 2.0f,
                                              100 + 10 * (uint64_t)step + (uint64_t)p);
            FSDP_TEST_OK(fsdp_tensor_copy(ctx, fsdp_param_grad(pa), g));
            FSDP_TEST_OK(fsdp_tensor_copy(
                ctx, fsdp_param_grad(fsdp_module_get_param(b, group_params[p])), g));
            fsdp_tensor_free(g);
        }
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, grouped));
        for (int g = 0; g <= c->n_groups; g++) FSDP_TEST_OK(fsdp_optimizer_step(ctx, sep[g]));
        for (int p = 0; p < N_GROUP_PARAMS; p++)
            mismatches += !same_bits(fsdp_param_data(fsdp_module_get_param(a, group_params[p])),
                                     fsdp_param_data(fsdp_module_get_param(b, group_params[p])));
    }
    CU_ASSERT_EQUAL(mismatches, 0);
    /* The same states, by name and kind, with the same bits. */
    int total = 0;
    for (int g = 0; g <= c->n_groups; g++) total += fsdp_optimizer_num_states(sep[g]);
    CU_ASSERT_EQUAL(fsdp_optimizer_num_states(grouped), total);
    for (int i = 0; i < fsdp_optimizer_num_states(grouped); i++) {
        fsdp_optim_state s, t;
        FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, grouped, i, &s));
        bool found = false;
        for (int g = 0; g <= c->n_groups && !found; g++)
            for (int j = 0; j < fsdp_optimizer_num_states(sep[g]) && !found; j++) {
                FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, sep[g], j, &t));
                found = strcmp(s.param_name, t.param_name) == 0 && s.kind == t.kind;
            }
        CU_ASSERT_TRUE(found && same_bits(s.value, t.value) && s.step == t.step);
    }
    printf("\n    %s: %d states, %d parameter mismatches over 6 steps", c->name,
           fsdp_optimizer_num_states(grouped), mismatches);
    fsdp_optimizer_free(grouped);
    for (int g = 0; g <= c->n_groups; g++) fsdp_optimizer_free(sep[g]);
    fsdp_module_free(a);
    fsdp_module_free(b);
}

static void test_groups_vs_separate(void) {
    static const fsdp_param_group sgd_g[] = {
        {.pattern = "*.bias", .weight_decay = FSDP_OVERRIDE(0.0), .momentum = FSDP_OVERRIDE(0.0)},
        {.pattern = "norm.*", .lr = FSDP_OVERRIDE(0.03), .dampening = FSDP_OVERRIDE(0.25)},
        {.pattern = "net2.weight",
         .weight_decay = FSDP_OVERRIDE(0.05),
         .momentum = FSDP_OVERRIDE(0.5)},
    };
    group_case sgd = {
        .name = "sgd momentum",
        .kind = 0,
        .sgd = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01},
        .groups = sgd_g,
        .n_groups = 3,
        .sep_sgd = {{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01},
                    {.lr = 0.1, .weight_decay = 0.0},
                    {.lr = 0.03, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.01},
                    {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.05}},
    };
    run_groups_vs_separate(&sgd);
    static const fsdp_param_group adam_g[] = {
        {.pattern = "*.bias", .weight_decay = FSDP_OVERRIDE(0.0), .lr = FSDP_OVERRIDE(0.02)},
        {.pattern = "net*",
         .beta1 = FSDP_OVERRIDE(0.5),
         .beta2 = FSDP_OVERRIDE(0.9),
         .eps = FSDP_OVERRIDE(1e-5)},
    };
    for (int kind = 1; kind <= 2; kind++) {
        group_case adam = {
            .name = kind == 1 ? "adam amsgrad" : "adamw amsgrad",
            .kind = kind,
            .adam = {.lr = 0.01, .weight_decay = 0.1, .amsgrad = true},
            .groups = adam_g,
            .n_groups = 2,
            .sep_adam = {{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true},
                         {.lr = 0.02, .amsgrad = true},
                         {.lr = 0.01,
                          .weight_decay = 0.1,
                          .beta1 = 0.5,
                          .beta2 = 0.9,
                          .eps = 1e-5,
                          .amsgrad = true}},
        };
        run_groups_vs_separate(&adam);
    }
}

/* A group with lr 0 leaves its parameters as they are while its state still moves, as in
 * PyTorch; set_lr keeps it at 0. */
static void test_groups_frozen_lr(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(group_model(ctx, 2, &m));
    fsdp_param_group frozen[] = {{.pattern = "norm.*", .lr = FSDP_OVERRIDE(0.0)}};
    fsdp_optimizer *opt;
    FSDP_TEST_OK(fsdp_sgd_create(
        ctx, m,
        &(fsdp_sgd_options){
            .lr = 0.1, .momentum = 0.9, .param_groups = frozen, .n_param_groups = 1},
        &opt));
    frozen[0].pattern = "changed after creation: not read again";
    fsdp_param *norm = fsdp_module_get_param(m, "norm.weight"),
               *w = fsdp_module_get_param(m, "net1.weight");
    fsdp_tensor *norm0 = NULL, *w0 = NULL;
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, fsdp_param_data(norm), &norm0));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, norm0, fsdp_param_data(norm)));
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, fsdp_param_data(w), &w0));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, w0, fsdp_param_data(w)));
    for (int p = 0; p < N_GROUP_PARAMS; p++)
        FSDP_TEST_OK(fsdp_tensor_fill(
            ctx, fsdp_param_grad(fsdp_module_get_param(m, group_params[p])), 1.0f));
    fsdp_optimizer_set_lr(opt, 0.2);
    CU_ASSERT_EQUAL(fsdp_optimizer_group_lr(opt, 0), 0.0);
    CU_ASSERT_EQUAL(fsdp_optimizer_group_lr(opt, FSDP_OPTIM_NO_GROUP), 0.2);
    CU_ASSERT_EQUAL(fsdp_optimizer_lr(opt), 0.2);
    CU_ASSERT_TRUE(isnan(fsdp_optimizer_group_lr(opt, 1)));
    CU_ASSERT_TRUE(isnan(fsdp_optimizer_group_lr(opt, -2)));
    FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
    CU_ASSERT_TRUE(same_bits(fsdp_param_data(norm), norm0));
    CU_ASSERT_FALSE(same_bits(fsdp_param_data(w), w0));
    fsdp_optim_state s;
    FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt, 2, &s)); /* net1.weight, net1.bias, norm */
    CU_ASSERT_STRING_EQUAL(s.param_name, "norm.weight");
    CU_ASSERT_EQUAL(fsdp_tensor_f32(s.value)[0], 1.0f); /* the buffer took the gradient */
    fsdp_tensor_free(norm0);
    fsdp_tensor_free(w0);
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
}

static void test_groups_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m, *big;
    fsdp_optimizer *opt = NULL;
    FSDP_TEST_OK(group_model(ctx, 3, &m));
    /* A pattern that matches nothing names itself and lists the parameters. */
    fsdp_param_group none[] = {{.pattern = "*.bias", .weight_decay = FSDP_OVERRIDE(0.0)},
                               {.pattern = "layers.*", .lr = FSDP_OVERRIDE(0.5)}};
    FSDP_TEST_FAILS(fsdp_adamw_create(
                        ctx, m,
                        &(fsdp_adam_options){.lr = 1e-3, .param_groups = none, .n_param_groups = 2},
                        &opt),
                    FSDP_ERR_INVALID_ARGUMENT, "param_groups[1]", "'layers.*'",
                    "matches no trainable parameter",
                    "net1.weight, net1.bias, norm.weight, net2.weight, net2.bias");
    /* Every parameter it matches went to an earlier group: first match wins. */
    fsdp_param_group shadowed[] = {{.pattern = "net*", .lr = FSDP_OVERRIDE(0.5)},
                                   {.pattern = "net1.*", .lr = FSDP_OVERRIDE(0.2)}};
    FSDP_TEST_FAILS(
        fsdp_sgd_create(
            ctx, m, &(fsdp_sgd_options){.lr = 0.1, .param_groups = shadowed, .n_param_groups = 2},
            &opt),
        FSDP_ERR_INVALID_ARGUMENT, "param_groups[1]", "'net1.*' gets no parameter", "'net1.weight'",
        "param_groups[0], 'net*'");
    /* Fields of the other optimizer, bad values, missing patterns and arrays. */
    fsdp_param_group mom[] = {{.pattern = "*", .momentum = FSDP_OVERRIDE(0.9)}};
    FSDP_TEST_FAILS(
        fsdp_adam_create(ctx, m,
                         &(fsdp_adam_options){.lr = 1e-3, .param_groups = mom, .n_param_groups = 1},
                         &opt),
        FSDP_ERR_INVALID_ARGUMENT, "Adam param_groups[0] ('*')",
        "momentum is not an option of Adam");
    fsdp_param_group eps[] = {{.pattern = "*", .eps = FSDP_OVERRIDE(1e-6)}};
    FSDP_TEST_FAILS(
        fsdp_sgd_create(
            ctx, m, &(fsdp_sgd_options){.lr = 0.1, .param_groups = eps, .n_param_groups = 1}, &opt),
        FSDP_ERR_INVALID_ARGUMENT, "eps is not an option of SGD");
    fsdp_param_group neg[] = {{.pattern = "norm.*", .weight_decay = FSDP_OVERRIDE(-1.0)}};
    FSDP_TEST_FAILS(
        fsdp_adamw_create(
            ctx, m, &(fsdp_adam_options){.lr = 1e-3, .param_groups = neg, .n_param_groups = 1},
            &opt),
        FSDP_ERR_INVALID_ARGUMENT, "AdamW param_groups[0] ('norm.*')", "weight_decay -1");
    fsdp_param_group beta[] = {{.pattern = "norm.*", .beta2 = FSDP_OVERRIDE(1.0)}};
    FSDP_TEST_FAILS(fsdp_adam_create(
                        ctx, m,
                        &(fsdp_adam_options){.lr = 1e-3, .param_groups = beta, .n_param_groups = 1},
                        &opt),
                    FSDP_ERR_INVALID_ARGUMENT, "betas (0.9, 1)");
    fsdp_param_group nest[] = {{.pattern = "*.bias", .dampening = FSDP_OVERRIDE(0.1)}};
    FSDP_TEST_FAILS(fsdp_sgd_create(ctx, m,
                                    &(fsdp_sgd_options){.lr = 0.1,
                                                        .momentum = 0.9,
                                                        .nesterov = true,
                                                        .param_groups = nest,
                                                        .n_param_groups = 1},
                                    &opt),
                    FSDP_ERR_INVALID_ARGUMENT, "('*.bias')", "nesterov");
    fsdp_param_group nopat[] = {{.lr = FSDP_OVERRIDE(0.1)}};
    FSDP_TEST_FAILS(
        fsdp_sgd_create(ctx, m,
                        &(fsdp_sgd_options){.lr = 0.1, .param_groups = nopat, .n_param_groups = 1},
                        &opt),
        FSDP_ERR_INVALID_ARGUMENT, "param_groups[0]: pattern is NULL");
    FSDP_TEST_FAILS(
        fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.1, .n_param_groups = 2}, &opt),
        FSDP_ERR_INVALID_ARGUMENT, "n_param_groups is 2");
    CU_ASSERT_PTR_NULL(opt);
    /* Unknown names in fsdp_optimizer_param_group; a long list is cut after eight names. */
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 3, &big));
    const fsdp_param_group gamma[] = {{.pattern = "*.gamma", .weight_decay = FSDP_OVERRIDE(0.0)}};
    FSDP_TEST_FAILS(
        fsdp_sgd_create(ctx, big,
                        &(fsdp_sgd_options){.lr = 0.1, .param_groups = gamma, .n_param_groups = 1},
                        &opt),
        FSDP_ERR_INVALID_ARGUMENT, "'*.gamma' matches no", "layers.0.net1.weight, ",
        "layers.1.net2.bias, ... (12 in all)");
    FSDP_TEST_OK(fsdp_sgd_create(ctx, big, &(fsdp_sgd_options){.lr = 0.1}, &opt));
    int g = 7;
    FSDP_TEST_OK(fsdp_optimizer_param_group(ctx, opt, "layers.2.net2.bias", &g));
    CU_ASSERT_EQUAL(g, FSDP_OPTIM_NO_GROUP);
    CU_ASSERT_EQUAL(fsdp_optimizer_num_groups(opt), 0);
    FSDP_TEST_FAILS(fsdp_optimizer_param_group(ctx, opt, "layers.3.net1.weight", &g),
                    FSDP_ERR_INVALID_ARGUMENT, "no trainable parameter 'layers.3.net1.weight'",
                    "layers.0.net1.weight");
    fsdp_optimizer_free(opt);
    fsdp_module_free(big);
    fsdp_module_free(m);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"sgd", test_sgd},
        {"sgd_momentum", test_sgd_momentum},
        {"sgd_dampening", test_sgd_dampening},
        {"sgd_nesterov", test_sgd_nesterov},
        {"sgd_maximize", test_sgd_maximize},
        {"adam", test_adam},
        {"adam_weight_decay", test_adam_weight_decay},
        {"adam_amsgrad", test_adam_amsgrad},
        {"adam_maximize", test_adam_maximize},
        {"adamw", test_adamw},
        {"adamw_amsgrad", test_adamw_amsgrad},
        {"bad_options", test_bad_options},
        {"clip_norm2", test_clip_norm2},
        {"clip_norm_inf", test_clip_norm_inf},
        {"clip_norm2_unclipped", test_clip_norm2_unclipped},
        {"clip_errors", test_clip_errors},
        {"lr_schedules", test_lr_schedules},
        {"groups_sgd", test_groups_sgd},
        {"groups_adamw", test_groups_adamw},
        {"groups_vs_separate", test_groups_vs_separate},
        {"groups_frozen_lr", test_groups_frozen_lr},
        {"groups_errors", test_groups_errors},
    };
    return fsdp_test_run(argc, argv, "optim", cases, sizeof cases / sizeof cases[0]);
}

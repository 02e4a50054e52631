/* test_optim.c: SGD, Adam and AdamW against 20-step PyTorch trajectories
 * (tests/fixtures/optim_*.bin): the same starting parameters and per-step gradients, and the
 * parameters after every step compared at rtol 1e-6; the options come from the fixture, as
 * PyTorch held them. Also gradient clipping against clip_grad_norm_, and LR schedules. */
#include <math.h>
#include <string.h>

#include "fixture.h"
#include "harness.h"

#define STEPS 20
#define RTOL  1e-6
#define ATOL  1e-7

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
    };
    return fsdp_test_run(argc, argv, "optim", cases, sizeof cases / sizeof cases[0]);
}

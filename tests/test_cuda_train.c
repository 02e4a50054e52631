/* test_cuda_train.c: the single-device training path end to end, on cuda:0 where a GPU is
 * usable and on sim:0 (the simulated GPU) otherwise, against the CPU run of the same model: an
 * MLP built and initialised on the CPU, moved with fsdp_module_to, trained with MSE and each
 * optimizer (SGD with momentum and Nesterov, Adam, AdamW); the per-step losses and the final
 * parameters must equal the CPU run's, bit for bit on sim (it runs the CPU's kernels) and to
 * f32 rounding on CUDA (the GPU sums in another order). Cross-entropy and the sum loss are
 * checked the same way. */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "on_device.h" // defines: fsdp_test_device, fsdp_test_device_close

#define STEPS 6

static fsdp_device dev(void) {
    return fsdp_test_device();
}

/* A copy of t on `device`. */
static fsdp_tensor *on(const fsdp_tensor *t, fsdp_device device) {
    fsdp_tensor *c;
    FSDP_TEST_OK(fsdp_tensor_create(fsdp_test_ctx(), fsdp_tensor_dtype(t), device,
                                    fsdp_tensor_ndim(t), fsdp_tensor_shape(t), &c));
    FSDP_TEST_OK(fsdp_tensor_copy(fsdp_test_ctx(), c, t));
    return c;
}

typedef enum optim_kind { OPT_SGD, OPT_ADAM, OPT_ADAMW } optim_kind;

static fsdp_optimizer *make_optimizer(fsdp_module *m, optim_kind kind) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_optimizer *opt = NULL;
    if (kind == OPT_SGD)
        FSDP_TEST_OK(fsdp_sgd_create(
            ctx, m,
            &(fsdp_sgd_options){
                .lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3},
            &opt));
    else if (kind == OPT_ADAM)
        FSDP_TEST_OK(
            fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 1e-2, .amsgrad = true}, &opt));
    else
        FSDP_TEST_OK(
            fsdp_adamw_create(ctx, m, &(fsdp_adam_options){.lr = 1e-2, .weight_decay = 0.1}, &opt));
    return opt;
}

/* Trains an MLP (13-37-29-7, GELU) for STEPS steps on `device`; losses[s] per step and the
 * model (on the CPU again) for the caller to compare and free. */
static fsdp_module *train(fsdp_device device, optim_kind kind, float *losses) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp(ctx, 4, (int64_t[]){13, 37, 29, 7}, FSDP_ACT_GELU, &m));
    FSDP_TEST_OK(fsdp_module_to(ctx, m, device));
    fsdp_optimizer *opt = make_optimizer(m, kind);
    fsdp_tensor *xh = fsdp_test_random(2, (int64_t[]){33, 13}, -1, 1, 7);
    fsdp_tensor *yh = fsdp_test_random(2, (int64_t[]){33, 7}, -1, 1, 8);
    fsdp_tensor *x = on(xh, device), *y = on(yh, device), *dout;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, device, 2, (int64_t[]){33, 7}, &dout));
    for (int s = 0; s < STEPS; s++) {
        const fsdp_tensor *out;
        FSDP_TEST_OK(fsdp_optimizer_zero_grad(ctx, opt));
        FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &out));
        FSDP_TEST_OK(fsdp_loss_mse(ctx, out, y, &losses[s], dout));
        FSDP_TEST_OK(fsdp_module_backward(ctx, m, dout, NULL));
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
    }
    FSDP_TEST_OK(fsdp_module_to(ctx, m, FSDP_CPU));
    fsdp_optimizer_free(opt);
    fsdp_tensor_free(xh);
    fsdp_tensor_free(yh);
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    fsdp_tensor_free(dout);
    return m;
}

typedef struct compare_args {
    fsdp_module *want;
    int compared;
} compare_args;

static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    compare_args *a = user;
    fsdp_param *w = fsdp_module_get_param(a->want, name);
    FSDP_RANK_CHECK(ctx, w, "no parameter %s in the CPU model", name);
    a->compared++;
    fsdp_tensor *got = fsdp_param_data(p), *want = fsdp_param_data(w);
    if (fsdp_test_device_is_cuda()) // the tolerances are for GPU arithmetic
        return fsdp_test_rank_close(ctx, name, got, want, 1e-4, 1e-6, NULL);
    FSDP_RANK_CHECK(ctx, fsdp_tensor_same_shape(got, want), "%s: shapes differ", name);
    FSDP_RANK_CHECK(ctx,
                    !memcmp(fsdp_tensor_data(got), fsdp_tensor_data(want), fsdp_tensor_nbytes(got)),
                    "%s: not bitwise equal to the CPU run's", name);
    return FSDP_OK;
}

static void check_training(optim_kind kind) {
    float cpu_losses[STEPS], dev_losses[STEPS];
    fsdp_module *cpu = train(FSDP_CPU, kind, cpu_losses);
    fsdp_module *on_dev = train(dev(), kind, dev_losses);
    CU_ASSERT_TRUE(fsdp_test_device_close("losses", dev_losses, cpu_losses, STEPS, 1e-5, 1e-7));
    CU_ASSERT_TRUE(cpu_losses[STEPS - 1] < cpu_losses[0]); /* it trained */
    compare_args a = {.want = cpu};
    FSDP_TEST_OK(fsdp_module_visit_params(fsdp_test_ctx(), on_dev, compare_param, &a));
    CU_ASSERT_EQUAL(a.compared, 6);
    fsdp_module_free(cpu);
    fsdp_module_free(on_dev);
}

static void test_sgd_nesterov(void) {
    check_training(OPT_SGD);
}
static void test_adam_amsgrad(void) {
    check_training(OPT_ADAM);
}
static void test_adamw(void) {
    check_training(OPT_ADAMW);
}

/* Cross-entropy (targets on the host) and the sum loss on the device equal the CPU's. */
static void test_losses(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *lh = fsdp_test_random(2, (int64_t[]){17, 11}, -30, 30, 3);
    fsdp_tensor *l = on(lh, dev()), *dh, *dd, *dback;
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, lh, &dh));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev(), 2, (int64_t[]){17, 11}, &dd));
    int32_t targets[17];
    for (int i = 0; i < 17; i++) targets[i] = (i * 5) % 11;
    float want, got;
    FSDP_TEST_OK(fsdp_loss_cross_entropy(ctx, lh, targets, &want, dh));
    FSDP_TEST_OK(fsdp_loss_cross_entropy(ctx, l, targets, &got, dd));
    CU_ASSERT_TRUE(fsdp_test_device_close("cross-entropy", &got, &want, 1, 1e-5, 1e-7));
    dback = on(dd, FSDP_CPU);
    CU_ASSERT_TRUE(fsdp_test_device_close("d logits", fsdp_tensor_f32(dback), fsdp_tensor_f32(dh),
                                          17 * 11, 1e-5, 1e-7));
    FSDP_TEST_OK(fsdp_loss_sum(ctx, lh, &want, NULL));
    FSDP_TEST_OK(fsdp_loss_sum(ctx, l, &got, NULL));
    CU_ASSERT_TRUE(fsdp_test_device_close("sum", &got, &want, 1, 1e-5, 1e-4));
    fsdp_tensor_free(lh);
    fsdp_tensor_free(l);
    fsdp_tensor_free(dh);
    fsdp_tensor_free(dd);
    fsdp_tensor_free(dback);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"sgd_nesterov", test_sgd_nesterov},
        {"adam_amsgrad", test_adam_amsgrad},
        {"adamw", test_adamw},
        {"losses", test_losses},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "cuda_train", cases, sizeof cases / sizeof cases[0]);
}

/* test_optim_multi.c: the optimizer's multi-tensor Adam/AdamW step and zero_grad (one
 * adam_update_multi / fill_multi call per run of slots of one device and param group) against
 * the per-tensor path (fsdp_optimizer_test_per_tensor), bit for bit, on the CPU and on the run's
 * device (sim here): 70 parameters of odd sizes (0 and 1 elements among them) in two param
 * groups that interleave, Adam and AdamW, amsgrad on and off, maximize, weight decay, four
 * steps; each step's parameters and every state compared, and on a GPU kind the launches of a
 * step counted: one per chunk of each run. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx, FSDP_TEST_OK
#include "kernels/kernels.h" // defines: fsdp_kernels_counts, FSDP_ADAM_MULTI_CHUNK
#include "on_device.h"       // defines: fsdp_test_device
#include "optim/update.h"    // defines: fsdp_optimizer_test_per_tensor

#define PARAMS 70
#define STEPS  4

static int64_t param_size(int i) {
    return i % 9 == 0 ? 0 : i % 5 == 1 ? 1 : 17 * i + 3;
}

/* A root with PARAMS parameters p0 .. p69, drawn from seed 7, on dev. */
static fsdp_module *make_model(fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &m));
    for (int i = 0; i < PARAMS; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        int64_t n = param_size(i);
        FSDP_TEST_OK(fsdp_module_add_param(ctx, m, name, 1, &n,
                                           (fsdp_init){FSDP_INIT_UNIFORM, -1.0f, 1.0f}, NULL));
    }
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, 7));
    FSDP_TEST_OK(fsdp_module_to(ctx, m, dev));
    return m;
}

/* t's elements, copied to the host (n floats at most). */
static void to_host(const fsdp_tensor *t, float *out) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    int64_t n = fsdp_tensor_numel(t);
    if (n == 0) return;
    fsdp_tensor *h;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, h, t));
    memcpy(out, fsdp_tensor_f32(h), (size_t)n * sizeof *out);
    fsdp_tensor_free(h);
}

/* Every gradient of m set to the step's values (the same in both models), or to 1.5 (fill). */
static void set_grads(fsdp_module *m, int step, bool fill) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int i = 0; i < PARAMS; i++) {
        fsdp_tensor *g = fsdp_param_grad(fsdp_module_param(m, i));
        int64_t n = fsdp_tensor_numel(g);
        if (n == 0) continue;
        fsdp_tensor *h;
        FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &h));
        float *x = fsdp_tensor_f32(h);
        for (int64_t j = 0; j < n; j++)
            x[j] = fill ? 1.5f : (float)((j * 7 + i * 13 + step * 5) % 23) / 11.0f - 1.0f;
        FSDP_TEST_OK(fsdp_tensor_copy(ctx, g, h));
        fsdp_tensor_free(h);
    }
}

/* Elements of a and b (one tensor each) whose bits differ. */
static int64_t differ(const fsdp_tensor *a, const fsdp_tensor *b) {
    static float x[PARAMS * 17 + 8], y[PARAMS * 17 + 8];
    int64_t n = fsdp_tensor_numel(a), bad = 0;
    CU_ASSERT_EQUAL_FATAL(n, fsdp_tensor_numel(b));
    to_host(a, x), to_host(b, y);
    for (int64_t j = 0; j < n; j++) bad += memcmp(&x[j], &y[j], sizeof x[j]) != 0;
    return bad;
}

/* The launches a multi-tensor step takes: per run of non-empty slots of one group, one per
 * chunk of FSDP_ADAM_MULTI_CHUNK. */
static int64_t expected_launches(const int *group) {
    int64_t launches = 0;
    int run = 0, last = -2;
    for (int i = 0; i <= PARAMS; i++) {
        if (i < PARAMS && param_size(i) == 0) continue;
        if (i == PARAMS || group[i] != last) {
            launches += (run + FSDP_ADAM_MULTI_CHUNK - 1) / FSDP_ADAM_MULTI_CHUNK;
            run = 0;
        }
        if (i < PARAMS) last = group[i], run++;
    }
    return launches;
}

static void run_case(fsdp_device dev, bool adamw, bool amsgrad, bool maximize) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m[2] = {make_model(dev), make_model(dev)}; /* [0] multi, [1] per tensor */
    fsdp_param_group groups[] = {
        {.pattern = "p1*", .lr = FSDP_OVERRIDE(3e-3), .weight_decay = FSDP_OVERRIDE(0.2)}};
    fsdp_adam_options o = {.lr = 1e-3,
                           .weight_decay = 0.05,
                           .amsgrad = amsgrad,
                           .maximize = maximize,
                           .param_groups = groups,
                           .n_param_groups = 1};
    fsdp_optimizer *opt[2];
    for (int k = 0; k < 2; k++)
        FSDP_TEST_OK(adamw ? fsdp_adamw_create(ctx, m[k], &o, &opt[k])
                           : fsdp_adam_create(ctx, m[k], &o, &opt[k]));
    int group[PARAMS];
    for (int i = 0; i < PARAMS; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        FSDP_TEST_OK(fsdp_optimizer_param_group(ctx, opt[0], name, &group[i]));
    }
    int64_t bad_zero = 0, bad_param = 0, bad_state = 0, launches = 0;
    for (int step = 1; step <= STEPS; step++) {
        for (int k = 0; k < 2; k++) {
            set_grads(m[k], step, true);
            fsdp_optimizer_test_per_tensor(k == 1);
            FSDP_TEST_OK(fsdp_optimizer_zero_grad(ctx, opt[k]));
            fsdp_optimizer_test_per_tensor(false);
        }
        for (int i = 0; i < PARAMS; i++) {
            fsdp_tensor *g = fsdp_param_grad(fsdp_module_param(m[0], i));
            static float z[PARAMS * 17 + 8];
            to_host(g, z);
            for (int64_t j = 0; j < fsdp_tensor_numel(g); j++) bad_zero += z[j] != 0.0f;
        }
        for (int k = 0; k < 2; k++) {
            set_grads(m[k], step, false);
            fsdp_optimizer_test_per_tensor(k == 1);
            fsdp_launch_counts c0 = fsdp_kernels_counts(dev);
            FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt[k]));
            if (k == 0) launches += fsdp_kernels_counts(dev).launches - c0.launches;
            fsdp_optimizer_test_per_tensor(false);
        }
        for (int i = 0; i < PARAMS; i++)
            bad_param += differ(fsdp_param_data(fsdp_module_param(m[0], i)),
                                fsdp_param_data(fsdp_module_param(m[1], i)));
    }
    int n_states = fsdp_optimizer_num_states(opt[0]);
    CU_ASSERT_EQUAL(n_states, PARAMS * (amsgrad ? 3 : 2));
    for (int s = 0; s < n_states; s++) {
        fsdp_optim_state a, b;
        FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt[0], s, &a));
        FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt[1], s, &b));
        bad_state += differ(a.value, b.value);
    }
    bool gpu = dev.type != FSDP_DEVICE_CPU;
    int64_t want = gpu ? STEPS * expected_launches(group) : 0;
    printf("\n    %s:%d %s%s%s: %lld parameter and %lld state elements unlike the per-tensor "
           "path, %lld gradients not zeroed; %lld launches in %d steps (%lld expected)",
           fsdp_device_to_string(dev), dev.index, adamw ? "AdamW" : "Adam",
           amsgrad ? " amsgrad" : "", maximize ? " maximize" : "", (long long)bad_param,
           (long long)bad_state, (long long)bad_zero, (long long)launches, STEPS, (long long)want);
    CU_ASSERT_EQUAL(bad_param, 0);
    CU_ASSERT_EQUAL(bad_state, 0);
    CU_ASSERT_EQUAL(bad_zero, 0);
    CU_ASSERT_EQUAL(launches, want);
    for (int k = 0; k < 2; k++) fsdp_optimizer_free(opt[k]), fsdp_module_free(m[k]);
}

/* An optimizer made (and stepped once) while the model was on the CPU, the model then moved
 * to dev: its state follows the parameters at the next step, values kept, and the three steps
 * after the move give the bits of a model that stayed on the CPU (on a GPU within 1e-6: each
 * step moves a parameter by at most lr (1 + weight_decay) = 1.05e-3, and a GPU's fused
 * multiply-adds may round that update differently by some 1e-7 of it); every state ends on
 * dev. */
static void test_state_follows_a_move(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_device dev = fsdp_test_device();
    fsdp_module *m[2] = {make_model(FSDP_CPU), make_model(FSDP_CPU)}; /* [0] moves */
    fsdp_adam_options o = {.lr = 1e-3, .weight_decay = 0.05, .amsgrad = true};
    fsdp_optimizer *opt[2];
    for (int k = 0; k < 2; k++) FSDP_TEST_OK(fsdp_adamw_create(ctx, m[k], &o, &opt[k]));
    bool exact = dev.type != FSDP_DEVICE_CUDA;
    double worst = 0;
    int64_t bad = 0;
    for (int step = 1; step <= STEPS; step++) {
        if (step == 2) FSDP_TEST_OK(fsdp_module_to(ctx, m[0], dev));
        for (int k = 0; k < 2; k++) {
            set_grads(m[k], step, false);
            FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt[k]));
        }
    }
    for (int i = 0; i < PARAMS; i++) {
        static float x[PARAMS * 17 + 8], y[PARAMS * 17 + 8];
        const fsdp_tensor *a = fsdp_param_data(fsdp_module_param(m[0], i));
        to_host(a, x), to_host(fsdp_param_data(fsdp_module_param(m[1], i)), y);
        for (int64_t j = 0; j < fsdp_tensor_numel(a); j++) {
            double d = fabs((double)x[j] - y[j]);
            worst = d > worst ? d : worst;
            bad += exact ? memcmp(&x[j], &y[j], 4) != 0 : !(d <= 1e-6);
        }
    }
    int on_dev = 0, n_states = fsdp_optimizer_num_states(opt[0]);
    for (int s = 0; s < n_states; s++) {
        fsdp_optim_state a, b;
        FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt[0], s, &a));
        FSDP_TEST_OK(fsdp_optimizer_get_state(ctx, opt[1], s, &b));
        fsdp_device at = fsdp_tensor_device(a.value);
        on_dev += at.type == dev.type && at.index == dev.index;
        if (exact) bad += differ(a.value, b.value);
    }
    printf("\n    AdamW amsgrad, moved to %s:%d after step 1: %lld elements unlike the model that "
           "stayed (largest parameter difference %.3g); %d of %d states on the device",
           fsdp_device_to_string(dev), dev.index, (long long)bad, worst, on_dev, n_states);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(on_dev, n_states);
    for (int k = 0; k < 2; k++) fsdp_optimizer_free(opt[k]), fsdp_module_free(m[k]);
}

static void run_all(fsdp_device dev) {
    run_case(dev, false, false, false);
    run_case(dev, false, true, true);
    run_case(dev, true, false, true);
    run_case(dev, true, true, false);
}

static void test_cpu(void) {
    run_all(FSDP_CPU);
}

static void test_device(void) {
    run_all(fsdp_test_device());
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {{"cpu", test_cpu},
                                           {"device", test_device},
                                           {"state_follows_a_move", test_state_follows_a_move}};
    return fsdp_test_run(argc, argv, "optim_multi", cases, sizeof cases / sizeof cases[0]);
}

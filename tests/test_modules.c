/* test_modules.c: the module tree (names, fully qualified names, PyTorch's parameter order),
 * hooks (order, replacement, scope and phase), backward against finite differences,
 * gradient accumulation, layout-independent initialisation, buffer reuse across steps,
 * Linear on the fused GEMM entries bit for bit the separate ones (CPU and sim, f32 and bf16), and
 * SGD's update equations. Layer numerics against PyTorch live in test_fixtures.c. */
#include <math.h>
#include <string.h>

#include "core/ctx_impl.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "harness.h"
#include "kernels/kernels.h" // defines: fsdp_kernels_cpu
#include "nn/nn.h" // defines: fsdp_nn_linear_can_give_bf16_output, fsdp_nn_linear_can_leave_dx_unrounded

typedef struct names {
    int n;
    char list[32][64];
} names;

static fsdp_status collect_name(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)p;
    names *ns = user;
    snprintf(ns->list[ns->n++], sizeof ns->list[0], "%s", name);
    return FSDP_OK;
}

static void expect_names(fsdp_module *m, const char *const *want, int n) {
    names got = {0};
    FSDP_TEST_OK(fsdp_module_visit_params(fsdp_test_ctx(), m, collect_name, &got));
    CU_ASSERT_EQUAL_FATAL(got.n, n);
    for (int i = 0; i < n; i++) {
        if (strcmp(got.list[i], want[i]) != 0)
            fprintf(stderr, "\n  parameter %d: got %s want %s", i, got.list[i], want[i]);
        CU_ASSERT_STRING_EQUAL(got.list[i], want[i]);
    }
}

static void test_seed_model_names(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &m));
    static const char *const stacked[] = {
        "layers.0.net1.weight", "layers.0.net1.bias", "layers.0.net2.weight", "layers.0.net2.bias",
        "layers.1.net1.weight", "layers.1.net1.bias", "layers.1.net2.weight", "layers.1.net2.bias"};
    expect_names(m, stacked, 8);
    fsdp_module *net1 = fsdp_module_find(m, "layers.1.net1");
    CU_ASSERT_PTR_NOT_NULL_FATAL(net1);
    CU_ASSERT_STRING_EQUAL(fsdp_module_fqn(net1), "layers.1.net1");
    CU_ASSERT_STRING_EQUAL(fsdp_module_name(net1), "net1");
    CU_ASSERT_STRING_EQUAL(fsdp_module_kind(net1), "Linear");
    CU_ASSERT_STRING_EQUAL(fsdp_module_kind(fsdp_module_find(m, "layers.0.relu")), "ReLU");
    CU_ASSERT_PTR_NULL(fsdp_module_find(m, "layers.2"));
    CU_ASSERT_PTR_EQUAL(fsdp_module_find(m, ""), m);
    CU_ASSERT_EQUAL(fsdp_module_param_count(m), 2 * (10 * 16 + 16 + 16 * 10 + 10));
    /* names relative to a subtree */
    static const char *const sub[] = {"net1.weight", "net1.bias", "net2.weight", "net2.bias"};
    expect_names(fsdp_module_find(m, "layers.1"), sub, 4);
    fsdp_param *p = fsdp_module_get_param(m, "layers.0.net2.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(fsdp_param_data(p), 0), 10);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(fsdp_param_data(p), 1), 16);
    CU_ASSERT_PTR_NULL(fsdp_module_get_param(m, "layers.0.net3.weight"));
    fsdp_module_free(m);

    FSDP_TEST_OK(fsdp_model_simple_model(ctx, &m));
    static const char *const simple[] = {"net1.weight", "net1.bias",   "net2.weight",
                                         "net2.bias",   "net3.weight", "net3.bias"};
    expect_names(m, simple, 6);
    fsdp_module_free(m);
    FSDP_TEST_OK(fsdp_model_net(ctx, 8, &m));
    static const char *const net[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                      "fc3.weight", "fc3.bias", "fc4.weight", "fc4.bias"};
    expect_names(m, net, 8);
    fsdp_module_free(m);
    FSDP_TEST_OK(fsdp_model_simple_mlp(ctx, &m));
    CU_ASSERT_STRING_EQUAL(fsdp_module_kind(m), "SimpleMLP");
    CU_ASSERT_EQUAL(fsdp_module_param_count(m), 50 * 32 + 32 + 32 * 8 + 8);
    fsdp_module_free(m);
    FSDP_TEST_OK(fsdp_model_mlp(ctx, 3, (int64_t[]){4, 6, 2}, FSDP_ACT_GELU, &m));
    static const char *const mlp[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    expect_names(m, mlp, 4);
    CU_ASSERT_STRING_EQUAL(fsdp_module_kind(fsdp_module_child(m, 1)), "GELU");
    fsdp_module_free(m);
}

static void test_tree_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *root, *a, *b, *c;
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &root));
    FSDP_TEST_OK(fsdp_relu_create(ctx, &a));
    FSDP_TEST_OK(fsdp_module_add_child(ctx, root, "act", a));
    FSDP_TEST_OK(fsdp_relu_create(ctx, &b));
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, root, "act", b), FSDP_ERR_INVALID_ARGUMENT, "'act'",
                    "already taken");
    FSDP_TEST_OK(fsdp_relu_create(ctx, &c));
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, root, "a.b", c), FSDP_ERR_INVALID_ARGUMENT, "a.b",
                    "letters, digits");
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, root, "again", a), FSDP_ERR_INVALID_ARGUMENT,
                    "already has a parent");
    CU_ASSERT_EQUAL(fsdp_module_num_children(root), 1); /* failed adds changed nothing */
    fsdp_module *lin;
    FSDP_TEST_FAILS(fsdp_linear_create(ctx, 0, 3, true, &lin), FSDP_ERR_INVALID_ARGUMENT,
                    "Linear(0, 3)");
    fsdp_module_free(root); /* b and c were freed by the failing calls: ASan checks */
}

static void test_input_shape_error_names_module(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){3, 7}, -1, 1, 1);
    const fsdp_tensor *y;
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, m, x, &y), FSDP_ERR_SHAPE, "Linear 'net1'", "(3, 7)",
                    "10 features");
    CU_ASSERT_EQUAL(ctx->scope_depth, 0); /* the scope unwinds on failure */
    CU_ASSERT_EQUAL(ctx->phase, FSDP_PHASE_NONE);
    fsdp_tensor_free(x);
    fsdp_module_free(m);
}

/* ---- hooks ---- */

typedef struct hook_log {
    int n;
    char events[32][96];
    fsdp_tensor *replacement; /* when set, a pre-forward hook swaps the input for it */
} hook_log;

static fsdp_status record_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                               const fsdp_tensor **io, void *user) {
    static const char *const point_names[] = {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd"};
    hook_log *log = user;
    snprintf(log->events[log->n++], sizeof log->events[0], "%s:%s scope=%s phase=%d io=%s",
             point_names[point], fsdp_module_fqn(m), fsdp_ctx_scope_top(ctx), (int)ctx->phase,
             *io ? "set" : "null");
    if (point == FSDP_HOOK_PRE_FORWARD && log->replacement) *io = log->replacement;
    return FSDP_OK;
}

static void test_hooks_order_scope_and_replacement(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
    hook_log log = {0};
    fsdp_module *net1 = fsdp_module_find(m, "net1"), *net2 = fsdp_module_find(m, "net2");
    int ids[4];
    for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++) {
        FSDP_TEST_OK(
            fsdp_module_add_hook(ctx, net1, (fsdp_hook_point)p, record_hook, &log, NULL, &ids[p]));
        FSDP_TEST_OK(
            fsdp_module_add_hook(ctx, net2, (fsdp_hook_point)p, record_hook, &log, NULL, NULL));
    }
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){4, 10}, -1, 1, 2);
    fsdp_tensor *dy = fsdp_test_random(2, (int64_t[]){4, 10}, -1, 1, 3);
    const fsdp_tensor *y;
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, NULL)); /* no input grad wanted */
    static const char *const want[] = {
        "pre_fwd:net1 scope=net1 phase=1 io=set", "post_fwd:net1 scope=net1 phase=1 io=set",
        "pre_fwd:net2 scope=net2 phase=1 io=set", "post_fwd:net2 scope=net2 phase=1 io=set",
        "pre_bwd:net2 scope=net2 phase=2 io=set", "post_bwd:net2 scope=net2 phase=2 io=set",
        "pre_bwd:net1 scope=net1 phase=2 io=set", "post_bwd:net1 scope=net1 phase=2 io=null",
    };
    CU_ASSERT_EQUAL_FATAL(log.n, 8);
    for (int i = 0; i < 8; i++) CU_ASSERT_STRING_EQUAL(log.events[i], want[i]);
    CU_ASSERT_EQUAL(ctx->scope_depth, 0);

    /* A pre-forward hook that replaces the input: the layer computes on the replacement. */
    for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++)
        FSDP_TEST_OK(fsdp_module_remove_hook(ctx, net1, ids[p]));
    FSDP_TEST_FAILS(fsdp_module_remove_hook(ctx, net1, ids[0]), FSDP_ERR_NOT_FOUND, "no hook");
    fsdp_tensor *zeros;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){4, 10}, &zeros));
    hook_log swap = {.replacement = zeros};
    FSDP_TEST_OK(
        fsdp_module_add_hook(ctx, net1, FSDP_HOOK_PRE_FORWARD, record_hook, &swap, NULL, NULL));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    /* net1(0) = bias1, so y = net2(relu(bias1)) whatever x was */
    const float *b1 = fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(m, "net1.bias")));
    const float *w2 = fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(m, "net2.weight")));
    const float *b2 = fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(m, "net2.bias")));
    /* a 17-term float32 sum against double: at most gamma_17 sum |terms| (< 1e-6 here) */
    for (int o = 0; o < 10; o++) {
        double acc = b2[o];
        for (int i = 0; i < 16; i++) acc += (double)w2[o * 16 + i] * fmax(b1[i], 0.0);
        CU_ASSERT_DOUBLE_EQUAL(fsdp_tensor_f32(y)[3 * 10 + o], acc, 1e-5);
    }
    fsdp_tensor_free(zeros);
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_module_free(m);
}

/* An observer (fsdp_module_add_observer) runs in order with the hooks and sees what passes, but a
 * replacement it makes is dropped: with the pre-forward swap of the test above as an observer,
 * the output is x's, not the swapped input's. The layers' rules for keeping a tensor in bf16 count
 * acting hooks only: a bf16-policy Linear still gives a bf16 output and leaves its input gradient
 * to its parent with observers at every point, and does not with an acting hook there. */
static void test_observer_hooks(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
    fsdp_module *net1 = fsdp_module_find(m, "net1");
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){4, 10}, -1, 1, 2), *zeros;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){4, 10}, &zeros));
    const fsdp_tensor *y;
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    float plain[40];
    memcpy(plain, fsdp_tensor_f32(y), sizeof plain);
    hook_log swap = {.replacement = zeros};
    int id;
    FSDP_TEST_OK(
        fsdp_module_add_observer(ctx, net1, FSDP_HOOK_PRE_FORWARD, record_hook, &swap, NULL, &id));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    CU_ASSERT_EQUAL(swap.n, 1); /* it ran, and saw the input */
    CU_ASSERT_STRING_EQUAL(swap.events[0], "pre_fwd:net1 scope=net1 phase=1 io=set");
    CU_ASSERT_EQUAL(memcmp(plain, fsdp_tensor_f32(y), sizeof plain), 0);
    FSDP_TEST_OK(fsdp_module_remove_hook(ctx, net1, id));

    fsdp_module *lin;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 10, 6, false, &lin));
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, lin, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_forward(ctx, lin, x, &y)); /* its last forward ran the policy */
    hook_log seen = {0};
    int ids[FSDP_HOOK_POINT_COUNT];
    for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++)
        FSDP_TEST_OK(fsdp_module_add_observer(ctx, lin, (fsdp_hook_point)p, record_hook, &seen,
                                              NULL, &ids[p]));
    CU_ASSERT_TRUE(fsdp_nn_linear_can_give_bf16_output(lin));
    CU_ASSERT_TRUE(fsdp_nn_linear_can_leave_dx_unrounded(lin));
    int acting[2];
    FSDP_TEST_OK(fsdp_module_add_hook(ctx, lin, FSDP_HOOK_POST_FORWARD, record_hook, &seen, NULL,
                                      &acting[0]));
    FSDP_TEST_OK(fsdp_module_add_hook(ctx, lin, FSDP_HOOK_POST_BACKWARD, record_hook, &seen, NULL,
                                      &acting[1]));
    CU_ASSERT_FALSE(fsdp_nn_linear_can_give_bf16_output(lin));
    CU_ASSERT_FALSE(fsdp_nn_linear_can_leave_dx_unrounded(lin));
    FSDP_TEST_FAILS(
        fsdp_module_add_observer(ctx, lin, FSDP_HOOK_POINT_COUNT, record_hook, &seen, NULL, NULL),
        FSDP_ERR_INVALID_ARGUMENT, "fsdp_module_add_observer", "hook point");
    fsdp_module_free(lin);
    fsdp_tensor_free(zeros);
    fsdp_tensor_free(x);
    fsdp_module_free(m);
}

static int freed_count;
static void count_free(void *user) {
    (void)user;
    freed_count++;
}

static fsdp_status failing_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io, (void)user;
    return FSDP_FAIL(ctx, FSDP_ERR_COMM, "hook says no");
}

static void test_hook_failure_and_free(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
    freed_count = 0;
    FSDP_TEST_OK(fsdp_module_add_hook(ctx, fsdp_module_find(m, "net2"), FSDP_HOOK_PRE_FORWARD,
                                      failing_hook, NULL, count_free, NULL));
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){2, 10}, -1, 1, 2);
    const fsdp_tensor *y = NULL;
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, m, x, &y), FSDP_ERR_COMM, "hook says no");
    CU_ASSERT_PTR_NULL(y);
    CU_ASSERT_EQUAL(ctx->scope_depth, 0);
    fsdp_module_free(m);
    CU_ASSERT_EQUAL(freed_count, 1);
    fsdp_tensor_free(x);
}

/* ---- gradients ---- */

/* loss = sum(model(x) * r) in double over f32 forward outputs */
static double probe_loss(fsdp_module *m, const fsdp_tensor *x, const fsdp_tensor *r) {
    const fsdp_tensor *y;
    if (fsdp_module_forward(fsdp_test_ctx(), m, x, &y) != FSDP_OK) return NAN;
    double s = 0;
    for (int64_t i = 0; i < fsdp_tensor_numel(y); i++)
        s += (double)fsdp_tensor_f32(y)[i] * fsdp_tensor_f32(r)[i];
    return s;
}

/* Central differences of probe_loss with respect to n elements of v; h = 1e-2 in f32 gives
 * about 1e-3 relative error on these smooth models (the truncation, h^2 / 6 of the third
 * derivative, and the loss's float32 rounding over 2h); the bound, rtol 2e-2 + atol 2e-3, is
 * 20 times that (seen 0.004 of it). */
static bool check_fd(const char *name, fsdp_module *m, const fsdp_tensor *x, const fsdp_tensor *r,
                     float *v, const float *analytic, int64_t n) {
    const float h = 1e-2f;
    float numeric[256];
    for (int64_t i = 0; i < n && i < 256; i++) {
        float keep = v[i];
        v[i] = keep + h;
        double lp = probe_loss(m, x, r);
        v[i] = keep - h;
        double lm = probe_loss(m, x, r);
        v[i] = keep;
        numeric[i] = (float)((lp - lm) / (2.0 * h));
    }
    return fsdp_test_close(name, analytic, numeric, n < 256 ? n : 256, 2e-2, 2e-3);
}

static void test_backward_matches_finite_differences(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m, *layer;
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &m));
    FSDP_TEST_OK(fsdp_rmsnorm_create(ctx, 5, 1e-6f, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_linear_create(ctx, 5, 7, true, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_gelu_create(ctx, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_linear_create(ctx, 7, 3, true, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_sigmoid_create(ctx, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, 5));
    /* a norm weight that is not all ones, so its gradient is a real test */
    fsdp_init nw = {.kind = FSDP_INIT_UNIFORM, .a = 0.5f, .b = 1.5f};
    FSDP_TEST_OK(
        fsdp_init_tensor(ctx, fsdp_param_data(fsdp_module_get_param(m, "0.weight")), &nw, 5, 1));

    fsdp_tensor *x = fsdp_test_random(3, (int64_t[]){2, 3, 5}, -2, 2, 10);
    fsdp_tensor *r = fsdp_test_random(3, (int64_t[]){2, 3, 3}, -1, 1, 11);
    const fsdp_tensor *y, *dx;
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_ndim(y), 3);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(y, -1), 3);
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, r, &dx));
    float dx_copy[30];
    memcpy(dx_copy, fsdp_tensor_f32(dx), sizeof dx_copy);
    CU_ASSERT_TRUE(check_fd("dx", m, x, r, fsdp_tensor_f32(x), dx_copy, 30));
    static const char *const params[] = {"0.weight", "1.weight", "1.bias", "3.weight", "3.bias"};
    for (int i = 0; i < 5; i++) {
        fsdp_param *p = fsdp_module_get_param(m, params[i]);
        CU_ASSERT_TRUE(check_fd(params[i], m, x, r, fsdp_tensor_f32(fsdp_param_data(p)),
                                fsdp_tensor_f32(fsdp_param_grad(p)),
                                fsdp_tensor_numel(fsdp_param_data(p))));
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(r);
    fsdp_module_free(m);
}

static void test_gradients_accumulate_and_frozen_params(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_simple_model(ctx, &m));
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){6, 5}, -1, 1, 20);
    fsdp_tensor *dy = fsdp_test_random(2, (int64_t[]){6, 12}, -1, 1, 21);
    const fsdp_tensor *y;
    fsdp_param *w = fsdp_module_get_param(m, "net2.weight");
    fsdp_param *frozen = fsdp_module_get_param(m, "net3.bias");
    fsdp_param_set_requires_grad(frozen, false);
    CU_ASSERT_FALSE(fsdp_param_requires_grad(frozen));
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, NULL));
    float once[32];
    memcpy(once, fsdp_tensor_f32(fsdp_param_grad(w)), sizeof once);
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, NULL));
    float twice[32];
    for (int i = 0; i < 32; i++) twice[i] = 2.0f * once[i];
    /* g + g is exactly 2 g; a GEMM kernel that accumulates into the gradient (beta 1) rounds
     * each of its few terms against it instead: a few u (rtol 1e-6 = 17 u) */
    FSDP_TEST_CLOSE("net2.weight grad after two backwards", fsdp_tensor_f32(fsdp_param_grad(w)),
                    twice, 32, 1e-6, 0);
    const float *fg = fsdp_tensor_f32(fsdp_param_grad(frozen));
    for (int i = 0; i < 12; i++) CU_ASSERT_EQUAL(fg[i], 0.0f);
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    CU_ASSERT_EQUAL(fsdp_tensor_f32(fsdp_param_grad(w))[0], 0.0f);
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_module_free(m);
}

/* A frozen RMSNorm weight: the backward still gives the input gradient, the bits of the
 * unfrozen run's, twice (its weight gradient goes to a sink made once, which nothing reads),
 * and leaves the weight's gradient at zeros. */
static void test_frozen_norm_weight(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m, *layer;
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &m));
    FSDP_TEST_OK(fsdp_rmsnorm_create(ctx, 5, 1e-6f, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_linear_create(ctx, 5, 3, true, &layer));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, m, layer));
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, 7));
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){4, 5}, -2, 2, 30);
    fsdp_tensor *r = fsdp_test_random(2, (int64_t[]){4, 3}, -1, 1, 31);
    fsdp_param *nw = fsdp_module_get_param(m, "0.weight");
    float want[20], got[20];
    const fsdp_tensor *y, *dx;
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, r, &dx));
    memcpy(want, fsdp_tensor_f32(dx), sizeof want);
    fsdp_param_set_requires_grad(nw, false);
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    for (int pass = 0; pass < 2; pass++) {
        FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
        FSDP_TEST_OK(fsdp_module_backward(ctx, m, r, &dx));
        memcpy(got, fsdp_tensor_f32(dx), sizeof got);
        CU_ASSERT_EQUAL(memcmp(got, want, sizeof got), 0);
    }
    const float *g = fsdp_tensor_f32(fsdp_param_grad(nw));
    for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(g[i], 0.0f);
    fsdp_tensor_free(x);
    fsdp_tensor_free(r);
    fsdp_module_free(m);
}

/* ---- Linear on the fused entries: the bits of the separate ones ---- */

enum { LR = 13, LC = 37, LOC = 29 }; /* rows, in and out features */

/* What Linear computed before its GEMMs took their epilogues (the separate entries, in the same
 * order), on host arrays, for two forward and backward passes accumulating the gradients: y
 * (LR, LOC), gw (LOC, LC), gb (LOC), dx (LR, LC). */
static void linear_separate(bool bf16, const float *x, const float *w, const float *b,
                            const float *dy, float *y, float *gw, float *gb, float *dx) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    static fsdp_bf16 x16[LR * LC], w16[LOC * LC], h[LR * LC];
    memset(gw, 0, sizeof(float) * LOC * LC), memset(gb, 0, sizeof(float) * LOC);
    for (int pass = 0; pass < 2; pass++) {
        if (bf16) {
            k->f32_to_bf16(x16, x, LR * LC), k->f32_to_bf16(w16, w, LOC * LC);
            k->gemm_bf16(false, true, LR, LOC, LC, 1.0f, x16, LC, w16, LC, 0.0f, y, LOC);
            k->bias_add(y, b, LR, LOC);
            k->f32_to_bf16(h, y, LR * LOC), k->bf16_to_f32(y, h, LR * LOC);
            k->f32_to_bf16(h, dy, LR * LOC); /* dy16 */
            k->gemm_bf16(true, false, LOC, LC, LR, 1.0f, h, LOC, x16, LC, 1.0f, gw, LC);
            k->bias_backward(gb, dy, LR, LOC);
            k->gemm_bf16(false, false, LR, LC, LOC, 1.0f, h, LOC, w16, LC, 0.0f, dx, LC);
            k->f32_to_bf16(h, dx, LR * LC), k->bf16_to_f32(dx, h, LR * LC);
        } else {
            k->gemm(false, true, LR, LOC, LC, 1.0f, x, LC, w, LC, 0.0f, y, LOC);
            k->bias_add(y, b, LR, LOC);
            k->gemm(true, false, LOC, LC, LR, 1.0f, dy, LOC, x, LC, 1.0f, gw, LC);
            k->bias_backward(gb, dy, LR, LOC);
            k->gemm(false, false, LR, LC, LOC, 1.0f, dy, LOC, w, LC, 0.0f, dx, LC);
        }
    }
}

/* n floats of t (any device) to the host */
static void to_host(float *dst, const fsdp_tensor *t, int64_t n) {
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(fsdp_tensor_from_blob(fsdp_test_ctx(), dst, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                       (int64_t[]){n}, &h));
    fsdp_tensor *flat = NULL;
    FSDP_TEST_OK(fsdp_tensor_view(fsdp_test_ctx(), t, 0, 1, (int64_t[]){n}, &flat));
    FSDP_TEST_OK(fsdp_tensor_copy(fsdp_test_ctx(), h, flat));
    fsdp_tensor_free(flat), fsdp_tensor_free(h);
}

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* Linear(37, 29) with bias under the f32 and bf16 policies, on the CPU and on sim:0: two
 * forward and backward passes (the gradients accumulate) give the output, the weight and bias
 * gradients and the input gradient bit for bit as the separate entries give them. */
static void test_linear_fused_bitwise(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    static float x[LR * LC], dy[LR * LOC], w[LOC * LC], b[LOC];
    static float y0[LR * LOC], gw0[LOC * LC], gb0[LOC], dx0[LR * LC];
    static float y1[LR * LOC], gw1[LOC * LC], gb1[LOC], dx1[LR * LC];
    fsdp_tensor *xh = fsdp_test_random(2, (int64_t[]){LR, LC}, -2, 2, 50);
    fsdp_tensor *dyh = fsdp_test_random(2, (int64_t[]){LR, LOC}, -1, 1, 51);
    memcpy(x, fsdp_tensor_f32(xh), sizeof x), memcpy(dy, fsdp_tensor_f32(dyh), sizeof dy);
    const fsdp_device devices[] = {FSDP_CPU, {FSDP_DEVICE_SIM, 0}};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int d = 0; d < 2; d++) {
            fsdp_module *m = NULL;
            FSDP_TEST_OK(fsdp_linear_create(ctx, LC, LOC, true, &m));
            memcpy(w, fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(m, "weight"))),
                   sizeof w);
            memcpy(b, fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(m, "bias"))), sizeof b);
            linear_separate(bf16, x, w, b, dy, y0, gw0, gb0, dx0);
            if (bf16) FSDP_TEST_OK(fsdp_module_set_autocast(ctx, m, FSDP_DTYPE_BF16));
            FSDP_TEST_OK(fsdp_module_to(ctx, m, devices[d]));
            fsdp_tensor *xd = NULL, *dyd = NULL;
            FSDP_TEST_OK(
                fsdp_tensor_create(ctx, FSDP_DTYPE_F32, devices[d], 2, (int64_t[]){LR, LC}, &xd));
            FSDP_TEST_OK(
                fsdp_tensor_create(ctx, FSDP_DTYPE_F32, devices[d], 2, (int64_t[]){LR, LOC}, &dyd));
            FSDP_TEST_OK(fsdp_tensor_copy(ctx, xd, xh));
            FSDP_TEST_OK(fsdp_tensor_copy(ctx, dyd, dyh));
            FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
            const fsdp_tensor *y = NULL, *dx = NULL;
            for (int pass = 0; pass < 2; pass++) {
                FSDP_TEST_OK(fsdp_module_forward(ctx, m, xd, &y));
                FSDP_TEST_OK(fsdp_module_backward(ctx, m, dyd, &dx));
            }
            to_host(y1, y, LR * LOC), to_host(dx1, dx, LR * LC);
            to_host(gw1, fsdp_param_grad(fsdp_module_get_param(m, "weight")), LOC * LC);
            to_host(gb1, fsdp_param_grad(fsdp_module_get_param(m, "bias")), LOC);
            int64_t diff = bits_differ(y0, y1, LR * LOC) + bits_differ(dx0, dx1, LR * LC) +
                           bits_differ(gw0, gw1, LOC * LC) + bits_differ(gb0, gb1, LOC);
            printf("\n    %s on %s: %lld elements differ from the separate entries",
                   bf16 ? "bf16" : "f32", fsdp_device_to_string(devices[d]), (long long)diff);
            CU_ASSERT_EQUAL(diff, 0);
            fsdp_tensor_free(xd), fsdp_tensor_free(dyd);
            fsdp_module_free(m);
        }
    fsdp_tensor_free(xh), fsdp_tensor_free(dyh);
}

/* Outputs and gradients live in buffers reused step after step: same addresses. */
static void test_buffers_reused_across_steps(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &m));
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){8, 10}, -1, 1, 30);
    fsdp_tensor *dy = fsdp_test_random(2, (int64_t[]){8, 10}, -1, 1, 31);
    const fsdp_tensor *y1, *dx1, *y2, *dx2;
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y1));
    void *y1_data = fsdp_tensor_data(y1);
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, &dx1));
    void *dx1_data = fsdp_tensor_data(dx1);
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y2));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, &dx2));
    CU_ASSERT_PTR_EQUAL(y1, y2);
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(y2), y1_data);
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(dx2), dx1_data);
    /* a smaller batch reuses the same storage too */
    fsdp_tensor *xs = fsdp_test_random(2, (int64_t[]){3, 10}, -1, 1, 32);
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, xs, &y2));
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(y2), y1_data);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(y2, 0), 3);
    fsdp_tensor_free(xs);
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_module_free(m);
}

/* The stacked MLP's forward and backward on x (8 x 10 rows of xh, the first `rows` of them) on
 * dev; output and input gradient copied to the host (rows x 10 each). */
static void mlp_pass(fsdp_module *m, fsdp_device dev, const fsdp_tensor *xh, const fsdp_tensor *dyh,
                     int64_t rows, float *y_out, float *dx_out) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *x = NULL, *dy = NULL, *xv = NULL, *dyv = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){rows, 10}, &x));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){rows, 10}, &dy));
    FSDP_TEST_OK(fsdp_tensor_view(ctx, xh, 0, 2, (int64_t[]){rows, 10}, &xv));
    FSDP_TEST_OK(fsdp_tensor_view(ctx, dyh, 0, 2, (int64_t[]){rows, 10}, &dyv));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, x, xv));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, dy, dyv));
    const fsdp_tensor *y = NULL, *dx = NULL;
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, &dx));
    to_host(y_out, y, rows * 10), to_host(dx_out, dx, rows * 10);
    fsdp_tensor_free(x), fsdp_tensor_free(dy), fsdp_tensor_free(xv), fsdp_tensor_free(dyv);
}

/* A batch larger than the buffers hold grows them with memory that is not zeroed (on sim: NaN
 * until written, core/device.h alloc_uninit): the layers write it whole, so the larger batch
 * on sim:0 gives the CPU's bits, and the growth is no launch (the grown pass counts as many as
 * the next pass of the same size). */
static void test_buffers_grow_unzeroed(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_device sim0 = {FSDP_DEVICE_SIM, 0};
    fsdp_tensor *xh = fsdp_test_random(2, (int64_t[]){8, 10}, -1, 1, 33);
    fsdp_tensor *dyh = fsdp_test_random(2, (int64_t[]){8, 10}, -1, 1, 34);
    fsdp_module *cpu = NULL, *dev = NULL;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &cpu));
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &dev));
    FSDP_TEST_OK(fsdp_module_to(ctx, dev, sim0));
    static float y_cpu[80], dx_cpu[80], y_dev[80], dx_dev[80];
    mlp_pass(cpu, FSDP_CPU, xh, dyh, 8, y_cpu, dx_cpu);
    mlp_pass(dev, sim0, xh, dyh, 3, y_dev, dx_dev); // buffers of 3 rows
    fsdp_kernels_counts_reset(sim0);
    mlp_pass(dev, sim0, xh, dyh, 8, y_dev, dx_dev); // grown to 8
    int64_t grown = fsdp_kernels_counts(sim0).launches;
    int64_t differ = 0;
    for (int i = 0; i < 80; i++)
        differ += memcmp(&y_cpu[i], &y_dev[i], 4) != 0 || memcmp(&dx_cpu[i], &dx_dev[i], 4) != 0;
    fsdp_kernels_counts_reset(sim0);
    mlp_pass(dev, sim0, xh, dyh, 8, y_dev, dx_dev);
    int64_t steady = fsdp_kernels_counts(sim0).launches;
    printf("\n    grown from 3 to 8 rows on sim: %lld of 160 elements differ from the CPU; %lld "
           "launches grown, %lld steady",
           (long long)differ, (long long)grown, (long long)steady);
    CU_ASSERT_EQUAL(differ, 0);
    CU_ASSERT_EQUAL(grown, steady);
    fsdp_module_free(cpu), fsdp_module_free(dev);
    fsdp_tensor_free(xh), fsdp_tensor_free(dyh);
}

/* A model that ran on the CPU, moved to sim:0 and back: its layers' buffers (outputs, saved
 * activations, gradients' scratch) follow it to each device, so each pass gives the bits of a
 * model that never moved. */
static void test_buffers_follow_a_move(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_device sim0 = {FSDP_DEVICE_SIM, 0};
    fsdp_tensor *xh = fsdp_test_random(2, (int64_t[]){8, 10}, -1, 1, 35);
    fsdp_tensor *dyh = fsdp_test_random(2, (int64_t[]){8, 10}, -1, 1, 36);
    fsdp_module *moved = NULL, *still = NULL;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &moved));
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &still));
    static float y_want[80], dx_want[80], y[80], dx[80];
    int64_t differ = 0;
    const fsdp_device route[] = {FSDP_CPU, sim0, FSDP_CPU, sim0};
    for (int i = 0; i < 4; i++) {
        FSDP_TEST_OK(fsdp_module_to(ctx, moved, route[i]));
        mlp_pass(moved, route[i], xh, dyh, 8, y, dx);
        mlp_pass(still, FSDP_CPU, xh, dyh, 8, y_want, dx_want); // the gradients accumulate alike
        for (int k = 0; k < 80; k++)
            differ += memcmp(&y[k], &y_want[k], 4) != 0 || memcmp(&dx[k], &dx_want[k], 4) != 0;
    }
    printf("\n    cpu -> sim -> cpu -> sim: %lld of 640 elements differ from a model that stayed",
           (long long)differ);
    CU_ASSERT_EQUAL(differ, 0);
    fsdp_module_free(moved), fsdp_module_free(still);
    fsdp_tensor_free(xh), fsdp_tensor_free(dyh);
}

/* One AdamW training step of a Llama on its current device (tokens and targets from the
 * host): the loss. */
static float llama_step(fsdp_module *m, fsdp_optimizer *opt, fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *ids = NULL, *dlogits = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, dev, 2, (int64_t[]){2, 8}, &ids));
    int32_t host[16], targets[16];
    for (int i = 0; i < 16; i++) host[i] = (i * 7 + 3) % 32, targets[i] = (i * 5 + 1) % 32;
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(
        fsdp_tensor_from_blob(ctx, host, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){2, 8}, &h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, ids, h));
    const fsdp_tensor *logits = NULL;
    float loss = NAN;
    FSDP_TEST_OK(fsdp_optimizer_zero_grad(ctx, opt));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, ids, &logits));
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, logits, &dlogits));
    FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, logits, targets, -100, &loss, dlogits));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dlogits, NULL));
    FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
    fsdp_tensor_free(ids), fsdp_tensor_free(h), fsdp_tensor_free(dlogits);
    return loss;
}

/* The same for a small Llama under the bf16 policy with bf16 logits (RoPE tables, attention,
 * the weights' bf16 mirrors, the loss) and its AdamW, made on the CPU: trained a step at a
 * time on cpu, sim:0, cpu, sim:0, its losses are the bits of a model that stayed. */
static void test_llama_follows_a_move(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_device sim0 = {FSDP_DEVICE_SIM, 0};
    fsdp_llama_config cfg = {.dim = 16,
                             .n_layers = 2,
                             .n_heads = 4,
                             .n_kv_heads = 2,
                             .vocab_size = 32,
                             .ffn_hidden = 24,
                             .max_seq_len = 8,
                             .compute_dtype = FSDP_DTYPE_BF16,
                             .logits_dtype = FSDP_DTYPE_BF16};
    fsdp_module *m[2] = {NULL, NULL}; /* [0] moves */
    fsdp_optimizer *opt[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m[k]));
        FSDP_TEST_OK(fsdp_adamw_create(ctx, m[k], &(fsdp_adam_options){.lr = 1e-2}, &opt[k]));
    }
    const fsdp_device route[] = {FSDP_CPU, sim0, FSDP_CPU, sim0};
    int differ = 0;
    for (int i = 0; i < 4; i++) {
        FSDP_TEST_OK(fsdp_module_to(ctx, m[0], route[i]));
        float moved = llama_step(m[0], opt[0], route[i]);
        float stayed = llama_step(m[1], opt[1], FSDP_CPU);
        printf("\n    step %d on %s:%d: loss %.9g, the model that stayed %.9g", i + 1,
               fsdp_device_to_string(route[i]), route[i].index, moved, stayed);
        differ += memcmp(&moved, &stayed, sizeof moved) != 0;
    }
    CU_ASSERT_EQUAL(differ, 0);
    for (int k = 0; k < 2; k++) fsdp_optimizer_free(opt[k]), fsdp_module_free(m[k]);
}

/* An input or output gradient on another device than the layer's parameters is refused with
 * FSDP_ERR_DEVICE naming the layer, both devices and the fix (a layer handed one device's
 * kernels the other's memory before: sim ended the process), and a later call with the right
 * tensors works: a Linear on sim:0 given cpu tensors, a Llama on sim:0 given cpu token ids (its
 * embedding is the layer that refuses). */
static void test_wrong_device_refused(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_device sim0 = {FSDP_DEVICE_SIM, 0};
    fsdp_module *lin = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 4, true, &lin));
    FSDP_TEST_OK(fsdp_module_to(ctx, lin, sim0));
    fsdp_tensor *x_cpu = NULL, *x_dev = NULL, *dy_cpu = NULL, *dy_dev = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){3, 8}, &x_cpu));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, sim0, 2, (int64_t[]){3, 8}, &x_dev));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){3, 4}, &dy_cpu));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, sim0, 2, (int64_t[]){3, 4}, &dy_dev));
    const fsdp_tensor *y = NULL;
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, lin, x_cpu, &y), FSDP_ERR_DEVICE, "Linear",
                    "the input is on cpu:0 and the parameters on sim:0", "fsdp_tensor_copy");
    FSDP_TEST_OK(fsdp_module_forward(ctx, lin, x_dev, &y));
    FSDP_TEST_FAILS(fsdp_module_backward(ctx, lin, dy_cpu, NULL), FSDP_ERR_DEVICE,
                    "the output gradient is on cpu:0 and the parameters on sim:0");
    FSDP_TEST_OK(fsdp_module_backward(ctx, lin, dy_dev, NULL));
    fsdp_module_free(lin);
    fsdp_tensor_free(x_cpu), fsdp_tensor_free(x_dev), fsdp_tensor_free(dy_cpu),
        fsdp_tensor_free(dy_dev);

    fsdp_llama_config cfg = {.dim = 16,
                             .n_layers = 1,
                             .n_heads = 4,
                             .n_kv_heads = 2,
                             .vocab_size = 32,
                             .ffn_hidden = 24,
                             .max_seq_len = 8};
    fsdp_module *llama = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &llama));
    FSDP_TEST_OK(fsdp_module_to(ctx, llama, sim0));
    fsdp_tensor *ids = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){1, 8}, &ids));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, llama, ids, &y), FSDP_ERR_DEVICE, "model.embed_tokens",
                    "the input is on cpu:0 and the parameters on sim:0");
    fsdp_tensor_free(ids);
    fsdp_module_free(llama);
}

/* Initialisation depends on (seed, fully qualified name) only. */
static void test_init_is_layout_independent(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *a, *b, *c;
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &a));
    FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &b));
    const fsdp_tensor *wa = fsdp_param_data(fsdp_module_get_param(a, "layers.1.net2.weight"));
    const fsdp_tensor *wb = fsdp_param_data(fsdp_module_get_param(b, "layers.1.net2.weight"));
    CU_ASSERT_EQUAL(memcmp(fsdp_tensor_data(wa), fsdp_tensor_data(wb), fsdp_tensor_nbytes(wa)), 0);
    /* resetting only the subtree layers.1 with the same seed gives the same values */
    FSDP_TEST_OK(
        fsdp_module_reset_parameters(ctx, fsdp_module_find(b, "layers.1"), fsdp_ctx_seed(ctx)));
    CU_ASSERT_EQUAL(memcmp(fsdp_tensor_data(wa), fsdp_tensor_data(wb), fsdp_tensor_nbytes(wa)), 0);
    /* different parameters and different seeds differ */
    const fsdp_tensor *w0 = fsdp_param_data(fsdp_module_get_param(a, "layers.0.net2.weight"));
    CU_ASSERT_NOT_EQUAL(memcmp(fsdp_tensor_data(wa), fsdp_tensor_data(w0), fsdp_tensor_nbytes(wa)),
                        0);
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, b, 777));
    CU_ASSERT_NOT_EQUAL(memcmp(fsdp_tensor_data(wa), fsdp_tensor_data(wb), fsdp_tensor_nbytes(wa)),
                        0);
    /* Linear's bound is 1/sqrt(in_features) = 1/4 for net2 (16 inputs) */
    const float *v = fsdp_tensor_f32(wa);
    float lo = 1, hi = -1;
    for (int i = 0; i < 160; i++) lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
    CU_ASSERT_TRUE(lo >= -0.25f && hi < 0.25f && hi - lo > 0.4f);
    /* RMSNorm's weight starts at ones */
    FSDP_TEST_OK(fsdp_rmsnorm_create(ctx, 4, 1e-6f, &c));
    CU_ASSERT_EQUAL(fsdp_tensor_f32(fsdp_param_data(fsdp_module_param(c, 0)))[3], 1.0f);
    fsdp_module_free(a);
    fsdp_module_free(b);
    fsdp_module_free(c);
}

/* The seed models' builders defer the layers' fills on creation to their final reset (each
 * element drawn once): every model's values are a reset's, bit for bit, and drawn (a new tensor
 * holds zeros); the deferral ends with the builder (a Linear made afterwards is filled). */
static void test_builders_fill_once(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int kind = 0; kind < 5; kind++) {
        fsdp_module *m = NULL;
        switch (kind) {
        case 0:
            FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
            break;
        case 1:
            FSDP_TEST_OK(fsdp_model_mlp_stacked(ctx, 2, &m));
            break;
        case 2:
            FSDP_TEST_OK(fsdp_model_simple_mlp(ctx, &m));
            break;
        case 3:
            FSDP_TEST_OK(fsdp_model_net(ctx, 8, &m));
            break;
        default:
            FSDP_TEST_OK(fsdp_model_mlp(ctx, 3, (int64_t[]){4, 6, 2}, FSDP_ACT_RELU, &m));
        }
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        int64_t n;
        float *built = fsdp_test_param_values(m, &n);
        FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, fsdp_ctx_seed(ctx)));
        float *reset = fsdp_test_param_values(m, NULL);
        CU_ASSERT_EQUAL(memcmp(built, reset, (size_t)n * sizeof(float)), 0);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < n; i++) nonzero += built[i] != 0.0f;
        CU_ASSERT_EQUAL(nonzero, n);
        free(built), free(reset);
        fsdp_module_free(m);
    }
    fsdp_module *lin = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 4, 4, true, &lin));
    int64_t n;
    float *w = fsdp_test_param_values(lin, &n);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += w[i] != 0.0f;
    CU_ASSERT_EQUAL(nonzero, n);
    free(w);
    fsdp_module_free(lin);
}

/* ---- SGD ---- */

/* PyTorch's SGD update rule (as include/fsdp/optim.h and docs/optim.md give it), written out
 * per element in double. */
static void sgd_reference(double *p, double *buf, const double *g, int n, int step,
                          const fsdp_sgd_options *o) {
    for (int i = 0; i < n; i++) {
        double d = (o->maximize ? -g[i] : g[i]) + o->weight_decay * p[i];
        if (o->momentum > 0) {
            buf[i] = step == 0 ? d : o->momentum * buf[i] + (1 - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * buf[i] : buf[i];
        }
        p[i] -= o->lr * d;
    }
}

static void test_sgd_update_equations(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_sgd_options configs[] = {
        {.lr = 0.1f},
        {.lr = 0.1f, .momentum = 0.9f},
        {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f, .weight_decay = 0.01f},
        {.lr = 0.05f, .momentum = 0.8f, .nesterov = true, .weight_decay = 0.1f},
        {.lr = 0.02f, .momentum = 0.5f, .maximize = true},
    };
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        fsdp_module *m;
        FSDP_TEST_OK(fsdp_linear_create(ctx, 3, 2, true, &m));
        fsdp_optimizer *opt;
        FSDP_TEST_OK(fsdp_sgd_create(ctx, m, &configs[c], &opt));
        fsdp_param *w = fsdp_module_get_param(m, "weight");
        float *pw = fsdp_tensor_f32(fsdp_param_data(w)), *gw = fsdp_tensor_f32(fsdp_param_grad(w));
        double p[6], buf[6] = {0}, g[6];
        for (int i = 0; i < 6; i++) p[i] = pw[i];
        for (int step = 0; step < 4; step++) {
            for (int i = 0; i < 6; i++) g[i] = gw[i] = (float)(0.3 * (i - 2.5) + 0.1 * step);
            sgd_reference(p, buf, g, 6, step, &configs[c]);
            FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
        }
        float want[6];
        for (int i = 0; i < 6; i++) want[i] = (float)p[i];
        /* elementwise float32 against double: a few roundings per step, 4 steps (17 u) */
        FSDP_TEST_CLOSE("sgd weight after 4 steps", pw, want, 6, 1e-6, 1e-7);
        FSDP_TEST_OK(fsdp_optimizer_zero_grad(ctx, opt));
        CU_ASSERT_EQUAL(gw[5], 0.0f);
        fsdp_optimizer_free(opt);
        fsdp_module_free(m);
    }
    fsdp_module *m;
    fsdp_optimizer *opt;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 3, 2, true, &m));
    FSDP_TEST_FAILS(
        fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.1f, .nesterov = true}, &opt),
        FSDP_ERR_INVALID_ARGUMENT, "nesterov needs momentum > 0");
    FSDP_TEST_FAILS(fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0}, &opt),
                    FSDP_ERR_INVALID_ARGUMENT, "lr is 0");
    fsdp_module_free(m);
}

/* fsdp_module_to: a move to where the model is changes nothing; a device that does not exist
 * and a parameter whose storage another tensor shares are refused before anything moves. */
static void test_module_to_refusals(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
    fsdp_param *w = fsdp_module_get_param(m, "net1.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    fsdp_tensor *data = fsdp_param_data(w);
    void *before = fsdp_tensor_data(data);
    FSDP_TEST_OK(fsdp_module_to(ctx, m, FSDP_CPU));
    CU_ASSERT_PTR_EQUAL(fsdp_param_data(w), data);
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(data), before);
    FSDP_TEST_FAILS(fsdp_module_to(ctx, m, (fsdp_device){FSDP_DEVICE_CUDA, 99}), FSDP_ERR_DEVICE,
                    "cuda:99", "not available");
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(data), before);
    fsdp_tensor *view;
    FSDP_TEST_OK(fsdp_tensor_view(ctx, data, 0, 1, (int64_t[]){4}, &view));
    FSDP_TEST_FAILS(fsdp_tensor_move(ctx, data, (fsdp_device){FSDP_DEVICE_CUDA, 0}),
                    fsdp_device_for(FSDP_DEVICE_CUDA) &&
                            fsdp_device_for(FSDP_DEVICE_CUDA)->device_count() > 0
                        ? FSDP_ERR_STATE
                        : FSDP_ERR_DEVICE,
                    "cuda:0");
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(data), before);
    fsdp_tensor_free(view);
    FSDP_TEST_FAILS(fsdp_module_to(ctx, NULL, FSDP_CPU), FSDP_ERR_INVALID_ARGUMENT, "NULL");
    /* a model with hooks is refused before anything moves (a no-op move is still fine) */
    hook_log log = {0};
    FSDP_TEST_OK(fsdp_module_add_hook(ctx, fsdp_module_find(m, "net1"), FSDP_HOOK_PRE_FORWARD,
                                      record_hook, &log, NULL, NULL));
    FSDP_TEST_OK(fsdp_module_to(ctx, m, FSDP_CPU));
    if (fsdp_device_count(FSDP_DEVICE_CUDA) > 0) {
        FSDP_TEST_FAILS(fsdp_module_to(ctx, m, (fsdp_device){FSDP_DEVICE_CUDA, 0}), FSDP_ERR_STATE,
                        "net1", "has hooks", "move the model first");
        CU_ASSERT_EQUAL(fsdp_tensor_device(data).type, FSDP_DEVICE_CPU);
        CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(data), before);
    }
    fsdp_module_free(m);
}

/* ---- fsdp_module_create owns impl from the call on ---- */

static int created_impl_frees;
static void count_impl_free(void *impl) {
    created_impl_frees++;
    free(impl);
}
static fsdp_status never_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                 const fsdp_tensor **out) {
    (void)m, (void)in, (void)out;
    return fsdp_ctx_set_error(ctx, FSDP_ERR_INTERNAL, "not run");
}
static fsdp_status never_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                  const fsdp_tensor **din) {
    (void)m, (void)dout, (void)din;
    return fsdp_ctx_set_error(ctx, FSDP_ERR_INTERNAL, "not run");
}

/* Every refused call releases impl once (under the sanitizers a leak fails the suite too); a
 * created module releases it when freed. */
static void test_create_releases_impl(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    static const fsdp_module_ops ops = {.kind = "Counted",
                                        .forward = never_forward,
                                        .backward = never_backward,
                                        .free_impl = count_impl_free};
    static const fsdp_module_ops no_forward = {.kind = "Counted", .free_impl = count_impl_free};
    fsdp_module *m = NULL;
    created_impl_frees = 0;
    FSDP_TEST_FAILS(fsdp_module_create(ctx, &ops, malloc(8), NULL), FSDP_ERR_INVALID_ARGUMENT,
                    "out is NULL");
    CU_ASSERT_EQUAL(created_impl_frees, 1);
    CU_ASSERT_EQUAL(fsdp_module_create(NULL, &ops, malloc(8), &m), FSDP_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_EQUAL(created_impl_frees, 2);
    FSDP_TEST_FAILS(fsdp_module_create(ctx, &no_forward, malloc(8), &m), FSDP_ERR_INVALID_ARGUMENT,
                    "kind, forward and backward");
    CU_ASSERT_EQUAL(created_impl_frees, 3);
    FSDP_TEST_OK(fsdp_module_create(ctx, &ops, malloc(8), &m));
    CU_ASSERT_EQUAL(created_impl_frees, 3);
    fsdp_module_free(m);
    CU_ASSERT_EQUAL(created_impl_frees, 4);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"seed_model_names", test_seed_model_names},
        {"tree_errors", test_tree_errors},
        {"input_shape_error_names_module", test_input_shape_error_names_module},
        {"hooks_order_scope_and_replacement", test_hooks_order_scope_and_replacement},
        {"observer_hooks", test_observer_hooks},
        {"hook_failure_and_free", test_hook_failure_and_free},
        {"backward_matches_finite_differences", test_backward_matches_finite_differences},
        {"gradients_accumulate_and_frozen_params", test_gradients_accumulate_and_frozen_params},
        {"frozen_norm_weight", test_frozen_norm_weight},
        {"buffers_reused_across_steps", test_buffers_reused_across_steps},
        {"buffers_grow_unzeroed", test_buffers_grow_unzeroed},
        {"buffers_follow_a_move", test_buffers_follow_a_move},
        {"llama_follows_a_move", test_llama_follows_a_move},
        {"wrong_device_refused", test_wrong_device_refused},
        {"linear_fused_bitwise", test_linear_fused_bitwise},
        {"init_is_layout_independent", test_init_is_layout_independent},
        {"builders_fill_once", test_builders_fill_once},
        {"sgd_update_equations", test_sgd_update_equations},
        {"module_to_refusals", test_module_to_refusals},
        {"create_releases_impl", test_create_releases_impl},
    };
    return fsdp_test_run(argc, argv, "modules", cases, sizeof cases / sizeof cases[0]);
}

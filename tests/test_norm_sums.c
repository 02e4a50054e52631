/* test_norm_sums.c: the decoder layer's norms add the residual stream's gradient in their
 * backward's pass (rmsnorm_backward_add, fsdp_nn_rmsnorm_set_grad_residual) instead of a norm
 * backward and an add. The entry bit for bit against rmsnorm_backward then add (input and weight
 * gradients) on the CPU and the run's device, on odd shapes, with NaN, infinities, a zero row and
 * sums that overflow among the inputs (where two NaNs meet, a NaN). Then the tiny Llama under the
 * bf16 policy and in f32 against the path before (fsdp_llama_test_norm_sums old_path): loss,
 * logits and every gradient over two steps bit for bit, on the CPU on one thread and on three
 * workers, and on sim; with every decoder layer checkpointed; at (dp, tp) = (2, 1) under FSDP;
 * at (1, 2) under torchtitan's plan, whose SequenceParallel hooks on the norms keep the path
 * before (counted: no norm adds there). An acting post-backward hook on a norm keeps that norm on
 * the path before and sees its own gradient; an observer does not. Counters show which path ran,
 * so no comparison is of a path with itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx
#include "kernels/kernels.h" // defines: fsdp_kernels_for, fsdp_kernels_cpu_workers_start
#include "nn/llama_common.h" // defines: fsdp_llama_test_norm_sums
#include "on_device.h"       // defines: fsdp_test_device
#include "tiny_llama.h"      // defines: tiny_llama_config, tiny_step_of, tiny_on, tiny_world

enum { LAYERS = TINY_LAYERS };

/* ---- the kernel ---- */

/* n values over many binades and both signs (which: a different sequence per array) */
static void fill(float *x, int64_t n, int which) {
    for (int64_t i = 0; i < n; i++)
        x[i] = sinf((float)(i * (which + 2)) * 0.613f + (float)which) *
               ldexpf(1.0f, (int)((i * 5 + which * 3) % 24) - 12);
}

/* The inputs' specials: a NaN, infinities and the largest float in dres (alone, and where dout's
 * row is NaN or infinite, which makes the row's input gradient NaN), a zero row of dout. */
static void put_specials(float *dres, float *dout, int64_t rows, int64_t cols) {
    static const uint32_t sp[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                                  0xff7fffffu, 0x80000000u, 0x00000001u};
    int64_t n = rows * cols;
    for (int s = 0; s < 7 && 3 * s < n; s++) dres[3 * s] = tiny_from_bits(sp[s]);
    if (rows < 3) return;
    dout[cols] = tiny_from_bits(0x7fc00000u);         /* row 1 NaN */
    dout[2 * cols + 1] = tiny_from_bits(0x7f800000u); /* row 2 infinite */
    dres[cols + cols / 2] = tiny_from_bits(0xffc00000u);
    if (rows > 3) memset(dout + 3 * cols, 0, (size_t)cols * sizeof(float)); /* row 3 zero */
}

/* rmsnorm_backward_add on dev against rmsnorm_backward then add(dinp, dres, dinp) on the same
 * device, both gradients bit for bit (dweight accumulated onto the same start). */
static void check_entry(fsdp_device dev, int64_t rows, int64_t cols) {
    int64_t n = rows * cols;
    float *h[6], *got = calloc((size_t)n, 4), *want = calloc((size_t)n, 4);
    for (int i = 0; i < 6; i++) h[i] = calloc((size_t)n, 4), fill(h[i], n, i);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got && want && h[0] && h[1] && h[2] && h[3] && h[4] && h[5]);
    float *x = h[0], *dout = h[1], *dres = h[2], *w = h[3], *dw0 = h[4];
    put_specials(dres, dout, rows, cols);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->rmsnorm_backward_add);
    fsdp_tensor *tx = tiny_on(dev, FSDP_DTYPE_F32, x, n),
                *tdy = tiny_on(dev, FSDP_DTYPE_F32, dout, n),
                *tres = tiny_on(dev, FSDP_DTYPE_F32, dres, n),
                *tw = tiny_on(dev, FSDP_DTYPE_F32, w, cols),
                *tn = tiny_on(dev, FSDP_DTYPE_F32, NULL, n),
                *trs = tiny_on(dev, FSDP_DTYPE_F32, NULL, rows);
    fsdp_tensor *dx[2] = {tiny_on(dev, FSDP_DTYPE_F32, NULL, n),
                          tiny_on(dev, FSDP_DTYPE_F32, NULL, n)};
    fsdp_tensor *dw[2] = {tiny_on(dev, FSDP_DTYPE_F32, dw0, cols),
                          tiny_on(dev, FSDP_DTYPE_F32, dw0, cols)};
    const float *px = fsdp_tensor_f32(tx), *pdy = fsdp_tensor_f32(tdy), *pw = fsdp_tensor_f32(tw);
    const float *prs = fsdp_tensor_f32(trs);
    k->rmsnorm_forward(fsdp_tensor_f32(tn), fsdp_tensor_f32(trs), px, pw, 1e-6f, rows, cols);
    float *d0 = fsdp_tensor_f32(dx[0]), *d1 = fsdp_tensor_f32(dx[1]);
    k->rmsnorm_backward(d0, fsdp_tensor_f32(dw[0]), pdy, px, pw, prs, rows, cols);
    k->add(d0, fsdp_tensor_f32(tres), d0, n); /* the path before */
    k->rmsnorm_backward_add(d1, fsdp_tensor_f32(dw[1]), pdy, fsdp_tensor_f32(tres), px, pw, prs,
                            rows, cols);
    tiny_back(want, dx[0]), tiny_back(got, dx[1]);
    int64_t d = 0, met = 0, nan = 0, inf = 0;
    for (int64_t i = 0; i < n; i++) {
        nan += isnan(want[i]) != 0, inf += isinf(want[i]) != 0;
        if (isnan(want[i]) && isnan(dres[i])) /* where NaNs meet the payload is unspecified */
            met++, d += !isnan(got[i]);
        else
            d += memcmp(&got[i], &want[i], 4) != 0;
    }
    tiny_back(want, dw[0]), tiny_back(got, dw[1]);
    int64_t dwd = tiny_differ(got, want, cols);
    printf("\n    %s (%lld, %lld): dinp %lld of %lld differ (%lld NaN, %lld inf; %lld where NaNs "
           "meet: NaN both), dweight %lld",
           fsdp_device_to_string(dev), (long long)rows, (long long)cols, (long long)d, (long long)n,
           (long long)nan, (long long)inf, (long long)met, (long long)dwd);
    CU_ASSERT_EQUAL(d, 0);
    CU_ASSERT_EQUAL(dwd, 0);
    if (rows >= 3) CU_ASSERT_TRUE(nan > 0 && inf > 0); /* the specials reached the sums */
    fsdp_tensor *all[] = {tx, tdy, tres, tw, tn, trs, dx[0], dx[1], dw[0], dw[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
    for (int i = 0; i < 6; i++) free(h[i]);
    free(got), free(want);
}

static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {17, 100}, {4, 1025}};

static void test_entry_cpu(void) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_entry(FSDP_CPU, shapes[s][0], shapes[s][1]);
}

/* the path before's add is split over workers from 65536 elements: the same bits */
static void test_entry_cpu_threads(void) {
    int threads = fsdp_kernels_cpu_workers_start(3, -1);
    printf("\n    %d threads", threads);
    check_entry(FSDP_CPU, 129, 1031);
    fsdp_kernels_cpu_workers_stop();
}

static void test_entry_device(void) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_entry(fsdp_test_device(), shapes[s][0], shapes[s][1]);
}

/* ---- the model ---- */

/* Two steps of m[0] with the norms adding and of m[1] on the path before, compared; the norm
 * adds counted: each step, `want` on the new path (two a layer unless hooks stop some), none on
 * the path before. */
static void compare_paths(fsdp_module *m[2], fsdp_device dev, int64_t want, const char *what) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    tiny_step *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (int s = 0; s < 2; s++) {
        int64_t adds[2];
        for (int i = 0; i < 2; i++) { /* i 0: the norms add; 1: the path before */
            fsdp_llama_test_norm_sums(i == 1, NULL);
            FSDP_TEST_OK(tiny_step_of(ctx, m[i], m[i], dev, s, &o[i]));
            fsdp_llama_test_norm_sums(false, &adds[i]);
        }
        printf("\n    %s step %d: %lld norm adds (path before: %lld)", what, s, (long long)adds[0],
               (long long)adds[1]);
        tiny_compare(dev, &o[0], &o[1]);
        CU_ASSERT_EQUAL(adds[0], want);
        CU_ASSERT_EQUAL(adds[1], 0);
    }
    free(o[0].grads), free(o[1].grads), free(o);
}

static void check_model(fsdp_dtype compute, fsdp_device dev, bool ckpt) {
    fsdp_test_device_pin_f32_attention(true);
    fsdp_module *m[2] = {tiny_model(compute, dev, ckpt), tiny_model(compute, dev, ckpt)};
    char what[64];
    snprintf(what, sizeof what, "%s%s", compute == FSDP_DTYPE_BF16 ? "bf16" : "f32",
             ckpt ? " checkpointed" : "");
    compare_paths(m, dev, 2 * LAYERS, what);
    fsdp_module_free(m[0]), fsdp_module_free(m[1]);
    fsdp_test_device_pin_f32_attention(false);
}

static void test_bf16_cpu(void) {
    check_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
}

static void test_f32_cpu(void) {
    check_model(FSDP_DTYPE_F32, FSDP_CPU, false);
}

static void test_checkpointed_cpu(void) {
    check_model(FSDP_DTYPE_BF16, FSDP_CPU, true);
    check_model(FSDP_DTYPE_F32, FSDP_CPU, true);
}

/* On three workers (the path before's adds and the GEMMs split; the norm entries are not). */
static void test_threads_cpu(void) {
    int threads = fsdp_kernels_cpu_workers_start(3, -1);
    printf("\n    %d threads", threads);
    check_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
    check_model(FSDP_DTYPE_F32, FSDP_CPU, false);
    fsdp_kernels_cpu_workers_stop();
}

static void test_bf16_device(void) {
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), false);
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), true);
}

static void test_f32_device(void) {
    check_model(FSDP_DTYPE_F32, fsdp_test_device(), false);
}

/* ---- hooks ---- */

typedef struct seen {
    int64_t calls;
    float first; /* the first element of the input gradient the hook saw last */
} seen;

static fsdp_status look(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                        const fsdp_tensor **io, void *user) {
    (void)m, (void)point;
    seen *s = user;
    s->calls++;
    fsdp_tensor *h = NULL;
    FSDP_TRY_AT(ctx, fsdp_tensor_from_blob(ctx, &s->first, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                           (int64_t[]){1}, &h));
    fsdp_tensor *v = NULL; /* the first element, as a 1-d view */
    fsdp_status st = fsdp_tensor_view(ctx, *io, 0, 1, (int64_t[]){1}, &v);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, h, v);
    fsdp_tensor_free(v), fsdp_tensor_free(h);
    return st;
}

/* An acting post-backward hook on layer 0's input_layernorm: that norm runs the path before (one
 * norm add fewer a step), the hook sees the norm's own input gradient (the path before's hook
 * sees the same bits), and the model's results are the path before's. An observer instead leaves
 * the norm adding (it then sees the sum). */
static void test_hooks(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int observer = 0; observer < 2; observer++) {
        fsdp_module *m[2] = {tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false),
                             tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false)};
        seen s[2] = {{0, 0.0f}, {0, 0.0f}};
        for (int i = 0; i < 2; i++) {
            fsdp_module *norm = fsdp_module_find(m[i], "model.layers.0.input_layernorm");
            FSDP_TEST_OK((observer ? fsdp_module_add_observer : fsdp_module_add_hook)(
                ctx, norm, FSDP_HOOK_POST_BACKWARD, look, &s[i], NULL, NULL));
        }
        compare_paths(m, FSDP_CPU, 2 * LAYERS - (observer ? 0 : 1),
                      observer ? "observed" : "hooked");
        printf("\n    the %s saw %.9g (path before: %.9g), %lld calls",
               observer ? "observer" : "hook", (double)s[0].first, (double)s[1].first,
               (long long)s[0].calls);
        CU_ASSERT_EQUAL(s[0].calls, 2);
        CU_ASSERT_EQUAL(s[1].calls, 2);
        if (!observer) CU_ASSERT_EQUAL(tiny_differ(&s[0].first, &s[1].first, 1), 0);
        if (observer) CU_ASSERT_NOT_EQUAL(tiny_differ(&s[0].first, &s[1].first, 1), 0);
        fsdp_module_free(m[0]), fsdp_module_free(m[1]);
    }
}

/* ---- distributed layouts ---- */

/* Both paths at (dp, tp) (tiny_world), each rank's results compared. At tp > 1 the plan's
 * SequenceParallel puts post-backward hooks on every norm (the all_reduce of the weight's
 * gradient, the redistribution of the input gradient), so no norm adds; at tp 1 (FSDP's hooks are
 * on the decoder layers) they add as on one rank: two a layer and step on every rank. */
static void check_world(fsdp_dtype compute, int dp, int tp) {
    tiny_world *r = calloc(2, sizeof *r); /* 0: the norms add; 1: the path before */
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    int64_t adds[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (tiny_world){.compute = compute, .dp = dp, .tp = tp};
        fsdp_llama_test_norm_sums(i == 1, NULL);
        tiny_world_run(&r[i]);
        fsdp_llama_test_norm_sums(false, &adds[i]);
    }
    printf("\n    (dp, tp) = (%d, %d), %s: %lld norm adds (path before: %lld)", dp, tp,
           compute == FSDP_DTYPE_BF16 ? "bf16" : "f32", (long long)adds[0], (long long)adds[1]);
    int hosted = tiny_world_compare(&r[0], &r[1]);
    CU_ASSERT_EQUAL(adds[0], tp == 1 ? 2 * LAYERS * 2 * hosted : 0);
    CU_ASSERT_EQUAL(adds[1], 0);
    tiny_world_free(&r[0]), tiny_world_free(&r[1]);
    free(r);
}

static void test_fsdp(void) {
    check_world(FSDP_DTYPE_BF16, TINY_WORLD, 1);
    check_world(FSDP_DTYPE_F32, TINY_WORLD, 1);
}

static void test_tp(void) {
    check_world(FSDP_DTYPE_BF16, 1, TINY_WORLD);
    check_world(FSDP_DTYPE_F32, 1, TINY_WORLD);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"entry_cpu", test_entry_cpu},
        {"entry_cpu_threads", test_entry_cpu_threads},
        {"entry_device", test_entry_device},
        {"bf16_cpu", test_bf16_cpu},
        {"f32_cpu", test_f32_cpu},
        {"checkpointed_cpu", test_checkpointed_cpu},
        {"threads_cpu", test_threads_cpu},
        {"bf16_device", test_bf16_device},
        {"f32_device", test_f32_device},
        {"hooks", test_hooks},
        {"fsdp", test_fsdp},
        {"tp", test_tp},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "norm_sums", cases, (int)(sizeof cases / sizeof cases[0]));
}

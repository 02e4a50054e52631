/* test_bf16_residual.c: o_proj's and down_proj's outputs in bf16, read widened by the decoder
 * layer's residual adds (issue 32). The table's add_bf16 (out = a + widen(b), b bf16) bit for bit
 * against add on the widened values (bf16_to_f32 then add) on the CPU (one thread and split over
 * workers) and the run's device, with NaN, infinities, subnormals and sums that overflow among the
 * inputs, in place and out of place (where two NaNs meet, a NaN). Then the tiny Llama under the
 * bf16 policy with the branches' bf16 outputs against the path before (fsdp_nn_llama_set_bf16_
 * branches off: each Linear widens into an f32 output): loss, logits and every gradient bit for
 * bit, on the CPU and sim, with every decoder layer checkpointed too; at (dp, tp) = (1, 2) under
 * torchtitan's plan, where RowwiseParallel's post-forward hook on o_proj and down_proj reduces
 * their Partial outputs, so they keep f32 (no bf16 add runs: counted); and at (2, 1) under FSDP.
 * The activation bytes after a forward: 2 R D fewer per Linear (its output in bf16, 2 bytes an
 * element instead of 4), 4 R D per layer; a direct call of the attention or the MLP gives f32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx
#include "kernels/kernels.h" // defines: fsdp_kernels_for, fsdp_kernels_cpu_workers_start
#include "nn/llama_common.h" // defines: fsdp_llama_test_bf16_branches
#include "nn/nn.h"           // defines: fsdp_nn_llama_set_bf16_branches
#include "on_device.h"       // defines: fsdp_test_device
#include "tiny_llama.h"      // defines: tiny_llama_config, tiny_step_of, tiny_on, tiny_world

enum {
    BATCH = TINY_BATCH,
    SEQ = TINY_SEQ,
    VOCAB = TINY_VOCAB,
    N_TOK = TINY_TOKENS,
    LAYERS = TINY_LAYERS,
    DIM = TINY_DIM,
    HIDDEN = TINY_HIDDEN
};
typedef tiny_step step_out;

/* ---- the kernel ---- */

/* x (f32) and y (bf16) over many binades and both signs, with specials in each at distinct
 * places and, every 20 elements, at a shared place, so a special meets ordinary values and the
 * other input's specials. */
static void fill_inputs(float *x, fsdp_bf16 *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = sinf((float)i * 0.731f) * ldexpf(1.0f, (int)((i * 7) % 40) - 20);
        float u = sinf((float)(i * 3) * 0.517f + 1.0f) * ldexpf(1.0f, (int)((i * 5) % 40) - 20);
        uint32_t b;
        memcpy(&b, &u, 4);
        y[i] = (fsdp_bf16)(b >> 16); /* any bf16 pattern: truncation is enough here */
    }
    static const uint32_t fx[] = {
        0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
        0x7f7f0000u, 0x00000001u, 0x80000001u, 0x00400000u, 0x80000000u, 0x3f800000u,
    };
    static const uint16_t fy[] = {
        0x7fc0u, /* quiet NaN */
        0x7f81u, /* signalling NaN */
        0xffc1u, /* negative NaN with a payload */
        0x7f80u, /* +inf */
        0xff80u, /* -inf */
        0x7f7fu, /* bf16's largest: sums with large f32 overflow */
        0xff7fu, /* its negative */
        0x0001u, /* the smallest bf16 subnormal */
        0x8040u, /* a negative subnormal */
        0x0000u, /* +0 */
        0x8000u, /* -0 */
        0x3f81u, /* 1 + 2^-7 */
    };
    int ns = (int)(sizeof fx / sizeof fx[0]);
    for (int s = 0; s < ns && 20 * s + 12 < n; s++) {
        x[20 * s + 2] = tiny_from_bits(fx[s]);  /* alone among ordinary values */
        y[20 * s + 5] = fy[s];                  /* alone */
        x[20 * s + 11] = tiny_from_bits(fx[s]); /* meeting each other */
        y[20 * s + 11] = fy[(s + 1) % ns];
    }
}

/* add_bf16 on dev (every array `off` elements in: unaligned for the vector path) against add of
 * the widened values on the same device, bit for bit; in place (out is a) and not. */
static void check_add_bf16(fsdp_device dev, int64_t n, int64_t off) {
    float *x = calloc((size_t)n, 4), *want = calloc((size_t)n, 4), *got = calloc((size_t)n, 4);
    fsdp_bf16 *y = calloc((size_t)n, 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x && want && got && y);
    fill_inputs(x, y, n);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->add_bf16);
    fsdp_tensor *a = tiny_on(dev, FSDP_DTYPE_F32, x, n), *b = tiny_on(dev, FSDP_DTYPE_BF16, y, n);
    fsdp_tensor *wide = tiny_on(dev, FSDP_DTYPE_F32, want, n),
                *ref = tiny_on(dev, FSDP_DTYPE_F32, want, n);
    fsdp_tensor *out = tiny_on(dev, FSDP_DTYPE_F32, want, n);
    int64_t m = n - off;
    const float *pa = fsdp_tensor_f32(a) + off;
    const fsdp_bf16 *pb = (const fsdp_bf16 *)fsdp_tensor_data(b) + off;
    float *pw = fsdp_tensor_f32(wide) + off, *pr = fsdp_tensor_f32(ref) + off;
    k->bf16_to_f32(pw, pb, m); /* the path before: widen, then add */
    k->add(pr, pa, pw, m);
    int64_t nan = 0, inf = 0, sub = 0;
    for (int in_place = 0; in_place < 2; in_place++) {
        float *dst = fsdp_tensor_f32(out) + off;
        if (in_place) {
            fsdp_tensor_free(out);
            out = tiny_on(dev, FSDP_DTYPE_F32, x, n);
            dst = fsdp_tensor_f32(out) + off;
        }
        k->add_bf16(dst, in_place ? dst : pa, pb, m);
        tiny_back(want, ref), tiny_back(got, out);
        int64_t d = 0, met = 0;
        for (int64_t i = off; i < n; i++) {
            uint32_t wb = (uint32_t)y[i] << 16;
            if (isnan(x[i]) &&
                isnan(tiny_from_bits(wb))) /* the NaN that propagates is unspecified */
                met++, d += !isnan(got[i]) || !isnan(want[i]);
            else
                d += memcmp(&got[i], &want[i], 4) != 0;
        }
        printf("\n    add_bf16 on %s%s, offset %lld, n %lld: %lld differ (%lld where NaNs meet: "
               "NaN both)",
               fsdp_device_to_string(dev), in_place ? ", in place" : "", (long long)off,
               (long long)m, (long long)d, (long long)met);
        CU_ASSERT_EQUAL(d, 0);
    }
    for (int64_t i = off; i < n; i++) {
        nan += isnan(want[i]) != 0, inf += isinf(want[i]) != 0;
        sub += want[i] != 0.0f && fabsf(want[i]) < 1.17549435e-38f;
    }
    printf("\n    (%lld NaN, %lld inf, %lld subnormal sums)", (long long)nan, (long long)inf,
           (long long)sub);
    CU_ASSERT_TRUE(nan > 0 && inf > 0 && sub > 0); /* the specials reached the sums */
    free(x), free(want), free(got), free(y);
    fsdp_tensor_free(a), fsdp_tensor_free(b), fsdp_tensor_free(wide), fsdp_tensor_free(ref);
    fsdp_tensor_free(out);
}

static void test_kernel_cpu(void) {
    check_add_bf16(FSDP_CPU, 1500, 0);
    check_add_bf16(FSDP_CPU, 1501, 1);
}

/* Over 3 worker threads (the CPU table splits calls of 65536 elements and more), the same bits. */
static void test_kernel_cpu_threads(void) {
    int threads = fsdp_kernels_cpu_workers_start(3, -1);
    printf("\n    %d threads", threads);
    check_add_bf16(FSDP_CPU, 200001, 1);
    fsdp_kernels_cpu_workers_stop();
}

static void test_kernel_device(void) {
    check_add_bf16(fsdp_test_device(), 1500, 0);
    check_add_bf16(fsdp_test_device(), 1501, 1);
}

/* ---- one training step's results on the host ---- */

/* The tiny Llama under `compute` on dev, the bf16 branches on or off (every decoder layer
 * checkpointed when ckpt). */
static fsdp_module *model(fsdp_dtype compute, fsdp_device dev, bool branches16, bool ckpt) {
    fsdp_module *m = tiny_model(compute, dev, ckpt);
    fsdp_nn_llama_set_bf16_branches(m, branches16);
    return m;
}

/* Two steps with the bf16 branches and on the path before, compared; the residual adds that read
 * a bf16 branch counted (bf16: two a layer, twice more with checkpointed layers, whose recompute
 * runs them again; f32: none; the path before: none). */
static void check_model(fsdp_dtype compute, fsdp_device dev, bool ckpt) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_test_device_pin_f32_attention(true);
    fsdp_module *m[2] = {model(compute, dev, true, ckpt), model(compute, dev, false, ckpt)};
    step_out *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    bool b16 = compute == FSDP_DTYPE_BF16;
    for (int s = 0; s < 2; s++) {
        int64_t adds[2];
        for (int i = 0; i < 2; i++) { /* i 0: the bf16 branches; 1: the path before */
            fsdp_llama_test_bf16_branches(NULL);
            FSDP_TEST_OK(tiny_step_of(ctx, m[i], m[i], dev, s, &o[i]));
            fsdp_llama_test_bf16_branches(&adds[i]);
        }
        printf("\n    %s%s step %d: %lld bf16 residual adds (path before: %lld)",
               b16 ? "bf16" : "f32", ckpt ? " checkpointed" : "", s, (long long)adds[0],
               (long long)adds[1]);
        tiny_compare(dev, &o[0], &o[1]);
        CU_ASSERT_EQUAL(adds[0], b16 ? 2 * LAYERS * (ckpt ? 2 : 1) : 0);
        CU_ASSERT_EQUAL(adds[1], 0);
    }
    free(o[0].grads), free(o[1].grads), free(o);
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
}

static void test_bf16_device(void) {
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), false);
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), true);
}

/* ---- activation bytes, and the direct calls ---- */

/* o_proj and down_proj each hold their output (R, D) in bf16 instead of f32: 2 R D bytes fewer
 * a Linear (R = B T rows, D = dim), 4 R D a layer; their bf16 weight copy, input copy and
 * scratch are the same either way. */
static void test_activation_bytes(void) {
    fsdp_module *mn = model(FSDP_DTYPE_BF16, FSDP_CPU, true, false);
    fsdp_module *mo = model(FSDP_DTYPE_BF16, FSDP_CPU, false, false);
    int64_t bn = tiny_forward_bytes(mn), bo = tiny_forward_bytes(mo),
            derived = 4 * N_TOK * DIM * LAYERS;
    printf("\n    activation bytes %lld, path before %lld: %lld fewer (derived 4 R D x %d layers "
           "= %lld)",
           (long long)bn, (long long)bo, (long long)(bo - bn), LAYERS, (long long)derived);
    CU_ASSERT_EQUAL(bo - bn, derived);
    fsdp_module_free(mn), fsdp_module_free(mo);
}

/* The attention and the MLP called directly (as generation calls them), and a decoder layer's
 * output: f32, as before; only the decoder layer's own call of its branches gives bf16. */
static void test_direct_calls_f32(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m = model(FSDP_DTYPE_BF16, FSDP_CPU, true, false);
    fsdp_module *parts[4];
    CU_ASSERT_TRUE_FATAL(
        fsdp_llama_decoder_layer_parts(fsdp_module_find(m, "model.layers.0"), parts));
    fsdp_tensor *x = NULL;
    FSDP_TEST_OK(
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){BATCH, SEQ, DIM}, &x));
    float *px = fsdp_tensor_f32(x);
    for (int64_t i = 0; i < N_TOK * DIM; i++) px[i] = sinf((float)i * 0.37f);
    const fsdp_tensor *a = NULL, *f = NULL, *y = NULL;
    FSDP_TEST_OK(fsdp_module_forward(ctx, parts[1], x, &a));
    FSDP_TEST_OK(fsdp_module_forward(ctx, parts[3], x, &f));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(a), FSDP_DTYPE_F32);
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(f), FSDP_DTYPE_F32);
    fsdp_llama_test_bf16_branches(NULL);
    FSDP_TEST_OK(fsdp_module_forward(ctx, fsdp_module_find(m, "model.layers.0"), x, &y));
    int64_t adds = 0;
    fsdp_llama_test_bf16_branches(&adds);
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    CU_ASSERT_EQUAL(adds, 2);
    printf("\n    direct: attention %s, MLP %s; the layer %s after %lld bf16 adds",
           fsdp_dtype_to_string(fsdp_tensor_dtype(a)), fsdp_dtype_to_string(fsdp_tensor_dtype(f)),
           fsdp_dtype_to_string(fsdp_tensor_dtype(y)), (long long)adds);
    fsdp_tensor_free(x);
    fsdp_module_free(m);
}

/* A post-forward hook that reads the output's dtype into *user. */
static fsdp_status see_dtype(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                             const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    *(fsdp_dtype *)user = fsdp_tensor_dtype(*io);
    return FSDP_OK;
}

/* The rule the attention and the MLP ask by: a Linear gives a bf16 output for a reader that widens
 * it only under the bf16 policy, without a bias and without a post-forward hook (which would read
 * the bf16 tensor: RowwiseParallel's reduces it). The MLP of a policy Llama with a hook on
 * down_proj, asked for a bf16 output, gives f32 (the hook sees f32); without the hook, bf16. */
static void test_linear_rule(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *plain = NULL, *biased = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 4, false, &plain));
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 4, true, &biased));
    CU_ASSERT_FALSE(fsdp_nn_linear_can_give_bf16_output(plain)); /* f32 compute */
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, plain, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, biased, FSDP_DTYPE_BF16));
    CU_ASSERT_TRUE(fsdp_nn_linear_can_give_bf16_output(plain));
    CU_ASSERT_FALSE(fsdp_nn_linear_can_give_bf16_output(biased));
    fsdp_dtype seen = FSDP_DTYPE_BF16;
    int id = -1;
    FSDP_TEST_OK(
        fsdp_module_add_hook(ctx, plain, FSDP_HOOK_POST_FORWARD, see_dtype, &seen, NULL, &id));
    CU_ASSERT_FALSE(fsdp_nn_linear_can_give_bf16_output(plain));
    FSDP_TEST_OK(fsdp_module_remove_hook(ctx, plain, id));
    CU_ASSERT_TRUE(fsdp_nn_linear_can_give_bf16_output(plain));
    fsdp_module_free(plain), fsdp_module_free(biased);

    fsdp_module *m = model(FSDP_DTYPE_BF16, FSDP_CPU, true, false);
    fsdp_module *mlp = fsdp_module_find(m, "model.layers.0.mlp");
    fsdp_module *down = fsdp_module_find(m, "model.layers.0.mlp.down_proj");
    fsdp_tensor *x = NULL;
    FSDP_TEST_OK(
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){BATCH, SEQ, DIM}, &x));
    float *px = fsdp_tensor_f32(x);
    for (int64_t i = 0; i < N_TOK * DIM; i++) px[i] = cosf((float)i * 0.29f);
    const fsdp_tensor *f = NULL;
    FSDP_TEST_OK(
        fsdp_module_add_hook(ctx, down, FSDP_HOOK_POST_FORWARD, see_dtype, &seen, NULL, &id));
    fsdp_llama_mlp_set_bf16_output(mlp, true);
    FSDP_TEST_OK(fsdp_module_forward(ctx, mlp, x, &f));
    printf("\n    asked, down_proj hooked: the hook sees %s, the MLP gives %s",
           fsdp_dtype_to_string(seen), fsdp_dtype_to_string(fsdp_tensor_dtype(f)));
    CU_ASSERT_EQUAL(seen, FSDP_DTYPE_F32);
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(f), FSDP_DTYPE_F32);
    FSDP_TEST_OK(fsdp_module_remove_hook(ctx, down, id));
    FSDP_TEST_OK(fsdp_module_forward(ctx, mlp, x, &f));
    fsdp_llama_mlp_set_bf16_output(mlp, false);
    printf("; not hooked: %s", fsdp_dtype_to_string(fsdp_tensor_dtype(f)));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(f), FSDP_DTYPE_BF16);
    fsdp_tensor_free(x);
    fsdp_module_free(m);
}

/* ---- distributed layouts ---- */

/* Both paths at (dp, tp) under the bf16 policy (tiny_world, the branches switched by
 * fsdp_nn_llama_set_bf16_branches), each rank's results compared. At tp > 1 o_proj and down_proj
 * carry RowwiseParallel's post-forward hook (its Partial output reduced in f32): they keep f32
 * outputs and no bf16 residual add runs; at tp 1 (FSDP's hooks are on the decoder layers) they
 * run as on one rank: two a layer and step on every rank. */
static void check_world(int dp, int tp) {
    tiny_world *r = calloc(2, sizeof *r); /* 0: the bf16 branches; 1: the path before */
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    int64_t adds[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (tiny_world){.compute = FSDP_DTYPE_BF16,
                            .dp = dp,
                            .tp = tp,
                            .prepare = fsdp_nn_llama_set_bf16_branches,
                            .on = i == 0};
        fsdp_llama_test_bf16_branches(NULL);
        tiny_world_run(&r[i]);
        fsdp_llama_test_bf16_branches(&adds[i]);
    }
    printf("\n    (dp, tp) = (%d, %d): %lld bf16 residual adds (path before: %lld)", dp, tp,
           (long long)adds[0], (long long)adds[1]);
    int hosted = tiny_world_compare(&r[0], &r[1]);
    CU_ASSERT_EQUAL(adds[0], tp == 1 ? 2 * LAYERS * 2 * hosted : 0);
    CU_ASSERT_EQUAL(adds[1], 0);
    tiny_world_free(&r[0]), tiny_world_free(&r[1]);
    free(r);
}

static void test_tp(void) {
    check_world(1, TINY_WORLD);
}

static void test_fsdp(void) {
    check_world(TINY_WORLD, 1);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"kernel_cpu", test_kernel_cpu},
        {"kernel_cpu_threads", test_kernel_cpu_threads},
        {"kernel_device", test_kernel_device},
        {"bf16_cpu", test_bf16_cpu},
        {"f32_cpu", test_f32_cpu},
        {"checkpointed_cpu", test_checkpointed_cpu},
        {"bf16_device", test_bf16_device},
        {"activation_bytes", test_activation_bytes},
        {"direct_calls_f32", test_direct_calls_f32},
        {"linear_rule", test_linear_rule},
        {"tp", test_tp},
        {"fsdp", test_fsdp},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "bf16_residual", cases, (int)(sizeof cases / sizeof cases[0]));
}

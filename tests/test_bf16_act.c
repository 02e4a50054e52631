/* test_bf16_act.c: bf16 activation storage under the bf16 compute policy. The Llama keeps q_proj's
 * and k_proj's outputs (read by RoPE), and its MLP keeps
 * gate_proj's and up_proj's outputs and the SwiGLU's output (which down_proj reads as its bf16
 * copy) in bf16 tensors; each decoder layer's norms give their outputs in bf16, which the
 * projections reading them take as their bf16 copy. Checked: the kernels that make and read them
 * (gemm_bf16_round, the SwiGLU on bf16 gate and up, RoPE on bf16 q and k, RMSNorm with a bf16
 * output) bit for bit against the f32 entries on the CPU and the run's device; the tiny Llama
 * under the policy bitwise equal to a copy of the f32-storage path, and to itself with the norms'
 * f32 outputs (fsdp_nn_llama_set_bf16_norms off), on the CPU and on the device (sim, deferred
 * streams: the CPU's bits), also at tp 2 and with every decoder layer checkpointed; its
 * activation bytes, fewer by exactly the derived amount; a bf16 input refused by a Linear, an
 * attention and an MLP outside the policy. The model, its batch and the comparison of two steps
 * are tests/tiny_llama.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx, FSDP_TEST_OK
#include "kernels/kernels.h" // defines: fsdp_kernels_for (the reference's f32 SwiGLU)
#include "llama_steps.h"     // defines: llama_tp_build
#include "nn/llama_common.h" // defines: fsdp_llama_test_attention16
#include "nn/nn.h"           // defines: fsdp_nn_llama_set_bf16_norms
#include "on_device.h"       // defines: fsdp_test_device
#include "tiny_llama.h"      // defines: tiny_model, tiny_step_of, tiny_compare, tiny_on, TINY_*

enum { LAYERS = TINY_LAYERS, DIM = TINY_DIM, HIDDEN = TINY_HIDDEN };

/* ---- the path before bf16 storage, kept as hooks: gate_proj's and up_proj's outputs replaced
 * by the f32 tensors the policy's Linear wrote before (a copy of its forward: the input and the
 * weight rounded to bf16, gemm_bf16 into f32, the sum rounded to bf16 and widened back), so the
 * MLP takes its f32 path: the f32 SwiGLU, and down_proj rounding its f32 input into its own bf16
 * copy, as before. ---- */

typedef struct f32_output {
    const fsdp_tensor *input; /* this forward's */
    fsdp_tensor *x16, *w16, *y16, *y;
    int calls; /* outputs replaced */
} f32_output;

static void f32_output_free(void *user) {
    f32_output *o = user;
    fsdp_tensor_free(o->x16), fsdp_tensor_free(o->w16), fsdp_tensor_free(o->y16);
    fsdp_tensor_free(o->y);
    free(o);
}

static fsdp_status keep_input(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    ((f32_output *)user)->input = *io;
    return FSDP_OK;
}

/* *t: a fresh tensor of dtype on dev (the last one freed) */
static fsdp_status fresh(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_dtype dtype, fsdp_device dev,
                         int64_t rows, int64_t cols) {
    fsdp_tensor_free(*t);
    *t = NULL;
    return fsdp_tensor_create(ctx, dtype, dev, 2, (int64_t[]){rows, cols}, t);
}

static fsdp_status f32_output_of(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user) {
    (void)point;
    f32_output *o = user;
    const fsdp_tensor *w = fsdp_param_data(fsdp_module_param(m, 0));
    fsdp_device dev = fsdp_tensor_device(w);
    int64_t OC = fsdp_tensor_dim(w, 0), C = fsdp_tensor_dim(w, 1);
    int64_t rows = fsdp_tensor_numel(o->input) / C;
    if (fsdp_tensor_dtype(o->input) != FSDP_DTYPE_F32) return FSDP_ERR_INTERNAL;
    FSDP_TRY_AT(ctx, fresh(ctx, &o->x16, FSDP_DTYPE_BF16, dev, rows, C));
    FSDP_TRY_AT(ctx, fresh(ctx, &o->w16, FSDP_DTYPE_BF16, dev, OC, C));
    FSDP_TRY_AT(ctx, fresh(ctx, &o->y16, FSDP_DTYPE_BF16, dev, rows, OC));
    fsdp_tensor_free(o->y); /* f32, of the output's shape */
    o->y = NULL;
    FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, fsdp_tensor_ndim(*io),
                                        fsdp_tensor_shape(*io), &o->y));
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    k->f32_to_bf16(fsdp_tensor_data(o->x16), fsdp_tensor_f32(o->input), rows * C);
    k->f32_to_bf16(fsdp_tensor_data(o->w16), fsdp_tensor_f32(w), OC * C);
    k->gemm_bf16(false, true, rows, OC, C, 1.0f, fsdp_tensor_data(o->x16), C,
                 fsdp_tensor_data(o->w16), C, 0.0f, fsdp_tensor_f32(o->y), OC);
    k->f32_to_bf16(fsdp_tensor_data(o->y16), fsdp_tensor_f32(o->y), rows * OC);
    k->bf16_to_f32(fsdp_tensor_f32(o->y), fsdp_tensor_data(o->y16), rows * OC);
    *io = o->y;
    o->calls++;
    return FSDP_OK;
}

/* The Linears whose outputs are bf16 tensors under the policy, per decoder layer, and
 * down_proj, which takes the SwiGLU's bf16 output as its input (the last entry). */
enum { KEPT16 = 4, PER_LAYER = KEPT16 + 1 };
static const char *const BF16_PROJ[PER_LAYER] = {"self_attn.q_proj", "self_attn.k_proj",
                                                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

static fsdp_module *proj(fsdp_module *m, int layer, int j) {
    char name[64];
    snprintf(name, sizeof name, "model.layers.%d.%s", layer, BF16_PROJ[j]);
    fsdp_module *lin = fsdp_module_find(m, name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(lin);
    return lin;
}

/* Puts the f32 path's hooks on q_proj, k_proj, gate_proj and up_proj of every decoder layer;
 * outs[KEPT16 i + j] is layer i's BF16_PROJ[j]. */
static void use_f32_path(fsdp_module *m, f32_output *outs[KEPT16 * LAYERS]) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int i = 0; i < KEPT16 * LAYERS; i++) {
        fsdp_module *lin = proj(m, i / KEPT16, i % KEPT16);
        f32_output *o = calloc(1, sizeof *o);
        CU_ASSERT_PTR_NOT_NULL_FATAL(o);
        outs[i] = o;
        FSDP_TEST_OK(
            fsdp_module_add_hook(ctx, lin, FSDP_HOOK_PRE_FORWARD, keep_input, o, NULL, NULL));
        FSDP_TEST_OK(fsdp_module_add_hook(ctx, lin, FSDP_HOOK_POST_FORWARD, f32_output_of, o,
                                          f32_output_free, NULL));
    }
}

/* Counts the bf16 tensors passing a hook point (the new path is taken, so the comparison is not
 * of a path with itself). */
static fsdp_status count_bf16(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    *(int *)user += fsdp_tensor_dtype(*io) == FSDP_DTYPE_BF16;
    return FSDP_OK;
}

/* The decoder layer's norms, whose outputs are bf16 tensors under the policy. */
enum { NORMS = 2 };
static const char *const NORM_NAMES[NORMS] = {"input_layernorm", "post_attention_layernorm"};

/* count: the bf16 outputs of q_proj, k_proj, gate_proj and up_proj and bf16 inputs of
 * down_proj, every layer (PER_LAYER a forward); norms (may be NULL): the bf16 outputs of the
 * norms, every layer (NORMS a forward) */
static void count_bf16_tensors(fsdp_module *m, int *count, int *norms) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int i = 0; i < LAYERS; i++) {
        for (int j = 0; j < PER_LAYER; j++)
            FSDP_TEST_OK(fsdp_module_add_hook(
                ctx, proj(m, i, j), j == KEPT16 ? FSDP_HOOK_PRE_FORWARD : FSDP_HOOK_POST_FORWARD,
                count_bf16, count, NULL, NULL));
        for (int j = 0; norms && j < NORMS; j++) {
            char name[64];
            snprintf(name, sizeof name, "model.layers.%d.%s", i, NORM_NAMES[j]);
            fsdp_module *n = fsdp_module_find(m, name);
            CU_ASSERT_PTR_NOT_NULL_FATAL(n);
            FSDP_TEST_OK(fsdp_module_add_hook(ctx, n, FSDP_HOOK_POST_FORWARD, count_bf16, norms,
                                              NULL, NULL));
        }
    }
}

/* Two steps of a and b on dev, both on batch 0 (the second on the buffers of the first), their
 * results compared after each (tiny_compare: loss, logits and every gradient bit for bit on the
 * CPU and sim; on CUDA within 5e-2 relative plus 1e-3); bytes (may be NULL) the models'
 * activation bytes right after the last forward. */
static void step_both(fsdp_device dev, fsdp_module *a, fsdp_module *b, int64_t bytes[2]) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    tiny_step *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (int s = 0; s < 2; s++) {
        FSDP_TEST_OK(tiny_step_of(ctx, a, a, dev, 0, &o[0]));
        FSDP_TEST_OK(tiny_step_of(ctx, b, b, dev, 0, &o[1]));
        printf("\n    step %d:", s);
        tiny_compare(dev, &o[0], &o[1]);
    }
    if (bytes) bytes[0] = o[0].forward_bytes, bytes[1] = o[1].forward_bytes;
    free(o[0].grads), free(o[1].grads), free(o);
}

/* ---- the kernels ---- */

/* swiglu_forward_bf16 and swiglu_backward_bf16 against the f32 entries on the widened inputs
 * (the forward then f32_to_bf16) on the same device, bit for bit: 1500 values (not a multiple of
 * the CPU's block of 512) over [-40, 40] where silu saturates, with zeros, +-inf, NaN, bf16's
 * largest value and a subnormal among them. */
static void check_swiglu(fsdp_device dev) {
    enum { N = 1500 };
    static fsdp_bf16 g16[N], u16[N], want16[N], got16[N];
    static float g[N], u[N], dy[N], r[4][N];
    for (int i = 0; i < N; i++) {
        g16[i] = fsdp_bf16_from_f32(-40.0f + 80.0f * (float)((i * 7919) % N) / N);
        u16[i] = fsdp_bf16_from_f32(-3.0f + 6.0f * (float)((i * 104729) % N) / N);
        dy[i] = -1.0f + 2.0f * (float)((i * 31) % N) / N;
    }
    const fsdp_bf16 special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f7f, 0x0001};
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++)
        g16[i * 11] = special[i], u16[i * 13 + 1] = special[i];
    for (int i = 0; i < N; i++) g[i] = fsdp_bf16_to_f32(g16[i]), u[i] = fsdp_bf16_to_f32(u16[i]);
    fsdp_tensor *gd = tiny_on(dev, FSDP_DTYPE_BF16, g16, N),
                *ud = tiny_on(dev, FSDP_DTYPE_BF16, u16, N);
    fsdp_tensor *gw = tiny_on(dev, FSDP_DTYPE_F32, g, N), *uw = tiny_on(dev, FSDP_DTYPE_F32, u, N);
    fsdp_tensor *dyd = tiny_on(dev, FSDP_DTYPE_F32, dy, N);
    fsdp_tensor *t[4], *y16 = tiny_on(dev, FSDP_DTYPE_BF16, NULL, N),
                       *w16 = tiny_on(dev, FSDP_DTYPE_BF16, NULL, N);
    for (int i = 0; i < 4; i++) t[i] = tiny_on(dev, FSDP_DTYPE_F32, NULL, N);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->swiglu_forward_bf16 && k->swiglu_backward_bf16);
    k->swiglu_forward(fsdp_tensor_f32(t[0]), fsdp_tensor_f32(gw), fsdp_tensor_f32(uw), N);
    k->f32_to_bf16(fsdp_tensor_data(w16), fsdp_tensor_f32(t[0]), N);
    k->swiglu_forward_bf16(fsdp_tensor_data(y16), fsdp_tensor_data(gd), fsdp_tensor_data(ud), N);
    k->swiglu_backward(fsdp_tensor_f32(t[0]), fsdp_tensor_f32(t[1]), fsdp_tensor_f32(dyd),
                       fsdp_tensor_f32(gw), fsdp_tensor_f32(uw), N);
    k->swiglu_backward_bf16(fsdp_tensor_f32(t[2]), fsdp_tensor_f32(t[3]), fsdp_tensor_f32(dyd),
                            fsdp_tensor_data(gd), fsdp_tensor_data(ud), N);
    tiny_back(want16, w16), tiny_back(got16, y16);
    for (int i = 0; i < 4; i++) tiny_back(r[i], t[i]);
    int64_t nan = 0, df = 0, dg = tiny_differ(r[2], r[0], N), du = tiny_differ(r[3], r[1], N);
    for (int i = 0; i < N; i++) nan += (want16[i] & 0x7fff) > 0x7f80, df += got16[i] != want16[i];
    printf("\n    swiglu on %s: %lld, %lld, %lld of %d differ (forward, dgate, dup; %lld NaN)",
           fsdp_device_to_string(dev), (long long)df, (long long)dg, (long long)du, N,
           (long long)nan);
    CU_ASSERT_TRUE(df == 0 && dg == 0 && du == 0);
    CU_ASSERT_TRUE(nan > 0); /* the specials reached the rounding */
    fsdp_tensor *all[] = {gd, ud, gw, uw, dyd, y16, w16, t[0], t[1], t[2], t[3]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
}

/* gemm_bf16_round against gemm_bf16 (alpha 1, beta 0) then f32_to_bf16 on the same device: bit
 * for bit on the CPU and sim, for the four transpositions, M 45, N 150, K 300 (over the CPU's
 * blocks of 32 rows, 128 columns and 128 of K, with partial ones), C's row stride 160, and K 0
 * (zeros). On CUDA cuBLAS may sum in another order for a bf16 C: within one bf16 rounding. */
static void check_gemm(fsdp_device dev) {
    enum { M = 45, N = 150, K = 300, LDC = 160 };
    static fsdp_bf16 A[M * K], B[K * N], want[M * LDC], got[M * LDC];
    for (int i = 0; i < M * K; i++) A[i] = fsdp_bf16_from_f32(sinf((float)i * 0.37f) * 2.0f);
    for (int i = 0; i < K * N; i++) B[i] = fsdp_bf16_from_f32(cosf((float)i * 0.11f));
    fsdp_tensor *ad = tiny_on(dev, FSDP_DTYPE_BF16, A, M * K),
                *bd = tiny_on(dev, FSDP_DTYPE_BF16, B, K * N);
    fsdp_tensor *c32 = tiny_on(dev, FSDP_DTYPE_F32, NULL, M * LDC);
    fsdp_tensor *w = tiny_on(dev, FSDP_DTYPE_BF16, NULL, M * LDC),
                *g = tiny_on(dev, FSDP_DTYPE_BF16, NULL, M * LDC);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->gemm_bf16_round);
    for (int t = 0; t < 5; t++) {
        bool ta = t & 1, tb = t & 2;
        int64_t kk = t == 4 ? 0 : K;
        int64_t lda = ta ? M : K,
                ldb = tb ? K : N; /* A, B read as (M, K) and (K, N) or transposed */
        FSDP_TEST_OK(fsdp_tensor_fill(fsdp_test_ctx(), c32, 0.0f));
        k->gemm_bf16(ta, tb, M, N, kk, 1.0f, fsdp_tensor_data(ad), lda, fsdp_tensor_data(bd), ldb,
                     0.0f, fsdp_tensor_f32(c32), LDC);
        k->f32_to_bf16(fsdp_tensor_data(w), fsdp_tensor_f32(c32), M * LDC);
        FSDP_TEST_OK(fsdp_tensor_fill(fsdp_test_ctx(), g, 0.0f));
        k->gemm_bf16_round(ta, tb, M, N, kk, fsdp_tensor_data(ad), lda, fsdp_tensor_data(bd), ldb,
                           fsdp_tensor_data(g), LDC);
        tiny_back(want, w), tiny_back(got, g);
        int64_t d = 0, far = 0, nonzero = 0;
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++) {
                float x = fsdp_bf16_to_f32(got[r * LDC + c]),
                      y = fsdp_bf16_to_f32(want[r * LDC + c]);
                d += got[r * LDC + c] != want[r * LDC + c];
                far += fabsf(x - y) > 0x1p-7f * fabsf(y); /* beyond one bf16 spacing */
                nonzero += y != 0.0f;
            }
        printf("\n    gemm_bf16_round on %s, %s%s K %lld: %lld of %d differ",
               fsdp_device_to_string(dev), ta ? "A^T" : "A", tb ? " B^T" : " B", (long long)kk,
               (long long)d, M * N);
        bool cuda = fsdp_test_device_is_cuda() && dev.type != FSDP_DEVICE_CPU;
        CU_ASSERT_EQUAL(cuda ? far : d, 0);
        CU_ASSERT_TRUE(kk == 0 ? nonzero == 0 : nonzero > M * N / 2);
    }
    fsdp_tensor *all[] = {ad, bd, c32, w, g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
}

/* rope_qk_forward_bf16 against rope_qk_forward on the widened q and k, on the same device, bit
 * for bit: B 2, T 5, 4 query heads and 2 key/value heads of 8, angles of several turns, with
 * infinities and NaN among the inputs. */
static void check_rope(fsdp_device dev) {
    enum { B = 2, T = 5, NH = 4, NKV = 2, D = 8, NQ = B * T * NH * D, NK = B * T * NKV * D };
    static fsdp_bf16 q16[NQ], k16[NK];
    static float q[NQ], k[NK], cs[2 * T * D / 2], r[4][NQ];
    for (int i = 0; i < NQ; i++) q16[i] = fsdp_bf16_from_f32(sinf((float)i * 1.7f) * 3.0f);
    for (int i = 0; i < NK; i++) k16[i] = fsdp_bf16_from_f32(cosf((float)i * 0.9f) * 2.0f);
    q16[3] = 0x7f80, q16[17] = 0x7fc0, k16[5] = 0xff80;
    for (int i = 0; i < NQ; i++) q[i] = fsdp_bf16_to_f32(q16[i]);
    for (int i = 0; i < NK; i++) k[i] = fsdp_bf16_to_f32(k16[i]);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D / 2; i++) {
            float ang = (float)t * powf(10000.0f, -(float)(2 * i) / D) * 7.0f;
            cs[t * D / 2 + i] = cosf(ang), cs[T * D / 2 + t * D / 2 + i] = sinf(ang);
        }
    fsdp_tensor *qd = tiny_on(dev, FSDP_DTYPE_BF16, q16, NQ),
                *kd = tiny_on(dev, FSDP_DTYPE_BF16, k16, NK);
    fsdp_tensor *qw = tiny_on(dev, FSDP_DTYPE_F32, q, NQ),
                *kw = tiny_on(dev, FSDP_DTYPE_F32, k, NK);
    fsdp_tensor *csd = tiny_on(dev, FSDP_DTYPE_F32, cs, 2 * T * D / 2), *t[4];
    for (int i = 0; i < 4; i++) t[i] = tiny_on(dev, FSDP_DTYPE_F32, NULL, i % 2 ? NK : NQ);
    const fsdp_kernels_i *kt = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(kt->rope_qk_forward_bf16);
    const float *c = fsdp_tensor_f32(csd), *sn = c + T * D / 2;
    kt->rope_qk_forward(fsdp_tensor_f32(t[0]), fsdp_tensor_f32(t[1]), fsdp_tensor_f32(qw),
                        fsdp_tensor_f32(kw), c, sn, B, T, NH, NKV, D);
    kt->rope_qk_forward_bf16(fsdp_tensor_f32(t[2]), fsdp_tensor_f32(t[3]), fsdp_tensor_data(qd),
                             fsdp_tensor_data(kd), c, sn, B, T, NH, NKV, D);
    for (int i = 0; i < 4; i++) tiny_back(r[i], t[i]);
    int64_t dq = tiny_differ(r[2], r[0], NQ), dk = tiny_differ(r[3], r[1], NK), nan = 0;
    for (int i = 0; i < NQ; i++) nan += isnan(r[0][i]);
    printf("\n    rope on %s: %lld, %lld differ (q, k; %lld NaN)", fsdp_device_to_string(dev),
           (long long)dq, (long long)dk, (long long)nan);
    CU_ASSERT_TRUE(dq == 0 && dk == 0);
    CU_ASSERT_TRUE(nan > 0);
    fsdp_tensor *all[] = {qd, kd, qw, kw, csd, t[0], t[1], t[2], t[3]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
}

/* rmsnorm_forward_bf16 against rmsnorm_forward then f32_to_bf16 on the same device, bit for bit
 * (the output's bf16 bits and rstd's f32 bits): 6 rows of 1100 (over the CPU's blocks of 512,
 * with a partial one), a row of zeros, a row with an infinity (rstd 0: a NaN there, zeros
 * elsewhere), a row with a NaN (a NaN row), and a weight of 3e38 in one column, whose products
 * overflow bf16's range to infinity. */
static void check_norm(fsdp_device dev) {
    enum { R = 6, C = 1100, N = R * C };
    static float x[N], w[C], rs[2][R];
    static fsdp_bf16 want16[N], got16[N];
    for (int i = 0; i < N; i++) x[i] = sinf((float)i * 0.731f) * (1.0f + (float)(i % 97));
    for (int c = 0; c < C; c++) w[c] = 0.5f + cosf((float)c * 0.29f);
    w[700] = 3e38f;
    for (int c = 0; c < C; c++) x[C + c] = 0.0f;
    x[2 * C + 5] = INFINITY, x[3 * C + 1099] = NAN;
    fsdp_tensor *xd = tiny_on(dev, FSDP_DTYPE_F32, x, N), *wd = tiny_on(dev, FSDP_DTYPE_F32, w, C);
    fsdp_tensor *yd = tiny_on(dev, FSDP_DTYPE_F32, NULL, N),
                *r0 = tiny_on(dev, FSDP_DTYPE_F32, NULL, R),
                *r1 = tiny_on(dev, FSDP_DTYPE_F32, NULL, R);
    fsdp_tensor *wantd = tiny_on(dev, FSDP_DTYPE_BF16, NULL, N),
                *gotd = tiny_on(dev, FSDP_DTYPE_BF16, NULL, N);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->rmsnorm_forward_bf16);
    k->rmsnorm_forward(fsdp_tensor_f32(yd), fsdp_tensor_f32(r0), fsdp_tensor_f32(xd),
                       fsdp_tensor_f32(wd), 1e-5f, R, C);
    k->f32_to_bf16(fsdp_tensor_data(wantd), fsdp_tensor_f32(yd), N);
    k->rmsnorm_forward_bf16(fsdp_tensor_data(gotd), fsdp_tensor_f32(r1), fsdp_tensor_f32(xd),
                            fsdp_tensor_f32(wd), 1e-5f, R, C);
    tiny_back(want16, wantd), tiny_back(got16, gotd), tiny_back(rs[0], r0), tiny_back(rs[1], r1);
    int64_t nan = 0, inf = 0, dy = 0, dr = tiny_differ(rs[1], rs[0], R);
    for (int i = 0; i < N; i++)
        nan += (want16[i] & 0x7fff) > 0x7f80, inf += (want16[i] & 0x7fff) == 0x7f80,
            dy += got16[i] != want16[i];
    printf("\n    rmsnorm on %s: %lld, %lld differ (out of %d, rstd of %d; %lld NaN, %lld inf)",
           fsdp_device_to_string(dev), (long long)dy, (long long)dr, N, R, (long long)nan,
           (long long)inf);
    CU_ASSERT_TRUE(dy == 0 && dr == 0);
    CU_ASSERT_TRUE(nan > C && inf > 0); /* the specials reached the rounding */
    fsdp_tensor *all[] = {xd, wd, yd, r0, r1, wantd, gotd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
}

static void test_kernels(void) {
    check_norm(FSDP_CPU);
    check_norm(fsdp_test_device());
    check_rope(FSDP_CPU);
    check_rope(fsdp_test_device());
    check_swiglu(FSDP_CPU);
    check_swiglu(fsdp_test_device());
    check_gemm(FSDP_CPU);
    check_gemm(fsdp_test_device());
}

/* ---- the model, bitwise the path before ---- */

/* Two steps of the policy's Llama (step_both) against the same model on the f32 path's hooks
 * with its norms' outputs in f32, on dev: loss, logits and every gradient bit for bit on the CPU
 * and sim. On CUDA cuBLAS may sum gate's and up's products in another order when it writes bf16
 * (gemm_bf16_round) than into f32, and a sum near a rounding boundary then rounds to the
 * neighbouring bf16 value (2^-7 relative), which later layers carry on: there within
 * test_autocast's device tolerance, 5e-2 relative plus 1e-3. The attention is pinned to the f32
 * kernels: by default CUDA runs the bf16 q and k of the storage path on cuDNN's bf16 attention
 * and the f32 path's on the f32 kernels, which is not the difference this compares. */
static void check_bitwise(fsdp_device dev) {
    fsdp_test_device_pin_f32_attention(true);
    /* the attention on f32 q, k, v and output in both (the f32-storage path cannot run it on
     * bf16 tensors, which rounds q and k after RoPE: test_attn16 and test_autocast cover that) */
    fsdp_llama_test_attention16(true, NULL);
    /* moved to dev before hooks are added (fsdp_module_to's rule) */
    fsdp_module *mb = tiny_model(FSDP_DTYPE_BF16, dev, false),
                *mf = tiny_model(FSDP_DTYPE_BF16, dev, false);
    f32_output *outs[KEPT16 * LAYERS];
    fsdp_nn_llama_set_bf16_norms(mf, false); /* the projections' inputs f32, as before */
    use_f32_path(mf, outs);
    int bf16_tensors = 0, bf16_tensors_f = 0, norms16 = 0, norms16_f = 0;
    count_bf16_tensors(mb, &bf16_tensors, &norms16);
    count_bf16_tensors(mf, &bf16_tensors_f, &norms16_f); /* after the f32 path's hooks */
    step_both(dev, mb, mf, NULL);
    /* each path ran: bf16 q, k, gate, up and SwiGLU output in one model (5 per layer and step),
     * none in the other, whose 4 projections per layer had their outputs replaced each step */
    CU_ASSERT_EQUAL(bf16_tensors, 2 * PER_LAYER * LAYERS);
    CU_ASSERT_EQUAL(bf16_tensors_f, 0);
    CU_ASSERT_EQUAL(norms16, 2 * NORMS * LAYERS);
    CU_ASSERT_EQUAL(norms16_f, 0);
    for (int i = 0; i < KEPT16 * LAYERS; i++) CU_ASSERT_EQUAL(outs[i]->calls, 2);
    fsdp_module_free(mb), fsdp_module_free(mf);
    int64_t ran = -1;
    fsdp_llama_test_attention16(false, &ran);
    CU_ASSERT_EQUAL(ran, 0);
    fsdp_test_device_pin_f32_attention(false);
}

static void test_bitwise_cpu(void) {
    check_bitwise(FSDP_CPU);
}

static void test_bitwise_device(void) {
    check_bitwise(fsdp_test_device());
}

/* Every decoder layer checkpointed: the bf16 buffers released after forward and recreated by
 * the recompute give the same logits, loss and gradients bit for bit over two steps, and after
 * forward only the layers' kept outputs remain, fewer bytes than without checkpointing. */
static void test_checkpointed(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *mb = tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false),
                *mc = tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, true);
    int bf16_tensors = 0, norms16 = 0;
    count_bf16_tensors(mc, &bf16_tensors, &norms16);
    int64_t bytes[2] = {0, 0}, mlp_c = -1; /* after forward: not checkpointed, checkpointed */
    step_both(FSDP_CPU, mb, mc, bytes);
    FSDP_TEST_OK(
        fsdp_module_activation_bytes(ctx, fsdp_module_find(mc, "model.layers.0.mlp"), &mlp_c));
    printf("\n    after forward: %lld bytes checkpointed, %lld not", (long long)bytes[1],
           (long long)bytes[0]);
    CU_ASSERT_TRUE(bytes[1] < bytes[0]);
    CU_ASSERT_EQUAL(mlp_c, 0); /* released after backward */
    /* the bf16 path ran in the forwards and the recomputes: 5 tensors and the 2 norms' outputs
     * per layer, 2 runs a step */
    CU_ASSERT_EQUAL(bf16_tensors, 2 * 2 * PER_LAYER * LAYERS);
    CU_ASSERT_EQUAL(norms16, 2 * 2 * NORMS * LAYERS);
    fsdp_module_free(mb), fsdp_module_free(mc);
}

/* ---- the norms' bf16 outputs, bitwise the path without them ---- */

/* Two steps of the policy's Llama with its norms' outputs in bf16 (the default) against the
 * same model with them in f32 (fsdp_nn_llama_set_bf16_norms off: each projection rounds the f32
 * output into its own bf16 copy, the path before), on dev: loss, logits and every gradient bit
 * for bit on the CPU and sim. The projections' GEMMs read the same bf16 values either way, so
 * CUDA should agree bit for bit too (not run here: there within check_bitwise's bound); the
 * attention pinned to the f32 kernels as there. */
static void check_norms16(fsdp_device dev) {
    fsdp_test_device_pin_f32_attention(true);
    fsdp_module *mb = tiny_model(FSDP_DTYPE_BF16, dev, false),
                *mo = tiny_model(FSDP_DTYPE_BF16, dev, false);
    fsdp_nn_llama_set_bf16_norms(mo, false);
    int proj16 = 0, proj16_o = 0, norms16 = 0, norms16_o = 0;
    count_bf16_tensors(mb, &proj16, &norms16);
    count_bf16_tensors(mo, &proj16_o, &norms16_o);
    step_both(dev, mb, mo, NULL);
    /* each path ran: the norms' bf16 outputs (2 a layer and step) in one model only; the other
     * projection-level bf16 tensors in both */
    CU_ASSERT_EQUAL(norms16, 2 * NORMS * LAYERS);
    CU_ASSERT_EQUAL(norms16_o, 0);
    CU_ASSERT_EQUAL(proj16, 2 * PER_LAYER * LAYERS);
    CU_ASSERT_EQUAL(proj16_o, 2 * PER_LAYER * LAYERS);
    fsdp_module_free(mb), fsdp_module_free(mo);
    fsdp_test_device_pin_f32_attention(false);
}

static void test_norms16_cpu(void) {
    check_norms16(FSDP_CPU);
}

static void test_norms16_device(void) {
    check_norms16(fsdp_test_device());
}

/* ---- the same at tp 2 ---- */

/* The projections that read a norm's output, per decoder layer. */
enum { READERS = 5 };
static const char *const READER_NAMES[READERS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"};

/* One step of the policy's Llama under the TP plan at tp 2 (lm_head's output Replicate, the
 * plain loss) on dev, norms16 or not; *in16 counts the bf16 inputs reaching the readers (after
 * the TP hooks' redistribution), *gathered the forward's all_gather bytes on tp. */
static fsdp_status tp_step(fsdp_ctx *ctx, fsdp_device dev, bool norms16, tiny_step *o, int *in16,
                           int64_t *gathered) {
    fsdp_llama_config cfg = tiny_llama_config(FSDP_DTYPE_BF16);
    llama_tp l = {0};
    fsdp_status st = fsdp_ctx_set_device(ctx, dev);
    if (st == FSDP_OK) st = llama_tp_build(ctx, &cfg, 1, 2, false, 99, dev, &l);
    if (st == FSDP_OK) fsdp_nn_llama_set_bf16_norms(l.m, norms16);
    for (int i = 0; st == FSDP_OK && i < LAYERS * READERS; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.%s", i / READERS, READER_NAMES[i % READERS]);
        fsdp_module *p = fsdp_module_find(l.m, name);
        st = p ? fsdp_module_add_hook(ctx, p, FSDP_HOOK_PRE_FORWARD, count_bf16, in16, NULL, NULL)
               : FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "no %s", name);
    }
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = tiny_step_of(ctx, l.m, l.m, dev, 0, o);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK)
        *gathered =
            fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_ALL_GATHER,
                                                           .group = "tp",
                                                           .phase = FSDP_COMM_PHASE_FORWARD})
                .bytes;
    llama_tp_free(&l);
    return st;
}

/* Elements of a and b (n) that differ: bit for bit, or on CUDA beyond check_bitwise's bound. */
static int64_t tp_differ(bool cuda, const float *a, const float *b, int64_t n) {
    if (!cuda) return tiny_differ(a, b, n);
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += !(fabsf(a[i] - b[i]) <= 1e-3f + 5e-2f * fabsf(b[i]));
    return d;
}

/* On every rank, on the CPU then on the run's device: the step with the norms' bf16 outputs
 * against the step without, loss, logits and this rank's gradients bit for bit (CUDA: within the
 * bound). The bf16 outputs travel through SequenceParallel and the attention's and MLP's
 * PrepareModuleInput (Shard(1) -> Replicate all_gathers, in bf16: each of the 2 a layer gathers
 * (B, T, dim) at 2 bytes an element instead of 4) and reach all five readers as bf16. */
static fsdp_status norms16_tp_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_test_device_pin_f32_attention(true);
    fsdp_device devs[2] = {FSDP_CPU, fsdp_test_device()};
    tiny_step *run[2] = {calloc(1, sizeof(tiny_step)), calloc(1, sizeof(tiny_step))};
    fsdp_status st = run[0] && run[1] ? FSDP_OK : FSDP_ERR_OUT_OF_MEMORY;
    for (int d = 0; st == FSDP_OK && d < 2; d++) {
        int in16[2] = {0, 0};
        int64_t gathered[2] = {0, 0};
        for (int r = 0; st == FSDP_OK && r < 2; r++)
            st = tp_step(ctx, devs[d], r == 0, run[r], &in16[r], &gathered[r]);
        if (st != FSDP_OK) break;
        bool cuda = d == 1 && fsdp_test_device_is_cuda();
        int64_t dl = tp_differ(cuda, &run[0]->loss, &run[1]->loss, 1),
                dy = tp_differ(cuda, run[0]->logits, run[1]->logits, TINY_TOKENS * TINY_VOCAB),
                dg = run[0]->n_grads == run[1]->n_grads
                         ? tp_differ(cuda, run[0]->grads, run[1]->grads, run[0]->n_grads)
                         : -1;
        if (rank == 0)
            printf("\n    tp 2 on %s, rank 0: %lld, %lld, %lld differ (loss, logits, %lld "
                   "gradients); bf16 inputs %d and %d; forward all_gather %lld and %lld B",
                   fsdp_device_to_string(devs[d]), (long long)dl, (long long)dy, (long long)dg,
                   (long long)run[0]->n_grads, in16[0], in16[1], (long long)gathered[0],
                   (long long)gathered[1]);
        FSDP_RANK_CHECK(ctx, dl == 0 && dy == 0 && dg == 0,
                        "rank %d on %s: the norms' bf16 outputs changed %lld, %lld, %lld of the "
                        "loss, logits and gradients",
                        rank, fsdp_device_to_string(devs[d]), (long long)dl, (long long)dy,
                        (long long)dg);
        FSDP_RANK_CHECK(ctx, in16[0] == READERS * LAYERS && in16[1] == 0,
                        "rank %d: %d and %d bf16 inputs reached the projections (want %d and 0)",
                        rank, in16[0], in16[1], READERS * LAYERS);
        FSDP_RANK_CHECK(ctx,
                        gathered[1] - gathered[0] == 2 * LAYERS * 2 * (int64_t)TINY_TOKENS * DIM,
                        "rank %d: forward all_gather bytes %lld with bf16 norms, %lld without",
                        rank, (long long)gathered[0], (long long)gathered[1]);
    }
    for (int r = 0; r < 2; r++)
        if (run[r]) free(run[r]->grads), free(run[r]);
    fsdp_test_device_pin_f32_attention(false);
    return st;
}

static void test_norms16_tp(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, norms16_tp_rank, NULL));
}

/* ---- the activation bytes ---- */

/* fsdp_module_activation_bytes of the policy's tiny Llama right after a forward, measured by
 * this suite's `step` on the code before bf16 storage (commit a9991fb: gate_proj's, up_proj's
 * and the SwiGLU's outputs in f32, down_proj's own bf16 copy of the last), where one MLP held
 * mlp_bytes + 8 R H + 4 R D + 6 H D (its weights' copies, now mirrors) = 28672: activation bytes
 * are sizes, the same on every machine. The attention's q_proj and k_proj outputs were f32 too, and
 * so were the norms' outputs. */
static const int64_t BYTES_BEFORE = 142144;

/* The MLP's activations under the policy (R rows, D dim, H hidden), each Linear holding its
 * output, its bf16 scratch (2 R max(out, in)) and its input's bf16 copy (2 R in) unless the input
 * is bf16 (the norm's output); its weight's bf16 copy (2 out in) is no activation now but the
 * weight's mirror (src/nn/mirror.c, parameter state the optimizer writes), 2 out in fewer for
 * every Linear (the 15 of the model: weights in all):
 *   gate_proj, up_proj: 2 R H (bf16 output; before 4 R H, f32) (before also + 2 R D, its
 *     copy of the norm's f32 output, and + 2 H D, its weight's copy; no scratch: below)
 *   SwiGLU output: 2 R H in bf16 (before: 4 R H in f32)
 *   down_proj: 2 R D (bf16 output, read widened by the residual add; before 4 R D, f32) +
 *     2 R max(D, H) (before: + 2 R H, its copy of the SwiGLU output, and + 2 D H)
 * so each MLP holds 2 R H x 4 = 8 R H bytes fewer, 2 R D x 2 without gate's and up's copies and
 * 2 R D for down_proj's bf16 output; each attention 2 R (NH + NKV) hd fewer (q_proj's and
 * k_proj's outputs, (R, NH hd) and (R, NKV hd), in bf16 instead of f32), 2 R D x 3 (q's, k's and
 * v's copies) and 2 R D (o_proj's bf16 output); each norm's output 2 R D (bf16 instead of f32).
 * Per layer 14 R D for the norms' bf16 outputs, 4 R D for o_proj's and down_proj's; and once,
 * 4 R D for the final norm's (model.norm's bf16 output, 2 R D, which lm_head reads as its bf16
 * copy, 2 R D). And
 * gate_proj, up_proj, q_proj and k_proj hold no bf16 scratch (2 R max(out, in) each): their output
 * gradients come rounded to bf16 from the SwiGLU's and RoPE's backward (swiglu_backward_bf16_round,
 * rope_qk_backward_round), so they round none of their own. The attention on bf16 tensors
 * (docs/models.md) holds per layer 2 R kv fewer for v_proj's bf16 output (kv = NKV hd), 2 R
 * (2 q + kv) for the rotated q, k and its output in bf16 (q = NH hd), 2 R q without o_proj's
 * copy of its input and 2 R max(kv, D) without v_proj's scratch (its output gradient comes in
 * bf16 from the attention), and 16 T (NH + NKV) hd more for its larger scratch (one batch's
 * tensors widened, FSDP_ATTENTION_BF16_SCRATCH). */
static int64_t attention16_saved(int64_t R, int64_t T) {
    const int64_t q = DIM, kv = DIM / 2; /* 4 heads and 2 kv heads of 8 */
    return 2 * R * kv + 2 * R * (2 * q + kv) + 2 * R * q + 2 * R * (kv > DIM ? kv : DIM) -
           16 * T * (q + kv);
}
static int64_t mlp_bytes(int64_t R, int64_t D, int64_t H) {
    int64_t w = H > D ? H : D;
    return 2 * (2 * R * H) + 2 * R * H + (2 * R * D + 2 * R * w);
}

static void test_activation_bytes(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m = tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
    /* q_proj (R, NH hd) = (R, DIM) and k_proj (R, NKV hd) = (R, DIM / 2): 4 heads, 2 kv */
    const int64_t R = TINY_TOKENS, H = HIDDEN, norms = 14 * R * DIM, final_norm = 4 * R * DIM,
                  scratch = 2 * 2 * R * (H > DIM ? H : DIM) + 2 * 2 * R * DIM, /* gate, up; q, k */
        att16 = attention16_saved(R, TINY_SEQ),
                  /* the weights' mirrors: q, o (D, D), k, v (D / 2, D), gate, up, down (H D) */
        mirrors = 2 * (3 * DIM * DIM + 3 * H * DIM),
                  saved = (8 * R * H + 2 * R * (DIM + DIM / 2) + norms + 4 * R * DIM + scratch +
                           att16 + mirrors) *
                              LAYERS +
                          final_norm + 2 * TINY_VOCAB * DIM /* lm_head's mirror */;
    int64_t bytes = tiny_forward_bytes(m), mlp = 0; /* the MLP's after the step */
    FSDP_TEST_OK(
        fsdp_module_activation_bytes(ctx, fsdp_module_find(m, "model.layers.0.mlp"), &mlp));
    printf("\n    activation bytes: %lld (before %lld, %lld fewer; derived %lld); one MLP %lld "
           "(derived %lld)",
           (long long)bytes, (long long)BYTES_BEFORE, (long long)(BYTES_BEFORE - bytes),
           (long long)saved, (long long)mlp, (long long)mlp_bytes(R, DIM, H));
    CU_ASSERT_EQUAL(mlp, mlp_bytes(R, DIM, H));
    CU_ASSERT_EQUAL(bytes, BYTES_BEFORE - saved);
    /* the norms' f32 outputs: 14 R D more a layer, and 4 R D the final norm's */
    fsdp_module *mn = tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
    fsdp_nn_llama_set_bf16_norms(mn, false);
    int64_t bytes_n = tiny_forward_bytes(mn);
    CU_ASSERT_EQUAL(bytes_n - bytes, norms * LAYERS + final_norm);
    /* the f32 path (hooks replace the projections' outputs with f32 tensors they own, which are
     * not counted) holds the f32 SwiGLU output (2 R H more than bf16) and down_proj's bf16 copy
     * of it (2 R H) per layer, beside the norms' f32 outputs, and the attention on f32 tensors
     * (att16 more) */
    fsdp_module *mf = tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
    f32_output *outs[KEPT16 * LAYERS];
    fsdp_nn_llama_set_bf16_norms(mf, false);
    use_f32_path(mf, outs);
    fsdp_llama_test_attention16(true, NULL); /* f32 q and k: the attention on f32 tensors */
    int64_t bytes_f = tiny_forward_bytes(mf);
    fsdp_llama_test_attention16(false, NULL);
    CU_ASSERT_EQUAL(bytes_f - bytes_n, (4 * R * H + att16) * LAYERS);
    fsdp_module_free(m), fsdp_module_free(mn), fsdp_module_free(mf);
}

/* ---- misuse ---- */

/* A Linear outside the policy refuses a bf16 input, naming the policy; under it, takes it. */
static void test_bf16_input_refused(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *lin = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 4, false, &lin));
    fsdp_tensor *x = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 2, (int64_t[]){3, 8}, &x));
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, x, 0.5f));
    const fsdp_tensor *y = NULL;
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, lin, x, &y), FSDP_ERR_DTYPE, "bf16",
                    "fsdp_module_set_autocast", "FSDP_DTYPE_BF16");
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, lin, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_forward(ctx, lin, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    fsdp_tensor *bad = NULL; /* the shape is still checked */
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 2, (int64_t[]){3, 7}, &bad));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, lin, bad, &y), FSDP_ERR_SHAPE, "8 features");
    fsdp_tensor_free(x), fsdp_tensor_free(bad);
    fsdp_module_free(lin);
}

/* A LlamaAttention whose q_proj, k_proj and v_proj do not all run the policy, and a LlamaMLP
 * whose gate_proj and up_proj do not, refuse a bf16 input naming the projections and the fix;
 * under the policy both take it and give f32. */
static void test_bf16_input_refused_llama(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config c = tiny_llama_config(FSDP_DTYPE_F32);
    fsdp_module *attn = NULL, *mlp = NULL;
    FSDP_TEST_OK(fsdp_llama_attention_create(ctx, &c, &attn));
    FSDP_TEST_OK(fsdp_llama_mlp_create(ctx, DIM, HIDDEN, &mlp));
    fsdp_tensor *x = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 3, (int64_t[]){1, 4, DIM}, &x));
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, x, 0.5f));
    const fsdp_tensor *y = NULL;
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, attn, x, &y), FSDP_ERR_DTYPE, "LlamaAttention", "bf16",
                    "q_proj, k_proj and v_proj", "fsdp_module_set_autocast");
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, mlp, x, &y), FSDP_ERR_DTYPE, "LlamaMLP", "bf16",
                    "gate_proj and up_proj", "fsdp_module_set_autocast");
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, attn, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, mlp, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, fsdp_module_find(attn, "v_proj"), FSDP_DTYPE_F32));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, attn, x, &y), FSDP_ERR_DTYPE,
                    "q_proj, k_proj and "
                    "v_proj");
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, fsdp_module_find(attn, "v_proj"), FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_forward(ctx, attn, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    FSDP_TEST_OK(fsdp_module_forward(ctx, mlp, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    fsdp_tensor_free(x);
    fsdp_module_free(attn), fsdp_module_free(mlp);
}

/* A decoder layer asks each norm for bf16 only when the norm's readers run the policy: with
 * layer 0's MLP in f32, its post_attention_layernorm gives f32 (and its input_layernorm, the
 * other layer's norms, bf16); a Llama outside the policy gives none; and a norm called directly
 * (as generation calls it) gives f32. */
static void test_norms16_follow_policy(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m = tiny_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
    FSDP_TEST_OK(
        fsdp_module_set_autocast(ctx, fsdp_module_find(m, "model.layers.0.mlp"), FSDP_DTYPE_F32));
    int proj16 = 0, norms16 = 0;
    count_bf16_tensors(m, &proj16, &norms16);
    tiny_step o = {0};
    FSDP_TEST_OK(tiny_step_of(ctx, m, m, FSDP_CPU, 0, &o));
    CU_ASSERT_EQUAL(norms16, NORMS * LAYERS - 1);
    fsdp_module *norm = fsdp_module_find(m, "model.layers.1.input_layernorm");
    fsdp_tensor *x = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){1, 4, DIM}, &x));
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, x, 0.5f));
    const fsdp_tensor *y = NULL;
    FSDP_TEST_OK(fsdp_module_forward(ctx, norm, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    fsdp_module_free(m);
    m = tiny_model(FSDP_DTYPE_F32, FSDP_CPU, false);
    proj16 = 0, norms16 = 0;
    count_bf16_tensors(m, &proj16, &norms16);
    FSDP_TEST_OK(tiny_step_of(ctx, m, m, FSDP_CPU, 0, &o));
    CU_ASSERT_EQUAL(norms16 + proj16, 0);
    fsdp_tensor_free(x);
    free(o.grads);
    fsdp_module_free(m);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"kernels", test_kernels},
        {"bitwise_cpu", test_bitwise_cpu},
        {"bitwise_device", test_bitwise_device},
        {"checkpointed", test_checkpointed},
        {"norms16_cpu", test_norms16_cpu},
        {"norms16_device", test_norms16_device},
        {"norms16_tp", test_norms16_tp},
        {"activation_bytes", test_activation_bytes},
        {"bf16_input_refused", test_bf16_input_refused},
        {"bf16_input_refused_llama", test_bf16_input_refused_llama},
        {"norms16_follow_policy", test_norms16_follow_policy},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "bf16_act", cases, (int)(sizeof cases / sizeof cases[0]));
}

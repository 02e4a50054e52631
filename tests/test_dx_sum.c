/* test_dx_sum.c: the one-pass sums of the Llama's branch input gradients. The table's add3
 * ((a + b) + c) and add3_round_bf16 (each input rounded to bf16 first) bit for bit against add
 * and round_bf16 composed as before, on the CPU (one thread and split over workers) and the run's
 * device, with NaN, infinities, values that round up to infinity, sums that overflow and
 * subnormals among the inputs, in place and out of place (where two NaN inputs meet, both NaN:
 * which payload propagates is the hardware's and the compiler's operand order's). Then the tiny
 * Llama under the bf16 policy (q, k and v_proj, gate and up_proj leaving their input gradients
 * unrounded for the attention's and MLP's rounding sums) and under f32 (the attention's three-input
 * add3) against the path before (fsdp_llama_test_sums old_path: every Linear rounds, two adds):
 * loss, logits and every gradient bit for bit, on the CPU and sim, with every decoder layer
 * checkpointed too; at (dp, tp) = (1, 2) under torchtitan's plan, where each projection's input
 * gradient is a Partial addend that the attention (MLP) sums and reduces once: there the
 * projections leave it in f32, unrounded, on both paths (no rounding sum runs) and each rank's
 * gradients are the path before's bits; and at
 * (2, 1) under FSDP (a unit per decoder layer), where the rounding sums run and every rank's flat
 * gradient shards are the path before's bits. Counters show which sums ran, so no comparison is
 * of a path with itself. swiglu_backward_bf16_round and rope_qk_backward_round bit for bit
 * against the f32 entries then f32_to_bf16 on the CPU and the device. The path before also gives
 * q/k_proj and gate/up_proj f32 output gradients that they round themselves, where the new path's
 * RoPE and SwiGLU backward write them rounded (fsdp_llama_grads16, counted too): the same
 * comparisons cover that. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx
#include "kernels/kernels.h" // defines: fsdp_kernels_for, fsdp_kernels_cpu_workers_start
#include "nn/llama_common.h" // defines: fsdp_llama_test_sums, fsdp_llama_test_grads16,
                             // fsdp_llama_test_bf16_branches
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

/* ---- the kernels ---- */

/* n values over many binades and both signs, with specials in each of the three inputs (which
 * one: `which`) at distinct places, so a special meets ordinary values and, at the shared
 * places, the other inputs' specials. */
static void fill_inputs(float *x, int64_t n, int which) {
    for (int64_t i = 0; i < n; i++) {
        float u = sinf((float)(i * (which + 3)) * 0.731f + (float)which);
        x[i] = u * ldexpf(1.0f, (int)((i * 7 + which * 5) % 40) - 20);
    }
    static const uint32_t special[] = {
        0x7fc00000u, /* quiet NaN */
        0x7f800001u, /* signalling NaN: rounds to a quiet NaN */
        0xffc12345u, /* negative NaN with a payload */
        0x7f800000u, /* +inf */
        0xff800000u, /* -inf */
        0x7f7fffffu, /* FLT_MAX: rounds up to +inf */
        0xff7f8000u, /* -(halfway above bf16's largest, odd): rounds to -inf */
        0x7f7f7fffu, /* just below that halfway: rounds to bf16's largest */
        0x7f7f0000u, /* bf16's largest: sums of two overflow */
        0x00000001u, /* the smallest subnormal: rounds to 0 */
        0x00008000u, /* a subnormal halfway: ties to even (0) */
        0x80018000u, /* a negative subnormal halfway: ties to even (up) */
        0x80000000u, /* -0 */
        0x3f808000u, /* 1 + 2^-8: a tie to even (down) */
        0x3f818000u, /* 1 + 3 2^-8: a tie to even (up) */
    };
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int s = 0; s < ns && 20 * s + 6 < n; s++) {
        x[20 * s + 3 * which] = tiny_from_bits(special[s]); /* alone among ordinary values */
        x[20 * s + 10] = tiny_from_bits(special[(s + which) % ns]); /* meeting the others' */
    }
}

/* The four sums on dev (offset: every array starts `off` floats in, unaligned for float4) against
 * add and round_bf16 composed on the same device, bit for bit; with c (3 inputs) or without, in
 * place (out is a) and not. */
static void check_sums(fsdp_device dev, int64_t n, int64_t off) {
    float *x[3], *want = calloc((size_t)n, 4), *got = calloc((size_t)n, 4);
    for (int i = 0; i < 3; i++) {
        x[i] = calloc((size_t)n, 4);
        CU_ASSERT_PTR_NOT_NULL_FATAL(x[i]);
        fill_inputs(x[i], n, i);
    }
    CU_ASSERT_PTR_NOT_NULL_FATAL(want && got);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->add3 && k->add3_round_bf16);
    fsdp_tensor *in[3], *r[3], *out = tiny_on(dev, FSDP_DTYPE_F32, want, n),
                               *ref = tiny_on(dev, FSDP_DTYPE_F32, want, n);
    for (int i = 0; i < 3; i++)
        in[i] = tiny_on(dev, FSDP_DTYPE_F32, x[i], n), r[i] = tiny_on(dev, FSDP_DTYPE_F32, x[i], n);
    int64_t m = n - off;
    const float *a = fsdp_tensor_f32(in[0]) + off, *b = fsdp_tensor_f32(in[1]) + off;
    const float *c = fsdp_tensor_f32(in[2]) + off;
    float *o = fsdp_tensor_f32(out) + off, *w = fsdp_tensor_f32(ref) + off;
    float *ra = fsdp_tensor_f32(r[0]) + off, *rb = fsdp_tensor_f32(r[1]) + off;
    float *rc = fsdp_tensor_f32(r[2]) + off;
    k->round_bf16(ra, m), k->round_bf16(rb, m), k->round_bf16(rc, m);
    int64_t nan = 0, inf = 0;
    for (int t = 0; t < 8; t++) {
        bool round = t & 1, three = t & 2, in_place = t & 4;
        /* the path before: round_bf16 on each input (copies), add, add again */
        k->add(w, round ? ra : a, round ? rb : b, m);
        if (three) k->add(w, w, round ? rc : c, m);
        float *dst = o;
        if (in_place) { /* out is the first input: a fresh copy of it */
            fsdp_tensor_free(out);
            out = tiny_on(dev, FSDP_DTYPE_F32, x[0], n);
            dst = fsdp_tensor_f32(out) + off;
        }
        const float *first = in_place ? dst : a;
        (round ? k->add3_round_bf16 : k->add3)(dst, first, b, three ? c : NULL, m);
        tiny_back(want, ref), tiny_back(got, out);
        int64_t d = 0, met = 0;
        for (int64_t i = off; i < n; i++) {
            int nans = (isnan(x[0][i]) != 0) + (isnan(x[1][i]) != 0) + (three && isnan(x[2][i]));
            if (nans >= 2) /* the NaN that propagates is unspecified (IEEE 754 6.2.3) */
                met++, d += !isnan(got[i]) || !isnan(want[i]);
            else
                d += memcmp(&got[i], &want[i], 4) != 0;
        }
        printf("\n    %s on %s, %d inputs%s, offset %lld, n %lld: %lld differ (%lld where NaNs "
               "meet: NaN both)",
               round ? "add3_round_bf16" : "add3", fsdp_device_to_string(dev), three ? 3 : 2,
               in_place ? ", in place" : "", (long long)off, (long long)m, (long long)d,
               (long long)met);
        CU_ASSERT_EQUAL(d, 0);
        for (int64_t i = off; i < n; i++) nan += isnan(want[i]) != 0, inf += isinf(want[i]) != 0;
    }
    float *kept = calloc((size_t)n, 4); /* add3_round_bf16 reads its inputs, never writes them */
    CU_ASSERT_PTR_NOT_NULL_FATAL(kept);
    tiny_back(kept, in[1]);
    CU_ASSERT_EQUAL(tiny_differ(kept, x[1], n), 0);
    printf("\n    (%lld NaN, %lld inf)", (long long)nan, (long long)inf);
    CU_ASSERT_TRUE(nan > 0 && inf > 0); /* the specials reached the sums */
    free(kept), free(want), free(got);
    for (int i = 0; i < 3; i++) free(x[i]), fsdp_tensor_free(in[i]), fsdp_tensor_free(r[i]);
    fsdp_tensor_free(out), fsdp_tensor_free(ref);
}

static void test_kernels_cpu(void) {
    check_sums(FSDP_CPU, 1500, 0);
    check_sums(FSDP_CPU, 1501, 1);
}

/* Over 3 worker threads (the CPU table splits calls of 65536 elements and more), the same bits. */
static void test_kernels_cpu_threads(void) {
    int threads = fsdp_kernels_cpu_workers_start(3, -1);
    printf("\n    %d threads", threads);
    check_sums(FSDP_CPU, 200001, 1);
    fsdp_kernels_cpu_workers_stop();
}

static void test_kernels_device(void) {
    check_sums(fsdp_test_device(), 1500, 0);
    check_sums(fsdp_test_device(), 1501, 1);
}

/* ---- the backward entries that write bf16 output gradients ---- */

/* swiglu_backward_bf16_round and rope_qk_backward_round on dev against swiglu_backward_bf16 and
 * rope_qk_backward then f32_to_bf16 on the same device, bit for bit (the inputs carry the
 * specials of fill_inputs: NaN, infinities, values rounding up to infinity, ties). */
static void check_grads16(fsdp_device dev) {
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->swiglu_backward_bf16_round && k->rope_qk_backward_round);
    enum {
        N = 1500,
        B = 2,
        T = 5,
        NH = 4,
        NKV = 2,
        D = 6,
        NQ = B * T * NH * D,
        NK = B * T * NKV * D
    };
    float *x[3];
    uint16_t *g16 = calloc(N, 2), *u16 = calloc(N, 2), *got = calloc(2 * N, 2),
             *want = calloc(2 * N, 2);
    for (int i = 0; i < 3; i++) x[i] = calloc(N, 4), fill_inputs(x[i], N, i);
    CU_ASSERT_PTR_NOT_NULL_FATAL(g16 && u16 && got && want && x[0] && x[1] && x[2]);
    for (int64_t i = 0; i < N; i++)
        g16[i] = fsdp_bf16_from_f32(x[1][i] * 0.25f), u16[i] = fsdp_bf16_from_f32(x[2][i]);
    fsdp_tensor *dout = tiny_on(dev, FSDP_DTYPE_F32, x[0], N),
                *gate = tiny_on(dev, FSDP_DTYPE_BF16, g16, N),
                *up = tiny_on(dev, FSDP_DTYPE_BF16, u16, N);
    fsdp_tensor *r = tiny_on(dev, FSDP_DTYPE_BF16, NULL, 2 * N),
                *w = tiny_on(dev, FSDP_DTYPE_BF16, NULL, 2 * N),
                *f = tiny_on(dev, FSDP_DTYPE_F32, NULL, 2 * N);
    fsdp_bf16 *r16 = fsdp_tensor_data(r), *w16 = fsdp_tensor_data(w);
    float *f32 = fsdp_tensor_f32(f);
    k->swiglu_backward_bf16_round(r16, r16 + N, fsdp_tensor_f32(dout), fsdp_tensor_data(gate),
                                  fsdp_tensor_data(up), N);
    k->swiglu_backward_bf16(f32, f32 + N, fsdp_tensor_f32(dout), fsdp_tensor_data(gate),
                            fsdp_tensor_data(up), N);
    k->f32_to_bf16(w16, f32, 2 * N);
    tiny_back(got, r), tiny_back(want, w);
    int64_t d = 0, nan = 0;
    for (int64_t i = 0; i < 2 * N; i++) d += got[i] != want[i], nan += (want[i] & 0x7fff) > 0x7f80;
    printf("\n    swiglu_backward_bf16_round on %s: %lld of %d differ (%lld NaN)",
           fsdp_device_to_string(dev), (long long)d, 2 * N, (long long)nan);
    CU_ASSERT_EQUAL(d, 0);
    CU_ASSERT_TRUE(nan > 0);
    /* the same from a bf16 dout: swiglu_backward_bf16io against swiglu_backward_bf16_round on the
     * widened dout */
    uint16_t *dout16 = calloc(N, 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dout16 && k->swiglu_backward_bf16io);
    for (int64_t i = 0; i < N; i++) dout16[i] = fsdp_bf16_from_f32(x[0][i]);
    fsdp_tensor *d16 = tiny_on(dev, FSDP_DTYPE_BF16, dout16, N);
    k->bf16_to_f32(f32, fsdp_tensor_data(d16), N);
    k->swiglu_backward_bf16io(r16, r16 + N, fsdp_tensor_data(d16), fsdp_tensor_data(gate),
                              fsdp_tensor_data(up), N);
    k->swiglu_backward_bf16_round(w16, w16 + N, f32, fsdp_tensor_data(gate), fsdp_tensor_data(up),
                                  N);
    tiny_back(got, r), tiny_back(want, w);
    d = 0;
    for (int64_t i = 0; i < 2 * N; i++) d += got[i] != want[i];
    printf("\n    swiglu_backward_bf16io on %s: %lld of %d differ", fsdp_device_to_string(dev),
           (long long)d, 2 * N);
    CU_ASSERT_EQUAL(d, 0);
    fsdp_tensor_free(d16), free(dout16);
    /* RoPE: q and k gradients of (B, T, heads, D), a table of T positions */
    float cs[2 * T * (D / 2)];
    for (int i = 0; i < T * (D / 2); i++)
        cs[i] = cosf(0.3f * i), cs[T * (D / 2) + i] = sinf(0.3f * i);
    fsdp_tensor *tab = tiny_on(dev, FSDP_DTYPE_F32, cs, 2 * T * (D / 2)),
                *dq = tiny_on(dev, FSDP_DTYPE_F32, x[0], NQ),
                *dk = tiny_on(dev, FSDP_DTYPE_F32, x[1] + 100, NK);
    const float *c = fsdp_tensor_f32(tab), *sn = c + T * (D / 2);
    k->rope_qk_backward_round(r16, r16 + NQ, fsdp_tensor_f32(dq), fsdp_tensor_f32(dk), c, sn, B, T,
                              NH, NKV, D);
    k->rope_qk_backward(f32, f32 + NQ, fsdp_tensor_f32(dq), fsdp_tensor_f32(dk), c, sn, B, T, NH,
                        NKV, D);
    k->f32_to_bf16(w16, f32, NQ + NK);
    tiny_back(got, r), tiny_back(want, w);
    d = 0, nan = 0;
    for (int64_t i = 0; i < NQ + NK; i++)
        d += got[i] != want[i], nan += (want[i] & 0x7fff) > 0x7f80;
    printf("\n    rope_qk_backward_round on %s: %lld of %d differ (%lld NaN)",
           fsdp_device_to_string(dev), (long long)d, NQ + NK, (long long)nan);
    CU_ASSERT_EQUAL(d, 0);
    CU_ASSERT_TRUE(nan > 0);
    fsdp_tensor *all[] = {dout, gate, up, r, w, f, tab, dq, dk};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
    for (int i = 0; i < 3; i++) free(x[i]);
    free(g16), free(u16), free(got), free(want);
}

static void test_grads16_cpu(void) {
    check_grads16(FSDP_CPU);
}

static void test_grads16_device(void) {
    check_grads16(fsdp_test_device());
}

/* ---- one training step's results on the host ---- */

static fsdp_status step(fsdp_ctx *ctx, fsdp_module *m, fsdp_device dev, int s, step_out *o) {
    return tiny_step_of(ctx, m, m, dev, s, o);
}

/* The model under `compute` on dev (every decoder layer checkpointed when ckpt), two steps on the
 * new sums and on the path before, compared; the fused sums counted (bf16: the attention's and
 * the MLP's, each layer and step; f32: none) and the three-input add3s (f32: the attention's). */
static void check_model(fsdp_dtype compute, fsdp_device dev, bool ckpt) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_test_device_pin_f32_attention(true);
    fsdp_module *m[2] = {tiny_model(compute, dev, ckpt), tiny_model(compute, dev, ckpt)};
    step_out *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    int64_t fused[2], add3[2], g16[2], dx16[2];
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 2; i++) { /* i 0: the new sums; 1: the path before */
            fsdp_llama_test_sums(i == 1, NULL, NULL);
            fsdp_llama_test_grads16(), fsdp_llama_test_dx16();
            FSDP_TEST_OK(step(ctx, m[i], dev, s, &o[i]));
            fsdp_llama_test_sums(false, &fused[i], &add3[i]);
            g16[i] = fsdp_llama_test_grads16(), dx16[i] = fsdp_llama_test_dx16();
        }
        printf("\n    %s%s step %d: %lld fused sums, %lld add3 (path before: %lld, %lld)",
               compute == FSDP_DTYPE_BF16 ? "bf16" : "f32", ckpt ? " checkpointed" : "", s,
               (long long)fused[0], (long long)add3[0], (long long)fused[1], (long long)add3[1]);
        tiny_compare(dev, &o[0], &o[1]);
        bool b16 = compute == FSDP_DTYPE_BF16;
        CU_ASSERT_EQUAL(fused[0], b16 ? 2 * LAYERS : 0);
        CU_ASSERT_EQUAL(add3[0], b16 ? 0 : LAYERS);
        CU_ASSERT_TRUE(fused[1] == 0 && add3[1] == 0);
        /* RoPE's and the SwiGLU's backward gave q/k_proj and gate/up_proj bf16 gradients */
        CU_ASSERT_EQUAL(g16[0], b16 ? 2 * LAYERS : 0);
        CU_ASSERT_EQUAL(g16[1], 0);
        /* o_proj wrote its input gradient in bf16 for the attention on bf16 tensors, down_proj
         * for the SwiGLU's backward */
        CU_ASSERT_EQUAL(dx16[0], b16 ? 2 * LAYERS : 0);
        CU_ASSERT_EQUAL(dx16[1], 0);
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
    check_model(FSDP_DTYPE_F32, FSDP_CPU, true);
}

/* Observers (fsdp_module_add_observer, as bench_llama_gpu --breakdown adds on every timed
 * module) at every point of every module leave the policy's paths as they are: the rounding sums,
 * the bf16 gradients and the bf16 branches all run, and the results are an unobserved model's
 * bits. (With acting hooks there the fused paths stand down: the path before.) */
static fsdp_status observe(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                           const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point, (void)io;
    ++*(int64_t *)user;
    return FSDP_OK;
}

static fsdp_status add_observers(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++)
        FSDP_TRY_AT(
            ctx, fsdp_module_add_observer(ctx, m, (fsdp_hook_point)p, observe, user, NULL, NULL));
    return FSDP_OK;
}

static void test_observed_cpu(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config cfg = tiny_llama_config(FSDP_DTYPE_BF16);
    fsdp_module *m[2] = {NULL, NULL};
    int64_t calls = 0;
    for (int i = 0; i < 2; i++) FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m[i]));
    FSDP_TEST_OK(fsdp_module_visit(ctx, m[0], add_observers, &calls));
    step_out *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (int s = 0; s < 2; s++) {
        int64_t fused, add3, branches; /* the counters zeroed first */
        fsdp_llama_test_sums(false, &fused, &add3);
        fsdp_llama_test_grads16();
        fsdp_llama_test_bf16_branches(&branches);
        FSDP_TEST_OK(step(ctx, m[0], FSDP_CPU, s, &o[0]));
        fsdp_llama_test_sums(false, &fused, &add3);
        int64_t g16 = fsdp_llama_test_grads16();
        fsdp_llama_test_bf16_branches(&branches);
        FSDP_TEST_OK(step(ctx, m[1], FSDP_CPU, s, &o[1]));
        printf("\n    observed step %d: %lld observer calls, %lld fused sums, %lld bf16 gradients, "
               "%lld bf16 branches",
               s, (long long)calls, (long long)fused, (long long)g16, (long long)branches);
        CU_ASSERT_EQUAL(fused, 2 * LAYERS);
        CU_ASSERT_EQUAL(g16, 2 * LAYERS);
        CU_ASSERT_EQUAL(branches, 2 * LAYERS);
        tiny_compare(FSDP_CPU, &o[0], &o[1]);
    }
    CU_ASSERT_TRUE(calls > 0);
    int64_t rest[3]; /* the counters left zero for the cases after */
    fsdp_llama_test_sums(false, &rest[0], &rest[1]);
    fsdp_llama_test_grads16();
    fsdp_llama_test_bf16_branches(&rest[2]);
    free(o[0].grads), free(o[1].grads), free(o);
    fsdp_module_free(m[0]), fsdp_module_free(m[1]);
}

static void test_bf16_device(void) {
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), false);
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), true);
}

static void test_f32_device(void) {
    check_model(FSDP_DTYPE_F32, fsdp_test_device(), false);
}

/* ---- distributed layouts ---- */

/* Both paths at (dp, tp) (tiny_world: the plain loss, lm_head's output is Replicate), each rank's
 * results compared. At tp > 1 every projection has ColwiseParallel's post-backward hook: each
 * rounds its own input gradient before the all_reduce, so no rounding sum runs and only the
 * attention's three-input add3 does; at tp 1 (FSDP's hooks are on the decoder layers) the sums
 * run as on one rank. */
static void check_world(fsdp_dtype compute, int dp, int tp) {
    tiny_world *r = calloc(2, sizeof *r); /* 0: the new sums; 1: the path before */
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    int64_t fused[2], add3[2], g16[2], dx16[2];
    for (int i = 0; i < 2; i++) {
        r[i].compute = compute, r[i].dp = dp, r[i].tp = tp;
        fsdp_llama_test_sums(i == 1, NULL, NULL);
        fsdp_llama_test_grads16(), fsdp_llama_test_dx16();
        tiny_world_run(&r[i]);
        fsdp_llama_test_sums(false, &fused[i], &add3[i]);
        g16[i] = fsdp_llama_test_grads16(), dx16[i] = fsdp_llama_test_dx16();
    }
    bool b16 = compute == FSDP_DTYPE_BF16;
    printf("\n    (dp, tp) = (%d, %d), %s: %lld fused sums, %lld add3 (path before: %lld, %lld)",
           dp, tp, b16 ? "bf16" : "f32", (long long)fused[0], (long long)add3[0],
           (long long)fused[1], (long long)add3[1]);
    int hosted = tiny_world_compare(&r[0], &r[1]);
    int64_t per_rank = 2 * LAYERS; /* two steps */
    bool fuse = b16 && tp == 1;
    CU_ASSERT_EQUAL(fused[0], fuse ? 2 * per_rank * hosted : 0);
    CU_ASSERT_EQUAL(add3[0], fuse ? 0 : per_rank * hosted);
    CU_ASSERT_TRUE(fused[1] == 0 && add3[1] == 0);
    /* bf16 output gradients for q/k_proj and gate/up_proj at every layout (TP's Colwise hooks
     * pass them through as they are), never on the path before */
    CU_ASSERT_EQUAL(g16[0], b16 ? 2 * per_rank * hosted : 0);
    CU_ASSERT_EQUAL(g16[1], 0);
    /* o_proj's and down_proj's bf16 input gradients: at tp 1 (under FSDP too); RowwiseParallel's
     * post-backward hooks on them read them, so at tp > 1 they stay f32 */
    printf("\n    o_proj's and down_proj's bf16 input gradients: %lld (path before: %lld)",
           (long long)dx16[0], (long long)dx16[1]);
    CU_ASSERT_EQUAL(dx16[0], b16 && tp == 1 ? 2 * per_rank * hosted : 0);
    CU_ASSERT_EQUAL(dx16[1], 0);
    tiny_world_free(&r[0]), tiny_world_free(&r[1]);
    free(r);
}

static void test_tp_bf16(void) {
    check_world(FSDP_DTYPE_BF16, 1, TINY_WORLD);
}

static void test_tp_f32(void) {
    check_world(FSDP_DTYPE_F32, 1, TINY_WORLD);
}

static void test_fsdp_bf16(void) {
    check_world(FSDP_DTYPE_BF16, TINY_WORLD, 1);
}

static void test_fsdp_f32(void) {
    check_world(FSDP_DTYPE_F32, TINY_WORLD, 1);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"kernels_cpu", test_kernels_cpu},
        {"kernels_cpu_threads", test_kernels_cpu_threads},
        {"kernels_device", test_kernels_device},
        {"grads16_cpu", test_grads16_cpu},
        {"grads16_device", test_grads16_device},
        {"bf16_cpu", test_bf16_cpu},
        {"f32_cpu", test_f32_cpu},
        {"checkpointed_cpu", test_checkpointed_cpu},
        {"observed_cpu", test_observed_cpu},
        {"bf16_device", test_bf16_device},
        {"f32_device", test_f32_device},
        {"tp_bf16", test_tp_bf16},
        {"tp_f32", test_tp_f32},
        {"fsdp_bf16", test_fsdp_bf16},
        {"fsdp_f32", test_fsdp_f32},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "dx_sum", cases, (int)(sizeof cases / sizeof cases[0]));
}

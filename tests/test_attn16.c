/* test_attn16.c: the bf16 policy's attention on bf16 tensors (issue 32). The table's
 * rope_qk_forward_bf16_round, rope_qk_backward_bf16_round, attention_forward_bf16_round and
 * attention_backward_bf16_round bit for bit against the composition of the entries before them
 * (bf16_to_f32, the f32 entry, f32_to_bf16) on the same device, on the CPU and the run's device
 * (sim by default), RoPE in place and not, with NaN, infinities and ties among RoPE's inputs, the
 * attention over ordinary values (a NaN would reach every element after it), with grouped-query
 * heads and more than one batch. On CUDA the attention's check pins the tiled f32 kernels
 * (fsdp_test_device_pin_f32_attention), so the widening path is what is compared bit for bit;
 * test_kernels_cuda checks cuDNN's path within its bound. Then the tiny Llama under the policy:
 * its attention takes the path (counted, every layer every forward; not with the test switch
 * off, whose results differ: the new roundings), on the device the CPU's bits (sim) for loss,
 * logits and every gradient. Its numerics against the f32 run: test_autocast. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx
#include "kernels/kernels.h" // defines: fsdp_kernels_for, FSDP_ATTENTION_BF16_SCRATCH
#include "nn/llama_common.h" // defines: fsdp_llama_test_attention16
#include "on_device.h"       // defines: fsdp_test_device, fsdp_test_device_pin_f32_attention
#include "tiny_llama.h"      // defines: tiny_on, tiny_back, tiny_differ, tiny_from_bits

/* The two tensors' bytes equal, element by element (size bytes each), the count printed. */
static bool same(const char *what, fsdp_device dev, const fsdp_tensor *a, const fsdp_tensor *b) {
    int64_t n = fsdp_tensor_numel(a), size = fsdp_dtype_size(fsdp_tensor_dtype(a));
    char *ha = malloc((size_t)(n * size)), *hb = malloc((size_t)(n * size));
    CU_ASSERT_PTR_NOT_NULL_FATAL(ha && hb);
    tiny_back(ha, a), tiny_back(hb, b);
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(ha + i * size, hb + i * size, (size_t)size) != 0;
    printf("\n    %s on %s: %lld of %lld differ", what, fsdp_device_to_string(dev), (long long)d,
           (long long)n);
    free(ha), free(hb);
    return d == 0;
}

/* n bf16 values of magnitude about scale (varied over a few binades, both signs, seeded by
 * which); with specials, NaN, infinities, -0 and the largest at some places. */
static void fill16(uint16_t *x, int64_t n, int which, float scale, bool specials) {
    for (int64_t i = 0; i < n; i++) {
        float u = sinf((float)(i * (which + 3)) * 0.731f + (float)which);
        x[i] = fsdp_bf16_from_f32(scale * u * ldexpf(1.0f, (int)((i * 7 + which) % 5) - 2));
    }
    static const uint32_t special[] = {0x7fc00000u, 0x7f800000u, 0xff800000u,
                                       0x80000000u, 0x7f7f0000u, 0x3f810000u};
    for (int s = 0; specials && s < 6 && 17 * s + which < n; s++)
        x[17 * s + which] = fsdp_bf16_from_f32(tiny_from_bits(special[s]));
}

enum { B = 3, T = 7, NH = 4, NKV = 2, D = 8, NQ = B * T * NH * D, NK = B * T * NKV * D };

/* RoPE's two entries against rope_qk_forward_bf16 then f32_to_bf16 and bf16_to_f32 then
 * rope_qk_backward_round, out of place and in place. */
static void check_rope(fsdp_device dev) {
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->rope_qk_forward_bf16_round && k->rope_qk_backward_bf16_round);
    uint16_t *h16 = calloc(NQ + NK, 2);
    float cs[2 * T * (D / 2)];
    for (int i = 0; i < T * (D / 2); i++)
        cs[i] = cosf(0.3f * i), cs[T * (D / 2) + i] = sinf(0.3f * i);
    fill16(h16, NQ + NK, 1, 3.0f, true);
    fsdp_tensor *tab = tiny_on(dev, FSDP_DTYPE_F32, cs, 2 * T * (D / 2)),
                *x = tiny_on(dev, FSDP_DTYPE_BF16, h16, NQ + NK),
                *got = tiny_on(dev, FSDP_DTYPE_BF16, NULL, NQ + NK),
                *want = tiny_on(dev, FSDP_DTYPE_BF16, NULL, NQ + NK),
                *f = tiny_on(dev, FSDP_DTYPE_F32, NULL, NQ + NK);
    const float *c = fsdp_tensor_f32(tab), *sn = c + T * (D / 2);
    const fsdp_bf16 *xs = fsdp_tensor_data(x);
    fsdp_bf16 *g = fsdp_tensor_data(got), *w = fsdp_tensor_data(want);
    float *ff = fsdp_tensor_f32(f);
    for (int backward = 0; backward < 2; backward++) {
        if (backward) {
            k->rope_qk_backward_bf16_round(g, g + NQ, xs, xs + NQ, c, sn, B, T, NH, NKV, D);
            k->bf16_to_f32(ff, xs, NQ + NK);
            k->rope_qk_backward_round(w, w + NQ, ff, ff + NQ, c, sn, B, T, NH, NKV, D);
        } else {
            k->rope_qk_forward_bf16_round(g, g + NQ, xs, xs + NQ, c, sn, B, T, NH, NKV, D);
            k->rope_qk_forward_bf16(ff, ff + NQ, xs, xs + NQ, c, sn, B, T, NH, NKV, D);
            k->f32_to_bf16(w, ff, NQ + NK);
        }
        CU_ASSERT_TRUE(same(backward ? "rope_qk_backward_bf16_round" : "rope_qk_forward_bf16_round",
                            dev, got, want));
        /* in place: got holds the inputs, then the results */
        FSDP_TEST_OK(fsdp_tensor_copy(fsdp_test_ctx(), got, x));
        (backward ? k->rope_qk_backward_bf16_round
                  : k->rope_qk_forward_bf16_round)(g, g + NQ, g, g + NQ, c, sn, B, T, NH, NKV, D);
        CU_ASSERT_TRUE(same("  in place", dev, got, want));
    }
    fsdp_tensor *all[] = {tab, x, got, want, f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
    free(h16);
}

/* The attention's two entries against bf16_to_f32, attention_forward / attention_backward (the
 * f32 entries, scratch (2, T, T)) and f32_to_bf16, with lse's bits too. */
static void check_attention(fsdp_device dev) {
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->attention_forward_bf16_round &&
                                 k->attention_backward_bf16_round);
    enum { N16 = 3 * NQ + 2 * NK }; /* q, k, v, dout, (spare) */
    uint16_t *h16 = calloc(N16, 2);
    fill16(h16, N16, 2, 1.0f, false);
    fsdp_tensor *in = tiny_on(dev, FSDP_DTYPE_BF16, h16, N16),
                *scr =
                    tiny_on(dev, FSDP_DTYPE_F32, NULL, FSDP_ATTENTION_BF16_SCRATCH(T, NH, NKV, D)),
                *f = tiny_on(dev, FSDP_DTYPE_F32, NULL, 4 * NQ + 4 * NK),
                *lse_g = tiny_on(dev, FSDP_DTYPE_F32, NULL, B * NH * T),
                *lse_w = tiny_on(dev, FSDP_DTYPE_F32, NULL, B * NH * T),
                *og = tiny_on(dev, FSDP_DTYPE_BF16, NULL, NQ),
                *ow = tiny_on(dev, FSDP_DTYPE_BF16, NULL, NQ),
                *gg = tiny_on(dev, FSDP_DTYPE_BF16, NULL, NQ + 2 * NK),
                *gw = tiny_on(dev, FSDP_DTYPE_BF16, NULL, NQ + 2 * NK);
    const fsdp_bf16 *q = fsdp_tensor_data(in), *kk = q + NQ, *v = kk + NK, *dout = v + NK;
    float *s = fsdp_tensor_f32(scr), *ff = fsdp_tensor_f32(f);
    float *qf = ff, *kf = qf + NQ, *vf = kf + NK, *dof = vf + NK, *of = dof + NQ, *dqf = of + NQ;
    float *dkf = dqf + NQ, *dvf = dkf + NK;
    fsdp_bf16 *o16 = fsdp_tensor_data(og), *ow16 = fsdp_tensor_data(ow);
    k->attention_forward_bf16_round(o16, fsdp_tensor_f32(lse_g), s, q, kk, v, B, T, NH, NKV, D);
    k->bf16_to_f32(qf, q, 2 * NQ + 2 * NK); /* q, k, v, dout: contiguous in both */
    k->attention_forward(of, fsdp_tensor_f32(lse_w), s, qf, kf, vf, B, T, NH, NKV, D);
    k->f32_to_bf16(ow16, of, NQ);
    CU_ASSERT_TRUE(same("attention_forward_bf16_round out", dev, og, ow));
    CU_ASSERT_TRUE(same("attention_forward_bf16_round lse", dev, lse_g, lse_w));
    /* the backward reads the rounded out (the forward's result, as the attention keeps it) */
    fsdp_bf16 *g = fsdp_tensor_data(gg), *w = fsdp_tensor_data(gw);
    k->attention_backward_bf16_round(g, g + NQ, g + NQ + NK, s, dout, q, kk, v, o16,
                                     fsdp_tensor_f32(lse_g), B, T, NH, NKV, D);
    k->bf16_to_f32(of, o16, NQ);
    k->attention_backward(dqf, dkf, dvf, s, dof, qf, kf, vf, of, fsdp_tensor_f32(lse_w), B, T, NH,
                          NKV, D);
    k->f32_to_bf16(w, dqf, NQ + 2 * NK);
    CU_ASSERT_TRUE(same("attention_backward_bf16_round dq, dk, dv", dev, gg, gw));
    fsdp_tensor *all[] = {in, scr, f, lse_g, lse_w, og, ow, gg, gw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
    free(h16);
}

static void test_rope_cpu(void) {
    check_rope(FSDP_CPU);
}

static void test_rope_device(void) {
    check_rope(fsdp_test_device());
}

static void test_attention_cpu(void) {
    check_attention(FSDP_CPU);
}

static void test_attention_device(void) {
    fsdp_test_device_pin_f32_attention(true);
    check_attention(fsdp_test_device());
    fsdp_test_device_pin_f32_attention(false);
}

/* ---- the tiny Llama under the policy ---- */

enum { BATCH = 2, SEQ = 8, VOCAB = 64, N_TOK = BATCH * SEQ, LAYERS = 2 };

typedef struct step_out {
    float loss;
    float logits[N_TOK * VOCAB];
    float grads[40000]; /* every parameter's gradient, in visit order */
    int64_t n_grads;
} step_out;

static fsdp_status copy_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    step_out *o = user;
    const fsdp_tensor *g = fsdp_param_grad(p);
    int64_t n = fsdp_tensor_numel(g);
    if (o->n_grads + n > (int64_t)(sizeof o->grads / sizeof o->grads[0])) return FSDP_ERR_INTERNAL;
    fsdp_tensor *h = NULL;
    FSDP_TRY_AT(ctx, fsdp_tensor_from_blob(ctx, o->grads + o->n_grads, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                           (int64_t[]){n}, &h));
    fsdp_status st = fsdp_tensor_copy(ctx, h, g);
    fsdp_tensor_free(h);
    o->n_grads += n;
    return st;
}

/* The policy's tiny Llama (the same initialisation every call) on dev: one forward, loss and
 * backward of a fixed batch into o, with the test switch off or not (on again after); *ran the
 * forwards whose attention ran on bf16 tensors. */
static void run_model(fsdp_device dev, bool off, step_out *o, int64_t *ran) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config cfg = {.dim = 32,
                             .n_layers = LAYERS,
                             .n_heads = 4,
                             .n_kv_heads = 2,
                             .vocab_size = VOCAB,
                             .ffn_hidden = 48,
                             .max_seq_len = 16,
                             .init_std = 0.2f,
                             .compute_dtype = FSDP_DTYPE_BF16};
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    if (dev.type != FSDP_DEVICE_CPU) FSDP_TEST_OK(fsdp_module_to(ctx, m, dev));
    int32_t tok[N_TOK], tgt[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)((i * 37 + 11) % VOCAB);
    for (int i = 0; i < N_TOK; i++) tgt[i] = i % SEQ == SEQ - 1 ? -100 : tok[i + 1];
    fsdp_tensor *th = NULL, *td = NULL, *dl = NULL, *lh = NULL;
    FSDP_TEST_OK(
        fsdp_tensor_from_blob(ctx, tok, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){BATCH, SEQ}, &th));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, dev, 2, (int64_t[]){BATCH, SEQ}, &td));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, td, th));
    const fsdp_tensor *out = NULL;
    fsdp_llama_test_attention16(off, NULL); /* the count from here */
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, td, &out));
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, out, &dl));
    FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, out, tgt, -100, &o->loss, dl));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dl, NULL));
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, o->logits, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                       (int64_t[]){N_TOK * VOCAB}, &lh));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, lh, out));
    o->n_grads = 0;
    FSDP_TEST_OK(fsdp_module_visit_params(ctx, m, copy_grad, o));
    fsdp_llama_test_attention16(false, ran);
    fsdp_tensor_free(th), fsdp_tensor_free(td), fsdp_tensor_free(dl), fsdp_tensor_free(lh);
    fsdp_module_free(m);
}

static void test_model(void) {
    step_out *c = calloc(1, sizeof *c), *d = calloc(1, sizeof *d), *off = calloc(1, sizeof *off);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c && d && off);
    fsdp_device dev = fsdp_test_device();
    int64_t ran_c = -1, ran_d = -1, ran_off = -1;
    run_model(FSDP_CPU, false, c, &ran_c);
    fsdp_test_device_pin_f32_attention(true); /* on CUDA: the widening path, bitwise */
    run_model(dev, false, d, &ran_d);
    fsdp_test_device_pin_f32_attention(false);
    run_model(FSDP_CPU, true, off, &ran_off); /* the attention on f32 tensors, as before */
    printf(
        "\n    on bf16 tensors: cpu %lld forwards, %s %lld, loss %.9g / %.9g; switched off: %lld, "
        "loss %.9g; %lld of %lld gradients differ from it",
        (long long)ran_c, fsdp_device_to_string(dev), (long long)ran_d, c->loss, d->loss,
        (long long)ran_off, off->loss, (long long)tiny_differ(c->grads, off->grads, c->n_grads),
        (long long)c->n_grads);
    CU_ASSERT_EQUAL(ran_c, LAYERS);
    CU_ASSERT_EQUAL(ran_d, LAYERS);
    CU_ASSERT_EQUAL(ran_off, 0);
    CU_ASSERT_TRUE(tiny_differ(c->grads, off->grads, c->n_grads) > 0);
    if (!fsdp_test_device_is_cuda()) { /* sim: the CPU's bits */
        CU_ASSERT_EQUAL(tiny_differ(&c->loss, &d->loss, 1), 0);
        CU_ASSERT_EQUAL(tiny_differ(c->logits, d->logits, N_TOK * VOCAB), 0);
        CU_ASSERT_EQUAL(c->n_grads, d->n_grads);
        CU_ASSERT_EQUAL(tiny_differ(c->grads, d->grads, c->n_grads), 0);
    }
    free(c), free(d), free(off);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"rope_cpu", test_rope_cpu},
        {"rope_device", test_rope_device},
        {"attention_cpu", test_attention_cpu},
        {"attention_device", test_attention_device},
        {"model", test_model},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "attn16", cases, (int)(sizeof cases / sizeof cases[0]));
}

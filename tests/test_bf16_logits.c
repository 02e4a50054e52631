/* test_bf16_logits.c: bf16 logits (fsdp_llama_config.logits_dtype) under the bf16 compute policy.
 * Checked: the cross-entropy over bf16 logits (cross_entropy_ignore_bf16, through
 * fsdp_loss_cross_entropy_ignore and fsdp_loss_cross_entropy) against the f32 entry on the
 * widened logits, bit for bit on the CPU and the run's device (loss, the f32 gradient, and the
 * bf16 gradient against f32_to_bf16 of the f32 one), with large logits, -inf-ish ones and an
 * ignored target among the rows; the tiny Llama with bf16 logits bitwise equal to the f32-logits
 * run (loss, logits, every gradient, over three SGD steps) on the CPU and the device, with a bf16
 * and with an f32 logit gradient; its activation bytes fewer by exactly the f32 logits' half and
 * lm_head's bf16 scratch; generation's logits equal; the refusals. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx, FSDP_TEST_OK
#include "kernels/kernels.h" // defines: fsdp_kernels_for (f32_to_bf16 of the reference)
#include "on_device.h"       // defines: fsdp_test_device

enum { BATCH = 2, SEQ = 8, VOCAB = 64, N_TOK = BATCH * SEQ, LAYERS = 2, DIM = 32, HIDDEN = 48 };

static fsdp_module *llama(fsdp_dtype logits) {
    fsdp_llama_config cfg = {.dim = DIM,
                             .n_layers = LAYERS,
                             .n_heads = 4,
                             .n_kv_heads = 2,
                             .vocab_size = VOCAB,
                             .ffn_hidden = HIDDEN,
                             .max_seq_len = 16,
                             .init_std = 0.2f,
                             .compute_dtype = FSDP_DTYPE_BF16,
                             .logits_dtype = logits};
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(fsdp_test_ctx(), &cfg, &m));
    return m;
}

/* A host array (n elements of dtype) on dev, as a (rows, n / rows) tensor. */
static fsdp_tensor *on(fsdp_device dev, fsdp_dtype dtype, void *host, int64_t rows, int64_t n) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *h = NULL, *d = NULL;
    int64_t shape[2] = {rows, n / rows};
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, host, dtype, FSDP_CPU, 2, shape, &h));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, dtype, dev, 2, shape, &d));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, d, h));
    fsdp_tensor_free(h);
    return d;
}

/* d copied to host (its dtype, numel elements) */
static void back(void *host, const fsdp_tensor *d) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, host, fsdp_tensor_dtype(d), FSDP_CPU, 1,
                                       (int64_t[]){fsdp_tensor_numel(d)}, &h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, h, d));
    fsdp_tensor_free(h);
}

/* Elements of `size` bytes that differ, printed. */
static int64_t differ(const char *name, const void *a, const void *b, int64_t n, size_t size) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++)
        d += memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0;
    printf("\n    %s: %lld of %lld differ", name, (long long)d, (long long)n);
    return d;
}

/* ---- the kernel, through the loss functions ---- */

enum { ROWS = 7, CLASSES = 1000 }; /* 1000: not a multiple of CUDA's block */

/* bf16 logits: a spread of values, then per row something to handle: row 1 a logit of 300 and
 * one of -300 (no exp may overflow), row 2 a -inf among ordinary ones (-FLT_MAX rounds to it),
 * row 3 every logit -1e30 but the target's, row 4 ignored, row 5 its target at -60 and another
 * logit at -3e38 (finite in bf16), row 6 all equal. */
static void make_logits(fsdp_bf16 *x, int32_t *t) {
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < CLASSES; c++)
            x[r * CLASSES + c] =
                fsdp_bf16_from_f32(-8.0f + 16.0f * (float)((r * 7919 + c * 104729) % 1009) / 1009);
        t[r] = (r * 331 + 17) % CLASSES;
    }
    x[1 * CLASSES + 5] = fsdp_bf16_from_f32(300.0f),
                    x[1 * CLASSES + 6] = fsdp_bf16_from_f32(-300.0f);
    x[2 * CLASSES + 9] = fsdp_bf16_from_f32(-FLT_MAX);
    for (int c = 0; c < CLASSES; c++)
        if (c != t[3]) x[3 * CLASSES + c] = fsdp_bf16_from_f32(-1e30f);
    t[4] = FSDP_IGNORE_INDEX;
    x[5 * CLASSES + t[5]] = fsdp_bf16_from_f32(-60.0f);
    x[5 * CLASSES + (t[5] + 1) % CLASSES] = fsdp_bf16_from_f32(-3e38f);
    for (int c = 0; c < CLASSES; c++) x[6 * CLASSES + c] = fsdp_bf16_from_f32(0.75f);
}

/* One loss call (ignore: fsdp_loss_cross_entropy_ignore, else fsdp_loss_cross_entropy on the
 * rows not ignored) of logits, gradient into d (NULL: none). */
static float loss_of(const fsdp_tensor *logits, const int32_t *t, bool ignore, fsdp_tensor *d) {
    float loss = 0;
    fsdp_ctx *ctx = fsdp_test_ctx();
    if (ignore)
        FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, logits, t, FSDP_IGNORE_INDEX, &loss, d));
    else
        FSDP_TEST_OK(fsdp_loss_cross_entropy(ctx, logits, t, &loss, d));
    return loss;
}

/* The loss over bf16 logits against the f32 loss over the widened ones on dev, bit for bit:
 * the loss without and with each gradient dtype, the f32 gradient, and the bf16 gradient against
 * the device's f32_to_bf16 of the f32 one. ignore false: fsdp_loss_cross_entropy on the rows
 * with targets (the ignored row's target set to a class). */
static void check_loss(fsdp_device dev, bool ignore) {
    static fsdp_bf16 x16[ROWS * CLASSES], g16[ROWS * CLASSES], want16[ROWS * CLASSES];
    static float xf[ROWS * CLASSES], gf[ROWS * CLASSES], want[ROWS * CLASSES];
    int32_t t[ROWS];
    make_logits(x16, t);
    if (!ignore) t[4] = 3;
    for (int i = 0; i < ROWS * CLASSES; i++) xf[i] = fsdp_bf16_to_f32(x16[i]);
    fsdp_tensor *l16 = on(dev, FSDP_DTYPE_BF16, x16, ROWS, ROWS * CLASSES);
    fsdp_tensor *l32 = on(dev, FSDP_DTYPE_F32, xf, ROWS, ROWS * CLASSES);
    fsdp_tensor *d16 = on(dev, FSDP_DTYPE_BF16, g16, ROWS, ROWS * CLASSES);
    fsdp_tensor *d32 = on(dev, FSDP_DTYPE_F32, gf, ROWS, ROWS * CLASSES);
    fsdp_tensor *r32 = on(dev, FSDP_DTYPE_F32, gf, ROWS, ROWS * CLASSES);
    fsdp_tensor *r16 = on(dev, FSDP_DTYPE_BF16, g16, ROWS, ROWS * CLASSES);
    float ref = loss_of(l32, t, ignore, r32);
    float losses[3] = {loss_of(l16, t, ignore, NULL), loss_of(l16, t, ignore, d32),
                       loss_of(l16, t, ignore, d16)};
    fsdp_kernels_for(dev)->f32_to_bf16(fsdp_tensor_data(r16), fsdp_tensor_f32(r32), ROWS * CLASSES);
    back(want, r32), back(gf, d32), back(want16, r16), back(g16, d16);
    printf("\n    %s %s: loss %.9g (f32 logits %.9g)", fsdp_device_to_string(dev),
           ignore ? "ignore_index" : "plain", (double)losses[0], (double)ref);
    CU_ASSERT_TRUE(isfinite(ref) && ref > 0);
    CU_ASSERT_EQUAL(differ("losses", losses, (float[]){ref, ref, ref}, 3, sizeof(float)), 0);
    CU_ASSERT_EQUAL(differ("f32 gradient", gf, want, ROWS * CLASSES, sizeof(float)), 0);
    CU_ASSERT_EQUAL(differ("bf16 gradient", g16, want16, ROWS * CLASSES, sizeof(fsdp_bf16)), 0);
    int64_t zeros = 0, nonzero = 0; /* the ignored row is zero, the others are not */
    for (int c = 0; c < CLASSES; c++) zeros += g16[4 * CLASSES + c] == 0;
    for (int c = 0; c < CLASSES; c++) nonzero += g16[0 * CLASSES + c] != 0;
    if (ignore) CU_ASSERT_EQUAL(zeros, CLASSES);
    CU_ASSERT_EQUAL(nonzero, CLASSES);
    fsdp_tensor *all[] = {l16, l32, d16, d32, r32, r16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
}

static void test_loss_kernel(void) {
    check_loss(FSDP_CPU, true);
    check_loss(FSDP_CPU, false);
    check_loss(fsdp_test_device(), true);
    check_loss(fsdp_test_device(), false);
}

/* ---- the model ---- */

typedef struct step_out {
    float loss;
    float logits[N_TOK * VOCAB];
    float *grads; /* every parameter's gradient, then every parameter, in visit order */
    int64_t n;
    fsdp_dtype grad_dtype; /* the logit gradient's */
} step_out;

static fsdp_status copy_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    step_out *o = user;
    const fsdp_tensor *src[2] = {fsdp_param_grad(p), fsdp_param_data(p)};
    for (int i = 0; i < 2; i++) {
        fsdp_tensor *h = NULL;
        int64_t n = fsdp_tensor_numel(src[i]);
        FSDP_TRY_AT(
            ctx, fsdp_tensor_from_blob(ctx, o->grads + o->n, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &h));
        fsdp_status st = fsdp_tensor_copy(ctx, h, src[i]);
        fsdp_tensor_free(h);
        FSDP_TRY_AT(ctx, st);
        o->n += n;
    }
    return FSDP_OK;
}

/* Forward, cross-entropy with a gradient of the logits' dtype (f32_grad: f32) and backward of a
 * fixed batch on m (on dev), its results to o, then an SGD step of opt; *bytes (may be NULL)
 * the model's activation bytes right after the forward. */
static void step(fsdp_module *m, fsdp_optimizer *opt, fsdp_device dev, bool f32_grad, step_out *o,
                 int64_t *bytes) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    int32_t tok[N_TOK], tgt[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)((i * 37 + 11) % VOCAB);
    for (int i = 0; i < N_TOK; i++) tgt[i] = i % SEQ == SEQ - 1 ? FSDP_IGNORE_INDEX : tok[i + 1];
    fsdp_tensor *td = on(dev, FSDP_DTYPE_I32, tok, BATCH, N_TOK), *dl = NULL, *lh = NULL;
    const fsdp_tensor *out = NULL;
    FSDP_TEST_OK(fsdp_optimizer_zero_grad(ctx, opt));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, td, &out));
    if (bytes) FSDP_TEST_OK(fsdp_module_activation_bytes(ctx, m, bytes));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, f32_grad ? FSDP_DTYPE_F32 : fsdp_tensor_dtype(out), dev, 3,
                                    fsdp_tensor_shape(out), &dl));
    o->grad_dtype = fsdp_tensor_dtype(dl);
    FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, out, tgt, FSDP_IGNORE_INDEX, &o->loss, dl));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dl, NULL));
    FSDP_TEST_OK(
        fsdp_tensor_create(ctx, fsdp_tensor_dtype(out), FSDP_CPU, 3, fsdp_tensor_shape(out), &lh));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, lh, out));
    for (int i = 0; i < N_TOK * VOCAB; i++) /* widened when bf16 */
        o->logits[i] = fsdp_tensor_dtype(lh) == FSDP_DTYPE_BF16
                           ? fsdp_bf16_to_f32(((const fsdp_bf16 *)fsdp_tensor_data(lh))[i])
                           : fsdp_tensor_f32(lh)[i];
    free(o->grads);
    o->n = 0;
    o->grads = calloc(2 * (size_t)fsdp_module_param_count(m), sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(o->grads);
    FSDP_TEST_OK(fsdp_module_visit_params(ctx, m, copy_param, o));
    FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
    fsdp_tensor_free(td), fsdp_tensor_free(dl), fsdp_tensor_free(lh);
}

/* Three SGD steps (momentum) of the bf16-logits Llama, its loss given a bf16 logit gradient
 * (f32_grad: an f32 one), against the f32-logits one on dev: loss, logits, gradients and the
 * parameters before each step bit for bit on the CPU and sim (CUDA: the same GEMMs and the same
 * loss kernel on each side, so equal too; compared within test_autocast's device bound). */
static void check_model(fsdp_device dev, bool f32_grad) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_test_device_pin_f32_attention(true);
    fsdp_module *mb = llama(FSDP_DTYPE_BF16), *mf = llama(FSDP_DTYPE_F32);
    if (dev.type != FSDP_DEVICE_CPU) {
        FSDP_TEST_OK(fsdp_module_to(ctx, mb, dev));
        FSDP_TEST_OK(fsdp_module_to(ctx, mf, dev));
    }
    fsdp_optimizer *ob = NULL, *of = NULL;
    fsdp_sgd_options so = {.lr = 0.5, .momentum = 0.9};
    FSDP_TEST_OK(fsdp_sgd_create(ctx, mb, &so, &ob));
    FSDP_TEST_OK(fsdp_sgd_create(ctx, mf, &so, &of));
    step_out *b = calloc(1, sizeof *b), *f = calloc(1, sizeof *f);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b && f);
    float first = 0;
    for (int s = 0; s < 3; s++) {
        step(mb, ob, dev, f32_grad, b, NULL), step(mf, of, dev, false, f, NULL);
        if (s == 0) first = f->loss;
        printf("\n    %s, %s gradient, step %d: loss %.9g, f32 logits %.9g",
               fsdp_device_to_string(dev), fsdp_dtype_to_string(b->grad_dtype), s, (double)b->loss,
               (double)f->loss);
        CU_ASSERT_EQUAL_FATAL(b->n, f->n);
        CU_ASSERT_EQUAL(b->grad_dtype, f32_grad ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16);
        CU_ASSERT_EQUAL(f->grad_dtype, FSDP_DTYPE_F32);
        double tol = fsdp_test_device_tol(5e-2);
        CU_ASSERT_TRUE(fsdp_test_device_close("loss", &b->loss, &f->loss, 1, tol, 0));
        CU_ASSERT_TRUE(fsdp_test_device_close("logits", b->logits, f->logits, N_TOK * VOCAB, tol,
                                              tol ? 1e-3 : 0));
        CU_ASSERT_TRUE(fsdp_test_device_close("gradients, parameters", b->grads, f->grads, b->n,
                                              tol, tol ? 1e-3 : 0));
    }
    CU_ASSERT_TRUE(f->loss < first); /* it trained: the steps changed the parameters */
    free(b->grads), free(f->grads), free(b), free(f);
    fsdp_optimizer_free(ob), fsdp_optimizer_free(of);
    fsdp_module_free(mb), fsdp_module_free(mf);
    fsdp_test_device_pin_f32_attention(false);
}

static void test_model_cpu(void) {
    check_model(FSDP_CPU, false);
    check_model(FSDP_CPU, true);
}

static void test_model_device(void) {
    check_model(fsdp_test_device(), false);
    check_model(fsdp_test_device(), true);
}

/* The logits are a bf16 tensor, and the activation bytes after forward are fewer by exactly
 * lm_head's f32 logits' second half (2 R V) and its bf16 scratch y16 (2 R max(V, C)), which a
 * bf16 logit gradient does not need (--plan's estimate counts the same). */
static void test_activation_bytes(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *mb = llama(FSDP_DTYPE_BF16), *mf = llama(FSDP_DTYPE_F32);
    fsdp_optimizer *ob = NULL, *of = NULL;
    FSDP_TEST_OK(fsdp_sgd_create(ctx, mb, &(fsdp_sgd_options){.lr = 0.1}, &ob));
    FSDP_TEST_OK(fsdp_sgd_create(ctx, mf, &(fsdp_sgd_options){.lr = 0.1}, &of));
    step_out *o = calloc(1, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    int64_t bb = 0, bf = 0, bb2 = 0;
    step(mb, ob, FSDP_CPU, false, o, &bb), step(mf, of, FSDP_CPU, false, o, &bf);
    step(mb, ob, FSDP_CPU, false, o, &bb2); /* the second forward makes none either */
    const int64_t R = N_TOK, saved = 2 * R * VOCAB + 2 * R * (VOCAB > DIM ? VOCAB : DIM);
    printf("\n    activation bytes: %lld with bf16 logits, %lld with f32 (%lld fewer; derived "
           "%lld)",
           (long long)bb, (long long)bf, (long long)(bf - bb), (long long)saved);
    CU_ASSERT_EQUAL(bf - bb, saved);
    CU_ASSERT_EQUAL(bb2, bb);
    const fsdp_tensor *out = NULL;
    fsdp_tensor *td = on(FSDP_CPU, FSDP_DTYPE_I32, (int32_t[N_TOK]){0}, BATCH, N_TOK);
    FSDP_TEST_OK(fsdp_module_forward(ctx, mb, td, &out));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(out), FSDP_DTYPE_BF16);
    FSDP_TEST_OK(fsdp_module_forward(ctx, mf, td, &out));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(out), FSDP_DTYPE_F32);
    /* the policy turned off: f32 logits from the same model */
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, mb, FSDP_DTYPE_F32));
    FSDP_TEST_OK(fsdp_module_forward(ctx, mb, td, &out));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(out), FSDP_DTYPE_F32);
    fsdp_tensor_free(td);
    free(o->grads), free(o);
    fsdp_optimizer_free(ob), fsdp_optimizer_free(of);
    fsdp_module_free(mb), fsdp_module_free(mf);
}

/* Generation over a bf16-logits model gives the f32-logits model's logits (widened). */
static void test_decode(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *mb = llama(FSDP_DTYPE_BF16), *mf = llama(FSDP_DTYPE_F32);
    fsdp_llama_cache *cb = NULL, *cf = NULL;
    FSDP_TEST_OK(fsdp_llama_cache_create(ctx, mb, 0, &cb));
    FSDP_TEST_OK(fsdp_llama_cache_create(ctx, mf, 0, &cf));
    const int32_t prompt[5] = {3, 14, 15, 9, 26};
    const float *lb = NULL, *lf = NULL;
    for (int i = 0; i < 2; i++) {
        FSDP_TEST_OK(fsdp_llama_decode(ctx, cb, i ? prompt + 4 : prompt, i ? 1 : 4, &lb));
        FSDP_TEST_OK(fsdp_llama_decode(ctx, cf, i ? prompt + 4 : prompt, i ? 1 : 4, &lf));
        CU_ASSERT_EQUAL(differ("decoded logits", lb, lf, VOCAB, sizeof(float)), 0);
    }
    fsdp_llama_cache_free(cb), fsdp_llama_cache_free(cf);
    fsdp_module_free(mb), fsdp_module_free(mf);
}

/* ---- misuse ---- */

static void test_refusals(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m = NULL;
    fsdp_llama_config cfg = {.dim = DIM, .n_layers = 1, .n_heads = 4, .vocab_size = VOCAB};
    cfg.logits_dtype = FSDP_DTYPE_BF16; /* without the bf16 policy */
    FSDP_TEST_FAILS(fsdp_model_llama(ctx, &cfg, &m), FSDP_ERR_INVALID_ARGUMENT, "logits_dtype",
                    "compute_dtype = FSDP_DTYPE_BF16");
    cfg.compute_dtype = FSDP_DTYPE_BF16, cfg.logits_dtype = FSDP_DTYPE_F16;
    FSDP_TEST_FAILS(fsdp_model_llama(ctx, &cfg, &m), FSDP_ERR_INVALID_ARGUMENT, "logits_dtype");
    cfg.logits_dtype = FSDP_DTYPE_BF16; /* tensor parallelism */
    fsdp_tp_plan_entry plan[FSDP_LLAMA_TP_PLAN_LEN];
    int n = 0;
    FSDP_TEST_FAILS(fsdp_llama_tp_plan(ctx, &cfg, 2, true, plan, &n), FSDP_ERR_INVALID_ARGUMENT,
                    "logits_dtype", "FSDP_DTYPE_F32");
    FSDP_TEST_OK(fsdp_llama_tp_plan(ctx, &cfg, 1, true, plan, &n));

    /* the loss: bf16 gradient of f32 logits, f16 logits or gradient, a gradient's shape */
    float loss = 0, zeros[8 * 4] = {0};
    int32_t t[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    fsdp_tensor *l32 = on(FSDP_CPU, FSDP_DTYPE_F32, zeros, 8, 32);
    fsdp_tensor *l16 = on(FSDP_CPU, FSDP_DTYPE_BF16, zeros, 8, 32);
    fsdp_tensor *h16 = on(FSDP_CPU, FSDP_DTYPE_F16, zeros, 8, 32);
    fsdp_tensor *w16 = on(FSDP_CPU, FSDP_DTYPE_BF16, zeros, 4, 32); /* (4, 8) */
    FSDP_TEST_FAILS(fsdp_loss_cross_entropy_ignore(ctx, l32, t, -100, &loss, l16), FSDP_ERR_DTYPE,
                    "bf16 logits only", "f32 dlogits");
    FSDP_TEST_FAILS(fsdp_loss_cross_entropy(ctx, l32, t, &loss, l16), FSDP_ERR_DTYPE,
                    "bf16 logits only");
    FSDP_TEST_FAILS(fsdp_loss_cross_entropy_ignore(ctx, h16, t, -100, &loss, NULL), FSDP_ERR_DTYPE,
                    "f16", "f32 or bf16 logits");
    FSDP_TEST_FAILS(fsdp_loss_cross_entropy_ignore(ctx, l16, t, -100, &loss, h16), FSDP_ERR_SHAPE,
                    "f32 or bf16");
    FSDP_TEST_FAILS(fsdp_loss_cross_entropy_ignore(ctx, l16, t, -100, &loss, w16), FSDP_ERR_SHAPE,
                    "f32 or bf16");
    FSDP_TEST_FAILS(fsdp_loss_scale_grad(ctx, l16, 2.0f), FSDP_ERR_DTYPE, "f32");
    FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, l16, t, -100, &loss, l16)); /* in place */
    CU_ASSERT_TRUE(fabsf(loss - logf(4.0f)) <= 1e-6f); /* 4 equal classes: log 4, to f32 */

    /* a Linear: a bf16 output gradient outside the policy, or with a bias gradient */
    fsdp_module *lin = NULL, *biased = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 8, false, &lin));
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 8, true, &biased));
    fsdp_tensor *x = on(FSDP_CPU, FSDP_DTYPE_F32, zeros, 4, 32); /* (4, 8) */
    const fsdp_tensor *y = NULL, *dx = NULL;
    FSDP_TEST_OK(fsdp_module_forward(ctx, lin, x, &y));
    FSDP_TEST_FAILS(fsdp_module_backward(ctx, lin, w16, &dx), FSDP_ERR_DTYPE, "bf16",
                    "fsdp_module_set_autocast");
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, lin, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, biased, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_forward(ctx, lin, x, &y));
    FSDP_TEST_OK(fsdp_module_backward(ctx, lin, w16, &dx));
    FSDP_TEST_OK(fsdp_module_forward(ctx, biased, x, &y));
    FSDP_TEST_FAILS(fsdp_module_backward(ctx, biased, w16, &dx), FSDP_ERR_DTYPE,
                    "without a bias gradient");
    fsdp_tensor *all[] = {l32, l16, h16, w16, x};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
    fsdp_module_free(lin), fsdp_module_free(biased);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"loss_kernel", test_loss_kernel},
        {"model_cpu", test_model_cpu},
        {"model_device", test_model_device},
        {"activation_bytes", test_activation_bytes},
        {"decode", test_decode},
        {"refusals", test_refusals},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "bf16_logits", cases, (int)(sizeof cases / sizeof cases[0]));
}

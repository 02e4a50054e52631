/* test_llama_cuda.c: the Llama kernels of a device's table against the CPU table's on random
 * inputs, and fsdp_model_llama moved to the device against the same Hugging Face fixture as
 * test_llama; on cuda:0 where a GPU is usable and on sim:0 (the simulated GPU) otherwise, where
 * every result must equal the CPU's bit for bit (the model's too: it is run on the CPU as well). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "harness.h"         // defines: fsdp_test_run, fsdp_test_close, FSDP_TEST_OK
#include "kernel_rng.h"      // defines: rng_seed, rng_uniform
#include "kernels/kernels.h" // defines: fsdp_kernels_for
#include "on_device.h"       // defines: fsdp_test_device, fsdp_test_device_close

static fsdp_device dev(void) {
    return fsdp_test_device();
}

/* ---- device buffers ---- */

typedef struct dbuf {
    fsdp_tensor *t;
    int64_t n;
} dbuf;

/* a device copy of n elements of dtype at host; when host is NULL an output, every element NaN
 * (an f32 one), as a reused block of the caching allocator holds what its last user left: an
 * entry that leaves an element unwritten leaves a NaN, which no comparison with the CPU passes */
static dbuf up(const void *host, fsdp_dtype dtype, int64_t n) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    dbuf b = {NULL, n};
    int64_t shape[1] = {n > 0 ? n : 1};
    FSDP_TEST_OK(fsdp_tensor_create(ctx, dtype, dev(), 1, shape, &b.t));
    if (!host && dtype == FSDP_DTYPE_F32) FSDP_TEST_OK(fsdp_tensor_fill(ctx, b.t, NAN));
    if (host) {
        fsdp_tensor *h = NULL;
        FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, (void *)host, dtype, FSDP_CPU, 1, shape, &h));
        FSDP_TEST_OK(fsdp_tensor_copy(ctx, b.t, h));
        fsdp_tensor_free(h);
    }
    return b;
}

static float *f(dbuf b) {
    return fsdp_tensor_data(b.t);
}

/* compares the device buffer with the CPU's result: bit for bit on sim, within rtol and atol on
 * CUDA (the tolerances are for GPU arithmetic) */
static void same(const char *name, dbuf b, const float *want, double rtol, double atol) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    float *got = calloc((size_t)b.n + 1, sizeof(float));
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, got, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                       (int64_t[]){b.n > 0 ? b.n : 1}, &h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, h, b.t));
    CU_ASSERT_TRUE(fsdp_test_device_close(name, got, want, b.n, rtol, atol));
    fsdp_tensor_free(h);
    free(got);
}

static float *uniform(int64_t n, float lo, float hi) {
    float *p = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) p[i] = rng_uniform(lo, hi);
    return p;
}

/* ---- kernels against the CPU ---- */

/* The embedding backward over many tokens of few rows (runs of one row as long as real text's
 * frequent tokens give), more columns than a block has threads, and a vocabulary range that
 * leaves tokens out on both sides: CUDA's sorted path adds each row's gradient rows in token
 * order, as the CPU does, so bit for bit. */
static void embedding_long_runs(const fsdp_kernels_i *c, const fsdp_kernels_i *g) {
    enum { N = 3000, V = 37, C = 300 };
    int32_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = i % 7 == 0 ? 0 : (int32_t)(rng_u32() % V);
    float *dy = uniform(N * C, -1, 1), *dw = uniform(V * C, -1, 1);
    dbuf gt = up(tok, FSDP_DTYPE_I32, N), gdy = up(dy, FSDP_DTYPE_F32, N * C);
    dbuf gdw = up(dw, FSDP_DTYPE_F32, V * C);
    c->embedding_backward(dw, dy, tok, N, C, 0, V);
    g->embedding_backward(f(gdw), f(gdy), fsdp_tensor_data(gt.t), N, C, 0, V);
    same("embedding backward, long runs", gdw, dw, 0, 0);
    c->embedding_backward(dw + 5 * C, dy, tok, N, C, 5, 20);
    g->embedding_backward(f(gdw) + 5 * C, f(gdy), fsdp_tensor_data(gt.t), N, C, 5, 20);
    same("embedding backward of a vocabulary range, long runs", gdw, dw, 0, 0);
    fsdp_tensor_free(gt.t), fsdp_tensor_free(gdy.t), fsdp_tensor_free(gdw.t);
    free(tok), free(dy), free(dw);
}

static void test_kernels_match_cpu(void) {
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU), *g = fsdp_kernels_for(dev());
    CU_ASSERT_TRUE_FATAL(g->embedding_forward && g->embedding_backward && g->rope_forward &&
                         g->rope_backward && g->attention_forward && g->attention_backward &&
                         g->swiglu_forward && g->swiglu_backward && g->cross_entropy_ignore &&
                         g->vocab_row_max && g->vocab_exp_sums && g->vocab_ce_grad);
    rng_seed(21);
    enum { B = 2, T = 7, NH = 4, NKV = 2, D = 6, V = 11, C = 5, N = B * T };
    /* embedding */
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u32() % V);
    float *w = uniform(V * C, -1, 1), *e = uniform(N * C, 0, 0), *dy = uniform(N * C, -1, 1);
    float *dw = uniform(V * C, -1, 1);
    dbuf gt = up(tok, FSDP_DTYPE_I32, N), gw = up(w, FSDP_DTYPE_F32, V * C);
    dbuf ge = up(NULL, FSDP_DTYPE_F32, N * C), gdy = up(dy, FSDP_DTYPE_F32, N * C);
    dbuf gdw = up(dw, FSDP_DTYPE_F32, V * C);
    c->embedding_forward(e, tok, w, N, C, 0, V);
    g->embedding_forward(f(ge), fsdp_tensor_data(gt.t), f(gw), N, C, 0, V);
    same("embedding forward", ge, e, 0, 0);
    c->embedding_backward(dw, dy, tok, N, C, 0, V);
    g->embedding_backward(f(gdw), f(gdy), fsdp_tensor_data(gt.t), N, C, 0, V);
    same("embedding backward", gdw, dw, 0, 0);
    /* a vocabulary range [3, 7) of the table (tensor parallelism's shard): zeros elsewhere */
    c->embedding_forward(e, tok, w + 3 * C, N, C, 3, 4);
    g->embedding_forward(f(ge), fsdp_tensor_data(gt.t), f(gw) + 3 * C, N, C, 3, 4);
    same("embedding forward of a vocabulary range", ge, e, 0, 0);
    c->embedding_backward(dw + 3 * C, dy, tok, N, C, 3, 4);
    g->embedding_backward(f(gdw) + 3 * C, f(gdy), fsdp_tensor_data(gt.t), N, C, 3, 4);
    same("embedding backward of a vocabulary range", gdw, dw, 0, 0);
    embedding_long_runs(c, g);
    /* rope */
    int64_t nq = B * T * NH * D, nk = B * T * NKV * D;
    float *cs = uniform(2 * T * (D / 2), -1, 1), *x = uniform(nq, -1, 1), *y = uniform(nq, 0, 0);
    dbuf gcs = up(cs, FSDP_DTYPE_F32, 2 * T * (D / 2)), gx = up(x, FSDP_DTYPE_F32, nq);
    dbuf gy = up(NULL, FSDP_DTYPE_F32, nq);
    const float *sn = cs + T * (D / 2);
    c->rope_forward(y, x, cs, sn, B, T, NH, D);
    g->rope_forward(f(gy), f(gx), f(gcs), f(gcs) + T * (D / 2), B, T, NH, D);
    same("rope forward", gy, y, 1e-6, 1e-7);
    c->rope_backward(y, x, cs, sn, B, T, NH, D);
    g->rope_backward(f(gy), f(gx), f(gcs), f(gcs) + T * (D / 2), B, T, NH, D);
    same("rope backward", gy, y, 1e-6, 1e-7);
    /* attention */
    float *q = uniform(nq, -1.5f, 1.5f), *k = uniform(nk, -1.5f, 1.5f), *v = uniform(nk, -1, 1);
    /* scratch: (T, T) for forward, (2, T, T) for backward */
    float *o = uniform(nq, 0, 0), *lse = uniform(B * NH * T, 0, 0);
    float *scr = uniform(2 * T * T, 0, 0);
    float *dout = uniform(nq, -1, 1), *dq = uniform(nq, 0, 0), *dk = uniform(nk, 0, 0);
    float *dv = uniform(nk, 0, 0);
    dbuf gq = up(q, FSDP_DTYPE_F32, nq), gk = up(k, FSDP_DTYPE_F32, nk);
    dbuf gv = up(v, FSDP_DTYPE_F32, nk), go = up(NULL, FSDP_DTYPE_F32, nq);
    dbuf gl = up(NULL, FSDP_DTYPE_F32, B * NH * T), gs = up(NULL, FSDP_DTYPE_F32, 2 * T * T);
    dbuf gdo = up(dout, FSDP_DTYPE_F32, nq), gdq = up(NULL, FSDP_DTYPE_F32, nq);
    dbuf gdk = up(NULL, FSDP_DTYPE_F32, nk), gdv = up(NULL, FSDP_DTYPE_F32, nk);
    c->attention_forward(o, lse, scr, q, k, v, B, T, NH, NKV, D);
    g->attention_forward(f(go), f(gl), f(gs), f(gq), f(gk), f(gv), B, T, NH, NKV, D);
    same("attention out", go, o, 1e-5, 1e-6);
    same("attention lse", gl, lse, 1e-5, 1e-6);
    c->attention_backward(dq, dk, dv, scr, dout, q, k, v, o, lse, B, T, NH, NKV, D);
    g->attention_backward(f(gdq), f(gdk), f(gdv), f(gs), f(gdo), f(gq), f(gk), f(gv), f(go), f(gl),
                          B, T, NH, NKV, D);
    same("attention dq", gdq, dq, 1e-4, 1e-6);
    same("attention dk", gdk, dk, 1e-4, 1e-6);
    same("attention dv", gdv, dv, 1e-4, 1e-6);
    /* SwiGLU */
    float *sw = uniform(nq, 0, 0), *sg = uniform(nq, 0, 0);
    dbuf gsw = up(NULL, FSDP_DTYPE_F32, nq), gsg = up(NULL, FSDP_DTYPE_F32, nq);
    c->swiglu_forward(sw, q, o, nq);
    g->swiglu_forward(f(gsw), f(gq), f(go), nq);
    same("swiglu forward", gsw, sw, 1e-6, 1e-7);
    c->swiglu_backward(sg, sw, dout, q, o, nq);
    g->swiglu_backward(f(gsg), f(gsw), f(gdo), f(gq), f(go), nq);
    same("swiglu dgate", gsg, sg, 1e-6, 1e-7);
    same("swiglu dup", gsw, sw, 1e-6, 1e-7);
    /* cross-entropy with ignored rows */
    int32_t tg[N];
    for (int i = 0; i < N; i++) tg[i] = i % 4 == 1 ? -100 : (int32_t)(rng_u32() % V);
    float *lg = uniform(N * V, -3, 3), *dl = uniform(N * V, 0, 0), lc = 0, ldev = 0;
    dbuf glg = up(lg, FSDP_DTYPE_F32, N * V), gdl = up(NULL, FSDP_DTYPE_F32, N * V);
    dbuf gtg = up(tg, FSDP_DTYPE_I32, N);
    c->cross_entropy_ignore(&lc, dl, lg, tg, -100, N, V);
    g->cross_entropy_ignore(&ldev, f(gdl), f(glg), fsdp_tensor_data(gtg.t), -100, N, V);
    printf("\n    cross_entropy_ignore loss cpu %.9g %s %.9g", lc, fsdp_device_to_string(dev()),
           ldev);
    CU_ASSERT_TRUE(fabsf(lc - ldev) <= fsdp_test_device_tol(1e-6) * fabsf(lc));
    same("cross_entropy_ignore dlogits", gdl, dl, 1e-5, 1e-8);
    /* loss parallel's pieces, the logits read as the classes [3, 3 + V) of a larger vocabulary
     * (targets below 3 or past 3 + V are another shard's), over 9 counted rows in all: the
     * maxima and target logits exact, the double sums and the gradient as cross_entropy's */
    const int32_t *gtgt = fsdp_tensor_data(gtg.t);
    float *vs = uniform(3 * N, 0, 0), *vd = uniform(N * V, 0, 0);
    dbuf gvs = up(NULL, FSDP_DTYPE_F32, 3 * N), gvd = up(NULL, FSDP_DTYPE_F32, N * V);
    c->vocab_row_max(vs, lg, N, V);
    g->vocab_row_max(f(gvs), f(glg), N, V);
    c->vocab_exp_sums(vs + N, vs + 2 * N, lg, vs, tg, -100, 3, N, V);
    g->vocab_exp_sums(f(gvs) + N, f(gvs) + 2 * N, f(glg), f(gvs), gtgt, -100, 3, N, V);
    c->vocab_ce_grad(vd, lg, vs, vs + N, tg, -100, 3, N, V, 9);
    g->vocab_ce_grad(f(gvd), f(glg), f(gvs), f(gvs) + N, gtgt, -100, 3, N, V, 9);
    same("vocab_row_max and vocab_exp_sums", gvs, vs, 1e-6, 0);
    same("vocab_ce_grad", gvd, vd, 1e-5, 1e-8);
    fsdp_tensor_free(gvs.t), fsdp_tensor_free(gvd.t), free(vs), free(vd);
    dbuf all[] = {gt, gw, ge,  gdy, gdw, gcs, gx,  gy,  gq,  gk,  gv, go,
                  gl, gs, gdo, gdq, gdk, gdv, gsw, gsg, glg, gdl, gtg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i].t);
    float *host[] = {w,   e,   dy,   dw, cs, x,  y,  q,  k,  v, o,
                     lse, scr, dout, dq, dk, dv, sw, sg, lg, dl};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

/* ---- the model on the device against Hugging Face ---- */

/* What a forward and backward of the model gave, on the host: the loss, the logits and every
 * parameter's gradient in the fixture's order. */
typedef struct llama_run {
    float loss;
    fsdp_tensor *logits;
    fsdp_tensor **grads;
    int n;
} llama_run;

static void llama_run_free(llama_run *r) {
    fsdp_tensor_free(r->logits);
    for (int i = 0; i < r->n; i++) fsdp_tensor_free(r->grads[i]);
    free(r->grads);
}

/* A copy of t on the host. */
static fsdp_tensor *to_host(const fsdp_tensor *t) {
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(fsdp_test_ctx(), fsdp_tensor_dtype(t), FSDP_CPU,
                                    fsdp_tensor_ndim(t), fsdp_tensor_shape(t), &h));
    FSDP_TEST_OK(fsdp_tensor_copy(fsdp_test_ctx(), h, t));
    return h;
}

/* The fixture's model with its weights, moved to `device`: cross-entropy on its tokens and
 * targets, forward and backward. */
static llama_run run_llama(const fixture *fx, const fsdp_llama_config *cfg, fsdp_device device) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fixture_tensor *tok = fixture_require(fx, "tokens", FIXTURE_I32);
    const fixture_tensor *tgt = fixture_require(fx, "targets", FIXTURE_I32);
    CU_ASSERT_FATAL(tok && tgt);
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, cfg, &m));
    for (int i = 0; i < fixture_num_params(fx); i++) {
        const fixture_tensor *t = fixture_param(fx, i);
        CU_ASSERT_EQUAL_FATAL(
            fixture_copy_into(ctx, t, fsdp_param_data(fsdp_module_get_param(m, t->name))), 0);
    }
    FSDP_TEST_OK(fsdp_module_to(ctx, m, device));
    fsdp_tensor *th = NULL, *td = NULL, *dl = NULL;
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, tok->data, FSDP_DTYPE_I32, FSDP_CPU, tok->ndim,
                                       tok->shape, &th));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, device, tok->ndim, tok->shape, &td));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, td, th));
    const fsdp_tensor *logits = NULL;
    llama_run r = {.loss = NAN, .n = fixture_num_params(fx)};
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, td, &logits));
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, logits, &dl));
    FSDP_TEST_OK(
        fsdp_loss_cross_entropy_ignore(ctx, logits, tgt->data, FSDP_IGNORE_INDEX, &r.loss, dl));
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dl, NULL));
    r.logits = to_host(logits);
    r.grads = calloc((size_t)r.n, sizeof *r.grads);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r.grads);
    for (int i = 0; i < r.n; i++)
        r.grads[i] = to_host(fsdp_param_grad(fsdp_module_get_param(m, fixture_param(fx, i)->name)));
    fsdp_tensor_free(th);
    fsdp_tensor_free(td);
    fsdp_tensor_free(dl);
    fsdp_module_free(m);
    return r;
}

static void test_model_matches_hf(void) {
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("llama_tiny", &fx), 0);
    const int32_t *ci = fixture_require(&fx, "config", FIXTURE_I32)->data;
    const double *cf = fixture_require(&fx, "config_f", FIXTURE_F64)->data;
    fsdp_llama_config cfg = {.dim = ci[0],
                             .n_layers = ci[1],
                             .n_heads = ci[2],
                             .n_kv_heads = ci[3],
                             .vocab_size = ci[4],
                             .ffn_hidden = ci[5],
                             .max_seq_len = ci[6],
                             .norm_eps = (float)cf[0],
                             .rope_theta = (float)cf[1]};
    llama_run r = run_llama(&fx, &cfg, dev());
    float want = *(const float *)fixture_require(&fx, "loss", FIXTURE_F32)->data;
    printf("\n    loss %.9g, PyTorch %.9g", r.loss, want);
    CU_ASSERT_TRUE(fabsf(r.loss - want) <= 1e-5f * fabsf(want));
    const fixture_tensor *lw = fixture_require(&fx, "logits", FIXTURE_F32);
    CU_ASSERT_EQUAL_FATAL(fsdp_tensor_numel(r.logits), lw->numel);
    FSDP_TEST_CLOSE("logits", fsdp_tensor_f32(r.logits), lw->data, lw->numel, 1e-5, 1e-5);
    char key[160];
    for (int i = 0; i < r.n; i++) {
        snprintf(key, sizeof key, "grad.%s", fixture_param(&fx, i)->name);
        const fixture_tensor *gw = fixture_require(&fx, key, FIXTURE_F32);
        CU_ASSERT_EQUAL_FATAL(fsdp_tensor_numel(r.grads[i]), gw->numel);
        double mx = 0;
        for (int64_t j = 0; j < gw->numel; j++) mx = fmax(mx, fabs(((const float *)gw->data)[j]));
        FSDP_TEST_CLOSE(key, fsdp_tensor_f32(r.grads[i]), gw->data, gw->numel, 1e-5, 1e-6 * mx);
    }
    if (!fsdp_test_device_is_cuda()) { // the sim runs the CPU's kernels: the CPU's bits
        llama_run c = run_llama(&fx, &cfg, FSDP_CPU);
        CU_ASSERT_TRUE(fsdp_test_device_close("loss against the CPU", &r.loss, &c.loss, 1, 0, 0));
        CU_ASSERT_TRUE(fsdp_test_device_close("logits against the CPU", fsdp_tensor_f32(r.logits),
                                              fsdp_tensor_f32(c.logits),
                                              fsdp_tensor_numel(c.logits), 0, 0));
        for (int i = 0; i < r.n; i++) {
            snprintf(key, sizeof key, "grad.%s against the CPU", fixture_param(&fx, i)->name);
            CU_ASSERT_TRUE(fsdp_test_device_close(key, fsdp_tensor_f32(r.grads[i]),
                                                  fsdp_tensor_f32(c.grads[i]),
                                                  fsdp_tensor_numel(c.grads[i]), 0, 0));
        }
        llama_run_free(&c);
    }
    llama_run_free(&r);
    fixture_free(&fx);
}

/* rope_qk_forward and rope_qk_backward: on the CPU the bits of rope_forward / rope_backward on
 * q and on k (out of place and in place); on the device against the CPU's, as rope's. */
static void test_rope_qk(void) {
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU), *g = fsdp_kernels_for(dev());
    CU_ASSERT_TRUE_FATAL(c->rope_qk_forward && c->rope_qk_backward && g->rope_qk_forward &&
                         g->rope_qk_backward);
    rng_seed(22);
    enum { B = 3, T = 5, NH = 6, NKV = 2, D = 8 };
    int64_t nq = B * T * NH * D, nk = B * T * NKV * D, h = D / 2;
    float *cs = uniform(2 * T * h, -1, 1), *q = uniform(nq, -2, 2), *k = uniform(nk, -2, 2);
    const float *sn = cs + T * h;
    float *q1 = uniform(nq, 0, 0), *k1 = uniform(nk, 0, 0), *q2 = uniform(nq, 0, 0);
    float *k2 = uniform(nk, 0, 0);
    dbuf gcs = up(cs, FSDP_DTYPE_F32, 2 * T * h), gq = up(q, FSDP_DTYPE_F32, nq);
    dbuf gk = up(k, FSDP_DTYPE_F32, nk), gqo = up(NULL, FSDP_DTYPE_F32, nq);
    dbuf gko = up(NULL, FSDP_DTYPE_F32, nk);
    for (int backward = 0; backward < 2; backward++) {
        const char *what = backward ? "rope_qk_backward" : "rope_qk_forward";
        void (*one)(float *, const float *, const float *, const float *, int64_t, int64_t, int64_t,
                    int64_t) = backward ? c->rope_backward : c->rope_forward;
        void (*both)(float *, float *, const float *, const float *, const float *, const float *,
                     int64_t, int64_t, int64_t, int64_t, int64_t) =
            backward ? c->rope_qk_backward : c->rope_qk_forward;
        one(q1, q, cs, sn, B, T, NH, D);
        one(k1, k, cs, sn, B, T, NKV, D);
        both(q2, k2, q, k, cs, sn, B, T, NH, NKV, D);
        CU_ASSERT_EQUAL(memcmp(q1, q2, (size_t)nq * 4), 0);
        CU_ASSERT_EQUAL(memcmp(k1, k2, (size_t)nk * 4), 0);
        memcpy(q2, q, (size_t)nq * 4), memcpy(k2, k, (size_t)nk * 4);
        both(q2, k2, q2, k2, cs, sn, B, T, NH, NKV, D); /* in place */
        CU_ASSERT_EQUAL(memcmp(q1, q2, (size_t)nq * 4), 0);
        CU_ASSERT_EQUAL(memcmp(k1, k2, (size_t)nk * 4), 0);
        printf("\n    %s: CPU bitwise two single calls, out of place and in place", what);
        (backward ? g->rope_qk_backward : g->rope_qk_forward)(f(gqo), f(gko), f(gq), f(gk), f(gcs),
                                                              f(gcs) + T * h, B, T, NH, NKV, D);
        /* 1e-6 relative, 1e-7 absolute on CUDA, as rope's: the same operations per element */
        same(backward ? "  q backward" : "  q forward", gqo, q1, 1e-6, 1e-7);
        same(backward ? "  k backward" : "  k forward", gko, k1, 1e-6, 1e-7);
    }
    dbuf all[] = {gcs, gq, gk, gqo, gko};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i].t);
    free(cs), free(q), free(k), free(q1), free(k1), free(q2), free(k2);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"kernels_match_cpu", test_kernels_match_cpu},
        {"rope_qk", test_rope_qk},
        {"model_matches_hf", test_model_matches_hf},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "llama_cuda", cases, (int)(sizeof cases / sizeof cases[0]));
}

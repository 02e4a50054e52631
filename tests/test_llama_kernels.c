/* test_llama_kernels.c: the CPU kernels of the Llama layers (embedding, rotary embedding,
 * causal grouped-query attention, SwiGLU, cross-entropy with an ignored target) against
 * double-precision references written here from Hugging Face Llama's formulas, and every
 * backward against central finite differences of the double forward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_close
#include "kernel_check.h"    // defines: new_floats, new_uniform, to_doubles, CLOSE_D, finite_diff
#include "kernel_rng.h"      // defines: rng_seed, rng_uniform
#include "kernels/kernels.h" // defines: fsdp_kernels_cpu

static void test_dispatch(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    CU_ASSERT_TRUE(k->embedding_forward && k->embedding_backward && k->rope_forward &&
                   k->rope_backward && k->attention_forward && k->attention_backward &&
                   k->swiglu_forward && k->swiglu_backward && k->cross_entropy_ignore);
}

/* ---- embedding ---- */

/* Forward copies rows exactly; backward adds each output-gradient row to its token's row, a
 * repeated token twice, other rows untouched (+= onto a non-zero gradient). */
static void test_embedding(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { V = 7, C = 5, N = 6 };
    rng_seed(1);
    float *w = new_uniform(V * C, -1, 1), *out = new_floats(N * C);
    float *dout = new_uniform(N * C, -1, 1), *dw = new_uniform(V * C, -1, 1);
    double *want = to_doubles(dw, V * C);
    int32_t tok[N] = {3, 0, 6, 3, 2, 3};
    k->embedding_forward(out, tok, w, N, C, 0, V);
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(memcmp(out + i * C, w + tok[i] * C, sizeof(float) * C), 0);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) want[tok[i] * C + c] += dout[i * C + c];
    k->embedding_backward(dw, dout, tok, N, C, 0, V);
    CLOSE_D("embedding dweight", dw, want, V * C, 1e-6, 1e-7);
    /* A vocabulary range [2, 5) of the table (tensor parallelism's shard, rows 2..4 of w):
     * tokens outside give zero rows and add nothing; 3 and 2 land on local rows 1 and 0. */
    enum { START = 2, ROWS = 3 };
    float *dws = new_uniform(ROWS * C, -1, 1);
    double *want_s = to_doubles(dws, ROWS * C);
    k->embedding_forward(out, tok, w + START * C, N, C, START, ROWS);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            bool in = tok[i] >= START && tok[i] < START + ROWS;
            CU_ASSERT_EQUAL(out[i * C + c], in ? w[tok[i] * C + c] : 0.0f);
            if (in) want_s[(tok[i] - START) * C + c] += dout[i * C + c];
        }
    k->embedding_backward(dws, dout, tok, N, C, START, ROWS);
    /* Each element adds at most 3 rows (token 3 three times) in f32 to a value in [-1, 1):
     * within 3 u (1.8e-7) relative of the double sum, inside rtol 1e-6 + atol 1e-7. */
    CLOSE_D("embedding dweight of a vocabulary range", dws, want_s, ROWS * C, 1e-6, 1e-7);
    free(w), free(out), free(dout), free(dw), free(want), free(dws), free(want_s);
}

/* ---- loss parallel's pieces ---- */

/* Logits (6, 11) split into the classes [0, 5) and [5, 11) of two shards: the maxima combined
 * by max, the sums of exponentials and target logits by addition (as the all_reduces do), then
 * each shard's gradient, against cross_entropy_ignore over the whole logits. The shards sum in
 * double, round each sum to f32 once and add the two in f32: lse differs from the whole row's
 * by about 2 u (1.2e-7 absolute at lse ~ 3); the loss (a mean of lse - x[t] ~ 2) and each
 * gradient element exp(x - lse) / n then within 2e-7 relative, inside rtol 1e-6 (+ atol 1e-8
 * for elements near 0). */
static void test_vocab_loss(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 6, V = 11, V0 = 5, V1 = V - V0 };
    rng_seed(5);
    float *x = new_uniform(R * V, -2, 2), *d = new_floats(R * V);
    float x0[R * V0], x1[R * V1], st0[3 * R], st1[3 * R], d0[R * V0], d1[R * V1];
    int32_t tg[R] = {3, -100, 7, 10, 0, 5};
    for (int r = 0; r < R; r++) {
        memcpy(x0 + r * V0, x + r * V, sizeof(float) * V0);
        memcpy(x1 + r * V1, x + r * V + V0, sizeof(float) * V1);
    }
    float loss = 0;
    k->cross_entropy_ignore(&loss, d, x, tg, -100, R, V);
    k->vocab_row_max(st0, x0, R, V0);
    k->vocab_row_max(st1, x1, R, V1);
    for (int r = 0; r < R; r++) st0[r] = st1[r] = st0[r] > st1[r] ? st0[r] : st1[r];
    k->vocab_exp_sums(st0 + R, st0 + 2 * R, x0, st0, tg, -100, 0, R, V0);
    k->vocab_exp_sums(st1 + R, st1 + 2 * R, x1, st1, tg, -100, V0, R, V1);
    for (int i = R; i < 3 * R; i++) st0[i] = st1[i] = st0[i] + st1[i];
    double total = 0;
    for (int r = 0; r < R; r++) {
        if (tg[r] == -100) {
            CU_ASSERT_TRUE(st0[R + r] == 0.0f && st0[2 * R + r] == 0.0f);
            continue;
        }
        CU_ASSERT_EQUAL(st0[2 * R + r], x[r * V + tg[r]]); /* the target logit, from its shard */
        total += (double)st0[r] + log((double)st0[R + r]) - (double)st0[2 * R + r];
    }
    double got = total / 5.0;
    CU_ASSERT_TRUE(fabs(got - loss) <= 1e-6 * fabs(loss));
    k->vocab_ce_grad(d0, x0, st0, st0 + R, tg, -100, 0, R, V0, 5);
    k->vocab_ce_grad(d1, x1, st1, st1 + R, tg, -100, V0, R, V1, 5);
    double *want = to_doubles(d, R * V);
    float got_d[R * V];
    for (int r = 0; r < R; r++) {
        memcpy(got_d + r * V, d0 + r * V0, sizeof(float) * V0);
        memcpy(got_d + r * V + V0, d1 + r * V1, sizeof(float) * V1);
    }
    CLOSE_D("loss-parallel gradient", got_d, want, R * V, 1e-6, 1e-8);
    free(x), free(d), free(want);
}

/* ---- rotary embedding ---- */

typedef struct rope_aux {
    const double *cos, *sin, *dout; /* (T, D/2), (T, D/2), (B, T, H, D) */
    int64_t B, T, H, D;
} rope_aux;

/* Hugging Face's formula literally: y = x * cat(cos, cos) + rotate_half(x) * cat(sin, sin),
 * rotate_half(x) = cat(-x[h:], x[:h]). */
static void ref_rope(double *y, const double *x, const rope_aux *a) {
    int64_t h = a->D / 2;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t t = 0; t < a->T; t++)
            for (int64_t hd = 0; hd < a->H; hd++) {
                int64_t off = ((b * a->T + t) * a->H + hd) * a->D;
                for (int64_t i = 0; i < a->D; i++) {
                    double c = a->cos[t * h + i % h], s = a->sin[t * h + i % h];
                    double rot = i < h ? -x[off + i + h] : x[off + i - h];
                    y[off + i] = x[off + i] * c + rot * s;
                }
            }
}

static double rope_loss(const double *x, const void *aux) {
    const rope_aux *a = aux;
    int64_t n = a->B * a->T * a->H * a->D;
    double *y = new_doubles(n), L = 0;
    ref_rope(y, x, a);
    for (int64_t i = 0; i < n; i++) L += y[i] * a->dout[i];
    free(y);
    return L;
}

/* Tables from Llama's inverse frequencies (theta 10000); forward against the reference (rtol
 * 1e-6), in place equal to out of place; backward against finite differences (rtol 1e-6),
 * in place too. Then the layout itself: at a quarter turn (cos 0, sin 1) x = e_0 goes to
 * e_{D/2}: the halves rotate together, not neighbouring pairs. */
static void test_rope(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { B = 2, T = 5, H = 3, D = 8, N = B * T * H * D, HALF = D / 2 };
    rng_seed(2);
    float cosf_[T * HALF], sinf_[T * HALF];
    double cosd[T * HALF], sind[T * HALF];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HALF; i++) {
            double ang = t / pow(10000.0, 2.0 * i / D);
            cosf_[t * HALF + i] = (float)cos(ang), sinf_[t * HALF + i] = (float)sin(ang);
            cosd[t * HALF + i] = cosf_[t * HALF + i], sind[t * HALF + i] = sinf_[t * HALF + i];
        }
    float *x = new_uniform(N, -2, 2), *y = new_floats(N), *dout = new_uniform(N, -1, 1);
    float *dx = new_floats(N);
    double *xd = to_doubles(x, N), *dd = to_doubles(dout, N), *want = new_doubles(N);
    rope_aux aux = {cosd, sind, dd, B, T, H, D};
    ref_rope(want, xd, &aux);
    k->rope_forward(y, x, cosf_, sinf_, B, T, H, D);
    CLOSE_D("rope forward", y, want, N, 1e-6, 1e-7);
    float *inplace = new_floats(N);
    memcpy(inplace, x, sizeof(float) * N);
    k->rope_forward(inplace, inplace, cosf_, sinf_, B, T, H, D);
    CU_ASSERT_EQUAL(memcmp(inplace, y, sizeof(float) * N), 0);
    k->rope_backward(dx, dout, cosf_, sinf_, B, T, H, D);
    finite_diff(want, rope_loss, xd, N, 1e-5, &aux);
    CLOSE_D("rope backward vs finite diff", dx, want, N, 1e-6, 1e-7);
    memcpy(inplace, dout, sizeof(float) * N);
    k->rope_backward(inplace, inplace, cosf_, sinf_, B, T, H, D);
    CU_ASSERT_EQUAL(memcmp(inplace, dx, sizeof(float) * N), 0);
    float e0[D] = {1}, r[D], c1[HALF] = {0}, s1[HALF] = {1, 1, 1, 1};
    k->rope_forward(r, e0, c1, s1, 1, 1, 1, D);
    float quarter[D] = {0, 0, 0, 0, 1, 0, 0, 0};
    FSDP_TEST_CLOSE("rope quarter turn of e_0", r, quarter, D, 0, 1e-7);
    free(x), free(y), free(dout), free(dx), free(xd), free(dd), free(want), free(inplace);
}

/* ---- attention ---- */

typedef struct att_aux {
    int64_t B, T, NH, NKV, D;
    const double *dout; /* (B, T, NH, D) */
} att_aux;

/* out (B, T, NH, D) from qkv = [q (B,T,NH,D) | k (B,T,NKV,D) | v (B,T,NKV,D)], as Hugging Face's
 * eager attention: repeat_kv, scores q k^T / sqrt(D) with -inf above the diagonal, softmax,
 * times v. */
static void ref_attention(double *out, const double *qkv, const att_aux *a) {
    int64_t B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, D = a->D, rep = NH / NKV;
    const double *q = qkv, *k = q + B * T * NH * D, *v = k + B * T * NKV * D;
    double *p = new_doubles(T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *qi = q + ((b * T + i) * NH + h) * D;
                double m = -INFINITY, se = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *kj = k + ((b * T + j) * NKV + h / rep) * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += qi[d] * kj[d];
                    p[j] = s / sqrt((double)D);
                    m = fmax(m, p[j]);
                }
                for (int64_t j = 0; j <= i; j++) se += (p[j] = exp(p[j] - m));
                double *o = out + ((b * T + i) * NH + h) * D;
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++)
                        acc += p[j] / se * v[((b * T + j) * NKV + h / rep) * D + d];
                    o[d] = acc;
                }
            }
    free(p);
}

static double att_loss(const double *qkv, const void *aux) {
    const att_aux *a = aux;
    int64_t n = a->B * a->T * a->NH * a->D;
    double *o = new_doubles(n), L = 0;
    ref_attention(o, qkv, a);
    for (int64_t i = 0; i < n; i++) L += o[i] * a->dout[i];
    free(o);
    return L;
}

/* One configuration: forward against the double reference (rtol 1e-5, atol 1e-6), lse finite;
 * backward (dq, dk, dv) against finite differences of the double forward (rtol 1e-4, atol
 * 1e-5). scratch is exactly (2, T, T), what backward may use (the forward uses one (T, T)
 * block), so AddressSanitizer catches a kernel that holds more. */
static void check_attention(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    int64_t nq = B * T * NH * D, nk = B * T * NKV * D, n = nq + 2 * nk;
    float *qkv = new_uniform(n, -1.5f, 1.5f), *out = new_floats(nq), *lse = new_floats(B * NH * T);
    float *scratch = malloc(sizeof(float) * (size_t)(2 * T * T)), *dout = new_uniform(nq, -1, 1);
    float *dqkv = new_uniform(n, -9, 9); /* garbage: the kernel writes every element */
    double *xd = to_doubles(qkv, n), *dd = to_doubles(dout, nq), *want = new_doubles(n);
    att_aux aux = {B, T, NH, NKV, D, dd};
    ref_attention(want, xd, &aux);
    k->attention_forward(out, lse, scratch, qkv, qkv + nq, qkv + nq + nk, B, T, NH, NKV, D);
    char name[96];
    snprintf(name, sizeof name, "attention forward B%lld T%lld NH%lld NKV%lld D%lld", (long long)B,
             (long long)T, (long long)NH, (long long)NKV, (long long)D);
    CLOSE_D(name, out, want, nq, 1e-5, 1e-6);
    bool finite = true;
    for (int64_t i = 0; i < B * NH * T; i++) finite = finite && isfinite(lse[i]);
    CU_ASSERT_TRUE(finite);
    k->attention_backward(dqkv, dqkv + nq, dqkv + nq + nk, scratch, dout, qkv, qkv + nq,
                          qkv + nq + nk, out, lse, B, T, NH, NKV, D);
    finite_diff(want, att_loss, xd, n, 1e-5, &aux);
    snprintf(name, sizeof name, "attention dq NH%lld NKV%lld vs finite diff", (long long)NH,
             (long long)NKV);
    CLOSE_D(name, dqkv, want, nq, 1e-4, 1e-5);
    snprintf(name, sizeof name, "attention dk NH%lld NKV%lld vs finite diff", (long long)NH,
             (long long)NKV);
    CLOSE_D(name, dqkv + nq, want + nq, nk, 1e-4, 1e-5);
    snprintf(name, sizeof name, "attention dv NH%lld NKV%lld vs finite diff", (long long)NH,
             (long long)NKV);
    CLOSE_D(name, dqkv + nq + nk, want + nq + nk, nk, 1e-4, 1e-5);
    free(qkv), free(out), free(lse), free(scratch), free(dout), free(dqkv), free(xd), free(dd),
        free(want);
}

/* grouped (4 query heads on 2), multi-head (NKV = NH), multi-query (NKV = 1), T = 1 */
static void test_attention(void) {
    rng_seed(3);
    check_attention(2, 5, 4, 2, 4);
    check_attention(1, 6, 2, 2, 3);
    check_attention(2, 4, 3, 1, 2);
    check_attention(2, 1, 2, 1, 4);
}

/* Row 0 sees only key 0, so its output is v's row 0 exactly, whatever the scores; scores of
 * +-80 (exp overflows f32 unless shifted by the row max) give finite outputs. */
static void test_attention_causal_and_stable(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { T = 3, D = 2 };
    float q[T * D] = {80, -80, 80, 80, -80, 80}, kk[T * D] = {80, 80, -80, 80, 80, -80};
    float v[T * D] = {1, 2, 3, 4, 5, 6}, out[T * D], lse[T], scratch[T * T];
    k->attention_forward(out, lse, scratch, q, kk, v, 1, T, 1, 1, D);
    CU_ASSERT_EQUAL(out[0], 1.0f);
    CU_ASSERT_EQUAL(out[1], 2.0f);
    bool finite = true;
    for (int i = 0; i < T * D; i++) finite = finite && isfinite(out[i]);
    CU_ASSERT_TRUE(finite);
}

/* ---- SwiGLU ---- */

typedef struct swiglu_aux {
    int64_t n;
    const double *dout;
} swiglu_aux;

static double swiglu_loss(const double *gu, const void *aux) {
    const swiglu_aux *a = aux;
    double L = 0;
    for (int64_t i = 0; i < a->n; i++) {
        double g = gu[i];
        L += g / (1 + exp(-g)) * gu[a->n + i] * a->dout[i];
    }
    return L;
}

/* forward against silu(g) u in double (rtol 1e-6), also into its gate array; backward against
 * finite differences (rtol 1e-5, atol 1e-7), including |gate| = 30 where e^-g is large */
static void test_swiglu(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 40 };
    rng_seed(4);
    float *gu = new_uniform(2 * N, -4, 4), *out = new_floats(N), *dout = new_uniform(N, -1, 1);
    float *dgu = new_floats(2 * N);
    gu[0] = 30, gu[1] = -30;
    double *xd = to_doubles(gu, 2 * N), *dd = to_doubles(dout, N), *want = new_doubles(2 * N);
    for (int i = 0; i < N; i++) want[i] = xd[i] / (1 + exp(-xd[i])) * xd[N + i];
    k->swiglu_forward(out, gu, gu + N, N);
    CLOSE_D("swiglu forward", out, want, N, 1e-6, 1e-7);
    float *g2 = new_floats(N);
    memcpy(g2, gu, sizeof(float) * N);
    k->swiglu_forward(g2, g2, gu + N, N);
    CU_ASSERT_EQUAL(memcmp(g2, out, sizeof(float) * N), 0);
    swiglu_aux aux = {N, dd};
    k->swiglu_backward(dgu, dgu + N, dout, gu, gu + N, N);
    finite_diff(want, swiglu_loss, xd, 2 * N, 1e-6, &aux);
    CLOSE_D("swiglu backward vs finite diff", dgu, want, 2 * N, 1e-5, 1e-7);
    free(gu), free(out), free(dout), free(dgu), free(xd), free(dd), free(want), free(g2);
}

/* ---- cross-entropy with an ignored target ---- */

typedef struct ce_aux {
    const int32_t *t;
    int64_t rows, classes;
} ce_aux;

static double ce_loss(const double *x, const void *aux) {
    const ce_aux *a = aux;
    double L = 0;
    int64_t n = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        if (a->t[r] == -100) continue;
        const double *xr = x + r * a->classes;
        double m = xr[0], se = 0;
        for (int64_t c = 1; c < a->classes; c++) m = fmax(m, xr[c]);
        for (int64_t c = 0; c < a->classes; c++) se += exp(xr[c] - m);
        L += m + log(se) - xr[a->t[r]];
        n++;
    }
    return L / (double)n;
}

/* Mean over the rows not ignored (rtol 1e-6), gradient against finite differences (rtol 1e-5),
 * ignored rows exactly 0; no ignored row gives cross_entropy's numbers; all ignored gives a NaN
 * loss (as PyTorch) and zero gradients. */
static void test_cross_entropy_ignore(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 6, C = 9 };
    rng_seed(5);
    float *x = new_uniform(R * C, -3, 3), *dl = new_uniform(R * C, -1, 1), loss = 0, loss2 = 0;
    int32_t t[R] = {4, -100, 0, 8, -100, 2};
    double *xd = to_doubles(x, R * C), *fd = new_doubles(R * C);
    ce_aux aux = {t, R, C};
    k->cross_entropy_ignore(&loss, dl, x, t, -100, R, C);
    CU_ASSERT_TRUE(fabs(loss - ce_loss(xd, &aux)) <= 1e-6 * fabs(ce_loss(xd, &aux)));
    finite_diff(fd, ce_loss, xd, R * C, 1e-5, &aux);
    CLOSE_D("cross_entropy_ignore dlogits vs finite diff", dl, fd, R * C, 1e-5, 1e-8);
    for (int c = 0; c < C; c++) CU_ASSERT_EQUAL(dl[1 * C + c], 0.0f);
    int32_t all[R] = {1, 2, 3, 4, 5, 6};
    float *dl2 = new_floats(R * C);
    k->cross_entropy_ignore(&loss, dl, x, all, -100, R, C);
    k->cross_entropy(&loss2, dl2, x, all, R, C);
    CU_ASSERT_EQUAL(loss, loss2);
    CU_ASSERT_EQUAL(memcmp(dl, dl2, sizeof(float) * R * C), 0);
    int32_t none[2] = {-100, -100};
    k->cross_entropy_ignore(&loss, dl, x, none, -100, 2, C);
    CU_ASSERT_TRUE(isnan(loss));
    for (int i = 0; i < 2 * C; i++) CU_ASSERT_EQUAL(dl[i], 0.0f);
    free(x), free(dl), free(xd), free(fd), free(dl2);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"dispatch", test_dispatch},
        {"embedding", test_embedding},
        {"vocab_loss", test_vocab_loss},
        {"rope", test_rope},
        {"attention", test_attention},
        {"attention_causal_and_stable", test_attention_causal_and_stable},
        {"swiglu", test_swiglu},
        {"cross_entropy_ignore", test_cross_entropy_ignore},
    };
    return fsdp_test_run(argc, argv, "llama_kernels", cases, (int)(sizeof cases / sizeof cases[0]));
}

/* test_attention_tiled.c: the tiled attention algorithm of src/kernels/cuda/attention.cu, written
 * for the CPU tile for tile (tiles of 32 rows zero-padded past T, an online softmax over key
 * tiles 0..qt, probabilities recomputed from lse, dq per query tile, dk and dv per key-value head
 * and key tile over the group's heads and the query tiles from the diagonal on), against the CPU
 * table's attention within the bound test_kernels_cuda states for the CUDA kernels. It proves
 * the algorithm (masks, tile ranges, rescaling, padding) where no GPU is; the CUDA kernels' own
 * thread mapping is checked on a GPU (test_kernels_cuda attention_flash). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run
#include "kernel_rng.h"      // defines: rng_seed, rng_uniform
#include "kernels/kernels.h" // defines: fsdp_kernels_for

#define TILE 32 // FA_TILE of attention.cu

/* The negative control's fault: key tiles the forward leaves out before the diagonal one. */
static int64_t skipped_tiles;

typedef struct shape {
    int64_t B, T, NH, NKV, D;
} shape;

/* A (TILE, D) tile of a (T, stride) head view from row0, zero past T (fa_load). */
static void load(float *dst, const float *src, int64_t row0, int64_t T, int64_t stride, int64_t D) {
    for (int64_t r = 0; r < TILE; r++)
        for (int64_t d = 0; d < D; d++)
            dst[r * D + d] = row0 + r < T ? src[(row0 + r) * stride + d] : 0.0f;
}

static float dot(const float *a, const float *b, int64_t D) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* flash_forward_kernel, one block (b, h, qt) at a time */
static void tiled_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          const shape *s) {
    int64_t T = s->T, NH = s->NH, NKV = s->NKV, D = s->D, tiles = (T + TILE - 1) / TILE;
    float scale = 1.0f / sqrtf((float)D);
    float *Qs = malloc(sizeof(float) * TILE * D * 3), *Ks = Qs + TILE * D, *Vs = Ks + TILE * D;
    float *acc = malloc(sizeof(float) * TILE * D), m[TILE], l[TILE], P[TILE][TILE];
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t qt = 0; qt < tiles; qt++) {
                int64_t g = h / (NH / NKV), q0 = qt * TILE;
                load(Qs, q + (b * T * NH + h) * D, q0, T, NH * D, D);
                for (int i = 0; i < TILE; i++) m[i] = -INFINITY, l[i] = 0.0f;
                memset(acc, 0, sizeof(float) * TILE * D);
                for (int64_t kt = 0; kt <= qt - skipped_tiles; kt++) {
                    int64_t k0 = kt * TILE;
                    load(Ks, k + (b * T * NKV + g) * D, k0, T, NKV * D, D);
                    load(Vs, v + (b * T * NKV + g) * D, k0, T, NKV * D, D);
                    for (int i = 0; i < TILE; i++) {
                        float sc[TILE], mt = -INFINITY;
                        for (int j = 0; j < TILE; j++) {
                            bool seen = k0 + j <= q0 + i && k0 + j < T;
                            sc[j] = seen ? scale * dot(Qs + i * D, Ks + j * D, D) : -INFINITY;
                            mt = fmaxf(mt, sc[j]);
                        }
                        float mn = fmaxf(m[i], mt), alpha = expf(m[i] - mn), ps = 0.0f;
                        for (int j = 0; j < TILE; j++) ps += P[i][j] = expf(sc[j] - mn);
                        l[i] = l[i] * alpha + ps, m[i] = mn;
                        for (int64_t d = 0; d < D; d++) {
                            float a = 0.0f;
                            for (int j = 0; j < TILE; j++) a += P[i][j] * Vs[j * D + d];
                            acc[i * D + d] = acc[i * D + d] * alpha + a;
                        }
                    }
                }
                for (int i = 0; i < TILE && q0 + i < T; i++) {
                    for (int64_t d = 0; d < D; d++)
                        out[((b * T + q0 + i) * NH + h) * D + d] = acc[i * D + d] / l[i];
                    lse[(b * NH + h) * T + q0 + i] = m[i] + logf(l[i]);
                }
            }
    free(Qs), free(acc);
}

/* fa_row_stats and fa_scores: lse, delta and P, dS of a (query tile, key tile) pair */
static void scores(float P[TILE][TILE], float dS[TILE][TILE], const float *Qs, const float *dOs,
                   const float *Ks, const float *Vs, const float *out, const float *lse, int64_t b,
                   int64_t h, int64_t q0, int64_t k0, const shape *s) {
    int64_t T = s->T, NH = s->NH, D = s->D;
    float scale = 1.0f / sqrtf((float)D);
    for (int i = 0; i < TILE; i++) {
        bool in = q0 + i < T;
        float L = in ? lse[(b * NH + h) * T + q0 + i] : 0.0f;
        float Dl = in ? dot(dOs + i * D, out + ((b * T + q0 + i) * NH + h) * D, D) : 0.0f;
        for (int j = 0; j < TILE; j++) {
            float p = 0.0f, ds = 0.0f;
            if (k0 + j <= q0 + i && in) {
                p = expf(scale * dot(Qs + i * D, Ks + j * D, D) - L);
                ds = p * (dot(dOs + i * D, Vs + j * D, D) - Dl);
            }
            P[i][j] = p, dS[i][j] = ds;
        }
    }
}

/* flash_dq_kernel and flash_dkv_kernel */
static void tiled_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const float *k, const float *v, const float *out, const float *lse,
                           const shape *s) {
    int64_t T = s->T, NH = s->NH, NKV = s->NKV, D = s->D, tiles = (T + TILE - 1) / TILE;
    int64_t group = NH / NKV;
    float scale = 1.0f / sqrtf((float)D);
    float *Qs = malloc(sizeof(float) * TILE * D * 4), *dOs = Qs + TILE * D, *Ks = dOs + TILE * D;
    float *Vs = Ks + TILE * D, *a1 = malloc(sizeof(float) * TILE * D * 2), *a2 = a1 + TILE * D;
    float(*P)[TILE] = malloc(sizeof(float[TILE][TILE]) * 2), (*dS)[TILE] = P + TILE;
    for (int64_t b = 0; b < s->B; b++) {
        for (int64_t h = 0; h < NH; h++) // dq
            for (int64_t qt = 0; qt < tiles; qt++) {
                int64_t g = h / group, q0 = qt * TILE;
                load(Qs, q + (b * T * NH + h) * D, q0, T, NH * D, D);
                load(dOs, dout + (b * T * NH + h) * D, q0, T, NH * D, D);
                memset(a1, 0, sizeof(float) * TILE * D);
                for (int64_t kt = 0; kt <= qt; kt++) {
                    load(Ks, k + (b * T * NKV + g) * D, kt * TILE, T, NKV * D, D);
                    load(Vs, v + (b * T * NKV + g) * D, kt * TILE, T, NKV * D, D);
                    scores(P, dS, Qs, dOs, Ks, Vs, out, lse, b, h, q0, kt * TILE, s);
                    for (int i = 0; i < TILE; i++)
                        for (int64_t d = 0; d < D; d++) {
                            float a = 0.0f;
                            for (int j = 0; j < TILE; j++) a += dS[i][j] * Ks[j * D + d];
                            a1[i * D + d] += a;
                        }
                }
                for (int i = 0; i < TILE && q0 + i < T; i++)
                    for (int64_t d = 0; d < D; d++)
                        dq[((b * T + q0 + i) * NH + h) * D + d] = scale * a1[i * D + d];
            }
        for (int64_t g = 0; g < NKV; g++) // dk, dv
            for (int64_t kt = 0; kt < tiles; kt++) {
                int64_t k0 = kt * TILE;
                load(Ks, k + (b * T * NKV + g) * D, k0, T, NKV * D, D);
                load(Vs, v + (b * T * NKV + g) * D, k0, T, NKV * D, D);
                memset(a1, 0, sizeof(float) * TILE * D * 2);
                for (int64_t h = g * group; h < (g + 1) * group; h++)
                    for (int64_t qt = kt; qt < tiles; qt++) {
                        int64_t q0 = qt * TILE;
                        load(Qs, q + (b * T * NH + h) * D, q0, T, NH * D, D);
                        load(dOs, dout + (b * T * NH + h) * D, q0, T, NH * D, D);
                        scores(P, dS, Qs, dOs, Ks, Vs, out, lse, b, h, q0, k0, s);
                        for (int j = 0; j < TILE; j++)
                            for (int64_t d = 0; d < D; d++) {
                                float x = 0.0f, y = 0.0f;
                                for (int i = 0; i < TILE; i++) {
                                    x += P[i][j] * dOs[i * D + d];
                                    y += dS[i][j] * Qs[i * D + d];
                                }
                                a2[j * D + d] += x, a1[j * D + d] += y;
                            }
                    }
                for (int j = 0; j < TILE && k0 + j < T; j++)
                    for (int64_t d = 0; d < D; d++) {
                        int64_t o = ((b * T + k0 + j) * NKV + g) * D + d;
                        dk[o] = scale * a1[j * D + d], dv[o] = a2[j * D + d];
                    }
            }
    }
    free(Qs), free(a1), free(P);
}

/* max |got - want| over n, NaN when any difference is NaN */
static double max_diff(const float *got, const float *want, int64_t n) {
    double m = 0;
    for (int64_t e = 0; e < n && !isnan(m); e++) {
        double d = fabs((double)got[e] - want[e]);
        if (!(d <= m)) m = d;
    }
    return m;
}

static double max_abs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t e = 0; e < n; e++) m = fmax(m, fabs((double)x[e]));
    return m;
}

/* test_kernels_cuda's bound (derived there), norm-wise: ts = 2 D u sqrt(D) for a score; out
 * 3 ts + 2 (T + D) u, lse ts + 2 T u (1 + sqrt(D) + log(T + 1)), gradients 6 ts + 4 (group T +
 * D) u, each times max(1, the largest reference entry). */
static void bounds(double tol[5], const shape *s) {
    const double u = 0x1p-24, D = (double)s->D, T = (double)s->T;
    double ts = 2.0 * D * u * sqrt(D), group = (double)(s->NH / s->NKV);
    double bwd = 6 * ts + 4.0 * (group * T + D) * u;
    tol[0] = 3 * ts + 2.0 * (T + D) * u;
    tol[1] = ts + 2.0 * T * u * (1.0 + sqrt(D) + log(T + 1));
    tol[2] = tol[3] = tol[4] = bwd;
}

static float *uniform(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    for (int64_t i = 0; i < n; i++) p[i] = rng_uniform(lo, hi);
    return p;
}

static void run_case(const shape *s) {
    static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};
    int64_t T = s->T, D = s->D, tq = s->B * T * s->NH * D, tk = s->B * T * s->NKV * D;
    int64_t n[5] = {tq, s->B * s->NH * T, tq, tk, tk};
    float *q = uniform(tq, -1, 1), *k = uniform(tk, -1, 1), *v = uniform(tk, -1, 1);
    float *dout = uniform(tq, -1, 1), *scratch = uniform(2 * T * T, 0, 0), *want[5], *got[5];
    for (int i = 0; i < 5; i++) want[i] = uniform(n[i], 0, 0), got[i] = uniform(n[i], 0, 0);
    const fsdp_kernels_i *C = fsdp_kernels_for(FSDP_CPU);
    C->attention_forward(want[0], want[1], scratch, q, k, v, s->B, T, s->NH, s->NKV, D);
    C->attention_backward(want[2], want[3], want[4], scratch, dout, q, k, v, want[0], want[1], s->B,
                          T, s->NH, s->NKV, D);
    tiled_forward(got[0], got[1], q, k, v, s);
    /* the backward from the table's forward, as the GPU's backward gets its own forward's */
    tiled_backward(got[2], got[3], got[4], dout, q, k, v, want[0], want[1], s);
    double tol[5];
    bounds(tol, s);
    for (int i = 0; i < 5; i++) {
        double maxd = max_diff(got[i], want[i], n[i]);
        double bound = tol[i] * fmax(1.0, max_abs(want[i], n[i]));
        printf("\n    B%lld T%lld NH%lld NKV%lld D%lld %-3s: max|diff| %.3g bound %.3g",
               (long long)s->B, (long long)T, (long long)s->NH, (long long)s->NKV, (long long)D,
               names[i], maxd, bound);
        CU_ASSERT_TRUE(maxd <= bound); // NaN fails
    }
    for (int i = 0; i < 5; i++) free(want[i]), free(got[i]);
    free(q), free(k), free(v), free(dout), free(scratch);
}

/* The shapes of test_kernels_cuda's attention_flash that the tiled kernels take (D <= 128). */
static void test_tiled_vs_table(void) {
    rng_seed(31);
    const shape cases[] = {{2, 45, 3, 3, 64},  {2, 77, 6, 2, 64}, {3, 100, 8, 2, 128},
                           {1, 33, 4, 1, 128}, {2, 1, 3, 1, 24},  {1, 65, 2, 2, 40},
                           {1, 64, 2, 1, 16}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

/* The check can fail: the tiled forward without its diagonal key tile leaves the first query
 * tile's rows with no key (NaN) and the second's without 32 of their keys, far outside the
 * bound. */
static void test_negative_control(void) {
    rng_seed(32);
    shape s = {1, 64, 1, 1, 16};
    int64_t n = 64 * 16;
    float *q = uniform(n, -1, 1), *k = uniform(n, -1, 1), *v = uniform(n, -1, 1);
    float *want = uniform(n, 0, 0), *lse = uniform(64, 0, 0), *got = uniform(n, 0, 0);
    float *got_lse = uniform(64, 0, 0), *scratch = uniform(64 * 64 * 2, 0, 0);
    fsdp_kernels_for(FSDP_CPU)->attention_forward(want, lse, scratch, q, k, v, 1, 64, 1, 1, 16);
    double tol[5];
    bounds(tol, &s);
    skipped_tiles = 1;
    tiled_forward(got, got_lse, q, k, v, &s);
    skipped_tiles = 0;
    double first = max_diff(got, want, 32 * 16), second = max_diff(got + 512, want + 512, 512);
    double bound = tol[0] * fmax(1.0, max_abs(want, n));
    printf("\n    diagonal tile skipped: rows 0-31 differ by %.3g, rows 32-63 by %.3g (bound %.3g)",
           first, second, bound);
    CU_ASSERT_TRUE(isnan(first));
    CU_ASSERT_TRUE(second > 100 * bound);
    tiled_forward(got, got_lse, q, k, v, &s); // and without the fault, within the bound
    CU_ASSERT_TRUE(max_diff(got, want, n) <= bound);
    free(q), free(k), free(v), free(want), free(lse), free(got), free(got_lse), free(scratch);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"tiled_vs_table", test_tiled_vs_table},
        {"negative_control", test_negative_control},
    };
    return fsdp_test_run(argc, argv, "attention_tiled", cases, sizeof cases / sizeof *cases);
}

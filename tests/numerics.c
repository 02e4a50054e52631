/* numerics.c: float32 rounding bounds, the statistical comparison of Adam runs and the
 * reference's rounding noise (tests/numerics.h). */
#include "numerics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h" // defines: FSDP_FAIL
#include "fsdp/rng.h"   // defines: fsdp_rng_uniform

double fsdp_test_sum_tol(int64_t k, int depth) {
    return 8.0 * sqrt((double)k * depth) * FSDP_TEST_U32;
}

double fsdp_test_max_abs(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

double fsdp_test_adam_step_bound(double beta1, double beta2, int t) {
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t), s = 0.0;
    for (int i = 1; i <= t; i++) {
        double a = (1.0 - beta1) * pow(beta1, t - i) / bc1;
        double b = (1.0 - beta2) * pow(beta2, t - i) / bc2;
        s += a * a / b;
    }
    return sqrt(s);
}

double fsdp_test_adam_max_move(double beta1, double beta2, int steps) {
    double total = 0.0;
    for (int t = 1; t <= steps; t++) total += fsdp_test_adam_step_bound(beta1, beta2, t);
    return total;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fsdp_test_quantile_abs_diff(const float *a, const float *b, int64_t n, double q) {
    if (n <= 0) return 0.0;
    double *d = malloc((size_t)n * sizeof *d);
    if (!d) return NAN;
    for (int64_t i = 0; i < n; i++) d[i] = fabs((double)a[i] - (double)b[i]);
    qsort(d, (size_t)n, sizeof *d, cmp_double);
    int64_t k = (int64_t)ceil(q * (double)n) - 1;
    double r = d[k < 0 ? 0 : (k >= n ? n - 1 : k)];
    free(d);
    return r;
}

void fsdp_test_adam_add(fsdp_test_adam_check *c, const char *name, const float *got,
                        const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (isnan(d)) d = INFINITY;
        if (d > c->bulk + c->bulk_rtol * fabs((double)want[i])) {
            c->exceptions++;
            if (!(d <= c->move)) c->beyond_move++;
        } else if (d > c->max_bulk) {
            c->max_bulk = d;
        }
        if (d > c->max_abs || (c->n == 0 && i == 0)) {
            c->max_abs = d;
            snprintf(c->worst, sizeof c->worst, "%.40s[%lld] %.9g, want %.9g", name, (long long)i,
                     got[i], want[i]);
        }
    }
    c->n += n;
}

bool fsdp_test_adam_ok(const fsdp_test_adam_check *c, char *why, size_t len) {
    if (c->beyond_move > 0)
        snprintf(why, len, "%lld elements differ by more than Adam can move (%.3g): largest %s",
                 (long long)c->beyond_move, c->move, c->worst);
    else if (c->exceptions > c->max_exceptions)
        snprintf(why, len,
                 "%lld of %lld elements differ by more than %.3g + %.3g |want| (at most %lld "
                 "may): largest %s",
                 (long long)c->exceptions, (long long)c->n, c->bulk, c->bulk_rtol,
                 (long long)c->max_exceptions, c->worst);
    else
        return true;
    return false;
}

typedef struct model_pair {
    fsdp_test_adam_check *check;
    fsdp_module *got;
} model_pair;

static fsdp_status add_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    model_pair *mp = user;
    fsdp_param *q = fsdp_module_get_param(mp->got, name);
    if (!q) return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "no parameter %s to compare", name);
    fsdp_tensor *full = NULL;
    FSDP_TRY(fsdp_param_full_tensor(ctx, q, false, &full));
    const fsdp_tensor *want = fsdp_param_data(p);
    fsdp_status st = FSDP_OK;
    if (!fsdp_tensor_same_shape(full, want))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s: the shapes differ", name);
    else
        fsdp_test_adam_add(mp->check, name, fsdp_tensor_f32(full), fsdp_tensor_f32(want),
                           fsdp_tensor_numel(want));
    fsdp_tensor_free(full);
    return st;
}

fsdp_status fsdp_test_adam_add_model(fsdp_ctx *ctx, fsdp_test_adam_check *c, fsdp_module *want,
                                     fsdp_module *got) {
    model_pair mp = {.check = c, .got = got};
    return fsdp_module_visit_params(ctx, want, add_param, &mp);
}

/* ---- the reference's rounding noise ---- */

static fsdp_status nudge_one(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx;
    (void)name;
    uint64_t *state = user; /* [stream, next index] */
    fsdp_tensor *t = fsdp_param_data(p);
    float *x = fsdp_tensor_f32(t);
    for (int64_t i = 0; i < fsdp_tensor_numel(t); i++) {
        bool up = fsdp_rng_uniform(1, state[0], state[1]++) < 0.5f;
        x[i] = nextafterf(x[i], up ? INFINITY : -INFINITY);
    }
    return FSDP_OK;
}

fsdp_status fsdp_test_nudge_params(fsdp_ctx *ctx, fsdp_module *m, uint64_t stream) {
    uint64_t state[2] = {stream, 0};
    return fsdp_module_visit_params(ctx, m, nudge_one, state);
}

typedef struct noise_acc {
    fsdp_module *other;
    float *a, *b; /* every element, concatenated */
    int64_t n, cap;
} noise_acc;

static fsdp_status collect_one(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    noise_acc *acc = user;
    fsdp_param *q = fsdp_module_get_param(acc->other, name);
    if (!q) return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "no parameter %s in the copy", name);
    const fsdp_tensor *x = fsdp_param_data(p), *y = fsdp_param_data(q);
    if (!fsdp_tensor_same_shape(x, y))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: shapes differ in the copy", name);
    int64_t n = fsdp_tensor_numel(x);
    if (acc->n + n > acc->cap) {
        int64_t cap = 2 * (acc->n + n);
        float *a = realloc(acc->a, (size_t)cap * sizeof *a);
        if (a) acc->a = a;
        float *b = realloc(acc->b, (size_t)cap * sizeof *b);
        if (b) acc->b = b;
        if (!a || !b)
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "noise: %lld floats", (long long)cap);
        acc->cap = cap;
    }
    memcpy(acc->a + acc->n, fsdp_tensor_f32(x), (size_t)n * sizeof(float));
    memcpy(acc->b + acc->n, fsdp_tensor_f32(y), (size_t)n * sizeof(float));
    acc->n += n;
    return FSDP_OK;
}

fsdp_status fsdp_test_param_noise(fsdp_ctx *ctx, fsdp_module *a, fsdp_module *b, double q,
                                  double *noise) {
    noise_acc acc = {.other = b};
    fsdp_status st = fsdp_module_visit_params(ctx, a, collect_one, &acc);
    if (st == FSDP_OK) *noise = fsdp_test_quantile_abs_diff(acc.a, acc.b, acc.n, q);
    free(acc.a);
    free(acc.b);
    return st;
}

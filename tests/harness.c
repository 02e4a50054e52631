/* harness.c: the shared CUnit main, per-test context and tensor comparison. */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static fsdp_ctx *g_ctx;

fsdp_ctx *fsdp_test_ctx(void) {
    return g_ctx;
}

static int setup_case(void) {
    fsdp_ctx_options opts = {.seed = 1234};
    return fsdp_ctx_create(&opts, &g_ctx) == FSDP_OK ? 0 : 1;
}

static int teardown_case(void) {
    fsdp_ctx_free(g_ctx);
    g_ctx = NULL;
    return 0;
}

int fsdp_test_run(int argc, char **argv, const char *suite, const fsdp_test_case *cases, int n) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite_with_setup_and_teardown(suite, NULL, NULL, (CU_SetUpFunc)setup_case,
                                                       (CU_TearDownFunc)teardown_case);
    if (!s) return 2;
    const char *only = argc > 1 ? argv[1] : NULL;
    int added = 0;
    for (int i = 0; i < n; i++) {
        if (only && strcmp(only, cases[i].name) != 0) continue;
        if (!CU_add_test(s, cases[i].name, cases[i].fn)) return 2;
        added++;
    }
    if (only && added == 0) {
        fprintf(stderr, "%s: no test named '%s'\n", suite, only);
        CU_cleanup_registry();
        return 2;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    unsigned run = CU_get_number_of_tests_run();
    CU_cleanup_registry();
    return (failed == 0 && run == (unsigned)added) ? 0 : 1;
}

bool fsdp_test_message_has(const char *message, const char *const *needles) {
    bool ok = true;
    for (int i = 0; needles[i]; i++) {
        if (!strstr(message, needles[i])) {
            fprintf(stderr, "\n  message \"%s\" does not name \"%s\"\n", message, needles[i]);
            ok = false;
        }
    }
    return ok;
}

bool fsdp_test_close(const char *name, const float *got, const float *want, int64_t n, double rtol,
                     double atol) {
    double max_abs = 0, max_rel = 0;
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double rel = d / fmax(fabs((double)want[i]), 1e-30);
        if (d > max_abs || isnan(d)) max_abs = isnan(d) ? NAN : d;
        if (d > 0 && rel > max_rel) max_rel = rel;
        if (!(d <= atol + rtol * fabs((double)want[i]))) {
            if (first_bad < 0) first_bad = i;
            bad++;
        }
    }
    printf("\n    %-40s max abs diff %.3g, max rel diff %.3g (%lld elements)", name, max_abs,
           max_rel, (long long)n);
    if (bad)
        printf("\n    %s: %lld elements off, first at %lld: got %.9g want %.9g", name,
               (long long)bad, (long long)first_bad, got[first_bad], want[first_bad]);
    return bad == 0;
}

fsdp_tensor *fsdp_test_random(int ndim, const int64_t *shape, float lo, float hi, uint64_t stream) {
    fsdp_tensor *t = NULL;
    if (fsdp_tensor_create(g_ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, shape, &t) != FSDP_OK)
        return NULL;
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = lo, .b = hi};
    if (fsdp_init_tensor(g_ctx, t, &init, 99, stream) != FSDP_OK) {
        fsdp_tensor_free(t);
        return NULL;
    }
    return t;
}

fsdp_status fsdp_test_run_world(int n, int timeout_ms, fsdp_rank_fn fn, void *user) {
    fsdp_world *w = NULL;
    fsdp_world_options o = {.nranks = n, .timeout_ms = timeout_ms};
    fsdp_status st = fsdp_world_create(g_ctx, &o, &w);
    if (st == FSDP_OK) st = fsdp_world_run(g_ctx, w, fn, user);
    fsdp_world_free(w);
    return st;
}

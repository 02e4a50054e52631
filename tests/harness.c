/* harness.c: the shared CUnit main, per-test context, skipped cases, tensor comparison, and the
 * multi-rank runner: rank threads of a local world, or under mpirun one rank per process of an
 * MPI world, with the processes agreeing on every case's result. */
#define _POSIX_C_SOURCE 200809L // nanosleep
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h" // defines: fsdp_clock_now

static fsdp_ctx *g_ctx;

/* Under MPI: this process's rank, the job's size, a world to agree on results, the failure
 * records before the running case, and the runs skipped for their size. */
static struct {
    bool on;
    int rank, size;
    fsdp_world *world;
    unsigned records_before;
    int skipped;
} g_mpi;

/* The running case's declared skips and the worlds it ran; the cases counted as skipped. */
static struct { int skips, worlds; } g_case;
static unsigned g_skipped_cases;

fsdp_ctx *fsdp_test_ctx(void) {
    return g_ctx;
}

static pthread_t g_case_thread; /* the thread that runs the cases */

fsdp_test_record fsdp_test_record_take(void) {
    fsdp_test_record r = {0};
    if (!g_ctx || !pthread_equal(pthread_self(), g_case_thread)) return r;
    r.taken = true;
    r.status = fsdp_last_status(g_ctx);
    snprintf(r.text, sizeof r.text, "%.300s (trail %.200s)", fsdp_last_error(g_ctx),
             fsdp_last_error_trail(g_ctx));
    return r;
}

void fsdp_test_record_check(const fsdp_test_record *before, const char *expr, const char *file,
                            int line) {
    if (!before->taken) return;
    fsdp_test_record after = fsdp_test_record_take();
    bool same = after.status == before->status && strcmp(after.text, before->text) == 0;
    if (after.status == FSDP_OK || same) return;
    fprintf(stderr, "\n  %s:%d: %s returned FSDP_OK but left a failure on the context: %s: %s\n",
            file, line, expr, fsdp_status_to_string(after.status), after.text);
    CU_FAIL("a successful call recorded a failure on the context");
}

bool fsdp_test_mpi(void) {
    return g_mpi.on;
}

static int setup_case(void) {
    fsdp_ctx_options opts = {.seed = 1234};
    g_case_thread = pthread_self();
    g_mpi.records_before = CU_get_number_of_failure_records();
    g_case.skips = g_case.worlds = 0;
    return fsdp_ctx_create(&opts, &g_ctx) == FSDP_OK ? 0 : 1;
}

static fsdp_status tell_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)ctx;
    *(int *)user = rank;
    return FSDP_OK;
}

/* counts[r] = the failure records of the running case on rank r, for every r. */
static fsdp_status share_counts(fsdp_ctx *ctx, int rank, void *user) {
    float *counts = user;
    fsdp_tensor *t = NULL;
    int64_t n = g_mpi.size;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &t));
    memset(fsdp_tensor_data(t), 0, fsdp_tensor_nbytes(t));
    fsdp_tensor_f32(t)[rank] = counts[rank];
    fsdp_status st = fsdp_all_reduce(ctx, NULL, t, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) memcpy(counts, fsdp_tensor_data(t), fsdp_tensor_nbytes(t));
    fsdp_tensor_free(t);
    return st;
}

/* Under MPI, after each case: rank R's failures are printed by that process, and a case that
 * failed on another rank fails here too, naming it. */
static void agree_on_case(void) {
    unsigned mine = CU_get_number_of_failure_records() - g_mpi.records_before;
    if (g_mpi.rank != 0) {
        CU_pFailureRecord f = CU_get_failure_list();
        for (unsigned i = 0; f; f = f->pNext, i++)
            if (i >= g_mpi.records_before)
                fprintf(stderr, "\n  [rank %d] %s:%u: %s", g_mpi.rank,
                        f->strFileName ? f->strFileName : "", f->uiLineNumber,
                        f->strCondition ? f->strCondition : "");
    }
    float *counts = calloc((size_t)g_mpi.size, sizeof *counts);
    static char message[512];
    if (!counts) {
        CU_assertImplementation(CU_FALSE, __LINE__, "out of memory agreeing on the result",
                                __FILE__, "", CU_FALSE);
        return;
    }
    counts[g_mpi.rank] = (float)mine;
    fsdp_status st = fsdp_world_run(g_ctx, g_mpi.world, share_counts, counts);
    size_t used = 0;
    message[0] = '\0';
    for (int r = 0; st == FSDP_OK && r < g_mpi.size && used < sizeof message; r++)
        if (r != g_mpi.rank && counts[r] > 0)
            used += (size_t)snprintf(message + used, sizeof message - used, "%s%d",
                                     used ? "," : "the case failed on rank ", r);
    if (st == FSDP_OK && used > 0 && used < sizeof message)
        snprintf(message + used, sizeof message - used, " (its failures are tagged [rank R])");
    if (st != FSDP_OK)
        snprintf(message, sizeof message, "the processes could not agree on the result: %s",
                 fsdp_last_error(g_ctx));
    if (message[0] && (mine == 0 || st != FSDP_OK))
        CU_assertImplementation(CU_FALSE, __LINE__, message, __FILE__, "", CU_FALSE);
    free(counts);
}

static int teardown_case(void) {
    if (g_case.skips > 0 && g_case.worlds == 0) g_skipped_cases++;
    if (g_mpi.on) agree_on_case();
    fsdp_ctx_free(g_ctx);
    g_ctx = NULL;
    return 0;
}

/* Whether to run under MPI: `--mpi` (removed from argv) or an MPI launcher's environment. */
static bool wants_mpi(int *argc, char **argv) {
    bool flag = false;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--mpi") != 0) continue;
        flag = true;
        memmove(&argv[i], &argv[i + 1], (size_t)(*argc - i) * sizeof *argv);
        (*argc)--, i--;
    }
    return flag || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* Joins the MPI job: a world for the agreements, this process's rank and the job's size. */
static int start_mpi(const char *suite) {
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(NULL, &ctx) != FSDP_OK) return 2;
    fsdp_world_options o = {.backend = FSDP_BACKEND_MPI, .timeout_ms = 120000};
    fsdp_status st = fsdp_world_create(ctx, &o, &g_mpi.world);
    if (st == FSDP_OK) st = fsdp_world_run(ctx, g_mpi.world, tell_rank, &g_mpi.rank);
    if (st != FSDP_OK) {
        fprintf(stderr, "%s: cannot run under MPI: %s\n", suite, fsdp_last_error(ctx));
        fsdp_ctx_free(ctx);
        return 2;
    }
    fsdp_ctx_free(ctx);
    g_mpi.on = true;
    g_mpi.size = fsdp_world_size(g_mpi.world);
    if (g_mpi.rank == 0)
        printf("%s: under MPI, %d processes, one rank each; multi-rank runs of another size are "
               "skipped\n",
               suite, g_mpi.size);
    return 0;
}

int fsdp_test_run(int argc, char **argv, const char *suite, const fsdp_test_case *cases, int n) {
    if (wants_mpi(&argc, argv) && start_mpi(suite) != 0) return 2;
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
    if (g_mpi.rank == 0) { /* under MPI the other ranks run quietly and report failures */
        CU_basic_set_mode(CU_BRM_VERBOSE);
        CU_basic_run_tests();
    } else {
        CU_run_all_tests();
    }
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    unsigned run = CU_get_number_of_tests_run();
    CU_cleanup_registry();
    bool all_skipped = run > 0 && g_skipped_cases == run;
    if (g_mpi.on && g_mpi.rank == 0)
        printf("%s under MPI (%d processes): %d multi-rank runs skipped (they need another "
               "number of processes)\n",
               suite, g_mpi.size, g_mpi.skipped);
    if (g_skipped_cases > 0 && g_mpi.rank == 0) {
        printf("%s: %u of %u cases skipped", suite, g_skipped_cases, run);
        if (all_skipped) printf(", so the suite exits %d (skipped)", FSDP_TEST_SKIPPED);
        printf("\n");
    }
    fsdp_world_free(g_mpi.world);
    if (failed != 0 || run != (unsigned)added) return 1;
    return all_skipped ? FSDP_TEST_SKIPPED : 0;
}

void fsdp_test_skip(const char *fmt, ...) {
    g_case.skips++;
    if (g_mpi.rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    printf("\n    skipped: ");
    vprintf(fmt, ap);
    va_end(ap);
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

/* Appends a parameter's values to the array being filled. */
typedef struct param_values {
    float *v;
    int64_t n, cap;
} param_values;

static fsdp_status take_values(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    param_values *pv = user;
    const fsdp_tensor *t = fsdp_param_data(p);
    int64_t n = fsdp_tensor_numel(t);
    if (pv->n + n > pv->cap) return FSDP_ERR_INTERNAL;
    memcpy(pv->v + pv->n, fsdp_tensor_f32(t), (size_t)n * sizeof(float));
    pv->n += n;
    return FSDP_OK;
}

float *fsdp_test_param_values(fsdp_module *m, int64_t *n) {
    param_values pv = {.cap = fsdp_module_param_count(m)};
    pv.v = malloc((size_t)(pv.cap ? pv.cap : 1) * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(pv.v);
    FSDP_TEST_OK(fsdp_module_visit_params(fsdp_test_ctx(), m, take_values, &pv));
    CU_ASSERT_EQUAL(pv.n, pv.cap);
    if (n) *n = pv.n;
    return pv.v;
}

bool fsdp_test_close(const char *name, const float *got, const float *want, int64_t n, double rtol,
                     double atol) {
    double max_abs = 0, max_rel = 0;
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        // equal values (infinities too) and NaN against NaN agree, whatever a NaN's sign and
        // payload (x86 makes -NaN where a GPU makes its canonical +NaN)
        if (got[i] == want[i] || (isnan(got[i]) && isnan(want[i]))) continue;
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

int fsdp_test_hosted_ranks(int n, int *first) {
    *first = g_mpi.on ? g_mpi.rank : 0;
    if (!g_mpi.on) return n;
    return n == g_mpi.size ? 1 : 0;
}

fsdp_status fsdp_test_run_world(int n, int timeout_ms, fsdp_rank_fn fn, void *user) {
    if (g_mpi.on && n != g_mpi.size) {
        g_mpi.skipped++;
        fsdp_test_skip("a run on %d ranks (this MPI job has %d processes)", n, g_mpi.size);
        return FSDP_OK;
    }
    g_case.worlds++;
    fsdp_world *w = NULL;
    /* FSDP_TEST_BACKEND=nccl: a suite whose program opened an NCCL (the stand-in) runs its
     * worlds on the nccl backend instead of the local one. */
    const char *be = getenv("FSDP_TEST_BACKEND");
    bool nccl = !g_mpi.on && be && strcmp(be, "nccl") == 0;
    fsdp_world_options o = {.backend = g_mpi.on ? FSDP_BACKEND_MPI
                                       : nccl   ? FSDP_BACKEND_NCCL
                                                : FSDP_BACKEND_LOCAL,
                            .nranks = n,
                            .timeout_ms = timeout_ms};
    fsdp_status st = fsdp_world_create(g_ctx, &o, &w);
    if (st == FSDP_OK) st = fsdp_world_run(g_ctx, w, fn, user);
    fsdp_world_free(w);
    return st;
}

fsdp_status fsdp_test_rank_close(fsdp_ctx *ctx, const char *what, const fsdp_tensor *got,
                                 const fsdp_tensor *want, double rtol, double atol,
                                 double *max_abs) {
    if (!fsdp_tensor_same_shape(got, want)) {
        char a[64], b[64];
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s: shape %s, want %s", what,
                         fsdp_tensor_shape_string(got, a, sizeof a),
                         fsdp_tensor_shape_string(want, b, sizeof b));
    }
    const float *g = fsdp_tensor_f32(got), *w = fsdp_tensor_f32(want);
    for (int64_t i = 0; i < fsdp_tensor_numel(got); i++) {
        double d = fabs((double)g[i] - w[i]);
        if (max_abs && d > *max_abs) *max_abs = d;
        if (!(d <= atol + rtol * fabs((double)w[i])))
            return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s: element %lld is %.9g, want %.9g", what,
                             (long long)i, g[i], w[i]);
    }
    return FSDP_OK;
}

double fsdp_test_now(void) {
    return fsdp_clock_now();
}

void fsdp_test_sleep_ms(long ms) {
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL);
}

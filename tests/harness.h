/* harness.h: what every CUnit suite of libfsdp shares: a main that runs one suite in CUnit's
 * basic mode, a context per test, status checks that print the library's message, tensor
 * comparison that prints the max absolute and relative difference, and the multi-rank runner
 * that uses rank threads, or MPI processes when the suite runs under mpirun. */
#ifndef FSDP_TEST_HARNESS_H
#define FSDP_TEST_HARNESS_H

#include <CUnit/Basic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h" // defines: FSDP_FAIL
#include "fsdp/fsdp.h"

/* UNDER_TSAN: this build is under ThreadSanitizer (a negative control whose dropped wait is a
 * data race is then skipped: TSan reports it, as it must). */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

typedef struct fsdp_test_case {
    const char *name;
    void (*fn)(void);
} fsdp_test_case;

/* The exit status of a suite whose every case that ran was skipped and none failed (CTest's
 * SKIP_RETURN_CODE for every entry, so CTest shows it as "Skipped", not "Passed"). */
#define FSDP_TEST_SKIPPED 77

/* Runs the cases as one CUnit suite; returns the process exit status (0 when all pass, and when
 * some cases ran and the others were skipped; FSDP_TEST_SKIPPED when every case was skipped).
 * argv[1], when given, runs only the case of that name. With `--mpi` among the arguments, or
 * under mpirun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set), the suite runs in every
 * process of the MPI job: fsdp_test_run_world then runs each process's rank of an MPI world,
 * after each case the processes agree on its result (a case that failed on any rank fails
 * on all, naming the ranks), rank 0 prints the CUnit report and every process exits non-zero
 * when a case failed. */
int fsdp_test_run(int argc, char **argv, const char *suite, const fsdp_test_case *cases, int n);

/* The context of the running test (created before, freed after each case; seed 1234). */
fsdp_ctx *fsdp_test_ctx(void);

/* The failure the case's context holds (fsdp_test_ctx: status, message and trail), as
 * FSDP_TEST_OK takes it before its call; `taken` is false off the case's own thread, where
 * another thread may be using that context. */
typedef struct fsdp_test_record {
    bool taken;
    fsdp_status status;
    char text[512];
} fsdp_test_record;
fsdp_test_record fsdp_test_record_take(void);
/* Fails the case when a call that returned FSDP_OK left a failure on the case's context that
 * was not there before (a successful call must not record one: fsdp_last_error would report a
 * failure that did not happen, and a rank that returns a failure of its own would be reported
 * with that message). */
void fsdp_test_record_check(const fsdp_test_record *before, const char *expr, const char *file,
                            int line);

/* Asserts that expr returns FSDP_OK, and that it left no failure on the case's context;
 * otherwise fails the test with the library's message. */
#define FSDP_TEST_OK(expr)                                                                         \
    do {                                                                                           \
        fsdp_test_record before_ = fsdp_test_record_take();                                        \
        fsdp_status st_ = (expr);                                                                  \
        if (st_ != FSDP_OK)                                                                        \
            fprintf(stderr, "\n  %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,                \
                    fsdp_status_to_string(st_), fsdp_last_error(fsdp_test_ctx()));                 \
        CU_ASSERT_EQUAL_FATAL(st_, FSDP_OK);                                                       \
        fsdp_test_record_check(&before_, #expr, __FILE__, __LINE__);                               \
    } while (0)

/* Asserts that expr fails with `want`, and that the message names every string in the
 * NULL-terminated list that follows. */
#define FSDP_TEST_FAILS(expr, want, ...)                                                           \
    do {                                                                                           \
        fsdp_status st_ = (expr);                                                                  \
        CU_ASSERT_EQUAL(st_, (want));                                                              \
        const char *needles_[] = {__VA_ARGS__, NULL};                                              \
        CU_ASSERT_TRUE(fsdp_test_message_has(fsdp_last_error(fsdp_test_ctx()), needles_));         \
    } while (0)

bool fsdp_test_message_has(const char *message, const char *const *needles);

/* Declares the running case skipped: prints "skipped: <reason>" in the suite's report (rank 0
 * only, under MPI). Call it where the case gives up, before it checks anything (no GPU, a
 * variable CTest sets is missing, ...), from the case's own thread. The case then counts as
 * skipped unless it also ran a world through fsdp_test_run_world (which declares its runs of
 * another size skipped this way). A skipped case that fails still fails. */
void fsdp_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Compares n floats; prints "name: max abs diff A, max rel diff R (n elements)" and
 * returns true when every element satisfies |got - want| <= atol + rtol * |want|. */
bool fsdp_test_close(const char *name, const float *got, const float *want, int64_t n, double rtol,
                     double atol);
#define FSDP_TEST_CLOSE(name, got, want, n, rtol, atol)                                            \
    CU_ASSERT_TRUE(fsdp_test_close((name), (got), (want), (n), (rtol), (atol)))

/* The f32 values of m's parameters (CPU tensors) in visit order, in one new array of
 * fsdp_module_param_count(m) floats (*n when n is given); the caller frees it. */
float *fsdp_test_param_values(fsdp_module *m, int64_t *n);

/* Runs fn on the n ranks of a fresh world (timeout_ms per collective wait; 0 for the
 * default); the first failing rank's message lands in the test context. Locally the ranks are
 * n threads of this process. Under MPI this process runs its own rank of an MPI world when
 * the job has n processes; otherwise the run is skipped (fsdp_test_skip says so) and returns
 * FSDP_OK.
 * With FSDP_TEST_BACKEND=nccl (and no MPI) the world is on the nccl backend instead of the local
 * one; the program must have opened an NCCL first (fsdp_nccl_library_use: the stand-in).
 * So a rank function must check its own results: under MPI, `user` is this process's copy,
 * and what other ranks write to theirs never reaches it. */
fsdp_status fsdp_test_run_world(int n, int timeout_ms, fsdp_rank_fn fn, void *user);

/* The ranks of a world of n that this process runs, [*first, *first + count): all n locally,
 * under MPI its own rank, or none (0) when the job does not have n processes. */
int fsdp_test_hosted_ranks(int n, int *first);

/* Whether the suite runs under MPI (one process per rank). */
bool fsdp_test_mpi(void);

/* Inside a rank function: fails the rank with a message when cond does not hold. */
#define FSDP_RANK_CHECK(ctx, cond, ...)                                                            \
    do {                                                                                           \
        if (!(cond)) return FSDP_FAIL((ctx), FSDP_ERR_INTERNAL, __VA_ARGS__);                      \
    } while (0)

/* Inside a rank function: fails the rank with "what: element i is g, want w" unless the shapes
 * match and |got - want| <= atol + rtol |want| everywhere; *max_abs (may be NULL) is raised to
 * the largest difference seen. */
fsdp_status fsdp_test_rank_close(fsdp_ctx *ctx, const char *what, const fsdp_tensor *got,
                                 const fsdp_tensor *want, double rtol, double atol,
                                 double *max_abs);

/* CLOCK_MONOTONIC in seconds (core's fsdp_clock_now), for bounding a case's wall time. */
double fsdp_test_now(void);
/* Sleeps ms milliseconds (a rank computing, arriving late, ...). */
void fsdp_test_sleep_ms(long ms);

/* A tensor of the given shape filled from the counter RNG: uniform in [lo, hi). */
fsdp_tensor *fsdp_test_random(int ndim, const int64_t *shape, float lo, float hi, uint64_t stream);

#endif

/* test_comm_trace.c: the flight recorder (fsdp_comm_trace_print) and the forensics of a
 * timed-out collective. A rank that skips a collective on a group and goes on to another one
 * makes its peer's wait time out with an error that names that rank, the call it did not
 * make and where it went instead; a rank busy outside the collectives is named as such. Runs
 * on rank threads and under mpirun (test_comm_trace_mpi3), where the missing rank is asked
 * over MPI. Every case bounds its wall time. */
#define _POSIX_C_SOURCE 200809L // nanosleep, open_memstream

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TIMEOUT_MS 1000
/* A failing case must end within the timeout plus this (the peers' answers, the ranks'
 * return; generous for sanitizer builds). */
#define SLACK_S 3.0

static fsdp_status all_reduce_of(fsdp_ctx *ctx, fsdp_group *g, int64_t n) {
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &t));
    fsdp_status st = fsdp_tensor_fill(ctx, t, 1.0f);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, t, FSDP_REDUCE_SUM);
    fsdp_tensor_free(t);
    return st;
}

/* The recorder's dump as a string (free it). */
static fsdp_status dump(fsdp_ctx *ctx, int last, char **out) {
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    FSDP_RANK_CHECK(ctx, f, "open_memstream failed");
    fsdp_status st = fsdp_comm_trace_print(ctx, last, f);
    fclose(f);
    return st;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* ---- the recorder ---- */

static fsdp_status record_calls(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    FSDP_TRY(fsdp_barrier(ctx, NULL));
    const int pair[2] = {0, 1};
    fsdp_group *g = NULL;
    FSDP_TRY(fsdp_group_new(ctx, NULL, 2, pair, "pair", &g));
    int64_t shape[2] = {3, 5};
    fsdp_tensor *t = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &t);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, t, FSDP_REDUCE_SUM);
    fsdp_tensor_free(t);
    char *text = NULL;
    if (st == FSDP_OK) st = dump(ctx, 0, &text);
    if (st == FSDP_OK) {
        char want[3][160];
        snprintf(want[0], sizeof want[0], "rank %d call 1: barrier #1 on group 'world'", rank);
        snprintf(want[1], sizeof want[1], "rank %d call 2: group split #2 on group 'world'", rank);
        snprintf(want[2], sizeof want[2],
                 "rank %d call 3: all_reduce #1 on group 'pair' (world ranks 0,1) of (3, 5) f32: "
                 "done in ",
                 rank);
        for (int i = 0; i < 3 && st == FSDP_OK; i++)
            if (!strstr(text, want[i]))
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the dump lacks \"%s\":\n%s", want[i], text);
        if (st == FSDP_OK && count_lines(text) != 3)
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the dump has %d lines, want 3:\n%s",
                           count_lines(text), text);
    }
    free(text);
    text = NULL;
    /* The ring keeps the last 64: after 70 more barriers on the pair, calls 10..73. */
    for (int i = 0; i < 70 && st == FSDP_OK; i++) st = fsdp_barrier(ctx, g);
    if (st == FSDP_OK) st = dump(ctx, 0, &text);
    if (st == FSDP_OK) {
        char first[96], last[96];
        snprintf(first, sizeof first, "rank %d call 10: barrier #8 on group 'pair'", rank);
        snprintf(last, sizeof last, "rank %d call 73: barrier #71 on group 'pair'", rank);
        if (count_lines(text) != 64 || strncmp(text, first, strlen(first)) != 0 ||
            !strstr(text, last))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "after 73 calls the dump must be calls 10..73 (64 lines); it has %d "
                           "lines:\n%.600s",
                           count_lines(text), text);
    }
    free(text);
    text = NULL;
    if (st == FSDP_OK) st = dump(ctx, 2, &text);
    if (st == FSDP_OK && count_lines(text) != 2)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "last = 2 printed %d lines", count_lines(text));
    free(text);
    if (st == FSDP_OK) {
        FILE *f = tmpfile();
        fsdp_status bad = fsdp_comm_trace_print(ctx, -1, f);
        fclose(f);
        FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_INVALID_ARGUMENT, "last = -1 was not refused");
        fsdp_clear_error(ctx);
    }
    fsdp_group_free(g);
    return st;
}

static void test_records(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, TIMEOUT_MS, record_calls, NULL));
    /* Outside a run there is no recorder. */
    FSDP_TEST_FAILS(fsdp_comm_trace_print(fsdp_test_ctx(), 0, stdout), FSDP_ERR_STATE,
                    "not bound to a world");
}

/* ---- a skipped collective ---- */

/* The second all_reduce of rank 0 below, non-blocking: started, then waited for. */
static fsdp_status all_reduce_started(fsdp_ctx *ctx, fsdp_group *g, int64_t n) {
    fsdp_tensor *t = NULL;
    fsdp_comm_work *work = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &t));
    fsdp_status st = fsdp_comm_work_create(ctx, &work);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, t, 1.0f);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, g, t, FSDP_REDUCE_SUM, work);
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, work);
    fsdp_comm_work_free(work);
    fsdp_tensor_free(t);
    return st;
}

/* Ranks 0 and 1 form 'pair' and make one all_reduce on it; then rank 0 makes a second one on
 * the pair (non-blocking when *user is true), which rank 1 skips: after a moment of work it
 * goes on, with rank 2, to an all_reduce on the world. Rank 0's wait times out first. */
static fsdp_status skip_one(fsdp_ctx *ctx, int rank, void *user) {
    const bool nonblocking = *(const bool *)user;
    const int pair[2] = {0, 1};
    fsdp_group *g = NULL;
    FSDP_TRY(fsdp_group_new(ctx, NULL, 2, pair, "pair", &g));
    fsdp_status st = FSDP_OK;
    if (g) st = all_reduce_of(ctx, g, 4);
    if (st == FSDP_OK && rank == 0) {
        /* call #2 on the pair: rank 1 never makes it */
        st = nonblocking ? all_reduce_started(ctx, g, 4) : all_reduce_of(ctx, g, 4);
    } else if (st == FSDP_OK) {
        fsdp_test_sleep_ms(300);
        st = all_reduce_of(ctx, NULL, 8);
    }
    fsdp_group_free(g);
    return st;
}

static void run_skipped(bool nonblocking) {
    int first = 0;
    if (fsdp_test_hosted_ranks(3, &first) == 0) {
        fsdp_test_skip("needs 3 ranks (test_comm_trace_mpi3 under mpirun)");
        return;
    }
    double t0 = fsdp_test_now();
    fsdp_status st = fsdp_test_run_world(3, TIMEOUT_MS, skip_one, &nonblocking);
    double took = fsdp_test_now() - t0;
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n    %.2f s: %s", took, msg);
    CU_ASSERT_EQUAL(st, FSDP_ERR_TIMEOUT);
    const char *needles[] = {"all_reduce on group 'pair' (world ranks 0,1) timed out",
                             "rank 1 did not arrive",
                             "This rank is at call #2 on the group",
                             "Rank 1 made calls up to #1 on this group (the last: all_reduce #1 "
                             "of (4,) f32)",
                             "the ranks diverge at call #2 on 'pair' (world ranks 0,1), which "
                             "rank 1 did not make: it went on to all_reduce #",
                             "on group 'world' (world ranks 0,1,2) of (8,) f32, inside which it "
                             "has been for",
                             NULL};
    CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    CU_ASSERT_TRUE(took < 1e-3 * TIMEOUT_MS + SLACK_S);
}

static void test_skipped_collective(void) {
    run_skipped(false);
}

/* The same with rank 0's call non-blocking (under MPI its wait is the one that times out, on
 * rank threads the start). */
static void test_skipped_nonblocking(void) {
    run_skipped(true);
}

/* ---- a group one rank never used ---- */

/* Rank 0 makes the first call on 'pair'; rank 1, its other member, never uses the pair: it
 * goes on, with rank 2, to an all_reduce on the world. */
static fsdp_status never_use(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int pair[2] = {0, 1};
    fsdp_group *g = NULL;
    FSDP_TRY(fsdp_group_new(ctx, NULL, 2, pair, "pair", &g));
    fsdp_status st;
    if (rank == 0) {
        st = all_reduce_of(ctx, g, 4);
    } else {
        fsdp_test_sleep_ms(300);
        st = all_reduce_of(ctx, NULL, 8);
    }
    fsdp_group_free(g);
    return st;
}

static void test_never_used_group(void) {
    int first = 0;
    if (fsdp_test_hosted_ranks(3, &first) == 0) {
        fsdp_test_skip("needs 3 ranks (test_comm_trace_mpi3 under mpirun)");
        return;
    }
    double t0 = fsdp_test_now();
    fsdp_status st = fsdp_test_run_world(3, TIMEOUT_MS, never_use, NULL);
    double took = fsdp_test_now() - t0;
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n    %.2f s: %s", took, msg);
    CU_ASSERT_EQUAL(st, FSDP_ERR_TIMEOUT);
    const char *needles[] = {"all_reduce on group 'pair' (world ranks 0,1) timed out",
                             "This rank is at call #1 on the group",
                             "Rank 1 has made no call on this group in this run; its 2 other "
                             "calls: group split #1 on group 'world' (world ranks 0,1,2)",
                             "then all_reduce #2 on group 'world' (world ranks 0,1,2) of (8,) "
                             "f32, inside which it has been for",
                             NULL};
    CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    CU_ASSERT_TRUE(took < 1e-3 * TIMEOUT_MS + SLACK_S);
}

/* ---- the dump to a directory ---- */

/* The whole of a file, or NULL (free it). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

/* The skipped call again, with FSDP_COMM_TRACE_DIR set: every rank whose collective failed
 * (rank 0 by its timeout, ranks 1 and 2 because rank 0 returned) writes its recorder there,
 * its error first. Each process checks the files of the ranks it hosts. */
static void test_dump_on_failure(void) {
    int first = 0, count = fsdp_test_hosted_ranks(3, &first);
    if (count == 0) {
        fsdp_test_skip("needs 3 ranks (test_comm_trace_mpi3 under mpirun)");
        return;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/comm-trace-%ld", FSDP_BINARY_DIR, (long)getppid());
    CU_ASSERT_EQUAL_FATAL(setenv(FSDP_COMM_TRACE_DIR_ENV, dir, 1), 0);
    bool nonblocking = false;
    fsdp_status st = fsdp_test_run_world(3, TIMEOUT_MS, skip_one, &nonblocking);
    unsetenv(FSDP_COMM_TRACE_DIR_ENV);
    CU_ASSERT_EQUAL(st, FSDP_ERR_TIMEOUT);
    /* Ranks 1 and 2 fail on rank 0's return, or on the group that the first of them to see it
     * poisoned: both messages name rank 0's. */
    static const char *const want[3][4] = {
        {"rank 0: all_reduce on group 'pair' (world ranks 0,1) timed out after 1000 ms",
         "rank 0 call 3: all_reduce #2 on group 'pair' (world ranks 0,1) of (4,) f32: failed in ",
         NULL},
        {"rank 1: all_reduce on group 'world' (world ranks 0,1,2)", "rank 0 will never arrive",
         "rank 1 call 3: all_reduce #2 on group 'world' (world ranks 0,1,2) of (8,) f32: failed "
         "in ",
         NULL},
        {"rank 2: all_reduce on group 'world' (world ranks 0,1,2)", "rank 0 will never arrive",
         "rank 2 call 2: all_reduce #2 on group 'world' (world ranks 0,1,2) of (8,) f32: failed "
         "in ",
         NULL},
    };
    for (int r = first; r < first + count; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s/comm-trace-rank%d.txt", dir, r);
        char *text = slurp(path);
        CU_ASSERT_PTR_NOT_NULL(text);
        if (text) {
            printf("\n    %s:\n%s", path, text);
            CU_ASSERT_TRUE(fsdp_test_message_has(text, want[r]));
        }
        free(text);
        remove(path);
    }
    rmdir(dir); /* under MPI the last process to get here removes it */
}

/* ---- a rank that returned ---- */

/* Both make an all_reduce on the world; rank 1 then returns, and rank 0's barrier fails at
 * once naming where rank 1 stopped on the group (its exit carries its calls per group). */
static fsdp_status leave_early(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    FSDP_TRY(all_reduce_of(ctx, NULL, 4));
    if (rank == 1) return FSDP_OK;
    return fsdp_barrier(ctx, NULL);
}

static void test_returned_early(void) {
    int first = 0;
    if (fsdp_test_hosted_ranks(2, &first) == 0) {
        fsdp_test_skip("needs 2 ranks (test_comm_trace_mpi2 under mpirun)");
        return;
    }
    double t0 = fsdp_test_now();
    fsdp_status st = fsdp_test_run_world(2, 30000, leave_early, NULL);
    double took = fsdp_test_now() - t0;
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n    %.2f s: %s", took, msg);
    CU_ASSERT_EQUAL(st, FSDP_ERR_COMM);
    const char *needles[] = {"barrier on group 'world' (world ranks 0,1): rank 1 will never "
                             "arrive: its function returned FSDP_OK after its call #1 on this "
                             "group, without making this rank's call #2",
                             NULL};
    CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    CU_ASSERT_TRUE(took < SLACK_S); /* not the 30 s timeout */
}

/* ---- a rank busy outside the collectives ---- */

/* Both make a barrier; then rank 1 computes (sleeps) past rank 0's timeout instead of
 * arriving at the second. */
static fsdp_status busy(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    FSDP_TRY(fsdp_barrier(ctx, NULL));
    if (rank == 1) fsdp_test_sleep_ms(TIMEOUT_MS + 800);
    return fsdp_barrier(ctx, NULL);
}

static void test_busy_rank(void) {
    int first = 0;
    if (fsdp_test_hosted_ranks(2, &first) == 0) {
        fsdp_test_skip("needs 2 ranks (test_comm_trace_mpi2 under mpirun)");
        return;
    }
    double t0 = fsdp_test_now();
    fsdp_status st = fsdp_test_run_world(2, TIMEOUT_MS, busy, NULL);
    double took = fsdp_test_now() - t0;
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n    %.2f s: %s", took, msg);
    CU_ASSERT_EQUAL(st, FSDP_ERR_TIMEOUT);
    if (fsdp_test_mpi()) {
        /* Rank 1 does not wait in a collective: it cannot answer. */
        const char *needles[] = {"barrier on group 'world'",
                                 "rank 1 did not arrive",
                                 "This rank is at call #2 on the group",
                                 "Rank 1 did not answer a query for its recent collectives",
                                 "not waiting inside a libfsdp collective",
                                 NULL};
        CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    } else {
        const char *needles[] = {"barrier on group 'world'",
                                 "rank 1 did not arrive",
                                 "This rank is at call #2 on the group",
                                 "Rank 1 made calls up to #1 on this group (the last: barrier #1)",
                                 "it has made no collective since (computing, or stuck",
                                 "it never made call #2",
                                 NULL};
        CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    }
    CU_ASSERT_TRUE(took < 1e-3 * (TIMEOUT_MS + 800) + SLACK_S);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"records", test_records},
        {"skipped_collective", test_skipped_collective},
        {"skipped_nonblocking", test_skipped_nonblocking},
        {"never_used_group", test_never_used_group},
        {"dump_on_failure", test_dump_on_failure},
        {"returned_early", test_returned_early},
        {"busy_rank", test_busy_rank},
    };
    return fsdp_test_run(argc, argv, "comm_trace", cases, sizeof cases / sizeof cases[0]);
}

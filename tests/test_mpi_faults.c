/* test_mpi_faults.c: the MPI backend when a member gives up on a call its peers complete. Rank
 * 0 runs with a short timeout and the others arrive just around its deadline, sweeping the
 * delay across the moment it gives up: a split never leaves a latecomer inside
 * MPI_Comm_split (a hang), and a split or barrier never succeeds on some ranks while it failed
 * on others. Where that moment falls depends on the machine's load (a process descheduled for
 * a few ms arrives later than asked), so the sweep first finds it from the outcomes it sees,
 * then sweeps around it. Runs under mpirun only (CTest's test_mpi_faults_mpi2 and _mpi3); as
 * rank threads it has nothing to do and says so. */
#define _POSIX_C_SOURCE 200809L // nanosleep

#include <stdio.h>
#include <time.h>

#include "harness.h"

/* Rank 0's timeout. Its world's creation waits under it too (fsdp_world_create waits timeout_ms
 * for the other processes), and on a loaded 2-core machine MPI_Comm_idup took more than 20 ms;
 * 50 ms held with four busy processes besides the job's. */
#define SHORT_MS  50
#define LONG_MS   20000 /* the others' */
#define SPAN_US   2000  /* the sweep: the others from 2 ms before the crossing to 2 ms after */
#define STEP_US   100
#define MAX_TRIES 20 /* runs to see each outcome once, before the sweep */

typedef struct sweep {
    fsdp_comm_op op; /* FSDP_COMM_BARRIER, or FSDP_COMM_ANY for a split */
    long delay_us;   /* the others arrive this long after rank 0's deadline (may be < 0) */
} sweep;

static void sleep_us(long us) {
    if (us <= 0) return;
    nanosleep(&(struct timespec){.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000}, NULL);
}

/* Both leave a barrier together; rank 0 then makes the call at once, the others after
 * SHORT_MS + delay. Returns the call's own status. */
static fsdp_status late_call(fsdp_ctx *ctx, int rank, void *user) {
    const sweep *s = user;
    FSDP_TRY(fsdp_barrier(ctx, NULL));
    if (rank != 0) sleep_us(SHORT_MS * 1000L + s->delay_us);
    if (s->op == FSDP_COMM_BARRIER) return fsdp_barrier(ctx, NULL);
    fsdp_group *g = NULL;
    fsdp_status st = fsdp_group_split(ctx, NULL, 0, rank, "late", &g);
    fsdp_group_free(g);
    return st;
}

static fsdp_status nothing(fsdp_ctx *ctx, int rank, void *user) {
    (void)ctx, (void)rank, (void)user;
    return FSDP_OK;
}

/* The outcomes of the runs so far: every rank succeeded, every rank failed, or some did
 * (a split: the defect this suite looks for). */
typedef struct tally {
    int ok, failed, split;
} tally;

/* One run with the others delay_us after rank 0's deadline; returns on how many ranks the
 * call succeeded (the same number in every process: each learns every rank's result). */
static int run_at(fsdp_world *w, fsdp_comm_op op, long delay_us, int rank, tally *t) {
    sweep s = {op, delay_us};
    (void)fsdp_world_run(fsdp_test_ctx(), w, late_call, &s);
    int size = fsdp_world_size(w), n_ok = 0;
    for (int r = 0; r < size; r++) n_ok += fsdp_world_rank_status(w, r) == FSDP_OK;
    if (n_ok == size) {
        t->ok++;
    } else if (n_ok == 0) {
        t->failed++;
    } else {
        t->split++;
        if (rank == 0)
            printf("\n    delay %+ld us: the call succeeded on %d of %d ranks: %s", delay_us, n_ok,
                   size, fsdp_last_error(fsdp_test_ctx()));
    }
    return n_ok;
}

/* Finds a delay at which the call succeeds on every rank (lo: the others arrive with rank 0,
 * retried while a loaded machine stalls them past its deadline) and one at which it fails on
 * every rank (hi: from SPAN_US after the deadline, doubled while the call still succeeds),
 * MAX_TRIES runs at most for each; bisects between them to the crossing, then sweeps
 * SPAN_US either side of it. Every run must end (a hang fails the CTest entry by its timeout)
 * with the call failed on every rank or on none. */
static void run_sweep(fsdp_comm_op op) {
    if (!fsdp_test_mpi()) {
        fsdp_test_skip("runs under mpirun only (test_mpi_faults_mpi2, _mpi3)");
        return;
    }
    /* The others create their world first, so that rank 0's short timeout does not apply to
     * the creation (a creation that times out would leave MPI's collectives misaligned). */
    fsdp_world *w = NULL, *align = NULL;
    fsdp_world_options o = {.backend = FSDP_BACKEND_MPI, .timeout_ms = LONG_MS};
    FSDP_TEST_OK(fsdp_world_create(fsdp_test_ctx(), &o, &align));
    int rank = -1, size = fsdp_world_size(align);
    fsdp_test_hosted_ranks(size, &rank);
    if (size < 2) {
        fsdp_test_skip("needs 2 or more processes");
        fsdp_world_free(align);
        return;
    }
    FSDP_TEST_OK(fsdp_world_run(fsdp_test_ctx(), align, nothing, NULL));
    if (rank == 0) sleep_us(50000);
    o.timeout_ms = rank == 0 ? SHORT_MS : LONG_MS;
    FSDP_TEST_OK(fsdp_world_create(fsdp_test_ctx(), &o, &w));
    tally t = {0};
    long lo = -SHORT_MS * 1000L, hi = SPAN_US;
    int tries_ok = 1, tries_failed = 1;
    while (run_at(w, op, lo, rank, &t) != size && tries_ok < MAX_TRIES) tries_ok++;
    while (run_at(w, op, hi, rank, &t) != 0 && tries_failed < MAX_TRIES) {
        tries_failed++;
        hi *= 2;
    }
    while (t.ok > 0 && t.failed > 0 && hi - lo > SPAN_US) {
        long mid = lo + (hi - lo) / 2;
        int n_ok = run_at(w, op, mid, rank, &t);
        if (n_ok == size)
            lo = mid;
        else if (n_ok == 0)
            hi = mid;
        else
            break;
    }
    long centre = lo + (hi - lo) / 2;
    for (long d = centre - SPAN_US; d <= centre + SPAN_US; d += STEP_US) run_at(w, op, d, rank, &t);
    if (rank == 0)
        printf("\n    %s: the crossing near %+ld us past rank 0's deadline (%d and %d runs to see "
               "each outcome); %d runs succeeded on every rank, %d failed on every rank, %d "
               "split",
               op == FSDP_COMM_BARRIER ? "barrier" : "split", centre, tries_ok, tries_failed, t.ok,
               t.failed, t.split);
    CU_ASSERT_EQUAL(t.split, 0);
    CU_ASSERT_TRUE(t.ok > 0 && t.failed > 0); /* the runs crossed the deadline */
    fsdp_world_free(w);
    fsdp_world_free(align);
}

static void test_late_split(void) {
    run_sweep(FSDP_COMM_ANY);
}

static void test_late_barrier(void) {
    run_sweep(FSDP_COMM_BARRIER);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"late_split", test_late_split},
        {"late_barrier", test_late_barrier},
    };
    return fsdp_test_run(argc, argv, "mpi_faults", cases, (int)(sizeof cases / sizeof cases[0]));
}

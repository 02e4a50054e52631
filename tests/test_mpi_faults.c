/* test_mpi_faults.c: the MPI backend when a member gives up on a call its peers complete. Rank
 * 0 runs with a short timeout and the others arrive just around its deadline, sweeping the
 * delay across the moment it gives up: a split never leaves a latecomer inside
 * MPI_Comm_split (a hang), and a split or barrier never succeeds on some ranks while it failed
 * on others. Runs under mpirun only (CTest's test_mpi_faults_mpi2 and _mpi3); as rank threads
 * it has nothing to do and says so. */
#define _POSIX_C_SOURCE 200809L // nanosleep

#include <stdio.h>
#include <time.h>

#include "harness.h"

#define SHORT_MS 20    /* rank 0's timeout */
#define LONG_MS  20000 /* the others' */

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

/* Sweeps the delay from -2 ms to +2 ms around rank 0's deadline. Every run must end (a hang
 * fails the CTest entry by its timeout) with the call failed on every rank or on none. */
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
    int ok = 0, failed = 0, split = 0;
    for (long d = -2000; d <= 2000; d += 100) {
        sweep s = {op, d};
        fsdp_status st = fsdp_world_run(fsdp_test_ctx(), w, late_call, &s);
        int n_ok = 0;
        for (int r = 0; r < fsdp_world_size(w); r++) n_ok += fsdp_world_rank_status(w, r) == 0;
        if (n_ok != 0 && n_ok != fsdp_world_size(w)) {
            split++;
            if (rank == 0)
                printf("\n    delay %+ld us: the call succeeded on %d of %d ranks: %s", d, n_ok,
                       fsdp_world_size(w), fsdp_last_error(fsdp_test_ctx()));
        }
        st == FSDP_OK ? ok++ : failed++;
    }
    if (rank == 0)
        printf("\n    %s: %d runs succeeded on every rank, %d failed on every rank, %d split",
               op == FSDP_COMM_BARRIER ? "barrier" : "split", ok, failed, split);
    CU_ASSERT_EQUAL(split, 0);
    CU_ASSERT_TRUE(ok > 0 && failed > 0); /* the sweep crossed the deadline */
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

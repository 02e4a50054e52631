/* test_comm_faults.c: a rank that never comes back ends the run. A rank thread that blocks
 * forever in its function, an MPI rank stopped (SIGSTOP) past the timeout and an MPI rank
 * killed under `mpirun --enable-recovery` each make the others time out; fsdp_world_run then
 * must not wait for the missing rank for longer than the grace period: with rank threads it
 * returns the error and reports the stuck thread, under MPI the job is aborted with a message
 * naming the rank. A rank that waits long in a collective logs whom it waits for, under its
 * own rank's prefix. Every case has a bounded wall time: a hang fails it. The MPI cases start
 * mpirun themselves (CTest's test_comm_faults_mpi_stopped and _mpi_killed set the command);
 * without it they skip with a line. */
#define _POSIX_C_SOURCE 200809L // nanosleep, fork, setpgid, kill, dup, mkdir

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h" // defines: fsdp_comm_rank_list
#include "harness.h"

#ifndef FSDP_FAULTS_EXE
#define FSDP_FAULTS_EXE ""
#endif

/* The MPI children: 3 processes; rank 2 stops or dies after the first barrier. */
#define CHILD_RANKS      3
#define CHILD_TIMEOUT_MS 2000
#define CHILD_GRACE_MS   1000
/* How long after the first failure every process must have ended: the grace period, plus
 * what MPI_Abort and mpirun take to bring the job down (generous for sanitizer builds). */
#define END_SLACK_MS 4000
/* A job still running after this long has hung (the code before the grace period). */
#define HARD_LIMIT_S 30.0

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- rank threads ---- */

/* A gate that a rank thread blocks on until the test opens it, or, so that the case ends
 * even where fsdp_world_run waits for the thread, GATE_LIMIT_S after it closed. */
#define GATE_LIMIT_S 20
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
} g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};

static void gate_set(bool open) {
    pthread_mutex_lock(&g_gate.mu);
    g_gate.open = open;
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
}

static void gate_wait(void) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += GATE_LIMIT_S;
    pthread_mutex_lock(&g_gate.mu);
    while (!g_gate.open)
        if (pthread_cond_timedwait(&g_gate.cv, &g_gate.mu, &until) == ETIMEDOUT) break;
    pthread_mutex_unlock(&g_gate.mu);
}

/* Rank 2 blocks in its function (never calls the barrier); ranks 0 and 1 time out in it. */
static fsdp_status stuck_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    if (rank == 2) {
        gate_wait();
        return FSDP_OK;
    }
    return fsdp_barrier(ctx, NULL);
}

static fsdp_status nothing(fsdp_ctx *ctx, int rank, void *user) {
    (void)ctx, (void)rank, (void)user;
    return FSDP_OK;
}

/* fsdp_world_run returns the timeout within timeout + grace (not when the thread returns, 20 s
 * later), reports rank 2's thread as stuck, refuses to run the world again while that thread
 * runs, and runs it again once the thread has returned. */
static void test_stuck_rank_thread(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world *w = NULL;
    fsdp_world_options o = {.nranks = 3, .timeout_ms = 500, .grace_ms = 500};
    FSDP_TEST_OK(fsdp_world_create(ctx, &o, &w));
    gate_set(false);
    double t0 = fsdp_test_now();
    fsdp_status st = fsdp_world_run(ctx, w, stuck_body, NULL);
    double took = fsdp_test_now() - t0;
    printf("\n    fsdp_world_run returned %s after %.2f s: %s", fsdp_status_to_string(st), took,
           fsdp_last_error(ctx));
    CU_ASSERT_TRUE(took < 5.0); /* timeout 0.5 s + grace 0.5 s, and room for a busy machine */
    CU_ASSERT_EQUAL(st, FSDP_ERR_TIMEOUT);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        fsdp_last_error(ctx),
        (const char *const[]){"barrier on group 'world'", "rank 2 did not arrive",
                              "rank 2 has not returned from its function", "500 ms", NULL}));
    CU_ASSERT_EQUAL(fsdp_world_rank_status(w, 2), FSDP_ERR_TIMEOUT);
    CU_ASSERT_TRUE(fsdp_test_message_has(fsdp_world_rank_error(w, 2),
                                         (const char *const[]){"still running", "detached", NULL}));
    if (took < GATE_LIMIT_S) {
        /* The stuck thread still uses the world: it cannot run again yet. */
        FSDP_TEST_FAILS(fsdp_world_run(ctx, w, nothing, NULL), FSDP_ERR_STATE, "rank 2's thread",
                        "has not returned");
    }
    gate_set(true);
    st = FSDP_ERR_STATE;
    for (double t1 = fsdp_test_now(); st == FSDP_ERR_STATE && fsdp_test_now() - t1 < 10.0;
         fsdp_test_sleep_ms(10))
        st = fsdp_world_run(ctx, w, nothing, NULL);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    fsdp_world_free(w);
}

/* A world freed while a stuck thread runs stays valid until that thread returns (it frees
 * the world then); nothing is freed under it. Under ASan a use after free would show. The
 * grace period comes from the environment here (FSDP_COMM_GRACE_MS), and a negative one is
 * refused. */
static void test_free_while_stuck(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world *w = NULL;
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &(fsdp_world_options){.grace_ms = -1}, &w),
                    FSDP_ERR_INVALID_ARGUMENT, "grace_ms is -1");
    fsdp_world_options o = {.nranks = 3, .timeout_ms = 200};
    setenv("FSDP_COMM_GRACE_MS", "300", 1);
    fsdp_status st = fsdp_world_create(ctx, &o, &w);
    unsetenv("FSDP_COMM_GRACE_MS");
    FSDP_TEST_OK(st);
    gate_set(false);
    double t0 = fsdp_test_now();
    FSDP_TEST_FAILS(fsdp_world_run(ctx, w, stuck_body, NULL), FSDP_ERR_TIMEOUT,
                    "rank 2 has not returned", "300 ms");
    CU_ASSERT_TRUE(fsdp_test_now() - t0 < 5.0);
    fsdp_world_free(w); /* the stuck thread keeps it alive */
    gate_set(true);
    fsdp_test_sleep_ms(200); /* the thread returns, and frees the world */
}

/* A rank that waits long in a collective logs whom it waits for, under its own rank, and what
 * that rank does meanwhile (its flight recorder). Rank 2 comes 2.2 s late to a barrier with a
 * 3 s timeout: ranks 0 and 1 log after 1.5 s (half the timeout), and the barrier then
 * succeeds. */
static fsdp_status late_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    if (rank == 2) fsdp_test_sleep_ms(2200);
    return fsdp_barrier(ctx, NULL);
}

static void test_waiting_rank_logs(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world *w = NULL;
    fsdp_world_options o = {.nranks = 3, .timeout_ms = 3000, .ctx = {.log_level = FSDP_LOG_WARN}};
    FSDP_TEST_OK(fsdp_world_create(ctx, &o, &w));
    /* stderr into a file while the ranks run */
    fflush(stderr);
    FILE *log = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(log);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(log), STDERR_FILENO);
    fsdp_status st = fsdp_world_run(ctx, w, late_body, NULL);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[8192];
    rewind(log);
    size_t n = fread(text, 1, sizeof text - 1, log);
    text[n] = '\0';
    fclose(log);
    printf("\n    the ranks logged:\n%s", text);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        text, (const char *const[]){"[fsdp r0 warn] barrier on group 'world'",
                                    "[fsdp r1 warn] barrier on group 'world'",
                                    "waiting for rank 2 (arrived: 0,1)",
                                    "Rank 2 has made no collective in this run yet", NULL}));
    CU_ASSERT_PTR_NULL(strstr(text, "[fsdp r2 "));
    fsdp_world_free(w);
}

/* ---- MPI processes ---- */

/* The child (`test_comm_faults --child stop|kill|kill-gather DIR`, one per MPI process): every
 * rank writes its pid into DIR/pid.R, and the ranks meet in a barrier; then rank 2 stops itself
 * (SIGSTOP) or dies (SIGKILL), and the others time out in the next barrier (kill-gather: in the
 * wait of a started all_gather), writing the time (CLOCK_REALTIME) into DIR/failed.R as their
 * function returns. */
typedef struct child_job {
    const char *mode, *dir;
} child_job;

static void child_note(const child_job *job, const char *what, int rank, const char *fmt,
                       double value) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d", job->dir, what, rank);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, fmt, value);
    fclose(f);
}

/* The survivors' call in "kill-gather" mode: a started all_gather, in flight (the mpi backend's
 * non-blocking call) while rank 2 dies, then waited for. */
static fsdp_status pending_gather(fsdp_ctx *ctx) {
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    fsdp_tensor *in = NULL, *out = NULL;
    fsdp_comm_work *w = NULL;
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){1 << 16}, &in);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                (const int64_t[]){(int64_t)W << 16}, &out);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) st = fsdp_all_gather_start(ctx, NULL, out, in, 0, w);
    if (st == FSDP_OK && !fsdp_comm_work_pending(w))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the started all_gather was not in flight");
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    fsdp_comm_work_free(w);
    fsdp_tensor_free(in), fsdp_tensor_free(out);
    return st;
}

static fsdp_status child_body(fsdp_ctx *ctx, int rank, void *user) {
    const child_job *job = user;
    const bool gather = strcmp(job->mode, "kill-gather") == 0;
    child_note(job, "pid", rank, "%.0f\n", (double)getpid());
    FSDP_TRY(fsdp_barrier(ctx, NULL));
    if (rank == 2) raise(strcmp(job->mode, "stop") == 0 ? SIGSTOP : SIGKILL);
    fsdp_status st = gather ? pending_gather(ctx) : fsdp_barrier(ctx, NULL);
    child_note(job, "failed", rank, "%.6f\n", wall_now());
    return st;
}

static int child_main(const char *mode, const char *dir) {
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(NULL, &ctx) != FSDP_OK) return 2;
    fsdp_world *w = NULL;
    fsdp_world_options o = {
        .backend = FSDP_BACKEND_MPI, .timeout_ms = CHILD_TIMEOUT_MS, .grace_ms = CHILD_GRACE_MS};
    fsdp_status st = fsdp_world_create(ctx, &o, &w);
    child_job job = {mode, dir};
    if (st == FSDP_OK) st = fsdp_world_run(ctx, w, child_body, &job);
    /* Not reached by the survivors once the grace period ends the job. */
    fprintf(stderr, "child: fsdp_world_run returned %s: %s\n", fsdp_status_to_string(st),
            fsdp_last_error(ctx));
    fsdp_world_free(w);
    fsdp_ctx_free(ctx);
    return st == FSDP_OK ? 0 : 1;
}

/* Reads DIR/what.R as a number; -1 when there is none. */
static double read_note(const char *dir, const char *what, int rank) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d", dir, what, rank);
    FILE *f = fopen(path, "r");
    double v = -1;
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* Whether process pid exists and is not a zombie (a rank of an ended job that its parent has
 * not reaped yet is gone). */
static bool process_alive(pid_t pid) {
    if (kill(pid, 0) != 0) return false;
    char path[64], stat[512] = "";
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    stat[n] = '\0';
    fclose(f);
    const char *end = strrchr(stat, ')'); /* "pid (name) S ..." */
    return !(end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

/* Runs `mpirun ... --child mode dir` (the command in the environment variable `env`), at most
 * HARD_LIMIT_S; checks that it ends with a message naming rank 2 within the grace period of
 * the first failure (and, with nonzero_exit, a failing exit status), and that no process of
 * the job is left. */
static void run_mpi_fault(const char *env, const char *mode, bool nonzero_exit, const char *call) {
    const char *mpirun = getenv(env);
    if (!mpirun || !*mpirun || !*FSDP_FAULTS_EXE) {
        fsdp_test_skip("%s is not set (CTest's test_comm_faults_mpi_* entries set it)", env);
        return;
    }
    char dir[2048], out_path[2100], cmd[8192];
    snprintf(dir, sizeof dir, "%s/test_comm_faults_%s", FSDP_BINARY_DIR, mode);
    mkdir(dir, 0700);
    for (int r = 0; r < CHILD_RANKS; r++) {
        char p[2100];
        snprintf(p, sizeof p, "%s/pid.%d", dir, r), remove(p);
        snprintf(p, sizeof p, "%s/failed.%d", dir, r), remove(p);
    }
    snprintf(out_path, sizeof out_path, "%s/output.txt", dir);
    snprintf(cmd, sizeof cmd, "exec %s '%s' --child %s '%s' >'%s' 2>&1", mpirun, FSDP_FAULTS_EXE,
             mode, dir, out_path);
    printf("\n    %s", cmd);
    fflush(stdout);
    double t0 = fsdp_test_now();
    pid_t pid = fork();
    CU_ASSERT_TRUE_FATAL(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0;
    bool ended = false;
    while (!ended && fsdp_test_now() - t0 < HARD_LIMIT_S) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        ended = got == pid;
        if (!ended) fsdp_test_sleep_ms(20);
    }
    double end = wall_now(), took = fsdp_test_now() - t0;
    if (!ended) { /* the job hung: end it and every rank */
        kill(-pid, SIGTERM);
        fsdp_test_sleep_ms(2000);
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    /* No process of the job may be left (a stopped one, above all). */
    int left = 0;
    for (int r = 0; r < CHILD_RANKS; r++) {
        double p = read_note(dir, "pid", r);
        if (p <= 0) continue;
        bool alive = true;
        for (double t1 = fsdp_test_now(); alive && fsdp_test_now() - t1 < 3.0;
             fsdp_test_sleep_ms(20))
            alive = process_alive((pid_t)p);
        if (alive) {
            printf("\n    rank %d (pid %.0f) is still there", r, p);
            left++;
            kill((pid_t)p, SIGKILL);
        }
    }
    char text[16384] = "";
    FILE *f = fopen(out_path, "r");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    double first_failure = -1;
    for (int r = 0; r < CHILD_RANKS; r++) {
        double t = read_note(dir, "failed", r);
        if (t > 0 && (first_failure < 0 || t < first_failure)) first_failure = t;
    }
    double after = first_failure > 0 ? end - first_failure : -1;
    printf("\n    %s after %.2f s (%.2f s after the first rank failed), exit status %d; "
           "output:\n%s",
           ended ? "the job ended" : "the job HUNG and was killed", took, after,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, text);
    CU_ASSERT_TRUE(ended);
    CU_ASSERT_EQUAL(left, 0);
    CU_ASSERT_TRUE(first_failure > 0);
    CU_ASSERT_TRUE(after >= 0 && after < 1e-3 * (CHILD_GRACE_MS + END_SLACK_MS));
    if (nonzero_exit) CU_ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        text, (const char *const[]){"rank 2 has not returned from its function", call,
                                    "rank 2 did not arrive", "aborting the MPI job", NULL}));
    /* The survivors' waits log under their own ranks. */
    CU_ASSERT_TRUE(fsdp_test_message_has(
        text, (const char *const[]){"[fsdp r0 warn]", "[fsdp r1 warn]", NULL}));
}

static void test_mpi_stopped_rank(void) {
    run_mpi_fault("FSDP_FAULTS_MPIRUN", "stop", true, "barrier on group 'world'");
}

static void test_mpi_killed_rank(void) {
    /* Under --enable-recovery, Open MPI 4.1's mpirun exits 0 even when a process called
     * MPI_Abort: the job's end and the message are what is checked. */
    run_mpi_fault("FSDP_FAULTS_MPIRUN_RECOVERY", "kill", false, "barrier on group 'world'");
}

/* The same with the survivors in the wait of a started all_gather (in flight when rank 2 dies):
 * they time out naming the all_gather, and the job ends within the grace period. */
static void test_mpi_killed_during_gather(void) {
    run_mpi_fault("FSDP_FAULTS_MPIRUN_RECOVERY", "kill-gather", false,
                  "all_gather on group 'world'");
}

/* Every item of list is a whole rank below n, or a run "a-b" of them, or the "..." that ends a
 * list cut short. */
static bool whole_ranks(const char *list, int n) {
    for (const char *p = list; *p;) {
        if (strcmp(p, "...") == 0) return true;
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return false;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        if (a < 0 || b >= n || b < a || (*end && *end != ',')) return false;
        p = *end ? end + 1 : end;
    }
    return true;
}

/* The lists of ranks the waits and timeouts name, for 1024 ranks: runs of consecutive ranks
 * as "first-last", and a list cut short (every second rank) ends after a whole rank with
 * "...", within the 256 bytes the messages give it; before, the list was cut inside a number
 * ("...,166,16"), naming a rank that is not late. */
static void test_rank_list_whole_numbers(void) {
    enum { N = 1024 };
    static bool late[N];
    char buf[256];
    memset(late, 0, sizeof late);
    late[1000] = true;
    CU_ASSERT_EQUAL(fsdp_comm_rank_list(NULL, late, N, false, buf, sizeof buf), N - 1);
    CU_ASSERT_STRING_EQUAL(buf, "0-999,1001-1023");
    CU_ASSERT_EQUAL(fsdp_comm_rank_list(NULL, late, N, true, buf, sizeof buf), 1);
    CU_ASSERT_STRING_EQUAL(buf, "1000");
    for (int r = 0; r < N; r++) late[r] = r % 2 == 1;
    CU_ASSERT_EQUAL(fsdp_comm_rank_list(NULL, late, N, true, buf, sizeof buf), N / 2);
    printf("\n    every second rank of %d: %s", N, buf);
    CU_ASSERT_TRUE(whole_ranks(buf, N));
    CU_ASSERT_TRUE(strlen(buf) > 200 && strcmp(buf + strlen(buf) - 4, ",...") == 0);
    int members[3] = {4, 5, 9};
    bool all[3] = {true, true, true};
    CU_ASSERT_EQUAL(fsdp_comm_rank_list(members, all, 3, true, buf, sizeof buf), 3);
    CU_ASSERT_STRING_EQUAL(buf, "4,5,9");
}

/* A data step's timeout names whom the rank waited for: the members whose data had not come
 * or, when only its sends were left open, the members that had not taken its data (before, that
 * case named nobody: "waiting for data from rank  for 10.0 s"). */
static void test_data_timeout_names_peers(void) {
    int ranks[3] = {4, 5, 9};
    bool missing[3] = {false, true, false};
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_DATA,
                           .op = FSDP_COMM_ALL_REDUCE,
                           .group_desc = "'world'",
                           .timeout_ms = 100,
                           .n_members = 3,
                           .ranks = ranks,
                           .missing = missing};
    char msg[FSDP_ERROR_MAX];
    CU_ASSERT_EQUAL(fsdp_comm_failure_format(&f, msg, sizeof msg), FSDP_ERR_TIMEOUT);
    printf("\n    %s", msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "nothing more came from rank 5."));
    f.unsent = true;
    CU_ASSERT_EQUAL(fsdp_comm_failure_format(&f, msg, sizeof msg), FSDP_ERR_TIMEOUT);
    printf("\n    %s", msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "rank 5 did not take this rank's data."));
    CU_ASSERT_PTR_NULL(strstr(msg, "came from"));
    missing[0] = true;
    CU_ASSERT_EQUAL(fsdp_comm_failure_format(&f, msg, sizeof msg), FSDP_ERR_TIMEOUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "ranks 4,5 did not take this rank's data."));
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child") == 0) return child_main(argv[2], argv[3]);
    static const fsdp_test_case cases[] = {
        {"stuck_rank_thread", test_stuck_rank_thread},
        {"free_while_stuck", test_free_while_stuck},
        {"waiting_rank_logs", test_waiting_rank_logs},
        {"mpi_stopped_rank", test_mpi_stopped_rank},
        {"mpi_killed_rank", test_mpi_killed_rank},
        {"mpi_killed_during_gather", test_mpi_killed_during_gather},
        {"rank_list_whole_numbers", test_rank_list_whole_numbers},
        {"data_timeout_names_peers", test_data_timeout_names_peers},
    };
    return fsdp_test_run(argc, argv, "comm_faults", cases, (int)(sizeof cases / sizeof cases[0]));
}

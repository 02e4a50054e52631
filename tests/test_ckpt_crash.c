/* test_ckpt_crash.c: a save killed with SIGKILL at random moments leaves the previous checkpoint
 * loadable. A child process trains on 2x2 rank threads and saves every step (sync and async in
 * turn); the parent kills it at a seeded-random point of a save, 20 times, and after each kill
 * checks that the newest committed checkpoint opens, verifies, holds the values of the step it
 * claims (bitwise against an uninterrupted run) and loads at another layout, and that the
 * temporary directory of the interrupted save is never taken. */
#define _POSIX_C_SOURCE 200809L /* fork, pipe, kill, clock_nanosleep, popen */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_common.h"
#include "harness.h"

#define KILLS       20
#define CHILD_STEPS 3 /* each child saves steps k+1 .. k+3 after resuming at k */
#define REF_STEPS   (KILLS * CHILD_STEPS + 4)
#define TARGET      2     /* the child's save that the kill aims at: k+2 */
#define WINDOW      1.5   /* kill points spread over WINDOW x one save's period */
#define WAIT_MS     60000 /* the longest the parent waits for a child's next save */

static const ckpt_layout layout = {
    "2x2 FULL_SHARD", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true};
static const ckpt_layout one_rank = {"1x1 plain", 1, 1, MODE_PLAIN, 0, 1, false, false, false};

/* What a child tells the parent before each save: the step and when (CLOCK_MONOTONIC). */
typedef struct save_note {
    int64_t step;
    double t;
} save_note;

static void note_save(int64_t step, void *user) {
    save_note n = {.step = step, .t = fsdp_test_now()};
    if (write(*(int *)user, &n, sizeof n) != (ssize_t)sizeof n) _exit(3);
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* Starts a child that runs jb, telling the parent (through *fd) before each save. The parent
 * holds no thread here: rank threads of earlier runs have been joined. */
static pid_t start_child(ckpt_job *jb, int *fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        jb->before_save = note_save;
        jb->hook_user = &p[1];
        fsdp_status s = ckpt_test_run(jb);
        if (s != FSDP_OK) fprintf(stderr, "crash child: %s\n", fsdp_last_error(fsdp_test_ctx()));
        _exit(s == FSDP_OK ? 0 : 1);
    }
    close(p[1]);
    *fd = p[0];
    return pid;
}

/* The child's next note; false when it exited or said nothing for WAIT_MS. */
static bool next_note(int fd, save_note *n) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, WAIT_MS) != 1) return false;
    return read(fd, n, sizeof *n) == (ssize_t)sizeof *n;
}

/* Waits for the child; true when it exited 0 or was killed by SIGKILL (*killed says which). */
static bool reap(pid_t pid, bool *killed) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return false;
    *killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    return *killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs jb to the end in a child; returns the median time between its saves (a save and one
 * training step), or -1. */
static double timed_run(ckpt_job *jb) {
    int fd;
    pid_t pid = start_child(jb, &fd);
    if (pid < 0) return -1;
    double t[REF_STEPS + 1], d[REF_STEPS];
    int n = 0;
    save_note note;
    while (n <= REF_STEPS && next_note(fd, &note)) t[n++] = note.t;
    close(fd);
    bool killed = false;
    if (!reap(pid, &killed) || killed || n < 3) return -1;
    for (int i = 0; i + 1 < n; i++) d[i] = t[i + 1] - t[i];
    qsort(d, (size_t)n - 1, sizeof *d, by_double);
    return d[(n - 1) / 2];
}

/* The step of "<dir>/step-XXXXXXXX". */
static int64_t step_of_path(const char *path) {
    const char *s = strrchr(path, '-');
    return s ? atoll(s + 1) : -1;
}

/* The temporary directory of an interrupted save in dir, if any: its path into buf. */
static bool find_tmp(const char *dir, char *buf, size_t size) {
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    while (d && !found && (de = readdir(d)))
        if (!strncmp(de->d_name, ".step-", 6) && strstr(de->d_name, ".tmp")) {
            snprintf(buf, size, "%s/%s", dir, de->d_name);
            found = true;
        }
    if (d) closedir(d);
    return found;
}

/* Runs `fsdp-ckpt verify arg`; returns its exit status, its output in out. */
static int tool_verify(const char *arg, char *out, size_t size) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' 2>&1", FSDP_CKPT_EXE, arg);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, size - 1, p);
    out[got] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

typedef struct phases {
    int before, writing, marked, committed, finished;
} phases;

/* After a kill: the newest committed checkpoint is complete, verifies, holds the values of its
 * step and loads at another layout; an interrupted save's directory is never taken. Returns the
 * newest step (-1 on failure). */
static int64_t check_after_kill(const char *root, const char *dir, const char *ref, int64_t prev,
                                int64_t target, phases *ph) {
    char *path = ckpt_test_latest(dir), tmp[700], want[700], out[4096], scratch[700];
    if (!path) return -1;
    int64_t step = step_of_path(path);
    CU_ASSERT_TRUE(step >= prev && step >= 1);
    FSDP_TEST_OK(ckpt_test_verify(path));
    fsdp_ckpt *ck;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), path, &ck));
    CU_ASSERT_EQUAL(fsdp_ckpt_step(ck), step);
    CU_ASSERT_EQUAL(fsdp_ckpt_optim_steps(ck), step); /* Adam steps once per training step */
    fsdp_ckpt_close(ck);
    snprintf(want, sizeof want, "%s/step-%08lld", ref, (long long)step);
    CU_ASSERT_TRUE(ckpt_test_same(path, want, -1, 0, "after the kill"));
    /* Loaded at one rank and saved again: the same values. */
    snprintf(scratch, sizeof scratch, "%s/reload", root);
    ckpt_test_remove_tree(scratch);
    FSDP_TEST_OK(ckpt_test_run_job(&one_rank, OPT_ADAM, path, scratch, step, 0));
    char *again = ckpt_test_latest(scratch);
    CU_ASSERT_TRUE(ckpt_test_same(again, want, -1, 0, "loaded at 1x1"));
    free(again);
    /* What the tool's verify of the run directory takes: the same committed checkpoint. */
    CU_ASSERT_EQUAL(tool_verify(dir, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "ok: "));
    bool has_tmp = find_tmp(dir, tmp, sizeof tmp);
    if (has_tmp) {
        char marker[760];
        snprintf(marker, sizeof marker, "%s/commit", tmp);
        bool marked = access(marker, F_OK) == 0;
        marked ? ph->marked++ : ph->writing++;
        CU_ASSERT_TRUE(strcmp(tmp, path) != 0);
        if (!marked) { /* never opened, by the library or the tool */
            fsdp_ckpt *bad = NULL;
            FSDP_TEST_FAILS(fsdp_ckpt_open(fsdp_test_ctx(), tmp, &bad), FSDP_ERR_NOT_FOUND,
                            "no commit marker");
            CU_ASSERT_EQUAL(tool_verify(tmp, out, sizeof out), 1);
            CU_ASSERT_PTR_NOT_NULL(strstr(out, "commit"));
        }
    } else {
        step >= target ? ph->committed++ : ph->before++;
    }
    free(path);
    return step;
}

static void test_sigkill_during_save(void) {
    char *root = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    char ref[600], dir[600], scratch[600];
    snprintf(ref, sizeof ref, "%s/ref", root);
    snprintf(dir, sizeof dir, "%s/run", root);
    snprintf(scratch, sizeof scratch, "%s/async-timing", root);
    /* The uninterrupted run, saving every step, and one save's period, sync and async. */
    ckpt_job ref_job = {.each_step = true,
                        .keep = REF_STEPS + 1,
                        .l = &layout,
                        .opt = OPT_ADAM,
                        .save = ref,
                        .steps = REF_STEPS};
    double period[2];
    period[0] = timed_run(&ref_job);
    ckpt_job async_job = {
        .async = true, .l = &layout, .opt = OPT_ADAM, .save = scratch, .steps = 8};
    period[1] = timed_run(&async_job);
    CU_ASSERT_FATAL(period[0] > 0 && period[1] > 0);
    const char *env = getenv("FSDP_CRASH_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : 14, rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    printf("\n  save period: sync %.1f ms, async %.1f ms; seed %llu (FSDP_CRASH_SEED)\n",
           1e3 * period[0], 1e3 * period[1], (unsigned long long)seed);
    phases ph = {0};
    int64_t step = 0;
    for (int i = 0; i < KILLS; i++) {
        bool async = i % 2 == 1;
        char *load = step > 0 ? ckpt_test_latest(dir) : NULL;
        ckpt_job jb = {.async = async,
                       .each_step = !async,
                       .keep = 3,
                       .l = &layout,
                       .opt = OPT_ADAM,
                       .load = load,
                       .save = dir,
                       .first_step = step,
                       .steps = CHILD_STEPS};
        int fd;
        pid_t pid = start_child(&jb, &fd);
        CU_ASSERT_FATAL(pid > 0);
        save_note note = {.step = -1};
        while (note.step < step + TARGET && next_note(fd, &note)) {
        }
        CU_ASSERT_EQUAL(note.step, step + TARGET);
        double delay = WINDOW * period[async] * (double)(rng_next(&rng) >> 11) * 0x1p-53;
        double at = note.t + delay;
        struct timespec ts = {.tv_sec = (time_t)at,
                              .tv_nsec = (long)((at - (double)(time_t)at) * 1e9)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        kill(pid, SIGKILL);
        close(fd);
        bool killed = false;
        CU_ASSERT_TRUE_FATAL(reap(pid, &killed));
        if (!killed) ph.finished++;
        int64_t next = check_after_kill(root, dir, ref, step, step + TARGET, &ph);
        printf("  kill %2d (%s, %5.1f ms into the save of step %lld): newest step %lld\n", i + 1,
               async ? "async" : "sync ", 1e3 * delay, (long long)(step + TARGET), (long long)next);
        free(load);
        CU_ASSERT_TRUE_FATAL(next >= step);
        step = next;
    }
    printf("  kills: %d before the save began, %d while writing, %d after the marker, %d after "
           "the commit (%d of them after the child had exited)\n",
           ph.before, ph.writing, ph.marked, ph.committed, ph.finished);
    CU_ASSERT_TRUE(ph.writing + ph.marked >= 1); /* some kills did land inside a save */
    /* A run after the last kill resumes, and its save removes the interrupted one's directory. */
    char *load = ckpt_test_latest(dir), tmp[700];
    FSDP_TEST_OK(ckpt_test_run_async(false, &layout, OPT_ADAM, load, dir, step, 1));
    CU_ASSERT_FALSE(find_tmp(dir, tmp, sizeof tmp));
    char *last = ckpt_test_latest(dir), want[700];
    snprintf(want, sizeof want, "%s/step-%08lld", ref, (long long)step + 1);
    CU_ASSERT_TRUE(ckpt_test_same(last, want, -1, 0, "resumed after the last kill"));
    free(last);
    free(load);
    ckpt_test_remove_tree(root);
    free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"sigkill_during_save", test_sigkill_during_save},
    };
    return fsdp_test_run(argc, argv, "ckpt_crash", cases, sizeof cases / sizeof cases[0]);
}

/* test_train_faults.c: fsdp-train when the machine or the run's own numbers get in the way. The
 * binary (FSDP_TRAIN_EXE) under a file size limit (a disk that fills while a checkpoint is
 * written), with one rank's open() never answered (a rank thread stuck inside HDF5), on a
 * checkpoint directory another run holds or that it cannot write: each ends by itself with exit
 * status 1 and a message that says what happened (no signal 11, no hang, no HDF5 text). And
 * train_run with NaN parameters that a ReLU keeps out of the loss, a diverged checkpoint resumed
 * and NaN [model] init parameters: each fails naming what is to blame. */
#define _POSIX_C_SOURCE 200809L // kill

#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_common.h" // defines: ckpt_test_tmp_root, ckpt_test_remove_tree
#include "harness.h"
#include "shell.h"        // defines: fsdp_test_shell, fsdp_test_spawn
#include "train_config.h" // defines: train_config_init, train_config_set
#include "trainer.h"      // defines: train_run

#ifndef FSDP_TRAIN_EXE
#define FSDP_TRAIN_EXE ""
#endif
#ifndef FSDP_BLOCK_OPEN_LIB
#define FSDP_BLOCK_OPEN_LIB ""
#endif

/* A library preloaded into a ThreadSanitizer program may not come first; stuck_in_hdf5 skips. */
#if defined(__SANITIZE_THREAD__)
#define FSDP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FSDP_TEST_TSAN 1
#endif
#endif

static train_config g_cfg; /* large: keep it off the stack */
static char *g_root;       /* this run's scratch directory */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The small run of test_train_ckpt: Linear(8, 16), relu, Linear(16, 16), relu, Linear(16, 4). */
static const char *const g_small[] = {
    "model.widths=8,16,16,4", "data.samples=64",        "data.batch_size=8",
    "data.teacher_widths=16", "optim.lr=0.1",           "train.log_every=4",
    "log.level=info",         "parallel.backend=local", "parallel.timeout_s=60"};
#define N_SMALL ((int)(sizeof g_small / sizeof g_small[0]))

/* "<root>/<name>", in a static ring of buffers. */
static const char *scratch(const char *name) {
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

/* `<prefix> fsdp-train --config examples/mlp.ini` with g_small and `sets` (--set options), under
 * /bin/sh; *out receives stdout and stderr (malloc'ed). Returns the exit status, -1 when it
 * ended on a signal. */
static int tool(const char *prefix, const char *sets, char **out) {
    char cmd[8192];
    int n = snprintf(cmd, sizeof cmd, "%s '%s' --config '%s/examples/mlp.ini'", prefix,
                     FSDP_TRAIN_EXE, FSDP_SOURCE_DIR);
    for (int i = 0; i < N_SMALL; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " --set %s", g_small[i]);
    snprintf(cmd + n, sizeof cmd - (size_t)n, " %s 2>&1", sets);
    int status = fsdp_test_shell(cmd, out);
    printf("\n    exit %d: %.1500s", status, *out);
    return status;
}

/* No HDF5 text reaches the reader: its error stack, or the addresses its messages carry. */
static void no_hdf5_text(const char *out) {
    CU_ASSERT_PTR_NULL(strstr(out, "HDF5-DIAG"));
    CU_ASSERT_PTR_NULL(strstr(out, "0x"));
    CU_ASSERT_PTR_NULL(strstr(out, "buf ="));
}

/* Under AddressSanitizer, no leak report: HDF5 never frees the file it could not close (H5close
 * would crash on it, so fsdp-train does not call it after a failure). */
#define NO_LEAK_CHECK "ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\""

/* A disk that fills while a checkpoint is written (here: a file size limit, which fails the
 * write with EFBIG as a full disk does with ENOSPC; and a 64 KiB tmpfs where mounting one is
 * allowed): the run fails with exit status 1 and the reason, the save named by its step, not
 * "training"; before, HDF5's exit handler crashed on the file it could not close (signal 11). */
static void test_full_disk(void) {
    if (!*FSDP_TRAIN_EXE) return;
    char sets[2048], *out = NULL;
    snprintf(sets, sizeof sets,
             "--set checkpoint.dir='%s' --set checkpoint.every=2 --set train.steps=4 "
             "--set parallel.ranks=2",
             scratch("full"));
    int status = tool("ulimit -f 2; trap '' XFSZ; " NO_LEAK_CHECK " exec", sets, &out);
    CU_ASSERT_EQUAL(status, 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, SET("saving the checkpoint of step 2", "File too large", "(FSDP_ERR_IO)")));
    /* The way the failure came up, a hop a line, through the checkpoint's save. */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "(FSDP_ERR_IO)\n  at src/"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "\n  at src/ckpt/save.c:"));
    CU_ASSERT_PTR_NULL(strstr(out, "training:"));
    no_hdf5_text(out);
    free(out);

    const char *mnt = scratch("tmpfs");
    char cmd[2400];
    mkdir(mnt, 0700);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=64k tmpfs '%s' 2>&1", mnt);
    if (geteuid() != 0 || fsdp_test_shell(cmd, &out) != 0) {
        free(out);
        fsdp_test_skip("no tmpfs could be mounted (not root, or no CAP_SYS_ADMIN): the file size "
                       "limit stood in for a full disk");
        return;
    }
    free(out);
    snprintf(sets, sizeof sets,
             "--set checkpoint.dir='%s/ck' --set train.steps=2 --set model.widths=8,256,256,4",
             mnt);
    status = tool(NO_LEAK_CHECK " exec", sets, &out);
    CU_ASSERT_EQUAL(status, 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, SET("saving the checkpoint of step 2", "No space left on device")));
    no_hdf5_text(out);
    free(out);
    snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
    CU_ASSERT_EQUAL(fsdp_test_shell(cmd, &out), 0);
    free(out);
}

/* Rank 1's open() of its shard never returns (a preloaded library holds it, as a file system
 * that does not answer would): rank 1 stays inside an HDF5 call, holding HDF5's lock. Rank 0
 * fails when the timeout (1 s) passes, in the commit's collective or waiting for that lock; the
 * grace period (0.5 s) later fsdp-train reports rank 1 as left running and ends with exit status
 * 1. Before, the process never ended: exit waited forever in HDF5's exit handler for the lock
 * the stuck thread holds (and rank 0 could wait for it forever too). */
static void test_stuck_in_hdf5(void) {
#ifdef FSDP_TEST_TSAN
    fsdp_test_skip("a preloaded library and ThreadSanitizer do not mix");
    return;
#endif
    if (!*FSDP_TRAIN_EXE || !*FSDP_BLOCK_OPEN_LIB) return;
    char prefix[2048], sets[2048], *out = NULL;
    snprintf(prefix, sizeof prefix,
             "LD_PRELOAD='%s' FSDP_TEST_BLOCK_OPEN=.tmp/shard-00001.h5 FSDP_COMM_GRACE_MS=500 "
             "ASAN_OPTIONS=\"$ASAN_OPTIONS:verify_asan_link_order=0\" timeout -s KILL 60",
             FSDP_BLOCK_OPEN_LIB);
    snprintf(sets, sizeof sets,
             "--set checkpoint.dir='%s' --set checkpoint.every=2 --set train.steps=4 "
             "--set parallel.ranks=2 --set parallel.timeout_s=1",
             scratch("stuck"));
    double t0 = fsdp_test_now();
    int status = tool(prefix, sets, &out);
    double took = fsdp_test_now() - t0;
    printf("\n    ended after %.1f s", took);
    CU_ASSERT_EQUAL(status, 1); /* 137: killed by timeout after 60 s, the process hung */
    CU_ASSERT_TRUE(took < 30);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, SET("rank 1 has not returned from its function", "(FSDP_ERR_TIMEOUT)")));
    free(out);
}

/* Starts fsdp-train with g_small and `extra` (argv entries), its output into log. */
static pid_t start_tool(const char *const *extra, const char *log) {
    const char *argv[64];
    char sets[N_SMALL][128];
    int n = 0;
    argv[n++] = FSDP_TRAIN_EXE;
    argv[n++] = "--config";
    argv[n++] = FSDP_SOURCE_DIR "/examples/mlp.ini";
    for (int i = 0; i < N_SMALL; i++) {
        snprintf(sets[i], sizeof sets[i], "--set=%s", g_small[i]);
        argv[n++] = sets[i];
    }
    for (int i = 0; extra[i] && n < 62; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    return fsdp_test_spawn(argv, log);
}

/* Whether file holds `text`, polled every 10 ms for up to `seconds`. */
static bool wait_for_text(const char *file, const char *text, int seconds) {
    for (int i = 0; i < seconds * 100; i++) {
        char buf[4096] = "";
        FILE *f = fopen(file, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = '\0';
        if (strstr(buf, text)) return true;
        fsdp_test_sleep_ms(10);
    }
    return false;
}

/* A second run on a checkpoint directory that a running one holds is refused before it trains,
 * naming the process that holds it; before, both trained and saved into it, one replacing and
 * pruning the other's checkpoints (and failing to flush a directory the other removed). */
static void test_dir_in_use(void) {
    if (!*FSDP_TRAIN_EXE) return;
    const char *dir = scratch("shared"), *log = scratch("first.log");
    char dir_set[1200], pid_text[64], sets[1400], *out = NULL;
    snprintf(dir_set, sizeof dir_set, "--set=checkpoint.dir=%s", dir);
    pid_t pid = start_tool(SET("--set=train.steps=100000000", "--set=checkpoint.every=50",
                               "--set=train.log_every=100000", dir_set),
                           log);
    CU_ASSERT_TRUE_FATAL(pid > 0);
    snprintf(pid_text, sizeof pid_text, "process %ld on ", (long)pid);
    char lock[1200];
    snprintf(lock, sizeof lock, "%s/.lock", dir);
    bool held = wait_for_text(lock, pid_text, 120) && wait_for_text(log, "loss", 120);
    CU_ASSERT_TRUE(held);
    snprintf(sets, sizeof sets, "--set checkpoint.dir='%s' --set train.steps=8", dir);
    int status = tool("exec", sets, &out);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CU_ASSERT_EQUAL(status, 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, SET("[checkpoint] dir = ", "is in use by another run", pid_text, "(FSDP_ERR_STATE)")));
    CU_ASSERT_PTR_NULL(strstr(out, "loss"));
    free(out);
}

/* A checkpoint directory the run cannot write is refused before training (exit status 1), not
 * at the first save after training for `every` steps: here a path under a regular file, and a
 * directory without write permission when not running as root. */
static void test_dir_unwritable(void) {
    if (!*FSDP_TRAIN_EXE) return;
    const char *file = scratch("plain-file");
    FILE *f = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    char sets[1400], *out = NULL;
    snprintf(sets, sizeof sets, "--set checkpoint.dir='%s/ck' --set train.steps=8", file);
    CU_ASSERT_EQUAL(tool("exec", sets, &out), 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, SET("cannot write checkpoints into [checkpoint] dir = ", "Not a directory",
                 "(FSDP_ERR_IO)")));
    CU_ASSERT_PTR_NULL(strstr(out, "loss"));
    free(out);
    if (geteuid() == 0) {
        fsdp_test_skip("running as root, which may write any directory: only the path under a "
                       "file was tried");
        return;
    }
    const char *ro = scratch("read-only");
    mkdir(ro, 0555);
    snprintf(sets, sizeof sets, "--set checkpoint.dir='%s' --set train.steps=8", ro);
    CU_ASSERT_EQUAL(tool("exec", sets, &out), 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(out, SET("cannot write to", "Permission denied")));
    CU_ASSERT_PTR_NULL(strstr(out, "loss"));
    free(out);
    chmod(ro, 0755);
}

/* ---- what the numbers hide (train_run in this process) ---------------------------------- */

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
}

/* train_run on g_small with the overrides; the error in err. */
static fsdp_status run(const char *const *overrides, train_result *res, char *err) {
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    set("log.level=warn");
    for (int i = 0; overrides[i]; i++) set(overrides[i]);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, res, err, TRAIN_ERROR_SIZE);
    printf("\n    %s", st == FSDP_OK ? "(ok)" : err);
    return st;
}

/* tests/fixtures/train_mlp.h5 (a PyTorch state dict of g_small's model) copied to
 * <root>/<name>.h5 with `value` at element `at` of tensor `tensor`. */
static const char *poisoned_state_dict(const char *name, const char *tensor, int at, float value) {
    static char path[1200];
    snprintf(path, sizeof path, "%s/%s.h5", g_root, name);
    static const char *const names[] = {"0.weight", "0.bias",   "2.weight",
                                        "2.bias",   "4.weight", "4.bias"};
    hid_t in = H5Fopen(FSDP_FIXTURE_DIR "/train_mlp.h5", H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t out = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(in >= 0 && out >= 0);
    for (int i = 0; i < 6; i++) {
        hid_t ds = H5Dopen2(in, names[i], H5P_DEFAULT), space = H5Dget_space(ds);
        hssize_t n = H5Sget_simple_extent_npoints(space);
        float *v = malloc((size_t)n * sizeof *v);
        H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        if (strcmp(names[i], tensor) == 0) v[at] = value;
        hid_t copy =
            H5Dcreate2(out, names[i], H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(copy, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(copy);
        free(v);
        H5Sclose(space);
        H5Dclose(ds);
    }
    H5Fclose(out);
    H5Fclose(in);
    return path;
}

/* A NaN weight feeding hidden unit 3 of the first layer makes that unit's input NaN, which the
 * ReLU turns into 0: the loss stays finite and falls, and the NaN stays in the model (its
 * gradient is 0 too). The run fails naming the parameter (on 1 rank and on 2 FSDP shards);
 * before, it ended with status 0 and the NaN in the model. */
static void test_nan_params_hidden(void) {
    char init[1300], err[TRAIN_ERROR_SIZE];
    snprintf(init, sizeof init, "model.init=%s",
             poisoned_state_dict("nan_hidden", "0.weight", 3 * 8 + 5, NAN));
    train_result res;
    for (int ranks = 1; ranks <= 2; ranks++) {
        char r[32];
        snprintf(r, sizeof r, "parallel.ranks=%d", ranks);
        CU_ASSERT_EQUAL(run(SET(init, r, "train.steps=4"), &res, err), FSDP_ERR_STATE);
        CU_ASSERT_TRUE(isfinite(res.last_loss));
        CU_ASSERT_TRUE(fsdp_test_message_has(
            err, SET("after training, '0.weight' holds NaN or infinite values",
                     "though the whole-dataset loss is", "lower [optim] lr")));
    }
}

/* A loss that is not finite before the first step blames where the parameters came from: a
 * resumed checkpoint saved after its run diverged (lr 1e30: its last update overflowed the
 * outputs), or a [model] init file with a NaN bias; not "the teacher's targets", as before. */
static void test_start_blamed(void) {
    char dir_set[1200], err[TRAIN_ERROR_SIZE];
    train_result res;
    snprintf(dir_set, sizeof dir_set, "checkpoint.dir=%s", scratch("diverged"));
    CU_ASSERT_EQUAL(run(SET(dir_set, "optim.lr=1e30", "train.steps=1"), &res, err), FSDP_ERR_STATE);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("the update of step 1 diverged")));
    CU_ASSERT_EQUAL(run(SET(dir_set, "optim.lr=1e30", "train.steps=2"), &res, err), FSDP_ERR_STATE);
    CU_ASSERT_TRUE(
        fsdp_test_message_has(err, SET("the whole-dataset loss at the resumed step is",
                                       "the parameters of the checkpoint it resumed from",
                                       "step-00000001", "resume from an earlier checkpoint")));
    CU_ASSERT_PTR_NULL(strstr(err, "teacher"));

    char init[1300];
    snprintf(init, sizeof init, "model.init=%s", poisoned_state_dict("nan_bias", "4.bias", 1, NAN));
    CU_ASSERT_EQUAL(run(SET(init, "train.steps=2"), &res, err), FSDP_ERR_STATE);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("the whole-dataset loss before training is",
                                                  "the parameters of [model] init", "nan_bias.h5",
                                                  "are not finite")));
    CU_ASSERT_PTR_NULL(strstr(err, "teacher"));
}

static int setup(void) {
    g_root = ckpt_test_tmp_root();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return g_root ? 0 : 1;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"full_disk", test_full_disk},
        {"stuck_in_hdf5", test_stuck_in_hdf5},
        {"dir_in_use", test_dir_in_use},
        {"dir_unwritable", test_dir_unwritable},
        {"nan_params_hidden", test_nan_params_hidden},
        {"start_blamed", test_start_blamed},
    };
    if (setup() != 0) return 2;
    int rc =
        fsdp_test_run(argc, argv, "train_faults", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}

/* test_train_faults.c: fsdp-train (the binary, FSDP_TRAIN_EXE) when the machine gets in the
 * way: under a file size limit (a disk that fills while a checkpoint is written), and with one
 * rank's open() never answered (a rank thread stuck inside HDF5). Each ends by itself with exit
 * status 1 and a message that says what happened (no signal 11, no hang, no HDF5 text). */
#define _POSIX_C_SOURCE 200809L // posix_spawn, kill

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_common.h" // defines: ckpt_test_tmp_root, ckpt_test_remove_tree
#include "harness.h"
#include "shell.h"        // defines: fsdp_test_shell
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

static char *g_root; /* this run's scratch directory */

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
    int status = tool("ulimit -f 2; trap '' XFSZ; exec", sets, &out);
    CU_ASSERT_EQUAL(status, 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, SET("saving the checkpoint of step 2", "File too large", "(FSDP_ERR_IO)")));
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
    status = tool("exec", sets, &out);
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

static int setup(void) {
    g_root = ckpt_test_tmp_root();
    return g_root ? 0 : 1;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"full_disk", test_full_disk},
        {"stuck_in_hdf5", test_stuck_in_hdf5},
    };
    if (setup() != 0) return 2;
    int rc =
        fsdp_test_run(argc, argv, "train_faults", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}

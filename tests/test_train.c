/* test_train.c: fsdp-train's training run (train_run in tools/train_world.c, the one the tool
 * runs): examples/mlp.ini learns its teacher (loss > 10x lower); a run is deterministic and
 * independent of the context's seed, writes its metrics file and stops when the loss diverges.
 * Distributed runs: every [parallel] mode and strategy on 2 and 4 rank threads, tp 2 x dp 2,
 * uneven and empty batch slices, offload, hybrid_shard, use_orig_params and
 * sync_module_states give the single-rank run's step losses to float32 rounding; the layout
 * rules fail with messages naming the keys; and, when CTest's MPI entry asks for it,
 * `mpirun -np 2 fsdp-train` writes the local backend's losses bitwise. */
#define _XOPEN_SOURCE 700 // popen, pclose, access; posix_openpt, grantpt, unlockpt, ptsname

#include <cblas.h> // defines: openblas_get_num_threads
#include <fcntl.h> // defines: O_RDWR, O_NOCTTY, O_NONBLOCK
#include <hdf5.h>  // defines: H5Fcreate, H5Dcreate2 (data files for [data] kind = h5)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: mkfifo
#include <sys/wait.h>
#include <termios.h> // defines: tcgetattr, tcsetattr, OPOST
#include <unistd.h>

#include "harness.h"
#include "train_config.h" // defines: train_config_init, train_config_set
#include "trainer.h"      // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */

/* setup_failure_label asks for a tensor of 4 TiB: under AddressSanitizer and ThreadSanitizer
 * the allocation must fail as it does without them (NULL) instead of aborting the process. */
#if defined(__SANITIZE_ADDRESS__)
#define FSDP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FSDP_TEST_ASAN 1
#endif
#endif
#ifdef FSDP_TEST_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1";
}
#endif
#if defined(__SANITIZE_THREAD__)
#define FSDP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FSDP_TEST_TSAN 1
#endif
#endif
#ifdef FSDP_TEST_TSAN
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) {
    return "allocator_may_return_null=1";
}
#endif

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
}

static fsdp_status run(fsdp_ctx *ctx, train_result *res, char *err) {
    fsdp_status st = train_run(ctx, &g_cfg, NULL, res, err, TRAIN_ERROR_SIZE);
    if (st != FSDP_OK)
        printf("\n    train_run: %s", err);
    else
        printf("\n    %lld steps, loss %.6f -> %.6f (%.1fx lower), %.2fs", (long long)res->steps,
               res->first_loss, res->last_loss, res->first_loss / res->last_loss, res->seconds);
    return st;
}

/* examples/mlp.ini (`make train CONFIG=examples/mlp.ini`) learns its teacher. */
static void test_example_learns(void) {
#ifdef FSDP_TEST_TSAN
    fsdp_test_skip("under ThreadSanitizer: one rank, 5000 steps (minutes there)");
    return;
#endif
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_load(&g_cfg, FSDP_SOURCE_DIR "/examples/mlp.ini", err, sizeof err));
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    set("checkpoint.dir="); /* no checkpoints (test_train_ckpt's example_resumes has them) */
    FSDP_TEST_OK(run(fsdp_test_ctx(), &res, err));
    CU_ASSERT_EQUAL(res.steps, g_cfg.train.steps);
    CU_ASSERT_TRUE(isfinite(res.first_loss) && res.first_loss > 0);
    CU_ASSERT_TRUE(res.first_loss > 10 * res.last_loss);
}

/* The same config gives the same losses, bitwise, whatever seed the context was made with. */
static void test_deterministic(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result a, b, c;
    train_config_init(&g_cfg);
    set("train.steps=300");
    set("train.seed=5");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &a, err)); /* ctx seed 1234: re-initialised */
    FSDP_TEST_OK(run(fsdp_test_ctx(), &b, err));
    fsdp_ctx_options opts = train_config_ctx_options(&g_cfg);
    fsdp_ctx *ctx = NULL;
    FSDP_TEST_OK(fsdp_ctx_create(&opts, &ctx));
    FSDP_TEST_OK(run(ctx, &c, err));
    fsdp_ctx_free(ctx);
    CU_ASSERT_EQUAL(a.first_loss, b.first_loss);
    CU_ASSERT_EQUAL(a.last_loss, b.last_loss);
    CU_ASSERT_EQUAL(a.first_loss, c.first_loss);
    CU_ASSERT_EQUAL(a.last_loss, c.last_loss);
    /* another model seed starts elsewhere; another data seed is another dataset */
    set("train.seed=6");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &b, err));
    CU_ASSERT_NOT_EQUAL(a.first_loss, b.first_loss);
    set("train.seed=5");
    set("data.seed=2");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &b, err));
    CU_ASSERT_NOT_EQUAL(a.first_loss, b.first_loss);
}

/* Other shapes of run: batches larger than the dataset wrap, a linear teacher, noise,
 * GELU, Nesterov and weight decay. */
static void test_variants(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    set("train.steps=200");
    set("data.samples=10");
    set("data.batch_size=64");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &res, err));
    CU_ASSERT_TRUE(res.last_loss < res.first_loss);

    train_config_init(&g_cfg);
    set("train.steps=200");
    set("model.widths=8,16,2");
    set("model.activation=gelu");
    set("data.teacher_widths=");
    set("data.noise=0.01");
    set("optim.nesterov=true");
    set("optim.weight_decay=1e-4");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &res, err));
    CU_ASSERT_TRUE(res.last_loss < res.first_loss);
}

static void test_metrics_file(void) {
    char err[TRAIN_ERROR_SIZE] = "", path[1024], line[512], assignment[1100];
    train_result res;
    /* in folders that do not exist yet: the run makes them */
    char dir[900];
    snprintf(dir, sizeof dir, "%s/test_train_metrics/runs", FSDP_BINARY_DIR);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    remove(path);
    rmdir(dir);
    *strrchr(dir, '/') = '\0';
    rmdir(dir);
    train_config_init(&g_cfg);
    set("train.steps=250");
    set("train.log_every=100");
    snprintf(assignment, sizeof assignment, "log.metrics=%s", path);
    set(assignment);
    FSDP_TEST_OK(run(fsdp_test_ctx(), &res, err));
    FILE *f = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    const long long want[] = {100, 200, 250}; /* every log_every steps, and the last */
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        long long step = -1;
        double loss = -1, rate = -1, t = -1;
        int got = sscanf(line,
                         "{\"step\": %lld, \"loss\": %lf, \"samples_per_s\": %lf, "
                         "\"time_s\": %lf}",
                         &step, &loss, &rate, &t);
        CU_ASSERT_EQUAL(got, 4);
        if (n < 3) CU_ASSERT_EQUAL(step, want[n]);
        CU_ASSERT_TRUE(loss > 0 && rate > 0 && t >= 0);
        n++;
    }
    fclose(f);
    CU_ASSERT_EQUAL(n, 3);
    remove(path);
}

static void test_divergence_is_an_error(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    set("optim.lr=1000");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_STATE);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, (const char *const[]){"the loss became", "lower [optim] lr", NULL}));
}

/* The advice of a diverging run names what the configuration sets that can make it diverge,
 * with values and origins: lr always, weight_decay and noise only when they are used. */
static void test_divergence_advice(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    set("optim.lr=1000");
    set("log.level=warn");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_STATE);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, (const char *const[]){"the loss became", "at step",
                                   "lower [optim] lr = 1000 (--set optim.lr=1000)", NULL}));
    CU_ASSERT_PTR_NULL(strstr(err, "weight_decay"));
    CU_ASSERT_PTR_NULL(strstr(err, "noise"));
    set("optim.weight_decay=0.5");
    set("data.noise=0.25");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_STATE);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, (const char *const[]){"lower [optim] lr = 1000 (--set optim.lr=1000)",
                                   "[optim] weight_decay = 0.5 (--set optim.weight_decay=0.5)",
                                   "[data] noise = 0.25 (--set data.noise=0.25)", NULL}));
}

/* A run whose model ends with a loss that is not finite fails: the last step's update is not
 * checked by the loop, so the whole-dataset loss after training is. So is the loss before
 * training (noise that overflows float32 makes the targets infinite). */
static void test_final_loss_not_finite(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    set("train.steps=1");
    set("optim.lr=1e30");
    set("log.level=warn");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_STATE);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, (const char *const[]){"the whole-dataset loss after training is",
                                   "lower [optim] lr = 1e+30 (--set optim.lr=1e30)", NULL}));
    CU_ASSERT_EQUAL(res.steps, 1);
    CU_ASSERT_FALSE(isfinite(res.last_loss));

    train_config_init(&g_cfg);
    set("train.steps=5");
    set("data.noise=1e39");
    set("log.level=warn");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_STATE);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, (const char *const[]){"the whole-dataset loss before training is",
                                   "[data] noise = 1e+39 (--set data.noise=1e39)", NULL}));
    CU_ASSERT_EQUAL(res.steps, 0);
}

/* A failure while the ranks set up is named by what they were doing, not "training": here the
 * model's 4 TiB weight cannot be allocated. */
static void test_setup_failure_label(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    set("model.widths=8,1048576,1048576,4");
    set("data.batch_size=8");
    set("log.level=warn");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_OUT_OF_MEMORY);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(strncmp(err, "building the model: ", 20) == 0);
    CU_ASSERT_PTR_NULL(strstr(err, "training"));
    CU_ASSERT_EQUAL(res.steps, 0);
}

/* Output that cannot be written fails the run with the name of what was being written:
 * the progress stream, and the metrics file on one rank and on two (rank 0 writes it). */
static void test_write_errors(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    if (access("/dev/full", W_OK) != 0) {
        fsdp_test_skip("no /dev/full");
        return;
    }
    train_config_init(&g_cfg);
    set("train.steps=20");
    set("train.log_every=5");
    FILE *full = fopen("/dev/full", "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(full);
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, full, &res, err, sizeof err), FSDP_ERR_IO);
    fclose(full);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, (const char *const[]){"cannot write the progress", "No space left on device", NULL}));

    set("log.metrics=/dev/full");
    for (int ranks = 1; ranks <= 2; ranks++) {
        char r[32];
        snprintf(r, sizeof r, "parallel.ranks=%d", ranks);
        set(r);
        set("parallel.backend=local");
        CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                        FSDP_ERR_IO);
        printf("\n    %s", err);
        CU_ASSERT_TRUE(fsdp_test_message_has(
            err, (const char *const[]){"cannot write metrics file '/dev/full'",
                                       "[log] metrics, --set log.metrics=/dev/full",
                                       "No space left on device", NULL}));
        if (ranks == 2) CU_ASSERT_TRUE(strncmp(err, "rank 0: ", 8) == 0);
    }
}

/* ---- distributed runs ---------------------------------------------------------------- */

/* A small run: 3 Linear layers (an odd count: under tp the output Linear stays whole), 20
 * steps of SGD with momentum, every step's loss kept. */
static const char *const g_small[] = {
    "model.widths=8,16,16,4", "data.samples=64", "data.batch_size=8",
    "data.teacher_widths=16", "optim.lr=0.1",    "train.steps=20",
    "train.log_every=1",      "log.level=warn",  "parallel.backend=local",
    "parallel.timeout_s=60",  "checkpoint.dir="};
#define N_SMALL ((int)(sizeof g_small / sizeof g_small[0]))

/* train_run on g_small plus the NULL-terminated overrides; fails the test on error. */
static bool run_small(train_result *res, const char *const *overrides) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    for (int i = 0; overrides[i]; i++) set(overrides[i]);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, res, err, sizeof err);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    return st == FSDP_OK;
}

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Step losses, the whole-dataset losses before and after: |got - want| <= rtol |want|. */
static double g_worst; /* the largest relative difference seen in a case */
static bool same_run(const char *what, const train_result *got, const train_result *want,
                     double rtol) {
    bool ok = got->steps == want->steps && got->n_step_losses == want->n_step_losses &&
              got->n_step_losses > 0;
    double worst = 0;
    for (int64_t i = 0; ok && i <= got->n_step_losses + 1; i++) {
        double g = i < got->n_step_losses    ? got->step_loss[i]
                   : i == got->n_step_losses ? got->first_loss
                                             : got->last_loss;
        double w = i < got->n_step_losses    ? want->step_loss[i]
                   : i == got->n_step_losses ? want->first_loss
                                             : want->last_loss;
        double rel = fabs(g - w) / fmax(fabs(w), 1e-30);
        worst = fmax(worst, rel);
        if (!(rel <= rtol)) {
            printf("\n    %s: %s %lld is %.9g, want %.9g (rel %.2e)", what,
                   i < got->n_step_losses ? "step" : "whole-dataset loss",
                   (long long)(i < got->n_step_losses ? i + 1 : i - got->n_step_losses), g, w, rel);
            ok = false;
        }
    }
    g_worst = fmax(g_worst, worst);
    printf("\n    %-52s max rel diff %.1e", what, worst);
    return ok;
}

/* Runs g_small with the overrides on `ranks` rank threads and compares with *ref. */
static void check_layout_rtol(const train_result *ref, int ranks, const char *const *overrides,
                              int want_dp, int want_tp, double rtol) {
    char what[256] = "", r[32];
    snprintf(r, sizeof r, "parallel.ranks=%d", ranks);
    const char *all[16];
    int n = 0;
    all[n++] = r;
    for (int i = 0; overrides[i] && n < 15; i++) all[n++] = overrides[i];
    all[n] = NULL;
    train_result res;
    if (!run_small(&res, all)) return;
    for (int i = 0; i < n; i++) /* "ranks=4 tp=2 data.batch_size=5" */
        train_append(what, sizeof what, "%s%s", i ? " " : "",
                     all[i] + (strncmp(all[i], "parallel.", 9) == 0 ? 9 : 0));
    CU_ASSERT_EQUAL(res.layout.world, ranks);
    CU_ASSERT_EQUAL(res.layout.dp, want_dp);
    CU_ASSERT_EQUAL(res.layout.tp, want_tp);
    CU_ASSERT_EQUAL(res.rank, 0);
    CU_ASSERT_TRUE(same_run(what, &res, ref, rtol));
}

/* rtol 1e-5 (170 u): g_small trains with SGD, so the layouts' reordered sums (at most 16
 * terms: widths 8, 16, 16, 4, batches of 8) reach the parameters and losses in proportion, a
 * few u per step; seen at most 1.3e-6 (two samples over 6 ranks, where the empty slices add
 * zeros in another order) under OpenBLAS's Haswell, Sandybridge and Prescott kernels. */
static void check_layout(const train_result *ref, int ranks, const char *const *overrides,
                         int want_dp, int want_tp) {
    check_layout_rtol(ref, ranks, overrides, want_dp, want_tp, 1e-5);
}

static train_result g_ref; /* g_small on one rank */

static void reference(void) {
    train_result plain;
    run_small(&g_ref, SET("parallel.ranks=1"));
    /* on one rank FSDP changes nothing: the same as the plain model (replicate of one) */
    run_small(&plain, SET("parallel.ranks=1", "parallel.mode=replicate"));
    CU_ASSERT_TRUE(same_run("1 rank: fsdp against the plain model", &g_ref, &plain, 0));
    CU_ASSERT_EQUAL(g_ref.layout.world, 1);
    CU_ASSERT_EQUAL(g_ref.n_step_losses, 20);
    CU_ASSERT_TRUE(g_ref.last_loss < g_ref.first_loss);
}

/* Every mode and strategy on 2 and 4 ranks, and nested units, against one rank. */
static void test_dp_matches_one_rank(void) {
    g_worst = 0;
    reference();
    static const char *const modes[][3] = {
        {"parallel.strategy=full_shard", NULL},
        {"parallel.strategy=shard_grad_op", NULL},
        {"parallel.strategy=no_shard", NULL},
        {"parallel.mode=replicate", NULL},
        {"parallel.strategy=full_shard", "parallel.wrap=layer", NULL},
        {"parallel.strategy=shard_grad_op", "parallel.wrap=layer", NULL},
    };
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
        for (int ranks = 2; ranks <= 4; ranks += 2) check_layout(&g_ref, ranks, modes[m], ranks, 1);
    printf("\n    worst %.1e", g_worst);
}

/* Tensor parallelism: tp 2 x dp 2 under each mode, tp 4 alone, and an even number of Linear
 * layers (two Colwise/Rowwise pairs, nothing left whole). */
static void test_tp_matches_one_rank(void) {
    g_worst = 0;
    reference();
    check_layout(&g_ref, 4, SET("parallel.tp=2"), 2, 2);
    check_layout(&g_ref, 4, SET("parallel.tp=2", "parallel.wrap=layer"), 2, 2);
    check_layout(&g_ref, 4, SET("parallel.tp=2", "parallel.strategy=no_shard"), 2, 2);
    check_layout(&g_ref, 4, SET("parallel.tp=2", "parallel.mode=replicate"), 2, 2);
    check_layout(&g_ref, 4, SET("parallel.tp=4"), 1, 4);
    check_layout(&g_ref, 2, SET("parallel.tp=2", "parallel.ranks=0"), 1, 2); /* ranks 0: tp */

    train_result even;
    run_small(&even, SET("model.widths=8,16,12,16,4"));
    check_layout(&even, 4, SET("model.widths=8,16,12,16,4", "parallel.tp=2"), 2, 2);
    check_layout(&even, 4, SET("model.widths=8,16,12,16,4", "parallel.tp=4"), 1, 4);
    printf("\n    worst %.1e", g_worst);
}

/* Batches that do not split evenly: 8 samples on 3 ranks (3, 3, 2), 5 on 4 ranks (2, 2, 1
 * and an empty slice), and on 3 ranks with tp 2 (6 ranks); a dp rank without samples under tp
 * 2. */
static void test_uneven_slices(void) {
    g_worst = 0;
    reference();
    check_layout(&g_ref, 3, SET("parallel.strategy=full_shard"), 3, 1);
    check_layout(&g_ref, 3, SET("parallel.mode=replicate"), 3, 1);
    check_layout(&g_ref, 6, SET("parallel.tp=2"), 3, 2);
    train_result five;
    run_small(&five, SET("data.batch_size=5"));
    check_layout(&five, 4, SET("data.batch_size=5"), 4, 1);
    check_layout(&five, 4, SET("data.batch_size=5", "parallel.mode=replicate"), 4, 1);
    /* 2 samples in batches of 4 on dp 3 x tp 2: dp rank 2 has no samples, neither in a batch
     * (2, 2, 0) nor in the whole dataset (1, 1, 0), so its tp pair only ever all_reduces empty
     * (0, width) tensors (the local all_reduce called memcpy(dst, NULL, 0) with the scratch
     * never allocated: UBSan). */
    train_result two;
    run_small(&two, SET("data.samples=2", "data.batch_size=4"));
    check_layout(&two, 6, SET("data.samples=2", "data.batch_size=4", "parallel.tp=2"), 3, 2);
    check_layout(
        &two, 6,
        SET("data.samples=2", "data.batch_size=4", "parallel.tp=2", "parallel.mode=replicate"), 3,
        2);
    printf("\n    worst %.1e", g_worst);
}

/* FSDP's options: CPU offload, hybrid_shard (replicas chosen and given), use_orig_params,
 * sync_module_states, alone and together with tp. */
static void test_fsdp_options_match_one_rank(void) {
    g_worst = 0;
    reference();
    check_layout(&g_ref, 4, SET("parallel.offload=true"), 4, 1);
    check_layout(&g_ref, 4, SET("parallel.offload=true", "parallel.wrap=layer"), 4, 1);
    check_layout(&g_ref, 4, SET("parallel.use_orig_params=true"), 4, 1);
    check_layout(&g_ref, 4, SET("parallel.use_orig_params=true", "parallel.wrap=layer"), 4, 1);
    check_layout(&g_ref, 4, SET("parallel.sync_module_states=true", "parallel.tp=2"), 2, 2);
    check_layout(&g_ref, 2, SET("parallel.sync_module_states=true", "parallel.mode=replicate"), 2,
                 1);
    check_layout(&g_ref, 4, SET("parallel.strategy=hybrid_shard"), 4, 1);
    check_layout(&g_ref, 4, SET("parallel.strategy=hybrid_shard", "parallel.replicas=4"), 4, 1);
    check_layout(&g_ref, 4,
                 SET("parallel.strategy=hybrid_shard", "parallel.tp=2", "parallel.wrap=layer"), 2,
                 2);
    check_layout(&g_ref, 4,
                 SET("parallel.strategy=hybrid_shard", "parallel.offload=true",
                     "parallel.use_orig_params=true"),
                 4, 1);
    printf("\n    worst %.1e", g_worst);
}

/* [train] grad_accum: the batch in micro-batches under no_sync gives the single-rank,
 * one-micro-batch run's step losses to float32 rounding (the gradient is summed in another
 * order), on one rank, under every data-parallel mode and with tp, offload, use_orig_params
 * and hybrid_shard. */
static void test_grad_accum_matches(void) {
    g_worst = 0;
    reference();
    train_result one;
    for (int n = 2; n <= 8; n *= 2) {
        char ga[32];
        snprintf(ga, sizeof ga, "train.grad_accum=%d", n);
        run_small(&one, SET(ga));
        CU_ASSERT_TRUE(same_run(ga, &one, &g_ref, 1e-5));
    }
    check_layout(&g_ref, 2, SET("train.grad_accum=4"), 2, 1);
    check_layout(&g_ref, 2, SET("train.grad_accum=2", "parallel.wrap=layer"), 2, 1);
    check_layout(&g_ref, 2, SET("train.grad_accum=4", "parallel.strategy=shard_grad_op"), 2, 1);
    check_layout(&g_ref, 2, SET("train.grad_accum=2", "parallel.strategy=no_shard"), 2, 1);
    check_layout(&g_ref, 4, SET("train.grad_accum=2", "parallel.mode=replicate"), 4, 1);
    check_layout(&g_ref, 4, SET("train.grad_accum=2", "parallel.tp=2", "parallel.wrap=layer"), 2,
                 2);
    check_layout(
        &g_ref, 2,
        SET("train.grad_accum=2", "parallel.offload=true", "parallel.use_orig_params=true"), 2, 1);
    check_layout(&g_ref, 4, SET("train.grad_accum=2", "parallel.strategy=hybrid_shard"), 4, 1);
    /* 3 ranks: micro-batches of 4 split 2, 1, 1 */
    check_layout(&g_ref, 3, SET("train.grad_accum=2"), 3, 1);
    printf("\n    worst %.1e", g_worst);
}

/* The calls of each op in a metrics record's "comm_calls" (-1 when missing). */
static void comm_calls(const char *line, long long calls[5]) {
    const char *p = strstr(line, "\"comm_calls\": {");
    for (int i = 0; i < 5; i++) calls[i] = -1;
    if (p)
        sscanf(p,
               "\"comm_calls\": {\"all_gather\": %lld, \"reduce_scatter\": %lld, \"all_reduce\": "
               "%lld, \"broadcast\": %lld, \"all_to_all\": %lld}",
               &calls[0], &calls[1], &calls[2], &calls[3], &calls[4]);
}

/* g_small on 2 rank threads with the overrides, a metrics record per step: every record after
 * the first has the collectives `want` (all_gather, reduce_scatter, all_reduce, broadcast,
 * all_to_all calls), and compute and communication seconds. The first step can find the
 * parameters that the loss evaluation before it left gathered. */
static void check_step_comm(const char *const *overrides, const long long want[5]) {
    char path[1024], line[2048], assignment[1100];
    snprintf(path, sizeof path, "%s/test_train_comm.jsonl", FSDP_BINARY_DIR);
    remove(path);
    snprintf(assignment, sizeof assignment, "log.metrics=%s", path);
    const char *all[16] = {assignment, "parallel.ranks=2", "train.steps=4"};
    int n = 3;
    for (int i = 0; overrides[i] && n < 15; i++) all[n++] = overrides[i];
    all[n] = NULL;
    train_result res;
    if (!run_small(&res, all)) return;
    FILE *f = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    int records = 0;
    while (fgets(line, sizeof line, f)) {
        long long calls[5];
        double compute = -1, comm = -1;
        comm_calls(line, calls);
        const char *t = strstr(line, "\"compute_s\": ");
        CU_ASSERT_TRUE(t && sscanf(t, "\"compute_s\": %lf, \"comm_s\": %lf", &compute, &comm) == 2);
        CU_ASSERT_TRUE(compute >= 0 && comm > 0);
        if (records++ == 0) continue;
        printf("\n    %s %s: ag %lld rs %lld ar %lld bc %lld a2a %lld", overrides[0],
               overrides[1] ? overrides[1] : "", calls[0], calls[1], calls[2], calls[3], calls[4]);
        for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(calls[i], want[i]);
    }
    fclose(f);
    CU_ASSERT_EQUAL(records, 4);
    remove(path);
}

/* The collectives of a step (the metrics' comm_calls) with grad_accum: one gradient
 * reduction per step and one loss all_reduce whatever the micro-batches; FULL_SHARD gathers a
 * unit's parameters in every micro-batch's forward (and a non-root unit's again in its
 * backward), as PyTorch's no_sync does. */
static void test_grad_accum_collectives(void) {
    /* the root unit: 1 all_gather per forward, 1 reduce_scatter, the loss's all_reduce */
    check_step_comm(SET("train.grad_accum=1"), (const long long[]){1, 1, 1, 0, 0});
    check_step_comm(SET("train.grad_accum=4"), (const long long[]){4, 1, 1, 0, 0});
    /* units 0 and 2 under the root: 3 gathers in forward, 2 in backward per micro-batch */
    check_step_comm(SET("train.grad_accum=1", "parallel.wrap=layer"),
                    (const long long[]){5, 3, 1, 0, 0});
    check_step_comm(SET("train.grad_accum=4", "parallel.wrap=layer"),
                    (const long long[]){20, 3, 1, 0, 0});
    /* SHARD_GRAD_OP keeps the gathered parameters until the reduction */
    check_step_comm(SET("train.grad_accum=4", "parallel.strategy=shard_grad_op"),
                    (const long long[]){1, 1, 1, 0, 0});
    /* replicate: one bucket's all_reduce and the loss's */
    check_step_comm(SET("train.grad_accum=1", "parallel.mode=replicate"),
                    (const long long[]){0, 0, 2, 0, 0});
    check_step_comm(SET("train.grad_accum=4", "parallel.mode=replicate"),
                    (const long long[]){0, 0, 2, 0, 0});
}

/* g_small with the overrides and a metrics record per step: the collectives of step 2 (calls
 * and bytes per op, as comm_calls); *res the run. */
static bool step2_comm(const char *const *overrides, long long calls[5], long long bytes[5],
                       train_result *res) {
    char path[1024], line[2048], assignment[1100];
    snprintf(path, sizeof path, "%s/test_train_comm2.jsonl", FSDP_BINARY_DIR);
    remove(path);
    snprintf(assignment, sizeof assignment, "log.metrics=%s", path);
    const char *all[16] = {assignment};
    int n = 1;
    for (int i = 0; overrides[i] && n < 15; i++) all[n++] = overrides[i];
    all[n] = NULL;
    if (!run_small(res, all)) return false;
    FILE *f = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    bool found = fgets(line, sizeof line, f) && fgets(line, sizeof line, f);
    fclose(f);
    remove(path);
    CU_ASSERT_TRUE_FATAL(found);
    comm_calls(line, calls);
    const char *p = strstr(line, "\"comm_bytes\": {");
    for (int i = 0; i < 5; i++) bytes[i] = -1;
    CU_ASSERT_TRUE_FATAL(p != NULL);
    sscanf(p,
           "\"comm_bytes\": {\"all_gather\": %lld, \"reduce_scatter\": %lld, \"all_reduce\": "
           "%lld, \"broadcast\": %lld, \"all_to_all\": %lld}",
           &bytes[0], &bytes[1], &bytes[2], &bytes[3], &bytes[4]);
    return true;
}

/* [parallel] mixed_precision, comm_hook and bucket_mb. On dp 2 x tp 2 (FSDP per Linear) bf16
 * and f16 parameters move half the bytes in all_gather (reduce_scatter too when they reduce in
 * them; f32 with ",f32") and track the f32 run's losses: 20 SGD steps with momentum stay
 * within 1e-2 relative (bf16 keeps 8 significant bits: at most 2^-8 = 3.9e-3 relative per
 * rounding; measured below), and are not the f32 run. The bf16/fp16 comm hooks halve the
 * gradient reduction's bytes under FSDP and replicate. bucket_mb splits replicate's single
 * bucket into two. */
static void test_precision_keys(void) {
    long long c32[5], b32[5], c[5], b[5];
    train_result f32, res;
    const char *const *base = SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer");
    if (!step2_comm(base, c32, b32, &f32)) return;
    static const struct {
        const char *mp;
        bool low_reduce;
        double rtol;
    } cases[] = {{"parallel.mixed_precision=bf16", true, 1e-2},
                 {"parallel.mixed_precision=bf16,f32", false, 1e-2},
                 {"parallel.mixed_precision=f16", true, 2e-3},
                 {"parallel.mixed_precision=f16,f32", false, 2e-3},
                 {"parallel.mixed_precision=f32,bf16", true, 1e-2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *all[] = {base[0], base[1], base[2], cases[i].mp, NULL};
        if (!step2_comm(all, c, b, &res)) continue;
        bool low_params = strstr(cases[i].mp, "=f32") == NULL;
        CU_ASSERT_TRUE(same_run(cases[i].mp + 9, &res, &f32, cases[i].rtol));
        CU_ASSERT_NOT_EQUAL(res.last_loss, f32.last_loss); /* it changed something */
        for (int k = 0; k < 5; k++) CU_ASSERT_EQUAL(c[k], c32[k]);
        CU_ASSERT_EQUAL(b[0], low_params ? b32[0] / 2 : b32[0]);
        CU_ASSERT_EQUAL(b[1], cases[i].low_reduce ? b32[1] / 2 : b32[1]);
        printf(" (all_gather %lld bytes for %lld, reduce_scatter %lld for %lld)", b[0], b32[0],
               b[1], b32[1]);
    }
    /* the comm hooks: gradients reduced in half the bytes, the losses to their rounding */
    static const struct {
        bool replicate;
        const char *hook;
    } hooks[] = {{false, "parallel.comm_hook=bf16"},
                 {false, "parallel.comm_hook=fp16"},
                 {true, "parallel.comm_hook=bf16"},
                 {true, "parallel.comm_hook=fp16"}};
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
        const char *mode = hooks[i].replicate ? "parallel.mode=replicate" : "parallel.mode=fsdp";
        long long cp[5], bp[5];
        train_result ref;
        if (!step2_comm(SET("parallel.ranks=2", mode), cp, bp, &ref) ||
            !step2_comm(SET("parallel.ranks=2", mode, hooks[i].hook), c, b, &res))
            continue;
        char what[96];
        snprintf(what, sizeof what, "%s, %s", mode + 9, hooks[i].hook + 9);
        CU_ASSERT_TRUE(same_run(what, &res, &ref, 1e-2));
        CU_ASSERT_NOT_EQUAL(res.last_loss, ref.last_loss);
        /* replicate: the bucket's all_reduce (and the loss's, f32: 8 bytes); fsdp: the
         * reduce_scatter */
        int k = hooks[i].replicate ? 2 : 1;
        long long loss = hooks[i].replicate ? 8 : 0;
        CU_ASSERT_EQUAL(c[k], cp[k]);
        CU_ASSERT_EQUAL(b[k] - loss, (bp[k] - loss) / 2);
        printf(" (%s %lld bytes for %lld)", k == 2 ? "all_reduce" : "reduce_scatter", b[k], bp[k]);
    }
    /* replicate (DDP's mixed_precision): bf16 parameters, the bucket reduced in bf16 */
    if (step2_comm(SET("parallel.ranks=2", "parallel.mode=replicate"), c32, b32, &f32) &&
        step2_comm(
            SET("parallel.ranks=2", "parallel.mode=replicate", "parallel.mixed_precision=bf16"), c,
            b, &res)) {
        CU_ASSERT_TRUE(same_run("mode=replicate, mixed_precision=bf16", &res, &f32, 1e-2));
        CU_ASSERT_NOT_EQUAL(res.last_loss, f32.last_loss);
        CU_ASSERT_EQUAL(c[2], c32[2]);
        CU_ASSERT_EQUAL(b[2] - 8, (b32[2] - 8) / 2); /* the loss's all_reduce stays f32 */
        printf(" (all_reduce %lld bytes for %lld)", b[2], b32[2]);
    }
    /* bucket_mb: 0.0005 MiB (524 bytes) closes a bucket after Linear 1's weight */
    if (step2_comm(SET("parallel.ranks=2", "parallel.mode=replicate"), c32, b32, &f32) &&
        step2_comm(SET("parallel.ranks=2", "parallel.mode=replicate", "parallel.bucket_mb=0.0005"),
                   c, b, &res)) {
        CU_ASSERT_EQUAL(c32[2], 2); /* one bucket and the loss */
        CU_ASSERT_EQUAL(c[2], 3);   /* two buckets and the loss */
        CU_ASSERT_EQUAL(b[2], b32[2]);
        CU_ASSERT_TRUE(same_run("bucket_mb=0.0005", &res, &f32, 0));
    }
}

/* Runs g_small with the overrides at log.level info into a temporary file; its text into buf. */
static bool run_to_text(const char *const *overrides, char *buf, size_t size) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    set("log.level=info");
    for (int i = 0; overrides[i]; i++) set(overrides[i]);
    FILE *f = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    train_result res;
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, f, &res, err, sizeof err);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    rewind(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return st == FSDP_OK;
}

/* [log] comm_debug: the table of step 2's collectives on rank 0, once: FSDP over dp 2 x tp 2,
 * the root unit's all_gather and reduce_scatter over dp (its 1136 bytes: rank 0's tp shards of
 * the 484 parameters, padded), the Rowwise Linear 2's output all_reduce over tp in forward (4
 * samples x 16 floats; the Colwise Linear 0 needs none in backward: the model's input has no
 * gradient), and the loss's all_reduce over dp. */
static void test_comm_debug_table(void) {
    static char text[65536];
    if (!run_to_text(SET("parallel.ranks=4", "parallel.tp=2", "log.comm_debug=true"), text,
                     sizeof text))
        return;
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\nstep  1/20  loss 0.060615  lr 0.1  samples/s "));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(text, "comm_debug: the collectives of step 2 on rank 0\n"
                     "comm-debug, rank 0: 4 collectives, 2536 bytes; barriers: 0\n"
                     "op              group  phase        calls           bytes  module\n"
                     "all_gather      dp     forward          1            1136  (root)\n"
                     "all_reduce      tp     forward          1             256  2\n"
                     "reduce_scatter  dp     backward         1            1136  (root)\n"
                     "all_reduce      dp     none             1               8  -\n"
                     "step  2/20  loss "));
    CU_ASSERT_PTR_NULL(strstr(strstr(text, "comm_debug:") + 1, "comm_debug:")); /* once */
    /* counting on: the progress lines split the steps' time */
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\nstep 20/20  loss 0.016872  lr 0.1  samples/s "));
    CU_ASSERT_PTR_NOT_NULL(strstr(strstr(text, "\nstep 20/20"), "s  compute "));
    CU_ASSERT_PTR_NOT_NULL(strstr(strstr(text, "\nstep 20/20"), "s  comm "));
    /* off by default: no table, no split */
    run_to_text(SET("parallel.ranks=4", "parallel.tp=2"), text, sizeof text);
    CU_ASSERT_PTR_NULL(strstr(text, "comm-debug"));
    CU_ASSERT_PTR_NULL(strstr(text, "compute"));
}

/* The text of the lines of out (the bar's redraws, "\r\033[K" and what follows up to the next
 * one without a newline, removed) that start with "step", each cut before "samples/s" (the
 * throughput differs from run to run). */
static void step_lines(const char *out, char *buf, size_t size) {
    buf[0] = '\0';
    const char *esc = "\r\033[K";
    char *text = strdup(out), *piece = text;
    for (char *next; piece; piece = next) {
        next = strstr(piece, esc);
        if (next) *next = '\0', next += strlen(esc);
        if (!strchr(piece, '\n')) continue; /* a bar */
        for (char *line = strtok(piece, "\n"); line; line = strtok(NULL, "\n")) {
            if (strncmp(line, "step", 4) != 0) continue;
            char *cut = strstr(line, "samples/s");
            if (cut) *cut = '\0';
            train_append(buf, size, "%s\n", line);
        }
    }
    free(text);
}

/* [log] progress = bar draws a bar (step, percent, loss, samples/s, ETA) in place between the
 * log lines and takes it off before each; the log lines are those of progress = lines. The
 * default (auto) draws none on a file. */
static void test_progress_bar(void) {
    static char bar[65536], lines[65536], auto_[65536], a[8192], b[8192];
    const char *const base[] = {"train.steps=40", "train.log_every=10", NULL};
    run_to_text(SET(base[0], base[1], "log.progress=bar"), bar, sizeof bar);
    run_to_text(SET(base[0], base[1], "log.progress=lines"), lines, sizeof lines);
    run_to_text(SET(base[0], base[1]), auto_, sizeof auto_);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(bar, "\r\033[Kstep  1/40 [........................]   2%  loss "));
    CU_ASSERT_PTR_NOT_NULL(strstr(bar, "samples/s  ETA "));
    CU_ASSERT_PTR_NULL(strstr(lines, "\r"));
    CU_ASSERT_PTR_NULL(strstr(auto_, "\r"));
    step_lines(bar, a, sizeof a);
    step_lines(lines, b, sizeof b);
    printf("\n%s", a);
    CU_ASSERT_STRING_EQUAL(a, b);
    CU_ASSERT_PTR_NOT_NULL(strstr(a, "step 40/40  loss "));
    /* the bar is off its line when the run ends: the done line starts a line */
    CU_ASSERT_PTR_NOT_NULL(strstr(bar, "\r\033[Kstep 40/40  loss ")); /* cleared first */
    CU_ASSERT_PTR_NOT_NULL(strstr(bar, "\ndone: 40 steps"));
}

/* progress = auto (the default) on a terminal: the bar is drawn. The run writes to the slave
 * side of a pseudo-terminal (without output processing, so the text passes unchanged) and the
 * master side is read back; skipped where no pseudo-terminal can be opened. */
static void test_progress_bar_terminal(void) {
    static char text[65536];
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    int slave = -1;
    if (master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0)
        slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    if (slave < 0) {
        fsdp_test_skip("no pseudo-terminal");
        if (master >= 0) close(master);
        return;
    }
    struct termios raw;
    tcgetattr(slave, &raw);
    raw.c_oflag &= ~(tcflag_t)OPOST; /* no output processing: "\n" stays "\n" */
    tcsetattr(slave, TCSANOW, &raw);
    FILE *out = fdopen(slave, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    set("log.level=info");
    set("train.steps=12");
    set("train.log_every=6");
    CU_ASSERT_TRUE(isatty(fileno(out)));
    train_result res;
    FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, out, &res, err, sizeof err));
    fclose(out); /* a few lines: the terminal's buffer holds them */
    fcntl(master, F_SETFL, O_NONBLOCK);
    size_t n = 0;
    for (ssize_t got;
         n + 1 < sizeof text && (got = read(master, text + n, sizeof text - 1 - n)) > 0;)
        n += (size_t)got;
    text[n] = '\0';
    close(master);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(text, "\r\033[Kstep  1/12 [##......................]   8%  loss "));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\r\033[Kstep  6/12  loss "));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\ndone: 12 steps"));
}

/* [model] norm = rmsnorm: an RMSNorm before the MLP, the same on every layout; the TP plan
 * given by name as the default one, and another one (the first pair only); checkpointed
 * activations change no bit. */
static void test_model_keys(void) {
    g_worst = 0;
    reference();
    train_result norm, res;
    run_small(&norm, SET("model.norm=rmsnorm"));
    CU_ASSERT_NOT_EQUAL(norm.first_loss, g_ref.first_loss); /* another model */
    check_layout(&norm, 4, SET("model.norm=rmsnorm", "parallel.tp=2"), 2, 2);
    check_layout(&norm, 4, SET("model.norm=rmsnorm", "parallel.mode=replicate"), 4, 1);
    check_layout(&norm, 4,
                 SET("model.norm=rmsnorm", "parallel.tp=2", "model.tp_plan=1=colwise,3=rowwise",
                     "parallel.wrap=layer"),
                 2, 2);
    /* the default plan spelled out runs bitwise as the default */
    train_result tp, named;
    run_small(&tp, SET("parallel.ranks=4", "parallel.tp=2"));
    run_small(&named,
              SET("parallel.ranks=4", "parallel.tp=2", "model.tp_plan=0=colwise, 2=rowwise"));
    CU_ASSERT_TRUE(same_run("tp_plan 0=colwise,2=rowwise as the default", &named, &tp, 0));
    /* four Linear layers, only the first pair split (patterns): as one rank */
    train_result four;
    run_small(&four, SET("model.widths=8,16,12,16,4"));
    check_layout(
        &four, 4,
        SET("model.widths=8,16,12,16,4", "parallel.tp=2", "model.tp_plan=[0]=colwise,[2]=rowwise"),
        2, 2);
    /* activation checkpointing: bitwise the same */
    run_small(&res, SET("model.checkpoint_activations=*"));
    CU_ASSERT_TRUE(same_run("checkpoint_activations = *", &res, &g_ref, 0));
    run_small(&res, SET("model.checkpoint_activations=0,2", "parallel.ranks=4", "parallel.tp=2",
                        "parallel.wrap=layer"));
    train_result plain;
    run_small(&plain, SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"));
    CU_ASSERT_TRUE(same_run("checkpoint_activations = 0,2 on dp 2 x tp 2", &res, &plain, 0));
    run_small(&res, SET("model.checkpoint_activations=0", "model.norm=rmsnorm"));
    CU_ASSERT_TRUE(same_run("checkpoint_activations = 0 (the RMSNorm)", &res, &norm, 0));
    printf("\n    worst %.1e", g_worst);
}

/* The local backend's most rank threads, FSDP_LOCAL_MAX_RANKS (1024), train the example's
 * model: one sample per dp rank, 3 steps, against one rank. OpenBLAS aborted the process here
 * ("too many memory regions") when each rank thread ran its GEMMs with the process's BLAS
 * threads; each now gets its share, 1 on fewer than 1024 cores, and the process's count is
 * back after the run. Under ThreadSanitizer 128 rank threads. rtol 1e-4: the loss and the gradients
 * are sums of 1024 float32 terms in another order than one rank's (worst case 1024 * 2^-24 = 6.1e-5
 * relative). */
static void test_many_rank_threads(void) {
#ifdef FSDP_TEST_TSAN
    const int ranks = 128; /* TSan takes minutes for 1024 threads; 128 still share BLAS */
#else
    const int ranks = FSDP_LOCAL_MAX_RANKS;
#endif
    char samples[48], batch[48];
    snprintf(samples, sizeof samples, "data.samples=%d", ranks);
    snprintf(batch, sizeof batch, "data.batch_size=%d", ranks);
    const char *const model[] = {
        "model.widths=32,64,64,8", "data.teacher_widths=64", samples, batch,
        "train.steps=3",           "parallel.timeout_s=240", NULL};
    int blas_before = openblas_get_num_threads();
    g_worst = 0;
    train_result one;
    if (!run_small(&one, model)) return;
    const char *full_shard[16], *replicate_tp[16];
    int n = 0;
    for (; model[n]; n++) full_shard[n] = replicate_tp[n] = model[n];
    full_shard[n] = NULL;
    replicate_tp[n] = "parallel.mode=replicate";
    replicate_tp[n + 1] = "parallel.tp=2";
    replicate_tp[n + 2] = NULL;
    check_layout_rtol(&one, ranks, full_shard, ranks, 1, 1e-4);
    check_layout_rtol(&one, ranks, replicate_tp, ranks / 2, 2, 1e-4); /* dp ranks/2 x tp 2 */
    CU_ASSERT_EQUAL(openblas_get_num_threads(), blas_before);
    printf("\n    worst %.1e", g_worst);
}

/* examples/mlp-4ranks.ini is valid and, shortened, trains as its single-rank twin does. */
static void test_example_4ranks(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result four, one;
    train_config_init(&g_cfg);
    FSDP_TEST_OK(
        train_config_load(&g_cfg, FSDP_SOURCE_DIR "/examples/mlp-4ranks.ini", err, sizeof err));
    CU_ASSERT_STRING_EQUAL(g_cfg.checkpoint.dir, "runs/mlp-4ranks");
    set("checkpoint.dir="); /* test_train_ckpt's example_resumes saves and resumes */
    set("train.steps=30");
    set("log.level=warn");
    set("parallel.backend=local");
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    FSDP_TEST_OK(run(fsdp_test_ctx(), &four, err));
    CU_ASSERT_TRUE(four.layout.world == 4 && four.layout.dp == 2 && four.layout.tp == 2);
    set("parallel.ranks=1");
    set("parallel.tp=1");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &one, err));
    CU_ASSERT_TRUE(same_run("examples/mlp-4ranks.ini against 1 rank", &four, &one, 1e-5));
}

/* The split of hybrid_shard and the banner's description of a layout. */
static void test_layout(void) {
    char err[TRAIN_ERROR_SIZE] = "", text[256];
    train_layout l;
    train_config_init(&g_cfg);
    set("parallel.strategy=hybrid_shard");
    set("parallel.tp=2");
    set("parallel.backend=local");
    set("parallel.ranks=12");
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    FSDP_TEST_OK(train_layout_resolve(&g_cfg, 12, &l, err, sizeof err));
    CU_ASSERT_TRUE(l.world == 12 && l.dp == 6 && l.tp == 2 && l.replicas == 2 && l.shard == 3);
    FSDP_TEST_OK(train_layout_resolve(&g_cfg, 18, &l, err, sizeof err)); /* dp 9: 3 x 3 */
    CU_ASSERT_TRUE(l.dp == 9 && l.replicas == 3 && l.shard == 3);
    FSDP_TEST_OK(train_layout_resolve(&g_cfg, 14, &l, err, sizeof err)); /* dp 7: 7 x 1 */
    CU_ASSERT_TRUE(l.dp == 7 && l.replicas == 7 && l.shard == 1);
    set("parallel.replicas=3");
    FSDP_TEST_OK(train_layout_resolve(&g_cfg, 12, &l, err, sizeof err));
    CU_ASSERT_TRUE(l.replicas == 3 && l.shard == 2);
    set("parallel.wrap=layer");
    set("parallel.offload=true");
    train_layout_describe(&g_cfg, &l, text, sizeof text);
    printf("\n    %s", text);
    CU_ASSERT_STRING_EQUAL(text, "12 ranks (local): dp 6 x tp 2, fsdp hybrid_shard (3 replicas x "
                                 "shard 2), wrap layer, offload");
    /* ranks 0 under local is tp: one dp rank */
    train_config_init(&g_cfg);
    set("parallel.backend=local");
    set("parallel.tp=4");
    CU_ASSERT_EQUAL(train_config_world_size(&g_cfg), 4);
    set("parallel.backend=mpi");
    if (fsdp_backend_available(FSDP_BACKEND_MPI))
        CU_ASSERT_EQUAL(train_config_world_size(&g_cfg), 0); /* the job decides */
}

/* Asserts that train_config_check fails on g_small plus the overrides, naming the needles. */
static void check_fails(const char *const *overrides, const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    for (int i = 0; overrides[i]; i++) set(overrides[i]);
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, needles));
    /* train_run checks too, before it makes a world */
    train_result res;
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(res.rank, -1);
}

static void test_parallel_config_errors(void) {
    check_fails(SET("parallel.ranks=2048", "data.batch_size=2048"),
                SET("[parallel] ranks = 2048 (--set parallel.ranks=2048) asks for 2048 rank "
                    "threads, but the local backend runs at most 1024 (FSDP_LOCAL_MAX_RANKS)"));
    check_fails(SET("parallel.ranks=4", "parallel.tp=3", "model.widths=8,24,24,4"),
                SET("[parallel] tp = 3 (--set parallel.tp=3) does not divide a world of 4 ranks",
                    "[parallel] ranks = 4 (--set parallel.ranks=4)", "multiple of 3"));
    check_fails(SET("parallel.ranks=6", "parallel.tp=3"),
                SET("[parallel] tp = 3", "must divide the hidden width 16",
                    "[model] widths = 8,16,16,4 (--set model.widths=8,16,16,4)",
                    "Linear 0 (Colwise) and Linear 1 (Rowwise)"));
    check_fails(SET("parallel.ranks=2", "parallel.tp=2", "model.widths=8,4"),
                SET("needs at least two Linear layers", "set tp = 1"));
    check_fails(SET("parallel.ranks=4", "data.batch_size=3"),
                SET("[data] batch_size = 3 (--set data.batch_size=3) is smaller than the 4 "
                    "data-parallel ranks",
                    "at least 4"));
    check_fails(SET("parallel.ranks=2", "parallel.tp=2", "parallel.strategy=hybrid_shard"),
                SET("[parallel] strategy = hybrid_shard", "at least 2 data-parallel ranks",
                    "dp = world / tp = 1"));
    check_fails(SET("parallel.ranks=6", "parallel.strategy=hybrid_shard", "parallel.replicas=4"),
                SET("[parallel] replicas = 4 (--set parallel.replicas=4) does not divide the 6 "
                    "data-parallel ranks",
                    "0 to pick one"));
    check_fails(SET("parallel.ranks=4", "parallel.replicas=2"),
                SET("[parallel] replicas = 2", "is for strategy = hybrid_shard",
                    "[parallel] strategy = full_shard (default)"));
    check_fails(SET("parallel.mode=replicate", "parallel.offload=true"),
                SET("[parallel] offload = true (--set parallel.offload=true) applies to mode = "
                    "fsdp",
                    "[parallel] mode = replicate (--set parallel.mode=replicate)"));
    check_fails(SET("parallel.mode=replicate", "parallel.wrap=layer"),
                SET("[parallel] wrap = layer", "applies to mode = fsdp"));
    check_fails(SET("parallel.mode=replicate", "parallel.strategy=no_shard"),
                SET("[parallel] strategy = no_shard", "applies to mode = fsdp"));
    check_fails(
        SET("parallel.mode=replicate", "parallel.mixed_precision=f16", "parallel.comm_hook=bf16"),
        SET("[parallel] comm_hook = bf16", "[parallel] mixed_precision = f16",
            "both choose the dtype gradients are reduced in"));
    check_fails(SET("parallel.bucket_mb=1"),
                SET("[parallel] bucket_mb = 1 (--set parallel.bucket_mb=1) applies to mode = "
                    "replicate",
                    "[parallel] mode = fsdp (default)"));
    check_fails(SET("parallel.comm_hook=bf16", "parallel.mixed_precision=bf16"),
                SET("[parallel] comm_hook = bf16", "[parallel] mixed_precision = bf16",
                    "both choose the dtype gradients are reduced in", "bf16,f32"));
    if (!fsdp_backend_available(FSDP_BACKEND_MPI))
        check_fails(SET("parallel.backend=mpi"), SET("this build has no MPI backend"));

    /* bad values are caught by the parser, with the allowed ones */
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.mode=ddp", err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("one of fsdp, replicate")));
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.strategy=FULL_SHARD", err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("one of full_shard, shard_grad_op, no_shard, hybrid_shard")));
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.tp=0", err, sizeof err), FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.backend=gloo", err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("one of local, mpi, auto, nccl")));
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.mixed_precision=fp16", err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("one of none, bf16, f16, bf16,f32, f16,f32, f32,bf16, f32,f16")));
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.comm_hook=f16", err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("one of default, bf16, fp16")));
}

/* Failures on several ranks: a diverging loss stops every rank at the same step (the loss is
 * global), and rank 0's metrics file that cannot be opened fails the run with its message
 * while the other ranks, waiting for rank 0, fail at once instead of timing out. */
static void test_multi_rank_failures(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    set("parallel.ranks=4");
    set("parallel.tp=2");
    set("optim.lr=1000");
    set("train.steps=100");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_STATE);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("the loss became", "lower [optim] lr")));
    CU_ASSERT_TRUE(strncmp(err, "rank ", 5) == 0);
    CU_ASSERT_EQUAL(res.rank, 0);
    CU_ASSERT_TRUE(res.steps < 100);

    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    set("parallel.ranks=2");
    /* a folder cannot be made where a file is (a missing one is made) */
    set("log.metrics=" FSDP_BINARY_DIR "/CMakeCache.txt/metrics.jsonl");
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err), FSDP_ERR_IO);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(
        fsdp_test_message_has(err, SET("rank 0: cannot open metrics file", "CMakeCache.txt",
                                       "[log] metrics", "Not a directory")));
}

/* train_config_agree on rank threads, each with its own configuration (fsdp-train's rank
 * threads share one, so train_run never needs this; MPI processes do, see
 * mpi_config_mismatch): equal configurations pass whatever their origins; otherwise every rank
 * fails with the same message naming the first key in table order that differs, rank 0's value
 * and the first differing rank's, exactly (a double that differs in its 17th digit). */
typedef struct agree_job {
    train_config cfg[3];
    char err[3][TRAIN_ERROR_SIZE];
    fsdp_status st[3];
} agree_job;

static fsdp_status agree_rank(fsdp_ctx *ctx, int rank, void *user) {
    agree_job *job = user;
    job->st[rank] =
        train_config_agree(ctx, NULL, &job->cfg[rank], job->err[rank], TRAIN_ERROR_SIZE);
    return FSDP_OK;
}

static void agree_set(train_config *cfg, const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(cfg, assignment, err, sizeof err));
}

static void test_config_agree(void) {
    static agree_job job;
    for (int r = 0; r < 3; r++) train_config_init(&job.cfg[r]);
    agree_set(&job.cfg[1], "optim.lr=0.2"); /* the default's value, set elsewhere */
    FSDP_TEST_OK(fsdp_test_run_world(3, 20000, agree_rank, &job));
    for (int r = 0; r < 3; r++) CU_ASSERT_EQUAL(job.st[r], FSDP_OK);
    CU_ASSERT_EQUAL(train_config_hash(&job.cfg[0]), train_config_hash(&job.cfg[1]));

    agree_set(&job.cfg[2], "optim.lr=0.20000000000000004"); /* the next double after 0.2 */
    agree_set(&job.cfg[2], "train.seed=9");
    agree_set(&job.cfg[2], "log.metrics=rank2.jsonl");
    CU_ASSERT_NOT_EQUAL(train_config_hash(&job.cfg[0]), train_config_hash(&job.cfg[2]));
    FSDP_TEST_OK(fsdp_test_run_world(3, 20000, agree_rank, &job));
    printf("\n    %s", job.err[0]);
    for (int r = 0; r < 3; r++) {
        CU_ASSERT_EQUAL(job.st[r], FSDP_ERR_STATE);
        CU_ASSERT_STRING_EQUAL(job.err[r], job.err[0]);
    }
    CU_ASSERT_TRUE(fsdp_test_message_has(
        job.err[0], (const char *const[]){
                        "[optim] lr = 0.2 (default) on rank 0",
                        "but 0.20000000000000004 (--set optim.lr=0.20000000000000004) on "
                        "rank 2",
                        "(and 2 more keys differ)", "same config file and --set options", NULL}));
}

/* Under mpirun, fsdp-train with the same configuration as a local run of 2 rank threads. The
 * CTest entry test_train_mpi2 (label mpi) runs this case with FSDP_TRAIN_MPIRUN set to the
 * mpirun command for 2 processes; without it the case does nothing. */
#ifndef FSDP_TRAIN_EXE
#define FSDP_TRAIN_EXE ""
#endif

/* Runs a shell command (with 2>&1 at its end); returns its exit status (-1 when it did not
 * exit) and its output. */
static int shell(const char *command, char *output, size_t size) {
    FILE *p = popen(command, "r");
    if (!p) return -1;
    size_t n = fread(output, 1, size - 1, p);
    output[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* fsdp-train under mpirun with g_small plus the overrides; its metrics are compared with
 * train_run's losses for the same config with backend local on the same number of ranks. */
static void mpi_matches_local(const char *mpirun, int np, const char *const *overrides) {
    char cmd[4096], metrics[1024], out[8192];
    snprintf(metrics, sizeof metrics, "%s/test_train_mpi.jsonl", FSDP_BINARY_DIR);
    remove(metrics);
    snprintf(cmd, sizeof cmd, "%s '%s' --config '%s/examples/mlp.ini' --set log.metrics='%s'",
             mpirun, FSDP_TRAIN_EXE, FSDP_SOURCE_DIR, metrics);
    for (int i = 0; i < N_SMALL; i++)
        if (strncmp(g_small[i], "parallel.backend", 16) != 0)
            train_append(cmd, sizeof cmd, " --set %s", g_small[i]);
    for (int i = 0; overrides[i]; i++) train_append(cmd, sizeof cmd, " --set %s", overrides[i]);
    train_append(cmd, sizeof cmd, " 2>&1");
    printf("\n    %s", cmd);
    int status = shell(cmd, out, sizeof out);
    if (status != 0) printf("\n    exit status %d:\n%s", status, out);
    CU_ASSERT_EQUAL_FATAL(status, 0);
    /* Each process has a pseudo-terminal under mpirun: progress = auto draws no bar there. */
    CU_ASSERT_PTR_NULL(strchr(out, '\r'));
    CU_ASSERT_PTR_NULL(strstr(out, "\033["));

    train_result local;
    char ranks[32];
    snprintf(ranks, sizeof ranks, "parallel.ranks=%d", np);
    const char *all[8] = {ranks};
    int n = 1;
    for (int i = 0; overrides[i] && n < 7; i++) /* the local run has no communication thread */
        if (strcmp(overrides[i], "parallel.comm_thread=true") != 0) all[n++] = overrides[i];
    all[n] = NULL;
    if (!run_small(&local, all)) return;
    FILE *f = fopen(metrics, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    char line[512];
    int steps = 0, equal = 0;
    while (fgets(line, sizeof line, f)) {
        long long step = -1;
        double loss = -1;
        CU_ASSERT_EQUAL(sscanf(line, "{\"step\": %lld, \"loss\": %lf", &step, &loss), 2);
        CU_ASSERT_EQUAL(step, steps + 1);
        if (steps < local.n_step_losses) {
            /* a float printed with %.9g reads back to the same float: the two backends
             * compute the same bits */
            bool same = (float)loss == (float)local.step_loss[steps];
            if (!same)
                printf("\n    step %d: %.9g, want %.9g", steps + 1, loss, local.step_loss[steps]);
            CU_ASSERT_TRUE(same);
            equal += same;
        }
        steps++;
    }
    fclose(f);
    remove(metrics);
    printf("\n    %d of %d step losses bitwise equal to the local backend's", equal, steps);
    CU_ASSERT_EQUAL(steps, 20);
}

/* fsdp-train's exit status: 1 for a final loss that is not finite, for stdout or a metrics file
 * that cannot be written (also --help and --version), naming what; 2 for a config that is
 * not a regular file, refused at once (it used to block or read forever). */
static void test_tool_exit_status(void) {
    char cmd[4096], base[2048], out[8192];
    if (!*FSDP_TRAIN_EXE || access("/dev/full", W_OK) != 0) {
        fsdp_test_skip("no fsdp-train or no /dev/full");
        return;
    }
    snprintf(base, sizeof base,
             "'%s' --config '%s/examples/mlp.ini' --set parallel.backend=local --set "
             "train.steps=20 --set checkpoint.dir=",
             FSDP_TRAIN_EXE, FSDP_SOURCE_DIR);
    static const struct {
        bool alone; /* args are the whole command line, without base */
        const char *args;
        const char *redirect;
        int status;
        const char *needle;
    } runs[] = {
        {false, "", "2>&1", 0, "done: 20 steps"},
        {false, "--set train.steps=1 --set optim.lr=1e30", "2>&1 >/dev/null", 1,
         "the whole-dataset loss after training is"},
        {false, "", "2>&1 >/dev/full", 1, "cannot write the progress to stdout: No space left"},
        {false, "--set log.metrics=/dev/full", "2>&1 >/dev/null", 1,
         "cannot write metrics file '/dev/full'"},
        {true, "--help", "2>&1 >/dev/full", 1, "cannot write to stdout"},
        {true, "--version", "2>&1 >/dev/full", 1, "cannot write to stdout"},
        {true, "--config /dev/zero", "2>&1", 2,
         "cannot read config '/dev/zero': not a regular file"},
        /* the keys of [model], [train] and [log] that fsdp-train's loop reads */
        {false, "--set model.norm=batchnorm", "2>&1", 2, "expected one of none, rmsnorm"},
        {false, "--set parallel.tp=2 --set model.tp_plan=0=colwise,x=rowwise", "2>&1", 2,
         "entry 2: 'x' matches no module of the model"},
        {false, "--set model.checkpoint_activations=mlp.*", "2>&1", 2,
         "pattern 'mlp.*' matches no module"},
        {false, "--set train.grad_accum=-1", "2>&1", 2, "[train] grad_accum: out of range"},
        {false, "--set log.comm_debug=2", "2>&1", 2, "[log] comm_debug: expected true or false"},
        {false, "--set log.progress=on", "2>&1", 2, "expected one of auto, bar, lines"},
        {false, "--set parallel.ranks=4096", "2>&1", 2, "the local backend runs at most 1024"},
        {false, "--set parallel.comm_thread=true", "2>&1", 2,
         "moves the mpi backend's started collectives, but [parallel] backend"},
        {false, "--set train.grad_accum=4 --set log.comm_debug=true --set log.progress=lines",
         "2>&1", 0, "comm_debug: the collectives of step 2 on rank 0\ncomm-debug, rank 0: 0"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if (runs[i].alone)
            snprintf(cmd, sizeof cmd, "timeout 60 '%s' %s %s", FSDP_TRAIN_EXE, runs[i].args,
                     runs[i].redirect);
        else
            snprintf(cmd, sizeof cmd, "timeout 60 %s %s %s", base, runs[i].args, runs[i].redirect);
        int status = shell(cmd, out, sizeof out);
        printf("\n    exit %d: %s: %s", status, runs[i].args, out);
        CU_ASSERT_EQUAL(status, runs[i].status);
        CU_ASSERT_TRUE(fsdp_test_message_has(out, (const char *const[]){runs[i].needle, NULL}));
    }
}

static void test_mpi_matches_local(void) {
    const char *mpirun = getenv("FSDP_TRAIN_MPIRUN");
    if (!mpirun || !*mpirun || !*FSDP_TRAIN_EXE) {
        fsdp_test_skip("FSDP_TRAIN_MPIRUN is not set (CTest's test_train_mpi2 sets it)");
        return;
    }
    /* the process count of the FSDP_TRAIN_MPIRUN command (CTest's entries: 2 and 4) */
    const char *np_text = getenv("FSDP_TRAIN_MPI_NP");
    int np = np_text && *np_text ? atoi(np_text) : 2;
    CU_ASSERT_TRUE_FATAL(np == 2 || np == 4);
    if (np == 2) {
        mpi_matches_local(mpirun, np, SET("parallel.wrap=layer", "log.level=info"));
        mpi_matches_local(mpirun, np, SET("parallel.tp=2", "parallel.mode=replicate"));
        /* FSDP's started gathers (backward prefetch) and gradient reductions moved by the
         * communication thread: the same bits as the rank threads' run */
        mpi_matches_local(mpirun, np, SET("parallel.wrap=layer", "parallel.comm_thread=true"));
    } else { /* (dp, tp) = (2, 2) with FSDP per Linear, and (4, 1) replicas */
        mpi_matches_local(mpirun, np, SET("parallel.tp=2", "parallel.wrap=layer"));
        mpi_matches_local(mpirun, np, SET("parallel.mode=replicate"));
    }

    /* under mpi the process count decides; a conflicting ranks is a config error (exit 2) */
    char cmd[2048], out[8192], want[160], hint[64];
    snprintf(cmd, sizeof cmd,
             "%s '%s' --config '%s/examples/mlp.ini' --set parallel.ranks=%d --set "
             "parallel.timeout_s=20 --set checkpoint.dir= 2>&1",
             mpirun, FSDP_TRAIN_EXE, FSDP_SOURCE_DIR, 2 * np);
    int status = shell(cmd, out, sizeof out);
    printf("\n    exit status %d: %s", status, out);
    CU_ASSERT_EQUAL(status, 2);
    snprintf(want, sizeof want,
             "[parallel] ranks = %d (--set parallel.ranks=%d), but mpirun started %d processes",
             2 * np, 2 * np, np);
    snprintf(hint, sizeof hint, "mpirun -np %d", 2 * np);
    CU_ASSERT_TRUE(fsdp_test_message_has(out, SET(want, hint)));
}

/* Under mpirun with another configuration on rank 1 (MPMD: `mpiexec -n 1 fsdp-train A : -n 1
 * fsdp-train B`), every process fails (exit status 1) before training and rank 0 alone names
 * the first key that differs with its value and origin on both ranks. The CTest entry
 * test_train_mpi_mismatch (label mpi) runs this case with FSDP_TRAIN_MPIEXEC (the launcher and
 * its flags) and FSDP_TRAIN_MPIEXEC_NP (its process-count flag) set; without them it does
 * nothing. */
static void test_mpi_config_mismatch(void) {
    const char *mpiexec = getenv("FSDP_TRAIN_MPIEXEC"), *np = getenv("FSDP_TRAIN_MPIEXEC_NP");
    if (!mpiexec || !*mpiexec || !np || !*np || !*FSDP_TRAIN_EXE) {
        fsdp_test_skip("FSDP_TRAIN_MPIEXEC is not set (CTest's test_train_mpi_mismatch "
                       "sets it)");
        return;
    }
    char small[2048] = "", cmd[8192], out[8192], a[1024], b[1024];
    for (int i = 0; i < N_SMALL; i++)
        if (strncmp(g_small[i], "parallel.backend", 16) != 0)
            train_append(small, sizeof small, " --set %s", g_small[i]);
    /* per-rank --set: data.batch_size */
    snprintf(cmd, sizeof cmd,
             "%s %s 1 '%s' --config '%s/examples/mlp.ini'%s --set data.batch_size=8 : %s 1 '%s' "
             "--config '%s/examples/mlp.ini'%s --set data.batch_size=16 2>&1",
             mpiexec, np, FSDP_TRAIN_EXE, FSDP_SOURCE_DIR, small, np, FSDP_TRAIN_EXE,
             FSDP_SOURCE_DIR, small);
    int status = shell(cmd, out, sizeof out);
    printf("\n    exit status %d: %s", status, out);
    CU_ASSERT_EQUAL(status, 1);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, (const char *const[]){"[data] batch_size = 8 (--set data.batch_size=8) on rank 0",
                                   "but 16 (--set data.batch_size=16) on rank 1", NULL}));
    const char *first = strstr(out, "fsdp-train:");
    CU_ASSERT_TRUE(first && !strstr(first + 1, "fsdp-train:")); /* rank 0 alone tells */

    /* per-rank config files: optim.lr and train.seed differ, lr comes first in the table */
    snprintf(a, sizeof a, "%s/test_train_rank0.ini", FSDP_BINARY_DIR);
    snprintf(b, sizeof b, "%s/test_train_rank1.ini", FSDP_BINARY_DIR);
    const char *paths[2] = {a, b}, *texts[2] = {"[optim]\nlr = 0.1\n[train]\nseed = 1\n",
                                                "[optim]\nlr = 0.05\n[train]\nseed = 2\n"};
    for (int r = 0; r < 2; r++) {
        FILE *f = fopen(paths[r], "w");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fputs(texts[r], f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd,
             "%s %s 1 '%s' --config '%s' --set train.steps=20 : %s 1 '%s' --config '%s' --set "
             "train.steps=20 2>&1",
             mpiexec, np, FSDP_TRAIN_EXE, a, np, FSDP_TRAIN_EXE, b);
    status = shell(cmd, out, sizeof out);
    printf("\n    exit status %d: %s", status, out);
    CU_ASSERT_EQUAL(status, 1);
    char want0[1200], want1[1200];
    snprintf(want0, sizeof want0, "[optim] lr = 0.1 (%s:2) on rank 0", a);
    snprintf(want1, sizeof want1, "but 0.05 (%s:2) on rank 1", b);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        out, (const char *const[]){want0, want1, "1 more key differs", NULL}));
    remove(a);
    remove(b);
}

/* ---- [data] kind = h5, classification, optimizers, the digits example --------------------- */

#define DIGITS_INI FSDP_SOURCE_DIR "/examples/digits.ini"
#define DIGITS_H5  FSDP_SOURCE_DIR "/examples/data/digits.h5"

/* Loads examples/digits.ini without checkpoints or metrics, its data file by absolute path,
 * then the overrides. */
static void load_digits(const char *const *overrides) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_load(&g_cfg, DIGITS_INI, err, sizeof err));
    set("data.path=" DIGITS_H5);
    set("checkpoint.dir=");
    set("log.metrics=");
    for (int i = 0; overrides && overrides[i]; i++) set(overrides[i]);
}

/* examples/digits.ini, the run `make train` does, classifies >= 95% of the held-out digits,
 * in well under a minute. */
static void test_digits_example(void) {
#ifdef FSDP_TEST_TSAN
    fsdp_test_skip("under ThreadSanitizer: 600 steps on 4 rank threads");
    return;
#endif
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    load_digits(NULL);
    FSDP_TEST_OK(run(fsdp_test_ctx(), &res, err));
    printf("\n    held-out accuracy %.2f%%, loss %.4f, after %lld steps in %.2fs on %d ranks",
           100 * res.eval_accuracy, res.eval_loss, (long long)res.steps, res.seconds,
           res.layout.world);
    CU_ASSERT_EQUAL(res.steps, 600);
    CU_ASSERT_EQUAL(res.layout.dp, 2);
    CU_ASSERT_EQUAL(res.layout.tp, 2);
    CU_ASSERT_TRUE(res.eval_accuracy >= 0.95);
    CU_ASSERT_TRUE(res.seconds < 60);
    CU_ASSERT_EQUAL(res.n_evals, 6);         /* every 100 steps */
    CU_ASSERT_TRUE(isfinite(res.grad_norm)); /* clip_grad_norm = 1 */
}

/* The digits configuration (AdamW, no_decay, warmup + cosine, clipping, shuffle, eval) gives
 * the single rank's step losses, held-out loss and accuracy and gradient norm at every layout,
 * to float32 rounding (rtol 1e-5); with a small clip_grad_norm that clips every step, too.
 * These 24 steps stay in the warmup (lr <= 1.4e-3), and the losses average 64 samples of 10
 * classes: seen at most 1.1e-7 (2 u) under the Haswell, Sandybridge and Prescott kernels. A
 * loss after Adam steps can still be a random draw (test_train_llama.c, RTOL): if one fails
 * here under another kernel, compare under SGD as that suite does. */
static void test_digits_layouts(void) {
    static const int layouts[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}};
    const char *clips[] = {"optim.clip_grad_norm=1", "optim.clip_grad_norm=0.05"};
    char err[TRAIN_ERROR_SIZE] = "";
    double worst = 0;
    train_result ref, res, unclipped;
    for (int c = 0; c < 2; c++) {
        for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
            char ranks[32], tp[32], what[96];
            snprintf(ranks, sizeof ranks, "parallel.ranks=%d", layouts[l][0] * layouts[l][1]);
            snprintf(tp, sizeof tp, "parallel.tp=%d", layouts[l][1]);
            load_digits(SET("train.steps=24", "train.eval_every=8", "optim.warmup_steps=6", ranks,
                            tp, clips[c]));
            train_result *r = l == 0 ? &ref : &res;
            FSDP_TEST_OK(run(fsdp_test_ctx(), r, err));
            CU_ASSERT_EQUAL(r->layout.dp, layouts[l][0]);
            CU_ASSERT_EQUAL(r->layout.tp, layouts[l][1]);
            CU_ASSERT_EQUAL(r->n_evals, 3);
            if (l == 0) continue;
            snprintf(what, sizeof what, "digits dp %d x tp %d, %s", layouts[l][0], layouts[l][1],
                     clips[c] + 6);
            g_worst = 0;
            CU_ASSERT_TRUE(same_run(what, &res, &ref, 1e-5));
            double e = fabs(res.eval_loss - ref.eval_loss) / ref.eval_loss;
            double g = fabs(res.grad_norm - ref.grad_norm) / ref.grad_norm;
            printf("; eval loss %.1e, grad_norm %.1e, accuracy %.4f / %.4f", e, g,
                   res.eval_accuracy, ref.eval_accuracy);
            CU_ASSERT_TRUE(e <= 1e-5);
            CU_ASSERT_TRUE(g <= 1e-5);
            CU_ASSERT_TRUE(fabs(res.eval_accuracy - ref.eval_accuracy) <= 1.0 / 359);
            worst = fmax(worst, fmax(g_worst, fmax(e, g)));
        }
        if (c == 1) { /* clipping every step changes the run */
            CU_ASSERT_TRUE(ref.grad_norm > 0.05);
            load_digits(SET("train.steps=24", "train.eval_every=8", "optim.warmup_steps=6",
                            "parallel.ranks=1", "parallel.tp=1", "optim.clip_grad_norm=0"));
            FSDP_TEST_OK(run(fsdp_test_ctx(), &unclipped, err));
            CU_ASSERT_TRUE(isnan(unclipped.grad_norm));
            CU_ASSERT_NOT_EQUAL(unclipped.step_loss[5], ref.step_loss[5]);
        }
    }
    printf("\n    worst relative difference over the layouts %.1e", worst);
}

/* A data file: x float32 (rows, x_cols), and y: int32 class ids i % classes (rank 1) or float32
 * (rows, y_cols) targets; bad_row >= 0 puts bad_value there (the id, or x's first column). */
typedef struct h5_spec {
    const char *x_name, *y_name;
    int64_t rows, x_cols, y_rows, y_cols; /* y_cols 0: rank 1 */
    bool y_int;
    int classes;
    int64_t bad_row;
    double bad_value;
    bool bad_in_x;
} h5_spec;

static const char *write_h5(const char *name, h5_spec sp) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/test_train_%s.h5", FSDP_BINARY_DIR, name);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    float *x = malloc((size_t)(sp.rows * sp.x_cols) * sizeof(float));
    for (int64_t i = 0; i < sp.rows * sp.x_cols; i++) x[i] = (float)(i % 7) / 7.0f;
    if (sp.bad_in_x) x[sp.bad_row * sp.x_cols] = (float)sp.bad_value;
    hsize_t xd[2] = {(hsize_t)sp.rows, (hsize_t)sp.x_cols};
    hid_t space = H5Screate_simple(2, xd, NULL);
    hid_t ds =
        H5Dcreate2(f, sp.x_name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    H5Dclose(ds);
    H5Sclose(space);
    int64_t yn = sp.y_rows * (sp.y_cols ? sp.y_cols : 1);
    hsize_t yd[2] = {(hsize_t)sp.y_rows, (hsize_t)sp.y_cols};
    space = H5Screate_simple(sp.y_cols ? 2 : 1, yd, NULL);
    if (sp.y_int) {
        int32_t *y = malloc((size_t)yn * sizeof *y);
        for (int64_t i = 0; i < yn; i++) y[i] = (int32_t)(i % sp.classes);
        if (sp.bad_row >= 0 && !sp.bad_in_x) y[sp.bad_row] = (int32_t)sp.bad_value;
        ds = H5Dcreate2(f, sp.y_name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
        free(y);
    } else {
        float *y = malloc((size_t)yn * sizeof *y);
        for (int64_t i = 0; i < yn; i++) y[i] = (float)(i % 5) / 5.0f;
        ds = H5Dcreate2(f, sp.y_name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
        free(y);
    }
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(f);
    free(x);
    return path;
}

/* A good classification file of 40 samples, 4 inputs, 3 classes. */
static h5_spec good_spec(void) {
    return (h5_spec){.x_name = "x",
                     .y_name = "y",
                     .rows = 40,
                     .x_cols = 4,
                     .y_rows = 40,
                     .y_int = true,
                     .classes = 3,
                     .bad_row = -1};
}

/* Runs the small h5 configuration on path with the overrides and expects status `want` and
 * a message naming the file and every needle. */
static void h5_run(const char *path, const char *const *overrides, fsdp_status want,
                   const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "", a[1100];
    train_result res;
    train_config_init(&g_cfg);
    set("model.widths=4,8,3");
    set("data.kind=h5");
    snprintf(a, sizeof a, "data.path=%s", path);
    set(a);
    set("data.task=classification");
    set("data.batch_size=8");
    set("data.eval_fraction=0.25");
    set("train.steps=20");
    set("parallel.ranks=2");
    for (int i = 0; overrides && overrides[i]; i++) set(overrides[i]);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err);
    if (st != FSDP_OK) printf("\n    %s", err);
    CU_ASSERT_EQUAL(st, want);
    if (want == FSDP_OK) {
        CU_ASSERT_EQUAL(res.steps, 20);
        bool classify = g_cfg.data.task == TRAIN_TASK_CLASSIFICATION;
        CU_ASSERT_TRUE(classify ? res.eval_accuracy >= 0 && res.eval_accuracy <= 1
                                : isnan(res.eval_accuracy));
        CU_ASSERT_TRUE(isfinite(res.eval_loss));
        return;
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
    CU_ASSERT_TRUE(fsdp_test_message_has(err, needles));
}

/* HDF5 data files: a good one trains; a missing dataset, widths that differ from the model's,
 * class ids out of range, non-finite values, a length mismatch, the wrong type and a missing
 * file fail before any rank starts, naming the file, the dataset and the fix. */
static void test_h5_data(void) {
    h5_spec sp = good_spec();
    h5_run(write_h5("good", sp), NULL, FSDP_OK, NULL);
    h5_run(write_h5("good", sp), SET("data.y=labels"), FSDP_ERR_CONFIG,
           SET("has no dataset 'labels' ([data] y, --set data.y=labels)", "it holds: x, y",
               "set [data] y to one of them"));
    h5_run(write_h5("good", sp), SET("model.widths=5,8,3"), FSDP_ERR_CONFIG,
           SET("dataset 'x' ([data] x) is (40, 4)", "needs (N, 5)", "first of [model] widths"));
    sp.bad_row = 7, sp.bad_value = 3;
    h5_run(write_h5("class", sp), NULL, FSDP_ERR_CONFIG,
           SET("holds class id 3 at sample 7", "outside [0, 3)", "raise the output width"));
    sp.bad_value = -1;
    h5_run(write_h5("class", sp), NULL, FSDP_ERR_CONFIG, SET("class id -1 at sample 7"));
    sp = good_spec();
    sp.bad_row = 5, sp.bad_value = NAN, sp.bad_in_x = true;
    h5_run(write_h5("nan", sp), NULL, FSDP_ERR_CONFIG,
           SET("dataset 'x' ([data] x) holds nan at sample 5, column 0", "finite"));
    sp = good_spec();
    sp.y_rows = 39;
    h5_run(write_h5("rows", sp), NULL, FSDP_ERR_CONFIG,
           SET("dataset 'y' ([data] y) is (39,)", "with N = 40 (x's)"));
    sp = good_spec();
    sp.y_int = false;
    h5_run(write_h5("float_ids", sp), NULL, FSDP_ERR_CONFIG,
           SET("dataset 'y' ([data] y) must hold integer class ids", "its type is float"));
    sp.y_cols = 2; /* regression targets of width 2 against an output width of 3 */
    h5_run(write_h5("reg", sp), SET("data.task=regression"), FSDP_ERR_CONFIG,
           SET("dataset 'y' ([data] y) is (40, 2)", "needs (N, 3)", "output width"));
    sp.y_cols = 3;
    h5_run(write_h5("reg", sp), SET("data.task=regression"), FSDP_OK, NULL);
    h5_run(write_h5("good", good_spec()), SET("data.eval_fraction=0.01"), FSDP_ERR_CONFIG,
           SET("has 40 samples", "holds out 0"));
    h5_run(FSDP_BINARY_DIR "/no-such-data.h5", NULL, FSDP_ERR_IO,
           SET("cannot read data file", "[data] path", "No such file"));
}

/* How the x of a stored_x file is stored. */
typedef enum x_storage {
    X_HALF_CHUNKS,   /* chunked by 10 rows, only the first 2 of its 4 chunks written */
    X_NEVER_WRITTEN, /* contiguous, created and never written */
    X_VIRTUAL,       /* virtual, its rows from dataset x of <name>-src.h5 */
    X_VIRTUAL_SAME,  /* virtual, from dataset x_src of the same file, half its chunks written */
} x_storage;

/* good_spec's file whose x (40, 4) is stored as `how` says; y is whole. */
static const char *stored_x(const char *name, x_storage how) {
    static char path[1024];
    char src[1100];
    snprintf(path, sizeof path, "%s/test_train_%s.h5", FSDP_BINARY_DIR, name);
    snprintf(src, sizeof src, "%s/test_train_%s-src.h5", FSDP_BINARY_DIR, name);
    h5_spec sp = good_spec();
    sp.x_name = "unused";
    write_h5(name, sp); /* y, and an x under another name */
    float x[40 * 4];
    for (int i = 0; i < 40 * 4; i++) x[i] = (float)(i % 7) / 7.0f;
    hsize_t dims[2] = {40, 4}, chunk[2] = {10, 4}, half[2] = {20, 4}, zero[2] = {0, 0};
    hid_t space = H5Screate_simple(2, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    const char *chunked = how == X_VIRTUAL_SAME ? "x_src" : "x";
    if (how == X_HALF_CHUNKS || how == X_VIRTUAL_SAME) {
        H5Pset_chunk(dcpl, 2, chunk);
        hid_t ds = H5Dcreate2(f, chunked, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        hid_t mem = H5Screate_simple(2, half, NULL), sel = H5Scopy(space);
        H5Sselect_hyperslab(sel, H5S_SELECT_SET, zero, NULL, half, NULL);
        H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, sel, H5P_DEFAULT, x);
        H5Sclose(sel);
        H5Sclose(mem);
        H5Dclose(ds);
    }
    if (how == X_NEVER_WRITTEN)
        H5Dclose(H5Dcreate2(f, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (how == X_VIRTUAL) {
        hid_t sf = H5Fcreate(src, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        hid_t ds =
            H5Dcreate2(sf, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
        H5Dclose(ds);
        H5Fclose(sf);
    }
    if (how == X_VIRTUAL || how == X_VIRTUAL_SAME) {
        H5Pclose(dcpl);
        dcpl = H5Pcreate(H5P_DATASET_CREATE);
        const char *base = strrchr(src, '/') + 1; /* found next to the file */
        H5Pset_virtual(dcpl, space, how == X_VIRTUAL ? base : ".", how == X_VIRTUAL ? "x" : "x_src",
                       space);
        H5Dclose(H5Dcreate2(f, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    }
    H5Fclose(f);
    H5Pclose(dcpl);
    H5Sclose(space);
    return path;
}

/* HDF5 reads zeros where a dataset's file stores nothing: chunks never written, a contiguous
 * dataset never written, a virtual dataset's source file that is missing or not a regular
 * file (a FIFO: opening it would wait for a writer), a virtual source with chunks missing. Each
 * is refused before any value is read (status FSDP_ERR_IO, naming the dataset and what is
 * missing); before, the run trained on the zeros and succeeded. A virtual dataset whose source
 * is there trains. */
static void test_h5_data_not_stored(void) {
    h5_run(stored_x("half", X_HALF_CHUNKS), NULL, FSDP_ERR_IO,
           SET("dataset 'x' ([data] x) has 2 of its 4 chunks in the file", "never written",
               "HDF5 would read zeros"));
    h5_run(stored_x("unwritten", X_NEVER_WRITTEN), NULL, FSDP_ERR_IO,
           SET("dataset 'x' ([data] x) was never written"));
    h5_run(stored_x("virtual", X_VIRTUAL), NULL, FSDP_OK, NULL);
    const char *path = stored_x("virtual", X_VIRTUAL);
    char src[1100];
    snprintf(src, sizeof src, "%s/test_train_virtual-src.h5", FSDP_BINARY_DIR);
    remove(src);
    h5_run(path, NULL, FSDP_ERR_IO,
           SET("dataset 'x' ([data] x) is virtual, and its source 0, dataset 'x' of file",
               "test_train_virtual-src.h5', does not exist"));
    CU_ASSERT_EQUAL(mkfifo(src, 0600), 0);
    h5_run(path, NULL, FSDP_ERR_IO, SET("test_train_virtual-src.h5', is not a regular file"));
    remove(src);
    h5_run(stored_x("virtual_same", X_VIRTUAL_SAME), NULL, FSDP_ERR_IO,
           SET("dataset 'x' ([data] x) has 2 of its 4 chunks in the file"));
}

/* A run on an HDF5 file of more training samples than [data] samples (the synthetic count,
 * 4096 by default) stops where its stream position is past 4096 and resumes: the position is
 * checked against the file's training samples (6000 rows, 4500 for training: step 8 of
 * batches of 512 ends at 4096), and the resumed steps are bitwise the uninterrupted run's. */
static void test_h5_resume_past_samples(void) {
    h5_spec sp = good_spec();
    sp.rows = sp.y_rows = 6000;
    const char *path = write_h5("large", sp);
    char data[1100], dir[1100], cleanup[1200];
    snprintf(data, sizeof data, "data.path=%s", path);
    snprintf(dir, sizeof dir, "checkpoint.dir=%s/test_train_h5_resume", FSDP_BINARY_DIR);
    snprintf(cleanup, sizeof cleanup, "rm -rf '%s/test_train_h5_resume'", FSDP_BINARY_DIR);
    CU_ASSERT_EQUAL(system(cleanup), 0);
    const char *const base[] = {
        "model.widths=4,8,3",       "data.kind=h5",        data,
        "data.task=classification", "data.batch_size=512", "data.eval_fraction=0.25",
        "parallel.ranks=2",         "log.level=warn",      "train.log_every=1"};
    train_result whole, first, rest;
    char err[TRAIN_ERROR_SIZE] = "";
    for (int run = 0; run < 3; run++) {
        train_config_init(&g_cfg);
        for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) set(base[i]);
        set(run == 1 ? "train.steps=8" : "train.steps=10");
        if (run > 0) set(dir);
        train_result *res = run == 0 ? &whole : run == 1 ? &first : &rest;
        fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, res, err, sizeof err);
        if (st != FSDP_OK) printf("\n    run %d: %s", run, err);
        CU_ASSERT_EQUAL_FATAL(st, FSDP_OK);
    }
    CU_ASSERT_EQUAL(rest.start_step, 8);
    CU_ASSERT_EQUAL_FATAL(rest.n_step_losses, 2);
    CU_ASSERT_EQUAL(rest.step_loss[0], whole.step_loss[8]);
    CU_ASSERT_EQUAL(rest.step_loss[1], whole.step_loss[9]);
    CU_ASSERT_EQUAL(system(cleanup), 0);
}

/* Shuffling draws a new order each epoch: another run than in order, the same for every seed
 * it is given twice, another for another seed. */
static void test_shuffle(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result a, b, c, d;
    load_digits(SET("train.steps=60", "parallel.ranks=1", "parallel.tp=1", "data.shuffle=false"));
    FSDP_TEST_OK(run(fsdp_test_ctx(), &a, err));
    load_digits(SET("train.steps=60", "parallel.ranks=1", "parallel.tp=1"));
    FSDP_TEST_OK(run(fsdp_test_ctx(), &b, err));
    FSDP_TEST_OK(run(fsdp_test_ctx(), &c, err));
    set("data.seed=2");
    FSDP_TEST_OK(run(fsdp_test_ctx(), &d, err));
    CU_ASSERT_NOT_EQUAL(a.step_loss[0], b.step_loss[0]);
    CU_ASSERT_EQUAL(b.step_loss[40], c.step_loss[40]);
    CU_ASSERT_EQUAL(b.last_loss, c.last_loss);
    CU_ASSERT_NOT_EQUAL(b.step_loss[0], d.step_loss[0]);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"example_learns", test_example_learns},
        {"deterministic", test_deterministic},
        {"variants", test_variants},
        {"metrics_file", test_metrics_file},
        {"divergence_is_an_error", test_divergence_is_an_error},
        {"precision_keys", test_precision_keys},
        {"divergence_advice", test_divergence_advice},
        {"final_loss_not_finite", test_final_loss_not_finite},
        {"setup_failure_label", test_setup_failure_label},
        {"write_errors", test_write_errors},
        {"dp_matches_one_rank", test_dp_matches_one_rank},
        {"tp_matches_one_rank", test_tp_matches_one_rank},
        {"uneven_slices", test_uneven_slices},
        {"fsdp_options_match_one_rank", test_fsdp_options_match_one_rank},
        {"many_rank_threads", test_many_rank_threads},
        {"grad_accum_matches", test_grad_accum_matches},
        {"grad_accum_collectives", test_grad_accum_collectives},
        {"comm_debug_table", test_comm_debug_table},
        {"progress_bar", test_progress_bar},
        {"progress_bar_terminal", test_progress_bar_terminal},
        {"model_keys", test_model_keys},
        {"example_4ranks", test_example_4ranks},
        {"layout", test_layout},
        {"parallel_config_errors", test_parallel_config_errors},
        {"multi_rank_failures", test_multi_rank_failures},
        {"config_agree", test_config_agree},
        {"tool_exit_status", test_tool_exit_status},
        {"mpi_matches_local", test_mpi_matches_local},
        {"mpi_config_mismatch", test_mpi_config_mismatch},
        {"digits_example", test_digits_example},
        {"digits_layouts", test_digits_layouts},
        {"h5_data", test_h5_data},
        {"h5_data_not_stored", test_h5_data_not_stored},
        {"shuffle", test_shuffle},
        {"h5_resume_past_samples", test_h5_resume_past_samples},
    };
    return fsdp_test_run(argc, argv, "train", cases, (int)(sizeof cases / sizeof cases[0]));
}

/* test_train_ckpt.c: fsdp-train's checkpoints (tools/train_ckpt.c through train_run, and the
 * fsdp-train binary for signals): a run stopped and resumed at the same layout ends bitwise
 * where an uninterrupted one does (parameters, optimizer state, step losses, progress lines),
 * at another layout to float32 rounding; resume = auto without a checkpoint starts at step 0;
 * another model's checkpoint and another configuration are refused naming the tensor or the
 * key; [model] init takes a PyTorch state dict's parameters; SIGKILL mid-training loses
 * nothing but the steps since the last checkpoint; SIGINT and SIGTERM save and exit 130; and,
 * when CTest's MPI entry asks for it, the same under mpirun. */
#define _POSIX_C_SOURCE 200809L // setenv, nanosleep, open_memstream, kill

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_common.h" // defines: ckpt_test_tmp_root, ckpt_test_remove_tree, ckpt_test_compare
#include "harness.h"
#include "shell.h"        // defines: fsdp_test_spawn
#include "train_config.h" // defines: train_config_init, train_config_set
#include "trainer.h"      // defines: train_run, train_stop_signal

#ifndef FSDP_TRAIN_EXE
#define FSDP_TRAIN_EXE ""
#endif

static train_config g_cfg; /* large: keep it off the stack */
static char *g_root;       /* this run's scratch directory */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A small run: Linear(8, 16), relu, Linear(16, 16), relu, Linear(16, 4) (what
 * tests/fixtures/train_mlp.* hold), SGD with momentum; the progress line every 4 steps. */
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

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
}

static void setf(const char *fmt, const char *value) {
    char a[1200];
    snprintf(a, sizeof a, fmt, value);
    set(a);
}

/* train_run on g_small, checkpoints in dir ("" for none), with the overrides; the progress
 * output in *out (malloc'ed, may be NULL), the error in err. */
static fsdp_status run_ckpt(train_result *res, const char *dir, const char *const *overrides,
                            char **out, char *err) {
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    setf("checkpoint.dir=%s", dir);
    for (int i = 0; overrides[i]; i++) set(overrides[i]);
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, f, res, err, TRAIN_ERROR_SIZE);
    fclose(f);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    if (out)
        *out = text;
    else
        free(text);
    return st;
}

/* The loss text of the progress line of step `step` in out ("" when none). */
static const char *line_loss(const char *out, int64_t step, char *buf, size_t size) {
    buf[0] = '\0';
    for (const char *p = out; p && *p;) {
        long long s = -1;
        char loss[32];
        if (sscanf(p, "step %lld/%*d loss %31s samples/s", &s, loss) == 2 && s == step)
            snprintf(buf, size, "%s", loss);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return buf;
}

static const char *step_dir(const char *dir, int64_t step) {
    static char buf[2][1100];
    static int next;
    char *b = buf[next++ % 2];
    snprintf(b, sizeof buf[0], "%.1000s/step-%08lld", dir, (long long)step);
    return b;
}

/* ---- resume ------------------------------------------------------------------------------ */

/* Ten steps uninterrupted, and five, a stop, five more resumed: the same parameters and
 * optimizer state (bitwise), step losses and progress lines (the line of step 8 averages steps
 * 5..8 across the stop). `layout` is the [parallel] of both; `extra` more overrides of the
 * interrupted run (async saves). */
static void resume_same_layout(const char *name, const char *const *layout, const char *extra) {
    char err[TRAIN_ERROR_SIZE], a_dir[1024], b_dir[1100], l1[64], l2[64];
    const char *all[32];
    train_result a, b1, b2;
    char *out_a = NULL, *out_b = NULL;
    snprintf(a_dir, sizeof a_dir, "%s", scratch(name));
    snprintf(b_dir, sizeof b_dir, "%.1000s-b", a_dir);
    int n = 0;
    for (int i = 0; layout[i]; i++) all[n++] = layout[i];
    all[n++] = "train.steps=10";
    all[n] = NULL;
    FSDP_TEST_OK(run_ckpt(&a, a_dir, all, &out_a, err));
    all[n - 1] = "train.steps=5";
    all[n++] = extra ? extra : "checkpoint.keep=0";
    all[n] = NULL;
    FSDP_TEST_OK(run_ckpt(&b1, b_dir, all, NULL, err));
    all[n - 2] = "train.steps=10";
    FSDP_TEST_OK(run_ckpt(&b2, b_dir, all, &out_b, err));
    CU_ASSERT_EQUAL(b1.steps, 5);
    CU_ASSERT_EQUAL(b2.start_step, 5);
    CU_ASSERT_EQUAL(b2.steps, 10);
    CU_ASSERT_STRING_EQUAL(b2.resumed_from, step_dir(b_dir, 5));
    CU_ASSERT_STRING_EQUAL(b2.saved, step_dir(b_dir, 10));
    char want[1200];
    snprintf(want, sizeof want, "resume: from %s at step 5 (saved by ", step_dir(b_dir, 5));
    CU_ASSERT_PTR_NOT_NULL(out_b ? strstr(out_b, want) : NULL);
    int same = 0;
    CU_ASSERT_EQUAL_FATAL(b2.n_step_losses, 5);
    for (int i = 0; i < 5; i++) same += b2.step_loss[i] == a.step_loss[5 + i];
    CU_ASSERT_EQUAL(same, 5);
    CU_ASSERT_EQUAL(b2.last_loss, a.last_loss);
    for (int64_t s = 8; s <= 10; s += 2) {
        line_loss(out_a, s, l1, sizeof l1);
        line_loss(out_b, s, l2, sizeof l2);
        CU_ASSERT_TRUE(l1[0] && strcmp(l1, l2) == 0);
        if (strcmp(l1, l2) != 0) printf("\n    step %lld: '%s' against '%s'", (long long)s, l2, l1);
    }
    double diff;
    bool bitwise;
    CU_ASSERT_TRUE(ckpt_test_compare(step_dir(a_dir, 10), step_dir(b_dir, 10), &diff, &bitwise));
    CU_ASSERT_TRUE(bitwise);
    printf("\n    %-28s %d of 5 resumed step losses, final loss, lines of steps 8 and 10 equal; "
           "checkpoints %s (max diff %.1e)",
           name, same, bitwise ? "bitwise equal" : "DIFFER", diff);
    free(out_a);
    free(out_b);
}

static void test_resume_bitwise(void) {
    resume_same_layout("one-rank", SET("parallel.ranks=1"), NULL);
    resume_same_layout("dp2-tp2", SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"),
                       NULL);
    resume_same_layout("replicate-3", SET("parallel.ranks=3", "parallel.mode=replicate"), NULL);
    /* async saves every 2 steps, keeping 2 */
    resume_same_layout("async", SET("parallel.ranks=2"), "checkpoint.async=true");
    /* AdamW (its moments in the checkpoint), no_decay groups, warmup + cosine, clipping,
     * a shuffled order and held-out evaluations. The cosine runs to [train] steps, and the
     * interrupted run stops by train.steps = 5: with 4 warmup steps its 5 updates have the
     * uninterrupted run's lrs (step 5 is the cosine's first, at lr whatever the length), and
     * the resumed steps 6..10 follow the 10-step cosine. The stop also falls inside an
     * epoch (48 training samples, batches of 8) and between evaluations. */
    resume_same_layout("adamw-cosine-dp2-tp2",
                       SET("parallel.ranks=4", "parallel.tp=2", "parallel.use_orig_params=true",
                           "optim.name=adamw", "optim.lr=0.01", "optim.weight_decay=0.1",
                           "optim.no_decay=*.bias", "optim.schedule=cosine", "optim.warmup_steps=4",
                           "optim.min_lr=0.001", "optim.clip_grad_norm=0.5", "data.shuffle=true",
                           "data.eval_fraction=0.5", "train.eval_every=3"),
                       NULL);
    resume_same_layout("adam-warmup-replicate",
                       SET("parallel.ranks=2", "parallel.mode=replicate", "optim.name=adam",
                           "optim.lr=0.01", "optim.betas=0.8,0.99", "optim.weight_decay=0.01",
                           "optim.schedule=warmup", "optim.warmup_steps=6"),
                       NULL);
}

/* The whole global tensor `name` of the checkpoint at dir, malloc'ed; *n its elements. */
static float *read_tensor(const char *dir, const char *name, int64_t *n) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *c = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, dir, &c));
    int t = c ? fsdp_ckpt_find(c, name) : -1;
    CU_ASSERT_TRUE(t >= 0);
    fsdp_ckpt_tensor info;
    float *v = NULL;
    *n = 0;
    if (t >= 0 && fsdp_ckpt_tensor_get(ctx, c, t, &info) == FSDP_OK) {
        fsdp_state_region all = {.ndim = info.ndim};
        *n = 1;
        for (int d = 0; d < info.ndim; d++) all.count[d] = info.shape[d], *n *= info.shape[d];
        v = malloc((size_t)*n * sizeof(float) + 1);
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, c, t, &all, v));
    }
    fsdp_ckpt_close(c);
    return v;
}

/* Whether tensor `name` is bitwise the same in the step-1 checkpoints of dirs a and b. */
static bool same_tensor(const char *a, const char *b, const char *name) {
    int64_t na, nb;
    float *va = read_tensor(step_dir(a, 1), name, &na);
    float *vb = read_tensor(step_dir(b, 1), name, &nb);
    bool same = va && vb && na == nb && memcmp(va, vb, (size_t)na * sizeof(float)) == 0;
    free(va);
    free(vb);
    return same;
}

/* [optim] no_decay: one AdamW step with weight_decay 0.5 and no_decay = *.bias leaves every
 * bias where the step without decay puts it (bitwise: p * (1 - lr * 0) is p) and every weight
 * where the step with decay for all puts it; under FSDP (use_orig_params) on 2 ranks and under
 * replicate with SGD. */
static void test_no_decay(void) {
    static const char *const modes[][4] = {
        {"parallel.use_orig_params=true", "optim.name=adamw", "optim.lr=0.01", NULL},
        {"parallel.mode=replicate", "optim.name=sgd", "optim.momentum=0", NULL},
    };
    static const char *const params[] = {"0.weight", "0.bias",   "2.weight",
                                         "2.bias",   "4.weight", "4.bias"};
    for (int m = 0; m < 2; m++) {
        char err[TRAIN_ERROR_SIZE], dirs[3][1024];
        const char *decay[3] = {"optim.weight_decay=0.5", "optim.weight_decay=0",
                                "optim.weight_decay=0.5"};
        for (int r = 0; r < 3; r++) {
            char name[64];
            snprintf(name, sizeof name, "no-decay-%d-%d", m, r);
            snprintf(dirs[r], sizeof dirs[r], "%s", scratch(name));
            const char *all[12] = {"parallel.ranks=2", "train.steps=1", decay[r]};
            int n = 3;
            if (r == 0) all[n++] = "optim.no_decay=*.bias";
            for (int i = 0; modes[m][i]; i++) all[n++] = modes[m][i];
            all[n] = NULL;
            FSDP_TEST_OK(run_ckpt(&(train_result){0}, dirs[r], all, NULL, err));
        }
        int biases = 0, weights = 0;
        for (int p = 0; p < 6; p++) {
            bool bias = strstr(params[p], "bias") != NULL;
            bool like_none = same_tensor(dirs[0], dirs[1], params[p]);
            bool like_all = same_tensor(dirs[0], dirs[2], params[p]);
            if (bias && like_none && !like_all) biases++;
            if (!bias && like_all && !like_none) weights++;
        }
        printf("\n    %s: %d of 3 biases undecayed, %d of 3 weights decayed", modes[m][1], biases,
               weights);
        CU_ASSERT_EQUAL(biases, 3);
        CU_ASSERT_EQUAL(weights, 3);
    }
}

/* Five steps at one layout, five more at another: the uninterrupted run's losses and
 * parameters to float32 rounding. `common` (may be NULL): overrides of all three runs; adam_lr:
 * the largest lr of an Adam or AdamW run, 0 for SGD.
 * The bounds: the losses within 1e-5 relative, every tensor within 1e-5 (values of order 1).
 * The layouts reorder sums of at most 16 terms (widths 8, 16, 16, 4; batches of 8), a few u of
 * each gradient, which SGD carries into the parameters in proportion: ~10 u = 6e-7 after 10
 * steps, and 1e-5 is 170 u; seen at most 2.1e-7 (losses) and 6e-8 (tensors) under the Haswell,
 * Sandybridge and Prescott kernels. Under Adam the parameters follow the statistical rule of
 * tests/numerics.h with that bulk: at most 2 elements beyond it, each within twice Adam's
 * largest move in 10 steps of adam_lr (a gradient that passes near zero). */
static void resume_cross_common(const char *name, const char *const *first,
                                const char *const *second, const char *const *common,
                                double adam_lr, double *worst) {
    char err[TRAIN_ERROR_SIZE], ref_dir[1100], dir[1024];
    train_result ref, r1, r2;
    snprintf(dir, sizeof dir, "%s", scratch(name));
    snprintf(ref_dir, sizeof ref_dir, "%.1000s-ref", dir);
    const char *all[32];
    int n = 0, c = 0;
    for (int i = 0; common && common[i]; i++) all[c++] = common[i];
    all[c] = "train.steps=10";
    all[c + 1] = NULL;
    FSDP_TEST_OK(run_ckpt(&ref, ref_dir, all, NULL, err));
    n = c;
    all[n++] = "train.steps=5";
    for (int i = 0; first[i]; i++) all[n++] = first[i];
    all[n] = NULL;
    FSDP_TEST_OK(run_ckpt(&r1, dir, all, NULL, err));
    n = c;
    all[n++] = "train.steps=10";
    for (int i = 0; second[i]; i++) all[n++] = second[i];
    all[n] = NULL;
    FSDP_TEST_OK(run_ckpt(&r2, dir, all, NULL, err));
    CU_ASSERT_EQUAL(r2.start_step, 5);
    double rel = fabs(r2.last_loss - ref.last_loss) / ref.last_loss;
    for (int i = 0; i < 5 && i < r2.n_step_losses; i++)
        rel = fmax(rel, fabs(r2.step_loss[i] - ref.step_loss[5 + i]) / ref.step_loss[5 + i]);
    double diff;
    bool bitwise;
    CU_ASSERT_TRUE(ckpt_test_compare(step_dir(ref_dir, 10), step_dir(dir, 10), &diff, &bitwise));
    printf("\n    %-40s losses max rel diff %.1e, tensors max abs diff %.1e", name, rel, diff);
    CU_ASSERT_TRUE(rel <= 1e-5);
    if (adam_lr > 0) {
        fsdp_test_adam_check rule = {.bulk = 1e-5,
                                     .move =
                                         2.0 * adam_lr * fsdp_test_adam_max_move(0.9, 0.999, 10),
                                     .max_exceptions = 2};
        CU_ASSERT_TRUE(
            ckpt_test_same_adam(step_dir(dir, 10), step_dir(ref_dir, 10), &rule, 0, 1e-5, name));
    } else {
        CU_ASSERT_TRUE(diff <= 1e-5);
    }
    *worst = fmax(*worst, diff);
}

static void resume_cross(const char *name, const char *const *first, const char *const *second,
                         double *worst) {
    resume_cross_common(name, first, second, NULL, 0, worst);
}

static void test_resume_other_layout(void) {
    double worst = 0;
    resume_cross("1 rank -> dp 2 x tp 2, wrap layer", SET("parallel.ranks=1"),
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"), &worst);
    resume_cross("dp 2 shard_grad_op -> 1 rank",
                 SET("parallel.ranks=2", "parallel.strategy=shard_grad_op"),
                 SET("parallel.ranks=1"), &worst);
    resume_cross("dp 4 replicate -> hybrid_shard 2 x 2",
                 SET("parallel.ranks=4", "parallel.mode=replicate"),
                 SET("parallel.ranks=4", "parallel.strategy=hybrid_shard"), &worst);
    resume_cross("tp 2 no_shard -> dp 3 offload",
                 SET("parallel.ranks=2", "parallel.tp=2", "parallel.strategy=no_shard"),
                 SET("parallel.ranks=3", "parallel.offload=true"), &worst);
    /* AdamW's moments, a cosine schedule and a shuffled order move across layouts too (the
     * stop at train.steps = 5 is the cosine's first step, whose lr does not depend on steps) */
    resume_cross_common("adamw cosine: dp 2 x tp 2 -> dp 3",
                        SET("parallel.ranks=4", "parallel.tp=2"), SET("parallel.ranks=3"),
                        SET("parallel.use_orig_params=true", "optim.name=adamw", "optim.lr=0.01",
                            "optim.weight_decay=0.1", "optim.no_decay=*.bias",
                            "optim.schedule=cosine", "optim.warmup_steps=4",
                            "optim.clip_grad_norm=0.5", "data.shuffle=true"),
                        0.01, &worst);
    printf("\n    worst tensor difference %.1e", worst);
}

/* resume = auto in a directory without a checkpoint starts at step 0 and says so; none
 * ignores the checkpoints there; a path resumes from it. */
static void test_resume_auto_fresh(void) {
    char err[TRAIN_ERROR_SIZE], want[1200];
    char *out = NULL;
    train_result r;
    const char *dir = scratch("fresh");
    FSDP_TEST_OK(run_ckpt(&r, dir, SET("train.steps=3"), &out, err));
    snprintf(want, sizeof want, "resume: no checkpoint in '%s' yet: starting from step 0", dir);
    printf("\n    %s", want);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
    CU_ASSERT_EQUAL(r.start_step, 0);
    CU_ASSERT_STRING_EQUAL(r.resumed_from, "");
    CU_ASSERT_EQUAL(access(step_dir(dir, 3), F_OK), 0);
    free(out);
    FSDP_TEST_OK(run_ckpt(&r, dir, SET("train.steps=4", "checkpoint.resume=none"), &out, err));
    CU_ASSERT_EQUAL(r.start_step, 0);
    CU_ASSERT_PTR_NULL(strstr(out, "resume:"));
    free(out);
    char path[1200];
    snprintf(path, sizeof path, "checkpoint.resume=%s", step_dir(dir, 3));
    FSDP_TEST_OK(run_ckpt(&r, "", SET("train.steps=4", path), &out, err));
    CU_ASSERT_EQUAL(r.start_step, 3);
    CU_ASSERT_EQUAL(r.steps, 4);
    free(out);
    /* a run already at its last step trains nothing and says so */
    FSDP_TEST_OK(run_ckpt(&r, dir, SET("train.steps=4"), &out, err));
    CU_ASSERT_EQUAL(r.start_step, 4);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "nothing to train: the run is at step 4"));
    free(out);
    CU_ASSERT_NOT_EQUAL(run_ckpt(&r, "", SET("checkpoint.resume=/no/such/checkpoint"), NULL, err),
                        FSDP_OK);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("cannot resume from [checkpoint] resume = /no/such/checkpoint")));
}

/* Another model's checkpoint (other widths) is refused naming the tensor, both shapes, the
 * key and the fix; so is another [optim] or [data] value, naming the key; and a checkpoint
 * fsdp-train did not save. */
static void test_resume_refused(void) {
    char err[TRAIN_ERROR_SIZE], key[1200];
    train_result r;
    const char *dir = scratch("refused");
    FSDP_TEST_OK(run_ckpt(&r, dir, SET("train.steps=3"), NULL, err));
    CU_ASSERT_EQUAL(run_ckpt(&r, dir, SET("train.steps=6", "model.widths=8,32,32,4"), NULL, err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("holds another model: tensor '0.weight' is (16, 8) there but (32, 8) in this "
                 "model",
                 "[model] widths = 8,32,32,4 (--set model.widths=8,32,32,4)",
                 "it was saved with widths = 8,16,16,4",
                 "set [model] widths to the checkpoint's, or start anew")));
    snprintf(key, sizeof key, "model.init=%s", step_dir(dir, 3));
    CU_ASSERT_EQUAL(run_ckpt(&r, "", SET("model.widths=8,32,32,4", key), NULL, err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("tensor '0.weight' is (16, 8) there but (32, 8)",
                                                  "or give another [model] init")));
    CU_ASSERT_EQUAL(run_ckpt(&r, dir, SET("train.steps=6", "optim.lr=0.05"), NULL, err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("it was saved with another configuration: [optim] lr = 0.05 (--set "
                 "optim.lr=0.05) here, but 0.1 (--set optim.lr=0.1) in the saved configuration",
                 "the [parallel] layout may differ")));
    CU_ASSERT_EQUAL(run_ckpt(&r, dir, SET("train.steps=6", "data.batch_size=4"), NULL, err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, SET("[data] batch_size = 4")));
    /* what does not matter to the numbers may differ: steps, seeds of the start, logging */
    FSDP_TEST_OK(
        run_ckpt(&r, dir, SET("train.steps=6", "train.seed=3", "train.log_every=1"), NULL, err));
    CU_ASSERT_EQUAL(r.start_step, 3);
    /* nor do the layout's TP plan, checkpointed activations and gradient accumulation */
    FSDP_TEST_OK(run_ckpt(&r, dir,
                          SET("train.steps=8", "parallel.ranks=2", "parallel.tp=2",
                              "model.tp_plan=0=colwise,2=rowwise", "model.checkpoint_activations=*",
                              "train.grad_accum=2"),
                          NULL, err));
    CU_ASSERT_EQUAL(r.start_step, 6);
    /* another model does */
    CU_ASSERT_EQUAL(run_ckpt(&r, dir, SET("train.steps=10", "model.norm=rmsnorm"), NULL, err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("tensor '0.weight' is (16, 8) there but (8) in this model ([model] norm = "
                 "rmsnorm (--set model.norm=rmsnorm); it was saved with norm = none); set [model] "
                 "norm to the checkpoint's")));
    /* an imported state has no loop position */
    const char *imp = scratch("imported");
    FSDP_TEST_OK(
        fsdp_ckpt_import(fsdp_test_ctx(), FSDP_FIXTURE_DIR "/train_mlp.safetensors", imp, NULL));
    snprintf(key, sizeof key, "checkpoint.resume=%s", step_dir(imp, 0));
    CU_ASSERT_NOT_EQUAL(run_ckpt(&r, "", SET(key), NULL, err), FSDP_OK);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("has no 'train.step', so fsdp-train did not save it", "set [model] init = ")));
}

/* [model] init from PyTorch state dicts (tests/fixtures/train_mlp.*, written by
 * tools/gen_import_fixture.py): the parameters are torch's bitwise (one step at lr 1e-30
 * changes no float), the same from safetensors, HDF5 and a checkpoint directory, at 1 rank and
 * at dp 2 x tp 2; the temporary import is removed; a state of other names is refused. */
static void test_init_from_pytorch(void) {
    char err[TRAIN_ERROR_SIZE], key[1200];
    train_result st, h5, dir_init, rand, tp;
    const char *tmp = scratch("tmpdir");
    mkdir(tmp, 0700);
    const char *old = getenv("TMPDIR");
    char *saved_tmpdir = old ? strdup(old) : NULL;
    setenv("TMPDIR", tmp, 1);
    const char *d = scratch("init");
    FSDP_TEST_OK(run_ckpt(&st, d,
                          SET("model.init=" FSDP_FIXTURE_DIR "/train_mlp.safetensors",
                              "train.steps=1", "optim.lr=1e-30", "optim.momentum=0"),
                          NULL, err));
    FSDP_TEST_OK(run_ckpt(
        &h5, "", SET("model.init=" FSDP_FIXTURE_DIR "/train_mlp.h5", "train.steps=1"), NULL, err));
    FSDP_TEST_OK(run_ckpt(&tp, "",
                          SET("model.init=" FSDP_FIXTURE_DIR "/train_mlp.safetensors",
                              "train.steps=1", "parallel.ranks=4", "parallel.tp=2"),
                          NULL, err));
    FSDP_TEST_OK(run_ckpt(&rand, "", SET("train.steps=1"), NULL, err));
    const char *imp = scratch("torch");
    FSDP_TEST_OK(
        fsdp_ckpt_import(fsdp_test_ctx(), FSDP_FIXTURE_DIR "/train_mlp.safetensors", imp, NULL));
    snprintf(key, sizeof key, "model.init=%s", imp); /* a directory of checkpoints */
    FSDP_TEST_OK(run_ckpt(&dir_init, "", SET(key, "train.steps=1"), NULL, err));
    /* a Hugging Face model directory: config.json (kept, not read) and model.safetensors */
    train_result hf_init;
    char hf[1024], file[1200];
    snprintf(hf, sizeof hf, "%s", scratch("hf_model"));
    mkdir(hf, 0700);
    snprintf(file, sizeof file, "%s/model.safetensors", hf);
    CU_ASSERT_EQUAL(symlink(FSDP_FIXTURE_DIR "/train_mlp.safetensors", file), 0);
    snprintf(file, sizeof file, "%s/config.json", hf);
    FILE *cf = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(cf);
    fputs("{\"model_type\": \"mlp\"}\n", cf);
    fclose(cf);
    snprintf(key, sizeof key, "model.init=%s", hf);
    FSDP_TEST_OK(run_ckpt(&hf_init, "", SET(key, "train.steps=1"), NULL, err));
    CU_ASSERT_EQUAL(st.first_loss, hf_init.first_loss);
    /* the checkpoint of the run holds the optimizer state too: compare the parameters */
    fsdp_ckpt *a = NULL, *b = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), step_dir(d, 1), &a));
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), step_dir(imp, 0), &b));
    int params = 0, equal = 0;
    for (int t = 0; a && b && t < fsdp_ckpt_num_tensors(b); t++) {
        fsdp_ckpt_tensor tb;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(fsdp_test_ctx(), b, t, &tb));
        int u = fsdp_ckpt_find(a, tb.name);
        CU_ASSERT_TRUE_FATAL(u >= 0);
        fsdp_state_region all = {.ndim = tb.ndim};
        int64_t n = 1;
        for (int k = 0; k < tb.ndim; k++) all.count[k] = tb.shape[k], n *= tb.shape[k];
        float va[256], vb[256];
        CU_ASSERT_TRUE_FATAL(n <= 256);
        FSDP_TEST_OK(fsdp_ckpt_read(fsdp_test_ctx(), a, u, &all, va));
        FSDP_TEST_OK(fsdp_ckpt_read(fsdp_test_ctx(), b, t, &all, vb));
        params++;
        equal += memcmp(va, vb, (size_t)n * sizeof(float)) == 0;
    }
    fsdp_ckpt_close(a);
    fsdp_ckpt_close(b);
    printf("\n    %d of %d parameters bitwise torch's after init; whole-dataset loss %.9g "
           "(safetensors) %.9g (h5) %.9g (checkpoint dir) %.9g (dp 2 x tp 2), random init %.9g",
           equal, params, st.first_loss, h5.first_loss, dir_init.first_loss, tp.first_loss,
           rand.first_loss);
    CU_ASSERT_EQUAL(params, 6);
    CU_ASSERT_EQUAL(equal, 6);
    CU_ASSERT_EQUAL(st.first_loss, h5.first_loss);
    CU_ASSERT_EQUAL(st.first_loss, dir_init.first_loss);
    CU_ASSERT_TRUE(fabs(tp.first_loss - st.first_loss) <= 1e-6 * st.first_loss);
    CU_ASSERT_NOT_EQUAL(st.first_loss, rand.first_loss);
    /* another model's names: MLPStacked(2)'s state dict */
    CU_ASSERT_NOT_EQUAL(
        run_ckpt(&st, "", SET("model.init=" FSDP_FIXTURE_DIR "/import_mlp.safetensors"), NULL, err),
        FSDP_OK);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, SET("loading the parameters of [model] init = ", "0.weight, 0.bias, 2.weight")));
    CU_ASSERT_EQUAL(run_ckpt(&st, "", SET("model.init=/no/such/file.safetensors"), NULL, err),
                    FSDP_ERR_CONFIG);
    /* every temporary import was removed */
    int left = 0;
    char cmd[1200], out[64] = "";
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", tmp);
    FILE *p = popen(cmd, "r");
    if (p && fgets(out, sizeof out, p)) left = atoi(out);
    if (p) pclose(p);
    CU_ASSERT_EQUAL(left, 0);
    if (saved_tmpdir)
        setenv("TMPDIR", saved_tmpdir, 1);
    else
        unsetenv("TMPDIR");
    free(saved_tmpdir);
}

/* One example, cut to `steps` (a multiple of its checkpoint.every), run twice in one
 * directory: the second run resumes at `steps` and says so. */
static void example_resumes(const char *ini, const char *name, int64_t steps) {
    char err[TRAIN_ERROR_SIZE] = "", want[1200];
    const char *dir = scratch(name);
    train_result r;
    for (int run = 0; run < 2; run++) {
        train_config_init(&g_cfg);
        FSDP_TEST_OK(train_config_load(&g_cfg, ini, err, sizeof err));
        CU_ASSERT_STRING_EQUAL(g_cfg.checkpoint.resume, "auto");
        CU_ASSERT_TRUE(g_cfg.checkpoint.every > 0);
        setf("checkpoint.dir=%s", dir);
        set("log.metrics=");
        if (g_cfg.data.kind == TRAIN_DATA_H5)
            set("data.path=" FSDP_SOURCE_DIR "/examples/data/digits.h5");
        char a[64];
        snprintf(a, sizeof a, "train.steps=%lld", (long long)steps);
        set(a);
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, f, &r, err, sizeof err));
        fclose(f);
        if (run == 0) {
            CU_ASSERT_EQUAL(r.start_step, 0);
            CU_ASSERT_STRING_EQUAL(r.saved, step_dir(dir, steps));
        } else {
            snprintf(want, sizeof want, "resume: from %s at step %lld", step_dir(dir, steps),
                     (long long)steps);
            printf("\n    %s", strstr(text, "resume:") ? strstr(text, "resume:") : text);
            CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
            CU_ASSERT_EQUAL(r.start_step, steps);
            if (g_cfg.data.eval_fraction > 0) /* where it stands on the held-out samples */
                CU_ASSERT_PTR_NOT_NULL(strstr(text, "accuracy"));
        }
        free(text);
    }
}

/* examples/mlp.ini, examples/mlp-4ranks.ini (4 rank threads) and examples/digits.ini (what
 * `make train` runs) save, and run again resume and say so; the digits run also shows the
 * held-out accuracy where it stands. */
static void test_example_resumes(void) {
    example_resumes(FSDP_SOURCE_DIR "/examples/mlp.ini", "example", 1000);
    example_resumes(FSDP_SOURCE_DIR "/examples/mlp-4ranks.ini", "example-4ranks", 500);
    example_resumes(FSDP_SOURCE_DIR "/examples/digits.ini", "digits", 200);
}

/* ---- the fsdp-train binary: signals ------------------------------------------------------ */

/* Starts fsdp-train with g_small (the binary's --set), the extra arguments and the output in
 * log (stdout and stderr). */
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

/* Waits up to `seconds` for pid; its wait status, or -1 after killing it. */
static int wait_tool(pid_t pid, int seconds) {
    int status = 0;
    for (int i = 0; i < seconds * 100; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        fsdp_test_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    char *buf = calloc(1, 65536);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Polls (10 ms) until dir holds a committed checkpoint or `seconds` pass. */
static bool wait_for_checkpoint(const char *dir, int seconds) {
    for (int i = 0; i < seconds * 100; i++) {
        char *p = NULL;
        fsdp_status st = fsdp_ckpt_latest(fsdp_test_ctx(), dir, &p);
        free(p);
        if (st == FSDP_OK) return true;
        fsdp_test_sleep_ms(10);
    }
    return false;
}

/* SIGKILL in the middle of training (checkpoints every 25 steps), then resume = auto: the run
 * ends with the parameters of an uninterrupted one, bitwise. */
static void test_sigkill_resume(void) {
    if (!*FSDP_TRAIN_EXE) return;
    char err[TRAIN_ERROR_SIZE], dir_set[1200], steps[64];
    const char *dir = scratch("killed"), *ref_dir = scratch("killed-ref"),
               *log = scratch("kill.log");
    snprintf(dir_set, sizeof dir_set, "--set=checkpoint.dir=%s", dir);
    pid_t pid = start_tool(SET("--set=train.steps=100000000", "--set=checkpoint.every=25",
                               "--set=checkpoint.keep=2", dir_set),
                           log);
    CU_ASSERT_TRUE_FATAL(pid > 0);
    bool saved = wait_for_checkpoint(dir, 120);
    fsdp_test_sleep_ms(30); /* kill it between saves, or during one */
    kill(pid, SIGKILL);
    int status = wait_tool(pid, 60);
    CU_ASSERT_TRUE(saved);
    CU_ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    char *latest = NULL;
    FSDP_TEST_OK(fsdp_ckpt_latest(fsdp_test_ctx(), dir, &latest));
    fsdp_ckpt *ck = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), latest, &ck));
    int64_t at = ck ? fsdp_ckpt_step(ck) : 0;
    fsdp_ckpt_close(ck);
    free(latest);
    /* a few steps past the newest checkpoint, resumed and uninterrupted */
    snprintf(steps, sizeof steps, "train.steps=%lld", (long long)(at + 7));
    train_result r, ref;
    FSDP_TEST_OK(run_ckpt(&r, dir, SET(steps), NULL, err));
    FSDP_TEST_OK(run_ckpt(&ref, ref_dir, SET(steps), NULL, err));
    CU_ASSERT_EQUAL(r.start_step, at);
    double diff;
    bool bitwise = false;
    CU_ASSERT_TRUE(
        ckpt_test_compare(step_dir(dir, at + 7), step_dir(ref_dir, at + 7), &diff, &bitwise));
    CU_ASSERT_TRUE(bitwise);
    printf("\n    killed after the checkpoint of step %lld; resumed to step %lld: %s the "
           "uninterrupted run (max diff %.1e)",
           (long long)at, (long long)(at + 7), bitwise ? "bitwise" : "NOT", diff);
}

/* SIGINT (2 rank threads) and SIGTERM (1 rank) stop the run after a step, save a checkpoint
 * that loads and resumes, and exit 130 with a line saying where. */
static void signal_saves(int sig, const char *ranks, const char *name) {
    char err[TRAIN_ERROR_SIZE], dir_set[1200], want[1200];
    char what[32];
    snprintf(what, sizeof what, "signal-%d", sig);
    const char *dir = scratch(what), *log = scratch("signal.log");
    snprintf(dir_set, sizeof dir_set, "--set=checkpoint.dir=%s", dir);
    pid_t pid = start_tool(
        SET("--set=train.steps=100000000", "--set=train.log_every=1000", ranks, dir_set), log);
    CU_ASSERT_TRUE_FATAL(pid > 0);
    bool started = false;
    for (int i = 0; i < 12000 && !started; i++) { /* the first progress line: training runs */
        char *text = slurp(log);
        started = strstr(text, "loss") && strstr(text, "samples/s");
        free(text);
        if (!started) fsdp_test_sleep_ms(10);
    }
    kill(pid, sig);
    int status = wait_tool(pid, 120);
    char *text = slurp(log);
    printf("\n    %s",
           strstr(text, "fsdp-train: stopped") ? strstr(text, "fsdp-train: stopped") : text);
    CU_ASSERT_TRUE(started);
    CU_ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 130);
    long long at = -1;
    const char *line = strstr(text, "fsdp-train: stopped by ");
    snprintf(want, sizeof want, "fsdp-train: stopped by %s after step %%lld", name);
    CU_ASSERT_TRUE(line && sscanf(line, want, &at) == 1);
    snprintf(want, sizeof want, "saved %s; run the same command again to resume from it",
             step_dir(dir, at));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
    free(text);
    fsdp_ckpt *ck = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(fsdp_test_ctx(), step_dir(dir, at), &ck));
    CU_ASSERT_EQUAL(ck ? fsdp_ckpt_step(ck) : -1, at);
    fsdp_ckpt_close(ck);
    char steps[64];
    snprintf(steps, sizeof steps, "train.steps=%lld", at + 3);
    train_result r;
    FSDP_TEST_OK(run_ckpt(&r, dir, SET(steps, ranks + 6), NULL, err));
    CU_ASSERT_EQUAL(r.start_step, at);
    CU_ASSERT_EQUAL(r.steps, at + 3);
}

static void test_signal_saves(void) {
    if (!*FSDP_TRAIN_EXE) return;
    signal_saves(SIGINT, "--set=parallel.ranks=2", "SIGINT");
    signal_saves(SIGTERM, "--set=parallel.ranks=1", "SIGTERM");
}

/* ---- under mpirun ------------------------------------------------------------------------ */

/* Runs a shell command (with 2>&1 at its end); returns its exit status and output. */
static int shell(const char *command, char *output, size_t size) {
    FILE *p = popen(command, "r");
    if (!p) return -1;
    size_t n = fread(output, 1, size - 1, p);
    output[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* `mpirun -np 2 fsdp-train` for 5 steps, then again resumed to 10 (tp 2): the checkpoint of
 * step 10 is bitwise the one of 10 uninterrupted steps on 2 rank threads. The CTest entry
 * test_train_ckpt_mpi2 (label mpi) runs this case with FSDP_TRAIN_MPIRUN set; without it the
 * case does nothing. */
static void test_mpi_resume(void) {
    const char *mpirun = getenv("FSDP_TRAIN_MPIRUN");
    if (!mpirun || !*mpirun || !*FSDP_TRAIN_EXE) {
        fsdp_test_skip("FSDP_TRAIN_MPIRUN is not set (CTest's test_train_ckpt_mpi2 sets it)");
        return;
    }
    char cmd[4096], out[8192], err[TRAIN_ERROR_SIZE];
    const char *dir = scratch("mpi"), *ref = scratch("mpi-ref");
    for (int steps = 5; steps <= 10; steps += 5) {
        snprintf(cmd, sizeof cmd, "%s '%s' --config '%s/examples/mlp.ini'", mpirun, FSDP_TRAIN_EXE,
                 FSDP_SOURCE_DIR);
        for (int i = 0; i < N_SMALL; i++)
            if (strncmp(g_small[i], "parallel.backend", 16) != 0)
                train_append(cmd, sizeof cmd, " --set %s", g_small[i]);
        train_append(cmd, sizeof cmd,
                     " --set parallel.tp=2 --set checkpoint.dir='%s' --set train.steps=%d 2>&1",
                     dir, steps);
        int status = shell(cmd, out, sizeof out);
        printf("\n    %s: exit %d", cmd, status);
        if (status != 0 || steps == 10) printf("\n%s", out);
        CU_ASSERT_EQUAL_FATAL(status, 0);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "resume: from "));
    train_result r;
    FSDP_TEST_OK(
        run_ckpt(&r, ref, SET("train.steps=10", "parallel.ranks=2", "parallel.tp=2"), NULL, err));
    double diff;
    bool bitwise = false;
    CU_ASSERT_TRUE(ckpt_test_compare(step_dir(dir, 10), step_dir(ref, 10), &diff, &bitwise));
    CU_ASSERT_TRUE(bitwise);
    printf("\n    mpi 5 + 5 steps against 10 on rank threads: %s (max diff %.1e)",
           bitwise ? "bitwise" : "DIFFER", diff);
}

static int setup(void) {
    g_root = ckpt_test_tmp_root();
    return g_root ? 0 : 1;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"resume_bitwise", test_resume_bitwise},
        {"resume_other_layout", test_resume_other_layout},
        {"no_decay", test_no_decay},
        {"resume_auto_fresh", test_resume_auto_fresh},
        {"resume_refused", test_resume_refused},
        {"init_from_pytorch", test_init_from_pytorch},
        {"example_resumes", test_example_resumes},
        {"sigkill_resume", test_sigkill_resume},
        {"signal_saves", test_signal_saves},
        {"mpi_resume", test_mpi_resume},
    };
    if (setup() != 0) return 2;
    int rc = fsdp_test_run(argc, argv, "train_ckpt", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}

/* test_train_stacked.c: fsdp-train's [model] kind = mlp_stacked, the seed's MLPStacked
 * (n_layers blocks layers.<i> of net1 Linear(10, 16), relu, net2 Linear(16, 10)) on the
 * synthetic teacher (train_run, the loop the tool runs): a single rank learns (the loss falls,
 * stays finite); (dp, tp) = (2, 2) rank threads with the seed's plan (layers.*.net[1] colwise,
 * layers.*.net[2] rowwise, by wildcards), FSDP per block and checkpointed blocks give the
 * single rank's step losses to float32 rounding; a run stopped at step 5 and resumed from its
 * checkpoint ends bitwise where an uninterrupted one does, checkpoint included; its keys and
 * module names are checked with messages naming the key and the fix. */
#define _POSIX_C_SOURCE 200809L // mkdtemp

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_common.h" // defines: ckpt_test_remove_tree, ckpt_test_same
#include "harness.h"
#include "train_config.h" // defines: train_config_init, train_config_set, train_config_check
#include "trainer.h"      // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */
static char *g_root;       /* this run's scratch directory */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
    if (err[0]) printf("\n    %s", err);
}

/* Two blocks on the teacher's 10 -> 10 regression, SGD (see RTOL), 12 steps. */
static const char *const g_small[] = {
    "model.kind=mlp_stacked", "model.n_layers=2",        "data.samples=256",
    "data.batch_size=16",     "data.eval_fraction=0.25", "optim.name=sgd",
    "optim.lr=0.05",          "train.steps=12",          "train.log_every=4",
    "log.level=off",          "parallel.backend=local",  "parallel.timeout_s=60"};
#define N_SMALL ((int)(sizeof g_small / sizeof g_small[0]))

static fsdp_status run(const char *const *overrides, train_result *res) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    for (int i = 0; overrides && overrides[i]; i++) set(overrides[i]);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, res, err, sizeof err);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    return st;
}

/* The layouts' losses against the single rank's: under SGD the layouts' reordered sums (a few
 * u of each gradient, u = 2^-24) reach the parameters in proportion to lr, and the MSE (its sum
 * reordered too) differs by a few tens of u over 12 steps: 1e-5 bounds that on any x86 kernel
 * of OpenBLAS (the same bound test_train_llama and test_train use for such runs). */
#define RTOL 1e-5

static double rel(double a, double b) {
    return fabs(a - b) / fmax(fabs(b), 1e-30);
}

static bool same_run(const char *what, const train_result *a, const train_result *b) {
    double worst = rel(a->first_loss, b->first_loss);
    bool ok = a->n_step_losses == b->n_step_losses;
    for (int i = 0; ok && i < a->n_step_losses; i++)
        worst = fmax(worst, rel(a->step_loss[i], b->step_loss[i]));
    worst = fmax(worst, rel(a->last_loss, b->last_loss));
    worst = fmax(worst, rel(a->eval_loss, b->eval_loss));
    printf("\n    %-40s max rel diff %.1e", what, worst);
    return ok && worst <= RTOL;
}

/* One rank learns: every step loss finite, the training and held-out losses fall. */
static void test_learns(void) {
    train_result res;
    FSDP_TEST_OK(run(SET("parallel.ranks=1", "train.steps=200", "train.log_every=50"), &res));
    bool finite = true;
    for (int i = 0; i < res.n_step_losses; i++) finite = finite && isfinite(res.step_loss[i]);
    CU_ASSERT_TRUE(finite);
    printf("\n    one rank, 200 steps: loss %.6f -> %.6f, held-out %.6f", res.first_loss,
           res.last_loss, res.eval_loss);
    CU_ASSERT_TRUE(isfinite(res.last_loss) && res.last_loss < 0.5 * res.first_loss);
    CU_ASSERT_TRUE(isfinite(res.eval_loss) && res.eval_loss < res.first_loss);
}

/* (2, 2): FSDP over dp, the seed's plan over tp (written as its wildcards and as the default),
 * a unit per block, checkpointed blocks; replicate at (2, 2); all the single rank's run. */
static void test_layouts(void) {
    train_result ref, res;
    FSDP_TEST_OK(run(SET("parallel.ranks=1"), &ref));
    CU_ASSERT_TRUE(ref.last_loss < ref.first_loss);
    const char *const *cases[] = {
        SET("parallel.ranks=4", "parallel.tp=2",
            "model.tp_plan=layers.*.net[1]=colwise,layers.*.net[2]=rowwise"),
        SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer",
            "model.checkpoint_activations=layers.*"),
        SET("parallel.ranks=4", "parallel.tp=2", "parallel.mode=replicate"),
    };
    const char *names[] = {"(2, 2) the seed's plan by wildcards", "(2, 2) wrap layer, checkpointed",
                           "(2, 2) replicate"};
    for (int c = 0; c < 3; c++) {
        FSDP_TEST_OK(run(cases[c], &res));
        CU_ASSERT_EQUAL(res.layout.dp, 2);
        CU_ASSERT_EQUAL(res.layout.tp, 2);
        CU_ASSERT_TRUE(same_run(names[c], &res, &ref));
    }
}

/* 12 steps against 5, a stop, and 7 resumed at (2, 2): the same losses and the same
 * checkpoint of step 12, bitwise (the same layout computes the same sums). */
static void test_resume(void) {
    char a_dir[1200], b_dir[1200], d[1300], pa[1400], pb[1400];
    snprintf(a_dir, sizeof a_dir, "%s/a", g_root);
    snprintf(b_dir, sizeof b_dir, "%s/b", g_root);
    train_result a, b1, b2;
    snprintf(d, sizeof d, "checkpoint.dir=%s", a_dir);
    FSDP_TEST_OK(run(SET("parallel.ranks=4", "parallel.tp=2", d), &a));
    snprintf(d, sizeof d, "checkpoint.dir=%s", b_dir);
    FSDP_TEST_OK(run(SET("parallel.ranks=4", "parallel.tp=2", d, "train.steps=5"), &b1));
    FSDP_TEST_OK(run(SET("parallel.ranks=4", "parallel.tp=2", d), &b2));
    CU_ASSERT_EQUAL(b2.start_step, 5);
    CU_ASSERT_EQUAL_FATAL(b2.n_step_losses, 7);
    CU_ASSERT_PTR_NOT_NULL(strstr(b2.resumed_from, "step-00000005"));
    bool same = b2.last_loss == a.last_loss && b2.eval_loss == a.eval_loss;
    for (int i = 0; i < 7; i++) same = same && b2.step_loss[i] == a.step_loss[5 + i];
    CU_ASSERT_TRUE(same);
    snprintf(pa, sizeof pa, "%s/step-00000012", a_dir);
    snprintf(pb, sizeof pb, "%s/step-00000012", b_dir);
    bool ckpt = ckpt_test_same(pa, pb, -1, 0, "mlp_stacked resume");
    CU_ASSERT_TRUE(ckpt);
    printf("\n    resumed at step 5: losses %s, checkpoints of step 12 %s",
           same ? "bitwise equal" : "DIFFER", ckpt ? "bitwise equal" : "DIFFER");
}

/* Bad keys fail naming the key and the fix. */
static void refused(const char *const *overrides, const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    for (int i = 0; overrides[i]; i++) set(overrides[i]);
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
    bool all = true;
    for (int i = 0; needles[i]; i++)
        if (!strstr(err, needles[i])) {
            printf("\n    no '%s' in: %s", needles[i], err);
            all = false;
        }
    CU_ASSERT_TRUE(all);
    printf("\n    %s", err);
}

static void test_config_errors(void) {
    refused(SET("model.widths=8,8"), SET("[model] widths = 8,8", "applies to kind = mlp"));
    refused(SET("model.dim=32"), SET("[model] dim = 32", "applies to kind = llama"));
    refused(SET("data.samples=4096", "data.kind=h5", "data.path=x.h5"),
            SET("[model] kind = mlp_stacked", "set [data] kind = synthetic"));
    refused(SET("parallel.tp=3", "parallel.ranks=3"),
            SET("[parallel] tp = 3", "hidden width 16", "use tp 2, 4, 8 or 16"));
    refused(SET("parallel.tp=2", "model.tp_plan=layers.*.net1=colwise"),
            SET("[model] tp_plan", "module layers.0.net2 (Linear 1) is not in the plan",
                "make module layers.0.net2 rowwise"));
    refused(SET("model.checkpoint_activations=layers.7"),
            SET("pattern 'layers.7' matches no module",
                "its modules are layers.0 (Sequential), layers.1 (Sequential)"));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"learns", test_learns},
        {"layouts", test_layouts},
        {"resume", test_resume},
        {"config_errors", test_config_errors},
    };
    char tmpl[] = "/tmp/test_train_stacked-XXXXXX";
    if (!mkdtemp(tmpl)) return 2;
    g_root = strdup(tmpl);
    int rc =
        fsdp_test_run(argc, argv, "train_stacked", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}

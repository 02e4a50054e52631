/* test_train.c: fsdp-train's training loop (train_run in tools/train_config.c, the one the tool
 * runs): examples/mlp.ini learns its teacher (loss > 10x lower); a run is deterministic and
 * independent of the context's seed, writes its metrics file and stops when the loss diverges. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "train_config.h" // defines: train_config_init, train_config_set
#include "trainer.h"      // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */

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

/* examples/mlp.ini, the run `make train` does, learns its teacher. */
static void test_example_learns(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_load(&g_cfg, FSDP_SOURCE_DIR "/examples/mlp.ini", err, sizeof err));
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
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
    snprintf(path, sizeof path, "%s/test_train_metrics.jsonl", FSDP_BINARY_DIR);
    remove(path);
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

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"example_learns", test_example_learns},
        {"deterministic", test_deterministic},
        {"variants", test_variants},
        {"metrics_file", test_metrics_file},
        {"divergence_is_an_error", test_divergence_is_an_error},
    };
    return fsdp_test_run(argc, argv, "train", cases, (int)(sizeof cases / sizeof cases[0]));
}

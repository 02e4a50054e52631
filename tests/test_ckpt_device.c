/* test_ckpt_device.c: checkpoints saved from and loaded into device tensors. The checkpoint
 * suites' model (ckpt_common.h) runs on each rank's simulated GPU, sim:(rank % 2), in deferred
 * mode, at FSDP, TP, FSDP x TP (2-D), replicate and plain layouts. Every checkpoint it saves,
 * sync and async, holds the same datasets bit for bit as the same run's on the CPU; a
 * checkpoint saved on either loads on either at another layout (CPU -> sim, sim -> CPU, sim at
 * dp 2 -> sim at dp 4, TP 2, 2x2) with the same results bit for bit, and at its own layout the
 * resumed run is the uninterrupted one. An async save stages device pieces in pinned host
 * memory, exactly the bytes it writes, released once written. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/stage.h" // defines: CKPT_STAGE_ALIGN
#include "ckpt_common.h"
#include "harness.h"
#include "kernels/sim/sim.h" // defines: fsdp_sim_mode_get, fsdp_sim_pinned_bytes

#define PRE_STEPS 2 /* trained before the saves that are loaded */
#define ALL_STEPS 3

static const ckpt_layout layouts[] = {
    {"2x1 FULL_SHARD nested", 2, 1, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true},
    {"4x1 SHARD_GRAD_OP", 4, 1, MODE_FSDP, FSDP_SHARD_GRAD_OP, 1, false, false, false},
    {"1x2 TP", 1, 2, MODE_PLAIN, 0, 1, false, false, false},
    {"2x2 FULL_SHARD nested", 2, 2, MODE_FSDP, FSDP_FULL_SHARD, 1, false, false, true},
    {"1x1 plain", 1, 1, MODE_PLAIN, 0, 1, false, false, false},
    {"2x1 replicate", 2, 1, MODE_REPLICATE, 0, 1, false, false, false},
    {"2x1 HYBRID_SHARD", 2, 1, MODE_FSDP, FSDP_HYBRID_SHARD, 2, false, false, false},
    {"2x1 FULL_SHARD offload orig", 2, 1, MODE_FSDP, FSDP_FULL_SHARD, 1, true, true, true},
};
#define N_LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))
#define SOURCE    0 /* the layout whose saves are loaded elsewhere */
#define TARGETS   5 /* layouts[0 .. TARGETS) load them */

/* One run of jb on the CPU or on sim devices, into save. */
static fsdp_status run_on(bool device, ckpt_job jb, const char *save) {
    jb.device = device;
    jb.save = save;
    return ckpt_test_run(&jb);
}

/* The newest checkpoints of two save directories hold the same tensors bit for bit. */
static bool same_latest(const char *da, const char *db, const char *what) {
    char *pa = ckpt_test_latest(da), *pb = ckpt_test_latest(db);
    bool ok = pa && pb && ckpt_test_same(pa, pb, -1, 0, what);
    free(pa);
    free(pb);
    return ok;
}

/* Every layout trains PRE_STEPS with Adam and saves: sync once, and async at every step (keep
 * 2); on sim the checkpoints equal the CPU run's bit for bit and verify. */
static void test_save_matches_cpu(void) {
    char *root = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    for (int a = 0; a < N_LAYOUTS; a++) {
        char cpu[600], dev[600], dev_async[600], what[160];
        snprintf(cpu, sizeof cpu, "%s/cpu-%d", root, a);
        snprintf(dev, sizeof dev, "%s/sim-%d", root, a);
        snprintf(dev_async, sizeof dev_async, "%s/sim-async-%d", root, a);
        ckpt_job jb = {.l = &layouts[a], .opt = a % 2 ? OPT_SGD : OPT_ADAM, .steps = PRE_STEPS};
        FSDP_TEST_OK(run_on(false, jb, cpu));
        FSDP_TEST_OK(run_on(true, jb, dev));
        jb.async = true;
        FSDP_TEST_OK(run_on(true, jb, dev_async));
        snprintf(what, sizeof what, "%s: sim vs CPU", layouts[a].name);
        CU_ASSERT_TRUE(same_latest(dev, cpu, what));
        snprintf(what, sizeof what, "%s: sim async vs CPU", layouts[a].name);
        CU_ASSERT_TRUE(same_latest(dev_async, cpu, what));
        char *p = ckpt_test_latest(dev_async);
        FSDP_TEST_OK(ckpt_test_verify(p));
        free(p);
    }
    ckpt_test_remove_tree(root);
    free(root);
}

/* Saves at SOURCE on the CPU and on sim; each loads at every target layout on the CPU and on
 * sim and trains the rest: the four runs equal bit for bit; at SOURCE's own layout they are the
 * uninterrupted CPU run. Loaded and saved again at once (no step), on sim, the checkpoint is
 * the source's. */
static void test_reshard(void) {
    char *root = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    char src[2][600], whole[600], out[600], first[600], what[200];
    ckpt_job jb = {.l = &layouts[SOURCE], .opt = OPT_ADAM, .steps = PRE_STEPS};
    for (int d = 0; d < 2; d++) {
        snprintf(src[d], sizeof src[d], "%s/src-%s", root, d ? "sim" : "cpu");
        FSDP_TEST_OK(run_on(d, jb, src[d]));
    }
    CU_ASSERT_TRUE(same_latest(src[1], src[0], "source: sim vs CPU"));
    snprintf(whole, sizeof whole, "%s/whole", root);
    jb.steps = ALL_STEPS;
    FSDP_TEST_OK(run_on(false, jb, whole));
    char *from[2] = {ckpt_test_latest(src[0]), ckpt_test_latest(src[1])};
    CU_ASSERT_FATAL(from[0] && from[1]);
    for (int b = 0; b < TARGETS; b++) {
        ckpt_job rj = {.l = &layouts[b],
                       .opt = OPT_ADAM,
                       .first_step = PRE_STEPS,
                       .steps = ALL_STEPS - PRE_STEPS};
        snprintf(first, sizeof first, "%s/resumed-%d-cpu-cpu", root, b);
        rj.load = from[0];
        FSDP_TEST_OK(run_on(false, rj, first));
        for (int k = 1; k < 4; k++) { /* k: bit 0 loads on sim, bit 1 loads the sim save */
            rj.load = from[k >> 1];
            snprintf(out, sizeof out, "%s/resumed-%d-%d", root, b, k);
            FSDP_TEST_OK(run_on(k & 1, rj, out));
            snprintf(what, sizeof what, "%s save -> %s on %s", k >> 1 ? "sim" : "CPU",
                     layouts[b].name, k & 1 ? "sim" : "CPU");
            CU_ASSERT_TRUE(same_latest(out, first, what));
        }
        if (b == SOURCE) CU_ASSERT_TRUE(same_latest(first, whole, "resumed vs uninterrupted"));
        rj.steps = 0;
        rj.load = from[1];
        snprintf(out, sizeof out, "%s/round-trip-%d", root, b);
        FSDP_TEST_OK(run_on(true, rj, out));
        snprintf(what, sizeof what, "sim save loaded and saved at once on sim at %s",
                 layouts[b].name);
        CU_ASSERT_TRUE(same_latest(out, src[1], what));
    }
    free(from[0]);
    free(from[1]);
    ckpt_test_remove_tree(root);
    free(root);
}

/* The pinned host bytes live just before each save (rank 0 of a world of 1). */
typedef struct pins {
    size_t at[ALL_STEPS + 2];
} pins;

static void count_pins(int64_t step, void *user) {
    pins *p = user;
    if (step >= 0 && step < ALL_STEPS + 2) p->at[step] = fsdp_sim_pinned_bytes();
}

/* The bytes of every piece of checkpoint dir/step-<step>, each rounded up to CKPT_STAGE_ALIGN as
 * staged. */
static size_t stored_bytes(const char *dir, int step) {
    char path[700];
    snprintf(path, sizeof path, "%s/step-%08d", dir, step);
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ck;
    if (fsdp_ckpt_open(ctx, path, &ck) != FSDP_OK) return 0;
    size_t n = 0;
    for (int t = 0; t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor ti;
        fsdp_ckpt_tensor_get(ctx, ck, t, &ti);
        for (int k = 0; k < ti.n_pieces; k++) {
            fsdp_ckpt_piece p;
            fsdp_ckpt_piece_get(ctx, ck, t, k, &p);
            int64_t e = 1;
            for (int d = 0; d < p.region.ndim; d++) e *= p.region.count[d];
            size_t b = (size_t)e * fsdp_dtype_size(ti.dtype);
            n += (b + CKPT_STAGE_ALIGN - 1) / CKPT_STAGE_ALIGN * CKPT_STAGE_ALIGN;
        }
    }
    fsdp_ckpt_close(ck);
    return n;
}

/* An async save on sim (one rank, every step, keep 3): while a save is in flight (just before
 * the next one, which waits for it) the pinned host memory holds exactly the bytes it writes
 * (each piece rounded up to CKPT_STAGE_ALIGN);
 * all of it is released by the end. On the CPU the staging takes no pinned sim memory. */
static void test_async_stages_pinned(void) {
    char *root = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    size_t before = fsdp_sim_pinned_bytes();
    for (int d = 0; d < 2; d++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/async-%s", root, d ? "sim" : "cpu");
        pins p = {0};
        ckpt_job jb = {.l = &layouts[4],
                       .opt = OPT_ADAM,
                       .steps = ALL_STEPS,
                       .async = true,
                       .keep = ALL_STEPS,
                       .before_save = count_pins,
                       .hook_user = &p};
        FSDP_TEST_OK(run_on(d, jb, dir));
        for (int s = 2; s <= ALL_STEPS; s++) {
            size_t want = d ? stored_bytes(dir, s - 1) : 0;
            if (d) CU_ASSERT_TRUE(want > 0);
            if (p.at[s] - before != want)
                printf("\n    %s: %zu pinned bytes before the save of step %d, want %zu",
                       d ? "sim" : "CPU", p.at[s] - before, s, want);
            CU_ASSERT_EQUAL(p.at[s] - before, want);
        }
        CU_ASSERT_EQUAL(fsdp_sim_pinned_bytes(), before);
    }
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/async-sim", root);
    snprintf(b, sizeof b, "%s/async-cpu", root);
    CU_ASSERT_TRUE(same_latest(a, b, "async on sim vs CPU"));
    ckpt_test_remove_tree(root);
    free(root);
}

static void test_deferred(void) {
    CU_ASSERT_EQUAL(fsdp_sim_mode_get(), FSDP_SIM_DEFERRED);
}

int main(int argc, char **argv) {
    setenv("FSDP_SIM_DEVICES", "2", 1); /* before the first use reads them */
    setenv("FSDP_SIM_MEMORY", "256M", 1);
    unsetenv("FSDP_SIM_MODE"); /* deferred */
    static const fsdp_test_case tests[] = {
        {"deferred", test_deferred},
        {"save_matches_cpu", test_save_matches_cpu},
        {"reshard", test_reshard},
        {"async_stages_pinned", test_async_stages_pinned},
    };
    return fsdp_test_run(argc, argv, "ckpt_device", tests, sizeof tests / sizeof tests[0]);
}

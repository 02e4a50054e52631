/* test_fsdp.c: FSDP over flat parameters against the same model on one rank: SGD training
 * under FULL_SHARD, SHARD_GRAD_OP and NO_SHARD, with only a root unit and with nested units,
 * on 1, 2, 3 (padding) and 4 data-parallel ranks; the collectives of each strategy per phase;
 * summon_full_params writeback; no_sync accumulation; wrapping errors. Resharded parameters
 * are poisoned with NaN, so a missing gather shows up as NaN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SEED   7
#define BATCH  8
#define LAYERS 3

typedef struct fsdp_case {
    int world;
    fsdp_sharding_strategy strategy;
    bool nested; /* layers.1 and layers.2 their own units; the root keeps layers.0 */
    int steps;
} fsdp_case;

static fsdp_status build(fsdp_ctx *ctx, fsdp_module **m) {
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, m));
    return fsdp_module_reset_parameters(ctx, *m, SEED);
}

/* Rows [off, off + len) of a (BATCH, 10) tensor made from `stream`. */
static fsdp_status batch_rows(fsdp_ctx *ctx, uint64_t stream, int64_t off, int64_t len,
                              fsdp_tensor **out) {
    fsdp_tensor *all;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){BATCH, 10}, &all));
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
    fsdp_status st = fsdp_init_tensor(ctx, all, &init, 42, stream);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, 10}, out);
    if (st == FSDP_OK)
        memcpy(fsdp_tensor_f32(*out), fsdp_tensor_f32(all) + off * 10,
               (size_t)(len * 10) * sizeof(float));
    fsdp_tensor_free(all);
    return st;
}

/* One step of loss = sum((out - target)^2) / BATCH over the global batch. A data-parallel rank
 * holds rows [off, off + len) and scales its gradient by the world size, which FSDP's
 * averaging divides out again. */
static fsdp_status step(fsdp_ctx *ctx, fsdp_module *m, fsdp_optimizer *opt, int s, int64_t off,
                        int64_t len, int world) {
    fsdp_tensor *x = NULL, *y = NULL, *dy = NULL;
    const fsdp_tensor *out;
    fsdp_status st = batch_rows(ctx, 100 + 2 * (uint64_t)s, off, len, &x);
    if (st == FSDP_OK) st = batch_rows(ctx, 101 + 2 * (uint64_t)s, off, len, &y);
    if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, out, &dy);
    if (st == FSDP_OK) {
        const float *o = fsdp_tensor_f32(out), *t = fsdp_tensor_f32(y);
        float *d = fsdp_tensor_f32(dy);
        for (int64_t i = 0; i < fsdp_tensor_numel(dy); i++)
            d[i] = 2.0f * (o[i] - t[i]) * (float)world / (float)BATCH;
        st = fsdp_module_backward(ctx, m, dy, NULL);
    }
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    fsdp_tensor_free(dy);
    return st;
}

typedef struct cmp {
    fsdp_module *other;
    const char *stage;
} cmp;

static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    const cmp *c = user;
    fsdp_param *q = fsdp_module_get_param(c->other, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "no parameter %s", name);
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->stage, name);
    return fsdp_test_rank_close(ctx, what, fsdp_param_data(q), fsdp_param_data(p), 1e-5, 1e-6,
                                NULL);
}

static fsdp_status train_rank(fsdp_ctx *ctx, int rank, void *user) {
    const fsdp_case *c = user;
    fsdp_module *ref = NULL, *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *ref_opt = NULL, *opt = NULL;
    fsdp_sgd_options sgd = {.lr = 0.1, .momentum = 0.9};
    const char *paths[] = {"layers.1", "layers.2"};
    fsdp_fully_shard_options o = {.strategy = c->strategy,
                                  .wrap_paths = c->nested ? paths : NULL,
                                  .n_wrap_paths = c->nested ? 2 : 0,
                                  .poison_resharded = true};
    fsdp_status st = build(ctx, &ref);
    if (st == FSDP_OK) st = build(ctx, &m);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_sharded_num_units(sh) == (c->nested ? LAYERS : 1), "%d units",
                        fsdp_sharded_num_units(sh));
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, ref, &sgd, &ref_opt);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &sgd, &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->world, rank, &off, &len);
    for (int s = 0; st == FSDP_OK && s < c->steps; s++) {
        st = step(ctx, ref, ref_opt, s, 0, BATCH, 1);
        if (st == FSDP_OK) st = step(ctx, m, opt, s, off, len, c->world);
        if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, NULL);
        char stage[32];
        snprintf(stage, sizeof stage, "after step %d", s + 1);
        if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, ref, compare_param, &(cmp){m, stage});
        if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    }
    fsdp_optimizer_free(ref_opt);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(ref);
    fsdp_module_free(m);
    return st;
}

static void run_training(fsdp_sharding_strategy strategy, bool nested) {
    for (int world = 1; world <= 4; world++) {
        fsdp_case c = {world, strategy, nested, 3};
        fsdp_status st = fsdp_test_run_world(world, 0, train_rank, &c);
        if (st != FSDP_OK)
            fprintf(stderr, "\n  %s %s on %d ranks\n", fsdp_sharding_strategy_to_string(strategy),
                    nested ? "nested" : "root only", world);
        FSDP_TEST_OK(st);
    }
}

static void test_train_full_shard_root(void) {
    run_training(FSDP_FULL_SHARD, false);
}
static void test_train_full_shard_nested(void) {
    run_training(FSDP_FULL_SHARD, true);
}
static void test_train_shard_grad_op_root(void) {
    run_training(FSDP_SHARD_GRAD_OP, false);
}
static void test_train_shard_grad_op_nested(void) {
    run_training(FSDP_SHARD_GRAD_OP, true);
}
static void test_train_no_shard_root(void) {
    run_training(FSDP_NO_SHARD, false);
}
static void test_train_no_shard_nested(void) {
    run_training(FSDP_NO_SHARD, true);
}

/* ---- collectives per strategy (REFERENCE.md section 4), 4 ranks, 1 or 3 units ---- */

static fsdp_status comm_rank(fsdp_ctx *ctx, int rank, void *user) {
    const fsdp_case *c = user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    const char *paths[] = {"layers.1", "layers.2"};
    fsdp_fully_shard_options o = {.strategy = c->strategy,
                                  .wrap_paths = c->nested ? paths : NULL,
                                  .n_wrap_paths = c->nested ? 2 : 0,
                                  .poison_resharded = true};
    fsdp_status st = build(ctx, &m);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK)
        st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_sgd_options){.lr = 0.1},
                             &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->world, rank, &off, &len);
    if (st == FSDP_OK) st = step(ctx, m, opt, 0, off, len, c->world); /* warm-up */
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = step(ctx, m, opt, 1, off, len, c->world);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        int units = c->nested ? LAYERS : 1, nonroot = units - 1;
        int64_t want[2][FSDP_COMM_OP_COUNT] = {{0}};
        switch (c->strategy) {
        case FSDP_FULL_SHARD: /* every unit gathers in forward; non-root units again in
                                 backward (they resharded after forward); all reduce-scatter */
            want[0][FSDP_COMM_ALL_GATHER] = units;
            want[1][FSDP_COMM_ALL_GATHER] = nonroot;
            want[1][FSDP_COMM_REDUCE_SCATTER] = units;
            break;
        case FSDP_SHARD_GRAD_OP: /* full parameters kept from forward to backward */
            want[0][FSDP_COMM_ALL_GATHER] = units;
            want[1][FSDP_COMM_REDUCE_SCATTER] = units;
            break;
        default: /* NO_SHARD: only the gradient all_reduce */
            want[1][FSDP_COMM_ALL_REDUCE] = units;
        }
        for (int ph = 0; ph < 2; ph++)
            for (int op = FSDP_COMM_ALL_GATHER; op < FSDP_COMM_BARRIER; op++) {
                fsdp_comm_filter f = {.op = (fsdp_comm_op)op,
                                      .phase =
                                          ph ? FSDP_COMM_PHASE_BACKWARD : FSDP_COMM_PHASE_FORWARD};
                int64_t got = fsdp_comm_debug_query(ctx, &f).calls;
                FSDP_RANK_CHECK(ctx, got == want[ph][op], "%s %s: %lld %s in %s, want %lld",
                                fsdp_sharding_strategy_to_string(c->strategy),
                                c->nested ? "nested" : "root", (long long)got,
                                fsdp_comm_op_to_string((fsdp_comm_op)op),
                                ph ? "backward" : "forward", (long long)want[ph][op]);
            }
        FSDP_RANK_CHECK(
            ctx,
            fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.phase = FSDP_COMM_PHASE_NONE}).calls ==
                0,
            "collectives outside forward and backward (the step must not communicate)");
    }
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void test_comm_counts(void) {
    fsdp_sharding_strategy strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD};
    for (int s = 0; s < 3; s++)
        for (int nested = 0; nested < 2; nested++) {
            fsdp_case c = {4, strategies[s], nested, 0};
            FSDP_TEST_OK(fsdp_test_run_world(4, 0, comm_rank, &c));
        }
}

/* ---- 2D: FSDP over dp wrapping a TP model on tp (seed test_fsdp_tp_extension_grad) ---- */

/* RMSNorm(10) then MLPModule; TP on tp: the norm SequenceParallel over Shard(0) rows, net1
 * Colwise(input Shard(0)), net2 Rowwise(output Shard(0)); one root FULL_SHARD unit over dp.
 * World 4 = (dp 2, tp 2); the global batch of 8 rows: dp replica d takes rows [4d, 4d + 4),
 * and tp rank t its 2 of them. One forward and backward of sum(output) makes exactly the 7
 * collectives of REFERENCE.md section 5; one SGD step then matches the single-rank model
 * trained on all 8 rows. */
static fsdp_status twod_build(fsdp_ctx *ctx, fsdp_module **m) {
    fsdp_module *norm = NULL, *mlp = NULL;
    FSDP_TRY(fsdp_sequential_create(ctx, m));
    FSDP_TRY(fsdp_rmsnorm_create(ctx, 10, 1e-6f, &norm));
    FSDP_TRY(fsdp_sequential_append(ctx, *m, norm));
    FSDP_TRY(fsdp_model_mlp_module(ctx, &mlp));
    FSDP_TRY(fsdp_sequential_append(ctx, *m, mlp));
    return fsdp_module_reset_parameters(ctx, *m, SEED);
}

static fsdp_status twod_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_mesh *mesh = NULL, *tp = NULL;
    fsdp_group *dp = NULL;
    fsdp_module *ref = NULL, *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *ref_opt = NULL, *opt = NULL;
    fsdp_tensor *x = NULL, *xr = NULL, *dy = NULL, *dref = NULL;
    const fsdp_tensor *out = NULL, *ref_out = NULL;
    fsdp_sgd_options sgd = {.lr = 0.25};
    fsdp_status st = fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_dim(ctx, mesh, "tp", &tp);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    if (st == FSDP_OK) st = twod_build(ctx, &ref);
    if (st == FSDP_OK) st = twod_build(ctx, &m);
    if (st == FSDP_OK) {
        fsdp_tp_plan_entry plan[] = {
            {"0", FSDP_SEQUENCE_PARALLEL(.input_layouts = FSDP_SHARD(0),
                                         .use_local_output = FSDP_TP_YES)},
            {"1.net1", FSDP_COLWISE(.input_layouts = FSDP_SHARD(0))},
            {"1.net2", FSDP_ROWWISE(.output_layouts = FSDP_SHARD(0))},
        };
        st = fsdp_tp_parallelize(ctx, m, tp, 3, plan, NULL);
    }
    fsdp_fully_shard_options o = {.group = dp, .poison_resharded = true};
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, ref, &sgd, &ref_opt);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &sgd, &opt);
    int d = fsdp_mesh_coordinate(mesh, 0), t = fsdp_mesh_coordinate(mesh, 1);
    if (st == FSDP_OK) st = batch_rows(ctx, 7, 4 * d + 2 * t, 2, &x);
    if (st == FSDP_OK) st = batch_rows(ctx, 7, 0, BATCH, &xr);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, out, &dy);
    /* sum(output); the factor 2 undoes FSDP's average over dp, so the step sees the gradient
     * of the sum over all 8 rows, as the reference does. */
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dy, 2.0f);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dy, NULL);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        struct {
            fsdp_comm_phase phase;
            const char *group;
            fsdp_comm_op op;
        } want[] = {
            {FSDP_COMM_PHASE_FORWARD, "dp", FSDP_COMM_ALL_GATHER},      /* 1: unshard */
            {FSDP_COMM_PHASE_FORWARD, "tp", FSDP_COMM_ALL_GATHER},      /* 2: net1 input */
            {FSDP_COMM_PHASE_FORWARD, "tp", FSDP_COMM_REDUCE_SCATTER},  /* 3: net2 output */
            {FSDP_COMM_PHASE_BACKWARD, "tp", FSDP_COMM_ALL_GATHER},     /* 4: adjoint of 3 */
            {FSDP_COMM_PHASE_BACKWARD, "tp", FSDP_COMM_REDUCE_SCATTER}, /* 5: adjoint of 2 */
            {FSDP_COMM_PHASE_BACKWARD, "tp", FSDP_COMM_ALL_REDUCE},     /* 6: norm weight */
            {FSDP_COMM_PHASE_BACKWARD, "dp", FSDP_COMM_REDUCE_SCATTER}, /* 7: flat gradient */
        };
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 7, "%lld collectives, want 7",
                        (long long)fsdp_comm_debug_total(ctx).calls);
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            fsdp_comm_filter f = {.op = want[i].op, .group = want[i].group, .phase = want[i].phase};
            FSDP_RANK_CHECK(ctx, fsdp_comm_debug_query(ctx, &f).calls == 1,
                            "collective %zu (%s on %s in %s): %lld calls, want 1", i + 1,
                            fsdp_comm_op_to_string(want[i].op), want[i].group,
                            fsdp_comm_phase_to_string(want[i].phase),
                            (long long)fsdp_comm_debug_query(ctx, &f).calls);
        }
        const fsdp_tensor *flat_grad =
            fsdp_param_grad(fsdp_module_param(fsdp_sharded_flat_params(sh), 0));
        const float *g = fsdp_tensor_f32(flat_grad);
        for (int64_t i = 0; i < fsdp_tensor_numel(flat_grad); i++)
            FSDP_RANK_CHECK(ctx, isfinite(g[i]), "flat gradient element %lld is %g", (long long)i,
                            g[i]);
    }
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
    /* The reference: all 8 rows, d sum / d out = 1. */
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, ref, xr, &ref_out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, ref_out, &dref);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dref, 1.0f);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, ref, dref, NULL);
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, ref_opt);
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, NULL);
    for (int i = 0; st == FSDP_OK && i < 5; i++) {
        static const char *names[] = {"0.weight", "1.net1.weight", "1.net1.bias", "1.net2.weight",
                                      "1.net2.bias"};
        fsdp_tensor *full = NULL;
        st = fsdp_param_full_tensor(ctx, fsdp_module_get_param(m, names[i]), false, &full);
        const fsdp_tensor *want_t = fsdp_param_data(fsdp_module_get_param(ref, names[i]));
        for (int64_t k = 0; st == FSDP_OK && k < fsdp_tensor_numel(want_t); k++) {
            float a = fsdp_tensor_f32(full)[k], b = fsdp_tensor_f32(want_t)[k];
            if (!(fabsf(a - b) <= 1e-6f + 1e-5f * fabsf(b)))
                st =
                    FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "2D %s[%lld] after the step: %.9g, want %.9g",
                              names[i], (long long)k, a, b);
        }
        fsdp_tensor_free(full);
    }
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    fsdp_tensor_free(x);
    fsdp_tensor_free(xr);
    fsdp_tensor_free(dy);
    fsdp_tensor_free(dref);
    fsdp_optimizer_free(ref_opt);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(ref);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_fsdp_tp_extension_grad(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, twod_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"train_full_shard_root", test_train_full_shard_root},
        {"train_full_shard_nested", test_train_full_shard_nested},
        {"train_shard_grad_op_root", test_train_shard_grad_op_root},
        {"train_shard_grad_op_nested", test_train_shard_grad_op_nested},
        {"train_no_shard_root", test_train_no_shard_root},
        {"train_no_shard_nested", test_train_no_shard_nested},
        {"comm_counts", test_comm_counts},
        {"fsdp_tp_extension_grad", test_fsdp_tp_extension_grad},
    };
    return fsdp_test_run(argc, argv, "fsdp", cases, sizeof cases / sizeof cases[0]);
}

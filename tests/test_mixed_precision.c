/* test_mixed_precision.c: FSDP's MixedPrecision (param_dtype, reduce_dtype) on 4 ranks as a
 * (dp 2, tp 2) mesh: MLPStacked(3) with every net1 Colwise and net2 Rowwise over tp, FSDP over
 * dp with layers.1 and layers.2 nested, trained 10 SGD steps. Each mixed-precision run is
 * compared with the f32 run of the same layout and strategy: its loss at every step lies within
 * the first-order effect of rounding the parameters (the bound below), all_gather moves exactly
 * half the bytes in the same number of calls (and reduce_scatter half with reduce_dtype bf16),
 * the parameters forward computes with are exactly param_dtype values while the shards the
 * optimizer steps are not, and summon_full_params hands out the f32 shards. Every rank checks
 * its own results. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "stacked_batches.h"

#define SEED   7
#define LAYERS 3
#define STEPS  10
#define LR     0.05f

typedef struct mp_case {
    fsdp_sharding_strategy strategy;
    bool offload;
    fsdp_mixed_precision mp;
} mp_case;

typedef struct curve {
    double loss[STEPS];
    double sens[STEPS]; /* sum over parameters of |w dL/dw| at each step's parameters */
    int64_t ag_calls, ag_bytes, rs_calls, rs_bytes; /* dp, one step */
    int64_t low_checked;                            /* parameter values seen in forward */
    bool all_low;                                   /* ... all of them param_dtype values */
    bool master_f32;   /* some shard value is not a param_dtype value */
    bool summon_exact; /* summon_full_params handed out the shard's f32 values */
} curve;

static bool representable(fsdp_dtype dtype, float v) {
    if (dtype == FSDP_DTYPE_BF16) return fsdp_bf16_to_f32(fsdp_bf16_from_f32(v)) == v;
    if (dtype == FSDP_DTYPE_F16) return fsdp_f16_to_f32(fsdp_f16_from_f32(v)) == v;
    return true;
}

typedef struct probe {
    curve *c;
    fsdp_dtype dtype;
} probe;

static fsdp_status probe_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    probe *pr = user;
    const fsdp_tensor *t = fsdp_param_data(p);
    for (int64_t i = 0; i < fsdp_tensor_numel(t); i++) {
        pr->c->all_low &= representable(pr->dtype, fsdp_tensor_f32(t)[i]);
        pr->c->low_checked++;
    }
    return FSDP_OK;
}

/* A pre-forward hook added after FSDP's (which gathers): reads the parameters the layer is
 * about to compute with. */
static fsdp_status probe_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)point, (void)io;
    return fsdp_module_visit_params(ctx, m, probe_param, user);
}

/* Forward and backward of step s on this rank's rows; *loss = the global loss
 * sum((out - y)^2) / STACKED_BATCH, summed over dp (tp ranks hold the same output). */
static fsdp_status step(fsdp_ctx *ctx, fsdp_module *m, fsdp_group *dp, int s, double *loss) {
    int64_t off, len;
    fsdp_batch_range(ctx, dp, STACKED_BATCH, &off, &len);
    fsdp_tensor *x = NULL, *y = NULL, *dy = NULL, *l = NULL;
    const fsdp_tensor *out;
    fsdp_status st = stacked_batch_rows(ctx, 100 + 2 * (uint64_t)s, off, len, &x);
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 101 + 2 * (uint64_t)s, off, len, &y);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, out, &dy);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &l);
    if (st == FSDP_OK) {
        const float *o = fsdp_tensor_f32(out), *t = fsdp_tensor_f32(y);
        float *d = fsdp_tensor_f32(dy);
        double sum = 0;
        for (int64_t i = 0; i < fsdp_tensor_numel(dy); i++) {
            sum += ((double)o[i] - t[i]) * ((double)o[i] - t[i]);
            d[i] = 2.0f * (o[i] - t[i]) * (float)fsdp_group_size(dp) / (float)STACKED_BATCH;
        }
        fsdp_tensor_f32(l)[0] = (float)(sum / STACKED_BATCH);
        st = fsdp_module_backward(ctx, m, dy, NULL);
    }
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, dp, l, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) *loss = fsdp_tensor_f32(l)[0];
    fsdp_tensor *t[] = {x, y, dy, l};
    for (int i = 0; i < 4; i++) fsdp_tensor_free(t[i]);
    return st;
}

/* sum |w g| over the shards the optimizer steps (f32 masters and reduced gradients), summed
 * over dp and tp. The Rowwise biases, replicated over tp, count twice: that only loosens the
 * bound. */
static fsdp_status sensitivity(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_group *dp, fsdp_group *tp,
                               double *out) {
    double s = 0;
    for (int u = 0; u < fsdp_sharded_num_units(sh); u++) {
        fsdp_param *p = fsdp_sharded_unit_flat_param(sh, u);
        const float *w = fsdp_tensor_f32(fsdp_param_data(p)),
                    *g = fsdp_tensor_f32(fsdp_param_grad(p));
        for (int64_t i = 0; i < fsdp_tensor_numel(fsdp_param_data(p)); i++)
            s += fabs((double)w[i] * g[i]);
    }
    fsdp_tensor *t;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &t));
    fsdp_tensor_f32(t)[0] = (float)s;
    fsdp_status st = fsdp_all_reduce(ctx, dp, t, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, tp, t, FSDP_REDUCE_SUM);
    *out = fsdp_tensor_f32(t)[0];
    fsdp_tensor_free(t);
    return st;
}

/* Inside summon_full_params the model's parameters hold every rank's f32 shard: this rank's
 * chunk of each unit's flat buffer equals its shard bit for bit. Checked through the segments. */
static fsdp_status check_summon(fsdp_ctx *ctx, fsdp_sharded *sh, curve *c) {
    FSDP_TRY(fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){0}));
    c->summon_exact = true;
    for (int i = 0; i < fsdp_sharded_num_segments(sh); i++) {
        fsdp_flat_segment s;
        FSDP_TRY(fsdp_sharded_segment(ctx, sh, i, &s));
        const float *full = fsdp_tensor_f32(fsdp_param_data(s.param)) + s.shard_begin;
        const float *shard =
            fsdp_tensor_f32(fsdp_param_data(fsdp_sharded_unit_flat_param(sh, s.unit))) +
            s.shard_offset;
        c->summon_exact &= memcmp(full, shard, (size_t)s.shard_numel * sizeof(float)) == 0;
    }
    return fsdp_release_full_params(ctx, sh);
}

static fsdp_status train(fsdp_ctx *ctx, const mp_case *k, fsdp_mixed_precision mp, curve *c) {
    memset(c, 0, sizeof *c);
    c->all_low = true;
    fsdp_mesh *mesh = NULL;
    fsdp_module *m = NULL;
    fsdp_mesh *tp_mesh = NULL;
    fsdp_group *dp = NULL, *tp = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    static const char *const nested[] = {"layers.1", "layers.2"};
    fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                 {"layers.*.net2", FSDP_ROWWISE()}};
    fsdp_status st = fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "tp", &tp);
    if (st == FSDP_OK) st = fsdp_mesh_dim(ctx, mesh, "tp", &tp_mesh);
    if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, LAYERS, &m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, SEED);
    if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, m, tp_mesh, 2, plan, NULL);
    fsdp_fully_shard_options o = {.strategy = k->strategy,
                                  .group = dp,
                                  .wrap_paths = nested,
                                  .n_wrap_paths = 2,
                                  .offload_params = k->offload,
                                  .poison_resharded = true,
                                  .mixed_precision = mp};
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    probe pr = {c, mp.param_dtype};
    for (int i = 0; st == FSDP_OK && i < fsdp_module_num_children(fsdp_module_child(m, 0)); i++)
        st = fsdp_module_add_hook(ctx, fsdp_module_child(fsdp_module_child(m, 0), i),
                                  FSDP_HOOK_PRE_FORWARD, probe_hook, &pr, NULL, NULL);
    if (st == FSDP_OK)
        st =
            fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_sgd_options){.lr = LR}, &opt);
    for (int s = 0; st == FSDP_OK && s < STEPS; s++) {
        if (s == 1) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK) st = step(ctx, m, dp, s, &c->loss[s]);
        if (st == FSDP_OK && s == 1) st = fsdp_comm_debug_end(ctx);
        if (st == FSDP_OK) st = sensitivity(ctx, sh, dp, tp, &c->sens[s]);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
    }
    fsdp_comm_count ag =
        fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_ALL_GATHER, .group = "dp"});
    fsdp_comm_count rs = fsdp_comm_debug_query(
        ctx, &(fsdp_comm_filter){.op = k->strategy == FSDP_NO_SHARD ? FSDP_COMM_ALL_REDUCE
                                                                    : FSDP_COMM_REDUCE_SCATTER,
                                 .group = "dp",
                                 .phase = FSDP_COMM_PHASE_BACKWARD});
    c->ag_calls = ag.calls, c->ag_bytes = ag.bytes, c->rs_calls = rs.calls, c->rs_bytes = rs.bytes;
    for (int u = 0; st == FSDP_OK && u < fsdp_sharded_num_units(sh); u++) {
        const fsdp_tensor *w = fsdp_param_data(fsdp_sharded_unit_flat_param(sh, u));
        for (int64_t i = 0; i < fsdp_tensor_numel(w); i++)
            c->master_f32 |= !representable(FSDP_DTYPE_BF16, fsdp_tensor_f32(w)[i]) &&
                             !representable(FSDP_DTYPE_F16, fsdp_tensor_f32(w)[i]);
    }
    if (st == FSDP_OK) st = check_summon(ctx, sh, c);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

/* The bound, per step k: rounding every parameter w once to param_dtype (unit roundoff u: 2^-8
 * bf16, 2^-11 f16) moves each by at most u |w|, so to first order the loss by at most
 * u sum |w dL/dw| = u S(k), S from the f32 run at step k; the test allows u S(k) + 1e-6 |L|.
 * The drift of the earlier steps (gradients taken at rounded parameters, and with a 16-bit
 * reduce_dtype rounded themselves) stays far inside it over these 10 steps: the runs print how
 * much of the bound they use (at most 0.4 when this was written). */
static fsdp_status mp_rank(fsdp_ctx *ctx, int rank, void *user) {
    const mp_case *k = user;
    curve ref, got;
    FSDP_TRY(train(ctx, k, (fsdp_mixed_precision){0}, &ref));
    FSDP_TRY(train(ctx, k, k->mp, &got));
    double u = k->mp.param_dtype == FSDP_DTYPE_BF16  ? 0x1p-8
               : k->mp.param_dtype == FSDP_DTYPE_F16 ? 0x1p-11
                                                     : 0.0;
    double worst = 0, max_diff = 0;
    for (int s = 0; s < STEPS; s++) {
        double d = fabs(got.loss[s] - ref.loss[s]);
        double bound = u * ref.sens[s] + 1e-6 * fabs(ref.loss[s]);
        FSDP_RANK_CHECK(ctx, d <= bound,
                        "step %d: loss %.9g, the f32 run's %.9g: off by %.3g, bound %.3g (S %.3g)",
                        s, got.loss[s], ref.loss[s], d, bound, ref.sens[s]);
        worst = fmax(worst, d / bound);
        max_diff = fmax(max_diff, d / fabs(ref.loss[s]));
    }
    FSDP_RANK_CHECK(ctx, ref.loss[STEPS - 1] < 0.9 * ref.loss[0],
                    "f32 loss %.6g -> %.6g: no training", ref.loss[0], ref.loss[STEPS - 1]);
    bool low_param = k->mp.param_dtype != FSDP_DTYPE_F32;
    /* The same collectives; all_gather in half the bytes with a 16-bit param_dtype, the
     * gradient reduction with a 16-bit reduce_dtype. */
    FSDP_RANK_CHECK(ctx, got.ag_calls == ref.ag_calls && got.rs_calls == ref.rs_calls,
                    "collectives: all_gather %lld (f32 %lld), reduction %lld (f32 %lld)",
                    (long long)got.ag_calls, (long long)ref.ag_calls, (long long)got.rs_calls,
                    (long long)ref.rs_calls);
    FSDP_RANK_CHECK(ctx, got.ag_bytes * (low_param ? 2 : 1) == ref.ag_bytes,
                    "all_gather bytes %lld, f32 %lld", (long long)got.ag_bytes,
                    (long long)ref.ag_bytes);
    bool low_grad = k->mp.reduce_dtype != FSDP_DTYPE_F32;
    FSDP_RANK_CHECK(ctx, got.rs_bytes * (low_grad ? 2 : 1) == ref.rs_bytes,
                    "reduction bytes %lld, f32 %lld", (long long)got.rs_bytes,
                    (long long)ref.rs_bytes);
    FSDP_RANK_CHECK(ctx, got.all_low && got.low_checked > 0,
                    "forward computed with parameters that are not %s values",
                    fsdp_dtype_to_string(k->mp.param_dtype));
    FSDP_RANK_CHECK(ctx, got.master_f32 && got.summon_exact,
                    "master shards in f32: %d, summon hands them out: %d", got.master_f32,
                    got.summon_exact);
    if (rank == 0)
        printf("\n    %s%s param %s reduce %s: loss %.6g -> %.6g (f32 %.6g -> %.6g), worst "
               "relative difference %.2g, at most %.2f of the bound; all_gather %lld -> %lld "
               "bytes, reduction %lld -> %lld",
               fsdp_sharding_strategy_to_string(k->strategy), k->offload ? " offload" : "",
               fsdp_dtype_to_string(k->mp.param_dtype), fsdp_dtype_to_string(k->mp.reduce_dtype),
               got.loss[0], got.loss[STEPS - 1], ref.loss[0], ref.loss[STEPS - 1], max_diff, worst,
               (long long)ref.ag_bytes, (long long)got.ag_bytes, (long long)ref.rs_bytes,
               (long long)got.rs_bytes);
    return FSDP_OK;
}

/* ---- replicate (DDP's mixed_precision) ---- */

#define REP_PARAMS 4096 /* more than MLPStacked(3)'s 1038 (checked) */

/* Copies every parameter's values of m (in visiting order) into or out of buf. */
typedef struct param_copy {
    float *buf;
    int64_t at;
    bool out; /* model -> buf */
} param_copy;

static fsdp_status copy_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    param_copy *c = user;
    float *v = fsdp_tensor_f32(fsdp_param_data(p));
    int64_t n = fsdp_tensor_numel(fsdp_param_data(p));
    if (c->at + n > REP_PARAMS)
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the model has more than REP_PARAMS elements");
    if (c->out)
        memcpy(c->buf + c->at, v, (size_t)n * sizeof(float));
    else
        memcpy(v, c->buf + c->at, (size_t)n * sizeof(float));
    c->at += n;
    return FSDP_OK;
}

static fsdp_status copy_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    param_copy *c = user;
    int64_t n = fsdp_tensor_numel(fsdp_param_grad(p));
    if (c->at + n > REP_PARAMS)
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the model has more than REP_PARAMS elements");
    memcpy(c->buf + c->at, fsdp_tensor_f32(fsdp_param_grad(p)), (size_t)n * sizeof(float));
    c->at += n;
    return FSDP_OK;
}

/* Replicate over 2 ranks with mixed_precision {param_dtype, reduce_dtype} against the
 * un-replicated model with its parameters rounded to param_dtype by hand, trained on the whole
 * batch: every gradient within 1e-5 relative to the largest (f32 reduction) or within the
 * reduce dtype's bound of comm_hook.h (bf16 reduction); the forward saw only param_dtype
 * values; after backward the parameters are their f32 values again, bit for bit; the bucket's
 * all_reduce moves half the bytes with a 16-bit reduce_dtype. */
static fsdp_status replicate_rank(fsdp_ctx *ctx, int rank, void *user) {
    const fsdp_mixed_precision *mp = user;
    fsdp_module *m = NULL, *ref = NULL;
    fsdp_replicate *r = NULL;
    float *before = calloc(4 * REP_PARAMS, sizeof(float)), *after = before + REP_PARAMS,
          *got = after + REP_PARAMS, *want = got + REP_PARAMS;
    if (!before) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "test buffers");
    curve c = {.all_low = true};
    probe pr = {&c, mp->param_dtype};
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, &m));
    FSDP_TRY(fsdp_module_reset_parameters(ctx, m, SEED));
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, &ref));
    FSDP_TRY(fsdp_module_reset_parameters(ctx, ref, SEED));
    fsdp_replicate_options o = {.src_rank = FSDP_NO_SRC_RANK, .mixed_precision = *mp};
    FSDP_TRY(fsdp_replicate_apply(ctx, m, &o, &r));
    for (int i = 0; i < fsdp_module_num_children(fsdp_module_child(m, 0)); i++)
        FSDP_TRY(fsdp_module_add_hook(ctx, fsdp_module_child(fsdp_module_child(m, 0), i),
                                      FSDP_HOOK_PRE_FORWARD, probe_hook, &pr, NULL, NULL));
    param_copy pc = {before, 0, true};
    FSDP_TRY(fsdp_module_visit_params(ctx, m, copy_param, &pc));
    int64_t n = pc.at;
    /* the reference: the parameters rounded by hand, the whole batch on one rank */
    for (int64_t i = 0; i < n; i++)
        want[i] =
            mp->param_dtype == FSDP_DTYPE_BF16  ? fsdp_bf16_to_f32(fsdp_bf16_from_f32(before[i]))
            : mp->param_dtype == FSDP_DTYPE_F16 ? fsdp_f16_to_f32(fsdp_f16_from_f32(before[i]))
                                                : before[i];
    pc = (param_copy){want, 0, false};
    FSDP_TRY(fsdp_module_visit_params(ctx, ref, copy_param, &pc));
    FSDP_TRY(stacked_forward_backward(ctx, ref, 0, 0, STACKED_BATCH, 1));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    int64_t off, len;
    fsdp_batch_range(ctx, NULL, STACKED_BATCH, &off, &len);
    FSDP_TRY(stacked_forward_backward(ctx, m, 0, off, len, 2));
    FSDP_TRY(fsdp_comm_debug_end(ctx));
    fsdp_comm_count ar =
        fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_ALL_REDUCE});
    pc = (param_copy){after, 0, true};
    FSDP_TRY(fsdp_module_visit_params(ctx, m, copy_param, &pc));
    pc = (param_copy){got, 0, true};
    FSDP_TRY(fsdp_module_visit_params(ctx, m, copy_grad, &pc));
    pc = (param_copy){want, 0, true};
    FSDP_TRY(fsdp_module_visit_params(ctx, ref, copy_grad, &pc));
    double gmax = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]) / gmax);
    /* f32: the two ranks' halves summed in another order than one rank's whole batch; bf16 /
     * f16 reduction: comm_hook.h's bound u |avg| + (2u + u^2) mean |g_r| <= (3u + u^2) max */
    double u = mp->reduce_dtype == FSDP_DTYPE_BF16  ? 0x1p-8
               : mp->reduce_dtype == FSDP_DTYPE_F16 ? 0x1p-11
                                                    : 0;
    double tol = u > 0 ? 3 * u + u * u + 1e-5 : 1e-5;
    FSDP_RANK_CHECK(
        ctx, worst <= tol,
        "gradients off the hand-rounded reference by %.3g of the largest (tolerance %.3g)", worst,
        tol);
    FSDP_RANK_CHECK(ctx, memcmp(before, after, (size_t)n * sizeof(float)) == 0,
                    "the parameters are not their f32 values after backward");
    bool low = mp->param_dtype != FSDP_DTYPE_F32;
    FSDP_RANK_CHECK(ctx, c.low_checked > 0 && c.all_low == true,
                    "forward computed with parameters that are not %s values",
                    fsdp_dtype_to_string(mp->param_dtype));
    int64_t want_bytes = n * (mp->reduce_dtype == FSDP_DTYPE_F32 ? 4 : 2);
    FSDP_RANK_CHECK(ctx, ar.calls == 1 && ar.bytes == want_bytes,
                    "all_reduce: %lld calls, %lld bytes (want 1 and %lld)", (long long)ar.calls,
                    (long long)ar.bytes, (long long)want_bytes);
    if (rank == 0)
        printf("\n    replicate param %s reduce %s: gradients within %.2g of the largest of the "
               "hand-rounded reference's%s; all_reduce %lld bytes",
               fsdp_dtype_to_string(mp->param_dtype), fsdp_dtype_to_string(mp->reduce_dtype), worst,
               low ? ", forward saw only rounded values" : "", (long long)ar.bytes);
    fsdp_module_free(m);
    fsdp_module_free(ref);
    free(before);
    return FSDP_OK;
}

static void test_replicate(void) {
    const fsdp_mixed_precision cases[] = {{FSDP_DTYPE_BF16, FSDP_DTYPE_F32},
                                          {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16},
                                          {FSDP_DTYPE_F16, FSDP_DTYPE_F32},
                                          {FSDP_DTYPE_F32, FSDP_DTYPE_F16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fsdp_mixed_precision mp = cases[i];
        FSDP_TEST_OK(fsdp_test_run_world(2, 0, replicate_rank, &mp));
    }
}

/* A reduce_dtype with a compressing hook, and a dtype that is not a float type, are refused. */
static fsdp_status replicate_refused_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_module *m = NULL;
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, 1, &m));
    fsdp_replicate_options o = {.mixed_precision = {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16},
                                .comm_hook = {.kind = FSDP_COMM_HOOK_FP16}};
    fsdp_status st = fsdp_replicate_apply(ctx, m, &o, NULL);
    FSDP_RANK_CHECK(ctx,
                    st == FSDP_ERR_INVALID_ARGUMENT &&
                        strstr(fsdp_last_error(ctx), "both choose how gradients are reduced"),
                    "reduce_dtype with the fp16 hook: %s", fsdp_last_error(ctx));
    o = (fsdp_replicate_options){.mixed_precision = {FSDP_DTYPE_I32, FSDP_DTYPE_F32}};
    st = fsdp_replicate_apply(ctx, m, &o, NULL);
    FSDP_RANK_CHECK(ctx,
                    st == FSDP_ERR_INVALID_ARGUMENT &&
                        strstr(fsdp_last_error(ctx), "mixed_precision.param_dtype is"),
                    "param_dtype i32: %s", fsdp_last_error(ctx));
    fsdp_module_free(m);
    return FSDP_OK;
}

static void test_replicate_refused(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, replicate_refused_rank, NULL));
}

static void run(mp_case k) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, mp_rank, &k));
}

static void test_bf16_params_f32_reduce(void) {
    run((mp_case){FSDP_FULL_SHARD, false, {FSDP_DTYPE_BF16, FSDP_DTYPE_F32}});
    run((mp_case){FSDP_SHARD_GRAD_OP, false, {FSDP_DTYPE_BF16, FSDP_DTYPE_F32}});
}

static void test_bf16_params_bf16_reduce(void) {
    run((mp_case){FSDP_FULL_SHARD, false, {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16}});
    run((mp_case){FSDP_FULL_SHARD, true, {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16}});
}

static void test_f16_and_no_shard(void) {
    run((mp_case){FSDP_FULL_SHARD, false, {FSDP_DTYPE_F16, FSDP_DTYPE_F16}});
    run((mp_case){FSDP_NO_SHARD, false, {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16}});
}

/* summon_full_params between a forward and its backward: the root unit still holds its bf16
 * parameters, which summon gathers again in f32, so writeback leaves every shard bit for bit as
 * it was; the backward then runs (gathering again) and the loss equals a run without the
 * summon. */
static fsdp_status summon_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_mesh *mesh = NULL;
    fsdp_group *dp = NULL;
    fsdp_module *m[2] = {NULL, NULL};
    fsdp_sharded *sh[2] = {NULL, NULL};
    double loss[2] = {0, 0};
    fsdp_status st = fsdp_mesh_create(ctx, 1, (int[]){4}, (const char *[]){"dp"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    fsdp_fully_shard_options o = {.group = dp, .mixed_precision = {.param_dtype = FSDP_DTYPE_BF16}};
    for (int k = 0; k < 2; k++) {
        if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, 1, &m[k]);
        if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m[k], SEED);
        if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m[k], &o, &sh[k]);
    }
    fsdp_param *flat = st == FSDP_OK ? fsdp_sharded_unit_flat_param(sh[0], 0) : NULL;
    int64_t n = flat ? fsdp_tensor_numel(fsdp_param_data(flat)) : 0;
    float before[256];
    if (st == FSDP_OK && n > 256)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "shard of %lld", (long long)n);
    if (st == FSDP_OK) memcpy(before, fsdp_tensor_f32(fsdp_param_data(flat)), (size_t)n * 4);
    int64_t off, len;
    fsdp_batch_range(ctx, dp, STACKED_BATCH, &off, &len);
    fsdp_tensor *x = NULL;
    const fsdp_tensor *out;
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 100, off, len, &x);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m[0], x, &out);
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh[0], NULL); /* writeback */
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh[0]);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx,
                        memcmp(before, fsdp_tensor_f32(fsdp_param_data(flat)), (size_t)n * 4) == 0,
                        "summon after a bf16 forward wrote rounded values back");
    /* the backward of that forward, then a whole step of each model: the same loss */
    if (st == FSDP_OK) {
        fsdp_tensor *dy = NULL;
        st = fsdp_tensor_create_like(ctx, out, &dy);
        if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dy, 0.0f);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, m[0], dy, NULL);
        fsdp_tensor_free(dy);
    }
    for (int k = 0; k < 2 && st == FSDP_OK; k++) st = step(ctx, m[k], dp, 1, &loss[k]);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, loss[0] == loss[1], "loss %.9g after the summon, %.9g without",
                        loss[0], loss[1]);
    fsdp_tensor_free(x);
    for (int k = 0; k < 2; k++) {
        fsdp_sharded_free(sh[k]);
        fsdp_module_free(m[k]);
    }
    fsdp_mesh_free(mesh);
    return st;
}

static void test_summon_after_forward(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, summon_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"bf16_params_f32_reduce", test_bf16_params_f32_reduce},
        {"bf16_params_bf16_reduce", test_bf16_params_bf16_reduce},
        {"f16_and_no_shard", test_f16_and_no_shard},
        {"summon_after_forward", test_summon_after_forward},
        {"replicate", test_replicate},
        {"replicate_refused", test_replicate_refused},
    };
    return fsdp_test_run(argc, argv, "mixed_precision", cases, sizeof cases / sizeof cases[0]);
}

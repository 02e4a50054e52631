/* test_replicate.c: replicated data parallelism (DDP) against the same model on one rank. The
 * replicate half of PyTorch's test_data_parallel.py, ported: SimpleMLP (and the seed's
 * transposing WrapperModule for input_batch_dim 1) trained with SGD and Adam on a global batch
 * that each rank slices by sample index. Every rank also trains the single-rank reference on
 * the whole batch with the loss divided by the data-parallel size (which is what DDP's gradient
 * averaging computes), through the seed's sequence of steps, and compares all parameters after
 * each step; replicas must stay bitwise equal, and the collectives of setup and of each step
 * are pinned (one broadcast and one all_reduce per bucket). Also no_sync accumulation, the
 * batch split, replicate over dp with TP over tp on a 2x2 mesh, and bad options. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_common.h" // defines: dp_build_model, dp_batch_block, dp_forward_backward
#include "harness.h"
#include "numerics.h" // defines: fsdp_test_adam_check

typedef enum optim_kind { OPT_SGD, OPT_ADAM } optim_kind;

typedef struct scenario {
    const char *name;
    int world;        /* ranks in all: dp * tp */
    int tp;           /* 1, or 2: a (dp, tp) mesh with net1 Colwise and net2 Rowwise over tp */
    int64_t batch;    /* global batch */
    int batch_dim;    /* 0; 1: the seed's WrapperModule, input (50, batch), output (8, batch) */
    optim_kind optim; /* SGD or Adam */
    fsdp_sgd_options sgd;
    fsdp_adam_options adam;
    int64_t bucket_bytes; /* 0: the 25 MiB default */
    int want_buckets;     /* gradient buckets = all_reduce calls per backward */
    int want_broadcasts;  /* broadcast buckets at setup */
} scenario;

/* Fails unless a and b hold the same bits. */
static fsdp_status check_bitwise(fsdp_ctx *ctx, const char *what, const fsdp_tensor *a,
                                 const fsdp_tensor *b) {
    FSDP_RANK_CHECK(ctx, fsdp_tensor_same_shape(a, b), "%s: shapes differ", what);
    FSDP_RANK_CHECK(ctx,
                    memcmp(fsdp_tensor_data(a), fsdp_tensor_data(b), fsdp_tensor_nbytes(a)) == 0,
                    "%s: values differ", what);
    return FSDP_OK;
}

/* ---- comparisons ---- */

typedef struct param_cmp {
    fsdp_module *dist;
    bool grad;
    double rtol, atol;
    const char *stage;
    double max_abs, max_val; /* the largest |difference| and |reference value| seen */
    double bulk_used;        /* Adam: the largest difference over the rule's bulk bound */
    int64_t exceptions;      /* Adam: the most elements beyond the bulk after one step */
} param_cmp;

/* Compares a reference parameter (or gradient) with the dist model's, gathered over tp. */
static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    param_cmp *c = user;
    fsdp_param *q = fsdp_module_get_param(c->dist, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "the replicated model has no parameter '%s'", name);
    fsdp_tensor *full;
    FSDP_TRY(fsdp_param_full_tensor(ctx, q, c->grad, &full));
    const fsdp_tensor *want = c->grad ? fsdp_param_grad(p) : fsdp_param_data(p);
    fsdp_status st = FSDP_OK;
    if (!fsdp_tensor_same_shape(full, want))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s %s: shapes differ", c->stage, name);
    const float *g = fsdp_tensor_f32(full), *w = fsdp_tensor_f32(want);
    for (int64_t i = 0; st == FSDP_OK && i < fsdp_tensor_numel(want); i++) {
        double d = fabs((double)g[i] - w[i]);
        if (d > c->max_abs) c->max_abs = d;
        if (fabs((double)w[i]) > c->max_val) c->max_val = fabs((double)w[i]);
        if (!(d <= c->atol + c->rtol * fabs((double)w[i])))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s %s%s: element %lld is %.9g, want %.9g",
                           c->stage, name, c->grad ? ".grad" : "", (long long)i, g[i], w[i]);
    }
    fsdp_tensor_free(full);
    return st;
}

/* All-gathers each local parameter (or gradient) of m over the group and checks that every
 * rank's copy has the same bits as this rank's. */
typedef struct replica_cmp {
    fsdp_group *group;
    bool grad;
} replica_cmp;

static fsdp_status replica_equal(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    const replica_cmp *c = user;
    const fsdp_tensor *t = c->grad ? fsdp_param_grad(p) : fsdp_param_data(p);
    int64_t n = fsdp_tensor_numel(t), all = n * fsdp_group_size(c->group);
    fsdp_tensor *flat = NULL, *gathered = NULL;
    fsdp_status st = fsdp_tensor_view(ctx, t, 0, 1, &n, &flat);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &all, &gathered);
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, c->group, gathered, flat, 0);
    for (int r = 0; st == FSDP_OK && r < fsdp_group_size(c->group); r++)
        if (memcmp(fsdp_tensor_f32(gathered) + r * n, fsdp_tensor_f32(t), (size_t)n * 4) != 0)
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s%s differs between dp ranks %d and %d", name,
                           c->grad ? ".grad" : "", r, fsdp_group_rank(c->group));
    fsdp_tensor_free(flat);
    fsdp_tensor_free(gathered);
    return st;
}

static int64_t calls(fsdp_ctx *ctx, fsdp_comm_op op, const char *group, fsdp_comm_phase phase) {
    fsdp_comm_filter f = {.op = op, .group = group, .phase = phase};
    return fsdp_comm_debug_query(ctx, &f).calls;
}

/* ---- the seed's _test_data_parallel ---- */

typedef struct rank_state {
    fsdp_mesh *mesh;
    fsdp_group *dp;
    fsdp_module *ref, *dist;
    fsdp_replicate *rep; /* borrowed from dist */
    fsdp_optimizer *ref_opt, *dist_opt;
    fsdp_tensor *x, *labels, *x_local, *labels_local, *sliced, *dref, *ddist;
    dp_adam_noise noise; /* Adam: the reference's rounding noise (dp_common.h) */
} rank_state;

static void rank_state_release(rank_state *rs) {
    fsdp_optimizer_free(rs->ref_opt);
    fsdp_optimizer_free(rs->dist_opt);
    dp_adam_noise_release(&rs->noise);
    fsdp_module_free(rs->ref);
    fsdp_module_free(rs->dist);
    fsdp_mesh_free(rs->mesh);
    fsdp_tensor *t[] = {rs->x,      rs->labels, rs->x_local, rs->labels_local,
                        rs->sliced, rs->dref,   rs->ddist};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) fsdp_tensor_free(t[i]);
}

/* The mesh (dp) or (dp, tp), the reference and the replicated model: every rank initialises
 * its replica from its own seed, so only the initial broadcast makes them equal. */
static fsdp_status setup_models(fsdp_ctx *ctx, int rank, const scenario *s, rank_state *rs) {
    int dp = s->world / s->tp;
    if (s->tp > 1)
        FSDP_TRY(
            fsdp_mesh_create(ctx, 2, (int[]){dp, s->tp}, (const char *[]){"dp", "tp"}, &rs->mesh));
    else
        FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){dp}, (const char *[]){"dp"}, &rs->mesh));
    FSDP_TRY(fsdp_mesh_get_group(ctx, rs->mesh, "dp", &rs->dp));
    FSDP_TRY(dp_build_model(ctx, s->batch_dim, DP_SEED, &rs->ref));
    FSDP_TRY(dp_build_model(ctx, s->batch_dim, DP_SEED + (uint64_t)rank, &rs->dist));
    if (s->tp > 1) {
        fsdp_mesh *tp;
        FSDP_TRY(fsdp_mesh_dim(ctx, rs->mesh, "tp", &tp));
        const char *prefix = s->batch_dim ? "mlp." : "";
        char k1[16], k2[16];
        snprintf(k1, sizeof k1, "%snet1", prefix);
        snprintf(k2, sizeof k2, "%snet2", prefix);
        fsdp_tp_plan_entry plan[] = {{k1, FSDP_COLWISE()}, {k2, FSDP_ROWWISE()}};
        FSDP_TRY(fsdp_tp_parallelize(ctx, rs->dist, tp, 2, plan, NULL));
    }
    /* DDP(model): the initial broadcast, one per bucket, and nothing else. */
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    FSDP_TRY(fsdp_replicate_apply(
        ctx, rs->dist, &(fsdp_replicate_options){.group = rs->dp, .bucket_bytes = s->bucket_bytes},
        &rs->rep));
    FSDP_TRY(fsdp_comm_debug_end(ctx));
    const fsdp_replicate *r = rs->rep;
    int64_t b = calls(ctx, FSDP_COMM_BROADCAST, "dp", FSDP_COMM_PHASE_ANY);
    int want_b = dp > 1 ? s->want_broadcasts : 0;
    FSDP_RANK_CHECK(ctx, b == want_b && fsdp_comm_debug_total(ctx).calls == b,
                    "%s: setup made %lld collectives (%lld broadcasts on dp), want %d broadcasts",
                    s->name, (long long)fsdp_comm_debug_total(ctx).calls, (long long)b, want_b);
    FSDP_RANK_CHECK(ctx, fsdp_replicate_num_buckets(r) == s->want_buckets,
                    "%s: %d buckets, want %d", s->name, fsdp_replicate_num_buckets(r),
                    s->want_buckets);
    FSDP_RANK_CHECK(ctx, fsdp_replicate_group(r) == rs->dp && fsdp_replicate_sync(r),
                    "%s: group or sync flag", s->name);
    param_cmp c = {.dist = rs->dist, .stage = "after the broadcast"};
    return fsdp_module_visit_params(ctx, rs->ref, compare_param, &c);
}

static fsdp_status make_optimizer(fsdp_ctx *ctx, const scenario *s, fsdp_module *m,
                                  fsdp_optimizer **out) {
    return s->optim == OPT_SGD ? fsdp_sgd_create(ctx, m, &s->sgd, out)
                               : fsdp_adam_create(ctx, m, &s->adam, out);
}

/* The global batch for the reference and this rank's slice for the replica: generated from
 * the global sample indices, and equal to fsdp_batch_slice of the global batch. */
static fsdp_status setup_data(fsdp_ctx *ctx, const scenario *s, rank_state *rs) {
    int64_t off, len;
    fsdp_batch_range(ctx, rs->dp, s->batch, &off, &len);
    FSDP_TRY(dp_batch_block(ctx, s->batch, DP_IN_DIM, s->batch_dim, 0, s->batch, 1, &rs->x));
    FSDP_TRY(dp_batch_block(ctx, s->batch, DP_OUT_DIM, s->batch_dim, 0, s->batch, 2, &rs->labels));
    FSDP_TRY(dp_batch_block(ctx, s->batch, DP_IN_DIM, s->batch_dim, off, len, 1, &rs->x_local));
    FSDP_TRY(
        dp_batch_block(ctx, s->batch, DP_OUT_DIM, s->batch_dim, off, len, 2, &rs->labels_local));
    FSDP_TRY(fsdp_batch_slice(ctx, rs->x, s->batch_dim, rs->dp, &rs->sliced));
    FSDP_TRY(check_bitwise(ctx, "batch_slice(inputs)", rs->sliced, rs->x_local));
    FSDP_TRY(fsdp_batch_slice(ctx, rs->labels, s->batch_dim, rs->dp, &rs->sliced)); /* reused */
    return check_bitwise(ctx, "batch_slice(labels)", rs->sliced, rs->labels_local);
}

/* One of the seed's steps on both models (zero_grad, forward, backward, step), with the
 * collectives of the replica's forward and backward pinned and its loss summed over dp
 * checked against the reference's; then every parameter is compared. */
static fsdp_status train_step(fsdp_ctx *ctx, const scenario *s, rank_state *rs, int step,
                              param_cmp *cmp) {
    int dp = s->world / s->tp;
    double ref_loss, loss;
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, rs->ref_opt));
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, rs->dist_opt));
    FSDP_TRY(dp_forward_backward(ctx, rs->ref, rs->x, rs->labels, (float)(1.0 / dp), &rs->dref,
                                 &ref_loss));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    FSDP_TRY(
        dp_forward_backward(ctx, rs->dist, rs->x_local, rs->labels_local, 1.0f, &rs->ddist, &loss));
    FSDP_TRY(fsdp_optimizer_step(ctx, rs->dist_opt));
    FSDP_TRY(fsdp_comm_debug_end(ctx));
    /* Backward: one all_reduce per bucket on dp, attributed to the root; TP adds its forward
     * all_reduce (net2's Partial output) on tp; nothing else, the step included. */
    int64_t ar = calls(ctx, FSDP_COMM_ALL_REDUCE, "dp", FSDP_COMM_PHASE_BACKWARD);
    fsdp_comm_filter root = {.op = FSDP_COMM_ALL_REDUCE, .group = "dp", .module = ""};
    int64_t tp_fwd = calls(ctx, FSDP_COMM_ALL_REDUCE, "tp", FSDP_COMM_PHASE_FORWARD);
    int want_ar = dp > 1 ? s->want_buckets : 0, want_tp = s->tp > 1 ? 1 : 0;
    FSDP_RANK_CHECK(ctx,
                    ar == want_ar && fsdp_comm_debug_query(ctx, &root).calls == want_ar &&
                        tp_fwd == want_tp && fsdp_comm_debug_total(ctx).calls == ar + tp_fwd,
                    "%s step %d: %lld all_reduce on dp in backward (want %d), %lld on tp in "
                    "forward (want %d), %lld collectives in all",
                    s->name, step, (long long)ar, want_ar, (long long)tp_fwd, want_tp,
                    (long long)fsdp_comm_debug_total(ctx).calls);
    FSDP_TRY(fsdp_optimizer_step(ctx, rs->ref_opt));
    if (rs->noise.model)
        FSDP_TRY(dp_adam_noise_step(ctx, &rs->noise, rs->x, rs->labels, (float)(1.0 / dp),
                                    fsdp_optimizer_lr(rs->ref_opt)));
    /* The losses of the dp ranks add up to the reference's. */
    char stage[64];
    snprintf(stage, sizeof stage, "%s step %d", s->name, step);
    FSDP_TRY(dp_check_loss_sum(ctx, rs->dp, loss, ref_loss, stage));
    cmp->stage = stage;
    if (rs->noise.model) {
        fsdp_test_adam_check c;
        FSDP_TRY(dp_adam_compare(ctx, &rs->noise, rs->ref, rs->dist, stage, &c));
        cmp->max_abs = fmax(cmp->max_abs, c.max_abs);
        cmp->bulk_used = fmax(cmp->bulk_used, c.max_abs / c.bulk);
        if (c.exceptions > cmp->exceptions) cmp->exceptions = c.exceptions;
    } else {
        FSDP_TRY(fsdp_module_visit_params(ctx, rs->ref, compare_param, cmp));
    }
    replica_cmp rc = {.group = rs->dp};
    return fsdp_module_visit_params(ctx, rs->dist, replica_equal, &rc);
}

static fsdp_status data_parallel_run(fsdp_ctx *ctx, int rank, const scenario *s, rank_state *rs) {
    FSDP_TRY(setup_models(ctx, rank, s, rs));
    FSDP_TRY(make_optimizer(ctx, s, rs->ref, &rs->ref_opt));
    FSDP_TRY(make_optimizer(ctx, s, rs->dist, &rs->dist_opt));
    if (s->optim == OPT_ADAM)
        FSDP_TRY(dp_adam_noise_init(ctx, &rs->noise, s->batch_dim, &s->adam, false));
    FSDP_TRY(setup_data(ctx, s, rs));
    /* The seed: train_step (the warm-up), then zero_grad and one more forward, backward and
     * step, then the step under test; parameters are compared after each. SGD: every element
     * within rtol 1e-5, atol 1e-6 (lr times a gradient summed over 128 samples in another order:
     * f32 rounding of about 1e-7 of gradients up to ~10, so about 5e-7 of parameters up to 4.6
     * after 3 steps with momentum; seen 4.8e-7). Adam: the statistical rule of tests/numerics.h
     * against the reference's rounding noise (dp_common.h). */
    param_cmp cmp = {.dist = rs->dist, .rtol = 1e-5, .atol = 1e-6};
    for (int step = 1; step <= 3; step++) FSDP_TRY(train_step(ctx, s, rs, step, &cmp));
    if (rank == 0)
        printf("\n    %s (%d ranks, batch %lld): max abs diff %.3g", s->name, s->world,
               (long long)s->batch, cmp.max_abs);
    if (rank == 0 && rs->noise.model)
        printf(" (%.2g x the bound, at most %lld elements beyond it)", cmp.bulk_used,
               (long long)cmp.exceptions);
    else if (rank == 0)
        printf(" (values up to %.3g)", cmp.max_val);
    return FSDP_OK;
}

static fsdp_status data_parallel_rank(fsdp_ctx *ctx, int rank, void *user) {
    rank_state rs = {0};
    fsdp_status st = data_parallel_run(ctx, rank, user, &rs);
    rank_state_release(&rs);
    return st;
}

static void run_scenario(const scenario *s) {
    FSDP_TEST_OK(fsdp_test_run_world(s->world, 0, data_parallel_rank, (void *)s));
}

/* 2, 3 and 4 ranks: 128 samples split 64/64 and 43/43/42; on 4 ranks 127 samples (32/32/32/31)
 * so that the split is uneven there too. Not 126: with it, one net1.weight gradient element of
 * the non-0-batch-dim case cancels to 3e-8 of the sum of its terms, and Adam's first step
 * (about lr * g / (|g| + eps)) turns the rounding of that near-zero value into a 0.06
 * difference: an ill-conditioned comparison, not a replication error (SGD agrees there). The
 * parameter comparison's rule allows such an element (tests/numerics.h), but the next step's
 * loss moves by 0.04 with it, beyond dp_check_loss_sum's bound. */
static scenario on_world(scenario s, int world) {
    s.world = world;
    s.batch = world == 4 ? 127 : 128;
    return s;
}

/* The seed's 2 ranks, and 3 and 4 for uneven batch slices. */
static void run_on_worlds_2_to_4(scenario s) {
    for (int w = 2; w <= 4; w++) {
        scenario sw = on_world(s, w);
        run_scenario(&sw);
    }
}

/* SimpleMLP's parameters in registration order: net1.weight 6400 bytes, net1.bias 128,
 * net2.weight 1024, net2.bias 32. Gradient buckets take them last first (DDP's rebuilt
 * buckets) and close once they hold bucket_bytes (the first 1 MiB with the default): the
 * default takes all four in one; 1024 bytes gives {net2.bias, net2.weight} {net1.bias,
 * net1.weight}; 1 byte one per parameter. The broadcast buckets of setup take them in
 * registration order, as DDP's initial sync does: 1024 bytes gives three there. */
static void test_replicate_sgd(void) {
    /* The seed's three configs. foreach=True only changes how PyTorch groups its kernels (one
     * multi-tensor launch instead of one per parameter); the update is the same math, which
     * is the only SGD libfsdp has, so the third config differs from the second in buckets. */
    static const scenario configs[] = {
        {.name = "sgd{lr 0.1}", .sgd = {.lr = 0.1}, .want_buckets = 1, .want_broadcasts = 1},
        {.name = "sgd{lr 0.1, momentum 0.9}",
         .sgd = {.lr = 0.1, .momentum = 0.9},
         .bucket_bytes = 1024,
         .want_buckets = 2,
         .want_broadcasts = 3},
        {.name = "sgd{lr 0.1, momentum 0.9, foreach}",
         .sgd = {.lr = 0.1, .momentum = 0.9},
         .bucket_bytes = 1,
         .want_buckets = 4,
         .want_broadcasts = 4},
    };
    for (int c = 0; c < 3; c++) {
        scenario s = configs[c];
        s.tp = 1;
        s.optim = OPT_SGD;
        run_on_worlds_2_to_4(s);
    }
}

static void test_replicate_adam_fused(void) {
    /* fused=True: libfsdp's Adam is always one pass per parameter (src/optim/update.c). */
    scenario s = {.name = "adam{lr 0.1, fused}",
                  .tp = 1,
                  .optim = OPT_ADAM,
                  .adam = {.lr = 0.1},
                  .want_buckets = 1,
                  .want_broadcasts = 1};
    run_on_worlds_2_to_4(s);
}

/* The seed's test_fully_shard_non_0_batch_dim under replicate: WrapperModule transposes its
 * (50, batch) input, and each rank slices the batch along dim 1 (input_batch_dim = 1). */
static void test_replicate_non_0_batch_dim(void) {
    scenario s = {.name = "non_0_batch_dim adam{lr 0.1}",
                  .tp = 1,
                  .batch_dim = 1,
                  .optim = OPT_ADAM,
                  .adam = {.lr = 0.1},
                  .want_buckets = 1,
                  .want_broadcasts = 1};
    run_on_worlds_2_to_4(s);
}

/* A global batch of 3 on 4 ranks: the last rank's slice is empty; it still joins every
 * all_reduce with zero gradients, and the average is over all 4 ranks, as in DDP. */
static void test_replicate_empty_slice(void) {
    scenario s = {.name = "empty slice sgd{lr 0.1, momentum 0.9}",
                  .world = 4,
                  .tp = 1,
                  .batch = 3,
                  .optim = OPT_SGD,
                  .sgd = {.lr = 0.1, .momentum = 0.9},
                  .want_buckets = 1,
                  .want_broadcasts = 1};
    run_scenario(&s);
}

/* Mesh (dp 2, tp 2): net1 Colwise and net2 Rowwise over tp, then replicate over dp. Gradients
 * of the TP parameters are local shards, averaged over dp all the same. Forward: net2's Partial
 * output is one all_reduce on tp; backward: the model input needs no gradient, so nothing on
 * tp; one all_reduce per bucket on dp. Setup: one broadcast on dp (the local shards). */
static void test_replicate_tp_2x2(void) {
    scenario sgd = {.name = "2x2 dp+tp sgd{lr 0.1, momentum 0.9}",
                    .world = 4,
                    .tp = 2,
                    .batch = 128,
                    .optim = OPT_SGD,
                    .sgd = {.lr = 0.1, .momentum = 0.9},
                    .want_buckets = 1,
                    .want_broadcasts = 1};
    run_scenario(&sgd);
    scenario adam = {.name = "2x2 dp+tp adam{lr 0.1}",
                     .world = 4,
                     .tp = 2,
                     .batch = 128,
                     .optim = OPT_ADAM,
                     .adam = {.lr = 0.1},
                     .bucket_bytes = 1,
                     .want_buckets = 4,
                     .want_broadcasts = 4};
    run_scenario(&adam);
    scenario wrapped = {.name = "2x2 dp+tp non_0_batch_dim sgd{lr 0.1}",
                        .world = 4,
                        .tp = 2,
                        .batch = 126,
                        .batch_dim = 1,
                        .optim = OPT_SGD,
                        .sgd = {.lr = 0.1},
                        .want_buckets = 1,
                        .want_broadcasts = 1};
    run_scenario(&wrapped);
}

/* ---- no_sync ---- */

/* Two micro-batches of 64 (global samples 0..63, then 64..127), each split over 2 ranks: the
 * first backward under no_sync communicates nothing, the second reduces what both
 * accumulated; the gradients then equal the reference's over all 128 samples (loss / 2), and
 * are bitwise equal on both ranks. */
static fsdp_status no_sync_run(fsdp_ctx *ctx, int rank, rank_state *rs) {
    scenario s = {.name = "no_sync",
                  .world = 2,
                  .tp = 1,
                  .batch = 128,
                  .want_buckets = 1,
                  .want_broadcasts = 1};
    FSDP_TRY(setup_models(ctx, rank, &s, rs));
    FSDP_TRY(dp_batch_block(ctx, 128, DP_IN_DIM, 0, 0, 128, 1, &rs->x));
    FSDP_TRY(dp_batch_block(ctx, 128, DP_OUT_DIM, 0, 0, 128, 2, &rs->labels));
    double loss;
    FSDP_TRY(dp_forward_backward(ctx, rs->ref, rs->x, rs->labels, 0.5f, &rs->dref, &loss));
    for (int micro = 0; micro < 2; micro++) {
        int64_t off, len;
        fsdp_batch_range(ctx, rs->dp, 64, &off, &len);
        fsdp_tensor_free(rs->x_local);
        fsdp_tensor_free(rs->labels_local);
        rs->x_local = rs->labels_local = NULL;
        FSDP_TRY(dp_batch_block(ctx, 128, DP_IN_DIM, 0, 64 * micro + off, len, 1, &rs->x_local));
        FSDP_TRY(
            dp_batch_block(ctx, 128, DP_OUT_DIM, 0, 64 * micro + off, len, 2, &rs->labels_local));
        fsdp_replicate_set_sync(rs->rep, micro == 1);
        FSDP_TRY(fsdp_comm_debug_begin(ctx));
        FSDP_TRY(dp_forward_backward(ctx, rs->dist, rs->x_local, rs->labels_local, 1.0f, &rs->ddist,
                                     &loss));
        FSDP_TRY(fsdp_comm_debug_end(ctx));
        int64_t total = fsdp_comm_debug_total(ctx).calls;
        int64_t ar = calls(ctx, FSDP_COMM_ALL_REDUCE, "dp", FSDP_COMM_PHASE_BACKWARD);
        FSDP_RANK_CHECK(ctx, micro == 0 ? total == 0 : (ar == 1 && total == 1),
                        "no_sync micro-batch %d: %lld collectives (%lld all_reduce)", micro,
                        (long long)total, (long long)ar);
    }
    param_cmp cmp = {
        .dist = rs->dist, .grad = true, .rtol = 1e-5, .atol = 1e-6, .stage = "no_sync gradient"};
    FSDP_TRY(fsdp_module_visit_params(ctx, rs->ref, compare_param, &cmp));
    replica_cmp rc = {.group = rs->dp, .grad = true};
    FSDP_TRY(fsdp_module_visit_params(ctx, rs->dist, replica_equal, &rc));
    if (rank == 0)
        printf("\n    no_sync gradients: max abs diff %.3g (values up to %.3g)", cmp.max_abs,
               cmp.max_val);
    return FSDP_OK;
}

static fsdp_status no_sync_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    rank_state rs = {0};
    fsdp_status st = no_sync_run(ctx, rank, &rs);
    rank_state_release(&rs);
    return st;
}

static void test_replicate_no_sync(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, no_sync_rank, NULL));
}

/* ---- clip_grad_norm on (dp 2, tp 2) ---- */

/* After a backward of the replicated TP model, clip_grad_norm gives the reference's norm
 * (of its gradients over the whole batch, loss / 2) with one all_reduce on tp (the Shard
 * parameters' sums) and none on dp (replicas hold equal gradients and count once), and the
 * clipped gradients equal the reference's and stay bitwise equal across dp. */
static fsdp_status clip_run(fsdp_ctx *ctx, int rank, double norm_type, rank_state *rs) {
    scenario s = {.name = "clip 2x2",
                  .world = 4,
                  .tp = 2,
                  .batch = 128,
                  .want_buckets = 1,
                  .want_broadcasts = 1};
    FSDP_TRY(setup_models(ctx, rank, &s, rs));
    FSDP_TRY(setup_data(ctx, &s, rs));
    double loss, ref_norm, ref_again, norm;
    FSDP_TRY(dp_forward_backward(ctx, rs->ref, rs->x, rs->labels, 0.5f, &rs->dref, &loss));
    FSDP_TRY(
        dp_forward_backward(ctx, rs->dist, rs->x_local, rs->labels_local, 1.0f, &rs->ddist, &loss));
    FSDP_TRY(fsdp_clip_grad_norm(ctx, rs->ref, 1e30, norm_type, &ref_norm)); /* no clipping */
    double max_norm = 0.25 * ref_norm;
    FSDP_TRY(fsdp_clip_grad_norm(ctx, rs->ref, max_norm, norm_type, &ref_again));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    FSDP_TRY(fsdp_clip_grad_norm(ctx, rs->dist, max_norm, norm_type, &norm));
    FSDP_TRY(fsdp_comm_debug_end(ctx));
    int64_t tp = calls(ctx, FSDP_COMM_ALL_REDUCE, "tp", FSDP_COMM_PHASE_ANY);
    FSDP_RANK_CHECK(ctx, tp == 1 && fsdp_comm_debug_total(ctx).calls == 1,
                    "clip made %lld collectives (%lld all_reduce on tp), want 1 on tp",
                    (long long)fsdp_comm_debug_total(ctx).calls, (long long)tp);
    FSDP_RANK_CHECK(ctx, fabs(norm - ref_norm) <= 1e-6 * ref_norm,
                    "p = %g: norm %.9g, reference %.9g", norm_type, norm, ref_norm);
    param_cmp cmp = {
        .dist = rs->dist, .grad = true, .rtol = 1e-5, .atol = 1e-7, .stage = "clipped"};
    FSDP_TRY(fsdp_module_visit_params(ctx, rs->ref, compare_param, &cmp));
    replica_cmp rc = {.group = rs->dp, .grad = true};
    FSDP_TRY(fsdp_module_visit_params(ctx, rs->dist, replica_equal, &rc));
    if (rank == 0)
        printf("\n    p = %g: norm %.9g vs %.9g, clipped grads max abs diff %.3g (up to %.3g)",
               norm_type, norm, ref_norm, cmp.max_abs, cmp.max_val);
    return FSDP_OK;
}

static fsdp_status clip_rank(fsdp_ctx *ctx, int rank, void *user) {
    rank_state rs = {0};
    fsdp_status st = clip_run(ctx, rank, *(const double *)user, &rs);
    rank_state_release(&rs);
    return st;
}

static void test_replicate_tp_clip(void) {
    double p2 = 2.0, inf = INFINITY;
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, clip_rank, &p2));
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, clip_rank, &inf));
}

/* ---- the batch split ---- */

/* ---- reduction during backward ---- */

/* A pre-backward hook on net1, whose gradients are the last the backward computes: how many
 * all_reduce calls had started by then. */
static fsdp_status count_started(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    *(int64_t *)user = fsdp_comm_debug_total(ctx).calls;
    return FSDP_OK;
}

/* The same replica twice, reducing during backward (the default) and after it, with one
 * bucket per parameter ({net2.bias} {net2.weight} {net1.bias} {net1.weight}): during backward
 * the first two buckets' all_reduces have started when net1's backward begins, after backward
 * none has; both make the same 4 all_reduces, and give bitwise equal gradients and, after SGD,
 * parameters, step after step (local backend: each call made as it starts; MPI: in flight
 * until the root's post-backward hook waits). */
static fsdp_status overlap_run(fsdp_ctx *ctx, int rank, const fsdp_replicate_options *how,
                               fsdp_module **m, fsdp_optimizer **opt, fsdp_tensor **data) {
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    int64_t started[2] = {-1, -1}, off, len;
    fsdp_batch_range(ctx, NULL, 64, &off, &len);
    FSDP_TRY(dp_batch_block(ctx, 64, DP_IN_DIM, 0, off, len, 1, &data[0]));
    FSDP_TRY(dp_batch_block(ctx, 64, DP_OUT_DIM, 0, off, len, 2, &data[1]));
    for (int k = 0; k < 2; k++) {
        FSDP_TRY(dp_build_model(ctx, 0, DP_SEED + (uint64_t)rank, &m[k]));
        fsdp_replicate_options o = {.bucket_bytes = 1,
                                    .reduce_after_backward = k == 1,
                                    .comm_hook = how->comm_hook,
                                    .mixed_precision = how->mixed_precision};
        fsdp_replicate *r;
        FSDP_TRY(fsdp_replicate_apply(ctx, m[k], &o, &r));
        FSDP_RANK_CHECK(ctx, fsdp_replicate_num_buckets(r) == 4, "%d buckets, want 4",
                        fsdp_replicate_num_buckets(r));
        FSDP_TRY(fsdp_module_add_hook(ctx, fsdp_module_child(m[k], 0), FSDP_HOOK_PRE_BACKWARD,
                                      count_started, &started[k], NULL, NULL));
        FSDP_TRY(
            fsdp_sgd_create(ctx, m[k], &(fsdp_sgd_options){.lr = 0.1, .momentum = 0.9}, &opt[k]));
    }
    for (int step = 1; step <= 3; step++) {
        for (int k = 0; k < 2; k++) {
            double loss;
            FSDP_TRY(fsdp_optimizer_zero_grad(ctx, opt[k]));
            FSDP_TRY(fsdp_comm_debug_begin(ctx));
            FSDP_TRY(dp_forward_backward(ctx, m[k], data[0], data[1], 1.0f, &data[2 + k], &loss));
            FSDP_TRY(fsdp_comm_debug_end(ctx));
            fsdp_comm_filter root = {
                .op = FSDP_COMM_ALL_REDUCE, .module = "", .phase = FSDP_COMM_PHASE_BACKWARD};
            int64_t total = fsdp_comm_debug_total(ctx).calls, want_started = k == 0 ? 2 : 0;
            if (W == 1) want_started = 0;
            FSDP_RANK_CHECK(ctx,
                            total == (W > 1 ? 4 : 0) &&
                                fsdp_comm_debug_query(ctx, &root).calls == total &&
                                started[k] == want_started,
                            "%s backward, step %d: %lld all_reduces had started when net1's "
                            "backward began (want %lld), %lld in all (want %d, all the root's "
                            "in backward)",
                            k == 0 ? "during" : "after", step, (long long)started[k],
                            (long long)want_started, (long long)total, W > 1 ? 4 : 0);
        }
        char stage[64];
        snprintf(stage, sizeof stage, "step %d gradients", step);
        param_cmp g = {.dist = m[0], .grad = true, .stage = stage};
        FSDP_TRY(fsdp_module_visit_params(ctx, m[1], compare_param, &g));
        FSDP_RANK_CHECK(ctx, g.max_abs == 0, "%s differ by %g", stage, g.max_abs);
        for (int k = 0; k < 2; k++) FSDP_TRY(fsdp_optimizer_step(ctx, opt[k]));
        snprintf(stage, sizeof stage, "step %d parameters", step);
        param_cmp p = {.dist = m[0], .stage = stage};
        FSDP_TRY(fsdp_module_visit_params(ctx, m[1], compare_param, &p));
        FSDP_RANK_CHECK(ctx, p.max_abs == 0, "%s differ by %g", stage, p.max_abs);
    }
    replica_cmp rc = {.group = fsdp_ctx_world_group(ctx)};
    return fsdp_module_visit_params(ctx, m[0], replica_equal, &rc);
}

static fsdp_status overlap_rank(fsdp_ctx *ctx, int rank, void *user) {
    fsdp_module *m[2] = {0};
    fsdp_optimizer *opt[2] = {0};
    fsdp_tensor *data[4] = {0};
    fsdp_status st = overlap_run(ctx, rank, user, m, opt, data);
    for (int k = 0; k < 2; k++) fsdp_optimizer_free(opt[k]), fsdp_module_free(m[k]);
    for (int k = 0; k < 4; k++) fsdp_tensor_free(data[k]);
    return st;
}

/* The default hook in f32, and the 16-bit reductions started on the buckets' works (the bf16
 * and fp16 hooks, reduce_dtype bf16), bitwise their blocking reduction after backward. */
static void test_replicate_during_backward(void) {
    static const fsdp_replicate_options how[] = {
        {0},
        {.comm_hook.kind = FSDP_COMM_HOOK_BF16},
        {.comm_hook.kind = FSDP_COMM_HOOK_FP16},
        {.mixed_precision.reduce_dtype = FSDP_DTYPE_BF16},
    };
    for (size_t h = 0; h < sizeof how / sizeof how[0]; h++)
        for (int w = 1; w <= 4; w++)
            FSDP_TEST_OK(fsdp_test_run_world(w, 0, overlap_rank, (void *)&how[h]));
}

/* A root that runs only its first child, "used": "unused" never runs forward or backward (the
 * parameters PyTorch's DDP calls unused). */
static fsdp_status skip_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    return fsdp_module_forward(ctx, fsdp_module_child(m, 0), in, out);
}
static fsdp_status skip_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    return fsdp_module_backward(ctx, fsdp_module_child(m, 0), dout, din);
}
static const fsdp_module_ops skip_ops = {
    .kind = "SkipUnused", .forward = skip_forward, .backward = skip_backward};

static fsdp_status fill_grad(fsdp_ctx *ctx, fsdp_module *m, const char *name, float v) {
    fsdp_param *p = fsdp_module_get_param(m, name);
    FSDP_RANK_CHECK(ctx, p, "no parameter '%s'", name);
    return fsdp_tensor_fill(ctx, fsdp_param_grad(p), v);
}

/* Unused parameters: their buckets ({unused.bias} and {unused.weight} come first) start when
 * the root's backward ends, so the buckets of "used" wait for them (DDP's order); what the
 * unused gradients hold (here rank + 1, as if accumulated earlier) is averaged as after
 * backward, and the used gradients are bitwise those of the after-backward schedule, with the
 * same 4 all_reduces. */
static fsdp_status unused_run(fsdp_ctx *ctx, int rank, fsdp_module **m, fsdp_tensor **t) {
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){3, 6}, &t[0]));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){3, 4}, &t[1]));
    FSDP_TRY(fsdp_tensor_fill(ctx, t[0], 0.25f * (float)(rank + 1)));
    FSDP_TRY(fsdp_tensor_fill(ctx, t[1], 1.0f));
    for (int k = 0; k < 2; k++) {
        fsdp_module *a = NULL, *b = NULL;
        FSDP_TRY(fsdp_module_create(ctx, &skip_ops, NULL, &m[k]));
        FSDP_TRY(fsdp_linear_create(ctx, 6, 4, true, &a));
        FSDP_TRY(fsdp_module_add_child(ctx, m[k], "used", a));
        FSDP_TRY(fsdp_linear_create(ctx, 6, 4, true, &b));
        FSDP_TRY(fsdp_module_add_child(ctx, m[k], "unused", b));
        fsdp_replicate_options o = {.bucket_bytes = 1, .reduce_after_backward = k == 1};
        FSDP_TRY(fsdp_replicate_apply(ctx, m[k], &o, NULL));
        FSDP_TRY(fill_grad(ctx, m[k], "unused.weight", (float)(rank + 1)));
        FSDP_TRY(fill_grad(ctx, m[k], "unused.bias", (float)(rank + 1)));
        const fsdp_tensor *y;
        FSDP_TRY(fsdp_comm_debug_begin(ctx));
        FSDP_TRY(fsdp_module_forward(ctx, m[k], t[0], &y));
        FSDP_TRY(fsdp_module_backward(ctx, m[k], t[1], NULL));
        FSDP_TRY(fsdp_comm_debug_end(ctx));
        int64_t total = fsdp_comm_debug_total(ctx).calls;
        FSDP_RANK_CHECK(ctx, total == (W > 1 ? 4 : 0), "%s backward: %lld all_reduces, want %d",
                        k == 0 ? "during" : "after", (long long)total, W > 1 ? 4 : 0);
        const fsdp_tensor *g = fsdp_param_grad(fsdp_module_get_param(m[k], "unused.weight"));
        float want = (float)(W + 1) / 2.0f; /* the mean of 1..W, exact in f32 */
        for (int64_t e = 0; e < fsdp_tensor_numel(g); e++)
            FSDP_RANK_CHECK(ctx, fsdp_tensor_f32(g)[e] == want,
                            "%s backward: unused.weight.grad[%lld] is %.9g, want %.9g",
                            k == 0 ? "during" : "after", (long long)e, fsdp_tensor_f32(g)[e], want);
    }
    param_cmp c = {.dist = m[0], .grad = true, .stage = "unused parameters"};
    FSDP_TRY(fsdp_module_visit_params(ctx, m[1], compare_param, &c));
    FSDP_RANK_CHECK(ctx, c.max_abs == 0, "gradients differ by %g", c.max_abs);
    return FSDP_OK;
}

static fsdp_status unused_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m[2] = {0};
    fsdp_tensor *t[2] = {0};
    fsdp_status st = unused_run(ctx, rank, m, t);
    for (int k = 0; k < 2; k++) fsdp_module_free(m[k]), fsdp_tensor_free(t[k]);
    return st;
}

static void test_replicate_unused_params(void) {
    for (int w = 1; w <= 4; w++) FSDP_TEST_OK(fsdp_test_run_world(w, 0, unused_rank, NULL));
}

/* A (4, 7, 5) tensor whose element values are their flat indices, sliced over 3 ranks along
 * each dim (7 rows: 3/3/1) and over 4 ranks along dim 0 (4: 1/1/1/1) and dim 2 (5: 2/2/1/0,
 * an empty slice), f32 and bf16, with *out reused. */
static fsdp_status batch_slice_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_group *world = fsdp_ctx_world_group(ctx);
    int w = fsdp_group_size(world);
    int64_t shape[3] = {4, 7, 5};
    fsdp_tensor *g = NULL, *gb = NULL, *out = NULL, *outb = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, shape, &g);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 3, shape, &gb);
    if (st == FSDP_OK) {
        for (int i = 0; i < 140; i++) fsdp_tensor_f32(g)[i] = (float)i;
        st = fsdp_tensor_copy(ctx, gb, g);
    }
    for (int dim = -1; st == FSDP_OK && dim < 3; dim++) {
        int d = dim < 0 ? 2 : dim;
        int64_t off, len;
        fsdp_batch_range(ctx, NULL, shape[d], &off, &len);
        int64_t chunk = (shape[d] + w - 1) / w, want_off = rank * chunk;
        int64_t want_len = want_off >= shape[d]          ? 0
                           : shape[d] - want_off < chunk ? shape[d] - want_off
                                                         : chunk;
        if (want_off > shape[d]) want_off = shape[d];
        FSDP_RANK_CHECK(ctx, len == want_len && (len == 0 || off == want_off),
                        "batch_range(%lld) on rank %d: [%lld, +%lld)", (long long)shape[d], rank,
                        (long long)off, (long long)len);
        st = fsdp_batch_slice(ctx, g, dim, NULL, &out);
        if (st == FSDP_OK) st = fsdp_batch_slice(ctx, gb, dim, NULL, &outb);
        if (st != FSDP_OK) break;
        FSDP_RANK_CHECK(
            ctx, fsdp_tensor_dim(out, d) == len && fsdp_tensor_numel(out) * shape[d] == 140 * len,
            "slice shape along %d", dim);
        const float *o = fsdp_tensor_f32(out);
        int64_t k = 0;
        for (int64_t a = 0; a < fsdp_tensor_dim(out, 0); a++)
            for (int64_t b = 0; b < fsdp_tensor_dim(out, 1); b++)
                for (int64_t c = 0; c < fsdp_tensor_dim(out, 2); c++, k++) {
                    int64_t idx[3] = {a, b, c};
                    idx[d] += off;
                    float want = (float)((idx[0] * 7 + idx[1]) * 5 + idx[2]);
                    FSDP_RANK_CHECK(ctx,
                                    o[k] == want && fsdp_bf16_to_f32(
                                                        ((fsdp_bf16 *)fsdp_tensor_data(outb))[k]) ==
                                                        fsdp_bf16_to_f32(fsdp_bf16_from_f32(want)),
                                    "slice along %d: element (%lld, %lld, %lld) is %g, want %g",
                                    dim, (long long)a, (long long)b, (long long)c, o[k], want);
                }
    }
    if (st == FSDP_OK) {
        fsdp_status bad = fsdp_batch_slice(ctx, g, 3, NULL, &out);
        FSDP_RANK_CHECK(
            ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "batch dim 3"),
            "bad dim: %s", fsdp_last_error(ctx));
        bad = fsdp_batch_slice(ctx, gb, 0, NULL, &out);
        FSDP_RANK_CHECK(ctx,
                        bad == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "bf16"),
                        "dtype mismatch: %s", fsdp_last_error(ctx));
    }
    fsdp_tensor_free(g);
    fsdp_tensor_free(gb);
    fsdp_tensor_free(out);
    fsdp_tensor_free(outb);
    return st;
}

static void test_batch_slice(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 0, batch_slice_rank, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, batch_slice_rank, NULL));
}

/* ---- options ---- */

static fsdp_status options_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    (void)user;
    fsdp_module *m = NULL;
    fsdp_status st = dp_build_model(ctx, 0, DP_SEED, &m);
    if (st == FSDP_OK) {
        fsdp_status bad =
            fsdp_replicate_apply(ctx, m, &(fsdp_replicate_options){.src_rank = 2}, NULL);
        FSDP_RANK_CHECK(
            ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "src_rank 2"),
            "src_rank: %s", fsdp_last_error(ctx));
        bad = fsdp_replicate_apply(ctx, m, &(fsdp_replicate_options){.bucket_bytes = -1}, NULL);
        FSDP_RANK_CHECK(
            ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "bucket_bytes"),
            "bucket_bytes: %s", fsdp_last_error(ctx));
        /* FSDP_NO_SRC_RANK: no collective at setup. */
        st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK)
            st = fsdp_replicate_apply(
                ctx, m, &(fsdp_replicate_options){.src_rank = FSDP_NO_SRC_RANK}, NULL);
        if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 0,
                            "FSDP_NO_SRC_RANK communicated");
        /* Twice on one model would average twice. */
        if (st == FSDP_OK) {
            bad = fsdp_replicate_apply(ctx, m, NULL, NULL);
            FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_STATE && strstr(fsdp_last_error(ctx), "already"),
                            "applied twice: %s", fsdp_last_error(ctx));
        }
    }
    fsdp_module_free(m);
    return st;
}

static void test_replicate_options(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, options_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"replicate_sgd", test_replicate_sgd},
        {"replicate_adam_fused", test_replicate_adam_fused},
        {"replicate_non_0_batch_dim", test_replicate_non_0_batch_dim},
        {"replicate_empty_slice", test_replicate_empty_slice},
        {"replicate_tp_2x2", test_replicate_tp_2x2},
        {"replicate_no_sync", test_replicate_no_sync},
        {"replicate_during_backward", test_replicate_during_backward},
        {"replicate_unused_params", test_replicate_unused_params},
        {"replicate_tp_clip", test_replicate_tp_clip},
        {"batch_slice", test_batch_slice},
        {"replicate_options", test_replicate_options},
    };
    return fsdp_test_run(argc, argv, "replicate", cases, sizeof cases / sizeof cases[0]);
}

/* test_seeds_dp.c: two of PyTorch's data-parallel tests, ported.
 *
 * Seed 004, test/distributed/_composable/test_replicate_with_compiler.py: torch.compile itself
 * has no C analogue; its intents are kept. The seed's Net (fc1 ... fc4, Linear(2000, 2000), no
 * activation) under replicate with the default bucket caps makes exactly 3 buckets, so 3
 * all_reduce per backward (_test_bucketing's ddp_buckets == 3), with and without fc1
 * checkpointed (the seed's Net(checkpoint=True)); no_sync accumulation equals one big batch
 * (test_compile_cpu_no_sync); and DDP_TP_Test.test_ddp_tp: the 2-D Net (fc1, fc3 Colwise and fc2,
 * fc4 Rowwise over tp, replicate over dp) gives the gradients of the un-parallelized model. The
 * seed's shapes (2000) are kept everywhere.
 *
 * Seed 002, test/distributed/tensor/parallel/test_ddp_2d_parallel.py,
 * test_2d_ddp_integration_functionality, on 4 ranks (dp 2 x tp 2): MLPModule as plain DDP over
 * all 4 ranks and as TP (net1 Colwise, net2 Rowwise) + DDP over dp, both from seed 0; Adam lr
 * 3e-5; the input rand(4, 10) from seed dp_rank + 1: outputs equal, gradients equal (the 2-D
 * ones redistributed to Replicate), one step, parameters equal, then a forward of rand(16, 10)
 * from seed dp_rank + 1004 gives equal outputs. "Equal" is the seed's assertEqual for float32:
 * the two models sum the same terms in different orders (TP splits net2's dot products; the
 * averages are over 4 and over 2 ranks), so they agree to rounding, not bitwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "numerics.h" // defines: fsdp_test_sum_tol, fsdp_test_adam_check

/* Under ThreadSanitizer, which runs each access some 10 times slower (this suite took 181 s of
 * the CI machine's TSan run at 2000), Net(400), as test_seeds_device does: the same code paths,
 * rank threads and bucket logic; the seed's 3 buckets need its width (below), so there the
 * bucket count is checked against the all_reduce count instead. */
#ifdef UNDER_TSAN
#define DIM 400
#else
#define DIM 2000
#endif
#define SEED002_LR 3e-5 /* seed 002's Adam */

static int64_t count(fsdp_ctx *ctx, fsdp_comm_op op, const char *group, fsdp_comm_phase phase) {
    fsdp_comm_filter f = {.op = op, .group = group, .phase = phase};
    return fsdp_comm_debug_query(ctx, &f).calls;
}

/* Forward and backward of sum(m(x)); *dout is kept between calls (the caller frees it). */
static fsdp_status sum_step(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *x, fsdp_tensor **dout,
                            const fsdp_tensor **y) {
    const fsdp_tensor *out;
    FSDP_TRY(fsdp_module_forward(ctx, m, x, &out));
    if (!*dout) FSDP_TRY(fsdp_tensor_create_like(ctx, out, dout));
    FSDP_TRY(fsdp_tensor_resize(ctx, *dout, fsdp_tensor_ndim(out), fsdp_tensor_shape(out)));
    FSDP_TRY(fsdp_tensor_fill(ctx, *dout, 1.0f));
    if (y) *y = out;
    return fsdp_module_backward(ctx, m, *dout, NULL);
}

/* *out <- a new copy of t. */
static fsdp_status clone(fsdp_ctx *ctx, const fsdp_tensor *t, fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create_like(ctx, t, out));
    return fsdp_tensor_copy(ctx, *out, t);
}

/* Compares every parameter (or gradient) of ref with dist's, gathered as its placements say:
 * |got - want| <= atol + tol max|want| + rtol |want| per tensor. */
typedef struct cmp {
    fsdp_module *dist;
    bool grad;
    double rtol, atol, tol, max_abs;
    const char *stage;
} cmp;

/* Net's gradients: fc1's passes back through fc4, fc3 and fc2 (three sums of DIM terms), fc4's
 * through the forward's three, then the sum over the samples: fsdp_test_sum_tol(DIM, 4) =
 * 4.3e-5 of each tensor's largest value (tests/numerics.h). The old rtol 1e-5 + atol 1e-6 was
 * below the random-walk estimate of this rounding for the gradients' smaller elements (used up
 * to 0.67 under the Prescott kernel). */
#define NET_GRAD_TOL fsdp_test_sum_tol(DIM, 4)

static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    cmp *c = user;
    fsdp_param *q = fsdp_module_get_param(c->dist, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "%s: no parameter '%s'", c->stage, name);
    fsdp_tensor *full;
    FSDP_TRY(fsdp_param_full_tensor(ctx, q, c->grad, &full));
    char what[128];
    snprintf(what, sizeof what, "%s: %s%s", c->stage, name, c->grad ? ".grad" : "");
    double m = 0.0;
    const fsdp_tensor *want = c->grad ? fsdp_param_grad(p) : fsdp_param_data(p);
    double atol =
        c->atol + c->tol * fsdp_test_max_abs(fsdp_tensor_f32(want), fsdp_tensor_numel(want));
    fsdp_status st = fsdp_test_rank_close(ctx, what, full, want, c->rtol, atol, &m);
    if (m > c->max_abs) c->max_abs = m;
    fsdp_tensor_free(full);
    return st;
}

/* ---- seed 004: bucketing ---- */

/* Net under replicate over 2 ranks with the default caps, fc1 checkpointed or not: 3 buckets
 * (last parameters first: {fc4.bias, fc4.weight} closes the 1 MiB first bucket, {fc3.bias,
 * fc3.weight, fc2.bias, fc2.weight} reaches 25 MiB, {fc1.bias, fc1.weight} is the rest), and
 * one step makes exactly 3 all_reduce, all in backward, and nothing else. */
static fsdp_status bucketing_run(fsdp_ctx *ctx, int rank, bool ckpt, float **grads) {
    fsdp_module *m = NULL;
    fsdp_replicate *r = NULL;
    fsdp_tensor *x = NULL, *dout = NULL;
    fsdp_status st = fsdp_model_net(ctx, DIM, &m);
    if (st == FSDP_OK && ckpt) st = fsdp_checkpoint_wrap(ctx, fsdp_module_find(m, "fc1"));
    if (st == FSDP_OK) st = fsdp_replicate_apply(ctx, m, NULL, &r);
    if (st == FSDP_OK) {
        static const int want_params[3] = {2, 4, 2};
        int nb = fsdp_replicate_num_buckets(r);
        bool ok = DIM != 2000 || nb == 3;
        for (int b = 0; ok && DIM == 2000 && b < 3; b++)
            ok = fsdp_replicate_bucket_num_params(r, b) == want_params[b];
        FSDP_RANK_CHECK(ctx, ok, "Net%s: %d buckets (want 3 of 2, 4 and 2 parameters)",
                        ckpt ? " with fc1 checkpointed" : "", nb);
        x = fsdp_test_random(2, (int64_t[]){1, DIM}, -1.0f, 1.0f, 100 + (uint64_t)rank);
        st = x ? fsdp_comm_debug_begin(ctx) : FSDP_ERR_OUT_OF_MEMORY;
    }
    if (st == FSDP_OK) st = sum_step(ctx, m, x, &dout, NULL);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        int64_t ar = count(ctx, FSDP_COMM_ALL_REDUCE, NULL, FSDP_COMM_PHASE_BACKWARD);
        int64_t total = fsdp_comm_debug_total(ctx).calls;
        int64_t nb = fsdp_replicate_num_buckets(r); /* 3 at the seed's width (checked above) */
        FSDP_RANK_CHECK(ctx, ar == nb && total == nb,
                        "Net%s: %lld all_reduce in backward, %lld collectives (want %lld and %lld)",
                        ckpt ? " with fc1 checkpointed" : "", (long long)ar, (long long)total,
                        (long long)nb, (long long)nb);
        if (rank == 0)
            printf("\n    Net(%d)%s: %d buckets of %lld, %lld, %lld elements; %lld all_reduce per "
                   "backward",
                   DIM, ckpt ? " fc1 checkpointed" : "", fsdp_replicate_num_buckets(r),
                   (long long)fsdp_replicate_bucket_numel(r, 0),
                   (long long)fsdp_replicate_bucket_numel(r, 1),
                   (long long)fsdp_replicate_bucket_numel(r, 2), (long long)ar);
    }
    int64_t n = 4 * (DIM * DIM + DIM), off = 0;
    *grads = st == FSDP_OK ? malloc((size_t)n * sizeof **grads) : NULL;
    for (int i = 1; st == FSDP_OK && *grads && i <= 4; i++) {
        const char *names[2] = {"weight", "bias"};
        for (int k = 0; k < 2; k++) {
            char path[16];
            snprintf(path, sizeof path, "fc%d.%s", i, names[k]);
            const fsdp_tensor *g = fsdp_param_grad(fsdp_module_get_param(m, path));
            memcpy(*grads + off, fsdp_tensor_data(g), fsdp_tensor_nbytes(g));
            off += fsdp_tensor_numel(g);
        }
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(dout);
    fsdp_module_free(m);
    return st;
}

static fsdp_status bucketing_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    float *plain = NULL, *ck = NULL;
    fsdp_status st = bucketing_run(ctx, rank, false, &plain);
    if (st == FSDP_OK) st = bucketing_run(ctx, rank, true, &ck);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(
            ctx, plain && ck && memcmp(plain, ck, (size_t)4 * (DIM * DIM + DIM) * sizeof *ck) == 0,
            "Net: gradients with fc1 checkpointed differ from those without");
    free(plain);
    free(ck);
    return st;
}

static void test_seed004_bucketing(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, bucketing_rank, NULL));
}

/* ---- seed 004: no_sync ---- */

/* Global batch of 4 rows over 2 ranks: rank r's samples are rows r and 2 + r. Replica A runs
 * them as two micro-batches, the first under no_sync (no collective), the second synchronising
 * (3 all_reduce, one per bucket); replica B runs them as one batch of 2. Their averaged gradients
 * agree. */
static fsdp_status no_sync_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *a = NULL, *b = NULL;
    fsdp_replicate *ra = NULL;
    fsdp_tensor *xg = fsdp_test_random(2, (int64_t[]){4, DIM}, -1.0f, 1.0f, 7), *x1 = NULL,
                *x2 = NULL, *xb = NULL, *dout = NULL;
    FSDP_RANK_CHECK(ctx, xg != NULL, "out of memory");
    fsdp_status st = fsdp_model_net(ctx, DIM, &a);
    if (st == FSDP_OK) st = fsdp_model_net(ctx, DIM, &b);
    if (st == FSDP_OK) st = fsdp_replicate_apply(ctx, a, NULL, &ra);
    if (st == FSDP_OK) st = fsdp_replicate_apply(ctx, b, NULL, NULL);
    int64_t row[2] = {rank, 2 + rank};
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){1, DIM}, &x1);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){1, DIM}, &x2);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){2, DIM}, &xb);
    if (st == FSDP_OK) {
        const float *g = fsdp_tensor_f32(xg);
        memcpy(fsdp_tensor_f32(x1), g + row[0] * DIM, DIM * sizeof(float));
        memcpy(fsdp_tensor_f32(x2), g + row[1] * DIM, DIM * sizeof(float));
        memcpy(fsdp_tensor_f32(xb), g + row[0] * DIM, DIM * sizeof(float));
        memcpy(fsdp_tensor_f32(xb) + DIM, g + row[1] * DIM, DIM * sizeof(float));
        fsdp_replicate_set_sync(ra, false);
        st = fsdp_comm_debug_begin(ctx);
    }
    if (st == FSDP_OK) st = sum_step(ctx, a, x1, &dout, NULL);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 0,
                        "no_sync: the accumulating backward made %lld collectives",
                        (long long)fsdp_comm_debug_total(ctx).calls);
    if (st == FSDP_OK) {
        fsdp_replicate_set_sync(ra, true);
        st = fsdp_comm_debug_begin(ctx);
    }
    if (st == FSDP_OK) st = sum_step(ctx, a, x2, &dout, NULL);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) /* one per bucket: 3 at the seed's width (seed004_bucketing) */
        FSDP_RANK_CHECK(ctx,
                        count(ctx, FSDP_COMM_ALL_REDUCE, NULL, FSDP_COMM_PHASE_BACKWARD) ==
                            fsdp_replicate_num_buckets(ra),
                        "no_sync: the synchronising backward made %lld all_reduce, want %d",
                        (long long)count(ctx, FSDP_COMM_ALL_REDUCE, NULL, FSDP_COMM_PHASE_ANY),
                        fsdp_replicate_num_buckets(ra));
    if (st == FSDP_OK) st = sum_step(ctx, b, xb, &dout, NULL);
    cmp c = {.dist = a, .grad = true, .tol = NET_GRAD_TOL, .stage = "no_sync vs one batch"};
    if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, b, compare_param, &c);
    if (st == FSDP_OK && rank == 0)
        printf("\n    no_sync (2 micro-batches) vs one batch of 2 per rank: max abs diff %.3g",
               c.max_abs);
    fsdp_tensor *t[] = {xg, x1, x2, xb, dout};
    for (int i = 0; i < 5; i++) fsdp_tensor_free(t[i]);
    fsdp_module_free(a);
    fsdp_module_free(b);
    return st;
}

static void test_seed004_no_sync(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, no_sync_rank, NULL));
}

/* ---- seed 004: DDP_TP_Test.test_ddp_tp ---- */

/* Mesh (dp 2, tp 2). The 2-D Net takes this dp rank's sample (one row); the un-parallelized
 * reference runs both dp ranks' samples and halves its gradients (replicate's average). */
static fsdp_status ddp_tp_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_mesh *mesh = NULL, *tp = NULL;
    fsdp_group *dp = NULL;
    fsdp_module *ref = NULL, *twod = NULL;
    fsdp_tensor *xg = fsdp_test_random(2, (int64_t[]){2, DIM}, -1.0f, 1.0f, 9), *xl = NULL,
                *x0 = NULL, *dout = NULL, *dref = NULL;
    FSDP_RANK_CHECK(ctx, xg != NULL, "out of memory");
    fsdp_status st = fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    if (st == FSDP_OK) st = fsdp_mesh_dim(ctx, mesh, "tp", &tp);
    if (st == FSDP_OK) st = fsdp_model_net(ctx, DIM, &ref);
    if (st == FSDP_OK) st = fsdp_model_net(ctx, DIM, &twod);
    fsdp_tp_plan_entry plan[] = {{"fc1", FSDP_COLWISE()},
                                 {"fc2", FSDP_ROWWISE()},
                                 {"fc3", FSDP_COLWISE()},
                                 {"fc4", FSDP_ROWWISE()}};
    if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, twod, tp, 4, plan, NULL);
    if (st == FSDP_OK)
        st = fsdp_replicate_apply(ctx, twod, &(fsdp_replicate_options){.group = dp}, NULL);
    if (st == FSDP_OK) st = fsdp_batch_slice(ctx, xg, 0, dp, &xl);
    if (st == FSDP_OK) st = sum_step(ctx, twod, xl, &dout, NULL);
    /* The reference: each dp rank's sample in turn, gradients accumulated, then halved. */
    for (int s = 0; s < 2 && st == FSDP_OK; s++) {
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){1, DIM}, &x0);
        if (st == FSDP_OK) {
            memcpy(fsdp_tensor_f32(x0), fsdp_tensor_f32(xg) + s * DIM, DIM * sizeof(float));
            st = sum_step(ctx, ref, x0, &dref, NULL);
        }
        fsdp_tensor_free(x0);
        x0 = NULL;
    }
    for (int i = 1; st == FSDP_OK && i <= 4; i++) {
        const char *names[2] = {"weight", "bias"};
        for (int k = 0; k < 2; k++) {
            char path[16];
            snprintf(path, sizeof path, "fc%d.%s", i, names[k]);
            fsdp_tensor *g = fsdp_param_grad(fsdp_module_get_param(ref, path));
            float *v = fsdp_tensor_f32(g);
            for (int64_t e = 0; e < fsdp_tensor_numel(g); e++) v[e] *= 0.5f;
        }
    }
    cmp c = {.dist = twod, .grad = true, .tol = NET_GRAD_TOL, .stage = "ddp_tp"};
    if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, ref, compare_param, &c);
    if (st == FSDP_OK && rank == 0)
        printf("\n    2-D Net (dp 2 x tp 2) vs un-parallelized: gradients max abs diff %.3g",
               c.max_abs);
    fsdp_tensor *t[] = {xg, xl, dout, dref};
    for (int i = 0; i < 4; i++) fsdp_tensor_free(t[i]);
    fsdp_module_free(ref);
    fsdp_module_free(twod);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_seed004_ddp_tp(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, ddp_tp_rank, NULL));
}

/* ---- seed 002: test_2d_ddp_integration_functionality ---- */

static fsdp_status seed002_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_mesh *mesh = NULL, *tp = NULL;
    fsdp_group *dp = NULL;
    fsdp_module *model = NULL, *twod = NULL;
    fsdp_optimizer *opt = NULL, *twod_opt = NULL;
    fsdp_tensor *x = NULL, *dout = NULL, *dout2 = NULL, *out1 = NULL;
    const fsdp_tensor *y, *y2;
    /* torch.manual_seed(0) before each MLPModule: the same parameters in both. */
    fsdp_status st = fsdp_model_mlp_module(ctx, &model);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, model, 0);
    if (st == FSDP_OK) st = fsdp_model_mlp_module(ctx, &twod);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, twod, 0);
    if (st == FSDP_OK) st = fsdp_replicate_apply(ctx, model, NULL, NULL); /* DDP(model) */
    if (st == FSDP_OK)
        st = fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    if (st == FSDP_OK) st = fsdp_mesh_dim(ctx, mesh, "tp", &tp);
    fsdp_tp_plan_entry plan[] = {{"net1", FSDP_COLWISE()}, {"net2", FSDP_ROWWISE()}};
    if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, twod, tp, 2, plan, NULL);
    if (st == FSDP_OK)
        st = fsdp_replicate_apply(ctx, twod, &(fsdp_replicate_options){.group = dp}, NULL);
    if (st == FSDP_OK)
        st = fsdp_adam_create(ctx, model, &(fsdp_adam_options){.lr = SEED002_LR}, &opt);
    if (st == FSDP_OK)
        st = fsdp_adam_create(ctx, twod, &(fsdp_adam_options){.lr = SEED002_LR}, &twod_opt);
    int dp_rank = dp ? fsdp_group_rank(dp) : 0;
    /* torch.manual_seed(dp_rank + 1); rand(4, 10) */
    if (st == FSDP_OK) {
        x = fsdp_test_random(2, (int64_t[]){4, 10}, 0.0f, 1.0f, (uint64_t)dp_rank + 1);
        if (!x) st = FSDP_ERR_OUT_OF_MEMORY;
    }
    if (st == FSDP_OK) st = sum_step(ctx, model, x, &dout, &y);
    if (st == FSDP_OK) st = clone(ctx, y, &out1);
    if (st == FSDP_OK) st = sum_step(ctx, twod, x, &dout2, &y2);
    /* "Equal" as the seed's assertEqual for float32 (rtol 1.3e-6, atol 1e-5), with rtol 1e-5:
     * MLPModule's sums have at most 16 terms (4 rows, 10 and 16 features), 2 or 3 deep, so
     * the outputs and gradients (of order 1) differ by a few u; seen 0.008 of the bound. */
    double m = 0.0;
    if (st == FSDP_OK) st = fsdp_test_rank_close(ctx, "seed 002 output", y2, out1, 1e-5, 1e-5, &m);
    cmp c = {.dist = twod, .grad = true, .rtol = 1e-5, .atol = 1e-5, .stage = "seed 002 grads"};
    if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, model, compare_param, &c);
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, twod_opt);
    /* One Adam step moves each element by lr g / (|g| + eps): lr up to eps / |g|, whatever the
     * rounding of g, unless the two runs' gradients have opposite signs, which takes |g| below
     * its rounding error; such an element differs by up to 2 lr. The rule of tests/numerics.h:
     * every element within the seed's bound, at most 2 within 2 lr (none seen). */
    fsdp_test_adam_check p = {.bulk = 1e-5,
                              .bulk_rtol = 1e-5,
                              .move = 2.0 * SEED002_LR * fsdp_test_adam_max_move(0.9, 0.999, 1),
                              .max_exceptions = 2};
    char why[256];
    if (st == FSDP_OK) st = fsdp_test_adam_add_model(ctx, &p, model, twod);
    if (st == FSDP_OK && !fsdp_test_adam_ok(&p, why, sizeof why))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "seed 002 params after Adam: %s", why);
    /* torch.manual_seed(dp_rank + 1004); rand(16, 10); forward only. */
    fsdp_tensor_free(x);
    x = NULL;
    if (st == FSDP_OK) {
        x = fsdp_test_random(2, (int64_t[]){16, 10}, 0.0f, 1.0f, (uint64_t)dp_rank + 1004);
        if (!x) st = FSDP_ERR_OUT_OF_MEMORY;
    }
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, model, x, &y);
    fsdp_tensor_free(out1);
    out1 = NULL;
    if (st == FSDP_OK) st = clone(ctx, y, &out1);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, twod, x, &y2);
    double m2 = 0.0;
    if (st == FSDP_OK)
        st = fsdp_test_rank_close(ctx, "seed 002 second output", y2, out1, 1e-5, 1e-5, &m2);
    if (st == FSDP_OK && rank == 0)
        printf("\n    seed 002: output %.3g, grads %.3g, params after Adam %.3g, batch-16 output "
               "%.3g (max abs diffs)",
               m, c.max_abs, p.max_abs, m2);
    fsdp_tensor *t[] = {x, dout, dout2, out1};
    for (int i = 0; i < 4; i++) fsdp_tensor_free(t[i]);
    fsdp_optimizer_free(opt);
    fsdp_optimizer_free(twod_opt);
    fsdp_module_free(model);
    fsdp_module_free(twod);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_seed002_2d_ddp_integration(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, seed002_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"seed004_bucketing", test_seed004_bucketing},
        {"seed004_no_sync", test_seed004_no_sync},
        {"seed004_ddp_tp", test_seed004_ddp_tp},
        {"seed002_2d_ddp_integration", test_seed002_2d_ddp_integration},
    };
    return fsdp_test_run(argc, argv, "seeds_dp", cases, sizeof cases / sizeof cases[0]);
}

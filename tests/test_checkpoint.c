/* test_checkpoint.c: activation checkpointing (fsdp_checkpoint_wrap, PyTorch's
 * checkpoint_wrapper). MLPStacked (4 blocks of net1 Linear(10, 16), relu, net2 Linear(16, 10))
 * runs two steps twice, plain and with every block checkpointed: on one rank, under FSDP
 * (FULL_SHARD with a unit per block, and with the root as the only unit), under replicate, and
 * under replicate over dp with TP over tp on a 2x2 mesh. Outputs and gradients must be bitwise
 * equal; the activation bytes held between forward and backward, and their peak over the step,
 * are measured (fsdp_module_activation_bytes, sampled by hooks on every module) and must drop;
 * the collectives are compared op by op. Also the Llama model with every decoder layer
 * checkpointed (bitwise gradients), and the misuse the wrapper refuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define LAYERS 4
#define BATCH  256

typedef enum dp_mode {
    MODE_NONE,
    MODE_FSDP_UNITS,  /* a unit per block: the checkpointed modules are units */
    MODE_FSDP_LAYERS, /* one non-root unit, "layers", around the checkpointed blocks */
    MODE_FSDP_ROOT,   /* the root is the only unit */
    MODE_REPLICATE
} dp_mode;

typedef struct ck_case {
    const char *name;
    int world, tp;
    dp_mode mode;
} ck_case;

/* What one run measured on this rank. */
typedef struct run_result {
    float *out, *grads; /* the second step's output and gradients (local shards), concatenated */
    int64_t n_out, n_grads;
    int64_t kept;       /* activation bytes held after the second forward */
    int64_t peak;       /* the most held at any module boundary of the second step */
    int64_t ops[3];     /* all_gather, reduce_scatter, all_reduce in the second step, any group */
    int64_t ops_bwd[3]; /* the same, backward phase */
} run_result;

typedef struct sampler {
    fsdp_module *root;
    int64_t peak;
} sampler;

static fsdp_status sample(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                          const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    sampler *s = user;
    int64_t b;
    FSDP_TRY(fsdp_module_activation_bytes(ctx, s->root, &b));
    if (b > s->peak) s->peak = b;
    return FSDP_OK;
}

static fsdp_status add_samplers(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    FSDP_TRY(fsdp_module_add_hook(ctx, m, FSDP_HOOK_POST_FORWARD, sample, user, NULL, NULL));
    FSDP_TRY(fsdp_module_add_hook(ctx, m, FSDP_HOOK_PRE_BACKWARD, sample, user, NULL, NULL));
    return fsdp_module_add_hook(ctx, m, FSDP_HOOK_POST_BACKWARD, sample, user, NULL, NULL);
}

typedef struct vec {
    float *v;
    int64_t n;
} vec;

static fsdp_status append(fsdp_ctx *ctx, vec *d, const fsdp_tensor *t) {
    int64_t n = fsdp_tensor_numel(t);
    float *p = realloc(d->v, (size_t)(d->n + n + 1) * sizeof *p);
    FSDP_RANK_CHECK(ctx, p != NULL, "out of memory");
    d->v = p;
    memcpy(d->v + d->n, fsdp_tensor_data(t), (size_t)n * sizeof *p);
    d->n += n;
    return FSDP_OK;
}

static fsdp_status collect_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    return append(ctx, user, fsdp_param_grad(p));
}

static const char *const unit_paths[LAYERS] = {"layers.0", "layers.1", "layers.2", "layers.3"};

/* Builds the model on its mesh, wraps it, runs two steps and measures the second. */
static fsdp_status one_run(fsdp_ctx *ctx, const ck_case *c, bool ckpt, run_result *r) {
    fsdp_mesh *mesh = NULL;
    fsdp_group *dp = NULL;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_tensor *x = NULL, *xl = NULL, *dout = NULL;
    sampler smp = {0};
    int dpn = c->world / c->tp;
    fsdp_status st =
        c->tp > 1
            ? fsdp_mesh_create(ctx, 2, (int[]){dpn, c->tp}, (const char *[]){"dp", "tp"}, &mesh)
            : fsdp_mesh_create(ctx, 1, (int[]){dpn}, (const char *[]){"dp"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, LAYERS, &m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, 5);
    if (st == FSDP_OK && c->tp > 1) {
        fsdp_mesh *tp;
        fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                     {"layers.*.net2", FSDP_ROWWISE()}};
        st = fsdp_mesh_dim(ctx, mesh, "tp", &tp);
        if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, m, tp, 2, plan, NULL);
    }
    for (int i = 0; ckpt && st == FSDP_OK && i < LAYERS; i++)
        st = fsdp_checkpoint_wrap(ctx, fsdp_module_find(m, unit_paths[i]));
    if (st == FSDP_OK && c->mode >= MODE_FSDP_UNITS && c->mode <= MODE_FSDP_ROOT) {
        static const char *const layers_path[] = {"layers"};
        fsdp_fully_shard_options o = {.group = dp};
        if (c->mode == MODE_FSDP_UNITS) o.wrap_paths = unit_paths, o.n_wrap_paths = LAYERS;
        if (c->mode == MODE_FSDP_LAYERS) o.wrap_paths = layers_path, o.n_wrap_paths = 1;
        st = fsdp_fully_shard(ctx, m, &o, &sh);
    }
    if (st == FSDP_OK && c->mode == MODE_REPLICATE)
        st = fsdp_replicate_apply(ctx, m, &(fsdp_replicate_options){.group = dp}, NULL);
    smp.root = m;
    if (st == FSDP_OK) st = fsdp_module_visit(ctx, m, add_samplers, &smp);
    if (st == FSDP_OK) {
        x = fsdp_test_random(2, (int64_t[]){BATCH, 10}, -1.0f, 1.0f, 3);
        st = x ? fsdp_batch_slice(ctx, x, 0, dp, &xl) : FSDP_ERR_OUT_OF_MEMORY;
    }
    for (int step = 0; step < 2 && st == FSDP_OK; step++) {
        const fsdp_tensor *y;
        fsdp_module *params = sh ? fsdp_sharded_flat_params(sh) : m;
        if (step == 1) {
            st = fsdp_comm_debug_begin(ctx);
            smp.peak = 0;
        }
        if (st == FSDP_OK) st = fsdp_module_zero_grad(ctx, params);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, xl, &y);
        if (st == FSDP_OK && step == 1) {
            vec o = {0};
            st = fsdp_module_activation_bytes(ctx, m, &r->kept);
            if (st == FSDP_OK) st = append(ctx, &o, y);
            r->out = o.v, r->n_out = o.n;
        }
        if (st == FSDP_OK && !dout) st = fsdp_tensor_create_like(ctx, y, &dout);
        if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dout, 1.0f);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dout, NULL);
        if (st == FSDP_OK && step == 1) {
            vec g = {0};
            st = fsdp_comm_debug_end(ctx);
            if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, params, collect_grad, &g);
            r->grads = g.v, r->n_grads = g.n;
        }
    }
    static const fsdp_comm_op ops[3] = {FSDP_COMM_ALL_GATHER, FSDP_COMM_REDUCE_SCATTER,
                                        FSDP_COMM_ALL_REDUCE};
    for (int i = 0; st == FSDP_OK && i < 3; i++) {
        fsdp_comm_filter f = {.op = ops[i], .phase = FSDP_COMM_PHASE_ANY};
        r->ops[i] = fsdp_comm_debug_query(ctx, &f).calls;
        f.phase = FSDP_COMM_PHASE_BACKWARD;
        r->ops_bwd[i] = fsdp_comm_debug_query(ctx, &f).calls;
    }
    r->peak = smp.peak;
    fsdp_tensor_free(x);
    fsdp_tensor_free(xl);
    fsdp_tensor_free(dout);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static fsdp_status bitwise(fsdp_ctx *ctx, const char *what, const char *name, const float *a,
                           int64_t na, const float *b, int64_t nb) {
    FSDP_RANK_CHECK(ctx, na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0,
                    "%s: %s differ with checkpointing (%lld vs %lld values)", name, what,
                    (long long)na, (long long)nb);
    return FSDP_OK;
}

static fsdp_status compare_rank(fsdp_ctx *ctx, int rank, void *user) {
    const ck_case *c = user;
    run_result plain = {0}, ck = {0};
    fsdp_status st = one_run(ctx, c, false, &plain);
    if (st == FSDP_OK) st = one_run(ctx, c, true, &ck);
    if (st == FSDP_OK)
        st = bitwise(ctx, "outputs", c->name, plain.out, plain.n_out, ck.out, ck.n_out);
    if (st == FSDP_OK)
        st = bitwise(ctx, "gradients", c->name, plain.grads, plain.n_grads, ck.grads, ck.n_grads);
    if (st == FSDP_OK && rank == 0)
        printf("\n    %s: activation bytes kept after forward %lld -> %lld, peak %lld -> %lld; "
               "all_gather %lld -> %lld (backward %lld -> %lld), reduce_scatter %lld -> %lld, "
               "all_reduce %lld -> %lld (backward %lld -> %lld)",
               c->name, (long long)plain.kept, (long long)ck.kept, (long long)plain.peak,
               (long long)ck.peak, (long long)plain.ops[0], (long long)ck.ops[0],
               (long long)plain.ops_bwd[0], (long long)ck.ops_bwd[0], (long long)plain.ops[1],
               (long long)ck.ops[1], (long long)plain.ops[2], (long long)ck.ops[2],
               (long long)plain.ops_bwd[2], (long long)ck.ops_bwd[2]);
    if (st == FSDP_OK) {
        /* Kept: each block's 3 buffers (net1 out, relu out, net2 out) drop to its output copy. */
        FSDP_RANK_CHECK(ctx, ck.kept < plain.kept && ck.peak < plain.peak,
                        "%s: activation bytes kept %lld -> %lld, peak %lld -> %lld", c->name,
                        (long long)plain.kept, (long long)ck.kept, (long long)plain.peak,
                        (long long)ck.peak);
        /* FSDP and replicate communicate exactly as without checkpointing; TP's net2 output
         * all_reduce (inside each checkpointed block) runs again in the recompute. */
        int64_t extra_ar = c->tp > 1 ? LAYERS : 0;
        FSDP_RANK_CHECK(ctx,
                        ck.ops[0] == plain.ops[0] && ck.ops[1] == plain.ops[1] &&
                            ck.ops[2] == plain.ops[2] + extra_ar,
                        "%s: collectives all_gather %lld/%lld reduce_scatter %lld/%lld "
                        "all_reduce %lld/%lld (+%lld expected)",
                        c->name, (long long)plain.ops[0], (long long)ck.ops[0],
                        (long long)plain.ops[1], (long long)ck.ops[1], (long long)plain.ops[2],
                        (long long)ck.ops[2], (long long)extra_ar);
    }
    free(plain.out), free(plain.grads), free(ck.out), free(ck.grads);
    return st;
}

static void run_case(const ck_case *c) {
    FSDP_TEST_OK(fsdp_test_run_world(c->world, 0, compare_rank, (void *)c));
}

static void test_checkpoint_one_rank(void) {
    run_case(&(ck_case){.name = "one rank", .world = 1, .tp = 1, .mode = MODE_NONE});
}

static void test_checkpoint_fsdp(void) {
    /* A unit per block, each block checkpointed: the recompute gathers the unit (it was
     * resharded after forward) and keeps it for the backward, which gathers nothing. */
    run_case(
        &(ck_case){.name = "FSDP, a unit per block", .world = 2, .tp = 1, .mode = MODE_FSDP_UNITS});
    /* The blocks inside one non-root unit: the unit is gathered again in its pre-backward (as
     * without checkpointing), so the recomputes inside its backward gather nothing. */
    run_case(&(ck_case){.name = "FSDP, blocks inside a non-root unit",
                        .world = 2,
                        .tp = 1,
                        .mode = MODE_FSDP_LAYERS});
    /* The root is the only unit: its parameters stay gathered; the recompute gathers nothing. */
    run_case(
        &(ck_case){.name = "FSDP, root unit only", .world = 2, .tp = 1, .mode = MODE_FSDP_ROOT});
}

static void test_checkpoint_replicate(void) {
    run_case(&(ck_case){.name = "replicate", .world = 2, .tp = 1, .mode = MODE_REPLICATE});
}

static void test_checkpoint_replicate_tp(void) {
    run_case(&(ck_case){
        .name = "replicate dp 2 x TP tp 2", .world = 4, .tp = 2, .mode = MODE_REPLICATE});
}

/* The Llama model (embedding, decoder layers with rotary attention and SwiGLU, norm, head)
 * with every decoder layer checkpointed: cross-entropy gradients bitwise equal, fewer bytes. */
static fsdp_status llama_run(fsdp_ctx *ctx, bool ckpt, float **grads, int64_t *n, int64_t *kept) {
    fsdp_llama_config cfg = {.dim = 32, .n_layers = 3, .n_heads = 4, .vocab_size = 64};
    fsdp_module *m;
    FSDP_TRY(fsdp_model_llama(ctx, &cfg, &m));
    int32_t ids[2 * 8], targets[2 * 8];
    for (int i = 0; i < 16; i++) ids[i] = (i * 7 + 3) % 64, targets[i] = (i * 5 + 1) % 64;
    fsdp_tensor *tok = NULL, *dlogits = NULL;
    fsdp_status st = FSDP_OK;
    for (int i = 0; ckpt && st == FSDP_OK && i < cfg.n_layers; i++) {
        char path[32];
        snprintf(path, sizeof path, "model.layers.%d", i);
        st = fsdp_checkpoint_wrap(ctx, fsdp_module_find(m, path));
    }
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){2, 8}, &tok);
    const fsdp_tensor *logits;
    float loss;
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, tok, &logits);
    if (st == FSDP_OK) st = fsdp_module_activation_bytes(ctx, m, kept);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, logits, &dlogits);
    if (st == FSDP_OK)
        st =
            fsdp_loss_cross_entropy_ignore(ctx, logits, targets, FSDP_IGNORE_INDEX, &loss, dlogits);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dlogits, NULL);
    vec g = {0};
    if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, m, collect_grad, &g);
    *grads = g.v, *n = g.n;
    fsdp_tensor_free(tok);
    fsdp_tensor_free(dlogits);
    fsdp_module_free(m);
    return st;
}

static void test_checkpoint_llama(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    float *plain = NULL, *ck = NULL;
    int64_t np = 0, nc = 0, kp = 0, kc = 0;
    FSDP_TEST_OK(llama_run(ctx, false, &plain, &np, &kp));
    FSDP_TEST_OK(llama_run(ctx, true, &ck, &nc, &kc));
    CU_ASSERT_TRUE(np == nc && np > 0 && memcmp(plain, ck, (size_t)np * sizeof *ck) == 0);
    CU_ASSERT_TRUE(kc < kp);
    printf("\n    Llama (3 layers, dim 32, batch 2 x 8): activation bytes kept %lld -> %lld",
           (long long)kp, (long long)kc);
    free(plain);
    free(ck);
}

/* Wrapped twice, inside a forward, or a second backward without a forward: refused. */
static void test_checkpoint_misuse(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    FSDP_TEST_OK(fsdp_model_mlp_module(ctx, &m));
    FSDP_TEST_OK(fsdp_checkpoint_wrap(ctx, m));
    FSDP_TEST_FAILS(fsdp_checkpoint_wrap(ctx, m), FSDP_ERR_STATE, "checkpointed already");
    fsdp_tensor *x = fsdp_test_random(2, (int64_t[]){3, 10}, -1.0f, 1.0f, 1), *dy;
    const fsdp_tensor *y;
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, y, &dy));
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, dy, 1.0f));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, NULL));
    FSDP_TEST_FAILS(fsdp_module_backward(ctx, m, dy, NULL), FSDP_ERR_STATE, "run a forward");
    int64_t b = -1;
    FSDP_TEST_OK(fsdp_module_activation_bytes(ctx, m, &b));
    CU_ASSERT_EQUAL(b, 0); /* everything released after backward */
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, x, &y));
    FSDP_TEST_OK(fsdp_module_activation_bytes(ctx, m, &b));
    CU_ASSERT_EQUAL(b, 3 * 10 * 4); /* only the output copy */
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dy, NULL));
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_module_free(m);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"checkpoint_one_rank", test_checkpoint_one_rank},
        {"checkpoint_fsdp", test_checkpoint_fsdp},
        {"checkpoint_replicate", test_checkpoint_replicate},
        {"checkpoint_replicate_tp", test_checkpoint_replicate_tp},
        {"checkpoint_llama", test_checkpoint_llama},
        {"checkpoint_misuse", test_checkpoint_misuse},
    };
    return fsdp_test_run(argc, argv, "checkpoint", cases, sizeof cases / sizeof cases[0]);
}

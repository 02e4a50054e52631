/* test_fsdp_misuse.c: the plausible mistakes with FSDP and replicate fail with a message that
 * names the fix, and leave the model and its gradients as they were: a data-parallel group
 * across tensor-parallel shards (given or defaulted), fsdp_module_zero_grad and an optimizer
 * on a wrapped model's own parameters, clipping a part of the shards alone, TP after FSDP,
 * summon_full_params inside forward and the model run inside summon_full_params,
 * freeing the model before its FSDP state, a model on a device while the rank's context is on
 * the CPU, or across two devices (replicate runs on CPU tensors only in this version; FSDP on
 * the rank's device, tests/test_fsdp_device.c). Also PyTorch's gradient divide factors. */
#include <stdlib.h>
#include <string.h>

#include "core/tensor_impl.h" // defines: fsdp_tensor_move
#include "dp/dp_impl.h"       // defines: fsdp_dp_divide_factors
#include "harness.h"
#include "stacked_batches.h"

#define SEED   7
#define LAYERS 3
#define SIM0   ((fsdp_device){FSDP_DEVICE_SIM, 0})

/* ---- a copy of every parameter value and gradient of a module, compared bitwise ---- */

typedef struct snapshot {
    fsdp_tensor *t[64];
    int n;
} snapshot;

static fsdp_status copy_into(fsdp_ctx *ctx, snapshot *s, const fsdp_tensor *t) {
    FSDP_RANK_CHECK(ctx, s->n < 64, "snapshot: too many tensors");
    FSDP_RANK_CHECK(ctx, fsdp_tensor_has_storage(t), "snapshot: a tensor without storage");
    FSDP_TRY(fsdp_tensor_create_like(ctx, t, &s->t[s->n]));
    return fsdp_tensor_copy(ctx, s->t[s->n++], t);
}

static fsdp_status snap_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    FSDP_TRY(copy_into(ctx, user, fsdp_param_data(p)));
    return copy_into(ctx, user, fsdp_param_grad(p));
}

static fsdp_status snapshot_take(fsdp_ctx *ctx, fsdp_module *m, snapshot *s) {
    memset(s, 0, sizeof *s);
    return fsdp_module_visit_params(ctx, m, snap_param, s);
}

typedef struct snap_cmp {
    const snapshot *s;
    int i;
    const char *what;
} snap_cmp;

static fsdp_status same_as(fsdp_ctx *ctx, snap_cmp *c, const fsdp_tensor *t, const char *name) {
    const fsdp_tensor *want = c->s->t[c->i++];
    FSDP_RANK_CHECK(ctx, fsdp_tensor_has_storage(t), "%s: %s lost its storage", c->what, name);
    FSDP_RANK_CHECK(
        ctx,
        fsdp_tensor_numel(t) == fsdp_tensor_numel(want) &&
            memcmp(fsdp_tensor_data(t), fsdp_tensor_data(want), fsdp_tensor_nbytes(want)) == 0,
        "%s: %s changed", c->what, name);
    return FSDP_OK;
}

static fsdp_status cmp_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    snap_cmp *c = user;
    FSDP_RANK_CHECK(ctx, c->i + 2 <= c->s->n, "%s: more parameters than before", c->what);
    FSDP_TRY(same_as(ctx, c, fsdp_param_data(p), name));
    return same_as(ctx, c, fsdp_param_grad(p), name);
}

/* Every parameter value and gradient of m equals the snapshot bit for bit. */
static fsdp_status snapshot_check(fsdp_ctx *ctx, fsdp_module *m, const snapshot *s,
                                  const char *what) {
    snap_cmp c = {s, 0, what};
    FSDP_TRY(fsdp_module_visit_params(ctx, m, cmp_param, &c));
    FSDP_RANK_CHECK(ctx, c.i == s->n, "%s: %d tensors, %d before", what, c.i, s->n);
    return FSDP_OK;
}

static void snapshot_free(snapshot *s) {
    for (int i = 0; i < s->n; i++) fsdp_tensor_free(s->t[i]);
    s->n = 0;
}

/* st must be FSDP_ERR_* `want` with a message holding every needle. */
static fsdp_status expect_fail(fsdp_ctx *ctx, fsdp_status st, fsdp_status want, const char *what,
                               const char *const *needles) {
    FSDP_RANK_CHECK(ctx, st == want, "%s returned %s, want %s", what, fsdp_status_to_string(st),
                    fsdp_status_to_string(want));
    const char *msg = fsdp_last_error(ctx);
    for (int i = 0; needles[i]; i++)
        FSDP_RANK_CHECK(ctx, msg && strstr(msg, needles[i]), "%s: message \"%s\" lacks \"%s\"",
                        what, msg ? msg : "(none)", needles[i]);
    return FSDP_OK;
}
#define EXPECT_FAIL(ctx, expr, want, ...)                                                          \
    FSDP_TRY(expect_fail((ctx), (expr), (want), #expr, (const char *const[]){__VA_ARGS__, NULL}))

static fsdp_status build(fsdp_ctx *ctx, fsdp_module **m) {
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, m));
    return fsdp_module_reset_parameters(ctx, *m, SEED);
}

/* A step's forward and backward on this rank's rows of a world of `world` ranks. */
static fsdp_status fwd_bwd(fsdp_ctx *ctx, fsdp_module *m, int rank, int world) {
    int64_t off, len;
    fsdp_chunk_range(STACKED_BATCH, world, rank, &off, &len);
    return stacked_forward_backward(ctx, m, 0, off, len, world);
}

/* ---- PyTorch's divide factors ---- */

static void test_divide_factors(void) {
    /* _get_gradient_predivide_factor: factor doubles while D % factor == 0 and
     * D / factor > factor; post = D / pre. */
    static const double want[9][2] = {{0, 0},   {1, 1},   {2, 1},   {2, 1.5}, {2, 2},
                                      {2, 2.5}, {4, 1.5}, {2, 3.5}, {4, 2}};
    for (int d = 1; d <= 8; d++) {
        double pre, post;
        fsdp_dp_divide_factors(d, &pre, &post);
        CU_ASSERT_EQUAL(pre, want[d][0]);
        CU_ASSERT_EQUAL(post, want[d][1]);
        CU_ASSERT_EQUAL(pre * post, (double)d);
    }
}

/* ---- a data-parallel group across TP shards ---- */

typedef struct mesh2d {
    fsdp_mesh *mesh, *tp;
    fsdp_group *dp_group, *tp_group;
} mesh2d;

static fsdp_status tp_model(fsdp_ctx *ctx, mesh2d *t, fsdp_module **m) {
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &t->mesh));
    FSDP_TRY(fsdp_mesh_dim(ctx, t->mesh, "tp", &t->tp));
    FSDP_TRY(fsdp_mesh_get_group(ctx, t->mesh, "dp", &t->dp_group));
    FSDP_TRY(fsdp_mesh_get_group(ctx, t->mesh, "tp", &t->tp_group));
    FSDP_TRY(build(ctx, m));
    fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                 {"layers.*.net2", FSDP_ROWWISE()}};
    FSDP_TRY(fsdp_tp_parallelize(ctx, *m, t->tp, 2, plan, NULL));
    /* Gradients that are not zero, so "unchanged" means something. */
    return fwd_bwd(ctx, *m, fsdp_mesh_coordinate(t->mesh, 0), 2);
}

static fsdp_status tp_group_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    mesh2d t = {0};
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    snapshot s = {0};
    fsdp_status st = tp_model(ctx, &t, &m);
    if (st == FSDP_OK) st = snapshot_take(ctx, m, &s);
    const char *fix = "fsdp_mesh_get_group(ctx, mesh, \"dp\"";
    if (st == FSDP_OK) {
        /* No group: the world, which crosses tp. */
        EXPECT_FAIL(ctx, fsdp_fully_shard(ctx, m, NULL, &sh), FSDP_ERR_INVALID_ARGUMENT,
                    "fsdp_fully_shard", "'tp'", "no group given", ".group", fix);
        EXPECT_FAIL(ctx, fsdp_replicate_apply(ctx, m, NULL, NULL), FSDP_ERR_INVALID_ARGUMENT,
                    "fsdp_replicate_apply", "'tp'", "no group given", fix);
        /* A group that holds ranks of both tp coordinates: the tp group itself. */
        EXPECT_FAIL(ctx,
                    fsdp_fully_shard(ctx, m, &(fsdp_fully_shard_options){.group = t.tp_group}, &sh),
                    FSDP_ERR_INVALID_ARGUMENT, "fsdp_fully_shard", "'tp'", fix);
        EXPECT_FAIL(
            ctx, fsdp_replicate_apply(ctx, m, &(fsdp_replicate_options){.group = t.tp_group}, NULL),
            FSDP_ERR_INVALID_ARGUMENT, "fsdp_replicate_apply", "'tp'", fix);
        st = snapshot_check(ctx, m, &s, "after the refused wraps");
    }
    FSDP_RANK_CHECK(ctx, sh == NULL, "a refused fsdp_fully_shard handed out a state");
    /* The dp group is right, and works after the refusals. */
    if (st == FSDP_OK)
        st = fsdp_replicate_apply(ctx, m, &(fsdp_replicate_options){.group = t.dp_group}, NULL);
    snapshot_free(&s);
    fsdp_module_free(m);
    fsdp_mesh_free(t.mesh);
    return st;
}

static void test_tp_group(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, tp_group_rank, NULL));
}

/* ---- the wrapped model's own parameters ---- */

/* A wrapped MLPStacked after one backward (shard gradients not zero). */
static fsdp_status wrapped(fsdp_ctx *ctx, int rank, int world, fsdp_module **m, fsdp_sharded **sh) {
    FSDP_TRY(build(ctx, m));
    static const char *paths[] = {"layers.1"};
    FSDP_TRY(fsdp_fully_shard(
        ctx, *m, &(fsdp_fully_shard_options){.wrap_paths = paths, .n_wrap_paths = 1}, sh));
    return fwd_bwd(ctx, *m, rank, world);
}

static fsdp_status own_params_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    snapshot s = {0};
    fsdp_status st = wrapped(ctx, rank, 2, &m, &sh);
    if (st == FSDP_OK) st = snapshot_take(ctx, fsdp_sharded_flat_params(sh), &s);
    if (st == FSDP_OK) {
        EXPECT_FAIL(ctx, fsdp_module_zero_grad(ctx, m), FSDP_ERR_STATE, "fsdp_module_zero_grad",
                    "fsdp_optimizer_zero_grad", "fsdp_sharded_flat_params");
        EXPECT_FAIL(ctx, fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.1}, &opt),
                    FSDP_ERR_STATE, "SGD", "fsdp_sharded_flat_params");
        EXPECT_FAIL(ctx, fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 0.1}, &opt),
                    FSDP_ERR_STATE, "Adam", "fsdp_sharded_flat_params");
        FSDP_RANK_CHECK(ctx, opt == NULL, "a refused optimizer was handed out");
        st = snapshot_check(ctx, fsdp_sharded_flat_params(sh), &s, "after the refused calls");
    }
    /* The right calls work: zero_grad on the shards, an optimizer over them. */
    if (st == FSDP_OK) st = fsdp_module_zero_grad(ctx, fsdp_sharded_flat_params(sh));
    if (st == FSDP_OK)
        st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_sgd_options){.lr = 0.1},
                             &opt);
    fsdp_optimizer_free(opt);
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    /* Unwrapped, the model is an ordinary one again. */
    if (st == FSDP_OK) st = fsdp_module_zero_grad(ctx, m);
    fsdp_module_free(m);
    return st;
}

static void test_own_params(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, own_params_rank, NULL));
}

/* ---- clipping a part of the shards ---- */

/* With use_orig_params the shards are a module tree; clip_grad_norm takes the whole of it (the
 * norm needs every group that shards a part) and refuses a module under it. */
static fsdp_status clip_part_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    snapshot s = {0};
    fsdp_status st = build(ctx, &m);
    static const char *paths[] = {"layers.1"};
    if (st == FSDP_OK)
        st = fsdp_fully_shard(ctx, m,
                              &(fsdp_fully_shard_options){
                                  .wrap_paths = paths, .n_wrap_paths = 1, .use_orig_params = true},
                              &sh);
    if (st == FSDP_OK) st = fwd_bwd(ctx, m, rank, 2);
    fsdp_module *flat = sh ? fsdp_sharded_flat_params(sh) : NULL;
    if (st == FSDP_OK) st = snapshot_take(ctx, flat, &s);
    if (st == FSDP_OK) {
        FSDP_RANK_CHECK(ctx, fsdp_module_num_children(flat) > 0, "no module under the shards");
        EXPECT_FAIL(ctx, fsdp_clip_grad_norm(ctx, fsdp_module_child(flat, 0), 1.0, 2.0, NULL),
                    FSDP_ERR_INVALID_ARGUMENT, "is an FSDP shard inside the optimizer's module",
                    "fsdp_sharded_clip_grad_norm");
        st = snapshot_check(ctx, flat, &s, "after the refused clip");
    }
    double norm = 0;
    if (st == FSDP_OK) st = fsdp_clip_grad_norm(ctx, flat, 1e30, 2.0, &norm);
    if (st == FSDP_OK) FSDP_RANK_CHECK(ctx, norm > 0, "the shards' gradient norm is %g", norm);
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void test_clip_part_of_shards(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, clip_part_rank, NULL));
}

/* ---- TP after FSDP ---- */

static fsdp_status tp_after_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_mesh *mesh = NULL;
    snapshot s = {0};
    fsdp_status st = wrapped(ctx, rank, 2, &m, &sh);
    if (st == FSDP_OK) st = fsdp_mesh_create(ctx, 1, (int[]){2}, (const char *[]){"tp"}, &mesh);
    if (st == FSDP_OK) st = snapshot_take(ctx, fsdp_sharded_flat_params(sh), &s);
    if (st == FSDP_OK) {
        fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()}};
        EXPECT_FAIL(ctx, fsdp_tp_parallelize(ctx, m, mesh, 1, plan, NULL), FSDP_ERR_STATE,
                    "fsdp_tp_parallelize", "apply tensor parallelism before fsdp_fully_shard");
        st = snapshot_check(ctx, fsdp_sharded_flat_params(sh), &s, "after the refused TP");
    }
    /* The wrapped model still trains: no hook was added, nothing moved. */
    if (st == FSDP_OK) st = fwd_bwd(ctx, m, rank, 2);
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_tp_after_fsdp(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, tp_after_rank, NULL));
}

/* ---- summon_full_params inside forward ---- */

typedef struct summon_probe {
    fsdp_sharded *sh;
    fsdp_status st;
    char msg[512];
} summon_probe;

static fsdp_status summon_in_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                  const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    summon_probe *p = user;
    p->st = fsdp_summon_full_params(ctx, p->sh, NULL);
    snprintf(p->msg, sizeof p->msg, "%s", fsdp_last_error(ctx) ? fsdp_last_error(ctx) : "");
    return FSDP_OK;
}

static fsdp_status summon_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    snapshot s = {0};
    summon_probe probe = {.st = FSDP_OK};
    fsdp_status st = wrapped(ctx, rank, 2, &m, &sh);
    probe.sh = sh;
    if (st == FSDP_OK) st = snapshot_take(ctx, fsdp_sharded_flat_params(sh), &s);
    if (st == FSDP_OK)
        st = fsdp_module_add_hook(ctx, fsdp_module_find(m, "layers.1"), FSDP_HOOK_POST_FORWARD,
                                  summon_in_hook, &probe, NULL, NULL);
    /* Forward only: the shard gradients stay as they are. */
    fsdp_tensor *x = NULL;
    const fsdp_tensor *out;
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 100, 0, 2, &x);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    fsdp_tensor_free(x);
    if (st == FSDP_OK) {
        FSDP_RANK_CHECK(ctx, probe.st == FSDP_ERR_STATE, "summon inside forward returned %s",
                        fsdp_status_to_string(probe.st));
        FSDP_RANK_CHECK(ctx, strstr(probe.msg, "inside forward") && strstr(probe.msg, "outside"),
                        "summon inside forward: message \"%s\"", probe.msg);
        st = snapshot_check(ctx, fsdp_sharded_flat_params(sh), &s, "after summon in forward");
    }
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void test_summon_in_forward(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, summon_rank, NULL));
}

/* ---- the model run inside summon_full_params ---- */

/* A forward between summon and release would free the summoned copy the caller is reading:
 * the root unit refuses to leave SUMMONED, naming itself, the state and the call; the release
 * that follows writes the same values back, and the next step runs. */
static fsdp_status forward_in_summon_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    snapshot s = {0};
    fsdp_status st = wrapped(ctx, rank, 2, &m, &sh);
    if (st == FSDP_OK) st = snapshot_take(ctx, fsdp_sharded_flat_params(sh), &s);
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, NULL);
    if (st == FSDP_OK) {
        fsdp_tensor *x = NULL;
        const fsdp_tensor *out;
        st = stacked_batch_rows(ctx, 100, 0, 2, &x);
        if (st == FSDP_OK)
            EXPECT_FAIL(ctx, fsdp_module_forward(ctx, m, x, &out), FSDP_ERR_STATE,
                        "FSDP unit '(root)'", "the pre-forward hook",
                        "unshard it in state SUMMONED", "fsdp_release_full_params");
        fsdp_tensor_free(x);
    }
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    if (st == FSDP_OK)
        st = snapshot_check(ctx, fsdp_sharded_flat_params(sh), &s, "after forward in summon");
    if (st == FSDP_OK) st = fwd_bwd(ctx, m, rank, 2);
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void test_forward_in_summon(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, forward_in_summon_rank, NULL));
}

/* ---- freeing the model before its FSDP state ---- */

static fsdp_status free_order_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    snapshot s = {0};
    fsdp_status st = wrapped(ctx, rank, 2, &m, &sh);
    if (st == FSDP_OK)
        st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_sgd_options){.lr = 0.1},
                             &opt);
    if (st == FSDP_OK) st = snapshot_take(ctx, fsdp_sharded_flat_params(sh), &s);
    /* The wrong order: the model goes first. Nothing of the state may point into it. */
    fsdp_module_free(m);
    m = NULL;
    if (st == FSDP_OK) {
        EXPECT_FAIL(ctx, fsdp_summon_full_params(ctx, sh, NULL), FSDP_ERR_STATE, "has been freed",
                    "fsdp_sharded_free");
        EXPECT_FAIL(ctx, fsdp_sharded_clip_grad_norm(ctx, sh, 1.0, 2.0, NULL), FSDP_ERR_STATE,
                    "has been freed");
        st = snapshot_check(ctx, fsdp_sharded_flat_params(sh), &s, "after the model was freed");
    }
    /* The shards are the state's: the optimizer can still step them. */
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
    fsdp_optimizer_free(opt);
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    return st;
}

static void test_free_model_first(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, free_order_rank, NULL));
}

/* ---- a model on a device ---- */

/* The refusals of a model (or one gradient of it) on sim:0 while the rank's context is on the
 * CPU, on every rank. FSDP wraps a model on the rank's device: for a whole model on sim:0 it
 * names both devices and the fix (fsdp_ctx_set_device or fsdp_module_to), for a model across
 * two devices the tensor that is elsewhere (`whole` says which). Replicate takes a model on one
 * device, but not the initial broadcast there (src_rank 0 by default), and names the tensor of
 * a model across two devices. */
static fsdp_status refuse_on_device(fsdp_ctx *ctx, fsdp_module *m, const char *tensor, bool whole) {
    static const char *paths[] = {"layers.1"};
    fsdp_sharded *sh = NULL;
    fsdp_replicate *r = NULL;
    if (whole)
        EXPECT_FAIL(ctx, fsdp_fully_shard(ctx, m, NULL, &sh), FSDP_ERR_DEVICE, "fsdp_fully_shard",
                    "the model is on sim:0 but this rank's device is cpu:0", "fsdp_ctx_set_device",
                    "fsdp_module_to");
    else
        EXPECT_FAIL(ctx, fsdp_fully_shard(ctx, m, NULL, &sh), FSDP_ERR_DEVICE, "fsdp_fully_shard",
                    tensor, "is on sim:0", "all on one device", "fsdp_module_to",
                    "before wrapping it");
    /* Nested units, and a broadcast of the states asked for: refused before either. */
    EXPECT_FAIL(
        ctx,
        fsdp_fully_shard(ctx, m,
                         &(fsdp_fully_shard_options){
                             .wrap_paths = paths, .n_wrap_paths = 1, .sync_module_states = true},
                         &sh),
        FSDP_ERR_DEVICE, "fsdp_fully_shard", whole ? "this rank's device" : tensor, "sim:0");
    if (whole)
        EXPECT_FAIL(ctx, fsdp_replicate_apply(ctx, m, NULL, &r), FSDP_ERR_UNSUPPORTED,
                    "replicate: the model is on sim:0", "initial broadcast", "FSDP_NO_SRC_RANK");
    else
        EXPECT_FAIL(ctx, fsdp_replicate_apply(ctx, m, NULL, &r), FSDP_ERR_DEVICE,
                    "fsdp_replicate_apply", tensor, "is on sim:0", "all on one device",
                    "fsdp_module_to", "before replicating it");
    FSDP_RANK_CHECK(ctx, sh == NULL && r == NULL, "a refused wrap handed out a state");
    return FSDP_OK;
}

static fsdp_status device_model_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    snapshot s = {0};
    fsdp_status st = build(ctx, &m);
    if (st == FSDP_OK) st = fwd_bwd(ctx, m, rank, 2); /* gradients that are not zero */
    if (st == FSDP_OK) st = snapshot_take(ctx, m, &s);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, m, SIM0);
    if (st == FSDP_OK) st = refuse_on_device(ctx, m, "parameter 'layers.0.net1.weight'", true);
    /* No hook was added (fsdp_module_to refuses a tree with hooks) and no value changed. */
    if (st == FSDP_OK) st = fsdp_module_to(ctx, m, FSDP_CPU);
    if (st == FSDP_OK) st = snapshot_check(ctx, m, &s, "after the refusals on sim:0");
    /* One gradient on the device is found too. */
    fsdp_tensor *g = fsdp_param_grad(fsdp_module_get_param(m, "layers.2.net2.weight"));
    if (st == FSDP_OK) st = fsdp_tensor_move(ctx, g, SIM0);
    if (st == FSDP_OK)
        st = refuse_on_device(ctx, m, "gradient of parameter 'layers.2.net2.weight'", false);
    if (st == FSDP_OK) st = fsdp_tensor_move(ctx, g, FSDP_CPU);
    if (st == FSDP_OK) st = snapshot_check(ctx, m, &s, "after the refusals of a device gradient");
    /* Back on the CPU, it wraps and trains. */
    static const char *paths[] = {"layers.1"};
    if (st == FSDP_OK)
        st = fsdp_fully_shard(
            ctx, m, &(fsdp_fully_shard_options){.wrap_paths = paths, .n_wrap_paths = 1}, &sh);
    if (st == FSDP_OK) st = fwd_bwd(ctx, m, rank, 2);
    snapshot_free(&s);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void test_device_model(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, device_model_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"divide_factors", test_divide_factors},
        {"tp_group", test_tp_group},
        {"own_params", test_own_params},
        {"clip_part_of_shards", test_clip_part_of_shards},
        {"tp_after_fsdp", test_tp_after_fsdp},
        {"summon_in_forward", test_summon_in_forward},
        {"forward_in_summon", test_forward_in_summon},
        {"free_model_first", test_free_model_first},
        {"device_model", test_device_model},
    };
    return fsdp_test_run(argc, argv, "fsdp_misuse", cases, sizeof cases / sizeof cases[0]);
}

/* test_fsdp_2d.c: FSDP together with tensor parallelism, on 4 ranks as a (dp 2, tp 2) mesh,
 * ported from PyTorch's test_fsdp_tp_integration.py (seed 003): TP + FSDP against FSDP alone
 * over cpu offload x strategy x use_orig_params; sync_module_states across dp only; the exact
 * collectives per strategy, unit layout and mesh (docs/fsdp.md's regression table); and
 * clip_grad_norm over shards against one rank. Every rank checks its own results. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "stacked_batches.h"

#define SEED   7
#define BATCH  STACKED_BATCH
#define LAYERS 3

/* Like FSDP_RANK_CHECK, inside a chain of `st == FSDP_OK` steps that must reach its cleanup. */
#define CHECK_ST(st, ctx, cond, ...)                                                               \
    do {                                                                                           \
        if ((st) == FSDP_OK && !(cond)) (st) = FSDP_FAIL((ctx), FSDP_ERR_INTERNAL, __VA_ARGS__);   \
    } while (0)

/* ---- meshes ---- */

typedef enum layout {
    LAYOUT_1D,     /* "dp" over the whole world: FSDP alone */
    LAYOUT_HYBRID, /* ("replicate" 2, "shard" W/2): HYBRID_SHARD */
    LAYOUT_2D,     /* ("dp" W/2, "tp" 2): TP inside each dp replica */
} layout;

static const char *layout_name(layout l) {
    return l == LAYOUT_1D ? "1-D" : l == LAYOUT_HYBRID ? "hybrid" : "2-D";
}

typedef struct topo {
    fsdp_mesh *mesh;
    fsdp_mesh *tp;         /* mesh["tp"] (2-D only) */
    fsdp_group *shard;     /* FSDP's group: "dp" or "shard" */
    fsdp_group *replicate; /* hybrid only */
    fsdp_group *tp_group;  /* 2-D only */
    int dp_index, dp_size; /* which slice of the global batch this rank's replica takes */
} topo;

static fsdp_status topo_create(fsdp_ctx *ctx, layout l, int world, topo *t) {
    memset(t, 0, sizeof *t);
    switch (l) {
    case LAYOUT_1D:
        FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){world}, (const char *[]){"dp"}, &t->mesh));
        FSDP_TRY(fsdp_mesh_get_group(ctx, t->mesh, "dp", &t->shard));
        t->dp_index = fsdp_mesh_coordinate(t->mesh, 0);
        t->dp_size = world;
        return FSDP_OK;
    case LAYOUT_HYBRID: /* every rank is its own data-parallel replica of the batch */
        FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){2, world / 2},
                                  (const char *[]){"replicate", "shard"}, &t->mesh));
        FSDP_TRY(fsdp_mesh_get_group(ctx, t->mesh, "shard", &t->shard));
        t->dp_index = fsdp_ctx_rank(ctx);
        t->dp_size = world;
        return fsdp_mesh_get_group(ctx, t->mesh, "replicate", &t->replicate);
    default: /* 2-D: both ranks of a tp pair take their dp replica's rows */
        FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){world / 2, 2}, (const char *[]){"dp", "tp"},
                                  &t->mesh));
        FSDP_TRY(fsdp_mesh_get_group(ctx, t->mesh, "dp", &t->shard));
        t->dp_index = fsdp_mesh_coordinate(t->mesh, 0);
        t->dp_size = world / 2;
        FSDP_TRY(fsdp_mesh_dim(ctx, t->mesh, "tp", &t->tp));
        return fsdp_mesh_get_group(ctx, t->mesh, "tp", &t->tp_group);
    }
}

/* ---- data and models ---- */

/* A tensor filled from `stream`, uniform in [0, 1) as torch.rand. */
static fsdp_status rand_tensor(fsdp_ctx *ctx, int ndim, const int64_t *shape, uint64_t stream,
                               fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, shape, out));
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = 0.0f, .b = 1.0f};
    return fsdp_init_tensor(ctx, *out, &init, SEED, stream);
}

/* MLPStacked(LAYERS); with a tp mesh, every layer's net1 Colwise and net2 Rowwise (default
 * layouts: Replicate in, Replicate out). */
static fsdp_status build_stacked(fsdp_ctx *ctx, const fsdp_mesh *tp, fsdp_module **m) {
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, m));
    FSDP_TRY(fsdp_module_reset_parameters(ctx, *m, SEED));
    if (!tp) return FSDP_OK;
    fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                 {"layers.*.net2", FSDP_ROWWISE()}};
    return fsdp_tp_parallelize(ctx, *m, tp, 2, plan, NULL);
}

/* Compares every parameter (or gradient) of a reference model with the other model's, gathered
 * over tp where it is distributed. Both must be readable: inside summon_full_params for FSDP.
 * The bounds used: rtol 1e-5 + atol 1e-6 (values of order 1). The layouts reorder sums of at
 * most 16 terms (MLPModule's widths, the batch's rows over dp and tp) and SGD moves the
 * parameters by lr times the gradients: a few u, 2.8e-7 by the random-walk estimate of
 * tests/numerics.h at most; the clipping norms (one sum over every gradient element, in
 * another order) within 1e-5 relative, ~sqrt(n) u. Seen at most 0.086 of the bound under the
 * Haswell, Sandybridge and Prescott kernels. The sync_module_states case is bitwise (0, 0):
 * broadcasts copy. */
typedef struct compare {
    fsdp_module *other;
    bool grad;
    const char *stage;
    double rtol, atol;
    double max_abs;  /* the largest difference seen */
    double max_want; /* the largest |reference value| seen */
} compare;

static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    compare *c = user;
    fsdp_param *q = fsdp_module_get_param(c->other, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "%s: no parameter %s", c->stage, name);
    const fsdp_tensor *want = c->grad ? fsdp_param_grad(p) : fsdp_param_data(p);
    FSDP_RANK_CHECK(ctx, fsdp_tensor_has_storage(want), "%s: reference %s has no storage", c->stage,
                    name);
    for (int64_t i = 0; i < fsdp_tensor_numel(want); i++)
        c->max_want = fmax(c->max_want, fabs((double)fsdp_tensor_f32(want)[i]));
    fsdp_tensor *full = NULL;
    FSDP_TRY(fsdp_param_full_tensor(ctx, q, c->grad, &full));
    char what[160];
    snprintf(what, sizeof what, "%s %s%s", c->stage, name, c->grad ? " grad" : "");
    fsdp_status st = fsdp_test_rank_close(ctx, what, full, want, c->rtol, c->atol, &c->max_abs);
    fsdp_tensor_free(full);
    return st;
}

/* Ends a summon_full_params; *st keeps the first failure. */
static void release_full(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_status *st) {
    fsdp_status r = fsdp_release_full_params(ctx, sh);
    if (*st == FSDP_OK) *st = r;
}

/* ---- test_fsdp_tp_integration ---- */

/* SimpleModel (net1 Linear(5, 8), relu, net2 Linear(8, 4), net3 Linear(4, 12)). Model A: FSDP
 * alone over the 4 ranks. Model B: the same initial values, net1 Colwise(input Shard(0)) and
 * net2 Rowwise(output Shard(0)) over tp, then FSDP over dp. Each rank feeds its own (2, 3, 5)
 * input: B's tp pair runs the concatenation of its two inputs through net1 and net2 and hands
 * each rank its own rows back, so the outputs equal A's rank by rank. Gradients (sum of the
 * output): A's are the average over the 4 inputs. B's TP parameters see both inputs of the pair
 * and are averaged over dp only, so they are twice A's; net3 sees only this rank's input and
 * differs across tp. The seed's _sync_tp_grads fixes both on the shards the optimizer steps:
 * net3 is all_reduced over tp, then everything is divided by the tp size. */

#define INTEGRATION_LR 0.1

typedef struct integration_case {
    bool offload;
    fsdp_sharding_strategy strategy;
    bool orig;
} integration_case;

/* SimpleModel.get_non_sharded_param_names(): computed on this rank's rows only. */
static bool non_sharded(const char *fqn) {
    return strcmp(fqn, "net3.weight") == 0 || strcmp(fqn, "net3.bias") == 0;
}

/* The part of the optimizer's gradient that holds segment s: a view of the unit's flat shard
 * gradient, or with use_orig_params the parameter's own view in the mirror tree. */
static fsdp_status segment_grad(fsdp_ctx *ctx, fsdp_sharded *sh, bool orig,
                                const fsdp_flat_segment *s, fsdp_tensor **out) {
    fsdp_module *params = fsdp_sharded_flat_params(sh);
    if (!orig)
        return fsdp_tensor_view(ctx, fsdp_param_grad(fsdp_module_param(params, s->unit)),
                                s->shard_offset, 1, &s->shard_numel, out);
    fsdp_param *view = fsdp_module_get_param(params, s->fqn);
    FSDP_RANK_CHECK(ctx, view != NULL, "use_orig_params: no parameter %s", s->fqn);
    FSDP_RANK_CHECK(ctx, fsdp_tensor_numel(fsdp_param_data(view)) == s->shard_numel,
                    "use_orig_params: %s has %lld elements here, its segment %lld", s->fqn,
                    (long long)fsdp_tensor_numel(fsdp_param_data(view)), (long long)s->shard_numel);
    return fsdp_tensor_view(ctx, fsdp_param_grad(view), 0, 1, &s->shard_numel, out);
}

/* The seed's _sync_tp_grads on this rank's shard: the non-TP parameters' parts are summed over
 * tp, then every part is divided by the tp size. A tp pair has the same dp coordinate, so the
 * same shard of the same flat layout: the parts line up across the pair. */
static fsdp_status sync_tp_grads(fsdp_ctx *ctx, fsdp_sharded *sh, bool orig, fsdp_group *tp) {
    float inv = 1.0f / (float)fsdp_group_size(tp);
    for (int i = 0; i < fsdp_sharded_num_segments(sh); i++) {
        fsdp_flat_segment s;
        FSDP_TRY(fsdp_sharded_segment(ctx, sh, i, &s));
        FSDP_RANK_CHECK(ctx, non_sharded(s.fqn) == (fsdp_param_dtensor_spec(s.param) == NULL),
                        "%s: distributed by TP is %d, want %d", s.fqn,
                        fsdp_param_dtensor_spec(s.param) != NULL, !non_sharded(s.fqn));
        if (s.shard_numel == 0) continue;
        fsdp_tensor *g = NULL;
        FSDP_TRY(segment_grad(ctx, sh, orig, &s, &g));
        fsdp_status st = FSDP_OK;
        if (non_sharded(s.fqn)) st = fsdp_all_reduce(ctx, tp, g, FSDP_REDUCE_SUM);
        for (int64_t k = 0; st == FSDP_OK && k < s.shard_numel; k++) fsdp_tensor_f32(g)[k] *= inv;
        fsdp_tensor_free(g);
        FSDP_TRY(st);
    }
    return FSDP_OK;
}

static fsdp_status build_simple(fsdp_ctx *ctx, fsdp_module **m) {
    FSDP_TRY(fsdp_model_simple_model(ctx, m));
    return fsdp_module_reset_parameters(ctx, *m, SEED);
}

static fsdp_status integration_rank(fsdp_ctx *ctx, int rank, void *user) {
    const integration_case *c = user;
    topo t;
    fsdp_module *a = NULL, *b = NULL;
    fsdp_sharded *sa = NULL, *sb = NULL;
    fsdp_optimizer *oa = NULL, *ob = NULL;
    fsdp_tensor *x = NULL, *dy = NULL;
    fsdp_sgd_options sgd = {.lr = INTEGRATION_LR};
    fsdp_summon_options summon = {.with_grads = true, .offload_to_cpu = c->offload};
    fsdp_status st = topo_create(ctx, LAYOUT_2D, 4, &t);
    if (st == FSDP_OK) st = build_simple(ctx, &a);
    if (st == FSDP_OK) st = build_simple(ctx, &b);
    if (st == FSDP_OK) {
        fsdp_tp_plan_entry plan[] = {
            {"net1", FSDP_COLWISE(.input_layouts = FSDP_SHARD(0))},
            {"net2", FSDP_ROWWISE(.output_layouts = FSDP_SHARD(0))},
        };
        st = fsdp_tp_parallelize(ctx, b, t.tp, 2, plan, NULL);
    }
    fsdp_fully_shard_options o = {.strategy = c->strategy,
                                  .offload_params = c->offload,
                                  .use_orig_params = c->orig,
                                  .poison_resharded = true};
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, a, &o, &sa); /* the world group: 1-D */
    o.group = t.shard;
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, b, &o, &sb);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sa), &sgd, &oa);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sb), &sgd, &ob);
    for (int pass = 0; st == FSDP_OK && pass < 2; pass++) {
        const fsdp_tensor *ya = NULL, *yb = NULL;
        fsdp_tensor_free(x);
        x = NULL;
        /* torch.manual_seed(rank + 1), then rank + 16 after the step: rank-dependent inputs */
        st =
            rand_tensor(ctx, 3, (int64_t[]){2, 3, 5}, 1 + (uint64_t)rank + 16 * (uint64_t)pass, &x);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, a, x, &ya);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, b, x, &yb);
        if (st == FSDP_OK)
            st = fsdp_test_rank_close(ctx, pass ? "output after the step" : "output", yb, ya, 1e-5,
                                      1e-6, NULL);
        if (pass == 1) break;
        if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, ya, &dy);
        if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dy, 1.0f); /* out.sum().backward() */
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, a, dy, NULL);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, b, dy, NULL);
        if (st == FSDP_OK) st = sync_tp_grads(ctx, sb, c->orig, t.tp_group);
        /* A's full gradients against B's, gathered over tp (the seed's
         * _get_grads_as_flattened), after the correction reached the shards. */
        compare g = {
            .other = b, .grad = true, .stage = "after backward", .rtol = 1e-5, .atol = 1e-6};
        if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sa, &summon);
        if (st == FSDP_OK) {
            st = fsdp_summon_full_params(ctx, sb, &summon);
            if (st == FSDP_OK) {
                st = fsdp_module_visit_params(ctx, a, compare_param, &g);
                release_full(ctx, sb, &st);
            }
            release_full(ctx, sa, &st);
        }
        /* The step must move the parameters far beyond the tolerances. */
        CHECK_ST(st, ctx, INTEGRATION_LR * g.max_want > 1e-2,
                 "largest gradient %g: the step would not show", g.max_want);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, oa);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, ob);
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_optimizer_free(oa);
    fsdp_optimizer_free(ob);
    fsdp_sharded_free(sa);
    fsdp_sharded_free(sb);
    fsdp_module_free(a);
    fsdp_module_free(b);
    fsdp_mesh_free(t.mesh);
    return st;
}

static void test_fsdp_tp_integration(void) {
    fsdp_sharding_strategy strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP};
    for (int offload = 0; offload < 2; offload++)
        for (int s = 0; s < 2; s++)
            for (int orig = 0; orig < 2; orig++) {
                integration_case c = {offload, strategies[s], orig};
                fsdp_status st = fsdp_test_run_world(4, 0, integration_rank, &c);
                if (st != FSDP_OK)
                    fprintf(stderr, "\n  offload_params %d, %s, use_orig_params %d\n", offload,
                            fsdp_sharding_strategy_to_string(strategies[s]), orig);
                FSDP_TEST_OK(st);
            }
}

/* ---- test_fsdp_tp_sync_module_state ---- */

/* The seed's TestModel: a parameter (8, 8), Replicate over tp (SequenceParallel with every
 * rank's own values, PyTorch's DTensor.from_local(run_check=False)), and a buffer (8, 8)
 * (buffers are plain tensors here; PyTorch's is a Replicate DTensor). Only wrapped, never run. */
static fsdp_status sync_state_run(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                  const fsdp_tensor **out) {
    (void)in, (void)out;
    return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED, "%s is only wrapped in this test, never run",
                     fsdp_module_kind(m));
}

static fsdp_status sync_state_back(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                   const fsdp_tensor **din) {
    (void)dout, (void)din;
    return sync_state_run(ctx, m, NULL, NULL);
}

static const fsdp_module_ops sync_state_ops = {
    .kind = "SyncState", .forward = sync_state_run, .backward = sync_state_back};

/* Initialised from `seed`: the seed's torch.manual_seed(global rank). */
static fsdp_status build_sync_state(fsdp_ctx *ctx, uint64_t seed, fsdp_module **m) {
    FSDP_TRY(fsdp_module_create(ctx, &sync_state_ops, NULL, m));
    fsdp_init normal = {.kind = FSDP_INIT_NORMAL, .a = 0.0f, .b = 1.0f};
    FSDP_TRY(fsdp_module_add_param(ctx, *m, "param", 2, (int64_t[]){8, 8}, normal, NULL));
    FSDP_TRY(fsdp_module_add_buffer(ctx, *m, "buf", 2, (int64_t[]){8, 8}, normal, NULL));
    return fsdp_module_reset_parameters(ctx, *m, seed);
}

/* The seed's assert_local_shard_across_ranks: gathers t over group and checks that every
 * rank's copy equals (or, with equal false, differs from) the group's rank 0's, bitwise. */
static fsdp_status across(fsdp_ctx *ctx, fsdp_group *group, const fsdp_tensor *t, bool equal,
                          const char *what) {
    int64_t n = fsdp_tensor_numel(t), all = n * fsdp_group_size(group);
    fsdp_tensor *flat = NULL, *out = NULL;
    fsdp_status st = fsdp_tensor_view(ctx, t, 0, 1, &n, &flat);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &all, &out);
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, group, out, flat, 0);
    const float *g = st == FSDP_OK ? fsdp_tensor_f32(out) : NULL;
    for (int r = 1; st == FSDP_OK && r < fsdp_group_size(group); r++) {
        bool same = memcmp(g, g + r * n, (size_t)n * sizeof *g) == 0;
        CHECK_ST(st, ctx, same == equal, "%s: %s's rank %d %s its rank 0", what,
                 fsdp_group_label(group), r, same ? "equals" : "differs from");
    }
    fsdp_tensor_free(flat);
    fsdp_tensor_free(out);
    return st;
}

static fsdp_status sync_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    topo t;
    fsdp_module *m = NULL, *want = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_status st = topo_create(ctx, LAYOUT_2D, 4, &t);
    if (st == FSDP_OK) st = build_sync_state(ctx, (uint64_t)rank, &m);
    fsdp_tp_options own = {.src_rank = FSDP_NO_SRC_RANK};
    if (st == FSDP_OK) st = fsdp_tp_apply(ctx, m, t.tp, &FSDP_SEQUENCE_PARALLEL(), &own);
    fsdp_param *p = m ? fsdp_module_get_param(m, "param") : NULL;
    const fsdp_dtensor_spec *spec = p ? fsdp_param_dtensor_spec(p) : NULL;
    CHECK_ST(st, ctx, spec && spec->placements[0].kind == FSDP_PLACEMENT_REPLICATE,
             "param is not a Replicate DTensor over tp");
    /* Every rank started from its own values: they differ over dp and over tp. */
    if (st == FSDP_OK) st = across(ctx, t.shard, fsdp_param_data(p), false, "param before");
    if (st == FSDP_OK) st = across(ctx, t.shard, fsdp_module_buffer(m, 0), false, "buf before");
    if (st == FSDP_OK) st = across(ctx, t.tp_group, fsdp_param_data(p), false, "param before");
    fsdp_fully_shard_options o = {
        .group = t.shard, .sync_module_states = true, .poison_resharded = true};
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    /* The parameter's local block and the buffer go out in one bucket from dp rank 0: one
     * broadcast of 2 x 64 floats on dp, nothing on tp, nothing else. */
    if (st == FSDP_OK) {
        fsdp_comm_count b = fsdp_comm_debug_count(ctx, FSDP_COMM_BROADCAST, "dp");
        CHECK_ST(st, ctx, b.calls == 1 && b.bytes == 2 * 64 * 4,
                 "%lld broadcasts of %lld bytes on dp, want 1 of 512", (long long)b.calls,
                 (long long)b.bytes);
        CHECK_ST(st, ctx, fsdp_comm_debug_total(ctx).calls == 1,
                 "%lld collectives while wrapping, want the one broadcast",
                 (long long)fsdp_comm_debug_total(ctx).calls);
    }
    /* Rank (dp d, tp c) now holds rank (dp 0, tp c)'s values, whose global rank is c: equal
     * over dp, still different over tp. */
    if (st == FSDP_OK) st = build_sync_state(ctx, (uint64_t)fsdp_mesh_coordinate(t.mesh, 1), &want);
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, NULL);
    if (st == FSDP_OK) {
        const fsdp_tensor *pd = fsdp_param_data(p), *buf = fsdp_module_buffer(m, 0);
        st = across(ctx, t.shard, pd, true, "param after");
        if (st == FSDP_OK) st = across(ctx, t.shard, buf, true, "buf after");
        if (st == FSDP_OK) st = across(ctx, t.tp_group, pd, false, "param after");
        if (st == FSDP_OK) st = across(ctx, t.tp_group, buf, false, "buf after");
        if (st == FSDP_OK)
            st = fsdp_test_rank_close(ctx, "param after", pd,
                                      fsdp_param_data(fsdp_module_get_param(want, "param")), 0.0,
                                      0.0, NULL);
        if (st == FSDP_OK)
            st = fsdp_test_rank_close(ctx, "buf after", buf, fsdp_module_buffer(want, 0), 0.0, 0.0,
                                      NULL);
        release_full(ctx, sh, &st);
    }
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_module_free(want);
    fsdp_mesh_free(t.mesh);
    return st;
}

static void test_fsdp_tp_sync_module_state(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, sync_rank, NULL));
}

/* ---- collectives per strategy: the regression table of docs/fsdp.md ---- */

typedef struct comm_case {
    layout layout;
    fsdp_sharding_strategy strategy;
    bool nested; /* layers.1 and layers.2 their own units; the root keeps layers.0 */
} comm_case;

typedef struct comm_want {
    const char *group;
    fsdp_comm_phase phase;
    fsdp_comm_op op;
    int64_t calls;
} comm_want;

/* One training step (zero_grad, forward, backward, SGD step) of MLPStacked(3) on 4 ranks, with
 * U units of which u = U - 1 are not the root (U = 1 root only, 3 nested):
 * - the collectives per strategy that PyTorch's FSDP makes (docs/fsdp.md, "Collectives per
 *   strategy"), on FSDP's group ("dp", or "shard" for HYBRID_SHARD):
 *   FULL_SHARD and HYBRID_SHARD: forward U all_gather (every unit unshards); backward u
 *   all_gather (non-root units resharded after forward; the root kept its parameters) and U
 *   reduce_scatter (one per flat gradient);
 *   SHARD_GRAD_OP: forward U all_gather; backward U reduce_scatter (no reshard in between);
 *   NO_SHARD: backward U all_reduce;
 *   HYBRID_SHARD also all_reduces each reduced shard across "replicate": U in backward.
 * - 2-D (the TP styles' redistributions of docs/tp.md on the MLP plan: net1 Colwise, net2
 *   Rowwise, default layouts), on "tp": forward one all_reduce per layer (Rowwise output
 *   Partial -> Replicate); backward one per layer but the first (Colwise input gradient
 *   Partial -> Replicate; the model's input gradient is not computed), so LAYERS - 1.
 *   Replicate -> Shard(-1) and back are local.
 * - Nothing outside forward and backward: the optimizer step and zero_grad never communicate.
 * Returns the number of entries written to w. */
static int comm_expected(const comm_case *c, comm_want *w) {
    int n = 0;
    int64_t units = c->nested ? LAYERS : 1, nonroot = units - 1;
    const char *g = c->layout == LAYOUT_HYBRID ? "shard" : "dp";
    switch (c->strategy) {
    case FSDP_FULL_SHARD:
    case FSDP_HYBRID_SHARD:
        w[n++] = (comm_want){g, FSDP_COMM_PHASE_FORWARD, FSDP_COMM_ALL_GATHER, units};
        w[n++] = (comm_want){g, FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_GATHER, nonroot};
        w[n++] = (comm_want){g, FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_REDUCE_SCATTER, units};
        break;
    case FSDP_SHARD_GRAD_OP:
        w[n++] = (comm_want){g, FSDP_COMM_PHASE_FORWARD, FSDP_COMM_ALL_GATHER, units};
        w[n++] = (comm_want){g, FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_REDUCE_SCATTER, units};
        break;
    default:
        w[n++] = (comm_want){g, FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_REDUCE, units};
    }
    if (c->strategy == FSDP_HYBRID_SHARD)
        w[n++] = (comm_want){"replicate", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_REDUCE, units};
    if (c->layout == LAYOUT_2D) {
        w[n++] = (comm_want){"tp", FSDP_COMM_PHASE_FORWARD, FSDP_COMM_ALL_REDUCE, LAYERS};
        w[n++] = (comm_want){"tp", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_REDUCE, LAYERS - 1};
    }
    return n;
}

/* Every (mesh dim, phase, op) count against the table, and the total (nothing on any other
 * group). */
static fsdp_status comm_check(fsdp_ctx *ctx, const comm_case *c, const fsdp_mesh *mesh) {
    comm_want w[8];
    int n = comm_expected(c, w);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += w[i].calls;
    static const fsdp_comm_phase phases[] = {FSDP_COMM_PHASE_NONE, FSDP_COMM_PHASE_FORWARD,
                                             FSDP_COMM_PHASE_BACKWARD};
    for (int d = 0; d < fsdp_mesh_ndim(mesh); d++)
        for (int ph = 0; ph < 3; ph++)
            for (int op = FSDP_COMM_ALL_GATHER; op < FSDP_COMM_BARRIER; op++) {
                const char *g = fsdp_mesh_dim_name(mesh, d);
                int64_t want = 0;
                for (int i = 0; i < n; i++)
                    if (strcmp(w[i].group, g) == 0 && w[i].phase == phases[ph] &&
                        w[i].op == (fsdp_comm_op)op)
                        want = w[i].calls;
                fsdp_comm_filter f = {.op = (fsdp_comm_op)op, .group = g, .phase = phases[ph]};
                int64_t got = fsdp_comm_debug_query(ctx, &f).calls;
                FSDP_RANK_CHECK(ctx, got == want, "%s %s %s: %lld %s on %s in %s, want %lld",
                                layout_name(c->layout),
                                fsdp_sharding_strategy_to_string(c->strategy),
                                c->nested ? "nested" : "root only", (long long)got,
                                fsdp_comm_op_to_string((fsdp_comm_op)op), g,
                                fsdp_comm_phase_to_string(phases[ph]), (long long)want);
            }
    int64_t got = fsdp_comm_debug_total(ctx).calls;
    FSDP_RANK_CHECK(ctx, got == total, "%s %s %s: %lld collectives in all, want %lld",
                    layout_name(c->layout), fsdp_sharding_strategy_to_string(c->strategy),
                    c->nested ? "nested" : "root only", (long long)got, (long long)total);
    return FSDP_OK;
}

static const char *const nested_paths[] = {"layers.1", "layers.2"};

static fsdp_status comm_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const comm_case *c = user;
    topo t;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_status st = topo_create(ctx, c->layout, 4, &t);
    if (st == FSDP_OK) st = build_stacked(ctx, t.tp, &m);
    fsdp_fully_shard_options o = {.strategy = c->strategy,
                                  .group = t.shard,
                                  .replicate_group = t.replicate,
                                  .wrap_paths = c->nested ? nested_paths : NULL,
                                  .n_wrap_paths = c->nested ? 2 : 0,
                                  .poison_resharded = true};
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK)
        st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_sgd_options){.lr = 0.1},
                             &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, t.dp_size, t.dp_index, &off, &len);
    for (int s = 0; st == FSDP_OK && s < 2; s++) { /* a warm-up step, then the counted one */
        if (s == 1) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
        if (st == FSDP_OK) st = stacked_forward_backward(ctx, m, s, off, len, t.dp_size);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        if (st == FSDP_OK && s == 1) st = fsdp_comm_debug_end(ctx);
    }
    if (st == FSDP_OK) st = comm_check(ctx, c, t.mesh);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(t.mesh);
    return st;
}

static void test_comm_table(void) {
    static const comm_case rows[] = {
        {LAYOUT_1D, FSDP_FULL_SHARD, false},       {LAYOUT_1D, FSDP_FULL_SHARD, true},
        {LAYOUT_1D, FSDP_SHARD_GRAD_OP, false},    {LAYOUT_1D, FSDP_SHARD_GRAD_OP, true},
        {LAYOUT_1D, FSDP_NO_SHARD, false},         {LAYOUT_1D, FSDP_NO_SHARD, true},
        {LAYOUT_HYBRID, FSDP_HYBRID_SHARD, false}, {LAYOUT_HYBRID, FSDP_HYBRID_SHARD, true},
        {LAYOUT_2D, FSDP_FULL_SHARD, false},       {LAYOUT_2D, FSDP_FULL_SHARD, true},
        {LAYOUT_2D, FSDP_SHARD_GRAD_OP, false},    {LAYOUT_2D, FSDP_SHARD_GRAD_OP, true},
        {LAYOUT_2D, FSDP_NO_SHARD, false},         {LAYOUT_2D, FSDP_NO_SHARD, true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fsdp_status st = fsdp_test_run_world(4, 0, comm_rank, (void *)&rows[i]);
        if (st != FSDP_OK)
            fprintf(stderr, "\n  %s %s %s\n", layout_name(rows[i].layout),
                    fsdp_sharding_strategy_to_string(rows[i].strategy),
                    rows[i].nested ? "nested" : "root only");
        FSDP_TEST_OK(st);
    }
}

/* ---- clip_grad_norm over shards against one rank ---- */

typedef struct clip_case {
    layout layout;
    int world;
    fsdp_sharding_strategy strategy;
    double norm_type;
    bool orig;
} clip_case;

/* The all_reduces of one sharded clip_grad_norm: one per distinct group that shards some
 * gradient (PyTorch's clip_grad_norm_ over FSDP shards and TP; docs/fsdp.md, "Clipping"):
 * FSDP's group when it shards (not NO_SHARD; HYBRID_SHARD's replicas hold equal shards and
 * count once), and tp for the TP-sharded parameters (a Replicate one, net2.bias, counts once
 * over tp). */
static fsdp_status clip_comm_check(fsdp_ctx *ctx, const clip_case *c, const fsdp_mesh *mesh) {
    const char *shard = c->layout == LAYOUT_HYBRID ? "shard" : "dp";
    int64_t total = 0;
    for (int d = 0; d < fsdp_mesh_ndim(mesh); d++) {
        const char *g = fsdp_mesh_dim_name(mesh, d);
        int64_t want =
            (strcmp(g, shard) == 0 && c->strategy != FSDP_NO_SHARD) || strcmp(g, "tp") == 0;
        total += want;
        int64_t got = fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_REDUCE, g).calls;
        FSDP_RANK_CHECK(ctx, got == want, "clip_grad_norm: %lld all_reduce on %s, want %lld",
                        (long long)got, g, (long long)want);
    }
    FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == total,
                    "clip_grad_norm: %lld collectives, want %lld",
                    (long long)fsdp_comm_debug_total(ctx).calls, (long long)total);
    return FSDP_OK;
}

/* MLPStacked(3) with layers.1 and layers.2 nested units; the reference is the same model on
 * this rank alone, fed the whole batch. Each of 2 steps: backward, clip both to a quarter of
 * the reference norm (so the scale is ~0.25), SGD; the sharded norm equals the reference's and
 * the parameters after the step equal the clipped reference's. */
static fsdp_status clip_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const clip_case *c = user;
    topo t;
    fsdp_module *ref = NULL, *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *ref_opt = NULL, *opt = NULL;
    fsdp_sgd_options sgd = {.lr = 0.1};
    fsdp_status st = topo_create(ctx, c->layout, c->world, &t);
    if (st == FSDP_OK) st = build_stacked(ctx, NULL, &ref);
    if (st == FSDP_OK) st = build_stacked(ctx, t.tp, &m);
    fsdp_fully_shard_options o = {.strategy = c->strategy,
                                  .group = t.shard,
                                  .replicate_group = t.replicate,
                                  .wrap_paths = nested_paths,
                                  .n_wrap_paths = 2,
                                  .use_orig_params = c->orig,
                                  .poison_resharded = true};
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, ref, &sgd, &ref_opt);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &sgd, &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, t.dp_size, t.dp_index, &off, &len);
    for (int s = 0; st == FSDP_OK && s < 2; s++) {
        double unclipped = 0, want = 0, got = 0;
        st = fsdp_optimizer_zero_grad(ctx, ref_opt);
        if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
        if (st == FSDP_OK) st = stacked_forward_backward(ctx, ref, s, 0, BATCH, 1);
        if (st == FSDP_OK) st = stacked_forward_backward(ctx, m, s, off, len, t.dp_size);
        if (st == FSDP_OK) st = fsdp_clip_grad_norm(ctx, ref, 1e30, c->norm_type, &unclipped);
        double max_norm = unclipped / 4;
        if (st == FSDP_OK) st = fsdp_clip_grad_norm(ctx, ref, max_norm, c->norm_type, &want);
        if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK)
            st = fsdp_clip_grad_norm(ctx, fsdp_sharded_flat_params(sh), max_norm, c->norm_type,
                                     &got);
        if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
        if (st == FSDP_OK) st = clip_comm_check(ctx, c, t.mesh);
        CHECK_ST(st, ctx, want > 0 && fabs(got - want) <= 1e-5 * want,
                 "step %d: sharded %g-norm %.9g, one rank's %.9g", s + 1, c->norm_type, got, want);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, ref_opt);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        char stage[48];
        snprintf(stage, sizeof stage, "after clipped step %d", s + 1);
        compare cmp = {.other = m, .stage = stage, .rtol = 1e-5, .atol = 1e-6};
        if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){0});
        if (st == FSDP_OK) {
            st = fsdp_module_visit_params(ctx, ref, compare_param, &cmp);
            release_full(ctx, sh, &st);
        }
    }
    fsdp_optimizer_free(ref_opt);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(ref);
    fsdp_module_free(m);
    fsdp_mesh_free(t.mesh);
    return st;
}

static void test_clip_grad_norm(void) {
    static const clip_case cases[] = {
        {LAYOUT_1D, 4, FSDP_FULL_SHARD, 2.0, false},
        {LAYOUT_1D, 4, FSDP_FULL_SHARD, INFINITY, true},
        {LAYOUT_1D, 3, FSDP_FULL_SHARD, 2.0, true}, /* uneven: padded shards, 3-3-2 rows */
        {LAYOUT_1D, 3, FSDP_FULL_SHARD, INFINITY, false},
        {LAYOUT_1D, 4, FSDP_NO_SHARD, 2.0, false},
        {LAYOUT_HYBRID, 4, FSDP_HYBRID_SHARD, 2.0, false},
        {LAYOUT_2D, 4, FSDP_FULL_SHARD, 2.0, false},
        {LAYOUT_2D, 4, FSDP_FULL_SHARD, INFINITY, true},
        {LAYOUT_2D, 4, FSDP_SHARD_GRAD_OP, 2.0, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const clip_case *c = &cases[i];
        fsdp_status st = fsdp_test_run_world(c->world, 0, clip_rank, (void *)c);
        if (st != FSDP_OK)
            fprintf(stderr, "\n  %s on %d ranks, %s, norm %g, use_orig_params %d\n",
                    layout_name(c->layout), c->world, fsdp_sharding_strategy_to_string(c->strategy),
                    c->norm_type, c->orig);
        FSDP_TEST_OK(st);
    }
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"fsdp_tp_integration", test_fsdp_tp_integration},
        {"fsdp_tp_sync_module_state", test_fsdp_tp_sync_module_state},
        {"comm_table", test_comm_table},
        {"clip_grad_norm", test_clip_grad_norm},
    };
    return fsdp_test_run(argc, argv, "fsdp_2d", cases, sizeof cases / sizeof cases[0]);
}

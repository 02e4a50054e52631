/* test_fsdp.c: FSDP over flat parameters against the same model on one rank: SGD training
 * under FULL_SHARD, SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD, with only a root unit and with
 * nested units, with and without CPU offload and use_orig_params, on 1, 2, 3 (padding) and 4
 * data-parallel ranks; the collectives of each strategy per phase; memory held against the
 * theoretical figure; summon_full_params and its options; no_sync accumulation (also under
 * offload); use_orig_params views; sync_module_states; wrapping errors; gradient reductions
 * left in flight by their started collectives (under MPI the all_reduce is) against the blocking
 * calls, bit for bit. Pool blocks are
 * poisoned with NaN when given back, and sharded parameters have no storage, so a missing
 * gather cannot pass unnoticed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp/shard_impl.h" // defines: fsdp_shard_test_blocking_works, fsdp_shard_test_trace
#include "harness.h"
#include "stacked_batches.h"

#define SEED   7
#define BATCH  STACKED_BATCH
#define LAYERS 3

typedef struct fsdp_case {
    int world;
    fsdp_sharding_strategy strategy;
    bool nested; /* layers.1 and layers.2 their own units; the root keeps layers.0 */
    int steps;
    bool offload;
    bool orig;     /* use_orig_params */
    int replicate; /* HYBRID_SHARD: the replicate size of a (replicate, shard) mesh */
} fsdp_case;

/* The wrapping options of a case; HYBRID_SHARD makes *mesh (replicate, shard). */
static fsdp_status case_options(fsdp_ctx *ctx, const fsdp_case *c, fsdp_mesh **mesh,
                                fsdp_fully_shard_options *o) {
    static const char *paths[] = {"layers.1", "layers.2"};
    *o = (fsdp_fully_shard_options){.strategy = c->strategy,
                                    .wrap_paths = c->nested ? paths : NULL,
                                    .n_wrap_paths = c->nested ? 2 : 0,
                                    .offload_params = c->offload,
                                    .use_orig_params = c->orig,
                                    .poison_resharded = true};
    *mesh = NULL;
    if (c->strategy != FSDP_HYBRID_SHARD) return FSDP_OK;
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){c->replicate, c->world / c->replicate},
                              (const char *[]){"replicate", "shard"}, mesh));
    FSDP_TRY(fsdp_mesh_get_group(ctx, *mesh, "shard", &o->group));
    return fsdp_mesh_get_group(ctx, *mesh, "replicate", &o->replicate_group);
}

static fsdp_status build(fsdp_ctx *ctx, fsdp_module **m) {
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, m));
    return fsdp_module_reset_parameters(ctx, *m, SEED);
}

/* One step: forward and backward on this rank's rows, then the optimizer. */
static fsdp_status step(fsdp_ctx *ctx, fsdp_module *m, fsdp_optimizer *opt, int s, int64_t off,
                        int64_t len, int world) {
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, opt));
    FSDP_TRY(stacked_forward_backward(ctx, m, s, off, len, world));
    return fsdp_optimizer_step(ctx, opt);
}

/* Parameters (and gradients) against the single-rank run: rtol 1e-5 + atol 1e-6 (values of
 * order 1). The sharded runs reduce MLPStacked's gradients (sums of at most 16 terms, the
 * batch's rows added over ranks) in another order, and SGD moves the parameters by lr times
 * them: a few u per step, 2.8e-7 by the random-walk estimate (tests/numerics.h) at most. Seen
 * at most 0.043 of the bound under the Haswell, Sandybridge and Prescott kernels. */
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
    fsdp_mesh *mesh = NULL;
    fsdp_fully_shard_options o;
    fsdp_status st = case_options(ctx, c, &mesh, &o);
    if (st == FSDP_OK) st = build(ctx, &ref);
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
    fsdp_mesh_free(mesh);
    return st;
}

/* Every world size, with and without offload and use_orig_params. HYBRID_SHARD runs on a
 * (2, 1) and a (2, 2) mesh. */
static void run_training(fsdp_sharding_strategy strategy, bool nested) {
    for (int world = 1; world <= 4; world++)
        for (int offload = 0; offload < 2; offload++)
            for (int orig = 0; orig < 2; orig++) {
                if (strategy == FSDP_HYBRID_SHARD && world % 2) continue;
                fsdp_case c = {world, strategy, nested, 3, offload, orig, 2};
                fsdp_status st = fsdp_test_run_world(world, 0, train_rank, &c);
                if (st != FSDP_OK)
                    fprintf(stderr, "\n  %s %s on %d ranks, offload %d, use_orig_params %d\n",
                            fsdp_sharding_strategy_to_string(strategy),
                            nested ? "nested" : "root only", world, offload, orig);
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
static void test_train_hybrid_shard_root(void) {
    run_training(FSDP_HYBRID_SHARD, false);
}
static void test_train_hybrid_shard_nested(void) {
    run_training(FSDP_HYBRID_SHARD, true);
}

/* The case's model, wrapped, with plain SGD (lr 0.1) over its shards. */
static fsdp_status wrapped_sgd(fsdp_ctx *ctx, const fsdp_case *c, fsdp_mesh **mesh, fsdp_module **m,
                               fsdp_sharded **sh, fsdp_optimizer **opt) {
    fsdp_fully_shard_options o;
    FSDP_TRY(case_options(ctx, c, mesh, &o));
    FSDP_TRY(build(ctx, m));
    FSDP_TRY(fsdp_fully_shard(ctx, *m, &o, sh));
    return fsdp_sgd_create(ctx, fsdp_sharded_flat_params(*sh), &(fsdp_sgd_options){.lr = 0.1}, opt);
}

/* ---- the collectives per strategy that PyTorch's FSDP makes (docs/fsdp.md, "Hooks and
 * strategies"), 4 ranks, 1 or 3 units ---- */

static fsdp_status comm_rank(fsdp_ctx *ctx, int rank, void *user) {
    const fsdp_case *c = user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_status st = wrapped_sgd(ctx, c, &mesh, &m, &sh, &opt);
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
        case FSDP_HYBRID_SHARD: /* FULL_SHARD on "shard", then all_reduce on "replicate" */
            want[0][FSDP_COMM_ALL_GATHER] = units;
            want[1][FSDP_COMM_ALL_GATHER] = nonroot;
            want[1][FSDP_COMM_REDUCE_SCATTER] = units;
            want[1][FSDP_COMM_ALL_REDUCE] = units;
            break;
        case FSDP_SHARD_GRAD_OP: /* full parameters kept from forward to backward */
            want[0][FSDP_COMM_ALL_GATHER] = units;
            want[1][FSDP_COMM_REDUCE_SCATTER] = units;
            break;
        default: /* NO_SHARD: only the gradient all_reduce */
            want[1][FSDP_COMM_ALL_REDUCE] = units;
        }
        const char *where = c->strategy == FSDP_HYBRID_SHARD ? "shard" : NULL;
        for (int ph = 0; ph < 2; ph++)
            for (int op = FSDP_COMM_ALL_GATHER; op < FSDP_COMM_BARRIER; op++) {
                /* HYBRID_SHARD: all_reduce on the replicate dim, the rest on the shard dim. */
                const char *group = where && op == FSDP_COMM_ALL_REDUCE ? "replicate" : where;
                fsdp_comm_filter f = {.op = (fsdp_comm_op)op,
                                      .group = group,
                                      .phase =
                                          ph ? FSDP_COMM_PHASE_BACKWARD : FSDP_COMM_PHASE_FORWARD};
                fsdp_comm_filter any = f;
                any.group = NULL;
                int64_t got = fsdp_comm_debug_query(ctx, &f).calls;
                int64_t all = fsdp_comm_debug_query(ctx, &any).calls;
                FSDP_RANK_CHECK(ctx, got == want[ph][op] && all == got,
                                "%s %s offload %d: %lld %s in %s on %s (%lld on any group), "
                                "want %lld",
                                fsdp_sharding_strategy_to_string(c->strategy),
                                c->nested ? "nested" : "root", c->offload, (long long)got,
                                fsdp_comm_op_to_string((fsdp_comm_op)op),
                                ph ? "backward" : "forward", group ? group : "any group",
                                (long long)all, (long long)want[ph][op]);
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
    fsdp_mesh_free(mesh);
    return st;
}

static void test_comm_counts(void) {
    fsdp_sharding_strategy strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD,
                                           FSDP_HYBRID_SHARD};
    for (int s = 0; s < 4; s++)
        for (int nested = 0; nested < 2; nested++)
            for (int offload = 0; offload < 2; offload++) {
                fsdp_case c = {4, strategies[s], nested, 0, offload, false, 2};
                FSDP_TEST_OK(fsdp_test_run_world(4, 0, comm_rank, &c));
            }
}

/* ---- memory: what is held against the theoretical figure (4 ranks, 3 units) ---- */

/* Elements of a unit's full buffer (padded) and shard. */
static int64_t padded_of(const fsdp_sharded *sh, int u, int world, bool sharded) {
    return sharded ? fsdp_sharded_unit_shard_numel(sh, u) * world : fsdp_sharded_unit_numel(sh, u);
}

static fsdp_status memory_rank(fsdp_ctx *ctx, int rank, void *user) {
    const fsdp_case *c = user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_status st = wrapped_sgd(ctx, c, &mesh, &m, &sh, &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->world, rank, &off, &len);
    fsdp_memory_stats first, second;
    if (st == FSDP_OK) st = step(ctx, m, opt, 0, off, len, c->world);
    if (st == FSDP_OK) {
        fsdp_sharded_memory(sh, &first);
        fsdp_sharded_reset_peak(sh);
        st = step(ctx, m, opt, 1, off, len, c->world);
    }
    if (st == FSDP_OK) {
        fsdp_sharded_memory(sh, &second);
        bool sharded = c->strategy != FSDP_NO_SHARD;
        int n = fsdp_sharded_num_units(sh);
        const int64_t f = (int64_t)sizeof(float);
        int64_t shards = 0, root = padded_of(sh, 0, c->world, sharded), want_peak = 0;
        for (int u = 0; u < n; u++) shards += 2 * fsdp_sharded_unit_shard_numel(sh, u) * f;
        /* On rank threads without offload the group's shards of a unit live side by side in
         * one block, and its parameters are gathered in place there, without a pool block. */
        bool in_place = sharded && !c->offload && !fsdp_test_mpi();
        int64_t padded_all = 0;
        for (int u = 0; u < n; u++) padded_all += padded_of(sh, u, c->world, sharded);
        FSDP_RANK_CHECK(ctx, second.shared_full_bytes == (in_place ? padded_all * f : 0),
                        "%s (offload %d): %lld bytes gathered in place, want %lld",
                        fsdp_sharding_strategy_to_string(c->strategy), c->offload,
                        (long long)second.shared_full_bytes,
                        (long long)(in_place ? padded_all * f : 0));
        if (c->strategy == FSDP_FULL_SHARD) {
            /* The root's parameters and gradient stay through backward; one nested unit's
             * parameters and gradient are alive at its reduction (parameters gathered in place
             * take no block). The reduce_scatter adds straight into the shard's gradient; under
             * offload it reduces into a pool block first (then copied to the host), which adds
             * the unit's reduce_scatter output, and the root's own reduction adds the root's. */
            int64_t out = c->offload ? 1 : 0, params = in_place ? 0 : 1;
            want_peak = (1 + params) * root + out * fsdp_sharded_unit_shard_numel(sh, 0);
            for (int u = 1; u < n; u++) {
                int64_t at = (1 + params) * root + (1 + params) * padded_of(sh, u, c->world, true) +
                             out * fsdp_sharded_unit_shard_numel(sh, u);
                if (at > want_peak) want_peak = at;
            }
        } else {
            /* NO_SHARD: parameters are the shards themselves; the root's full gradient and
             * one nested unit's are alive at once (all_reduce works in place). Under offload
             * every unit's parameters are copied to the device in forward and kept until its
             * backward is over, as NO_SHARD never reshards after forward. */
            want_peak = root;
            for (int u = 1; u < n; u++)
                if (root + padded_of(sh, u, c->world, false) > want_peak)
                    want_peak = root + padded_of(sh, u, c->world, false);
            for (int u = 0; c->offload && u < n; u++)
                want_peak += padded_of(sh, u, c->world, false);
        }
        want_peak *= f;
        FSDP_RANK_CHECK(ctx, second.shard_bytes == shards, "%s: shard bytes %lld, want %lld",
                        fsdp_sharding_strategy_to_string(c->strategy),
                        (long long)second.shard_bytes, (long long)shards);
        FSDP_RANK_CHECK(ctx, second.peak_full_bytes == want_peak,
                        "%s: peak gathered bytes %lld, theory %lld",
                        fsdp_sharding_strategy_to_string(c->strategy),
                        (long long)second.peak_full_bytes, (long long)want_peak);
        FSDP_RANK_CHECK(ctx, second.full_bytes == 0, "%lld gathered bytes held between steps",
                        (long long)second.full_bytes);
        /* The pool grows in the first step only, and holds what the peak needed. */
        FSDP_RANK_CHECK(ctx, second.reserved_bytes == first.reserved_bytes,
                        "the pool grew from %lld to %lld bytes in the second step",
                        (long long)first.reserved_bytes, (long long)second.reserved_bytes);
        FSDP_RANK_CHECK(ctx, second.reserved_bytes >= want_peak, "pool %lld bytes < peak %lld",
                        (long long)second.reserved_bytes, (long long)want_peak);
        FSDP_RANK_CHECK(
            ctx,
            second.device_bytes == second.reserved_bytes + (c->offload ? 0 : second.shard_bytes) &&
                second.host_bytes ==
                    (c->offload ? second.shard_bytes +
                                      (int64_t)sizeof(float) * fsdp_sharded_unit_shard_numel(sh, 0)
                                : 0),
            "device %lld / host %lld bytes do not add up", (long long)second.device_bytes,
            (long long)second.host_bytes);
        /* Parameters of a sharded (or offloaded) unit have no storage between steps. */
        fsdp_param *p = fsdp_module_get_param(m, "layers.1.net1.weight");
        bool resident = !sharded && !c->offload;
        FSDP_RANK_CHECK(ctx, fsdp_tensor_has_storage(fsdp_param_data(p)) == resident,
                        "a parameter of a %s unit (offload %d) %s storage between steps",
                        fsdp_sharding_strategy_to_string(c->strategy), c->offload,
                        resident ? "lost its" : "keeps");
        FSDP_RANK_CHECK(ctx, !fsdp_tensor_has_storage(fsdp_param_grad(p)),
                        "a gradient keeps its full buffer between steps");
    }
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_memory(void) {
    fsdp_sharding_strategy strategies[] = {FSDP_FULL_SHARD, FSDP_NO_SHARD};
    for (int s = 0; s < 2; s++)
        for (int offload = 0; offload < 2; offload++) {
            fsdp_case c = {4, strategies[s], true, 2, offload, false, 0};
            FSDP_TEST_OK(fsdp_test_run_world(4, 0, memory_rank, &c));
        }
}

/* ---- summon_full_params options, no_sync, use_orig_params views (3 ranks: padding) ---- */

/* Compares every parameter of m (inside a summon) with ref's; gradients too when grads. */
typedef struct cmp_grad {
    fsdp_module *other;
    bool grads;
} cmp_grad;

static fsdp_status compare_param_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    const cmp_grad *c = user;
    fsdp_param *q = fsdp_module_get_param(c->other, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "no parameter %s", name);
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->grads ? "gradient of" : "summoned", name);
    return fsdp_test_rank_close(ctx, what, c->grads ? fsdp_param_grad(q) : fsdp_param_data(q),
                                c->grads ? fsdp_param_grad(p) : fsdp_param_data(p), 1e-5, 1e-6,
                                NULL);
}

static fsdp_status summon_rank(fsdp_ctx *ctx, int rank, void *user) {
    const fsdp_case *c = user;
    fsdp_module *ref = NULL, *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_fully_shard_options o;
    fsdp_status st = case_options(ctx, c, &mesh, &o);
    if (st == FSDP_OK) st = build(ctx, &ref);
    if (st == FSDP_OK) st = build(ctx, &m);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->world, rank, &off, &len);
    /* no_sync: two micro-batches (the halves of this rank's rows) accumulate without
     * communication, then the sync backward of a third (empty of rows, the rest) reduces it
     * all: the gradient of the whole batch. */
    int64_t half = len / 2;
    if (st == FSDP_OK) st = stacked_forward_backward(ctx, ref, 0, 0, BATCH, 1);
    fsdp_sharded_set_sync(sh, false);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = stacked_forward_backward(ctx, m, 0, off, half, c->world);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(
            ctx,
            fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_REDUCE_SCATTER}).calls +
                    fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_ALL_REDUCE})
                        .calls ==
                0,
            "a no_sync backward reduced gradients");
    if (st == FSDP_OK) {
        fsdp_status refused =
            fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.with_grads = true});
        FSDP_RANK_CHECK(ctx, refused == FSDP_ERR_STATE,
                        "summon with_grads while no_sync gradients are pending: %s",
                        fsdp_status_to_string(refused));
    }
    fsdp_sharded_set_sync(sh, true);
    if (st == FSDP_OK) st = stacked_forward_backward(ctx, m, 0, off + half, len - half, c->world);
    /* with_grads: the reduced gradients, whole, equal the single-rank model's. */
    if (st == FSDP_OK)
        st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.with_grads = true});
    if (st == FSDP_OK)
        st = fsdp_module_visit_params(ctx, ref, compare_param_grad, &(cmp_grad){m, true});
    if (st == FSDP_OK)
        st = fsdp_module_visit_params(ctx, ref, compare_param_grad, &(cmp_grad){m, false});
    if (st == FSDP_OK) {
        fsdp_status twice = fsdp_summon_full_params(ctx, sh, NULL);
        FSDP_RANK_CHECK(ctx, twice == FSDP_ERR_STATE, "a second summon: %s",
                        fsdp_status_to_string(twice));
        st = fsdp_release_full_params(ctx, sh);
    }
    fsdp_param *w = fsdp_module_get_param(m, "layers.1.net1.weight");
    /* writeback false: edits are dropped. */
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){0});
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, fsdp_param_data(w), 0.5f);
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, NULL);
    if (st == FSDP_OK)
        st = fsdp_module_visit_params(ctx, ref, compare_param_grad, &(cmp_grad){m, false});
    /* writeback: every rank made the same edit, so after writing back its own chunk the whole
     * parameter holds it. */
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, fsdp_param_data(w), 0.5f);
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    if (st == FSDP_OK)
        st = fsdp_tensor_fill(
            ctx, fsdp_param_data(fsdp_module_get_param(ref, "layers.1.net1.weight")), 0.5f);
    /* offload_to_cpu: the same values, in a host copy; the device holds no gathered buffer of
     * a unit that was sharded. Writeback from the host copy. */
    if (st == FSDP_OK)
        st = fsdp_summon_full_params(
            ctx, sh, &(fsdp_summon_options){.writeback = true, .offload_to_cpu = true});
    if (st == FSDP_OK) {
        fsdp_memory_stats ms;
        fsdp_sharded_memory(sh, &ms);
        bool sharded = c->strategy != FSDP_NO_SHARD && c->world > 1;
        FSDP_RANK_CHECK(ctx, !sharded || ms.full_bytes == 0,
                        "summon(offload_to_cpu) holds %lld gathered bytes on the device",
                        (long long)ms.full_bytes);
        st = fsdp_module_visit_params(ctx, ref, compare_param_grad, &(cmp_grad){m, false});
    }
    fsdp_param *b = fsdp_module_get_param(m, "layers.2.net2.bias");
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, fsdp_param_data(b), -2.0f);
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    if (st == FSDP_OK)
        st = fsdp_tensor_fill(
            ctx, fsdp_param_data(fsdp_module_get_param(ref, "layers.2.net2.bias")), -2.0f);
    /* rank0_only: rank 0 sees everything, the others keep sharded units without storage. */
    if (st == FSDP_OK) {
        fsdp_status bad = fsdp_summon_full_params(
            ctx, sh, &(fsdp_summon_options){.writeback = true, .rank0_only = true});
        FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_INVALID_ARGUMENT, "rank0_only with writeback: %s",
                        fsdp_status_to_string(bad));
        st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.rank0_only = true});
    }
    if (st == FSDP_OK && rank == 0)
        st = fsdp_module_visit_params(ctx, ref, compare_param_grad, &(cmp_grad){m, false});
    if (st == FSDP_OK && rank != 0)
        FSDP_RANK_CHECK(ctx,
                        fsdp_tensor_has_storage(fsdp_param_data(w)) ==
                            (c->strategy == FSDP_NO_SHARD && !c->offload),
                        "rank0_only: rank %d's parameter storage", rank);
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    /* use_orig_params: each view is this rank's part of its parameter, aligned to 16 bytes. */
    if (st == FSDP_OK && c->orig) {
        st = fsdp_summon_full_params(ctx, sh, NULL);
        fsdp_module *views = fsdp_sharded_flat_params(sh);
        for (int i = 0; st == FSDP_OK && i < fsdp_sharded_num_segments(sh); i++) {
            fsdp_flat_segment seg;
            st = fsdp_sharded_segment(ctx, sh, i, &seg);
            if (st != FSDP_OK) break;
            fsdp_param *v = fsdp_module_get_param(views, seg.fqn);
            FSDP_RANK_CHECK(ctx, v && seg.offset % 4 == 0, "segment %s: view %p, offset %lld",
                            seg.fqn, (void *)v, (long long)seg.offset);
            FSDP_RANK_CHECK(ctx, fsdp_tensor_numel(fsdp_param_data(v)) == seg.shard_numel,
                            "view %s has %lld elements, its shard part %lld", seg.fqn,
                            (long long)fsdp_tensor_numel(fsdp_param_data(v)),
                            (long long)seg.shard_numel);
            const float *full = fsdp_tensor_f32(fsdp_param_data(seg.param));
            const float *part = fsdp_tensor_f32(fsdp_param_data(v));
            for (int64_t k = 0; k < seg.shard_numel; k++)
                FSDP_RANK_CHECK(ctx, part[k] == full[seg.shard_begin + k],
                                "view %s[%lld] = %g, the parameter's element %lld is %g", seg.fqn,
                                (long long)k, part[k], (long long)(seg.shard_begin + k),
                                full[seg.shard_begin + k]);
        }
        if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    }
    /* writeback of a different edit on every rank: each rank writes back its own chunk only
     * (PyTorch's semantics), so the parameter ends up with rank r's value where rank r's shard
     * holds it, whatever the others wrote. On rank threads the summon hands out a copy, not
     * the block where the shards live side by side. */
    if (st == FSDP_OK && c->strategy != FSDP_NO_SHARD && c->world > 1) {
        fsdp_flat_segment seg = {0};
        for (int i = 0; st == FSDP_OK && i < fsdp_sharded_num_segments(sh); i++) {
            fsdp_flat_segment s;
            st = fsdp_sharded_segment(ctx, sh, i, &s);
            if (st == FSDP_OK && strcmp(s.fqn, "layers.1.net1.weight") == 0) seg = s;
        }
        FSDP_RANK_CHECK(ctx, seg.param == w, "no segment for layers.1.net1.weight");
        int64_t S = fsdp_sharded_unit_shard_numel(sh, seg.unit);
        if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, NULL);
        if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, fsdp_param_data(w), (float)(rank + 1));
        if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
        if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){0});
        const float *v = st == FSDP_OK ? fsdp_tensor_f32(fsdp_param_data(w)) : NULL;
        for (int64_t k = 0; v && k < seg.numel && st == FSDP_OK; k++) {
            float want = (float)((seg.offset + k) / S + 1);
            FSDP_RANK_CHECK(ctx, v[k] == want,
                            "rank-specific writeback: element %lld is %g, want %g (the value "
                            "of the rank whose shard holds it)",
                            (long long)k, v[k], want);
        }
        if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    }
    fsdp_sharded_free(sh);
    fsdp_module_free(ref);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_summon_and_no_sync(void) {
    fsdp_sharding_strategy strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD};
    for (int s = 0; s < 3; s++)
        for (int offload = 0; offload < 2; offload++)
            for (int orig = 0; orig < 2; orig++) {
                fsdp_case c = {3, strategies[s], true, 0, offload, orig, 0};
                fsdp_status st = fsdp_test_run_world(3, 0, summon_rank, &c);
                if (st != FSDP_OK)
                    fprintf(stderr, "\n  %s offload %d use_orig_params %d\n",
                            fsdp_sharding_strategy_to_string(strategies[s]), offload, orig);
                FSDP_TEST_OK(st);
            }
}

/* ---- sync_module_states, wrapping errors ---- */

static fsdp_status sync_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_module *ref = NULL, *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_status st = build(ctx, &ref);
    /* Every rank initialises differently; rank 0's values must win. */
    if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, LAYERS, &m);
    if (st == FSDP_OK)
        st = fsdp_module_reset_parameters(ctx, m, rank == 0 ? SEED : 1000 + (uint64_t)rank);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK)
        st =
            fsdp_fully_shard(ctx, m,
                             &(fsdp_fully_shard_options){.sync_module_states = true,
                                                         .wrap_paths = (const char *[]){"layers.1"},
                                                         .n_wrap_paths = 1},
                             &sh);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        /* One bucket for the whole model. */
        int64_t calls =
            fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_BROADCAST}).calls;
        int64_t all = fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){0}).calls;
        FSDP_RANK_CHECK(ctx, calls == 1 && all == 1,
                        "sync_module_states: %lld broadcasts, %lld collectives; want 1",
                        (long long)calls, (long long)all);
        st = fsdp_summon_full_params(ctx, sh, NULL);
    }
    if (st == FSDP_OK)
        st = fsdp_module_visit_params(ctx, ref, compare_param_grad, &(cmp_grad){m, false});
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    fsdp_sharded_free(sh);
    sh = NULL;
    /* Errors: HYBRID_SHARD without its replicate group; a replicate group without it; wrapping
     * twice. The model is left untouched by a refused wrap. */
    fsdp_status e =
        fsdp_fully_shard(ctx, m, &(fsdp_fully_shard_options){.strategy = FSDP_HYBRID_SHARD}, &sh);
    FSDP_RANK_CHECK(
        ctx, e == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "replicate_group"),
        "HYBRID_SHARD without replicate_group: %s", fsdp_last_error(ctx));
    e = fsdp_fully_shard(
        ctx, m, &(fsdp_fully_shard_options){.replicate_group = fsdp_ctx_world_group(ctx)}, &sh);
    FSDP_RANK_CHECK(ctx, e == FSDP_ERR_INVALID_ARGUMENT, "replicate_group with FULL_SHARD: %s",
                    fsdp_status_to_string(e));
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, NULL, &sh);
    if (st == FSDP_OK) {
        fsdp_sharded *again = NULL;
        e = fsdp_fully_shard(ctx, m, NULL, &again);
        FSDP_RANK_CHECK(ctx, e == FSDP_ERR_STATE && !again, "wrapping twice: %s",
                        fsdp_status_to_string(e));
        fsdp_param *w = fsdp_module_get_param(m, "layers.0.net1.weight");
        fsdp_tensor *copy = NULL;
        st = fsdp_tensor_create_like(ctx, fsdp_param_data(w), &copy);
        if (st == FSDP_OK) {
            e = fsdp_tensor_copy(ctx, copy, fsdp_param_data(w));
            FSDP_RANK_CHECK(ctx, e == FSDP_ERR_STATE && strstr(fsdp_last_error(ctx), "summon"),
                            "copying a sharded parameter: %s", fsdp_last_error(ctx));
        }
        fsdp_tensor_free(copy);
    }
    fsdp_sharded_free(sh);
    fsdp_module_free(ref);
    fsdp_module_free(m);
    return st;
}

static void test_sync_module_states_and_errors(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 0, sync_rank, NULL));
}

/* ---- 2D: FSDP over dp wrapping a TP model on tp (seed test_fsdp_tp_extension_grad) ---- */

/* RMSNorm(10) then MLPModule; TP on tp: the norm SequenceParallel over Shard(0) rows, net1
 * Colwise(input Shard(0)), net2 Rowwise(output Shard(0)); one root FULL_SHARD unit over dp.
 * World 4 = (dp 2, tp 2); the global batch of 8 rows: dp replica d takes rows [4d, 4d + 4),
 * and tp rank t its 2 of them. One forward and backward of sum(output) makes exactly the 7
 * collectives PyTorch's FSDP over TP makes here (docs/fsdp.md, "Verified"); one SGD step then
 * matches the single-rank model trained on all 8 rows. */
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
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 7, 4 * d + 2 * t, 2, &x);
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 7, 0, BATCH, &xr);
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

/* ---- reductions left in flight (started collectives) against the blocking calls ---- */

#define WORKS_MAX_VALUES (1 << 16)
#define WORKS_MAX_RANKS  4

/* A case of the started reductions: the strategy's, and how gradients are reduced. */
typedef struct works_case {
    fsdp_case c;
    fsdp_comm_hook_kind hook;
    fsdp_dtype reduce_dtype;
} works_case;

static fsdp_status works_options(fsdp_ctx *ctx, const works_case *w, fsdp_mesh **mesh,
                                 fsdp_fully_shard_options *o) {
    FSDP_TRY(case_options(ctx, &w->c, mesh, o));
    o->comm_hook.kind = w->hook;
    o->mixed_precision.reduce_dtype = w->reduce_dtype;
    return FSDP_OK;
}

/* One run of works_rank: per rank, every unit's flat shard and its gradient after each step,
 * the comm-debug calls per op, and the reductions FSDP's hooks left in flight. */
typedef struct works_run {
    const works_case *w;
    float *values[WORKS_MAX_RANKS];
    int64_t n[WORKS_MAX_RANKS];
    int64_t calls[WORKS_MAX_RANKS][FSDP_COMM_OP_COUNT];
    int in_flight[WORKS_MAX_RANKS];
    bool ran[WORKS_MAX_RANKS];
} works_run;

static void count_in_flight(void *user, int unit_index, fsdp_prefetch_event ev, int in_flight) {
    (void)unit_index, (void)in_flight;
    if (ev == FSDP_REDUCE_IN_FLIGHT) ++*(int *)user;
}

static fsdp_status record_flat(fsdp_ctx *ctx, works_run *r, int rank, const fsdp_tensor *t) {
    int64_t n = fsdp_tensor_numel(t);
    FSDP_RANK_CHECK(ctx, r->n[rank] + n <= WORKS_MAX_VALUES, "more than %d values",
                    WORKS_MAX_VALUES);
    memcpy(r->values[rank] + r->n[rank], fsdp_tensor_data(t), (size_t)n * sizeof(float));
    r->n[rank] += n;
    return FSDP_OK;
}

static fsdp_status works_rank(fsdp_ctx *ctx, int rank, void *user) {
    works_run *r = user;
    const fsdp_case *c = &r->w->c;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_fully_shard_options o;
    fsdp_sgd_options sgd = {.lr = 0.1, .momentum = 0.9};
    FSDP_RANK_CHECK(ctx, rank < WORKS_MAX_RANKS, "rank %d", rank);
    r->ran[rank] = true;
    fsdp_status st = works_options(ctx, r->w, &mesh, &o);
    if (st == FSDP_OK) st = build(ctx, &m);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &sgd, &opt);
    if (st == FSDP_OK) fsdp_shard_test_trace(sh, count_in_flight, &r->in_flight[rank]);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->world, rank, &off, &len);
    for (int s = 0; st == FSDP_OK && s < c->steps; s++) {
        st = step(ctx, m, opt, s, off, len, c->world);
        for (int u = 0; st == FSDP_OK && u < fsdp_sharded_num_units(sh); u++) {
            fsdp_param *flat = fsdp_sharded_unit_flat_param(sh, u);
            st = record_flat(ctx, r, rank, fsdp_param_data(flat));
            if (st == FSDP_OK) st = record_flat(ctx, r, rank, fsdp_param_grad(flat));
        }
    }
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    for (int op = 0; st == FSDP_OK && op < FSDP_COMM_OP_COUNT; op++)
        r->calls[rank][op] =
            fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = (fsdp_comm_op)op}).calls;
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

/* Reductions started on works (the default) against the blocking calls of the comm hook's
 * separate passes (fsdp_shard_test_blocking_works), nested units, 3 SGD steps: every shard and
 * gradient equal bit for bit after every step, and the same collectives. The default hook in f32
 * (NO_SHARD's all_reduce, HYBRID_SHARD's replicas' all_reduce after the reduce_scatter), and the
 * 16-bit reductions (the bf16 and fp16 hooks, reduce_dtype bf16 and f16) under NO_SHARD,
 * FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD: their collective in that dtype is started, and the
 * widening and the post-division wait for it. Under MPI an all_reduce's start leaves it in flight
 * (the backend's non-blocking all_reduce), so every unit's reduction is still in flight when its
 * post-backward hook returns (the pool and the end of backward complete it); a reduce_scatter is
 * left in flight only where the backend's start leaves it so (fsdp_comm_work_pending), then for
 * every unit alike. On rank threads a start on host tensors completes at once, so nothing is left
 * in flight there. */
static void test_reductions_in_flight(void) {
    static const works_case cases[] = {
        {{2, FSDP_NO_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_F32},
        {{3, FSDP_NO_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_F32},
        {{4, FSDP_NO_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_F32},
        {{4, FSDP_HYBRID_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_F32},
        {{2, FSDP_NO_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_BF16, FSDP_DTYPE_F32},
        {{3, FSDP_NO_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_BF16},
        {{4, FSDP_NO_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_FP16, FSDP_DTYPE_F32},
        {{2, FSDP_FULL_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_BF16},
        {{3, FSDP_FULL_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_FP16, FSDP_DTYPE_F32},
        {{4, FSDP_SHARD_GRAD_OP, true, 3, false, false, 2}, FSDP_COMM_HOOK_BF16, FSDP_DTYPE_F32},
        {{4, FSDP_FULL_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_F16},
        {{4, FSDP_HYBRID_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_BF16, FSDP_DTYPE_F32},
        {{4, FSDP_HYBRID_SHARD, true, 3, false, false, 2}, FSDP_COMM_HOOK_DEFAULT, FSDP_DTYPE_BF16},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const fsdp_case *c = &cases[k].c;
        works_run started = {.w = &cases[k]}, blocking = {.w = &cases[k]};
        for (int i = 0; i < WORKS_MAX_RANKS; i++) {
            started.values[i] = calloc(WORKS_MAX_VALUES, sizeof(float));
            blocking.values[i] = calloc(WORKS_MAX_VALUES, sizeof(float));
            CU_ASSERT_PTR_NOT_NULL_FATAL(started.values[i]);
            CU_ASSERT_PTR_NOT_NULL_FATAL(blocking.values[i]);
        }
        FSDP_TEST_OK(fsdp_test_run_world(c->world, 0, works_rank, &started));
        fsdp_shard_test_blocking_works(true);
        fsdp_status st = fsdp_test_run_world(c->world, 0, works_rank, &blocking);
        fsdp_shard_test_blocking_works(false);
        FSDP_TEST_OK(st);
        /* the last collective is an all_reduce: NO_SHARD's, or the replicas' */
        bool all_reduce = c->strategy == FSDP_NO_SHARD || c->strategy == FSDP_HYBRID_SHARD;
        int every = LAYERS * c->steps;
        for (int i = 0; i < c->world; i++) {
            CU_ASSERT_EQUAL(started.ran[i], blocking.ran[i]);
            if (!started.ran[i]) continue;
            CU_ASSERT_TRUE(started.n[i] > 0 && started.n[i] == blocking.n[i]);
            CU_ASSERT_EQUAL(
                memcmp(started.values[i], blocking.values[i], (size_t)started.n[i] * sizeof(float)),
                0);
            CU_ASSERT_EQUAL(memcmp(started.calls[i], blocking.calls[i], sizeof started.calls[i]),
                            0);
            /* under MPI every unit's all_reduce in every step, and a reduce_scatter in every
             * step or in none (as the backend's start leaves it); none on rank threads */
            int want = fsdp_test_mpi() && all_reduce ? every : 0;
            bool ok = started.in_flight[i] == want ||
                      (fsdp_test_mpi() && !all_reduce && started.in_flight[i] == every);
            if (!ok || (fsdp_test_mpi() && !all_reduce && i == 0))
                printf("\n  %s, hook %s, reduce_dtype %s on %d ranks, rank %d: %d reductions "
                       "left in flight (want %d%s)\n",
                       fsdp_sharding_strategy_to_string(c->strategy),
                       fsdp_comm_hook_kind_to_string(cases[k].hook),
                       fsdp_dtype_to_string(cases[k].reduce_dtype), c->world, i,
                       started.in_flight[i], want,
                       all_reduce || !fsdp_test_mpi() ? "" : " or every one");
            CU_ASSERT_TRUE(ok);
            CU_ASSERT_EQUAL(blocking.in_flight[i], 0);
        }
        for (int i = 0; i < WORKS_MAX_RANKS; i++) free(started.values[i]), free(blocking.values[i]);
    }
}

/* A step whose FSDP hook fails (fsdp_shard_test_fail_hook: layers.1's pre-backward, after
 * layers.2's reduction was started; under MPI its all_reduce is then in flight) returns that
 * failure with its message, and leaves no work in flight (the hook completes every unit's works
 * first); the group still works after it. */
static fsdp_status failure_rank(fsdp_ctx *ctx, int rank, void *user) {
    const works_case *w = user;
    const fsdp_case *c = &w->c;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_fully_shard_options o;
    fsdp_sgd_options sgd = {.lr = 0.1};
    int in_flight = 0;
    fsdp_status st = works_options(ctx, w, &mesh, &o);
    if (st == FSDP_OK) st = build(ctx, &m);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &o, &sh);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &sgd, &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->world, rank, &off, &len);
    if (st == FSDP_OK) st = step(ctx, m, opt, 0, off, len, c->world);
    if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
    if (st == FSDP_OK) fsdp_shard_test_trace(sh, count_in_flight, &in_flight);
    /* every rank has finished the good step before any rank's hooks may fail */
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK) fsdp_shard_test_fail_hook(1, FSDP_HOOK_PRE_BACKWARD);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK) {
        fsdp_status failed = stacked_forward_backward(ctx, m, 1, off, len, c->world);
        FSDP_RANK_CHECK(ctx, failed == FSDP_ERR_INTERNAL, "the step returned %s",
                        fsdp_status_to_string(failed));
        const char *needles[] = {"the failure a test asked for", NULL};
        FSDP_RANK_CHECK(ctx, fsdp_test_message_has(fsdp_last_error(ctx), needles),
                        "the step's message is '%s'", fsdp_last_error(ctx));
        for (int u = 0; u < fsdp_sharded_num_units(sh); u++)
            FSDP_RANK_CHECK(ctx,
                            !fsdp_comm_work_pending(sh->units[u]->gather_work) &&
                                !fsdp_comm_work_pending(sh->units[u]->reduce_work),
                            "unit %d has a work in flight after the failed step", u);
        /* under MPI layers.2's all_reduce was in flight when layers.1's hook failed */
        FSDP_RANK_CHECK(ctx, in_flight == (fsdp_test_mpi() ? 1 : 0),
                        "%d reductions in flight in the failed step", in_flight);
        st = fsdp_barrier(ctx, NULL);
    }
    fsdp_shard_test_fail_hook(-1, FSDP_HOOK_PRE_BACKWARD);
    fsdp_tensor *t = NULL;
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &t);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, o.group, t, FSDP_REDUCE_SUM);
    fsdp_tensor_free(t);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

/* The default hook in f32, the bf16 hook and reduce_dtype f16 (the 16-bit all_reduce started
 * on the work, its widening left for the wait). */
static void test_failed_step(void) {
    static const fsdp_comm_hook_kind hooks[] = {FSDP_COMM_HOOK_DEFAULT, FSDP_COMM_HOOK_BF16,
                                                FSDP_COMM_HOOK_DEFAULT};
    static const fsdp_dtype dtypes[] = {FSDP_DTYPE_F32, FSDP_DTYPE_F32, FSDP_DTYPE_F16};
    for (int k = 0; k < 3; k++)
        for (int world = 2; world <= 4; world++) {
            works_case w = {{world, FSDP_NO_SHARD, true, 2, false, false, 2}, hooks[k], dtypes[k]};
            FSDP_TEST_OK(fsdp_test_run_world(world, 0, failure_rank, &w));
        }
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"train_full_shard_root", test_train_full_shard_root},
        {"train_full_shard_nested", test_train_full_shard_nested},
        {"train_shard_grad_op_root", test_train_shard_grad_op_root},
        {"train_shard_grad_op_nested", test_train_shard_grad_op_nested},
        {"train_no_shard_root", test_train_no_shard_root},
        {"train_no_shard_nested", test_train_no_shard_nested},
        {"train_hybrid_shard_root", test_train_hybrid_shard_root},
        {"train_hybrid_shard_nested", test_train_hybrid_shard_nested},
        {"comm_counts", test_comm_counts},
        {"memory", test_memory},
        {"summon_and_no_sync", test_summon_and_no_sync},
        {"sync_module_states_and_errors", test_sync_module_states_and_errors},
        {"fsdp_tp_extension_grad", test_fsdp_tp_extension_grad},
        {"reductions_in_flight", test_reductions_in_flight},
        {"failed_step", test_failed_step},
    };
    return fsdp_test_run(argc, argv, "fsdp", cases, sizeof cases / sizeof cases[0]);
}

/* test_comm_hooks.c: the gradient comm hooks of replicate (per bucket) and FSDP (per unit:
 * FULL_SHARD's reduce_scatter, NO_SHARD's all_reduce) on MLPStacked(3), one backward of each
 * rank's rows. A user hook that records every call (its index, sizes and group), the per-element
 * mean of |g_r| over the ranks, and the default average it computes with fsdp_comm_hook_run, is
 * the reference: the default hook gives its bits exactly; the bf16 and fp16 hooks give
 * gradients within the compressed type's rounding of it (the bound of comm_hook.h, with u = 2^-8
 * and 2^-11) and move exactly half the bytes; a user hook's result is what lands in the
 * gradients; FSDP's reduce_dtype bf16 equals the bf16 hook bit for bit. Also the refused
 * options. Every rank checks its own results. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "stacked_batches.h"

#define SEED      7
#define LAYERS    3
#define MAX_INDEX 16

typedef enum wrapper {
    WRAP_REPLICATE,
    WRAP_FSDP_FULL,
    WRAP_FSDP_NO_SHARD,
    WRAP_FSDP_HYBRID
} wrapper;

static const char *wrapper_name(wrapper w) {
    static const char *names[] = {"replicate", "FULL_SHARD", "NO_SHARD", "HYBRID_SHARD"};
    return names[w];
}

/* What the recording hook saw and computed, per bucket (unit) index. */
typedef struct record {
    fsdp_comm_hook_kind inner; /* the built-in it runs */
    float times;               /* then scales the result by this */
    fsdp_group *want_group;
    int calls[MAX_INDEX];
    int64_t grad_numel[MAX_INDEX], out_numel[MAX_INDEX]; /* -1: output NULL */
    float *result[MAX_INDEX];                            /* the hook's result */
    float *abs_mean[MAX_INDEX]; /* sum over ranks of |g_r| / W, at the result's elements */
    int64_t n[MAX_INDEX];
    bool wrong_group;
} record;

static void record_free(record *r) {
    for (int i = 0; i < MAX_INDEX; i++) free(r->result[i]), free(r->abs_mean[i]);
}

static fsdp_status record_hook(fsdp_ctx *ctx, const fsdp_comm_bucket *b, void *user) {
    record *r = user;
    int i = b->index;
    FSDP_RANK_CHECK(ctx, i >= 0 && i < MAX_INDEX && r->calls[i] == 0,
                    "hook called for index %d (calls so far %d)", i,
                    i >= 0 && i < MAX_INDEX ? r->calls[i] : -1);
    r->calls[i]++;
    r->wrong_group |= b->group != r->want_group;
    r->grad_numel[i] = fsdp_tensor_numel(b->grad);
    r->out_numel[i] = b->output ? fsdp_tensor_numel(b->output) : -1;
    int W = fsdp_group_size(b->group);
    int64_t n = fsdp_tensor_numel(b->grad);
    fsdp_tensor *a;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &a));
    for (int64_t k = 0; k < n; k++)
        fsdp_tensor_f32(a)[k] = fabsf(fsdp_tensor_f32(b->grad)[k]) / (float)W;
    fsdp_status st = fsdp_all_reduce(ctx, b->group, a, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) st = fsdp_comm_hook_run(ctx, r->inner, b);
    const fsdp_tensor *res = b->output ? b->output : b->grad;
    int64_t m = fsdp_tensor_numel(res), at = b->output ? fsdp_group_rank(b->group) * m : 0;
    r->n[i] = m;
    r->result[i] = malloc((size_t)(m + 1) * sizeof(float));
    r->abs_mean[i] = malloc((size_t)(m + 1) * sizeof(float));
    if (st == FSDP_OK && (!r->result[i] || !r->abs_mean[i]))
        st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "record");
    for (int64_t k = 0; st == FSDP_OK && k < m; k++) {
        fsdp_tensor_f32(res)[k] *= r->times;
        r->result[i][k] = fsdp_tensor_f32(res)[k];
        r->abs_mean[i][k] = fsdp_tensor_f32(a)[at + k];
    }
    fsdp_tensor_free(a);
    return st;
}

/* ---- one backward under a wrapper ---- */

typedef struct run_out {
    float *grad; /* the reduced gradients: buckets (units) in index order, concatenated */
    int64_t n;
    int n_index;                  /* buckets or units */
    int64_t want_grad[MAX_INDEX]; /* what each index's hook call must see */
    int64_t want_out[MAX_INDEX];
    int64_t calls, bytes; /* the backward's reductions (both groups for HYBRID_SHARD) */
    int64_t unit_numel[MAX_INDEX];
} run_out;

static fsdp_status append(fsdp_ctx *ctx, run_out *o, const fsdp_tensor *g) {
    int64_t m = fsdp_tensor_numel(g);
    float *p = realloc(o->grad, (size_t)(o->n + m + 1) * sizeof(float));
    if (!p) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "append");
    o->grad = p;
    memcpy(o->grad + o->n, fsdp_tensor_f32(g), (size_t)m * sizeof(float));
    o->n += m;
    return FSDP_OK;
}

typedef struct params {
    fsdp_param **p;
    int n;
} params;

static fsdp_status list_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    params *l = user;
    l->p[l->n++] = p;
    return FSDP_OK;
}

/* Builds MLPStacked(3), wraps it with `hook` (and mixed precision mp), runs one forward and
 * backward of this rank's rows, and collects the reduced gradients in index order: replicate's
 * buckets hold the parameters in reverse registration order, so those gradients in that order;
 * FSDP's units (the root, layers.1, layers.2) their flat shards' gradients. */
static fsdp_status run_once(fsdp_ctx *ctx, wrapper w, fsdp_group *dp, fsdp_group *replicas,
                            const fsdp_comm_hook *hook, fsdp_mixed_precision mp, run_out *o) {
    memset(o, 0, sizeof *o);
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_replicate *rep = NULL;
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, &m));
    fsdp_status st = fsdp_module_reset_parameters(ctx, m, SEED);
    static const char *const nested[] = {"layers.1", "layers.2"};
    if (st == FSDP_OK && w == WRAP_REPLICATE)
        st = fsdp_replicate_apply(
            ctx, m,
            &(fsdp_replicate_options){.group = dp, .bucket_bytes = 1024, .comm_hook = *hook}, &rep);
    else if (st == FSDP_OK)
        st = fsdp_fully_shard(
            ctx, m,
            &(fsdp_fully_shard_options){.strategy = w == WRAP_FSDP_FULL     ? FSDP_FULL_SHARD
                                                    : w == WRAP_FSDP_HYBRID ? FSDP_HYBRID_SHARD
                                                                            : FSDP_NO_SHARD,
                                        .group = dp,
                                        .replicate_group = replicas,
                                        .wrap_paths = nested,
                                        .n_wrap_paths = 2,
                                        .comm_hook = *hook,
                                        .mixed_precision = mp},
            &sh);
    /* The world's ranks are the data-parallel ranks: each takes its rows of the batch. */
    int64_t off, len;
    fsdp_batch_range(ctx, NULL, STACKED_BATCH, &off, &len);
    int world = fsdp_world_size(fsdp_ctx_world(ctx));
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = stacked_forward_backward(ctx, m, 0, off, len, world);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    /* the reductions (FULL_SHARD's backward also re-gathers the nested units) */
    fsdp_comm_op op = w == WRAP_FSDP_FULL || w == WRAP_FSDP_HYBRID ? FSDP_COMM_REDUCE_SCATTER
                                                                   : FSDP_COMM_ALL_REDUCE;
    fsdp_comm_count c = fsdp_comm_debug_query(
        ctx, &(fsdp_comm_filter){
                 .op = op, .group = fsdp_group_label(dp), .phase = FSDP_COMM_PHASE_BACKWARD});
    fsdp_comm_count r =
        fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_ALL_REDUCE,
                                                       .group = "replicate",
                                                       .phase = FSDP_COMM_PHASE_BACKWARD});
    o->calls = c.calls + (replicas ? r.calls : 0);
    o->bytes = c.bytes + (replicas ? r.bytes : 0);
    int W = fsdp_group_size(dp);
    if (st == FSDP_OK && rep) {
        o->n_index = fsdp_replicate_num_buckets(rep);
        for (int b = 0; b < o->n_index && b < MAX_INDEX; b++) {
            o->want_grad[b] = fsdp_replicate_bucket_numel(rep, b);
            o->want_out[b] = -1;
        }
        fsdp_param *list[64];
        params l = {list, 0};
        st = fsdp_module_visit_params(ctx, m, list_param, &l);
        for (int i = l.n - 1; st == FSDP_OK && i >= 0; i--)
            st = append(ctx, o, fsdp_param_grad(list[i]));
    } else if (st == FSDP_OK) {
        o->n_index = fsdp_sharded_num_units(sh);
        for (int u = 0; u < o->n_index && st == FSDP_OK && u < MAX_INDEX; u++) {
            int64_t s = fsdp_sharded_unit_shard_numel(sh, u);
            bool sharded = w == WRAP_FSDP_FULL || w == WRAP_FSDP_HYBRID;
            o->want_grad[u] = sharded ? s * W : s;
            o->want_out[u] = sharded ? s : -1;
            o->unit_numel[u] = fsdp_sharded_unit_numel(sh, u);
            st = append(ctx, o, fsdp_param_grad(fsdp_sharded_unit_flat_param(sh, u)));
        }
    }
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

/* ---- the checks ---- */

typedef struct hook_case {
    int world;
    wrapper w;
} hook_case;

/* |got - want| <= (u + 4 eps) |want| + (1.01 u + 3 W eps) A + sub per element, with want the
 * recorded default average, A the recorded mean of |g_r| and sub = (W + 2) 2^-25 for f16 (its
 * subnormal spacing); eps = 2^-24 covers the f32 sums and divisions on both sides. Also at least
 * one element must differ (the compression happened). */
static fsdp_status check_bound(fsdp_ctx *ctx, const char *what, const run_out *got,
                               const record *ref, int n_index, int W, double u, double sub) {
    const double eps = 0x1p-24;
    double worst = 0; /* the largest |difference| / bound */
    int64_t k = 0, differ = 0;
    for (int i = 0; i < n_index; i++)
        for (int64_t j = 0; j < ref->n[i]; j++, k++) {
            double want = ref->result[i][j], a = ref->abs_mean[i][j];
            double d = fabs((double)got->grad[k] - want);
            double bound = (u + 4 * eps) * fabs(want) + (1.01 * u + 3 * W * eps) * a + sub;
            FSDP_RANK_CHECK(ctx, d <= bound,
                            "%s: index %d element %lld is %.9g, the f32 average %.9g: off by "
                            "%.3g, more than the bound %.3g (mean |g| %.3g)",
                            what, i, (long long)j, (double)got->grad[k], want, d, bound, a);
            if (bound > 0 && d / bound > worst) worst = d / bound;
            differ += d > 0;
        }
    FSDP_RANK_CHECK(ctx, k == got->n, "%s: %lld gradient values, %lld recorded", what,
                    (long long)got->n, (long long)k);
    FSDP_RANK_CHECK(ctx, differ > 0, "%s: no element differs from the f32 average", what);
    if (fsdp_ctx_rank(ctx) == 0)
        printf("\n    %s: %lld of %lld differ from f32, worst at %.2f of the bound", what,
               (long long)differ, (long long)k, worst);
    return FSDP_OK;
}

static fsdp_status same_bits(fsdp_ctx *ctx, const char *what, const run_out *a, const float *b,
                             int64_t n) {
    FSDP_RANK_CHECK(ctx, a->n == n, "%s: %lld values, want %lld", what, (long long)a->n,
                    (long long)n);
    FSDP_RANK_CHECK(ctx, memcmp(a->grad, b, (size_t)n * sizeof(float)) == 0,
                    "%s: the gradients differ", what);
    return FSDP_OK;
}

static fsdp_status hooks_body(fsdp_ctx *ctx, const hook_case *c) {
    fsdp_mesh *mesh = NULL;
    fsdp_group *dp;
    FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){c->world}, (const char *[]){"dp"}, &mesh));
    fsdp_status st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
    char what[96];
    record rec = {.inner = FSDP_COMM_HOOK_DEFAULT, .times = 1.0f, .want_group = dp};
    record twice = {.inner = FSDP_COMM_HOOK_DEFAULT, .times = 2.0f, .want_group = dp};
    run_out user = {0}, def = {0}, bf = {0}, fp = {0}, x2 = {0}, mp = {0};
    fsdp_mixed_precision f32 = {0};
    int W = c->world;
    /* 1. The recording hook: called once per index with the sizes the wrapper reduces, on the
     * dp group; its result is what the gradients hold. */
    if (st == FSDP_OK)
        st = run_once(
            ctx, c->w, dp, NULL,
            &(fsdp_comm_hook){.kind = FSDP_COMM_HOOK_USER, .fn = record_hook, .user = &rec}, f32,
            &user);
    int64_t total = 0;
    for (int i = 0; st == FSDP_OK && i < user.n_index; i++) {
        if (rec.calls[i] != 1 || rec.grad_numel[i] != user.want_grad[i] ||
            rec.out_numel[i] != user.want_out[i])
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "%s: index %d: %d calls, grad %lld (want %lld), output %lld (want %lld)",
                           wrapper_name(c->w), i, rec.calls[i], (long long)rec.grad_numel[i],
                           (long long)user.want_grad[i], (long long)rec.out_numel[i],
                           (long long)user.want_out[i]);
        total += rec.n[i];
    }
    if (st == FSDP_OK && (rec.wrong_group || user.n_index < 2 || user.n_index > MAX_INDEX))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s: %d indices, group %s", wrapper_name(c->w),
                       user.n_index, rec.wrong_group ? "wrong" : "right");
    if (st == FSDP_OK && fsdp_ctx_rank(ctx) == 0)
        printf("\n    %s W=%d: %d %s, %lld gradient values here", wrapper_name(c->w), W,
               user.n_index, c->w == WRAP_REPLICATE ? "buckets" : "units", (long long)total);
    float *ref = malloc((size_t)(total + 1) * sizeof(float));
    if (st == FSDP_OK && !ref) st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "ref");
    for (int i = 0, k = 0; st == FSDP_OK && i < user.n_index; k += (int)rec.n[i], i++)
        memcpy(ref + k, rec.result[i], (size_t)rec.n[i] * sizeof(float));
    if (st == FSDP_OK) st = same_bits(ctx, "user hook result", &user, ref, total);
    /* 2. The default: the same bits (FSDP's factors pre, post are powers of two here). */
    if (st == FSDP_OK) st = run_once(ctx, c->w, dp, NULL, &(fsdp_comm_hook){0}, f32, &def);
    if (st == FSDP_OK) st = same_bits(ctx, "default hook", &def, ref, total);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, def.calls == user.n_index, "default: %lld collectives, want %d",
                        (long long)def.calls, user.n_index);
    /* 3. bf16 and fp16: within the bound, the same collectives, half the bytes. */
    if (st == FSDP_OK)
        st =
            run_once(ctx, c->w, dp, NULL, &(fsdp_comm_hook){.kind = FSDP_COMM_HOOK_BF16}, f32, &bf);
    snprintf(what, sizeof what, "%s W=%d bf16 hook", wrapper_name(c->w), W);
    if (st == FSDP_OK) st = check_bound(ctx, what, &bf, &rec, user.n_index, W, 0x1p-8, 0);
    if (st == FSDP_OK)
        st =
            run_once(ctx, c->w, dp, NULL, &(fsdp_comm_hook){.kind = FSDP_COMM_HOOK_FP16}, f32, &fp);
    snprintf(what, sizeof what, "%s W=%d fp16 hook", wrapper_name(c->w), W);
    if (st == FSDP_OK)
        st = check_bound(ctx, what, &fp, &rec, user.n_index, W, 0x1p-11, (W + 2) * 0x1p-25);
    for (int k = 0; st == FSDP_OK && k < 2; k++) {
        const run_out *h = k ? &fp : &bf;
        FSDP_RANK_CHECK(ctx, h->calls == def.calls && 2 * h->bytes == def.bytes,
                        "%s hook: %lld collectives of %lld bytes; the default %lld of %lld",
                        k ? "fp16" : "bf16", (long long)h->calls, (long long)h->bytes,
                        (long long)def.calls, (long long)def.bytes);
    }
    /* 4. A user hook's result is used: the average times 2, exactly. */
    if (st == FSDP_OK)
        st = run_once(
            ctx, c->w, dp, NULL,
            &(fsdp_comm_hook){.kind = FSDP_COMM_HOOK_USER, .fn = record_hook, .user = &twice}, f32,
            &x2);
    for (int64_t k = 0; st == FSDP_OK && k < total; k++) ref[k] *= 2.0f;
    if (st == FSDP_OK) st = same_bits(ctx, "user hook times 2", &x2, ref, total);
    /* 5. FSDP: reduce_dtype bf16 is the bf16 hook's cast-reduce-cast. */
    if (st == FSDP_OK && c->w != WRAP_REPLICATE)
        st = run_once(ctx, c->w, dp, NULL, &(fsdp_comm_hook){0},
                      (fsdp_mixed_precision){.reduce_dtype = FSDP_DTYPE_BF16}, &mp);
    if (st == FSDP_OK && c->w != WRAP_REPLICATE)
        st = same_bits(ctx, "reduce_dtype bf16", &mp, bf.grad, bf.n);
    free(ref);
    run_out *outs[] = {&user, &def, &bf, &fp, &x2, &mp};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) free(outs[i]->grad);
    record_free(&rec);
    record_free(&twice);
    fsdp_mesh_free(mesh);
    return st;
}

static fsdp_status hooks_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    return hooks_body(ctx, user);
}

static void run_hooks(wrapper w, const int *worlds, int n) {
    for (int i = 0; i < n; i++) {
        hook_case c = {.world = worlds[i], .w = w};
        FSDP_TEST_OK(fsdp_test_run_world(c.world, 0, hooks_rank, &c));
    }
}

static void test_replicate_hooks(void) {
    run_hooks(WRAP_REPLICATE, (int[]){2, 3, 4}, 3);
}

/* FSDP on 2 and 4 ranks, where the divide factors (2, 1) and (2, 2) are powers of two, so the
 * default reduction and the recording hook's plain average have the same bits. */
static void test_fsdp_full_shard_hooks(void) {
    run_hooks(WRAP_FSDP_FULL, (int[]){2, 4}, 2);
}

static void test_fsdp_no_shard_hooks(void) {
    run_hooks(WRAP_FSDP_NO_SHARD, (int[]){2, 4}, 2);
}

/* HYBRID_SHARD on a (replicate 2, shard 2) mesh: the bf16 hook reduces in bf16 twice (the
 * reduce_scatter over shard, then the all_reduce over replicate), each sum rounded once, so one
 * more rounding of a partial sum than above: |h - d| <= (u + 4 eps)|d| + (2.02 u + 3 W eps) A,
 * with d the default HYBRID result and A the mean of |g_r| over the 4 ranks, recorded by a user
 * hook on NO_SHARD over the same 4 ranks and data (a user hook is refused with HYBRID_SHARD).
 * Half the bytes on both groups; reduce_dtype bf16 gives the bf16 hook's bits. */
static fsdp_status hybrid_rank(fsdp_ctx *ctx, int rank, void *arg) {
    (void)rank, (void)arg;
    fsdp_mesh *flat = NULL, *mesh = NULL;
    fsdp_group *dp = NULL, *shard = NULL, *replicas = NULL;
    fsdp_status st = fsdp_mesh_create(ctx, 1, (int[]){4}, (const char *[]){"dp"}, &flat);
    if (st == FSDP_OK)
        st = fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"replicate", "shard"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, flat, "dp", &dp);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "shard", &shard);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "replicate", &replicas);
    record rec = {.inner = FSDP_COMM_HOOK_DEFAULT, .times = 1.0f, .want_group = dp};
    run_out user = {0}, def = {0}, bf = {0}, mp = {0};
    fsdp_mixed_precision f32 = {0};
    if (st == FSDP_OK)
        st = run_once(
            ctx, WRAP_FSDP_NO_SHARD, dp, NULL,
            &(fsdp_comm_hook){.kind = FSDP_COMM_HOOK_USER, .fn = record_hook, .user = &rec}, f32,
            &user);
    if (st == FSDP_OK)
        st = run_once(ctx, WRAP_FSDP_HYBRID, shard, replicas, &(fsdp_comm_hook){0}, f32, &def);
    if (st == FSDP_OK)
        st = run_once(ctx, WRAP_FSDP_HYBRID, shard, replicas,
                      &(fsdp_comm_hook){.kind = FSDP_COMM_HOOK_BF16}, f32, &bf);
    if (st == FSDP_OK)
        st = run_once(ctx, WRAP_FSDP_HYBRID, shard, replicas, &(fsdp_comm_hook){0},
                      (fsdp_mixed_precision){.reduce_dtype = FSDP_DTYPE_BF16}, &mp);
    if (st == FSDP_OK) st = same_bits(ctx, "HYBRID reduce_dtype bf16", &mp, bf.grad, bf.n);
    const double u = 0x1p-8, eps = 0x1p-24;
    int s = fsdp_group_rank(shard);
    int64_t k = 0, differ = 0;
    double worst = 0;
    for (int i = 0; st == FSDP_OK && i < def.n_index; i++) {
        int64_t S = def.want_out[i];
        for (int64_t j = 0; j < S && st == FSDP_OK; j++, k++) {
            int64_t at = s * S + j; /* in the unit's flat buffer */
            double a = at < def.unit_numel[i] ? rec.abs_mean[i][at] : 0.0;
            double d = fabs((double)bf.grad[k] - def.grad[k]);
            double bound = (u + 4 * eps) * fabs((double)def.grad[k]) + (2.02 * u + 12 * eps) * a;
            if (!(d <= bound))
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                               "HYBRID bf16: unit %d element %lld is %.9g, f32 %.9g, bound %.3g", i,
                               (long long)j, (double)bf.grad[k], (double)def.grad[k], bound);
            if (bound > 0 && d / bound > worst) worst = d / bound;
            differ += d > 0;
        }
    }
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, k == def.n && k == bf.n && differ > 0,
                        "HYBRID bf16: %lld values checked of %lld, %lld differ", (long long)k,
                        (long long)def.n, (long long)differ);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, bf.calls == def.calls && def.calls == 6 && 2 * bf.bytes == def.bytes,
                        "HYBRID bf16: %lld reductions of %lld bytes; the default %lld of %lld",
                        (long long)bf.calls, (long long)bf.bytes, (long long)def.calls,
                        (long long)def.bytes);
    if (st == FSDP_OK && fsdp_ctx_rank(ctx) == 0)
        printf("\n    HYBRID_SHARD bf16 hook: %lld of %lld differ from f32, worst at %.2f of the "
               "bound; %lld -> %lld bytes",
               (long long)differ, (long long)k, worst, (long long)def.bytes, (long long)bf.bytes);
    run_out *outs[] = {&user, &def, &bf, &mp};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) free(outs[i]->grad);
    record_free(&rec);
    fsdp_mesh_free(flat);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_fsdp_hybrid_hooks(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, hybrid_rank, NULL));
}

/* ---- refused options ---- */

static fsdp_status dummy_hook(fsdp_ctx *ctx, const fsdp_comm_bucket *b, void *user) {
    (void)user;
    return fsdp_comm_hook_run(ctx, FSDP_COMM_HOOK_DEFAULT, b);
}

static fsdp_status expect(fsdp_ctx *ctx, fsdp_status got, fsdp_status want, const char *needle) {
    FSDP_RANK_CHECK(ctx, got == want && strstr(fsdp_last_error(ctx), needle),
                    "want %s with '%s', got %s: %s", fsdp_status_to_string(want), needle,
                    fsdp_status_to_string(got), fsdp_last_error(ctx));
    return FSDP_OK;
}

static fsdp_status options_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_group *rg = NULL, *sg = NULL;
    fsdp_status st = fsdp_model_mlp_stacked(ctx, 1, &m);
    if (st == FSDP_OK)
        st = fsdp_mesh_create(ctx, 2, (int[]){1, 2}, (const char *[]){"replicate", "shard"}, &mesh);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "replicate", &rg);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "shard", &sg);
    const struct {
        fsdp_comm_hook hook;
        const char *needle;
    } bad_hooks[] = {
        {{.kind = FSDP_COMM_HOOK_USER}, "needs .fn"},
        {{.kind = FSDP_COMM_HOOK_BF16, .fn = dummy_hook}, "set .kind = FSDP_COMM_HOOK_USER"},
        {{.kind = (fsdp_comm_hook_kind)9}, "unknown comm_hook kind 9"},
    };
    for (size_t i = 0; st == FSDP_OK && i < sizeof bad_hooks / sizeof bad_hooks[0]; i++) {
        st = expect(ctx,
                    fsdp_replicate_apply(
                        ctx, m, &(fsdp_replicate_options){.comm_hook = bad_hooks[i].hook}, NULL),
                    FSDP_ERR_INVALID_ARGUMENT, bad_hooks[i].needle);
        if (st == FSDP_OK)
            st = expect(
                ctx,
                fsdp_fully_shard(ctx, m,
                                 &(fsdp_fully_shard_options){.comm_hook = bad_hooks[i].hook}, &sh),
                FSDP_ERR_INVALID_ARGUMENT, bad_hooks[i].needle);
    }
    fsdp_fully_shard_options hybrid_user = {
        .strategy = FSDP_HYBRID_SHARD,
        .group = sg,
        .replicate_group = rg,
        .comm_hook = {.kind = FSDP_COMM_HOOK_USER, .fn = dummy_hook}};
    if (st == FSDP_OK)
        st = expect(ctx, fsdp_fully_shard(ctx, m, &hybrid_user, &sh), FSDP_ERR_UNSUPPORTED,
                    "not supported with HYBRID_SHARD");
    fsdp_fully_shard_options both = {.comm_hook = {.kind = FSDP_COMM_HOOK_FP16},
                                     .mixed_precision = {.reduce_dtype = FSDP_DTYPE_BF16}};
    if (st == FSDP_OK)
        st = expect(ctx, fsdp_fully_shard(ctx, m, &both, &sh), FSDP_ERR_INVALID_ARGUMENT,
                    "keep one");
    fsdp_fully_shard_options i32 = {.mixed_precision = {.param_dtype = FSDP_DTYPE_I32}};
    if (st == FSDP_OK)
        st = expect(ctx, fsdp_fully_shard(ctx, m, &i32, &sh), FSDP_ERR_INVALID_ARGUMENT,
                    "mixed_precision.param_dtype is i32");
    fsdp_comm_bucket empty = {0};
    if (st == FSDP_OK)
        st = expect(ctx, fsdp_comm_hook_run(ctx, FSDP_COMM_HOOK_USER, &empty),
                    FSDP_ERR_INVALID_ARGUMENT, "not a built-in hook");
    if (st == FSDP_OK)
        st = expect(ctx, fsdp_comm_hook_run(ctx, FSDP_COMM_HOOK_BF16, &empty),
                    FSDP_ERR_INVALID_ARGUMENT, "grad is NULL");
    /* Nothing was wrapped: a plain wrap still works. */
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, NULL, &sh);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_options(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, options_rank, NULL));
    CU_ASSERT_STRING_EQUAL(fsdp_comm_hook_kind_to_string(FSDP_COMM_HOOK_FP16), "fp16");
    CU_ASSERT_STRING_EQUAL(fsdp_comm_hook_kind_to_string((fsdp_comm_hook_kind)-1), "unknown");
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"replicate_hooks", test_replicate_hooks},
        {"fsdp_full_shard_hooks", test_fsdp_full_shard_hooks},
        {"fsdp_no_shard_hooks", test_fsdp_no_shard_hooks},
        {"fsdp_hybrid_hooks", test_fsdp_hybrid_hooks},
        {"options", test_options},
    };
    return fsdp_test_run(argc, argv, "comm_hooks", cases, sizeof cases / sizeof cases[0]);
}

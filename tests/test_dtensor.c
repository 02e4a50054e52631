/* test_dtensor.c: DTensor placements and redistribution against a serial computation: every
 * pair of placements on 1-d meshes of 3 and 4 ranks and on 2x2 and 3x2 meshes, with uneven
 * shapes (13 rows on 4 ranks leaves a short last shard; 3 columns on 4 ranks an empty one),
 * forward and backward; the collectives each 1-d redistribution makes; from_local,
 * distribute_tensor and their errors. The same pairs on device tensors, bitwise against
 * these CPU runs: test_tp_device.
 *
 * Values are small integers, so every sum is exact and results compare bitwise. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- serial reference ---- */

/* The integer-valued global tensor of a stream: values in -8..8. */
static float global_value(uint64_t stream, int64_t i) {
    uint64_t h = (stream + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    return (float)((int)(h % 17) - 8);
}

/* This rank's share of a Partial on a mesh dim of `size` at coordinate `coord`, of value v at
 * flat index i: coordinate 0 holds v - (size-1)*j, the others j, so the sum is v exactly. */
static float partial_share(float v, int64_t i, int coord, int size) {
    float j = (float)((i % 5) - 2);
    return coord == 0 ? v - (float)(size - 1) * j : j;
}

/* The local tensor this rank holds for the global tensor of `stream` under placements:
 * its block, with Partial shares applied per Partial mesh dim. */
static fsdp_status make_local(fsdp_ctx *ctx, const fsdp_mesh *mesh, const fsdp_placement *pl,
                              int ndim, const int64_t *shape, uint64_t stream, fsdp_tensor **out) {
    int64_t off[FSDP_MAX_DIMS], len[FSDP_MAX_DIMS];
    FSDP_TRY(fsdp_placement_local_block(ctx, mesh, pl, ndim, shape, off, len));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, len, out));
    float *x = fsdp_tensor_f32(*out);
    int64_t n = fsdp_tensor_numel(*out);
    for (int64_t k = 0; k < n; k++) {
        int64_t rem = k, gi = 0, stride = 1, idx[FSDP_MAX_DIMS];
        for (int d = ndim - 1; d >= 0; d--) {
            idx[d] = rem % len[d];
            rem /= len[d];
        }
        for (int d = ndim - 1; d >= 0; d--) {
            gi += (off[d] + idx[d]) * stride;
            stride *= shape[d];
        }
        float v = global_value(stream, gi);
        for (int i = 0; i < fsdp_mesh_ndim(mesh); i++)
            if (pl[i].kind == FSDP_PLACEMENT_PARTIAL)
                v = partial_share(v, gi, fsdp_mesh_coordinate(mesh, i), fsdp_mesh_size(mesh, i));
        x[k] = v;
    }
    return FSDP_OK;
}

static bool has_partial(const fsdp_placement *pl, int n) {
    for (int i = 0; i < n; i++)
        if (pl[i].kind == FSDP_PLACEMENT_PARTIAL) return true;
    return false;
}

/* Checks that dt holds the global tensor of `stream` under `want`: the spec's placements, the
 * full value bitwise, and (without Partial) the local block bitwise. */
static fsdp_status check_dtensor(fsdp_ctx *ctx, const fsdp_dtensor *dt, const fsdp_placement *want,
                                 uint64_t stream, const char *what) {
    const fsdp_dtensor_spec *spec = fsdp_dtensor_spec_of(dt);
    int n = spec->mesh_ndim;
    for (int i = 0; i < n; i++) {
        fsdp_placement w = want[i];
        if (w.kind == FSDP_PLACEMENT_SHARD && w.dim < 0) w.dim += spec->ndim;
        char a[24], b[24];
        FSDP_RANK_CHECK(ctx, fsdp_placement_equal(spec->placements[i], w),
                        "%s: mesh dim %d is %s, want %s", what, i,
                        fsdp_placement_to_string(spec->placements[i], a, sizeof a),
                        fsdp_placement_to_string(w, b, sizeof b));
    }
    fsdp_tensor *full = NULL, *want_full = NULL, *want_local = NULL;
    fsdp_placement replicate[FSDP_MESH_MAX_DIMS] = {FSDP_REPLICATE, FSDP_REPLICATE, FSDP_REPLICATE,
                                                    FSDP_REPLICATE};
    fsdp_status st = fsdp_dtensor_full_tensor(ctx, dt, &full);
    if (st == FSDP_OK)
        st = make_local(ctx, spec->mesh, replicate, spec->ndim, spec->shape, stream, &want_full);
    if (st == FSDP_OK &&
        memcmp(fsdp_tensor_data(full), fsdp_tensor_data(want_full), fsdp_tensor_nbytes(full)) != 0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s: the full tensor differs from the serial one",
                       what);
    if (st == FSDP_OK && !has_partial(want, n)) {
        st = make_local(ctx, spec->mesh, want, spec->ndim, spec->shape, stream, &want_local);
        const fsdp_tensor *local = fsdp_dtensor_local(dt);
        if (st == FSDP_OK && (!fsdp_tensor_same_shape(local, want_local) ||
                              memcmp(fsdp_tensor_data(local), fsdp_tensor_data(want_local),
                                     fsdp_tensor_nbytes(local)) != 0))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "%s: the local block differs from the serial one", what);
    }
    fsdp_tensor_free(full);
    fsdp_tensor_free(want_full);
    fsdp_tensor_free(want_local);
    return st;
}

/* ---- every pair ---- */

#define NCHOICES 5
static const fsdp_placement choices[NCHOICES] = {
    {FSDP_PLACEMENT_REPLICATE, 0}, {FSDP_PLACEMENT_PARTIAL, 0}, {FSDP_PLACEMENT_SHARD, 0},
    {FSDP_PLACEMENT_SHARD, 1},     {FSDP_PLACEMENT_SHARD, -1},
};

typedef struct pairs_case {
    int ndim_mesh;
    int mesh_shape[2];
    int ndim;
    int64_t shape[3];
} pairs_case;

/* Forward: from -> to keeps the global value. Backward: a gradient in `to` goes back to `from`
 * with Partial read as Replicate, keeping its global value. */
static fsdp_status check_pair(fsdp_ctx *ctx, const fsdp_mesh *mesh, const pairs_case *c,
                              const fsdp_placement *from, const fsdp_placement *to, int count) {
    char what[160], a[24], b[24], a2[24], b2[24];
    snprintf(what, sizeof what, "[%s%s%s] -> [%s%s%s] on %d ranks",
             fsdp_placement_to_string(from[0], a, sizeof a), count > 1 ? ", " : "",
             count > 1 ? fsdp_placement_to_string(from[1], a2, sizeof a2) : "",
             fsdp_placement_to_string(to[0], b, sizeof b), count > 1 ? ", " : "",
             count > 1 ? fsdp_placement_to_string(to[1], b2, sizeof b2) : "",
             fsdp_group_size(fsdp_ctx_world_group(ctx)));
    fsdp_tensor *x = NULL, *g = NULL;
    fsdp_dtensor *dx = NULL, *dy = NULL, *dg = NULL, *dback = NULL;
    fsdp_status st = make_local(ctx, mesh, from, c->ndim, c->shape, 1, &x);
    if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, x, mesh, from, c->shape, &dx);
    if (st == FSDP_OK) st = fsdp_dtensor_redistribute(ctx, dx, to, &dy);
    if (st == FSDP_OK) st = check_dtensor(ctx, dy, to, 1, what);
    /* backward */
    if (st == FSDP_OK) st = make_local(ctx, mesh, to, c->ndim, c->shape, 2, &g);
    if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, g, mesh, to, c->shape, &dg);
    if (st == FSDP_OK) st = fsdp_dtensor_redistribute_backward(ctx, dg, from, &dback);
    fsdp_placement back[FSDP_MESH_MAX_DIMS];
    for (int i = 0; i < count; i++)
        back[i] = from[i].kind == FSDP_PLACEMENT_PARTIAL ? FSDP_REPLICATE : from[i];
    if (st == FSDP_OK) {
        char bw[180];
        snprintf(bw, sizeof bw, "backward of %s", what);
        st = check_dtensor(ctx, dback, back, 2, bw);
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(g);
    fsdp_dtensor_free(dx);
    fsdp_dtensor_free(dy);
    fsdp_dtensor_free(dg);
    fsdp_dtensor_free(dback);
    return st;
}

static fsdp_status all_pairs_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const pairs_case *c = user;
    fsdp_mesh *mesh = NULL;
    const char *names[2] = {"dp", "tp"};
    FSDP_TRY(fsdp_mesh_create(ctx, c->ndim_mesh, c->mesh_shape, names, &mesh));
    fsdp_status st = FSDP_OK;
    int combos = c->ndim_mesh == 1 ? NCHOICES : NCHOICES * NCHOICES;
    for (int f = 0; st == FSDP_OK && f < combos; f++)
        for (int t = 0; st == FSDP_OK && t < combos; t++) {
            fsdp_placement from[2] = {choices[f % NCHOICES], choices[f / NCHOICES]};
            fsdp_placement to[2] = {choices[t % NCHOICES], choices[t / NCHOICES]};
            st = check_pair(ctx, mesh, c, from, to, c->ndim_mesh);
        }
    fsdp_mesh_free(mesh);
    return st;
}

static void test_pairs_1d_4_ranks(void) {
    pairs_case c = {1, {4, 0}, 3, {13, 3, 6}};
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, all_pairs_rank, &c));
}

static void test_pairs_1d_3_ranks(void) {
    pairs_case c = {1, {3, 0}, 2, {7, 5, 0}};
    FSDP_TEST_OK(fsdp_test_run_world(3, 0, all_pairs_rank, &c));
}

static void test_pairs_2d_2x2(void) {
    pairs_case c = {2, {2, 2}, 3, {13, 3, 6}};
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, all_pairs_rank, &c));
}

static void test_pairs_2d_3x2(void) {
    pairs_case c = {2, {3, 2}, 2, {11, 5, 0}};
    FSDP_TEST_OK(fsdp_test_run_world(6, 0, all_pairs_rank, &c));
}

/* ---- the collective of each 1-d redistribution, as PyTorch's DTensor makes it (the table
 * in docs/tp.md, "Redistribution") ---- */

typedef struct comm_row {
    fsdp_placement from, to;
    fsdp_comm_op op; /* FSDP_COMM_ANY: none */
} comm_row;

static fsdp_status comm_table_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    (void)user;
    static const comm_row rows[] = {
        {{FSDP_PLACEMENT_SHARD, 0}, {FSDP_PLACEMENT_REPLICATE, 0}, FSDP_COMM_ALL_GATHER},
        {{FSDP_PLACEMENT_PARTIAL, 0}, {FSDP_PLACEMENT_REPLICATE, 0}, FSDP_COMM_ALL_REDUCE},
        {{FSDP_PLACEMENT_PARTIAL, 0}, {FSDP_PLACEMENT_SHARD, 1}, FSDP_COMM_REDUCE_SCATTER},
        {{FSDP_PLACEMENT_REPLICATE, 0}, {FSDP_PLACEMENT_SHARD, 0}, FSDP_COMM_ANY},
        {{FSDP_PLACEMENT_SHARD, 0}, {FSDP_PLACEMENT_SHARD, 1}, FSDP_COMM_ALL_TO_ALL},
        {{FSDP_PLACEMENT_REPLICATE, 0}, {FSDP_PLACEMENT_PARTIAL, 0}, FSDP_COMM_ANY},
        {{FSDP_PLACEMENT_SHARD, 1}, {FSDP_PLACEMENT_SHARD, 1}, FSDP_COMM_ANY},
    };
    fsdp_mesh *mesh;
    FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){4}, (const char *[]){"tp"}, &mesh));
    pairs_case c = {1, {4, 0}, 2, {13, 6, 0}};
    fsdp_status st = FSDP_OK;
    for (size_t r = 0; st == FSDP_OK && r < sizeof rows / sizeof rows[0]; r++) {
        fsdp_tensor *x = NULL;
        fsdp_dtensor *dx = NULL, *dy = NULL;
        st = make_local(ctx, mesh, &rows[r].from, c.ndim, c.shape, 3, &x);
        if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, x, mesh, &rows[r].from, c.shape, &dx);
        if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK) st = fsdp_dtensor_redistribute(ctx, dx, &rows[r].to, &dy);
        if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
        if (st == FSDP_OK) {
            fsdp_comm_count total = fsdp_comm_debug_total(ctx);
            fsdp_comm_count one = fsdp_comm_debug_count(ctx, rows[r].op, "tp");
            char a[24], b[24];
            int64_t want_calls = rows[r].op == FSDP_COMM_ANY ? 0 : 1;
            if (total.calls != want_calls || one.calls != want_calls)
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                               "%s -> %s made %lld collectives (%lld of %s); want %lld",
                               fsdp_placement_to_string(rows[r].from, a, sizeof a),
                               fsdp_placement_to_string(rows[r].to, b, sizeof b),
                               (long long)total.calls, (long long)one.calls,
                               fsdp_comm_op_to_string(rows[r].op), (long long)want_calls);
        }
        fsdp_tensor_free(x);
        fsdp_dtensor_free(dx);
        fsdp_dtensor_free(dy);
    }
    fsdp_mesh_free(mesh);
    return st;
}

static void test_comm_per_redistribution(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, comm_table_rank, NULL));
}

/* A mesh dim of size 1 never communicates: [Shard(0), Shard(1)] -> [Replicate, Replicate] on
 * a 1x4 mesh is one all_gather on tp only. */
static fsdp_status size_one_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    (void)user;
    fsdp_mesh *mesh;
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){1, 4}, (const char *[]){"dp", "tp"}, &mesh));
    fsdp_placement from[2] = {FSDP_SHARD(0), FSDP_SHARD(1)},
                   to[2] = {FSDP_REPLICATE, FSDP_REPLICATE};
    int64_t shape[2] = {5, 9};
    fsdp_tensor *x = NULL;
    fsdp_dtensor *dx = NULL, *dy = NULL;
    fsdp_status st = make_local(ctx, mesh, from, 2, shape, 4, &x);
    if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, x, mesh, from, shape, &dx);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_dtensor_redistribute(ctx, dx, to, &dy);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) st = check_dtensor(ctx, dy, to, 4, "1x4 mesh");
    if (st == FSDP_OK && (fsdp_comm_debug_total(ctx).calls != 1 ||
                          fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_GATHER, "tp").calls != 1))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "want exactly one all_gather on tp, got %lld calls",
                       (long long)fsdp_comm_debug_total(ctx).calls);
    fsdp_tensor_free(x);
    fsdp_dtensor_free(dx);
    fsdp_dtensor_free(dy);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_size_one_mesh_dim(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, size_one_rank, NULL));
}

/* ---- from_local, distribute_tensor ---- */

static fsdp_status construct_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_mesh *mesh;
    FSDP_TRY(fsdp_mesh_create(ctx, 1, (int[]){4}, (const char *[]){"tp"}, &mesh));
    fsdp_status st = FSDP_OK;
    fsdp_tensor *t = NULL;
    fsdp_dtensor *dt = NULL;
    /* from_local without a global shape takes Shard as even: (3, 2) on 4 ranks is (12, 2). */
    st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){3, 2}, &t);
    if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, t, mesh, &FSDP_SHARD(0), NULL, &dt);
    if (st == FSDP_OK) {
        const fsdp_dtensor_spec *s = fsdp_dtensor_spec_of(dt);
        FSDP_RANK_CHECK(ctx, s->shape[0] == 12 && s->shape[1] == 2, "global shape %lldx%lld",
                        (long long)s->shape[0], (long long)s->shape[1]);
        FSDP_RANK_CHECK(ctx, fsdp_dtensor_of(fsdp_dtensor_local(dt)) == dt,
                        "the local tensor does not lead back to its DTensor");
        FSDP_RANK_CHECK(ctx, fsdp_dtensor_of(t) == NULL, "a plain tensor claims a DTensor");
        FSDP_RANK_CHECK(ctx, fsdp_tensor_data(fsdp_dtensor_local(dt)) == fsdp_tensor_data(t),
                        "from_local copied instead of sharing storage");
    }
    fsdp_dtensor_free(dt);
    dt = NULL;
    /* A local tensor that is not this rank's block of the given global shape is refused. */
    if (st == FSDP_OK) {
        fsdp_status bad =
            fsdp_dtensor_from_local(ctx, t, mesh, &FSDP_SHARD(0), (int64_t[]){11, 2}, &dt);
        bool ok = rank < 3 ? bad == FSDP_OK : bad == FSDP_ERR_SHAPE;
        fsdp_dtensor_free(dt);
        dt = NULL;
        FSDP_RANK_CHECK(ctx, ok, "from_local with global (11, 2) on rank %d returned %s", rank,
                        fsdp_status_to_string(bad));
        FSDP_RANK_CHECK(ctx, rank < 3 || strstr(fsdp_last_error(ctx), "torch.chunk"), "message: %s",
                        fsdp_last_error(ctx));
        /* An unset placement and a Shard outside the tensor are refused with a message. */
        FSDP_RANK_CHECK(ctx,
                        fsdp_dtensor_from_local(ctx, t, mesh, &(fsdp_placement){0}, NULL, &dt) ==
                                FSDP_ERR_INVALID_ARGUMENT &&
                            strstr(fsdp_last_error(ctx), "FSDP_SHARD(d)"),
                        "unset placement: %s", fsdp_last_error(ctx));
        FSDP_RANK_CHECK(ctx,
                        fsdp_dtensor_from_local(ctx, t, mesh, &FSDP_SHARD(2), NULL, &dt) ==
                                FSDP_ERR_INVALID_ARGUMENT &&
                            strstr(fsdp_last_error(ctx), "Shard(2)"),
                        "Shard(2) of a 2-dim tensor: %s", fsdp_last_error(ctx));
    }
    fsdp_tensor_free(t);
    t = NULL;
    /* distribute_tensor from rank 0: ranks start with different values and end with rank 0's
     * chunk; FSDP_NO_SRC_RANK keeps each rank's own values. */
    int64_t shape[2] = {13, 3};
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &t);
    if (st == FSDP_OK) {
        float *v = fsdp_tensor_f32(t);
        for (int i = 0; i < 39; i++) v[i] = (float)(rank * 100 + i);
        st = fsdp_comm_debug_begin(ctx);
    }
    if (st == FSDP_OK) st = fsdp_distribute_tensor(ctx, t, mesh, &FSDP_SHARD(0), 0, &dt);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_BROADCAST, "tp").calls == 1,
                        "distribute_tensor from rank 0 should make one broadcast");
        int64_t off, len;
        fsdp_chunk_range(13, 4, rank, &off, &len);
        const float *l = fsdp_tensor_f32(fsdp_dtensor_local(dt));
        FSDP_RANK_CHECK(ctx, fsdp_tensor_dim(fsdp_dtensor_local(dt), 0) == len, "local rows");
        for (int64_t i = 0; i < len * 3; i++)
            FSDP_RANK_CHECK(ctx, l[i] == (float)(off * 3 + i), "element %lld is %g", (long long)i,
                            l[i]);
    }
    fsdp_dtensor_free(dt);
    dt = NULL;
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK)
        st = fsdp_distribute_tensor(ctx, t, mesh, &FSDP_SHARD(1), FSDP_NO_SRC_RANK, &dt);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 0,
                        "FSDP_NO_SRC_RANK must not communicate");
        /* 3 columns on 4 ranks: ranks 0..2 hold one column each, rank 3 none. */
        const fsdp_tensor *l = fsdp_dtensor_local(dt);
        FSDP_RANK_CHECK(ctx, fsdp_tensor_dim(l, 1) == (rank < 3 ? 1 : 0), "columns on rank %d",
                        rank);
        for (int64_t i = 0; rank < 3 && i < 13; i++)
            FSDP_RANK_CHECK(ctx, fsdp_tensor_f32(l)[i] == (float)(rank * 100 + i * 3 + rank),
                            "own values kept");
    }
    fsdp_dtensor_free(dt);
    fsdp_tensor_free(t);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_from_local_and_distribute(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, construct_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"pairs_1d_4_ranks", test_pairs_1d_4_ranks},
        {"pairs_1d_3_ranks", test_pairs_1d_3_ranks},
        {"pairs_2d_2x2", test_pairs_2d_2x2},
        {"pairs_2d_3x2", test_pairs_2d_3x2},
        {"comm_per_redistribution", test_comm_per_redistribution},
        {"size_one_mesh_dim", test_size_one_mesh_dim},
        {"from_local_and_distribute", test_from_local_and_distribute},
    };
    return fsdp_test_run(argc, argv, "dtensor", cases, sizeof cases / sizeof cases[0]);
}

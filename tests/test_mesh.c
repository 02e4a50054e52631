/* test_mesh.c: the device mesh on rank threads: 1-d, 2x2, 4x2, 2x4 and 2x2x2 layouts, each
 * rank's coordinate, the members of each dim's group (world 8, tp 2: tp groups [0,1] [2,3]
 * [4,5] [6,7], dp groups [0,2,4,6] [1,3,5,7]), sub-meshes by name, a sum over every dim's
 * group to show the groups really communicate, and the errors. Rank bodies report through
 * their status (CUnit is not thread-safe). */
#include <string.h>

#include "core/error.h"
#include "harness.h"

typedef struct layout {
    int ndim;
    int shape[FSDP_MESH_MAX_DIMS];
    const char *names[FSDP_MESH_MAX_DIMS];
} layout;

/* The sum of the world ranks of g's members, computed by an all_reduce over g. */
static fsdp_status group_sum(fsdp_ctx *ctx, fsdp_group *g, float *sum) {
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){1}, &t));
    fsdp_tensor_f32(t)[0] = (float)fsdp_ctx_rank(ctx);
    fsdp_status st = fsdp_all_reduce(ctx, g, t, FSDP_REDUCE_SUM);
    *sum = fsdp_tensor_f32(t)[0];
    fsdp_tensor_free(t);
    return st;
}

/* Checks dim k of mesh m for this rank against the row-major layout L. */
static fsdp_status check_dim(fsdp_ctx *ctx, fsdp_mesh *m, const layout *L, const int *coord,
                             int k) {
    const char *name = L->names[k];
    fsdp_group *g = NULL;
    fsdp_mesh *sub = NULL;
    FSDP_TRY(fsdp_mesh_get_group(ctx, m, name, &g));
    FSDP_TRY(fsdp_mesh_dim(ctx, m, name, &sub));
    FSDP_RANK_CHECK(ctx, fsdp_group_size(g) == L->shape[k] && fsdp_group_rank(g) == coord[k],
                    "dim %s: group size %d rank %d, want %d %d", name, fsdp_group_size(g),
                    fsdp_group_rank(g), L->shape[k], coord[k]);
    FSDP_RANK_CHECK(ctx, strcmp(fsdp_group_label(g), name) == 0, "dim %s: label %s", name,
                    fsdp_group_label(g));
    /* Members: this rank's coordinate with dim k running over 0..size-1, in that order. */
    float want_sum = 0;
    for (int i = 0; i < L->shape[k]; i++) {
        int c[FSDP_MESH_MAX_DIMS], want = 0;
        memcpy(c, coord, sizeof c);
        c[k] = i;
        for (int j = 0; j < L->ndim; j++) want = want * L->shape[j] + c[j];
        FSDP_RANK_CHECK(ctx, fsdp_group_world_rank(g, i) == want,
                        "dim %s: member %d is rank %d, want %d", name, i,
                        fsdp_group_world_rank(g, i), want);
        FSDP_RANK_CHECK(ctx, fsdp_mesh_rank_at(sub, &i) == want, "sub-mesh %s: rank at %d is %d",
                        name, i, fsdp_mesh_rank_at(sub, &i));
        want_sum += (float)want;
    }
    /* The sub-mesh is the 1-d mesh of this rank along the dim, sharing its group. */
    fsdp_group *sub_group = NULL;
    FSDP_TRY(fsdp_mesh_get_group(ctx, sub, NULL, &sub_group));
    FSDP_RANK_CHECK(ctx,
                    fsdp_mesh_ndim(sub) == 1 && fsdp_mesh_size(sub, 0) == L->shape[k] &&
                        fsdp_mesh_coordinate(sub, 0) == coord[k] &&
                        strcmp(fsdp_mesh_dim_name(sub, 0), name) == 0 && sub_group == g,
                    "sub-mesh %s: ndim %d size %d coordinate %d", name, fsdp_mesh_ndim(sub),
                    fsdp_mesh_size(sub, 0), fsdp_mesh_coordinate(sub, 0));
    float sum = 0;
    FSDP_TRY(group_sum(ctx, g, &sum));
    FSDP_RANK_CHECK(ctx, sum == want_sum, "dim %s: the sum over the group is %g, want %g", name,
                    sum, want_sum);
    fsdp_group_free(g);  /* borrowed from the mesh: does nothing */
    fsdp_mesh_free(sub); /* a sub-mesh: does nothing */
    return FSDP_OK;
}

static fsdp_status layout_body(fsdp_ctx *ctx, int rank, void *user) {
    const layout *L = user;
    fsdp_mesh *m = NULL;
    FSDP_TRY(fsdp_mesh_create(ctx, L->ndim, L->shape, L->names, &m));
    int coord[FSDP_MESH_MAX_DIMS] = {0};
    for (int k = L->ndim - 1, rest = rank; k >= 0; k--) {
        coord[k] = rest % L->shape[k];
        rest /= L->shape[k];
    }
    fsdp_status st = FSDP_OK;
    if (fsdp_mesh_ndim(m) != L->ndim)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "ndim %d", fsdp_mesh_ndim(m));
    for (int k = 0; st == FSDP_OK && k < L->ndim; k++) {
        if (fsdp_mesh_size(m, k) != L->shape[k] || fsdp_mesh_coordinate(m, k) != coord[k] ||
            strcmp(fsdp_mesh_dim_name(m, k), L->names[k]) != 0 ||
            fsdp_mesh_dim_index(m, L->names[k]) != k)
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "dim %d: size %d coordinate %d name %s", k,
                           fsdp_mesh_size(m, k), fsdp_mesh_coordinate(m, k),
                           fsdp_mesh_dim_name(m, k));
    }
    if (st == FSDP_OK && fsdp_mesh_rank_at(m, coord) != rank)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "rank at this rank's coordinate is %d",
                       fsdp_mesh_rank_at(m, coord));
    for (int k = 0; st == FSDP_OK && k < L->ndim; k++) st = check_dim(ctx, m, L, coord, k);
    fsdp_mesh_free(m);
    return st;
}

static void test_mesh_1d(void) {
    for (int n = 1; n <= 4; n *= 4) {
        layout L = {1, {n}, {"dp"}};
        FSDP_TEST_OK(fsdp_test_run_world(n, 20000, layout_body, &L));
    }
}

static void test_mesh_2d(void) {
    const layout layouts[] = {
        {2, {2, 2}, {"dp", "tp"}},
        {2, {4, 2}, {"dp", "tp"}},
        {2, {2, 4}, {"dp", "tp"}},
        {2, {1, 4}, {"dp", "tp"}},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        FSDP_TEST_OK(fsdp_test_run_world(layouts[i].shape[0] * layouts[i].shape[1], 20000,
                                         layout_body, (void *)&layouts[i]));
}

static void test_mesh_3d(void) {
    layout L = {3, {2, 2, 2}, {"pp", "dp", "tp"}};
    FSDP_TEST_OK(fsdp_test_run_world(8, 20000, layout_body, &L));
}

/* The example spelled out: world 8 as (dp 4, tp 2). */
static fsdp_status example_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    static const int tp_groups[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
    static const int dp_groups[2][4] = {{0, 2, 4, 6}, {1, 3, 5, 7}};
    fsdp_mesh *m = NULL;
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (const int[]){4, 2}, (const char *const[]){"dp", "tp"}, &m));
    fsdp_group *tp = NULL, *dp = NULL;
    fsdp_status st = fsdp_mesh_get_group(ctx, m, "tp", &tp);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, m, "dp", &dp);
    for (int i = 0; st == FSDP_OK && i < 2; i++)
        if (fsdp_group_world_rank(tp, i) != tp_groups[rank / 2][i])
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "tp member %d is %d", i,
                           fsdp_group_world_rank(tp, i));
    for (int i = 0; st == FSDP_OK && i < 4; i++)
        if (fsdp_group_world_rank(dp, i) != dp_groups[rank % 2][i])
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "dp member %d is %d", i,
                           fsdp_group_world_rank(dp, i));
    if (st == FSDP_OK &&
        (fsdp_mesh_coordinate(m, 0) != rank / 2 || fsdp_mesh_coordinate(m, 1) != rank % 2))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "coordinate (%d, %d)", fsdp_mesh_coordinate(m, 0),
                       fsdp_mesh_coordinate(m, 1));
    fsdp_mesh_free(m);
    return st;
}

static void test_mesh_example(void) {
    FSDP_TEST_OK(fsdp_test_run_world(8, 20000, example_body, NULL));
}

static fsdp_status expect_failure(fsdp_ctx *ctx, fsdp_status got, fsdp_status want,
                                  const char *needle) {
    char msg[1024]; /* a copy: a failing check rewrites the context's message */
    snprintf(msg, sizeof msg, "%s", fsdp_last_error(ctx));
    FSDP_RANK_CHECK(ctx, got == want && strstr(msg, needle),
                    "got %s (message \"%s\"), want %s naming \"%s\"", fsdp_status_to_string(got),
                    msg, fsdp_status_to_string(want), needle);
    return FSDP_OK;
}

static fsdp_status errors_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    const char *const dp_tp[] = {"dp", "tp"};
    fsdp_mesh *m = NULL;
    FSDP_TRY(expect_failure(ctx, fsdp_mesh_create(ctx, 2, (const int[]){3, 2}, dp_tp, &m),
                            FSDP_ERR_SHAPE, "mesh (dp 3, tp 2) has 6 ranks but the world has 4"));
    FSDP_TRY(expect_failure(
        ctx, fsdp_mesh_create(ctx, 2, (const int[]){2, 2}, (const char *const[]){"dp", "dp"}, &m),
        FSDP_ERR_INVALID_ARGUMENT, "dims 0 and 1 are both named 'dp'"));
    FSDP_TRY(expect_failure(
        ctx, fsdp_mesh_create(ctx, 2, (const int[]){2, 2}, (const char *const[]){"dp", "t-p"}, &m),
        FSDP_ERR_INVALID_ARGUMENT, "dim 1's name 't-p' is not allowed"));
    FSDP_TRY(expect_failure(ctx,
                            fsdp_mesh_create(ctx, 5, (const int[]){1, 1, 1, 1, 4},
                                             (const char *const[]){"a", "b", "c", "d", "e"}, &m),
                            FSDP_ERR_INVALID_ARGUMENT, "5 dims; a mesh has 1 to 4"));
    FSDP_TRY(expect_failure(ctx, fsdp_mesh_create(ctx, 2, (const int[]){0, 4}, dp_tp, &m),
                            FSDP_ERR_INVALID_ARGUMENT, "dim 0 ('dp') has size 0"));
    FSDP_RANK_CHECK(ctx, m == NULL, "a failed create left a mesh");
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (const int[]){2, 2}, dp_tp, &m));
    fsdp_mesh *sub = NULL;
    fsdp_group *g = NULL;
    fsdp_status st = expect_failure(ctx, fsdp_mesh_dim(ctx, m, "pp", &sub), FSDP_ERR_NOT_FOUND,
                                    "the mesh has no dim 'pp'; its dims are dp, tp");
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_mesh_get_group(ctx, m, NULL, &g), FSDP_ERR_INVALID_ARGUMENT,
                            "the mesh has 2 dims; name one of them (dp, tp)");
    if (st == FSDP_OK && (fsdp_mesh_dim_index(m, "pp") != -1 || fsdp_mesh_size(m, 2) != 0 ||
                          fsdp_mesh_coordinate(m, -1) != -1 || fsdp_mesh_dim_name(m, 5) ||
                          fsdp_mesh_rank_at(m, (const int[]){2, 0}) != -1))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "out-of-range accessors");
    fsdp_mesh_free(m);
    return st;
}

static void test_mesh_errors(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, errors_body, NULL));
    fsdp_mesh *m = NULL;
    FSDP_TEST_FAILS(
        fsdp_mesh_create(fsdp_test_ctx(), 1, (const int[]){1}, (const char *const[]){"dp"}, &m),
        FSDP_ERR_STATE, "not bound to a world");
    fsdp_mesh_free(NULL);
}

/* Ranks that ask for different meshes of the same size all fail, each naming every rank's. */
static fsdp_status disagree_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_mesh *m = NULL;
    const int *shape = rank == 1 ? (const int[]){4, 1} : (const int[]){2, 2};
    fsdp_status st = fsdp_mesh_create(ctx, 2, shape, (const char *const[]){"dp", "tp"}, &m);
    fsdp_mesh_free(m);
    return expect_failure(ctx, st, FSDP_ERR_INVALID_ARGUMENT,
                          "rank 0 'mesh (dp 2, tp 2)', rank 1 'mesh (dp 4, tp 1)', rank 2 'mesh "
                          "(dp 2, tp 2)'");
}

static void test_mesh_disagreement(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, disagree_body, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"mesh_1d", test_mesh_1d},         {"mesh_2d", test_mesh_2d},
        {"mesh_3d", test_mesh_3d},         {"mesh_example", test_mesh_example},
        {"mesh_errors", test_mesh_errors}, {"mesh_disagreement", test_mesh_disagreement},
    };
    return fsdp_test_run(argc, argv, "mesh", cases, sizeof cases / sizeof cases[0]);
}

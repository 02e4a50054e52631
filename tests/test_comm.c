/* test_comm.c: the world, groups and every collective on 1, 2, 3, 4 and 8 ranks (rank threads,
 * or under mpirun the processes of an MPI job), f32, bf16 and f16, with uneven and empty chunks:
 * each result is compared bitwise with a serial computation in rank order, and replicated
 * results with every other rank's. Then the failures: mismatches across ranks, a rank
 * rejecting its arguments, tensors on a device (on every rank, or on one), a rank that never
 * arrives (timeout), a rank that has returned, and bad arguments. Rank bodies never call CUnit (it
 * is not thread-safe): they return a status with a message, which fsdp_world_run hands to the main
 * thread. What a body leaves for the main thread is about its own rank only, since under MPI each
 * process has its own copy. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_SET */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h> // open_memstream
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "fsdp/profile.h" // defines: fsdp_profile_start, fsdp_profile_read
#include "harness.h"

static const int world_sizes[] = {1, 2, 3, 4, 8};
#define N_WORLD_SIZES ((int)(sizeof world_sizes / sizeof world_sizes[0]))
#define MAX_RANKS     8
#define MAX_CASES     96

/* What each rank of a run leaves for the main thread, in its own slot: the cases it ran, and
 * for replicated results, every rank's hash of each, as gathered from them by this rank. */
typedef struct shared {
    int ncases[MAX_RANKS];
    uint64_t hash[MAX_RANKS][MAX_CASES][MAX_RANKS]; /* [this rank][case][from rank] */
} shared;

/* Gathers every rank's hashes of its n replicated results into sh->hash[rank] (the hashes
 * travel as the bits of f32 pairs; all_gather copies bytes). */
static fsdp_status share_hashes(fsdp_ctx *ctx, int rank, int W, int n, const uint64_t *mine,
                                shared *sh) {
    fsdp_tensor *in = NULL, *out = NULL;
    FSDP_TRY(
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){1, 2 * n}, &in));
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){W, 2 * n}, &out);
    if (st == FSDP_OK) {
        memcpy(fsdp_tensor_data(in), mine, (size_t)n * sizeof *mine);
        st = fsdp_all_gather(ctx, NULL, out, in, 0);
    }
    const uint64_t *all = st == FSDP_OK ? fsdp_tensor_data(out) : NULL;
    for (int q = 0; all && q < W; q++)
        for (int c = 0; c < n; c++) sh->hash[rank][c][q] = all[q * n + c];
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

/* Which serial references of the tables (below) the ranks of a run read. */
enum { REFS_NONE = 0, REFS_REDUCE = 1, REFS_SCALED = 2 };
static void tables_for_world(int W, int refs);

/* Runs fn on every world size (after the main thread has computed the references `refs` of
 * that size) and checks, for each rank this process ran, that it ran its cases and that
 * replicated results agree bitwise with every other rank's. */
static void run_all_sizes(fsdp_rank_fn fn, bool replicated, int refs) {
    shared *sh = malloc(sizeof *sh);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sh);
    for (int i = 0; i < N_WORLD_SIZES; i++) {
        const int W = world_sizes[i];
        memset(sh, 0, sizeof *sh);
        if (fsdp_test_hosted_ranks(W, &(int){0}) > 0) tables_for_world(W, refs);
        FSDP_TEST_OK(fsdp_test_run_world(W, 0, fn, sh));
        int first = 0, count = fsdp_test_hosted_ranks(W, &first);
        for (int me = first; me < first + count; me++) {
            CU_ASSERT_TRUE(sh->ncases[me] > 0);
            for (int c = 0; replicated && c < sh->ncases[me]; c++)
                for (int r = 1; r < W; r++) {
                    if (sh->hash[me][c][r] != sh->hash[me][c][0])
                        fprintf(stderr,
                                "\n  world %d, case %d: rank %d's result differs from rank 0's "
                                "(seen by rank %d)",
                                W, c, r, me);
                    CU_ASSERT_EQUAL(sh->hash[me][c][r], sh->hash[me][c][0]);
                }
        }
    }
    free(sh);
}

/* ---- values, shapes and references ---- */

/* A value in [-1, 1) with 24 significant bits, so sums round and their order matters. */
static float value(uint64_t salt, int64_t i) {
    uint64_t x = (salt + 1) * 0x9E3779B97F4A7C15u ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9u;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBu;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / (double)(1u << 23) - 1.0);
}

/* v as a tensor of `dtype` stores it. */
static float stored(fsdp_dtype dtype, float v) {
    return dtype == FSDP_DTYPE_BF16  ? fsdp_bf16_to_f32(fsdp_bf16_from_f32(v))
           : dtype == FSDP_DTYPE_F16 ? fsdp_f16_to_f32(fsdp_f16_from_f32(v))
                                     : v;
}

/* Element i of data holding `dtype` values, as f32. */
static float get_at(fsdp_dtype dtype, const void *data, int64_t i) {
    if (dtype == FSDP_DTYPE_F32) return ((const float *)data)[i];
    if (dtype == FSDP_DTYPE_F16) return fsdp_f16_to_f32(((const fsdp_f16 *)data)[i]);
    return fsdp_bf16_to_f32(((const fsdp_bf16 *)data)[i]);
}

static void set_at(fsdp_dtype dtype, void *data, int64_t i, float v) {
    if (dtype == FSDP_DTYPE_F32)
        ((float *)data)[i] = v;
    else if (dtype == FSDP_DTYPE_F16)
        ((fsdp_f16 *)data)[i] = fsdp_f16_from_f32(v);
    else
        ((fsdp_bf16 *)data)[i] = fsdp_bf16_from_f32(v);
}

static float get(const fsdp_tensor *t, int64_t i) {
    return get_at(fsdp_tensor_dtype(t), fsdp_tensor_data(t), i);
}

static void set(fsdp_tensor *t, int64_t i, float v) {
    set_at(fsdp_tensor_dtype(t), fsdp_tensor_data(t), i, v);
}

static bool same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

/* The flat index in `global` of element i of a box of shape `local` placed at `at`. */
static int64_t to_global(int64_t i, int ndim, const int64_t *local, const int64_t *at,
                         const int64_t *global) {
    int64_t idx[FSDP_MAX_DIMS], flat = 0;
    for (int k = ndim - 1; k >= 0; k--) {
        idx[k] = local[k] ? i % local[k] + at[k] : 0;
        i = local[k] ? i / local[k] : 0;
    }
    for (int k = 0; k < ndim; k++) flat = flat * global[k] + idx[k];
    return flat;
}

static const fsdp_dtype dtypes[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

static int dtype_index(fsdp_dtype dtype) {
    int t = 0;
    while (t < N_DTYPES - 1 && dtypes[t] != dtype) t++;
    return t;
}

/* The serial reduction over ranks 0..W-1 of element e, where rank r holds value(r + 1, e). */
static float serial_reduce(int64_t e, int W, fsdp_reduce_op op, fsdp_dtype dtype) {
    float acc = stored(dtype, value(1, e));
    for (int r = 1; r < W; r++) {
        float x = stored(dtype, value((uint64_t)r + 1, e));
        if (op == FSDP_REDUCE_MAX)
            acc = (acc != acc || acc >= x) ? acc : x;
        else
            acc += x;
    }
    if (op == FSDP_REDUCE_AVG) acc /= (float)W;
    return stored(dtype, acc);
}

/* Element e of (x0 * pre + x1 * pre) + ... over W ranks (rank r holds value(r + 1, e)), divided
 * by W for the average, times post: what a reduction with fsdp_reduce_options computes. */
static float serial_scaled(int64_t e, int W, fsdp_reduce_op op, const fsdp_reduce_options *o) {
    const float pre = o->pre_scale != 0.0f ? o->pre_scale : 1.0f;
    const float post = o->post_scale != 0.0f ? o->post_scale : 1.0f;
    float acc = value(1, e) * pre;
    for (int r = 1; r < W; r++) {
        float x = value((uint64_t)r + 1, e) * pre;
        acc += x;
    }
    if (op == FSDP_REDUCE_AVG) acc /= (float)W;
    return acc * post;
}

/* all_reduce_ex's options (sum and average with each). */
static const fsdp_reduce_options ar_ex_opts[] = {{.pre_scale = 1.0f / 3.0f, .post_scale = 0.3f},
                                                 {.pre_scale = 0.5f}};
#define N_AR_EX_OPTS ((int)(sizeof ar_ex_opts / sizeof ar_ex_opts[0]))

/* ---- tables: written by the main thread, read by the ranks ----
 * Rank r's input to an all_reduce, broadcast or reduce_scatter holds value(r + 1, e) at its flat
 * index e, and each element's expected result depends on e alone, so one table of REF_N elements
 * serves every shape. The main thread computes them before it starts a world's ranks (after
 * which they only read them): a rank fills its input with one copy and compares its result
 * with the serial reduction in one memcmp, instead of every rank recomputing the reduction of
 * every element. The references are the functions above, element by element, so the checks
 * are as strict as before: bitwise. */
#define REF_N     140001 /* the largest whole spec's elements: every index filled from a table */
#define REF_SALTS (MAX_RANKS + 1)
static struct tables {
    void *vals[N_DTYPES][REF_SALTS]; /* value(salt, e) as dtypes[t] stores it, in its bytes */
    int reduce_W;                    /* the world size of reduce[][], 0 for none */
    void *reduce[N_DTYPES][FSDP_REDUCE_OP_COUNT]; /* serial_reduce(e, W, op, dtypes[t]) */
    int scaled_W;                                 /* the world size of scaled[][] */
    float *scaled[2][N_AR_EX_OPTS]; /* serial_scaled(e, W, sum / avg, &ar_ex_opts[k]) */
} tab;

static void tables_free(void) {
    for (int t = 0; t < N_DTYPES; t++) {
        for (int s = 0; s < REF_SALTS; s++) free(tab.vals[t][s]);
        for (int op = 0; op < FSDP_REDUCE_OP_COUNT; op++) free(tab.reduce[t][op]);
    }
    for (int op = 0; op < 2; op++)
        for (int k = 0; k < N_AR_EX_OPTS; k++) free(tab.scaled[op][k]);
    memset(&tab, 0, sizeof tab);
}

/* Allocates every table and fills the values (main thread, once); false when out of memory. */
static bool tables_create(void) {
    bool ok = true;
    for (int t = 0; t < N_DTYPES; t++) {
        const size_t bytes = (size_t)REF_N * fsdp_dtype_size(dtypes[t]);
        for (int s = 0; s < REF_SALTS; s++) {
            ok = ok && (tab.vals[t][s] = malloc(bytes)) != NULL;
            for (int64_t e = 0; ok && e < REF_N; e++)
                set_at(dtypes[t], tab.vals[t][s], e, value((uint64_t)s, e));
        }
        for (int op = 0; op < FSDP_REDUCE_OP_COUNT; op++)
            ok = ok && (tab.reduce[t][op] = malloc(bytes)) != NULL;
    }
    for (int op = 0; op < 2; op++)
        for (int k = 0; k < N_AR_EX_OPTS; k++)
            ok = ok && (tab.scaled[op][k] = malloc(REF_N * sizeof(float))) != NULL;
    if (!ok) tables_free();
    return ok;
}

/* The references `refs` of world size W (main thread, before the world's ranks start). */
static void tables_for_world(int W, int refs) {
    for (int t = 0; (refs & REFS_REDUCE) && tab.reduce_W != W && t < N_DTYPES; t++)
        for (int op = 0; op < FSDP_REDUCE_OP_COUNT; op++)
            for (int64_t e = 0; e < REF_N; e++)
                set_at(dtypes[t], tab.reduce[t][op], e,
                       serial_reduce(e, W, (fsdp_reduce_op)op, dtypes[t]));
    if (refs & REFS_REDUCE) tab.reduce_W = W;
    for (int op = 0; (refs & REFS_SCALED) && tab.scaled_W != W && op < 2; op++)
        for (int k = 0; k < N_AR_EX_OPTS; k++)
            for (int64_t e = 0; e < REF_N; e++)
                tab.scaled[op][k][e] =
                    serial_scaled(e, W, op ? FSDP_REDUCE_AVG : FSDP_REDUCE_SUM, &ar_ex_opts[k]);
    if (refs & REFS_SCALED) tab.scaled_W = W;
}

/* The index of the first element of t whose bytes differ from ref's (in t's dtype), or -1 when
 * t equals ref bitwise. */
static int64_t first_difference(const fsdp_tensor *t, const void *ref) {
    const unsigned char *p = fsdp_tensor_data(t), *q = ref;
    const size_t size = fsdp_dtype_size(fsdp_tensor_dtype(t)), nbytes = fsdp_tensor_nbytes(t);
    if (nbytes == 0 || memcmp(p, q, nbytes) == 0) return -1;
    size_t i = 0;
    while (memcmp(p + i, q + i, size) == 0) i += size;
    return (int64_t)(i / size);
}

/* Fills t, the box at `at` of a tensor of shape `global`, with value(salt, global index): a
 * copy of the table when t is the whole tensor and the table holds it. */
static void fill_box(fsdp_tensor *t, const int64_t *global, const int64_t *at, uint64_t salt) {
    const int ndim = fsdp_tensor_ndim(t);
    const int64_t *local = fsdp_tensor_shape(t), n = fsdp_tensor_numel(t);
    const fsdp_dtype dtype = fsdp_tensor_dtype(t);
    void *data = fsdp_tensor_data(t);
    bool whole = true;
    for (int k = 0; k < ndim; k++) whole = whole && at[k] == 0 && local[k] == global[k];
    if (whole && salt < REF_SALTS && n <= REF_N) {
        memcpy(data, tab.vals[dtype_index(dtype)][salt], fsdp_tensor_nbytes(t));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        set_at(dtype, data, i, value(salt, whole ? i : to_global(i, ndim, local, at, global)));
}

/* FNV-1a over 8-byte words (and the last bytes one by one). */
static uint64_t hash_bytes(const fsdp_tensor *t) {
    uint64_t h = 0xcbf29ce484222325u;
    const unsigned char *p = fsdp_tensor_data(t);
    const size_t n = fsdp_tensor_nbytes(t);
    size_t i = 0;
    for (uint64_t w; i + sizeof w <= n; i += sizeof w) {
        memcpy(&w, p + i, sizeof w);
        h = (h ^ w) * 0x100000001b3u;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

typedef struct spec {
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int dim;  /* the sharded dim (all_to_all: concat_dim, the one the input is sharded on) */
    int dim2; /* all_to_all: split_dim */
} spec;

/* Uneven (13 on 4 ranks), smaller than W (empty chunks), inner and negative dims, 1-d,
 * empty tensors. */
static const spec shard_specs[] = {
    {2, {13, 3}, 0, 1}, {2, {2, 3}, 0, 1},       {2, {4, 13}, 1, 0},   {3, {2, 5, 3}, 1, 2},
    {1, {3}, 0, 0},     {2, {4, 7}, -1, -2},     {2, {0, 4}, 0, 1},    {3, {3, 9, 2}, 2, 1},
    {2, {1, 1}, 0, 1},  {4, {2, 3, 5, 2}, 2, 0}, {2, {9001, 3}, 0, 1}, /* chunks of many blocks */
};
#define N_SHARD_SPECS ((int)(sizeof shard_specs / sizeof shard_specs[0]))

static int norm_dim(int dim, int ndim) {
    return dim < 0 ? dim + ndim : dim;
}

/* ---- the collectives against serial computations ---- */

static fsdp_status gather_case(fsdp_ctx *ctx, int rank, int W, fsdp_dtype dtype, const spec *sp,
                               uint64_t *hash) {
    int d = norm_dim(sp->dim, sp->ndim);
    int64_t at[FSDP_MAX_DIMS] = {0}, local[FSDP_MAX_DIMS];
    memcpy(local, sp->shape, sizeof local);
    fsdp_chunk_range(sp->shape[d], W, rank, &at[d], &local[d]);
    fsdp_tensor *in = NULL, *out = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, local, &in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, sp->shape, &out);
    if (st == FSDP_OK) {
        fill_box(in, sp->shape, at, 0);
        st = fsdp_all_gather(ctx, NULL, out, in, sp->dim);
    }
    for (int64_t e = 0; st == FSDP_OK && e < fsdp_tensor_numel(out); e++)
        if (!same_bits(get(out, e), stored(dtype, value(0, e))))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "all_gather %s dim %d: element %lld is %.9g, "
                           "want %.9g",
                           fsdp_dtype_to_string(dtype), sp->dim, (long long)e, get(out, e),
                           stored(dtype, value(0, e)));
    if (st == FSDP_OK) *hash = hash_bytes(out);
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

static fsdp_status gather_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx)), c = 0;
    uint64_t hash[MAX_CASES];
    for (int t = 0; t < N_DTYPES; t++)
        for (int s = 0; s < N_SHARD_SPECS; s++, c++)
            FSDP_TRY(gather_case(ctx, rank, W, dtypes[t], &shard_specs[s], &hash[c]));
    sh->ncases[rank] = c;
    return share_hashes(ctx, rank, W, c, hash, sh);
}

static void test_all_gather(void) {
    run_all_sizes(gather_body, true, REFS_NONE);
}

/* A reduce_scatter's tensors: *in of the full shape holding value(rank + 1, e), *out of this
 * rank's chunk along the spec's dim, which starts at `at` and has the shape `local`. */
static fsdp_status scatter_tensors(fsdp_ctx *ctx, int rank, int W, fsdp_dtype dtype, const spec *sp,
                                   int64_t *at, int64_t *local, fsdp_tensor **in,
                                   fsdp_tensor **out) {
    int d = norm_dim(sp->dim, sp->ndim);
    const int64_t zero[FSDP_MAX_DIMS] = {0};
    memset(at, 0, FSDP_MAX_DIMS * sizeof *at);
    memcpy(local, sp->shape, FSDP_MAX_DIMS * sizeof *local);
    fsdp_chunk_range(sp->shape[d], W, rank, &at[d], &local[d]);
    *in = *out = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, sp->shape, in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, local, out);
    if (st == FSDP_OK) fill_box(*in, sp->shape, zero, (uint64_t)rank + 1);
    return st;
}

static fsdp_status reduce_scatter_case(fsdp_ctx *ctx, int rank, int W, fsdp_dtype dtype,
                                       const spec *sp, fsdp_reduce_op op) {
    int64_t at[FSDP_MAX_DIMS], local[FSDP_MAX_DIMS];
    fsdp_tensor *in, *out;
    fsdp_status st = scatter_tensors(ctx, rank, W, dtype, sp, at, local, &in, &out);
    const void *ref = tab.reduce[dtype_index(dtype)][op]; /* serial_reduce(e, W, op, dtype) */
    if (st == FSDP_OK) st = fsdp_reduce_scatter(ctx, NULL, out, in, sp->dim, op);
    for (int64_t i = 0; st == FSDP_OK && i < fsdp_tensor_numel(out); i++) {
        int64_t e = to_global(i, sp->ndim, local, at, sp->shape);
        float want = get_at(dtype, ref, e);
        if (!same_bits(get(out, i), want))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "reduce_scatter %s %s dim %d: element %lld (global %lld) is %.9g, "
                           "want %.9g",
                           fsdp_reduce_op_to_string(op), fsdp_dtype_to_string(dtype), sp->dim,
                           (long long)i, (long long)e, get(out, i), want);
    }
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

static fsdp_status reduce_scatter_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    FSDP_RANK_CHECK(ctx, tab.reduce_W == W, "the references are of %d ranks", tab.reduce_W);
    for (int t = 0; t < N_DTYPES; t++)
        for (int s = 0; s < N_SHARD_SPECS; s++)
            for (int op = 0; op < FSDP_REDUCE_OP_COUNT; op++)
                FSDP_TRY(reduce_scatter_case(ctx, rank, W, dtypes[t], &shard_specs[s],
                                             (fsdp_reduce_op)op));
    sh->ncases[rank] = 1;
    return FSDP_OK;
}

static void test_reduce_scatter(void) {
    run_all_sizes(reduce_scatter_body, false, REFS_REDUCE);
}

/* fsdp_reduce_scatter_ex: the scaled, accumulated reduction is bitwise the separate passes:
 * every input times pre, the sum in rank order (the average's division), times post, added to
 * what out held. pre 1/3 and post 0.3 are not powers of two, so a fused multiply-add or another
 * order would show. With sum and avg, the sets below make every combination of pre, avg, post
 * and accumulate (each has its own loop in the reduction). */
static const fsdp_reduce_options ex_opts[] = {
    {.pre_scale = 0.5f},
    {.pre_scale = 1.0f / 3.0f, .post_scale = 0.3f, .accumulate = true},
    {.accumulate = true},
    {.post_scale = 0.25f},
    {.pre_scale = 1.0f},
    {.pre_scale = 1.0f / 3.0f, .post_scale = 0.3f},
    {.pre_scale = 0.75f, .accumulate = true},
    {.post_scale = 1.0f / 3.0f, .accumulate = true},
};
#define N_EX_OPTS ((int)(sizeof ex_opts / sizeof ex_opts[0]))

static fsdp_status reduce_scatter_ex_case(fsdp_ctx *ctx, int rank, int W, const spec *sp,
                                          fsdp_reduce_op op, const fsdp_reduce_options *o) {
    int64_t at[FSDP_MAX_DIMS], local[FSDP_MAX_DIMS];
    fsdp_tensor *in, *out;
    fsdp_status st = scatter_tensors(ctx, rank, W, FSDP_DTYPE_F32, sp, at, local, &in, &out);
    if (st == FSDP_OK) {
        fill_box(out, sp->shape, at, 99);
        st = fsdp_reduce_scatter_ex(ctx, NULL, out, in, sp->dim, op, o);
    }
    for (int64_t i = 0; st == FSDP_OK && i < fsdp_tensor_numel(out); i++) {
        int64_t e = to_global(i, sp->ndim, local, at, sp->shape);
        float acc = serial_scaled(e, W, op, o);
        float want = o->accumulate ? value(99, e) + acc : acc;
        if (!same_bits(get(out, i), want))
            st =
                FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                          "reduce_scatter_ex %s pre %g post %g accumulate %d dim %d: element "
                          "%lld (global %lld) is %.9g, want %.9g",
                          fsdp_reduce_op_to_string(op), (double)o->pre_scale, (double)o->post_scale,
                          o->accumulate, sp->dim, (long long)i, (long long)e, get(out, i), want);
    }
    /* The input is left as it was. */
    for (int64_t e = 0; st == FSDP_OK && e < fsdp_tensor_numel(in); e++)
        if (!same_bits(get(in, e), value((uint64_t)rank + 1, e)))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "reduce_scatter_ex changed its input");
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

/* Options it refuses, on every rank alike (each names the problem; nobody waits). */
static fsdp_status reduce_scatter_ex_refusals(fsdp_ctx *ctx, int W) {
    int64_t n = 2 * W, m = 2;
    fsdp_tensor *in = NULL, *out = NULL, *bin = NULL, *bout = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &m, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 1, &n, &bin);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 1, &m, &bout);
    if (st != FSDP_OK) goto done;
    const fsdp_reduce_options add = {.accumulate = true}, nan = {.pre_scale = NAN};
    struct {
        fsdp_tensor *o, *i;
        fsdp_reduce_op op;
        const fsdp_reduce_options *opts;
        fsdp_status want;
        const char *says;
    } cases[] = {
        {bout, bin, FSDP_REDUCE_SUM, &add, FSDP_ERR_UNSUPPORTED, "f32 sums and averages, not bf16"},
        {out, in, FSDP_REDUCE_MAX, &add, FSDP_ERR_UNSUPPORTED, "not f32 max"},
        {out, in, FSDP_REDUCE_SUM, &nan, FSDP_ERR_INVALID_ARGUMENT, "must be finite"},
    };
    for (size_t k = 0; st == FSDP_OK && k < sizeof cases / sizeof cases[0]; k++) {
        fsdp_status got = fsdp_reduce_scatter_ex(ctx, NULL, cases[k].o, cases[k].i, 0, cases[k].op,
                                                 cases[k].opts);
        if (got != cases[k].want || !strstr(fsdp_last_error(ctx), cases[k].says))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "refusal %zu: %s, message '%s' (want %s)", k,
                           fsdp_status_to_string(got), fsdp_last_error(ctx), cases[k].says);
    }
    /* and the group still works */
    if (st == FSDP_OK) st = fsdp_reduce_scatter_ex(ctx, NULL, out, in, 0, FSDP_REDUCE_SUM, &add);
done:
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    fsdp_tensor_free(bin);
    fsdp_tensor_free(bout);
    return st;
}

static fsdp_status reduce_scatter_ex_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    for (int s = 0; s < N_SHARD_SPECS; s++)
        for (int op = 0; op < 2; op++)
            for (int k = 0; k < N_EX_OPTS; k++)
                FSDP_TRY(reduce_scatter_ex_case(ctx, rank, W, &shard_specs[s],
                                                op ? FSDP_REDUCE_AVG : FSDP_REDUCE_SUM,
                                                &ex_opts[k]));
    FSDP_TRY(reduce_scatter_ex_refusals(ctx, W));
    sh->ncases[rank] = 1;
    return FSDP_OK;
}

static void test_reduce_scatter_ex(void) {
    run_all_sizes(reduce_scatter_ex_body, false, REFS_NONE);
}

static const spec whole_specs[] = {
    {2, {13, 3}, 0, 0},
    {1, {5}, 0, 0},
    {0, {0}, 0, 0},
    {3, {2, 3, 4}, 0, 0},
    {1, {0}, 0, 0},
    {1, {1}, 0, 0},
    {1, {1000}, 0, 0},
    /* 256 KiB and more (f32, and bf16 for the last): the local backend reduces in place */
    {2, {257, 300}, 0, 0},
    {1, {140001}, 0, 0},
};
#define N_WHOLE_SPECS ((int)(sizeof whole_specs / sizeof whole_specs[0]))

static fsdp_status all_reduce_case(fsdp_ctx *ctx, int rank, fsdp_dtype dtype, const spec *sp,
                                   fsdp_reduce_op op, uint64_t *hash) {
    int64_t zero[FSDP_MAX_DIMS] = {0};
    fsdp_tensor *t = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, sp->shape, &t);
    if (st == FSDP_OK) {
        fill_box(t, sp->shape, zero, (uint64_t)rank + 1);
        st = fsdp_all_reduce(ctx, NULL, t, op);
    }
    const void *ref = tab.reduce[dtype_index(dtype)][op]; /* serial_reduce(e, W, op, dtype) */
    const int64_t e = st == FSDP_OK ? first_difference(t, ref) : -1;
    if (e >= 0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "all_reduce %s %s: element %lld is %.9g, want %.9g",
                       fsdp_reduce_op_to_string(op), fsdp_dtype_to_string(dtype), (long long)e,
                       get(t, e), get_at(dtype, ref, e));
    if (st == FSDP_OK) *hash = hash_bytes(t);
    fsdp_tensor_free(t);
    return st;
}

static fsdp_status all_reduce_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx)), c = 0;
    uint64_t hash[MAX_CASES];
    FSDP_RANK_CHECK(ctx, tab.reduce_W == W, "the references are of %d ranks", tab.reduce_W);
    for (int t = 0; t < N_DTYPES; t++)
        for (int s = 0; s < N_WHOLE_SPECS; s++)
            for (int op = 0; op < FSDP_REDUCE_OP_COUNT; op++, c++)
                FSDP_TRY(all_reduce_case(ctx, rank, dtypes[t], &whole_specs[s], (fsdp_reduce_op)op,
                                         &hash[c]));
    sh->ncases[rank] = c;
    return share_hashes(ctx, rank, W, c, hash, sh);
}

static void test_all_reduce(void) {
    run_all_sizes(all_reduce_body, true, REFS_REDUCE);
}

/* fsdp_all_reduce_ex and fsdp_all_reduce_start_ex: t = post * (t0 * pre + t1 * pre + ...) (the
 * average's division before post), bitwise, on every rank (hashes compared), through both of
 * the local backend's paths (below and from 256 KiB); accumulate is refused. */
static fsdp_status all_reduce_ex_case(fsdp_ctx *ctx, int rank, const spec *sp, fsdp_reduce_op op,
                                      int k, fsdp_comm_work *work, uint64_t *hash) {
    const fsdp_reduce_options *o = &ar_ex_opts[k];
    const float *ref = tab.scaled[op == FSDP_REDUCE_AVG][k]; /* serial_scaled(e, W, op, o) */
    int64_t zero[FSDP_MAX_DIMS] = {0};
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, sp->ndim, sp->shape, &t));
    fill_box(t, sp->shape, zero, (uint64_t)rank + 1);
    fsdp_status st = work ? fsdp_all_reduce_start_ex(ctx, NULL, t, op, o, work)
                          : fsdp_all_reduce_ex(ctx, NULL, t, op, o);
    if (st == FSDP_OK && work) st = fsdp_comm_work_wait(ctx, work);
    const int64_t e = st == FSDP_OK ? first_difference(t, ref) : -1;
    if (e >= 0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                       "all_reduce_ex%s %s pre %g post %g: element %lld is %.9g, want %.9g",
                       work ? " (start)" : "", fsdp_reduce_op_to_string(op), (double)o->pre_scale,
                       (double)o->post_scale, (long long)e, get(t, e), ref[e]);
    if (st == FSDP_OK) *hash = hash_bytes(t);
    fsdp_tensor_free(t);
    return st;
}

static fsdp_status all_reduce_ex_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx)), c = 0;
    uint64_t hash[MAX_CASES];
    FSDP_RANK_CHECK(ctx, tab.scaled_W == W, "the references are of %d ranks", tab.scaled_W);
    fsdp_comm_work *work = NULL;
    FSDP_TRY(fsdp_comm_work_create(ctx, &work));
    fsdp_status st = FSDP_OK;
    for (int s = 0; st == FSDP_OK && s < N_WHOLE_SPECS; s++)
        for (int op = 0; st == FSDP_OK && op < 2; op++)
            for (int k = 0; st == FSDP_OK && k < 2; k++)
                for (int start = 0; st == FSDP_OK && start < 2; start++, c++)
                    st = all_reduce_ex_case(ctx, rank, &whole_specs[s],
                                            op ? FSDP_REDUCE_AVG : FSDP_REDUCE_SUM, k,
                                            start ? work : NULL, &hash[c]);
    if (st == FSDP_OK) {
        int64_t n = 4;
        fsdp_tensor *t = NULL;
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &t);
        fsdp_status got = st == FSDP_OK
                              ? fsdp_all_reduce_ex(ctx, NULL, t, FSDP_REDUCE_SUM,
                                                   &(fsdp_reduce_options){.accumulate = true})
                              : st;
        if (st == FSDP_OK && (got != FSDP_ERR_INVALID_ARGUMENT ||
                              !strstr(fsdp_last_error(ctx), "accumulate is for reduce_scatter")))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "all_reduce_ex accumulate: %s, '%s'",
                           fsdp_status_to_string(got), fsdp_last_error(ctx));
        fsdp_tensor_free(t);
    }
    fsdp_comm_work_free(work);
    FSDP_TRY(st);
    sh->ncases[rank] = c;
    return share_hashes(ctx, rank, W, c, hash, sh);
}

static void test_all_reduce_ex(void) {
    run_all_sizes(all_reduce_ex_body, true, REFS_SCALED);
}

static fsdp_status broadcast_case(fsdp_ctx *ctx, int rank, fsdp_dtype dtype, const spec *sp,
                                  int root, uint64_t *hash) {
    int64_t zero[FSDP_MAX_DIMS] = {0};
    fsdp_tensor *t = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, sp->shape, &t);
    if (st == FSDP_OK) {
        fill_box(t, sp->shape, zero, (uint64_t)rank + 1);
        st = fsdp_broadcast(ctx, NULL, t, root);
    }
    const void *ref = tab.vals[dtype_index(dtype)][root + 1]; /* value(root + 1, e) stored */
    const int64_t e = st == FSDP_OK ? first_difference(t, ref) : -1;
    if (e >= 0)
        st = FSDP_FAIL(
            ctx, FSDP_ERR_INTERNAL, "broadcast %s from %d: element %lld is %.9g, want %.9g",
            fsdp_dtype_to_string(dtype), root, (long long)e, get(t, e), get_at(dtype, ref, e));
    if (st == FSDP_OK) *hash = hash_bytes(t);
    fsdp_tensor_free(t);
    return st;
}

static fsdp_status broadcast_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx)), c = 0;
    const int roots[] = {0, W - 1, W / 2};
    uint64_t hash[MAX_CASES];
    for (int t = 0; t < N_DTYPES; t++)
        for (int s = 0; s < N_WHOLE_SPECS; s++)
            for (int k = 0; k < 3; k++, c++)
                FSDP_TRY(broadcast_case(ctx, rank, dtypes[t], &whole_specs[s], roots[k], &hash[c]));
    sh->ncases[rank] = c;
    return share_hashes(ctx, rank, W, c, hash, sh);
}

static void test_broadcast(void) {
    run_all_sizes(broadcast_body, true, REFS_NONE);
}

/* Shard(concat) -> Shard(split) of a global tensor filled with value(0, e). */
static fsdp_status all_to_all_case(fsdp_ctx *ctx, int rank, int W, fsdp_dtype dtype,
                                   const spec *sp) {
    int c = norm_dim(sp->dim, sp->ndim), s = norm_dim(sp->dim2, sp->ndim);
    int64_t in_at[FSDP_MAX_DIMS] = {0}, out_at[FSDP_MAX_DIMS] = {0};
    int64_t in_shape[FSDP_MAX_DIMS], out_shape[FSDP_MAX_DIMS];
    memcpy(in_shape, sp->shape, sizeof in_shape);
    memcpy(out_shape, sp->shape, sizeof out_shape);
    fsdp_chunk_range(sp->shape[c], W, rank, &in_at[c], &in_shape[c]);
    fsdp_chunk_range(sp->shape[s], W, rank, &out_at[s], &out_shape[s]);
    fsdp_tensor *in = NULL, *out = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, in_shape, &in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, sp->ndim, out_shape, &out);
    if (st == FSDP_OK) {
        fill_box(in, sp->shape, in_at, 0);
        st = fsdp_all_to_all(ctx, NULL, out, in, sp->dim2, sp->dim);
    }
    for (int64_t i = 0; st == FSDP_OK && i < fsdp_tensor_numel(out); i++) {
        int64_t e = to_global(i, sp->ndim, out_shape, out_at, sp->shape);
        float want = stored(dtype, value(0, e));
        if (!same_bits(get(out, i), want))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "all_to_all %s split %d concat %d: element %lld is %.9g, want %.9g",
                           fsdp_dtype_to_string(dtype), s, c, (long long)i, get(out, i), want);
    }
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

/* split_dim == concat_dim: equal pieces of a (W * 3, 2) tensor, torch's all_to_all_single. */
static fsdp_status all_to_all_equal_case(fsdp_ctx *ctx, int rank, int W, fsdp_dtype dtype) {
    const int64_t k = 3, shape[2] = {W * k, 2}, zero[2] = {0, 0};
    fsdp_tensor *in = NULL, *out = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, 2, shape, &in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, 2, shape, &out);
    if (st == FSDP_OK) {
        fill_box(in, shape, zero, (uint64_t)rank + 1);
        st = fsdp_all_to_all(ctx, NULL, out, in, 0, 0);
    }
    for (int64_t i = 0; st == FSDP_OK && i < fsdp_tensor_numel(out); i++) {
        int64_t row = i / 2, col = i % 2, from = row / k, j = row % k;
        float want = stored(dtype, value((uint64_t)from + 1, (rank * k + j) * 2 + col));
        if (!same_bits(get(out, i), want))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "all_to_all (equal pieces) %s: element %lld is %.9g, want %.9g",
                           fsdp_dtype_to_string(dtype), (long long)i, get(out, i), want);
    }
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

static fsdp_status all_to_all_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    for (int t = 0; t < N_DTYPES; t++) {
        for (int s = 0; s < N_SHARD_SPECS; s++)
            if (norm_dim(shard_specs[s].dim, shard_specs[s].ndim) !=
                norm_dim(shard_specs[s].dim2, shard_specs[s].ndim))
                FSDP_TRY(all_to_all_case(ctx, rank, W, dtypes[t], &shard_specs[s]));
        FSDP_TRY(all_to_all_equal_case(ctx, rank, W, dtypes[t]));
    }
    sh->ncases[rank] = 1;
    return FSDP_OK;
}

static void test_all_to_all(void) {
    run_all_sizes(all_to_all_body, false, REFS_NONE);
}

/* No rank leaves a barrier before every rank has entered it. Two witnesses: a counter the
 * ranks of this process share (every rank's entry, locally; under MPI only this rank's), and
 * the monotonic clock, which every process of one machine shares: each rank's exit time of
 * every round is checked against every rank's entry time, gathered afterwards. */
#define BARRIER_ROUNDS 20

typedef struct barrier_state {
    int hosted; /* the ranks of this process that share `entered` */
    atomic_int entered;
    int rounds[MAX_RANKS]; /* per rank: rounds it checked */
} barrier_state;

/* Checks that this rank left every round after every rank had entered it. */
static fsdp_status check_barrier_times(fsdp_ctx *ctx, int W, const double *t_in,
                                       const double *t_out) {
    fsdp_tensor *in = NULL, *out = NULL;
    const int64_t n = 2 * BARRIER_ROUNDS; /* the doubles as f32 pairs */
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){1, n}, &in));
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){W, n}, &out);
    if (st == FSDP_OK) {
        memcpy(fsdp_tensor_data(in), t_in, BARRIER_ROUNDS * sizeof *t_in);
        st = fsdp_all_gather(ctx, NULL, out, in, 0);
    }
    const double *all = st == FSDP_OK ? fsdp_tensor_data(out) : NULL;
    for (int q = 0; all && q < W && st == FSDP_OK; q++)
        for (int i = 0; i < BARRIER_ROUNDS && st == FSDP_OK; i++)
            if (t_out[i] < all[q * BARRIER_ROUNDS + i])
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                               "round %d: left the barrier %.6f s before rank %d entered it", i,
                               all[q * BARRIER_ROUNDS + i] - t_out[i], q);
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

static fsdp_status barrier_body(fsdp_ctx *ctx, int rank, void *user) {
    barrier_state *b = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    double t_in[BARRIER_ROUNDS], t_out[BARRIER_ROUNDS];
    for (int i = 0; i < BARRIER_ROUNDS; i++) {
        atomic_fetch_add(&b->entered, 1);
        t_in[i] = fsdp_test_now();
        FSDP_TRY(fsdp_barrier(ctx, NULL));
        t_out[i] = fsdp_test_now();
        int seen = atomic_load(&b->entered);
        FSDP_RANK_CHECK(ctx, seen >= (i + 1) * b->hosted,
                        "round %d: left the barrier with %d entries, want %d", i, seen,
                        (i + 1) * b->hosted);
        FSDP_TRY(fsdp_barrier(ctx, NULL)); /* nobody enters round i + 1 before all checked */
        b->rounds[rank]++;
    }
    return check_barrier_times(ctx, W, t_in, t_out);
}

static void test_barrier(void) {
    for (int i = 0; i < N_WORLD_SIZES; i++) {
        barrier_state b = {0};
        int first = 0;
        b.hosted = fsdp_test_hosted_ranks(world_sizes[i], &first);
        atomic_init(&b.entered, 0);
        FSDP_TEST_OK(fsdp_test_run_world(world_sizes[i], 0, barrier_body, &b));
        CU_ASSERT_EQUAL(atomic_load(&b.entered), BARRIER_ROUNDS * b.hosted);
        for (int r = first; r < first + b.hosted; r++) CU_ASSERT_EQUAL(b.rounds[r], BARRIER_ROUNDS);
    }
}

/* In place: the input is this rank's chunk of the output (the FSDP flat-parameter case). */
static fsdp_status in_place_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const int64_t shape[2] = {13, 2};
    int64_t at[2] = {0, 0}, local[2] = {13, 2};
    fsdp_chunk_range(13, W, rank, &at[0], &local[0]);
    fsdp_tensor *out = NULL, *in = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &out));
    fsdp_status st = fsdp_tensor_view(ctx, out, at[0] * 2, 2, local, &in);
    if (st == FSDP_OK) {
        fill_box(in, shape, at, 0);
        st = fsdp_all_gather(ctx, NULL, out, in, 0);
    }
    for (int64_t e = 0; st == FSDP_OK && e < 26; e++)
        if (!same_bits(get(out, e), value(0, e)))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "in-place all_gather: element %lld wrong",
                           (long long)e);
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

static void test_all_gather_in_place(void) {
    for (int i = 0; i < N_WORLD_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(world_sizes[i], 0, in_place_body, NULL));
}

/* fsdp_group_share_shards: on rank threads every rank's shard moves into one block, in rank
 * order, keeping its values and its views; an all_gather into the block is then correct
 * without copying (comm-debug counts it, not the sharing), and a write to a shard after a
 * rendezvous is what the peers read. Under MPI nothing changes and full is NULL. Refusals
 * name the problem, and the peers fail at once naming the rank. */
#define SHARE_N 1000

static fsdp_status share_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    int64_t n = SHARE_N, half = SHARE_N / 2, at = (int64_t)rank * SHARE_N, total = W * n;
    fsdp_tensor *shard = NULL, *view = NULL, *full = NULL, *copy = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &shard));
    fsdp_status st = fsdp_tensor_view(ctx, shard, half, 1, &half, &view);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &total, &copy);
    if (st == FSDP_OK) {
        fill_box(shard, &total, &at, 5);
        st = fsdp_comm_debug_begin(ctx);
    }
    if (st == FSDP_OK) st = fsdp_group_share_shards(ctx, NULL, shard, &full);
    const bool in_block = !fsdp_test_mpi();
    FSDP_RANK_CHECK(ctx, st != FSDP_OK || (full != NULL) == in_block, "full is %s on %s",
                    full ? "set" : "NULL", in_block ? "rank threads" : "MPI");
    if (st == FSDP_OK && in_block) {
        /* the shard and its view moved into the block, values kept */
        FSDP_RANK_CHECK(ctx,
                        fsdp_tensor_data(shard) == (float *)fsdp_tensor_data(full) + at &&
                            fsdp_tensor_data(view) == (float *)fsdp_tensor_data(shard) + half,
                        "the shard or its view is not at its place in the block");
        for (int64_t e = 0; st == FSDP_OK && e < total; e++)
            if (!same_bits(((const float *)fsdp_tensor_data(full))[e], value(5, e)))
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "block element %lld is %.9g, want %.9g",
                               (long long)e, (double)((const float *)fsdp_tensor_data(full))[e],
                               (double)value(5, e));
    }
    /* nobody writes its shard while a peer still reads the block */
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    /* A step's worth: write the shard (through the view too), then gather. */
    for (int round = 0; st == FSDP_OK && round < 3; round++) {
        float *s = fsdp_tensor_data(shard);
        for (int64_t i = 0; i < n; i++) s[i] = value(10 + (uint64_t)round, at + i);
        ((float *)fsdp_tensor_data(view))[0] = -1.0f - (float)round;
        fsdp_tensor *out = in_block ? full : copy;
        st = fsdp_all_gather(ctx, NULL, out, shard, 0);
        for (int64_t e = 0; st == FSDP_OK && e < total; e++) {
            float want = e % n == half ? -1.0f - (float)round : value(10 + (uint64_t)round, e);
            if (!same_bits(((const float *)fsdp_tensor_data(out))[e], want))
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "round %d: element %lld wrong", round,
                               (long long)e);
        }
        /* nobody writes its shard for the next round while a peer still reads this one */
        if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    }
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        fsdp_comm_count ag = fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_GATHER, NULL);
        fsdp_comm_count all = fsdp_comm_debug_total(ctx);
        FSDP_RANK_CHECK(ctx, ag.calls == 3 && all.calls == 3,
                        "comm-debug counted %lld all_gathers and %lld calls, want 3 and 3",
                        (long long)ag.calls, (long long)all.calls);
    }
    /* Rank 0 lets go of the block first, the others of their shards first: the last handle,
     * whichever it is, frees it (ASan checks). */
    if (rank == 0) fsdp_tensor_free(full), full = NULL;
    fsdp_tensor_free(view);
    fsdp_tensor_free(shard);
    fsdp_tensor_free(full);
    fsdp_tensor_free(copy);
    return st;
}

static fsdp_status share_refusals_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    int64_t n = rank == 1 ? 5 : 4, two[2] = {2, 2}, eight = 8;
    fsdp_tensor *shard = NULL, *square = NULL, *base = NULL, *view = NULL, *full = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &shard);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, two, &square);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &eight, &base);
    if (st == FSDP_OK) st = fsdp_tensor_view(ctx, base, 4, 1, (const int64_t[]){4}, &view);
    if (st != FSDP_OK) goto done;
    const bool in_block = !fsdp_test_mpi();
    struct {
        fsdp_tensor *t;
        fsdp_status want;
        const char *says;
    } cases[] = {
        /* each rank refuses its own 2-D tensor, or a view */
        {square, FSDP_ERR_SHAPE, "must be 1-D, not 2-D"},
        {view, FSDP_ERR_STATE, "CPU memory of its own"},
        /* rank 1's shard is longer: the ranks disagree (rank threads only: MPI does nothing) */
        {shard, in_block ? FSDP_ERR_SHAPE : FSDP_OK,
         in_block ? "disagree on the global shape" : ""},
    };
    for (size_t k = 0; st == FSDP_OK && k < sizeof cases / sizeof cases[0]; k++) {
        fsdp_status got = fsdp_group_share_shards(ctx, NULL, cases[k].t, &full);
        if (got != cases[k].want ||
            (got != FSDP_OK && !strstr(fsdp_last_error(ctx), cases[k].says)))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "refusal %zu: %s, message '%s' (want %s '%s')",
                           k, fsdp_status_to_string(got), fsdp_last_error(ctx),
                           fsdp_status_to_string(cases[k].want), cases[k].says);
        else if (full)
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "refusal %zu: full is set", k);
    }
    /* Only rank 2 refuses: the others fail at once, naming it. */
    if (st == FSDP_OK && fsdp_world_size(fsdp_ctx_world(ctx)) > 2 && in_block) {
        fsdp_tensor *mine = NULL;
        int64_t four = 4;
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &four, &mine);
        double t0 = fsdp_test_now();
        fsdp_status got =
            st == FSDP_OK ? fsdp_group_share_shards(ctx, NULL, rank == 2 ? view : mine, &full) : st;
        const char *says = rank == 2 ? "CPU memory of its own" : "rank 2 rejected its arguments";
        if (st == FSDP_OK &&
            (got == FSDP_OK || !strstr(fsdp_last_error(ctx), says) || fsdp_test_now() - t0 > 5.0))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "one refuses: %s, message '%s' (want '%s')",
                           fsdp_status_to_string(got), fsdp_last_error(ctx), says);
        fsdp_tensor_free(mine);
    }
done:
    fsdp_tensor_free(shard);
    fsdp_tensor_free(square);
    fsdp_tensor_free(view);
    fsdp_tensor_free(base);
    fsdp_tensor_free(full);
    return st;
}

static void test_share_shards(void) {
    for (int i = 0; i < N_WORLD_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(world_sizes[i], 0, share_body, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(3, 0, share_refusals_body, NULL));
}

/* ---- groups ---- */

static fsdp_status sum_of_world_ranks(fsdp_ctx *ctx, fsdp_group *g, float *out) {
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 0, NULL, &t));
    fsdp_tensor_f32(t)[0] = (float)fsdp_ctx_rank(ctx);
    fsdp_status st = fsdp_all_reduce(ctx, g, t, FSDP_REDUCE_SUM);
    *out = fsdp_tensor_f32(t)[0];
    fsdp_tensor_free(t);
    return st;
}

static fsdp_status groups_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_group *world = fsdp_ctx_world_group(ctx), *parity = NULL, *listed = NULL, *none = NULL;
    FSDP_RANK_CHECK(ctx, fsdp_group_size(world) == 4 && fsdp_group_rank(world) == rank,
                    "world group: size %d rank %d", fsdp_group_size(world), fsdp_group_rank(world));
    FSDP_RANK_CHECK(ctx, strcmp(fsdp_group_label(world), "world") == 0, "world label %s",
                    fsdp_group_label(world));
    /* Parity groups, ordered by descending world rank through the key. */
    fsdp_status st = fsdp_group_split(ctx, NULL, rank % 2, -rank, "parity", &parity);
    if (st == FSDP_OK) st = fsdp_group_new(ctx, NULL, 3, (const int[]){3, 0, 1}, "listed", &listed);
    if (st == FSDP_OK)
        st = fsdp_group_split(ctx, NULL, rank == 2 ? 0 : FSDP_GROUP_NO_COLOR, 0, NULL, &none);
    float sum = 0;
    if (st == FSDP_OK) {
        int want_rank = rank < 2 ? 1 : 0; /* [2, 0] and [3, 1] */
        if (fsdp_group_size(parity) != 2 || fsdp_group_rank(parity) != want_rank ||
            fsdp_group_world_rank(parity, 0) != 2 + rank % 2 ||
            fsdp_group_world_rank(parity, 1) != rank % 2 ||
            strcmp(fsdp_group_label(parity), "parity") != 0)
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "parity group: size %d rank %d members %d %d",
                           fsdp_group_size(parity), fsdp_group_rank(parity),
                           fsdp_group_world_rank(parity, 0), fsdp_group_world_rank(parity, 1));
    }
    if (st == FSDP_OK) st = sum_of_world_ranks(ctx, parity, &sum);
    if (st == FSDP_OK && sum != (rank % 2 ? 4.0f : 2.0f))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "sum over the parity group is %g", sum);
    if (st == FSDP_OK && (rank == 2) != (listed == NULL))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "rank %d %s a listed group", rank,
                       listed ? "got" : "did not get");
    if (st == FSDP_OK && listed) {
        const int want[] = {3, 0, 1};
        for (int i = 0; i < 3; i++)
            if (fsdp_group_world_rank(listed, i) != want[i])
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "listed member %d is %d", i,
                               fsdp_group_world_rank(listed, i));
        if (st == FSDP_OK) st = sum_of_world_ranks(ctx, listed, &sum);
        if (st == FSDP_OK && sum != 4.0f)
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "sum over the listed group is %g", sum);
    }
    if (st == FSDP_OK && (rank == 2) != (none != NULL))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "rank %d: no-color split gave %p", rank,
                       (void *)none);
    if (st == FSDP_OK && none && (fsdp_group_size(none) != 1 || fsdp_group_rank(none) != 0))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "singleton group size %d", fsdp_group_size(none));
    fsdp_group_free(parity);
    fsdp_group_free(listed);
    fsdp_group_free(none);
    fsdp_group_free(world); /* borrowed: does nothing */
    return st;
}

static void test_groups(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 0, groups_body, NULL));
}

static void test_chunk_range(void) {
    int64_t off, len;
    const int64_t want13[4][2] = {{0, 4}, {4, 4}, {8, 4}, {12, 1}};
    for (int r = 0; r < 4; r++) {
        fsdp_chunk_range(13, 4, r, &off, &len);
        CU_ASSERT_EQUAL(off, want13[r][0]);
        CU_ASSERT_EQUAL(len, want13[r][1]);
    }
    /* 5 on 4 ranks: torch.chunk gives 2, 2, 1 and the fourth rank nothing */
    const int64_t want5[4][2] = {{0, 2}, {2, 2}, {4, 1}, {5, 0}};
    for (int r = 0; r < 4; r++) {
        fsdp_chunk_range(5, 4, r, &off, &len);
        CU_ASSERT_EQUAL(off, want5[r][0]);
        CU_ASSERT_EQUAL(len, want5[r][1]);
    }
    fsdp_chunk_range(2, 8, 7, &off, &len);
    CU_ASSERT_EQUAL(off, 2);
    CU_ASSERT_EQUAL(len, 0);
    fsdp_chunk_range(0, 3, 1, &off, &len);
    CU_ASSERT_EQUAL(len, 0);
}

/* ---- failures ---- */

static fsdp_status expect_failure(fsdp_ctx *ctx, fsdp_status got, fsdp_status want,
                                  const char *const *needles) {
    char msg[1024]; /* a copy: a failing check rewrites the context's message */
    snprintf(msg, sizeof msg, "%s", fsdp_last_error(ctx));
    FSDP_RANK_CHECK(ctx, got == want, "got %s, want %s (message: %s)", fsdp_status_to_string(got),
                    fsdp_status_to_string(want), msg);
    for (int i = 0; needles[i]; i++)
        FSDP_RANK_CHECK(ctx, strstr(msg, needles[i]), "message \"%s\" does not name \"%s\"", msg,
                        needles[i]);
    fsdp_clear_error(ctx);
    return FSDP_OK;
}

/* Ranks disagree on shape, then dtype, then the op: every rank fails with a message listing
 * each rank's value, and the group stays usable. */
static fsdp_status mismatch_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_tensor *a = NULL, *b = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2,
                                (const int64_t[]){4, rank == 1 ? 5 : 4}, &a));
    fsdp_status st = fsdp_tensor_create(ctx, rank == 0 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32, FSDP_CPU,
                                        1, (const int64_t[]){6}, &b);
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_all_reduce(ctx, NULL, a, FSDP_REDUCE_SUM), FSDP_ERR_SHAPE,
                            (const char *[]){"all_reduce", "'world' (world ranks 0,1,2)",
                                             "rank 0 (4, 4), rank 1 (4, 5), rank 2 (4, 4)", NULL});
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_broadcast(ctx, NULL, b, 0), FSDP_ERR_DTYPE,
                            (const char *[]){"rank 0 bf16, rank 1 f32, rank 2 f32", NULL});
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_broadcast(ctx, NULL, b, rank == 2 ? 1 : 0), FSDP_ERR_DTYPE,
                            (const char *[]){"dtype", NULL});
    if (st == FSDP_OK) {
        fsdp_status got =
            rank == 1 ? fsdp_barrier(ctx, NULL) : fsdp_all_reduce(ctx, NULL, b, FSDP_REDUCE_MAX);
        st = expect_failure(ctx, got, FSDP_ERR_COMM,
                            (const char *[]){"rank 0 all_reduce, rank 1 barrier, rank 2 "
                                             "all_reduce",
                                             "same collectives in the same order", NULL});
    }
    fsdp_tensor_free(b);
    b = NULL;
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){6}, &b);
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_broadcast(ctx, NULL, b, rank == 2 ? 1 : 0),
                            FSDP_ERR_INVALID_ARGUMENT,
                            (const char *[]){"the root", "rank 0 0, rank 1 0, rank 2 1", NULL});
    /* The group still works. */
    if (st == FSDP_OK) {
        fsdp_tensor_f32(b)[0] = (float)rank;
        st = fsdp_all_reduce(ctx, NULL, b, FSDP_REDUCE_SUM);
    }
    if (st == FSDP_OK && fsdp_tensor_f32(b)[0] != 3.0f)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "all_reduce after the failures gave %g",
                       fsdp_tensor_f32(b)[0]);
    fsdp_tensor_free(a);
    fsdp_tensor_free(b);
    return st;
}

static void test_mismatch_across_ranks(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 10000, mismatch_body, NULL));
}

/* Rank 2 passes a wrong input shape: it fails with its own message, the others fail at
 * once naming it (not after the 20 s timeout). */
static fsdp_status reject_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_tensor *in = NULL, *out = NULL;
    int64_t rows;
    fsdp_chunk_range(13, 4, rank, NULL, &rows);
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2,
                                (const int64_t[]){rank == 2 ? rows - 1 : rows, 2}, &in));
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){13, 2}, &out);
    double t0 = fsdp_test_now();
    if (st == FSDP_OK) {
        fsdp_status got = fsdp_all_gather(ctx, NULL, out, in, 0);
        if (rank == 2)
            st = expect_failure(ctx, got, FSDP_ERR_SHAPE,
                                (const char *[]){"the input is (3, 2) but must be (4, 2)",
                                                 "[8, 12) of 13 split among 4 ranks", NULL});
        else
            st = expect_failure(ctx, got, FSDP_ERR_SHAPE,
                                (const char *[]){"rank 2 rejected its arguments",
                                                 "(3, 2) but must be (4, 2)", NULL});
    }
    double waited = fsdp_test_now() - t0;
    if (st == FSDP_OK && waited > 10.0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the failure took %.1f s: it waited for a timeout",
                       waited);
    fsdp_tensor_free(in);
    fsdp_tensor_free(out);
    return st;
}

static void test_rank_rejects_arguments(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, reject_body, NULL));
}

/* ---- tensors on a device ---- */

#define SIM0 ((fsdp_device){FSDP_DEVICE_SIM, 0})

/* Every value of t is v. */
static fsdp_status all_equal(fsdp_ctx *ctx, const fsdp_tensor *t, float v, const char *what) {
    const float *x = fsdp_tensor_f32(t);
    for (int64_t i = 0; i < fsdp_tensor_numel(t); i++)
        FSDP_RANK_CHECK(ctx, x[i] == v, "%s: element %lld is %g, want %g", what, (long long)i, x[i],
                        v);
    return FSDP_OK;
}

/* Each public collective, every rank passing a tensor on sim:0 (the input or output of a pair,
 * the other on the CPU) while its context's device is the CPU: refused on every rank with its
 * own message before the rendezvous (local: collectives run on the rank's device, and
 * test_comm_device moves device tensors; mpi: no device tensors). */
static fsdp_status device_everywhere(fsdp_ctx *ctx, fsdp_tensor *cpu, fsdp_tensor *dev,
                                     fsdp_tensor *full, fsdp_tensor *full_dev,
                                     fsdp_comm_work *work) {
    const fsdp_reduce_options half = {.post_scale = 0.5f};
    const fsdp_reduce_op sum = FSDP_REDUCE_SUM;
    fsdp_status st = FSDP_OK;
    /* local: the rank's device is the CPU; mpi: no device tensors at all */
    const char *why = fsdp_test_mpi() ? "the mpi backend does not move sim tensors"
                                      : "this rank's device is cpu:0";
    const char *fix = fsdp_test_mpi() ? "the local backend" : "fsdp_ctx_set_device";
#define DEVICE(call, ...)                                                                          \
    if (st == FSDP_OK)                                                                             \
    st = expect_failure(                                                                           \
        ctx, (call), FSDP_ERR_DEVICE,                                                              \
        (const char *[]){"is on sim:0", why, fix, "fsdp_tensor_copy", __VA_ARGS__, NULL})
    DEVICE(fsdp_all_gather(ctx, NULL, full, dev, 0), "all_gather", "the input tensor");
    DEVICE(fsdp_all_gather(ctx, NULL, full_dev, cpu, 0), "all_gather", "the output tensor");
    DEVICE(fsdp_reduce_scatter(ctx, NULL, cpu, full_dev, 0, sum), "reduce_scatter", "input");
    DEVICE(fsdp_reduce_scatter_ex(ctx, NULL, dev, full, 0, sum, &half), "reduce_scatter",
           "the output tensor");
    DEVICE(fsdp_all_reduce(ctx, NULL, dev, sum), "all_reduce", "the given tensor");
    DEVICE(fsdp_all_reduce_ex(ctx, NULL, dev, sum, &half), "all_reduce", "the given tensor");
    DEVICE(fsdp_all_reduce_start(ctx, NULL, dev, sum, work), "all_reduce", "the given tensor");
    DEVICE(fsdp_all_reduce_start_ex(ctx, NULL, dev, sum, &half, work), "all_reduce", "given");
    DEVICE(fsdp_broadcast(ctx, NULL, dev, 0), "broadcast", "the given tensor");
    DEVICE(fsdp_all_to_all(ctx, NULL, full, full_dev, 0, 0), "all_to_all", "the input tensor");
#undef DEVICE
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, !fsdp_comm_work_pending(work), "a refused start left its work busy");
    return st;
}

/* Only rank 1's tensor is on sim:0: rank 1 fails with its own message, its peers at once with
 * the same status naming it, and nothing moves. */
static fsdp_status device_on_one(fsdp_ctx *ctx, int rank, fsdp_tensor *cpu, fsdp_tensor *dev,
                                 fsdp_tensor *full) {
    fsdp_tensor *mine = rank == 1 ? dev : cpu;
    const char *own[] = {"is on sim:0", "fsdp_tensor_copy", NULL};
    const char *peer[] = {"rank 1 rejected its arguments", "is on sim:0", NULL};
    const char *const *says = rank == 1 ? own : peer;
    double t0 = fsdp_test_now();
    fsdp_status st = expect_failure(ctx, fsdp_all_reduce(ctx, NULL, mine, FSDP_REDUCE_SUM),
                                    FSDP_ERR_DEVICE, says);
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_broadcast(ctx, NULL, mine, 0), FSDP_ERR_DEVICE, says);
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_all_gather(ctx, NULL, full, mine, 0), FSDP_ERR_DEVICE, says);
    double waited = fsdp_test_now() - t0;
    if (st == FSDP_OK && waited > 10.0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                       "the failures took %.1f s: they waited for a timeout", waited);
    return st;
}

static fsdp_status device_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int64_t n = 4, W = fsdp_world_size(fsdp_ctx_world(ctx)), wn = W * n;
    fsdp_tensor *cpu = NULL, *dev = NULL, *full = NULL, *full_dev = NULL;
    fsdp_comm_work *work = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &cpu);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, SIM0, 1, &n, &dev);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &wn, &full);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, SIM0, 1, &wn, &full_dev);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &work);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, cpu, (float)(rank + 1));
    if (st == FSDP_OK) st = device_everywhere(ctx, cpu, dev, full, full_dev, work);
    if (st == FSDP_OK) st = device_on_one(ctx, rank, cpu, dev, full);
    /* The CPU tensors given alongside are as they were, and the group still works. */
    if (st == FSDP_OK) st = all_equal(ctx, cpu, (float)(rank + 1), "this rank's tensor");
    if (st == FSDP_OK) st = all_equal(ctx, full, 0.0f, "the output");
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, cpu, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) st = all_equal(ctx, cpu, (float)(W * (W + 1) / 2), "the all_reduce after");
    fsdp_comm_work_free(work);
    fsdp_tensor_free(cpu);
    fsdp_tensor_free(dev);
    fsdp_tensor_free(full);
    fsdp_tensor_free(full_dev);
    return st;
}

static void test_device_tensors(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 20000, device_body, NULL));
}

/* Rank 3 skips an all_reduce (busy elsewhere for longer than the timeout): ranks 0-2 fail
 * with FSDP_ERR_TIMEOUT naming it, and the poisoned group then fails at once for rank 3. */
static fsdp_status skip_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){8}, &t));
    fsdp_status st = FSDP_OK;
    if (rank == 3) {
        nanosleep(&(struct timespec){.tv_nsec = 500 * 1000000L}, NULL);
        st = expect_failure(ctx, fsdp_barrier(ctx, NULL), FSDP_ERR_TIMEOUT,
                            (const char *[]){"barrier", "failed earlier", "timed out after 100 ms",
                                             "rank 3 did not arrive", NULL});
    } else {
        st = expect_failure(ctx, fsdp_all_reduce(ctx, NULL, t, FSDP_REDUCE_SUM), FSDP_ERR_TIMEOUT,
                            (const char *[]){"all_reduce on group 'world' (world ranks 0,1,2,3)",
                                             "timed out after 100 ms", "rank 3 did not arrive",
                                             "arrived: 0,1,2", "timeout_ms", NULL});
    }
    fsdp_tensor_free(t);
    return st;
}

static void test_timeout_names_missing_rank(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 100, skip_body, NULL));
}

/* Rank 2 returns without making the barrier: the others fail at once (FSDP_ERR_COMM) instead
 * of waiting out the 60 s timeout; a rank that returns an error is named with its message. */
static fsdp_status leave_body(fsdp_ctx *ctx, int rank, void *user) {
    const bool fail = user != NULL;
    if (rank == 2)
        return fail ? FSDP_FAIL(ctx, FSDP_ERR_CONFIG, "rank two's own trouble") : FSDP_OK;
    double t0 = fsdp_test_now();
    fsdp_status st = expect_failure(
        ctx, fsdp_barrier(ctx, NULL), FSDP_ERR_COMM,
        fail ? (const char *[]){"rank 2 will never arrive", "FSDP_ERR_CONFIG",
                                "rank two's own trouble", NULL}
             : (const char *[]){"barrier on group 'world'", "rank 2 will never arrive",
                                "returned FSDP_OK without making this call", NULL});
    FSDP_RANK_CHECK(ctx, fsdp_test_now() - t0 < 10.0, "waited %.1f s", fsdp_test_now() - t0);
    return st;
}

static void test_returned_rank_fails_peers(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 60000, leave_body, NULL));
    /* When rank 2 fails, fsdp_world_run reports its failure (the first) with its rank (under
     * MPI: in every process). */
    int first = 0;
    if (fsdp_test_hosted_ranks(3, &first) == 0) return;
    FSDP_TEST_FAILS(fsdp_test_run_world(3, 60000, leave_body, (void *)1), FSDP_ERR_CONFIG,
                    "rank 2: rank two's own trouble");
}

/* ---- non-blocking all_reduce ---- */

/* Checks t (every rank r held value(r + 1, e)) against the serial rank-order reduction,
 * bitwise. */
static fsdp_status check_reduced(fsdp_ctx *ctx, const fsdp_tensor *t, fsdp_reduce_op op,
                                 const char *what) {
    const fsdp_dtype dtype = fsdp_tensor_dtype(t);
    const void *ref = tab.reduce[dtype_index(dtype)][op]; /* serial_reduce(e, W, op, dtype) */
    const int64_t e = first_difference(t, ref);
    if (e >= 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s %s %s: element %lld is %.9g, want %.9g", what,
                         fsdp_reduce_op_to_string(op), fsdp_dtype_to_string(dtype), (long long)e,
                         get(t, e), get_at(dtype, ref, e));
    return FSDP_OK;
}

/* One round: every whole spec's all_reduce started, in flight together, with a blocking
 * all_reduce and an all_gather made between the starts, one work polled, then waited for in
 * reverse order; each result bitwise equal to the serial reduction (so to fsdp_all_reduce's). */
static fsdp_status start_round(fsdp_ctx *ctx, int rank, int W, fsdp_dtype dtype, fsdp_reduce_op op,
                               uint64_t *hash) {
    enum { N = N_WHOLE_SPECS };
    int64_t zero[FSDP_MAX_DIMS] = {0};
    fsdp_tensor *t[N] = {0}, *x = NULL, *g_in = NULL, *g_out = NULL;
    fsdp_comm_work *w[N] = {0};
    const spec *big = &whole_specs[N - 1];
    fsdp_status st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, big->ndim, big->shape, &x);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, 1, (const int64_t[]){3}, &g_in);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, 1, (const int64_t[]){3 * (int64_t)W}, &g_out);
    for (int i = 0; st == FSDP_OK && i < N; i++) {
        st = fsdp_tensor_create(ctx, dtype, FSDP_CPU, whole_specs[i].ndim, whole_specs[i].shape,
                                &t[i]);
        if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w[i]);
        if (st != FSDP_OK) break;
        fill_box(t[i], whole_specs[i].shape, zero, (uint64_t)rank + 1);
        st = fsdp_all_reduce_start(ctx, NULL, t[i], op, w[i]);
        /* MPI: in flight until waited for; local: complete at once. */
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, fsdp_comm_work_pending(w[i]) == fsdp_test_mpi(),
                            "work %d pending %d after its start", i,
                            (int)fsdp_comm_work_pending(w[i]));
        if (st == FSDP_OK && i == 1) { /* blocking calls while works are in flight */
            fill_box(x, big->shape, zero, (uint64_t)rank + 1);
            st = fsdp_all_reduce(ctx, NULL, x, op);
            if (st == FSDP_OK) st = check_reduced(ctx, x, op, "blocking all_reduce");
            for (int k = 0; k < 3 && st == FSDP_OK; k++)
                set(g_in, k, stored(dtype, (float)(rank * 3 + k)));
            if (st == FSDP_OK) st = fsdp_all_gather(ctx, NULL, g_out, g_in, 0);
            for (int k = 0; st == FSDP_OK && k < 3 * W; k++)
                FSDP_RANK_CHECK(ctx, get(g_out, k) == stored(dtype, (float)k),
                                "all_gather between starts: element %d is %g", k, get(g_out, k));
        }
    }
    if (st == FSDP_OK && w[0]) {
        bool done = false;
        st = fsdp_comm_work_test(ctx, w[0], &done);
        if (st == FSDP_OK && done)
            FSDP_RANK_CHECK(ctx, !fsdp_comm_work_pending(w[0]), "a work tested done is pending");
    }
    for (int i = N - 1; st == FSDP_OK && i >= 0; i--) {
        st = fsdp_comm_work_wait(ctx, w[i]);
        if (st == FSDP_OK) st = check_reduced(ctx, t[i], op, "all_reduce_start");
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, !fsdp_comm_work_pending(w[i]), "a work waited for is pending");
    }
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w[0]); /* idle: nothing to do */
    uint64_t h = 0;
    for (int i = 0; st == FSDP_OK && i < N; i++) h = h * 31 + hash_bytes(t[i]);
    *hash = h;
    for (int i = 0; i < N; i++) fsdp_comm_work_free(w[i]), fsdp_tensor_free(t[i]);
    fsdp_tensor_free(x), fsdp_tensor_free(g_in), fsdp_tensor_free(g_out);
    return st;
}

static fsdp_status all_reduce_start_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx)), c = 0;
    uint64_t hash[MAX_CASES];
    FSDP_RANK_CHECK(ctx, tab.reduce_W == W, "the references are of %d ranks", tab.reduce_W);
    for (int d = 0; d < 2; d++)
        for (int op = 0; op < FSDP_REDUCE_OP_COUNT; op++, c++)
            FSDP_TRY(start_round(ctx, rank, W, dtypes[d], (fsdp_reduce_op)op, &hash[c]));
    /* A work is reused; one still in flight is refused (every rank makes the same mistake
     * here, so the group stays usable). */
    fsdp_tensor *t = NULL, *u = NULL;
    fsdp_comm_work *w = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){8}, &t);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){8}, &u);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
    if (st == FSDP_OK && fsdp_comm_work_pending(w))
        st = expect_failure(ctx, fsdp_all_reduce_start(ctx, NULL, u, FSDP_REDUCE_SUM, w),
                            FSDP_ERR_STATE,
                            (const char *[]){"still in flight", "fsdp_comm_work_wait", NULL});
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, u, FSDP_REDUCE_SUM, w);
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    fsdp_comm_work_free(w), fsdp_tensor_free(t), fsdp_tensor_free(u);
    FSDP_TRY(st);
    sh->ncases[rank] = c;
    return share_hashes(ctx, rank, W, c, hash, sh);
}

static void test_all_reduce_start(void) {
    run_all_sizes(all_reduce_start_body, true, REFS_REDUCE);
}

/* Rank 2 starts an all_reduce and waits for it only 1.2 s later, past the 250 ms timeout:
 * under MPI ranks 0 and 1, whose data steps make no progress without it (nothing more comes
 * from it, or it takes nothing of theirs), fail with FSDP_ERR_TIMEOUT, and rank 2's wait then
 * fails on the poisoned group; on the local backend the call completed in the start, and with
 * the mpi backend's communication thread rank 2's thread moves it meanwhile: everyone
 * succeeds. Then rank 2 starts one and returns without waiting: the others' waits fail at once
 * naming it (MPI, with or without a thread: a rank's works are abandoned as it returns). */
/* What rank 2 leaves in flight when it returns without waiting (MPI: one process per rank). */
static fsdp_comm_work *left_behind_work;
static fsdp_tensor *left_behind_tensor;

static fsdp_status late_wait_body(fsdp_ctx *ctx, int rank, void *user) {
    const bool leave = user != NULL;
    fsdp_tensor *t = NULL;
    fsdp_comm_work *w = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){4096}, &t));
    fsdp_status st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
    const bool mpi = fsdp_test_mpi();
    if (st == FSDP_OK && rank == 2 && leave) {
        if (mpi) { /* kept (MPI may still read t); freeing the work would poison the group */
            left_behind_work = w, left_behind_tensor = t;
            return FSDP_OK;
        }
        fsdp_comm_work_free(w);
        fsdp_tensor_free(t);
        return FSDP_OK;
    }
    double t0 = fsdp_test_now();
    if (st == FSDP_OK && rank == 2)
        nanosleep(&(struct timespec){.tv_sec = 1, .tv_nsec = 200 * 1000000L}, NULL);
    if (st == FSDP_OK) {
        fsdp_status got = fsdp_comm_work_wait(ctx, w);
        /* With a communication thread rank 2's call moves while it sleeps. */
        if (!mpi || (!leave && fsdp_world_comm_thread(fsdp_ctx_world(ctx))))
            st = got;
        else if (leave)
            st = expect_failure(
                ctx, got, FSDP_ERR_COMM,
                (const char *[]){"all_reduce on group 'world'", "rank 2 will never arrive", NULL});
        else if (rank == 2)
            st = expect_failure(ctx, got, FSDP_ERR_TIMEOUT,
                                (const char *[]){"failed earlier", "timed out after 250 ms", NULL});
        else
            st = expect_failure(
                ctx, got, FSDP_ERR_TIMEOUT,
                (const char *[]){"all_reduce on group 'world' (world ranks 0,1,2)",
                                 "timed out after 250 ms without progress while moving data",
                                 NULL});
    }
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_test_now() - t0 < 10.0, "waited %.1f s", fsdp_test_now() - t0);
    fsdp_comm_work_free(w);
    fsdp_tensor_free(t);
    return st;
}

/* Ranks disagree on a non-blocking all_reduce (shape), then one starts one while another makes
 * a barrier: every rank fails with the message a blocking call gives (under MPI from its
 * wait, the start having returned at once), and the group and the work stay usable. */
static fsdp_status start_mismatch_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_tensor *t = NULL;
    fsdp_comm_work *w = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                (const int64_t[]){rank == 1 ? 5 : 4}, &t));
    fsdp_status st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) {
        fsdp_status got = fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
        if (got == FSDP_OK) got = fsdp_comm_work_wait(ctx, w);
        st = expect_failure(ctx, got, FSDP_ERR_SHAPE,
                            (const char *[]){"all_reduce", "'world' (world ranks 0,1,2)",
                                             "rank 0 (4), rank 1 (5), rank 2 (4)", NULL});
    }
    if (st == FSDP_OK) {
        fsdp_status got = rank == 1 ? fsdp_barrier(ctx, NULL)
                                    : fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
        if (got == FSDP_OK && rank != 1) got = fsdp_comm_work_wait(ctx, w);
        st = expect_failure(ctx, got, FSDP_ERR_COMM,
                            (const char *[]){"rank 0 all_reduce, rank 1 barrier, rank 2 "
                                             "all_reduce",
                                             NULL});
    }
    fsdp_tensor_free(t);
    t = NULL;
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){4}, &t);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, t, (float)(rank + 1));
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, get(t, 3) == 6.0f, "after the failures: the sum is %g, want 6",
                        get(t, 3));
    fsdp_comm_work_free(w);
    fsdp_tensor_free(t);
    return st;
}

static void test_all_reduce_start_mismatch(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 20000, start_mismatch_body, NULL));
}

/* Comm-debug counts a non-blocking all_reduce once, when it starts, and times its start and
 * its wait under that record, not under the call noted last (an all_gather made meanwhile). */
static fsdp_status start_timed_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    fsdp_tensor *t = NULL, *in = NULL, *out = NULL;
    fsdp_comm_work *w = NULL;
    fsdp_comm_filter ar = {.op = FSDP_COMM_ALL_REDUCE}, ag = {.op = FSDP_COMM_ALL_GATHER};
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){4096}, &t);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){2}, &in);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){2 * (int64_t)W},
                                &out);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, t, (float)rank);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, NULL, out, in, 0);
    double ar0 = fsdp_comm_debug_seconds(ctx, &ar), ag0 = fsdp_comm_debug_seconds(ctx, &ag);
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    double ar1 = fsdp_comm_debug_seconds(ctx, &ar), ag1 = fsdp_comm_debug_seconds(ctx, &ag);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx,
                        fsdp_comm_debug_query(ctx, &ar).calls == 1 && ar0 > 0 && ag1 == ag0 &&
                            (fsdp_test_mpi() ? ar1 > ar0 : ar1 == ar0),
                        "all_reduce: %lld calls, %.3g s after its start, %.3g s after its wait; "
                        "all_gather %.3g s then %.3g s",
                        (long long)fsdp_comm_debug_query(ctx, &ar).calls, ar0, ar1, ag0, ag1);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, get(t, 4095) == (float)(W * (W - 1) / 2), "the sum is %g",
                        get(t, 4095));
    fsdp_comm_work_free(w);
    fsdp_tensor_free(t), fsdp_tensor_free(in), fsdp_tensor_free(out);
    return st;
}

/* ---- every collective started on a work ---- */

/* Collective k on host tensors of this rank (0: all_gather along dim 1, 1: reduce_scatter along
 * dim 1, 2: reduce_scatter_ex with pre_scale and accumulate, 3: all_reduce_ex with post_scale,
 * 4: broadcast from the last rank, 5: all_to_all, 6: barrier, 7: all_gather along dim 0),
 * its tensors filled from `salt` (started_prepare), made blocking (work NULL) or started on work
 * (started_launch). */
#define N_KINDS 8
typedef struct started {
    fsdp_tensor *in, *out;
} started;

static fsdp_status started_prepare(fsdp_ctx *ctx, int k, int rank, int W, uint64_t salt,
                                   started *s) {
    const int64_t n = 2 * W + 1, zero[FSDP_MAX_DIMS] = {0};
    int64_t len = 0, whole[2] = {3, n}, piece[2] = {3, 0}, a2a[2] = {2 * W, 3}, rows[2] = {0, 5},
            rows_all[2] = {n, 5};
    fsdp_chunk_range(n, W, rank, NULL, &len);
    piece[1] = rows[0] = len;
    const int64_t *in_shape = k == 0 ? piece : k == 5 ? a2a : k == 7 ? rows : whole;
    const int64_t *out_shape = k == 1 || k == 2 ? piece : k == 5 ? a2a : k == 7 ? rows_all : whole;
    *s = (started){0};
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, in_shape, &s->in);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, out_shape, &s->out);
    if (st == FSDP_OK)
        fill_box(s->in, in_shape, zero, salt), fill_box(s->out, out_shape, zero, salt + 99);
    return st;
}

static void started_free(started *s) {
    fsdp_tensor_free(s->in), fsdp_tensor_free(s->out);
    *s = (started){0};
}

static fsdp_status started_launch(fsdp_ctx *ctx, int k, int W, const started *s,
                                  fsdp_comm_work *work) {
    const fsdp_reduce_options acc = {.pre_scale = 0.5f, .accumulate = true},
                              post = {.post_scale = 3};
    fsdp_tensor *in = s->in, *out = s->out;
    switch (k) {
    case 0:
    case 7:
        return work ? fsdp_all_gather_start(ctx, NULL, out, in, k == 0, work)
                    : fsdp_all_gather(ctx, NULL, out, in, k == 0);
    case 1:
        return work ? fsdp_reduce_scatter_start(ctx, NULL, out, in, 1, FSDP_REDUCE_SUM, work)
                    : fsdp_reduce_scatter(ctx, NULL, out, in, 1, FSDP_REDUCE_SUM);
    case 2:
        return work ? fsdp_reduce_scatter_start_ex(ctx, NULL, out, in, 1, FSDP_REDUCE_AVG, &acc,
                                                   work)
                    : fsdp_reduce_scatter_ex(ctx, NULL, out, in, 1, FSDP_REDUCE_AVG, &acc);
    case 3:
        return work ? fsdp_all_reduce_start_ex(ctx, NULL, out, FSDP_REDUCE_SUM, &post, work)
                    : fsdp_all_reduce_ex(ctx, NULL, out, FSDP_REDUCE_SUM, &post);
    case 4:
        return work ? fsdp_broadcast_start(ctx, NULL, out, W - 1, work)
                    : fsdp_broadcast(ctx, NULL, out, W - 1);
    case 5:
        return work ? fsdp_all_to_all_start(ctx, NULL, out, in, 0, 0, work)
                    : fsdp_all_to_all(ctx, NULL, out, in, 0, 0);
    default:
        return work ? fsdp_barrier_start(ctx, NULL, work) : fsdp_barrier(ctx, NULL);
    }
}

/* Whether the mpi backend leaves collective k's start in flight (its non-blocking calls). */
static bool mpi_in_flight(int k) {
    return k <= 3 || k == 7;
}

/* This rank's newest flight-recorder record without its numbers and times: "all_gather on group
 * 'world' (world ranks 0,1) of (3, 7) f32 ...: done" (into out). */
static fsdp_status trace_last(fsdp_ctx *ctx, char *out, size_t size) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "open_memstream failed");
    fsdp_status st = fsdp_comm_trace_print(ctx, 1, f);
    fclose(f);
    out[0] = '\0';
    const char *call = buf ? strstr(buf, ": ") : NULL, *number = call ? strstr(call, " #") : NULL;
    const char *state = buf ? strrchr(buf, ':') : NULL;
    if (st == FSDP_OK && call && number && state && state > number) {
        const char *rest = number + 2 + strspn(number + 2, "0123456789");
        snprintf(out, size, "%.*s%.*s:%.*s", (int)(number - call - 2), call + 2,
                 (int)(state - rest), rest, (int)strcspn(state + 1, "0123456789"), state + 1);
    } else if (st == FSDP_OK) {
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "unexpected flight-recorder line: %s",
                       buf ? buf : "(none)");
    }
    free(buf);
    return st;
}

/* Collective k blocking or started, then tested and waited for. The output's bytes hash into
 * *hash; *pending: whether the work was in flight after the start; its flight-recorder record
 * (trace_last) into trace, when not NULL. */
static fsdp_status started_call(fsdp_ctx *ctx, int k, int rank, int W, uint64_t salt,
                                fsdp_comm_work *work, uint64_t *hash, bool *pending, char *trace,
                                size_t trace_size) {
    started s;
    fsdp_status st = started_prepare(ctx, k, rank, W, salt, &s);
    *pending = false;
    if (st == FSDP_OK) st = started_launch(ctx, k, W, &s, work);
    if (st == FSDP_OK && work) {
        bool done = false;
        *pending = fsdp_comm_work_pending(work);
        st = fsdp_comm_work_test(ctx, work, &done);
        if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, work);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, !fsdp_comm_work_pending(work), "a work waited for is pending");
    }
    if (st == FSDP_OK) *hash = hash_bytes(s.out);
    if (st == FSDP_OK && trace) st = trace_last(ctx, trace, trace_size);
    started_free(&s);
    return st;
}

/* Every collective's start on host tensors against its blocking call with the same inputs:
 * the output bit for bit, the comm-debug counts of every op and the flight recorder's record
 * (but its numbers and times) equal; the work is complete when
 * the start returns (the local backend's host calls, and the mpi backend's broadcast,
 * all_to_all and barrier), or in flight until tested or waited for (the mpi backend's
 * all_gather, reduce_scatter(_ex) and all_reduce(_ex)). Then, where a work is in flight (MPI),
 * every other start on it is refused naming the call in flight, on every rank alike, and the
 * call still completes right. */
static fsdp_status every_start_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    fsdp_comm_work *w = NULL;
    FSDP_TRY(fsdp_comm_work_create(ctx, &w));
    fsdp_status st = FSDP_OK;
    for (int k = 0; k < N_KINDS && st == FSDP_OK; k++) {
        uint64_t hash[2] = {0};
        bool pending[2] = {false};
        char trace[2][FSDP_ERROR_MAX];
        fsdp_comm_count count[2][FSDP_COMM_OP_COUNT];
        for (int i = 0; i < 2 && st == FSDP_OK; i++) {
            st = fsdp_comm_debug_begin(ctx);
            if (st == FSDP_OK)
                st = started_call(ctx, k, rank, W, (uint64_t)(rank * 11 + k + 1), i ? w : NULL,
                                  &hash[i], &pending[i], trace[i], sizeof trace[i]);
            for (int op = 0; op < FSDP_COMM_OP_COUNT; op++)
                count[i][op] = fsdp_comm_debug_count(ctx, (fsdp_comm_op)op, NULL);
            fsdp_status end = fsdp_comm_debug_end(ctx);
            if (st == FSDP_OK) st = end;
        }
        if (st != FSDP_OK) break;
        FSDP_RANK_CHECK(ctx, hash[0] == hash[1],
                        "collective %d: the start's output differs from "
                        "the blocking call's",
                        k);
        FSDP_RANK_CHECK(ctx, strcmp(trace[0], trace[1]) == 0 && strstr(trace[0], ": done"),
                        "collective %d: flight recorder \"%s\" blocking, \"%s\" started", k,
                        trace[0], trace[1]);
        const bool in_flight = fsdp_test_mpi() && mpi_in_flight(k);
        FSDP_RANK_CHECK(ctx, pending[1] == in_flight,
                        "collective %d: the work was %spending after "
                        "its start",
                        k, pending[1] ? "" : "not ");
        for (int op = 0; op < FSDP_COMM_OP_COUNT; op++)
            FSDP_RANK_CHECK(ctx,
                            count[0][op].calls == count[1][op].calls &&
                                count[0][op].bytes == count[1][op].bytes,
                            "collective %d: comm-debug %s %lld calls, %lld bytes blocking; %lld, "
                            "%lld started",
                            k, fsdp_comm_op_to_string((fsdp_comm_op)op),
                            (long long)count[0][op].calls, (long long)count[0][op].bytes,
                            (long long)count[1][op].calls, (long long)count[1][op].bytes);
    }
    fsdp_tensor *t = NULL;
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){W}, &t);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, t, (float)rank);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, FSDP_REDUCE_SUM, w);
    if (st == FSDP_OK && fsdp_comm_work_pending(w)) {
        const char *says[] = {"still in flight", "a all_reduce on group", "fsdp_comm_work_wait",
                              NULL};
        fsdp_tensor *u = NULL;
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){1}, &u);
        if (st == FSDP_OK)
            st = expect_failure(ctx,
                                fsdp_reduce_scatter_start(ctx, NULL, u, t, 0, FSDP_REDUCE_SUM, w),
                                FSDP_ERR_STATE, says);
        fsdp_tensor_free(u);
        st =
            expect_failure(ctx, fsdp_all_gather_start(ctx, NULL, t, t, 0, w), FSDP_ERR_STATE, says);
        if (st == FSDP_OK)
            st =
                expect_failure(ctx, fsdp_broadcast_start(ctx, NULL, t, 0, w), FSDP_ERR_STATE, says);
        if (st == FSDP_OK)
            st = expect_failure(ctx, fsdp_barrier_start(ctx, NULL, w), FSDP_ERR_STATE, says);
    }
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    for (int64_t i = 0; st == FSDP_OK && i < W; i++)
        FSDP_RANK_CHECK(ctx, fsdp_tensor_f32(t)[i] == (float)(W * (W - 1) / 2),
                        "the all_reduce left element %lld %g", (long long)i,
                        (double)fsdp_tensor_f32(t)[i]);
    fsdp_tensor_free(t);
    fsdp_comm_work_free(w);
    sh->ncases[rank] = N_KINDS;
    return st;
}

static void test_every_start(void) {
    run_all_sizes(every_start_body, false, REFS_NONE);
}

/* Several non-blocking calls in flight on one group: all_gathers (along a contiguous dim and a
 * strided one), reduce_scatters (plain and fused) and a fused all_reduce, started in turn with a
 * blocking all_gather and a test of the first work between, then waited for out of start
 * order; each output bit for bit its blocking call's with the same inputs (made first), and
 * each work in flight after its start under MPI. */
#define N_MIXED 6
static const int mixed_kinds[N_MIXED] = {0, 1, 7, 3, 2, 0};
static const int mixed_order[N_MIXED] = {3, 5, 0, 2, 4, 1};

static fsdp_status starts_in_flight_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    uint64_t want[N_MIXED] = {0}, between = 0;
    started s[N_MIXED] = {0};
    fsdp_comm_work *w[N_MIXED] = {0};
    fsdp_status st = FSDP_OK;
    for (int i = 0; i < N_MIXED && st == FSDP_OK; i++) {
        st = started_prepare(ctx, mixed_kinds[i], rank, W, (uint64_t)(rank * 7 + i + 1), &s[i]);
        if (st == FSDP_OK) st = started_launch(ctx, mixed_kinds[i], W, &s[i], NULL);
        if (st == FSDP_OK) want[i] = hash_bytes(s[i].out);
        started_free(&s[i]);
    }
    for (int i = 0; i < N_MIXED && st == FSDP_OK; i++) {
        st = started_prepare(ctx, mixed_kinds[i], rank, W, (uint64_t)(rank * 7 + i + 1), &s[i]);
        if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w[i]);
        if (st == FSDP_OK) st = started_launch(ctx, mixed_kinds[i], W, &s[i], w[i]);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, fsdp_comm_work_pending(w[i]) == fsdp_test_mpi(),
                            "work %d (collective %d) pending %d after its start", i, mixed_kinds[i],
                            (int)fsdp_comm_work_pending(w[i]));
        bool pending = false, done = false;
        if (st == FSDP_OK && i == 2) /* a blocking call while works are in flight */
            st = started_call(ctx, 7, rank, W, 77, NULL, &between, &pending, NULL, 0);
        if (st == FSDP_OK && i == 3) st = fsdp_comm_work_test(ctx, w[0], &done);
    }
    for (int j = 0; j < N_MIXED && st == FSDP_OK; j++) {
        const int i = mixed_order[j];
        st = fsdp_comm_work_wait(ctx, w[i]);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, !fsdp_comm_work_pending(w[i]) && hash_bytes(s[i].out) == want[i],
                            "work %d (collective %d), waited for %d-th: its output differs from "
                            "the blocking call's",
                            i, mixed_kinds[i], j);
    }
    for (int i = 0; i < N_MIXED; i++) fsdp_comm_work_free(w[i]), started_free(&s[i]);
    sh->ncases[rank] = N_MIXED;
    return st;
}

static void test_starts_in_flight(void) {
    run_all_sizes(starts_in_flight_body, false, REFS_NONE);
}

/* Some ranks start a call and the others make it blocking, as PyTorch lets one rank pass
 * async_op=True where another does not: all_gather (along dims 1 and 0), reduce_scatter (plain
 * and fused) and a fused all_reduce. Round 0: every rank blocking (the reference); round 1: rank
 * 0 starts each call and waits for it at once; round 2: rank 0 starts them all, then waits in
 * reverse order; round 3: every rank but rank 0 does that, rank 0 blocking; round 4: blocking
 * calls while works are in flight (meet_in_between). Each output bit for bit round 0's with the
 * same inputs. (Under MPI a blocking call and a started one must move
 * their data with the same messages, or they wait for each other until the timeout.) */
#define N_MEET 5
static const int meet_kinds[N_MEET] = {0, 7, 1, 2, 3};

/* Round 4: every rank starts call i; rank 0 waits for it at once, the others first make call
 * i+1 (mod N_MEET) blocking, then wait. (Under MPI rank 0's wait moves call i's data while the
 * others' blocking call must move call i's before its own, as every rank posts the data of one
 * group's calls in start order.) */
static fsdp_status meet_in_between(fsdp_ctx *ctx, int rank, int W, fsdp_comm_work **w,
                                   const uint64_t *want) {
    fsdp_status st = FSDP_OK;
    for (int i = 0; i < N_MEET && st == FSDP_OK; i++) {
        const int j = (i + 1) % N_MEET;
        started a, b = {0};
        st = started_prepare(ctx, meet_kinds[i], rank, W, (uint64_t)(rank * 5 + i + 1), &a);
        if (st == FSDP_OK) st = started_launch(ctx, meet_kinds[i], W, &a, w[i]);
        if (st == FSDP_OK && rank == 0) st = fsdp_comm_work_wait(ctx, w[i]);
        if (st == FSDP_OK)
            st = started_prepare(ctx, meet_kinds[j], rank, W, (uint64_t)(rank * 5 + j + 1), &b);
        if (st == FSDP_OK) st = started_launch(ctx, meet_kinds[j], W, &b, NULL);
        if (st == FSDP_OK && rank != 0) st = fsdp_comm_work_wait(ctx, w[i]);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, hash_bytes(a.out) == want[i] && hash_bytes(b.out) == want[j],
                            "round 4, collectives %d (started) and %d (blocking): an output "
                            "differs from the all-blocking call's",
                            meet_kinds[i], meet_kinds[j]);
        started_free(&a), started_free(&b);
    }
    return st;
}

static fsdp_status start_meets_blocking_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    uint64_t want[N_MEET] = {0};
    started s[N_MEET] = {0};
    fsdp_comm_work *w[N_MEET] = {0};
    fsdp_status st = FSDP_OK;
    for (int i = 0; i < N_MEET && st == FSDP_OK; i++) st = fsdp_comm_work_create(ctx, &w[i]);
    for (int round = 0; round < 4 && st == FSDP_OK; round++) {
        const bool starts = round == 1 || round == 2 ? rank == 0 : round == 3 && rank != 0;
        for (int i = 0; i < N_MEET && st == FSDP_OK; i++) {
            const int k = meet_kinds[i];
            st = started_prepare(ctx, k, rank, W, (uint64_t)(rank * 5 + i + 1), &s[i]);
            if (st == FSDP_OK) st = started_launch(ctx, k, W, &s[i], starts ? w[i] : NULL);
            if (st == FSDP_OK && starts && round == 1) st = fsdp_comm_work_wait(ctx, w[i]);
        }
        for (int i = N_MEET - 1; i >= 0 && st == FSDP_OK; i--) {
            if (starts && round >= 2) st = fsdp_comm_work_wait(ctx, w[i]);
            if (st == FSDP_OK && round == 0) want[i] = hash_bytes(s[i].out);
            if (st == FSDP_OK)
                FSDP_RANK_CHECK(ctx, hash_bytes(s[i].out) == want[i],
                                "round %d, collective %d (%s on this rank): its output differs "
                                "from the all-blocking call's",
                                round, meet_kinds[i], starts ? "started" : "blocking");
        }
        for (int i = 0; i < N_MEET; i++) started_free(&s[i]);
    }
    if (st == FSDP_OK) st = meet_in_between(ctx, rank, W, w, want);
    for (int i = 0; i < N_MEET; i++) fsdp_comm_work_free(w[i]), started_free(&s[i]);
    sh->ncases[rank] = N_MEET;
    return st;
}

static void test_start_meets_blocking(void) {
    shared *sh = calloc(1, sizeof *sh);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sh);
    for (int i = 0; i < N_WORLD_SIZES; i++) {
        const int W = world_sizes[i];
        memset(sh, 0, sizeof *sh);
        /* 20 s: a wait that ends by the timeout is the failure this case guards against */
        FSDP_TEST_OK(fsdp_test_run_world(W, 20000, start_meets_blocking_body, sh));
        int first = 0, count = fsdp_test_hosted_ranks(W, &first);
        for (int me = first; me < first + count; me++) CU_ASSERT_EQUAL(sh->ncases[me], N_MEET);
    }
    free(sh);
}

/* Ranks disagree on a started all_gather: rank 1 starts a reduce_scatter instead, then gathers a
 * piece of another shape; every rank fails with the message the blocking calls give (the same
 * text from the group on; under MPI from its wait, the start having returned at once), and the
 * group and the work stay usable. */
static fsdp_status mismatched_gather(fsdp_ctx *ctx, int rank, int W, int round,
                                     fsdp_comm_work *work) {
    const bool odd = rank == 1;
    const int64_t n = round == 1 && odd ? 3 : 2;
    fsdp_tensor *in = NULL, *out = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                        (const int64_t[]){round == 0 && odd ? n * W : n}, &in);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                (const int64_t[]){round == 0 && odd ? n : n * W}, &out);
    if (st == FSDP_OK) {
        if (round == 0 && odd)
            st = work ? fsdp_reduce_scatter_start(ctx, NULL, out, in, 0, FSDP_REDUCE_SUM, work)
                      : fsdp_reduce_scatter(ctx, NULL, out, in, 0, FSDP_REDUCE_SUM);
        else
            st = work ? fsdp_all_gather_start(ctx, NULL, out, in, 0, work)
                      : fsdp_all_gather(ctx, NULL, out, in, 0);
        if (st == FSDP_OK && work) st = fsdp_comm_work_wait(ctx, work);
    }
    fsdp_tensor_free(in), fsdp_tensor_free(out);
    return st;
}

static fsdp_status start_mismatch_gather_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_status want[2] = {FSDP_ERR_COMM, FSDP_ERR_SHAPE};
    const char *says[2] = {"rank 0 all_gather, rank 1 reduce_scatter, rank 2 all_gather",
                           "rank 0 (6), rank 1 (9), rank 2 (6)"};
    fsdp_comm_work *w = NULL;
    FSDP_TRY(fsdp_comm_work_create(ctx, &w));
    fsdp_status st = FSDP_OK;
    for (int round = 0; round < 2 && st == FSDP_OK; round++) {
        char blocking[FSDP_ERROR_MAX];
        fsdp_status got = mismatched_gather(ctx, rank, W, round, NULL);
        snprintf(blocking, sizeof blocking, "%s", fsdp_last_error(ctx));
        st = expect_failure(ctx, got, want[round], (const char *[]){says[round], NULL});
        if (st != FSDP_OK) break;
        got = mismatched_gather(ctx, rank, W, round, w);
        /* From the group on: the call named first may be any rank's on the local backend. */
        const char *from = strstr(blocking, " on group ");
        st = expect_failure(ctx, got, want[round], (const char *[]){from ? from : blocking, NULL});
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, !fsdp_comm_work_pending(w), "a failed work is pending");
    }
    uint64_t hash = 0;
    bool pending = false;
    if (st == FSDP_OK) st = started_call(ctx, 0, rank, W, 5, w, &hash, &pending, NULL, 0);
    fsdp_comm_work_free(w);
    return st;
}

static void test_start_mismatch_gather(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 20000, start_mismatch_gather_body, NULL));
}

/* Rank 2 never starts the all_gather the others started (busy for longer than the 250 ms
 * timeout): their waits (the local backend: their starts, which make the call) fail with
 * FSDP_ERR_TIMEOUT naming the call and rank 2 instead of hanging; rank 2's start then fails at
 * once on the poisoned group. */
static fsdp_status gather_never_started_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    fsdp_tensor *in = NULL, *out = NULL;
    fsdp_comm_work *w = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){64}, &in));
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){64 * W}, &out);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w);
    const double t0 = fsdp_test_now();
    if (st == FSDP_OK && rank == 2) {
        fsdp_test_sleep_ms(1200);
        st = expect_failure(ctx, fsdp_all_gather_start(ctx, NULL, out, in, 0, w), FSDP_ERR_TIMEOUT,
                            (const char *[]){"all_gather", "failed earlier",
                                             "timed out after 250 ms", "rank 2 did not arrive",
                                             NULL});
    } else if (st == FSDP_OK) {
        fsdp_status got = fsdp_all_gather_start(ctx, NULL, out, in, 0, w);
        if (got == FSDP_OK)
            FSDP_RANK_CHECK(ctx, fsdp_comm_work_pending(w) == fsdp_test_mpi(),
                            "pending %d after the start", (int)fsdp_comm_work_pending(w));
        if (got == FSDP_OK) got = fsdp_comm_work_wait(ctx, w);
        st = expect_failure(ctx, got, FSDP_ERR_TIMEOUT,
                            (const char *[]){"all_gather on group 'world' (world ranks 0,1,2)",
                                             "timed out after 250 ms", "rank 2 did not arrive",
                                             NULL});
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, fsdp_test_now() - t0 < 10.0, "waited %.1f s",
                            fsdp_test_now() - t0);
    }
    fsdp_comm_work_free(w);
    fsdp_tensor_free(in), fsdp_tensor_free(out);
    return st;
}

static void test_gather_never_started(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 250, gather_never_started_body, NULL));
}

/* With the communication thread (the mpi backend with comm_thread, or FSDP_COMM_THREAD=1 as
 * CTest's test_comm_thread_mpi* entries set), a started all_gather of 4 MiB per rank and a fused
 * reduce_scatter of as much complete while the rank sleeps and makes no call: the first
 * fsdp_comm_work_test after the sleep reports both done. The outputs are bitwise the blocking
 * calls' with or without a thread (without one, nothing moves during the sleep, and the test
 * and wait move it afterwards). */
#define MOVED_ELEMS (1 << 20)
static fsdp_status thread_moves_data_body(fsdp_ctx *ctx, int rank, void *user) {
    shared *sh = user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const bool thread = fsdp_world_comm_thread(fsdp_ctx_world(ctx));
    const fsdp_reduce_options fuse = {.pre_scale = 0.25f, .accumulate = true};
    fsdp_tensor *g_in = NULL, *g_out = NULL, *r_in = NULL, *r_out = NULL;
    fsdp_comm_work *w[2] = {0};
    uint64_t want[2] = {0};
    const int64_t zero[FSDP_MAX_DIMS] = {0}, piece[1] = {MOVED_ELEMS},
                  whole[1] = {(int64_t)W * MOVED_ELEMS};
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, piece, &g_in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, whole, &g_out);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, whole, &r_in);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, piece, &r_out);
    for (int i = 0; i < 2 && st == FSDP_OK; i++) st = fsdp_comm_work_create(ctx, &w[i]);
    for (int pass = 0; pass < 2 && st == FSDP_OK; pass++) {
        fill_box(g_in, piece, zero, (uint64_t)rank + 3);
        fill_box(r_in, whole, zero, (uint64_t)rank + 5);
        fill_box(r_out, piece, zero, 9);
        if (pass == 0) { /* the blocking calls */
            st = fsdp_all_gather(ctx, NULL, g_out, g_in, 0);
            if (st == FSDP_OK)
                st = fsdp_reduce_scatter_ex(ctx, NULL, r_out, r_in, 0, FSDP_REDUCE_SUM, &fuse);
            want[0] = hash_bytes(g_out), want[1] = hash_bytes(r_out);
            continue;
        }
        st = fsdp_barrier(ctx, NULL); /* the ranks start together (filling takes a while) */
        if (st == FSDP_OK) st = fsdp_all_gather_start(ctx, NULL, g_out, g_in, 0, w[0]);
        if (st == FSDP_OK)
            st = fsdp_reduce_scatter_start_ex(ctx, NULL, r_out, r_in, 0, FSDP_REDUCE_SUM, &fuse,
                                              w[1]);
        if (st != FSDP_OK) break;
        /* computing: no call into the library (without the thread nothing moves meanwhile, so
         * the sleep would only wait) */
        if (thread) fsdp_test_sleep_ms(1000);
        bool done[2] = {false, false};
        for (int i = 0; i < 2 && st == FSDP_OK; i++) st = fsdp_comm_work_test(ctx, w[i], &done[i]);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, !thread || (done[0] && done[1]),
                            "with the communication thread, 1 s after their starts: all_gather "
                            "done %d, reduce_scatter done %d at the first test",
                            (int)done[0], (int)done[1]);
        for (int i = 0; i < 2 && st == FSDP_OK; i++) st = fsdp_comm_work_wait(ctx, w[i]);
        if (st == FSDP_OK)
            FSDP_RANK_CHECK(ctx, hash_bytes(g_out) == want[0] && hash_bytes(r_out) == want[1],
                            "started (thread %d): all_gather %s, reduce_scatter %s the blocking "
                            "call's",
                            (int)thread, hash_bytes(g_out) == want[0] ? "equals" : "differs from",
                            hash_bytes(r_out) == want[1] ? "equals" : "differs from");
    }
    for (int i = 0; i < 2; i++) fsdp_comm_work_free(w[i]);
    fsdp_tensor_free(g_in), fsdp_tensor_free(g_out), fsdp_tensor_free(r_in),
        fsdp_tensor_free(r_out);
    sh->ncases[rank] = 1;
    return st;
}

static void test_thread_moves_data(void) {
    shared *sh = calloc(1, sizeof *sh);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sh);
    for (int W = 1; W <= 3; W++)
        FSDP_TEST_OK(fsdp_test_run_world(W, 0, thread_moves_data_body, sh));
    free(sh);
}

static void test_all_reduce_start_timed(void) {
    for (int w = 1; w <= 3; w++) FSDP_TEST_OK(fsdp_test_run_world(w, 0, start_timed_body, NULL));
}

static void test_work_wait_fails_not_hangs(void) {
    FSDP_TEST_OK(fsdp_test_run_world(3, 250, late_wait_body, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(3, 60000, late_wait_body, (void *)1));
    /* The run is over: its groups (and the work's pending call) are gone. */
    fsdp_comm_work_free(left_behind_work);
    fsdp_tensor_free(left_behind_tensor);
    left_behind_work = NULL, left_behind_tensor = NULL;
}

/* Bad arguments on one rank: each is refused with its message, and the group stays usable. */
static fsdp_status bad_args_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_tensor *a = NULL, *b = NULL, *h = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){4, 3}, &a));
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (const int64_t[]){4, 3}, &b);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 2, (const int64_t[]){4, 3}, &h);
#define EXPECT(call, want, needle)                                                                 \
    if (st == FSDP_OK) st = expect_failure(ctx, (call), (want), (const char *[]){(needle), NULL})
    EXPECT(fsdp_all_gather(ctx, NULL, a, b, 2), FSDP_ERR_INVALID_ARGUMENT, "dim 2 is out of range");
    EXPECT(fsdp_all_gather(ctx, NULL, a, h, 0), FSDP_ERR_DTYPE,
           "the input is bf16 and the output f32");
    EXPECT(fsdp_all_gather(ctx, NULL, a, NULL, 0), FSDP_ERR_INVALID_ARGUMENT,
           "fsdp_all_gather: in is NULL");
    EXPECT(fsdp_reduce_scatter(ctx, NULL, a, a, 0, FSDP_REDUCE_SUM), FSDP_ERR_INVALID_ARGUMENT,
           "overlaps");
    EXPECT(fsdp_reduce_scatter(ctx, NULL, a, b, 0, (fsdp_reduce_op)7), FSDP_ERR_INVALID_ARGUMENT,
           "unknown reduction 7");
    EXPECT(fsdp_broadcast(ctx, NULL, a, 1), FSDP_ERR_INVALID_ARGUMENT,
           "root 1 is not a group rank");
    EXPECT(fsdp_all_to_all(ctx, NULL, a, b, 0, -3), FSDP_ERR_INVALID_ARGUMENT, "concat_dim -3");
    EXPECT(fsdp_tensor_resize(ctx, b, 2, (const int64_t[]){4, 4}) == FSDP_OK
               ? fsdp_all_to_all(ctx, NULL, b, a, 1, 0)
               : FSDP_ERR_INTERNAL,
           FSDP_ERR_SHAPE, "the output is (4, 4) but must be (4, 3)");
    EXPECT(fsdp_reduce_scatter(ctx, NULL, b, a, 1, FSDP_REDUCE_AVG), FSDP_ERR_SHAPE,
           "the output is (4, 4) but must be (4, 3): the input (4, 3) with dim 1 cut");
    EXPECT(fsdp_tensor_resize(ctx, b, 2, (const int64_t[]){4, 3}) == FSDP_OK
               ? fsdp_all_to_all(ctx, NULL, b, a, 0, 0)
               : FSDP_ERR_INTERNAL,
           FSDP_OK, "");
#undef EXPECT
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, NULL, a, b, 0); /* still usable */
    fsdp_tensor_free(a);
    fsdp_tensor_free(b);
    fsdp_tensor_free(h);
    return st;
}

static void test_bad_arguments(void) {
    FSDP_TEST_OK(fsdp_test_run_world(1, 5000, bad_args_body, NULL));
}

/* Integers move exactly: 64-bit values beyond every float's mantissa through
 * fsdp_all_gather_u64 (2 i32 per value), i32 tensors through broadcast and all_to_all; the
 * reductions refuse i32, naming the collectives that take it. */
static fsdp_status integers_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    int W = fsdp_world_size(fsdp_ctx_world(ctx));
    enum { N = 3 };
    uint64_t mine[N] = {UINT64_MAX - (uint64_t)rank, ((uint64_t)rank << 53) | 1u,
                        0x8000000000000001ull ^ (uint64_t)rank};
    uint64_t all[N * 8];
    FSDP_TRY(fsdp_all_gather_u64(ctx, NULL, mine, N, all));
    for (int r = 0; r < W; r++) {
        FSDP_RANK_CHECK(ctx, all[r * N] == UINT64_MAX - (uint64_t)r, "value 0 of rank %d", r);
        FSDP_RANK_CHECK(ctx, all[r * N + 1] == (((uint64_t)r << 53) | 1u), "value 1 of rank %d", r);
        FSDP_RANK_CHECK(ctx, all[r * N + 2] == (0x8000000000000001ull ^ (uint64_t)r),
                        "value 2 of rank %d", r);
    }
    FSDP_TRY(fsdp_all_gather_u64(ctx, NULL, mine, 0, all)); // nothing to gather
    fsdp_tensor *t = NULL, *a = NULL, *b = NULL;
    const int64_t n = 2 * W;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, &n, &t);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, &n, &a);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, &n, &b);
    int32_t *pt = st == FSDP_OK ? fsdp_tensor_data(t) : NULL, *pa = NULL, *pb = NULL;
    if (pt) {
        pa = fsdp_tensor_data(a), pb = fsdp_tensor_data(b);
        for (int64_t i = 0; i < n; i++) {
            pt[i] = rank == W - 1 ? INT32_MIN + (int32_t)i : 0;
            pa[i] = rank * 1000 + (int32_t)i; // piece i / 2 goes to rank i / 2
        }
        st = fsdp_broadcast(ctx, NULL, t, W - 1);
    }
    for (int64_t i = 0; st == FSDP_OK && i < n; i++)
        FSDP_RANK_CHECK(ctx, pt[i] == INT32_MIN + (int32_t)i, "broadcast element %lld",
                        (long long)i);
    if (st == FSDP_OK) st = fsdp_all_to_all(ctx, NULL, b, a, 0, 0);
    for (int64_t i = 0; st == FSDP_OK && i < n; i++) // from rank i / 2, its piece `rank`
        FSDP_RANK_CHECK(ctx, pb[i] == (int32_t)(i / 2) * 1000 + 2 * rank + (int32_t)(i % 2),
                        "all_to_all element %lld", (long long)i);
    if (st == FSDP_OK) {
        fsdp_status refused = fsdp_all_reduce(ctx, NULL, t, FSDP_REDUCE_SUM);
        FSDP_RANK_CHECK(ctx,
                        refused == FSDP_ERR_DTYPE &&
                            strstr(fsdp_last_error(ctx), "i32 only moves in all_gather"),
                        "all_reduce of i32: %s", fsdp_last_error(ctx));
        fsdp_clear_error(ctx);
        st = fsdp_barrier(ctx, NULL); // the group is still usable
    }
    fsdp_tensor_free(t);
    fsdp_tensor_free(a);
    fsdp_tensor_free(b);
    return st;
}

static void test_integers_exact(void) {
    for (int i = 0; i < N_WORLD_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(world_sizes[i], 20000, integers_body, NULL));
}

static void test_world_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world *w = NULL;
    FSDP_TEST_FAILS(
        fsdp_world_create(
            ctx, &(fsdp_world_options){.backend = FSDP_BACKEND_LOCAL, .comm_thread = true}, &w),
        FSDP_ERR_INVALID_ARGUMENT, "comm_thread is on for the 'local' backend",
        "only the 'mpi' backend", "leave comm_thread false");
    CU_ASSERT_FALSE(fsdp_world_comm_thread(NULL));
    if (!fsdp_backend_available(FSDP_BACKEND_MPI)) {
        FSDP_TEST_FAILS(
            fsdp_world_create(ctx, &(fsdp_world_options){.backend = FSDP_BACKEND_MPI}, &w),
            FSDP_ERR_UNSUPPORTED, "'mpi' backend is not part of this build", "FSDP_BACKEND_LOCAL");
    } else if (fsdp_test_mpi()) {
        /* (Only under mpirun: a plain run would start MPI as a singleton just for this.) */
        FSDP_TEST_FAILS(
            fsdp_world_create(
                ctx, &(fsdp_world_options){.backend = FSDP_BACKEND_MPI, .nranks = 5000}, &w),
            FSDP_ERR_INVALID_ARGUMENT, "nranks is 5000", "the MPI world has", "mpirun -np 5000");
    } else {
        CU_ASSERT_TRUE(fsdp_backend_available(FSDP_BACKEND_MPI));
    }
    CU_ASSERT_TRUE(fsdp_backend_available(FSDP_BACKEND_LOCAL));
#ifdef FSDP_HAVE_NCCL /* test_comm_nccl runs it */
    CU_ASSERT_TRUE(fsdp_backend_available(FSDP_BACKEND_NCCL));
#else
    CU_ASSERT_FALSE(fsdp_backend_available(FSDP_BACKEND_NCCL));
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &(fsdp_world_options){.backend = FSDP_BACKEND_NCCL}, &w),
                    FSDP_ERR_UNSUPPORTED, "'nccl'", "needs CUDA and NCCL");
#endif
    /* nccl-mpi needs both (test_comm_nccl runs it under mpirun). */
    CU_ASSERT_EQUAL(fsdp_backend_available(FSDP_BACKEND_NCCL_MPI),
                    fsdp_backend_available(FSDP_BACKEND_NCCL) &&
                        fsdp_backend_available(FSDP_BACKEND_MPI));
    CU_ASSERT_STRING_EQUAL(fsdp_backend_to_string(FSDP_BACKEND_NCCL_MPI), "nccl-mpi");
    if (!fsdp_backend_available(FSDP_BACKEND_NCCL_MPI))
        FSDP_TEST_FAILS(
            fsdp_world_create(ctx, &(fsdp_world_options){.backend = FSDP_BACKEND_NCCL_MPI}, &w),
            FSDP_ERR_UNSUPPORTED, "'nccl-mpi'", "needs both the mpi and the nccl backends");
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &(fsdp_world_options){.nranks = -2}, &w),
                    FSDP_ERR_INVALID_ARGUMENT, "nranks is -2");
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &(fsdp_world_options){.nranks = 5000}, &w),
                    FSDP_ERR_INVALID_ARGUMENT, "at most 1024 rank threads");
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &(fsdp_world_options){.threads_per_rank = -1}, &w),
                    FSDP_ERR_INVALID_ARGUMENT, "threads_per_rank is -1", "use 1 to 1024, or 0");
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &(fsdp_world_options){.threads_per_rank = 1025}, &w),
                    FSDP_ERR_INVALID_ARGUMENT, "threads_per_rank is 1025");
    CU_ASSERT_PTR_NULL(w);
    /* Collectives need a context bound to a world. */
    fsdp_tensor *t = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (const int64_t[]){2}, &t));
    FSDP_TEST_FAILS(fsdp_all_reduce(ctx, NULL, t, FSDP_REDUCE_SUM), FSDP_ERR_STATE,
                    "not bound to a world", "fsdp_world_run");
    fsdp_tensor_free(t);
    CU_ASSERT_PTR_NULL(fsdp_ctx_world(ctx));
    CU_ASSERT_PTR_NULL(fsdp_ctx_world_group(ctx));
    /* Defaults: one rank, the local backend. */
    FSDP_TEST_OK(fsdp_world_create(ctx, NULL, &w));
    CU_ASSERT_EQUAL(fsdp_world_size(w), 1);
    CU_ASSERT_EQUAL(fsdp_world_backend(w), FSDP_BACKEND_LOCAL);
    CU_ASSERT_STRING_EQUAL(fsdp_backend_to_string(fsdp_world_backend(w)), "local");
    fsdp_world_free(w);
    fsdp_world_free(NULL);
}

/* Runs of one world follow each other; each rank sees its rank and world, and a world's
 * per-rank results are kept. */
static fsdp_status identity_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    FSDP_RANK_CHECK(ctx, fsdp_ctx_rank(ctx) == rank, "ctx rank %d, want %d", fsdp_ctx_rank(ctx),
                    rank);
    FSDP_RANK_CHECK(ctx, fsdp_ctx_world(ctx) && fsdp_world_size(fsdp_ctx_world(ctx)) == 3,
                    "world size");
    if (rank == 1) return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND, "rank one looked for nothing");
    return fsdp_barrier(ctx, NULL) == FSDP_ERR_COMM ? FSDP_OK : FSDP_ERR_INTERNAL;
}

static void test_world_runs(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world *w = NULL;
    FSDP_TEST_OK(fsdp_world_create(ctx, &(fsdp_world_options){.nranks = 3}, &w));
    for (int run = 0; run < 3; run++) {
        FSDP_TEST_FAILS(fsdp_world_run(ctx, w, identity_body, NULL), FSDP_ERR_NOT_FOUND,
                        "rank 1: rank one looked for nothing");
        CU_ASSERT_EQUAL(fsdp_world_rank_status(w, 0), FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_world_rank_status(w, 1), FSDP_ERR_NOT_FOUND);
        CU_ASSERT_STRING_EQUAL(fsdp_world_rank_error(w, 1), "rank one looked for nothing");
        CU_ASSERT_STRING_EQUAL(fsdp_world_rank_error(w, 2), "");
    }
    fsdp_world_free(w);
}

/* ---- a rank's own message, and the trail of a failure ---- */

/* The last rank fails with a message it sets through the public API; the others succeed. */
static fsdp_status own_message_body(fsdp_ctx *ctx, int rank, void *user) {
    const bool bare = user != NULL;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    if (rank != W - 1) return FSDP_OK;
    if (bare) return FSDP_ERR_IO; /* a failure without a message */
    fsdp_ctx_set_error(ctx, FSDP_ERR_IO, "a message cleared before it is seen");
    fsdp_ctx_set_error(ctx, FSDP_OK, NULL);
    FSDP_RANK_CHECK(ctx, fsdp_last_status(ctx) == FSDP_OK && !fsdp_last_error(ctx)[0],
                    "fsdp_ctx_set_error(FSDP_OK) left %s \"%s\"",
                    fsdp_status_to_string(fsdp_last_status(ctx)), fsdp_last_error(ctx));
    return fsdp_ctx_set_error(ctx, FSDP_ERR_CONFIG, "rank %d cannot read shard-%05d.h5: %s", rank,
                              rank, "the file ends at byte 12");
}

/* fsdp_world_run reports the message a rank function set, whichever rank it is and whichever
 * backend runs it (under MPI the failing rank is another process). */
static void test_rank_sets_own_message(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int n = 2; n <= 3; n++) {
        int first = 0;
        if (fsdp_test_hosted_ranks(n, &first) == 0) continue; /* another MPI job size */
        char want[128];
        snprintf(want, sizeof want,
                 "rank %d: rank %d cannot read shard-%05d.h5: the file ends "
                 "at byte 12",
                 n - 1, n - 1, n - 1);
        CU_ASSERT_EQUAL(fsdp_test_run_world(n, 20000, own_message_body, NULL), FSDP_ERR_CONFIG);
        CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), want);
        CU_ASSERT_EQUAL(fsdp_last_status(ctx), FSDP_ERR_CONFIG);
        CU_ASSERT_STRING_EQUAL(fsdp_last_error_origin(ctx), ""); /* not raised in libfsdp */
        CU_ASSERT_PTR_NOT_NULL(strstr(fsdp_last_error_trail(ctx), "src/comm/world.c:"));
        snprintf(want, sizeof want, "rank %d: (the function set no message)", n - 1);
        CU_ASSERT_EQUAL(fsdp_test_run_world(n, 20000, own_message_body, (void *)1), FSDP_ERR_IO);
        CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), want);
    }
    /* Outside a world, and with a NULL context. */
    CU_ASSERT_EQUAL(fsdp_ctx_set_error(ctx, FSDP_ERR_STATE, "step %d of %d", 3, 4), FSDP_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), "step 3 of 4");
    CU_ASSERT_EQUAL(fsdp_last_status(ctx), FSDP_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error_trail(ctx), "");
    CU_ASSERT_EQUAL(fsdp_ctx_set_error(NULL, FSDP_ERR_IO, "nowhere"), FSDP_ERR_IO);
    fsdp_clear_error(ctx);
}

/* A failure three calls deep: raised at `origin_line`, passed up unchanged by a plain
 * FSDP_TRY, with a hop by FSDP_TRY_AT and one with context by FSDP_TRYF. */
static int origin_line, hop_line;
static _Atomic int context_line; /* written by every rank thread of trail_body */

static fsdp_status read_header(fsdp_ctx *ctx, int64_t bytes) {
    origin_line = __LINE__ + 1;
    return FSDP_FAIL(ctx, FSDP_ERR_IO, "the file ends at byte %lld", (long long)bytes);
}
static fsdp_status open_shard(fsdp_ctx *ctx) {
    FSDP_TRY(read_header(ctx, 12)); /* adds nothing */
    return FSDP_OK;
}
static fsdp_status load_piece(fsdp_ctx *ctx) {
    hop_line = __LINE__ + 1;
    FSDP_TRY_AT(ctx, open_shard(ctx));
    return FSDP_OK;
}
static fsdp_status load_param(fsdp_ctx *ctx, const char *name) {
    context_line = __LINE__ + 1;
    FSDP_TRYF(ctx, load_piece(ctx), "loading '%s'", name);
    return FSDP_OK;
}
/* depth hops of FSDP_TRY_AT above a failure; a status without a message at the bottom when
 * bare. */
static fsdp_status deep(fsdp_ctx *ctx, int depth, bool bare) {
    if (depth == 0) return bare ? FSDP_ERR_INTERNAL : read_header(ctx, 7);
    FSDP_TRY_AT(ctx, deep(ctx, depth - 1, bare));
    return FSDP_OK;
}

static void check_trail_across_ranks(int n);

static void test_error_trail(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    CU_ASSERT_EQUAL(load_param(ctx, "fc1.weight"), FSDP_ERR_IO);
    /* The message: outermost context first; the origin and the trail: file:line. */
    CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), "loading 'fc1.weight': the file ends at byte 12");
    char want[256];
    snprintf(want, sizeof want, "tests/test_comm.c:%d", origin_line);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error_origin(ctx), want);
    snprintf(want, sizeof want,
             "tests/test_comm.c:%d (load_param) -> tests/test_comm.c:%d (load_piece) -> "
             "tests/test_comm.c:%d",
             context_line, hop_line, origin_line);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error_trail(ctx), want);
    /* A callee that failed without a message: the status names it. */
    fsdp_clear_error(ctx);
    CU_ASSERT_EQUAL(deep(ctx, 2, true), FSDP_ERR_INTERNAL);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), "FSDP_ERR_INTERNAL");
    CU_ASSERT_STRING_EQUAL(fsdp_last_error_origin(ctx), "");
    /* A trail longer than the context holds keeps its outermost hops and the origin. */
    CU_ASSERT_EQUAL(deep(ctx, 60, false), FSDP_ERR_IO);
    const char *trail = fsdp_last_error_trail(ctx), *origin = fsdp_last_error_origin(ctx);
    size_t tl = strlen(trail), ol = strlen(origin);
    CU_ASSERT_TRUE(tl > ol && strcmp(trail + tl - ol, origin) == 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(trail, " -> ... -> "));
    CU_ASSERT_EQUAL(strncmp(trail, "tests/test_comm.c:", 18), 0);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), "the file ends at byte 7");
    fsdp_clear_error(ctx);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error_trail(ctx), "");
    for (int n = 2; n <= 3; n++) {
        int first = 0;
        if (fsdp_test_hosted_ranks(n, &first) > 0) check_trail_across_ranks(n);
    }
}

/* Ranks disagree on an all_reduce's dtype; each passes the failure up with context. */
static fsdp_status step(fsdp_ctx *ctx, int rank, fsdp_tensor *t) {
    (void)rank;
    context_line = __LINE__ + 1;
    FSDP_TRYF(ctx, fsdp_all_reduce(ctx, NULL, t, FSDP_REDUCE_SUM), "step %d", 3);
    return FSDP_OK;
}
static fsdp_status trail_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, rank == 0 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32, FSDP_CPU, 1,
                                (const int64_t[]){4}, &t));
    fsdp_status st = step(ctx, rank, t);
    fsdp_tensor_free(t);
    return st;
}

/* The trail crosses fsdp_world_run: world.c, the rank's hop with its context, the public
 * collective, and the backend's origin last (on every backend: under MPI the failing rank
 * may be another process). */
static void check_trail_across_ranks(int n) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    CU_ASSERT_EQUAL(fsdp_test_run_world(n, 20000, trail_body, NULL), FSDP_ERR_DTYPE);
    const char *msg = fsdp_last_error(ctx), *trail = fsdp_last_error_trail(ctx);
    const char *origin = fsdp_last_error_origin(ctx);
    CU_ASSERT_TRUE(strncmp(msg, "rank ", 5) == 0 && strstr(msg, ": step 3: ") &&
                   strstr(msg, "rank 0 bf16, rank 1 f32"));
    char hop[96];
    snprintf(hop, sizeof hop,
             " -> tests/test_comm.c:%d (step) -> src/comm/collectives.c:", context_line);
    CU_ASSERT_EQUAL(strncmp(trail, "src/comm/world.c:", 17), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(trail, hop));
    size_t tl = strlen(trail), ol = strlen(origin);
    CU_ASSERT_TRUE(ol > 0 && tl > ol && strcmp(trail + tl - ol, origin) == 0);
    CU_ASSERT_EQUAL(strncmp(origin, "src/comm/", 9), 0);
    if (!strstr(trail, hop) || strncmp(origin, "src/comm/", 9) != 0)
        fprintf(stderr, "\n  message: %s\n  trail: %s\n  origin: %s\n", msg, trail, origin);
    fsdp_clear_error(ctx);
}

/* The profile counts every collective of its rank while it runs, by op, and splits its time
 * into copy and wait (both non-negative); calls after fsdp_profile_stop are not counted. */
static fsdp_status profile_body(fsdp_ctx *ctx, int rank, void *user) {
    int W = fsdp_group_size(fsdp_ctx_world_group(ctx));
    int64_t n = 4096L * W;
    fsdp_tensor *full = NULL, *part = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &full));
    int64_t chunk = n / W;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &chunk, &part);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, full, 1.0f);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, part, 2.0f);
    if (st == FSDP_OK) st = fsdp_profile_start(ctx);
    for (int i = 0; st == FSDP_OK && i < 3; i++) st = fsdp_all_gather(ctx, NULL, full, part, 0);
    for (int i = 0; st == FSDP_OK && i < 2; i++)
        st = fsdp_reduce_scatter(ctx, NULL, part, full, 0, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, full, FSDP_REDUCE_SUM);
    if (st == FSDP_OK) st = fsdp_broadcast(ctx, NULL, full, 0);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK) st = fsdp_profile_stop(ctx);
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, NULL, full, part, 0); /* not counted */
    fsdp_profile pr;
    if (st == FSDP_OK) st = fsdp_profile_read(ctx, &pr);
    const int want[FSDP_COMM_OP_COUNT] = {[FSDP_COMM_ALL_GATHER] = 3,
                                          [FSDP_COMM_REDUCE_SCATTER] = 2,
                                          [FSDP_COMM_ALL_REDUCE] = 1,
                                          [FSDP_COMM_BROADCAST] = 1,
                                          [FSDP_COMM_BARRIER] = 1};
    for (int op = 0; st == FSDP_OK && op < FSDP_COMM_OP_COUNT; op++) {
        if (pr.comm_calls[op] != want[op] || pr.comm_copy_s[op] < 0 || pr.comm_wait_s[op] < 0 ||
            (want[op] == 0 && pr.comm_copy_s[op] + pr.comm_wait_s[op] != 0))
            st =
                fsdp_ctx_set_error(ctx, FSDP_ERR_INTERNAL,
                                   "rank %d: %s counted %lld calls (want %d), copy %g s, wait %g s",
                                   rank, fsdp_comm_op_to_string(op), (long long)pr.comm_calls[op],
                                   want[op], pr.comm_copy_s[op], pr.comm_wait_s[op]);
    }
    (void)user;
    fsdp_tensor_free(full);
    fsdp_tensor_free(part);
    return st;
}

static void test_profile_counts(void) {
    for (int i = 0; i < N_WORLD_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(world_sizes[i], 0, profile_body, NULL));
}

/* pin_threads: each rank's thread runs on the (rank x threads)-th CPU the process may use
 * (modulo their count) while its function runs, and a world of one gives the calling thread
 * its affinity back. */
typedef struct pin_state {
    cpu_set_t allowed; /* the process's CPUs, before the run */
    int threads;
    int cpu[MAX_RANKS]; /* per rank: the one CPU it found itself on, or -1 */
} pin_state;

static int nth_cpu(const cpu_set_t *set, int n) {
    n %= CPU_COUNT(set);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, set) && n-- == 0) return cpu;
    return -1;
}

static fsdp_status pin_body(fsdp_ctx *ctx, int rank, void *user) {
    pin_state *ps = user;
    cpu_set_t now;
    ps->cpu[rank] = -1;
    if (sched_getaffinity(0, sizeof now, &now) == 0 && CPU_COUNT(&now) == 1)
        ps->cpu[rank] = nth_cpu(&now, 0);
    return fsdp_barrier(ctx, NULL); /* every rank runs at once */
}

static void test_pin_threads(void) {
    pin_state ps = {.threads = 2};
    CU_ASSERT_EQUAL_FATAL(sched_getaffinity(0, sizeof ps.allowed, &ps.allowed), 0);
    for (int n = 1; n <= 4; n *= 2) {
        fsdp_world *w = NULL;
        fsdp_world_options o = {.nranks = n,
                                .threads_per_rank = ps.threads,
                                .pin_threads = true,
                                .ctx = {.log_level = FSDP_LOG_ERROR}};
        CU_ASSERT_EQUAL_FATAL(fsdp_world_create(fsdp_test_ctx(), &o, &w), FSDP_OK);
        FSDP_TEST_OK(fsdp_world_run(fsdp_test_ctx(), w, pin_body, &ps));
        fsdp_world_free(w);
        for (int r = 0; r < n; r++) {
            int want = nth_cpu(&ps.allowed, r * ps.threads);
            if (ps.cpu[r] != want)
                fprintf(stderr, "\n  %d ranks: rank %d ran on CPU %d, want %d", n, r, ps.cpu[r],
                        want);
            CU_ASSERT_EQUAL(ps.cpu[r], want);
        }
        cpu_set_t after; /* a world of one ran on this thread: its affinity is back */
        CU_ASSERT_EQUAL(sched_getaffinity(0, sizeof after, &after), 0);
        CU_ASSERT_TRUE(CPU_EQUAL(&after, &ps.allowed));
    }
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"chunk_range", test_chunk_range},
        {"profile_counts", test_profile_counts},
        {"pin_threads", test_pin_threads},
        {"all_gather", test_all_gather},
        {"all_gather_in_place", test_all_gather_in_place},
        {"share_shards", test_share_shards},
        {"reduce_scatter", test_reduce_scatter},
        {"reduce_scatter_ex", test_reduce_scatter_ex},
        {"all_reduce_ex", test_all_reduce_ex},
        {"all_reduce", test_all_reduce},
        {"all_reduce_start", test_all_reduce_start},
        {"all_reduce_start_mismatch", test_all_reduce_start_mismatch},
        {"all_reduce_start_timed", test_all_reduce_start_timed},
        {"work_wait_fails_not_hangs", test_work_wait_fails_not_hangs},
        {"every_start", test_every_start},
        {"starts_in_flight", test_starts_in_flight},
        {"start_meets_blocking", test_start_meets_blocking},
        {"start_mismatch_gather", test_start_mismatch_gather},
        {"gather_never_started", test_gather_never_started},
        {"thread_moves_data", test_thread_moves_data},
        {"broadcast", test_broadcast},
        {"all_to_all", test_all_to_all},
        {"barrier", test_barrier},
        {"groups", test_groups},
        {"mismatch_across_ranks", test_mismatch_across_ranks},
        {"rank_rejects_arguments", test_rank_rejects_arguments},
        {"device_tensors", test_device_tensors},
        {"timeout_names_missing_rank", test_timeout_names_missing_rank},
        {"returned_rank_fails_peers", test_returned_rank_fails_peers},
        {"bad_arguments", test_bad_arguments},
        {"integers_exact", test_integers_exact},
        {"world_errors", test_world_errors},
        {"world_runs", test_world_runs},
        {"rank_sets_own_message", test_rank_sets_own_message},
        {"error_trail", test_error_trail},
    };
    for (int s = 0; s < N_WHOLE_SPECS; s++) { /* every whole spec is a prefix of the tables */
        int64_t n = 1;
        for (int k = 0; k < whole_specs[s].ndim; k++) n *= whole_specs[s].shape[k];
        if (n > REF_N) {
            fprintf(stderr, "test_comm: whole spec %d has %lld elements, the tables %d\n", s,
                    (long long)n, REF_N);
            return 1;
        }
    }
    if (!tables_create()) {
        fprintf(stderr, "test_comm: no memory for the reference tables\n");
        return 1;
    }
    int status = fsdp_test_run(argc, argv, "comm", cases, sizeof cases / sizeof cases[0]);
    tables_free();
    return status;
}

/* test_rng.c: Philox4x32-10 against the Random123 known-answer vectors, uniform and normal
 * statistics, and the determinism contract: a tensor initialised in blocks (as shards on
 * many ranks) equals the same tensor initialised whole, and a fill split over threads equals
 * the serial fill and the scalar draws bit for bit. */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> // defines: sysconf

#include "core/rng_fill.h" // defines: fsdp_init_block_threads, fsdp_init_threads
#include "harness.h"

static void test_philox_known_answers(void) {
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        fsdp_philox4x32(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++) CU_ASSERT_EQUAL(out[j], kat[i].want[j]);
    }
}

static void test_uniform_and_normal_statistics(void) {
    const int n = 200000;
    double sum = 0, sumsq = 0, nsum = 0, nsumsq = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < n; i++) {
        float u = fsdp_rng_uniform(7, 11, (uint64_t)i);
        lo = fminf(lo, u);
        hi = fmaxf(hi, u);
        sum += u;
        sumsq += (double)u * u;
        double z = fsdp_rng_normal(7, 11, (uint64_t)i);
        nsum += z;
        nsumsq += z * z;
    }
    CU_ASSERT_TRUE(lo >= 0.0f && hi < 1.0f);
    /* mean 1/2 and variance 1/12; 5 standard errors */
    CU_ASSERT_DOUBLE_EQUAL(sum / n, 0.5, 5 * sqrt(1.0 / 12 / n));
    CU_ASSERT_DOUBLE_EQUAL(sumsq / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
    CU_ASSERT_DOUBLE_EQUAL(nsum / n, 0.0, 5 / sqrt((double)n));
    CU_ASSERT_DOUBLE_EQUAL(nsumsq / n, 1.0, 0.02);
    /* streams and seeds are independent */
    CU_ASSERT_NOT_EQUAL(fsdp_rng_uniform(7, 11, 5), fsdp_rng_uniform(7, 12, 5));
    CU_ASSERT_NOT_EQUAL(fsdp_rng_uniform(7, 11, 5), fsdp_rng_uniform(8, 11, 5));
    CU_ASSERT_NOT_EQUAL(fsdp_rng_stream("net1.weight"), fsdp_rng_stream("net2.weight"));
}

/* A (13, 6) tensor initialised whole, and again as blocks cut along either dimension in
 * torch.chunk sizes over 4 "ranks", must agree bitwise. */
static void test_blocks_equal_whole(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const int64_t global[2] = {13, 6};
    const fsdp_init inits[] = {{FSDP_INIT_UNIFORM, -0.3f, 0.3f}, {FSDP_INIT_NORMAL, 1.0f, 0.02f}};
    for (int k = 0; k < 2; k++) {
        fsdp_tensor *whole;
        FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, global, &whole));
        FSDP_TEST_OK(fsdp_init_tensor(ctx, whole, &inits[k], 42, 99));
        const float *w = fsdp_tensor_f32(whole);
        for (int dim = 0; dim < 2; dim++) {
            int64_t chunk = (global[dim] + 3) / 4;
            for (int r = 0; r < 4; r++) {
                int64_t start = r * chunk, end = start + chunk;
                if (end > global[dim]) end = global[dim];
                if (start > end) start = end;
                int64_t shape[2] = {global[0], global[1]}, at[2] = {0, 0};
                shape[dim] = end - start;
                at[dim] = start;
                fsdp_tensor *block;
                FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &block));
                FSDP_TEST_OK(fsdp_init_block(ctx, block, &inits[k], 42, 99, 2, global, at));
                const float *b = fsdp_tensor_f32(block);
                int bad = 0;
                for (int64_t i = 0; i < shape[0]; i++)
                    for (int64_t j = 0; j < shape[1]; j++)
                        bad += b[i * shape[1] + j] != w[(i + at[0]) * global[1] + j + at[1]];
                CU_ASSERT_EQUAL(bad, 0);
                fsdp_tensor_free(block);
            }
        }
        fsdp_tensor_free(whole);
    }
}

static void test_init_kinds_and_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *t;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 1, (int64_t[]){3}, &t));
    fsdp_init c = {.kind = FSDP_INIT_CONSTANT, .a = 0.25f};
    FSDP_TEST_OK(fsdp_init_tensor(ctx, t, &c, 0, 0));
    CU_ASSERT_EQUAL(fsdp_bf16_to_f32(((fsdp_bf16 *)fsdp_tensor_data(t))[2]), 0.25f);
    fsdp_init ones = {.kind = FSDP_INIT_ONES};
    FSDP_TEST_OK(fsdp_init_tensor(ctx, t, &ones, 0, 0));
    CU_ASSERT_EQUAL(fsdp_bf16_to_f32(((fsdp_bf16 *)fsdp_tensor_data(t))[0]), 1.0f);
    FSDP_TEST_FAILS(fsdp_init_block(ctx, t, &ones, 0, 0, 1, (int64_t[]){4}, (int64_t[]){2}),
                    FSDP_ERR_SHAPE, "[2, 5)", "global size 4");
    fsdp_tensor_free(t);
    /* f16 receives the rounded draw; integers are refused (they would get 16-bit halves) */
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F16, FSDP_CPU, 1, (int64_t[]){3}, &t));
    fsdp_init third = {.kind = FSDP_INIT_CONSTANT, .a = 1.0f / 3.0f};
    FSDP_TEST_OK(fsdp_init_tensor(ctx, t, &third, 0, 0));
    CU_ASSERT_EQUAL(((fsdp_f16 *)fsdp_tensor_data(t))[1], fsdp_f16_from_f32(1.0f / 3.0f));
    CU_ASSERT_EQUAL(((fsdp_f16 *)fsdp_tensor_data(t))[1], 0x3555); /* 0.33325195 */
    fsdp_tensor_free(t);
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, (int64_t[]){3}, &t));
    FSDP_TEST_FAILS(fsdp_init_tensor(ctx, t, &ones, 0, 0), FSDP_ERR_DTYPE, "is i32",
                    "fsdp_tensor_fill");
    fsdp_tensor_free(t);
}

static const fsdp_dtype float_dtypes[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
static const fsdp_init random_inits[] = {{FSDP_INIT_UNIFORM, -0.3f, 0.3f},
                                         {FSDP_INIT_NORMAL, 0.1f, 0.02f},
                                         {FSDP_INIT_CONSTANT, 0.7f, 0.0f}};

/* Elements of a and b (same dtype and size) whose bits differ. */
static int64_t bits_differ(const fsdp_tensor *a, const fsdp_tensor *b) {
    size_t size = fsdp_dtype_size(fsdp_tensor_dtype(a));
    const unsigned char *x = fsdp_tensor_data(a), *y = fsdp_tensor_data(b);
    int64_t bad = 0;
    for (int64_t i = 0; i < fsdp_tensor_numel(a); i++)
        bad += memcmp(x + (size_t)i * size, y + (size_t)i * size, size) != 0;
    return bad;
}

/* Elements of the block t (ndim 1 to 3) that differ from the scalar definition: the element
 * at global index g holds a + (b - a) * fsdp_rng_uniform(g) or a + b * fsdp_rng_normal(g),
 * rounded to t's dtype. An independent check of the fill's batched draws. */
static int64_t differs_from_scalar(const fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                                   uint64_t stream, const int64_t *global, const int64_t *at) {
    int nd = fsdp_tensor_ndim(t);
    int64_t shape[3] = {1, 1, 1}, gs[3] = {1, 1, 1}, st[3] = {0, 0, 0};
    for (int d = 0; d < nd; d++) {
        shape[3 - nd + d] = fsdp_tensor_shape(t)[d];
        gs[3 - nd + d] = global[d];
        st[3 - nd + d] = at[d];
    }
    fsdp_dtype dt = fsdp_tensor_dtype(t);
    const void *data = fsdp_tensor_data(t);
    int64_t bad = 0, i = 0;
    for (int64_t a = 0; a < shape[0]; a++)
        for (int64_t b = 0; b < shape[1]; b++)
            for (int64_t c = 0; c < shape[2]; c++, i++) {
                uint64_t g = (uint64_t)(((st[0] + a) * gs[1] + st[1] + b) * gs[2] + st[2] + c);
                float want = init->kind == FSDP_INIT_UNIFORM
                                 ? init->a + (init->b - init->a) * fsdp_rng_uniform(seed, stream, g)
                             : init->kind == FSDP_INIT_NORMAL
                                 ? init->a + init->b * fsdp_rng_normal(seed, stream, g)
                                 : init->a;
                if (dt == FSDP_DTYPE_F32)
                    bad += memcmp(&want, (const float *)data + i, sizeof want) != 0;
                else if (dt == FSDP_DTYPE_F16)
                    bad += ((const fsdp_f16 *)data)[i] != fsdp_f16_from_f32(want);
                else
                    bad += ((const fsdp_bf16 *)data)[i] != fsdp_bf16_from_f32(want);
            }
    return bad;
}

/* Whole tensors and blocks at nonzero offsets of larger global shapes, odd sizes and sizes
 * below the thread count: split into 2, 3, 7 and 16 ranges (and 4 ranges with none or one on a
 * new thread, as when threads cannot be created), every result bitwise the 1-range fill, and
 * that one bitwise the scalar draws. */
static void test_threaded_fill_bitwise(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    static const struct {
        int ndim;
        int64_t global[3], shape[3], at[3];
    } cases[] = {
        {1, {1}, {1}, {0}},
        {1, {7}, {7}, {0}},
        {1, {100003}, {100003}, {0}},
        {2, {211, 499}, {200, 487}, {11, 5}},
        {3, {3, 61, 257}, {2, 50, 255}, {1, 5, 1}},
        {2, {4, 5}, {0, 5}, {2, 0}}, /* empty blocks: nothing filled, no thread */
        {2, {4, 5}, {3, 0}, {1, 5}},
    };
    static const int split[][2] = {{2, -1}, {3, -1}, {7, -1}, {16, -1}, {4, 0}, {4, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 3; k++) {
                fsdp_tensor *serial, *split_t;
                int64_t numel = 1;
                for (int i = 0; i < cases[c].ndim; i++) numel *= cases[c].shape[i];
                int started = -1;
                FSDP_TEST_OK(fsdp_tensor_create(ctx, float_dtypes[d], FSDP_CPU, cases[c].ndim,
                                                cases[c].shape, &serial));
                FSDP_TEST_OK(fsdp_tensor_create(ctx, float_dtypes[d], FSDP_CPU, cases[c].ndim,
                                                cases[c].shape, &split_t));
                FSDP_TEST_OK(fsdp_init_block_threads(ctx, serial, &random_inits[k], 42, 99,
                                                     cases[c].ndim, cases[c].global, cases[c].at, 1,
                                                     -1, &started));
                CU_ASSERT_EQUAL(started, 0);
                CU_ASSERT_EQUAL(differs_from_scalar(serial, &random_inits[k], 42, 99,
                                                    cases[c].global, cases[c].at),
                                0);
                for (size_t s = 0; s < sizeof split / sizeof split[0]; s++) {
                    FSDP_TEST_OK(fsdp_tensor_fill(ctx, split_t, NAN));
                    FSDP_TEST_OK(fsdp_init_block_threads(
                        ctx, split_t, &random_inits[k], 42, 99, cases[c].ndim, cases[c].global,
                        cases[c].at, split[s][0], split[s][1], &started));
                    /* ranges past the element count are dropped; all ranges but the first
                     * start a thread (this machine can start them), or as many as asked */
                    int64_t ranges = numel == 0 ? 1 : split[s][0] < numel ? split[s][0] : numel;
                    int64_t want =
                        split[s][1] < 0 || split[s][1] > ranges - 1 ? ranges - 1 : split[s][1];
                    CU_ASSERT_EQUAL(started, want);
                    int64_t bad = bits_differ(serial, split_t);
                    if (bad)
                        fprintf(stderr, "\n  case %zu dtype %d init %d, %d ranges: %lld differ\n",
                                c, d, k, split[s][0], (long long)bad);
                    CU_ASSERT_EQUAL(bad, 0);
                }
                fsdp_tensor_free(serial);
                fsdp_tensor_free(split_t);
            }
    fsdp_tensor *t;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){3}, &t));
    FSDP_TEST_FAILS(fsdp_init_block_threads(ctx, t, &random_inits[0], 0, 0, 1, (int64_t[]){3},
                                            (int64_t[]){0}, 0, -1, NULL),
                    FSDP_ERR_INVALID_ARGUMENT, "0 threads", "pass 1 to 64");
    fsdp_tensor_free(t);
}

/* Sets FSDP_INIT_THREADS (NULL: unsets it). */
static void set_init_threads(const char *value) {
    if (value)
        setenv("FSDP_INIT_THREADS", value, 1);
    else
        unsetenv("FSDP_INIT_THREADS");
}

/* The thread count: 1 below the threshold whatever the variable says; the variable above it;
 * the online CPUs up to 16 when it is unset; malformed values refused, naming the variable
 * and the range, also by fsdp_init_block. */
static void test_init_threads_policy(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const char *saved = getenv("FSDP_INIT_THREADS");
    char *keep = saved ? strdup(saved) : NULL;
    int n = 0;
    set_init_threads(NULL);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
    FSDP_TEST_OK(fsdp_init_threads(ctx, FSDP_INIT_SERIAL_BELOW - 1, &n));
    CU_ASSERT_EQUAL(n, 1);
    FSDP_TEST_OK(fsdp_init_threads(ctx, FSDP_INIT_SERIAL_BELOW, &n));
    CU_ASSERT_EQUAL(n, want);
    set_init_threads("5");
    FSDP_TEST_OK(fsdp_init_threads(ctx, FSDP_INIT_SERIAL_BELOW - 1, &n));
    CU_ASSERT_EQUAL(n, 1);
    FSDP_TEST_OK(fsdp_init_threads(ctx, FSDP_INIT_SERIAL_BELOW, &n));
    CU_ASSERT_EQUAL(n, 5);
    set_init_threads("1");
    FSDP_TEST_OK(fsdp_init_threads(ctx, INT64_C(1) << 40, &n));
    CU_ASSERT_EQUAL(n, 1);
    set_init_threads("64");
    FSDP_TEST_OK(fsdp_init_threads(ctx, FSDP_INIT_SERIAL_BELOW, &n));
    CU_ASSERT_EQUAL(n, 64);
    static const char *const bad[] = {"0", "65", "-2", "abc", "3x", "", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set_init_threads(bad[i]);
        FSDP_TEST_FAILS(fsdp_init_threads(ctx, 10, &n), FSDP_ERR_INVALID_ARGUMENT,
                        "FSDP_INIT_THREADS is '", "from 1 (fill on the calling thread) to 64",
                        "unset it");
    }
    fsdp_tensor *t;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){3}, &t));
    set_init_threads("many");
    FSDP_TEST_FAILS(fsdp_init_tensor(ctx, t, &random_inits[0], 0, 0), FSDP_ERR_INVALID_ARGUMENT,
                    "FSDP_INIT_THREADS is 'many'");
    fsdp_tensor_free(t);
    set_init_threads(keep);
    free(keep);
}

/* Through fsdp_init_block as a model calls it: sizes just under and over the threshold (odd)
 * and a block over it at a nonzero offset, filled with FSDP_INIT_THREADS=1 and =3 (and unset,
 * for f32), bitwise equal; the large block also against the scalar draws. */
static void test_threshold_fill_bitwise(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const char *saved = getenv("FSDP_INIT_THREADS");
    char *keep = saved ? strdup(saved) : NULL;
    const int64_t below = FSDP_INIT_SERIAL_BELOW;
    static const struct {
        int ndim;
        int64_t global[2], shape[2], at[2];
    } cases[] = {
        {1, {below - 1}, {below - 1}, {0}},
        {1, {below + 1}, {below + 1}, {0}},
        {2, {1100, 1001}, {1050, 999}, {37, 1}}, /* 1,048,950 elements, over the threshold */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 2; k++) {
                fsdp_tensor *t[3];
                static const char *const env[] = {"1", "3", NULL};
                int runs = d == 0 ? 3 : 2;
                for (int e = 0; e < runs; e++) {
                    FSDP_TEST_OK(fsdp_tensor_create(ctx, float_dtypes[d], FSDP_CPU, cases[c].ndim,
                                                    cases[c].shape, &t[e]));
                    set_init_threads(env[e]);
                    FSDP_TEST_OK(fsdp_init_block(ctx, t[e], &random_inits[k], 7, 1234,
                                                 cases[c].ndim, cases[c].global, cases[c].at));
                }
                for (int e = 1; e < runs; e++) CU_ASSERT_EQUAL(bits_differ(t[0], t[e]), 0);
                if (c == 2)
                    CU_ASSERT_EQUAL(differs_from_scalar(t[1], &random_inits[k], 7, 1234,
                                                        cases[c].global, cases[c].at),
                                    0);
                for (int e = 0; e < runs; e++) fsdp_tensor_free(t[e]);
            }
    set_init_threads(keep);
    free(keep);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"philox_known_answers", test_philox_known_answers},
        {"uniform_and_normal_statistics", test_uniform_and_normal_statistics},
        {"blocks_equal_whole", test_blocks_equal_whole},
        {"init_kinds_and_errors", test_init_kinds_and_errors},
        {"threaded_fill_bitwise", test_threaded_fill_bitwise},
        {"init_threads_policy", test_init_threads_policy},
        {"threshold_fill_bitwise", test_threshold_fill_bitwise},
    };
    return fsdp_test_run(argc, argv, "rng", cases, sizeof cases / sizeof cases[0]);
}

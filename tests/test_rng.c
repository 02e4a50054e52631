/* test_rng.c: Philox4x32-10 against the Random123 known-answer vectors, uniform and normal
 * statistics, and the determinism contract: a tensor initialised in blocks (as shards on
 * many ranks) equals the same tensor initialised whole. */
#include <math.h>

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

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"philox_known_answers", test_philox_known_answers},
        {"uniform_and_normal_statistics", test_uniform_and_normal_statistics},
        {"blocks_equal_whole", test_blocks_equal_whole},
        {"init_kinds_and_errors", test_init_kinds_and_errors},
    };
    return fsdp_test_run(argc, argv, "rng", cases, sizeof cases / sizeof cases[0]);
}

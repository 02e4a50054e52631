/* test_tensor.c: fsdp_tensor creation, shapes, views and their ownership, resize, copy with
 * bf16 conversion, fill, and the error messages of bad input; core's growable array. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/tensor_impl.h"
#include "harness.h"

static void test_create_shapes(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *t;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){2, 3, 4}, &t));
    CU_ASSERT_EQUAL(fsdp_tensor_ndim(t), 3);
    CU_ASSERT_EQUAL(fsdp_tensor_numel(t), 24);
    CU_ASSERT_EQUAL(fsdp_tensor_nbytes(t), 96);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(t, -1), 4);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(t, 0), 2);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(t, 5), 0);
    char buf[64];
    CU_ASSERT_STRING_EQUAL(fsdp_tensor_shape_string(t, buf, sizeof buf), "(2, 3, 4)");
    const float *d = fsdp_tensor_f32(t);
    for (int i = 0; i < 24; i++) CU_ASSERT_EQUAL(d[i], 0.0f); /* zero-filled */
    CU_ASSERT_EQUAL((uintptr_t)d % 64, 0);                    /* aligned for SIMD */
    fsdp_tensor_free(t);

    fsdp_tensor *scalar, *empty;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 0, NULL, &scalar));
    CU_ASSERT_EQUAL(fsdp_tensor_numel(scalar), 1);
    CU_ASSERT_PTR_NULL(fsdp_tensor_f32(scalar)); /* not f32 */
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){0, 5}, &empty));
    CU_ASSERT_EQUAL(fsdp_tensor_numel(empty), 0);
    CU_ASSERT_PTR_NOT_NULL(fsdp_tensor_data(empty));
    CU_ASSERT_STRING_EQUAL(fsdp_tensor_shape_string(empty, buf, sizeof buf), "(0, 5)");
    fsdp_tensor_free(scalar);
    fsdp_tensor_free(empty);
    fsdp_tensor_free(NULL);
}

static void test_bad_input(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *t = (fsdp_tensor *)1;
    FSDP_TEST_FAILS(
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 5, (int64_t[]){1, 1, 1, 1, 1}, &t),
        FSDP_ERR_SHAPE, "5 dimensions", "0 to 4");
    CU_ASSERT_PTR_NULL(t);
    FSDP_TEST_FAILS(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){3, -1}, &t),
                    FSDP_ERR_SHAPE, "dimension 1", "-1");
    FSDP_TEST_FAILS(fsdp_tensor_create(ctx, (fsdp_dtype)7, FSDP_CPU, 1, (int64_t[]){3}, &t),
                    FSDP_ERR_DTYPE, "FSDP_DTYPE_F32");
    FSDP_TEST_FAILS(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, (fsdp_device){FSDP_DEVICE_CUDA, 0}, 1,
                                       (int64_t[]){3}, &t),
                    FSDP_ERR_DEVICE, "cuda", "not available");
    CU_ASSERT_STRING_NOT_EQUAL(fsdp_last_error_origin(ctx), "");
    CU_ASSERT_PTR_NULL(strstr(fsdp_last_error_origin(ctx), "/work"));
    fsdp_clear_error(ctx);
    CU_ASSERT_EQUAL(fsdp_last_status(ctx), FSDP_OK);
    CU_ASSERT_STRING_EQUAL(fsdp_last_error(ctx), "");
}

static void test_views_share_storage(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *base, *row, *flat;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){3, 4}, &base));
    float *b = fsdp_tensor_f32(base);
    for (int i = 0; i < 12; i++) b[i] = (float)i;
    FSDP_TEST_OK(fsdp_tensor_view(ctx, base, 4, 1, (int64_t[]){4}, &row));
    FSDP_TEST_OK(fsdp_tensor_view(ctx, base, 0, 1, (int64_t[]){12}, &flat));
    CU_ASSERT_EQUAL(fsdp_tensor_f32(row)[0], 4.0f);
    fsdp_tensor_f32(row)[1] = 100.0f; /* writes through */
    CU_ASSERT_EQUAL(b[5], 100.0f);
    fsdp_tensor_free(base); /* the views keep the storage alive */
    CU_ASSERT_EQUAL(fsdp_tensor_f32(flat)[5], 100.0f);
    CU_ASSERT_EQUAL(fsdp_tensor_f32(row)[3], 7.0f);
    fsdp_tensor *bad = NULL;
    FSDP_TEST_FAILS(fsdp_tensor_view(ctx, row, 2, 1, (int64_t[]){3}, &bad), FSDP_ERR_SHAPE,
                    "[2, 5)", "(4,)");
    fsdp_tensor_free(row);
    fsdp_tensor_free(flat);
}

static void test_rebind(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *flat, *p;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){10}, &flat));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){2, 2}, &p));
    for (int i = 0; i < 10; i++) fsdp_tensor_f32(flat)[i] = (float)i;
    FSDP_TEST_OK(fsdp_tensor_rebind(ctx, p, flat, 6));
    CU_ASSERT_EQUAL(fsdp_tensor_f32(p)[0], 6.0f);
    CU_ASSERT_EQUAL(fsdp_tensor_f32(p)[3], 9.0f);
    CU_ASSERT_EQUAL(fsdp_tensor_dim(p, 0), 2);
    FSDP_TEST_FAILS(fsdp_tensor_rebind(ctx, p, flat, 7), FSDP_ERR_SHAPE, "[7, 11)");
    fsdp_tensor_free(flat);
    CU_ASSERT_EQUAL(fsdp_tensor_f32(p)[1], 7.0f); /* storage alive through p */
    fsdp_tensor_free(p);
}

static void test_resize(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *t, *v;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){4, 4}, &t));
    void *before = fsdp_tensor_data(t);
    FSDP_TEST_OK(fsdp_tensor_resize(ctx, t, 2, (int64_t[]){2, 3})); /* fits: same storage */
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(t), before);
    CU_ASSERT_EQUAL(fsdp_tensor_numel(t), 6);
    FSDP_TEST_OK(fsdp_tensor_resize(ctx, t, 2, (int64_t[]){8, 8})); /* grows: new storage */
    CU_ASSERT_EQUAL(fsdp_tensor_numel(t), 64);
    fsdp_tensor_f32(t)[63] = 1.0f;
    FSDP_TEST_OK(fsdp_tensor_view(ctx, t, 0, 1, (int64_t[]){4}, &v));
    FSDP_TEST_FAILS(fsdp_tensor_resize(ctx, t, 1, (int64_t[]){100}), FSDP_ERR_STATE, "shared");
    fsdp_tensor_free(v);
    fsdp_tensor_free(t);
}

static void test_bf16_and_copy(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    CU_ASSERT_EQUAL(fsdp_bf16_from_f32(1.0f), 0x3f80);
    CU_ASSERT_EQUAL(fsdp_bf16_to_f32(0x3f80), 1.0f);
    CU_ASSERT_EQUAL(fsdp_bf16_from_f32(-2.0f), 0xc000);
    /* 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one (1.0) */
    CU_ASSERT_EQUAL(fsdp_bf16_from_f32(1.00390625f), 0x3f80);
    CU_ASSERT_EQUAL(fsdp_bf16_from_f32(1.01171875f), 0x3f82); /* 1 + 3*2^-8: tie to even up */
    CU_ASSERT_TRUE(isnan(fsdp_bf16_to_f32(fsdp_bf16_from_f32(NAN))));
    CU_ASSERT_TRUE(isinf(fsdp_bf16_to_f32(fsdp_bf16_from_f32(INFINITY))));

    fsdp_tensor *f, *h, *back;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){6}, &f));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 2, (int64_t[]){2, 3}, &h));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){6}, &back));
    const float vals[6] = {0.5f, -3.25f, 1.0e-3f, 65504.0f, 3.14159265f, -0.0f};
    memcpy(fsdp_tensor_f32(f), vals, sizeof vals);
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, h, f));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, back, h));
    for (int i = 0; i < 6; i++) {
        CU_ASSERT_EQUAL(fsdp_tensor_f32(back)[i], fsdp_bf16_to_f32(fsdp_bf16_from_f32(vals[i])));
        CU_ASSERT_TRUE(fabsf(fsdp_tensor_f32(back)[i] - vals[i]) <= fabsf(vals[i]) * 0x1p-8f);
    }
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, h, 2.5f));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, back, h));
    CU_ASSERT_EQUAL(fsdp_tensor_f32(back)[4], 2.5f);
    fsdp_tensor *wrong;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){5}, &wrong));
    FSDP_TEST_FAILS(fsdp_tensor_copy(ctx, wrong, f), FSDP_ERR_SHAPE, "(6,)", "(5,)");
    fsdp_tensor_free(wrong);
    fsdp_tensor_free(f);
    fsdp_tensor_free(h);
    fsdp_tensor_free(back);
}

static void test_from_blob(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    float mine[4] = {1, 2, 3, 4};
    fsdp_tensor *t;
    FSDP_TEST_OK(
        fsdp_tensor_from_blob(ctx, mine, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){2, 2}, &t));
    CU_ASSERT_PTR_EQUAL(fsdp_tensor_data(t), mine);
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, t, 7.0f));
    CU_ASSERT_EQUAL(mine[3], 7.0f);
    FSDP_TEST_FAILS(fsdp_tensor_resize(ctx, t, 1, (int64_t[]){8}), FSDP_ERR_STATE, "not owned");
    fsdp_tensor_free(t); /* must not free `mine` (ASan would catch a free of the stack) */
}

static void test_status_and_log(void) {
    CU_ASSERT_STRING_EQUAL(fsdp_status_to_string(FSDP_OK), "FSDP_OK");
    CU_ASSERT_STRING_EQUAL(fsdp_status_to_string(FSDP_ERR_TIMEOUT), "FSDP_ERR_TIMEOUT");
    CU_ASSERT_STRING_EQUAL(fsdp_status_to_string((fsdp_status)999), "FSDP_ERR_UNKNOWN");
    for (int s = 0; s < FSDP_STATUS_COUNT; s++)
        CU_ASSERT_PTR_NOT_NULL(fsdp_status_to_string((fsdp_status)s));
    fsdp_log_level l;
    FSDP_TEST_OK(fsdp_log_level_parse("info", &l));
    CU_ASSERT_EQUAL(l, FSDP_LOG_INFO);
    CU_ASSERT_EQUAL(fsdp_log_level_parse("loud", &l), FSDP_ERR_INVALID_ARGUMENT);
    CU_ASSERT_STRING_EQUAL(fsdp_version(), FSDP_VERSION_STRING);
}

typedef struct captured {
    int count;
    fsdp_log_level level;
    char text[256];
} captured;

static void capture(void *user, fsdp_log_level level, const char *message) {
    captured *c = user;
    c->count++;
    c->level = level;
    snprintf(c->text, sizeof c->text, "%s", message);
}

static void test_log_levels(void) {
    captured c = {0};
    fsdp_ctx *ctx;
    fsdp_ctx_options o = {.log_level = FSDP_LOG_INFO, .log_fn = capture, .log_user = &c, .rank = 3};
    FSDP_TEST_OK(fsdp_ctx_create(&o, &ctx));
    CU_ASSERT_EQUAL(fsdp_ctx_rank(ctx), 3);
    fsdp_log(ctx, FSDP_LOG_DEBUG, "hidden %d", 1);
    CU_ASSERT_EQUAL(c.count, 0);
    fsdp_log(ctx, FSDP_LOG_WARN, "shown %d", 2);
    CU_ASSERT_EQUAL(c.count, 1);
    CU_ASSERT_EQUAL(c.level, FSDP_LOG_WARN);
    CU_ASSERT_STRING_EQUAL(c.text, "shown 2");
    fsdp_ctx_set_log_level(ctx, FSDP_LOG_OFF);
    fsdp_log(ctx, FSDP_LOG_ERROR, "silenced");
    CU_ASSERT_EQUAL(c.count, 1);
    fsdp_ctx_free(ctx);
    fsdp_ctx_free(NULL);
}

/* Shapes whose element count overflows and views or rebinds past the end of their base are
 * refused before any memory is touched (int64 arithmetic could otherwise wrap to a small size). */
static void test_sizes_never_overflow(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *t = NULL, *v = NULL;
    int64_t huge[2] = {((int64_t)1 << 62) + 1, 4};
    FSDP_TEST_FAILS(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, huge, &t), FSDP_ERR_SHAPE,
                    "fsdp_tensor_create", "overflows");
    CU_ASSERT_PTR_NULL(t);
    int64_t wide[4] = {1 << 20, 1 << 20, 1 << 20, 1 << 20};
    FSDP_TEST_FAILS(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 4, wide, &t), FSDP_ERR_SHAPE,
                    "overflows");
    FSDP_TEST_FAILS(fsdp_tensor_from_blob(ctx, wide, FSDP_DTYPE_F32, FSDP_CPU, 2, huge, &t),
                    FSDP_ERR_SHAPE, "overflows");
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){16}, &t));
    FSDP_TEST_FAILS(fsdp_tensor_view(ctx, t, INT64_MAX - 2, 1, (int64_t[]){4}, &v), FSDP_ERR_SHAPE,
                    "outside the base");
    CU_ASSERT_PTR_NULL(v);
    FSDP_TEST_FAILS(fsdp_tensor_view(ctx, t, 8, 1, (int64_t[]){INT64_MAX / 16}, &v), FSDP_ERR_SHAPE,
                    "outside the base");
    FSDP_TEST_FAILS(fsdp_tensor_resize(ctx, t, 2, huge), FSDP_ERR_SHAPE, "overflows");
    CU_ASSERT_EQUAL(fsdp_tensor_numel(t), 16);
    fsdp_tensor_free(t);
}

/* fsdp_array_reserve keeps the elements, doubles the capacity, and refuses a byte count that
 * overflows without touching the array. */
static void test_array_reserve(void) {
    int *a = NULL;
    int64_t cap = 0;
    CU_ASSERT_TRUE(fsdp_array_reserve((void **)&a, &cap, 0, sizeof *a));
    CU_ASSERT_PTR_NULL(a);
    CU_ASSERT_TRUE(fsdp_array_reserve((void **)&a, &cap, 1, sizeof *a));
    CU_ASSERT_EQUAL(cap, 8);
    for (int i = 0; i < 100; i++) {
        CU_ASSERT_FATAL(fsdp_array_reserve((void **)&a, &cap, i + 1, sizeof *a));
        a[i] = i;
    }
    CU_ASSERT_EQUAL(cap, 128);
    for (int i = 0; i < 100; i++) CU_ASSERT_EQUAL(a[i], i);
    int *before = a;
    CU_ASSERT_TRUE(fsdp_array_reserve((void **)&a, &cap, 128, sizeof *a));
    CU_ASSERT_PTR_EQUAL(a, before);
    CU_ASSERT_FALSE(fsdp_array_reserve((void **)&a, &cap, INT64_MAX, sizeof *a));
    CU_ASSERT_FALSE(fsdp_array_reserve((void **)&a, &cap, INT64_MAX / 2, 64));
    CU_ASSERT_PTR_EQUAL(a, before);
    CU_ASSERT_EQUAL(cap, 128);
    free(a);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"create_shapes", test_create_shapes},
        {"bad_input", test_bad_input},
        {"views_share_storage", test_views_share_storage},
        {"sizes_never_overflow", test_sizes_never_overflow},
        {"rebind", test_rebind},
        {"resize", test_resize},
        {"bf16_and_copy", test_bf16_and_copy},
        {"from_blob", test_from_blob},
        {"status_and_log", test_status_and_log},
        {"log_levels", test_log_levels},
        {"array_reserve", test_array_reserve},
    };
    return fsdp_test_run(argc, argv, "tensor", cases, sizeof cases / sizeof cases[0]);
}

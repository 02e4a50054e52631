/* stacked_batches.h: the data and the training step the FSDP suites share: rows of a global
 * batch of STACKED_BATCH samples of 10 features (MLPStacked's width), and one forward and
 * backward of loss = sum((out - target)^2) / STACKED_BATCH, as a data-parallel rank computes
 * it on its rows. */
#ifndef FSDP_TESTS_STACKED_BATCHES_H
#define FSDP_TESTS_STACKED_BATCHES_H

#include <stdint.h>
#include <string.h>

#include "fsdp/fsdp.h"

#define STACKED_BATCH 8

/* Rows [off, off + len) of a (STACKED_BATCH, 10) tensor drawn from `stream`, uniform in
 * [-1, 1). */
static inline fsdp_status stacked_batch_rows(fsdp_ctx *ctx, uint64_t stream, int64_t off,
                                             int64_t len, fsdp_tensor **out) {
    fsdp_tensor *all;
    FSDP_TRY(
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){STACKED_BATCH, 10}, &all));
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
    fsdp_status st = fsdp_init_tensor(ctx, all, &init, 42, stream);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, 10}, out);
    if (st == FSDP_OK)
        memcpy(fsdp_tensor_f32(*out), fsdp_tensor_f32(all) + off * 10,
               (size_t)(len * 10) * sizeof(float));
    fsdp_tensor_free(all);
    return st;
}

/* Forward and backward of batch `s` on rows [off, off + len). A data-parallel rank scales its
 * gradient by the data-parallel size dp, which FSDP's averaging divides out again. */
static inline fsdp_status stacked_forward_backward(fsdp_ctx *ctx, fsdp_module *m, int s,
                                                   int64_t off, int64_t len, int dp) {
    fsdp_tensor *x = NULL, *y = NULL, *dy = NULL;
    const fsdp_tensor *out;
    fsdp_status st = stacked_batch_rows(ctx, 100 + 2 * (uint64_t)s, off, len, &x);
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 101 + 2 * (uint64_t)s, off, len, &y);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, out, &dy);
    if (st == FSDP_OK) {
        const float *o = fsdp_tensor_f32(out), *t = fsdp_tensor_f32(y);
        float *d = fsdp_tensor_f32(dy);
        for (int64_t i = 0; i < fsdp_tensor_numel(dy); i++)
            d[i] = 2.0f * (o[i] - t[i]) * (float)dp / (float)STACKED_BATCH;
        st = fsdp_module_backward(ctx, m, dy, NULL);
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    fsdp_tensor_free(dy);
    return st;
}

#endif

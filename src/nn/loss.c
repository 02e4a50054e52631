/* loss.c: sum, mean-squared-error and cross-entropy losses with their gradients. */
#include "fsdp/loss.h"
#include "core/error.h"
#include "kernels/kernels.h"

/* Checks out is f32 and dout (when given) is an f32 tensor of out's shape on its device. */
static fsdp_status check_grad_target(fsdp_ctx *ctx, const char *loss, const fsdp_tensor *out,
                                     const fsdp_tensor *dout) {
    char a[64], b[64];
    if (fsdp_tensor_dtype(out) != FSDP_DTYPE_F32)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "%s: the output is %s; losses take f32", loss,
                         fsdp_dtype_to_string(fsdp_tensor_dtype(out)));
    if (dout && (!fsdp_tensor_same_shape(out, dout) || fsdp_tensor_dtype(dout) != FSDP_DTYPE_F32 ||
                 fsdp_tensor_device(dout).type != fsdp_tensor_device(out).type))
        return FSDP_FAIL(
            ctx, FSDP_ERR_SHAPE,
            "%s: the gradient tensor %s must be f32 of the output's shape %s on its device", loss,
            fsdp_tensor_shape_string(dout, a, sizeof a),
            fsdp_tensor_shape_string(out, b, sizeof b));
    return FSDP_OK;
}

fsdp_status fsdp_loss_sum(fsdp_ctx *ctx, const fsdp_tensor *out, float *loss, fsdp_tensor *dout) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, loss);
    FSDP_TRY_AT(ctx, check_grad_target(ctx, "sum loss", out, dout));
    const fsdp_kernels_i *k = fsdp_kernels_for(fsdp_tensor_device(out));
    *loss = (float)k->sum(fsdp_tensor_f32(out), fsdp_tensor_numel(out));
    if (dout) k->fill(fsdp_tensor_f32(dout), 1.0f, fsdp_tensor_numel(dout));
    return FSDP_OK;
}

fsdp_status fsdp_loss_mse(fsdp_ctx *ctx, const fsdp_tensor *out, const fsdp_tensor *target,
                          float *loss, fsdp_tensor *dout) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, target);
    FSDP_ARG_NOT_NULL(ctx, loss);
    FSDP_TRY_AT(ctx, check_grad_target(ctx, "MSE loss", out, dout));
    if (!fsdp_tensor_same_shape(out, target) || fsdp_tensor_dtype(target) != FSDP_DTYPE_F32) {
        char a[64], b[64];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "MSE loss: target %s must be f32 of the output's shape %s",
                         fsdp_tensor_shape_string(target, a, sizeof a),
                         fsdp_tensor_shape_string(out, b, sizeof b));
    }
    if (fsdp_tensor_numel(out) == 0)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "MSE loss: the mean of an empty output is undefined");
    fsdp_kernels_for(fsdp_tensor_device(out))
        ->mse_loss(loss, dout ? fsdp_tensor_f32(dout) : NULL, fsdp_tensor_f32(out),
                   fsdp_tensor_f32(target), fsdp_tensor_numel(out));
    return FSDP_OK;
}

/* A copy of rows int32 targets on dev, held in a 4-byte tensor (the bits are moved, not read). */
static fsdp_status stage_targets(fsdp_ctx *ctx, const int32_t *targets, int64_t rows,
                                 fsdp_device dev, fsdp_tensor **out) {
    fsdp_tensor *host;
    FSDP_TRY_AT(ctx, fsdp_tensor_from_blob(ctx, (void *)targets, FSDP_DTYPE_F32, FSDP_CPU, 1, &rows,
                                           &host));
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, &rows, out);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, *out, host);
    fsdp_tensor_free(host);
    if (st != FSDP_OK) {
        fsdp_tensor_free(*out);
        *out = NULL;
    }
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_loss_cross_entropy(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                    const int32_t *targets, float *loss, fsdp_tensor *dlogits) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_ARG_NOT_NULL(ctx, targets);
    FSDP_ARG_NOT_NULL(ctx, loss);
    FSDP_TRY_AT(ctx, check_grad_target(ctx, "cross-entropy loss", logits, dlogits));
    if (fsdp_tensor_ndim(logits) != 2 || fsdp_tensor_dim(logits, 0) == 0) {
        char a[64];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "cross-entropy loss: logits %s must be (N, C) with N > 0",
                         fsdp_tensor_shape_string(logits, a, sizeof a));
    }
    int64_t rows = fsdp_tensor_dim(logits, 0), classes = fsdp_tensor_dim(logits, 1);
    for (int64_t i = 0; i < rows; i++)
        if (targets[i] < 0 || targets[i] >= classes)
            return FSDP_FAIL(
                ctx, FSDP_ERR_INVALID_ARGUMENT,
                "cross-entropy loss: target %d of row %lld is not a class in [0, %lld)", targets[i],
                (long long)i, (long long)classes);
    fsdp_device dev = fsdp_tensor_device(logits);
    fsdp_tensor *staged = NULL;
    if (dev.type != FSDP_DEVICE_CPU) /* the kernel reads the targets where the logits are */
        FSDP_TRY_AT(ctx, stage_targets(ctx, targets, rows, dev, &staged));
    fsdp_kernels_for(dev)->cross_entropy(
        loss, dlogits ? fsdp_tensor_f32(dlogits) : NULL, fsdp_tensor_f32(logits),
        staged ? fsdp_tensor_data(staged) : targets, rows, classes);
    fsdp_tensor_free(staged);
    return FSDP_OK;
}

fsdp_status fsdp_loss_cross_entropy_ignore(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float *loss, fsdp_tensor *dlogits) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_ARG_NOT_NULL(ctx, targets);
    FSDP_ARG_NOT_NULL(ctx, loss);
    const char *what = "cross-entropy loss (ignore_index)";
    FSDP_TRY_AT(ctx, check_grad_target(ctx, what, logits, dlogits));
    if (fsdp_tensor_ndim(logits) < 2 || fsdp_tensor_dim(logits, -1) == 0) {
        char a[64];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: logits %s must be (..., C) with C > 0", what,
                         fsdp_tensor_shape_string(logits, a, sizeof a));
    }
    int64_t classes = fsdp_tensor_dim(logits, -1), rows = fsdp_tensor_numel(logits) / classes;
    for (int64_t i = 0; i < rows; i++)
        if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= classes))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: target %d of row %lld is neither a class in [0, %lld) nor the "
                             "ignore index %d",
                             what, targets[i], (long long)i, (long long)classes, ignore_index);
    fsdp_device dev = fsdp_tensor_device(logits);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    if (!k || !k->cross_entropy_ignore)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE, "%s: no kernel for %s tensors yet; use the CPU",
                         what, fsdp_device_to_string(dev));
    fsdp_tensor *staged = NULL;
    if (dev.type != FSDP_DEVICE_CPU) /* the kernel reads the targets where the logits are */
        FSDP_TRY_AT(ctx, stage_targets(ctx, targets, rows, dev, &staged));
    k->cross_entropy_ignore(loss, dlogits ? fsdp_tensor_f32(dlogits) : NULL,
                            fsdp_tensor_f32(logits), staged ? fsdp_tensor_data(staged) : targets,
                            ignore_index, rows, classes);
    fsdp_tensor_free(staged);
    return FSDP_OK;
}

fsdp_status fsdp_loss_scale_grad(fsdp_ctx *ctx, fsdp_tensor *dout, float factor) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, dout);
    if (fsdp_tensor_dtype(dout) != FSDP_DTYPE_F32 || !fsdp_tensor_has_storage(dout))
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "fsdp_loss_scale_grad: the gradient is %s%s; it takes an f32 tensor "
                         "with storage",
                         fsdp_dtype_to_string(fsdp_tensor_dtype(dout)),
                         fsdp_tensor_has_storage(dout) ? "" : " without storage");
    float *d = fsdp_tensor_f32(dout);
    fsdp_kernels_for(fsdp_tensor_device(dout))->scale(d, d, factor, fsdp_tensor_numel(dout));
    return FSDP_OK;
}

/* loss.c: sum, mean-squared-error and cross-entropy losses with their gradients (cross-entropy
 * over f32 or bf16 logits). */
#include <stdint.h>

#include "core/error.h"
#include "fsdp/loss.h"
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
    fsdp_status st = fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_F32, dev, 1, &rows, out);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, *out, host);
    fsdp_tensor_free(host);
    if (st != FSDP_OK) {
        fsdp_tensor_free(*out);
        *out = NULL;
    }
    return FSDP_PASS(ctx, st);
}

/* Logits f32 or bf16; dlogits (when given) of their shape on their device, f32, or bf16 when the
 * logits are bf16; a device whose table has the entry the dtypes need. *k: that table. */
static fsdp_status check_logits(fsdp_ctx *ctx, const char *what, const fsdp_tensor *logits,
                                const fsdp_tensor *dlogits, const fsdp_kernels_i **k) {
    fsdp_dtype lt = fsdp_tensor_dtype(logits);
    if (lt != FSDP_DTYPE_F32 && lt != FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "%s: the logits are %s; it takes f32 or bf16 logits",
                         what, fsdp_dtype_to_string(lt));
    fsdp_dtype dt = dlogits ? fsdp_tensor_dtype(dlogits) : lt;
    if (dlogits && lt == FSDP_DTYPE_F32 && dt == FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: a bf16 gradient is written for bf16 logits only (a Llama with "
                         "logits_dtype FSDP_DTYPE_BF16); the logits are f32: pass an f32 dlogits",
                         what);
    char a[64], b[64];
    if (dlogits && (!fsdp_tensor_same_shape(logits, dlogits) ||
                    (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16) ||
                    fsdp_tensor_device(dlogits).type != fsdp_tensor_device(logits).type))
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: the gradient tensor %s (%s) must be f32%s of the logits' shape %s on "
                         "their device",
                         what, fsdp_tensor_shape_string(dlogits, a, sizeof a),
                         fsdp_dtype_to_string(dt), lt == FSDP_DTYPE_BF16 ? " or bf16" : "",
                         fsdp_tensor_shape_string(logits, b, sizeof b));
    fsdp_device dev = fsdp_tensor_device(logits);
    *k = fsdp_kernels_for(dev);
    bool has = *k && (lt == FSDP_DTYPE_BF16 ? (*k)->cross_entropy_ignore_bf16 != NULL
                                            : (*k)->cross_entropy_ignore != NULL);
    if (!has)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE, "%s: no kernel for %s %s logits yet; use the CPU",
                         what, fsdp_device_to_string(dev), fsdp_dtype_to_string(lt));
    return FSDP_OK;
}

/* The kernel over rows (targets checked): stages the targets on a device, runs the f32 entry
 * (cross_entropy when plain, else cross_entropy_ignore) or the bf16 one. */
static fsdp_status run_cross_entropy(fsdp_ctx *ctx, const fsdp_kernels_i *k, bool plain,
                                     const fsdp_tensor *logits, const int32_t *targets,
                                     int32_t ignore_index, int64_t rows, int64_t classes,
                                     float *loss, fsdp_tensor *dlogits) {
    fsdp_device dev = fsdp_tensor_device(logits);
    fsdp_tensor *staged = NULL;
    if (dev.type != FSDP_DEVICE_CPU) /* the kernel reads the targets where the logits are */
        FSDP_TRY_AT(ctx, stage_targets(ctx, targets, rows, dev, &staged));
    const int32_t *t = staged ? fsdp_tensor_data(staged) : targets;
    void *d = dlogits ? fsdp_tensor_data(dlogits) : NULL;
    if (fsdp_tensor_dtype(logits) == FSDP_DTYPE_BF16)
        k->cross_entropy_ignore_bf16(loss, d, dlogits ? fsdp_tensor_dtype(dlogits) : FSDP_DTYPE_F32,
                                     fsdp_tensor_data(logits), t, ignore_index, rows, classes);
    else if (plain)
        k->cross_entropy(loss, d, fsdp_tensor_f32(logits), t, rows, classes);
    else
        k->cross_entropy_ignore(loss, d, fsdp_tensor_f32(logits), t, ignore_index, rows, classes);
    fsdp_tensor_free(staged);
    return FSDP_OK;
}

fsdp_status fsdp_loss_cross_entropy(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                    const int32_t *targets, float *loss, fsdp_tensor *dlogits) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_ARG_NOT_NULL(ctx, targets);
    FSDP_ARG_NOT_NULL(ctx, loss);
    const fsdp_kernels_i *k = NULL;
    FSDP_TRY_AT(ctx, check_logits(ctx, "cross-entropy loss", logits, dlogits, &k));
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
    /* bf16 logits: no target is INT32_MIN, so no row is ignored (the f32 entry's bits, N > 0) */
    return run_cross_entropy(ctx, k, true, logits, targets, INT32_MIN, rows, classes, loss,
                             dlogits);
}

fsdp_status fsdp_loss_cross_entropy_ignore(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float *loss, fsdp_tensor *dlogits) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_ARG_NOT_NULL(ctx, targets);
    FSDP_ARG_NOT_NULL(ctx, loss);
    const char *what = "cross-entropy loss (ignore_index)";
    const fsdp_kernels_i *k = NULL;
    FSDP_TRY_AT(ctx, check_logits(ctx, what, logits, dlogits, &k));
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
    return run_cross_entropy(ctx, k, false, logits, targets, ignore_index, rows, classes, loss,
                             dlogits);
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

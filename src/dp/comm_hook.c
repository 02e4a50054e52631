/* comm_hook.c: the one body that reduces a data-parallel gradient (a replicate bucket or an FSDP
 * unit's flat gradient) over its group: the built-in hooks (average in f32, or cast to bf16/f16,
 * reduce in that dtype, cast back) and the call of a user hook; and the checks of a hook. */
#include <stdlib.h>

#include "core/error.h"
#include "dp/dp_impl.h"
#include "fsdp/comm_hook.h"
#include "kernels/kernels.h"

const char *fsdp_comm_hook_kind_to_string(fsdp_comm_hook_kind kind) {
    static const char *names[] = {"default", "bf16", "fp16", "user"};
    return (int)kind >= 0 && kind < FSDP_COMM_HOOK_KIND_COUNT ? names[kind] : "unknown";
}

fsdp_status fsdp_dp_check_hook(fsdp_ctx *ctx, const fsdp_comm_hook *hook, const char *who) {
    if ((int)hook->kind < 0 || hook->kind >= FSDP_COMM_HOOK_KIND_COUNT)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: unknown comm_hook kind %d; use FSDP_COMM_HOOK_DEFAULT, _BF16, _FP16 "
                         "or _USER",
                         who, (int)hook->kind);
    if (hook->kind == FSDP_COMM_HOOK_USER && !hook->fn)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: comm_hook kind FSDP_COMM_HOOK_USER needs .fn, the function that "
                         "reduces a bucket",
                         who);
    if (hook->kind != FSDP_COMM_HOOK_USER && hook->fn)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: comm_hook .fn is set but the kind is %s; set .kind = "
                         "FSDP_COMM_HOOK_USER to use it",
                         who, fsdp_comm_hook_kind_to_string(hook->kind));
    return FSDP_OK;
}

fsdp_status fsdp_dp_check_mixed_precision(fsdp_ctx *ctx, const fsdp_mixed_precision *mp,
                                          const fsdp_comm_hook *hook, const char *who) {
    const fsdp_dtype *dt[2] = {&mp->param_dtype, &mp->reduce_dtype};
    for (int i = 0; i < 2; i++)
        if (*dt[i] != FSDP_DTYPE_F32 && *dt[i] != FSDP_DTYPE_BF16 && *dt[i] != FSDP_DTYPE_F16)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: mixed_precision.%s is %s (%d); use FSDP_DTYPE_F32, "
                             "FSDP_DTYPE_BF16 or FSDP_DTYPE_F16",
                             who, i ? "reduce_dtype" : "param_dtype", fsdp_dtype_to_string(*dt[i]),
                             (int)*dt[i]);
    if (mp->reduce_dtype != FSDP_DTYPE_F32 && hook->kind != FSDP_COMM_HOOK_DEFAULT)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: mixed_precision.reduce_dtype is %s and comm_hook is %s: both choose "
                         "how gradients are reduced; keep one (reduce_dtype f32, or the default "
                         "hook)",
                         who, fsdp_dtype_to_string(mp->reduce_dtype),
                         fsdp_comm_hook_kind_to_string(hook->kind));
    return FSDP_OK;
}

fsdp_dtype fsdp_dp_hook_dtype(fsdp_comm_hook_kind kind, fsdp_dtype reduce_dtype) {
    return kind == FSDP_COMM_HOOK_BF16   ? FSDP_DTYPE_BF16
           : kind == FSDP_COMM_HOOK_FP16 ? FSDP_DTYPE_F16
                                         : reduce_dtype;
}

float fsdp_dp_inverse(double factor) {
    return (float)(1.0 / factor);
}

static void divide(fsdp_tensor *t, double factor) {
    if (factor == 1.0) return;
    fsdp_kernels_for(fsdp_tensor_device(t))
        ->scale(fsdp_tensor_f32(t), fsdp_tensor_f32(t), fsdp_dp_inverse(factor),
                fsdp_tensor_numel(t));
}

fsdp_status fsdp_dp_round(fsdp_ctx *ctx, fsdp_tensor *low, fsdp_tensor *grad, double pre) {
    divide(grad, pre);
    return FSDP_PASS(ctx, fsdp_tensor_copy(ctx, low, grad)); /* round once */
}

fsdp_status fsdp_dp_widen(fsdp_ctx *ctx, fsdp_tensor *res, const fsdp_tensor *low, double post) {
    FSDP_TRY_AT(ctx, fsdp_tensor_copy(ctx, res, low)); /* exact */
    divide(res, post);
    return FSDP_OK;
}

/* The reduction of `in` over the group into `out` (reduce_scatter) or in place (all_reduce; a
 * group of one rank: nothing), then over the replicate group. Returns the tensor holding the
 * result in *res. */
static fsdp_status reduce_in(fsdp_ctx *ctx, const fsdp_dp_reduce_args *a, fsdp_tensor *in,
                             fsdp_tensor *out, fsdp_tensor **res) {
    if (out)
        FSDP_TRY_AT(ctx, fsdp_reduce_scatter(ctx, a->group, out, in, 0, FSDP_REDUCE_SUM));
    else if (fsdp_group_size(a->group) > 1)
        FSDP_TRY_AT(ctx, fsdp_all_reduce(ctx, a->group, in, FSDP_REDUCE_SUM));
    *res = out ? out : in;
    if (a->replicate) FSDP_TRY_AT(ctx, fsdp_all_reduce(ctx, a->replicate, *res, FSDP_REDUCE_SUM));
    return FSDP_OK;
}

fsdp_status fsdp_dp_reduce(fsdp_ctx *ctx, const fsdp_dp_reduce_args *a) {
    if (a->hook->kind == FSDP_COMM_HOOK_USER) {
        fsdp_comm_bucket b = {
            .grad = a->grad, .output = a->out, .group = a->group, .index = a->index};
        return a->hook->fn(ctx, &b, a->hook->user);
    }
    fsdp_dtype dtype = fsdp_dp_hook_dtype(a->hook->kind, a->reduce_dtype);
    fsdp_tensor *res, *low;
    if (dtype != FSDP_DTYPE_F32) {
        FSDP_TRY_AT(ctx, fsdp_dp_round(ctx, a->low_grad, a->grad, a->pre));
        FSDP_TRY_AT(ctx, reduce_in(ctx, a, a->low_grad, a->out ? a->low_out : NULL, &low));
        return FSDP_PASS(ctx, fsdp_dp_widen(ctx, a->out ? a->out : a->grad, low, a->post));
    }
    divide(a->grad, a->pre);
    FSDP_TRY_AT(ctx, reduce_in(ctx, a, a->grad, a->out, &res));
    divide(res, a->post);
    return FSDP_OK;
}

fsdp_status fsdp_comm_hook_run(fsdp_ctx *ctx, fsdp_comm_hook_kind kind,
                               const fsdp_comm_bucket *bucket) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, bucket);
    const fsdp_comm_bucket *b = bucket;
    if ((int)kind < 0 || kind >= FSDP_COMM_HOOK_USER)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_comm_hook_run: kind %s is not a built-in hook; use "
                         "FSDP_COMM_HOOK_DEFAULT, _BF16 or _FP16",
                         fsdp_comm_hook_kind_to_string(kind));
    if (!b->grad || !b->group)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_comm_hook_run: the bucket's %s is NULL", b->grad ? "group" : "grad");
    int W = fsdp_group_size(b->group);
    int64_t n = fsdp_tensor_numel(b->grad);
    if (!fsdp_tensor_f32(b->grad) || fsdp_tensor_ndim(b->grad) != 1 ||
        (b->output && (!fsdp_tensor_f32(b->output) || fsdp_tensor_ndim(b->output) != 1 ||
                       fsdp_tensor_numel(b->output) * W != n)))
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "fsdp_comm_hook_run: the bucket's grad must be a 1-D f32 tensor with "
                         "storage, and its output NULL or 1-D f32 of numel(grad) / %d elements "
                         "(the group size)",
                         W);
    fsdp_dp_reduce_args a = {.hook = &(fsdp_comm_hook){.kind = kind},
                             .reduce_dtype = FSDP_DTYPE_F32,
                             .group = b->group,
                             .pre = W,
                             .post = 1.0,
                             .index = b->index,
                             .grad = b->grad,
                             .out = b->output};
    fsdp_dtype dtype = fsdp_dp_hook_dtype(kind, FSDP_DTYPE_F32);
    fsdp_status st = FSDP_OK;
    fsdp_device dev = fsdp_tensor_device(b->grad);
    if (dtype != FSDP_DTYPE_F32) {
        /* written whole: the gradient rounded into low_grad, the reduction into low_out */
        st = fsdp_tensor_create_uninit(ctx, dtype, dev, 1, &n, &a.low_grad);
        int64_t m = n / W;
        if (st == FSDP_OK && b->output)
            st = fsdp_tensor_create_uninit(ctx, dtype, dev, 1, &m, &a.low_out);
    }
    if (st == FSDP_OK) st = fsdp_dp_reduce(ctx, &a);
    fsdp_tensor_free(a.low_grad);
    fsdp_tensor_free(a.low_out);
    return FSDP_PASS(ctx, st);
}

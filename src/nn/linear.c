/* linear.c: Linear, y = x W^T + b over the last dimension, in f32 or under the bf16 compute
 * policy (fsdp_module_set_autocast). The feature counts are read from the weight's current
 * shape, so a tensor-parallel shard of the weight just works. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_release_storage
#include "fsdp/layers.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"

typedef struct linear {
    fsdp_param *weight;       /* (out, in) */
    fsdp_param *bias;         /* (out), or NULL */
    const fsdp_tensor *input; /* (rows, in), kept for backward */
    fsdp_tensor *output;      /* (rows, out) */
    fsdp_tensor *dinput;      /* (rows, in) */
    fsdp_dtype compute;       /* FSDP_DTYPE_F32, or FSDP_DTYPE_BF16: the GEMMs' inputs */
    fsdp_dtype last_compute;  /* the policy the last forward ran (its backward follows it) */
    fsdp_tensor *x16, *w16;   /* bf16: (rows, in) and (out, in), rounded in forward, kept */
    /* The weight's bf16 copy the last forward read: the weight's mirror (mirror.c), rounded
     * only when the mirror is not current (an AdamW step writes it), or w16 when the weight
     * can carry none (FSDP manages it). Not owned. */
    const fsdp_tensor *w16_read;
    fsdp_tensor *y16; /* bf16: (rows, max(out, in)), the rounding of outputs and dy */

    /* bf16 storage under the policy: a bf16 input is kept as the GEMMs' copy (no x16); with
     * bf16_out (the parent asks: fsdp_nn_linear_set_bf16_output) and no bias, the output is
     * output16, a bf16 tensor. last_out: output or output16, of the last forward. bf16_grad (the
     * parent or the loss gives a bf16 output gradient: fsdp_nn_linear_set_bf16_grad): a forward
     * with output16 makes no y16, which only an f32 output gradient needs. */
    bool bf16_out, bf16_grad;
    fsdp_tensor *output16;
    const fsdp_tensor *last_out;
    /* dx_unrounded: the parent sums the bf16-policy input gradient with a rounding kernel
     * (fsdp_nn_linear_set_dx_unrounded), so backward leaves it unrounded; dx16: the parent reads
     * it as a bf16 tensor (fsdp_nn_linear_set_bf16_dx), dinput16, written by gemm_bf16_round */
    bool dx_unrounded, dx16;
    fsdp_tensor *dinput16;
    /* dx_partial: the input gradient is a Partial addend a layer above sums over ranks
     * (fsdp_nn_linear_set_dx_partial): under the policy it is left in f32, unrounded */
    bool dx_partial;
} linear;

/* The bf16 policy's input gradient: rounded in place (f32), left unrounded for the parent's
 * rounding sum, or written in bf16 */
typedef enum dx_form { DX_ROUNDED, DX_UNROUNDED, DX_BF16 } dx_form;

static void linear_free(void *impl) {
    linear *l = impl;
    fsdp_tensor_free(l->output);
    fsdp_tensor_free(l->output16);
    fsdp_tensor_free(l->dinput);
    fsdp_tensor_free(l->dinput16);
    fsdp_tensor_free(l->x16);
    fsdp_tensor_free(l->w16);
    fsdp_tensor_free(l->y16);
    free(l);
}

/* ---- the bf16 compute policy: every GEMM reads bf16 copies of its inputs and accumulates in
 * f32 (gemm_bf16); its output is rounded to bf16 where a GPU writes a bf16 tensor (the output
 * and the input gradient), and the weight gradient is accumulated in f32 into the f32 gradient
 * (as Megatron's fused weight-gradient accumulation). The rounded values are stored widened in
 * the f32 tensors the other layers read, so they compute on exactly the GPU's inputs. A bf16
 * input (a layer that rounds its output for this Linear, as LlamaMLP's SwiGLU) is the bf16 copy
 * itself: read in forward and backward as is, with no x16 of its own. ---- */

/* *t: a bf16 buffer of shape (rows, cols) on device (reused when large enough). */
static fsdp_status bf16_buffer(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_device device, int64_t rows,
                               int64_t cols) {
    return fsdp_nn_buffer_dtype(ctx, t, FSDP_DTYPE_BF16, device, 2, (int64_t[]){rows, cols});
}

/* The bf16 copy of the input the GEMMs read: the input itself when it is bf16, else x16. */
static const fsdp_bf16 *kept_x16(const linear *l, const fsdp_tensor *in) {
    return fsdp_tensor_data(fsdp_tensor_dtype(in) == FSDP_DTYPE_BF16 ? in : l->x16);
}

/* y (rows, OC) = bf16(bf16(x) bf16(W)^T + b): x16 (or the bf16 input) and the weight's copy
 * (w16_read) are kept for backward; the copy is not rounded again while the weight's mirror is
 * current. With out16 (no bias) y is output16, written in bf16 by gemm_bf16_round; without a
 * bias the f32 y is that written into y16 and widened (2 + 6 bytes an element moved, against 4
 * for an f32 GEMM output and 8 more to round it in place); with a bias, the f32 GEMM and bias
 * epilogue, then the rounding in place (round_bf16). The same bits every way. */
static fsdp_status bf16_forward(fsdp_ctx *ctx, linear *l, const fsdp_kernels_i *k,
                                const fsdp_tensor *in, int64_t rows, int64_t OC, int64_t C,
                                bool bias, bool out16) {
    fsdp_device dev = fsdp_tensor_device(in);
    if (fsdp_tensor_dtype(in) == FSDP_DTYPE_BF16) {
        if (l->x16) fsdp_tensor_release_storage(l->x16); /* an f32 input's copy, not needed now */
    } else {
        FSDP_TRY_AT(ctx, bf16_buffer(ctx, &l->x16, dev, rows, C));
        k->f32_to_bf16(fsdp_tensor_data(l->x16), fsdp_tensor_f32(in), rows * C);
    }
    fsdp_tensor *mirror;
    bool current;
    FSDP_TRY_AT(ctx, fsdp_nn_param_mirror(ctx, l->weight, &mirror, &current));
    if (mirror && l->w16) fsdp_tensor_release_storage(l->w16); /* the copy before a mirror */
    if (!mirror) FSDP_TRY_AT(ctx, bf16_buffer(ctx, &l->w16, dev, OC, C));
    l->w16_read = mirror ? mirror : l->w16;
    if (!out16 || !l->bf16_grad) /* else a backward given an f32 gradient makes it */
        FSDP_TRY_AT(ctx, bf16_buffer(ctx, &l->y16, dev, rows, OC > C ? OC : C));
    const fsdp_bf16 *x16 = kept_x16(l, in);
    fsdp_bf16 *w16 = fsdp_tensor_data(l->w16_read);
    if (!current) {
        k->f32_to_bf16(w16, fsdp_tensor_f32(l->weight->data), OC * C);
        if (mirror) fsdp_nn_param_mirror_written(l->weight); /* after the pointer was taken */
    }
    if (out16) {
        k->gemm_bf16_round(false, true, rows, OC, C, x16, C, w16, C, fsdp_tensor_data(l->output16),
                           OC);
        return FSDP_OK;
    }
    float *y = fsdp_tensor_f32(l->output);
    if (!bias && k->gemm_bf16_round) {
        fsdp_bf16 *y16 = fsdp_tensor_data(l->y16);
        k->gemm_bf16_round(false, true, rows, OC, C, x16, C, w16, C, y16, OC);
        k->bf16_to_f32(y, y16, rows * OC);
        return FSDP_OK;
    }
    k->gemm_bf16_bias_act(y, NULL, x16, w16, bias ? fsdp_tensor_f32(l->bias->data) : NULL, rows, C,
                          OC, FSDP_GEMM_ACT_NONE);
    k->round_bf16(y, rows * OC);
    return FSDP_OK;
}

/* dW (OC, C) += bf16(dy)^T x16 in f32; dx (rows, C) = bf16(bf16(dy) w16), or unrounded when
 * `unrounded` (the parent rounds it as it sums it); the bias gradient sums dy in f32 (not
 * bf16(dy), which is all a bias-gradient epilogue of the bf16 GEMM could read: so it stays a
 * separate entry). A bf16 dout is bf16(dy) itself, read as is (no y16; check_dout refuses it
 * when a bias gradient would need the f32 dy). */
static fsdp_status bf16_backward(fsdp_ctx *ctx, linear *l, const fsdp_kernels_i *k,
                                 const fsdp_tensor *dout, const fsdp_tensor **din, int64_t rows,
                                 int64_t OC, int64_t C, dx_form form) {
    const fsdp_bf16 *x16 = kept_x16(l, l->input), *w16 = fsdp_tensor_data(l->w16_read);
    const fsdp_bf16 *dy16 = fsdp_tensor_data(dout);
    const float *dy = NULL;
    if (fsdp_tensor_dtype(dout) == FSDP_DTYPE_F32) {
        FSDP_TRY_AT(ctx,
                    bf16_buffer(ctx, &l->y16, fsdp_tensor_device(dout), rows, OC > C ? OC : C));
        dy = fsdp_tensor_f32(dout);
        k->f32_to_bf16(fsdp_tensor_data(l->y16), dy, rows * OC);
        dy16 = fsdp_tensor_data(l->y16);
    }
    if (l->weight->requires_grad)
        k->gemm_bf16(true, false, OC, C, rows, 1.0f, dy16, OC, x16, C, 1.0f,
                     fsdp_tensor_f32(l->weight->grad), C);
    if (l->bias && l->bias->requires_grad && !l->bias->hook_applied)
        k->bias_backward(fsdp_tensor_f32(l->bias->grad), dy, rows, OC);
    if (!din) return FSDP_OK;
    fsdp_device dev = fsdp_tensor_device(dout);
    int nd = fsdp_tensor_ndim(l->input);
    const int64_t *shape = fsdp_tensor_shape(l->input);
    if (form == DX_BF16) { /* the GEMM's f32 sums rounded as they are stored: 2 bytes, one pass */
        FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &l->dinput16, FSDP_DTYPE_BF16, dev, nd, shape));
        k->gemm_bf16_round(false, false, rows, C, OC, dy16, OC, w16, C,
                           fsdp_tensor_data(l->dinput16), C);
        *din = l->dinput16;
        return FSDP_OK;
    }
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &l->dinput, dev, nd, shape));
    float *dx = fsdp_tensor_f32(l->dinput);
    k->gemm_bf16(false, false, rows, C, OC, 1.0f, dy16, OC, w16, C, 0.0f, dx, C);
    /* rounded in place (gemm_bf16_round would need a second scratch), unless the parent does */
    if (form == DX_ROUNDED) k->round_bf16(dx, rows * C);
    *din = l->dinput;
    return FSDP_OK;
}

static fsdp_status linear_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                  const fsdp_tensor **out) {
    linear *l = m->impl;
    const fsdp_tensor *w = l->weight->data;
    int64_t OC = fsdp_tensor_dim(w, 0), C = fsdp_tensor_dim(w, 1);
    if (fsdp_tensor_dtype(in) == FSDP_DTYPE_BF16 && l->compute != FSDP_DTYPE_BF16) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: input is bf16, which a Linear reads only under the bf16 compute "
                         "policy; set it with fsdp_module_set_autocast(ctx, m, FSDP_DTYPE_BF16), "
                         "or pass an f32 input",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    FSDP_TRY_AT(ctx, fsdp_nn_check_input_bf16(ctx, m, in, C, l->compute == FSDP_DTYPE_BF16));
    int64_t rows = fsdp_tensor_numel(in) / (C ? C : 1);
    int64_t shape[FSDP_MAX_DIMS];
    int nd = fsdp_tensor_ndim(in);
    for (int i = 0; i < nd; i++) shape[i] = fsdp_tensor_dim(in, i);
    shape[nd - 1] = OC;
    fsdp_device dev = fsdp_tensor_device(in);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    bool out16 = l->compute == FSDP_DTYPE_BF16 && l->bf16_out && !l->bias && k->gemm_bf16_round;
    fsdp_tensor **o = out16 ? &l->output16 : &l->output, *unused = out16 ? l->output : l->output16;
    /* the other kind's storage, of an earlier forward, is not needed */
    if (unused) fsdp_tensor_release_storage(unused);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, o, out16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32, dev, nd,
                                          shape));
    bool bias = l->bias && !l->bias->hook_applied;
    l->last_compute = l->compute;
    l->last_out = *o;
    if (l->compute == FSDP_DTYPE_BF16) {
        FSDP_TRY_AT(ctx, bf16_forward(ctx, l, k, in, rows, OC, C, bias, out16));
    } else {
        k->gemm_bias_act(fsdp_tensor_f32(l->output), NULL, fsdp_tensor_f32(in), fsdp_tensor_f32(w),
                         bias ? fsdp_tensor_f32(l->bias->data) : NULL, rows, C, OC,
                         FSDP_GEMM_ACT_NONE);
    }
    l->input = in;
    *out = l->last_out;
    return FSDP_OK;
}

/* dout is f32, or bf16 under the bf16 compute policy when no bias gradient needs the f32 sums
 * (the Linear's own, or a TP style's when it applies the bias: it sums the f32 gradient too). */
static fsdp_status check_dout(fsdp_ctx *ctx, const fsdp_module *m, const linear *l,
                              const fsdp_tensor *dout) {
    fsdp_dtype dt = fsdp_tensor_dtype(dout);
    if (dt == FSDP_DTYPE_F32) return FSDP_OK;
    char desc[160];
    if (dt != FSDP_DTYPE_BF16 || l->last_compute != FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: the output gradient is %s; a Linear takes f32, or bf16 under the "
                         "bf16 compute policy (fsdp_module_set_autocast) that its last forward ran",
                         fsdp_nn_describe(m, desc, sizeof desc), fsdp_dtype_to_string(dt));
    if (l->bias && l->bias->requires_grad)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: a bf16 output gradient is taken by a Linear without a bias gradient "
                         "(its sums read the f32 gradient); pass an f32 output gradient",
                         fsdp_nn_describe(m, desc, sizeof desc));
    return FSDP_OK;
}

static fsdp_status linear_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                   const fsdp_tensor **din) {
    linear *l = m->impl;
    const fsdp_tensor *w = l->weight->data;
    int64_t OC = fsdp_tensor_dim(w, 0), C = fsdp_tensor_dim(w, 1);
    if (!l->input || !l->last_out || !fsdp_tensor_same_shape(dout, l->last_out)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: backward needs a forward first, and an output gradient of the "
                         "output's shape",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    FSDP_TRY_AT(ctx, check_dout(ctx, m, l, dout));
    int64_t rows = fsdp_tensor_numel(dout) / (OC ? OC : 1);
    const fsdp_kernels_i *k = fsdp_kernels_for(fsdp_tensor_device(dout));
    if (l->last_compute == FSDP_DTYPE_BF16) {
        /* both read a hook-free post-backward (an acting hook reads dx as the GPU writes it) */
        bool free_dx = fsdp_nn_linear_can_leave_dx_unrounded(m);
        dx_form form = l->dx_partial                              ? DX_UNROUNDED
                       : l->dx16 && free_dx && k->gemm_bf16_round ? DX_BF16
                       : l->dx_unrounded && free_dx               ? DX_UNROUNDED
                                                                  : DX_ROUNDED;
        return bf16_backward(ctx, l, k, dout, din, rows, OC, C, form);
    }
    const float *dy = fsdp_tensor_f32(dout), *x = fsdp_tensor_f32(l->input);
    float *db = l->bias && l->bias->requires_grad && !l->bias->hook_applied
                    ? fsdp_tensor_f32(l->bias->grad)
                    : NULL;
    if (l->weight->requires_grad) /* dW (OC, C) += dy^T (OC, rows) @ x (rows, C), db += sums */
        k->gemm_bgrad(fsdp_tensor_f32(l->weight->grad), db, dy, x, rows, C, OC);
    else if (db)
        k->bias_backward(db, dy, rows, OC);
    if (din) { /* dx (rows, C) = dy (rows, OC) @ W (OC, C) */
        FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &l->dinput, fsdp_tensor_device(dout),
                                        fsdp_tensor_ndim(l->input), fsdp_tensor_shape(l->input)));
        k->gemm(false, false, rows, C, OC, 1.0f, dy, OC, fsdp_tensor_f32(w), C, 0.0f,
                fsdp_tensor_f32(l->dinput), C);
        *din = l->dinput;
    }
    return FSDP_OK;
}

static const fsdp_module_ops linear_ops = {.kind = "Linear",
                                           .forward = linear_forward,
                                           .backward = linear_backward,
                                           .free_impl = linear_free};

bool fsdp_nn_is_linear(const fsdp_module *m) {
    return m && m->ops == &linear_ops;
}

fsdp_param *fsdp_nn_linear_weight(const fsdp_module *m) {
    return fsdp_nn_is_linear(m) ? ((const linear *)m->impl)->weight : NULL;
}

fsdp_dtype fsdp_nn_linear_compute(const fsdp_module *m) {
    return fsdp_nn_is_linear(m) ? ((const linear *)m->impl)->compute : FSDP_DTYPE_F32;
}

void fsdp_nn_linear_set_bf16_output(fsdp_module *m, bool on) {
    if (fsdp_nn_is_linear(m)) ((linear *)m->impl)->bf16_out = on;
}

void fsdp_nn_linear_set_bf16_grad(fsdp_module *m, bool on) {
    if (fsdp_nn_is_linear(m)) ((linear *)m->impl)->bf16_grad = on;
}

bool fsdp_nn_linear_takes_bf16_grad(const fsdp_module *m, bool next) {
    if (!fsdp_nn_is_linear(m)) return false;
    const linear *l = m->impl;
    return (next ? l->compute : l->last_compute) == FSDP_DTYPE_BF16 &&
           !(l->bias && l->bias->requires_grad);
}

bool fsdp_nn_linear_can_leave_dx_unrounded(const fsdp_module *m) {
    return fsdp_nn_is_linear(m) && ((const linear *)m->impl)->last_compute == FSDP_DTYPE_BF16 &&
           fsdp_nn_num_acting_hooks(m, FSDP_HOOK_POST_BACKWARD) == 0;
}

bool fsdp_nn_linear_can_give_bf16_output(const fsdp_module *m) {
    return fsdp_nn_is_linear(m) && ((const linear *)m->impl)->compute == FSDP_DTYPE_BF16 &&
           !((const linear *)m->impl)->bias &&
           fsdp_nn_num_acting_hooks(m, FSDP_HOOK_POST_FORWARD) == 0;
}

void fsdp_nn_linear_set_dx_unrounded(fsdp_module *m, bool on) {
    if (fsdp_nn_is_linear(m)) ((linear *)m->impl)->dx_unrounded = on;
}

void fsdp_nn_linear_set_dx_partial(fsdp_module *m, bool on) {
    if (fsdp_nn_is_linear(m)) ((linear *)m->impl)->dx_partial = on;
}

void fsdp_nn_linear_set_bf16_dx(fsdp_module *m, bool on) {
    if (fsdp_nn_is_linear(m)) ((linear *)m->impl)->dx16 = on;
}

fsdp_status fsdp_nn_linear_create_tied(fsdp_ctx *ctx, fsdp_param *weight, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, weight);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (fsdp_tensor_ndim(weight->data) != 2)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "a tied Linear needs a 2-d (out, in) weight; '%s' has %d dims",
                         weight->name, fsdp_tensor_ndim(weight->data));
    linear *l = calloc(1, sizeof *l);
    if (!l) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a Linear layer");
    l->weight = weight; /* not registered: its owner holds it */
    return fsdp_module_create(ctx, &linear_ops, l, out);
}

fsdp_status fsdp_linear_create(fsdp_ctx *ctx, int64_t in_features, int64_t out_features, bool bias,
                               fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (in_features <= 0 || out_features <= 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Linear(%lld, %lld): feature counts must be positive",
                         (long long)in_features, (long long)out_features);
    linear *l = calloc(1, sizeof *l);
    if (!l) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a Linear layer");
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &linear_ops, l, &m));
    float bound = 1.0f / sqrtf((float)in_features); /* PyTorch's nn.Linear default */
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = -bound, .b = bound};
    fsdp_status st = fsdp_module_add_param(
        ctx, m, "weight", 2, (int64_t[]){out_features, in_features}, init, &l->weight);
    if (st == FSDP_OK && bias)
        st = fsdp_module_add_param(ctx, m, "bias", 1, (int64_t[]){out_features}, init, &l->bias);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

/* Sets the policy of m when it is a Linear. */
static fsdp_status set_autocast(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    (void)ctx;
    if (fsdp_nn_is_linear(m)) ((linear *)m->impl)->compute = *(const fsdp_dtype *)user;
    return FSDP_OK;
}

fsdp_status fsdp_module_set_autocast(fsdp_ctx *ctx, fsdp_module *m, fsdp_dtype compute_dtype) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    if (compute_dtype != FSDP_DTYPE_F32 && compute_dtype != FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_module_set_autocast: compute dtype %s is not a policy; use "
                         "FSDP_DTYPE_BF16 (bf16 GEMM inputs, f32 accumulation) or FSDP_DTYPE_F32",
                         fsdp_dtype_to_string(compute_dtype));
    return fsdp_module_visit(ctx, m, set_autocast, &compute_dtype);
}

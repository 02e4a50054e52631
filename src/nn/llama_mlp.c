/* llama_mlp.c: the Llama feed-forward (SwiGLU), down_proj(silu(gate_proj(x)) * up_proj(x)),
 * with Hugging Face's child names (Meta's w1 = gate_proj, w3 = up_proj, w2 = down_proj). When
 * the three projections run the bf16 compute policy, the activations are kept in bf16 storage:
 * gate_proj and up_proj give their outputs (bf16 values under the policy) as bf16 tensors, the
 * SwiGLU reads them widened and writes its output rounded to bf16, which down_proj rounds to
 * anyway and reads as its bf16 copy. The same bits as the f32 storage, in half the bytes, and
 * without down_proj's own copy. A bf16 input (the decoder layer's norm output, rounded once for
 * gate_proj and up_proj) is passed to both as is; and when the decoder layer asks, down_proj's
 * output is given as a bf16 tensor, which its residual add widens as it reads. */
#include <stdlib.h>

#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_release_storage
#include "nn/llama_common.h"
#include "nn/module_impl.h"
#include "nn/nn.h" // defines: fsdp_nn_linear_compute, fsdp_nn_linear_set_bf16_output,
                   // fsdp_nn_linear_set_bf16_grad, fsdp_nn_linear_can_give_bf16_output,
                   // fsdp_nn_linear_set_bf16_dx

typedef struct llama_mlp {
    fsdp_module *gate_proj, *up_proj, *down_proj;
    bool bf16_out;                /* the parent asks for down_proj's output in bf16 (this call) */
    const fsdp_tensor *gate, *up; /* (rows, hidden): the projections' outputs, for backward:
                                   * f32, or bf16 under the policy */
    fsdp_tensor *hidden;          /* (rows, hidden) = silu(gate) * up, f32 */
    fsdp_tensor *hidden16;        /* (rows, hidden) the same rounded to bf16, under the policy */
    fsdp_tensor *dgate, *dup;     /* (rows, hidden), f32 */
    fsdp_tensor *dgate16, *dup16; /* (rows, hidden), the same rounded to bf16 for the projections
                                   * under the policy (fsdp_llama_grads16) */
    fsdp_tensor *dinput;          /* (rows, dim) */
} llama_mlp;

static void llama_mlp_free(void *impl) {
    llama_mlp *p = impl;
    fsdp_tensor_free(p->hidden);
    fsdp_tensor_free(p->hidden16);
    fsdp_tensor_free(p->dgate);
    fsdp_tensor_free(p->dup);
    fsdp_tensor_free(p->dgate16);
    fsdp_tensor_free(p->dup16);
    fsdp_tensor_free(p->dinput);
    free(p);
}

/* down_proj's forward of x into *out, its output asked in bf16 when the parent asks and it can */
static fsdp_status down_forward(fsdp_ctx *ctx, llama_mlp *p, const fsdp_tensor *x,
                                const fsdp_tensor **out) {
    bool o16 = p->bf16_out && fsdp_nn_linear_can_give_bf16_output(p->down_proj);
    fsdp_nn_linear_set_bf16_output(p->down_proj, o16);
    fsdp_status st = fsdp_module_forward(ctx, p->down_proj, x, out);
    fsdp_nn_linear_set_bf16_output(p->down_proj, false); /* for this call only */
    return FSDP_PASS(ctx, st);
}

static fsdp_status llama_mlp_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                     const fsdp_tensor **out) {
    llama_mlp *p = m->impl;
    if (fsdp_tensor_dtype(in) == FSDP_DTYPE_BF16 && !fsdp_llama_mlp_reads_bf16(m)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: input is bf16, which the MLP takes only when gate_proj and up_proj "
                         "run the bf16 compute policy (fsdp_module_set_autocast(ctx, m, "
                         "FSDP_DTYPE_BF16) on it); pass an f32 input otherwise",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    fsdp_device dev = fsdp_tensor_device(in);
    const fsdp_kernels_i *k;
    LLAMA_KERNELS(ctx, m, dev, swiglu_forward, k);
    bool b16 = fsdp_nn_linear_compute(p->gate_proj) == FSDP_DTYPE_BF16 &&
               fsdp_nn_linear_compute(p->up_proj) == FSDP_DTYPE_BF16 &&
               fsdp_nn_linear_compute(p->down_proj) == FSDP_DTYPE_BF16 && k->swiglu_forward_bf16 &&
               k->swiglu_backward_bf16;
    fsdp_module *const proj[2] = {p->gate_proj, p->up_proj};
    bool g16 = b16 && fsdp_llama_grads16(proj, 2, k->swiglu_backward_bf16_round != NULL, true);
    for (int i = 0; i < 2; i++) {
        fsdp_nn_linear_set_bf16_output(proj[i], b16);
        fsdp_nn_linear_set_bf16_grad(proj[i], g16); /* the SwiGLU's backward rounds their dy */
    }
    fsdp_status st = fsdp_module_forward(ctx, p->gate_proj, in, &p->gate);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, p->up_proj, in, &p->up);
    for (int i = 0; i < 2; i++) { /* for this call only */
        fsdp_nn_linear_set_bf16_output(proj[i], false);
        fsdp_nn_linear_set_bf16_grad(proj[i], false);
    }
    FSDP_TRY_AT(ctx, st);
    fsdp_dtype dt = fsdp_tensor_dtype(p->gate);
    if (!fsdp_tensor_same_shape(p->gate, p->up) || dt != fsdp_tensor_dtype(p->up) ||
        (dt == FSDP_DTYPE_BF16 && fsdp_nn_linear_compute(p->down_proj) != FSDP_DTYPE_BF16)) {
        char desc[160], a[64], b[64];
        return FSDP_FAIL(ctx,
                         fsdp_tensor_same_shape(p->gate, p->up) ? FSDP_ERR_DTYPE : FSDP_ERR_SHAPE,
                         "%s: gate_proj gives %s %s but up_proj %s %s: the SwiGLU takes two "
                         "outputs of one shape, both f32 or both bf16 (the bf16 compute policy on "
                         "all three projections: fsdp_module_set_autocast on the MLP)",
                         fsdp_nn_describe(m, desc, sizeof desc), fsdp_dtype_to_string(dt),
                         fsdp_tensor_shape_string(p->gate, a, sizeof a),
                         fsdp_dtype_to_string(fsdp_tensor_dtype(p->up)),
                         fsdp_tensor_shape_string(p->up, b, sizeof b));
    }
    int nd = fsdp_tensor_ndim(p->gate);
    const int64_t *shape = fsdp_tensor_shape(p->gate);
    int64_t n = fsdp_tensor_numel(p->gate);
    /* the storage of the other kind, of an earlier forward under another policy, is not needed */
    fsdp_tensor *unused = dt == FSDP_DTYPE_BF16 ? p->hidden : p->hidden16;
    if (unused) fsdp_tensor_release_storage(unused);
    if (dt == FSDP_DTYPE_BF16) {
        FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &p->hidden16, FSDP_DTYPE_BF16, dev, nd, shape));
        k->swiglu_forward_bf16(fsdp_tensor_data(p->hidden16), fsdp_tensor_data(p->gate),
                               fsdp_tensor_data(p->up), n);
        return down_forward(ctx, p, p->hidden16, out);
    }
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &p->hidden, dev, nd, shape));
    k->swiglu_forward(fsdp_tensor_f32(p->hidden), fsdp_tensor_f32(p->gate), fsdp_tensor_f32(p->up),
                      n);
    return down_forward(ctx, p, p->hidden, out);
}

static fsdp_status llama_mlp_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                      const fsdp_tensor **din) {
    llama_mlp *p = m->impl;
    if (!p->gate) return fsdp_llama_no_forward(ctx, m);
    fsdp_device dev = fsdp_tensor_device(dout);
    const fsdp_kernels_i *k;
    LLAMA_KERNELS(ctx, m, dev, swiglu_backward, k);
    fsdp_module *const proj[2] = {p->gate_proj, p->up_proj};
    bool b16 = fsdp_tensor_dtype(p->gate) == FSDP_DTYPE_BF16;
    /* under the policy the projections read their output gradients rounded to bf16: the SwiGLU
     * writes them so (2 bytes each instead of 4, and no rounding pass in each Linear); and it
     * reads down_proj's input gradient in bf16 when down_proj can write it so */
    bool g16 = b16 && fsdp_llama_grads16(proj, 2, k->swiglu_backward_bf16_round != NULL, false);
    bool dx16 = g16 && k->swiglu_backward_bf16io && fsdp_llama_fused_on();
    const fsdp_tensor *dh;
    fsdp_nn_linear_set_bf16_dx(p->down_proj, dx16);
    fsdp_status st = fsdp_module_backward(ctx, p->down_proj, dout, &dh);
    fsdp_nn_linear_set_bf16_dx(p->down_proj, false); /* for this call only */
    FSDP_TRY_AT(ctx, st);
    bool dh16 = fsdp_tensor_dtype(dh) == FSDP_DTYPE_BF16;
    if (dh16) fsdp_llama_dx16_ran();
    int nd = fsdp_tensor_ndim(p->gate);
    const int64_t *shape = fsdp_tensor_shape(p->gate);
    const float *dy = fsdp_tensor_f32(dh); /* NULL when dh16 */
    int64_t n = fsdp_tensor_numel(p->gate);
    fsdp_tensor **dgate = g16 ? &p->dgate16 : &p->dgate, **dup = g16 ? &p->dup16 : &p->dup;
    fsdp_tensor *unused[2] = {g16 ? p->dgate : p->dgate16, g16 ? p->dup : p->dup16};
    for (int i = 0; i < 2; i++) /* the other kind's, of an earlier backward */
        if (unused[i]) fsdp_tensor_release_storage(unused[i]);
    fsdp_dtype gt = g16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, dgate, gt, dev, nd, shape));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, dup, gt, dev, nd, shape));
    if (dh16) /* only asked when g16 */
        k->swiglu_backward_bf16io(fsdp_tensor_data(*dgate), fsdp_tensor_data(*dup),
                                  fsdp_tensor_data(dh), fsdp_tensor_data(p->gate),
                                  fsdp_tensor_data(p->up), n);
    else if (g16)
        k->swiglu_backward_bf16_round(fsdp_tensor_data(*dgate), fsdp_tensor_data(*dup), dy,
                                      fsdp_tensor_data(p->gate), fsdp_tensor_data(p->up), n);
    else if (b16)
        k->swiglu_backward_bf16(fsdp_tensor_f32(*dgate), fsdp_tensor_f32(*dup), dy,
                                fsdp_tensor_data(p->gate), fsdp_tensor_data(p->up), n);
    else
        k->swiglu_backward(fsdp_tensor_f32(*dgate), fsdp_tensor_f32(*dup), dy,
                           fsdp_tensor_f32(p->gate), fsdp_tensor_f32(p->up), n);
    const fsdp_tensor *const dproj[2] = {*dgate, *dup};
    const fsdp_tensor *dx[2];
    bool unrounded;
    FSDP_TRY_AT(ctx, fsdp_llama_branch_grads(ctx, proj, dproj, 2, din != NULL, dx, &unrounded));
    if (!din) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_llama_sum_grads(ctx, &p->dinput, dx[0], dx[1], NULL, unrounded));
    *din = p->dinput;
    return FSDP_OK;
}

static const fsdp_module_ops llama_mlp_ops = {.kind = "LlamaMLP",
                                              .forward = llama_mlp_forward,
                                              .backward = llama_mlp_backward,
                                              .free_impl = llama_mlp_free};

bool fsdp_llama_mlp_reads_bf16(const fsdp_module *m) {
    if (!m || m->ops != &llama_mlp_ops) return false;
    const llama_mlp *p = m->impl;
    return fsdp_nn_linear_compute(p->gate_proj) == FSDP_DTYPE_BF16 &&
           fsdp_nn_linear_compute(p->up_proj) == FSDP_DTYPE_BF16;
}

void fsdp_llama_mlp_set_bf16_output(fsdp_module *m, bool on) {
    if (m && m->ops == &llama_mlp_ops) ((llama_mlp *)m->impl)->bf16_out = on;
}

/* Builds the MLP with its projections' weights ~ normal(0, std). */
fsdp_status fsdp_llama_mlp_build(fsdp_ctx *ctx, int64_t dim, int64_t hidden, float std,
                                 fsdp_module **out) {
    if (dim <= 0 || hidden <= 0 || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "LlamaMLP(dim %lld, hidden %lld): both must be positive", (long long)dim,
                         (long long)hidden);
    llama_mlp *p = calloc(1, sizeof *p);
    if (!p) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a LlamaMLP");
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &llama_mlp_ops, p, &m));
    fsdp_status st = fsdp_llama_add_proj(ctx, m, "gate_proj", dim, hidden, std, &p->gate_proj);
    if (st == FSDP_OK) st = fsdp_llama_add_proj(ctx, m, "up_proj", dim, hidden, std, &p->up_proj);
    if (st == FSDP_OK)
        st = fsdp_llama_add_proj(ctx, m, "down_proj", hidden, dim, std, &p->down_proj);
    /* forward hands the input to gate and up only; backward sums their input gradients */
    fsdp_module *const readers[2] = {p->gate_proj, p->up_proj};
    if (st == FSDP_OK) st = fsdp_nn_set_input_readers(ctx, m, readers, 2);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

fsdp_status fsdp_llama_mlp_create(fsdp_ctx *ctx, int64_t dim, int64_t hidden, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    return fsdp_llama_mlp_build(ctx, dim, hidden, 0.02f, out);
}

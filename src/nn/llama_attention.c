/* llama_attention.c: LlamaAttention: q, k, v projections, rotary embedding of q and k, causal
 * grouped-query softmax attention (one (T, T) score block at a time), o projection; backward
 * recomputes each block from the saved log-sum-exp. Head counts are read from the
 * projections' weights, so tensor parallelism can split heads across ranks. Under the bf16
 * compute policy a bf16 input (the decoder layer's norm output, rounded once for the three
 * projections) is passed to them as is, and the attention runs on bf16 tensors (forward16,
 * backward16: q, k, v, its output and the gradients in bf16, rounded where cuDNN rounds) when
 * the four projections and the device allow it; else q_proj and k_proj give bf16 outputs and
 * the rest is f32, as before (also the tests' path: fsdp_llama_test_attention16). When the
 * decoder layer asks, o_proj's output is given as a bf16 tensor, which its residual add widens
 * as it reads. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "nn/llama_common.h"
#include "nn/module_impl.h"
#include "nn/nn.h" // defines: fsdp_nn_linear_compute, fsdp_nn_linear_set_bf16_output,
                   // fsdp_nn_linear_set_bf16_grad, fsdp_nn_linear_can_give_bf16_output,
                   // fsdp_nn_linear_set_bf16_dx

typedef struct llama_attention {
    int64_t n_heads, n_kv_heads; /* this rank's heads, from the last forward (all, without TP) */
    int64_t head_dim, max_seq_len;
    float rope_theta;
    fsdp_llama_rope_scaling rope_scaling;
    fsdp_module *q_proj, *k_proj, *v_proj, *o_proj;
    int64_t B, T;         /* of the last forward */
    bool bf16;            /* the last forward ran the bf16 policy's attention entries */
    bool bf16_out;        /* the parent asks for o_proj's output in bf16 (this call) */
    bool io16;            /* ... on bf16 tensors (the _bf16_round entries, fields *16 below) */
    fsdp_tensor *rope;    /* (2, T, hd / 2): cos then sin of positions 0 .. T-1 */
    fsdp_tensor *q, *k;   /* (B, T, NH * hd), (B, T, NKV * hd): rotated */
    const fsdp_tensor *v; /* (B, T, NKV * hd): v_proj's output */
    fsdp_tensor *att;     /* (B, T, NH * hd): attention output, o_proj's input */
    fsdp_tensor *lse;     /* (B, NH, T) */
    fsdp_tensor *scratch; /* (2, T, T): one score block (and backward's dO V^T block) */
    fsdp_tensor *dq, *dk, *dv;
    fsdp_tensor *dq16, *dk16; /* RoPE's backward rounded to bf16 for q_proj and k_proj (policy) */
    /* io16: q, k rotated, att (the attention's output), datt (o_proj's dx rounded) and dv in
     * bf16; v is v_proj's bf16 output */
    fsdp_tensor *q16, *k16, *att16, *datt16, *dv16;
    fsdp_tensor *v32;    /* v_proj's bf16 output widened when q or k came f32 (not io16) */
    fsdp_tensor *dinput; /* (B, T, dim) */
} llama_attention;

static void llama_attention_free(void *impl) {
    llama_attention *a = impl;
    fsdp_tensor *own[] = {a->rope, a->q,   a->k,     a->att,    a->lse,  a->scratch,
                          a->dq,   a->dk,  a->dv,    a->dq16,   a->dk16, a->dinput,
                          a->q16,  a->k16, a->att16, a->datt16, a->dv16, a->v32};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) fsdp_tensor_free(own[i]);
    free(a);
}

/* Llama 3's scaling of one inverse frequency, in float32 in transformers' order (its Python
 * scalars, 2 pi and the wavelength bounds, rounded to float32 as torch does against a float32
 * tensor). */
static float llama3_scale(float inv, const fsdp_llama_rope_scaling *s) {
    const float two_pi = 6.283185307179586f;
    double old_len = (double)s->original_max_len;
    float low_wavelen = (float)(old_len / s->low_freq_factor);
    float high_wavelen = (float)(old_len / s->high_freq_factor);
    float wavelen = two_pi / inv;
    float scaled = wavelen > low_wavelen ? inv / s->factor : inv;
    if (wavelen < high_wavelen || wavelen > low_wavelen) return scaled;
    float span = (float)((double)s->high_freq_factor - (double)s->low_freq_factor);
    float smooth = ((float)old_len / wavelen - s->low_freq_factor) / span;
    return (1.0f - smooth) * scaled / s->factor + smooth * scaled;
}

void fsdp_llama_rope_table(float *cos, float *sin, int64_t t0, int64_t T, int64_t head_dim,
                           float theta, const fsdp_llama_rope_scaling *scaling) {
    int64_t h = head_dim / 2;
    bool llama3 = scaling && scaling->type == FSDP_LLAMA_ROPE_LLAMA3;
    for (int64_t i = 0; i < h; i++) {
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        if (llama3) inv = llama3_scale(inv, scaling);
        for (int64_t t = 0; t < T; t++) {
            float ang = (float)(t0 + t) * inv;
            cos[t * h + i] = cosf(ang);
            sin[t * h + i] = sinf(ang);
        }
    }
}

/* The rope table of positions 0 .. T-1 in a->rope on dev (remade when T or dev change). */
static fsdp_status make_rope(fsdp_ctx *ctx, llama_attention *a, int64_t T, fsdp_device dev) {
    int64_t h = a->head_dim / 2;
    if (a->rope && fsdp_tensor_dim(a->rope, 1) == T &&
        fsdp_tensor_device(a->rope).type == dev.type &&
        fsdp_tensor_device(a->rope).index == dev.index)
        return FSDP_OK;
    fsdp_tensor_free(a->rope);
    a->rope = NULL;
    int64_t shape[3] = {2, T, h};
    fsdp_tensor *host;
    FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, shape, &host));
    float *c = fsdp_tensor_f32(host);
    fsdp_llama_rope_table(c, c + T * h, 0, T, a->head_dim, a->rope_theta, &a->rope_scaling);
    if (dev.type == FSDP_DEVICE_CPU) {
        a->rope = host;
        return FSDP_OK;
    }
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 3, shape, &a->rope);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, a->rope, host);
    fsdp_tensor_free(host);
    return FSDP_PASS(ctx, st);
}

/* The head counts the projections give: NH = q rows / hd, NKV = k rows / hd = v rows / hd. */
static fsdp_status read_heads(fsdp_ctx *ctx, fsdp_module *m, llama_attention *a) {
    int64_t hd = a->head_dim;
    int64_t qr = fsdp_tensor_dim(fsdp_module_param(a->q_proj, 0)->data, 0);
    int64_t kr = fsdp_tensor_dim(fsdp_module_param(a->k_proj, 0)->data, 0);
    int64_t vr = fsdp_tensor_dim(fsdp_module_param(a->v_proj, 0)->data, 0);
    if (qr % hd || kr % hd || kr != vr || kr == 0 || (qr / hd) % (kr / hd)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: q_proj has %lld rows and k_proj/v_proj %lld/%lld: each must hold "
                         "whole heads of %lld, and the key/value heads must divide the query "
                         "heads",
                         fsdp_nn_describe(m, desc, sizeof desc), (long long)qr, (long long)kr,
                         (long long)vr, (long long)hd);
    }
    a->n_heads = qr / hd;
    a->n_kv_heads = kr / hd;
    return FSDP_OK;
}

/* o_proj's forward of the attention's output att, its output given in bf16 for this call when
 * the parent asks (bf16_out) and o_proj can (fsdp_nn_linear_can_give_bf16_output). */
static fsdp_status o_proj_forward(fsdp_ctx *ctx, llama_attention *a, const fsdp_tensor *att,
                                  const fsdp_tensor **out) {
    bool o16 = a->bf16_out && fsdp_nn_linear_can_give_bf16_output(a->o_proj);
    fsdp_nn_linear_set_bf16_output(a->o_proj, o16);
    fsdp_status st = fsdp_module_forward(ctx, a->o_proj, att, out);
    fsdp_nn_linear_set_bf16_output(a->o_proj, false); /* for this call only */
    return FSDP_PASS(ctx, st);
}

/* The forward on bf16 tensors: RoPE from q_proj's and k_proj's bf16 outputs into bf16 q16, k16
 * (rounded once), the attention on them and v_proj's bf16 output into a bf16 att16 (rounded
 * once) that o_proj reads as its bf16 input. */
static fsdp_status forward16(fsdp_ctx *ctx, llama_attention *a, const fsdp_kernels_i *k,
                             const fsdp_tensor *q, const fsdp_tensor *kk, const fsdp_tensor **out) {
    int64_t B = a->B, T = a->T, NH = a->n_heads, NKV = a->n_kv_heads, hd = a->head_dim;
    fsdp_device dev = fsdp_tensor_device(q);
    fsdp_dtype bf = FSDP_DTYPE_BF16;
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->q16, bf, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->k16, bf, dev, 3, (int64_t[]){B, T, NKV * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->att16, bf, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->lse, dev, 3, (int64_t[]){B, NH, T}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->scratch, dev, 1,
                                    (int64_t[]){FSDP_ATTENTION_BF16_SCRATCH(T, NH, NKV, hd)}));
    const float *cos = fsdp_tensor_f32(a->rope), *sin = cos + T * (hd / 2);
    fsdp_bf16 *q16 = fsdp_tensor_data(a->q16), *k16 = fsdp_tensor_data(a->k16);
    k->rope_qk_forward_bf16_round(q16, k16, fsdp_tensor_data(q), fsdp_tensor_data(kk), cos, sin, B,
                                  T, NH, NKV, hd);
    k->attention_forward_bf16_round(fsdp_tensor_data(a->att16), fsdp_tensor_f32(a->lse),
                                    fsdp_tensor_f32(a->scratch), q16, k16, fsdp_tensor_data(a->v),
                                    B, T, NH, NKV, hd);
    fsdp_llama_attention16_ran();
    return o_proj_forward(ctx, a, a->att16, out);
}

/* The backward on bf16 tensors: o_proj's input gradient in bf16 (as o_proj writes it, or
 * rounded into datt16; as cuDNN reads it), the attention's bf16 dq, dk, dv, RoPE's backward on dq,
 * dk in place (rounded once more); the projections take them as is, or (the test path of
 * fsdp_llama_grads16) widened. */
static fsdp_status backward16(fsdp_ctx *ctx, llama_attention *a, const fsdp_kernels_i *k,
                              const fsdp_tensor *datt, const fsdp_tensor *dproj[3]) {
    int64_t B = a->B, T = a->T, NH = a->n_heads, NKV = a->n_kv_heads, hd = a->head_dim;
    fsdp_device dev = fsdp_tensor_device(datt);
    fsdp_dtype bf = FSDP_DTYPE_BF16;
    int64_t nq = B * T * NH * hd, nk = B * T * NKV * hd;
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->datt16, bf, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->dq16, bf, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->dk16, bf, dev, 3, (int64_t[]){B, T, NKV * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->dv16, bf, dev, 3, (int64_t[]){B, T, NKV * hd}));
    fsdp_bf16 *d16 = fsdp_tensor_data(a->datt16), *dq = fsdp_tensor_data(a->dq16),
              *dk = fsdp_tensor_data(a->dk16), *dv = fsdp_tensor_data(a->dv16);
    if (fsdp_tensor_dtype(datt) == FSDP_DTYPE_BF16) /* o_proj wrote it in bf16 (the same bits) */
        d16 = fsdp_tensor_data(datt);
    else
        k->f32_to_bf16(d16, fsdp_tensor_f32(datt), nq);
    k->attention_backward_bf16_round(dq, dk, dv, fsdp_tensor_f32(a->scratch), d16,
                                     fsdp_tensor_data(a->q16), fsdp_tensor_data(a->k16),
                                     fsdp_tensor_data(a->v), fsdp_tensor_data(a->att16),
                                     fsdp_tensor_f32(a->lse), B, T, NH, NKV, hd);
    const float *cos = fsdp_tensor_f32(a->rope), *sin = cos + T * (hd / 2);
    k->rope_qk_backward_bf16_round(dq, dk, dq, dk, cos, sin, B, T, NH, NKV, hd);
    fsdp_module *const proj[3] = {a->q_proj, a->k_proj, a->v_proj};
    dproj[0] = a->dq16, dproj[1] = a->dk16, dproj[2] = a->dv16;
    if (fsdp_llama_grads16(proj, 3, true, false)) return FSDP_OK;
    /* the path before: f32 output gradients the projections round themselves (the same bits) */
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->dq, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->dk, dev, 3, (int64_t[]){B, T, NKV * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->dv, dev, 3, (int64_t[]){B, T, NKV * hd}));
    k->bf16_to_f32(fsdp_tensor_f32(a->dq), dq, nq);
    k->bf16_to_f32(fsdp_tensor_f32(a->dk), dk, nk);
    k->bf16_to_f32(fsdp_tensor_f32(a->dv), dv, nk);
    dproj[0] = a->dq, dproj[1] = a->dk, dproj[2] = a->dv;
    return FSDP_OK;
}

static fsdp_status llama_attention_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                           const fsdp_tensor **out) {
    llama_attention *a = m->impl;
    char desc[160], shape[64];
    fsdp_dtype dt = fsdp_tensor_dtype(in);
    if (dt == FSDP_DTYPE_BF16 && !fsdp_llama_attention_reads_bf16(m))
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: input is bf16, which the attention takes only when q_proj, k_proj "
                         "and v_proj run the bf16 compute policy (fsdp_module_set_autocast(ctx, "
                         "m, FSDP_DTYPE_BF16) on it); pass an f32 input otherwise",
                         fsdp_nn_describe(m, desc, sizeof desc));
    if (fsdp_tensor_ndim(in) != 3 || (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16))
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: input %s %s must be f32 (B, T, dim) (or bf16 under the bf16 "
                         "compute policy)",
                         fsdp_nn_describe(m, desc, sizeof desc), fsdp_dtype_to_string(dt),
                         fsdp_tensor_shape_string(in, shape, sizeof shape));
    int64_t B = fsdp_tensor_dim(in, 0), T = fsdp_tensor_dim(in, 1), hd = a->head_dim;
    if (T > a->max_seq_len)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: %lld positions, more than max_seq_len %lld",
                         fsdp_nn_describe(m, desc, sizeof desc), (long long)T,
                         (long long)a->max_seq_len);
    fsdp_device dev = fsdp_tensor_device(in);
    const fsdp_kernels_i *k;
    LLAMA_KERNELS(ctx, m, dev, attention_forward, k);
    FSDP_TRY_AT(ctx, read_heads(ctx, m, a));
    int64_t NH = a->n_heads, NKV = a->n_kv_heads;
    const fsdp_tensor *q, *kk;
    bool b16 = fsdp_nn_linear_compute(a->q_proj) == FSDP_DTYPE_BF16 &&
               fsdp_nn_linear_compute(a->k_proj) == FSDP_DTYPE_BF16 && k->rope_qk_forward_bf16;
    fsdp_module *const qkv[3] = {a->q_proj, a->k_proj, a->v_proj};
    /* on bf16 tensors: v_proj and o_proj under the policy too, each projection taking a bf16
     * output gradient (fsdp_nn_linear_takes_bf16_grad), the table's entries */
    bool io16 = b16 && fsdp_nn_linear_compute(a->v_proj) == FSDP_DTYPE_BF16 &&
                fsdp_nn_linear_compute(a->o_proj) == FSDP_DTYPE_BF16 &&
                fsdp_llama_attention16_on(
                    k->rope_qk_forward_bf16_round && k->rope_qk_backward_bf16_round &&
                    k->attention_forward_bf16_round && k->attention_backward_bf16_round &&
                    fsdp_nn_linear_takes_bf16_grad(qkv[0], true) &&
                    fsdp_nn_linear_takes_bf16_grad(qkv[1], true) &&
                    fsdp_nn_linear_takes_bf16_grad(qkv[2], true));
    int n16 = io16 ? 3 : 2; /* the projections giving bf16 outputs */
    bool g16 = b16 && fsdp_llama_grads16(qkv, n16, io16 || k->rope_qk_backward_round, true);
    for (int i = 0; i < n16; i++) {
        fsdp_nn_linear_set_bf16_output(qkv[i], b16);
        fsdp_nn_linear_set_bf16_grad(qkv[i], g16); /* RoPE's (the attention's) backward rounds */
    }
    fsdp_status st = fsdp_module_forward(ctx, a->q_proj, in, &q);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, a->k_proj, in, &kk);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, a->v_proj, in, &a->v);
    for (int i = 0; i < n16; i++) { /* for this call only */
        fsdp_nn_linear_set_bf16_output(qkv[i], false);
        fsdp_nn_linear_set_bf16_grad(qkv[i], false);
    }
    FSDP_TRY_AT(ctx, st);
    FSDP_TRY_AT(ctx, make_rope(ctx, a, T, dev));
    a->B = B, a->T = T;
    /* a projection with a bias (or a device without gemm_bf16_round) gave f32: as before */
    a->io16 = io16 && fsdp_tensor_dtype(q) == FSDP_DTYPE_BF16 &&
              fsdp_tensor_dtype(kk) == FSDP_DTYPE_BF16 &&
              fsdp_tensor_dtype(a->v) == FSDP_DTYPE_BF16;
    if (a->io16) return forward16(ctx, a, k, q, kk, out);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->q, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->k, dev, 3, (int64_t[]){B, T, NKV * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->att, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->lse, dev, 3, (int64_t[]){B, NH, T}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->scratch, dev, 3, (int64_t[]){2, T, T}));
    const float *cos = fsdp_tensor_f32(a->rope), *sin = cos + T * (hd / 2);
    fsdp_dtype dq = fsdp_tensor_dtype(q), dk = fsdp_tensor_dtype(kk);
    if (fsdp_tensor_dtype(a->v) == FSDP_DTYPE_BF16) { /* q or k came f32 (a hook's): widened */
        FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->v32, dev, 3, (int64_t[]){B, T, NKV * hd}));
        k->bf16_to_f32(fsdp_tensor_f32(a->v32), fsdp_tensor_data(a->v), B * T * NKV * hd);
        a->v = a->v32;
    }
    if (dq != dk) {
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: q_proj gives %s and k_proj %s: RoPE takes both f32 or both bf16 "
                         "(the bf16 compute policy on both: fsdp_module_set_autocast on the "
                         "attention)",
                         fsdp_nn_describe(m, desc, sizeof desc), fsdp_dtype_to_string(dq),
                         fsdp_dtype_to_string(dk));
    }
    if (dq == FSDP_DTYPE_BF16)
        k->rope_qk_forward_bf16(fsdp_tensor_f32(a->q), fsdp_tensor_f32(a->k), fsdp_tensor_data(q),
                                fsdp_tensor_data(kk), cos, sin, B, T, NH, NKV, hd);
    else
        k->rope_qk_forward(fsdp_tensor_f32(a->q), fsdp_tensor_f32(a->k), fsdp_tensor_f32(q),
                           fsdp_tensor_f32(kk), cos, sin, B, T, NH, NKV, hd);
    // under the bf16 policy the device may run the attention as autocast does (cuDNN's on CUDA)
    a->bf16 = dq == FSDP_DTYPE_BF16 && k->attention_forward_bf16 && k->attention_backward_bf16;
    (a->bf16 ? k->attention_forward_bf16 : k->attention_forward)(
        fsdp_tensor_f32(a->att), fsdp_tensor_f32(a->lse), fsdp_tensor_f32(a->scratch),
        fsdp_tensor_f32(a->q), fsdp_tensor_f32(a->k), fsdp_tensor_f32(a->v), B, T, NH, NKV, hd);
    return o_proj_forward(ctx, a, a->att, out);
}

/* The three projections' backward from their output gradients, their input gradients summed. */
static fsdp_status branches(fsdp_ctx *ctx, llama_attention *a, fsdp_module *const *proj,
                            const fsdp_tensor *const *dproj, const fsdp_tensor **din) {
    const fsdp_tensor *dx[3];
    bool unrounded;
    FSDP_TRY_AT(ctx, fsdp_llama_branch_grads(ctx, proj, dproj, 3, din != NULL, dx, &unrounded));
    if (!din) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_llama_sum_grads(ctx, &a->dinput, dx[0], dx[1], dx[2], unrounded));
    *din = a->dinput;
    return FSDP_OK;
}

static fsdp_status llama_attention_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                            const fsdp_tensor **din) {
    llama_attention *a = m->impl;
    if (!a->v) return fsdp_llama_no_forward(ctx, m);
    fsdp_device dev = fsdp_tensor_device(dout);
    const fsdp_kernels_i *k;
    LLAMA_KERNELS(ctx, m, dev, attention_backward, k);
    int64_t B = a->B, T = a->T, NH = a->n_heads, NKV = a->n_kv_heads, hd = a->head_dim;
    const fsdp_tensor *datt;
    /* on bf16 tensors the attention reads o_proj's input gradient in bf16: o_proj writes it so
     * (not on the tests' path before: fsdp_llama_test_sums) */
    bool dx16 = a->io16 && fsdp_llama_fused_on();
    fsdp_nn_linear_set_bf16_dx(a->o_proj, dx16);
    fsdp_status st = fsdp_module_backward(ctx, a->o_proj, dout, &datt);
    fsdp_nn_linear_set_bf16_dx(a->o_proj, false); /* for this call only */
    FSDP_TRY_AT(ctx, st);
    if (fsdp_tensor_dtype(datt) == FSDP_DTYPE_BF16) fsdp_llama_dx16_ran();
    fsdp_module *const proj[3] = {a->q_proj, a->k_proj, a->v_proj};
    const fsdp_tensor *dproj[3] = {a->dq, a->dk, a->dv};
    if (a->io16) {
        FSDP_TRY_AT(ctx, backward16(ctx, a, k, datt, dproj));
        return branches(ctx, a, proj, dproj, din);
    }
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->dq, dev, 3, (int64_t[]){B, T, NH * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->dk, dev, 3, (int64_t[]){B, T, NKV * hd}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &a->dv, dev, 3, (int64_t[]){B, T, NKV * hd}));
    float *dq = fsdp_tensor_f32(a->dq), *dk = fsdp_tensor_f32(a->dk);
    (a->bf16 ? k->attention_backward_bf16 : k->attention_backward)(
        dq, dk, fsdp_tensor_f32(a->dv), fsdp_tensor_f32(a->scratch), fsdp_tensor_f32(datt),
        fsdp_tensor_f32(a->q), fsdp_tensor_f32(a->k), fsdp_tensor_f32(a->v),
        fsdp_tensor_f32(a->att), fsdp_tensor_f32(a->lse), B, T, NH, NKV, hd);
    const float *cos = fsdp_tensor_f32(a->rope), *sin = cos + T * (hd / 2);
    dproj[0] = a->dq, dproj[1] = a->dk, dproj[2] = a->dv;
    /* under the policy q_proj and k_proj read their output gradients rounded to bf16: RoPE's
     * backward writes them so (2 bytes each instead of 4 in place, and no rounding pass) */
    if (fsdp_llama_grads16(proj, 2, k->rope_qk_backward_round != NULL, false)) {
        FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->dq16, FSDP_DTYPE_BF16, dev, 3,
                                              (int64_t[]){B, T, NH * hd}));
        FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, &a->dk16, FSDP_DTYPE_BF16, dev, 3,
                                              (int64_t[]){B, T, NKV * hd}));
        k->rope_qk_backward_round(fsdp_tensor_data(a->dq16), fsdp_tensor_data(a->dk16), dq, dk, cos,
                                  sin, B, T, NH, NKV, hd);
        dproj[0] = a->dq16, dproj[1] = a->dk16;
    } else {
        k->rope_qk_backward(dq, dk, dq, dk, cos, sin, B, T, NH, NKV, hd);
    }
    return branches(ctx, a, proj, dproj, din);
}

static const fsdp_module_ops llama_attention_ops = {.kind = "LlamaAttention",
                                                    .forward = llama_attention_forward,
                                                    .backward = llama_attention_backward,
                                                    .free_impl = llama_attention_free};

bool fsdp_llama_attention_reads_bf16(const fsdp_module *m) {
    if (!m || m->ops != &llama_attention_ops) return false;
    const llama_attention *a = m->impl;
    return fsdp_nn_linear_compute(a->q_proj) == FSDP_DTYPE_BF16 &&
           fsdp_nn_linear_compute(a->k_proj) == FSDP_DTYPE_BF16 &&
           fsdp_nn_linear_compute(a->v_proj) == FSDP_DTYPE_BF16;
}

void fsdp_llama_attention_set_bf16_output(fsdp_module *m, bool on) {
    if (m && m->ops == &llama_attention_ops) ((llama_attention *)m->impl)->bf16_out = on;
}

bool fsdp_llama_attention_parts(const fsdp_module *m, fsdp_llama_attention_info *out) {
    if (!m || m->ops != &llama_attention_ops) return false;
    const llama_attention *a = m->impl;
    *out = (fsdp_llama_attention_info){.q_proj = a->q_proj,
                                       .k_proj = a->k_proj,
                                       .v_proj = a->v_proj,
                                       .o_proj = a->o_proj,
                                       .head_dim = a->head_dim,
                                       .max_seq_len = a->max_seq_len,
                                       .rope_theta = a->rope_theta,
                                       .rope_scaling = a->rope_scaling};
    return true;
}

fsdp_status fsdp_llama_attention_create(fsdp_ctx *ctx, const fsdp_llama_config *cfg,
                                        fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_llama_config c;
    FSDP_TRY_AT(ctx, fsdp_llama_config_resolve(ctx, cfg, &c));
    llama_attention *a = calloc(1, sizeof *a);
    if (!a) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a LlamaAttention");
    int64_t hd = c.dim / c.n_heads;
    a->n_heads = c.n_heads, a->n_kv_heads = c.n_kv_heads, a->head_dim = hd;
    a->max_seq_len = c.max_seq_len, a->rope_theta = c.rope_theta;
    a->rope_scaling = c.rope_scaling;
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &llama_attention_ops, a, &m));
    float std = c.init_std;
    fsdp_status st = fsdp_llama_add_proj(ctx, m, "q_proj", c.dim, c.n_heads * hd, std, &a->q_proj);
    if (st == FSDP_OK)
        st = fsdp_llama_add_proj(ctx, m, "k_proj", c.dim, c.n_kv_heads * hd, std, &a->k_proj);
    if (st == FSDP_OK)
        st = fsdp_llama_add_proj(ctx, m, "v_proj", c.dim, c.n_kv_heads * hd, std, &a->v_proj);
    if (st == FSDP_OK)
        st = fsdp_llama_add_proj(ctx, m, "o_proj", c.n_heads * hd, c.dim, std, &a->o_proj);
    /* forward hands the input to q, k and v only; backward sums their input gradients */
    fsdp_module *const readers[3] = {a->q_proj, a->k_proj, a->v_proj};
    if (st == FSDP_OK) st = fsdp_nn_set_input_readers(ctx, m, readers, 3);
    if (st == FSDP_OK) st = fsdp_module_set_autocast(ctx, m, c.compute_dtype);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

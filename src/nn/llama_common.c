/* llama_common.c: what the Llama layers share (llama_common.h): the kernel table check, the
 * bias-free projections, the branches' backward and their gradient sums, and the
 * configuration's defaults and checks. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "nn/llama_common.h"
#include "nn/module_impl.h"
#include "nn/nn.h" // defines: fsdp_nn_linear_set_dx_unrounded, fsdp_nn_linear_takes_bf16_grad

/* ---- helpers ---- */

const fsdp_kernels_i *fsdp_llama_kernels(fsdp_ctx *ctx, const fsdp_module *m, fsdp_device dev,
                                         bool has, fsdp_status *st) {
    if (has) return fsdp_kernels_for(dev);
    char desc[160];
    *st = FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                    "%s: no Llama kernels for %s tensors yet; run it on the CPU",
                    fsdp_nn_describe(m, desc, sizeof desc), fsdp_device_to_string(dev));
    return NULL;
}

fsdp_status fsdp_llama_add_proj(fsdp_ctx *ctx, fsdp_module *parent, const char *name, int64_t in,
                                int64_t out, float std, fsdp_module **child) {
    fsdp_module *l;
    FSDP_TRY_AT(ctx, fsdp_linear_create(ctx, in, out, false, &l));
    l->params[0]->init = (fsdp_init){.kind = FSDP_INIT_NORMAL, .a = 0.0f, .b = std};
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, parent, name, l));
    if (child) *child = l;
    return FSDP_OK;
}

static atomic_bool old_sums;
static atomic_llong fused_sums, add3_sums, grads16, dx16;

void fsdp_llama_test_sums(bool old_path, int64_t *fused, int64_t *add3) {
    atomic_store(&old_sums, old_path);
    if (fused) *fused = atomic_exchange(&fused_sums, 0);
    if (add3) *add3 = atomic_exchange(&add3_sums, 0);
}

static atomic_bool attention16_off;
static atomic_llong attention16_ran;

void fsdp_llama_test_attention16(bool off, int64_t *ran) {
    atomic_store(&attention16_off, off);
    if (ran) *ran = atomic_exchange(&attention16_ran, 0);
}

bool fsdp_llama_attention16_on(bool entries) {
    return entries && !atomic_load(&attention16_off);
}

void fsdp_llama_attention16_ran(void) {
    atomic_fetch_add(&attention16_ran, 1);
}

bool fsdp_llama_fused_on(void) {
    return !atomic_load(&old_sums);
}

void fsdp_llama_dx16_ran(void) {
    atomic_fetch_add(&dx16, 1);
}

int64_t fsdp_llama_test_dx16(void) {
    return atomic_exchange(&dx16, 0);
}

int64_t fsdp_llama_test_grads16(void) {
    return atomic_exchange(&grads16, 0);
}

bool fsdp_llama_grads16(fsdp_module *const *branch, int n, bool entry, bool next) {
    bool on = entry && !atomic_load(&old_sums);
    for (int i = 0; i < n; i++) on = on && fsdp_nn_linear_takes_bf16_grad(branch[i], next);
    if (on && !next) atomic_fetch_add(&grads16, 1);
    return on;
}

fsdp_status fsdp_llama_sum_grads(fsdp_ctx *ctx, fsdp_tensor **dst, const fsdp_tensor *a,
                                 const fsdp_tensor *b, const fsdp_tensor *c, bool round_bf16) {
    fsdp_device dev = fsdp_tensor_device(a);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, dst, dev, fsdp_tensor_ndim(a), fsdp_tensor_shape(a)));
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    float *d = fsdp_tensor_f32(*dst);
    const float *fc = c ? fsdp_tensor_f32(c) : NULL;
    int64_t n = fsdp_tensor_numel(a);
    if (round_bf16) { /* fsdp_llama_branch_grads checked the entry */
        k->add3_round_bf16(d, fsdp_tensor_f32(a), fsdp_tensor_f32(b), fc, n);
        atomic_fetch_add(&fused_sums, 1);
    } else if (fc && k->add3 && !atomic_load(&old_sums)) {
        k->add3(d, fsdp_tensor_f32(a), fsdp_tensor_f32(b), fc, n);
        atomic_fetch_add(&add3_sums, 1);
    } else {
        k->add(d, fsdp_tensor_f32(a), fsdp_tensor_f32(b), n);
        if (fc) k->add(d, d, fc, n);
    }
    return FSDP_OK;
}

fsdp_status fsdp_llama_branch_grads(fsdp_ctx *ctx, fsdp_module *const *branch,
                                    const fsdp_tensor *const *dout, int n, bool din,
                                    const fsdp_tensor **dx, bool *unrounded) {
    const fsdp_kernels_i *k = fsdp_kernels_for(fsdp_tensor_device(dout[0]));
    bool leave = din && k->add3_round_bf16 && !atomic_load(&old_sums);
    for (int i = 0; i < n; i++) leave = leave && fsdp_nn_linear_can_leave_dx_unrounded(branch[i]);
    for (int i = 0; i < n; i++) fsdp_nn_linear_set_dx_unrounded(branch[i], leave);
    fsdp_status st = FSDP_OK;
    for (int i = 0; i < n && st == FSDP_OK; i++)
        st = fsdp_module_backward(ctx, branch[i], dout[i], din ? &dx[i] : NULL);
    for (int i = 0; i < n; i++) fsdp_nn_linear_set_dx_unrounded(branch[i], false); /* this call */
    *unrounded = leave;
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_llama_no_forward(fsdp_ctx *ctx, const fsdp_module *m) {
    char desc[160];
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "%s: backward needs a forward first, and an output gradient of the output's "
                     "shape",
                     fsdp_nn_describe(m, desc, sizeof desc));
}

/* ---- configuration ---- */

fsdp_status fsdp_llama_bad_config(fsdp_ctx *ctx, const char *field, long long value,
                                  const char *rule) {
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "Llama config: %s = %lld; %s", field, value,
                     rule);
}

/* Llama 3's scaling needs its four numbers in range; the default type ignores them. */
static fsdp_status check_rope_scaling(fsdp_ctx *ctx, const fsdp_llama_rope_scaling *s) {
    if (s->type == FSDP_LLAMA_ROPE_DEFAULT) return FSDP_OK;
    if (s->type != FSDP_LLAMA_ROPE_LLAMA3)
        return fsdp_llama_bad_config(
            ctx, "rope_scaling.type", s->type,
            "it must be FSDP_LLAMA_ROPE_DEFAULT or FSDP_LLAMA_ROPE_LLAMA3");
    if (!(s->factor >= 1.0f) || !isfinite(s->factor) || !(s->low_freq_factor > 0.0f) ||
        !(s->high_freq_factor > s->low_freq_factor) || !isfinite(s->high_freq_factor))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama config: rope_scaling (llama3) factor = %g, low_freq_factor = %g, "
                         "high_freq_factor = %g; factor must be >= 1 and 0 < low_freq_factor < "
                         "high_freq_factor, all finite",
                         (double)s->factor, (double)s->low_freq_factor,
                         (double)s->high_freq_factor);
    if (s->original_max_len < 1 || s->original_max_len > (1 << 24))
        return fsdp_llama_bad_config(ctx, "rope_scaling.original_max_len", s->original_max_len,
                                     "it must be in [1, 2^24]");
    return FSDP_OK;
}

fsdp_status fsdp_llama_config_resolve(fsdp_ctx *ctx, const fsdp_llama_config *cfg,
                                      fsdp_llama_config *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_llama_config c = *cfg;
    if (c.dim <= 0 || c.dim > (1 << 20))
        return fsdp_llama_bad_config(ctx, "dim", c.dim, "it must be in [1, 2^20]");
    if (c.n_heads <= 0 || c.dim % c.n_heads || (c.dim / c.n_heads) % 2)
        return fsdp_llama_bad_config(
            ctx, "n_heads", c.n_heads,
            "it must divide dim into heads of an even size (rotary embedding "
            "rotates pairs)");
    if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
    if (c.n_kv_heads < 0 || c.n_heads % c.n_kv_heads)
        return fsdp_llama_bad_config(ctx, "n_kv_heads", c.n_kv_heads, "it must divide n_heads");
    if (c.n_layers < 0)
        return fsdp_llama_bad_config(ctx, "n_layers", c.n_layers, "it must be >= 1");
    if (c.vocab_size < 0 || c.vocab_size > INT32_MAX)
        return fsdp_llama_bad_config(ctx, "vocab_size", c.vocab_size, "it must be in [1, 2^31)");
    if (c.ffn_hidden == 0) c.ffn_hidden = (8 * c.dim / 3 + 255) / 256 * 256;
    if (c.ffn_hidden < 0 || c.ffn_hidden > (1 << 24))
        return fsdp_llama_bad_config(ctx, "ffn_hidden", c.ffn_hidden, "it must be in [1, 2^24]");
    if (c.max_seq_len == 0) c.max_seq_len = 2048;
    if (c.max_seq_len < 0 || c.max_seq_len > (1 << 24))
        return fsdp_llama_bad_config(ctx, "max_seq_len", c.max_seq_len, "it must be in [1, 2^24]");
    if (c.norm_eps == 0.0f) c.norm_eps = 1e-6f;
    if (!(c.norm_eps > 0.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama config: norm_eps = %g; it must be > 0", (double)c.norm_eps);
    if (c.rope_theta == 0.0f) c.rope_theta = 10000.0f;
    if (!(c.rope_theta > 1.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama config: rope_theta = %g; it must be > 1", (double)c.rope_theta);
    FSDP_TRY_AT(ctx, check_rope_scaling(ctx, &c.rope_scaling));
    if (c.init_std == 0.0f) c.init_std = 0.02f;
    if (!(c.init_std > 0.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama config: init_std = %g; it must be > 0", (double)c.init_std);
    if (c.compute_dtype != FSDP_DTYPE_F32 && c.compute_dtype != FSDP_DTYPE_BF16)
        return fsdp_llama_bad_config(ctx, "compute_dtype", c.compute_dtype,
                                     "it must be FSDP_DTYPE_F32 or FSDP_DTYPE_BF16");
    if (c.logits_dtype != FSDP_DTYPE_F32 && c.logits_dtype != FSDP_DTYPE_BF16)
        return fsdp_llama_bad_config(ctx, "logits_dtype", c.logits_dtype,
                                     "it must be FSDP_DTYPE_F32 (the default) or FSDP_DTYPE_BF16");
    if (c.logits_dtype == FSDP_DTYPE_BF16 && c.compute_dtype != FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama config: logits_dtype = bf16 needs the bf16 compute policy "
                         "(compute_dtype = FSDP_DTYPE_BF16), whose lm_head rounds its output to "
                         "bf16; under f32 compute the logits are f32: set compute_dtype, or "
                         "leave logits_dtype 0 (f32)");
    *out = c;
    return FSDP_OK;
}

fsdp_status fsdp_llama_flops_per_token(fsdp_ctx *ctx, const fsdp_llama_config *cfg, int64_t seq,
                                       double *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_llama_config c;
    FSDP_TRY_AT(ctx, fsdp_llama_config_resolve(ctx, cfg, &c));
    if (seq < 1 || seq > c.max_seq_len)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_llama_flops_per_token: seq = %lld; it must be in [1, max_seq_len = "
                         "%lld]",
                         (long long)seq, (long long)c.max_seq_len);
    double d = (double)c.dim, kv = d / c.n_heads * c.n_kv_heads;
    /* q_proj and o_proj (d, d), k_proj and v_proj (kv, d), three (ffn, d), two norms */
    double layer = 2 * d * d + 2 * kv * d + 3 * (double)c.ffn_hidden * d + 2 * d;
    double n = c.n_layers * layer + d + (double)c.vocab_size * d; /* the final norm, lm_head */
    *out = 6 * n + 12.0 * c.n_layers * d * (double)seq;
    return FSDP_OK;
}

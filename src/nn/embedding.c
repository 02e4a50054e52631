/* embedding.c: Embedding, out[..., :] = weight[token, :] for i32 token ids, and its weight
 * gradient (a scatter-add). Token ids have no gradient. A vocabulary-sharded table (TP's
 * RowwiseParallel) holds rows [vocab_start, vocab_start + rows) and gives zeros elsewhere; the
 * kernel table does both on the tokens' device (the CPU or a device, where the ids stay). */
#include <stdlib.h>

#include "core/error.h"
#include "nn/llama_common.h"
#include "nn/module_impl.h"

typedef struct embedding {
    fsdp_param *weight;       /* (V, C), or (rows of this rank's vocabulary range, C) */
    int64_t num_embeddings;   /* V of the whole vocabulary */
    int64_t vocab_start;      /* first token of the weight's rows; -1: the whole table */
    const fsdp_tensor *input; /* (...) i32 token ids, kept for backward */
    fsdp_tensor *output;      /* (..., C) */
} embedding;

static void embedding_free(void *impl) {
    embedding *e = impl;
    fsdp_tensor_free(e->output);
    free(e);
}

/* Token ids must be i32 in [0, V) with room for one more dim; ids are read on the CPU only
 * (a device's ids are trusted). */
static fsdp_status check_tokens(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *in,
                                int64_t V) {
    char desc[160], shape[64];
    if (fsdp_tensor_dtype(in) != FSDP_DTYPE_I32 || fsdp_tensor_ndim(in) >= FSDP_MAX_DIMS)
        return FSDP_FAIL(
            ctx, FSDP_ERR_DTYPE, "%s: input is %s %s; it takes i32 token ids of at most %d dims",
            fsdp_nn_describe(m, desc, sizeof desc), fsdp_dtype_to_string(fsdp_tensor_dtype(in)),
            fsdp_tensor_shape_string(in, shape, sizeof shape), FSDP_MAX_DIMS - 1);
    if (fsdp_tensor_device(in).type != FSDP_DEVICE_CPU) return FSDP_OK;
    const int32_t *tok = fsdp_tensor_data(in);
    for (int64_t i = 0; i < fsdp_tensor_numel(in); i++)
        if (tok[i] < 0 || tok[i] >= V)
            return FSDP_FAIL(
                ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: token %d at position %lld is not in [0, %lld)",
                fsdp_nn_describe(m, desc, sizeof desc), tok[i], (long long)i, (long long)V);
    return FSDP_OK;
}

static fsdp_status embedding_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                     const fsdp_tensor **out) {
    embedding *e = m->impl;
    int64_t C = fsdp_tensor_dim(e->weight->data, 1);
    bool sharded = e->vocab_start >= 0;
    FSDP_TRY_AT(ctx,
                check_tokens(ctx, m, in,
                             sharded ? e->num_embeddings : fsdp_tensor_dim(e->weight->data, 0)));
    fsdp_device dev = fsdp_tensor_device(in);
    const fsdp_kernels_i *k;
    LLAMA_KERNELS(ctx, m, dev, embedding_forward, k);
    int nd = fsdp_tensor_ndim(in);
    int64_t shape[FSDP_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = fsdp_tensor_dim(in, i);
    shape[nd] = C;
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &e->output, dev, nd + 1, shape));
    e->input = in;
    int64_t start = sharded ? e->vocab_start : 0, rows = fsdp_tensor_dim(e->weight->data, 0);
    k->embedding_forward(fsdp_tensor_f32(e->output), fsdp_tensor_data(in),
                         fsdp_tensor_f32(e->weight->data), fsdp_tensor_numel(in), C, start, rows);
    *out = e->output;
    return FSDP_OK;
}

static fsdp_status embedding_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                      const fsdp_tensor **din) {
    embedding *e = m->impl;
    if (!e->input || !fsdp_tensor_same_shape(dout, e->output)) return fsdp_llama_no_forward(ctx, m);
    if (din) *din = NULL; /* token ids have no gradient */
    if (!e->weight->requires_grad) return FSDP_OK;
    const fsdp_kernels_i *k;
    LLAMA_KERNELS(ctx, m, fsdp_tensor_device(dout), embedding_backward, k);
    int64_t C = fsdp_tensor_dim(e->weight->data, 1);
    int64_t start = e->vocab_start >= 0 ? e->vocab_start : 0;
    int64_t rows = fsdp_tensor_dim(e->weight->data, 0);
    if (rows == 0) return FSDP_OK; /* a vocabulary shard with no rows */
    k->embedding_backward(fsdp_tensor_f32(e->weight->grad), fsdp_tensor_f32(dout),
                          fsdp_tensor_data(e->input), fsdp_tensor_numel(e->input), C, start, rows);
    return FSDP_OK;
}

static const fsdp_module_ops embedding_ops = {.kind = "Embedding",
                                              .forward = embedding_forward,
                                              .backward = embedding_backward,
                                              .free_impl = embedding_free};

fsdp_status fsdp_embedding_create(fsdp_ctx *ctx, int64_t num_embeddings, int64_t dim,
                                  fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (num_embeddings <= 0 || num_embeddings > INT32_MAX || dim <= 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Embedding(%lld, %lld): num_embeddings must be in [1, 2^31) and dim "
                         "positive",
                         (long long)num_embeddings, (long long)dim);
    embedding *e = calloc(1, sizeof *e);
    if (!e) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an Embedding layer");
    e->num_embeddings = num_embeddings;
    e->vocab_start = -1;
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &embedding_ops, e, &m));
    fsdp_status st =
        fsdp_module_add_param(ctx, m, "weight", 2, (int64_t[]){num_embeddings, dim},
                              (fsdp_init){.kind = FSDP_INIT_NORMAL, .a = 0, .b = 1}, &e->weight);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

bool fsdp_nn_is_embedding(const fsdp_module *m) {
    return m && m->ops == &embedding_ops;
}

fsdp_status fsdp_nn_embedding_shard_vocab(fsdp_ctx *ctx, fsdp_module *m, int64_t start) {
    embedding *e = fsdp_nn_is_embedding(m) ? m->impl : NULL;
    int64_t rows = e ? fsdp_tensor_dim(e->weight->data, 0) : 0;
    if (!e || start < 0 || start + rows > e->num_embeddings) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: cannot hold vocabulary rows [%lld, %lld) of an Embedding",
                         fsdp_nn_describe(m, desc, sizeof desc), (long long)start,
                         (long long)(start + rows));
    }
    e->vocab_start = start;
    return FSDP_OK;
}

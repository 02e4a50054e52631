/* llama_steps.c: the Llama suites' shared set-up (the (dp, tp) mesh, the model under its TP
 * plan) and the device suites' recorded training steps (llama_steps.h). */
#include "llama_steps.h"

#include "core/error.h" // defines: FSDP_TRY

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* (LLAMA_BATCH, LLAMA_SEQ) tokens and next-token targets (-100 at each row's end), the same on
 * every rank. */
static void make_batch(int step, int64_t V, int32_t *tokens, int32_t *targets) {
    for (int i = 0; i < LLAMA_BATCH * LLAMA_SEQ; i++)
        tokens[i] = (int32_t)(mix(1000u * (uint64_t)step + (uint64_t)i) % (uint64_t)V);
    for (int b = 0; b < LLAMA_BATCH; b++)
        for (int t = 0; t < LLAMA_SEQ; t++)
            targets[b * LLAMA_SEQ + t] =
                t + 1 < LLAMA_SEQ ? tokens[b * LLAMA_SEQ + t + 1] : FSDP_IGNORE_INDEX;
}

fsdp_status llama_tp_build(fsdp_ctx *ctx, const fsdp_llama_config *cfg, int dp, int tp,
                           bool loss_parallel, uint64_t seed, fsdp_device dev, llama_tp *out) {
    *out = (llama_tp){0};
    fsdp_tp_plan_entry plan[FSDP_LLAMA_TP_PLAN_LEN];
    int n = 0;
    fsdp_status st =
        fsdp_mesh_create(ctx, 2, (int[]){dp, tp}, (const char *[]){"dp", "tp"}, &out->mesh);
    if (st == FSDP_OK) st = fsdp_mesh_dim(ctx, out->mesh, "tp", &out->tp);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, out->mesh, "dp", &out->dp);
    if (st == FSDP_OK) st = fsdp_model_llama(ctx, cfg, &out->m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, out->m, seed);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, out->m, dev);
    if (st == FSDP_OK) st = fsdp_llama_tp_plan(ctx, cfg, tp, loss_parallel, plan, &n);
    if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, out->m, out->tp, n, plan, NULL);
    return st;
}

void llama_tp_free(llama_tp *l) {
    fsdp_module_free(l->m);
    fsdp_mesh_free(l->mesh);
    *l = (llama_tp){0};
}

fsdp_status llama_record_optimizer(fsdp_ctx *ctx, fsdp_module *m, fsdp_optimizer **out) {
    return bounded() ? fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.1}, out)
                     : fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = 1e-2}, out);
}

/* One step: forward, loss, backward, (clipping,) update, each recorded. */
static fsdp_status record_step(fsdp_ctx *ctx, const llama_tp *l, const llama_record_options *o,
                               const fsdp_tensor *tok, const int32_t *targets,
                               fsdp_tensor **dlogits, record *r) {
    const fsdp_tensor *logits, *unused;
    float loss = 0.0f;
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, o->opt));
    FSDP_TRY(fsdp_module_forward(ctx, l->m, tok, &logits));
    FSDP_TRY(put_tensor(ctx, r, "logits", logits));
    if (!*dlogits) FSDP_TRY(fsdp_tensor_create_like(ctx, logits, dlogits));
    FSDP_TRY(o->plain_loss ? fsdp_loss_cross_entropy_ignore(ctx, logits, targets, FSDP_IGNORE_INDEX,
                                                            &loss, *dlogits)
                           : fsdp_loss_parallel_cross_entropy(ctx, logits, targets,
                                                              FSDP_IGNORE_INDEX, &loss, *dlogits));
    FSDP_TRY(put_f32(ctx, r, "loss", &loss, 1));
    FSDP_TRY(put_tensor(ctx, r, "dlogits", *dlogits));
    FSDP_TRY(fsdp_module_backward(ctx, l->m, *dlogits, &unused));
    if (o->clip) {
        double norm = 0.0;
        FSDP_TRY(fsdp_sharded_clip_grad_norm(ctx, o->clip, 1.0, 2.0, &norm));
        float normf = (float)norm; /* on cuda a number within the bound; else its bits */
        FSDP_TRY(on_cuda() ? put_f32(ctx, r, "clip norm", &normf, 1)
                           : put(ctx, r, "clip norm", &norm, sizeof norm));
    }
    return fsdp_optimizer_step(ctx, o->opt);
}

fsdp_status llama_record_steps(fsdp_ctx *ctx, const llama_tp *l, fsdp_device dev,
                               const llama_record_options *o, record *r) {
    fsdp_tensor *htok = NULL, *tok = NULL, *dlogits = NULL;
    int32_t tokens[LLAMA_BATCH * LLAMA_SEQ], targets[LLAMA_BATCH * LLAMA_SEQ];
    int64_t off, len; /* this dp rank's rows of the batch */
    fsdp_chunk_range(LLAMA_BATCH, fsdp_mesh_size(l->mesh, 0), fsdp_mesh_coordinate(l->mesh, 0),
                     &off, &len);
    fsdp_status st = fsdp_tensor_from_blob(ctx, tokens + off * LLAMA_SEQ, FSDP_DTYPE_I32, FSDP_CPU,
                                           2, (int64_t[]){len, LLAMA_SEQ}, &htok);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, dev, 2, (int64_t[]){len, LLAMA_SEQ}, &tok);
    for (int s = 0; st == FSDP_OK && s < LLAMA_STEPS; s++) {
        make_batch(s, o->vocab, tokens, targets);
        if (s == LLAMA_STEPS - 1) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, tok, htok);
        if (st == FSDP_OK) st = record_step(ctx, l, o, tok, targets + off * LLAMA_SEQ, &dlogits, r);
        if (st == FSDP_OK && s == LLAMA_STEPS - 1) st = fsdp_comm_debug_end(ctx);
    }
    if (st == FSDP_OK) st = put_comm(ctx, r, "comm-debug");
    fsdp_tensor_free(htok), fsdp_tensor_free(tok), fsdp_tensor_free(dlogits);
    return st;
}

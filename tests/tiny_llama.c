/* tiny_llama.c: the bf16-policy suites' tiny Llama, its steps and their comparison, on one rank
 * and on two rank threads (tiny_llama.h). */
#include "tiny_llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"     // defines: fsdp_test_ctx, FSDP_TEST_OK, fsdp_test_run_world
#include "llama_steps.h" // defines: llama_tp_build, llama_tp_free
#include "on_device.h"   // defines: fsdp_test_device_close

fsdp_llama_config tiny_llama_config(fsdp_dtype compute) {
    return (fsdp_llama_config){.dim = TINY_DIM,
                               .n_layers = TINY_LAYERS,
                               .n_heads = 4,
                               .n_kv_heads = 2,
                               .vocab_size = TINY_VOCAB,
                               .ffn_hidden = TINY_HIDDEN,
                               .max_seq_len = 16,
                               .init_std = 0.2f,
                               .compute_dtype = compute};
}

fsdp_module *tiny_model(fsdp_dtype compute, fsdp_device dev, bool ckpt) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config cfg = tiny_llama_config(compute);
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    if (dev.type != FSDP_DEVICE_CPU) FSDP_TEST_OK(fsdp_module_to(ctx, m, dev));
    for (int l = 0; ckpt && l < TINY_LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "model.layers.%d", l);
        FSDP_TEST_OK(fsdp_checkpoint_wrap(ctx, fsdp_module_find(m, name)));
    }
    return m;
}

int64_t tiny_differ(const void *a, const void *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++)
        d += memcmp((const char *)a + 4 * i, (const char *)b + 4 * i, 4) != 0;
    return d;
}

bool tiny_same_bits(const char *name, const float *a, const float *b, int64_t n) {
    int64_t d = tiny_differ(a, b, n);
    printf("\n    %s: %lld of %lld elements differ", name, (long long)d, (long long)n);
    return d == 0;
}

fsdp_tensor *tiny_on(fsdp_device dev, fsdp_dtype dtype, const void *host, int64_t n) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *h = NULL, *d = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, dtype, dev, 1, (int64_t[]){n}, &d));
    if (host) {
        FSDP_TEST_OK(
            fsdp_tensor_from_blob(ctx, (void *)host, dtype, FSDP_CPU, 1, (int64_t[]){n}, &h));
        FSDP_TEST_OK(fsdp_tensor_copy(ctx, d, h));
        fsdp_tensor_free(h);
    }
    return d;
}

void tiny_back(void *host, const fsdp_tensor *d) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, host, fsdp_tensor_dtype(d), FSDP_CPU, 1,
                                       (int64_t[]){fsdp_tensor_numel(d)}, &h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, h, d));
    fsdp_tensor_free(h);
}

float tiny_from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static fsdp_status copy_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    tiny_step *o = user;
    const fsdp_tensor *g = fsdp_param_grad(p);
    fsdp_tensor *h = NULL;
    FSDP_TRY_AT(ctx, fsdp_tensor_from_blob(ctx, o->grads + o->n_grads, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                           (int64_t[]){fsdp_tensor_numel(g)}, &h));
    fsdp_status st = fsdp_tensor_copy(ctx, h, g);
    fsdp_tensor_free(h);
    o->n_grads += fsdp_tensor_numel(g);
    return st;
}

fsdp_status tiny_tokens(fsdp_ctx *ctx, fsdp_device dev, int s, int32_t *tgt, fsdp_tensor **td) {
    int32_t tok[TINY_TOKENS];
    for (int i = 0; i < TINY_TOKENS; i++) tok[i] = (int32_t)((i * 37 + 11 + 5 * s) % TINY_VOCAB);
    for (int i = 0; tgt && i < TINY_TOKENS; i++)
        tgt[i] = i % TINY_SEQ == TINY_SEQ - 1 ? FSDP_IGNORE_INDEX : tok[i + 1];
    fsdp_tensor *th = NULL;
    int64_t shape[2] = {TINY_BATCH, TINY_SEQ};
    fsdp_status st = fsdp_tensor_from_blob(ctx, tok, FSDP_DTYPE_I32, FSDP_CPU, 2, shape, &th);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, dev, 2, shape, td);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, *td, th);
    fsdp_tensor_free(th);
    return st;
}

fsdp_status tiny_step_of(fsdp_ctx *ctx, fsdp_module *m, fsdp_module *grads_of, fsdp_device dev,
                         int s, tiny_step *o) {
    int32_t tgt[TINY_TOKENS];
    fsdp_tensor *td = NULL, *dl = NULL, *lh = NULL;
    const fsdp_tensor *out = NULL;
    fsdp_status st = tiny_tokens(ctx, dev, s, tgt, &td);
    if (st == FSDP_OK) st = fsdp_module_zero_grad(ctx, grads_of);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, td, &out);
    if (st == FSDP_OK) st = fsdp_module_activation_bytes(ctx, m, &o->forward_bytes);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, out, &dl);
    if (st == FSDP_OK)
        st = fsdp_loss_cross_entropy_ignore(ctx, out, tgt, FSDP_IGNORE_INDEX, &o->loss, dl);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dl, NULL);
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, o->logits, FSDP_DTYPE_F32, FSDP_CPU, 3,
                                   (int64_t[]){TINY_BATCH, TINY_SEQ, TINY_VOCAB}, &lh);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, lh, out);
    free(o->grads);
    o->n_grads = 0;
    o->grads = calloc((size_t)fsdp_module_param_count(grads_of) + 1, sizeof(float));
    if (st == FSDP_OK && !o->grads) st = FSDP_ERR_OUT_OF_MEMORY;
    if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, grads_of, copy_grad, o);
    fsdp_tensor_free(td), fsdp_tensor_free(dl), fsdp_tensor_free(lh);
    return st;
}

int64_t tiny_forward_bytes(fsdp_module *m) {
    tiny_step o = {0};
    FSDP_TEST_OK(tiny_step_of(fsdp_test_ctx(), m, m, FSDP_CPU, 0, &o));
    free(o.grads);
    return o.forward_bytes;
}

void tiny_compare(fsdp_device dev, const tiny_step *n, const tiny_step *o) {
    CU_ASSERT_EQUAL_FATAL(n->n_grads, o->n_grads);
    printf("\n    %s: loss %.9g, path before %.9g", fsdp_device_to_string(dev), n->loss, o->loss);
    int64_t nl = TINY_TOKENS * TINY_VOCAB;
    if (dev.type == FSDP_DEVICE_CPU) {
        CU_ASSERT_TRUE(tiny_same_bits("loss", &n->loss, &o->loss, 1));
        CU_ASSERT_TRUE(tiny_same_bits("logits", n->logits, o->logits, nl));
        CU_ASSERT_TRUE(tiny_same_bits("gradients", n->grads, o->grads, n->n_grads));
        return;
    }
    CU_ASSERT_TRUE(fsdp_test_device_close("loss", &n->loss, &o->loss, 1, 5e-2, 0));
    CU_ASSERT_TRUE(fsdp_test_device_close("logits", n->logits, o->logits, nl, 5e-2, 1e-3));
    CU_ASSERT_TRUE(fsdp_test_device_close("gradients", n->grads, o->grads, n->n_grads, 5e-2, 1e-3));
}

static fsdp_status world_rank(fsdp_ctx *ctx, int rank, void *user) {
    tiny_world *r = user;
    fsdp_llama_config cfg = tiny_llama_config(r->compute);
    llama_tp l;
    fsdp_sharded *sh = NULL;
    static const char *const kinds[] = {"LlamaDecoderLayer"};
    fsdp_status st = FSDP_OK;
    if (r->tp > 1) {
        st = llama_tp_build(ctx, &cfg, r->dp, r->tp, false, 1234, FSDP_CPU, &l);
    } else { /* no plan (as fsdp-train at tp 1): a dp mesh and the model */
        l = (llama_tp){0};
        st = fsdp_mesh_create(ctx, 1, (int[]){r->dp}, (const char *[]){"dp"}, &l.mesh);
        if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, l.mesh, "dp", &l.dp);
        if (st == FSDP_OK) st = fsdp_model_llama(ctx, &cfg, &l.m);
        if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, l.m, 1234);
    }
    if (st == FSDP_OK && r->prepare) r->prepare(l.m, r->on);
    if (st == FSDP_OK && r->dp > 1)
        st = fsdp_fully_shard(
            ctx, l.m,
            &(fsdp_fully_shard_options){.group = l.dp, .wrap_kinds = kinds, .n_wrap_kinds = 1},
            &sh);
    fsdp_module *grads_of = sh ? fsdp_sharded_flat_params(sh) : l.m;
    for (int s = 0; st == FSDP_OK && s < 2; s++)
        st = tiny_step_of(ctx, l.m, grads_of, FSDP_CPU, s, &r->out[rank][s]);
    fsdp_sharded_free(sh);
    llama_tp_free(&l);
    return st;
}

void tiny_world_run(tiny_world *w) {
    FSDP_TEST_OK(fsdp_test_run_world(TINY_WORLD, 0, world_rank, w));
}

int tiny_world_compare(const tiny_world *a, const tiny_world *b) {
    int first = 0, hosted = fsdp_test_hosted_ranks(TINY_WORLD, &first);
    for (int rank = first; rank < first + hosted; rank++)
        for (int s = 0; s < 2; s++) {
            printf("\n    rank %d step %d:", rank, s);
            tiny_compare(FSDP_CPU, &a->out[rank][s], &b->out[rank][s]);
        }
    return hosted;
}

void tiny_world_free(tiny_world *w) {
    for (int rank = 0; rank < TINY_WORLD; rank++)
        for (int s = 0; s < 2; s++) free(w->out[rank][s].grads), w->out[rank][s].grads = NULL;
}

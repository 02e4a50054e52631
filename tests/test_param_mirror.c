/* test_param_mirror.c: a parameter's bf16 mirror under the bf16 compute policy without FSDP
 * (src/nn/mirror.c, issue 32). A Linear reads its weight's bf16 copy from the weight's mirror,
 * which AdamW's step writes in its update's pass (adam_update_multi's bf16 copy, or the
 * per-tensor adam_update_bf16), and rounds the weight again only when the mirror is not current
 * (the weight's storage or write generation moved since the mirror was last written whole). The
 * tiny Llama over several AdamW steps, mirrors on against off (fsdp_nn_test_param_mirror, the
 * path before: every forward rounds every weight): each step's loss, logits and every gradient,
 * and every weight after the last step, bit for bit on the CPU and the run's device (sim),
 * plain and with every decoder layer checkpointed, with tied embeddings, with the per-tensor
 * steps; between two steps two weights are written (fsdp_tensor_fill, fsdp_tensor_copy), which
 * the next forward must round again. The forwards that read a current mirror and that rounded
 * are counted and pinned, so a run that never used one cannot pass. SGD writes no mirror: every
 * forward rounds, the same bits. A checkpoint load (fsdp_ckpt_load, as fsdp-train resumes) writes
 * the weights: trained on past its save and then loaded, the model's next two steps equal, bit
 * for bit, those of a fresh model loaded from the same save, the first forward after the load
 * rounding every weight in both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt_common.h"    // defines: ckpt_test_tmp_root, ckpt_test_latest, ckpt_test_remove_tree
#include "harness.h"        // defines: fsdp_test_run, fsdp_test_ctx, FSDP_TEST_OK
#include "nn/module_impl.h" // defines: fsdp_nn_test_param_mirror, fsdp_nn_test_param_mirror_counts
#include "on_device.h"      // defines: fsdp_test_device, fsdp_test_device_close
#include "optim/update.h"   // defines: fsdp_optimizer_test_per_tensor
#include "tiny_llama.h"     // defines: tiny_llama_config, tiny_step_of, tiny_compare, tiny_on

enum {
    STEPS = 5,
    WRITE_AFTER = 2, /* the weights written after this step's update, before the next forward */
    LINEARS = 7 * TINY_LAYERS + 1 /* q, k, v, o, gate, up, down per layer; lm_head */
};

static const fsdp_adam_options ADAMW = {.lr = 1e-2, .weight_decay = 0.01};

typedef struct scenario {
    const char *name;
    bool ckpt, tied, per_tensor, sgd;
} scenario;

typedef struct run {
    tiny_step out[STEPS];
    float *weights; /* every parameter after the last step, in visit order */
    int64_t n_weights, used, rounded;
} run;

static fsdp_module *build(const scenario *s, fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config cfg = tiny_llama_config(FSDP_DTYPE_BF16);
    cfg.tie_word_embeddings = s->tied;
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    if (dev.type != FSDP_DEVICE_CPU) FSDP_TEST_OK(fsdp_module_to(ctx, m, dev));
    for (int l = 0; s->ckpt && l < TINY_LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "model.layers.%d", l);
        FSDP_TEST_OK(fsdp_checkpoint_wrap(ctx, fsdp_module_find(m, name)));
    }
    return m;
}

/* Writes to two weights between steps, as a user or a checkpoint load would: a fill of one and a
 * copy into another. */
static void write_weights(fsdp_module *m, fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_param *q = fsdp_module_get_param(m, "model.layers.0.self_attn.q_proj.weight");
    fsdp_param *d = fsdp_module_get_param(m, "model.layers.1.mlp.down_proj.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, fsdp_param_data(q), 0.03f));
    int64_t n = fsdp_tensor_numel(fsdp_param_data(d));
    float *h = malloc((size_t)n * sizeof *h);
    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    for (int64_t i = 0; i < n; i++) h[i] = 0.1f * sinf((float)i * 0.37f);
    fsdp_tensor *src = tiny_on(dev, FSDP_DTYPE_F32, h, n), *view = NULL;
    FSDP_TEST_OK(fsdp_tensor_view(ctx, src, 0, fsdp_tensor_ndim(fsdp_param_data(d)),
                                  fsdp_tensor_shape(fsdp_param_data(d)), &view));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, fsdp_param_data(d), view));
    fsdp_tensor_free(view), fsdp_tensor_free(src), free(h);
}

static fsdp_status copy_weight(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    run *r = user;
    const fsdp_tensor *w = fsdp_param_data(p);
    int64_t n = fsdp_tensor_numel(w);
    float *grown = realloc(r->weights, (size_t)(r->n_weights + n) * sizeof *grown);
    if (!grown) return FSDP_ERR_OUT_OF_MEMORY;
    r->weights = grown;
    tiny_back(r->weights + r->n_weights, w);
    r->n_weights += n;
    return FSDP_OK;
}

/* s's STEPS steps on dev with mirrors on or off, into r. */
static void run_steps(const scenario *s, fsdp_device dev, bool mirrors, run *r) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_nn_test_param_mirror(mirrors);
    fsdp_optimizer_test_per_tensor(s->per_tensor);
    int64_t used, rounded;
    fsdp_nn_test_param_mirror_counts(&used, &rounded, true);
    fsdp_module *m = build(s, dev);
    fsdp_optimizer *opt = NULL;
    if (s->sgd)
        FSDP_TEST_OK(
            fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 0.05, .momentum = 0.9}, &opt));
    else
        FSDP_TEST_OK(fsdp_adamw_create(ctx, m, &ADAMW, &opt));
    for (int i = 0; i < STEPS; i++) {
        FSDP_TEST_OK(tiny_step_of(ctx, m, m, dev, i, &r->out[i]));
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
        if (i == WRITE_AFTER) write_weights(m, dev);
    }
    fsdp_nn_test_param_mirror_counts(&r->used, &r->rounded, true);
    FSDP_TEST_OK(fsdp_module_visit_params(ctx, m, copy_weight, r));
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
    fsdp_nn_test_param_mirror(true);
    fsdp_optimizer_test_per_tensor(false);
}

static void run_free(run *r) {
    for (int i = 0; i < STEPS; i++) free(r->out[i].grads);
    free(r->weights);
}

/* The forwards of a run that round a weight: every Linear's first; the two written weights' next;
 * with tied embeddings lm_head's every one (the embedding's forward reads the shared weight,
 * which moves its write generation past the step's); under SGD every one. The rest read a
 * current mirror: each step runs every Linear's forward once, and a checkpointed layer's Linears
 * once more in the backward's recompute. */
static void check_counts(const scenario *s, const run *on) {
    int64_t forwards = (int64_t)STEPS * (LINEARS + (s->ckpt ? LINEARS - 1 : 0));
    int64_t rounded = s->sgd ? forwards : s->tied ? LINEARS + 2 + (STEPS - 1) : LINEARS + 2;
    printf("\n    mirrors: %lld forwards read a current one, %lld rounded (pinned %lld and %lld)",
           (long long)on->used, (long long)on->rounded, (long long)(forwards - rounded),
           (long long)rounded);
    CU_ASSERT_EQUAL(on->rounded, rounded);
    CU_ASSERT_EQUAL(on->used, forwards - rounded);
}

static void check(const scenario *s, fsdp_device dev) {
    run on = {0}, off = {0};
    printf("\n  %s on %s:", s->name, fsdp_device_to_string(dev));
    run_steps(s, dev, true, &on);
    run_steps(s, dev, false, &off);
    CU_ASSERT_EQUAL(off.used + off.rounded, 0); /* off: no parameter carries a mirror */
    check_counts(s, &on);
    for (int i = 0; i < STEPS; i++) {
        printf("\n    step %d:", i);
        tiny_compare(dev, &on.out[i], &off.out[i]);
    }
    CU_ASSERT_EQUAL_FATAL(on.n_weights, off.n_weights);
    if (dev.type == FSDP_DEVICE_CUDA) { /* tiny_compare's device tolerance, for its reason */
        CU_ASSERT_TRUE(
            fsdp_test_device_close("weights", on.weights, off.weights, on.n_weights, 5e-2, 1e-3));
    } else {
        CU_ASSERT_TRUE(tiny_same_bits("weights", on.weights, off.weights, on.n_weights));
    }
    run_free(&on), run_free(&off);
}

static const scenario PLAIN = {.name = "plain"}, CKPT = {.name = "checkpointed", .ckpt = true},
                      TIED = {.name = "tied embeddings", .tied = true},
                      PER_TENSOR = {.name = "per-tensor steps", .per_tensor = true},
                      CKPT_PER_TENSOR = {.name = "checkpointed, per-tensor steps",
                                         .ckpt = true,
                                         .per_tensor = true},
                      SGD = {.name = "SGD", .sgd = true};

/* The scenario on the CPU and on the test device (sim, or the GPU where FSDP_TEST_DEVICE says) */
static void check_both(const scenario *sc) {
    check(sc, FSDP_CPU);
    check(sc, fsdp_test_device());
}

static void test_plain(void) {
    check_both(&PLAIN);
}

static void test_checkpointed(void) {
    check_both(&CKPT);
}

static void test_tied(void) {
    check_both(&TIED);
}

static void test_per_tensor(void) {
    check_both(&PER_TENSOR);
    check(&CKPT_PER_TENSOR, fsdp_test_device());
}

static void test_sgd(void) {
    check_both(&SGD);
}

/* ---- a checkpoint load ---- */

enum { SAVE_AFTER = 2, LOAD_AFTER = 4 }; /* saved after 2 steps, loaded after 4 */

/* m's and opt's state by name (the parameters, AdamW's moments and step count), as fsdp-train
 * saves and resumes it; the caller frees it. */
static fsdp_state *state_of(fsdp_module *m, fsdp_optimizer *opt) {
    fsdp_state *st = NULL;
    FSDP_TEST_OK(fsdp_state_create(fsdp_test_ctx(),
                                   &(fsdp_state_sources){.model = m, .optimizer = opt}, &st));
    return st;
}

static void save(fsdp_module *m, fsdp_optimizer *opt, const char *dir, int64_t step) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_state *st = state_of(m, opt);
    fsdp_ckpt_writer *w = NULL;
    FSDP_TEST_OK(fsdp_ckpt_writer_create(ctx, dir, NULL, &w));
    FSDP_TEST_OK(fsdp_ckpt_save(ctx, w, st, &(fsdp_ckpt_meta){.step = step}));
    fsdp_ckpt_writer_free(ctx, w);
    fsdp_state_free(st);
}

static void load(fsdp_module *m, fsdp_optimizer *opt, const char *path) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_state *st = state_of(m, opt);
    fsdp_ckpt *ck = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    FSDP_TEST_OK(fsdp_ckpt_load(ctx, ck, st, NULL));
    fsdp_ckpt_close(ck);
    fsdp_state_free(st);
}

/* The tiny Llama and AdamW on dev, mirrors on: model 0 trained SAVE_AFTER steps, saved, trained
 * on to LOAD_AFTER (its mirrors current, written by the last update) and loaded; model 1 fresh and
 * loaded from the same save. Their next two steps (batches SAVE_AFTER on, as a resumed run's)
 * compared bit for bit (tiny_compare); the forwards that rounded a weight counted: every Linear's
 * in the first step after the load in both (model 0's mirrors are stale: the load wrote the
 * weights), none in the second (AdamW's update wrote them). */
static void check_load(fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    printf("\n  checkpoint load on %s:", fsdp_device_to_string(dev));
    char *dir = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fsdp_module *m[2] = {build(&PLAIN, dev), build(&PLAIN, dev)};
    fsdp_optimizer *opt[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) FSDP_TEST_OK(fsdp_adamw_create(ctx, m[i], &ADAMW, &opt[i]));
    tiny_step *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    for (int s = 0; s < LOAD_AFTER; s++) {
        if (s == SAVE_AFTER) save(m[0], opt[0], dir, s);
        FSDP_TEST_OK(tiny_step_of(ctx, m[0], m[0], dev, s, &o[0]));
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt[0]));
    }
    char *path = ckpt_test_latest(dir);
    for (int i = 0; i < 2; i++) load(m[i], opt[i], path);
    for (int s = SAVE_AFTER; s < SAVE_AFTER + 2; s++) {
        int64_t used[2], rounded[2];
        for (int i = 0; i < 2; i++) {
            fsdp_nn_test_param_mirror_counts(&used[i], &rounded[i], true);
            FSDP_TEST_OK(tiny_step_of(ctx, m[i], m[i], dev, s, &o[i]));
            fsdp_nn_test_param_mirror_counts(&used[i], &rounded[i], true);
            FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt[i]));
        }
        printf("\n    step %d: %lld and %lld forwards rounded (loaded after training on; fresh)", s,
               (long long)rounded[0], (long long)rounded[1]);
        tiny_compare(dev, &o[0], &o[1]);
        for (int i = 0; i < 2; i++) {
            CU_ASSERT_EQUAL(rounded[i], s == SAVE_AFTER ? LINEARS : 0);
            CU_ASSERT_EQUAL(used[i], s == SAVE_AFTER ? 0 : LINEARS);
        }
    }
    free(o[0].grads), free(o[1].grads), free(o);
    for (int i = 0; i < 2; i++) fsdp_optimizer_free(opt[i]), fsdp_module_free(m[i]);
    ckpt_test_remove_tree(dir);
    free(path), free(dir);
}

static void test_checkpoint_load(void) {
    check_load(FSDP_CPU);
    check_load(fsdp_test_device());
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {.name = "plain", test_plain}, {.name = "checkpointed", test_checkpointed},
        {.name = "tied", test_tied},   {"per_tensor", test_per_tensor},
        {.name = "sgd", test_sgd},     {"checkpoint_load", test_checkpoint_load},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "param_mirror", cases, (int)(sizeof cases / sizeof cases[0]));
}

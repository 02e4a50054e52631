/* test_final_norm16.c: the Llama's final norm (model.norm) gives lm_head its output in bf16 when
 * lm_head runs the bf16 policy (LlamaForCausalLM asks around model's call; issue 32). The tiny
 * Llama under the policy against the path before (fsdp_nn_llama_set_bf16_norms off: every norm's
 * output f32): loss, logits and every gradient over two steps bit for bit, on the CPU and the
 * device, with every decoder layer checkpointed, at (dp, tp) = (2, 1) under FSDP and at (1, 2)
 * under torchtitan's plan, whose SequenceParallel and Colwise hooks keep it f32; the bf16 outputs
 * counted, none in f32 or on the path before. The activation bytes after a forward exactly 4 R D
 * fewer than with the final norm alone kept f32 (its output 2 R D, lm_head's bf16 copy of it
 * 2 R D); an acting hook on model.norm's output or lm_head's input keeps f32 (the hook sees f32),
 * an observer does not; model.norm called directly (as generation calls it) gives f32. */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx
#include "nn/llama_common.h" // defines: fsdp_llama_test_final_norm16
#include "nn/nn.h"           // defines: fsdp_nn_llama_set_bf16_norms
#include "on_device.h"       // defines: fsdp_test_device
#include "tiny_llama.h"      // defines: tiny_llama_config, tiny_step_of, tiny_compare, tiny_world

enum { R = TINY_TOKENS, D = TINY_DIM, LAYERS = TINY_LAYERS };

/* The tiny Llama under compute on dev, its norms' bf16 outputs on or off, every decoder layer
 * checkpointed when ckpt. */
static fsdp_module *model(fsdp_dtype compute, fsdp_device dev, bool norms16, bool ckpt) {
    fsdp_module *m = tiny_model(compute, dev, ckpt);
    fsdp_nn_llama_set_bf16_norms(m, norms16);
    return m;
}

/* Two steps with the norms' bf16 outputs and on the path before, compared; the final norm's bf16
 * outputs counted (one a step under the policy, checkpointed or not: the root is not recomputed;
 * none in f32 or on the path before). */
static void check_model(fsdp_dtype compute, fsdp_device dev, bool ckpt) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_test_device_pin_f32_attention(true);
    fsdp_module *m[2] = {model(compute, dev, true, ckpt), model(compute, dev, false, ckpt)};
    tiny_step *o = calloc(2, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    bool b16 = compute == FSDP_DTYPE_BF16;
    for (int s = 0; s < 2; s++) {
        int64_t n16[2];
        for (int i = 0; i < 2; i++) {
            fsdp_llama_test_final_norm16();
            FSDP_TEST_OK(tiny_step_of(ctx, m[i], m[i], dev, s, &o[i]));
            n16[i] = fsdp_llama_test_final_norm16();
        }
        printf("\n    %s%s step %d: %lld bf16 final norm outputs (path before: %lld)",
               b16 ? "bf16" : "f32", ckpt ? " checkpointed" : "", s, (long long)n16[0],
               (long long)n16[1]);
        tiny_compare(dev, &o[0], &o[1]);
        CU_ASSERT_EQUAL(n16[0], b16 ? 1 : 0);
        CU_ASSERT_EQUAL(n16[1], 0);
    }
    free(o[0].grads), free(o[1].grads), free(o);
    fsdp_module_free(m[0]), fsdp_module_free(m[1]);
    fsdp_test_device_pin_f32_attention(false);
}

static void test_bf16_cpu(void) {
    check_model(FSDP_DTYPE_BF16, FSDP_CPU, false);
    check_model(FSDP_DTYPE_BF16, FSDP_CPU, true);
}

static void test_f32_cpu(void) {
    check_model(FSDP_DTYPE_F32, FSDP_CPU, false);
}

static void test_bf16_device(void) {
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), false);
    check_model(FSDP_DTYPE_BF16, fsdp_test_device(), true);
}

/* ---- hooks, activation bytes, a direct call ---- */

/* A hook that records the dtype of what passes (the norm's output or lm_head's input). */
static fsdp_status see_dtype(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                             const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    *(fsdp_dtype *)user = fsdp_tensor_dtype(*io);
    return FSDP_OK;
}

/* fsdp_module_activation_bytes of m after a forward of batch 0 on the CPU; *n16 the bf16 final
 * norm outputs it gave. */
static int64_t forward_bytes(fsdp_module *m, int64_t *n16) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tensor *td = NULL;
    const fsdp_tensor *out = NULL;
    int64_t bytes = -1;
    FSDP_TEST_OK(tiny_tokens(ctx, FSDP_CPU, 0, NULL, &td));
    fsdp_llama_test_final_norm16();
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, td, &out));
    *n16 = fsdp_llama_test_final_norm16();
    FSDP_TEST_OK(fsdp_module_activation_bytes(ctx, m, &bytes));
    fsdp_tensor_free(td);
    return bytes;
}

/* An acting hook at model.norm's post-forward or lm_head's pre-forward sees f32 and the final
 * norm stays f32: 4 R D activation bytes more than without it (model.norm's f32 output 4 R D
 * against 2 R D, and lm_head's bf16 copy of its input 2 R D); an observer there sees bf16 and
 * changes nothing. */
static void test_hooks_and_bytes(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *plain = model(FSDP_DTYPE_BF16, FSDP_CPU, true, false);
    int64_t n16 = 0, base = forward_bytes(plain, &n16);
    CU_ASSERT_EQUAL(n16, 1);
    static const struct {
        const char *module;
        fsdp_hook_point point;
    } at[] = {{"model.norm", FSDP_HOOK_POST_FORWARD},
              {"model", FSDP_HOOK_POST_FORWARD},
              {"lm_head", FSDP_HOOK_PRE_FORWARD}};
    for (int a = 0; a < 3; a++)
        for (int observer = 0; observer < 2; observer++) {
            fsdp_module *m = model(FSDP_DTYPE_BF16, FSDP_CPU, true, false);
            fsdp_dtype seen = FSDP_DTYPE_I32;
            FSDP_TEST_OK((observer ? fsdp_module_add_observer : fsdp_module_add_hook)(
                ctx, fsdp_module_find(m, at[a].module), at[a].point, see_dtype, &seen, NULL, NULL));
            int64_t bytes = forward_bytes(m, &n16);
            printf("\n    %s on %s: it sees %s, %lld bf16 final norm outputs, activation bytes "
                   "%lld (%lld more than unhooked; 4 R D = %d)",
                   observer ? "an observer" : "a hook", at[a].module, fsdp_dtype_to_string(seen),
                   (long long)n16, (long long)bytes, (long long)(bytes - base), 4 * R * D);
            CU_ASSERT_EQUAL(seen, observer ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32);
            CU_ASSERT_EQUAL(n16, observer ? 1 : 0);
            CU_ASSERT_EQUAL(bytes - base, observer ? 0 : 4 * R * D);
            fsdp_module_free(m);
        }
    /* model.norm called directly (as generation calls it): f32 */
    fsdp_tensor *x = NULL;
    const fsdp_tensor *y = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3,
                                    (int64_t[]){TINY_BATCH, TINY_SEQ, D}, &x));
    FSDP_TEST_OK(fsdp_module_forward(ctx, fsdp_module_find(plain, "model.norm"), x, &y));
    printf("\n    model.norm called directly: %s", fsdp_dtype_to_string(fsdp_tensor_dtype(y)));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    fsdp_tensor_free(x);
    fsdp_module_free(plain);
}

/* ---- distributed layouts ---- */

/* Both paths at (dp, tp) under the policy (tiny_world, the norms switched by
 * fsdp_nn_llama_set_bf16_norms), each rank's results compared: one bf16 final norm output a
 * step on every rank at tp 1 (FSDP's hooks are on the decoder layers and the root); none at
 * tp > 1, where the plan's SequenceParallel on model.norm and Colwise on lm_head have hooks. */
static void check_world(int dp, int tp) {
    tiny_world *r = calloc(2, sizeof *r); /* 0: bf16 norm outputs; 1: the path before */
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    int64_t n16[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (tiny_world){.compute = FSDP_DTYPE_BF16,
                            .dp = dp,
                            .tp = tp,
                            .prepare = fsdp_nn_llama_set_bf16_norms,
                            .on = i == 0};
        fsdp_llama_test_final_norm16();
        tiny_world_run(&r[i]);
        n16[i] = fsdp_llama_test_final_norm16();
    }
    printf("\n    (dp, tp) = (%d, %d): %lld bf16 final norm outputs (path before: %lld)", dp, tp,
           (long long)n16[0], (long long)n16[1]);
    int hosted = tiny_world_compare(&r[0], &r[1]);
    CU_ASSERT_EQUAL(n16[0], tp == 1 ? 2 * hosted : 0);
    CU_ASSERT_EQUAL(n16[1], 0);
    tiny_world_free(&r[0]), tiny_world_free(&r[1]);
    free(r);
}

static void test_fsdp(void) {
    check_world(TINY_WORLD, 1);
}

static void test_tp(void) {
    check_world(1, TINY_WORLD);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"bf16_cpu", test_bf16_cpu},
        {"f32_cpu", test_f32_cpu},
        {"bf16_device", test_bf16_device},
        {"hooks_and_bytes", test_hooks_and_bytes},
        {"fsdp", test_fsdp},
        {"tp", test_tp},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "final_norm16", cases, (int)(sizeof cases / sizeof cases[0]));
}

/* tiny_llama.h: the tiny Llama the bf16-policy suites step on two paths and compare bit for bit
 * (test_bf16_act, test_dx_sum, test_bf16_residual, test_norm_sums, test_final_norm16,
 * test_param_mirror; test_step_counts counts its launches): its configuration and batches, one
 * step's results on the host, the comparison of two steps' results, the same over two rank
 * threads at a (dp, tp) layout; and small host/device copies (also test_attn16's). */
#ifndef FSDP_TESTS_TINY_LLAMA_H
#define FSDP_TESTS_TINY_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

enum {
    TINY_BATCH = 2,
    TINY_SEQ = 8,
    TINY_VOCAB = 64,
    TINY_TOKENS = TINY_BATCH * TINY_SEQ,
    TINY_LAYERS = 2,
    TINY_DIM = 32,
    TINY_HIDDEN = 48
};

/* The tiny Llama's configuration under `compute` (4 heads, 2 key/value heads, init_std 0.2). */
fsdp_llama_config tiny_llama_config(fsdp_dtype compute);

/* A new tiny Llama under `compute` on dev (moved there from the CPU), every decoder layer
 * checkpointed when ckpt; asserts (CUnit) that each step succeeded. The caller frees it. */
fsdp_module *tiny_model(fsdp_dtype compute, fsdp_device dev, bool ckpt);

/* The 4-byte elements of a and b (n each) that differ in their bits. */
int64_t tiny_differ(const void *a, const void *b, int64_t n);
/* Bit for bit, with the count of differing elements printed. */
bool tiny_same_bits(const char *name, const float *a, const float *b, int64_t n);
/* A new 1-d tensor of n elements of dtype on dev holding host's bytes (uninitialised when host is
 * NULL); the caller frees it. Asserts (CUnit) that each step succeeded. */
fsdp_tensor *tiny_on(fsdp_device dev, fsdp_dtype dtype, const void *host, int64_t n);
/* Every element of d (its dtype's size each) into host. */
void tiny_back(void *host, const fsdp_tensor *d);
/* The float with these bits. */
float tiny_from_bits(uint32_t b);

/* One step's results on the host. */
typedef struct tiny_step {
    float loss;
    float logits[TINY_TOKENS * TINY_VOCAB];
    float *grads; /* every parameter's (local) gradient, in visit order (tiny_step_of allocates) */
    int64_t n_grads;
    int64_t forward_bytes; /* the model's fsdp_module_activation_bytes right after the forward */
} tiny_step;

/* The tokens of batch s on dev in *td (the caller frees it) and, when tgt is not NULL, their
 * next-token targets (the last of each row ignored). */
fsdp_status tiny_tokens(fsdp_ctx *ctx, fsdp_device dev, int s, int32_t *tgt, fsdp_tensor **td);
/* Forward, cross-entropy and backward of batch s on m (on dev), into o; the gradients of
 * grads_of's parameters (m's, or FSDP's flat shards). */
fsdp_status tiny_step_of(fsdp_ctx *ctx, fsdp_module *m, fsdp_module *grads_of, fsdp_device dev,
                         int s, tiny_step *o);
/* fsdp_module_activation_bytes of m right after the forward of a step on batch 0 on the CPU
 * (tiny_step_of: the step runs whole). */
int64_t tiny_forward_bytes(fsdp_module *m);
/* Two steps' results compared: bit for bit on the CPU and sim; on CUDA within test_bf16_act's
 * device tolerance (5e-2 relative plus 1e-3: the GEMMs are the same calls, but the attention's
 * and cuBLAS's sums are not promised to repeat their order run to run). */
void tiny_compare(fsdp_device dev, const tiny_step *n, const tiny_step *o);

/* ---- two rank threads at a (dp, tp) layout ---- */

enum { TINY_WORLD = 2 };

/* One run of tiny_world_run: the tiny Llama under `compute` with torchtitan's plan over tp (none
 * at tp 1, as fsdp-train) and, at dp > 1, FSDP over dp (a unit per decoder layer and the root),
 * on the CPU: two steps of the same batches on every rank, each rank's gradients kept (FSDP's:
 * its flat shards, reduced). prepare (may be NULL) is called with `on` on each rank's model before
 * FSDP wraps it (a path's switch, as fsdp_nn_llama_set_bf16_branches). */
typedef struct tiny_world {
    fsdp_dtype compute;
    int dp, tp; /* dp * tp = TINY_WORLD */
    void (*prepare)(fsdp_module *m, bool on);
    bool on;
    tiny_step out[TINY_WORLD][2]; /* per rank: step 0 and 1 */
} tiny_world;

/* w's run on TINY_WORLD rank threads (fsdp_test_run_world), asserted to succeed. */
void tiny_world_run(tiny_world *w);
/* Every rank this process hosts: its two steps in a and b compared (tiny_compare). Returns the
 * number of hosted ranks (fsdp_test_hosted_ranks). */
int tiny_world_compare(const tiny_world *a, const tiny_world *b);
/* Frees the gradients w's steps hold. */
void tiny_world_free(tiny_world *w);

#endif

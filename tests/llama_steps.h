/* llama_steps.h: what the Llama suites share: the (dp, tp) mesh with the Llama under its TP plan
 * over tp (test_llama_2d, test_tp_device, test_llama_device), and the device suites' recorded
 * training steps (device_record.h): tokens uploaded each step, logits, loss and their gradient
 * recorded, the last step's collectives. */
#ifndef FSDP_TESTS_LLAMA_STEPS_H
#define FSDP_TESTS_LLAMA_STEPS_H

#include <stdbool.h>
#include <stdint.h>

#include "device_record.h" // defines: record
#include "fsdp/fsdp.h"

/* The recorded runs' batch: (LLAMA_BATCH, LLAMA_SEQ) tokens, LLAMA_STEPS steps. */
#define LLAMA_BATCH 4
#define LLAMA_SEQ   8
#define LLAMA_STEPS 3

/* The model with the plan over a (dp, tp) mesh. llama_tp_free frees m and the mesh (the tp dim
 * and the dp group with it): free what wraps m (FSDP, an optimizer) first. */
typedef struct llama_tp {
    fsdp_mesh *mesh; /* (dp, tp), dims "dp" and "tp" */
    fsdp_mesh *tp;   /* its tp dim (the mesh's) */
    fsdp_group *dp;  /* its dp group (the mesh's) */
    fsdp_module *m;
} llama_tp;

/* Builds the (dp, tp) mesh and the Llama of cfg, its parameters from seed, moves it to dev (on
 * the CPU nothing moves) and applies fsdp_llama_tp_plan(cfg, tp, loss_parallel) over tp. On
 * failure *out holds what was made, for llama_tp_free. */
fsdp_status llama_tp_build(fsdp_ctx *ctx, const fsdp_llama_config *cfg, int dp, int tp,
                           bool loss_parallel, uint64_t seed, fsdp_device dev, llama_tp *out);
void llama_tp_free(llama_tp *l);

/* The device suites' optimizer of m: Adam (lr 1e-2), or SGD (lr 0.1) where the comparison is
 * bounded (device_record.h bounded(): Adam's division by sqrt(v) turns the unordered sums'
 * rounding into moves of up to lr, docs/testing.md "Bounds"; SGD carries it unamplified). */
fsdp_status llama_record_optimizer(fsdp_ctx *ctx, fsdp_module *m, fsdp_optimizer **out);

typedef struct llama_record_options {
    int64_t vocab;       /* the tokens' range: the model's vocabulary */
    bool plain_loss;     /* the ordinary cross-entropy; else loss parallel */
    fsdp_sharded *clip;  /* not NULL: fsdp_sharded_clip_grad_norm(1.0) before each step */
    fsdp_optimizer *opt; /* steps l->m's parameters (or FSDP's flat ones) */
} llama_record_options;

/* LLAMA_STEPS steps of l->m on dev on this dp rank's rows of the batch (the same tokens on every
 * rank, uploaded each step), recording each step's logits, loss and logits' gradient (and, with
 * clip, the gradient norm), then the last step's comm-debug records. */
fsdp_status llama_record_steps(fsdp_ctx *ctx, const llama_tp *l, fsdp_device dev,
                               const llama_record_options *o, record *r);

#endif

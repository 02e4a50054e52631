/* train_rank.h: the run on one rank of fsdp-train's world (trainer.c), which train_run
 * (train_world.c) starts on every rank. */
#ifndef FSDP_TOOLS_TRAIN_RANK_H
#define FSDP_TOOLS_TRAIN_RANK_H

#include "train_ckpt.h" // defines: train_sources
#include "trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The run on one rank of the world (ctx bound to it): the mesh, the model of cfg's kind with
 * its parallelism, the optimizer, the rank's feed of `input` (what the kind's load read for this
 * process, or NULL), then the loop with its checkpoints. out: rank 0's progress stream or NULL;
 * metrics are written by rank 0. res is filled as far as the run got; a failure's message goes
 * into err (empty when it is the library's, fsdp_last_error). */
fsdp_status train_rank(fsdp_ctx *ctx, const train_config *cfg, const train_layout *layout,
                       const train_sources *src, const void *input, FILE *out, train_result *res,
                       char *err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif

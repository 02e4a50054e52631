/* trainer.h: the training run a train_config describes, shared by fsdp-train and the tests. */
#ifndef FSDP_TOOLS_TRAINER_H
#define FSDP_TOOLS_TRAINER_H

#include "train_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct train_result {
    int64_t steps;        /* steps run */
    double first_loss;    /* loss over the whole dataset before the first step */
    double last_loss;     /* loss over the whole dataset after the last step */
    double seconds;       /* wall time of the training loop */
    double samples_per_s; /* over the whole loop */
} train_result;

/* Trains the model cfg describes on its synthetic teacher dataset. Progress and summary lines
 * go to `out` (NULL for none) when log.level is info or debug; JSON lines go to log.metrics
 * when set. If the ctx's seed differs from train.seed the model is re-initialised from
 * train.seed, so any ctx gives the same run. On failure returns the status and writes the
 * message (fsdp_last_error, or the tool's own) into err. */
fsdp_status train_run(fsdp_ctx *ctx, const train_config *cfg, FILE *out, train_result *result,
                      char *err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif

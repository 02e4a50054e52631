/* train_samples.h: the samples the MLP kinds train on ([data] kind = synthetic or h5), as a
 * model kind's data side (train_kind.h): the synthetic teacher's dataset or an HDF5 file's,
 * regression or classification, and one rank's slice of every batch. */
#ifndef FSDP_TOOLS_TRAIN_SAMPLES_H
#define FSDP_TOOLS_TRAIN_SAMPLES_H

#include "train_kind.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kind->load: [data] kind = h5 reads the file (train_data_load, with [model] widths); else
 * NULL. */
fsdp_status train_samples_load(const train_config *cfg, void **input, char *err, size_t err_size);
void train_samples_unload(void *input);

/* A rank's feed of samples of `in` inputs and `out` outputs (classes). The synthetic teacher is
 * an MLP from in over [data] teacher_widths to out, with [model] activation. */
fsdp_status train_samples_create(fsdp_ctx *ctx, const train_rank_env *env, int64_t in, int64_t out,
                                 void **feed, train_feed_info *info);
void train_samples_free(void *feed);
fsdp_status train_samples_step(fsdp_ctx *ctx, void *feed, fsdp_module *model, int64_t k0,
                               float *loss, fsdp_tensor **dout);
fsdp_status train_samples_loss(fsdp_ctx *ctx, void *feed, fsdp_module *model, bool held_out,
                               double *loss, double *accuracy);
/* The end of the banner's first line: "data FILE" or "teacher 32-64-8", the samples and the
 * task, and its newline. */
void train_samples_banner(const train_config *cfg, const void *feed, FILE *out);
/* The end of the done line: "; training-samples loss A -> B, Nx lower". */
void train_samples_done(const train_config *cfg, const void *feed, FILE *out, double first_loss,
                        double last_loss);

#ifdef __cplusplus
}
#endif
#endif

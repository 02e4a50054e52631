/* train_ckpt.h: fsdp-train's checkpoints: the state a run starts from ([model] init,
 * [checkpoint] resume), loading it at the run's layout, and saving the run (parameters,
 * optimizer state and the loop's position, so that a resumed run continues bitwise). */
#ifndef FSDP_TOOLS_TRAIN_CKPT_H
#define FSDP_TOOLS_TRAIN_CKPT_H

#include "train_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_CKPT_PATH 1100 /* bytes of a checkpoint path */

/* What a run starts from, decided once per process before the ranks run. */
typedef struct train_sources {
    char resume[TRAIN_CKPT_PATH];   /* the checkpoint to resume from; "" to start anew */
    char init[TRAIN_CKPT_PATH];     /* the checkpoint to take the parameters from; "" random */
    char tmp[TRAIN_CKPT_PATH - 64]; /* the temporary directory of an imported init, or "" */
    char note[2 * TRAIN_CKPT_PATH]; /* a line for the progress output, or "" */
} train_sources;

/* Resolves [checkpoint] resume (auto: the newest committed checkpoint in dir, if any; none; a
 * checkpoint step directory or a directory of them, whose newest is taken) and, when the run
 * does not resume, [model] init (random; a checkpoint directory; a PyTorch state dict file,
 * imported with fsdp_ckpt_import into a temporary directory under $TMPDIR or /tmp). ctx may be
 * NULL. On failure writes the message into err. train_sources_free removes what this made. */
fsdp_status train_sources_resolve(fsdp_ctx *ctx, const train_config *cfg, train_sources *src,
                                  char *err, size_t err_size);
void train_sources_free(train_sources *src);
/* For a loss that is not finite before any step: the parameters the run started from when they
 * came from a checkpoint (resumed) or [model] init, named as what to blame and the fix; "" when
 * they are random (then the data or the initialisation are to blame). */
void train_ckpt_start_blame(const train_config *cfg, const train_sources *src, char *buf,
                            size_t size);

/* [checkpoint] dir, claimed by this run before training (by the process of rank 0): the
 * directory is made (with its parents) and a lock file, <dir>/.lock, is written with this
 * process's id and locked (flock, held until train_ckpt_release_dir or the process ends). A
 * directory this run cannot write fails at once (FSDP_ERR_IO) instead of at the first save; a
 * directory another run holds fails (FSDP_ERR_STATE) naming that run's process: two runs saving
 * into one directory would replace and prune each other's checkpoints. *fd receives the lock's
 * descriptor (-1 on failure); the message goes into err. */
fsdp_status train_ckpt_claim_dir(const train_config *cfg, int *fd, char *err, size_t err_size);
void train_ckpt_release_dir(int fd); /* -1: nothing */

/* Where the loop stands: what a checkpoint saves beside the tensors, as named integers
 * (extras) "train.step", "data.position", "log.loss_sum_bits" (the double's bits) and
 * "log.steps_since". The data are functions of the global sample index and training draws
 * no random numbers, so these are all a resumed run needs to continue bitwise. */
typedef struct train_progress {
    int64_t step;     /* steps done */
    int64_t position; /* the first sample of the next batch */
    double loss_sum;  /* batch losses since the last progress line of a log_every step */
    int64_t since;    /* steps since it */
} train_progress;

/* Loads the parameters of the checkpoint at path into the model (src without optimizer),
 * strictly, at this rank's layout. Every rank calls it; no collective. A tensor of another
 * shape, a missing or extra one fails (FSDP_ERR_CONFIG for shapes) with the message in err,
 * naming the tensor, the shapes and the fix. */
fsdp_status train_ckpt_init(fsdp_ctx *ctx, const train_config *cfg, const fsdp_state_sources *src,
                            const char *path, char *err, size_t err_size);

/* Resumes from the checkpoint at path: checks that it holds this model (shapes) and that the
 * [model] (but init), [data] and [optim] keys are those it was saved with (FSDP_ERR_CONFIG
 * naming the first key that differs), loads parameters and optimizer state strictly and
 * fills *prog from its extras, whose stream position must lie in [0, n_positions) (the
 * training samples, or a token file's probe sequences). saved_layout receives the layout it
 * was saved with. */
fsdp_status train_ckpt_resume(fsdp_ctx *ctx, const train_config *cfg, const fsdp_state_sources *src,
                              const char *path, int64_t n_positions, train_progress *prog,
                              char *saved_layout, size_t layout_size, char *err, size_t err_size);

/* Saves a rank's run into [checkpoint] dir. */
typedef struct train_saver {
    fsdp_state *state;
    fsdp_ckpt_writer *writer;
    char *config;       /* train_config_write's text, kept in every checkpoint */
    char *model_config; /* the kind's export_config (llama: Hugging Face's config.json, for
                           fsdp-ckpt export --format hf), or NULL */
    char layout[256];
} train_saver;

fsdp_status train_saver_create(fsdp_ctx *ctx, const train_config *cfg,
                               const fsdp_state_sources *src, const char *layout, train_saver *sv);
/* Saves the run at prog->step (a collective); with commit (or a sync writer) the checkpoint is
 * committed when it returns. *blocked: the seconds the caller waited. */
fsdp_status train_saver_save(fsdp_ctx *ctx, train_saver *sv, const train_progress *prog,
                             bool commit, double *blocked);
/* "<dir>/step-<8 digits>" of a step. */
void train_ckpt_step_path(const train_config *cfg, int64_t step, char *buf, size_t size);
/* Commits a save in flight (a collective: every rank calls it), then frees. */
void train_saver_free(fsdp_ctx *ctx, train_saver *sv);

#ifdef __cplusplus
}
#endif
#endif

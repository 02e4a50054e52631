/* trainer.h: the training run a train_config describes, shared by fsdp-train and the tests. */
#ifndef FSDP_TOOLS_TRAINER_H
#define FSDP_TOOLS_TRAINER_H

#include <stdatomic.h> // defines: atomic_int

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "a signal handler may store only to a lock-free atomic");

#include "train_ckpt.h" // defines: TRAIN_CKPT_PATH
#include "train_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_TRACE_STEPS 64 /* step losses kept in a train_result */

typedef struct train_result {
    int64_t steps;        /* the last step reached (counted from the run's start: a resumed
                             run continues the count) */
    int64_t start_step;   /* the step the run started from: 0, or the resumed checkpoint's */
    double first_loss;    /* loss over the whole dataset before the first step */
    double last_loss;     /* loss over the whole dataset after the last step */
    double seconds;       /* wall time of the training loop */
    double samples_per_s; /* over the whole loop, global samples */
    train_layout layout;  /* how the ranks were laid out */
    /* The rank whose result this is: 0 under local; this process's rank under mpi (every rank
     * computes the same global losses, and fails the same way when the processes' configurations
     * differ); -1 when no rank ran (the world could not be made or laid out). */
    int rank;
    /* The global batch loss of steps start_step + 1, start_step + 2, ..., step_loss[0] being
     * the first's: the mean over the whole batch, whatever the layout, for the first
     * min(steps - start_step, TRAIN_TRACE_STEPS) steps of this run. */
    int64_t n_step_losses;
    double step_loss[TRAIN_TRACE_STEPS];
    /* The last evaluation on the held-out split ([data] eval_fraction > 0): its loss and,
     * for classification, the fraction classified right; NAN when none ran. The steps of the
     * first TRAIN_TRACE_STEPS evaluations. */
    double eval_loss;
    double eval_accuracy;
    /* [optim] clip_grad_norm > 0: the global gradient norm of the last step, before clipping;
     * else NAN. */
    double grad_norm;
    int64_t n_evals;
    int64_t eval_step[TRAIN_TRACE_STEPS];
    /* The checkpoint the run resumed from, "" when it started fresh; the last checkpoint it
     * committed, "" when none. */
    char resumed_from[TRAIN_CKPT_PATH];
    char saved[TRAIN_CKPT_PATH];
    /* The run stopped early on train_stop_signal (at step `steps`, saved in `saved`). */
    bool interrupted;
    /* Rank threads still running when train_run returned, left after the grace period (stuck
     * in a call: a file system that does not answer). What they use stays allocated; the
     * process should end without exit handlers (fsdp_world_threads_left). */
    int threads_left;
} train_result;

/* Set to the signal's number by fsdp-train's SIGINT/SIGTERM handler (a store to a lock-free
 * atomic int, which a handler may do, and which the rank threads read without a data race). With
 * [checkpoint] dir set, the ranks look at it after every step, agree on it (one all_reduce of one
 * float over the world per step when the world has several ranks), and stop together: a checkpoint
 * is saved and train_run returns FSDP_OK with result->interrupted. Without dir it is not read. */
extern atomic_int train_stop_signal;

/* Trains the model cfg describes on its dataset ([data]: the synthetic teacher's, or an HDF5
 * file read once by this process and checked before any rank starts), on the ranks [parallel]
 * asks for: it creates the world (local rank threads, or this process's rank of an MPI job),
 * under mpi checks that every process has the same configuration (train_config_agree; when
 * not, FSDP_ERR_STATE naming the first key that differs), lays it out (train_layout_resolve),
 * runs every rank and frees the world. Each dp rank trains on its slice of every batch; the
 * losses are global. Rank 0 alone writes progress and summary lines to `out` (NULL for none;
 * only when log.level is info or debug) and JSON lines to log.metrics; a write that fails
 * (checked at every flush, and when the metrics file is closed) fails the run with
 * FSDP_ERR_IO. A global loss that is not finite, at a step or over the whole dataset before or
 * after training, fails it with FSDP_ERR_STATE and advice naming the keys that can cause it.
 * ctx (may be NULL) receives the library's message when the world cannot be made. Every
 * rank's context is seeded with train.seed, so any ctx gives the same run. On failure returns
 * the status and writes the message into err: the tool's own, or the library's
 * (fsdp_last_error) with what the trainer was doing, prefixed "rank R: " when the world has
 * several ranks. result (may be NULL) is filled on success and failure alike. */
fsdp_status train_run(fsdp_ctx *ctx, const train_config *cfg, FILE *out, train_result *result,
                      char *err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif

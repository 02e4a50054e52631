/* ckpt_common.h: what the checkpoint suites (test_ckpt, test_ckpt_tool, test_ckpt_crash) share: a
 * small MLP (MLPStacked(2)) laid out by a `ckpt_layout` (dp x tp mesh, plain, FSDP of any strategy
 * or replicate), trained with Adam or SGD on batches drawn from global indices, loaded from and
 * saved to checkpoints; and the scratch directories, the newest checkpoint, a flipped byte. */
#ifndef FSDP_TEST_CKPT_COMMON_H
#define FSDP_TEST_CKPT_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/fsdp.h"
#include "numerics.h" // defines: fsdp_test_adam_check

typedef enum ckpt_mode { MODE_PLAIN, MODE_FSDP, MODE_REPLICATE } ckpt_mode;

typedef struct ckpt_layout {
    const char *name;
    int dp, tp;
    ckpt_mode mode;
    fsdp_sharding_strategy strategy;
    int rep; /* HYBRID_SHARD: replica groups (dp = rep * shard) */
    bool offload, orig, nested;
} ckpt_layout;

typedef enum ckpt_optim { OPT_ADAM, OPT_SGD } ckpt_optim;

/* Called on rank 0 just before each fsdp_ckpt_save of a job, with the step it saves. */
typedef void (*ckpt_save_hook)(int64_t step, void *user);

/* One run: train `steps` after loading `load` (NULL: from the seed), then save to `save`.
 * Adam and SGD (momentum 0.9) use lr CKPT_LR; the loss is MSE. */
typedef struct ckpt_job {
    bool async;     /* save every step (keep 2), asynchronously */
    bool each_step; /* save every step synchronously (keep 2) */
    int keep;       /* with async or each_step: keep this many (0: 2) */
    bool raw;       /* uncompressed (the flipped-byte case finds values in the file) */
    const ckpt_layout *l;
    ckpt_optim opt;
    const char *load, *save;
    int64_t first_step, steps;
    /* Load `load` into a state without the optimizer (strictly), as a checkpoint without
     * optimizer state (an imported one) is loaded; the optimizer starts anew. */
    bool load_model_only;
    /* A fixed global batch (CKPT_TEST_BATCH, CKPT_TEST_DIM) row-major, inputs and targets,
     * that every step trains on instead of the drawn ones; NULL: drawn. */
    const float *fixed_x, *fixed_y;
    /* When set (with fixed_x): receives the model's output for fixed_x (CKPT_TEST_BATCH,
     * CKPT_TEST_DIM) after loading, before any step (the first step's forward); each dp rank
     * writes its rows (rank threads only: under MPI each process fills its own copy). */
    float *forward_out;
    ckpt_save_hook before_save; /* or NULL */
    void *hook_user;
    /* Start from the seed's (or the loaded) parameters nudged by one ulp
     * (fsdp_test_nudge_params): a run whose difference from the same run unnudged is its
     * rounding noise. One plain rank (MODE_PLAIN, 1x1) only. */
    bool nudge;
} ckpt_job;

#define CKPT_TEST_BATCH 12   /* the global batch: divisible by every dp size of the matrix */
#define CKPT_LR         1e-2 /* Adam's and SGD's learning rate */
#define CKPT_TEST_DIM   10   /* the model's input and output width */

/* Runs a job on dp x tp rank threads (or its rank of an MPI job). */
fsdp_status ckpt_test_run(const ckpt_job *jb);
/* Async saves every step, keeping 2; else one sync save after the last step. */
fsdp_status ckpt_test_run_async(bool async, const ckpt_layout *l, ckpt_optim opt, const char *load,
                                const char *save, int64_t first, int64_t steps);
fsdp_status ckpt_test_run_job(const ckpt_layout *l, ckpt_optim opt, const char *load,
                              const char *save, int64_t first, int64_t steps);
/* Adam, uncompressed (so stored values can be found in the file), from step 0. */
fsdp_status ckpt_test_run_raw(const ckpt_layout *l, const char *save, int64_t steps);

/* Compares every tensor of checkpoints a and b (whole global tensors, read as f32): *max_diff
 * the largest absolute difference, *bitwise whether every value has the same bits; returns
 * whether they hold the same names and shapes (printing the first that does not). */
bool ckpt_test_compare(const char *a, const char *b, double *max_diff, bool *bitwise);

/* A new scratch directory under /tmp (malloc'ed), and removing one. */
char *ckpt_test_tmp_root(void);
void ckpt_test_remove_tree(const char *dir);
/* The newest committed checkpoint under dir (malloc'ed); fails the test when there is none. */
char *ckpt_test_latest(const char *dir);
/* Flips a byte of the stored values of the first piece of at least 4 elements that file rank
 * `rank` holds, found by its first 8 bytes in the (uncompressed) file. Returns the tensor's
 * name (malloc'ed) or NULL. */
char *ckpt_test_flip_value_byte(const char *path, int rank);

/* What `fsdp-ckpt verify` does: opens the checkpoint, reads every piece in full and checks
 * every shard file (fsdp_ckpt_check_shard). Returns
 * FSDP_OK, or the first failure, its message (naming the tensor) in the test context. */
fsdp_status ckpt_test_verify(const char *path);
/* Every tensor of checkpoint a equals b's: bitwise (rtol < 0) or within rtol/atol; prints the
 * first difference, labelled `what`, and (with rtol >= 0) the largest difference. */
bool ckpt_test_same(const char *a, const char *b, double rtol, double atol, const char *what);
/* Two Adam runs' checkpoints (tests/numerics.h): the parameters by `rule` (what it saw is added
 * to *rule), every other tensor (Adam's moments, buffers) within rtol/atol. */
bool ckpt_test_same_adam(const char *a, const char *b, fsdp_test_adam_check *rule, double rtol,
                         double atol, const char *what);
/* The q-quantile of |a - b| over the parameters of checkpoints a and b: with b the same run
 * nudged (ckpt_job.nudge), a's rounding noise. NAN when they cannot be read. */
double ckpt_test_param_noise(const char *a, const char *b, double q);

#endif

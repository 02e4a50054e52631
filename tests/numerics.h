/* numerics.h: the bounds the numerical suites share, derived from float32 arithmetic rather
 * than tuned to one machine's BLAS kernel (docs/testing.md "Bounds"): the unit roundoff, the
 * tolerance of chained sums evaluated in another order, and the statistical comparison of two
 * Adam runs whose gradients were summed in different orders. */
#ifndef FSDP_TEST_NUMERICS_H
#define FSDP_TEST_NUMERICS_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

/* float32's unit roundoff u = 2^-24: one rounding changes a value by at most u of it. */
#define FSDP_TEST_U32 0x1p-24

/* The tolerance, relative to the largest magnitude of a tensor, for two float32 evaluations of
 * it that pass through `depth` chained sums of up to k terms each in different orders (another
 * BLAS kernel, another split over ranks, PyTorch's kernels): 8 sqrt(k depth) u. Each rounding
 * is an error of up to u of a partial sum, whose scale the tensor's largest magnitude bounds;
 * with terms of mixed signs the errors add as a random walk (Higham and Mary, SIAM J. Sci.
 * Comput. 41(5), 2019), so the two evaluations differ by about sqrt(k depth / 3) u of that
 * scale, and this allows 14 times as much, still far below the worst case 2 k depth u. */
double fsdp_test_sum_tol(int64_t k, int depth);
/* max |x[i]| over n floats (0 when n is 0). */
double fsdp_test_max_abs(const float *x, int64_t n);

/* Adam's (and AdamW's) largest move of one element in its step t (1, 2, ...), as a multiple of
 * lr: the bias-corrected |m / (sqrt(v) + eps)| is at most sqrt(sum_i a_i^2 / b_i) for i = 1..t
 * (Cauchy-Schwarz), with a_i = (1 - beta1) beta1^(t-i) / (1 - beta1^t) and b_i likewise with
 * beta2; 1 at step 1 and about 1 for the default betas and few steps, whatever the gradients
 * (amsgrad only enlarges v; L2 weight decay only changes the gradient). */
double fsdp_test_adam_step_bound(double beta1, double beta2, int t);
/* The sum of fsdp_test_adam_step_bound over steps 1..steps: two runs from the same parameters
 * differ after `steps` steps of a constant lr by at most twice this times lr (AdamW's decay
 * p *= 1 - lr wd only shrinks a difference). */
double fsdp_test_adam_max_move(double beta1, double beta2, int steps);

/* The q-quantile (0 <= q <= 1, nearest rank) of |a[i] - b[i]| over n elements. */
double fsdp_test_quantile_abs_diff(const float *a, const float *b, int64_t n, double q);

/* Two Adam runs compared statistically. Adam divides by sqrt(v), so an element whose gradient
 * passes near zero turns a rounding difference in that gradient into a move of up to lr: the
 * largest difference over elements is a random draw, not a bound. The rule instead: every
 * element within `bulk` (k times the reference's own rounding noise, fsdp_test_param_noise),
 * except at most `max_exceptions` elements, each within `move` (twice Adam's largest move in
 * the steps taken, fsdp_test_adam_max_move x lr). Feed every tensor of the model with
 * fsdp_test_adam_add, then ask fsdp_test_adam_ok. */
typedef struct fsdp_test_adam_check {
    double bulk;            /* every element but the exceptions within this */
    double bulk_rtol;       /* ... plus this times |want| (0 for the noise rule) */
    double move;            /* an exception within this */
    int64_t max_exceptions; /* how many may exceed bulk */
    /* what was seen */
    int64_t n, exceptions, beyond_move;
    double max_bulk; /* the largest difference within bulk */
    double max_abs;  /* the largest difference of all */
    char worst[160]; /* "name[i] got g, want w" of the largest difference */
} fsdp_test_adam_check;

/* Compares n elements of one tensor (name for the message) under c's rule; accumulates. */
void fsdp_test_adam_add(fsdp_test_adam_check *c, const char *name, const float *got,
                        const float *want, int64_t n);
/* Whether every tensor added so far keeps the rule; otherwise writes why to why (len bytes). */
bool fsdp_test_adam_ok(const fsdp_test_adam_check *c, char *why, size_t len);

/* Adds every parameter of `got`, whole (gathered as its placements say; inside
 * summon_full_params for FSDP), against the parameter of the same name in `want`. Fails
 * (the message in ctx) only when a name or shape does not match; ask fsdp_test_adam_ok. */
fsdp_status fsdp_test_adam_add_model(fsdp_ctx *ctx, fsdp_test_adam_check *c, fsdp_module *want,
                                     fsdp_module *got);

/* Moves every element of every parameter of m by one ulp, up or down as the counter RNG of
 * `stream` says: a float32 run's rounding noise, injected at its start. Trained like the
 * reference, such a copy differs from it as a run with other summation orders would. */
fsdp_status fsdp_test_nudge_params(fsdp_ctx *ctx, fsdp_module *m, uint64_t stream);

/* The q-quantile of |a - b| over every element of every parameter of a and the parameter of
 * the same name in b (same shapes): the rounding noise of a reference trained twice, once
 * nudged. */
fsdp_status fsdp_test_param_noise(fsdp_ctx *ctx, fsdp_module *a, fsdp_module *b, double q,
                                  double *noise);

#endif

/* loss.c: mean squared error and cross-entropy (optionally ignoring a target) on the CPU. Sums run
 * in double; the loss is written to *loss (host), the gradient to dout/dlogits when those are not
 * NULL. */
#include <math.h>

#include "core/error.h" // defines: FSDP_ASSERT
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/llama.h"

/* loss = mean((out - target)^2), dout = 2 (out - target) / n; an empty input has loss 0 */
void fsdp_cpu_mse_loss(float *loss, float *dout, const float *out, const float *target, int64_t n) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)out[i] - (double)target[i];
        ss += d * d;
    }
    *loss = n > 0 ? (float)(ss / (double)n) : 0.0f;
    if (!dout) return;
    double g = 2.0 / (double)n;
    for (int64_t i = 0; i < n; i++) dout[i] = (float)(g * ((double)out[i] - (double)target[i]));
}

/* log(sum_c exp(x_c)) of one row, shifted by its max so that no exp overflows */
static double log_sum_exp(const float *x, int64_t classes) {
    float m = x[0];
    for (int64_t c = 1; c < classes; c++) m = x[c] > m ? x[c] : m;
    double se = 0.0;
    for (int64_t c = 0; c < classes; c++) se += exp((double)x[c] - (double)m);
    return (double)m + log(se);
}

/* Per row: loss_r = lse - x[t], dlogits = (softmax - onehot(t)) / rows; loss = mean_r loss_r
 * (0 when rows == 0). dlogits may be the logits array itself. */
void fsdp_cpu_cross_entropy(float *loss, float *dlogits, const float *logits,
                            const int32_t *targets, int64_t rows, int64_t classes) {
    /* no target is INT32_MIN, so no row is ignored */
    fsdp_cpu_cross_entropy_ignore(loss, dlogits, logits, targets, INT32_MIN, rows, classes);
    if (rows == 0) *loss = 0.0f;
}

/* As above over the rows whose target is not ignore_index, divided by their count n; ignored
 * rows get a zero gradient; loss = 0 / 0 = NaN when n == 0, as PyTorch. */
void fsdp_cpu_cross_entropy_ignore(float *loss, float *dlogits, const float *logits,
                                   const int32_t *targets, int32_t ignore_index, int64_t rows,
                                   int64_t classes) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += targets[r] != ignore_index;
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * classes; // (classes)
        float *d = dlogits ? dlogits + r * classes : NULL;
        int32_t t = targets[r];
        if (t == ignore_index) {
            if (d)
                for (int64_t c = 0; c < classes; c++) d[c] = 0.0f;
            continue;
        }
        FSDP_ASSERT(t >= 0 && t < classes);
        double lse = log_sum_exp(x, classes);
        total += lse - (double)x[t];
        if (!d) continue;
        double pt = exp((double)x[t] - lse);
        for (int64_t c = 0; c < classes; c++) d[c] = (float)(exp((double)x[c] - lse) / (double)n);
        d[t] = (float)((pt - 1.0) / (double)n);
    }
    *loss = (float)(total / (double)n);
}

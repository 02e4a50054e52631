/* loss.c: mean squared error and cross-entropy (optionally ignoring a target, over f32 or bf16
 * logits) on the CPU. Sums run in double; the loss is written to *loss (host), the gradient to
 * dout/dlogits when those are not NULL. */
#include <math.h>
#include <string.h>

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

/* Logits of one dtype, f32 or bf16 (widened exactly), read as f32. */
typedef struct row_in {
    const float *f32;
    const fsdp_bf16 *bf16;
} row_in;

static inline float x_at(row_in x, int64_t c) {
    if (x.f32) return x.f32[c];
    uint32_t bits = (uint32_t)x.bf16[c] << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline row_in row_of(row_in x, int64_t r, int64_t classes) {
    return x.f32 ? (row_in){.f32 = x.f32 + r * classes} : (row_in){.bf16 = x.bf16 + r * classes};
}

/* log(sum_c exp(x_c)) of one row, shifted by its max so that no exp overflows */
static double log_sum_exp(row_in x, int64_t classes) {
    float m = x_at(x, 0);
    for (int64_t c = 1; c < classes; c++) m = x_at(x, c) > m ? x_at(x, c) : m;
    double se = 0.0;
    for (int64_t c = 0; c < classes; c++) se += exp((double)x_at(x, c) - (double)m);
    return (double)m + log(se);
}

/* A gradient of one dtype: f32, or bf16 (each value rounded as f32_to_bf16 rounds it). */
typedef struct row_out {
    float *f32;
    fsdp_bf16 *bf16;
} row_out;

static inline void d_set(row_out d, int64_t c, float v) {
    if (d.f32)
        d.f32[c] = v;
    else
        d.bf16[c] = fsdp_bf16_from_f32(v);
}

/* The rows of cross_entropy_ignore over logits x and gradient d (both of any dtype above; d
 * empty: none). */
static void cross_entropy_rows(float *loss, row_out d, row_in logits, const int32_t *targets,
                               int32_t ignore_index, int64_t rows, int64_t classes) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += targets[r] != ignore_index;
    bool grad = d.f32 || d.bf16;
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        row_in x = row_of(logits, r, classes); // (classes)
        row_out dr = {d.f32 ? d.f32 + r * classes : NULL, d.bf16 ? d.bf16 + r * classes : NULL};
        int32_t t = targets[r];
        if (t == ignore_index) {
            if (grad)
                for (int64_t c = 0; c < classes; c++) d_set(dr, c, 0.0f);
            continue;
        }
        FSDP_ASSERT(t >= 0 && t < classes);
        double lse = log_sum_exp(x, classes);
        total += lse - (double)x_at(x, t);
        if (!grad) continue;
        double pt = exp((double)x_at(x, t) - lse);
        for (int64_t c = 0; c < classes; c++)
            d_set(dr, c, (float)(exp((double)x_at(x, c) - lse) / (double)n));
        d_set(dr, t, (float)((pt - 1.0) / (double)n));
    }
    *loss = (float)(total / (double)n);
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
    cross_entropy_rows(loss, (row_out){.f32 = dlogits}, (row_in){.f32 = logits}, targets,
                       ignore_index, rows, classes);
}

/* The same over bf16 logits, widened as they are read; dlogits f32 or bf16. */
void fsdp_cpu_cross_entropy_ignore_bf16(float *loss, void *dlogits, fsdp_dtype dlogits_dtype,
                                        const fsdp_bf16 *logits, const int32_t *targets,
                                        int32_t ignore_index, int64_t rows, int64_t classes) {
    FSDP_ASSERT(dlogits_dtype == FSDP_DTYPE_F32 || dlogits_dtype == FSDP_DTYPE_BF16);
    row_out d =
        dlogits_dtype == FSDP_DTYPE_BF16 ? (row_out){.bf16 = dlogits} : (row_out){.f32 = dlogits};
    cross_entropy_rows(loss, d, (row_in){.bf16 = logits}, targets, ignore_index, rows, classes);
}

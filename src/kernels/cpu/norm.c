/* norm.c: RMSNorm on the CPU. Per row of (rows, cols): rstd = 1/sqrt(mean(x^2) + eps),
 * out = x * rstd * weight. Outputs must not overlap the inputs. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void fsdp_cpu_rmsnorm_forward(float *restrict out, float *restrict rstd, const float *restrict inp,
                              const float *restrict weight, float eps, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict x = inp + r * cols; // (cols)
        float *restrict o = out + r * cols;       // (cols)
        double ms = cols > 0 ? fsdp_cpu_sum_squares(x, cols) / (double)cols : 0.0;
        float s = (float)(1.0 / sqrt(ms + (double)eps));
        rstd[r] = s;
        for (int64_t c = 0; c < cols; c++) o[c] = x[c] * s * weight[c];
    }
}

/* With g_k = dout_k * w_k and d rstd / d x_k = -rstd^3 x_k / cols:
 *   dinp_j = rstd g_j - (rstd^3 / cols) x_j sum_k g_k x_k
 *   dweight_j += sum over rows of dout_j x_j rstd */
void fsdp_cpu_rmsnorm_backward(float *restrict dinp, float *restrict dweight,
                               const float *restrict dout, const float *restrict inp,
                               const float *restrict weight, const float *restrict rstd,
                               int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict x = inp + r * cols;   // (cols)
        const float *restrict dy = dout + r * cols; // (cols)
        float *restrict dx = dinp + r * cols;       // (cols)
        double dot = 0.0;
        for (int64_t c = 0; c < cols; c++) dot += (double)dy[c] * (double)weight[c] * (double)x[c];
        double s = (double)rstd[r];
        float coef = (float)(s * s * s * dot / (double)cols);
        float sf = rstd[r];
        for (int64_t c = 0; c < cols; c++) dx[c] = sf * weight[c] * dy[c] - coef * x[c];
    }
    fsdp_cpu_column_sum(dweight, dout, inp, rstd, rows, cols);
}

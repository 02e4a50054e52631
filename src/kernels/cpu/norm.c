/* norm.c: RMSNorm on the CPU. Per row of (rows, cols): rstd = 1/sqrt(mean(x^2) + eps),
 * out = x * rstd * weight, in f32 or rounded to bf16; the backward, with a residual's gradient
 * added to the input gradient or not. Outputs must not overlap the inputs. */
#include <math.h>

#include "kernels/cpu/cpu.h" // defines: fsdp_cpu_sum_squares, fsdp_cpu_f32_to_bf16

/* 1/sqrt(mean(x^2) + eps) of the row x (cols) */
static float row_rstd(const float *x, int64_t cols, float eps) {
    double ms = cols > 0 ? fsdp_cpu_sum_squares(x, cols) / (double)cols : 0.0;
    return (float)(1.0 / sqrt(ms + (double)eps));
}

static void scale_row(float *restrict o, const float *restrict x, const float *restrict weight,
                      float s, int64_t n) {
    for (int64_t c = 0; c < n; c++) o[c] = x[c] * s * weight[c];
}

void fsdp_cpu_rmsnorm_forward(float *restrict out, float *restrict rstd, const float *restrict inp,
                              const float *restrict weight, float eps, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        rstd[r] = row_rstd(inp + r * cols, cols, eps);
        scale_row(out + r * cols, inp + r * cols, weight, rstd[r], cols);
    }
}

/* Each row's values in blocks on the stack, rounded with the table's own conversion: the bits
 * of the f32 entry then f32_to_bf16 by construction; nothing is allocated. */
enum { BLOCK = 512 };

void fsdp_cpu_rmsnorm_forward_bf16(fsdp_bf16 *restrict out, float *restrict rstd,
                                   const float *restrict inp, const float *restrict weight,
                                   float eps, int64_t rows, int64_t cols) {
    float y[BLOCK];
    for (int64_t r = 0; r < rows; r++) {
        const float *x = inp + r * cols; // (cols)
        float s = row_rstd(x, cols, eps);
        rstd[r] = s;
        for (int64_t c = 0; c < cols; c += BLOCK) {
            int64_t m = cols - c < BLOCK ? cols - c : BLOCK;
            scale_row(y, x + c, weight + c, s, m);
            fsdp_cpu_f32_to_bf16(out + r * cols + c, y, m);
        }
    }
}

/* With g_k = dout_k * w_k and d rstd / d x_k = -rstd^3 x_k / cols:
 *   dinp_j = rstd g_j - (rstd^3 / cols) x_j sum_k g_k x_k   (plus dres_j when dres is given)
 *   dweight_j += sum over rows of dout_j x_j rstd
 * With dres, each element is the f32 value above then one f32 add, as add(dinp, dres, dinp)
 * after the plain backward: the same bits. */
static void rmsnorm_backward(float *restrict dinp, float *restrict dweight,
                             const float *restrict dout, const float *restrict dres,
                             const float *restrict inp, const float *restrict weight,
                             const float *restrict rstd, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict x = inp + r * cols;   // (cols)
        const float *restrict dy = dout + r * cols; // (cols)
        float *restrict dx = dinp + r * cols;       // (cols)
        double dot = 0.0;
        for (int64_t c = 0; c < cols; c++) dot += (double)dy[c] * (double)weight[c] * (double)x[c];
        double s = (double)rstd[r];
        float coef = (float)(s * s * s * dot / (double)cols);
        float sf = rstd[r];
        if (!dres) {
            for (int64_t c = 0; c < cols; c++) dx[c] = sf * weight[c] * dy[c] - coef * x[c];
            continue;
        }
        const float *restrict res = dres + r * cols; // (cols)
        for (int64_t c = 0; c < cols; c++) {
            float g = sf * weight[c] * dy[c] - coef * x[c];
            dx[c] = res[c] + g;
        }
    }
    fsdp_cpu_column_sum(dweight, dout, inp, rstd, rows, cols);
}

void fsdp_cpu_rmsnorm_backward(float *restrict dinp, float *restrict dweight,
                               const float *restrict dout, const float *restrict inp,
                               const float *restrict weight, const float *restrict rstd,
                               int64_t rows, int64_t cols) {
    rmsnorm_backward(dinp, dweight, dout, NULL, inp, weight, rstd, rows, cols);
}

void fsdp_cpu_rmsnorm_backward_add(float *restrict dinp, float *restrict dweight,
                                   const float *restrict dout, const float *restrict dres,
                                   const float *restrict inp, const float *restrict weight,
                                   const float *restrict rstd, int64_t rows, int64_t cols) {
    rmsnorm_backward(dinp, dweight, dout, dres, inp, weight, rstd, rows, cols);
}

/* reduce.c: reductions on the CPU, summed in double: sum, sum of squares and max |x| of n
 * floats, and column sums (bias and RMSNorm weight gradients). Sums use LANES independent
 * accumulators (element i to lane i % LANES, tail last): they vectorise without reassociation
 * and the result depends only on x and n. */
#include <string.h>

#include "kernels/cpu/cpu.h"

#define LANES 8

static double lanes_total(const double *acc) {
    double s4[4], s2[2];
    for (int j = 0; j < 4; j++) s4[j] = acc[j] + acc[j + 4];
    for (int j = 0; j < 2; j++) s2[j] = s4[j] + s4[j + 2];
    return s2[0] + s2[1];
}

/* sum of x[i] (square false) or x[i]^2 (square true); inlined into both callers */
static inline double sum_lanes(const float *restrict x, int64_t n, bool square) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            double v = (double)x[i + j];
            acc[j] += square ? v * v : v;
        }
    double tail = 0.0;
    for (; i < n; i++) {
        double v = (double)x[i];
        tail += square ? v * v : v;
    }
    return lanes_total(acc) + tail;
}

double fsdp_cpu_sum(const float *x, int64_t n) {
    return sum_lanes(x, n, false);
}

double fsdp_cpu_sum_squares(const float *x, int64_t n) {
    return sum_lanes(x, n, true);
}

/* Works on the bits: with the sign cleared, f32 bit patterns order like the values and every
 * NaN sorts above inf, so an integer max (which vectorises) gives max |x|, or NaN if any. */
double fsdp_cpu_max_abs(const float *x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        bits &= 0x7FFFFFFFu;
        m = bits > m ? bits : m;
    }
    float best;
    memcpy(&best, &m, sizeof best);
    return (double)best;
}

/* Columns are taken in blocks of COLUMN_BLOCK with one double accumulator each; rows are
 * added in order and the inner loop runs across columns, so it vectorises. */
#define COLUMN_BLOCK 256

void fsdp_cpu_column_sum(float *restrict dst, const float *restrict a, const float *restrict b,
                         const float *restrict scale, int64_t rows, int64_t cols) {
    fsdp_cpu_column_sum_ld(dst, a, b, scale, rows, cols, cols);
}

void fsdp_cpu_column_sum_ld(float *restrict dst, const float *restrict a, const float *restrict b,
                            const float *restrict scale, int64_t rows, int64_t cols, int64_t ld) {
    double acc[COLUMN_BLOCK];
    for (int64_t c0 = 0; c0 < cols; c0 += COLUMN_BLOCK) {
        int64_t w = cols - c0 < COLUMN_BLOCK ? cols - c0 : COLUMN_BLOCK;
        for (int64_t c = 0; c < w; c++) acc[c] = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const float *restrict ar = a + r * ld + c0; // (w)
            if (b) {
                const float *restrict br = b + r * ld + c0; // (w)
                double s = scale ? (double)scale[r] : 1.0;
                for (int64_t c = 0; c < w; c++) acc[c] += (double)ar[c] * (double)br[c] * s;
            } else {
                for (int64_t c = 0; c < w; c++) acc[c] += (double)ar[c];
            }
        }
        for (int64_t c = 0; c < w; c++) dst[c0 + c] = (float)((double)dst[c0 + c] + acc[c]);
    }
}

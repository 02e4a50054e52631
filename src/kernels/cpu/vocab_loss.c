/* vocab_loss.c: the per-row pieces of cross-entropy over vocabulary-sharded logits on the CPU
 * (kernels/kernels.h, loss parallel): the row maxima, the sums of exponentials with the target
 * logits, and the gradient. Sums run in double, one row after another. */
#include <math.h>

#include "kernels/cpu/llama.h"

void fsdp_cpu_vocab_row_max(float *mx, const float *logits, int64_t rows, int64_t V) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V; // (V)
        float m = -INFINITY;
        for (int64_t c = 0; c < V; c++) m = x[c] > m ? x[c] : m;
        mx[r] = m;
    }
}

void fsdp_cpu_vocab_exp_sums(float *se, float *xt, const float *logits, const float *mx,
                             const int32_t *targets, int32_t ignore_index, int64_t start,
                             int64_t rows, int64_t V) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V; // (V)
        se[r] = 0.0f, xt[r] = 0.0f;
        if (targets[r] == ignore_index) continue;
        double s = 0.0;
        for (int64_t c = 0; c < V; c++) s += exp((double)x[c] - (double)mx[r]);
        se[r] = (float)s;
        int64_t t = (int64_t)targets[r] - start;
        if (t >= 0 && t < V) xt[r] = x[t];
    }
}

void fsdp_cpu_vocab_ce_grad(float *dlogits, const float *logits, const float *mx, const float *se,
                            const int32_t *targets, int32_t ignore_index, int64_t start,
                            int64_t rows, int64_t V, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V; // (V)
        float *d = dlogits + r * V;      // (V)
        if (targets[r] == ignore_index) {
            for (int64_t c = 0; c < V; c++) d[c] = 0.0f;
            continue;
        }
        double lse = (double)mx[r] + log((double)se[r]);
        for (int64_t c = 0; c < V; c++) d[c] = (float)(exp((double)x[c] - lse) / (double)n);
        int64_t t = (int64_t)targets[r] - start;
        if (t >= 0 && t < V) d[t] = (float)((exp((double)x[t] - lse) - 1.0) / (double)n);
    }
}

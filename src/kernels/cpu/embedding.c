/* embedding.c: token embedding on the CPU: a row gather forward and a row scatter-add
 * backward (in token order, so the sums are deterministic), over the whole table or a
 * vocabulary range of it (tokens outside give zero rows and add nothing). */
#include <string.h>

#include "core/error.h" // defines: FSDP_ASSERT
#include "kernels/cpu/llama.h"

void fsdp_cpu_embedding_forward(float *restrict out, const int32_t *restrict tokens,
                                const float *restrict weight, int64_t n, int64_t C, int64_t start,
                                int64_t rows) {
    for (int64_t i = 0; i < n; i++) {
        FSDP_ASSERT(tokens[i] >= 0);
        int64_t r = (int64_t)tokens[i] - start;
        if (r >= 0 && r < rows)
            memcpy(out + i * C, weight + r * C, (size_t)C * sizeof(float));
        else
            memset(out + i * C, 0, (size_t)C * sizeof(float));
    }
}

void fsdp_cpu_embedding_backward(float *restrict dweight, const float *restrict dout,
                                 const int32_t *restrict tokens, int64_t n, int64_t C,
                                 int64_t start, int64_t rows) {
    for (int64_t i = 0; i < n; i++) {
        FSDP_ASSERT(tokens[i] >= 0);
        int64_t r = (int64_t)tokens[i] - start;
        if (r < 0 || r >= rows) continue;
        float *restrict dw = dweight + r * C;    // (C)
        const float *restrict dy = dout + i * C; // (C)
        for (int64_t c = 0; c < C; c++) dw[c] += dy[c];
    }
}

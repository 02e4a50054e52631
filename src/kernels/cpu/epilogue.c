/* epilogue.c: the CPU's fused-GEMM entries (gemm_bias_act, gemm_bf16_bias_act, gemm_bgrad):
 * the reference the CUDA epilogues are held to, so each runs the table's separate entries in the
 * order kernels.h gives, and its bits are theirs. */
#include <stddef.h>

#include "core/error.h" // defines: FSDP_ASSERT
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/parallel.h"

/* out (rows, OC), holding the GEMM's result: + bias, copied to pre, then act in place. */
static void epilogue(float *out, float *pre, const float *bias, int64_t rows, int64_t OC,
                     fsdp_gemm_act act) {
    int64_t n = rows * OC;
    if (bias) fsdp_cpu_par_bias_add(out, bias, rows, OC);
    if (pre) fsdp_cpu_par_copy(pre, out, n);
    if (act == FSDP_GEMM_ACT_RELU) fsdp_cpu_par_relu_forward(out, out, n);
    if (act == FSDP_GEMM_ACT_GELU) fsdp_cpu_par_gelu_forward(out, out, n);
}

void fsdp_cpu_gemm_bias_act(float *out, float *pre, const float *inp, const float *weight,
                            const float *bias, int64_t rows, int64_t C, int64_t OC,
                            fsdp_gemm_act act) {
    FSDP_ASSERT(act >= FSDP_GEMM_ACT_NONE && act <= FSDP_GEMM_ACT_GELU);
    fsdp_cpu_par_gemm(false, true, rows, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    epilogue(out, pre, bias, rows, OC, act);
}

void fsdp_cpu_gemm_bf16_bias_act(float *out, float *pre, const fsdp_bf16 *inp,
                                 const fsdp_bf16 *weight, const float *bias, int64_t rows,
                                 int64_t C, int64_t OC, fsdp_gemm_act act) {
    FSDP_ASSERT(act >= FSDP_GEMM_ACT_NONE && act <= FSDP_GEMM_ACT_GELU);
    fsdp_cpu_gemm_bf16(false, true, rows, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    epilogue(out, pre, bias, rows, OC, act);
}

void fsdp_cpu_gemm_bgrad(float *dweight, float *dbias, const float *dout, const float *inp,
                         int64_t rows, int64_t C, int64_t OC) {
    fsdp_cpu_par_gemm(true, false, OC, C, rows, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) fsdp_cpu_par_bias_backward(dbias, dout, rows, OC);
}

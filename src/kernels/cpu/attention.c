/* attention.c: causal multi-head attention with grouped-query heads on the CPU, forward and
 * backward, one (T, T) score block per (batch, head) at a time in the caller's scratch: the
 * forward keeps only each row's log-sum-exp, and the backward recomputes the probabilities
 * from it (as FlashAttention does), so no (B, NH, T, T) tensor is ever held.
 * Also on bf16 tensors, widened batch by batch. Layouts: q, out (B, T, NH, D); k, v (B, T, NKV,
 * D); lse (B, NH, T). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h" // defines: fsdp_cpu_gemm, fsdp_cpu_bf16_to_f32, fsdp_cpu_f32_to_bf16
#include "kernels/cpu/llama.h"

/* The (b, h) head's view of a (B, T, heads, D) array: row t is at base + t * heads * D. */
static inline int64_t head_offset(int64_t b, int64_t h, int64_t T, int64_t heads, int64_t D) {
    return b * T * heads * D + h * D;
}

/* P (T, T) = exp(q k^T / sqrt(D) - lse_row) for keys j <= i, 0 above the diagonal; with
 * lse == NULL, first computes each row's log-sum-exp into lse_out (the forward). */
static void probabilities(float *P, float *lse_out, const float *lse, const float *q,
                          const float *k, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    float scale = 1.0f / sqrtf((float)D);
    fsdp_cpu_gemm(false, true, T, T, D, scale, q, NH * D, k, NKV * D, 0.0f, P, T);
    for (int64_t i = 0; i < T; i++) {
        float *row = P + i * T; // (T)
        double l;
        if (lse) {
            l = (double)lse[i];
        } else {
            float m = row[0];
            for (int64_t j = 1; j <= i; j++) m = row[j] > m ? row[j] : m;
            double se = exp((double)row[0] - (double)m); /* key 0 is always visible */
            for (int64_t j = 1; j <= i; j++) se += exp((double)row[j] - (double)m);
            l = (double)m + log(se);
            lse_out[i] = (float)l;
        }
        for (int64_t j = 0; j <= i; j++) row[j] = (float)exp((double)row[j] - l);
        for (int64_t j = i + 1; j < T; j++) row[j] = 0.0f;
    }
}

void fsdp_cpu_attention_forward(float *out, float *lse, float *scratch, const float *q,
                                const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                                int64_t NKV, int64_t D) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    int64_t group = NH / NKV;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            int64_t g = h / group;
            const float *qh = q + head_offset(b, h, T, NH, D);  // (T, D), row stride NH * D
            const float *kg = k + head_offset(b, g, T, NKV, D); // (T, D), row stride NKV * D
            const float *vg = v + head_offset(b, g, T, NKV, D); // (T, D), row stride NKV * D
            float *oh = out + head_offset(b, h, T, NH, D);      // (T, D), row stride NH * D
            float *P = scratch;                                 // (T, T)
            probabilities(P, lse + (b * NH + h) * T, NULL, qh, kg, T, NH, NKV, D);
            fsdp_cpu_gemm(false, false, T, D, T, 1.0f, P, T, vg, NKV * D, 0.0f, oh, NH * D);
        }
    }
}

/* With P the probabilities, dO the output gradient and O the output of one head:
 *   dV += P^T dO;  dP = dO V^T;  dS_ij = P_ij (dP_ij - dO_i . O_i);  dQ = dS K / sqrt(D);
 *   dK += dS^T Q / sqrt(D). scratch holds P (T, T), then dP (T, T) after it; dS overwrites P in
 *   place, row by row. */
void fsdp_cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                 const float *q, const float *k, const float *v, const float *out,
                                 const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                 int64_t D) {
    if (B <= 0 || T <= 0) return;
    memset(dk, 0, (size_t)(B * T * NKV * D) * sizeof(float));
    memset(dv, 0, (size_t)(B * T * NKV * D) * sizeof(float));
    if (NH <= 0) return;
    int64_t group = NH / NKV;
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            int64_t g = h / group, qo = head_offset(b, h, T, NH, D),
                    ko = head_offset(b, g, T, NKV, D);
            const float *qh = q + qo, *oh = out + qo, *doh = dout + qo; // (T, D), stride NH * D
            const float *kg = k + ko, *vg = v + ko;                     // (T, D), stride NKV * D
            float *P = scratch, *dP = scratch + T * T;                  // (T, T) each
            probabilities(P, NULL, lse + (b * NH + h) * T, qh, kg, T, NH, NKV, D);
            fsdp_cpu_gemm(true, false, T, D, T, 1.0f, P, T, doh, NH * D, 1.0f, dv + ko, NKV * D);
            fsdp_cpu_gemm(false, true, T, T, D, 1.0f, doh, NH * D, vg, NKV * D, 0.0f, dP, T);
            for (int64_t i = 0; i < T; i++) {
                const float *dyi = doh + i * NH * D, *oi = oh + i * NH * D; // (D)
                float *row = P + i * T;                                     // (T)
                const float *dpi = dP + i * T;                              // (T)
                double di = 0.0;
                for (int64_t d = 0; d < D; d++) di += (double)dyi[d] * (double)oi[d];
                for (int64_t j = 0; j <= i; j++) row[j] = row[j] * (float)((double)dpi[j] - di);
            }
            fsdp_cpu_gemm(false, false, T, D, T, scale, P, T, kg, NKV * D, 0.0f, dq + qo, NH * D);
            fsdp_cpu_gemm(true, false, T, D, T, scale, P, T, qh, NH * D, 1.0f, dk + ko, NKV * D);
        }
    }
}

/* ---- on bf16 tensors: batch b widened into scratch after the (2, T, T) blocks, the f32 entry
 * run on it (B = 1: the same per-head computations), its results rounded ---- */

void fsdp_cpu_attention_forward_bf16_round(fsdp_bf16 *out, float *lse, float *scratch,
                                           const fsdp_bf16 *q, const fsdp_bf16 *k,
                                           const fsdp_bf16 *v, int64_t B, int64_t T, int64_t NH,
                                           int64_t NKV, int64_t D) {
    int64_t nq = T * NH * D, nk = T * NKV * D; /* one batch's */
    float *qf = scratch + 2 * T * T, *of = qf + nq, *kf = of + nq, *vf = kf + nk;
    for (int64_t b = 0; b < B; b++) {
        fsdp_cpu_bf16_to_f32(qf, q + b * nq, nq);
        fsdp_cpu_bf16_to_f32(kf, k + b * nk, nk);
        fsdp_cpu_bf16_to_f32(vf, v + b * nk, nk);
        fsdp_cpu_attention_forward(of, lse + b * NH * T, scratch, qf, kf, vf, 1, T, NH, NKV, D);
        fsdp_cpu_f32_to_bf16(out + b * nq, of, nq);
    }
}

void fsdp_cpu_attention_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                            float *scratch, const fsdp_bf16 *dout,
                                            const fsdp_bf16 *q, const fsdp_bf16 *k,
                                            const fsdp_bf16 *v, const fsdp_bf16 *out,
                                            const float *lse, int64_t B, int64_t T, int64_t NH,
                                            int64_t NKV, int64_t D) {
    int64_t nq = T * NH * D, nk = T * NKV * D; /* one batch's */
    float *dof = scratch + 2 * T * T, *qf = dof + nq, *of = qf + nq, *dqf = of + nq;
    float *kf = dqf + nq, *vf = kf + nk, *dkf = vf + nk, *dvf = dkf + nk;
    for (int64_t b = 0; b < B; b++) {
        fsdp_cpu_bf16_to_f32(dof, dout + b * nq, nq);
        fsdp_cpu_bf16_to_f32(qf, q + b * nq, nq);
        fsdp_cpu_bf16_to_f32(of, out + b * nq, nq);
        fsdp_cpu_bf16_to_f32(kf, k + b * nk, nk);
        fsdp_cpu_bf16_to_f32(vf, v + b * nk, nk);
        fsdp_cpu_attention_backward(dqf, dkf, dvf, scratch, dof, qf, kf, vf, of, lse + b * NH * T,
                                    1, T, NH, NKV, D);
        fsdp_cpu_f32_to_bf16(dq + b * nq, dqf, nq);
        fsdp_cpu_f32_to_bf16(dk + b * nk, dkf, nk);
        fsdp_cpu_f32_to_bf16(dv + b * nk, dvf, nk);
    }
}

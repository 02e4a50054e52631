/* table_epilogue.c: the simulated GPU's fused-GEMM entries (table.c lists them): each queues
 * the CPU table's fused entry as one closure on the device's stream over the shadow memory, so
 * its bits are the CPU's, which are those of the separate entries. */
#include "kernels/sim/sim_impl.h"

typedef struct bias_act_args {
    float *out, *pre;
    const void *inp, *weight; /* f32 or bf16 */
    const float *bias;
    int64_t rows, C, OC;
    fsdp_gemm_act act;
} bias_act_args;

static void run_gemm_bias_act(void *arg) {
    bias_act_args *a = arg;
    fsdp_kernels_cpu()->gemm_bias_act(a->out, a->pre, a->inp, a->weight, a->bias, a->rows, a->C,
                                      a->OC, a->act);
}

static void run_gemm_bf16_bias_act(void *arg) {
    bias_act_args *a = arg;
    fsdp_kernels_cpu()->gemm_bf16_bias_act(a->out, a->pre, a->inp, a->weight, a->bias, a->rows,
                                           a->C, a->OC, a->act);
}

/* The closure's arguments, every array translated to its shadow on out's device. */
static bias_act_args bias_act_call(int dev, float *out, float *pre, const void *inp,
                                   const void *weight, const float *bias, int64_t rows, int64_t C,
                                   int64_t OC, fsdp_gemm_act act) {
    return (bias_act_args){.out = sim_kernel_ptr(dev, out),
                           .pre = sim_kernel_ptr(dev, pre),
                           .inp = sim_kernel_ptr(dev, inp),
                           .weight = sim_kernel_ptr(dev, weight),
                           .bias = sim_kernel_ptr(dev, bias),
                           .rows = rows,
                           .C = C,
                           .OC = OC,
                           .act = act};
}

void sim_gemm_bias_act(float *out, float *pre, const float *inp, const float *weight,
                       const float *bias, int64_t rows, int64_t C, int64_t OC, fsdp_gemm_act act) {
    int dev = sim_kernel_device(out, "gemm_bias_act");
    bias_act_args call = bias_act_call(dev, out, pre, inp, weight, bias, rows, C, OC, act);
    sim_kernel_launch(dev, run_gemm_bias_act, &call, sizeof call);
}

void sim_gemm_bf16_bias_act(float *out, float *pre, const fsdp_bf16 *inp, const fsdp_bf16 *weight,
                            const float *bias, int64_t rows, int64_t C, int64_t OC,
                            fsdp_gemm_act act) {
    int dev = sim_kernel_device(out, "gemm_bf16_bias_act");
    bias_act_args call = bias_act_call(dev, out, pre, inp, weight, bias, rows, C, OC, act);
    sim_kernel_launch(dev, run_gemm_bf16_bias_act, &call, sizeof call);
}

typedef struct bgrad_args {
    float *dweight, *dbias;
    const float *dout, *inp;
    int64_t rows, C, OC;
} bgrad_args;

static void run_gemm_bgrad(void *arg) {
    bgrad_args *a = arg;
    fsdp_kernels_cpu()->gemm_bgrad(a->dweight, a->dbias, a->dout, a->inp, a->rows, a->C, a->OC);
}

void sim_gemm_bgrad(float *dweight, float *dbias, const float *dout, const float *inp, int64_t rows,
                    int64_t C, int64_t OC) {
    int dev = sim_kernel_device(dweight, "gemm_bgrad");
    bgrad_args call = {sim_kernel_ptr(dev, dweight),
                       sim_kernel_ptr(dev, dbias),
                       sim_kernel_ptr(dev, dout),
                       sim_kernel_ptr(dev, inp),
                       rows,
                       C,
                       OC};
    sim_kernel_launch(dev, run_gemm_bgrad, &call, sizeof call);
}

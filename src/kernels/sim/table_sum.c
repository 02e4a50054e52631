/* table_sum.c: the simulated GPU's sums of parallel branches' input gradients, the residual
 * add of a bf16 branch and the norm backward that adds the residual's gradient (table.c lists
 * them): add3, add3_round_bf16, add_bf16 and rmsnorm_backward_add, each the CPU entry run on the
 * device's stream over the shadow memory, as every other entry. */
#include "kernels/sim/sim_impl.h"

typedef struct add3_args {
    float *out;
    const float *a, *b, *c; /* c may be NULL */
    int64_t n;
} add3_args;

static void run_add3(void *arg) {
    add3_args *a = arg;
    fsdp_kernels_cpu()->add3(a->out, a->a, a->b, a->c, a->n);
}

static void run_add3_round_bf16(void *arg) {
    add3_args *a = arg;
    fsdp_kernels_cpu()->add3_round_bf16(a->out, a->a, a->b, a->c, a->n);
}

/* The closure's arguments, every array translated to its shadow on out's device. */
static void launch(void (*run)(void *), const char *name, float *out, const float *a,
                   const float *b, const float *c, int64_t n) {
    int dev = sim_kernel_device(out, name);
    add3_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, a), sim_kernel_ptr(dev, b),
                      sim_kernel_ptr(dev, c), n};
    sim_kernel_launch(dev, run, &call, sizeof call);
}

void sim_add3(float *out, const float *a, const float *b, const float *c, int64_t n) {
    launch(run_add3, "add3", out, a, b, c, n);
}

void sim_add3_round_bf16(float *out, const float *a, const float *b, const float *c, int64_t n) {
    launch(run_add3_round_bf16, "add3_round_bf16", out, a, b, c, n);
}

typedef struct add_bf16_args {
    float *out;
    const float *a;
    const fsdp_bf16 *b;
    int64_t n;
} add_bf16_args;

static void run_add_bf16(void *arg) {
    add_bf16_args *a = arg;
    fsdp_kernels_cpu()->add_bf16(a->out, a->a, a->b, a->n);
}

void sim_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n) {
    int dev = sim_kernel_device(out, "add_bf16");
    add_bf16_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, a), sim_kernel_ptr(dev, b),
                          n};
    sim_kernel_launch(dev, run_add_bf16, &call, sizeof call);
}

typedef struct rmsnorm_backward_add_args {
    float *dinp, *dweight;
    const float *dout, *dres, *inp, *weight, *rstd;
    int64_t rows, cols;
} rmsnorm_backward_add_args;

static void run_rmsnorm_backward_add(void *arg) {
    rmsnorm_backward_add_args *a = arg;
    fsdp_kernels_cpu()->rmsnorm_backward_add(a->dinp, a->dweight, a->dout, a->dres, a->inp,
                                             a->weight, a->rstd, a->rows, a->cols);
}

void sim_rmsnorm_backward_add(float *dinp, float *dweight, const float *dout, const float *dres,
                              const float *inp, const float *weight, const float *rstd,
                              int64_t rows, int64_t cols) {
    int dev = sim_kernel_device(dinp, "rmsnorm_backward_add");
    rmsnorm_backward_add_args call = {.dinp = sim_kernel_ptr(dev, dinp),
                                      .dweight = sim_kernel_ptr(dev, dweight),
                                      .dout = sim_kernel_ptr(dev, dout),
                                      .dres = sim_kernel_ptr(dev, dres),
                                      .inp = sim_kernel_ptr(dev, inp),
                                      .weight = sim_kernel_ptr(dev, weight),
                                      .rstd = sim_kernel_ptr(dev, rstd),
                                      .rows = rows,
                                      .cols = cols};
    sim_kernel_launch(dev, run_rmsnorm_backward_add, &call, sizeof call);
}

/* table_multi.c: the simulated GPU's multi-tensor entries (kernels.h adam_update_multi,
 * fill_multi): the list split into chunks of FSDP_ADAM_MULTI_CHUNK / FSDP_FILL_MULTI_CHUNK
 * tensors as CUDA splits it, each chunk copied (shadow addresses) into one closure that runs
 * the CPU's entry on the device's stream: one launch per chunk, the CPU's bits. */
#include <stdlib.h>

#include "kernels/sim/sim_impl.h"

typedef struct adam_multi_args {
    fsdp_adam_step_args args;
    int count;
    fsdp_adam_tensor t[FSDP_ADAM_MULTI_CHUNK];
} adam_multi_args;

static void run_adam_multi(void *arg) {
    adam_multi_args *a = arg;
    fsdp_kernels_cpu()->adam_update_multi(a->t, a->count, &a->args);
}

void sim_adam_update_multi(const fsdp_adam_tensor *t, int count, const fsdp_adam_step_args *args) {
    int dev = -1; /* the device of the first tensor with elements */
    for (int i = 0; i < count && dev < 0; i++)
        if (t[i].n > 0) dev = sim_kernel_device(t[i].p, "adam_update_multi");
    if (dev < 0) return;
    for (int start = 0; start < count; start += FSDP_ADAM_MULTI_CHUNK) {
        adam_multi_args call = {.args = *args};
        for (int i = start; i < count && i < start + FSDP_ADAM_MULTI_CHUNK; i++) {
            if (t[i].n <= 0) continue;
            call.t[call.count++] = (fsdp_adam_tensor){
                sim_kernel_ptr(dev, t[i].p),
                sim_kernel_ptr(dev, t[i].g),
                sim_kernel_ptr(dev, t[i].m),
                sim_kernel_ptr(dev, t[i].v),
                sim_kernel_ptr(dev, t[i].vmax),
                sim_kernel_ptr(dev, t[i].p_bf16),
                t[i].n,
            };
        }
        if (call.count > 0) sim_kernel_launch(dev, run_adam_multi, &call, sizeof call);
    }
}

typedef struct fill_multi_args {
    float value;
    int count;
    float *out[FSDP_FILL_MULTI_CHUNK];
    int64_t n[FSDP_FILL_MULTI_CHUNK];
} fill_multi_args;

static void run_fill_multi(void *arg) {
    fill_multi_args *a = arg;
    fsdp_kernels_cpu()->fill_multi(a->out, a->n, a->count, a->value);
}

void sim_fill_multi(float *const *out, const int64_t *n, int count, float value) {
    int dev = -1;
    for (int i = 0; i < count && dev < 0; i++)
        if (n[i] > 0) dev = sim_kernel_device(out[i], "fill_multi");
    if (dev < 0) return;
    for (int start = 0; start < count; start += FSDP_FILL_MULTI_CHUNK) {
        fill_multi_args call = {.value = value};
        for (int i = start; i < count && i < start + FSDP_FILL_MULTI_CHUNK; i++) {
            if (n[i] <= 0) continue;
            call.out[call.count] = sim_kernel_ptr(dev, out[i]);
            call.n[call.count++] = n[i];
        }
        if (call.count > 0) sim_kernel_launch(dev, run_fill_multi, &call, sizeof call);
    }
}

/* multi.c: the CPU's multi-tensor entries (kernels.h adam_update_multi, fill_multi): the
 * per-tensor entries of the table, tensor after tensor, each split over the rank's threads as
 * alone (parallel.c), so every element gets the per-tensor bits. The CPU has no launches to
 * save; the entries exist so that callers need not branch on the device. */
#include "kernels/cpu/parallel.h"

void fsdp_cpu_par_adam_update_multi(const fsdp_adam_tensor *t, int count,
                                    const fsdp_adam_step_args *args) {
    for (int i = 0; i < count; i++) {
        if (t[i].n <= 0) continue;
        if (t[i].p_bf16)
            fsdp_cpu_par_adam_update_bf16(t[i].p, t[i].p_bf16, t[i].g, t[i].m, t[i].v, t[i].vmax,
                                          t[i].n, args);
        else
            fsdp_cpu_par_adam_update(t[i].p, t[i].g, t[i].m, t[i].v, t[i].vmax, t[i].n, args);
    }
}

void fsdp_cpu_par_fill_multi(float *const *out, const int64_t *n, int count, float value) {
    for (int i = 0; i < count; i++)
        if (n[i] > 0) fsdp_cpu_par_fill(out[i], value, n[i]);
}

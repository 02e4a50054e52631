/* reduce_n.c: the sim table's reduce_n: the n input pointers (a host array) are checked to be
 * memory of the output's device and copied, as shadow addresses, into the closure with the
 * arguments, and the CPU's entry runs on the calling thread's current stream: bitwise the
 * CPU's result. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/sim/sim_impl.h"

typedef struct reduce_n_args {
    void *out;
    int n;
    int64_t count;
    fsdp_dtype dtype;
    fsdp_reduce_n_args args;
    const void *in[FSDP_REDUCE_N_MAX];
} reduce_n_args;

static void run_reduce_n(void *arg) {
    reduce_n_args *a = arg;
    fsdp_kernels_cpu()->reduce_n(a->out, a->in, a->n, a->count, a->dtype, &a->args);
}

void sim_reduce_n(void *out, const void *const *in, int n, int64_t count, fsdp_dtype dtype,
                  const fsdp_reduce_n_args *args) {
    if (n <= 0 || count <= 0) return;
    int dev = sim_kernel_device(out, "reduce_n");
    if (n > FSDP_REDUCE_N_MAX) {
        fprintf(stderr, "libfsdp: the sim kernel reduce_n was given %d inputs (at most %d)\n", n,
                FSDP_REDUCE_N_MAX);
        abort();
    }
    reduce_n_args call = {sim_kernel_ptr(dev, out), n, count, dtype, *args, {0}};
    for (int r = 0; r < n; r++) call.in[r] = sim_kernel_ptr(dev, in[r]);
    sim_kernel_launch(dev, run_reduce_n, &call, sizeof call);
}

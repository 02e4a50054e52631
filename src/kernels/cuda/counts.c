/* counts.c: the launch and host-wait counts of each CUDA device (cuda.h says what counts), in
 * relaxed atomics: a count costs a cudaGetDevice and an atomic add, and orders nothing. */
#include <stdatomic.h>

#include "kernels/cuda/cuda_impl.h"

static _Atomic int64_t launches[FSDP_CUDA_MAX_DEVICES], host_waits[FSDP_CUDA_MAX_DEVICES];

/* device, or the calling thread's current one when -1; -1 when out of range. */
static int which(int device) {
    if (device == -1 && cudaGetDevice(&device) != cudaSuccess) return -1;
    return device >= 0 && device < FSDP_CUDA_MAX_DEVICES ? device : -1;
}

void fsdp_cuda_count_launch(int device) {
    int d = which(device);
    if (d >= 0) atomic_fetch_add_explicit(&launches[d], 1, memory_order_relaxed);
}

void fsdp_cuda_count_host_wait(int device) {
    int d = which(device);
    if (d >= 0) atomic_fetch_add_explicit(&host_waits[d], 1, memory_order_relaxed);
}

fsdp_launch_counts fsdp_cuda_counts_get(int device) {
    if (device < 0 || device >= FSDP_CUDA_MAX_DEVICES) return (fsdp_launch_counts){0};
    return (fsdp_launch_counts){
        .launches = atomic_load_explicit(&launches[device], memory_order_relaxed),
        .host_waits = atomic_load_explicit(&host_waits[device], memory_order_relaxed)};
}

void fsdp_cuda_counts_reset(int device) {
    if (device < 0 || device >= FSDP_CUDA_MAX_DEVICES) return;
    atomic_store_explicit(&launches[device], 0, memory_order_relaxed);
    atomic_store_explicit(&host_waits[device], 0, memory_order_relaxed);
}

/* counts.c: the launch and host-wait counts of each sim device (sim.h says what counts). Relaxed
 * atomics: a count orders nothing, so ThreadSanitizer sees no edge from it, and a missing
 * stream wait stays visible to it. */
#include <stdatomic.h>

#include "kernels/sim/sim_impl.h"

static _Atomic int64_t launches[SIM_MAX_DEVICES], host_waits[SIM_MAX_DEVICES];

static bool valid(int device) {
    return device >= 0 && device < SIM_MAX_DEVICES;
}

void sim_count_launch(int device) {
    if (valid(device)) atomic_fetch_add_explicit(&launches[device], 1, memory_order_relaxed);
}

void sim_count_host_wait(int device) {
    if (valid(device)) atomic_fetch_add_explicit(&host_waits[device], 1, memory_order_relaxed);
}

fsdp_launch_counts fsdp_sim_counts_get(int device) {
    if (!valid(device)) return (fsdp_launch_counts){0};
    return (fsdp_launch_counts){
        .launches = atomic_load_explicit(&launches[device], memory_order_relaxed),
        .host_waits = atomic_load_explicit(&host_waits[device], memory_order_relaxed)};
}

void fsdp_sim_counts_reset(int device) {
    if (!valid(device)) return;
    atomic_store_explicit(&launches[device], 0, memory_order_relaxed);
    atomic_store_explicit(&host_waits[device], 0, memory_order_relaxed);
}

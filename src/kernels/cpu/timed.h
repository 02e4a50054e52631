/* timed.h: the CPU table with profile timers (timed.c). Internal to src/kernels/cpu. */
#ifndef FSDP_KERNELS_CPU_TIMED_H
#define FSDP_KERNELS_CPU_TIMED_H

#include "kernels/kernels.h"

/* The table whose entries time `untimed`'s (the CPU table) into the calling thread's profile. */
const fsdp_kernels_i *fsdp_cpu_timed_table(const fsdp_kernels_i *untimed);

#endif

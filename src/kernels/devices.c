/* devices.c: the device kinds this build has, each registered as one record (memory, queues,
 * kernels: core/device.h) when the library loads, fsdp_kernels_for, the operator table of a
 * tensor's device read from its record, and the launch and host-wait counts of a device, asked
 * of its kind. The only place that lists the kinds. */
#include "core/device.h"     // defines: fsdp_device_register, fsdp_device_cpu_memory
#include "kernels/kernels.h" // defines: fsdp_kernels_cpu
#include "kernels/sim/sim.h" // defines: fsdp_device_sim, fsdp_sim_counts_get
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_device, fsdp_cuda_counts_get
#endif

static fsdp_device_i cpu_record;

/* Only stores pointers: no device is touched before a tensor is made on it. */
__attribute__((constructor)) static void register_devices(void) {
    cpu_record = *fsdp_device_cpu_memory();
    cpu_record.kernels = fsdp_kernels_cpu;
    fsdp_device_register(FSDP_DEVICE_CPU, &cpu_record);
    fsdp_device_register(FSDP_DEVICE_SIM, fsdp_device_sim());
#ifdef FSDP_HAVE_CUDA
    fsdp_device_register(FSDP_DEVICE_CUDA, fsdp_cuda_device());
#endif
}

const fsdp_kernels_i *fsdp_kernels_for(fsdp_device device) {
    const fsdp_device_i *d = fsdp_device_for(device.type);
    return d && d->kernels ? d->kernels() : NULL;
}

fsdp_launch_counts fsdp_kernels_counts(fsdp_device device) {
    if (device.type == FSDP_DEVICE_SIM) return fsdp_sim_counts_get(device.index);
#ifdef FSDP_HAVE_CUDA
    if (device.type == FSDP_DEVICE_CUDA) return fsdp_cuda_counts_get(device.index);
#endif
    return (fsdp_launch_counts){0};
}

void fsdp_kernels_counts_reset(fsdp_device device) {
    if (device.type == FSDP_DEVICE_SIM) fsdp_sim_counts_reset(device.index);
#ifdef FSDP_HAVE_CUDA
    if (device.type == FSDP_DEVICE_CUDA) fsdp_cuda_counts_reset(device.index);
#endif
}

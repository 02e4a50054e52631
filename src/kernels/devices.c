/* devices.c: the device kinds this build has, each registered as one record (memory, queues,
 * kernels: core/device.h) when the library loads, and fsdp_kernels_for, the operator table of a
 * tensor's device read from its record. The only place that lists the kinds. */
#include "core/device.h"     // defines: fsdp_device_register, fsdp_device_cpu_memory
#include "kernels/kernels.h" // defines: fsdp_kernels_cpu
#include "kernels/sim/sim.h" // defines: fsdp_device_sim
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_device
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

/* dispatch.c: fsdp_kernels_for, the operator table of a device (NULL when this build has
 * none for it). */
#include "kernels/kernels.h"
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda.h" // defines: fsdp_kernels_cuda
#endif

const fsdp_kernels_i *fsdp_kernels_for(fsdp_device device) {
    switch (device.type) {
    case FSDP_DEVICE_CPU:
        return fsdp_kernels_cpu();
    case FSDP_DEVICE_CUDA:
#ifdef FSDP_HAVE_CUDA
        return fsdp_kernels_cuda();
#else
        return NULL; // a build without CUDA
#endif
    case FSDP_DEVICE_SIM:
    case FSDP_DEVICE_KINDS:
        break; // the simulated device is not built yet
    }
    return NULL;
}

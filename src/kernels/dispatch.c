/* dispatch.c: fsdp_kernels_for, the operator table of a device (NULL when this build has
 * none for it). */
#include "kernels/kernels.h"

const fsdp_kernels_i *fsdp_kernels_for(fsdp_device device) {
    switch (device.type) {
    case FSDP_DEVICE_CPU:
        return fsdp_kernels_cpu();
    case FSDP_DEVICE_CUDA:
        return NULL; // no CUDA table yet
    }
    return NULL;
}

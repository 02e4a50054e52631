/* gpu_peaks.h: the dense peak GEMM throughputs of the NVIDIA GPUs libfsdp keeps figures for,
 * found by the name CUDA gives the device (fsdp_device_properties' peak_tflops_*). */
#ifndef FSDP_KERNELS_GPU_PEAKS_H
#define FSDP_KERNELS_GPU_PEAKS_H

#ifdef __cplusplus
extern "C" {
#endif

/* *f32, *tf32, *bf16 <- the dense peak TFLOP/s of the GPU named `name` (f32 GEMMs, f32 GEMMs on
 * TF32 tensor cores, bf16 GEMMs with f32 accumulation), or zeros for a GPU outside the table. */
void fsdp_gpu_peaks(const char *name, double *f32, double *tf32, double *bf16);

#ifdef __cplusplus
}
#endif
#endif

/* sdpa_impl.h: what sdpa.c and sdpa_graph.c share: the cuDNN functions they call, resolved from
 * the library opened at run time (dlopen), and the execution plans of cuDNN's fused attention
 * graphs. Included only where cuDNN's headers are (FSDP_HAVE_CUDNN); internal to
 * src/kernels/cuda. */
#ifndef FSDP_KERNELS_CUDA_SDPA_IMPL_H
#define FSDP_KERNELS_CUDA_SDPA_IMPL_H

#include <cudnn_graph.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The functions of libcudnn.so.9 this library calls (names without the cudnn prefix). */
typedef struct fsdp_cudnn_lib {
    size_t version; // cudnnGetVersion(): 91900 for 9.19.0
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t status);
    void (*GetLastErrorString)(char *message, size_t max_size);
    cudnnStatus_t (*Create)(cudnnHandle_t *handle);
    cudnnStatus_t (*Destroy)(cudnnHandle_t handle);
    cudnnStatus_t (*SetStream)(cudnnHandle_t handle, cudaStream_t stream);
    cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t type,
                                             cudnnBackendDescriptor_t *desc);
    cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t desc);
    cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t desc);
    cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t desc,
                                         cudnnBackendAttributeName_t name,
                                         cudnnBackendAttributeType_t type, int64_t count,
                                         const void *values);
    cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t const desc,
                                         cudnnBackendAttributeName_t name,
                                         cudnnBackendAttributeType_t type, int64_t requested,
                                         int64_t *count, void *values);
    cudnnStatus_t (*BackendExecute)(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                    cudnnBackendDescriptor_t variant_pack);
} fsdp_cudnn_lib;

/* The tensors of the graphs, by unique id (the variant pack's keys). */
enum {
    SDPA_Q = 1,
    SDPA_K,
    SDPA_V,
    SDPA_O,
    SDPA_STATS, // f32 (B, NH, T, 1): each row's log-sum-exp, the table's lse
    SDPA_SCALE, // f32 by value: 1 / sqrt(D)
    SDPA_NEG,   // f32 by value: the masked score (-FLT_MAX)
    SDPA_ONE,   // f32 by value: 1 (the backward's dropout factors, absent here)
    SDPA_DO,
    SDPA_DQ,
    SDPA_DK,
    SDPA_DV,
    SDPA_DQ_ACCUM, // f32 (B, NH, T, D) the backward accumulates dq into, zeroed before each run
    SDPA_VIRTUAL,  // the first id of the graphs' virtual tensors
};

/* The byte alignment the graphs declare for every tensor (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT): a
 * plan may assume it, so a run hands cuDNN no pointer less aligned (sdpa.c checks each call's). */
#define SDPA_ALIGN 16

/* The most descriptors one graph keeps alive (tensors, operations, the graph, its plan). */
#define SDPA_MAX_DESCS 160

/* A finalized execution plan of one graph and everything it was made of. */
typedef struct fsdp_sdpa_plan {
    cudnnBackendDescriptor_t plan;
    int64_t workspace; // bytes the plan asks for
    cudnnBackendDescriptor_t desc[SDPA_MAX_DESCS];
    int n_desc;
} fsdp_sdpa_plan;

/* The graph of the causal grouped-query attention's forward (backward: false) or backward for
 * q (B, T, NH, D), k and v (B, T, NKV, D) and out, dout, dq like q, dk, dv like k, all bf16 in
 * those row-major layouts, and lse (B, NH, T) f32, with its first execution plan that cuDNN's
 * heuristics offer and that finalizes, on `handle`. Returns CUDNN_STATUS_SUCCESS, or the first
 * failure with what failed written to why (the plan then holds nothing). */
cudnnStatus_t fsdp_sdpa_plan_build(const fsdp_cudnn_lib *lib, cudnnHandle_t handle, bool backward,
                                   int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D,
                                   fsdp_sdpa_plan *out, char *why, size_t why_size);

/* The graph's operations alone, each finalized, without a handle or a plan (a CPU can check
 * them): SUCCESS or the first failure, named in why. */
cudnnStatus_t fsdp_sdpa_ops_check(const fsdp_cudnn_lib *lib, bool backward, int64_t B, int64_t T,
                                  int64_t NH, int64_t NKV, int64_t D, char *why, size_t why_size);

/* Destroys every descriptor of the plan (nothing when it holds none). */
void fsdp_sdpa_plan_free(const fsdp_cudnn_lib *lib, fsdp_sdpa_plan *p);

#endif

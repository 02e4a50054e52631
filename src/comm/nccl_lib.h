/* nccl_lib.h: the NCCL library the nccl backend calls, opened at run time: its functions, the
 * device kind whose memory and streams it takes, and the name every message of the backend
 * carries ("NCCL 2.28.9", or the name a test gave a stand-in library). Internal to src/comm and
 * to the tests that run the backend over a stand-in (tests/nccl_standin). */
#ifndef FSDP_COMM_NCCL_LIB_H
#define FSDP_COMM_NCCL_LIB_H

#include <nccl.h>

#include "fsdp/status.h"
#include "fsdp/tensor.h"

#define FSDP_NCCL_LIBRARY_ENV "FSDP_NCCL_LIBRARY"

/* A library that exports this symbol (an int holding an fsdp_device_type) is a stand-in for
 * NCCL (tests/nccl_standin): when it comes from FSDP_NCCL_LIBRARY or the build's default, it
 * serves tensors of that device kind (the stand-in: FSDP_DEVICE_SIM) and every message names
 * it FSDP_NCCL_STANDIN_NAME, never an NCCL version. */
#define FSDP_NCCL_STANDIN_SYMBOL "fsdpStandinDeviceKind"
#define FSDP_NCCL_STANDIN_NAME   "stand-in NCCL"

typedef struct fsdp_nccl_lib {
    char name[64];  /* "NCCL 2.28.9" */
    char path[512]; /* the file opened */
    int version;    /* ncclGetVersion's code */
    fsdp_device_type device;
    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*CommSplit)(ncclComm_t comm, int color, int key, ncclComm_t *out,
                              ncclConfig_t *config);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*CommAbort)(ncclComm_t comm);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *error);
    const char *(*GetErrorString)(ncclResult_t result);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t count, ncclDataType_t type,
                              ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*ReduceScatter)(const void *send, void *recv, size_t count, ncclDataType_t type,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Broadcast)(const void *send, void *recv, size_t count, ncclDataType_t type,
                              int root, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Send)(const void *send, size_t count, ncclDataType_t type, int peer,
                         ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Recv)(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
} fsdp_nccl_lib;

/* The library worlds made from now on use: `path` (a file name dlopen finds, or a path), whose
 * messages say `name` (NULL: "stand-in NCCL" for a library with the stand-in's marker, else
 * "NCCL x.y.z" from its version), serving tensors of `device`. path NULL: back to the default,
 * FSDP_NCCL_LIBRARY from the environment, else the library CMake found, serving
 * FSDP_DEVICE_CUDA, or the device kind of a stand-in's marker. For tests (a stand-in over sim
 * devices) and for programs that carry their own NCCL. */
void fsdp_nccl_library_use(const char *path, const char *name, fsdp_device_type device);

/* The library chosen now, opened on first use and kept open for the process (a table that
 * lives as long as the process). Fails naming the file and dlopen's reason, or the missing
 * function. */
fsdp_status fsdp_nccl_library_open(fsdp_ctx *ctx, const fsdp_nccl_lib **out);

#endif

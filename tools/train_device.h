/* train_device.h: fsdp-train's [parallel] device: the device each rank computes on, the rules
 * that refuse a device the run cannot use, and what the feeds and the step need to keep their
 * tensors there (docs/train.md, "[parallel]"). */
#ifndef FSDP_TOOLS_TRAIN_DEVICE_H
#define FSDP_TOOLS_TRAIN_DEVICE_H

#include <stddef.h>
#include <stdio.h>

#include "train_config.h"
#include "train_kind.h"
#include "train_metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device of world rank `rank`: the CPU, or device rank mod the count of [parallel] device's
 * kind on this machine (rank threads share a device when there are more ranks than devices);
 * under nccl-mpi the launcher's node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID)
 * mod the count, so each process of a machine takes its own device (with a
 * CUDA_VISIBLE_DEVICES of one GPU per process: that one).
 * Call after train_device_check passed. */
fsdp_device train_device_of(const train_config *cfg, int rank);

/* The rules of [parallel] device, at configuration time: under the mpi backend only the cpu
 * (its collectives move host tensors), and a device kind this machine has at least one of
 * (cuda: a usable GPU in a build with CUDA; sim: FSDP_SIM_DEVICES not 0). FSDP_ERR_CONFIG with
 * a message naming the key and the fix otherwise. */
fsdp_status train_device_check(const train_config *cfg, char *err, size_t err_size);

/* The rules of [parallel] backend = nccl, at configuration time: a build with the nccl backend
 * (and under mpirun the nccl-mpi one), a device (not the cpu), with rank threads no more ranks
 * than devices, and for sim a library in FSDP_NCCL_LIBRARY (the stand-in; the build's default
 * is the real NCCL, and a real NCCL named there fails when the world makes its communicator).
 * FSDP_ERR_CONFIG with a message naming the key and the fix otherwise; FSDP_OK for the other
 * backends. */
fsdp_status train_nccl_check(const train_config *cfg, char *err, size_t err_size);

/* How ranks map to devices, for the banner: "rank r on sim:(r mod 2)", or under nccl-mpi
 * "node-local rank l on cuda:(l mod 8)", into buf; returns buf. Not for device = cpu. */
const char *train_device_rule(const train_config *cfg, char *buf, size_t size);

/* "sim:0", "cuda:1", "cpu" into buf; returns buf. */
const char *train_device_name(fsdp_device device, char *buf, size_t size);

/* Rank 0's device's allocator figures into r (mem_peak, mem_reserved, mem_capacity), its peak
 * restarted so that the next progress step reports its own interval; nothing on the CPU. */
fsdp_status train_device_memory(fsdp_ctx *ctx, train_report *r);

/* What the progress lines' mfu (model-FLOP utilisation) is measured against: the model FLOPs
 * of a sample, one device's dense peak in the run's compute mode and the devices the world
 * computes on (ranks sharing a device count it once). */
typedef struct train_mfu {
    double flops_per_sample; /* the kind's count; 0: none */
    double peak_tflops;      /* [log] peak_tflops, or the device's figure; 0: none known */
    const char *mode;        /* the peak's compute mode: "f32", "tf32" or "bf16" */
    int devices;
    char source[256]; /* where the peak came from: the card's name, or "[log] peak_tflops" */
} train_mfu;

/* [parallel] allow_tf32 on the rank's GPU, after fsdp_ctx_set_device (on = false sets the
 * thread back to exact f32 when the rank is done); nothing on another device. */
fsdp_status train_device_tf32(fsdp_ctx *ctx, const train_config *cfg, bool on);
/* *mfu for the run: the kind's count, the peak ([log] peak_tflops, or the properties of
 * `device`: none for the CPU) in the run's compute mode, the devices. */
fsdp_status train_device_mfu(fsdp_ctx *ctx, const train_config *cfg, const train_kind *kind,
                             fsdp_device device, train_mfu *mfu);
/* What the count is, for a line: "6N + 12 L d T per token" or "6N". */
const char *train_mfu_count(const train_config *cfg);
/* The utilisation of a step rate: samples/s x FLOPs of a sample over devices x peak; 0 when
 * either count is missing. */
double train_mfu_of(const train_mfu *mfu, double samples_per_s);
/* The banner's line about mfu, or nothing: the count and the peak, or on a GPU without a
 * figure what sets one. */
void train_mfu_describe(const train_config *cfg, const train_mfu *mfu, FILE *out);

/* *dev <- a copy of host tensor `host` on the ctx's device (fsdp_ctx_device), owned by the
 * caller; NULL when the ctx computes on the CPU (the host tensor serves). */
fsdp_status train_device_mirror(fsdp_ctx *ctx, const fsdp_tensor *host, fsdp_tensor **dev);

/* A host copy of device tensor t into *scratch (made, or resized to t's shape, as needed; kept
 * by the caller), for code that reads values on the host; t itself when it is on the CPU. */
fsdp_status train_device_to_host(fsdp_ctx *ctx, const fsdp_tensor *t, fsdp_tensor **scratch,
                                 const fsdp_tensor **host);

#ifdef __cplusplus
}
#endif
#endif

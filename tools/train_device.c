/* train_device.c: fsdp-train's [parallel] device: which device a rank computes on, the rules
 * that refuse one the run cannot use, and the host round trips of the feeds. */
#include "train_device.h"

#include <stdio.h>
#include <stdlib.h>

/* The launcher's node-local rank of this process (Open MPI, then MPICH), or -1. */
static int local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end = NULL;
        long r = v && *v ? strtol(v, &end, 10) : -1;
        if (end && *end == '\0' && r >= 0 && r < 1 << 20) return (int)r;
    }
    return -1;
}

fsdp_device train_device_of(const train_config *cfg, int rank) {
    fsdp_device_type type = cfg->parallel.device;
    int count = fsdp_device_count(type);
    if (type == FSDP_DEVICE_CPU || count <= 0) return FSDP_CPU;
    if (train_config_backend(cfg) == TRAIN_BACKEND_NCCL_MPI) { /* a process per rank and device */
        int local = local_rank();
        return (fsdp_device){type, (local >= 0 ? local : rank) % count};
    }
    return (fsdp_device){type, rank % count};
}

const char *train_device_rule(const train_config *cfg, char *buf, size_t size) {
    const char *kind = fsdp_device_to_string((fsdp_device){cfg->parallel.device, 0});
    int count = fsdp_device_count(cfg->parallel.device);
    if (train_config_backend(cfg) == TRAIN_BACKEND_NCCL_MPI)
        snprintf(buf, size, "node-local rank l on %s:(l mod %d)", kind, count);
    else
        snprintf(buf, size, "rank r on %s:(r mod %d)", kind, count);
    return buf;
}

fsdp_status train_nccl_check(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    train_backend backend = train_config_backend(cfg);
    if (backend != TRAIN_BACKEND_NCCL && backend != TRAIN_BACKEND_NCCL_MPI) return FSDP_OK;
    train_config_key_text(cfg, "parallel", "backend", a, sizeof a);
    if (!fsdp_backend_available(FSDP_BACKEND_NCCL)) {
        snprintf(err, err_size,
                 "%s, but this build has no nccl backend (it is built when CMake finds CUDA "
                 "and NCCL, or with -DFSDP_NCCL=ON); use backend = local (or mpi under mpirun), "
                 "or rebuild with NCCL",
                 a);
        return FSDP_ERR_CONFIG;
    }
    if (backend == TRAIN_BACKEND_NCCL_MPI && !fsdp_backend_available(FSDP_BACKEND_NCCL_MPI)) {
        snprintf(err, err_size,
                 "%s under mpirun runs one process per rank (the nccl-mpi backend), but this "
                 "build has no nccl-mpi backend (it needs MPI too, and CMake found none); "
                 "install an MPI (Debian: libopenmpi-dev openmpi-bin) and rebuild, or run "
                 "without mpirun (rank threads, ranks = the device count)",
                 a);
        return FSDP_ERR_CONFIG;
    }
    train_config_key_text(cfg, "parallel", "device", b, sizeof b);
    if (cfg->parallel.device == FSDP_DEVICE_CPU) {
        snprintf(err, err_size,
                 "%s moves device tensors with NCCL, but %s; set device = cuda (or device = sim "
                 "with the stand-in NCCL in FSDP_NCCL_LIBRARY), or backend = local for the cpu",
                 a, b);
        return FSDP_ERR_CONFIG;
    }
    int world = train_config_world_size(cfg), count = fsdp_device_count(cfg->parallel.device);
    if (backend == TRAIN_BACKEND_NCCL && count > 0 && world > count) {
        snprintf(err, err_size,
                 "%s runs one rank thread per device, but the world has %d ranks and %s has %d "
                 "device%s here (NCCL refuses two ranks on one GPU); use at most %d ranks, more "
                 "devices (sim: FSDP_SIM_DEVICES), or backend = local",
                 a, world, b, count, count == 1 ? "" : "s", count);
        return FSDP_ERR_CONFIG;
    }
    const char *lib = getenv("FSDP_NCCL_LIBRARY");
    if (cfg->parallel.device == FSDP_DEVICE_SIM && !(lib && *lib)) {
        snprintf(err, err_size,
                 "%s with %s needs the stand-in NCCL, which moves sim memory: set the "
                 "environment variable FSDP_NCCL_LIBRARY to its libfsdp_nccl_standin.so (the "
                 "build's default is the real NCCL, which moves cuda memory only), or set "
                 "device = cuda, or backend = local",
                 b, a);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

fsdp_status train_device_check(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    fsdp_device_type type = cfg->parallel.device;
    if (type == FSDP_DEVICE_CPU) return FSDP_OK;
    train_config_key_text(cfg, "parallel", "device", a, sizeof a);
    if (train_config_backend(cfg) == TRAIN_BACKEND_MPI) {
        snprintf(err, err_size,
                 "%s needs rank threads in one process (backend = local), but %s runs one "
                 "process per rank, whose collectives move host tensors only; set backend = "
                 "local (and ranks), backend = nccl (NCCL between the processes' devices), or "
                 "device = cpu under mpirun",
                 a, train_config_key_text(cfg, "parallel", "backend", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    if (fsdp_device_count(type) > 0) return FSDP_OK;
    if (type == FSDP_DEVICE_CUDA)
        snprintf(err, err_size,
                 "%s, but no GPU is usable here (this build has no CUDA support, or the driver "
                 "sees no GPU: nvidia-smi, CUDA_VISIBLE_DEVICES); set device = cpu, or device = "
                 "sim to run the same device path on the simulated GPU",
                 a);
    else
        snprintf(err, err_size,
                 "%s, but the environment variable FSDP_SIM_DEVICES = 0 leaves no simulated "
                 "device; set FSDP_SIM_DEVICES to 1..16 (unset: 2), or device = cpu",
                 a);
    return FSDP_ERR_CONFIG;
}

const char *train_device_name(fsdp_device device, char *buf, size_t size) {
    if (device.type == FSDP_DEVICE_CPU)
        snprintf(buf, size, "cpu");
    else
        snprintf(buf, size, "%s:%d", fsdp_device_to_string(device), device.index);
    return buf;
}

fsdp_status train_device_mirror(fsdp_ctx *ctx, const fsdp_tensor *host, fsdp_tensor **dev) {
    *dev = NULL;
    fsdp_device d = fsdp_ctx_device(ctx);
    if (d.type == FSDP_DEVICE_CPU) return FSDP_OK;
    fsdp_status st = fsdp_tensor_create(ctx, fsdp_tensor_dtype(host), d, fsdp_tensor_ndim(host),
                                        fsdp_tensor_shape(host), dev);
    if (st == FSDP_OK && fsdp_tensor_numel(host) > 0) st = fsdp_tensor_copy(ctx, *dev, host);
    if (st != FSDP_OK) {
        fsdp_tensor_free(*dev);
        *dev = NULL;
    }
    return st;
}

fsdp_status train_device_to_host(fsdp_ctx *ctx, const fsdp_tensor *t, fsdp_tensor **scratch,
                                 const fsdp_tensor **host) {
    *host = t;
    if (fsdp_tensor_device(t).type == FSDP_DEVICE_CPU) return FSDP_OK;
    fsdp_status st = FSDP_OK;
    if (!*scratch)
        st = fsdp_tensor_create(ctx, fsdp_tensor_dtype(t), FSDP_CPU, fsdp_tensor_ndim(t),
                                fsdp_tensor_shape(t), scratch);
    else if (!fsdp_tensor_same_shape(*scratch, t))
        st = fsdp_tensor_resize(ctx, *scratch, fsdp_tensor_ndim(t), fsdp_tensor_shape(t));
    if (st == FSDP_OK && fsdp_tensor_numel(t) > 0) st = fsdp_tensor_copy(ctx, *scratch, t);
    if (st == FSDP_OK) *host = *scratch;
    return st;
}

fsdp_status train_device_memory(fsdp_ctx *ctx, train_report *r) {
    fsdp_device dev = fsdp_ctx_device(ctx);
    if (dev.type == FSDP_DEVICE_CPU) return FSDP_OK;
    fsdp_device_memory m;
    fsdp_status st = fsdp_device_memory_stats(ctx, dev, &m);
    if (st == FSDP_OK) st = fsdp_device_reset_peak_memory(ctx, dev);
    if (st != FSDP_OK) return st;
    r->mem_peak = m.peak_in_use;
    r->mem_reserved = m.reserved;
    r->mem_capacity = m.capacity;
    return FSDP_OK;
}

fsdp_status train_device_tf32(fsdp_ctx *ctx, const train_config *cfg, bool on) {
    if (!cfg->parallel.allow_tf32 || fsdp_ctx_device(ctx).type != FSDP_DEVICE_CUDA) return FSDP_OK;
    return fsdp_cuda_set_allow_tf32(ctx, on);
}

/* The devices the world computes on: a rank's own (the CPU's cores, or a GPU per process under
 * nccl-mpi), or rank threads sharing the device kind's count here. */
static int devices_of(const train_config *cfg) {
    int world = train_config_world_size(cfg);
    fsdp_device_type type = cfg->parallel.device;
    if (type == FSDP_DEVICE_CPU || train_config_backend(cfg) == TRAIN_BACKEND_NCCL_MPI)
        return world;
    int count = fsdp_device_count(type);
    return count > 0 && count < world ? count : world;
}

fsdp_status train_device_mfu(fsdp_ctx *ctx, const train_config *cfg, const train_kind *kind,
                             fsdp_device device, train_mfu *mfu) {
    *mfu = (train_mfu){.devices = devices_of(cfg)};
    bool bf16 = cfg->model.kind == TRAIN_MODEL_LLAMA && cfg->model.autocast == 1;
    bool tf32 = !bf16 && cfg->parallel.allow_tf32 && cfg->parallel.device == FSDP_DEVICE_CUDA;
    mfu->mode = bf16 ? "bf16" : tf32 ? "tf32" : "f32";
    if (kind->flops_per_sample) TRAIN_TRY(kind->flops_per_sample(ctx, cfg, &mfu->flops_per_sample));
    if (cfg->log.peak_tflops > 0) {
        mfu->peak_tflops = cfg->log.peak_tflops;
        snprintf(mfu->source, sizeof mfu->source, "[log] peak_tflops");
        return FSDP_OK;
    }
    fsdp_device_properties p;
    TRAIN_TRY(fsdp_device_get_properties(ctx, device, &p));
    mfu->peak_tflops = bf16 ? p.peak_tflops_bf16 : tf32 ? p.peak_tflops_tf32 : p.peak_tflops_f32;
    snprintf(mfu->source, sizeof mfu->source, "%s", p.name);
    return FSDP_OK;
}

double train_mfu_of(const train_mfu *mfu, double samples_per_s) {
    if (!(mfu->flops_per_sample > 0 && mfu->peak_tflops > 0)) return 0;
    return samples_per_s * mfu->flops_per_sample / (mfu->peak_tflops * 1e12 * mfu->devices);
}

const char *train_mfu_count(const train_config *cfg) {
    return cfg->model.kind == TRAIN_MODEL_LLAMA ? "6N + 12 L d T per token" : "6N";
}

void train_mfu_describe(const train_config *cfg, const train_mfu *mfu, FILE *out) {
    if (mfu->flops_per_sample > 0 && mfu->peak_tflops > 0)
        fprintf(out, "mfu: %.4g FLOP per %s (%s) against %g TFLOP/s (%s, %s) x %d device%s\n",
                mfu->flops_per_sample, cfg->model.kind == TRAIN_MODEL_LLAMA ? "sequence" : "sample",
                train_mfu_count(cfg), mfu->peak_tflops, mfu->mode, mfu->source, mfu->devices,
                mfu->devices == 1 ? "" : "s");
    else if (mfu->flops_per_sample > 0 && cfg->parallel.device == FSDP_DEVICE_CUDA)
        fprintf(out,
                "mfu: none, libfsdp has no peak figure for '%s' in %s; set [log] peak_tflops "
                "to its dense peak TFLOP/s\n",
                mfu->source, mfu->mode);
}

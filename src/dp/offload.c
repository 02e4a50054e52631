/* offload.c: CPU offload of a model on a device: the flat shards and their gradients live in
 * pinned host memory (fsdp_host_alloc), which the gathers copy to the device asynchronously on
 * the stream that gathers (a copy from pinned memory reads it when the stream gets there), and
 * the synchronisation that keeps the host from writing a shard (the optimizer step, a summon's
 * write-back, a checkpoint load) before those copies have read it: at the end of the root's
 * forward and backward, and around summon_full_params. */
#include <stdatomic.h>

#include "core/error.h"
#include "core/tensor_impl.h"
#include "dp/shard_impl.h"

static atomic_bool skip_sync;

void fsdp_shard_test_skip_offload_sync(bool on) {
    atomic_store(&skip_sync, on);
}

bool fsdp_offload_on_device(const fsdp_sharded *sh) {
    return sh->opts.offload_params && sh->pool.device.type != FSDP_DEVICE_CPU;
}

static void free_sim(void *p) {
    fsdp_host_free(FSDP_DEVICE_SIM, p);
}

static void free_cuda(void *p) {
    fsdp_host_free(FSDP_DEVICE_CUDA, p);
}

/* t (a CPU tensor owning its storage) moves into pinned memory for devices of `type`. */
static fsdp_status pin(fsdp_ctx *ctx, fsdp_device_type type, fsdp_tensor *t) {
    size_t bytes = fsdp_tensor_nbytes(t);
    if (bytes == 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_tensor_relocatable(ctx, t, "FSDP offload"));
    void *p;
    FSDP_TRY_AT(ctx, fsdp_host_alloc(ctx, type, bytes, &p));
    fsdp_tensor_relocate(t, p, type == FSDP_DEVICE_SIM ? free_sim : free_cuda, p);
    return FSDP_OK;
}

fsdp_status fsdp_offload_pin(fsdp_ctx *ctx, const fsdp_sharded *sh, unit *u) {
    if (!fsdp_offload_on_device(sh)) return FSDP_OK;
    FSDP_TRY_AT(ctx, pin(ctx, sh->pool.device.type, fsdp_param_data(u->flat)));
    return pin(ctx, sh->pool.device.type, fsdp_param_grad(u->flat));
}

fsdp_status fsdp_offload_sync(fsdp_ctx *ctx, const fsdp_sharded *sh) {
    if (!fsdp_offload_on_device(sh) || atomic_load(&skip_sync)) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_stream_synchronize(ctx, fsdp_stream_current(sh->pool.device)));
    if (sh->prefetch_ready) FSDP_TRY_AT(ctx, fsdp_stream_synchronize(ctx, sh->unshard));
    return FSDP_OK;
}

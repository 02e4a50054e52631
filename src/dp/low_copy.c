/* low_copy.c: the optimizer's bf16 copy of a flat shard under mixed precision (param_dtype
 * bf16): an Adam step writes the f32 shard and its rounding in one pass, and the unit's next
 * gathers take this rank's chunk from the copy instead of rounding the shard again, while the
 * shard's storage generation says nothing has touched it since. */
#include <stdatomic.h>

#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_stamp_of, fsdp_tensor_stamp_holds
#include "dp/flat.h"
#include "dp/shard_impl.h"

static atomic_int test_mode; /* fsdp_low_copy_mode; FSDP_LOW_COPY_ON is 0 */

void fsdp_shard_test_low_copy(fsdp_low_copy_mode mode) {
    atomic_store(&test_mode, (int)mode);
}

void fsdp_shard_test_low_copy_counts(const fsdp_sharded *sh, int64_t *used, int64_t *rounded) {
    *used = sh->low_copy_used;
    *rounded = sh->low_copy_rounded;
}

/* The unit whose flat shard p is, when its gathers could take a bf16 copy; else NULL. Under
 * offload the shard lives on the host and the gather copies it to the device anyway. */
static unit *unit_of(const fsdp_param *p) {
    fsdp_sharded *sh = fsdp_module_flat_params_owner(fsdp_param_module(p));
    if (!sh || sh->param_dtype != FSDP_DTYPE_BF16 || sh->opts.offload_params ||
        atomic_load(&test_mode) == FSDP_LOW_COPY_OFF)
        return NULL;
    for (int i = 0; i < sh->n_units; i++)
        if (sh->units[i]->flat == p) return sh->units[i];
    return NULL;
}

fsdp_status fsdp_flat_low_copy(fsdp_ctx *ctx, fsdp_param *p, fsdp_bf16 **out) {
    *out = NULL;
    unit *u = unit_of(p);
    if (!u) return FSDP_OK;
    const fsdp_tensor *shard = fsdp_param_data(p);
    if (!u->low_copy) {
        int64_t n = fsdp_tensor_numel(shard);
        FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, fsdp_tensor_device(shard), 1, &n,
                                            &u->low_copy));
    }
    u->low_copy_stamp = FSDP_TENSOR_NO_STAMP; /* not current until the step says it wrote it */
    *out = fsdp_tensor_data(u->low_copy);
    return FSDP_OK;
}

void fsdp_flat_low_copy_written(fsdp_param *p) {
    unit *u = unit_of(p);
    if (!u || !u->low_copy) return;
    const fsdp_tensor *shard = fsdp_param_data(p);
    u->low_copy_stamp = fsdp_tensor_stamp_of(shard);
}

bool fsdp_low_copy_take(unit *u) {
    fsdp_sharded *sh = u->owner;
    const fsdp_tensor *shard = fsdp_param_data(u->flat);
    int mode = atomic_load(&test_mode);
    bool take =
        u->low_copy && u->low_copy_stamp.storage && sh->param_dtype == FSDP_DTYPE_BF16 &&
        !sh->opts.offload_params && mode != FSDP_LOW_COPY_OFF &&
        (mode == FSDP_LOW_COPY_UNCHECKED || fsdp_tensor_stamp_holds(u->low_copy_stamp, shard));
    if (take)
        sh->low_copy_used++;
    else
        sh->low_copy_rounded++;
    return take;
}

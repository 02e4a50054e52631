/* mirror.c: a parameter's bf16 mirror under the bf16 compute policy without FSDP. A Linear
 * registers its weight's bf16 copy on the weight (fsdp_param.mirror) instead of keeping its own;
 * an optimizer whose update pass can write the rounding too (AdamW's bf16-copy variant) writes
 * it and records the weight's storage and write generation, and the next forward reads the
 * mirror instead of rounding the weight again while both still read the same. Any pointer taken
 * to the weight's values since (a fill, a copy, a checkpoint load, a layer reading it) bumps the
 * generation, so the forward rounds as before. FSDP's flat shards follow the same rule with
 * their own copy (src/dp/low_copy.c): their gathers, not a parameter's layer, read it. */
#include <stdatomic.h>

#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_stamp_of, fsdp_tensor_stamp_holds
#include "nn/module_impl.h"

static atomic_bool test_off;               /* fsdp_nn_test_param_mirror */
static atomic_int_least64_t used, rounded; /* fsdp_nn_test_param_mirror_counts */

void fsdp_nn_test_param_mirror(bool on) {
    atomic_store(&test_off, !on);
}

void fsdp_nn_test_param_mirror_counts(int64_t *n_used, int64_t *n_rounded, bool reset) {
    *n_used = atomic_load(&used);
    *n_rounded = atomic_load(&rounded);
    if (reset) atomic_store(&used, 0), atomic_store(&rounded, 0);
}

/* Whether p may carry a mirror: not while FSDP holds its values, nor with the switch off. */
static bool mirrorable(const fsdp_param *p) {
    return !p->manager && !atomic_load(&test_off) && fsdp_tensor_has_storage(p->data);
}

/* Whether p's mirror has p's data's shape and device. */
static bool fits(const fsdp_param *p) {
    if (!p->mirror || !fsdp_tensor_has_storage(p->mirror) ||
        !fsdp_tensor_same_shape(p->mirror, p->data))
        return false;
    fsdp_device a = fsdp_tensor_device(p->mirror), b = fsdp_tensor_device(p->data);
    return a.type == b.type && a.index == b.index;
}

fsdp_status fsdp_nn_param_mirror(fsdp_ctx *ctx, fsdp_param *p, fsdp_tensor **mirror,
                                 bool *current) {
    *mirror = NULL;
    *current = false;
    if (!mirrorable(p)) { /* e.g. FSDP wrapped the model after a forward made one: let it go */
        fsdp_tensor_free(p->mirror);
        p->mirror = NULL;
        p->mirror_stamp = FSDP_TENSOR_NO_STAMP;
        return FSDP_OK;
    }
    if (!fits(p)) {
        fsdp_tensor *t;
        FSDP_TRY_AT(ctx,
                    fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, fsdp_tensor_device(p->data),
                                       fsdp_tensor_ndim(p->data), fsdp_tensor_shape(p->data), &t));
        fsdp_tensor_free(p->mirror);
        p->mirror = t;
        p->mirror_stamp = FSDP_TENSOR_NO_STAMP;
    }
    *current = fsdp_tensor_stamp_holds(p->mirror_stamp, p->data);
    atomic_fetch_add(*current ? &used : &rounded, 1);
    *mirror = p->mirror;
    return FSDP_OK;
}

fsdp_bf16 *fsdp_nn_param_mirror_target(fsdp_param *p) {
    if (!mirrorable(p) || !fits(p)) return NULL;
    p->mirror_stamp = FSDP_TENSOR_NO_STAMP; /* not current until the update says it wrote it */
    return fsdp_tensor_data(p->mirror);
}

void fsdp_nn_param_mirror_written(fsdp_param *p) {
    if (!p->mirror) return;
    p->mirror_stamp = fsdp_tensor_stamp_of(p->data);
}

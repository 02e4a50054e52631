/* tensor_impl.h: the body of fsdp_tensor and its reference-counted storage, for libfsdp's
 * own layers (FSDP re-points parameters into flat buffers through fsdp_tensor_rebind). */
#ifndef FSDP_CORE_TENSOR_IMPL_H
#define FSDP_CORE_TENSOR_IMPL_H

#include <stdatomic.h>

#include "fsdp/tensor.h"

/* Whether a and b name the same device (kind and index). */
static inline bool fsdp_device_same(fsdp_device a, fsdp_device b) {
    return a.type == b.type && a.index == b.index;
}

/* Releases memory a storage does not own (fsdp_tensor_over, fsdp_tensor_relocate). */
typedef void (*fsdp_storage_release_fn)(void *arg);

typedef struct fsdp_storage {
    void *data;
    size_t nbytes;
    atomic_int refs; /* handles that point here */
    bool owned;      /* false for fsdp_tensor_from_blob memory and for memory with `release` */
    fsdp_device device;
    fsdp_storage_release_fn release; /* not owned: called with release_arg when refs drop to 0 */
    void *release_arg;
    /* Bumped each time a pointer into the memory is handed out (fsdp_tensor_data, so
     * fsdp_tensor_f32 and every copy, fill and kernel call too) and when the memory moves: a
     * value that changes whenever the values may have been written (read with
     * fsdp_tensor_stamp_of). It starts at a per-storage base (a count of storages made, in the
     * high 32 bits). Atomic: peers' rank threads may read a shared block. */
    atomic_uint_least64_t write_gen;
} fsdp_storage;

struct fsdp_tensor {
    fsdp_storage *storage;
    int64_t offset; /* elements from the start of storage */
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
    /* The DTensor this tensor is the local part of (set by src/tp), or NULL: activations that
     * flow between modules as DTensors are plain tensors carrying this back-pointer. Not
     * owned; views and copies do not inherit it. */
    void *dist;
};

/* Makes t a view of base's storage at element `offset`, keeping t's shape and dtype (which
 * must be base's). t's old storage is released. FSDP uses this to point a parameter into
 * its unit's gathered flat buffer and back. */
fsdp_status fsdp_tensor_rebind(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_tensor *base,
                               int64_t offset);

/* Makes t a view of the whole of src (its storage, offset, dtype and shape); t's old storage
 * is released and t->dist is kept. No allocation: src/tp re-points its DTensor handles at
 * each step's result this way. */
void fsdp_tensor_alias(fsdp_tensor *t, const fsdp_tensor *src);

/* Leaves t without memory (fsdp_tensor_has_storage false, data NULL), keeping its shape, dtype
 * and device, until the next fsdp_tensor_rebind. FSDP does this to a unit's parameters when it
 * reshards, so their gathered buffer can go back to the pool. No allocation. */
void fsdp_tensor_release_storage(fsdp_tensor *t);

/* Moves t's values to `device` in place: the handle stays the same and now points at new
 * storage there. Refused (FSDP_ERR_STATE) when t shares its storage with another handle (a view,
 * or a parameter inside an FSDP flat buffer) or wraps caller memory, since those would be left
 * behind. Nothing happens when t is already on `device`. */
fsdp_status fsdp_tensor_move(fsdp_ctx *ctx, fsdp_tensor *t, fsdp_device device);

/* A CPU tensor of the given shape over `data` (memory of at least its bytes that something
 * else manages): release(arg) is called once the last handle on the storage lets go. On
 * failure release is not called. */
fsdp_status fsdp_tensor_over(fsdp_ctx *ctx, void *data, fsdp_dtype dtype, int ndim,
                             const int64_t *shape, fsdp_storage_release_fn release, void *arg,
                             fsdp_tensor **out);

/* Moves the values of t's storage to `data` (CPU memory of at least the storage's bytes,
 * managed as for fsdp_tensor_over), frees the old memory and points the storage there: t and
 * every view of it keep their values, now at the new place. t must be on the CPU, own its
 * storage (fsdp_tensor_create memory) and span all of it (FSDP_ERR_STATE otherwise; checked
 * by fsdp_tensor_relocatable first, without side effects). */
fsdp_status fsdp_tensor_relocatable(fsdp_ctx *ctx, const fsdp_tensor *t, const char *what);
void fsdp_tensor_relocate(fsdp_tensor *t, void *data, fsdp_storage_release_fn release, void *arg);

/* fsdp_tensor_resize whose new storage, when it needs one, is not zeroed
 * (fsdp_tensor_create_uninit): for buffers the caller writes whole (fsdp_nn_buffer). */
fsdp_status fsdp_tensor_resize_uninit(fsdp_ctx *ctx, fsdp_tensor *t, int ndim,
                                      const int64_t *shape);
/* A tensor of the given shape without storage, for fsdp_tensor_rebind to bind later. */
fsdp_status fsdp_tensor_create_unbound(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device,
                                       int ndim, const int64_t *shape, fsdp_tensor **out);

/* Elements t can hold from its offset to the end of its storage. */
int64_t fsdp_tensor_capacity(const fsdp_tensor *t);

/* t's storage and its write generation (fsdp_storage.write_gen) at a moment: while
 * fsdp_tensor_stamp_holds, nothing can have written t's values since through libfsdp (only
 * through a raw pointer taken before that moment). Taking or checking one bumps nothing; a
 * zeroed stamp (FSDP_TENSOR_NO_STAMP) holds for no tensor. The rule behind the bf16 copies an
 * Adam step writes beside its values (dp/low_copy.c's shards, nn/mirror.c's weights). */
typedef struct fsdp_tensor_stamp {
    const void *storage;
    uint64_t gen;
} fsdp_tensor_stamp;
#define FSDP_TENSOR_NO_STAMP ((fsdp_tensor_stamp){NULL, 0})
fsdp_tensor_stamp fsdp_tensor_stamp_of(const fsdp_tensor *t);
bool fsdp_tensor_stamp_holds(fsdp_tensor_stamp s, const fsdp_tensor *t);

/* numel of a shape; -1 when a dim is negative or ndim out of range. */
int64_t fsdp_shape_numel(int ndim, const int64_t *shape);

#endif

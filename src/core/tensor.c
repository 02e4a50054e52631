/* tensor.c: fsdp_tensor: creation, views, resize, copy and fill over reference-counted
 * storage. Contiguous only: a tensor is (storage, element offset, shape). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor_impl.h"

/* The most elements a tensor may have: its byte size must fit an int64_t for any dtype (up to
 * 8 bytes), so element and byte arithmetic on it can never overflow. */
#define MAX_NUMEL (INT64_MAX / 8)

int64_t fsdp_shape_numel(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > FSDP_MAX_DIMS) return -1;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] > 0 && n > MAX_NUMEL / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

static fsdp_status check_shape(fsdp_ctx *ctx, int ndim, const int64_t *shape, const char *what) {
    if (ndim < 0 || ndim > FSDP_MAX_DIMS)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: %d dimensions; tensors have 0 to %d", what, ndim,
                         FSDP_MAX_DIMS);
    if (ndim > 0 && !shape)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: shape is NULL", what);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: dimension %d has negative size %lld", what,
                             i, (long long)shape[i]);
    if (fsdp_shape_numel(ndim, shape) < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: the shape has more than %lld elements (the product of its sizes "
                         "overflows); check the sizes",
                         what, (long long)MAX_NUMEL);
    return FSDP_OK;
}

/* offset + numel (numel >= 0) for messages, saturating at INT64_MAX instead of overflowing. */
static int64_t range_end(int64_t offset, int64_t numel) {
    return offset > 0 && numel > INT64_MAX - offset ? INT64_MAX : offset + numel;
}

/* Whether [offset, offset + numel) lies inside [0, limit), without overflowing. */
static bool range_inside(int64_t offset, int64_t numel, int64_t limit) {
    return offset >= 0 && numel >= 0 && numel <= limit && offset <= limit - numel;
}

static fsdp_status check_dtype_device(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device) {
    if (fsdp_dtype_size(dtype) == 0)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "unknown dtype %d; use FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16 or "
                         "FSDP_DTYPE_I32",
                         (int)dtype);
    return fsdp_device_check(ctx, device);
}

/* A new storage's first write generation: a process-wide count of storages in the high 32 bits,
 * so that a storage made where a freed one lived (the same address) does not repeat its
 * generations for 2^32 hand-outs, and (storage, generation) names one state of one storage. */
static uint64_t first_write_gen(void) {
    static atomic_uint_least64_t storages;
    return (uint64_t)atomic_fetch_add_explicit(&storages, 1, memory_order_relaxed) << 32;
}

/* Zeroed memory unless `uninit` (core/device.h alloc_uninit, where the device has it). */
static fsdp_status storage_new(fsdp_ctx *ctx, size_t nbytes, fsdp_device device, bool uninit,
                               fsdp_storage **out) {
    fsdp_storage *s = calloc(1, sizeof *s);
    if (!s) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a tensor handle");
    const fsdp_device_i *d = fsdp_device_for(device.type);
    fsdp_status (*alloc)(fsdp_ctx *, int, size_t, void **) =
        uninit && d->alloc_uninit ? d->alloc_uninit : d->alloc;
    /* never a NULL data pointer, even for an empty tensor */
    fsdp_status st = alloc(ctx, device.index, nbytes ? nbytes : 1, &s->data);
    if (st != FSDP_OK) {
        free(s);
        return FSDP_PASS(ctx, st);
    }
    s->nbytes = nbytes;
    atomic_init(&s->refs, 1);
    atomic_init(&s->write_gen, first_write_gen());
    s->owned = true;
    s->device = device;
    *out = s;
    return FSDP_OK;
}

/* The storage of tensors without memory: one per device, never freed (refs is not counted). */
#define NO_STORAGE_CUDA_DEVICES 16
#define NO_STORAGE(type, index)                                                                    \
    {                                                                                              \
        .device = {(type), (index) }                                                               \
    }
static fsdp_storage no_storage_cpu = NO_STORAGE(FSDP_DEVICE_CPU, 0);
static fsdp_storage no_storage_cuda[NO_STORAGE_CUDA_DEVICES] = {
    NO_STORAGE(FSDP_DEVICE_CUDA, 0),  NO_STORAGE(FSDP_DEVICE_CUDA, 1),
    NO_STORAGE(FSDP_DEVICE_CUDA, 2),  NO_STORAGE(FSDP_DEVICE_CUDA, 3),
    NO_STORAGE(FSDP_DEVICE_CUDA, 4),  NO_STORAGE(FSDP_DEVICE_CUDA, 5),
    NO_STORAGE(FSDP_DEVICE_CUDA, 6),  NO_STORAGE(FSDP_DEVICE_CUDA, 7),
    NO_STORAGE(FSDP_DEVICE_CUDA, 8),  NO_STORAGE(FSDP_DEVICE_CUDA, 9),
    NO_STORAGE(FSDP_DEVICE_CUDA, 10), NO_STORAGE(FSDP_DEVICE_CUDA, 11),
    NO_STORAGE(FSDP_DEVICE_CUDA, 12), NO_STORAGE(FSDP_DEVICE_CUDA, 13),
    NO_STORAGE(FSDP_DEVICE_CUDA, 14), NO_STORAGE(FSDP_DEVICE_CUDA, 15)};

static bool is_no_storage(const fsdp_storage *s) {
    return s == &no_storage_cpu ||
           (s >= no_storage_cuda && s < no_storage_cuda + NO_STORAGE_CUDA_DEVICES);
}

static fsdp_storage *no_storage_for(fsdp_device d) {
    if (d.type == FSDP_DEVICE_CUDA && d.index >= 0 && d.index < NO_STORAGE_CUDA_DEVICES)
        return &no_storage_cuda[d.index];
    return &no_storage_cpu;
}

static void storage_release(fsdp_storage *s) {
    if (!s || is_no_storage(s) || atomic_fetch_sub(&s->refs, 1) != 1) return;
    if (s->owned)
        fsdp_device_for(s->device.type)->free(s->device.index, s->data);
    else if (s->release)
        s->release(s->release_arg);
    free(s);
}

static void set_shape(fsdp_tensor *t, int ndim, const int64_t *shape) {
    t->ndim = ndim;
    for (int i = 0; i < FSDP_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 0;
    t->numel = fsdp_shape_numel(ndim, shape);
}

static fsdp_status tensor_new(fsdp_ctx *ctx, fsdp_storage *s, int64_t offset, fsdp_dtype dtype,
                              int ndim, const int64_t *shape, fsdp_tensor **out) {
    fsdp_tensor *t = calloc(1, sizeof *t);
    if (!t) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a tensor handle");
    t->storage = s;
    t->offset = offset;
    t->dtype = dtype;
    set_shape(t, ndim, shape);
    *out = t;
    return FSDP_OK;
}

/* After the caller checked its arguments (messages name the public function). */
static fsdp_status create(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device, int ndim,
                          const int64_t *shape, bool uninit, const char *what, fsdp_tensor **out) {
    *out = NULL;
    FSDP_TRY_AT(ctx, check_shape(ctx, ndim, shape, what));
    FSDP_TRY_AT(ctx, check_dtype_device(ctx, dtype, device));
    fsdp_storage *s;
    FSDP_TRY_AT(ctx,
                storage_new(ctx, (size_t)fsdp_shape_numel(ndim, shape) * fsdp_dtype_size(dtype),
                            device, uninit, &s));
    fsdp_status st = tensor_new(ctx, s, 0, dtype, ndim, shape, out);
    if (st != FSDP_OK) storage_release(s);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_tensor_create(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device, int ndim,
                               const int64_t *shape, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_ARG_NOT_NULL(ctx, out);
    return create(ctx, dtype, device, ndim, shape, false, "fsdp_tensor_create", out);
}

fsdp_status fsdp_tensor_create_uninit(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device, int ndim,
                                      const int64_t *shape, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_ARG_NOT_NULL(ctx, out);
    return create(ctx, dtype, device, ndim, shape, true, "fsdp_tensor_create_uninit", out);
}

fsdp_status fsdp_tensor_create_like(fsdp_ctx *ctx, const fsdp_tensor *src, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, src);
    FSDP_ARG_NOT_NULL(ctx, out);
    return fsdp_tensor_create(ctx, src->dtype, src->storage->device, src->ndim, src->shape, out);
}

fsdp_status fsdp_tensor_from_blob(fsdp_ctx *ctx, void *data, fsdp_dtype dtype, fsdp_device device,
                                  int ndim, const int64_t *shape, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    FSDP_TRY_AT(ctx, check_shape(ctx, ndim, shape, "fsdp_tensor_from_blob"));
    FSDP_TRY_AT(ctx, check_dtype_device(ctx, dtype, device));
    int64_t numel = fsdp_shape_numel(ndim, shape);
    if (!data && numel > 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_tensor_from_blob: data is NULL");
    fsdp_storage *s = calloc(1, sizeof *s);
    if (!s) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a tensor handle");
    s->data = data;
    s->nbytes = (size_t)numel * fsdp_dtype_size(dtype);
    atomic_init(&s->refs, 1);
    atomic_init(&s->write_gen, first_write_gen());
    s->owned = false;
    s->device = device;
    fsdp_status st = tensor_new(ctx, s, 0, dtype, ndim, shape, out);
    if (st != FSDP_OK) storage_release(s);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_tensor_over(fsdp_ctx *ctx, void *data, fsdp_dtype dtype, int ndim,
                             const int64_t *shape, fsdp_storage_release_fn release, void *arg,
                             fsdp_tensor **out) {
    FSDP_TRY_AT(ctx, fsdp_tensor_from_blob(ctx, data, dtype, FSDP_CPU, ndim, shape, out));
    (*out)->storage->release = release;
    (*out)->storage->release_arg = arg;
    return FSDP_OK;
}

fsdp_status fsdp_tensor_relocatable(fsdp_ctx *ctx, const fsdp_tensor *t, const char *what) {
    const fsdp_storage *s = t->storage;
    if (s->device.type != FSDP_DEVICE_CPU || !s->owned || is_no_storage(s) || t->offset != 0 ||
        (size_t)t->numel * fsdp_dtype_size(t->dtype) != s->nbytes)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: the tensor must be CPU memory of its own, spanning all of it "
                         "(made by fsdp_tensor_create, not a view or caller memory)",
                         what);
    return FSDP_OK;
}

void fsdp_tensor_relocate(fsdp_tensor *t, void *data, fsdp_storage_release_fn release, void *arg) {
    fsdp_storage *s = t->storage;
    if (s->nbytes) memcpy(data, s->data, s->nbytes);
    fsdp_device_for(s->device.type)->free(s->device.index, s->data);
    s->data = data;
    atomic_fetch_add_explicit(&s->write_gen, 1, memory_order_relaxed);
    s->owned = false;
    s->release = release;
    s->release_arg = arg;
}

/* Whether numel elements starting at `offset` fit in base's storage. */
static bool fits(const fsdp_storage *s, fsdp_dtype dtype, int64_t offset, int64_t numel) {
    return range_inside(offset, numel, (int64_t)(s->nbytes / fsdp_dtype_size(dtype)));
}

fsdp_status fsdp_tensor_view(fsdp_ctx *ctx, const fsdp_tensor *base, int64_t offset, int ndim,
                             const int64_t *shape, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, base);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    FSDP_TRY_AT(ctx, check_shape(ctx, ndim, shape, "fsdp_tensor_view"));
    int64_t numel = fsdp_shape_numel(ndim, shape);
    if (!range_inside(offset, numel, base->numel)) {
        char buf[64];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "fsdp_tensor_view: elements [%lld, %lld) are outside the base tensor %s "
                         "(%lld elements)",
                         (long long)offset, (long long)range_end(offset, numel),
                         fsdp_tensor_shape_string(base, buf, sizeof buf), (long long)base->numel);
    }
    FSDP_TRY_AT(
        ctx, tensor_new(ctx, base->storage, base->offset + offset, base->dtype, ndim, shape, out));
    if (!is_no_storage(base->storage)) atomic_fetch_add(&base->storage->refs, 1);
    return FSDP_OK;
}

fsdp_status fsdp_tensor_rebind(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_tensor *base,
                               int64_t offset) {
    if (base->dtype != t->dtype)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "fsdp_tensor_rebind: dtype %s onto a %s base",
                         fsdp_dtype_to_string(t->dtype), fsdp_dtype_to_string(base->dtype));
    if (!range_inside(offset, t->numel, base->numel))
        return FSDP_FAIL(
            ctx, FSDP_ERR_SHAPE,
            "fsdp_tensor_rebind: elements [%lld, %lld) are outside the base (%lld elements)",
            (long long)offset, (long long)range_end(offset, t->numel), (long long)base->numel);
    if (t->storage == base->storage && t->offset == base->offset + offset) return FSDP_OK;
    if (!is_no_storage(base->storage)) atomic_fetch_add(&base->storage->refs, 1);
    storage_release(t->storage);
    t->storage = base->storage;
    t->offset = base->offset + offset;
    return FSDP_OK;
}

void fsdp_tensor_alias(fsdp_tensor *t, const fsdp_tensor *src) {
    if (t == src) return;
    if (!is_no_storage(src->storage)) atomic_fetch_add(&src->storage->refs, 1);
    storage_release(t->storage);
    t->storage = src->storage;
    t->offset = src->offset;
    t->dtype = src->dtype;
    set_shape(t, src->ndim, src->shape);
}

void fsdp_tensor_release_storage(fsdp_tensor *t) {
    fsdp_storage *none = no_storage_for(t->storage->device);
    storage_release(t->storage);
    t->storage = none;
    t->offset = 0;
}

fsdp_status fsdp_tensor_create_unbound(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device,
                                       int ndim, const int64_t *shape, fsdp_tensor **out) {
    FSDP_TRY_AT(ctx, check_shape(ctx, ndim, shape, "fsdp_tensor_create_unbound"));
    FSDP_TRY_AT(ctx, check_dtype_device(ctx, dtype, device));
    return tensor_new(ctx, no_storage_for(device), 0, dtype, ndim, shape, out);
}

bool fsdp_tensor_has_storage(const fsdp_tensor *t) {
    return !is_no_storage(t->storage);
}

int64_t fsdp_tensor_capacity(const fsdp_tensor *t) {
    return (int64_t)(t->storage->nbytes / fsdp_dtype_size(t->dtype)) - t->offset;
}

/* After the caller checked its arguments (messages name the public function). */
static fsdp_status resize(fsdp_ctx *ctx, fsdp_tensor *t, int ndim, const int64_t *shape,
                          bool uninit) {
    FSDP_TRY_AT(ctx, check_shape(ctx, ndim, shape, "fsdp_tensor_resize"));
    int64_t numel = fsdp_shape_numel(ndim, shape);
    if (fits(t->storage, t->dtype, t->offset, numel)) {
        set_shape(t, ndim, shape);
        return FSDP_OK;
    }
    if (!t->storage->owned || atomic_load(&t->storage->refs) != 1)
        return FSDP_FAIL(
            ctx, FSDP_ERR_STATE,
            "fsdp_tensor_resize: %lld elements do not fit, and the storage is shared or "
            "not owned, so it cannot be reallocated; resize the owner instead",
            (long long)numel);
    fsdp_storage *s;
    FSDP_TRY_AT(ctx, storage_new(ctx, (size_t)numel * fsdp_dtype_size(t->dtype), t->storage->device,
                                 uninit, &s));
    storage_release(t->storage);
    t->storage = s;
    t->offset = 0;
    set_shape(t, ndim, shape);
    return FSDP_OK;
}

fsdp_status fsdp_tensor_resize(fsdp_ctx *ctx, fsdp_tensor *t, int ndim, const int64_t *shape) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    return resize(ctx, t, ndim, shape, false);
}

fsdp_status fsdp_tensor_resize_uninit(fsdp_ctx *ctx, fsdp_tensor *t, int ndim,
                                      const int64_t *shape) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    return resize(ctx, t, ndim, shape, true);
}

fsdp_status fsdp_tensor_move(fsdp_ctx *ctx, fsdp_tensor *t, fsdp_device device) {
    fsdp_device from = t->storage->device;
    if (from.type == device.type && from.index == device.index) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    if (is_no_storage(t->storage))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "moving a tensor to %s:%d: it has no storage (a sharded FSDP parameter); "
                         "move the model before wrapping it",
                         fsdp_device_to_string(device), device.index);
    if (!t->storage->owned || atomic_load(&t->storage->refs) != 1)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "moving a tensor to %s:%d: its storage is shared with other tensors or "
                         "wraps caller memory, which would be left behind; move the model "
                         "before wrapping it with FSDP or replicate",
                         fsdp_device_to_string(device), device.index);
    fsdp_storage *s;
    size_t nbytes = fsdp_tensor_nbytes(t);
    FSDP_TRY_AT(ctx, storage_new(ctx, nbytes, device, true, &s)); // the copy writes it whole
    fsdp_status st = fsdp_device_between(device, from)
                         ->copy(ctx, s->data, device, fsdp_tensor_data(t), from, nbytes);
    if (st != FSDP_OK) {
        storage_release(s);
        return FSDP_PASS(ctx, st);
    }
    storage_release(t->storage);
    t->storage = s;
    t->offset = 0;
    return FSDP_OK;
}

void fsdp_tensor_free(fsdp_tensor *t) {
    if (!t) return;
    storage_release(t->storage);
    free(t);
}

fsdp_dtype fsdp_tensor_dtype(const fsdp_tensor *t) {
    return t->dtype;
}
fsdp_device fsdp_tensor_device(const fsdp_tensor *t) {
    return t->storage->device;
}
int fsdp_tensor_ndim(const fsdp_tensor *t) {
    return t->ndim;
}
const int64_t *fsdp_tensor_shape(const fsdp_tensor *t) {
    return t->shape;
}
int64_t fsdp_tensor_numel(const fsdp_tensor *t) {
    return t->numel;
}
size_t fsdp_tensor_nbytes(const fsdp_tensor *t) {
    return (size_t)t->numel * fsdp_dtype_size(t->dtype);
}

int64_t fsdp_tensor_dim(const fsdp_tensor *t, int dim) {
    if (dim < 0) dim += t->ndim;
    return (dim >= 0 && dim < t->ndim) ? t->shape[dim] : 0;
}

void *fsdp_tensor_data(const fsdp_tensor *t) {
    if (!t->storage->data) return NULL;
    atomic_fetch_add_explicit(&t->storage->write_gen, 1, memory_order_relaxed);
    return (char *)t->storage->data + (size_t)t->offset * fsdp_dtype_size(t->dtype);
}

fsdp_tensor_stamp fsdp_tensor_stamp_of(const fsdp_tensor *t) {
    return (fsdp_tensor_stamp){t->storage,
                               atomic_load_explicit(&t->storage->write_gen, memory_order_relaxed)};
}

bool fsdp_tensor_stamp_holds(fsdp_tensor_stamp s, const fsdp_tensor *t) {
    return s.storage && s.storage == (const void *)t->storage &&
           s.gen == atomic_load_explicit(&t->storage->write_gen, memory_order_relaxed);
}

float *fsdp_tensor_f32(const fsdp_tensor *t) {
    return t->dtype == FSDP_DTYPE_F32 ? (float *)fsdp_tensor_data(t) : NULL;
}

bool fsdp_tensor_same_shape(const fsdp_tensor *a, const fsdp_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *fsdp_shape_string(int ndim, const int64_t *shape, char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && used < size; i++)
        used +=
            (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, ndim == 1 ? ",)" : ")");
    return buf;
}

const char *fsdp_tensor_shape_string(const fsdp_tensor *t, char *buf, size_t size) {
    return fsdp_shape_string(t->ndim, t->shape, buf, size);
}

/* Copies and fills refuse tensors without memory with a message that says why they have none. */
static fsdp_status check_storage(fsdp_ctx *ctx, const fsdp_tensor *t, const char *what) {
    if (!is_no_storage(t->storage) || t->numel == 0) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "%s: the tensor has no storage (a parameter or gradient of an FSDP unit "
                     "while it is sharded); read it inside fsdp_summon_full_params",
                     what);
}

fsdp_status fsdp_tensor_copy(fsdp_ctx *ctx, fsdp_tensor *dst, const fsdp_tensor *src) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, dst);
    FSDP_ARG_NOT_NULL(ctx, src);
    FSDP_TRY_AT(ctx, check_storage(ctx, dst, "fsdp_tensor_copy"));
    FSDP_TRY_AT(ctx, check_storage(ctx, src, "fsdp_tensor_copy"));
    if (dst->numel != src->numel) {
        char a[64], b[64];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "fsdp_tensor_copy: %s into %s: element counts differ",
                         fsdp_tensor_shape_string(src, a, sizeof a),
                         fsdp_tensor_shape_string(dst, b, sizeof b));
    }
    fsdp_device dd = dst->storage->device, sd = src->storage->device;
    bool same_device = dd.type == sd.type && dd.index == sd.index;
    void *d = fsdp_tensor_data(dst);
    const void *s = fsdp_tensor_data(src);
    if (dst->dtype == src->dtype) {
        if (same_device && d == s) return FSDP_OK;
        return fsdp_device_between(dd, sd)->copy(ctx, d, dd, s, sd, fsdp_tensor_nbytes(src));
    }
    if (!same_device)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "fsdp_tensor_copy: a %s tensor on %s into a %s tensor on %s: convert on "
                         "one device, then copy between devices",
                         fsdp_dtype_to_string(src->dtype), fsdp_device_to_string(sd),
                         fsdp_dtype_to_string(dst->dtype), fsdp_device_to_string(dd));
    return fsdp_device_for(dd.type)->convert(ctx, dd.index, d, dst->dtype, s, src->dtype,
                                             src->numel);
}

fsdp_status fsdp_tensor_fill(fsdp_ctx *ctx, fsdp_tensor *t, float value) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_TRY_AT(ctx, check_storage(ctx, t, "fsdp_tensor_fill"));
    fsdp_device dev = t->storage->device;
    if (t->dtype == FSDP_DTYPE_BF16) {
        fsdp_bf16 v = fsdp_bf16_from_f32(value);
        return fsdp_device_for(dev.type)->fill(ctx, dev.index, fsdp_tensor_data(t), &v, sizeof v,
                                               t->numel);
    }
    if (t->dtype == FSDP_DTYPE_F16) {
        fsdp_f16 v = fsdp_f16_from_f32(value);
        return fsdp_device_for(dev.type)->fill(ctx, dev.index, fsdp_tensor_data(t), &v, sizeof v,
                                               t->numel);
    }
    if (t->dtype == FSDP_DTYPE_I32) { /* the value truncated toward zero, as a C cast */
        if (!(value >= (float)INT32_MIN && value < 2147483648.0f))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "fsdp_tensor_fill: %g is not an i32 value", (double)value);
        int32_t v = (int32_t)value;
        return fsdp_device_for(dev.type)->fill(ctx, dev.index, fsdp_tensor_data(t), &v, sizeof v,
                                               t->numel);
    }
    return fsdp_device_for(dev.type)->fill(ctx, dev.index, fsdp_tensor_data(t), &value,
                                           sizeof value, t->numel);
}

/* import.c: a PyTorch state dict (safetensors, HDF5, or a Hugging Face model directory) as a
 * committed checkpoint of one piece per tensor, written through the shard and metadata writers a
 * save uses, one tensor at a time (fsdp_ckpt_import). */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/dir.h"
#include "ckpt/h5.h"
#include "ckpt/import_source.h"
#include "core/error.h"

static const char *const dtype_names[] = {"F32", "F16", "BF16", "F64"};

/* ---- checking the listed tensors ---- */

/* Names are 1..255 printable ASCII bytes without '/', and neither "." nor "..". */
static bool name_ok(const char *n) {
    if (!*n || !strcmp(n, ".") || !strcmp(n, "..")) return false;
    for (; *n; n++)
        if ((unsigned char)*n < 0x21 || (unsigned char)*n > 0x7e || *n == '/') return false;
    return true;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const import_tensor *const *)a)->name,
                  (*(const import_tensor *const *)b)->name);
}

static fsdp_status check_names(fsdp_ctx *ctx, const import_source *src) {
    const import_tensor **order = malloc(((size_t)src->n_tensors + 1) * sizeof *order);
    if (!order) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    fsdp_status s = FSDP_OK;
    for (int i = 0; i < src->n_tensors && s == FSDP_OK; i++) {
        order[i] = &src->tensors[i];
        if (!name_ok(order[i]->name))
            s = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                          "'%s': tensor name '%s' is not allowed (printable ASCII without spaces "
                          "or '/', not \".\" or \"..\"): rename it in the state dict",
                          src->path, order[i]->name);
    }
    if (s == FSDP_OK) qsort(order, (size_t)src->n_tensors, sizeof *order, by_name);
    for (int i = 1; s == FSDP_OK && i < src->n_tensors; i++)
        if (!strcmp(order[i]->name, order[i - 1]->name))
            s = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                          "'%s': two datasets are both named tensor '%s' (a dataset with dots and "
                          "one in nested groups?): keep one",
                          src->path, order[i]->name);
    free(order);
    return FSDP_PASS(ctx, s);
}

/* The dtype tensor t becomes under the policy, or a failure naming it. */
static fsdp_status target_dtype(fsdp_ctx *ctx, const import_source *src, const import_tensor *t,
                                fsdp_ckpt_import_dtype policy, fsdp_dtype *out) {
    if (t->dtype == IMPORT_UNSUPPORTED)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s': tensor '%s' is %s; libfsdp imports floating point tensors (F32, "
                         "F16, BF16, F64): drop it from the state dict (e.g. BatchNorm's "
                         "num_batches_tracked) or save it as float32",
                         src->path, t->name, t->dtype_name);
    if (policy == FSDP_CKPT_IMPORT_KEEP && t->dtype != IMPORT_F32 && t->dtype != IMPORT_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s': tensor '%s' is %s, and keeping dtypes imports only F32 and BF16 "
                         "(libfsdp's dtypes): convert to f32 instead (FSDP_CKPT_IMPORT_TO_F32, "
                         "fsdp-ckpt import --dtype f32)",
                         src->path, t->name, t->dtype_name);
    *out = policy == FSDP_CKPT_IMPORT_KEEP && t->dtype == IMPORT_BF16 ? FSDP_DTYPE_BF16
                                                                      : FSDP_DTYPE_F32;
    return FSDP_OK;
}

/* ---- converting little-endian values in place ---- */

static uint64_t le(const unsigned char *b, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static float f32_of_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return f32_of_bits(sign | 0x7f800000u | (man << 13));
    if (exp) return f32_of_bits(sign | ((exp + 112u) << 23) | (man << 13));
    float f = ldexpf((float)man, -24); /* zero or subnormal */
    return sign ? -f : f;
}

/* buf holds n little-endian values of `from`; rewrites them as `to` (native f32, or bf16 as
 * native uint16). Widening runs backwards and narrowing forwards, so values are read before
 * they are overwritten. FSDP_ERR_INVALID_ARGUMENT for an F64 value beyond f32's range. */
static fsdp_status convert(fsdp_ctx *ctx, const import_source *src, const import_tensor *t,
                           void *buf, fsdp_dtype to) {
    unsigned char *b = buf;
    float *f = buf;
    int64_t n = t->numel;
    switch (t->dtype) {
    case IMPORT_F32:
        for (int64_t i = 0; i < n; i++) f[i] = f32_of_bits((uint32_t)le(b + 4 * i, 4));
        break;
    case IMPORT_F16:
        for (int64_t i = n - 1; i >= 0; i--) f[i] = half_to_float((uint16_t)le(b + 2 * i, 2));
        break;
    case IMPORT_BF16:
        if (to == FSDP_DTYPE_BF16)
            for (int64_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = (uint16_t)le(b + 2 * i, 2);
        else
            for (int64_t i = n - 1; i >= 0; i--)
                f[i] = f32_of_bits((uint32_t)le(b + 2 * i, 2) << 16);
        break;
    case IMPORT_F64:
        for (int64_t i = 0; i < n; i++) {
            uint64_t bits = le(b + 8 * i, 8);
            double d;
            memcpy(&d, &bits, 8);
            if (isfinite(d) && fabs(d) > FLT_MAX)
                return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                                 "'%s': tensor '%s' (F64) holds %g at element %lld, beyond f32's "
                                 "range: scale it before saving",
                                 src->path, t->name, d, (long long)i);
            f[i] = (float)d;
        }
        break;
    default:
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "import: unsupported dtype converted");
    }
    return FSDP_OK;
}

/* ---- writing the checkpoint ---- */

/* Tensor i read, converted and written as piece 0 of the shard. Memory: the tensor once, in
 * the larger of its file dtype and its checkpoint dtype. */
static fsdp_status import_tensor_values(fsdp_ctx *ctx, import_source *src, int i, ckpt_meta *m,
                                        ckpt_shard_writer *sw) {
    const import_tensor *t = &src->tensors[i];
    const ckpt_tensor *x = &m->tensors[i];
    size_t in = import_dtype_size(t->dtype), out = fsdp_dtype_size(x->dtype);
    void *buf = malloc((size_t)t->numel * (in > out ? in : out) + 1);
    if (!buf) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "importing tensor '%s'", t->name);
    fsdp_status s = src->iface->read(ctx, src, i, buf);
    if (s == FSDP_OK) s = convert(ctx, src, t, buf, x->dtype);
    if (s == FSDP_OK) s = h5_lock(ctx);
    if (s == FSDP_OK) {
        s = ckpt_shard_put(ctx, sw, x->name, 0, x->dtype, &m->pieces[i].box, buf,
                           &m->pieces[i].digest);
        h5_unlock();
    }
    free(buf);
    return FSDP_PASS(ctx, s);
}

/* The metadata of the imported checkpoint: one tensor and one whole piece per source tensor,
 * in rank 0's file. Names point into src. */
static fsdp_status describe(fsdp_ctx *ctx, const import_source *src,
                            const fsdp_ckpt_import_options *o, ckpt_meta *m) {
    m->step = o->step;
    m->world_size = 1;
    m->id = ckpt_id_new();
    m->layout = (char *)"imported";
    m->config = (char *)"";
    m->model_config = src->model_config;
    m->tensors = calloc((size_t)src->n_tensors + 1, sizeof *m->tensors);
    m->pieces = calloc((size_t)src->n_tensors + 1, sizeof *m->pieces);
    if (!m->tensors || !m->pieces) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    m->n_tensors = m->n_pieces = src->n_tensors;
    for (int i = 0; i < src->n_tensors; i++) {
        const import_tensor *t = &src->tensors[i];
        ckpt_tensor *x = &m->tensors[i];
        *x = (ckpt_tensor){.name = (char *)t->name, .kind = FSDP_STATE_PARAM, .ndim = t->ndim};
        FSDP_TRY_AT(ctx, target_dtype(ctx, src, t, o->dtype, &x->dtype));
        memcpy(x->shape, t->shape, sizeof x->shape);
        m->pieces[i] = (ckpt_piece){.tensor = i, .box = {.ndim = t->ndim}};
        memcpy(m->pieces[i].box.count, t->shape, sizeof t->shape);
    }
    return FSDP_OK;
}

static fsdp_status write_checkpoint(fsdp_ctx *ctx, import_source *src, const char *dir,
                                    const fsdp_ckpt_import_options *o) {
    ckpt_meta m = {0};
    fsdp_status s = describe(ctx, src, o, &m);
    char tmp[4096], final[4096];
    snprintf(final, sizeof final, "%s/step-%08lld", dir, (long long)o->step);
    snprintf(tmp, sizeof tmp, "%s/.step-%08lld.tmp", dir, (long long)o->step);
    bool made = false;
    if (s == FSDP_OK) made = (s = ckpt_dir_begin(ctx, dir, tmp)) == FSDP_OK;
    ckpt_shard_writer sw;
    if (s == FSDP_OK) s = h5_lock(ctx);
    if (s == FSDP_OK) {
        s = ckpt_shard_create(ctx, tmp, 0, o->zstd_level, m.id, &sw);
        h5_unlock();
    }
    if (s == FSDP_OK) {
        int converted = 0;
        for (int i = 0; s == FSDP_OK && i < src->n_tensors; i++) {
            s = import_tensor_values(ctx, src, i, &m, &sw);
            if (s == FSDP_OK && src->tensors[i].dtype != IMPORT_F32 &&
                m.tensors[i].dtype == FSDP_DTYPE_F32) {
                fsdp_log(ctx, FSDP_LOG_INFO, "import '%s': tensor '%s' converted from %s to f32",
                         src->path, src->tensors[i].name, dtype_names[src->tensors[i].dtype]);
                converted++;
            }
        }
        fsdp_status locked = h5_lock(ctx); /* not taken: the file stays open */
        if (locked == FSDP_OK) {
            s = ckpt_shard_close(ctx, &sw, s);
            h5_unlock();
        } else if (s == FSDP_OK) {
            s = locked;
        }
        if (s == FSDP_OK) s = ckpt_sync_path(ctx, sw.path);
        if (s == FSDP_OK && converted)
            fsdp_log(ctx, FSDP_LOG_WARN,
                     "import '%s': %d of %d tensors converted to f32 (from F16, BF16 or F64)",
                     src->path, converted, src->n_tensors);
    }
    if (s == FSDP_OK) s = ckpt_meta_write(ctx, tmp, &m);
    if (s == FSDP_OK) s = ckpt_dir_commit(ctx, tmp, final, dir, 0);
    if (s != FSDP_OK && made) ckpt_dir_remove(tmp);
    free(m.tensors);
    free(m.pieces);
    return FSDP_PASS(ctx, s);
}

/* Whether the file starts with the HDF5 signature (else it is read as safetensors). */
static bool is_hdf5(const char *path) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    bool yes = f && fread(head, 1, 8, f) == 8 && !memcmp(head, sig, 8);
    if (f) fclose(f);
    return yes;
}

static fsdp_status check_options(fsdp_ctx *ctx, const fsdp_ckpt_import_options *o) {
    if (o->step < 0 || o->step > 99999999)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "import: step %lld is outside [0, 99999999]", (long long)o->step);
    if (o->dtype != FSDP_CKPT_IMPORT_TO_F32 && o->dtype != FSDP_CKPT_IMPORT_KEEP)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "import: dtype policy %d; use FSDP_CKPT_IMPORT_TO_F32 or "
                         "FSDP_CKPT_IMPORT_KEEP",
                         (int)o->dtype);
    if (o->zstd_level != FSDP_CKPT_NO_COMPRESSION && (o->zstd_level < 0 || o->zstd_level > 19))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "import: zstd_level %d; use 1..19, 0 for the default (3), or "
                         "FSDP_CKPT_NO_COMPRESSION",
                         o->zstd_level);
    return FSDP_OK;
}

fsdp_status fsdp_ckpt_import(fsdp_ctx *ctx, const char *src_path, const char *dir,
                             const fsdp_ckpt_import_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, src_path);
    FSDP_ARG_NOT_NULL(ctx, dir);
    if (!*dir)
        return FSDP_FAIL(
            ctx, FSDP_ERR_INVALID_ARGUMENT,
            "fsdp_ckpt_import: the directory is empty; name where the checkpoint goes");
    if (strlen(dir) > 3000)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "import: directory path too long");
    fsdp_ckpt_import_options o = opts ? *opts : (fsdp_ckpt_import_options){0};
    FSDP_TRY_AT(ctx, check_options(ctx, &o));
    import_source src;
    struct stat sb;
    bool dir_src = stat(src_path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (!dir_src) FSDP_TRY_AT(ctx, ckpt_check_regular(ctx, src_path)); /* before is_hdf5 opens it */
    fsdp_status s = dir_src             ? import_open_hf_dir(ctx, src_path, &src)
                    : is_hdf5(src_path) ? import_open_h5(ctx, src_path, &src)
                                        : import_open_safetensors(ctx, src_path, &src);
    if (s == FSDP_OK) s = check_names(ctx, &src);
    if (s == FSDP_OK) s = write_checkpoint(ctx, &src, dir, &o);
    src.iface->close(&src);
    free(src.tensors);
    return FSDP_PASS(ctx, s);
}

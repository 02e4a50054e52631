/* safetensors.c: reading a safetensors file (an 8-byte little-endian header length, a JSON
 * header parsed with jansson, then the data) for fsdp_ckpt_import. Nothing in the file is
 * trusted: the header length, every dtype, shape and byte range is checked before use, and
 * the byte ranges must tile the data section up to the end of the file. */
#define _POSIX_C_SOURCE 200809L /* fseeko, ftello */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/import_source.h"
#include "core/error.h"

/* The largest header read, as the safetensors library bounds it. */
#define ST_MAX_HEADER 100000000ull

static const struct {
    const char *name;
    import_dtype dtype;
} st_dtypes[] = {
    {"F32", IMPORT_F32},
    {"F16", IMPORT_F16},
    {"BF16", IMPORT_BF16},
    {"F64", IMPORT_F64},
    {"I64", IMPORT_UNSUPPORTED},
    {"I32", IMPORT_UNSUPPORTED},
    {"I16", IMPORT_UNSUPPORTED},
    {"I8", IMPORT_UNSUPPORTED},
    {"U64", IMPORT_UNSUPPORTED},
    {"U32", IMPORT_UNSUPPORTED},
    {"U16", IMPORT_UNSUPPORTED},
    {"U8", IMPORT_UNSUPPORTED},
    {"BOOL", IMPORT_UNSUPPORTED},
    {"F8_E4M3", IMPORT_UNSUPPORTED},
    {"F8_E5M2", IMPORT_UNSUPPORTED},
};

static fsdp_status corrupt(fsdp_ctx *ctx, const char *path, const char *what) {
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "'%s' is not a valid safetensors file: %s; write it again with "
                     "safetensors.torch.save_file",
                     path, what);
}

static fsdp_status bad_tensor(fsdp_ctx *ctx, const char *path, const char *name, const char *what) {
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "'%s' is not a valid safetensors file: tensor '%s': %s; write it again with "
                     "safetensors.torch.save_file",
                     path, name, what);
}

/* The dtype, shape and byte range of one header entry into *t (name already set). */
static fsdp_status parse_entry(fsdp_ctx *ctx, const char *path, json_t *v, uint64_t data_len,
                               import_tensor *t) {
    const char *n = t->name;
    if (!json_is_object(v)) return bad_tensor(ctx, path, n, "its entry is not a JSON object");
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return bad_tensor(ctx, path, n,
                          "needs \"dtype\" (a string), \"shape\" and "
                          "\"data_offsets\" (arrays)");
    const char *dname = json_string_value(dt);
    size_t k = 0, nd = sizeof st_dtypes / sizeof st_dtypes[0];
    while (k < nd && strcmp(st_dtypes[k].name, dname)) k++;
    if (k == nd)
        return FSDP_FAIL(
            ctx, FSDP_ERR_UNSUPPORTED,
            "'%s': tensor '%s' has dtype \"%.15s\", which is not a safetensors dtype libfsdp "
            "knows (F64, F32, F16, BF16, integers, BOOL, F8): save it as float32",
            path, n, dname);
    t->dtype = st_dtypes[k].dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", st_dtypes[k].name);
    if (json_array_size(sh) > FSDP_MAX_DIMS)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s': tensor '%s' has %zu dimensions; libfsdp tensors have at most %d",
                         path, n, json_array_size(sh), FSDP_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        json_int_t len = json_is_integer(x) ? json_integer_value(x) : -1;
        if (len < 0 || (len && t->numel > (INT64_MAX / 8) / len))
            return bad_tensor(ctx, path, n,
                              "a dimension is not an integer >= 0, or the shape "
                              "overflows");
        t->shape[d] = len;
        t->numel *= len;
    }
    json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
    if (json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(e) ||
        json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b))
        return bad_tensor(ctx, path, n,
                          "\"data_offsets\" is not [begin, end] with 0 <= begin "
                          "<= end");
    t->begin = (uint64_t)json_integer_value(b);
    t->end = (uint64_t)json_integer_value(e);
    char msg[200];
    if (t->end > data_len) {
        snprintf(
            msg, sizeof msg,
            "bytes [%llu, %llu) run past the end of the data (%llu bytes: the file is truncated?)",
            (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_len);
        return bad_tensor(ctx, path, n, msg);
    }
    if (t->dtype != IMPORT_UNSUPPORTED &&
        t->end - t->begin != (uint64_t)t->numel * import_dtype_size(t->dtype)) {
        snprintf(msg, sizeof msg, "holds %llu bytes but its shape and dtype %s take %llu",
                 (unsigned long long)(t->end - t->begin), t->dtype_name,
                 (unsigned long long)((uint64_t)t->numel * import_dtype_size(t->dtype)));
        return bad_tensor(ctx, path, n, msg);
    }
    return FSDP_OK;
}

static int by_range(const void *a, const void *b) {
    const import_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The byte ranges, sorted, must tile [0, data_len). */
static fsdp_status check_tiling(fsdp_ctx *ctx, const char *path, import_tensor *t, int n,
                                uint64_t data_len) {
    qsort(t, (size_t)n, sizeof *t, by_range);
    uint64_t at = 0;
    char msg[FSDP_STATE_NAME_MAX + 128];
    for (int i = 0; i < n; i++) {
        if (t[i].begin < at) {
            snprintf(msg, sizeof msg, "its bytes [%llu, %llu) overlap tensor '%s'",
                     (unsigned long long)t[i].begin, (unsigned long long)t[i].end, t[i - 1].name);
            return bad_tensor(ctx, path, t[i].name, msg);
        }
        if (t[i].begin > at) {
            snprintf(msg, sizeof msg, "data bytes [%llu, %llu) belong to no tensor",
                     (unsigned long long)at, (unsigned long long)t[i].begin);
            return corrupt(ctx, path, msg);
        }
        at = t[i].end;
    }
    if (at != data_len) {
        snprintf(msg, sizeof msg,
                 "the tensors end at data byte %llu but the file has %llu data bytes "
                 "(truncated, or bytes appended)",
                 (unsigned long long)at, (unsigned long long)data_len);
        return corrupt(ctx, path, msg);
    }
    return FSDP_OK;
}

/* The header's entries (all but "__metadata__") into src->tensors, checked. */
static fsdp_status parse_header(fsdp_ctx *ctx, import_source *src, const char *text, size_t len,
                                uint64_t data_len) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    char msg[320];
    if (!root) {
        snprintf(msg, sizeof msg, "its header is not valid JSON (%s, at byte %d)", err.text,
                 err.position);
        return corrupt(ctx, src->path, msg);
    }
    fsdp_status s = FSDP_OK;
    if (!json_is_object(root)) s = corrupt(ctx, src->path, "its header is not a JSON object");
    size_t n = s == FSDP_OK ? json_object_size(root) : 0;
    src->tensors = calloc(n + 1, sizeof *src->tensors);
    if (s == FSDP_OK && !src->tensors) s = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (s != FSDP_OK) break;
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v))
                s = corrupt(ctx, src->path, "\"__metadata__\" is not an object");
            continue;
        }
        import_tensor *t = &src->tensors[src->n_tensors++];
        if (strlen(key) >= sizeof t->name) {
            snprintf(msg, sizeof msg, "a tensor name of %zu bytes (at most %d)", strlen(key),
                     FSDP_STATE_NAME_MAX - 1);
            s = corrupt(ctx, src->path, msg);
            break;
        }
        snprintf(t->name, sizeof t->name, "%s", key);
        s = parse_entry(ctx, src->path, v, data_len, t);
    }
    json_decref(root);
    if (s == FSDP_OK) s = check_tiling(ctx, src->path, src->tensors, src->n_tensors, data_len);
    return FSDP_PASS(ctx, s);
}

static fsdp_status st_read(fsdp_ctx *ctx, import_source *src, int i, void *dst) {
    const import_tensor *t = &src->tensors[i];
    size_t bytes = (size_t)(t->end - t->begin);
    if (fseeko(src->file, (off_t)(src->data_start + t->begin), SEEK_SET) != 0 ||
        fread(dst, 1, bytes, src->file) != bytes)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "'%s': cannot read tensor '%s' (the file changed or is unreadable)",
                         src->path, t->name);
    return FSDP_OK;
}

static void st_close(import_source *src) {
    if (src->file) fclose(src->file);
    src->file = NULL;
}

static const import_source_i st_iface = {.read = st_read, .close = st_close};

fsdp_status import_open_safetensors(fsdp_ctx *ctx, const char *path, import_source *out) {
    *out = (import_source){.iface = &st_iface, .path = path, .h5 = -1};
    FSDP_TRY_AT(ctx, ckpt_check_regular(ctx, path));
    if (!(out->file = fopen(path, "rb")))
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot open '%s': check the path", path);
    unsigned char n8[8];
    off_t size = -1;
    if (fseeko(out->file, 0, SEEK_END) == 0) size = ftello(out->file);
    if (size < 8 || fseeko(out->file, 0, SEEK_SET) != 0 || fread(n8, 1, 8, out->file) != 8)
        return corrupt(ctx, path, "shorter than its 8-byte header length");
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)n8[i] << (8 * i);
    char msg[200];
    if (len < 2 || len > ST_MAX_HEADER || len > (uint64_t)size - 8) {
        snprintf(msg, sizeof msg,
                 "its header length %llu is not in [2, %llu] (the file has %lld "
                 "bytes after the length)",
                 (unsigned long long)len,
                 (unsigned long long)((uint64_t)size - 8 < ST_MAX_HEADER ? (uint64_t)size - 8
                                                                         : ST_MAX_HEADER),
                 (long long)size - 8);
        return corrupt(ctx, path, msg);
    }
    char *text = malloc((size_t)len);
    if (!text) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "the header of '%s'", path);
    fsdp_status s = FSDP_OK;
    if (fread(text, 1, (size_t)len, out->file) != (size_t)len)
        s = corrupt(ctx, path, "cannot read its header");
    else if (text[0] != '{')
        s = corrupt(ctx, path, "its header does not start with '{'");
    out->data_start = 8 + len;
    if (s == FSDP_OK) s = parse_header(ctx, out, text, (size_t)len, (uint64_t)size - 8 - len);
    free(text);
    return FSDP_PASS(ctx, s);
}

/* fixture.c: the reader of the PyTorch reference fixtures (tests/fixtures/README.md). The
 * whole file is read into memory and parsed with bounds checks; every field is decoded
 * byte by byte as little-endian, so the reader also works on a big-endian host. */
#include "fixture.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE_MAGIC     "FSDPFX01"
#define FIXTURE_MAGIC_LEN 8
#define FIXTURE_MAX_NAME  4096
#define FIXTURE_MAX_FILE  (64L * 1024 * 1024)
/* The smallest tensor record: name length, a 1-byte name, dtype, ndim 0, one value. */
#define FIXTURE_MIN_RECORD 17

#ifndef FSDP_FIXTURE_DIR
#define FSDP_FIXTURE_DIR "tests/fixtures"
#endif

static char g_last_error[FIXTURE_MAX_NAME + 512];

/* Prints a message (one line) on stderr and keeps it for fixture_last_error. */
__attribute__((format(printf, 1, 2))) static void report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", g_last_error);
}

const char *fixture_last_error(void) {
    return g_last_error;
}

/* A cursor over the file's bytes; the first failure prints and sets failed. */
typedef struct reader {
    const char *path;
    const unsigned char *buf;
    size_t size, pos;
    bool failed;
} reader;

static void reader_fail(reader *r, const char *what) {
    if (!r->failed) report("fixture %s: %s (at byte %zu of %zu)", r->path, what, r->pos, r->size);
    r->failed = true;
}

/* Claims n bytes at the cursor; NULL (and a message naming `what`) past the end. */
static const unsigned char *reader_take(reader *r, size_t n, const char *what) {
    if (r->failed) return NULL;
    if (n > r->size - r->pos) {
        char msg[160];
        snprintf(msg, sizeof msg, "truncated: %s needs %zu bytes, %zu left", what, n,
                 r->size - r->pos);
        reader_fail(r, msg);
        return NULL;
    }
    const unsigned char *p = r->buf + r->pos;
    r->pos += n;
    return p;
}

static uint32_t le_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le_u64(const unsigned char *p) {
    return (uint64_t)le_u32(p) | (uint64_t)le_u32(p + 4) << 32;
}

static uint32_t reader_u32(reader *r, const char *what) {
    const unsigned char *p = reader_take(r, 4, what);
    return p ? le_u32(p) : 0;
}

static int64_t reader_i64(reader *r, const char *what) {
    const unsigned char *p = reader_take(r, 8, what);
    return p ? (int64_t)le_u64(p) : 0;
}

/* Reads the whole file; NULL with a message on failure. */
static unsigned char *read_file(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        report("fixture %s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    unsigned char *buf = NULL;
    long len = -1;
    if (fseek(fp, 0, SEEK_END) == 0) len = ftell(fp);
    if (len < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        report("fixture %s: cannot determine the file size", path);
    } else if (len > FIXTURE_MAX_FILE) {
        report("fixture %s: %ld bytes, more than a fixture may hold (%ld)", path, len,
               FIXTURE_MAX_FILE);
    } else if (!(buf = malloc(len > 0 ? (size_t)len : 1))) {
        report("fixture %s: out of memory for %ld bytes", path, len);
    } else if (fread(buf, 1, (size_t)len, fp) != (size_t)len) {
        report("fixture %s: read error", path);
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *size = len > 0 ? (size_t)len : 0;
    return buf;
}

static void tensor_clear(fixture_tensor *t) {
    free(t->name);
    free(t->data);
    memset(t, 0, sizeof *t);
}

static int read_name(reader *r, fixture_tensor *t) {
    uint32_t len = reader_u32(r, "name length");
    if (r->failed) return 1;
    if (len == 0 || len > FIXTURE_MAX_NAME) {
        char msg[96];
        snprintf(msg, sizeof msg, "name length %u is outside 1..%d", len, FIXTURE_MAX_NAME);
        reader_fail(r, msg);
        return 1;
    }
    const unsigned char *p = reader_take(r, len, "name");
    if (!p) return 1;
    if (memchr(p, '\0', len)) {
        reader_fail(r, "name contains a NUL byte");
        return 1;
    }
    if (!(t->name = malloc((size_t)len + 1))) {
        reader_fail(r, "out of memory");
        return 1;
    }
    memcpy(t->name, p, len);
    t->name[len] = '\0';
    return 0;
}

/* dtype, ndim and shape; sets numel. */
static int read_header(reader *r, fixture_tensor *t) {
    char msg[FIXTURE_MAX_NAME + 128];
    uint32_t dtype = reader_u32(r, "dtype");
    uint32_t ndim = reader_u32(r, "ndim");
    if (r->failed) return 1;
    if (dtype != FIXTURE_F32 && dtype != FIXTURE_I32 && dtype != FIXTURE_F64) {
        snprintf(msg, sizeof msg, "tensor '%s': unknown dtype %u (0 = f32, 1 = i32, 2 = f64)",
                 t->name, dtype);
        reader_fail(r, msg);
        return 1;
    }
    if (ndim > FIXTURE_MAX_DIMS) {
        snprintf(msg, sizeof msg, "tensor '%s': ndim %u is over %d", t->name, ndim,
                 FIXTURE_MAX_DIMS);
        reader_fail(r, msg);
        return 1;
    }
    t->dtype = (int)dtype;
    t->ndim = (int)ndim;
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = reader_i64(r, "shape");
        if (r->failed) return 1;
        /* Each dim and the product stay below 2^40 elements: no overflow, and far more
         * than the file could hold anyway (checked against the bytes left next). */
        if (t->shape[d] < 0 || t->shape[d] > ((int64_t)1 << 40) ||
            (t->shape[d] > 0 && t->numel > ((int64_t)1 << 40) / t->shape[d])) {
            snprintf(msg, sizeof msg, "tensor '%s': bad size %lld in dim %d", t->name,
                     (long long)t->shape[d], d);
            reader_fail(r, msg);
            return 1;
        }
        t->numel *= t->shape[d];
    }
    return 0;
}

static int read_data(reader *r, fixture_tensor *t) {
    size_t n = (size_t)t->numel, es = t->dtype == FIXTURE_F64 ? 8 : 4;
    if (n > (r->size - r->pos) / es) {
        char msg[FIXTURE_MAX_NAME + 128];
        snprintf(msg, sizeof msg, "truncated: the data of tensor '%s' needs %lld bytes, %zu left",
                 t->name, (long long)(t->numel * (int64_t)es), r->size - r->pos);
        reader_fail(r, msg);
        return 1;
    }
    const unsigned char *p = reader_take(r, n * es, "data");
    if (!(t->data = malloc(n > 0 ? n * es : 1))) {
        reader_fail(r, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++) { /* little-endian words into host order; same bits */
        if (es == 8) {
            uint64_t word = le_u64(p + 8 * i);
            memcpy((double *)t->data + i, &word, sizeof word);
        } else {
            uint32_t word = le_u32(p + 4 * i);
            memcpy((uint32_t *)t->data + i, &word, sizeof word);
        }
    }
    return 0;
}

static int read_tensor(reader *r, fixture *f, fixture_tensor *t) {
    if (read_name(r, t)) return 1;
    if (fixture_get(f, t->name)) {
        char msg[FIXTURE_MAX_NAME + 64];
        snprintf(msg, sizeof msg, "tensor '%s' appears twice", t->name);
        reader_fail(r, msg);
        return 1;
    }
    if (read_header(r, t) || read_data(r, t)) return 1;
    return 0;
}

/* Reads one record into t; on failure t is left empty. */
static int read_record(reader *r, fixture *f, fixture_tensor *t) {
    if (read_tensor(r, f, t) == 0) return 0;
    tensor_clear(t);
    return 1;
}

static int parse(reader *r, fixture *f) {
    const unsigned char *magic = reader_take(r, FIXTURE_MAGIC_LEN, "magic");
    if (!magic) return 1;
    if (memcmp(magic, FIXTURE_MAGIC, FIXTURE_MAGIC_LEN) != 0) {
        r->pos = 0;
        reader_fail(r, "bad magic: not a fixture file (expected \"" FIXTURE_MAGIC "\")");
        return 1;
    }
    uint32_t count = reader_u32(r, "tensor count");
    if (r->failed) return 1;
    if (count > (r->size - r->pos) / FIXTURE_MIN_RECORD) {
        char msg[128];
        snprintf(msg, sizeof msg, "truncated or corrupt: %u tensors cannot fit in %zu bytes", count,
                 r->size - r->pos);
        reader_fail(r, msg);
        return 1;
    }
    if (count > 0 && !(f->tensors = calloc(count, sizeof *f->tensors))) {
        reader_fail(r, "out of memory");
        return 1;
    }
    for (uint32_t i = 0; i < count; i++) {
        if (read_record(r, f, &f->tensors[i])) return 1;
        f->n = (int)i + 1;
    }
    if (r->pos != r->size) {
        char msg[96];
        snprintf(msg, sizeof msg, "%zu bytes of trailing garbage after the last tensor",
                 r->size - r->pos);
        reader_fail(r, msg);
        return 1;
    }
    return 0;
}

int fixture_load(const char *path, fixture *out) {
    if (!out) return 1;
    memset(out, 0, sizeof *out);
    g_last_error[0] = '\0';
    if (!path) {
        report("fixture: no path given");
        return 1;
    }
    size_t size = 0;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return 1;
    reader r = {.path = path, .buf = buf, .size = size};
    int rc = parse(&r, out);
    free(buf);
    if (rc) fixture_free(out);
    return rc;
}

int fixture_load_named(const char *name, fixture *out) {
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/%s.bin", FSDP_FIXTURE_DIR, name);
    if (len < 0 || (size_t)len >= sizeof path) {
        if (out) memset(out, 0, sizeof *out);
        report("fixture %s: path too long", name);
        return 1;
    }
    return fixture_load(path, out);
}

void fixture_free(fixture *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) tensor_clear(&f->tensors[i]);
    free(f->tensors);
    f->tensors = NULL;
    f->n = 0;
}

const fixture_tensor *fixture_get(const fixture *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++)
        if (f->tensors[i].name && strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const fixture_tensor *fixture_require(const fixture *f, const char *name, fixture_dtype dtype) {
    const fixture_tensor *t = fixture_get(f, name);
    if (!t) {
        report("fixture: no tensor '%s'", name);
        return NULL;
    }
    if (t->dtype != (int)dtype) {
        report("fixture: tensor '%s' has dtype %d, wanted %d", name, t->dtype, (int)dtype);
        return NULL;
    }
    return t;
}

const char *fixture_shape_string(const fixture_tensor *t, char *buf, size_t size) {
    size_t used = 0;
    if (size == 0) return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < t->ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld",
                                 (long long)t->shape[d]);
    if (used < size) snprintf(buf + used, size - used, ")");
    return buf;
}

bool fixture_shape_equal(const fixture_tensor *t, const fsdp_tensor *x) {
    if (!t || !x || fsdp_tensor_ndim(x) != t->ndim) return false;
    const int64_t *shape = fsdp_tensor_shape(x);
    for (int d = 0; d < t->ndim; d++)
        if (shape[d] != t->shape[d]) return false;
    return true;
}

fsdp_tensor *fixture_to_tensor(fsdp_ctx *ctx, const fixture_tensor *t) {
    if (!t || t->dtype != FIXTURE_F32) {
        report("fixture_to_tensor: %s is not an f32 fixture tensor", t ? t->name : "(null)");
        return NULL;
    }
    fsdp_tensor *x = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, t->ndim, t->shape, &x);
    if (st != FSDP_OK) {
        report("fixture_to_tensor: %s: %s", t->name, fsdp_last_error(ctx));
        return NULL;
    }
    if (t->numel > 0) memcpy(fsdp_tensor_f32(x), t->data, (size_t)t->numel * sizeof(float));
    return x;
}

int fixture_copy_into(fsdp_ctx *ctx, const fixture_tensor *t, fsdp_tensor *dst) {
    if (!t || !dst) return 1;
    if (!fixture_shape_equal(t, dst)) {
        char want[96], got[96];
        report("fixture_copy_into: %s: fixture shape %s, tensor shape %s", t->name,
               fixture_shape_string(t, want, sizeof want),
               fsdp_tensor_shape_string(dst, got, sizeof got));
        return 1;
    }
    fsdp_tensor *src = fixture_to_tensor(ctx, t);
    if (!src) return 1;
    fsdp_status st = fsdp_tensor_copy(ctx, dst, src);
    if (st != FSDP_OK) report("fixture_copy_into: %s: %s", t->name, fsdp_last_error(ctx));
    fsdp_tensor_free(src);
    return st != FSDP_OK;
}

static bool has_grad(const fixture *f, const char *name) {
    char key[FIXTURE_MAX_NAME + 8];
    int len = snprintf(key, sizeof key, "grad.%s", name);
    return len > 0 && (size_t)len < sizeof key && fixture_get(f, key) != NULL;
}

int fixture_num_params(const fixture *f) {
    int n = 0;
    for (int i = 0; f && i < f->n; i++) n += has_grad(f, f->tensors[i].name);
    return n;
}

const fixture_tensor *fixture_param(const fixture *f, int i) {
    for (int k = 0; f && k < f->n; k++)
        if (has_grad(f, f->tensors[k].name) && i-- == 0) return &f->tensors[k];
    return NULL;
}

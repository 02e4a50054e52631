/* fuzz_ckpt_reader.c: a structure-aware fuzz target over the checkpoint reader. An input is a
 * program of mutations applied to a small valid checkpoint (metadata attributes and tables,
 * the header and piece digests, names, shard dataset shapes, types and names, zstd frames and
 * filter parameters, shard ids and ranks, missing or truncated files, and optionally raw byte
 * flips); the result is written as a checkpoint and
 * goes through latest, open, the inspect enumeration, verify (every piece read) and load into a
 * model. Built as a libFuzzer target (FSDP_LIBFUZZER) or with its own driver:
 *   fuzz_ckpt_reader [--iterations N] [--seconds S] [--seed X] [--raw PERCENT] [--verbose]
 *                    [FILE...]
 * runs N seeded random programs (or for S seconds; raw byte flips in PERCENT of them), printing
 * each refusal with --verbose, or replays the given inputs. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup, truncate */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "ckpt/bind.h"
#include "ckpt/ckpt_impl.h"
#include "ckpt/h5.h"
#include "ckpt/zstd_filter.h"
#include "core/clock.h"
#include "fsdp/fsdp.h"

#define MAX_ROWS  128
#define MAX_COLS  16
#define MAX_DS    64
#define MAX_BYTES 8192
#define READ_CAP  ((int64_t)1 << 24) /* bytes: larger reads are skipped, not failures */
#define WORLD     2                  /* shard files of the base checkpoint */
#define N_ATTRS   7
#define N_BLOBS   4
#define N_TABLES  5
#define MAX_OPS   12

/* ---- the checkpoint as values ---- */

enum { A_FORMAT, A_VERSION, A_LIBVER, A_STEP, A_OPTIM, A_WORLD, A_ID };
static const char *const attr_names[N_ATTRS] = {"format",    "format_version", "library_version",
                                                "step",      "optim_steps",    "world_size",
                                                CKPT_ID_ATTR};
enum { B_NAMES, B_EXTRA_NAMES, B_LAYOUT, B_CONFIG };
static const char *const blob_names[N_BLOBS] = {"names", "extra_names", "layout", "config"};
enum { T_TENSORS, T_PIECES, T_EXTRAS, T_HEADER, T_DIGESTS };
static const char *const table_names[N_TABLES] = {"tensors", "pieces", "extra_values", "header",
                                                  "piece_digests"};

typedef struct attr {
    bool present;
    int form; /* 0 as written by libfsdp, 1 the other type (string / integer), 2 a 1-d array */
    int64_t i;
    char s[160];
} attr;

typedef struct blob {
    bool present;
    int form; /* 0 uint8 1-d, 1 int64 1-d, 2 uint8 2-d */
    size_t len;
    unsigned char b[MAX_BYTES];
} blob;

typedef struct table {
    bool present;
    int form; /* 0 int64 2-d, 1 int32 2-d, 2 int64 1-d, 3 declared `rows` with no data */
    int64_t rows, cols, declared;
    int64_t v[MAX_ROWS * MAX_COLS];
} table;

/* A piece dataset of a shard file. */
typedef struct dset {
    bool present;
    int file;
    char path[320];
    int type;  /* 0 f32, 1 u16, 2 i32, 3 f64, 4 u8 */
    int store; /* 0 zstd + Fletcher32, 1 contiguous, 2 zstd frames written directly, 3 unwritten */
    int ndim;
    int64_t dims[FSDP_MAX_DIMS];
    int64_t chunk[FSDP_MAX_DIMS]; /* 0: whole dims */
    unsigned char *data;          /* numel x type size, when written */
    int cd_mode, frame_mode;
    uint32_t frame_arg;
} dset;

typedef struct spec {
    attr attrs[N_ATTRS];
    blob blobs[N_BLOBS];
    table tables[N_TABLES];
    dset ds[MAX_DS];
    int n_ds;
    bool commit;
    int file_mode[WORLD + 1]; /* 0 as written, 1 missing, 2 truncated, 3 empty */
    uint32_t file_arg[WORLD + 1];
    int shard_bind[WORLD]; /* 0 as written, 1 another id, 2 no id, 3 another rank, 4 neither */
    int n_raw;
    struct {
        int file;
        uint32_t at;
        unsigned char x;
    } raw[8];
} spec;

static size_t type_size(int type) {
    static const size_t sizes[] = {4, 2, 4, 8, 1};
    return sizes[type];
}
static hid_t file_type(int type) {
    hid_t t[] = {H5T_IEEE_F32LE, H5T_STD_U16LE, H5T_STD_I32LE, H5T_IEEE_F64LE, H5T_STD_U8LE};
    return t[type];
}
static hid_t mem_type(int type) {
    hid_t t[] = {H5T_NATIVE_FLOAT, H5T_NATIVE_UINT16, H5T_NATIVE_INT32, H5T_NATIVE_DOUBLE,
                 H5T_NATIVE_UINT8};
    return t[type];
}

/* ---- globals: the base, the model to load into, the scratch directory ---- */

static struct {
    fsdp_ctx *ctx;
    fsdp_module *model;
    fsdp_optimizer *opt;
    fsdp_state *state;
    spec base;
    char root[256], dir[320];
    int raw_percent;
    bool verbose;
    long opened, loaded, verified;
} g;

static void spec_free(spec *s) {
    for (int i = 0; i < s->n_ds; i++) free(s->ds[i].data);
    s->n_ds = 0;
}

static void spec_copy(spec *dst, const spec *src) {
    *dst = *src;
    for (int i = 0; i < src->n_ds; i++) {
        const dset *d = &src->ds[i];
        int64_t n = 1;
        for (int k = 0; k < d->ndim; k++) n *= d->dims[k];
        size_t bytes = d->data ? (size_t)n * type_size(d->type) : 0;
        dst->ds[i].data = bytes ? malloc(bytes) : NULL;
        if (bytes) memcpy(dst->ds[i].data, d->data, bytes);
    }
}

/* The base: every state entry of the model as a tensor split along dim 0 into two pieces, one
 * per shard file (one piece in file 0 when it has fewer than two rows). */
static void add_piece(spec *s, int t, const char *name, int file, int id, int ndim,
                      const int64_t *off, const int64_t *cnt, const unsigned char *values,
                      size_t elem) {
    table *p = &s->tables[T_PIECES], *dig = &s->tables[T_DIGESTS];
    int64_t *row = p->v + p->rows++ * CKPT_PIECE_COLS;
    row[0] = t, row[1] = file, row[2] = id;
    for (int d = 0; d < ndim; d++) row[3 + d] = off[d], row[7 + d] = cnt[d];
    dset *ds = &s->ds[s->n_ds++];
    *ds = (dset){.present = true, .file = file, .type = elem == 2 ? 1 : 0, .ndim = ndim};
    snprintf(ds->path, sizeof ds->path, "%s/%d", name, id);
    int64_t n = 1, inner = 1;
    for (int d = 0; d < ndim; d++) n *= ds->dims[d] = cnt[d];
    for (int d = 1; d < ndim; d++) inner *= cnt[d];
    ds->data = malloc((size_t)n * elem + 1);
    memcpy(ds->data, values + (size_t)(ndim ? off[0] * inner : 0) * elem, (size_t)n * elem);
    ckpt_digest d;
    ckpt_digest_init(&d);
    ckpt_digest_values(&d, ds->data, (size_t)n, elem);
    dig->v[dig->rows++] = (int64_t)ckpt_digest_final(&d);
}

static const ckpt_id base_id = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};

static void make_base(spec *s) {
    memset(s, 0, sizeof *s);
    for (int a = 0; a < N_ATTRS; a++) s->attrs[a].present = true;
    snprintf(s->attrs[A_FORMAT].s, sizeof s->attrs[A_FORMAT].s, "%s", CKPT_FORMAT_NAME);
    snprintf(s->attrs[A_LIBVER].s, sizeof s->attrs[A_LIBVER].s, "%s", FSDP_VERSION_STRING);
    s->attrs[A_VERSION].i = FSDP_CKPT_FORMAT_VERSION;
    s->attrs[A_STEP].i = 7, s->attrs[A_OPTIM].i = 0, s->attrs[A_WORLD].i = WORLD;
    ckpt_id_format(base_id, s->attrs[A_ID].s);
    s->tables[T_HEADER] = (table){
        .present = true,
        .rows = 1,
        .cols = CKPT_HEADER_COLS,
        .v = {FSDP_CKPT_FORMAT_VERSION, 7, 0, WORLD, (int64_t)base_id.hi, (int64_t)base_id.lo}};
    s->tables[T_DIGESTS] = (table){.present = true, .cols = 1};
    for (int b = 0; b < N_BLOBS; b++) s->blobs[b].present = true;
    memcpy(s->blobs[B_LAYOUT].b, "1x1 fuzz", s->blobs[B_LAYOUT].len = 8);
    memcpy(s->blobs[B_CONFIG].b, "[model]\nkind = mlp\n", s->blobs[B_CONFIG].len = 19);
    memcpy(s->blobs[B_EXTRA_NAMES].b, "data_pos\0seed", s->blobs[B_EXTRA_NAMES].len = 14);
    s->tables[T_EXTRAS] = (table){.present = true, .rows = 2, .cols = 1, .v = {12, 5}};
    s->tables[T_TENSORS] = (table){.present = true, .cols = CKPT_TENSOR_COLS};
    s->tables[T_PIECES] = (table){.present = true, .cols = CKPT_PIECE_COLS};
    s->commit = true;
    blob *names = &s->blobs[B_NAMES];
    for (int i = 0; i < fsdp_state_num_entries(g.state); i++) {
        fsdp_state_entry e;
        fsdp_state_entry_get(g.ctx, g.state, i, &e);
        size_t elem = fsdp_dtype_size(e.dtype), len = strlen(e.name) + 1;
        int64_t n = 1, off[FSDP_MAX_DIMS] = {0}, cnt[FSDP_MAX_DIMS];
        for (int d = 0; d < e.ndim; d++) n *= cnt[d] = e.shape[d];
        unsigned char *v = malloc((size_t)n * elem + 1);
        if (e.n_regions == 1) fsdp_state_read_region(g.ctx, g.state, i, 0, v);
        int64_t *row = s->tables[T_TENSORS].v + s->tables[T_TENSORS].rows++ * CKPT_TENSOR_COLS;
        row[0] = e.kind, row[1] = e.dtype, row[2] = e.ndim;
        for (int d = 0; d < e.ndim; d++) row[3 + d] = e.shape[d];
        memcpy(names->b + names->len, e.name, len);
        names->len += len;
        if (e.ndim >= 1 && e.shape[0] >= 2) {
            int64_t half = e.shape[0] / 2;
            cnt[0] = half;
            add_piece(s, i, e.name, 0, 0, e.ndim, off, cnt, v, elem);
            off[0] = half, cnt[0] = e.shape[0] - half;
            add_piece(s, i, e.name, 1, 1, e.ndim, off, cnt, v, elem);
        } else {
            add_piece(s, i, e.name, 0, 0, e.ndim, off, cnt, v, elem);
        }
        free(v);
    }
}

/* ---- the input as a stream of choices ---- */

typedef struct input {
    const uint8_t *p;
    size_t n, at;
} input;

static unsigned u8(input *in) {
    return in->at < in->n ? in->p[in->at++] : 0;
}
static uint32_t u32(input *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | u8(in);
    return v;
}

/* A value that tends to break checks: small, boundary, huge, negative, or near `cur`. */
static int64_t pick(input *in, int64_t cur) {
    static const int64_t special[] = {0,
                                      1,
                                      -1,
                                      2,
                                      3,
                                      4,
                                      5,
                                      7,
                                      8,
                                      16,
                                      63,
                                      64,
                                      255,
                                      256,
                                      4096,
                                      65535,
                                      (int64_t)1 << 20,
                                      (int64_t)1 << 24,
                                      (int64_t)1 << 28,
                                      INT32_MAX,
                                      (int64_t)INT32_MAX + 1,
                                      (int64_t)1 << 32,
                                      (int64_t)1 << 40,
                                      INT64_MAX / 8,
                                      INT64_MAX / 8 + 1,
                                      INT64_MAX / 2,
                                      INT64_MAX,
                                      INT64_MIN,
                                      INT64_MIN + 1,
                                      INT32_MIN};
    unsigned c = u8(in);
    if (c < 128) return special[c % (sizeof special / sizeof special[0])];
    return (int64_t)((uint64_t)cur + (c % 17) - 8); /* wraps, as a damaged file would */
}

static void mutate_bytes(input *in, blob *b) {
    unsigned op = u8(in) % 7;
    size_t at = b->len ? u8(in) % b->len : 0;
    switch (op) {
    case 0:
        if (b->len) b->b[at] ^= (unsigned char)(1u << (u8(in) % 8));
        break;
    case 1:
        if (b->len) b->b[at] = 0;
        break;
    case 2:
        if (b->len) memmove(b->b + at, b->b + at + 1, b->len - at - 1), b->len--;
        break;
    case 3:
        b->len = at;
        break;
    case 4: /* a long name */
    {
        size_t add = 200 + u8(in) % 120;
        if (b->len + add < MAX_BYTES) memset(b->b + b->len, 'a', add), b->len += add;
        break;
    }
    case 5:
        if (b->len + 1 < MAX_BYTES) b->b[b->len++] = (unsigned char)u8(in);
        break;
    default:
        if (b->len) b->b[at] = '\0', b->b[b->len - 1] = 'x';
        break;
    }
}

static void mutate_table(input *in, table *t) {
    unsigned op = u8(in) % 8;
    switch (op) {
    case 0:
    case 1:
    case 2: /* a cell */
        if (t->rows && t->cols) {
            int64_t *c = &t->v[(u8(in) % t->rows) * t->cols + u8(in) % t->cols];
            *c = pick(in, *c);
        }
        break;
    case 3:
        if (t->rows) t->rows--;
        break;
    case 4: /* duplicate a row */
        if (t->rows && t->rows < MAX_ROWS)
            memcpy(t->v + t->rows * t->cols, t->v + (u8(in) % t->rows) * t->cols,
                   (size_t)t->cols * sizeof *t->v),
                t->rows++;
        break;
    case 5: /* a column more or less (rows stay row-major with the new width) */
        if (u8(in) % 2 && t->cols > 1)
            t->cols--;
        else if (t->cols < MAX_COLS && (t->rows + 1) * (t->cols + 1) <= MAX_ROWS * MAX_COLS)
            t->cols++;
        break;
    case 6:
        t->form = (int)(u8(in) % 4), t->declared = pick(in, t->rows);
        break;
    default:
        t->rows = 0;
        break;
    }
}

static void mutate_attr(input *in, attr *a) {
    unsigned op = u8(in) % 5;
    if (op == 0)
        a->present = false;
    else if (op == 1)
        a->form = (int)(u8(in) % 3);
    else if (op == 2)
        a->i = pick(in, a->i);
    else if (op == 3)
        snprintf(a->s, sizeof a->s, "%.*s", (int)(u8(in) % 100),
                 "libfsdp-checkpointlibfsdp-checkpointlibfsdp-checkpointlibfsdp-checkpointlibfsdp-"
                 "checkpointlibfsdp-checkpoint");
    else
        a->s[u8(in) % 20] ^= 1;
}

static void mutate_dset(input *in, spec *s) {
    if (!s->n_ds) return;
    dset *d = &s->ds[u8(in) % s->n_ds];
    unsigned op = u8(in) % 9;
    switch (op) {
    case 0:
        d->present = false;
        break;
    case 1:
        d->file = (int)(u8(in) % (WORLD + 1));
        break;
    case 2:
        d->path[u8(in) % strlen(d->path)] ^= 1;
        break;
    case 3:
        d->type = (int)(u8(in) % 5);
        free(d->data);
        d->data = NULL;
        d->store = 3;
        break;
    case 4: /* other dims: unwritten (the reader must not trust them to size anything) */
        if (d->ndim)
            d->dims[u8(in) % d->ndim] = pick(in, d->dims[0]);
        else
            d->ndim = 1, d->dims[0] = pick(in, 1);
        free(d->data), d->data = NULL, d->store = 3;
        break;
    case 5:
        d->store = 1;
        break;
    case 6: /* chunk dims */
        for (int k = 0; k < d->ndim; k++) d->chunk[k] = 1 + u8(in) % 4;
        break;
    default: /* zstd frames written directly, damaged in one chunk, or the filter's parameters */
        d->store = 2, d->cd_mode = (int)(u8(in) % 6), d->frame_mode = (int)(u8(in) % 8);
        d->frame_arg = u32(in);
        break;
    }
}

/* Applies the program in `in` to s. */
static void mutate(input *in, spec *s) {
    for (int ops = 0; ops < MAX_OPS && in->at < in->n; ops++) {
        unsigned op = u8(in) % 10;
        switch (op) {
        case 0:
            mutate_attr(in, &s->attrs[u8(in) % N_ATTRS]);
            break;
        case 1:
        case 2:
            mutate_table(in, &s->tables[u8(in) % N_TABLES]);
            break;
        case 3: {
            blob *b = &s->blobs[u8(in) % N_BLOBS];
            if (u8(in) % 8 == 0)
                b->present = false;
            else if (u8(in) % 8 == 0)
                b->form = (int)(u8(in) % 3);
            else
                mutate_bytes(in, b);
            break;
        }
        case 4:
        case 5:
        case 6:
            mutate_dset(in, s);
            break;
        case 7: {
            int f = (int)(u8(in) % (WORLD + 1));
            s->file_mode[f] = (int)(u8(in) % 4), s->file_arg[f] = u32(in);
            break;
        }
        case 8: {
            unsigned c = u8(in) % 16;
            if (c == 5) s->commit = false;
            if (c >= 12) s->shard_bind[u8(in) % WORLD] = 1 + (int)(c - 12);
            break;
        }
        default:
            if (s->n_raw < 8 && g.raw_percent > 0) {
                s->raw[s->n_raw].file = (int)(u8(in) % (WORLD + 1));
                s->raw[s->n_raw].at = u32(in);
                s->raw[s->n_raw++].x = (unsigned char)(1 + u8(in) % 255);
            }
            break;
        }
    }
}

/* ---- writing the spec as HDF5 files ---- */

static hid_t plain_space(int ndim, const int64_t *dims) {
    hsize_t h[FSDP_MAX_DIMS + 1];
    for (int d = 0; d < ndim; d++) h[d] = (hsize_t)dims[d];
    return ndim ? H5Screate_simple(ndim, h, NULL) : H5Screate(H5S_SCALAR);
}

static void write_attr(hid_t f, const char *name, const attr *a, bool is_int) {
    if (!a->present) return;
    bool as_int = is_int != (a->form == 1);
    hid_t space = a->form == 2 ? H5Screate_simple(1, (hsize_t[]){2}, NULL) : H5Screate(H5S_SCALAR);
    hid_t type = as_int ? H5Tcopy(H5T_STD_I64LE) : H5Tcopy(H5T_C_S1);
    if (!as_int) H5Tset_size(type, strlen(a->s) + 1);
    hid_t at = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (at >= 0) {
        int64_t iv[2] = {a->i, a->i};
        if (!as_int) {
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, strlen(a->s) + 1);
            char buf[2 * 161];
            memcpy(buf, a->s, strlen(a->s) + 1);
            memcpy(buf + strlen(a->s) + 1, a->s, strlen(a->s) + 1);
            H5Awrite(at, mt, buf);
            H5Tclose(mt);
        } else {
            H5Awrite(at, H5T_NATIVE_INT64, iv);
        }
        H5Aclose(at);
    }
    H5Tclose(type);
    H5Sclose(space);
}

static void write_raw(hid_t f, const char *name, hid_t ftype, hid_t mtype, int ndim,
                      const int64_t *dims, const void *data, bool written) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    bool empty = false;
    for (int d = 0; d < ndim; d++) empty |= dims[d] <= 0;
    if (!written && ndim > 0 && !empty) { /* chunked, never written: only its shape exists */
        hsize_t ch[FSDP_MAX_DIMS];
        for (int d = 0; d < ndim; d++) ch[d] = 1;
        H5Pset_chunk(dcpl, ndim, ch);
    }
    hid_t space = plain_space(ndim, dims);
    hid_t ds = space >= 0 ? H5Dcreate2(f, name, ftype, space, lcpl, dcpl, H5P_DEFAULT) : -1;
    if (ds >= 0 && written && data) H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    if (ds >= 0) H5Dclose(ds);
    if (space >= 0) H5Sclose(space);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
}

static void write_table(hid_t f, const char *name, const table *t) {
    if (!t->present) return;
    int64_t dims[2] = {t->rows, t->cols}, flat = t->rows * t->cols;
    if (t->form == 0) {
        h5_write_table(g.ctx, f, name, t->rows, (int)t->cols, t->v);
    } else if (t->form == 1) {
        int32_t v32[MAX_ROWS * MAX_COLS];
        for (int64_t i = 0; i < flat; i++) v32[i] = (int32_t)t->v[i];
        write_raw(f, name, H5T_STD_I32LE, H5T_NATIVE_INT32, 2, dims, v32, true);
    } else if (t->form == 2) {
        write_raw(f, name, H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &flat, t->v, true);
    } else {
        int64_t d[2] = {t->declared, t->cols};
        write_raw(f, name, H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d, NULL, false);
    }
}

static void write_blob(hid_t f, const char *name, const blob *b) {
    if (!b->present) return;
    int64_t n = (int64_t)b->len;
    if (b->form == 0) {
        h5_write_bytes(g.ctx, f, name, b->b, b->len);
    } else if (b->form == 1) {
        int64_t *w = malloc((size_t)n * 8 + 8);
        for (int64_t i = 0; i < n; i++) w[i] = b->b[i];
        write_raw(f, name, H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &n, w, true);
        free(w);
    } else {
        int64_t d[2] = {1, n};
        write_raw(f, name, H5T_STD_U8LE, H5T_NATIVE_UINT8, 2, d, b->b, true);
    }
}

static void write_metadata(const spec *s) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", g.dir, CKPT_METADATA);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return;
    for (int a = 0; a < N_ATTRS; a++)
        write_attr(f, attr_names[a], &s->attrs[a], a != A_FORMAT && a != A_LIBVER && a != A_ID);
    for (int b = 0; b < N_BLOBS; b++) write_blob(f, blob_names[b], &s->blobs[b]);
    for (int t = 0; t < N_TABLES; t++) write_table(f, table_names[t], &s->tables[t]);
    H5Fclose(f);
}

/* One zstd frame of `n` bytes of src, with or without its content size. */
static size_t frame(const void *src, size_t n, bool content_size, void *dst, size_t cap) {
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, content_size);
    size_t got = ZSTD_compress2(c, dst, cap, src, n);
    ZSTD_freeCCtx(c);
    return ZSTD_isError(got) ? 0 : got;
}

/* The chunk at grid position `at` (chunk dims ch) of d's values, zero-padded at the edges. */
static void chunk_values(const dset *d, const hsize_t *ch, const hsize_t *at, unsigned char *out) {
    size_t elem = type_size(d->type), inner = 1;
    for (int k = 0; k < d->ndim; k++) inner *= ch[k];
    memset(out, 0, inner * elem);
    for (size_t i = 0; i < inner; i++) {
        size_t rem = i, src = 0;
        bool inside = true;
        for (int k = d->ndim - 1; k >= 0; k--) {
            hsize_t c = at[k] + rem % ch[k];
            rem /= ch[k];
            inside &= c < (hsize_t)d->dims[k];
        }
        if (!inside) continue;
        rem = i;
        size_t stride = 1;
        for (int k = d->ndim - 1; k >= 0; k--) {
            src += (size_t)(at[k] + rem % ch[k]) * stride;
            stride *= (size_t)d->dims[k];
            rem /= ch[k];
        }
        memcpy(out + i * elem, d->data + src * elem, elem);
    }
}

/* The filter's parameters after cd_mode, and the frame of one chunk after frame_mode. */
static void write_frames(hid_t ds, const dset *d, const hsize_t *ch, size_t chunk_bytes) {
    hsize_t at[FSDP_MAX_DIMS] = {0};
    unsigned char *raw = malloc(chunk_bytes + 64), *alt = malloc(2 * chunk_bytes + 64);
    size_t cap = ZSTD_compressBound(2 * chunk_bytes + 64);
    unsigned char *z = malloc(cap + 64);
    for (int index = 0;; index++) {
        chunk_values(d, ch, at, raw);
        bool damaged = index == (int)(d->frame_arg % 4);
        size_t n = frame(raw, chunk_bytes, true, z, cap), cut = d->frame_arg >> 8;
        if (damaged) {
            switch (d->frame_mode) {
            case 1:
                if (n) z[cut % n] ^= (unsigned char)(1 + d->frame_arg % 255);
                break;
            case 2:
                n = n ? cut % n : 0;
                break;
            case 3:
                memset(z + n, 0xa5, 1 + cut % 32), n += 1 + cut % 32;
                break;
            case 4: { /* a frame of another size */
                size_t other = d->frame_arg % 2 ? chunk_bytes / 2 : chunk_bytes + 1 + cut % 64;
                memset(alt, 7, other);
                n = frame(alt, other, true, z, cap);
                break;
            }
            case 5:
                n = frame(raw, chunk_bytes, false, z, cap);
                break;
            case 6:
                n = 1, z[0] = 0;
                break;
            case 7: /* the frame's recorded content size rewritten (header byte) */
                if (n > 6) z[5 + cut % 2] ^= 0x40;
                break;
            default:
                break;
            }
        }
        hsize_t off[FSDP_MAX_DIMS];
        for (int k = 0; k < d->ndim; k++) off[k] = at[k];
        H5Dwrite_chunk(ds, H5P_DEFAULT, 0, off, n ? n : 1, z);
        int k = d->ndim - 1;
        for (; k >= 0; k--) {
            at[k] += ch[k];
            if (at[k] < (hsize_t)d->dims[k]) break;
            at[k] = 0;
        }
        if (k < 0) break;
    }
    free(raw);
    free(alt);
    free(z);
}

static void write_dset(hid_t f, const dset *d) {
    if (!d->present) return;
    if (d->store == 3 || !d->data) {
        write_raw(f, d->path, file_type(d->type), mem_type(d->type), d->ndim, d->dims, NULL, false);
        return;
    }
    int64_t n = 1;
    for (int k = 0; k < d->ndim; k++) n *= d->dims[k];
    if (d->store == 1 || d->ndim == 0 || n == 0) {
        write_raw(f, d->path, file_type(d->type), mem_type(d->type), d->ndim, d->dims, d->data,
                  true);
        return;
    }
    hsize_t dims[FSDP_MAX_DIMS], ch[FSDP_MAX_DIMS];
    size_t chunk_bytes = type_size(d->type);
    for (int k = 0; k < d->ndim; k++) {
        dims[k] = (hsize_t)d->dims[k];
        ch[k] = d->chunk[k] ? (hsize_t)d->chunk[k] : dims[k];
        chunk_bytes *= ch[k];
    }
    unsigned cd[2] = {3, (unsigned)chunk_bytes};
    size_t ncd = 2;
    if (d->store == 2) {
        switch (d->cd_mode) {
        case 1:
            ncd = 1;
            break;
        case 2:
            cd[1] += 4;
            break;
        case 3:
            cd[1] = d->frame_arg;
            break;
        case 4:
            ncd = 0;
            break;
        case 5:
            cd[0] = (unsigned)-200;
            break;
        default:
            break;
        }
    }
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    H5Pset_chunk(dcpl, d->ndim, ch);
    H5Pset_filter(dcpl, FSDP_H5Z_ZSTD, H5Z_FLAG_MANDATORY, ncd, cd);
    if (d->store == 0) H5Pset_fletcher32(dcpl);
    hid_t space = H5Screate_simple(d->ndim, dims, NULL);
    hid_t ds = H5Dcreate2(f, d->path, file_type(d->type), space, lcpl, dcpl, H5P_DEFAULT);
    if (ds >= 0 && d->store == 0)
        H5Dwrite(ds, mem_type(d->type), H5S_ALL, H5S_ALL, H5P_DEFAULT, d->data);
    else if (ds >= 0)
        write_frames(ds, d, ch, chunk_bytes);
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
}

static void file_path(int file, char *buf, size_t size) {
    if (file == WORLD)
        snprintf(buf, size, "%s/%s", g.dir, CKPT_METADATA);
    else
        ckpt_shard_path(g.dir, file, buf, size);
}

/* Writes s as the checkpoint g.dir (the previous one removed). */
static void write_spec(const spec *s) {
    char path[400];
    for (int r = 0; r <= WORLD; r++) {
        file_path(r, path, sizeof path);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/%s", g.dir, CKPT_COMMIT);
    unlink(path);
    (void)h5_lock(NULL); /* no world: waits as long as it takes */
    write_metadata(s);
    for (int r = 0; r < WORLD; r++) {
        ckpt_shard_path(g.dir, r, path, sizeof path);
        hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        int mode = s->shard_bind[r];
        ckpt_id id = mode == 1 ? (ckpt_id){base_id.hi, base_id.lo + 1} : base_id;
        if (f >= 0 && (mode == 0 || mode == 1 || mode == 3)) {
            char text[CKPT_ID_CHARS + 1];
            ckpt_id_format(id, text);
            h5_attr_write_str(g.ctx, f, CKPT_ID_ATTR, text);
        }
        if (f >= 0 && mode != 4) h5_attr_write_i64(g.ctx, f, CKPT_RANK_ATTR, mode == 3 ? r + 1 : r);
        for (int i = 0; f >= 0 && i < s->n_ds; i++)
            if (s->ds[i].file == r) write_dset(f, &s->ds[i]);
        if (f >= 0) H5Fclose(f);
    }
    H5Eclear2(H5E_DEFAULT);
    h5_unlock();
    for (int r = 0; r <= WORLD; r++) {
        file_path(r, path, sizeof path);
        struct stat sb;
        long size = stat(path, &sb) == 0 ? (long)sb.st_size : 0;
        if (s->file_mode[r] == 1) unlink(path);
        if (s->file_mode[r] == 2 && size) (void)!truncate(path, (off_t)(s->file_arg[r] % size));
        if (s->file_mode[r] == 3) (void)!truncate(path, 0);
    }
    for (int i = 0; i < s->n_raw; i++) {
        file_path(s->raw[i].file, path, sizeof path);
        FILE *fp = fopen(path, "r+b");
        if (!fp) continue;
        fseek(fp, 0, SEEK_END);
        long size = ftell(fp);
        if (size > 0) {
            fseek(fp, (long)(s->raw[i].at % (uint32_t)size), SEEK_SET);
            int c = fgetc(fp);
            fseek(fp, (long)(s->raw[i].at % (uint32_t)size), SEEK_SET);
            fputc((c ^ s->raw[i].x) & 0xff, fp);
        }
        fclose(fp);
    }
    if (s->commit) {
        snprintf(path, sizeof path, "%s/%s", g.dir, CKPT_COMMIT);
        FILE *fp = fopen(path, "w");
        if (fp) fclose(fp);
    }
}

/* ---- the reader, as inspect, verify and a resume use it ---- */

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* Reads `r` of tensor t when it is small enough to hold. */
static void read_region(fsdp_ckpt *ck, int t, const fsdp_ckpt_tensor *x,
                        const fsdp_state_region *r) {
    int64_t bytes = numel_of(r->ndim, r->count) * (int64_t)fsdp_dtype_size(x->dtype);
    if (bytes > READ_CAP) return;
    void *buf = malloc((size_t)bytes + 1);
    if (buf && fsdp_ckpt_read(g.ctx, ck, t, r, buf) == FSDP_OK) g.verified++;
    free(buf);
}

static void run_reader(void) {
    fsdp_ctx *ctx = g.ctx;
    char *latest = NULL;
    if (fsdp_ckpt_latest(ctx, g.root, &latest) == FSDP_OK) free(latest);
    fsdp_ckpt *ck = NULL;
    if (fsdp_ckpt_open(ctx, g.dir, &ck) != FSDP_OK) {
        if (!*fsdp_last_error(ctx)) abort(); /* a failure always says why */
        if (g.verbose) printf("open: %s\n", fsdp_last_error(ctx));
        return;
    }
    g.opened++;
    (void)fsdp_ckpt_step(ck), (void)fsdp_ckpt_world_size(ck), (void)fsdp_ckpt_optim_steps(ck);
    (void)strlen(fsdp_ckpt_layout(ck)), (void)strlen(fsdp_ckpt_config(ck));
    (void)strlen(fsdp_ckpt_library_version(ck));
    int64_t v;
    (void)fsdp_ckpt_extra(ctx, ck, "data_pos", &v);
    for (int t = 0; t < fsdp_ckpt_num_tensors(ck); t++) {
        fsdp_ckpt_tensor x;
        if (fsdp_ckpt_tensor_get(ctx, ck, t, &x) != FSDP_OK) abort();
        if (fsdp_ckpt_find(ck, x.name) < 0 || strlen(x.name) >= FSDP_STATE_NAME_MAX) abort();
        for (int k = 0; k < x.n_pieces; k++) {
            fsdp_ckpt_piece p;
            int64_t stored;
            if (fsdp_ckpt_piece_get(ctx, ck, t, k, &p) != FSDP_OK) abort();
            (void)fsdp_ckpt_piece_stored_bytes(ctx, ck, t, k, &stored);
            read_region(ck, t, &x, &p.region);
        }
        fsdp_state_region all = {.ndim = x.ndim}, mid = {.ndim = x.ndim};
        for (int d = 0; d < x.ndim; d++) {
            all.count[d] = x.shape[d];
            mid.offset[d] = x.shape[d] / 3, mid.count[d] = x.shape[d] / 2;
        }
        read_region(ck, t, &x, &all);
        read_region(ck, t, &x, &mid);
    }
    if (fsdp_ckpt_load(ctx, ck, g.state, NULL) == FSDP_OK)
        g.loaded++;
    else if (g.verbose)
        printf("load: %s\n", fsdp_last_error(ctx));
    (void)fsdp_ckpt_load(ctx, ck, g.state, &(fsdp_ckpt_load_options){.non_strict = true});
    fsdp_ckpt_close(ck);
}

/* ---- one input ---- */

static void run_one(const uint8_t *data, size_t size) {
    spec s;
    spec_copy(&s, &g.base);
    input in = {.p = data, .n = size};
    mutate(&in, &s);
    write_spec(&s);
    spec_free(&s);
    run_reader();
}

static int setup(void) {
    /* quiet: a mutated format version makes every other input warn about format 1 */
    if (fsdp_ctx_create(&(fsdp_ctx_options){.log_level = FSDP_LOG_ERROR}, &g.ctx) != FSDP_OK)
        return 1;
    fsdp_ctx *ctx = g.ctx;
    if (fsdp_model_mlp_stacked(ctx, 1, &g.model) != FSDP_OK ||
        fsdp_adam_create(ctx, g.model, &(fsdp_adam_options){.lr = 1e-2}, &g.opt) != FSDP_OK ||
        fsdp_state_create(ctx, &(fsdp_state_sources){.model = g.model, .optimizer = g.opt},
                          &g.state) != FSDP_OK)
        return fprintf(stderr, "fuzz_ckpt_reader: %s\n", fsdp_last_error(ctx)), 1;
    const char *tmp = getenv("TMPDIR");
    snprintf(g.root, sizeof g.root, "%s/fsdp-fuzz-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g.root)) return 1;
    snprintf(g.dir, sizeof g.dir, "%s/step-00000007", g.root);
    if (mkdir(g.dir, 0755) != 0) return 1;
    /* Filter 32015 as libfsdp registers it, then without its set_local, so that the fuzzer's
     * datasets keep the parameters it gives them (the filter function is libfsdp's). */
    if (fsdp_zstd_filter_register(ctx) != FSDP_OK) return 1;
    H5Zregister(&fsdp_zstd_filter_class);
    make_base(&g.base);
    /* The unmutated base must read and load cleanly, or the fuzzer tests nothing. */
    run_one(NULL, 0);
    if (g.opened != 1 || g.loaded != 1)
        return fprintf(stderr, "fuzz_ckpt_reader: the base checkpoint does not load: %s\n",
                       fsdp_last_error(ctx)),
               1;
    return 0;
}

static void teardown(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g.root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g.root);
    spec_free(&g.base);
    fsdp_state_free(g.state);
    fsdp_optimizer_free(g.opt);
    fsdp_module_free(g.model);
    fsdp_ctx_free(g.ctx);
}

#ifdef FSDP_LIBFUZZER

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *raw = getenv("FSDP_FUZZ_RAW");
    g.raw_percent = raw ? atoi(raw) : 0;
    if (setup() != 0) abort();
    atexit(teardown);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run_one(data, size);
    return 0;
}

#else

static uint64_t next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int replay(const char *file) {
    FILE *f = fopen(file, "rb");
    if (!f) return fprintf(stderr, "cannot read %s\n", file), 1;
    uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    run_one(buf, n);
    printf("%s: ok\n", file);
    return 0;
}

int main(int argc, char **argv) {
    long iterations = 300;
    double limit = 0;
    uint64_t seed = 1;
    int first_file = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
            iterations = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            limit = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--raw") && i + 1 < argc)
            g.raw_percent = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--verbose"))
            g.verbose = true;
        else if (argv[i][0] == '-')
            return fprintf(stderr, "usage: see the file's header\n"), 2;
        else if (first_file == argc)
            first_file = i;
    }
    if (setup() != 0) return 1;
    int rc = 0;
    if (first_file < argc) {
        for (int i = first_file; i < argc && rc == 0; i++) rc = replay(argv[i]);
        teardown();
        return rc;
    }
    double start = fsdp_clock_now();
    uint64_t rng = seed;
    long n = 0;
    uint8_t buf[96];
    for (; limit > 0 ? fsdp_clock_now() - start < limit : n < iterations; n++) {
        size_t len = 1 + next(&rng) % sizeof buf;
        for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)next(&rng);
        /* Raw byte flips (op 9) only in raw_percent of the inputs. */
        bool raw = (int)(next(&rng) % 100) < g.raw_percent;
        for (size_t i = 0; !raw && i < len; i++)
            if (buf[i] % 10 == 9) buf[i] = (uint8_t)(buf[i] - 1);
        run_one(buf, len);
        if ((n + 1) % 1000 == 0)
            printf("  %ld inputs, %.0f s: %ld opened, %ld loaded, %ld reads\n", n + 1,
                   fsdp_clock_now() - start, g.opened, g.loaded, g.verified);
    }
    printf("fuzz_ckpt_reader: %ld inputs in %.1f s (seed %llu, raw %d%%): %ld opened, %ld "
           "loaded, %ld regions read; no crash\n",
           n, fsdp_clock_now() - start, (unsigned long long)seed, g.raw_percent, g.opened, g.loaded,
           g.verified);
    teardown();
    return 0;
}

#endif

/* meta.c: metadata.h5, the table of a checkpoint's tensors and pieces, written by rank 0 and
 * read back with every size and region checked before it is used. */
#define _POSIX_C_SOURCE 200809L /* strnlen, stpcpy */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/h5.h"
#include "core/error.h"
#include "fsdp/version.h"

/* NUL-separated names as one byte string. */
static char *join_names(char *const *names, int n, size_t *len) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += strlen(names[i]) + 1;
    char *buf = malloc(total + 1), *p = buf;
    for (int i = 0; buf && i < n; i++) p = stpcpy(p, names[i]) + 1;
    *len = total;
    return buf;
}

static fsdp_status write_tables(fsdp_ctx *ctx, hid_t f, const ckpt_meta *m) {
    int64_t *tt = calloc((size_t)m->n_tensors * CKPT_TENSOR_COLS + 1, sizeof *tt);
    int64_t *pt = calloc((size_t)m->n_pieces * CKPT_PIECE_COLS + 1, sizeof *pt);
    char **names = malloc(((size_t)m->n_tensors + 1) * sizeof *names);
    fsdp_status s =
        tt && pt && names ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "metadata tables");
    for (int i = 0; s == FSDP_OK && i < m->n_tensors; i++) {
        const ckpt_tensor *t = &m->tensors[i];
        int64_t *row = tt + (size_t)i * CKPT_TENSOR_COLS;
        row[0] = t->kind, row[1] = t->dtype, row[2] = t->ndim;
        for (int d = 0; d < t->ndim; d++) row[3 + d] = t->shape[d];
        names[i] = t->name;
    }
    for (int i = 0; s == FSDP_OK && i < m->n_pieces; i++) {
        const ckpt_piece *p = &m->pieces[i];
        int64_t *row = pt + (size_t)i * CKPT_PIECE_COLS;
        row[0] = p->tensor, row[1] = p->file_rank, row[2] = p->id;
        for (int d = 0; d < p->box.ndim; d++) row[3 + d] = p->box.offset[d];
        for (int d = 0; d < p->box.ndim; d++) row[7 + d] = p->box.count[d];
    }
    size_t len = 0, elen = 0;
    char *joined = s == FSDP_OK ? join_names(names, m->n_tensors, &len) : NULL;
    char *extras = s == FSDP_OK ? join_names(m->extra_name, m->n_extras, &elen) : NULL;
    if (s == FSDP_OK && (!joined || !extras))
        s = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "metadata names");
    if (s == FSDP_OK) s = h5_write_bytes(ctx, f, "names", joined, len);
    if (s == FSDP_OK) s = h5_write_table(ctx, f, "tensors", m->n_tensors, CKPT_TENSOR_COLS, tt);
    if (s == FSDP_OK) s = h5_write_table(ctx, f, "pieces", m->n_pieces, CKPT_PIECE_COLS, pt);
    for (int i = 0; s == FSDP_OK && i < m->n_pieces; i++) pt[i] = (int64_t)m->pieces[i].digest;
    if (s == FSDP_OK) s = h5_write_table(ctx, f, "piece_digests", m->n_pieces, 1, pt);
    if (s == FSDP_OK) s = h5_write_bytes(ctx, f, "extra_names", extras, elen);
    if (s == FSDP_OK) s = h5_write_table(ctx, f, "extra_values", m->n_extras, 1, m->extra_value);
    free(joined);
    free(extras);
    free(names);
    free(tt);
    free(pt);
    return FSDP_PASS(ctx, s);
}

/* The attributes, and the header: the same numbers and the checkpoint id in a checksummed
 * dataset (attributes have no checksum), which reading compares with the attributes. */
static fsdp_status write_attrs(fsdp_ctx *ctx, hid_t f, const ckpt_meta *m) {
    char id[CKPT_ID_CHARS + 1];
    ckpt_id_format(m->id, id);
    FSDP_TRY_AT(ctx, h5_attr_write_str(ctx, f, "format", CKPT_FORMAT_NAME));
    FSDP_TRY_AT(ctx, h5_attr_write_i64(ctx, f, "format_version", FSDP_CKPT_FORMAT_VERSION));
    FSDP_TRY_AT(ctx, h5_attr_write_str(ctx, f, "library_version", FSDP_VERSION_STRING));
    FSDP_TRY_AT(ctx, h5_attr_write_i64(ctx, f, "step", m->step));
    FSDP_TRY_AT(ctx, h5_attr_write_i64(ctx, f, "optim_steps", m->optim_steps));
    FSDP_TRY_AT(ctx, h5_attr_write_i64(ctx, f, "world_size", m->world_size));
    FSDP_TRY_AT(ctx, h5_attr_write_str(ctx, f, CKPT_ID_ATTR, id));
    int64_t header[CKPT_HEADER_COLS] = {FSDP_CKPT_FORMAT_VERSION, m->step,
                                        m->optim_steps,           m->world_size,
                                        (int64_t)m->id.hi,        (int64_t)m->id.lo};
    FSDP_TRY_AT(ctx, h5_write_table(ctx, f, "header", 1, CKPT_HEADER_COLS, header));
    const char *layout = m->layout ? m->layout : "", *config = m->config ? m->config : "";
    FSDP_TRY_AT(ctx, h5_write_bytes(ctx, f, "layout", layout, strlen(layout)));
    FSDP_TRY_AT(ctx, h5_write_bytes(ctx, f, "config", config, strlen(config)));
    /* Optional (readers before it ignore it), so written only when there is one. */
    if (!m->model_config || !*m->model_config) return FSDP_OK;
    return h5_write_bytes(ctx, f, "model_config", m->model_config, strlen(m->model_config));
}

fsdp_status ckpt_meta_write(fsdp_ctx *ctx, const char *dir, const ckpt_meta *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_METADATA);
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    hid_t f;
    fsdp_status s = h5_create(ctx, path, &f);
    if (s == FSDP_OK) {
        s = write_attrs(ctx, f, m);
        if (s == FSDP_OK) s = write_tables(ctx, f, m);
        if (H5Fclose(f) < 0 && s == FSDP_OK) s = h5_fail(ctx, "cannot close", path);
    }
    h5_unlock();
    if (s == FSDP_OK) s = ckpt_sync_path(ctx, path);
    return FSDP_PASS(ctx, s);
}

/* ---- reading, trusting nothing ---- */

static fsdp_status bad(fsdp_ctx *ctx, const char *path, const char *what, long long a) {
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "checkpoint metadata '%s' is corrupt: %s (%lld); the checkpoint cannot be "
                     "loaded: use an earlier one",
                     path, what, a);
}

/* Splits n NUL-terminated names out of buf (len bytes). */
static fsdp_status split_names(fsdp_ctx *ctx, const char *path, char *buf, size_t len, int n,
                               size_t max, char **out) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strnlen(buf + at, len - at);
        if (at >= len || l == len - at) return bad(ctx, path, "a name runs past its table", i);
        if (l == 0 || l >= max) return bad(ctx, path, "a name is empty or too long", (long long)l);
        out[i] = buf + at;
        at += l + 1;
    }
    return at == len ? FSDP_OK : bad(ctx, path, "names left over in the table", (long long)at);
}

/* Format 2: the checksummed header must repeat the attributes, and the id must parse. */
static fsdp_status read_binding(fsdp_ctx *ctx, hid_t f, const char *path, ckpt_meta *m) {
    int64_t rows = 0, *h = NULL;
    char *text = NULL;
    if (H5Lexists(f, "header", H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "checkpoint metadata '%s' says format %lld but has no 'header' (the "
                         "checksummed copy of its numbers and checkpoint id): it was edited or "
                         "damaged; restore metadata.h5 from the same save or use another "
                         "checkpoint",
                         path, (long long)m->version);
    }
    FSDP_TRY_AT(ctx, h5_read_table(ctx, f, "header", CKPT_HEADER_COLS, 1, &rows, &h));
    fsdp_status s = rows == 1 ? FSDP_OK : bad(ctx, path, "header rows", (long long)rows);
    static const char *const names[] = {"format_version", "step", "optim_steps", "world_size"};
    const int64_t attrs[] = {m->version, m->step, m->optim_steps, m->world_size};
    for (int i = 0; s == FSDP_OK && i < 4; i++)
        if (h[i] != attrs[i])
            s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                          "checkpoint metadata '%s': attribute '%s' is %lld, but the checksummed "
                          "header says %lld: the attribute was edited or damaged; restore "
                          "metadata.h5 from the same save or use another checkpoint",
                          path, names[i], (long long)attrs[i], (long long)h[i]);
    if (s == FSDP_OK) s = h5_attr_read_str(ctx, f, CKPT_ID_ATTR, CKPT_ID_CHARS, &text);
    if (s == FSDP_OK &&
        (!ckpt_id_parse(text, &m->id) || m->id.hi != (uint64_t)h[4] || m->id.lo != (uint64_t)h[5]))
        s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                      "checkpoint metadata '%s': attribute '%s' ('%.40s') is not the id its "
                      "checksummed header records: the file was edited or damaged; restore "
                      "metadata.h5 from the same save or use another checkpoint",
                      path, CKPT_ID_ATTR, text);
    free(text);
    free(h);
    m->bound = s == FSDP_OK;
    return FSDP_PASS(ctx, s);
}

static fsdp_status read_attrs(fsdp_ctx *ctx, hid_t f, const char *path, ckpt_meta *m) {
    char *format = NULL;
    FSDP_TRY_AT(ctx, h5_attr_read_str(ctx, f, "format", 64, &format));
    bool ours = !strcmp(format, CKPT_FORMAT_NAME);
    free(format);
    if (!ours) return FSDP_FAIL(ctx, FSDP_ERR_IO, "'%s' is not libfsdp checkpoint metadata", path);
    FSDP_TRY_AT(ctx, h5_attr_read_i64(ctx, f, "format_version", &m->version));
    if (m->version > FSDP_CKPT_FORMAT_VERSION)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s' has checkpoint format version %lld, newer than the version %d "
                         "this libfsdp (%s) reads: upgrade libfsdp to load it",
                         path, (long long)m->version, FSDP_CKPT_FORMAT_VERSION,
                         FSDP_VERSION_STRING);
    if (m->version < 1) return bad(ctx, path, "format_version", (long long)m->version);
    FSDP_TRY_AT(ctx, h5_attr_read_str(ctx, f, "library_version", 64, &m->library_version));
    FSDP_TRY_AT(ctx, h5_attr_read_i64(ctx, f, "step", &m->step));
    FSDP_TRY_AT(ctx, h5_attr_read_i64(ctx, f, "optim_steps", &m->optim_steps));
    FSDP_TRY_AT(ctx, h5_attr_read_i64(ctx, f, "world_size", &m->world_size));
    if (m->world_size < 1 || m->world_size > CKPT_MAX_WORLD)
        return bad(ctx, path, "world_size", (long long)m->world_size);
    if (m->step < 0) return bad(ctx, path, "step is negative", (long long)m->step);
    if (m->optim_steps < 0)
        return bad(ctx, path, "optim_steps is negative", (long long)m->optim_steps);
    if (m->version >= 2) FSDP_TRY_AT(ctx, read_binding(ctx, f, path, m));
    size_t len;
    FSDP_TRY_AT(ctx, h5_read_bytes(ctx, f, "layout", CKPT_MAX_TEXT, &m->layout, &len));
    FSDP_TRY_AT(ctx, h5_read_bytes(ctx, f, "config", CKPT_MAX_TEXT, &m->config, &len));
    htri_t has = H5Lexists(f, "model_config", H5P_DEFAULT);
    if (has < 0) return h5_fail(ctx, "cannot look for model_config in", path);
    if (has)
        return h5_read_bytes(ctx, f, "model_config", FSDP_HF_CONFIG_MAX, &m->model_config, &len);
    m->model_config = calloc(1, 1);
    return m->model_config ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "metadata");
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Two tensors of one name would make one of them unreachable (found by name). */
static fsdp_status check_unique(fsdp_ctx *ctx, const char *path, char **names, int n) {
    char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    if (!sorted) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "metadata");
    memcpy(sorted, names, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_name);
    int i = 1;
    while (i < n && strcmp(sorted[i - 1], sorted[i])) i++;
    fsdp_status s = i < n ? FSDP_FAIL(ctx, FSDP_ERR_IO,
                                      "checkpoint metadata '%s' is corrupt: two tensors are "
                                      "called '%s'",
                                      path, sorted[i])
                          : FSDP_OK;
    free(sorted);
    return FSDP_PASS(ctx, s);
}

static fsdp_status read_tensors(fsdp_ctx *ctx, hid_t f, const char *path, ckpt_meta *m) {
    int64_t rows, *tt = NULL;
    size_t len;
    FSDP_TRY_AT(ctx,
                h5_read_table(ctx, f, "tensors", CKPT_TENSOR_COLS, CKPT_MAX_TENSORS, &rows, &tt));
    m->n_tensors = (int)rows;
    m->tensors = calloc((size_t)rows + 1, sizeof *m->tensors);
    char **names = calloc((size_t)rows + 1, sizeof *names);
    fsdp_status s =
        m->tensors && names ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "metadata");
    if (s == FSDP_OK)
        s = h5_read_bytes(ctx, f, "names", (size_t)rows * FSDP_STATE_NAME_MAX, &m->names, &len);
    if (s == FSDP_OK)
        s = split_names(ctx, path, m->names, len, m->n_tensors, FSDP_STATE_NAME_MAX, names);
    if (s == FSDP_OK) s = check_unique(ctx, path, names, m->n_tensors);
    for (int i = 0; s == FSDP_OK && i < m->n_tensors; i++) {
        const int64_t *row = tt + (size_t)i * CKPT_TENSOR_COLS;
        ckpt_tensor *t = &m->tensors[i];
        t->name = names[i];
        if (row[0] < 0 || row[0] >= FSDP_STATE_KIND_COUNT)
            s = bad(ctx, path, "tensor kind", row[0]);
        else if (row[1] != FSDP_DTYPE_F32 && row[1] != FSDP_DTYPE_BF16) /* what shards store */
            s = bad(ctx, path, "tensor dtype", row[1]);
        else if (row[2] < 0 || row[2] > FSDP_MAX_DIMS)
            s = bad(ctx, path, "tensor ndim", row[2]);
        if (s != FSDP_OK) break;
        t->kind = (fsdp_state_kind)row[0], t->dtype = (fsdp_dtype)row[1], t->ndim = (int)row[2];
        int64_t numel = 1;
        for (int d = 0; d < t->ndim && s == FSDP_OK; d++) {
            t->shape[d] = row[3 + d];
            if (t->shape[d] < 0 || (t->shape[d] && numel > (INT64_MAX / 8) / t->shape[d]))
                s = bad(ctx, path, "a tensor dimension is negative or overflows", t->shape[d]);
            else
                numel *= t->shape[d];
        }
    }
    free(names);
    free(tt);
    return FSDP_PASS(ctx, s);
}

static int by_tensor(const void *a, const void *b) {
    const ckpt_piece *x = a, *y = b;
    return x->tensor != y->tensor
               ? (x->tensor < y->tensor ? -1 : 1)
               : (x->file_rank != y->file_rank ? x->file_rank - y->file_rank : x->id - y->id);
}

/* Each piece inside its tensor; a tensor's pieces disjoint and covering it exactly. */
static fsdp_status check_cover(fsdp_ctx *ctx, const char *path, ckpt_meta *m) {
    for (int i = 0, k = 0; i < m->n_tensors; i++) {
        ckpt_tensor *t = &m->tensors[i];
        t->first_piece = k;
        int64_t covered = 0, numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        for (; k < m->n_pieces && m->pieces[k].tensor == i; k++) {
            const ckpt_piece *p = &m->pieces[k];
            for (int j = t->first_piece; j < k; j++)
                if (region_intersect(&p->box, &m->pieces[j].box, NULL))
                    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                                     "checkpoint metadata '%s' is corrupt: two pieces of '%s' "
                                     "overlap",
                                     path, t->name);
            covered += region_numel(&p->box);
        }
        t->n_pieces = k - t->first_piece;
        if (covered != numel)
            return FSDP_FAIL(ctx, FSDP_ERR_IO,
                             "checkpoint metadata '%s' is corrupt: the pieces of '%s' cover %lld "
                             "of its %lld elements",
                             path, t->name, (long long)covered, (long long)numel);
    }
    return FSDP_OK;
}

/* One digest per row of the pieces table, in its order. */
static fsdp_status read_digests(fsdp_ctx *ctx, hid_t f, const char *path, ckpt_meta *m) {
    int64_t rows = 0, *d = NULL;
    FSDP_TRY_AT(ctx, h5_read_table(ctx, f, "piece_digests", 1, CKPT_MAX_PIECES, &rows, &d));
    fsdp_status s =
        rows == m->n_pieces ? FSDP_OK : bad(ctx, path, "piece digests, not one per piece", rows);
    for (int i = 0; s == FSDP_OK && i < m->n_pieces; i++) m->pieces[i].digest = (uint64_t)d[i];
    free(d);
    return FSDP_PASS(ctx, s);
}

static fsdp_status read_pieces(fsdp_ctx *ctx, hid_t f, const char *path, ckpt_meta *m) {
    int64_t rows, *pt = NULL;
    FSDP_TRY_AT(ctx, h5_read_table(ctx, f, "pieces", CKPT_PIECE_COLS, CKPT_MAX_PIECES, &rows, &pt));
    m->n_pieces = (int)rows;
    m->pieces = calloc((size_t)rows + 1, sizeof *m->pieces);
    fsdp_status s = m->pieces ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "metadata");
    for (int i = 0; s == FSDP_OK && i < m->n_pieces; i++) {
        const int64_t *row = pt + (size_t)i * CKPT_PIECE_COLS;
        ckpt_piece *p = &m->pieces[i];
        if (row[0] < 0 || row[0] >= m->n_tensors)
            s = bad(ctx, path, "piece tensor", row[0]);
        else if (row[1] < 0 || row[1] >= m->world_size)
            s = bad(ctx, path, "piece file", row[1]);
        else if (row[2] < 0 || row[2] > INT32_MAX)
            s = bad(ctx, path, "piece id", row[2]);
        if (s != FSDP_OK) break;
        const ckpt_tensor *t = &m->tensors[row[0]];
        *p = (ckpt_piece){.tensor = (int)row[0], .file_rank = (int)row[1], .id = (int)row[2]};
        p->box.ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            p->box.offset[d] = row[3 + d], p->box.count[d] = row[7 + d];
        if (!region_inside(&p->box, t->ndim, t->shape) || region_numel(&p->box) == 0)
            s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                          "checkpoint metadata '%s' is corrupt: a piece of '%s' lies outside it",
                          path, t->name);
    }
    free(pt);
    if (s == FSDP_OK && m->bound) s = read_digests(ctx, f, path, m);
    if (s != FSDP_OK) return FSDP_PASS(ctx, s);
    qsort(m->pieces, (size_t)m->n_pieces, sizeof *m->pieces, by_tensor);
    return check_cover(ctx, path, m);
}

static fsdp_status read_extras(fsdp_ctx *ctx, hid_t f, const char *path, ckpt_meta *m) {
    int64_t rows, *vals = NULL;
    size_t len;
    FSDP_TRY_AT(ctx, h5_read_table(ctx, f, "extra_values", 1, FSDP_CKPT_MAX_EXTRAS, &rows, &vals));
    m->n_extras = (int)rows;
    memcpy(m->extra_value, vals, (size_t)rows * sizeof *vals);
    free(vals);
    FSDP_TRY_AT(ctx,
                h5_read_bytes(ctx, f, "extra_names", FSDP_CKPT_MAX_EXTRAS * CKPT_EXTRA_NAME_MAX,
                              &m->extra_names, &len));
    return split_names(ctx, path, m->extra_names, len, m->n_extras, CKPT_EXTRA_NAME_MAX,
                       m->extra_name);
}

fsdp_status ckpt_meta_read(fsdp_ctx *ctx, const char *dir, ckpt_meta *m) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_METADATA);
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    hid_t f;
    fsdp_status s = h5_open(ctx, path, &f);
    if (s == FSDP_OK) {
        s = read_attrs(ctx, f, path, m);
        if (s == FSDP_OK) s = read_tensors(ctx, f, path, m);
        if (s == FSDP_OK) s = read_pieces(ctx, f, path, m);
        if (s == FSDP_OK) s = read_extras(ctx, f, path, m);
        H5Fclose(f);
    }
    h5_unlock();
    if (s != FSDP_OK) ckpt_meta_free(m);
    return FSDP_PASS(ctx, s);
}

void ckpt_meta_free(ckpt_meta *m) {
    free(m->library_version);
    free(m->layout);
    free(m->config);
    free(m->model_config);
    free(m->names);
    free(m->extra_names);
    free(m->tensors);
    free(m->pieces);
    memset(m, 0, sizeof *m);
}

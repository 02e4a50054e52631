/* train_data.c: fsdp-train's HDF5 datasets (read once per process and checked before use),
 * the held-out split and the seeded per-epoch order of the training samples. */
#define _POSIX_C_SOURCE 200809L // stat

#include "train_data.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: stat, S_ISREG

#include "fsdp/rng.h" // defines: fsdp_rng_uniform, fsdp_rng_stream

#define STREAM_SHUFFLE "fsdp-train/shuffle"

int64_t train_data_eval_count(const train_config *cfg, int64_t n) {
    return (int64_t)floor((double)n * cfg->data.eval_fraction);
}

void train_data_free(train_data *d) {
    free(d->x);
    free(d->y);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

/* ---- reading and checking ------------------------------------------------------------------ */

typedef struct reader {
    const train_config *cfg;
    const char *path;
    hid_t file;
    char *err;
    size_t err_size;
} reader;

static herr_t add_name(hid_t group, const char *name, const H5L_info_t *info, void *user) {
    (void)group, (void)info;
    train_append(user, 256, "%s%s", ((char *)user)[0] ? ", " : "", name);
    return 0;
}

/* Opens dataset `name` ([data] key), or fails naming what the file's root holds. */
static fsdp_status open_dataset(reader *r, const char *key, const char *name, hid_t *out) {
    htri_t there =
        name[0] && name[0] != '/' && !strchr(name, '/') ? H5Lexists(r->file, name, H5P_DEFAULT) : 1;
    *out = there > 0 ? H5Dopen2(r->file, name, H5P_DEFAULT) : -1;
    if (*out >= 0) return FSDP_OK;
    char names[256] = "";
    hsize_t idx = 0;
    H5Literate(r->file, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, add_name, names);
    H5Eclear2(H5E_DEFAULT);
    snprintf(r->err, r->err_size,
             "data file '%s' has no dataset '%s' ([data] %s, %s); it holds: %s; set [data] %s to "
             "one of them",
             r->path, name, key, train_config_origin(r->cfg, "data", key),
             names[0] ? names : "nothing at its root", key);
    return FSDP_ERR_CONFIG;
}

/* The dataset's rank (at most 2) and dims, checked against the shapes allowed: want0 (the
 * sample count, -1: any) by want1 (-1: a rank-1 dataset only; 1 allows rank 1 or (N, 1)). */
static fsdp_status check_shape(reader *r, hid_t ds, const char *key, const char *name,
                               int64_t want0, int64_t want1, const char *fix, int64_t *rows) {
    hid_t space = H5Dget_space(ds);
    int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hsize_t dims[2] = {0, 0};
    if (rank >= 1 && rank <= 2) H5Sget_simple_extent_dims(space, dims, NULL);
    if (space >= 0) H5Sclose(space);
    char shape[96] = "";
    if (rank >= 1 && rank <= 2)
        snprintf(shape, sizeof shape, rank == 1 ? "(%llu,)" : "(%llu, %llu)",
                 (unsigned long long)dims[0], (unsigned long long)dims[1]);
    else
        snprintf(shape, sizeof shape, "of rank %d", rank);
    bool ok = rank >= 1 && rank <= 2 && dims[0] >= 1;
    if (ok && want1 < 0) ok = rank == 1;
    if (ok && want1 == 1) ok = rank == 1 || dims[1] == 1;
    if (ok && want1 > 1) ok = rank == 2 && (int64_t)dims[1] == want1;
    if (ok && want0 >= 0) ok = (int64_t)dims[0] == want0;
    if (!ok) {
        char want[96];
        if (want1 < 0)
            snprintf(want, sizeof want, "(N,)");
        else if (want1 == 1)
            snprintf(want, sizeof want, "(N,) or (N, 1)");
        else
            snprintf(want, sizeof want, "(N, %lld)", (long long)want1);
        if (want0 >= 0) train_append(want, sizeof want, " with N = %lld (x's)", (long long)want0);
        snprintf(r->err, r->err_size,
                 "data file '%s': dataset '%s' ([data] %s) is %s, but the configuration needs "
                 "%s, N >= 1; %s",
                 r->path, name, key, shape, want, fix);
        return FSDP_ERR_CONFIG;
    }
    *rows = (int64_t)dims[0];
    return FSDP_OK;
}

static fsdp_status check_class(reader *r, hid_t ds, const char *key, const char *name,
                               H5T_class_t want, const char *what) {
    hid_t type = H5Dget_type(ds);
    H5T_class_t c = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    if (type >= 0) H5Tclose(type);
    if (c == want) return FSDP_OK;
    snprintf(r->err, r->err_size,
             "data file '%s': dataset '%s' ([data] %s) must hold %s, but its type is %s; "
             "convert it (numpy: astype)",
             r->path, name, key, what,
             c == H5T_INTEGER ? "integer"
             : c == H5T_FLOAT ? "float"
                              : "neither float nor integer");
    return FSDP_ERR_CONFIG;
}

/* ---- what the file stores --------------------------------------------------------------- */

/* HDF5 reads the fill value (zeros) for what a dataset's file never stored: chunks never
 * written, contiguous space never allocated, a virtual dataset's source that is missing. Training
 * would go on, on zeros; each is refused instead, before any value is read. */

#define MAX_VIRTUAL_DEPTH 4 /* a virtual dataset's source may itself be virtual, this deep */

static fsdp_status not_stored(reader *r, const char *key, const char *name, const char *why) {
    snprintf(r->err, r->err_size,
             "data file '%s': dataset '%s' ([data] %s) %s; HDF5 would read zeros for what is "
             "missing: write the whole dataset into the file (or restore its sources)",
             r->path, name, key, why);
    return FSDP_ERR_IO;
}

static fsdp_status check_storage(reader *r, hid_t ds, const char *key, const char *name, int depth);

/* Every chunk of the chunk grid is in the file (H5Dget_num_chunks counts the stored ones). */
static fsdp_status check_chunks(reader *r, hid_t ds, hid_t dcpl, const char *key,
                                const char *name) {
    hid_t space = H5Dget_space(ds);
    int nd = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK], want = 1, have = 0;
    bool ok = nd >= 1 && H5Sget_simple_extent_dims(space, dims, NULL) == nd &&
              H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) == nd;
    for (int d = 0; ok && d < nd; d++)
        if ((ok = chunk[d] > 0)) want *= (dims[d] + chunk[d] - 1) / chunk[d];
    ok = ok && H5Dget_num_chunks(ds, space, &have) >= 0;
    if (space >= 0) H5Sclose(space);
    H5Eclear2(H5E_DEFAULT);
    if (ok && have == want) return FSDP_OK;
    char why[192];
    if (ok)
        snprintf(why, sizeof why,
                 "has %llu of its %llu chunks in the file (the others were never "
                 "written)",
                 (unsigned long long)have, (unsigned long long)want);
    else
        snprintf(why, sizeof why, "is chunked, but its chunks cannot be counted");
    return not_stored(r, key, name, why);
}

/* Whether source dataset src holds all that mapping i of a virtual dataset (dcpl) takes from it:
 * the bounds of its selection inside src's dims; a whole-source selection ("all", whose extent
 * HDF5 1.10 does not keep) as many elements as the mapping's part of the virtual dataset. */
static bool source_covers(hid_t dcpl, size_t i, hid_t src) {
    hid_t sel = H5Pget_virtual_srcspace(dcpl, i), vsel = H5Pget_virtual_vspace(dcpl, i);
    hid_t space = H5Dget_space(src);
    int nd = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hsize_t start[H5S_MAX_RANK], end[H5S_MAX_RANK], dims[H5S_MAX_RANK];
    bool ok =
        sel >= 0 && vsel >= 0 && nd >= 0 && H5Sget_simple_extent_dims(space, dims, NULL) == nd;
    if (ok && H5Sget_select_type(sel) == H5S_SEL_ALL)
        ok = H5Sget_select_npoints(vsel) <= H5Sget_simple_extent_npoints(space);
    else if (ok)
        ok = H5Sget_simple_extent_ndims(sel) == nd && H5Sget_select_bounds(sel, start, end) >= 0;
    for (int d = 0; ok && nd > 0 && H5Sget_select_type(sel) != H5S_SEL_ALL && d < nd; d++)
        ok = end[d] < dims[d];
    if (sel >= 0) H5Sclose(sel);
    if (vsel >= 0) H5Sclose(vsel);
    if (space >= 0) H5Sclose(space);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

/* Source i of a virtual dataset (dcpl): its file found as HDF5 looks for it (next to the data
 * file, then as named), a regular file (a FIFO would block the open), holding the dataset, itself
 * stored, and at least as large as the part the mapping takes from it. */
static fsdp_status check_source(reader *r, hid_t dcpl, size_t i, const char *key, const char *name,
                                int depth) {
    char file[1024], dset[1024], path[2200], why[2600];
    ssize_t fl = H5Pget_virtual_filename(dcpl, i, file, sizeof file);
    ssize_t dl = H5Pget_virtual_dsetname(dcpl, i, dset, sizeof dset);
    if (fl <= 0 || dl <= 0 || fl >= (ssize_t)sizeof file || dl >= (ssize_t)sizeof dset)
        return not_stored(r, key, name, "is virtual, and a source's name cannot be read");
    if (strchr(file, '%') || strchr(dset, '%')) {
        snprintf(why, sizeof why,
                 "is virtual with a printf-style source name ('%s', '%s'), "
                 "which fsdp-train does not follow",
                 file, dset);
        return not_stored(r, key, name, why);
    }
    const char *slash = strrchr(r->path, '/');
    struct stat sb;
    snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - r->path + 1) : 0, r->path, file);
    if (file[0] != '/' && stat(path, &sb) != 0) snprintf(path, sizeof path, "%s", file);
    bool same = strcmp(file, ".") == 0;
    const char *missing = NULL;
    if (!same && stat(path, &sb) != 0)
        missing = "does not exist";
    else if (!same && !S_ISREG(sb.st_mode))
        missing = "is not a regular file";
    hid_t f = same || missing ? -1 : H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (!same && !missing && f < 0) missing = "is not an HDF5 file";
    hid_t at = same ? r->file : f;
    hid_t src = missing ? -1 : H5Dopen2(at, dset, H5P_DEFAULT);
    if (!missing && src < 0) missing = "does not hold that dataset";
    if (!missing && !source_covers(dcpl, i, src))
        missing = "is smaller than the part mapped from it";
    H5Eclear2(H5E_DEFAULT);
    fsdp_status st = FSDP_OK;
    if (missing) {
        snprintf(why, sizeof why,
                 "is virtual, and its source %zu, dataset '%s' of file '%.1100s', %s", i, dset,
                 same ? r->path : path, missing);
        st = not_stored(r, key, name, why);
    } else if (depth >= MAX_VIRTUAL_DEPTH) {
        st = not_stored(r, key, name, "is virtual over more than 4 levels of virtual sources");
    } else {
        st = check_storage(r, src, key, name, depth + 1);
    }
    if (src >= 0) H5Dclose(src);
    if (f >= 0) H5Fclose(f);
    return st;
}

/* What the dataset's layout says the file stores is there (depth: how many virtual datasets
 * led here). */
static fsdp_status check_storage(reader *r, hid_t ds, const char *key, const char *name,
                                 int depth) {
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0) {
        H5Eclear2(H5E_DEFAULT);
        return not_stored(r, key, name, "has a storage description that cannot be read");
    }
    H5D_layout_t layout = H5Pget_layout(dcpl);
    H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
    size_t n = 0;
    fsdp_status st = FSDP_OK;
    if (layout == H5D_CHUNKED) {
        st = check_chunks(r, ds, dcpl, key, name);
    } else if (layout == H5D_VIRTUAL) {
        if (H5Pget_virtual_count(dcpl, &n) < 0 || n == 0)
            st = not_stored(r, key, name, "is virtual without sources");
        for (size_t i = 0; st == FSDP_OK && i < n; i++)
            st = check_source(r, dcpl, i, key, name, depth);
    } else if (layout == H5D_CONTIGUOUS && H5Pget_external_count(dcpl) == 0 &&
               (H5Dget_space_status(ds, &status) < 0 || status != H5D_SPACE_STATUS_ALLOCATED)) {
        st = not_stored(r, key, name, "was never written (the file holds no values for it)");
    }
    H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return st;
}

static fsdp_status read_all(reader *r, hid_t ds, hid_t mem_type, void *buf, const char *key,
                            const char *name) {
    fsdp_status st = check_storage(r, ds, key, name, 0);
    if (st != FSDP_OK) return st;
    if (H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0) return FSDP_OK;
    H5Eclear2(H5E_DEFAULT);
    snprintf(r->err, r->err_size,
             "data file '%s': cannot read dataset '%s' (damaged, or compressed with a filter "
             "this HDF5 lacks); rewrite it uncompressed",
             r->path, name);
    return FSDP_ERR_IO;
}

static fsdp_status check_finite(reader *r, const float *v, int64_t n, int64_t cols, const char *key,
                                const char *name) {
    for (int64_t i = 0; i < n * cols; i++) {
        if (isfinite(v[i])) continue;
        snprintf(r->err, r->err_size,
                 "data file '%s': dataset '%s' ([data] %s) holds %g at sample %lld, column %lld; "
                 "training needs finite values: clean the data",
                 r->path, name, key, (double)v[i], (long long)(i / cols), (long long)(i % cols));
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

static void *alloc_bytes(reader *r, int64_t bytes, fsdp_status *st) {
    void *p = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!p) {
        snprintf(r->err, r->err_size, "data file '%s': out of memory for %lld bytes", r->path,
                 (long long)bytes);
        *st = FSDP_ERR_OUT_OF_MEMORY;
    }
    return p;
}

/* The targets: float (N, out) or class ids (N,), read into d. */
static fsdp_status read_targets(reader *r, hid_t ds, train_data *d) {
    const train_config *cfg = r->cfg;
    const char *name = cfg->data.y;
    bool classify = cfg->data.task == TRAIN_TASK_CLASSIFICATION;
    fsdp_status st = check_class(r, ds, "y", name, classify ? H5T_INTEGER : H5T_FLOAT,
                                 classify ? "integer class ids (task = classification)"
                                          : "float targets (task = regression)");
    int64_t rows = 0;
    char fix[256];
    snprintf(fix, sizeof fix, "%s",
             classify ? "classification needs one class id per sample"
                      : "the output width (the last of [model] widths) must be the targets' "
                        "width");
    if (st == FSDP_OK)
        st = check_shape(r, ds, "y", name, d->n, classify ? 1 : (d->out == 1 ? 1 : d->out), fix,
                         &rows);
    if (st != FSDP_OK) return st;
    if (!classify) {
        if (!(d->y = alloc_bytes(r, d->n * d->out * (int64_t)sizeof(float), &st))) return st;
        if ((st = read_all(r, ds, H5T_NATIVE_FLOAT, d->y, "y", name))) return st;
        return check_finite(r, d->y, d->n, d->out, "y", name);
    }
    long long *ids = alloc_bytes(r, d->n * (int64_t)sizeof(long long), &st);
    if (ids) st = read_all(r, ds, H5T_NATIVE_LLONG, ids, "y", name);
    if (st == FSDP_OK && !(d->labels = alloc_bytes(r, d->n * (int64_t)sizeof(int32_t), &st)))
        st = FSDP_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; st == FSDP_OK && i < d->n; i++) {
        if (ids[i] < 0 || ids[i] >= d->out) {
            snprintf(r->err, r->err_size,
                     "data file '%s': dataset '%s' ([data] y) holds class id %lld at sample %lld, "
                     "outside [0, %lld) (the output width, the last of [model] widths, is the "
                     "number of classes); raise the output width or fix the labels",
                     r->path, name, ids[i], (long long)i, (long long)d->out);
            st = FSDP_ERR_CONFIG;
        } else {
            d->labels[i] = (int32_t)ids[i];
        }
    }
    free(ids);
    return st;
}

static fsdp_status read_file(reader *r, train_data *d) {
    const train_config *cfg = r->cfg;
    hid_t xs = -1, ys = -1;
    fsdp_status st = open_dataset(r, "x", cfg->data.x, &xs);
    if (st == FSDP_OK) st = check_class(r, xs, "x", cfg->data.x, H5T_FLOAT, "float inputs");
    if (st == FSDP_OK)
        st = check_shape(r, xs, "x", cfg->data.x, -1, d->in,
                         "the input width (the first of [model] widths) must be x's width", &d->n);
    int64_t y_cols = cfg->data.task == TRAIN_TASK_CLASSIFICATION ? 1 : d->out;
    if (st == FSDP_OK && (d->n > TRAIN_MAX_DATA_BYTES / 4 / (d->in + y_cols) ||
                          d->n * (d->in + y_cols) * 4 > TRAIN_MAX_DATA_BYTES)) {
        snprintf(r->err, r->err_size,
                 "data file '%s': %lld samples of %lld inputs and %lld targets take more than "
                 "the %lld bytes (1 GiB) fsdp-train holds in memory for every rank; use a "
                 "subset of the samples",
                 r->path, (long long)d->n, (long long)d->in, (long long)y_cols,
                 (long long)TRAIN_MAX_DATA_BYTES);
        st = FSDP_ERR_CONFIG;
    }
    if (st == FSDP_OK && !(d->x = alloc_bytes(r, d->n * d->in * (int64_t)sizeof(float), &st)))
        st = FSDP_ERR_OUT_OF_MEMORY;
    if (st == FSDP_OK) st = read_all(r, xs, H5T_NATIVE_FLOAT, d->x, "x", cfg->data.x);
    if (st == FSDP_OK) st = check_finite(r, d->x, d->n, d->in, "x", cfg->data.x);
    if (st == FSDP_OK) st = open_dataset(r, "y", cfg->data.y, &ys);
    if (st == FSDP_OK) st = read_targets(r, ys, d);
    if (xs >= 0) H5Dclose(xs);
    if (ys >= 0) H5Dclose(ys);
    return st;
}

fsdp_status train_data_load(const train_config *cfg, train_data *d, char *err, size_t err_size) {
    memset(d, 0, sizeof *d);
    d->in = cfg->model.widths.v[0];
    d->out = cfg->model.widths.v[cfg->model.widths.n - 1];
    const char *path = cfg->data.path;
    struct stat sb;
    int rc = stat(path, &sb);
    if (rc != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, err_size, "cannot read data file '%s' ([data] path, %s): %s", path,
                 train_config_origin(cfg, "data", "path"),
                 rc != 0 ? strerror(errno) : "not a regular file");
        return FSDP_ERR_IO;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* messages are ours */
    reader r = {.cfg = cfg, .path = path, .err = err, .err_size = err_size};
    r.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r.file < 0) {
        H5Eclear2(H5E_DEFAULT);
        snprintf(err, err_size,
                 "cannot read data file '%s' ([data] path, %s): not an HDF5 file; write one "
                 "with h5py (see examples/make_digits.py)",
                 path, train_config_origin(cfg, "data", "path"));
        return FSDP_ERR_IO;
    }
    fsdp_status st = read_file(&r, d);
    H5Fclose(r.file);
    int64_t n_eval = train_data_eval_count(cfg, d->n);
    if (st == FSDP_OK && cfg->data.eval_fraction > 0 && (n_eval < 1 || n_eval >= d->n)) {
        snprintf(err, err_size,
                 "data file '%s' has %lld samples, and [data] eval_fraction = %g (%s) holds out "
                 "%lld; both the held-out and the training part need at least one sample",
                 path, (long long)d->n, cfg->data.eval_fraction,
                 train_config_origin(cfg, "data", "eval_fraction"), (long long)n_eval);
        st = FSDP_ERR_CONFIG;
    }
    if (st != FSDP_OK) train_data_free(d);
    return st;
}

/* ---- the order of the samples -------------------------------------------------------------- */

fsdp_status train_order_init(train_order *o, const train_config *cfg, int64_t n_train) {
    *o = (train_order){
        .n = n_train, .shuffle = cfg->data.shuffle, .seed = (uint64_t)cfg->data.seed, .epoch = -1};
    if (!o->shuffle) return FSDP_OK;
    o->perm = malloc((size_t)n_train * sizeof *o->perm);
    return o->perm ? FSDP_OK : FSDP_ERR_OUT_OF_MEMORY;
}

/* Fisher-Yates over 0..n-1 with the counter RNG: swap i with j = floor(u * (i + 1)), u the
 * uniform of (seed, shuffle stream + epoch, i). */
static void make_permutation(train_order *o, int64_t epoch) {
    uint64_t stream = fsdp_rng_stream(STREAM_SHUFFLE) + (uint64_t)epoch;
    for (int64_t i = 0; i < o->n; i++) o->perm[i] = i;
    for (int64_t i = o->n - 1; i > 0; i--) {
        int64_t j =
            (int64_t)((double)fsdp_rng_uniform(o->seed, stream, (uint64_t)i) * (double)(i + 1));
        if (j > i) j = i;
        int64_t t = o->perm[i];
        o->perm[i] = o->perm[j];
        o->perm[j] = t;
    }
    o->epoch = epoch;
}

int64_t train_order_sample(train_order *o, int64_t k) {
    int64_t epoch = k / o->n, i = k % o->n;
    if (!o->shuffle) return i;
    if (epoch != o->epoch) make_permutation(o, epoch);
    return o->perm[i];
}

void train_order_free(train_order *o) {
    free(o->perm);
    o->perm = NULL;
}

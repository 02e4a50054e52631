/* h5_check.c: what a checkpoint dataset must be before any value of it is read: its rank and
 * dims, exactly the element type libfsdp writes (class, size, byte order, bit layout, exponent
 * bias), no filter but zstd and Fletcher32, and every chunk in the file, stored whole through
 * every filter. Nothing read from the file is trusted before it is checked. */
#include <stdio.h>
#include <string.h>

#include "ckpt/h5.h"
#include "ckpt/zstd_filter.h"
#include "core/error.h"

static const char *order_name(H5T_order_t o) {
    return o == H5T_ORDER_LE    ? "little-endian"
           : o == H5T_ORDER_BE  ? "big-endian"
           : o == H5T_ORDER_VAX ? "VAX byte order"
                                : "no or mixed byte order";
}

void h5_type_describe(hid_t t, char *buf, size_t size) {
    H5T_class_t cls = H5Tget_class(t);
    size_t bytes = H5Tget_size(t), spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    if (cls == H5T_FLOAT && H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) >= 0)
        snprintf(buf, size,
                 "float of %zu bytes, %s, sign bit %zu, exponent bits %zu..%zu (bias %zu), "
                 "mantissa bits %zu..%zu",
                 bytes, order_name(H5Tget_order(t)), spos, epos, epos + esize - 1, H5Tget_ebias(t),
                 mpos, mpos + msize - 1);
    else if (cls == H5T_INTEGER)
        snprintf(buf, size, "%s integer of %zu bytes, %s, %zu bits at bit %d",
                 H5Tget_sign(t) == H5T_SGN_NONE ? "unsigned" : "signed", bytes,
                 order_name(H5Tget_order(t)), H5Tget_precision(t), H5Tget_offset(t));
    else
        snprintf(buf, size, "HDF5 type class %d of %zu bytes", (int)cls, bytes);
    H5Eclear2(H5E_DEFAULT);
}

/* The dataset's element type is exactly `want` (H5Tequal compares every property: class, size,
 * byte order, precision, offset, sign, the float's fields, bias, normalisation and padding). A
 * type that differs in any of them would make HDF5 convert every value by it. */
static fsdp_status check_type(fsdp_ctx *ctx, hid_t ds, const char *path, hid_t want) {
    hid_t type = H5Dget_type(ds);
    bool same = type >= 0 && H5Tequal(type, want) > 0;
    char got[192] = "unreadable", wants[192];
    if (!same && type >= 0) h5_type_describe(type, got, sizeof got);
    if (type >= 0) H5Tclose(type);
    H5Eclear2(H5E_DEFAULT);
    if (same) return FSDP_OK;
    h5_type_describe(want, wants, sizeof wants);
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "dataset '%s' has element type %s; libfsdp writes %s: its type description "
                     "was changed or damaged (HDF5 would convert every value by it); restore the "
                     "file from the same save or use an earlier checkpoint",
                     path, got, wants);
}

/* Where the dataset's filters are: zstd first and Fletcher32 last, each optional, nothing else
 * (shuffle, scale-offset, n-bit and others could change values). -1: absent. */
typedef struct pipeline {
    int zstd, fletcher, n;
} pipeline;

static fsdp_status check_pipeline(fsdp_ctx *ctx, hid_t dcpl, const char *path, pipeline *p) {
    *p = (pipeline){.zstd = -1, .fletcher = -1, .n = H5Pget_nfilters(dcpl)};
    int bad = -1;
    for (int i = 0; i < p->n && bad < 0; i++) {
        unsigned flags, cd[8];
        size_t n_cd = 8;
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &n_cd, cd, 0, NULL, NULL);
        if (id == FSDP_H5Z_ZSTD && i == 0)
            p->zstd = i;
        else if (id == H5Z_FILTER_FLETCHER32 && i == p->n - 1)
            p->fletcher = i;
        else
            bad = (int)id;
    }
    H5Eclear2(H5E_DEFAULT);
    if (p->n >= 0 && p->n <= 2 && bad < 0) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "dataset '%s' has %d filters (filter %d among them); libfsdp stores values "
                     "through zstd (32015) and Fletcher32 only, in that order: another filter "
                     "could change the values; the file was not written by libfsdp or was "
                     "tampered with",
                     path, p->n, bad);
}

static fsdp_status not_all_there(fsdp_ctx *ctx, const char *path) {
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "dataset '%s' is not all in its file (chunks missing, never written or "
                     "truncated): the file is damaged or was not written by libfsdp",
                     path);
}

/* Chunk `index` (at grid position off) stored in `size` bytes with filter_mask `mask`: what
 * it holds must go through every filter, and uncompressed it is exactly the chunk's bytes and
 * the 4-byte checksum (HDF5 would copy a whole chunk out of a shorter buffer). */
static fsdp_status check_chunk(fsdp_ctx *ctx, const char *path, const pipeline *p, uint64_t index,
                               unsigned mask, hsize_t size, hsize_t bytes) {
    bool zstd = p->zstd >= 0 && !(mask & (1u << p->zstd));
    bool sum = p->fletcher >= 0 && !(mask & (1u << p->fletcher));
    hsize_t want = zstd ? 1 + (sum ? 4 : 0) : bytes + (sum ? 4 : 0);
    if (zstd ? size < want : size != want)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "chunk %llu of dataset '%s' is stored in %llu bytes; %s it holds %llu "
                         "(%llu bytes of values%s): the file is damaged or was not written by "
                         "libfsdp; restore it from the same save or use an earlier checkpoint",
                         (unsigned long long)index, path, (unsigned long long)size,
                         zstd ? "compressed, at least" : "uncompressed,", (unsigned long long)want,
                         (unsigned long long)bytes, sum ? " and a 4-byte checksum" : "");
    if (mask & ((1u << p->n) - 1u))
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "chunk %llu of dataset '%s' is stored with filters skipped (filter "
                         "mask 0x%x): its values were never compressed or checksummed as "
                         "libfsdp writes them; the file was tampered with or not written by "
                         "libfsdp; restore it from the same save or use an earlier checkpoint",
                         (unsigned long long)index, path, mask);
    return FSDP_OK;
}

/* Every chunk of the grid, in row-major grid order: present, stored whole, every filter
 * applied. The count is checked first (H5Dget_num_chunks walks the chunk index, which the file
 * bounds), so a shape that claims more chunks than the file holds is refused before the grid is
 * walked. */
static fsdp_status check_chunks(fsdp_ctx *ctx, hid_t ds, hid_t dcpl, const char *path, int ndim,
                                const hsize_t *dims, size_t elem) {
    pipeline p;
    FSDP_TRY_AT(ctx, check_pipeline(ctx, dcpl, path, &p));
    hsize_t chunk[FSDP_MAX_DIMS], want = 1, have = 0, bytes = elem;
    if (ndim < 1 || H5Pget_chunk(dcpl, FSDP_MAX_DIMS, chunk) != ndim)
        return not_all_there(ctx, path);
    for (int d = 0; d < ndim; d++) {
        if (chunk[d] == 0) return not_all_there(ctx, path);
        want *= (dims[d] + chunk[d] - 1) / chunk[d]; /* <= numel: no overflow */
        bytes *= chunk[d];                           /* HDF5 bounds a chunk to 4 GiB */
    }
    hid_t space = H5Dget_space(ds); /* HDF5 1.10 refuses H5S_ALL here */
    bool counted = space >= 0 && H5Dget_num_chunks(ds, space, &have) >= 0 && have == want;
    if (space >= 0) H5Sclose(space);
    H5Eclear2(H5E_DEFAULT);
    if (!counted) return not_all_there(ctx, path);
    hsize_t at[FSDP_MAX_DIMS] = {0};
    for (uint64_t index = 0; index < want; index++) {
        unsigned mask = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (H5Dget_chunk_info_by_coord(ds, at, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF) {
            H5Eclear2(H5E_DEFAULT);
            return not_all_there(ctx, path);
        }
        FSDP_TRY_AT(ctx, check_chunk(ctx, path, &p, index, mask, size, bytes));
        for (int d = ndim - 1; d >= 0; d--) {
            at[d] += chunk[d];
            if (at[d] < dims[d]) break;
            at[d] = 0;
        }
    }
    return FSDP_OK;
}

/* A zstd dataset must record its chunk size (cd_values[1], as libfsdp writes it), so the
 * filter refuses a frame of any other size: HDF5 itself does not check what a filter returns.
 * Datasets without the filter pass. */
static fsdp_status check_zstd_chunk(fsdp_ctx *ctx, hid_t dcpl, const char *path, size_t elem) {
    fsdp_status s = FSDP_OK;
    unsigned flags, cd[4] = {0};
    size_t n = 4;
    if (H5Pget_filter_by_id2(dcpl, FSDP_H5Z_ZSTD, &flags, &n, cd, 0, NULL, NULL) >= 0) {
        hsize_t chunk[FSDP_MAX_DIMS] = {0};
        int nd = H5Pget_chunk(dcpl, FSDP_MAX_DIMS, chunk);
        uint64_t bytes = elem;
        for (int d = 0; d < nd; d++) bytes *= chunk[d];
        if (nd < 1 || n < 2 || cd[1] != bytes)
            s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                          "dataset '%s' is zstd-compressed without its chunk size recorded (not "
                          "written by libfsdp, or damaged); refusing to decode it",
                          path);
    }
    H5Eclear2(H5E_DEFAULT);
    return FSDP_PASS(ctx, s);
}

/* The storage holds all of the dataset, as libfsdp writes it: HDF5 returns fill values for
 * what was never written, so a dataset whose shape claims more than the file holds would read
 * as zeros, and a table's shape would size an allocation that nothing in the file backs. */
static fsdp_status check_storage(fsdp_ctx *ctx, hid_t ds, const char *path, int ndim,
                                 const hsize_t *dims, size_t elem) {
    hsize_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] && numel > (HSIZE_UNDEF / 2) / elem / dims[d]) return not_all_there(ctx, path);
        numel *= dims[d];
    }
    if (numel == 0) return FSDP_OK;
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0) return h5_fail(ctx, "cannot read the storage of dataset", path);
    H5D_layout_t layout = H5Pget_layout(dcpl);
    fsdp_status s = FSDP_OK;
    if (layout == H5D_CHUNKED) {
        s = check_chunks(ctx, ds, dcpl, path, ndim, dims, elem);
        if (s == FSDP_OK) s = check_zstd_chunk(ctx, dcpl, path, elem);
    } else if (H5Pget_nfilters(dcpl) != 0) {
        s = FSDP_FAIL(ctx, FSDP_ERR_IO, "dataset '%s' has filters without chunks", path);
    } else if (layout != H5D_COMPACT &&
               !(layout == H5D_CONTIGUOUS && H5Dget_storage_size(ds) >= numel * elem)) {
        s = not_all_there(ctx, path);
    }
    H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return FSDP_PASS(ctx, s);
}

fsdp_status h5_dataset_open(fsdp_ctx *ctx, hid_t file, const char *path, hid_t ftype, int ndim,
                            const hsize_t *want, hid_t *ds, hsize_t *dims) {
    *ds = H5Dopen2(file, path, H5P_DEFAULT);
    if (*ds < 0) return h5_fail(ctx, "missing dataset", path);
    hid_t space = H5Dget_space(*ds);
    int nd = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    bool ok = nd == ndim;
    if (ok && ndim > 0) H5Sget_simple_extent_dims(space, dims, NULL);
    for (int d = 0; ok && want && d < ndim; d++) ok = dims[d] == want[d];
    if (space >= 0) H5Sclose(space);
    fsdp_status s = ok ? FSDP_OK
                       : FSDP_FAIL(ctx, FSDP_ERR_IO,
                                   "dataset '%s' has another rank or shape than its metadata says "
                                   "(the file was changed or belongs to another checkpoint)",
                                   path);
    if (s == FSDP_OK) s = check_type(ctx, *ds, path, ftype);
    if (s == FSDP_OK) s = check_storage(ctx, *ds, path, ndim, dims, H5Tget_size(ftype));
    if (s != FSDP_OK) H5Dclose(*ds);
    return FSDP_PASS(ctx, s);
}

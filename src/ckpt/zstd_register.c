/* zstd_register.c: makes the zstd filter (zstd_filter.c) available to libfsdp's HDF5, once per
 * process, with a set_local that records each dataset's chunk size in cd_values[1] so that a
 * read can hold every frame to it. */
#include <H5Epublic.h>
#include <H5Ppublic.h>
#include <H5Spublic.h>
#include <H5Tpublic.h>
#include <H5public.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/zstd_filter.h"
#include "core/error.h" // defines: FSDP_FAIL

/* The bytes of one chunk of a dataset of `type` with chunking from dcpl; 0 when not known (no
 * chunking, variable-length elements), SIZE_MAX when over FSDP_ZSTD_MAX_CHUNK_BYTES. */
static size_t chunk_bytes_of(hid_t dcpl, hid_t type) {
    hsize_t dims[H5S_MAX_RANK];
    int rank = H5Pget_chunk(dcpl, H5S_MAX_RANK, dims);
    size_t bytes = H5Tget_size(type);
    if (rank <= 0 || bytes == 0) return 0;
    if (H5Tdetect_class(type, H5T_VLEN) > 0 || H5Tis_variable_str(type) > 0) return 0;
    for (int i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > FSDP_ZSTD_MAX_CHUNK_BYTES / bytes) return SIZE_MAX;
        bytes *= (size_t)dims[i];
    }
    return bytes;
}

/* set_local: cd_values becomes {level (default FSDP_ZSTD_LEVEL_DEFAULT), chunk bytes}. A chunk
 * over the limit fails the dataset's creation, naming the limit. */
static herr_t zstd_set_local(hid_t dcpl, hid_t type, hid_t space) {
    (void)space;
    unsigned flags, cd[FSDP_ZSTD_CD_COUNT] = {FSDP_ZSTD_LEVEL_DEFAULT, 0};
    size_t n = FSDP_ZSTD_CD_COUNT;
    if (H5Pget_filter_by_id2(dcpl, FSDP_H5Z_ZSTD, &flags, &n, cd, 0, NULL, NULL) < 0) return -1;
    size_t bytes = chunk_bytes_of(dcpl, type);
    if (bytes == SIZE_MAX) {
        H5Epush2(H5E_DEFAULT, __FILE__, __func__, __LINE__, H5E_ERR_CLS, H5E_PLINE, H5E_BADVALUE,
                 "zstd filter: a chunk is over %zu bytes; choose smaller chunk dimensions",
                 (size_t)FSDP_ZSTD_MAX_CHUNK_BYTES);
        return -1;
    }
    cd[FSDP_ZSTD_CD_CHUNK_BYTES] = (unsigned)bytes;
    return H5Pmodify_filter(dcpl, FSDP_H5Z_ZSTD, flags, FSDP_ZSTD_CD_COUNT, cd);
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static herr_t g_registered = -1;
static char g_reason[256] = "unknown reason";

/* Walks HDF5's error stack from its innermost record: keeps the first description. */
static herr_t keep_innermost(unsigned n, const H5E_error2_t *err, void *user) {
    if (n == 0) snprintf(user, sizeof g_reason, "%s (in %s)", err->desc, err->func_name);
    return 0;
}

/* Registers the class even when HDF5 already has a filter with this id (a plugin it loaded
 * through HDF5_PLUGIN_PATH, our own libh5zstd.so included): H5Zregister replaces it, and only
 * this class records chunk sizes, so a library whose users export HDF5_PLUGIN_PATH for h5dump
 * still writes and checks them. */
static void register_once(void) {
    H5Z_class2_t cls = fsdp_zstd_filter_class;
    cls.set_local = zstd_set_local;
    H5E_BEGIN_TRY {
        g_registered = H5Zregister(&cls);
        if (g_registered < 0) H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, g_reason);
    }
    H5E_END_TRY;
}

fsdp_status fsdp_zstd_filter_register(fsdp_ctx *ctx) {
    pthread_once(&g_once, register_once);
    if (g_registered >= 0) return FSDP_OK;
    unsigned major = 0, minor = 0, release = 0;
    H5get_libversion(&major, &minor, &release);
    return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                     "cannot register the zstd filter (HDF5 filter id %d) with libhdf5 %u.%u.%u: "
                     "%s; libfsdp was built against HDF5 %d.%d.%d: run it with that libhdf5",
                     FSDP_H5Z_ZSTD, major, minor, release, g_reason, H5_VERS_MAJOR, H5_VERS_MINOR,
                     H5_VERS_RELEASE);
}

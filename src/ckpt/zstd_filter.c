/* zstd_filter.c: the zstd HDF5 filter (id 32015): its class and the function that compresses a
 * chunk into one frame and decompresses a frame without trusting it. Calls no HDF5 function,
 * so the plugin (plugin/h5zstd.c) is built from this file without linking libhdf5. */
#include "ckpt/zstd_filter.h"

#include <limits.h>
#include <stdlib.h>
#include <zstd.h>

const H5Z_class2_t fsdp_zstd_filter_class = {
    .version = H5Z_CLASS_T_VERS,
    .id = FSDP_H5Z_ZSTD,
    .encoder_present = 1,
    .decoder_present = 1,
    .name = "Zstandard compression (libfsdp): http://www.zstd.net",
    .can_apply = NULL,
    .set_local = NULL,
    .filter = fsdp_zstd_filter_apply,
};

/* cd_values[0] as a signed level, clamped to zstd's range. */
static int level_of(size_t cd_nelmts, const unsigned cd_values[]) {
    if (cd_nelmts <= FSDP_ZSTD_CD_LEVEL) return FSDP_ZSTD_LEVEL_DEFAULT;
    unsigned v = cd_values[FSDP_ZSTD_CD_LEVEL];
    long long level = v <= INT_MAX ? (long long)v : (long long)v - UINT_MAX - 1;
    if (level < ZSTD_minCLevel()) return ZSTD_minCLevel();
    if (level > ZSTD_maxCLevel()) return ZSTD_maxCLevel();
    return (int)level;
}

/* The chunk size cd_values[1] records; 0 when the dataset does not record it. */
static size_t expected_bytes(size_t cd_nelmts, const unsigned cd_values[]) {
    return cd_nelmts > FSDP_ZSTD_CD_CHUNK_BYTES ? cd_values[FSDP_ZSTD_CD_CHUNK_BYTES] : 0;
}

/* One frame with its content size and checksum in a new buffer of *cap bytes; 0 on failure. */
static size_t compress_chunk(int level, const void *src, size_t n, void **out, size_t *cap) {
    size_t bound = ZSTD_compressBound(n);
    if (n > FSDP_ZSTD_MAX_CHUNK_BYTES || ZSTD_isError(bound)) return 0;
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    void *dst = malloc(bound);
    size_t got = 0;
    if (cctx && dst &&
        !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level)) &&
        !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)))
        got = ZSTD_compress2(cctx, dst, bound, src, n);
    ZSTD_freeCCtx(cctx);
    if (got == 0 || ZSTD_isError(got)) {
        free(dst);
        return 0;
    }
    *out = dst;
    *cap = bound;
    return got;
}

/* The content size of the single frame that fills src[0, n), checked against the limit and
 * against `expected` (0: not known); 0 when the frame is not acceptable. */
static size_t checked_content_size(const void *src, size_t n, size_t expected) {
    unsigned long long size = ZSTD_getFrameContentSize(src, n);
    if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR) return 0;
    if (size == 0 || size > FSDP_ZSTD_MAX_CHUNK_BYTES) return 0;
    if (expected != 0 && size != expected) return 0;
    if (ZSTD_findFrameCompressedSize(src, n) != n) return 0; /* truncated, or bytes after it */
    return (size_t)size;
}

/* The content of the frame in src[0, n) in a new buffer; 0 on any failure. */
static size_t decompress_chunk(size_t expected, const void *src, size_t n, void **out) {
    size_t size = checked_content_size(src, n, expected);
    if (size == 0) return 0;
    void *dst = malloc(size);
    if (!dst) return 0;
    size_t got = ZSTD_decompress(dst, size, src, n);
    if (ZSTD_isError(got) || got != size) {
        free(dst);
        return 0;
    }
    *out = dst;
    return got;
}

size_t fsdp_zstd_filter_apply(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                              size_t nbytes, size_t *buf_size, void **buf) {
    void *out = NULL;
    size_t n, cap;
    if (flags & H5Z_FLAG_REVERSE) {
        n = decompress_chunk(expected_bytes(cd_nelmts, cd_values), *buf, nbytes, &out);
        cap = n;
    } else {
        n = compress_chunk(level_of(cd_nelmts, cd_values), *buf, nbytes, &out, &cap);
    }
    if (n == 0) return 0;
    free(*buf);
    *buf = out;
    *buf_size = cap;
    return n;
}

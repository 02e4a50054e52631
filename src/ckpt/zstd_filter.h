/* zstd_filter.h: the zstd compression filter of checkpoints, HDF5 filter id 32015 (the id of the
 * community HDF5 zstd plugin, which h5py's hdf5plugin also reads and writes). Internal to
 * src/ckpt and to the HDF5 plugin built from the same source (plugin/h5zstd.c). */
#ifndef FSDP_CKPT_ZSTD_FILTER_H
#define FSDP_CKPT_ZSTD_FILTER_H

#include <H5Ipublic.h> // defines: hid_t (H5Zpublic.h uses it without including it)
#include <H5Zpublic.h> // defines: H5Z_class2_t, H5Z_FLAG_REVERSE
#include <stddef.h>

#include "fsdp/ctx.h"

#define FSDP_H5Z_ZSTD           32015
#define FSDP_ZSTD_LEVEL_DEFAULT 3
/* The largest chunk the filter compresses or decompresses: a frame that claims more content is
 * refused before any allocation. */
#define FSDP_ZSTD_MAX_CHUNK_BYTES ((size_t)1 << 30)

/* The filter's cd_values:
 *   [0] the level, an int stored as unsigned (two's complement for zstd's negative levels),
 *       clamped to [ZSTD_minCLevel(), ZSTD_maxCLevel()]; default FSDP_ZSTD_LEVEL_DEFAULT.
 *   [1] the bytes of one chunk, written by the library's set_local when the dataset is
 *       created (the reference plugin reads only [0]); when present and non-zero, a chunk
 *       decompresses to exactly this size or is refused.
 * Files from other writers (the reference plugin, hdf5plugin) record only [0], and then the
 * filter cannot know the chunk size: HDF5 1.10 copies a whole chunk out of whatever the filter
 * returns, so a crafted frame shorter than its chunk makes H5Dread read past the filter's
 * buffer. A reader of untrusted files checks that [1] equals the chunk's bytes before H5Dread,
 * or reads such chunks itself (H5Dread_chunk, then fsdp_zstd_filter_apply with [1] filled in). */
#define FSDP_ZSTD_CD_LEVEL       0
#define FSDP_ZSTD_CD_CHUNK_BYTES 1
#define FSDP_ZSTD_CD_COUNT       2

/* The H5Z filter function. Forward: *buf (nbytes) becomes one zstd frame that records its
 * content size and a checksum. Reverse (H5Z_FLAG_REVERSE): *buf must hold exactly one frame whose
 * content size is known, at most FSDP_ZSTD_MAX_CHUNK_BYTES and equal to cd_values[1] when
 * given; it becomes the content. On success *buf is replaced (the old buffer freed, the new one
 * malloc'ed, *buf_size its capacity) and the new length returned; any failure returns 0 and
 * leaves *buf and *buf_size as they were (HDF5 then fails the read or write). */
size_t fsdp_zstd_filter_apply(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                              size_t nbytes, size_t *buf_size, void **buf);

/* The filter's class without set_local: what the plugin hands HDF5. The library registers a
 * copy with set_local, which records cd_values[1]. */
extern const H5Z_class2_t fsdp_zstd_filter_class;

/* Makes the filter available to this process's HDF5: registers the library's class (with
 * set_local), replacing any filter with id FSDP_H5Z_ZSTD that HDF5 loaded as a plugin (whose
 * class records no chunk size). Thread-safe; the work is done once per process and later calls
 * return its result. Fails with FSDP_ERR_UNSUPPORTED, naming HDF5's reason, when HDF5 refuses
 * the registration. */
fsdp_status fsdp_zstd_filter_register(fsdp_ctx *ctx);

#endif

/* h5zstd.c: libfsdp's zstd filter (src/ckpt/zstd_filter.c, HDF5 filter id 32015) as an HDF5
 * dynamically loaded filter plugin, for h5dump, h5py and other HDF5 programs: point
 * HDF5_PLUGIN_PATH at the folder that holds libh5zstd.so (docs/checkpoint.md). */
#include <H5PLextern.h> // defines: H5PLget_plugin_type, H5PLget_plugin_info

#include "ckpt/zstd_filter.h"

H5PL_type_t H5PLget_plugin_type(void) {
    return H5PL_TYPE_FILTER;
}

const void *H5PLget_plugin_info(void) {
    return &fsdp_zstd_filter_class;
}

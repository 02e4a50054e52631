/* import_source.c: the element types of a state dict that import reads (import_source.h). */
#include "ckpt/import_source.h"

size_t import_dtype_size(import_dtype d) {
    return d == IMPORT_F64 ? 8 : d == IMPORT_F32 ? 4 : 2;
}

/* array.c: fsdp_array_reserve, the growable array every layer uses. */
#include <stdlib.h>

#include "core/array.h"

#define FIRST_CAP 8

bool fsdp_array_reserve(void **items, int64_t *cap, int64_t need, size_t elem_size) {
    if (need <= *cap) return true;
    int64_t grown = *cap > 0 ? *cap : FIRST_CAP;
    while (grown < need) {
        if (grown > INT64_MAX / 2) return false;
        grown *= 2;
    }
    if (elem_size == 0 || (uint64_t)grown > SIZE_MAX / elem_size) return false;
    void *p = realloc(*items, (size_t)grown * elem_size);
    if (!p) return false;
    *items = p;
    *cap = grown;
    return true;
}

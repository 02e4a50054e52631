/* array.h: the one growable array of libfsdp: room for more elements of any size in an array
 * that the caller keeps as a pointer and a capacity, doubled as it fills. */
#ifndef FSDP_CORE_ARRAY_H
#define FSDP_CORE_ARRAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Makes *items, an array with room for *cap elements of elem_size bytes (NULL and 0 at first),
 * hold at least `need`. When need > *cap the capacity doubles, from *cap or from 8 when it is
 * 0, until it covers need, and *items is reallocated; the elements kept stay as they were.
 * Returns false when the byte count would overflow or memory runs out, leaving *items and
 * *cap as they were (the caller reports it, naming what it was growing). The array is the
 * caller's, freed with free(). */
bool fsdp_array_reserve(void **items, int64_t *cap, int64_t need, size_t elem_size);

#endif

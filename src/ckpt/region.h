/* region.h: box arithmetic over global tensors for the checkpoint layer: a flat range of a
 * block cut into boxes, intersection, subtraction, and copying a box between buffers laid out
 * as other boxes. Internal to src/ckpt. */
#ifndef FSDP_CKPT_REGION_H
#define FSDP_CKPT_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/ckpt.h" // defines: fsdp_state_region

typedef fsdp_state_region region;

int64_t region_numel(const region *r);
/* Whether a and b (same ndim) overlap; *out (may be NULL) receives the overlap. */
bool region_intersect(const region *a, const region *b, region *out);
bool region_equal(const region *a, const region *b);
/* Whether r lies inside a tensor of the given shape (offsets >= 0, ends <= shape, no overflow). */
bool region_inside(const region *r, int ndim, const int64_t *shape);
/* a minus b as at most 2 * ndim disjoint boxes written to out; returns how many. */
int region_subtract(const region *a, const region *b, region *out);

/* Cuts elements [lo, hi) of a block (row-major, ndim dims of size len, placed at `offset` in
 * the global tensor) into boxes of the global tensor, in flat order, so that each box's values
 * are contiguous in the block. Calls emit for each; returns the first non-zero emit result. */
typedef int (*region_emit_fn)(const region *box, void *user);
int region_from_flat_range(int ndim, const int64_t *offset, const int64_t *len, int64_t lo,
                           int64_t hi, region_emit_fn emit, void *user);

/* Copies the elements of `part` (inside both src_box and dst_box) from a buffer holding src_box
 * row-major to a buffer holding dst_box row-major; elements of `size` bytes. */
void region_copy(void *dst, const region *dst_box, const void *src, const region *src_box,
                 const region *part, size_t size);

/* "[0:3, 4:8]" into buf; returns buf. */
const char *region_to_string(const region *r, char *buf, size_t size);

#endif

/* region.c: box arithmetic for the checkpoint layer (see region.h). */
#include "ckpt/region.h"

#include <stdio.h>
#include <string.h>

int64_t region_numel(const region *r) {
    int64_t n = 1;
    for (int d = 0; d < r->ndim; d++) n *= r->count[d];
    return n;
}

bool region_intersect(const region *a, const region *b, region *out) {
    region o = {.ndim = a->ndim};
    for (int d = 0; d < a->ndim; d++) {
        int64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        int64_t ha = a->offset[d] + a->count[d], hb = b->offset[d] + b->count[d];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo) return false;
        o.offset[d] = lo;
        o.count[d] = hi - lo;
    }
    if (out) *out = o;
    return true;
}

bool region_equal(const region *a, const region *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->offset[d] != b->offset[d] || a->count[d] != b->count[d]) return false;
    return true;
}

bool region_inside(const region *r, int ndim, const int64_t *shape) {
    if (r->ndim != ndim || ndim < 0 || ndim > FSDP_MAX_DIMS) return false;
    for (int d = 0; d < ndim; d++)
        if (r->offset[d] < 0 || r->count[d] < 0 || r->offset[d] > shape[d] ||
            r->count[d] > shape[d] - r->offset[d])
            return false;
    return true;
}

int region_subtract(const region *a, const region *b, region *out) {
    region cut;
    if (!region_intersect(a, b, &cut)) {
        out[0] = *a;
        return 1;
    }
    int n = 0;
    region rest = *a;
    for (int d = 0; d < a->ndim; d++) {
        int64_t end = rest.offset[d] + rest.count[d], cut_end = cut.offset[d] + cut.count[d];
        if (rest.offset[d] < cut.offset[d]) {
            out[n] = rest;
            out[n++].count[d] = cut.offset[d] - rest.offset[d];
        }
        if (end > cut_end) {
            out[n] = rest;
            out[n].offset[d] = cut_end;
            out[n++].count[d] = end - cut_end;
        }
        rest.offset[d] = cut.offset[d];
        rest.count[d] = cut.count[d];
    }
    return n;
}

/* Elements [lo, hi) of dims d.. of the block, the dims before d fixed in *box. */
static int flat_range(int d, int ndim, const int64_t *offset, const int64_t *len, int64_t lo,
                      int64_t hi, region *box, region_emit_fn emit, void *user) {
    if (lo >= hi) return 0;
    if (d == ndim - 1) {
        box->offset[d] = offset[d] + lo;
        box->count[d] = hi - lo;
        return emit(box, user);
    }
    int64_t inner = 1;
    for (int k = d + 1; k < ndim; k++) inner *= len[k];
    int64_t first = lo / inner, last = hi / inner; /* the rows holding lo and hi */
    int rc = 0;
    if (lo % inner) { /* a partial first row */
        box->offset[d] = offset[d] + first;
        box->count[d] = 1;
        int64_t end = first == last ? hi - first * inner : inner;
        rc = flat_range(d + 1, ndim, offset, len, lo - first * inner, end, box, emit, user);
        if (rc || first == last) return rc;
        first++;
    }
    if (last > first) { /* whole rows */
        box->offset[d] = offset[d] + first;
        box->count[d] = last - first;
        for (int k = d + 1; k < ndim; k++) {
            box->offset[k] = offset[k];
            box->count[k] = len[k];
        }
        if ((rc = emit(box, user))) return rc;
    }
    if (hi > last * inner) { /* a partial last row */
        box->offset[d] = offset[d] + last;
        box->count[d] = 1;
        rc = flat_range(d + 1, ndim, offset, len, 0, hi - last * inner, box, emit, user);
    }
    return rc;
}

int region_from_flat_range(int ndim, const int64_t *offset, const int64_t *len, int64_t lo,
                           int64_t hi, region_emit_fn emit, void *user) {
    region box = {.ndim = ndim};
    if (ndim == 0) return lo < hi ? emit(&box, user) : 0;
    return flat_range(0, ndim, offset, len, lo, hi, &box, emit, user);
}

/* Row-major element strides of a box. */
static void strides_of(const region *box, int64_t *stride) {
    int64_t s = 1;
    for (int d = box->ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= box->count[d];
    }
}

void region_copy(void *dst, const region *dst_box, const void *src, const region *src_box,
                 const region *part, size_t size) {
    int nd = part->ndim;
    if (region_numel(part) == 0) return;
    if (nd == 0) {
        memcpy(dst, src, size);
        return;
    }
    int64_t ds[FSDP_MAX_DIMS], ss[FSDP_MAX_DIMS], idx[FSDP_MAX_DIMS] = {0};
    strides_of(dst_box, ds);
    strides_of(src_box, ss);
    size_t row = (size_t)part->count[nd - 1] * size;
    for (;;) {
        int64_t di = 0, si = 0;
        for (int d = 0; d < nd; d++) {
            int64_t g = part->offset[d] + (d < nd - 1 ? idx[d] : 0);
            di += (g - dst_box->offset[d]) * ds[d];
            si += (g - src_box->offset[d]) * ss[d];
        }
        memcpy((char *)dst + (size_t)di * size, (const char *)src + (size_t)si * size, row);
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == part->count[d]) idx[d--] = 0;
        if (d < 0) return;
    }
}

const char *region_to_string(const region *r, char *buf, size_t size) {
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < r->ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld:%lld", d ? ", " : "",
                                 (long long)r->offset[d], (long long)(r->offset[d] + r->count[d]));
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

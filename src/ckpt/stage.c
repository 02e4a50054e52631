/* stage.c: an async save's host copies of the held pieces (stage.h): one buffer per piece,
 * pinned host memory of the piece's device kind, filled by one device-to-host copy (a memcpy
 * on the CPU), released when the save's job is. */
#include "ckpt/stage.h"

#include <stdlib.h>

#include "core/error.h"
#include "core/stream.h"

typedef struct slot {
    void *host; /* NULL until staged; fsdp_host_alloc'ed on `type` */
    fsdp_device_type type;
    region box;
} slot;

struct ckpt_stage {
    int n_entries;
    int *first; /* entry i's pieces are slots[first[i] .. first[i + 1]) */
    fsdp_dtype *dtypes;
    slot *slots;
    size_t bytes;
};

fsdp_status ckpt_stage_create(fsdp_ctx *ctx, const fsdp_state *st, ckpt_stage **out) {
    ckpt_stage *sg = calloc(1, sizeof *sg);
    int n = 0;
    for (int i = 0; i < st->n_entries; i++) n += st->entries[i].n_pieces;
    if (sg) {
        sg->n_entries = st->n_entries;
        sg->first = calloc((size_t)st->n_entries + 1, sizeof *sg->first);
        sg->dtypes = calloc((size_t)st->n_entries + 1, sizeof *sg->dtypes);
        sg->slots = calloc((size_t)n + 1, sizeof *sg->slots);
    }
    if (!sg || !sg->first || !sg->dtypes || !sg->slots) {
        ckpt_stage_free(sg);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "async checkpoint staging");
    }
    for (int i = 0, at = 0; i < st->n_entries; i++) {
        const state_entry *e = &st->entries[i];
        sg->first[i] = at;
        sg->dtypes[i] = e->dtype;
        for (int k = 0; k < e->n_pieces; k++, at++) {
            sg->slots[at].box = e->pieces[k].box;
            sg->slots[at].type = fsdp_tensor_device(e->pieces[k].src).type;
        }
        sg->first[i + 1] = at;
    }
    *out = sg;
    return FSDP_OK;
}

fsdp_status ckpt_stage_piece(fsdp_ctx *ctx, ckpt_stage *sg, const fsdp_state *st, int i, int k) {
    slot *s = &sg->slots[sg->first[i] + k];
    if (s->host) return FSDP_OK;
    const state_entry *e = &st->entries[i];
    size_t bytes = (size_t)region_numel(&s->box) * fsdp_dtype_size(e->dtype);
    void *p = NULL;
    /* host_alloc wants at least a byte; an empty piece still gets a buffer */
    FSDP_TRY_AT(ctx, fsdp_host_alloc(ctx, s->type, bytes ? bytes : 1, &p));
    fsdp_status st_read = state_piece_read(ctx, e, k, p);
    if (st_read != FSDP_OK) {
        fsdp_host_free(s->type, p);
        return FSDP_PASS(ctx, st_read);
    }
    s->host = p;
    sg->bytes += bytes;
    return FSDP_OK;
}

fsdp_status ckpt_stage_values(fsdp_ctx *ctx, const ckpt_stage *sg, int i, int k, const region *box,
                              const void **data, void **owned) {
    const slot *s = &sg->slots[sg->first[i] + k];
    FSDP_ASSERT(s->host); /* save.c stages every piece a fragment reads */
    *owned = NULL;
    if (region_equal(box, &s->box)) {
        *data = s->host;
        return FSDP_OK;
    }
    size_t size = fsdp_dtype_size(sg->dtypes[i]);
    void *part = malloc((size_t)region_numel(box) * size + 1);
    if (!part) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "async checkpoint write");
    region_copy(part, box, s->host, &s->box, box, size);
    *data = *owned = part;
    return FSDP_OK;
}

size_t ckpt_stage_bytes(const ckpt_stage *sg) {
    return sg ? sg->bytes : 0;
}

void ckpt_stage_free(ckpt_stage *sg) {
    if (!sg) return;
    int n = sg->first ? sg->first[sg->n_entries] : 0;
    for (int j = 0; sg->slots && j < n; j++) fsdp_host_free(sg->slots[j].type, sg->slots[j].host);
    free(sg->first);
    free(sg->dtypes);
    free(sg->slots);
    free(sg);
}

/* stage.c: an async save's host copies of the held pieces (stage.h): the marked pieces laid out
 * one after another in one buffer per device kind, pinned host memory of that kind
 * (fsdp_host_alloc), each filled by one device-to-host copy (a memcpy on the CPU) on the
 * calling thread's current stream; released with the save's job. */
#include "ckpt/stage.h"

#include <stdlib.h>

#include "core/error.h"
#include "core/stream.h"

typedef struct slot {
    bool marked;
    fsdp_device_type type;
    size_t at, bytes; /* where in its kind's buffer, how many */
    region box;
} slot;

struct ckpt_stage {
    int n_entries;
    int *first; /* entry i's pieces are slots[first[i] .. first[i + 1]) */
    fsdp_dtype *dtypes;
    slot *slots;
    char *buf[FSDP_DEVICE_KINDS]; /* per device kind; NULL when none is staged */
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
            slot *s = &sg->slots[at];
            s->box = e->pieces[k].box;
            s->type = fsdp_tensor_device(e->pieces[k].src).type;
            s->bytes = (size_t)region_numel(&s->box) * fsdp_dtype_size(e->dtype);
        }
        sg->first[i + 1] = at;
    }
    *out = sg;
    return FSDP_OK;
}

void ckpt_stage_mark(ckpt_stage *sg, int i, int k) {
    sg->slots[sg->first[i] + k].marked = true;
}

fsdp_status ckpt_stage_copy(fsdp_ctx *ctx, ckpt_stage *sg, const fsdp_state *st) {
    size_t total[FSDP_DEVICE_KINDS] = {0};
    int n = sg->first[sg->n_entries];
    for (int j = 0; j < n; j++) {
        slot *s = &sg->slots[j];
        FSDP_ASSERT(s->type >= 0 && s->type < FSDP_DEVICE_KINDS);
        if (!s->marked) continue;
        s->at = total[s->type];
        total[s->type] += (s->bytes + CKPT_STAGE_ALIGN - 1) / CKPT_STAGE_ALIGN * CKPT_STAGE_ALIGN;
    }
    for (int t = 0; t < FSDP_DEVICE_KINDS; t++) {
        void *p = NULL;
        if (total[t]) FSDP_TRY_AT(ctx, fsdp_host_alloc(ctx, (fsdp_device_type)t, total[t], &p));
        sg->buf[t] = p;
    }
    for (int i = 0; i < st->n_entries; i++)
        for (int k = 0; k < st->entries[i].n_pieces; k++) {
            const slot *s = &sg->slots[sg->first[i] + k];
            if (s->marked && s->bytes)
                FSDP_TRY_AT(ctx,
                            state_piece_read(ctx, &st->entries[i], k, sg->buf[s->type] + s->at));
        }
    return FSDP_OK;
}

fsdp_status ckpt_stage_values(fsdp_ctx *ctx, const ckpt_stage *sg, int i, int k, const region *box,
                              const void **data, void **owned) {
    const slot *s = &sg->slots[sg->first[i] + k];
    FSDP_ASSERT(s->marked); /* save.c marks every piece a fragment reads */
    const char *piece = sg->buf[s->type] + s->at;
    *owned = NULL;
    if (region_equal(box, &s->box)) {
        *data = piece;
        return FSDP_OK;
    }
    size_t size = fsdp_dtype_size(sg->dtypes[i]);
    void *part = malloc((size_t)region_numel(box) * size + 1);
    if (!part) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "async checkpoint write");
    region_copy(part, box, piece, &s->box, box, size);
    *data = *owned = part;
    return FSDP_OK;
}

void ckpt_stage_free(ckpt_stage *sg) {
    if (!sg) return;
    for (int t = 0; t < FSDP_DEVICE_KINDS; t++) fsdp_host_free((fsdp_device_type)t, sg->buf[t]);
    free(sg->first);
    free(sg->dtypes);
    free(sg->slots);
    free(sg);
}

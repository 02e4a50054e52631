/* load.c: opening a checkpoint and reading it back at any layout: a region is read from the
 * saved pieces that overlap it (hyperslabs of their datasets), so each rank reads only what
 * it holds under its own layout. */
#define _POSIX_C_SOURCE 200809L /* strdup, strnlen, stpcpy, fsync */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/dir.h"
#include "ckpt/h5.h"
#include "ckpt/state_impl.h"
#include "ckpt/zstd_filter.h"
#include "core/error.h"

fsdp_status fsdp_ckpt_open(fsdp_ctx *ctx, const char *path, fsdp_ckpt **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, path);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    FSDP_TRY_AT(ctx, ckpt_dir_check_committed(ctx, path));
    fsdp_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(path))) {
        free(ck);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_ckpt_open");
    }
    fsdp_status s = ckpt_meta_read(ctx, path, &ck->meta);
    if (s == FSDP_OK && (!(ck->files = malloc((size_t)ck->meta.world_size * sizeof *ck->files)) ||
                         !(ck->verified = calloc((size_t)ck->meta.n_pieces + 1, 1))))
        s = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_ckpt_open");
    if (s != FSDP_OK) {
        free(ck->files);
        ckpt_meta_free(&ck->meta); /* zeroed when the read failed */
        free(ck->path);
        free(ck);
        return FSDP_PASS(ctx, s);
    }
    for (int64_t r = 0; r < ck->meta.world_size; r++) ck->files[r] = -1;
    ck->lock_ms = h5_lock_ms(ctx);
    if (!ck->meta.bound)
        fsdp_log(ctx, FSDP_LOG_WARN,
                 "checkpoint '%s' has format %lld, from before shard files were bound to their "
                 "metadata: a shard of another save in its directory would not be noticed, and "
                 "its values have no digests to check; it loads as before; save it again to "
                 "write format %d",
                 path, (long long)ck->meta.version, FSDP_CKPT_FORMAT_VERSION);
    *out = ck;
    return FSDP_OK;
}

void fsdp_ckpt_close(fsdp_ckpt *ck) {
    if (!ck) return;
    if (h5_lock_within(ck->lock_ms)) { /* not taken: the files stay open */
        for (int64_t r = 0; ck->files && r < ck->meta.world_size; r++)
            if (ck->files[r] >= 0) H5Fclose(ck->files[r]);
        h5_unlock();
    }
    free(ck->files);
    free(ck->verified);
    ckpt_meta_free(&ck->meta);
    free(ck->path);
    free(ck);
}

int64_t fsdp_ckpt_step(const fsdp_ckpt *ck) {
    return ck ? ck->meta.step : -1;
}
int fsdp_ckpt_world_size(const fsdp_ckpt *ck) {
    return ck ? (int)ck->meta.world_size : 0;
}
const char *fsdp_ckpt_layout(const fsdp_ckpt *ck) {
    return ck ? ck->meta.layout : "";
}
const char *fsdp_ckpt_config(const fsdp_ckpt *ck) {
    return ck ? ck->meta.config : "";
}
const char *fsdp_ckpt_model_config(const fsdp_ckpt *ck) {
    return ck && ck->meta.model_config ? ck->meta.model_config : "";
}
const char *fsdp_ckpt_library_version(const fsdp_ckpt *ck) {
    return ck ? ck->meta.library_version : "";
}
int64_t fsdp_ckpt_optim_steps(const fsdp_ckpt *ck) {
    return ck ? ck->meta.optim_steps : 0;
}
int fsdp_ckpt_format_version(const fsdp_ckpt *ck) {
    return ck ? (int)ck->meta.version : 0;
}

fsdp_status fsdp_ckpt_extra(fsdp_ctx *ctx, const fsdp_ckpt *ck, const char *name, int64_t *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, name);
    FSDP_ARG_NOT_NULL(ctx, out);
    for (int i = 0; i < ck->meta.n_extras; i++)
        if (!strcmp(ck->meta.extra_name[i], name)) {
            *out = ck->meta.extra_value[i];
            return FSDP_OK;
        }
    return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND, "checkpoint '%s' has no value '%s'", ck->path, name);
}

int fsdp_ckpt_num_tensors(const fsdp_ckpt *ck) {
    return ck ? ck->meta.n_tensors : 0;
}

int fsdp_ckpt_find(const fsdp_ckpt *ck, const char *name) {
    for (int i = 0; ck && name && i < ck->meta.n_tensors; i++)
        if (!strcmp(ck->meta.tensors[i].name, name)) return i;
    return -1;
}

fsdp_status fsdp_ckpt_tensor_get(fsdp_ctx *ctx, const fsdp_ckpt *ck, int t, fsdp_ckpt_tensor *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (t < 0 || t >= ck->meta.n_tensors)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "checkpoint tensor %d does not exist", t);
    const ckpt_tensor *x = &ck->meta.tensors[t];
    *out = (fsdp_ckpt_tensor){.name = x->name,
                              .kind = x->kind,
                              .dtype = x->dtype,
                              .ndim = x->ndim,
                              .n_pieces = x->n_pieces};
    memcpy(out->shape, x->shape, sizeof out->shape);
    return FSDP_OK;
}

fsdp_status fsdp_ckpt_piece_get(fsdp_ctx *ctx, const fsdp_ckpt *ck, int t, int k,
                                fsdp_ckpt_piece *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (t < 0 || t >= ck->meta.n_tensors || k < 0 || k >= ck->meta.tensors[t].n_pieces)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "checkpoint piece %d of tensor %d does "
                         "not exist",
                         k, t);
    const ckpt_piece *p = &ck->meta.pieces[ck->meta.tensors[t].first_piece + k];
    *out = (fsdp_ckpt_piece){.file_rank = p->file_rank, .id = p->id, .region = p->box};
    return FSDP_OK;
}

/* The shard file of rank r, opened once, and (format 2) checked to be bound to this checkpoint
 * as rank r (call with the HDF5 lock held). A process that only reads (never saved) must
 * register the zstd filter before it reads a compressed dataset. */
static fsdp_status shard_file(fsdp_ctx *ctx, fsdp_ckpt *ck, int r, hid_t *out) {
    if (ck->files[r] < 0) {
        FSDP_TRY_AT(ctx, fsdp_zstd_filter_register(ctx));
        char path[4200], name[32];
        ckpt_shard_path(ck->path, r, path, sizeof path);
        snprintf(name, sizeof name, "shard-%05d.h5", r);
        hid_t f;
        FSDP_TRY_AT(ctx, h5_open(ctx, path, &f));
        fsdp_status s = ck->meta.bound ? ckpt_shard_check(ctx, f, name, r, ck->meta.id) : FSDP_OK;
        if (s != FSDP_OK) {
            H5Fclose(f);
            return FSDP_PASS(ctx, s);
        }
        ck->files[r] = f;
    }
    *out = ck->files[r];
    return FSDP_OK;
}

fsdp_status fsdp_ckpt_check_shard(fsdp_ctx *ctx, fsdp_ckpt *ck, int rank) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    if (rank < 0 || rank >= ck->meta.world_size)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_ckpt_check_shard: rank %d; the checkpoint has shards 0..%lld", rank,
                         (long long)ck->meta.world_size - 1);
    hid_t f;
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    fsdp_status s = shard_file(ctx, ck, rank, &f);
    h5_unlock();
    return FSDP_PASS(ctx, s);
}

fsdp_status fsdp_ckpt_piece_stored_bytes(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, int k, int64_t *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_ckpt_piece p;
    FSDP_TRY_AT(ctx, fsdp_ckpt_piece_get(ctx, ck, t, k, &p));
    const char *name = ck->meta.tensors[t].name;
    char ds[FSDP_STATE_NAME_MAX + 32];
    ckpt_piece_dataset(name, p.id, ds, sizeof ds);
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    hid_t file;
    fsdp_status s = shard_file(ctx, ck, p.file_rank, &file);
    *out = s == FSDP_OK ? h5_stored_bytes(file, ds) : -1;
    h5_unlock();
    FSDP_TRYF(ctx, s, "tensor '%s'", name);
    if (*out < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "checkpoint '%s': shard-%05d.h5 has no dataset '%s'",
                         ck->path, p.file_rank, ds);
    return FSDP_OK;
}

/* ---- reading pieces, checking their digests ---- */

#define READ_BUDGET ((size_t)8 << 20) /* bytes of a piece held at once while it is checked */

/* A piece read whole for its digest; the part of it inside `part` copied to dst (laid out as
 * dst_box), when dst is given. */
typedef struct piece_read {
    ckpt_digest d;
    const region *part, *dst_box;
    void *dst;
    size_t elem;
} piece_read;

static fsdp_status take_slab(fsdp_ctx *ctx, const region *slab, const void *values, void *user) {
    piece_read *r = user;
    region cut;
    ckpt_digest_values(&r->d, values, (size_t)region_numel(slab), r->elem);
    if (r->dst && region_intersect(slab, r->part, &cut))
        region_copy(r->dst, r->dst_box, values, slab, &cut, r->elem);
    (void)ctx;
    return FSDP_OK;
}

/* Piece `pi` (its `part` into dst laid out as dst_box): the first time (format 2), read whole
 * and checked against its digest; afterwards, and in format 1, only the part. Call with the
 * HDF5 lock held. */
static fsdp_status read_piece(fsdp_ctx *ctx, fsdp_ckpt *ck, int pi, const region *part, void *dst,
                              const region *dst_box) {
    const ckpt_piece *p = &ck->meta.pieces[pi];
    const ckpt_tensor *x = &ck->meta.tensors[p->tensor];
    hid_t file;
    FSDP_TRYF(ctx, shard_file(ctx, ck, p->file_rank, &file), "tensor '%s'", x->name);
    char ds[FSDP_STATE_NAME_MAX + 32];
    ckpt_piece_dataset(x->name, p->id, ds, sizeof ds);
    if (!ck->meta.bound || ck->verified[pi]) {
        if (!dst) return FSDP_OK;
        FSDP_TRYF(ctx, h5_read_part(ctx, file, ds, x->dtype, &p->box, part, dst, dst_box),
                  "tensor '%s' in shard-%05d.h5", x->name, p->file_rank);
        return FSDP_OK;
    }
    piece_read r = {
        .part = part, .dst_box = dst_box, .dst = dst, .elem = fsdp_dtype_size(x->dtype)};
    ckpt_digest_init(&r.d);
    FSDP_TRYF(ctx, h5_read_rows(ctx, file, ds, x->dtype, &p->box, READ_BUDGET, take_slab, &r),
              "tensor '%s' in shard-%05d.h5", x->name, p->file_rank);
    uint64_t got = ckpt_digest_final(&r.d);
    if (got != p->digest)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "tensor '%s' in shard-%05d.h5: dataset '%s' holds other values than its "
                         "save wrote (digest %016llx, metadata.h5 records %016llx): the shard was "
                         "changed after the save or comes from another one; restore it from the "
                         "same save or use an earlier checkpoint",
                         x->name, p->file_rank, ds, (unsigned long long)got,
                         (unsigned long long)p->digest);
    ck->verified[pi] = true;
    return FSDP_OK;
}

static fsdp_status read_locked(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, const region *want, void *dst) {
    const ckpt_tensor *x = &ck->meta.tensors[t];
    for (int k = 0; k < x->n_pieces; k++) {
        region part;
        if (region_intersect(&ck->meta.pieces[x->first_piece + k].box, want, &part))
            FSDP_TRY_AT(ctx, read_piece(ctx, ck, x->first_piece + k, &part, dst, want));
    }
    return FSDP_OK;
}

fsdp_status fsdp_ckpt_read(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, const fsdp_state_region *want,
                           void *dst) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL_AS(ctx, want, region);
    FSDP_ARG_NOT_NULL(ctx, dst);
    if (t < 0 || t >= ck->meta.n_tensors)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_read: bad argument");
    const ckpt_tensor *x = &ck->meta.tensors[t];
    char buf[96];
    if (!region_inside(want, x->ndim, x->shape))
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "region %s lies outside '%s'",
                         region_to_string(want, buf, sizeof buf), x->name);
    /* The pieces tile the tensor (checked at open), so every element is read exactly once. */
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    fsdp_status s = read_locked(ctx, ck, t, want, dst);
    h5_unlock();
    return FSDP_PASS(ctx, s);
}

static fsdp_status check_match(fsdp_ctx *ctx, const fsdp_ckpt *ck, const ckpt_tensor *x,
                               const state_entry *e) {
    bool same = x->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = x->shape[d] == e->shape[d];
    char a[96], b[96];
    fsdp_shape_string(x->ndim, x->shape, a, sizeof a);
    fsdp_shape_string(e->ndim, e->shape, b, sizeof b);
    if (!same)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "checkpoint '%s': tensor '%s' is %s in the checkpoint and %s in the "
                         "model",
                         ck->path, e->name, a, b);
    if (x->dtype != e->dtype)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "checkpoint '%s': tensor '%s' is %s in the checkpoint and %s in the "
                         "model",
                         ck->path, e->name, fsdp_dtype_to_string(x->dtype),
                         fsdp_dtype_to_string(e->dtype));
    return FSDP_OK;
}

/* Every region this rank holds of entry e, read from tensor t. */
static fsdp_status load_entry(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, const state_entry *e) {
    size_t size = fsdp_dtype_size(e->dtype);
    for (int k = 0; k < e->n_pieces; k++) {
        void *host = state_piece_host(e, k), *tmp = NULL;
        if (!host && !(host = tmp = malloc((size_t)region_numel(&e->pieces[k].box) * size + 1)))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "loading '%s'", e->name);
        fsdp_status s = fsdp_ckpt_read(ctx, ck, t, &e->pieces[k].box, host);
        if (s == FSDP_OK && tmp) s = state_piece_write(ctx, e, k, tmp);
        free(tmp);
        FSDP_TRY_AT(ctx, s);
    }
    return FSDP_OK;
}

static fsdp_status check_extra_tensors(fsdp_ctx *ctx, const fsdp_ckpt *ck, const fsdp_state *st,
                                       bool strict) {
    for (int t = 0; t < ck->meta.n_tensors; t++) {
        if (fsdp_state_find(st, ck->meta.tensors[t].name) >= 0) continue;
        if (strict)
            return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND,
                             "checkpoint '%s' has tensor '%s', which the model lacks (another "
                             "model or optimizer?); load with non_strict to ignore it",
                             ck->path, ck->meta.tensors[t].name);
        fsdp_log(ctx, FSDP_LOG_INFO, "checkpoint '%s': tensor '%s' not in the model, ignored",
                 ck->path, ck->meta.tensors[t].name);
    }
    return FSDP_OK;
}

/* Every piece that a region of st overlaps: its shard opened and bound to this checkpoint,
 * and (format 2) its values read whole and checked against their digest, so that a damaged or
 * foreign file fails the load before any value changes. */
static fsdp_status check_pieces(fsdp_ctx *ctx, fsdp_ckpt *ck, const fsdp_state *st) {
    fsdp_status s = FSDP_OK;
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    for (int i = 0; s == FSDP_OK && i < st->n_entries; i++) {
        const state_entry *e = &st->entries[i];
        int t = fsdp_ckpt_find(ck, e->name);
        const ckpt_tensor *x = t >= 0 ? &ck->meta.tensors[t] : NULL;
        for (int k = 0; x && s == FSDP_OK && k < x->n_pieces; k++) {
            int pi = x->first_piece + k;
            for (int j = 0; s == FSDP_OK && j < e->n_pieces; j++)
                if (region_intersect(&ck->meta.pieces[pi].box, &e->pieces[j].box, NULL)) {
                    s = read_piece(ctx, ck, pi, NULL, NULL, NULL);
                    break;
                }
        }
    }
    h5_unlock();
    return FSDP_PASS(ctx, s);
}

fsdp_status fsdp_ckpt_load(fsdp_ctx *ctx, fsdp_ckpt *ck, const fsdp_state *st,
                           const fsdp_ckpt_load_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, st);
    bool strict = !(opts && opts->non_strict);
    FSDP_TRY_AT(ctx, check_extra_tensors(ctx, ck, st, strict));
    /* Everything is checked before any value changes. */
    for (int i = 0; i < st->n_entries; i++) {
        const state_entry *e = &st->entries[i];
        int t = fsdp_ckpt_find(ck, e->name);
        if (t >= 0) {
            FSDP_TRY_AT(ctx, check_match(ctx, ck, &ck->meta.tensors[t], e));
        } else if (strict) {
            return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND,
                             "checkpoint '%s' has no tensor '%s' (saved by another model or "
                             "without the optimizer?); load with non_strict to keep its value",
                             ck->path, e->name);
        } else {
            fsdp_log(ctx, FSDP_LOG_INFO, "checkpoint '%s': no '%s', kept as it is", ck->path,
                     e->name);
        }
    }
    FSDP_TRY_AT(ctx, check_pieces(ctx, ck, st));
    for (int i = 0; i < st->n_entries; i++) {
        int t = fsdp_ckpt_find(ck, st->entries[i].name);
        if (t >= 0) FSDP_TRY_AT(ctx, load_entry(ctx, ck, t, &st->entries[i]));
    }
    fsdp_state_set_steps((fsdp_state *)st, ck->meta.optim_steps);
    return FSDP_OK;
}

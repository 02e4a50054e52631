/* save.c: sharded checkpoint save. Every rank lists the regions it holds; one all_gather tells
 * every rank what the others hold, so each writes the parts no lower rank holds (replicated
 * values once) and rank 0 writes the table of all pieces; the directory is committed by a
 * rename once every rank has written. Async: the pieces are copied to host memory (pinned for
 * device tensors: stage.h), so the save waits only for those copies, and a thread writes them;
 * the commit waits for the next save or wait. */
#define _POSIX_C_SOURCE 200809L /* strdup, strnlen, stpcpy, fsync */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/dir.h"
#include "ckpt/h5.h"
#include "ckpt/stage.h"
#include "ckpt/state_impl.h"
#include "core/array.h"
#include "core/clock.h"
#include "core/error.h"

/* A part of a held region that this rank writes: values of `box` (inside piece `piece` of
 * entry `entry`), dataset id `id` in the shard file. */
typedef struct frag {
    int rank, entry, piece, id;
    region box;
    uint64_t digest; /* of the values written (bind.h) */
} frag;

/* One save: what the writing (this thread, or the async thread) needs. */
typedef struct job {
    char tmp[4096], final[4096];
    int rank, world, level;
    int lock_ms;          /* the rank's bound on waiting for the HDF5 lock (h5_lock_ms) */
    const fsdp_state *st; /* sync only: values are read from it while writing */
    ckpt_stage *stage;    /* async only: the host copies of the pieces the fragments read */
    char **names;         /* entry names (copied for async) */
    fsdp_dtype *dtypes;
    int n_entries;
    frag *frags;
    int n_frags, most_frags; /* this rank's fragments; the most any rank writes */
    uint64_t *digests; /* the commit's: mine, every rank's (most_frags each), a count per rank */
    uint64_t *flags;   /* agree's: mine, then one per rank (world + 1) */
    ckpt_id id;        /* rank 0's, binding every file of the save */
    bool has_meta;     /* rank 0 */
    ckpt_meta meta;
    char *meta_text[3]; /* owned layout, config and model_config copies */
    fsdp_ctx *tctx;     /* async: the thread's context for its failure */
    fsdp_status status;
} job;

struct fsdp_ckpt_writer {
    char *dir;
    fsdp_ckpt_options opts;
    job *inflight;
    pthread_t thread;
    double blocking;
    char last[4096];
};

/* ---- who writes what ---- */

#define REC_VALUES        (2 + 2 * FSDP_MAX_DIMS) /* entry, piece, offset[4], count[4] */
#define HEAD_VALUES       5  /* state hash, pieces held, HEAD_FAILED_* bits, rank 0's id (2) */
#define HEAD_FAILED_MKDIR 1u /* rank 0 could not create the directory */
#define HEAD_FAILED_LOCAL 2u /* the rank's metadata was invalid or its memory ran out */

static uint64_t state_hash(const fsdp_state *st) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < st->n_entries; i++) {
        const state_entry *e = &st->entries[i];
        for (const char *c = e->name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
        int64_t v[3 + FSDP_MAX_DIMS] = {e->kind, e->dtype, e->ndim};
        memcpy(v + 3, e->shape, sizeof e->shape);
        for (int k = 0; k < 3 + FSDP_MAX_DIMS; k++) h = (h ^ (uint64_t)v[k]) * 1099511628211ull;
    }
    return h;
}

static int count_pieces(const fsdp_state *st) {
    int n = 0;
    for (int i = 0; i < st->n_entries; i++) n += st->entries[i].n_pieces;
    return n;
}

/* all_gather of n values per rank over the world group (a copy when alone). */
static fsdp_status gather(fsdp_ctx *ctx, fsdp_group *g, int world, const uint64_t *in, int64_t n,
                          uint64_t *out) {
    if (!g || world == 1) {
        memcpy(out, in, (size_t)n * sizeof *in);
        return FSDP_OK;
    }
    return fsdp_all_gather_u64(ctx, g, in, n, out);
}

typedef struct rec {
    int rank, entry, piece;
    region box;
} rec;

/* This rank's held regions as records of REC_VALUES, `most` records long. */
static uint64_t *records(const fsdp_state *st, int64_t most) {
    uint64_t *out = calloc((size_t)(most * REC_VALUES) + 1, sizeof *out);
    for (int i = 0, at = 0; out && i < st->n_entries; i++)
        for (int k = 0; k < st->entries[i].n_pieces; k++, at++) {
            uint64_t *r = out + (size_t)at * REC_VALUES;
            const region *b = &st->entries[i].pieces[k].box;
            r[0] = (uint64_t)i, r[1] = (uint64_t)k;
            for (int d = 0; d < b->ndim; d++) {
                r[2 + d] = (uint64_t)b->offset[d];
                r[2 + FSDP_MAX_DIMS + d] = (uint64_t)b->count[d];
            }
        }
    return out;
}

/* Checks the headers: every rank prepared, the same entries everywhere, rank 0's directory
 * made. *most receives the most pieces a rank holds. */
static fsdp_status check_heads(fsdp_ctx *ctx, const job *jb, const uint64_t *heads, int64_t *most) {
    *most = 0;
    for (int r = 0; r < jb->world; r++)
        if (heads[HEAD_VALUES * r + 2] & HEAD_FAILED_LOCAL)
            return FSDP_FAIL(
                ctx, FSDP_ERR_IO,
                "checkpoint save: rank %d could not prepare its part (see that "
                "rank's error); nothing was written, earlier checkpoints are untouched",
                r);
    for (int r = 0; r < jb->world; r++) {
        const uint64_t *h = heads + HEAD_VALUES * r;
        if (h[0] != heads[0])
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "checkpoint save: rank %d lists other state entries than rank 0 "
                             "(another model, optimizer or wrapping): every rank must save the "
                             "same model",
                             r);
        *most = (int64_t)h[1] > *most ? (int64_t)h[1] : *most;
    }
    if (heads[2] & HEAD_FAILED_MKDIR)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "checkpoint save: rank 0 could not create '%s'",
                         jb->tmp);
    return FSDP_OK;
}

/* Every rank's held regions (heads: each rank's header), decoded. */
static void decode(const fsdp_state *st, int world, const uint64_t *heads, const uint64_t *all,
                   int64_t most, rec *recs, int *n) {
    *n = 0;
    for (int r = 0; r < world; r++)
        for (uint64_t p = 0; p < heads[HEAD_VALUES * r + 1]; p++) {
            const uint64_t *v = all + ((size_t)r * (size_t)most + p) * REC_VALUES;
            rec *x = &recs[(*n)++];
            x->rank = r, x->entry = (int)v[0], x->piece = (int)v[1];
            FSDP_ASSERT(x->entry >= 0 && x->entry < st->n_entries);
            x->box.ndim = st->entries[x->entry].ndim;
            for (int d = 0; d < x->box.ndim; d++) {
                x->box.offset[d] = (int64_t)v[2 + d];
                x->box.count[d] = (int64_t)v[2 + FSDP_MAX_DIMS + d];
            }
        }
}

/* Every rank's held regions, after checking every rank lists the same entries. A rank that
 * failed before (made_dir: rank 0's directory; local: its metadata or its own copies of the
 * entries) still takes part in the first all_gather, so every rank learns of it there and
 * returns alike. */
static fsdp_status exchange(fsdp_ctx *ctx, fsdp_group *g, job *jb, fsdp_status made_dir,
                            fsdp_status local, rec **out, int *n_out) {
    const fsdp_state *st = jb->st;
    int world = jb->world;
    uint64_t head[HEAD_VALUES] = {state_hash(st), (uint64_t)count_pieces(st),
                                  (made_dir != FSDP_OK ? HEAD_FAILED_MKDIR : 0) |
                                      (local != FSDP_OK ? HEAD_FAILED_LOCAL : 0),
                                  jb->id.hi, jb->id.lo};
    uint64_t *heads = malloc((size_t)world * sizeof head), *mine = NULL, *all = NULL;
    int64_t most = 0;
    rec *recs = NULL;
    fsdp_status s = heads ? gather(ctx, g, world, head, HEAD_VALUES, heads)
                          : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint exchange");
    if (s == FSDP_OK)
        s = local != FSDP_OK      ? local
            : made_dir != FSDP_OK ? made_dir
                                  : check_heads(ctx, jb, heads, &most);
    if (s == FSDP_OK) {
        mine = records(st, most);
        all = calloc((size_t)(most * REC_VALUES * world) + 1, sizeof *all);
        recs = calloc((size_t)(most * world) + 1, sizeof *recs);
        if (!mine || !all || !recs)
            s = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint exchange");
    }
    if (s == FSDP_OK && most) s = gather(ctx, g, world, mine, most * REC_VALUES, all);
    if (s == FSDP_OK) decode(st, world, heads, all, most, recs, n_out);
    if (s == FSDP_OK) jb->id = (ckpt_id){heads[3], heads[4]};
    free(heads);
    free(mine);
    free(all);
    if (s != FSDP_OK) {
        free(recs);
        return FSDP_PASS(ctx, s);
    }
    *out = recs;
    return FSDP_OK;
}

/* ---- the parts each rank writes ---- */

typedef struct frag_list {
    frag *v;
    int n;
    int64_t cap;
} frag_list;

static int frag_push(frag_list *l, frag f) {
    if (!fsdp_array_reserve((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) return 1;
    l->v[l->n++] = f;
    return 0;
}

/* What is left of x's region after every lower rank's regions of the same entry (group holds
 * the records of x's entry in rank order), appended to out. */
static int remaining(const rec *x, const rec *const *group, int n_group, frag_list *out) {
    frag_list cur = {0}, next = {0};
    frag base = {.rank = x->rank, .entry = x->entry, .piece = x->piece, .box = x->box};
    int rc = frag_push(&cur, base);
    for (int j = 0; !rc && j < n_group && group[j]->rank < x->rank; j++) {
        next.n = 0;
        for (int f = 0; !rc && f < cur.n; f++) {
            region parts[2 * FSDP_MAX_DIMS];
            int np = region_subtract(&cur.v[f].box, &group[j]->box, parts);
            for (int q = 0; !rc && q < np; q++) {
                base.box = parts[q];
                rc = frag_push(&next, base);
            }
        }
        frag_list t = cur;
        cur = next;
        next = t;
    }
    for (int f = 0; !rc && f < cur.n; f++) rc = frag_push(out, cur.v[f]);
    free(cur.v);
    free(next.v);
    return rc;
}

static int meta_pieces(ckpt_meta *m, const frag_list *all) {
    m->pieces = calloc((size_t)all->n + 1, sizeof *m->pieces);
    if (!m->pieces) return 1;
    for (int f = 0; f < all->n; f++)
        m->pieces[f] = (ckpt_piece){.tensor = all->v[f].entry,
                                    .file_rank = all->v[f].rank,
                                    .id = all->v[f].id,
                                    .box = all->v[f].box};
    m->n_pieces = all->n;
    return 0;
}

static int by_entry_rank(const void *a, const void *b) {
    const rec *x = *(const rec *const *)a, *y = *(const rec *const *)b;
    if (x->entry != y->entry) return x->entry < y->entry ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->piece - y->piece;
}

/* Every rank's fragments (rank 0 records them all in the metadata; every rank its own). */
static fsdp_status assign(fsdp_ctx *ctx, job *jb, rec *recs, int n) {
    const rec **order = malloc(((size_t)n + 1) * sizeof *order);
    int *next_id = calloc((size_t)jb->world * (size_t)jb->n_entries + 1, sizeof *next_id);
    frag_list all = {0}, mine = {0};
    int rc = !order || !next_id;
    for (int i = 0; !rc && i < n; i++) order[i] = &recs[i];
    if (!rc) qsort(order, (size_t)n, sizeof *order, by_entry_rank);
    for (int i = 0; !rc && i < n;) {
        int j = i;
        while (j < n && order[j]->entry == order[i]->entry) j++;
        for (int k = i; !rc && k < j; k++) {
            int before = all.n;
            rc = remaining(order[k], order + i, j - i, &all);
            for (int f = before; !rc && f < all.n; f++) {
                int *id = &next_id[(size_t)order[k]->rank * (size_t)jb->n_entries +
                                   (size_t)order[k]->entry];
                all.v[f].id = (*id)++;
                if (order[k]->rank == jb->rank) rc = frag_push(&mine, all.v[f]);
            }
        }
        i = j;
    }
    if (!rc && jb->has_meta) rc = meta_pieces(&jb->meta, &all);
    int *count = rc ? NULL : calloc((size_t)jb->world + 1, sizeof *count);
    rc = rc || !count;
    for (int f = 0; !rc && f < all.n; f++)
        if (++count[all.v[f].rank] > jb->most_frags) jb->most_frags = count[all.v[f].rank];
    free(count);
    /* allocated now, so that the commit's all_gather cannot fail on one rank alone */
    size_t n_dig = (size_t)(jb->world + 1) * (size_t)jb->most_frags + (size_t)jb->world;
    jb->digests = rc ? NULL : calloc(n_dig + 1, sizeof *jb->digests);
    rc = rc || !jb->digests;
    free(order);
    free(next_id);
    free(all.v);
    if (rc) {
        free(mine.v);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint save: listing the pieces");
    }
    jb->frags = mine.v;
    jb->n_frags = mine.n;
    return FSDP_OK;
}

/* ---- writing ---- */

/* The values of f: in place when they can be (*owned NULL), else a malloc'ed copy. */
static fsdp_status fetch(fsdp_ctx *ctx, const fsdp_state *st, const frag *f, const void **data,
                         void **owned) {
    const state_entry *e = &st->entries[f->entry];
    const state_piece *p = &e->pieces[f->piece];
    size_t size = fsdp_dtype_size(e->dtype);
    bool whole = region_equal(&f->box, &p->box);
    *owned = NULL;
    if (whole && (*data = state_piece_host(e, f->piece))) return FSDP_OK;
    void *piece = malloc((size_t)region_numel(&p->box) * size + 1);
    if (!piece) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint save: '%s'", e->name);
    fsdp_status s = state_piece_read(ctx, e, f->piece, piece);
    if (s != FSDP_OK || whole) {
        *data = *owned = piece;
        if (s != FSDP_OK) free(piece), *owned = NULL;
        return FSDP_PASS(ctx, s);
    }
    void *part = malloc((size_t)region_numel(&f->box) * size + 1);
    if (part) region_copy(part, &f->box, piece, &p->box, &f->box, size);
    free(piece);
    if (!part) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint save: '%s'", e->name);
    *data = *owned = part;
    return FSDP_OK;
}

static fsdp_status write_frags(fsdp_ctx *ctx, job *jb, ckpt_shard_writer *sw) {
    for (int i = 0; i < jb->n_frags; i++) {
        frag *f = &jb->frags[i];
        const void *data;
        void *owned;
        if (jb->stage)
            FSDP_TRY_AT(
                ctx, ckpt_stage_values(ctx, jb->stage, f->entry, f->piece, &f->box, &data, &owned));
        else
            FSDP_TRY_AT(ctx, fetch(ctx, jb->st, f, &data, &owned));
        fsdp_status s = ckpt_shard_put(ctx, sw, jb->names[f->entry], f->id, jb->dtypes[f->entry],
                                       &f->box, data, &f->digest);
        free(owned);
        FSDP_TRY_AT(ctx, s);
    }
    return FSDP_OK;
}

/* This rank's shard file into the temporary directory (rank 0 writes the metadata at the
 * commit, once it has every piece's digest). */
static fsdp_status write_files(fsdp_ctx *ctx, job *jb) {
    ckpt_shard_writer sw;
    FSDP_TRY_AT(ctx, h5_lock_for(ctx, jb->lock_ms));
    fsdp_status s = ckpt_shard_create(ctx, jb->tmp, jb->rank, jb->level, jb->id, &sw);
    if (s == FSDP_OK) s = ckpt_shard_close(ctx, &sw, write_frags(ctx, jb, &sw));
    h5_unlock();
    if (s == FSDP_OK) s = ckpt_sync_path(ctx, sw.path);
    return FSDP_PASS(ctx, s);
}

static void job_free(job *jb) {
    if (!jb) return;
    ckpt_stage_free(jb->stage);
    free(jb->frags);
    free(jb->digests);
    free(jb->flags);
    for (int i = 0; jb->names && i < jb->n_entries; i++) free(jb->names[i]);
    free(jb->names);
    free(jb->dtypes);
    free(jb->meta.tensors);
    free(jb->meta.pieces);
    for (int i = 0; i < jb->meta.n_extras; i++) free(jb->meta.extra_name[i]);
    free(jb->meta_text[0]);
    free(jb->meta_text[1]);
    free(jb->meta_text[2]);
    fsdp_ctx_free(jb->tctx);
    free(jb);
}

static void *write_thread(void *arg) {
    job *jb = arg;
    jb->status = write_files(jb->tctx, jb);
    return NULL;
}

/* ---- one save ---- */

static fsdp_status check_meta(fsdp_ctx *ctx, const fsdp_ckpt_meta *meta) {
    if (meta->step < 0 || meta->step > 99999999)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "checkpoint step %lld is outside [0, 99999999]", (long long)meta->step);
    if (meta->n_extras < 0 || meta->n_extras > FSDP_CKPT_MAX_EXTRAS ||
        (meta->n_extras && (!meta->extra_names || !meta->extra_values)))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "checkpoint extras: %d given (at most %d, with names and values)",
                         meta->n_extras, FSDP_CKPT_MAX_EXTRAS);
    if (meta->model_config && strlen(meta->model_config) > FSDP_HF_CONFIG_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "checkpoint model_config: %zu bytes, at most %d are stored; pass the "
                         "model's config.json text only",
                         strlen(meta->model_config), FSDP_HF_CONFIG_MAX);
    for (int i = 0; i < meta->n_extras; i++) {
        const char *n = meta->extra_names[i];
        size_t len = n ? strlen(n) : 0;
        bool ok = len > 0 && len < CKPT_EXTRA_NAME_MAX &&
                  strspn(n, "abcdefghijklmnopqrstuvwxyz"
                            "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                            "0123456789_.") == len;
        for (int j = 0; ok && j < i; j++) ok = strcmp(n, meta->extra_names[j]) != 0;
        if (!ok)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "checkpoint extra %d ('%s'): names are unique, [A-Za-z0-9_.], 1 to "
                             "%d bytes",
                             i, n ? n : "(null)", CKPT_EXTRA_NAME_MAX - 1);
    }
    return FSDP_OK;
}

/* The job's copies of the entry names and dtypes, and rank 0's metadata. */
static fsdp_status job_describe(fsdp_ctx *ctx, job *jb, const fsdp_state *st,
                                const fsdp_ckpt_meta *meta) {
    jb->n_entries = st->n_entries;
    jb->names = calloc((size_t)st->n_entries + 1, sizeof *jb->names);
    jb->dtypes = calloc((size_t)st->n_entries + 1, sizeof *jb->dtypes);
    if (!jb->names || !jb->dtypes) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint");
    for (int i = 0; i < st->n_entries; i++) {
        if (!(jb->names[i] = strdup(st->entries[i].name)))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint");
        jb->dtypes[i] = st->entries[i].dtype;
    }
    if (!jb->has_meta) return FSDP_OK;
    ckpt_meta *m = &jb->meta;
    m->step = meta->step;
    m->optim_steps = fsdp_state_steps(st);
    m->world_size = jb->world;
    m->layout = jb->meta_text[0] = strdup(meta->layout ? meta->layout : "");
    m->config = jb->meta_text[1] = strdup(meta->config ? meta->config : "");
    m->model_config = jb->meta_text[2] = strdup(meta->model_config ? meta->model_config : "");
    m->tensors = calloc((size_t)st->n_entries + 1, sizeof *m->tensors);
    if (!m->layout || !m->config || !m->model_config || !m->tensors)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint");
    m->n_tensors = st->n_entries;
    for (int i = 0; i < st->n_entries; i++) {
        const state_entry *e = &st->entries[i];
        m->tensors[i] = (ckpt_tensor){
            .name = jb->names[i], .kind = e->kind, .dtype = e->dtype, .ndim = e->ndim};
        memcpy(m->tensors[i].shape, e->shape, sizeof e->shape);
    }
    for (int i = 0; i < meta->n_extras; i++) {
        if (!(m->extra_name[i] = strdup(meta->extra_names[i])))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint");
        m->extra_value[i] = meta->extra_values[i];
        m->n_extras = i + 1;
    }
    return FSDP_OK;
}

/* Async: every piece a fragment reads copied to host memory now (stage.h). */
static fsdp_status stage(fsdp_ctx *ctx, job *jb) {
    FSDP_TRY_AT(ctx, ckpt_stage_create(ctx, jb->st, &jb->stage));
    for (int i = 0; i < jb->n_frags; i++)
        ckpt_stage_mark(jb->stage, jb->frags[i].entry, jb->frags[i].piece);
    FSDP_TRY_AT(ctx, ckpt_stage_copy(ctx, jb->stage, jb->st));
    jb->st = NULL;
    return FSDP_OK;
}

/* All ranks: whether any failed. The flag travels as an integer, one all_gather of a word per
 * rank into jb->flags (allocated before the save's first collective, so the commit's cannot
 * fail on one rank alone). */
static fsdp_status agree(fsdp_ctx *ctx, fsdp_group *g, job *jb, bool failed, bool *any) {
    *any = failed;
    if (!g || fsdp_group_size(g) == 1) return FSDP_OK;
    uint64_t *mine = jb->flags, *all = mine + 1;
    *mine = failed ? 1 : 0;
    FSDP_TRY_AT(ctx, fsdp_all_gather_u64(ctx, g, mine, 1, all));
    for (int r = 0; r < jb->world; r++)
        if (all[r]) *any = true;
    return FSDP_OK;
}

/* After every rank wrote its shard: rank 0 learns every piece's digest for the metadata, by
 * one all_gather of the digests of each rank's fragments, in the order assign listed them (the
 * metadata's pieces are every rank's fragments in that order). Every rank gathers the same
 * count: assign succeeded everywhere on the same records. */
static fsdp_status collect(fsdp_ctx *ctx, fsdp_group *g, job *jb) {
    int64_t n = jb->most_frags;
    uint64_t *mine = jb->digests, *all = mine + n, *next = all + n * jb->world;
    for (int i = 0; i < jb->n_frags; i++) mine[i] = jb->frags[i].digest;
    if (n) FSDP_TRY_AT(ctx, gather(ctx, g, jb->world, mine, n, all));
    for (int i = 0; jb->has_meta && i < jb->meta.n_pieces; i++) {
        int r = jb->meta.pieces[i].file_rank;
        jb->meta.pieces[i].digest = all[(uint64_t)r * (uint64_t)n + next[r]++];
    }
    return FSDP_OK;
}

/* After every rank wrote: rank 0 writes the metadata and renames the directory into place,
 * then everyone learns whether it did. */
static fsdp_status commit(fsdp_ctx *ctx, fsdp_ckpt_writer *w, job *jb) {
    fsdp_group *g = fsdp_ctx_world_group(ctx);
    bool any;
    if (jb->tctx && jb->status != FSDP_OK)
        FSDP_FAIL(ctx, jb->status, "%s", fsdp_last_error(jb->tctx));
    FSDP_TRY_AT(ctx, agree(ctx, g, jb, jb->status != FSDP_OK, &any));
    if (jb->status != FSDP_OK) return jb->status;
    if (any)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "checkpoint '%s' was not committed: another rank failed to write its "
                         "shard (see that rank's error); earlier checkpoints are untouched",
                         jb->final);
    FSDP_TRY_AT(ctx, collect(ctx, g, jb));
    fsdp_status s = FSDP_OK;
    if (jb->has_meta) s = ckpt_meta_write(ctx, jb->tmp, &jb->meta);
    if (s == FSDP_OK && jb->rank == 0)
        s = ckpt_dir_commit(ctx, jb->tmp, jb->final, w->dir, w->opts.keep);
    FSDP_TRY_AT(ctx, agree(ctx, g, jb, s != FSDP_OK, &any));
    if (s != FSDP_OK) return FSDP_PASS(ctx, s);
    if (any)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "checkpoint '%s': rank 0 could not commit it",
                         jb->final);
    snprintf(w->last, sizeof w->last, "%s", jb->final);
    return FSDP_OK;
}

static fsdp_status prepare(fsdp_ctx *ctx, fsdp_ckpt_writer *w, job *jb, const fsdp_state *st,
                           const fsdp_ckpt_meta *meta) {
    fsdp_group *g = fsdp_ctx_world_group(ctx);
    jb->world = g ? fsdp_group_size(g) : 1;
    jb->rank = g ? fsdp_group_rank(g) : 0;
    jb->has_meta = jb->rank == 0;
    jb->level = w->opts.zstd_level;
    jb->lock_ms = h5_lock_ms(ctx);
    jb->st = st;
    snprintf(jb->final, sizeof jb->final, "%s/step-%08lld", w->dir, (long long)meta->step);
    snprintf(jb->tmp, sizeof jb->tmp, "%s/.step-%08lld.tmp", w->dir, (long long)meta->step);
    /* What only this rank can get wrong (its metadata, memory) is carried into the exchange's
     * first all_gather, so every rank fails alike instead of one leaving the others waiting. */
    fsdp_status local = check_meta(ctx, meta);
    if (jb->rank == 0) jb->id = ckpt_id_new(); /* every rank takes it at the exchange */
    fsdp_status made =
        jb->rank == 0 && local == FSDP_OK ? ckpt_dir_begin(ctx, w->dir, jb->tmp) : FSDP_OK;
    if (local == FSDP_OK) local = job_describe(ctx, jb, st, meta);
    rec *recs = NULL;
    int n = 0;
    FSDP_TRY_AT(ctx, exchange(ctx, g, jb, made, local, &recs, &n));
    jb->meta.id = jb->id;
    fsdp_status s = assign(ctx, jb, recs, n);
    free(recs);
    return FSDP_PASS(ctx, s);
}

fsdp_status fsdp_ckpt_save(fsdp_ctx *ctx, fsdp_ckpt_writer *w, const fsdp_state *st,
                           const fsdp_ckpt_meta *meta) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, w);
    FSDP_ARG_NOT_NULL(ctx, st);
    FSDP_ARG_NOT_NULL(ctx, meta);
    FSDP_TRY_AT(ctx, fsdp_ckpt_writer_wait(ctx, w));
    double t0 = fsdp_clock_now();
    job *jb = calloc(1, sizeof *jb);
    fsdp_group *g = fsdp_ctx_world_group(ctx);
    if (jb) jb->flags = calloc((size_t)(g ? fsdp_group_size(g) : 1) + 1, sizeof *jb->flags);
    if (!jb || !jb->flags) {
        job_free(jb);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint save");
    }
    fsdp_status s = prepare(ctx, w, jb, st, meta);
    if (s == FSDP_OK && w->opts.async) {
        /* The writer thread logs under its own context, as this rank. */
        fsdp_ctx_options topts = {.rank = fsdp_ctx_rank(ctx), .log_level = fsdp_ctx_log_level(ctx)};
        s = fsdp_ctx_create(&topts, &jb->tctx);
        if (s == FSDP_OK) s = stage(ctx, jb);
        if (s == FSDP_OK && pthread_create(&w->thread, NULL, write_thread, jb) != 0)
            s = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "cannot start the checkpoint writer thread");
        if (s == FSDP_OK) {
            w->inflight = jb;
            w->blocking = fsdp_clock_now() - t0;
            return FSDP_OK;
        }
    }
    /* Sync, or an async save that failed before its thread: write (or not) and commit, so
     * every rank takes part in the commit's collectives. */
    jb->status = s == FSDP_OK ? write_files(ctx, jb) : s;
    fsdp_ctx *tctx = jb->tctx;
    jb->tctx = NULL;
    fsdp_status c = commit(ctx, w, jb);
    jb->tctx = tctx;
    job_free(jb);
    w->blocking = fsdp_clock_now() - t0;
    return c;
}

fsdp_status fsdp_ckpt_writer_wait(fsdp_ctx *ctx, fsdp_ckpt_writer *w) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, w);
    job *jb = w->inflight;
    if (!jb) return FSDP_OK;
    w->inflight = NULL;
    pthread_join(w->thread, NULL);
    fsdp_status s = commit(ctx, w, jb);
    job_free(jb);
    return FSDP_PASS(ctx, s);
}

fsdp_status fsdp_ckpt_writer_create(fsdp_ctx *ctx, const char *dir, const fsdp_ckpt_options *opts,
                                    fsdp_ckpt_writer **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, dir);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (!*dir)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_ckpt_writer_create: dir is empty; name the checkpoint directory");
    fsdp_ckpt_options o = opts ? *opts : (fsdp_ckpt_options){0};
    if (o.zstd_level != FSDP_CKPT_NO_COMPRESSION && (o.zstd_level < 0 || o.zstd_level > 19))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "zstd_level %d: use 1..19, 0 for the default (3), or "
                         "FSDP_CKPT_NO_COMPRESSION",
                         o.zstd_level);
    if (o.keep < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "keep %d: use 0 (keep all) or more",
                         o.keep);
    if (strlen(dir) > 3000)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "checkpoint directory path too long");
    fsdp_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "checkpoint writer");
    }
    w->opts = o;
    *out = w;
    return FSDP_OK;
}

double fsdp_ckpt_writer_last_blocking_seconds(const fsdp_ckpt_writer *w) {
    return w ? w->blocking : 0.0;
}

const char *fsdp_ckpt_writer_last_path(const fsdp_ckpt_writer *w) {
    return w ? w->last : "";
}

void fsdp_ckpt_writer_free(fsdp_ctx *ctx, fsdp_ckpt_writer *w) {
    if (!w) return;
    if (w->inflight && fsdp_ckpt_writer_wait(ctx, w) != FSDP_OK)
        fsdp_log(ctx, FSDP_LOG_ERROR, "checkpoint writer: the last save failed: %s",
                 fsdp_last_error(ctx));
    free(w->dir);
    free(w);
}

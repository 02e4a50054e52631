/* local_device.c: the local backend's collectives on device tensors. The rendezvous and the
 * judgement stay on the host (local.c); the data moves on each rank's communication stream,
 * ordered by events the ranks publish at the rendezvous: a rank records READY on its current
 * stream at entry, its communication stream waits for every member's READY, moves its part
 * (copies through the device record, reductions through the table's reduce_n in rank order)
 * and records the stage's event; after the last stage it waits for every member's stage event
 * (nobody reads its input any more) and records END, which the caller's stream (or the work)
 * waits for. No host waits for device work. The rules are in docs/device.md. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/local_impl.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor_impl.h"

static atomic_bool skip_input_wait;

void fsdp_local_test_skip_input_wait(bool on) {
    atomic_store(&skip_input_wait, on);
}

/* ---- events ---- */

/* This member's events, made on dev (the earlier ones retired when its device changed). */
static fsdp_status events_on(fsdp_ctx *ctx, local_events *mine, fsdp_device dev) {
    if (mine->ev[0].handle && fsdp_device_same(mine->ev[0].device, dev)) return FSDP_OK;
    if (mine->ev[0].handle) {
        local_retired_events *old = malloc(sizeof *old);
        if (!old) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate event records");
        old->events = *mine;
        old->events.retired = NULL;
        old->next = mine->retired;
        mine->retired = old;
    }
    for (int k = 0; k < LOCAL_EV_COUNT; k++) mine->ev[k] = (fsdp_event){dev, NULL};
    for (int k = 0; k < LOCAL_EV_COUNT; k++)
        FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &mine->ev[k]));
    return FSDP_OK;
}

/* ---- one call ---- */

typedef struct dev_call {
    fsdp_ctx *ctx;
    fsdp_group *g;
    local_group *lg;
    int op;
    fsdp_device dev; /* this rank's, where its tensors are */
    const fsdp_device_i *rec;
    fsdp_stream caller; /* the caller's current stream at entry */
    fsdp_stream comm;   /* the rank's communication stream */
    fsdp_stream saved;  /* the current stream while a stage runs */
    /* Every member's event handles, taken once the call is posted (a member whose device
     * changes by its next call makes new ones while this member may still wait). */
    void *ev[FSDP_REDUCE_N_MAX][LOCAL_EV_COUNT];
} dev_call;

static local_events *mine(const dev_call *d) {
    return &d->lg->events[d->g->rank];
}

/* Enters the call: READY recorded on the caller's stream, then the call posted at the
 * rendezvous. A rank that cannot take part posts a rejection, so its peers fail naming it. */
static fsdp_status dev_begin(dev_call *d, fsdp_ctx *ctx, fsdp_group *g, fsdp_device dev,
                             const fsdp_call *post) {
    d->ctx = ctx;
    d->g = g;
    d->lg = g->state;
    d->op = post->op;
    d->dev = dev;
    d->rec = fsdp_device_for(dev.type);
    d->caller = fsdp_stream_current(dev);
    fsdp_status st = FSDP_OK;
    if (g->size > FSDP_REDUCE_N_MAX)
        st = FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                       "%s on group %s: collectives on device tensors take groups of at most %d "
                       "ranks, and this one has %d; use host tensors or smaller groups",
                       fsdp_call_op_name(post->op), g->desc, FSDP_REDUCE_N_MAX, g->size);
    if (st == FSDP_OK) st = fsdp_ctx_comm_stream(ctx, &d->comm);
    if (st == FSDP_OK) st = events_on(ctx, mine(d), dev);
    if (st == FSDP_OK) st = fsdp_event_record(ctx, mine(d)->ev[LOCAL_EV_READY], d->caller);
    if (st == FSDP_OK) {
        FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, post->op, post));
        for (int r = 0; r < g->size; r++)
            for (int k = 0; k < LOCAL_EV_COUNT; k++) d->ev[r][k] = d->lg->events[r].ev[k].handle;
        return FSDP_OK;
    }
    fsdp_error_record own;
    fsdp_error_save(ctx, &own);
    fsdp_call reject = {.op = post->op, .rejected = st, .reject_msg = own.message};
    (void)fsdp_local_rendezvous(ctx, g, post->op, &reject);
    fsdp_error_restore(ctx, &own);
    return FSDP_PASS(ctx, st);
}

/* The communication stream waits for event `ev` of every member (with the negative control
 * on, READY only of this member). A member's stream and its peers' are on devices of one kind
 * (the judge checked), possibly different ones: the record takes a wait across them. */
static fsdp_status comm_waits(const dev_call *d, int ev) {
    const bool skip = ev == LOCAL_EV_READY && atomic_load(&skip_input_wait);
    for (int r = 0; r < d->g->size; r++) {
        if (skip && r != d->g->rank) continue;
        FSDP_TRY_AT(d->ctx, d->rec->stream_wait_event(d->ctx, d->comm.device.index, d->comm.handle,
                                                      d->ev[r][ev]));
    }
    return FSDP_OK;
}

/* Opens a stage: the communication stream waits for every member's event `after` and becomes
 * the device's current stream, where the stage's copies and kernels run. */
static fsdp_status stage_open(dev_call *d, int after) {
    fsdp_status st = comm_waits(d, after);
    d->saved = fsdp_stream_set_current(d->comm);
    return st;
}

/* Closes it (st: how this member's part went): the caller's stream is current again, the
 * member's event `done` marks the end of its part, and the members meet. A member whose part
 * failed poisons the group instead, so that every member fails rather than reading what it did
 * not write. */
static fsdp_status stage_close(dev_call *d, fsdp_status st, int done) {
    (void)fsdp_stream_set_current(d->saved);
    if (st == FSDP_OK) st = fsdp_event_record(d->ctx, mine(d)->ev[done], d->comm);
    if (st != FSDP_OK) {
        fsdp_local_poison(d->g, st, fsdp_error_of(d->ctx)->message);
        return st;
    }
    return fsdp_local_rendezvous(d->ctx, d->g, d->op, NULL);
}

/* The per-work state of a device all_reduce: the event its completion is recorded on. */
typedef struct local_work {
    fsdp_event end;
} local_work;

static void local_work_free(void *state) {
    local_work *w = state;
    if (!w) return;
    fsdp_event_destroy(w->end);
    free(w);
}

/* The work's event on dev (made again when its device changed). */
static fsdp_status work_event(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_device dev,
                              fsdp_event *out) {
    local_work *w = work->state;
    if (work->state && work->free_state != local_work_free) {
        work->free_state(work->state); /* another backend's state */
        work->state = NULL;
        w = NULL;
    }
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a comm work");
        work->state = w;
        work->free_state = local_work_free;
    }
    if (!w->end.handle || !fsdp_device_same(w->end.device, dev)) {
        fsdp_event_destroy(w->end);
        w->end = (fsdp_event){dev, NULL};
        FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &w->end));
    }
    *out = w->end;
    return FSDP_OK;
}

/* Completes the call after its last stage (`last`): the communication stream waits until every
 * member has finished that stage (nobody reads this member's tensors any more) and records the
 * end; the caller's stream waits for it, or (work, a start) the work holds it, pending. */
static fsdp_status dev_finish(dev_call *d, int last, fsdp_comm_work *work) {
    FSDP_TRY_AT(d->ctx, comm_waits(d, last));
    fsdp_event end = mine(d)->ev[LOCAL_EV_END];
    if (work) FSDP_TRY_AT(d->ctx, work_event(d->ctx, work, d->dev, &end));
    FSDP_TRY_AT(d->ctx, fsdp_event_record(d->ctx, end, d->comm));
    if (!work) return fsdp_stream_wait(d->ctx, d->caller, end);
    work->pending = true;
    return FSDP_OK;
}

/* ---- data movement on the communication stream ---- */

typedef struct dev_box {
    const dev_call *d;
    char *dst;
    const char *src;
    fsdp_device src_dev;
} dev_box;

static fsdp_status dev_run(void *user, size_t dst_off, size_t src_off, size_t bytes, size_t rows,
                           size_t dst_pitch, size_t src_pitch) {
    const dev_box *b = user;
    char *dst = b->dst + dst_off;
    const char *src = b->src + src_off;
    if (dst == src && (rows == 1 || dst_pitch == src_pitch)) return FSDP_OK; /* in place */
    if (rows == 1) return b->d->rec->copy(b->d->ctx, dst, b->d->dev, src, b->src_dev, bytes);
    return b->d->rec->copy_2d(b->d->ctx, dst, b->d->dev, dst_pitch, src, b->src_dev, src_pitch,
                              bytes, rows);
}

/* fsdp_box_copy from src (member r's tensor, on its device) into out (this member's). */
static fsdp_status box_copy(const dev_call *d, fsdp_tensor *out, const int64_t *dst_at,
                            const fsdp_tensor *src, const int64_t *src_at, const int64_t *box) {
    dev_box b = {d, fsdp_tensor_data(out), fsdp_tensor_data(src), fsdp_tensor_device(src)};
    return fsdp_box_runs(out->shape, dst_at, src->shape, src_at, box, out->ndim,
                         fsdp_dtype_size(out->dtype), dev_run, &b);
}

/* Device memory on this member's device for the stage (ordered on the communication stream,
 * which is current); NULL for 0 bytes. */
static fsdp_status stage_alloc(const dev_call *d, size_t bytes, char **out) {
    *out = NULL;
    if (bytes == 0) return FSDP_OK;
    void *p = NULL;
    FSDP_TRY_AT(d->ctx, d->rec->alloc(d->ctx, d->dev.index, bytes, &p));
    *out = p;
    return FSDP_OK;
}

/* How many members' inputs are on another device than this member's (they are copied over
 * before a reduction reads them). */
static int remote_inputs(const dev_call *d) {
    int m = 0;
    for (int r = 0; r < d->g->size; r++)
        m += !fsdp_device_same(fsdp_tensor_device(d->lg->calls[r]->in), d->dev);
    return m;
}

/* dst (count elements, this member's device) = the reduction in rank order of every member's
 * input data at element `offset` (count each); inputs on another device go through `staging`
 * (remote_inputs x count elements) first. */
static fsdp_status reduce_run(const dev_call *d, void *dst, int64_t offset, int64_t count,
                              fsdp_dtype dtype, const fsdp_reduce_n_args *args, char *staging) {
    if (count <= 0) return FSDP_OK;
    const size_t esize = fsdp_dtype_size(dtype), bytes = (size_t)count * esize;
    const void *in[FSDP_REDUCE_N_MAX];
    for (int r = 0, k = 0; r < d->g->size; r++) {
        const fsdp_tensor *t = d->lg->calls[r]->in;
        const char *src = (const char *)fsdp_tensor_data(t) + (size_t)offset * esize;
        fsdp_device on = fsdp_tensor_device(t);
        in[r] = src;
        if (fsdp_device_same(on, d->dev)) continue;
        char *copy = staging + (size_t)k++ * bytes;
        FSDP_TRY_AT(d->ctx, d->rec->copy(d->ctx, copy, d->dev, src, on, bytes));
        in[r] = copy;
    }
    fsdp_kernels_for(d->dev)->reduce_n(dst, in, d->g->size, count, dtype, args);
    return FSDP_OK;
}

/* ---- the collectives ---- */

fsdp_status fsdp_local_device_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                         const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    fsdp_call c = fsdp_call_all_gather(out, in, dim);
    dev_call d;
    FSDP_TRY_AT(ctx, dev_begin(&d, ctx, g, fsdp_tensor_device(out), &c));
    fsdp_status st = stage_open(&d, LOCAL_EV_READY);
    int64_t at[FSDP_MAX_DIMS] = {0}, zeros[FSDP_MAX_DIMS] = {0};
    for (int r = 0; r < g->size && st == FSDP_OK; r++) {
        const fsdp_tensor *src = d.lg->calls[r]->in;
        fsdp_chunk_range(out->shape[dim], g->size, r, &at[dim], NULL);
        st = box_copy(&d, out, at, src, zeros, src->shape);
    }
    FSDP_TRY_AT(ctx, stage_close(&d, st, LOCAL_EV_S1));
    return dev_finish(&d, LOCAL_EV_S1, work);
}

fsdp_status fsdp_local_device_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                             const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                             const fsdp_reduce_options *fuse,
                                             fsdp_comm_work *work) {
    fsdp_call c = fsdp_call_reduce_scatter(out, in, dim, op);
    dev_call d;
    FSDP_TRY_AT(ctx, dev_begin(&d, ctx, g, fsdp_tensor_device(out), &c));
    int64_t outer = 1, inner = 1, n = in->shape[dim], begin, len;
    for (int i = 0; i < dim; i++) outer *= in->shape[i];
    for (int i = dim + 1; i < in->ndim; i++) inner *= in->shape[i];
    fsdp_chunk_range(n, g->size, g->rank, &begin, &len);
    const size_t esize = fsdp_dtype_size(in->dtype);
    const fsdp_reduce_n_args args = fsdp_reduce_args(op, fuse);
    char *dst = fsdp_tensor_data(out), *staging = NULL;
    fsdp_status st = stage_open(&d, LOCAL_EV_READY);
    if (st == FSDP_OK && len > 0)
        st = stage_alloc(&d, (size_t)remote_inputs(&d) * (size_t)(len * inner) * esize, &staging);
    for (int64_t o = 0; o < outer && len > 0 && st == FSDP_OK; o++)
        st = reduce_run(&d, dst + (size_t)(o * len * inner) * esize, (o * n + begin) * inner,
                        len * inner, in->dtype, &args, staging);
    d.rec->free(d.dev.index, staging); /* on the communication stream, after its readers */
    FSDP_TRY_AT(ctx, stage_close(&d, st, LOCAL_EV_S1));
    return dev_finish(&d, LOCAL_EV_S1, work);
}

/* Three stages, as the host's in-place all_reduce: each member reduces its chunk of every
 * member's tensor into its own tensor's chunk; once all have, each copies the other chunks
 * from their owners; the end waits until every member has copied (nobody reads its tensor). */
fsdp_status fsdp_local_device_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                         fsdp_reduce_op op, const fsdp_reduce_options *fuse,
                                         fsdp_comm_work *work) {
    fsdp_call c = fsdp_call_all_reduce(t, op);
    dev_call d;
    FSDP_TRY_AT(ctx, dev_begin(&d, ctx, g, fsdp_tensor_device(t), &c));
    int64_t begin, len;
    fsdp_chunk_range(t->numel, g->size, g->rank, &begin, &len);
    const size_t esize = fsdp_dtype_size(t->dtype);
    const fsdp_reduce_n_args args = fsdp_reduce_args(op, fuse);
    char *data = fsdp_tensor_data(t), *staging = NULL;
    fsdp_status st = stage_open(&d, LOCAL_EV_READY);
    if (st == FSDP_OK && len > 0)
        st = stage_alloc(&d, (size_t)remote_inputs(&d) * (size_t)len * esize, &staging);
    if (st == FSDP_OK)
        st = reduce_run(&d, data + (size_t)begin * esize, begin, len, t->dtype, &args, staging);
    d.rec->free(d.dev.index, staging);
    FSDP_TRY_AT(ctx, stage_close(&d, st, LOCAL_EV_S1));
    st = stage_open(&d, LOCAL_EV_S1);
    for (int r = 0; r < g->size && st == FSDP_OK; r++) {
        int64_t b, m;
        fsdp_chunk_range(t->numel, g->size, r, &b, &m);
        const fsdp_tensor *owner = d.lg->calls[r]->in;
        if (r != g->rank && m > 0)
            st = d.rec->copy(ctx, data + (size_t)b * esize, d.dev,
                             (const char *)fsdp_tensor_data(owner) + (size_t)b * esize,
                             fsdp_tensor_device(owner), (size_t)m * esize);
    }
    FSDP_TRY_AT(ctx, stage_close(&d, st, LOCAL_EV_S2));
    return dev_finish(&d, LOCAL_EV_S2, work);
}

fsdp_status fsdp_local_device_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                        fsdp_comm_work *work) {
    fsdp_call c = fsdp_call_broadcast(t, root);
    dev_call d;
    FSDP_TRY_AT(ctx, dev_begin(&d, ctx, g, fsdp_tensor_device(t), &c));
    fsdp_status st = stage_open(&d, LOCAL_EV_READY);
    const fsdp_tensor *src = d.lg->calls[root]->out;
    if (st == FSDP_OK && g->rank != root && t->numel > 0)
        st = d.rec->copy(ctx, fsdp_tensor_data(t), d.dev, fsdp_tensor_data(src),
                         fsdp_tensor_device(src), fsdp_tensor_nbytes(t));
    FSDP_TRY_AT(ctx, stage_close(&d, st, LOCAL_EV_S1));
    return dev_finish(&d, LOCAL_EV_S1, work);
}

fsdp_status fsdp_local_device_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                         const fsdp_tensor *in, int split_dim, int concat_dim,
                                         fsdp_comm_work *work) {
    fsdp_call c = fsdp_call_all_to_all(out, in, split_dim, concat_dim);
    dev_call d;
    FSDP_TRY_AT(ctx, dev_begin(&d, ctx, g, fsdp_tensor_device(out), &c));
    fsdp_status st = stage_open(&d, LOCAL_EV_READY);
    int64_t at = 0; /* where along concat_dim the next member's piece goes */
    for (int r = 0; r < g->size && st == FSDP_OK; r++) {
        const fsdp_tensor *src = d.lg->calls[r]->in;
        int64_t box[FSDP_MAX_DIMS], src_at[FSDP_MAX_DIMS] = {0}, dst_at[FSDP_MAX_DIMS] = {0};
        memcpy(box, src->shape, sizeof box);
        fsdp_chunk_range(src->shape[split_dim], g->size, g->rank, &src_at[split_dim],
                         &box[split_dim]);
        dst_at[concat_dim] = at;
        st = box_copy(&d, out, dst_at, src, src_at, box);
        at += box[concat_dim];
    }
    FSDP_TRY_AT(ctx, stage_close(&d, st, LOCAL_EV_S1));
    return dev_finish(&d, LOCAL_EV_S1, work);
}

/* ---- works ---- */

static const local_work *work_of(const fsdp_comm_work *work) {
    return work->free_state == local_work_free ? work->state : NULL;
}

fsdp_status fsdp_local_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    (void)ctx;
    const local_work *w = work_of(work);
    *done = !w || fsdp_event_query(w->end);
    return FSDP_OK;
}

fsdp_status fsdp_local_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    const local_work *w = work_of(work);
    return w ? fsdp_event_synchronize(ctx, w->end) : FSDP_OK;
}

fsdp_status fsdp_local_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream) {
    const local_work *w = work_of(work);
    return w ? fsdp_stream_wait(ctx, stream, w->end) : FSDP_OK;
}

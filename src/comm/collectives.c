/* collectives.c: the public collectives, blocking and started (fsdp_*_start, on a work). Each
 * describes its call (a `coll`) and passes it through one front end (issue): the group
 * resolved, a flight-recorder record, a start's work checked to be idle, this rank's own
 * arguments checked, the call counted in comm-debug, then handed to the backend and timed, so
 * nothing reaches a backend uncounted. A rank whose arguments are wrong tells its peers through
 * the backend's reject entry so they fail at once instead of waiting for it. */
#include <math.h> // defines: isfinite
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/error.h"
#include "core/prof_impl.h" // defines: fsdp_prof_now
#include "core/tensor_impl.h"

/* Finds the group (NULL: the world group) and checks that it is this rank's handle. */
static fsdp_status resolve(fsdp_ctx *ctx, fsdp_group **g, fsdp_comm_op op) {
    const char *name = fsdp_comm_op_to_string(op);
    if (!ctx) return FSDP_ERR_INVALID_ARGUMENT;
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: this context is not bound to a world; make collectives inside "
                         "fsdp_world_run, on the context passed to the rank's function",
                         name);
    if (!*g) *g = b->world_group;
    const fsdp_group *grp = *g;
    if (grp->world != b->world || grp->ranks[grp->rank] != ctx->rank)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: group %s is a handle of another rank or world than this context "
                         "(rank %d); use the handles made on this rank",
                         name, grp->desc, ctx->rank);
    return FSDP_OK;
}

/* The profile (fsdp/profile.h): a backend call's time, minus what the backend counted as
 * moving data, is its wait. */
typedef struct prof_mark {
    double t0, copy0;
} prof_mark;

static prof_mark prof_begin(const fsdp_ctx *ctx, fsdp_comm_op op) {
    if (!ctx->prof_on) return (prof_mark){0};
    return (prof_mark){fsdp_prof_now(), ctx->prof.comm_copy_s[op]};
}

static void prof_end(fsdp_ctx *ctx, fsdp_comm_op op, prof_mark m) {
    if (!ctx->prof_on) return;
    double copied = ctx->prof.comm_copy_s[op] - m.copy0;
    ctx->prof.comm_wait_s[op] += fsdp_prof_now() - m.t0 - copied;
    ctx->prof.comm_calls[op]++;
}

/* A backend call is timed twice, for comm-debug's seconds (fsdp_comm_debug_timed, the whole
 * call) and for the profile (its wait, less the copies), and its flight-recorder record (seq,
 * from fsdp_trace_begin) ends with it. */
typedef struct call_mark {
    double debug_t0;
    prof_mark prof;
    uint64_t seq;
} call_mark;

static call_mark call_begin(const fsdp_ctx *ctx, fsdp_comm_op op, uint64_t seq) {
    return (call_mark){fsdp_comm_debug_clock(ctx), prof_begin(ctx, op), seq};
}

/* The backend returned st (in_flight: a non-blocking call that started); returns st. */
static fsdp_status call_end_as(fsdp_ctx *ctx, fsdp_comm_op op, call_mark m, fsdp_status st,
                               bool in_flight) {
    prof_end(ctx, op, m.prof);
    fsdp_comm_debug_timed(ctx, m.debug_t0);
    return fsdp_trace_end(ctx, m.seq, st, in_flight);
}

/* This rank will not make call seq (its arguments failed with st): let the peers know,
 * keeping this rank's own message. */
static fsdp_status reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op, fsdp_status st,
                          uint64_t seq) {
    fsdp_trace_end(ctx, seq, st, false);
    if (!g->world->backend.iface.reject) return FSDP_PASS(ctx, st);
    fsdp_error_record mine;
    fsdp_error_save(ctx, &mine);
    g->world->backend.iface.reject(ctx, g, op);
    fsdp_error_restore(ctx, &mine);
    ctx->error.status = st;
    return FSDP_PASS(ctx, st);
}

/* Every tensor of every collective passes here before the rendezvous: a dtype the backends do
 * not carry, or a device the backend does not move (mpi: the CPU only, a device tensor is
 * refused rather than read through its pointer; local: also the rank's own device, set with
 * fsdp_ctx_set_device), fails this rank, and reject() makes its peers fail naming it. */
/* Whether op only copies its elements (no arithmetic): those also move i32 tensors (token ids,
 * integer metadata), bit for bit. */
static bool copies_only(fsdp_comm_op op) {
    return op == FSDP_COMM_ALL_GATHER || op == FSDP_COMM_BROADCAST || op == FSDP_COMM_ALL_TO_ALL;
}

static fsdp_status check_tensor(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                                const fsdp_tensor *t, const char *what) {
    const char *name = fsdp_comm_op_to_string(op);
    if (!t)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s on group %s: the %s tensor is NULL",
                         name, g->desc, what);
    bool floats =
        t->dtype == FSDP_DTYPE_F32 || t->dtype == FSDP_DTYPE_BF16 || t->dtype == FSDP_DTYPE_F16;
    if (!floats && !(t->dtype == FSDP_DTYPE_I32 && copies_only(op)))
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "%s on group %s: the %s tensor is %s; use %s", name,
                         g->desc, what, fsdp_dtype_to_string(t->dtype),
                         copies_only(op) ? "f32, bf16, f16 or i32"
                                         : "f32, bf16 or f16 (i32 only moves in all_gather, "
                                           "broadcast and all_to_all)");
    fsdp_device dev = fsdp_tensor_device(t);
    const fsdp_comm_backend_i *be = &g->world->backend.iface;
    if (dev.type == be->device) return FSDP_OK;
    const char *kind = fsdp_device_to_string(dev);
    if (be->moves_devices) {
        if (dev.type == ctx->device.type && dev.index == ctx->device.index) return FSDP_OK;
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "%s on group %s: the %s tensor is on %s:%d but this rank's device is "
                         "%s:%d; a rank's collectives run on its device's streams: call "
                         "fsdp_ctx_set_device(ctx, (fsdp_device){FSDP_DEVICE_%s, %d}) on the "
                         "rank's context first, or copy the tensor to %s:%d (fsdp_tensor_copy)",
                         name, g->desc, what, kind, dev.index, fsdp_device_to_string(ctx->device),
                         ctx->device.index, dev.type == FSDP_DEVICE_SIM ? "SIM" : "CUDA", dev.index,
                         fsdp_device_to_string(ctx->device), ctx->device.index);
    }
    const char *moves = fsdp_device_to_string((fsdp_device){be->device, 0});
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "%s on group %s: the %s tensor is on %s:%d, and the %s backend does not move "
                     "%s tensors (it moves %s tensors only in this version): copy it into a %s "
                     "tensor (fsdp_tensor_copy) for the collective, and back after, or run the "
                     "ranks as threads of one process (the local backend) to keep it on %s",
                     name, g->desc, what, kind, dev.index, be->name, kind, moves, moves, kind);
}

static fsdp_status check_pair(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                              const fsdp_tensor *out, const fsdp_tensor *in) {
    FSDP_TRY_AT(ctx, check_tensor(ctx, g, op, out, "output"));
    FSDP_TRY_AT(ctx, check_tensor(ctx, g, op, in, "input"));
    const char *name = fsdp_comm_op_to_string(op);
    fsdp_device od = fsdp_tensor_device(out), id = fsdp_tensor_device(in);
    if (od.type != id.type || od.index != id.index)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "%s on group %s: the input is on %s:%d and the output on %s:%d; both "
                         "must be on one device (the rank's): copy one of them over "
                         "(fsdp_tensor_copy)",
                         name, g->desc, fsdp_device_to_string(id), id.index,
                         fsdp_device_to_string(od), od.index);
    if (out->dtype != in->dtype)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s on group %s: the input is %s and the output %s; both must have one "
                         "dtype",
                         name, g->desc, fsdp_dtype_to_string(in->dtype),
                         fsdp_dtype_to_string(out->dtype));
    if (out->ndim != in->ndim || out->ndim == 0)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s on group %s: the input has %d dims and the output %d; both need the "
                         "same number, at least 1",
                         name, g->desc, in->ndim, out->ndim);
    return FSDP_OK;
}

/* Normalises a dim of an ndim-d tensor (negative counts from the end). */
static fsdp_status check_dim(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op, int ndim,
                             int *dim, const char *what) {
    int d = *dim < 0 ? *dim + ndim : *dim;
    if (d < 0 || d >= ndim)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s on group %s: %s %d is out of range for %d-d tensors (use %d..%d)",
                         fsdp_comm_op_to_string(op), g->desc, what, *dim, ndim, -ndim, ndim - 1);
    *dim = d;
    return FSDP_OK;
}

/* Checks that `t` is this rank's chunk of `global` along `dim`: global's shape with that dim
 * cut to its torch.chunk piece. `t_what` and `global_what` name the two in the message. */
static fsdp_status expect_chunk(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                                const fsdp_tensor *t, const char *t_what, const int64_t *global,
                                int dim, const char *global_what) {
    int64_t off, len;
    fsdp_chunk_range(global[dim], g->size, g->rank, &off, &len);
    bool same = true;
    for (int i = 0; i < t->ndim; i++) same &= t->shape[i] == (i == dim ? len : global[i]);
    if (same) return FSDP_OK;
    int64_t want[FSDP_MAX_DIMS];
    memcpy(want, global, sizeof want);
    want[dim] = len;
    char got_s[96], want_s[96], global_s[96];
    return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                     "%s on group %s: the %s is %s but must be %s: %s %s with dim %d cut to "
                     "group rank %d's torch.chunk piece [%lld, %lld) of %lld split among %d ranks",
                     fsdp_comm_op_to_string(op), g->desc, t_what,
                     fsdp_shape_string(t->ndim, t->shape, got_s, sizeof got_s),
                     fsdp_shape_string(t->ndim, want, want_s, sizeof want_s), global_what,
                     fsdp_shape_string(t->ndim, global, global_s, sizeof global_s), dim, g->rank,
                     (long long)off, (long long)(off + len), (long long)global[dim], g->size);
}

static bool overlap(const fsdp_tensor *a, const fsdp_tensor *b) {
    uintptr_t pa = (uintptr_t)fsdp_tensor_data(a), pb = (uintptr_t)fsdp_tensor_data(b);
    size_t na = fsdp_tensor_nbytes(a), nb = fsdp_tensor_nbytes(b);
    return na && nb && pa < pb + nb && pb < pa + na;
}

static fsdp_status no_overlap(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                              const fsdp_tensor *out, const fsdp_tensor *in) {
    if (!overlap(out, in)) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "%s on group %s: the output overlaps the input; use separate buffers",
                     fsdp_comm_op_to_string(op), g->desc);
}

static fsdp_status check_reduce_op(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                                   fsdp_reduce_op rop) {
    if ((int)rop >= 0 && rop < FSDP_REDUCE_OP_COUNT) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "%s on group %s: unknown reduction %d; use FSDP_REDUCE_SUM, _AVG or _MAX",
                     fsdp_comm_op_to_string(op), g->desc, (int)rop);
}

/* ---- the front end every collective passes through ---- */

/* One collective as the front end sees it; its check normalises its dims and options. */
typedef struct coll {
    fsdp_comm_op op;
    fsdp_group *group; /* NULL until resolved: the world group */
    fsdp_tensor *out;
    const fsdp_tensor *in;
    const fsdp_tensor *counted; /* what the flight recorder describes and comm-debug counts */
    int dim, dim2; /* all_gather, reduce_scatter: dim; all_to_all: split_dim, concat_dim */
    int root;
    fsdp_reduce_op rop;
    const fsdp_reduce_options *opts; /* as given */
    const fsdp_reduce_options *fuse; /* checked: NULL, or &norm */
    fsdp_reduce_options norm;
    fsdp_comm_work *work; /* a non-blocking start's */
    uint64_t seq;         /* its flight-recorder record */
} coll;

/* A start's work must be idle: one call in flight per work. */
static fsdp_status check_idle(fsdp_ctx *ctx, const coll *c) {
    const fsdp_comm_work *w = c->work;
    if (!w || !w->pending) return FSDP_OK;
    const char *name = fsdp_comm_op_to_string(c->op);
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "%s on group %s: the work given to fsdp_%s_start is still in flight (a %s on "
                     "group %s); wait for it (fsdp_comm_work_wait) first, or use another work",
                     name, c->group->desc, name, fsdp_comm_op_to_string((fsdp_comm_op)w->op),
                     w->group->desc);
}

/* Readies a start's work for the backend (comm_impl.h): idle, with the call's op, group,
 * comm-debug row (noted just before) and flight-recorder record; the backend sets pending when
 * it leaves the call in flight. */
static void work_ready(const fsdp_ctx *ctx, const coll *c) {
    fsdp_comm_work *w = c->work;
    w->pending = false;
    w->op = c->op;
    w->group = c->group;
    w->debug_row = fsdp_comm_debug_last(ctx, &w->debug_session);
    w->trace_seq = c->seq;
}

/* Resolves the group, opens the call's flight-recorder record, checks a start's work and this
 * rank's arguments (check), counts the call in comm-debug and hands it to the backend (run,
 * with c->work: NULL, or readied), timed; a rank whose arguments fail tells its peers (reject)
 * instead of making the call. A start the backend left in flight keeps its record in flight
 * until the work completes (work.c); one it completed at once ends as a blocking call. */
static fsdp_status issue(fsdp_ctx *ctx, coll *c, fsdp_status (*check)(fsdp_ctx *, coll *),
                         fsdp_status (*run)(fsdp_ctx *, coll *)) {
    FSDP_TRY_AT(ctx, resolve(ctx, &c->group, c->op));
    c->seq = fsdp_trace_begin(ctx, c->group, c->op);
    fsdp_status st = check_idle(ctx, c);
    if (st == FSDP_OK) st = check(ctx, c);
    if (st == FSDP_OK && c->counted) fsdp_trace_describe(ctx, c->seq, c->counted);
    if (st == FSDP_OK)
        st = fsdp_comm_debug_note(ctx, c->group, c->op,
                                  c->counted ? (int64_t)fsdp_tensor_nbytes(c->counted) : 0);
    if (st != FSDP_OK) return reject(ctx, c->group, c->op, st, c->seq);
    if (c->work) work_ready(ctx, c);
    call_mark mark = call_begin(ctx, c->op, c->seq);
    st = run(ctx, c);
    const bool in_flight = st == FSDP_OK && c->work && c->work->pending;
    if (c->work && !in_flight) c->work->pending = false, c->work->group = NULL;
    st = call_end_as(ctx, c->op, mark, st, in_flight);
    FSDP_TRY_AT(ctx, st);
    return FSDP_OK;
}

/* ---- the collectives ---- */

static fsdp_status check_all_gather(fsdp_ctx *ctx, coll *c) {
    const fsdp_comm_op op = FSDP_COMM_ALL_GATHER;
    const fsdp_group *g = c->group;
    const fsdp_tensor *out = c->out, *in = c->in;
    int *dim = &c->dim;
    FSDP_TRY_AT(ctx, check_pair(ctx, g, op, out, in));
    FSDP_TRY_AT(ctx, check_dim(ctx, g, op, out->ndim, dim, "dim"));
    FSDP_TRY_AT(ctx, expect_chunk(ctx, g, op, in, "input", out->shape, *dim, "the output"));
    if (!overlap(out, in)) return FSDP_OK;
    /* In place: the input must be exactly this rank's chunk of the output, contiguous. */
    int64_t outer = 1, inner = 1, off;
    for (int i = 0; i < *dim; i++) outer *= out->shape[i];
    for (int i = *dim + 1; i < out->ndim; i++) inner *= out->shape[i];
    fsdp_chunk_range(out->shape[*dim], g->size, g->rank, &off, NULL);
    const char *chunk =
        (const char *)fsdp_tensor_data(out) + (size_t)(off * inner) * fsdp_dtype_size(out->dtype);
    if ((outer == 1 || g->size == 1) && fsdp_tensor_data(in) == chunk) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "all_gather on group %s: the input overlaps the output without being "
                     "exactly this rank's chunk of it (in place works when dim %d is the "
                     "outermost dim of size > 1); use separate buffers",
                     g->desc, *dim);
}

static fsdp_status run_all_gather(fsdp_ctx *ctx, coll *c) {
    return c->group->world->backend.iface.all_gather(ctx, c->group, c->out, c->in, c->dim, c->work);
}

static fsdp_status all_gather_on(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                 const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    coll c = {.op = FSDP_COMM_ALL_GATHER,
              .group = group,
              .out = out,
              .in = in,
              .counted = out,
              .dim = dim,
              .work = work};
    return issue(ctx, &c, check_all_gather, run_all_gather);
}

fsdp_status fsdp_all_gather(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                            const fsdp_tensor *in, int dim) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    return all_gather_on(ctx, group, out, in, dim, NULL);
}

fsdp_status fsdp_all_gather_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                  const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    FSDP_ARG_NOT_NULL(ctx, work);
    return all_gather_on(ctx, group, out, in, dim, work);
}

/* A u64 travels as two i32 elements, its bits copied as they are. */
fsdp_status fsdp_all_gather_u64(fsdp_ctx *ctx, fsdp_group *group, const uint64_t *in, int64_t n,
                                uint64_t *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, in);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_TRY_AT(ctx, resolve(ctx, &group, FSDP_COMM_ALL_GATHER));
    if (n < 0 || n > INT64_MAX / 2 / group->size)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_all_gather_u64 on group %s: %lld values (use 0 or more, and fewer "
                         "than fit a tensor)",
                         group->desc, (long long)n);
    int64_t mine = 2 * n, all = mine * group->size;
    fsdp_tensor *tin = NULL, *tout = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, &mine, &tin);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, &all, &tout);
    if (st == FSDP_OK) {
        if (n) memcpy(fsdp_tensor_data(tin), in, (size_t)n * sizeof *in);
        st = fsdp_all_gather(ctx, group, tout, tin, 0);
    }
    if (st == FSDP_OK && n) memcpy(out, fsdp_tensor_data(tout), (size_t)all * sizeof(int32_t));
    fsdp_tensor_free(tin);
    fsdp_tensor_free(tout);
    return FSDP_PASS(ctx, st);
}

static fsdp_status check_fuse(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op cop,
                              const fsdp_tensor *in, fsdp_reduce_op rop,
                              const fsdp_reduce_options *opts, fsdp_reduce_options *norm,
                              const fsdp_reduce_options **fuse);

static fsdp_status check_reduce_scatter(fsdp_ctx *ctx, coll *c) {
    const fsdp_comm_op op = FSDP_COMM_REDUCE_SCATTER;
    const fsdp_group *g = c->group;
    FSDP_TRY_AT(ctx, check_reduce_op(ctx, g, op, c->rop));
    FSDP_TRY_AT(ctx, check_pair(ctx, g, op, c->out, c->in));
    FSDP_TRY_AT(ctx, check_dim(ctx, g, op, c->in->ndim, &c->dim, "dim"));
    FSDP_TRY_AT(ctx, expect_chunk(ctx, g, op, c->out, "output", c->in->shape, c->dim, "the input"));
    FSDP_TRY_AT(ctx, no_overlap(ctx, g, op, c->out, c->in));
    return check_fuse(ctx, g, op, c->in, c->rop, c->opts, &c->norm, &c->fuse);
}

static fsdp_status run_reduce_scatter(fsdp_ctx *ctx, coll *c) {
    return c->group->world->backend.iface.reduce_scatter(ctx, c->group, c->out, c->in, c->dim,
                                                         c->rop, c->fuse, c->work);
}

/* The options of fsdp_reduce_scatter_ex and fsdp_all_reduce_ex(_start), checked: *fuse is NULL
 * for none, else `norm` with scales of 1 for 0. */
static fsdp_status check_fuse(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op cop,
                              const fsdp_tensor *in, fsdp_reduce_op rop,
                              const fsdp_reduce_options *opts, fsdp_reduce_options *norm,
                              const fsdp_reduce_options **fuse) {
    *fuse = NULL;
    const char *name = fsdp_comm_op_to_string(cop);
    if (!opts || (opts->pre_scale == 0.0f && opts->post_scale == 0.0f && !opts->accumulate))
        return FSDP_OK;
    if (!isfinite(opts->pre_scale) || !isfinite(opts->post_scale))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s on group %s: pre_scale %g and post_scale %g must be finite (0 means "
                         "1)",
                         name, g->desc, (double)opts->pre_scale, (double)opts->post_scale);
    if (in->dtype != FSDP_DTYPE_F32 || rop == FSDP_REDUCE_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "%s on group %s: scaling and accumulation are for f32 sums and "
                         "averages, not %s %s; call it without options and scale apart",
                         name, g->desc, fsdp_dtype_to_string(in->dtype),
                         fsdp_reduce_op_to_string(rop));
    if (opts->accumulate && cop == FSDP_COMM_ALL_REDUCE)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "all_reduce on group %s: accumulate is for reduce_scatter (an "
                         "all_reduce's result replaces its tensor)",
                         g->desc);
    *norm = (fsdp_reduce_options){.pre_scale = opts->pre_scale == 0.0f ? 1.0f : opts->pre_scale,
                                  .post_scale = opts->post_scale == 0.0f ? 1.0f : opts->post_scale,
                                  .accumulate = opts->accumulate};
    *fuse = norm;
    return FSDP_OK;
}

static fsdp_status reduce_scatter_on(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                     const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                     const fsdp_reduce_options *opts, fsdp_comm_work *work) {
    coll c = {.op = FSDP_COMM_REDUCE_SCATTER,
              .group = group,
              .out = out,
              .in = in,
              .counted = in,
              .dim = dim,
              .rop = op,
              .opts = opts,
              .work = work};
    return issue(ctx, &c, check_reduce_scatter, run_reduce_scatter);
}

fsdp_status fsdp_reduce_scatter_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                   const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                   const fsdp_reduce_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    return reduce_scatter_on(ctx, group, out, in, dim, op, opts, NULL);
}

fsdp_status fsdp_reduce_scatter_start_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                         const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                         const fsdp_reduce_options *opts, fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    FSDP_ARG_NOT_NULL(ctx, work);
    return reduce_scatter_on(ctx, group, out, in, dim, op, opts, work);
}

fsdp_status fsdp_reduce_scatter_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                      const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                      fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    FSDP_ARG_NOT_NULL(ctx, work);
    return reduce_scatter_on(ctx, group, out, in, dim, op, NULL, work);
}

fsdp_status fsdp_reduce_scatter(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                const fsdp_tensor *in, int dim, fsdp_reduce_op op) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    return fsdp_reduce_scatter_ex(ctx, group, out, in, dim, op, NULL);
}

static fsdp_status check_all_reduce(fsdp_ctx *ctx, coll *c) {
    const fsdp_comm_op op = FSDP_COMM_ALL_REDUCE;
    FSDP_TRY_AT(ctx, check_reduce_op(ctx, c->group, op, c->rop));
    FSDP_TRY_AT(ctx, check_tensor(ctx, c->group, op, c->out, "given"));
    return check_fuse(ctx, c->group, op, c->out, c->rop, c->opts, &c->norm, &c->fuse);
}

static fsdp_status run_all_reduce(fsdp_ctx *ctx, coll *c) {
    return c->group->world->backend.iface.all_reduce(ctx, c->group, c->out, c->rop, c->fuse,
                                                     c->work);
}

fsdp_status fsdp_all_reduce_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, fsdp_reduce_op op,
                               const fsdp_reduce_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    coll c = {.op = FSDP_COMM_ALL_REDUCE,
              .group = group,
              .out = t,
              .in = t,
              .counted = t,
              .rop = op,
              .opts = opts};
    return issue(ctx, &c, check_all_reduce, run_all_reduce);
}

fsdp_status fsdp_all_reduce(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, fsdp_reduce_op op) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    return fsdp_all_reduce_ex(ctx, group, t, op, NULL);
}

fsdp_status fsdp_all_reduce_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t,
                                  fsdp_reduce_op op, fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, work);
    return fsdp_all_reduce_start_ex(ctx, group, t, op, NULL, work);
}

fsdp_status fsdp_all_reduce_start_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t,
                                     fsdp_reduce_op op, const fsdp_reduce_options *opts,
                                     fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, work);
    coll c = {.op = FSDP_COMM_ALL_REDUCE,
              .group = group,
              .out = t,
              .in = t,
              .counted = t,
              .rop = op,
              .opts = opts,
              .work = work};
    return issue(ctx, &c, check_all_reduce, run_all_reduce);
}

static fsdp_status check_broadcast(fsdp_ctx *ctx, coll *c) {
    FSDP_TRY_AT(ctx, check_tensor(ctx, c->group, c->op, c->out, "given"));
    if (c->root >= 0 && c->root < c->group->size) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "broadcast on group %s: root %d is not a group rank (use 0..%d)",
                     c->group->desc, c->root, c->group->size - 1);
}

static fsdp_status run_broadcast(fsdp_ctx *ctx, coll *c) {
    return c->group->world->backend.iface.broadcast(ctx, c->group, c->out, c->root, c->work);
}

static fsdp_status broadcast_on(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, int root,
                                fsdp_comm_work *work) {
    coll c = {.op = FSDP_COMM_BROADCAST,
              .group = group,
              .out = t,
              .in = t,
              .counted = t,
              .root = root,
              .work = work};
    return issue(ctx, &c, check_broadcast, run_broadcast);
}

fsdp_status fsdp_broadcast(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, int root) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    return broadcast_on(ctx, group, t, root, NULL);
}

fsdp_status fsdp_broadcast_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, int root,
                                 fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, work);
    return broadcast_on(ctx, group, t, root, work);
}

static fsdp_status check_all_to_all(fsdp_ctx *ctx, coll *call) {
    const fsdp_comm_op op = FSDP_COMM_ALL_TO_ALL;
    const fsdp_group *g = call->group;
    const fsdp_tensor *out = call->out, *in = call->in;
    int *split_dim = &call->dim, *concat_dim = &call->dim2;
    FSDP_TRY_AT(ctx, check_pair(ctx, g, op, out, in));
    FSDP_TRY_AT(ctx, check_dim(ctx, g, op, in->ndim, split_dim, "split_dim"));
    FSDP_TRY_AT(ctx, check_dim(ctx, g, op, in->ndim, concat_dim, "concat_dim"));
    FSDP_TRY_AT(ctx, no_overlap(ctx, g, op, out, in));
    int s = *split_dim, c = *concat_dim;
    char a[96], b[96];
    if (s == c) {
        if (in->shape[s] % g->size == 0 && fsdp_tensor_same_shape(out, in)) return FSDP_OK;
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "all_to_all on group %s: with split_dim == concat_dim (%d) the input "
                         "and output have one shape whose dim %d divides into %d equal pieces; "
                         "they are %s and %s",
                         g->desc, s, s, g->size,
                         fsdp_shape_string(in->ndim, in->shape, a, sizeof a),
                         fsdp_shape_string(out->ndim, out->shape, b, sizeof b));
    }
    /* Both are this rank's chunks of one global shape: in along concat_dim, out along
     * split_dim. */
    int64_t global[FSDP_MAX_DIMS];
    memcpy(global, in->shape, sizeof global);
    global[c] = out->shape[c];
    FSDP_TRY_AT(ctx,
                expect_chunk(ctx, g, op, in, "input", global, c,
                             "the global shape (the input's, with the output's concat_dim size)"));
    return expect_chunk(ctx, g, op, out, "output", global, s, "the global shape");
}

static fsdp_status run_all_to_all(fsdp_ctx *ctx, coll *c) {
    return c->group->world->backend.iface.all_to_all(ctx, c->group, c->out, c->in, c->dim, c->dim2,
                                                     c->work);
}

static fsdp_status all_to_all_on(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                 const fsdp_tensor *in, int split_dim, int concat_dim,
                                 fsdp_comm_work *work) {
    coll c = {.op = FSDP_COMM_ALL_TO_ALL,
              .group = group,
              .out = out,
              .in = in,
              .counted = in,
              .dim = split_dim,
              .dim2 = concat_dim,
              .work = work};
    return issue(ctx, &c, check_all_to_all, run_all_to_all);
}

fsdp_status fsdp_all_to_all(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                            const fsdp_tensor *in, int split_dim, int concat_dim) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    return all_to_all_on(ctx, group, out, in, split_dim, concat_dim, NULL);
}

fsdp_status fsdp_all_to_all_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                  const fsdp_tensor *in, int split_dim, int concat_dim,
                                  fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_ARG_NOT_NULL(ctx, in);
    FSDP_ARG_NOT_NULL(ctx, work);
    return all_to_all_on(ctx, group, out, in, split_dim, concat_dim, work);
}

static fsdp_status check_nothing(fsdp_ctx *ctx, coll *c) {
    (void)ctx, (void)c;
    return FSDP_OK;
}

static fsdp_status run_barrier(fsdp_ctx *ctx, coll *c) {
    return c->group->world->backend.iface.barrier(ctx, c->group, c->work);
}

fsdp_status fsdp_barrier(fsdp_ctx *ctx, fsdp_group *group) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    coll c = {.op = FSDP_COMM_BARRIER, .group = group};
    return issue(ctx, &c, check_nothing, run_barrier);
}

fsdp_status fsdp_barrier_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, work);
    coll c = {.op = FSDP_COMM_BARRIER, .group = group, .work = work};
    return issue(ctx, &c, check_nothing, run_barrier);
}

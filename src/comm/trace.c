/* trace.c: the flight recorder. Every rank keeps a ring of its last FSDP_TRACE_DEPTH
 * collectives (op, group, call number on that group, dtype and shape, the module and phase
 * comm-debug attributes it to, when it started and ended, how it ended). When a collective
 * times out waiting for members that never arrived, the backend asks each of them for a view
 * of its ring around the call that timed out (the local backend reads it, the MPI backend
 * asks over the network) and the message names where the ranks diverge: the first call on
 * the group that a missing rank did not make, and what it did instead. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "core/clock.h"
#include "core/error.h"

fsdp_trace_ring *fsdp_trace_ring_new(void) {
    fsdp_trace_ring *ring = calloc(1, sizeof *ring);
    if (ring && pthread_mutex_init(&ring->mu, NULL) != 0) {
        free(ring);
        return NULL;
    }
    return ring;
}

void fsdp_trace_ring_free(fsdp_trace_ring *ring) {
    if (!ring) return;
    pthread_mutex_destroy(&ring->mu);
    free(ring);
}

void fsdp_trace_ring_clear(fsdp_trace_ring *ring) {
    if (!ring) return;
    pthread_mutex_lock(&ring->mu);
    ring->calls = 0;
    ring->dumped = false;
    pthread_mutex_unlock(&ring->mu);
}

/* The record of call `seq` while it is still in the ring, else NULL (ring->mu held). */
static fsdp_trace_rec *rec_of(fsdp_trace_ring *ring, uint64_t seq) {
    if (seq == 0 || seq > ring->calls || ring->calls - seq >= FSDP_TRACE_DEPTH) return NULL;
    return &ring->rec[(seq - 1) % FSDP_TRACE_DEPTH];
}

static fsdp_trace_ring *ring_of(const fsdp_ctx *ctx) {
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    return b ? b->trace : NULL;
}

uint64_t fsdp_trace_begin(fsdp_ctx *ctx, fsdp_group *g, int op) {
    fsdp_trace_ring *ring = ring_of(ctx);
    uint64_t group_seq = ++g->calls;
    if (!ring) return 0;
    const char *module = fsdp_ctx_scope_top(ctx);
    double now = fsdp_clock_now();
    pthread_mutex_lock(&ring->mu);
    uint64_t seq = ++ring->calls;
    fsdp_trace_rec *r = rec_of(ring, seq);
    *r = (fsdp_trace_rec){.seq = seq,
                          .group_id = g->id,
                          .group_seq = group_seq,
                          .op = op,
                          .state = FSDP_TRACE_RUNNING,
                          .phase = fsdp_comm_phase_of(ctx),
                          .dtype = -1,
                          .t_start = now};
    snprintf(r->group, sizeof r->group, "%s", g->desc);
    snprintf(r->module, sizeof r->module, "%s", module);
    pthread_mutex_unlock(&ring->mu);
    return seq;
}

void fsdp_trace_describe(fsdp_ctx *ctx, uint64_t seq, const fsdp_tensor *t) {
    fsdp_trace_ring *ring = ring_of(ctx);
    if (!ring || !t) return;
    pthread_mutex_lock(&ring->mu);
    fsdp_trace_rec *r = rec_of(ring, seq);
    if (r) {
        r->dtype = (int32_t)fsdp_tensor_dtype(t);
        r->ndim = fsdp_tensor_ndim(t);
        for (int i = 0; i < r->ndim && i < FSDP_MAX_DIMS; i++)
            r->shape[i] = fsdp_tensor_shape(t)[i];
    }
    pthread_mutex_unlock(&ring->mu);
}

static void dump_on_failure(fsdp_ctx *ctx, fsdp_trace_ring *ring);

fsdp_status fsdp_trace_end(fsdp_ctx *ctx, uint64_t seq, fsdp_status st, bool in_flight) {
    fsdp_trace_ring *ring = ring_of(ctx);
    if (!ring) return FSDP_PASS(ctx, st);
    double now = fsdp_clock_now();
    pthread_mutex_lock(&ring->mu);
    fsdp_trace_rec *r = rec_of(ring, seq);
    if (r) {
        r->state = st != FSDP_OK ? FSDP_TRACE_FAILED
                   : in_flight   ? FSDP_TRACE_IN_FLIGHT
                                 : FSDP_TRACE_DONE;
        r->t_end = now;
    }
    pthread_mutex_unlock(&ring->mu);
    if (st == FSDP_ERR_TIMEOUT || st == FSDP_ERR_COMM) dump_on_failure(ctx, ring);
    return FSDP_PASS(ctx, st);
}

void fsdp_trace_waiting(fsdp_ctx *ctx, uint64_t seq) {
    fsdp_trace_ring *ring = ring_of(ctx);
    if (!ring) return;
    pthread_mutex_lock(&ring->mu);
    fsdp_trace_rec *r = rec_of(ring, seq);
    if (r && r->state == FSDP_TRACE_IN_FLIGHT) r->state = FSDP_TRACE_RUNNING;
    pthread_mutex_unlock(&ring->mu);
}

void fsdp_trace_counts_of(fsdp_trace_ring *ring, fsdp_trace_counts *out) {
    *out = (fsdp_trace_counts){0};
    if (!ring) return;
    pthread_mutex_lock(&ring->mu);
    uint64_t newest = ring->calls;
    uint64_t oldest = newest > FSDP_TRACE_DEPTH ? newest - FSDP_TRACE_DEPTH + 1 : 1;
    for (uint64_t s = newest; s >= oldest && s > 0 && out->n < FSDP_TRACE_GROUPS; s--) {
        const fsdp_trace_rec *r = rec_of(ring, s);
        bool seen = false;
        for (int k = 0; k < out->n && !seen; k++) seen = out->id[k] == r->group_id;
        if (seen) continue;
        out->id[out->n] = r->group_id;
        out->calls[out->n++] = r->group_seq;
    }
    pthread_mutex_unlock(&ring->mu);
}

/* ---- views: what a rank shows a peer that waits for it ---- */

static void copy_aged(fsdp_trace_rec *dst, const fsdp_trace_rec *src, double now) {
    *dst = *src;
    dst->t_start = now - src->t_start;
    dst->t_end = src->state == FSDP_TRACE_RUNNING ? 0 : now - src->t_end;
}

void fsdp_trace_view_build(fsdp_trace_ring *ring, uint64_t group_id, fsdp_trace_view *v) {
    *v = (fsdp_trace_view){.answered = 1};
    if (!ring) return;
    double now = fsdp_clock_now();
    pthread_mutex_lock(&ring->mu);
    uint64_t newest = ring->calls;
    uint64_t oldest = newest > FSDP_TRACE_DEPTH ? newest - FSDP_TRACE_DEPTH + 1 : 1;
    v->calls = newest;
    uint64_t on_group = 0; /* its newest call on the group, 0: none in the ring */
    for (uint64_t s = newest; s >= oldest && s > 0 && !on_group; s--)
        if (rec_of(ring, s)->group_id == group_id) on_group = s;
    if (on_group) {
        v->has_on_group = 1;
        copy_aged(&v->rec[v->n++], rec_of(ring, on_group), now);
    }
    /* The calls after it (or the whole ring): the first ones, where the rank went instead,
     * and the last ones, where it is now. */
    uint64_t first = on_group ? on_group + 1 : oldest,
             after = newest >= first ? newest - first + 1 : 0;
    const int room = FSDP_TRACE_VIEW_MAX - v->n, head = room - room / 2;
    for (uint64_t s = first; s <= newest && newest > 0; s++) {
        uint64_t k = s - first;
        if (after > (uint64_t)room && k >= (uint64_t)head && k < after - (uint64_t)(room - head)) {
            v->left_out++;
            continue;
        }
        if (v->left_out && !v->n_before_gap) v->n_before_gap = v->n;
        copy_aged(&v->rec[v->n++], rec_of(ring, s), now);
    }
    pthread_mutex_unlock(&ring->mu);
}

/* ---- explaining a timeout ---- */

typedef struct text {
    char *buf;
    size_t size, used;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    if (t->used >= t->size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->used, t->size - t->used, fmt, ap);
    va_end(ap);
    if (n > 0) t->used += (size_t)n;
    if (t->used > t->size) t->used = t->size;
}

/* "all_reduce #12 on 'tp' (world ranks 0,1) of (8, 16) f32 in module 'fc2' (backward)" */
static void put_call(text *t, const fsdp_trace_rec *r, bool with_group) {
    put(t, "%s #%llu", fsdp_call_op_name(r->op), (unsigned long long)r->group_seq);
    if (with_group) put(t, " on group %s", r->group);
    if (r->dtype >= 0) {
        char shape[96];
        put(t, " of %s %s", fsdp_shape_string(r->ndim, r->shape, shape, sizeof shape),
            fsdp_dtype_to_string((fsdp_dtype)r->dtype));
    }
    if (r->module[0]) put(t, " in module '%s'", r->module);
    if (r->phase == FSDP_COMM_PHASE_FORWARD || r->phase == FSDP_COMM_PHASE_BACKWARD)
        put(t, " (%s)", fsdp_comm_phase_to_string((fsdp_comm_phase)r->phase));
}

/* How the call stands: ", inside which it has been for 2.0 s", ", which failed 0.1 s ago",
 * or for the rank's last call when it is done, since when it has made none. */
static void put_state(text *t, const fsdp_trace_rec *r, bool last) {
    switch (r->state) {
    case FSDP_TRACE_RUNNING:
        put(t, ", inside which it has been for %.1f s", r->t_start);
        break;
    case FSDP_TRACE_IN_FLIGHT:
        put(t, " (started without waiting %.1f s ago, not waited for yet)", r->t_start);
        break;
    case FSDP_TRACE_FAILED:
        put(t, ", which failed %.1f s ago", r->t_end);
        break;
    default:
        if (last)
            put(t,
                ", done %.1f s ago; it has made no collective since (computing, or stuck "
                "outside libfsdp's collectives)",
                r->t_end);
        break;
    }
}

void fsdp_trace_explain_rank(char *buf, size_t size, int rank, uint64_t group_seq,
                             const char *group_desc, const fsdp_trace_view *v, int asked_ms) {
    text t = {buf, size, strlen(buf)};
    if (!v->answered) {
        put(&t,
            " Rank %d did not answer a query for its recent collectives within %d ms: it is not "
            "waiting inside a libfsdp collective (computing, stopped, or stuck elsewhere).",
            rank, asked_ms);
        return;
    }
    if (v->calls == 0) {
        put(&t, " Rank %d has made no collective in this run yet.", rank);
        return;
    }
    int i = 0;
    if (v->has_on_group) {
        const fsdp_trace_rec *g = &v->rec[0];
        if (g->group_seq >= group_seq) {
            put(&t, " Rank %d has reached call #%llu on this group: ", rank,
                (unsigned long long)g->group_seq);
            put_call(&t, g, false);
            put_state(&t, g, v->n == 1);
            put(&t, ".");
            return;
        }
        put(&t, " Rank %d made calls up to #%llu on this group (the last: ", rank,
            (unsigned long long)g->group_seq);
        put_call(&t, g, false);
        put(&t, ")");
        i = 1;
        if (v->n == 1) {
            put_state(&t, g, true);
            put(&t, ": it never made call #%llu.", (unsigned long long)group_seq);
            return;
        }
        put(&t,
            "; the ranks diverge at call #%llu on %s, which rank %d did not make: it went on "
            "to ",
            (unsigned long long)group_seq, group_desc, rank);
    } else if (v->calls <= FSDP_TRACE_DEPTH) {
        put(&t, " Rank %d has made no call on this group in this run; its %llu other calls: ", rank,
            (unsigned long long)v->calls);
    } else {
        put(&t,
            " Rank %d made no call on this group among its last %d collectives (of %llu); they "
            "are: ",
            rank, FSDP_TRACE_DEPTH, (unsigned long long)v->calls);
    }
    for (int k = i; k < v->n; k++) {
        const fsdp_trace_rec *r = &v->rec[k];
        if (k > i && k == v->n_before_gap && v->left_out)
            put(&t, ", ... (%llu more), ", (unsigned long long)v->left_out);
        else if (k > i)
            put(&t, ", then ");
        put_call(&t, r, true);
        put_state(&t, r, k == v->n - 1);
    }
    put(&t, ".");
}

void fsdp_trace_forensics(char *buf, size_t size, uint64_t group_seq, const char *group_desc,
                          int n_members, const int *ranks, const bool *missing,
                          const fsdp_trace_view *views, int asked_ms) {
    text t = {buf, size, 0};
    buf[0] = '\0';
    put(&t, " This rank is at call #%llu on the group.", (unsigned long long)group_seq);
    int shown = 0, more = 0;
    for (int m = 0; m < n_members; m++) {
        if (!missing[m]) continue;
        if (shown == FSDP_TRACE_EXPLAINED) {
            more++;
            continue;
        }
        t.used = strlen(buf);
        fsdp_trace_explain_rank(buf, size, ranks[m], group_seq, group_desc, &views[m], asked_ms);
        shown++;
    }
    t.used = strlen(buf);
    if (more) put(&t, " (%d more missing rank%s not shown.)", more, more > 1 ? "s" : "");
}

/* ---- writing a ring ---- */

/* Writes the ring's last `last` calls (0: all it holds), oldest first, one line each; returns
 * false when out of memory or when writing failed. */
static bool write_ring(fsdp_trace_ring *ring, int rank, int last, FILE *f) {
    fsdp_trace_rec *recs = malloc(FSDP_TRACE_DEPTH * sizeof *recs);
    if (!recs) return false;
    double now = fsdp_clock_now();
    pthread_mutex_lock(&ring->mu);
    uint64_t newest = ring->calls;
    uint64_t kept = newest < FSDP_TRACE_DEPTH ? newest : FSDP_TRACE_DEPTH;
    if (last > 0 && (uint64_t)last < kept) kept = (uint64_t)last;
    for (uint64_t i = 0; i < kept; i++)
        copy_aged(&recs[i], rec_of(ring, newest - kept + 1 + i), now);
    pthread_mutex_unlock(&ring->mu);
    bool ok = true;
    for (uint64_t i = 0; i < kept; i++) {
        const fsdp_trace_rec *r = &recs[i];
        char line[FSDP_ERROR_MAX];
        text t = {line, sizeof line, 0};
        put(&t, "rank %d call %llu: ", rank, (unsigned long long)r->seq);
        put_call(&t, r, true);
        switch (r->state) {
        case FSDP_TRACE_RUNNING:
            put(&t, ": running for %.3f s", r->t_start);
            break;
        case FSDP_TRACE_IN_FLIGHT:
            put(&t, ": started %.3f s ago, not waited for yet", r->t_start);
            break;
        default:
            put(&t, ": %s in %.3f ms, %.3f s ago",
                r->state == FSDP_TRACE_FAILED ? "failed" : "done", 1e3 * (r->t_start - r->t_end),
                r->t_end);
            break;
        }
        ok &= fprintf(f, "%s\n", line) >= 0;
    }
    free(recs);
    return ok;
}

/* A collective of this rank failed for a communication reason: the first time in the run,
 * the ring goes to the world's trace_dir (DIR/comm-trace-rank<R>.txt, the error first).
 * Failing to write it is logged, never added to the failure. */
static void dump_on_failure(fsdp_ctx *ctx, fsdp_trace_ring *ring) {
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    const char *dir = b->world->trace_dir;
    if (!dir || ring->dumped) return;
    ring->dumped = true;
    char path[4096];
    snprintf(path, sizeof path, "%s/comm-trace-rank%d.txt", dir, ctx->rank);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fsdp_log(ctx, FSDP_LOG_WARN, "cannot create %s for the flight recorder: %s", dir,
                 strerror(errno));
        return;
    }
    FILE *f = fopen(path, "w");
    bool ok = f && fprintf(f, "rank %d: %s\n", ctx->rank, fsdp_last_error(ctx)) >= 0 &&
              write_ring(ring, ctx->rank, 0, f);
    int err = errno;
    if (f && fclose(f) != 0) ok = false, err = errno;
    if (!ok)
        fsdp_log(ctx, FSDP_LOG_WARN, "cannot write the flight recorder to %s: %s", path,
                 strerror(err));
    else
        fsdp_log(ctx, FSDP_LOG_WARN, "this rank's last collectives are in %s", path);
}

/* ---- the public dump ---- */

fsdp_status fsdp_comm_trace_print(fsdp_ctx *ctx, int last, FILE *f) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, f);
    fsdp_trace_ring *ring = ring_of(ctx);
    if (!ring)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_comm_trace_print: this context is not bound to a world; call it "
                         "inside fsdp_world_run, on the context passed to the rank's function");
    if (last < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_comm_trace_print: last is %d; use 0 for every call remembered (at "
                         "most %d) or a positive count",
                         last, FSDP_TRACE_DEPTH);
    if (!write_ring(ring, ctx->rank, last, f))
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "fsdp_comm_trace_print: cannot write (or out of memory)");
    return FSDP_OK;
}

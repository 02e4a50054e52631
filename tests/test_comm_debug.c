/* test_comm_debug.c: the comm-debug counters. A tiny model on a (dp 2, tp 2) mesh whose
 * modules make collectives in forward and backward (a "block" all-gathers on tp and reduce-
 * scatters its gradient, its child "block.proj" all-reduces on tp, the root broadcasts on the
 * world and all-reduces a gradient on dp) runs a scripted sequence of steps; the test pins the
 * exact calls and bytes per op and mesh dim, per module name and per phase, the records in
 * order, the JSON text and the table. Also: barriers apart from the totals, nothing counted
 * while off or when the arguments are refused, begin/end misuse, JSON escaping. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "harness.h"

/* ---- the tiny model ---- */

typedef struct groups {
    fsdp_group *world, *dp, *tp;
} groups;

/* "block" (2, 3) -> (4, 3): all_gather rows on tp, then its child; backward: the child, then
 * reduce_scatter of the gradient on tp. */
typedef struct block_impl {
    const groups *g;
    fsdp_tensor *out, *din;
} block_impl;

/* "block.proj" (4, 3) -> (4, 3): copy and all_reduce(sum) on tp; backward passes through. */
typedef struct proj_impl {
    const groups *g;
    fsdp_tensor *out, *din;
} proj_impl;

/* the root: runs block, then broadcasts a bf16 (5,) flag on the world; backward: block, then
 * all_reduce(avg) of a bf16 (4,) gradient on dp. */
typedef struct root_impl {
    const groups *g;
    fsdp_tensor *flag, *grad;
} root_impl;

static void free_two(fsdp_tensor *a, fsdp_tensor *b, void *impl) {
    fsdp_tensor_free(a);
    fsdp_tensor_free(b);
    free(impl);
}
static void block_free(void *p) {
    block_impl *b = p;
    free_two(b->out, b->din, b);
}
static void proj_free(void *p) {
    proj_impl *q = p;
    free_two(q->out, q->din, q);
}
static void root_free(void *p) {
    root_impl *r = p;
    free_two(r->flag, r->grad, r);
}

static fsdp_status block_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                 const fsdp_tensor **out) {
    block_impl *b = fsdp_module_impl(m);
    FSDP_TRY(fsdp_all_gather(ctx, b->g->tp, b->out, in, 0));
    return fsdp_module_forward(ctx, fsdp_module_child(m, 0), b->out, out);
}

static fsdp_status block_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                  const fsdp_tensor **din) {
    block_impl *b = fsdp_module_impl(m);
    const fsdp_tensor *d = NULL;
    FSDP_TRY(fsdp_module_backward(ctx, fsdp_module_child(m, 0), dout, &d));
    FSDP_TRY(fsdp_reduce_scatter(ctx, b->g->tp, b->din, d, 0, FSDP_REDUCE_SUM));
    if (din) *din = b->din;
    return FSDP_OK;
}

static fsdp_status proj_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    proj_impl *q = fsdp_module_impl(m);
    FSDP_TRY(fsdp_tensor_copy(ctx, q->out, in));
    FSDP_TRY(fsdp_all_reduce(ctx, q->g->tp, q->out, FSDP_REDUCE_SUM));
    *out = q->out;
    return FSDP_OK;
}

static fsdp_status proj_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    proj_impl *q = fsdp_module_impl(m);
    FSDP_TRY(fsdp_tensor_copy(ctx, q->din, dout));
    if (din) *din = q->din;
    return FSDP_OK;
}

static fsdp_status root_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    root_impl *r = fsdp_module_impl(m);
    FSDP_TRY(fsdp_module_forward(ctx, fsdp_module_child(m, 0), in, out));
    return fsdp_broadcast(ctx, r->g->world, r->flag, 0);
}

static fsdp_status root_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    root_impl *r = fsdp_module_impl(m);
    FSDP_TRY(fsdp_module_backward(ctx, fsdp_module_child(m, 0), dout, din));
    return fsdp_all_reduce(ctx, r->g->dp, r->grad, FSDP_REDUCE_AVG);
}

static const fsdp_module_ops block_ops = {
    .kind = "Block", .forward = block_forward, .backward = block_backward, .free_impl = block_free};
static const fsdp_module_ops proj_ops = {
    .kind = "Proj", .forward = proj_forward, .backward = proj_backward, .free_impl = proj_free};
static const fsdp_module_ops root_ops = {
    .kind = "Root", .forward = root_forward, .backward = root_backward, .free_impl = root_free};

static fsdp_status tensor(fsdp_ctx *ctx, fsdp_dtype dtype, int64_t rows, int64_t cols,
                          fsdp_tensor **out) {
    return fsdp_tensor_create(ctx, dtype, FSDP_CPU, cols ? 2 : 1, (const int64_t[]){rows, cols},
                              out);
}

/* Builds root -> "block" -> "block.proj". */
static fsdp_status build_model(fsdp_ctx *ctx, const groups *g, fsdp_module **out) {
    root_impl *r = calloc(1, sizeof *r);
    block_impl *b = calloc(1, sizeof *b);
    proj_impl *q = calloc(1, sizeof *q);
    fsdp_module *root = NULL, *block = NULL, *proj = NULL;
    fsdp_status st = r && b && q ? FSDP_OK : FSDP_ERR_OUT_OF_MEMORY;
    if (st == FSDP_OK) {
        r->g = b->g = q->g = g;
        st = tensor(ctx, FSDP_DTYPE_BF16, 5, 0, &r->flag);
    }
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_BF16, 4, 0, &r->grad);
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 4, 3, &b->out);
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 2, 3, &b->din);
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 4, 3, &q->out);
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 4, 3, &q->din);
    if (st != FSDP_OK) {
        if (r) root_free(r);
        if (b) block_free(b);
        if (q) proj_free(q);
        return st;
    }
    /* Each module owns its impl from here on, also on failure. */
    st = fsdp_module_create(ctx, &root_ops, r, &root);
    if (st != FSDP_OK) {
        block_free(b);
        proj_free(q);
        return st;
    }
    st = fsdp_module_create(ctx, &block_ops, b, &block);
    if (st == FSDP_OK) st = fsdp_module_add_child(ctx, root, "block", block);
    if (st == FSDP_OK)
        st = fsdp_module_create(ctx, &proj_ops, q, &proj);
    else
        proj_free(q);
    if (st == FSDP_OK) st = fsdp_module_add_child(ctx, block, "proj", proj);
    if (st != FSDP_OK) {
        fsdp_module_free(root);
        return st;
    }
    *out = root;
    return FSDP_OK;
}

/* ---- the scripted sequence ---- */

static fsdp_status expect(fsdp_ctx *ctx, fsdp_comm_count got, int64_t calls, int64_t bytes,
                          const char *what) {
    FSDP_RANK_CHECK(ctx, got.calls == calls && got.bytes == bytes,
                    "%s: %lld calls and %lld bytes, want %lld and %lld", what, (long long)got.calls,
                    (long long)got.bytes, (long long)calls, (long long)bytes);
    return FSDP_OK;
}

/* The records every rank must have, in the order of their first call. */
static const fsdp_comm_record want_records[] = {
    {FSDP_COMM_ALL_REDUCE, "dp", "", FSDP_COMM_PHASE_NONE, {1, 12}},
    {FSDP_COMM_ALL_GATHER, "tp", "block", FSDP_COMM_PHASE_FORWARD, {2, 96}},
    {FSDP_COMM_ALL_REDUCE, "tp", "block.proj", FSDP_COMM_PHASE_FORWARD, {2, 96}},
    {FSDP_COMM_BROADCAST, "world", "", FSDP_COMM_PHASE_FORWARD, {2, 20}},
    {FSDP_COMM_REDUCE_SCATTER, "tp", "block", FSDP_COMM_PHASE_BACKWARD, {2, 96}},
    {FSDP_COMM_ALL_REDUCE, "dp", "", FSDP_COMM_PHASE_BACKWARD, {2, 16}},
    {FSDP_COMM_BARRIER, "world", "", FSDP_COMM_PHASE_NONE, {1, 0}},
    {FSDP_COMM_ALL_TO_ALL, "tp", "", FSDP_COMM_PHASE_NONE, {1, 32}},
};
#define N_WANT_RECORDS ((int)(sizeof want_records / sizeof want_records[0]))

static const char want_json[] =
    "{\"rank\":%d,\"total\":{\"calls\":12,\"bytes\":368},\"records\":["
    "{\"op\":\"all_reduce\",\"group\":\"dp\",\"module\":\"\",\"phase\":\"none\",\"calls\":1,"
    "\"bytes\":12},"
    "{\"op\":\"all_gather\",\"group\":\"tp\",\"module\":\"block\",\"phase\":\"forward\","
    "\"calls\":2,\"bytes\":96},"
    "{\"op\":\"all_reduce\",\"group\":\"tp\",\"module\":\"block.proj\",\"phase\":\"forward\","
    "\"calls\":2,\"bytes\":96},"
    "{\"op\":\"broadcast\",\"group\":\"world\",\"module\":\"\",\"phase\":\"forward\","
    "\"calls\":2,\"bytes\":20},"
    "{\"op\":\"reduce_scatter\",\"group\":\"tp\",\"module\":\"block\",\"phase\":\"backward\","
    "\"calls\":2,\"bytes\":96},"
    "{\"op\":\"all_reduce\",\"group\":\"dp\",\"module\":\"\",\"phase\":\"backward\","
    "\"calls\":2,\"bytes\":16},"
    "{\"op\":\"barrier\",\"group\":\"world\",\"module\":\"\",\"phase\":\"none\",\"calls\":1,"
    "\"bytes\":0},"
    "{\"op\":\"all_to_all\",\"group\":\"tp\",\"module\":\"\",\"phase\":\"none\",\"calls\":1,"
    "\"bytes\":32}]}\n";

/* Two training steps with collectives in between, counted; one more call after the end. */
static fsdp_status script(fsdp_ctx *ctx, const groups *g, fsdp_module *model) {
    fsdp_tensor *v = NULL, *x = NULL, *dy = NULL, *a = NULL, *b = NULL;
    fsdp_status st = tensor(ctx, FSDP_DTYPE_F32, 3, 0, &v); /* 12 bytes */
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 2, 3, &x);
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 4, 3, &dy);
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 2, 4, &a); /* 32 bytes */
    if (st == FSDP_OK) st = tensor(ctx, FSDP_DTYPE_F32, 2, 4, &b);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g->dp, v, FSDP_REDUCE_SUM);
    for (int step = 0; st == FSDP_OK && step < 2; step++) {
        const fsdp_tensor *y = NULL;
        st = fsdp_module_forward(ctx, model, x, &y);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, model, dy, NULL);
    }
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    /* (2, 4) Shard(0) -> Shard(1) on tp: the input is (2, 4), the output (4, 2). */
    if (st == FSDP_OK) st = fsdp_tensor_resize(ctx, b, 2, (const int64_t[]){4, 2});
    if (st == FSDP_OK) st = fsdp_all_to_all(ctx, g->tp, b, a, 1, 0);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g->dp, v, FSDP_REDUCE_SUM); /* not counted */
    fsdp_tensor_free(v);
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_tensor_free(a);
    fsdp_tensor_free(b);
    return st;
}

static fsdp_status check_counts(fsdp_ctx *ctx) {
    /* per op and mesh dim */
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_GATHER, "tp"), 2, 96, "ag tp"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_GATHER, "dp"), 0, 0, "ag dp"));
    FSDP_TRY(
        expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_REDUCE_SCATTER, "tp"), 2, 96, "rs tp"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_REDUCE, "tp"), 2, 96, "ar tp"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_REDUCE, "dp"), 3, 28, "ar dp"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_REDUCE, NULL), 5, 124, "ar"));
    FSDP_TRY(
        expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_BROADCAST, "world"), 2, 20, "bc world"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ALL_TO_ALL, "tp"), 1, 32, "a2a tp"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_BARRIER, NULL), 1, 0, "barrier"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ANY, "tp"), 7, 320, "any tp"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_count(ctx, FSDP_COMM_ANY, "world"), 2, 20, "any world"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_total(ctx), 12, 368, "total"));
    /* per module (fully qualified names; "" is the root and outside any module) */
    FSDP_TRY(expect(ctx, fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.module = "block"}), 4, 192,
                    "module block"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.module = "block.proj"}), 2,
                    96, "module block.proj"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.module = ""}), 6, 80,
                    "module root"));
    FSDP_TRY(expect(ctx,
                    fsdp_comm_debug_query(
                        ctx, &(fsdp_comm_filter){.module = "", .phase = FSDP_COMM_PHASE_NONE}),
                    2, 44, "outside modules"));
    /* per phase, and combined filters */
    FSDP_TRY(expect(
        ctx, fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.phase = FSDP_COMM_PHASE_FORWARD}), 6,
        212, "forward"));
    FSDP_TRY(expect(
        ctx, fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.phase = FSDP_COMM_PHASE_BACKWARD}), 4,
        112, "backward"));
    FSDP_TRY(
        expect(ctx,
               fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_ALL_REDUCE,
                                                              .group = "dp",
                                                              .phase = FSDP_COMM_PHASE_BACKWARD}),
               2, 16, "ar dp backward"));
    FSDP_TRY(expect(ctx, fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.module = "nothing"}), 0, 0,
                    "unknown module"));
    /* seconds: every counted call was timed (a clock read before and after it), none else */
    double total = fsdp_comm_debug_seconds(ctx, NULL), sum = 0;
    for (int op = FSDP_COMM_ALL_GATHER; op < FSDP_COMM_BARRIER; op++) {
        double s = fsdp_comm_debug_seconds(ctx, &(fsdp_comm_filter){.op = (fsdp_comm_op)op});
        FSDP_RANK_CHECK(ctx, s > 0, "%s: %g seconds, want > 0", fsdp_comm_op_to_string(op), s);
        sum += s;
    }
    FSDP_RANK_CHECK(ctx, fabs(sum - total) <= 1e-12 * total,
                    "the ops' seconds add up to %.9g, the total is %.9g", sum, total);
    double barrier = fsdp_comm_debug_seconds(ctx, &(fsdp_comm_filter){.op = FSDP_COMM_BARRIER});
    double none = fsdp_comm_debug_seconds(ctx, &(fsdp_comm_filter){.module = "nothing"});
    FSDP_RANK_CHECK(ctx, barrier > 0 && none == 0, "barrier %g s, unknown module %g s", barrier,
                    none);
    return FSDP_OK;
}

static fsdp_status check_records(fsdp_ctx *ctx) {
    int n = fsdp_comm_debug_num_records(ctx);
    FSDP_RANK_CHECK(ctx, n == N_WANT_RECORDS, "%d records, want %d", n, N_WANT_RECORDS);
    for (int i = 0; i < n; i++) {
        fsdp_comm_record r;
        FSDP_TRY(fsdp_comm_debug_record(ctx, i, &r));
        const fsdp_comm_record *w = &want_records[i];
        FSDP_RANK_CHECK(ctx,
                        r.op == w->op && strcmp(r.group, w->group) == 0 &&
                            strcmp(r.module, w->module) == 0 && r.phase == w->phase &&
                            r.count.calls == w->count.calls && r.count.bytes == w->count.bytes,
                        "record %d: %s %s '%s' %s %lld calls %lld bytes", i,
                        fsdp_comm_op_to_string(r.op), r.group, r.module,
                        fsdp_comm_phase_to_string(r.phase), (long long)r.count.calls,
                        (long long)r.count.bytes);
    }
    fsdp_comm_record r;
    fsdp_status st = fsdp_comm_debug_record(ctx, n, &r);
    FSDP_RANK_CHECK(ctx, st == FSDP_ERR_INVALID_ARGUMENT, "record %d exists", n);
    fsdp_clear_error(ctx);
    return FSDP_OK;
}

/* Writes with fn into a memory stream; the caller frees *text. */
static fsdp_status capture(fsdp_ctx *ctx, fsdp_status (*fn)(fsdp_ctx *, FILE *), char **text) {
    size_t size = 0;
    *text = NULL;
    FILE *f = open_memstream(text, &size);
    FSDP_RANK_CHECK(ctx, f != NULL, "open_memstream failed");
    fsdp_status st = fn(ctx, f);
    fclose(f);
    return st;
}

static fsdp_status check_outputs(fsdp_ctx *ctx, int rank, bool show) {
    char *json = NULL, *table = NULL, want[sizeof want_json + 16];
    snprintf(want, sizeof want, want_json, rank);
    fsdp_status st = capture(ctx, fsdp_comm_debug_write_json, &json);
    if (st == FSDP_OK && strcmp(json, want) != 0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "JSON is\n%s\nwant\n%s", json, want);
    if (st == FSDP_OK) st = capture(ctx, fsdp_comm_debug_print, &table);
    const char *const lines[] = {
        "comm-debug, rank ",
        ": 12 collectives, 368 bytes; barriers: 1\n",
        "op              group  phase        calls           bytes  module",
        "all_gather      tp     forward          2              96  block\n",
        "all_reduce      tp     forward          2              96  block.proj\n",
        "all_reduce      dp     none             1              12  -\n",
        "barrier         world  none             1               0  -\n",
        "broadcast       world  forward          2              20  (root)\n"};
    for (size_t i = 0; st == FSDP_OK && i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(table, lines[i]))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the table\n%s\nlacks \"%s\"", table, lines[i]);
    if (st == FSDP_OK && show) printf("\n%s%s", table, json);
    free(json);
    free(table);
    return st;
}

static fsdp_status scripted_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_mesh *mesh = NULL;
    FSDP_TRY(
        fsdp_mesh_create(ctx, 2, (const int[]){2, 2}, (const char *const[]){"dp", "tp"}, &mesh));
    groups g = {.world = fsdp_ctx_world_group(ctx)};
    fsdp_module *model = NULL;
    fsdp_status st = fsdp_mesh_get_group(ctx, mesh, "dp", &g.dp);
    if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "tp", &g.tp);
    if (st == FSDP_OK) st = build_model(ctx, &g, &model);
    if (st == FSDP_OK) st = script(ctx, &g, model);
    if (st == FSDP_OK) st = check_counts(ctx);
    if (st == FSDP_OK) st = check_records(ctx);
    if (st == FSDP_OK) st = check_outputs(ctx, rank, rank == 0);
    /* A new begin starts from zero. */
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = expect(ctx, fsdp_comm_debug_total(ctx), 0, 0, "after begin");
    if (st == FSDP_OK && fsdp_comm_debug_num_records(ctx) != 0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "records survived begin");
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    fsdp_module_free(model);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_scripted_counts(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, scripted_body, NULL));
}

/* Refused calls are not counted; begin and end misuse; JSON escaping of labels, and a label
 * that is not UTF-8 refused. */
static fsdp_status misc_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_status st = fsdp_comm_debug_end(ctx);
    FSDP_RANK_CHECK(ctx, st == FSDP_ERR_STATE && strstr(fsdp_last_error(ctx), "not counting"),
                    "end before begin: %s", fsdp_status_to_string(st));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    st = fsdp_comm_debug_begin(ctx);
    FSDP_RANK_CHECK(ctx, st == FSDP_ERR_STATE && strstr(fsdp_last_error(ctx), "already counting"),
                    "begin twice: %s", fsdp_status_to_string(st));
    fsdp_tensor *t = NULL;
    fsdp_group *odd = NULL;
    FSDP_TRY(tensor(ctx, FSDP_DTYPE_F32, 6, 0, &t));
    st = fsdp_all_gather(ctx, NULL, t, t, 3); /* refused: dim out of range */
    if (st == FSDP_ERR_INVALID_ARGUMENT)
        st = expect(ctx, fsdp_comm_debug_total(ctx), 0, 0, "a refused call");
    else
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "the bad all_gather returned %s",
                       fsdp_status_to_string(st));
    if (st == FSDP_OK) st = fsdp_group_split(ctx, NULL, 0, 0, "q\"\\\x01z", &odd);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, odd, t, FSDP_REDUCE_MAX);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    char *json = NULL;
    if (st == FSDP_OK) st = capture(ctx, fsdp_comm_debug_write_json, &json);
    const char *want = "{\"rank\":0,\"total\":{\"calls\":1,\"bytes\":24},\"records\":[{\"op\":"
                       "\"all_reduce\",\"group\":\"q\\\"\\\\\\u0001z\",\"module\":\"\",\"phase\":"
                       "\"none\",\"calls\":1,\"bytes\":24}]}\n";
    if (st == FSDP_OK && strcmp(json, want) != 0)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "JSON is %s, want %s", json, want);
    free(json);
    json = NULL;
    /* a label that is not UTF-8 cannot be a JSON string: refused, naming it */
    fsdp_group *latin1 = NULL;
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_group_split(ctx, NULL, 0, 0, "caf\xe9", &latin1);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, latin1, t, FSDP_REDUCE_MAX);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        fsdp_status bad = capture(ctx, fsdp_comm_debug_write_json, &json);
        if (bad != FSDP_ERR_INVALID_ARGUMENT || !strstr(fsdp_last_error(ctx), "not UTF-8"))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "a Latin-1 label gave %s: %s",
                           fsdp_status_to_string(bad), fsdp_last_error(ctx));
    }
    free(json);
    fsdp_group_free(latin1);
    fsdp_group_free(odd);
    fsdp_tensor_free(t);
    return st;
}

static void test_misc(void) {
    FSDP_TEST_OK(fsdp_test_run_world(1, 20000, misc_body, NULL));
    fsdp_ctx *ctx = fsdp_test_ctx();
    FSDP_TEST_FAILS(fsdp_comm_debug_begin(ctx), FSDP_ERR_STATE, "not bound to a world");
    fsdp_comm_count c = fsdp_comm_debug_total(ctx);
    CU_ASSERT_EQUAL(c.calls, 0);
    CU_ASSERT_EQUAL(fsdp_comm_debug_num_records(ctx), 0);
    CU_ASSERT_STRING_EQUAL(fsdp_comm_op_to_string(FSDP_COMM_REDUCE_SCATTER), "reduce_scatter");
    CU_ASSERT_STRING_EQUAL(fsdp_comm_op_to_string(FSDP_COMM_ALL_TO_ALL), "all_to_all");
    CU_ASSERT_STRING_EQUAL(fsdp_comm_phase_to_string(FSDP_COMM_PHASE_BACKWARD), "backward");
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"scripted_counts", test_scripted_counts},
        {"misc", test_misc},
    };
    return fsdp_test_run(argc, argv, "comm_debug", cases, sizeof cases / sizeof cases[0]);
}

/* comm_debug.c: the comm-debug counters of one rank: calls and bytes per (op, group label,
 * running module, phase), and the seconds spent in them, kept in the rank's context while
 * counting is on; queried through filters, printed as a table and written as JSON. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h> // defines: json_pack, json_dumpf

#include "comm/comm_impl.h"
#include "core/array.h"
#include "core/clock.h"
#include "core/error.h"

fsdp_comm_phase fsdp_comm_phase_of(const fsdp_ctx *ctx) {
    switch (ctx->phase) {
    case FSDP_PHASE_FORWARD:
        return FSDP_COMM_PHASE_FORWARD;
    case FSDP_PHASE_BACKWARD:
        return FSDP_COMM_PHASE_BACKWARD;
    default:
        return FSDP_COMM_PHASE_NONE;
    }
}

static void clear_rows(fsdp_comm_debug *d) {
    for (int i = 0; i < d->n_rows; i++) free(d->rows[i].module);
    d->n_rows = 0;
}

void fsdp_comm_debug_release(fsdp_comm_debug *d) {
    clear_rows(d);
    free(d->rows);
    *d = (fsdp_comm_debug){0};
}

fsdp_status fsdp_comm_debug_note(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                                 int64_t bytes) {
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b || !b->debug.active) return FSDP_OK;
    fsdp_comm_debug *d = &b->debug;
    const char *module = fsdp_ctx_scope_top(ctx);
    fsdp_comm_phase phase = fsdp_comm_phase_of(ctx);
    fsdp_comm_debug_row *row = NULL;
    for (int i = 0; i < d->n_rows && !row; i++) {
        fsdp_comm_debug_row *r = &d->rows[i];
        if (r->op == op && r->phase == phase && strcmp(r->group, g->label) == 0 &&
            strcmp(r->module, module) == 0)
            row = r;
    }
    if (!row) {
        if (!fsdp_array_reserve((void **)&d->rows, &d->cap_rows, d->n_rows + 1, sizeof *d->rows))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "comm-debug: cannot grow to %d rows",
                             d->n_rows + 1);
        char *name = strdup(module);
        if (!name)
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "comm-debug: cannot copy a module name");
        row = &d->rows[d->n_rows++];
        *row = (fsdp_comm_debug_row){.op = op, .phase = phase, .module = name};
        snprintf(row->group, sizeof row->group, "%s", g->label);
    }
    row->count.calls++;
    row->count.bytes += bytes;
    d->last_row = (int)(row - d->rows);
    return FSDP_OK;
}

double fsdp_comm_debug_clock(const fsdp_ctx *ctx) {
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b || !b->debug.active) return 0;
    return fsdp_clock_now();
}

void fsdp_comm_debug_timed(fsdp_ctx *ctx, double t0) {
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (t0 == 0 || !b || !b->debug.active || b->debug.last_row >= b->debug.n_rows) return;
    b->debug.rows[b->debug.last_row].seconds += fsdp_comm_debug_clock(ctx) - t0;
}

int fsdp_comm_debug_last(const fsdp_ctx *ctx, unsigned *session) {
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b || !b->debug.active || b->debug.last_row >= b->debug.n_rows) return -1;
    *session = b->debug.session;
    return b->debug.last_row;
}

void fsdp_comm_debug_timed_row(fsdp_ctx *ctx, int row, unsigned session, double t0) {
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (t0 == 0 || row < 0 || !b || !b->debug.active || b->debug.session != session ||
        row >= b->debug.n_rows)
        return;
    b->debug.rows[row].seconds += fsdp_comm_debug_clock(ctx) - t0;
}

fsdp_status fsdp_comm_debug_begin(fsdp_ctx *ctx) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_comm_debug_begin: this context is not bound to a world; count "
                         "inside fsdp_world_run, on the context passed to the rank's function");
    if (b->debug.active)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_comm_debug_begin: already counting; call fsdp_comm_debug_end first");
    clear_rows(&b->debug);
    b->debug.session++;
    b->debug.active = true;
    return FSDP_OK;
}

fsdp_status fsdp_comm_debug_end(fsdp_ctx *ctx) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b || !b->debug.active)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_comm_debug_end: not counting; call fsdp_comm_debug_begin first");
    b->debug.active = false;
    return FSDP_OK;
}

static bool matches(const fsdp_comm_debug_row *r, const fsdp_comm_filter *f) {
    if (f->op == FSDP_COMM_ANY ? r->op == FSDP_COMM_BARRIER : r->op != f->op) return false;
    if (f->group && strcmp(f->group, r->group) != 0) return false;
    if (f->module && strcmp(f->module, r->module) != 0) return false;
    return f->phase == FSDP_COMM_PHASE_ANY || f->phase == r->phase;
}

fsdp_comm_count fsdp_comm_debug_query(const fsdp_ctx *ctx, const fsdp_comm_filter *filter) {
    fsdp_comm_count sum = {0, 0};
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b) return sum;
    const fsdp_comm_filter all = {0};
    for (int i = 0; i < b->debug.n_rows; i++) {
        const fsdp_comm_debug_row *r = &b->debug.rows[i];
        if (!matches(r, filter ? filter : &all)) continue;
        sum.calls += r->count.calls;
        sum.bytes += r->count.bytes;
    }
    return sum;
}

double fsdp_comm_debug_seconds(const fsdp_ctx *ctx, const fsdp_comm_filter *filter) {
    double sum = 0;
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    const fsdp_comm_filter all = {0};
    for (int i = 0; b && i < b->debug.n_rows; i++)
        if (matches(&b->debug.rows[i], filter ? filter : &all)) sum += b->debug.rows[i].seconds;
    return sum;
}

fsdp_comm_count fsdp_comm_debug_count(const fsdp_ctx *ctx, fsdp_comm_op op, const char *group) {
    return fsdp_comm_debug_query(ctx, &(fsdp_comm_filter){.op = op, .group = group});
}

fsdp_comm_count fsdp_comm_debug_total(const fsdp_ctx *ctx) {
    return fsdp_comm_debug_query(ctx, NULL);
}

int fsdp_comm_debug_num_records(const fsdp_ctx *ctx) {
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    return b ? b->debug.n_rows : 0;
}

fsdp_status fsdp_comm_debug_record(fsdp_ctx *ctx, int i, fsdp_comm_record *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    int n = b ? b->debug.n_rows : 0;
    if (i < 0 || i >= n)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_comm_debug_record: record %d does not exist (there are %d)", i, n);
    const fsdp_comm_debug_row *r = &b->debug.rows[i];
    *out = (fsdp_comm_record){
        .op = r->op, .group = r->group, .module = r->module, .phase = r->phase, .count = r->count};
    return FSDP_OK;
}

static fsdp_status check_written(fsdp_ctx *ctx, FILE *f, const char *what) {
    if (!ferror(f)) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_IO, "%s: writing failed", what);
}

/* The module column: its name; "(root)" for the root module, whose name is ""; "-" outside
 * any module (the module layer sets a phase only while a module runs). */
static const char *module_column(const fsdp_comm_debug_row *r) {
    if (r->module[0]) return r->module;
    return r->phase == FSDP_COMM_PHASE_NONE ? "-" : "(root)";
}

fsdp_status fsdp_comm_debug_print(fsdp_ctx *ctx, FILE *f) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, f);
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    int n = b ? b->debug.n_rows : 0;
    int group_w = 5;
    for (int i = 0; i < n; i++) {
        int w = (int)strlen(b->debug.rows[i].group);
        if (w > group_w) group_w = w;
    }
    fsdp_comm_count total = fsdp_comm_debug_total(ctx);
    fsdp_comm_count barriers = fsdp_comm_debug_count(ctx, FSDP_COMM_BARRIER, NULL);
    fprintf(f, "comm-debug, rank %d: %lld collectives, %lld bytes; barriers: %lld\n", ctx->rank,
            (long long)total.calls, (long long)total.bytes, (long long)barriers.calls);
    fprintf(f, "%-14s  %-*s  %-8s  %8s  %14s  %s\n", "op", group_w, "group", "phase", "calls",
            "bytes", "module");
    for (int i = 0; i < n; i++) {
        const fsdp_comm_debug_row *r = &b->debug.rows[i];
        fprintf(f, "%-14s  %-*s  %-8s  %8lld  %14lld  %s\n", fsdp_comm_op_to_string(r->op), group_w,
                r->group, fsdp_comm_phase_to_string(r->phase), (long long)r->count.calls,
                (long long)r->count.bytes, module_column(r));
    }
    return check_written(ctx, f, "fsdp_comm_debug_print");
}

/* *out = a JSON string of s; refused when s is not UTF-8, which JSON strings must be. */
static fsdp_status json_text(fsdp_ctx *ctx, const char *what, const char *s, json_t **out) {
    *out = json_string(s);
    if (*out) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "fsdp_comm_debug_write_json: the %s name '%s' is not UTF-8 text, which JSON "
                     "needs; name it in UTF-8",
                     what, s);
}

/* Appends one record (op, group, module, phase, calls, bytes, in this order) to records. */
static fsdp_status json_record(fsdp_ctx *ctx, const fsdp_comm_debug_row *r, json_t *records) {
    json_t *group = NULL, *module = NULL;
    FSDP_TRY(json_text(ctx, "group", r->group, &group));
    fsdp_status st = json_text(ctx, "module", r->module, &module);
    if (st != FSDP_OK) {
        json_decref(group);
        return FSDP_PASS(ctx, st);
    }
    /* "o" hands group and module to the record, which json_pack frees on failure too. */
    json_t *j =
        json_pack("{s:s, s:o, s:o, s:s, s:I, s:I}", "op", fsdp_comm_op_to_string(r->op), "group",
                  group, "module", module, "phase", fsdp_comm_phase_to_string(r->phase), "calls",
                  (json_int_t)r->count.calls, "bytes", (json_int_t)r->count.bytes);
    if (!j || json_array_append_new(records, j) != 0)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_comm_debug_write_json");
    return FSDP_OK;
}

fsdp_status fsdp_comm_debug_write_json(fsdp_ctx *ctx, FILE *f) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, f);
    const fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    int n = b ? b->debug.n_rows : 0;
    fsdp_comm_count total = fsdp_comm_debug_total(ctx);
    json_t *records = json_array();
    json_t *root =
        json_pack("{s:i, s:{s:I, s:I}, s:o}", "rank", ctx->rank, "total", "calls",
                  (json_int_t)total.calls, "bytes", (json_int_t)total.bytes, "records", records);
    fsdp_status st =
        root ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_comm_debug_write_json");
    for (int i = 0; st == FSDP_OK && i < n; i++) st = json_record(ctx, &b->debug.rows[i], records);
    /* Compact (",", ":") in insertion order, one line per rank: the bytes the readers know. */
    if (st == FSDP_OK &&
        (json_dumpf(root, f, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0 || fputc('\n', f) == EOF))
        st = FSDP_FAIL(ctx, FSDP_ERR_IO, "fsdp_comm_debug_write_json: writing failed");
    json_decref(root);
    return st == FSDP_OK ? check_written(ctx, f, "fsdp_comm_debug_write_json") : FSDP_PASS(ctx, st);
}

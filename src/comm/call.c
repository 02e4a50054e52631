/* call.c: what one rank asks of a group (fsdp_call), built the same way by every backend, and
 * the judgement of a group's calls: the first rank that rejected its own arguments, else the
 * first field the ranks disagree on, with every rank's value in the message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/tensor_impl.h"

const char *fsdp_call_op_name(int op) {
    return op == FSDP_OP_SPLIT   ? "group split"
           : op == FSDP_OP_SHARE ? "shard sharing"
                                 : fsdp_comm_op_to_string((fsdp_comm_op)op);
}

static void set_global_shape(fsdp_call *c, const fsdp_tensor *t) {
    c->dtype = t->dtype;
    c->device = fsdp_tensor_device(t).type;
    c->ndim = t->ndim;
    memcpy(c->shape, t->shape, sizeof c->shape);
}

fsdp_call fsdp_call_all_gather(fsdp_tensor *out, const fsdp_tensor *in, int dim) {
    fsdp_call c = {.op = FSDP_COMM_ALL_GATHER, .dim = dim, .in = in, .out = out};
    set_global_shape(&c, out);
    return c;
}

fsdp_call fsdp_call_reduce_scatter(fsdp_tensor *out, const fsdp_tensor *in, int dim,
                                   fsdp_reduce_op op) {
    fsdp_call c = {.op = FSDP_COMM_REDUCE_SCATTER, .dim = dim, .reduce = op, .in = in, .out = out};
    set_global_shape(&c, in);
    return c;
}

fsdp_call fsdp_call_all_reduce(fsdp_tensor *t, fsdp_reduce_op op) {
    fsdp_call c = {.op = FSDP_COMM_ALL_REDUCE, .reduce = op, .in = t, .out = t};
    set_global_shape(&c, t);
    return c;
}

fsdp_call fsdp_call_broadcast(fsdp_tensor *t, int root) {
    fsdp_call c = {.op = FSDP_COMM_BROADCAST, .root = root, .in = t, .out = t};
    set_global_shape(&c, t);
    return c;
}

fsdp_call fsdp_call_all_to_all(fsdp_tensor *out, const fsdp_tensor *in, int split_dim,
                               int concat_dim) {
    fsdp_call c = {
        .op = FSDP_COMM_ALL_TO_ALL, .dim = split_dim, .dim2 = concat_dim, .in = in, .out = out};
    set_global_shape(&c, in);
    if (split_dim != concat_dim) c.shape[concat_dim] = out->shape[concat_dim];
    return c;
}

/* ---- judging: do the ranks agree? ---- */

typedef void (*show_fn)(const fsdp_call *c, char *buf, size_t size);

static void show_op(const fsdp_call *c, char *buf, size_t size) {
    snprintf(buf, size, "%s", fsdp_call_op_name(c->op));
}
static void show_agree(const fsdp_call *c, char *buf, size_t size) {
    snprintf(buf, size, "'%s'", c->agree ? c->agree : "");
}
static void show_dtype(const fsdp_call *c, char *buf, size_t size) {
    snprintf(buf, size, "%s", fsdp_dtype_to_string(c->dtype));
}
static void show_device(const fsdp_call *c, char *buf, size_t size) {
    snprintf(buf, size, "%s", fsdp_device_to_string((fsdp_device){c->device, 0}));
}
static void show_shape(const fsdp_call *c, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < c->ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)c->shape[i]);
    if (used < size) snprintf(buf + used, size - used, ")");
}
static void show_dims(const fsdp_call *c, char *buf, size_t size) {
    if (c->op == FSDP_COMM_ALL_TO_ALL)
        snprintf(buf, size, "split %d concat %d", c->dim, c->dim2);
    else
        snprintf(buf, size, "%d", c->dim);
}
static void show_root(const fsdp_call *c, char *buf, size_t size) {
    snprintf(buf, size, "%d", c->root);
}
static void show_reduce(const fsdp_call *c, char *buf, size_t size) {
    snprintf(buf, size, "%s", fsdp_reduce_op_to_string(c->reduce));
}

static bool same_op(const fsdp_call *a, const fsdp_call *b) {
    return a->op == b->op;
}
static bool same_agree(const fsdp_call *a, const fsdp_call *b) {
    return strcmp(a->agree ? a->agree : "", b->agree ? b->agree : "") == 0;
}
static bool same_dtype(const fsdp_call *a, const fsdp_call *b) {
    return a->dtype == b->dtype;
}
static bool same_device(const fsdp_call *a, const fsdp_call *b) {
    return a->device == b->device;
}
static bool same_shape(const fsdp_call *a, const fsdp_call *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}
static bool same_dims(const fsdp_call *a, const fsdp_call *b) {
    return a->dim == b->dim && a->dim2 == b->dim2;
}
static bool same_root(const fsdp_call *a, const fsdp_call *b) {
    return a->root == b->root;
}
static bool same_reduce(const fsdp_call *a, const fsdp_call *b) {
    return a->reduce == b->reduce;
}

/* What every rank's call must agree on, in the order it is checked. */
static const struct agreement {
    const char *what;
    fsdp_status status;
    bool (*same)(const fsdp_call *a, const fsdp_call *b);
    show_fn show;
} agreements[] = {
    {"which collective to make (every rank of a group must make the same collectives in the "
     "same order)",
     FSDP_ERR_COMM, same_op, show_op},
    {"the group to make", FSDP_ERR_INVALID_ARGUMENT, same_agree, show_agree},
    {"the dtype", FSDP_ERR_DTYPE, same_dtype, show_dtype},
    {"the device kind of the tensors (every rank's tensors of a collective are on one kind: "
     "move them with fsdp_tensor_copy or fsdp_module_to, or give every rank a device of that "
     "kind with fsdp_ctx_set_device)",
     FSDP_ERR_DEVICE, same_device, show_device},
    {"the global shape (all_gather: the output; reduce_scatter: the input; all_to_all: the "
     "shape both are chunks of)",
     FSDP_ERR_SHAPE, same_shape, show_shape},
    {"the dim", FSDP_ERR_INVALID_ARGUMENT, same_dims, show_dims},
    {"the root", FSDP_ERR_INVALID_ARGUMENT, same_root, show_root},
    {"the reduction", FSDP_ERR_INVALID_ARGUMENT, same_reduce, show_reduce},
};

/* "rank 0 (8, 13), rank 1 (8, 12)" */
static void list_values(char *buf, size_t size, const fsdp_call *const *calls, int n,
                        const int *ranks, show_fn show) {
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < n && used < size; r++) {
        char value[160];
        show(calls[r], value, sizeof value);
        used += (size_t)snprintf(buf + used, size - used, "%srank %d %s", r ? ", " : "", ranks[r],
                                 value);
    }
}

static fsdp_status verdict(char *msg, size_t size, fsdp_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static fsdp_status verdict(char *msg, size_t size, fsdp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, size, fmt, ap);
    va_end(ap);
    return status;
}

fsdp_status fsdp_call_judge(const fsdp_call *const *calls, int n, int mine, const int *ranks,
                            const char *group_desc, char *msg, size_t size) {
    msg[0] = '\0';
    for (int r = 0; r < n; r++) {
        const fsdp_call *c = calls[r];
        if (c->rejected != FSDP_OK)
            return verdict(
                msg, size, c->rejected, "%s on group %s: rank %d rejected its arguments: %s",
                fsdp_call_op_name(c->op), group_desc, ranks[r], c->reject_msg ? c->reject_msg : "");
    }
    for (size_t k = 0; k < sizeof agreements / sizeof agreements[0]; k++) {
        const struct agreement *a = &agreements[k];
        for (int r = 1; r < n; r++) {
            if (a->same(calls[0], calls[r])) continue;
            char values[FSDP_ERROR_MAX / 2];
            list_values(values, sizeof values, calls, n, ranks, a->show);
            return verdict(msg, size, a->status, "%s on group %s: the ranks disagree on %s: %s",
                           fsdp_call_op_name(calls[mine]->op), group_desc, a->what, values);
        }
    }
    return FSDP_OK;
}

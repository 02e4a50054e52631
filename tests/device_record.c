/* device_record.c: the recorded CPU-then-device runs of the device suites (device_record.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_record.h"
#include "harness.h" // defines: FSDP_RANK_CHECK

/* The device of a rank's second pass: two ranks share a sim device in a world of 4. */
fsdp_device rank_device(int rank) {
    return (fsdp_device){FSDP_DEVICE_SIM, rank % 2};
}

/* ---- what a pass produced: bytes with labels ---- */

void record_free(record *r) {
    free(r->p);
    memset(r, 0, sizeof *r);
}

fsdp_status put(fsdp_ctx *ctx, record *r, const char *label, const void *src, size_t n) {
    if (label && r->n_marks < MAX_MARKS) {
        r->mark_at[r->n_marks] = r->n;
        snprintf(r->mark[r->n_marks++], sizeof r->mark[0], "%s", label);
    }
    if (r->n + n > r->cap) {
        size_t cap = 2 * (r->n + n) + 256;
        unsigned char *p = realloc(r->p, cap);
        if (!p) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "no memory for a record");
        r->p = p, r->cap = cap;
    }
    if (n) memcpy(r->p + r->n, src, n);
    r->n += n;
    return FSDP_OK;
}

/* t's bytes (copied to the host first when it lives on a device), t on the pass's device. */
fsdp_status put_tensor(fsdp_ctx *ctx, record *r, const char *label, const fsdp_tensor *t) {
    fsdp_device at = fsdp_tensor_device(t);
    FSDP_RANK_CHECK(ctx, at.type == r->dev.type && at.index == r->dev.index,
                    "%s is on %s:%d, not on the pass's device %s:%d", label,
                    fsdp_device_to_string(at), at.index, fsdp_device_to_string(r->dev),
                    r->dev.index);
    fsdp_tensor *h;
    FSDP_TRY(fsdp_tensor_create(ctx, fsdp_tensor_dtype(t), FSDP_CPU, fsdp_tensor_ndim(t),
                                fsdp_tensor_shape(t), &h));
    fsdp_status st = fsdp_tensor_copy(ctx, h, t);
    if (st == FSDP_OK)
        st = put(ctx, r, label, fsdp_tensor_shape(t), 8 * (size_t)fsdp_tensor_ndim(t));
    if (st == FSDP_OK) st = put(ctx, r, NULL, fsdp_tensor_data(h), fsdp_tensor_nbytes(h));
    fsdp_tensor_free(h);
    return st;
}

/* Every comm-debug record since the last fsdp_comm_debug_begin, in order. */
fsdp_status put_comm(fsdp_ctx *ctx, record *r, const char *label) {
    int n = fsdp_comm_debug_num_records(ctx);
    FSDP_TRY(put(ctx, r, label, &n, sizeof n));
    for (int i = 0; i < n; i++) {
        fsdp_comm_record c;
        FSDP_TRY(fsdp_comm_debug_record(ctx, i, &c));
        char line[256];
        int len = snprintf(line, sizeof line, "%d %s %s %d %lld %lld", (int)c.op,
                           c.group ? c.group : "-", c.module ? c.module : "-", (int)c.phase,
                           (long long)c.count.calls, (long long)c.count.bytes);
        FSDP_TRY(put(ctx, r, NULL, line, (size_t)len));
    }
    return FSDP_OK;
}

/* The device pass's record against the CPU pass's: equal bytes, or a message naming the first
 * labelled piece that differs. */
static fsdp_status same_record(fsdp_ctx *ctx, const record *cpu, const record *dev,
                               const char *what) {
    size_t first = 0, n = cpu->n < dev->n ? cpu->n : dev->n;
    while (first < n && cpu->p[first] == dev->p[first]) first++;
    if (first == n && cpu->n == dev->n) return FSDP_OK;
    const char *label = "(start)";
    for (int i = 0; i < cpu->n_marks && cpu->mark_at[i] <= first; i++) label = cpu->mark[i];
    return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                     "%s: the run on sim differs from the CPU run's at byte %zu, in '%s' (%zu and "
                     "%zu bytes)",
                     what, first, label, dev->n, cpu->n);
}

/* Runs fn on the CPU and then on this rank's device, and compares. */
fsdp_status cpu_then_device(fsdp_ctx *ctx, int rank, pass_fn fn, const void *arg, const char *what,
                            bool *differs) {
    record cpu = {.dev = FSDP_CPU}, dev = {.dev = rank_device(rank)};
    fsdp_status st = fsdp_ctx_set_device(ctx, FSDP_CPU);
    if (st == FSDP_OK) st = fn(ctx, rank, FSDP_CPU, arg, &cpu);
    if (st == FSDP_OK) st = fsdp_ctx_set_device(ctx, rank_device(rank));
    if (st == FSDP_OK) st = fn(ctx, rank, rank_device(rank), arg, &dev);
    if (st == FSDP_OK) {
        st = same_record(ctx, &cpu, &dev, what);
        if (differs) { /* the negative control wants the difference, not a failure */
            *differs = st != FSDP_OK;
            st = FSDP_OK;
        }
    }
    record_free(&cpu);
    record_free(&dev);
    return st;
}

/* A copy on dev of host tensor h (h itself on the CPU). */
fsdp_status to_dev(fsdp_ctx *ctx, fsdp_tensor *h, fsdp_device dev, fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create(ctx, fsdp_tensor_dtype(h), dev, fsdp_tensor_ndim(h),
                                fsdp_tensor_shape(h), out));
    return fsdp_tensor_copy(ctx, *out, h);
}

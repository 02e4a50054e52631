/* device_record.h: what the device suites (test_tp_device, test_replicate_device) share: a
 * run recorded as labelled bytes (tensors copied back to the host, comm-debug records), the
 * same run on the CPU and then on the rank's simulated GPU compared bit for bit, naming the
 * first piece that differs. */
#ifndef FSDP_TESTS_DEVICE_RECORD_H
#define FSDP_TESTS_DEVICE_RECORD_H

#include <stdbool.h>
#include <stddef.h>

#include "fsdp/fsdp.h"

/* The device of a rank's second pass: sim:(rank % 2), so two ranks share a sim device in a
 * world of 4 (the suites set FSDP_SIM_DEVICES=2). */
fsdp_device rank_device(int rank);

/* One pass's results: labelled bytes, and where the labels start (at most MAX_MARKS). */
#define MAX_MARKS 512

typedef struct record {
    fsdp_device dev; /* where every recorded tensor must be: the pass's device */
    unsigned char *p;
    size_t n, cap;
    int n_marks;
    size_t mark_at[MAX_MARKS];
    char mark[MAX_MARKS][48];
} record;

void record_free(record *r);

/* Appends n bytes at src, marked with label (NULL: part of the previous piece). */
fsdp_status put(fsdp_ctx *ctx, record *r, const char *label, const void *src, size_t n);
/* Appends t's shape and bytes (copied to the host); t must be on the pass's device (r->dev). */
fsdp_status put_tensor(fsdp_ctx *ctx, record *r, const char *label, const fsdp_tensor *t);
/* Appends every comm-debug record (op, group, module, phase, calls, bytes) since the last
 * fsdp_comm_debug_begin, in order. */
fsdp_status put_comm(fsdp_ctx *ctx, record *r, const char *label);

typedef fsdp_status (*pass_fn)(fsdp_ctx *ctx, int rank, fsdp_device dev, const void *arg,
                               record *out);

/* Runs fn on the CPU (the rank's device set to the CPU) and then on rank_device(rank), and
 * compares the records: FSDP_OK when equal; otherwise a failure naming `what` and the first
 * piece that differs, or, with differs (may be NULL) given, *differs set and FSDP_OK (for a
 * negative control). */
fsdp_status cpu_then_device(fsdp_ctx *ctx, int rank, pass_fn fn, const void *arg, const char *what,
                            bool *differs);

/* A copy on dev of host tensor h. */
fsdp_status to_dev(fsdp_ctx *ctx, fsdp_tensor *h, fsdp_device dev, fsdp_tensor **out);

#endif

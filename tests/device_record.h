/* device_record.h: what the device suites (test_tp_device, test_replicate_device) share: a
 * run recorded as labelled bytes (tensors copied back to the host, comm-debug records), the
 * same run on the CPU and then on the rank's simulated GPU compared bit for bit, naming the
 * first piece that differs; with FSDP_TEST_DEVICE=cuda on cuda:0 instead, every rank thread
 * on the one GPU, compared within a derived bound (record_cuda_model). */
#ifndef FSDP_TESTS_DEVICE_RECORD_H
#define FSDP_TESTS_DEVICE_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

/* Whether the suite's worlds run on the nccl backend (FSDP_TEST_BACKEND=nccl, harness.h). */
bool on_nccl(void);

/* Whether the suite's device passes run on cuda:0: FSDP_TEST_DEVICE=cuda (CTest's <suite>_cuda
 * entries) in a program that has the mode (it called record_cuda_model); otherwise on sim,
 * whatever the machine has. */
bool on_cuda(void);

/* Whether the device pass is compared with the CPU pass within a bound rather than bit for bit:
 * on nccl (unordered sums) or on cuda (other kernels). The suites then train with SGD where they
 * would use Adam (whose division by sqrt(v) amplifies a rounding difference up to lr). */
bool bounded(void);

/* What a suite's main does first: 0 to run (on sim; or on cuda with a GPU present, printing the
 * device and the bound); FSDP_TEST_SKIPPED (printing why) with FSDP_TEST_DEVICE=cuda and no usable
 * CUDA device; 1 (printing why) with FSDP_TEST_REQUIRE_DEVICE=cuda and no such device, an unknown
 * device name, or cuda with FSDP_TEST_BACKEND=nccl. main returns it when it is not 0. Call
 * record_cuda_model before it. */
int record_device_mode(void);

/* The device of a rank's second pass: sim:(rank % 2), so two ranks share a sim device in a
 * world of 4 (the suites set FSDP_SIM_DEVICES=2); on the nccl backend sim:rank, one device per
 * rank as NCCL wants one GPU per rank (the suites then set FSDP_SIM_DEVICES=4); on cuda cuda:0
 * for every rank (each rank thread's context has its own streams there). */
fsdp_device rank_device(int rank);

/* Gives the program its cuda mode (call it first in main), and the suite's model of its longest
 * path for the cuda bound (nothing else off cuda): k the largest
 * GEMM inner dimension or summed length, depth the GEMMs and sums chained on a recorded value's
 * path over all the steps. Sets record_cuda_bound() = fsdp_test_sum_tol(k, depth) + 8 depth u
 * (derived in device_record.c), which every comparison on cuda then allows at least. */
void record_cuda_model(int64_t k, int depth);
/* That bound, as a multiple of a recorded tensor's largest magnitude (0 off cuda). */
double record_cuda_bound(void);

/* One pass's results: labelled bytes, and where the labels start (at most MAX_MARKS), and the
 * spans of float32 values among them, which a bounded comparison reads as
 * numbers; everything else (shapes, comm-debug records) is compared bit for bit always. */
#define MAX_MARKS 512

typedef struct record {
    fsdp_device dev; /* where every recorded tensor must be: the pass's device */
    unsigned char *p;
    size_t n, cap;
    int n_marks;
    size_t mark_at[MAX_MARKS];
    char mark[MAX_MARKS][48];
    int n_spans, cap_spans;
    size_t *span_at; /* where each span starts (byte) */
    int64_t *span_n; /* its floats */
} record;

void record_free(record *r);

/* Appends n bytes at src, marked with label (NULL: part of the previous piece). */
fsdp_status put(fsdp_ctx *ctx, record *r, const char *label, const void *src, size_t n);
/* Appends n float32 values at v, marked with label, as a span of numbers. */
fsdp_status put_f32(fsdp_ctx *ctx, record *r, const char *label, const float *v, int64_t n);
/* Appends t's shape and bytes (copied to the host); t must be on the pass's device (r->dev).
 * An f32 tensor's values are a span of numbers. */
fsdp_status put_tensor(fsdp_ctx *ctx, record *r, const char *label, const fsdp_tensor *t);
/* Appends every comm-debug record (op, group, module, phase, calls, bytes) since the last
 * fsdp_comm_debug_begin, in order. */
fsdp_status put_comm(fsdp_ctx *ctx, record *r, const char *label);

typedef fsdp_status (*pass_fn)(fsdp_ctx *ctx, int rank, fsdp_device dev, const void *arg,
                               record *out);

/* The tolerance of the comparisons that follow (set before the world runs; 0, the start, is bit
 * for bit): each span's values may differ by tol times the span's largest magnitude in the CPU
 * run. Only for the nccl backend's unordered sums: the suites derive tol where they set it. */
void record_set_tolerance(double tol);
/* The largest difference seen in the spans since the last call, as a multiple of its span's
 * largest magnitude (0 when every span was equal); resets it. */
double record_take_max_diff(void);

/* Runs fn on the CPU (the rank's device set to the CPU) and then on rank_device(rank), and
 * compares the records: FSDP_OK when equal (within the tolerance set, in the spans); otherwise a
 * failure naming `what` and the first piece that differs, or, with differs (may be NULL) given,
 * *differs set and FSDP_OK (for a negative control). */
fsdp_status cpu_then_device(fsdp_ctx *ctx, int rank, pass_fn fn, const void *arg, const char *what,
                            bool *differs);

/* The tolerance of a recorded run whose collectives sum over groups of at most n ranks (the
 * world's size will do: the bound grows with n), on a value that
 * passes through `sums` chained such sums (at least 1): on the nccl backend with n > 2,
 * fsdp_test_sum_tol(n, sums) of a tensor's largest magnitude (derived in device_record.c); 0
 * (bit for bit) on the local backend, and on nccl for n <= 2. */
double record_nccl_bound(int n, int sums);

/* fsdp_test_run_world(n, 60 s, fn, user) with record_nccl_bound(n, sums) (on cuda
 * record_cuda_bound()) as the tolerance of its comparisons; on nccl and cuda prints the largest
 * difference seen against the bound. */
fsdp_status record_run_world(int n, int sums, fsdp_rank_fn fn, void *user);
/* The largest difference the last record_run_world saw (what it printed on nccl). */
double record_last_diff(void);

/* A copy on dev of host tensor h. */
fsdp_status to_dev(fsdp_ctx *ctx, fsdp_tensor *h, fsdp_device dev, fsdp_tensor **out);

#endif

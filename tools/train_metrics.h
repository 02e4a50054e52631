/* train_metrics.h: what a logged step of fsdp-train reports, and its record in the metrics file
 * ([log] metrics): one JSON object per line, written through jansson. docs/train.md, "Metrics". */
#ifndef FSDP_TOOLS_TRAIN_METRICS_H
#define FSDP_TOOLS_TRAIN_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp/fsdp.h"

/* Collectives of the training steps since the last metrics record, on rank 0 (from its
 * comm-debug counters): per op (fsdp_comm_op) calls, bytes and seconds; the steps' wall time. */
typedef struct train_comm {
    fsdp_comm_count count[FSDP_COMM_OP_COUNT];
    double seconds[FSDP_COMM_OP_COUNT];
    double step_seconds;
} train_comm;

/* What a logged step reports. */
typedef struct train_report {
    bool progress;        /* a progress line: loss, samples_per_s, elapsed, lr, grad_norm */
    double loss;          /* batch losses averaged since the last line */
    double samples_per_s; /* since the last line */
    double elapsed;       /* seconds since the loop started */
    double lr;            /* of the step's update */
    double grad_norm;     /* before clipping; NAN without clipping */
    bool eval;            /* an evaluation: eval_loss, eval_accuracy */
    double eval_loss;
    double eval_accuracy;   /* NAN for regression */
    const train_comm *comm; /* progress with counting on: the steps' collectives, else NULL */
    const char *device;     /* rank 0's device ("sim:0") on a progress step; NULL on the CPU */
    /* With device: its caching allocator's peak bytes in use since the previous progress step
     * (all ranks on it together), its reserved bytes now and its capacity. */
    int64_t mem_peak, mem_reserved, mem_capacity;
    double mfu; /* progress: model-FLOP utilisation since the last line (train_mfu_of); 0: none */
} train_report;

/* The seconds of the steps in collectives, and the rest of the steps' wall time. */
double train_comm_seconds(const train_comm *c);
double train_comm_compute_seconds(const train_comm *c);

/* Writes step's record to f as one line: {"step": 10, "loss": 0.5, ...} (jansson, keys in the
 * order of docs/train.md, ", " and ": " between them); per_sample is the targets of a sequence
 * (tokens_per_s, eval_perplexity), 0 for a model on samples. Does not flush. 0, or -1 when
 * memory ran out or the write failed (ferror(f) tells which). */
int train_metrics_write(FILE *f, int64_t step, const train_report *r, int64_t per_sample);

#endif

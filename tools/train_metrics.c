/* train_metrics.c: a logged step's record in fsdp-train's metrics file, one JSON line built and
 * written by jansson. Readers: tools/plot_metrics.py, tools/check_tensorboard.py, the tests. */
#include "train_metrics.h"

#include <jansson.h> // defines: json_object, json_real, json_dumpf
#include <math.h>

/* Reals with 9 significant digits (JSON_REAL_PRECISION(9)), as the records' "%.9g" had: enough
 * to read back every float32 exactly (the loss, lr and gradient norm are float32 values or
 * averages of them), without the 17 digits of a double's noise ("0.10000000000000001"). */
#define METRICS_FLAGS (JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))

static const fsdp_comm_op g_ops[] = {FSDP_COMM_ALL_GATHER, FSDP_COMM_REDUCE_SCATTER,
                                     FSDP_COMM_ALL_REDUCE, FSDP_COMM_BROADCAST,
                                     FSDP_COMM_ALL_TO_ALL};

double train_comm_seconds(const train_comm *c) {
    double sum = 0;
    for (int op = FSDP_COMM_ANY + 1; op < FSDP_COMM_OP_COUNT; op++) sum += c->seconds[op];
    return sum;
}

double train_comm_compute_seconds(const train_comm *c) {
    return fmax(c->step_seconds - train_comm_seconds(c), 0);
}

/* Sets key to v rounded to `decimals` places (the "%.1f" and "%.6f" fields: rates and seconds),
 * or to v itself when decimals < 0; null when v is not finite (JSON has no NaN). 0 or -1. */
static int set_real(json_t *o, const char *key, double v, int decimals) {
    if (!isfinite(v)) return json_object_set_new(o, key, json_null());
    if (decimals >= 0) {
        double scale = pow(10, decimals);
        double r = round(v * scale) / scale;
        if (isfinite(r)) v = r;
    }
    return json_object_set_new(o, key, json_real(v));
}

/* "comm_calls" or "comm_bytes": {"all_gather": n, ..., "all_to_all": n}. */
static int set_counts(json_t *o, const char *key, const train_comm *c, bool bytes) {
    json_t *m = json_object();
    int rc = m ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < sizeof g_ops / sizeof g_ops[0]; i++) {
        const fsdp_comm_count *n = &c->count[g_ops[i]];
        rc = json_object_set_new(m, fsdp_comm_op_to_string(g_ops[i]),
                                 json_integer((json_int_t)(bytes ? n->bytes : n->calls)));
    }
    if (rc != 0) {
        json_decref(m);
        return -1;
    }
    return json_object_set_new(o, key, m);
}

/* The record's fields in their order; 0 or -1 (out of memory). */
static int fill(json_t *o, int64_t step, const train_report *r, int64_t per_sample) {
    int rc = json_object_set_new(o, "step", json_integer((json_int_t)step));
    if (r->progress) {
        rc |= set_real(o, "loss", r->loss, -1);
        rc |= set_real(o, "samples_per_s", r->samples_per_s, 1);
        rc |= set_real(o, "time_s", r->elapsed, 6);
        if (per_sample) rc |= set_real(o, "tokens_per_s", r->samples_per_s * (double)per_sample, 1);
        if (r->mfu > 0) rc |= set_real(o, "mfu", r->mfu, 4);
        rc |= set_real(o, "lr", r->lr, -1);
        if (!isnan(r->grad_norm)) rc |= set_real(o, "grad_norm", r->grad_norm, -1);
        if (r->device) {
            rc |= json_object_set_new(o, "device", json_string(r->device));
            rc |= json_object_set_new(o, "mem_peak_bytes", json_integer((json_int_t)r->mem_peak));
            rc |= json_object_set_new(o, "mem_reserved_bytes",
                                      json_integer((json_int_t)r->mem_reserved));
        }
        if (r->comm) {
            rc |= set_real(o, "compute_s", train_comm_compute_seconds(r->comm), 6);
            rc |= set_real(o, "comm_s", train_comm_seconds(r->comm), 6);
            rc |= set_counts(o, "comm_calls", r->comm, false);
            rc |= set_counts(o, "comm_bytes", r->comm, true);
        }
    }
    if (r->eval) {
        rc |= set_real(o, "eval_loss", r->eval_loss, -1);
        if (!isnan(r->eval_accuracy)) rc |= set_real(o, "eval_accuracy", r->eval_accuracy, -1);
        if (per_sample) rc |= set_real(o, "eval_perplexity", exp(r->eval_loss), -1);
    }
    return rc ? -1 : 0;
}

int train_metrics_write(FILE *f, int64_t step, const train_report *r, int64_t per_sample) {
    json_t *o = json_object();
    int rc = o ? fill(o, step, r, per_sample) : -1;
    if (rc == 0) rc = json_dumpf(o, f, METRICS_FLAGS);
    json_decref(o);
    if (rc == 0 && fputc('\n', f) == EOF) rc = -1;
    return rc;
}

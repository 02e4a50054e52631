/* train_estimate_print.c: fsdp-train --plan's output: the estimate of train_estimate.c as a table
 * (ranks whose figures are equal share a row) or as one JSON object (jansson), and the command's
 * body. */
#include <inttypes.h>
#include <jansson.h> // defines: json_pack, json_dumpf
#include <stdlib.h>
#include <string.h>

#include "train_estimate.h"

/* Whether two ranks have the same figures (all but their place). */
static bool same_figures(const train_est_rank *a, const train_est_rank *b) {
    train_est_rank x = *a, y = *b;
    x.rank = y.rank = x.dp_index = y.dp_index = x.tp_index = y.tp_index = 0;
    if (x.n_comm != y.n_comm) return false;
    for (int i = 0; i < x.n_comm; i++)
        if (x.comm[i].op != y.comm[i].op || strcmp(x.comm[i].dim, y.comm[i].dim) != 0 ||
            x.comm[i].calls != y.comm[i].calls || x.comm[i].bytes != y.comm[i].bytes)
            return false;
    return x.param_bytes == y.param_bytes && x.grad_bytes == y.grad_bytes &&
           x.optim_bytes == y.optim_bytes && x.gathered_bytes == y.gathered_bytes &&
           x.device_bytes == y.device_bytes && x.act_bytes == y.act_bytes &&
           x.act_ckpt_bytes == y.act_ckpt_bytes && x.total_bytes == y.total_bytes;
}

/* "512 B", "12.5 KiB", "3.0 GiB" */
static const char *human(int64_t bytes, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0)
        snprintf(buf, size, "%" PRId64 " B", bytes);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

/* The ranks of group g (the ranks equal to rank `first`): "0,2" or "0,2,4,... (64 ranks)". */
static void rank_list(const train_estimate *e, int first, char *buf, size_t size) {
    int n = 0;
    buf[0] = '\0';
    for (int r = first; r < e->layout.world; r++) {
        if (!same_figures(&e->ranks[first], &e->ranks[r])) continue;
        if (n < 6) train_append(buf, size, "%s%d", n ? "," : "", r);
        n++;
    }
    if (n > 6) train_append(buf, size, ",... (%d ranks)", n);
}

/* Whether rank r is the first of its group. */
static bool first_of_group(const train_estimate *e, int r) {
    for (int q = 0; q < r; q++)
        if (same_figures(&e->ranks[q], &e->ranks[r])) return false;
    return true;
}

void train_estimate_print(const train_config *cfg, const train_estimate *e, FILE *f) {
    char layout[256], a[32], b[32], c[32], d[32], g[32], h[32], k[32], t[32], ranks[96];
    train_layout_describe(cfg, &e->layout, layout, sizeof layout);
    char pats[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING];
    bool ckpt = train_config_checkpoint_patterns(cfg, pats) > 0;
    fprintf(f, "plan: %s\n", layout);
    fprintf(f,
            "plan: micro-batch of %" PRId64 " samples (batch_size %" PRId64 " / grad_accum %" PRId64
            "), split over dp %d; estimated, nothing ran\n",
            e->micro, cfg->data.batch_size, cfg->train.grad_accum, e->layout.dp);
    const train_mfu *m = &e->mfu;
    if (m->flops_per_sample > 0) {
        double step = m->flops_per_sample * (double)cfg->data.batch_size;
        fprintf(f, "plan: %.4g model FLOP per step (%s)", step, train_mfu_count(cfg));
        if (m->peak_tflops > 0) {
            double ms = 1e3 * step / (m->peak_tflops * 1e12 * m->devices);
            fprintf(
                f,
                "; at %g TFLOP/s (%s, %s) x %d device%s: %.4g ms a step at 100%% mfu, %.4g at 40%%",
                m->peak_tflops, m->mode, m->source, m->devices, m->devices == 1 ? "" : "s", ms,
                ms / 0.4);
        }
        fputc('\n', f);
    }
    fprintf(f, "\nmemory per rank%s:\n",
            cfg->parallel.offload ? " (params, grads, optimizer on the host: offload)" : "");
    fprintf(f, "%-28s %10s %10s %10s %10s %10s %11s %11s %10s\n", "ranks", "params", "grads",
            "optimizer", "gathered", "device", "activations", "act_ckpt", "total");
    for (int r = 0; r < e->layout.world; r++) {
        if (!first_of_group(e, r)) continue;
        const train_est_rank *x = &e->ranks[r];
        rank_list(e, r, ranks, sizeof ranks);
        fprintf(f, "%-28s %10s %10s %10s %10s %10s %11s %11s %10s\n", ranks,
                human(x->param_bytes, a, sizeof a), human(x->grad_bytes, b, sizeof b),
                human(x->optim_bytes, c, sizeof c), human(x->gathered_bytes, d, sizeof d),
                human(x->device_bytes, g, sizeof g), human(x->act_bytes, h, sizeof h),
                human(x->act_ckpt_bytes, k, sizeof k), human(x->total_bytes, t, sizeof t));
    }
    fprintf(f,
            "  params, grads: FSDP's flat shards and their gradients (f32); optimizer: its state "
            "beside them;\n  gathered: the pool's peak over a step (gathered units, full "
            "gradients, reduction buffers;\n  replicate: its gradient buckets' buffers);\n  "
            "device: gathered + the shards (fsdp_sharded_memory's "
            "peak_device_bytes); activations: what one\n  micro-batch's forward keeps for "
            "backward, act_ckpt: the same with %s checkpointed;\n  total: device + optimizer + "
            "activations (%s)\n",
            ckpt ? "[model] checkpoint_activations" : "every checkpointable module",
            ckpt ? "checkpointed, as configured" : "not checkpointed, as configured");
    for (int r = 0; r < e->layout.world; r++) {
        if (!first_of_group(e, r)) continue;
        const train_est_rank *x = &e->ranks[r];
        rank_list(e, r, ranks, sizeof ranks);
        fprintf(f, "\ncollectives of one step, ranks %s (as comm-debug counts them):\n", ranks);
        fprintf(f, "%-15s %-10s %8s %16s\n", "op", "dim", "calls", "bytes");
        for (int i = 0; i < x->n_comm; i++)
            fprintf(f, "%-15s %-10s %8" PRId64 " %16" PRId64 "\n",
                    fsdp_comm_op_to_string(x->comm[i].op), x->comm[i].dim, x->comm[i].calls,
                    x->comm[i].bytes);
        if (x->n_comm == 0) fprintf(f, "(none: one rank)\n");
    }
}

static json_t *rank_json(const train_est_rank *x) {
    json_t *comm = json_array();
    for (int i = 0; comm && i < x->n_comm; i++)
        json_array_append_new(comm, json_pack("{s:s, s:s, s:I, s:I}", "op",
                                              fsdp_comm_op_to_string(x->comm[i].op), "dim",
                                              x->comm[i].dim, "calls", (json_int_t)x->comm[i].calls,
                                              "bytes", (json_int_t)x->comm[i].bytes));
    return json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "rank",
                     x->rank, "dp_index", x->dp_index, "tp_index", x->tp_index, "param_bytes",
                     (json_int_t)x->param_bytes, "grad_bytes", (json_int_t)x->grad_bytes,
                     "optimizer_bytes", (json_int_t)x->optim_bytes, "gathered_bytes",
                     (json_int_t)x->gathered_bytes, "device_bytes", (json_int_t)x->device_bytes,
                     "activation_bytes", (json_int_t)x->act_bytes, "activation_ckpt_bytes",
                     (json_int_t)x->act_ckpt_bytes, "total_bytes", (json_int_t)x->total_bytes,
                     "collectives", comm);
}

void train_estimate_write_json(const train_config *cfg, const train_estimate *e, FILE *f) {
    char layout[256];
    train_layout_describe(cfg, &e->layout, layout, sizeof layout);
    json_t *ranks = json_array();
    for (int r = 0; ranks && r < e->layout.world; r++)
        json_array_append_new(ranks, rank_json(&e->ranks[r]));
    json_t *root = json_pack(
        "{s:s, s:i, s:i, s:i, s:I, s:I, s:b, s:s, s:f, s:f, s:i, s:o}", "layout", layout, "world",
        e->layout.world, "dp", e->layout.dp, "tp", e->layout.tp, "micro_batch",
        (json_int_t)e->micro, "grad_accum", (json_int_t)cfg->train.grad_accum, "offload",
        cfg->parallel.offload, "activations_counted", e->activation_note ? e->activation_note : "",
        "flops_per_step", e->mfu.flops_per_sample * (double)cfg->data.batch_size, "peak_tflops",
        e->mfu.peak_tflops, "devices", e->mfu.devices, "ranks", ranks);
    if (root) json_dumpf(root, f, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    fputc('\n', f);
    json_decref(root);
}

int train_estimate_main(const train_config *cfg, bool json, FILE *out) {
    train_estimate e;
    char err[TRAIN_ERROR_SIZE];
    fsdp_status st = train_estimate_make(cfg, 0, &e, err, sizeof err);
    if (st != FSDP_OK) {
        fprintf(stderr, "fsdp-train: %s\n", err);
        return st == FSDP_ERR_CONFIG ? 2 : 1;
    }
    if (json)
        train_estimate_write_json(cfg, &e, out);
    else
        train_estimate_print(cfg, &e, out);
    train_estimate_free(&e);
    return 0;
}

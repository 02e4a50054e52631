/* loss_parallel.c: cross-entropy over logits sharded along the vocabulary (PyTorch's
 * loss_parallel): the row max and the sum of exponentials are all_reduced over the tp mesh,
 * the target's logit comes from the rank whose shard holds it, and the gradient stays local.
 * Logits on a device are staged through the host (the statistics are host work, as on the
 * CPU), their gradient copied back. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/loss.h"
#include "tp/tp_impl.h"

static const char *const WHAT = "loss_parallel cross-entropy";

/* The vocabulary shard of logits: mesh group, first class held, classes held and in all.
 * *group is NULL when the logits are not a DTensor sharded along their last dim. */
static fsdp_status vocab_shard(fsdp_ctx *ctx, const fsdp_tensor *logits, fsdp_group **group,
                               int64_t *start, int64_t *local, int64_t *global) {
    *group = NULL;
    const fsdp_dtensor *dt = fsdp_dtensor_of(logits);
    if (!dt) return FSDP_OK;
    const fsdp_dtensor_spec *sp = &dt->spec;
    int last = sp->ndim - 1;
    if (sp->mesh_ndim != 1 || sp->placements[0].kind != FSDP_PLACEMENT_SHARD ||
        sp->placements[0].dim != last) {
        char p[24];
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: the logits are a DTensor placed %s on a %d-d mesh; it takes "
                         "Shard(-1) on the 1-d tp mesh (ColwiseParallel(output_layouts=Shard(-1), "
                         "use_local_output=false) on the output projection)",
                         WHAT, fsdp_placement_to_string(sp->placements[0], p, sizeof p),
                         sp->mesh_ndim);
    }
    int64_t off[FSDP_MAX_DIMS], len[FSDP_MAX_DIMS];
    tp_spec_block(sp, off, len);
    *start = off[last], *local = len[last], *global = sp->shape[last];
    return fsdp_mesh_get_group(ctx, sp->mesh, NULL, group);
}

/* Per row r (not ignored): lse_r = M_r + log(sum over every shard of exp(x - M_r)), M_r the
 * row's max over all shards; loss = mean over counted rows of lse_r - x[t_r]; dlogits on this
 * rank's classes = (softmax - onehot(t)) / count. Sums run in double on the host, as the CPU
 * kernel's; the per-rank sums travel as f32. */
static fsdp_status sharded_loss(fsdp_ctx *ctx, fsdp_group *g, const float *x, const int32_t *tgt,
                                int32_t ignore, int64_t rows, int64_t start, int64_t V, float *loss,
                                float *dx) {
    float *buf = calloc((size_t)(3 * rows) + 1, sizeof *buf);
    if (!buf)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld rows", WHAT,
                         (long long)rows);
    float *mx = buf, *se = buf + rows, *xt = buf + 2 * rows; /* (rows) each */
    fsdp_tensor *tmax = NULL, *tsum = NULL;
    fsdp_status st =
        fsdp_tensor_from_blob(ctx, mx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){rows}, &tmax);
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, se, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){2 * rows},
                                   &tsum);
    for (int64_t r = 0; r < rows; r++) {
        mx[r] = -INFINITY;
        for (int64_t c = 0; c < V; c++) mx[r] = x[r * V + c] > mx[r] ? x[r * V + c] : mx[r];
    }
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, tmax, FSDP_REDUCE_MAX);
    int64_t n = 0;
    for (int64_t r = 0; st == FSDP_OK && r < rows; r++) {
        if (tgt[r] == ignore) continue;
        n++;
        double s = 0.0;
        for (int64_t c = 0; c < V; c++) s += exp((double)x[r * V + c] - (double)mx[r]);
        se[r] = (float)s;
        int64_t t = tgt[r] - start;
        if (t >= 0 && t < V) xt[r] = x[r * V + t];
    }
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, tsum, FSDP_REDUCE_SUM);
    double total = 0.0;
    for (int64_t r = 0; st == FSDP_OK && r < rows; r++) {
        float *d = dx ? dx + r * V : NULL;
        if (tgt[r] == ignore) {
            for (int64_t c = 0; d && c < V; c++) d[c] = 0.0f;
            continue;
        }
        double lse = (double)mx[r] + log((double)se[r]);
        total += lse - (double)xt[r];
        for (int64_t c = 0; d && c < V; c++)
            d[c] = (float)(exp((double)x[r * V + c] - lse) / (double)n);
        int64_t t = tgt[r] - start;
        if (d && t >= 0 && t < V)
            d[t] = (float)((exp((double)x[r * V + t] - lse) - 1.0) / (double)n);
    }
    if (st == FSDP_OK) *loss = (float)(total / (double)n);
    fsdp_tensor_free(tmax);
    fsdp_tensor_free(tsum);
    free(buf);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_loss_parallel_cross_entropy(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                             const int32_t *targets, int32_t ignore_index,
                                             float *loss, fsdp_tensor *dlogits) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_ARG_NOT_NULL(ctx, targets);
    FSDP_ARG_NOT_NULL(ctx, loss);
    fsdp_group *g;
    int64_t start = 0, V = 0, global = 0;
    FSDP_TRY_AT(ctx, vocab_shard(ctx, logits, &g, &start, &V, &global));
    if (!g)
        return fsdp_loss_cross_entropy_ignore(ctx, logits, targets, ignore_index, loss, dlogits);
    char a[64], b[64];
    fsdp_device dev = fsdp_tensor_device(logits);
    if (fsdp_tensor_dtype(logits) != FSDP_DTYPE_F32)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "%s: f32 logits only (got %s on %s)", WHAT,
                         fsdp_dtype_to_string(fsdp_tensor_dtype(logits)),
                         fsdp_device_to_string(dev));
    if (dlogits &&
        (!fsdp_tensor_same_shape(dlogits, logits) || fsdp_tensor_dtype(dlogits) != FSDP_DTYPE_F32 ||
         fsdp_tensor_device(dlogits).type != dev.type ||
         fsdp_tensor_device(dlogits).index != dev.index))
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: dlogits %s must be f32 on %s:%d, shaped as the local logits %s", WHAT,
                         fsdp_tensor_shape_string(dlogits, a, sizeof a), fsdp_device_to_string(dev),
                         dev.index, fsdp_tensor_shape_string(logits, b, sizeof b));
    int64_t rows = 1;
    for (int d = 0; d < fsdp_tensor_ndim(logits) - 1; d++) rows *= fsdp_tensor_dim(logits, d);
    for (int64_t i = 0; i < rows; i++)
        if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= global))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: target %d of row %lld is neither a class in [0, %lld) nor the "
                             "ignore index %d",
                             WHAT, targets[i], (long long)i, (long long)global, ignore_index);
    if (dev.type == FSDP_DEVICE_CPU)
        return sharded_loss(ctx, g, fsdp_tensor_f32(logits), targets, ignore_index, rows, start, V,
                            loss, dlogits ? fsdp_tensor_f32(dlogits) : NULL);
    /* Device logits: staged through the host, where the statistics are computed exactly as on
     * the CPU (so the loss and the gradient have the CPU's bits); the gradient goes back. */
    fsdp_tensor *hx = NULL, *hd = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, fsdp_tensor_ndim(logits),
                                        fsdp_tensor_shape(logits), &hx);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, hx, logits);
    if (st == FSDP_OK && dlogits) st = fsdp_tensor_create_like(ctx, hx, &hd);
    if (st == FSDP_OK)
        st = sharded_loss(ctx, g, fsdp_tensor_f32(hx), targets, ignore_index, rows, start, V, loss,
                          hd ? fsdp_tensor_f32(hd) : NULL);
    if (st == FSDP_OK && hd) st = fsdp_tensor_copy(ctx, dlogits, hd);
    fsdp_tensor_free(hx);
    fsdp_tensor_free(hd);
    return FSDP_PASS(ctx, st);
}

/* loss_parallel.c: cross-entropy over logits sharded along the vocabulary (PyTorch's
 * loss_parallel): the row max and the sum of exponentials are all_reduced over the tp mesh,
 * the target's logit comes from the rank whose shard holds it, and the gradient stays local,
 * on the logits' device (the CPU or a device). */
#include <math.h>

#include "core/error.h"
#include "fsdp/loss.h"
#include "kernels/kernels.h"
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
 * rank's classes = (softmax - onehot(t)) / count. The per-row pieces are the kernel table's, on
 * the logits' device (sums in double, as the CPU's cross-entropy); the per-rank statistics
 * travel as f32 in one buffer there (maxima | sums of exponentials | target logits), and only
 * they come back to the host for the loss. Device targets are staged (they are host memory). */
static fsdp_status sharded_loss(fsdp_ctx *ctx, fsdp_group *g, const fsdp_tensor *logits,
                                const int32_t *targets, int32_t ignore, int64_t rows, int64_t start,
                                int64_t V, float *loss, fsdp_tensor *dlogits) {
    fsdp_device dev = fsdp_tensor_device(logits);
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    if (!k || !k->vocab_row_max || !k->vocab_exp_sums || !k->vocab_ce_grad)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "%s: no loss-parallel kernels for %s tensors; "
                         "use the CPU",
                         WHAT, fsdp_device_to_string(dev));
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += targets[r] != ignore;
    int64_t all = 3 * rows + 1, two = 2 * rows;
    fsdp_tensor *stats = NULL, *tmax = NULL, *tsum = NULL, *host = NULL, *tg = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, &all, &stats);
    if (st == FSDP_OK) st = fsdp_tensor_view(ctx, stats, 0, 1, &rows, &tmax);
    if (st == FSDP_OK) st = fsdp_tensor_view(ctx, stats, rows, 1, &two, &tsum);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &all, &host);
    const int32_t *tgt = targets;
    if (st == FSDP_OK && dev.type != FSDP_DEVICE_CPU) {
        fsdp_tensor *h = NULL;
        st = fsdp_tensor_from_blob(ctx, (void *)targets, FSDP_DTYPE_I32, FSDP_CPU, 1, &rows, &h);
        if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, dev, 1, &rows, &tg);
        if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, tg, h);
        fsdp_tensor_free(h);
        if (st == FSDP_OK) tgt = fsdp_tensor_data(tg);
    }
    const float *x = fsdp_tensor_f32(logits);
    float *mx = NULL, *se = NULL, *xt = NULL; /* (rows) each */
    if (st == FSDP_OK) mx = fsdp_tensor_f32(stats), se = mx + rows, xt = mx + two;
    if (st == FSDP_OK) k->vocab_row_max(mx, x, rows, V);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, tmax, FSDP_REDUCE_MAX);
    if (st == FSDP_OK) k->vocab_exp_sums(se, xt, x, mx, tgt, ignore, start, rows, V);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, tsum, FSDP_REDUCE_SUM);
    if (st == FSDP_OK && dlogits)
        k->vocab_ce_grad(fsdp_tensor_f32(dlogits), x, mx, se, tgt, ignore, start, rows, V, n);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, host, stats);
    double total = 0.0;
    const float *h = st == FSDP_OK ? fsdp_tensor_f32(host) : NULL;
    for (int64_t r = 0; h && r < rows; r++) {
        if (targets[r] == ignore) continue;
        double lse = (double)h[r] + log((double)h[rows + r]);
        total += lse - (double)h[two + r];
    }
    if (st == FSDP_OK) *loss = (float)(total / (double)n);
    fsdp_tensor_free(tmax), fsdp_tensor_free(tsum), fsdp_tensor_free(stats);
    fsdp_tensor_free(host), fsdp_tensor_free(tg);
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
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "%s: f32 logits only (got %s on %s): its vocab_* kernels read f32; a "
                         "Llama sharded over the vocabulary keeps logits_dtype FSDP_DTYPE_F32 "
                         "(the default)",
                         WHAT, fsdp_dtype_to_string(fsdp_tensor_dtype(logits)),
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
    return sharded_loss(ctx, g, logits, targets, ignore_index, rows, start, V, loss, dlogits);
}

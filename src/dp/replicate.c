/* replicate.c: replicated data parallelism (DDP): the initial broadcast of parameters and
 * buffers (state_sync.c), and the gradient averaging over the data-parallel group in buckets
 * through flat buffers allocated at setup, each bucket through the comm hook (comm_hook.c):
 * each bucket's reduction starts from the post-backward hooks as soon as its gradients are
 * final (DDP's order), and the root's post-backward hook waits for them; or, with
 * reduce_after_backward, every bucket after backward. With mixed precision the root's forward
 * and backward run with the parameters rounded to param_dtype (from an f32 master copy) and the
 * buckets are reduced in reduce_dtype. All of it runs where the model lives: on a device the
 * buckets are device memory, the copies and roundings that device's kernels on the compute
 * stream, and the compute stream waits for each bucket's all_reduce (the host does not). Also
 * the batch split by sample index. */
#include <stdlib.h>

#include "comm/comm_device.h" // defines: fsdp_comm_work_wait_stream
#include "core/ctx_impl.h"    // defines: fsdp_ctx_scope_push, fsdp_ctx_scope_pop
#include "core/device.h"      // defines: fsdp_device_for
#include "core/error.h"
#include "core/stream.h" // defines: fsdp_stream_current
#include "core/tensor_impl.h"
#include "dp/dp_impl.h"
#include "fsdp/replicate.h"
#include "kernels/kernels.h"
#include "nn/nn.h"

struct fsdp_replicate {
    fsdp_group *group;
    fsdp_device dev; /* where the model lives (one device): buckets and copies are there */
    int world;
    bool sync;
    fsdp_param **params; /* trainable, reverse registration order (gradients' ready order) */
    int64_t *numel;      /* each one's elements at setup */
    int64_t *offset;     /* where it lies in its bucket */
    int n_params;
    int *bucket_start;    /* bucket b holds params [bucket_start[b], bucket_start[b + 1]) */
    fsdp_tensor **bucket; /* views of stage, one per bucket, of the bucket's elements */
    int n_buckets;
    /* The flat buffer: after backward, as many elements as the largest bucket (shared by all);
     * during backward, every bucket's, one after the other. */
    fsdp_tensor *stage;
    fsdp_comm_hook hook;
    /* BF16 and FP16 hooks: a buffer in that dtype as large as the largest bucket, and its
     * views per bucket (their reductions are blocking: one at a time) */
    fsdp_tensor *low_stage;
    fsdp_tensor **low_bucket;
    fsdp_mixed_precision mp;
    /* param_dtype other than f32: the trainable parameters' f32 values while the root's
     * forward or backward runs with them rounded (low), and a param_dtype buffer as large as
     * the largest parameter to round through */
    fsdp_tensor *master, *round;
    bool low;
    fsdp_module *root;
    bool after_backward; /* fsdp_replicate_options.reduce_after_backward */
    /* Reduction during backward. */
    fsdp_module **ready_at; /* per param: the module whose post-backward finalises its gradient */
    int *bucket_of;         /* per param: its bucket */
    bool *ready;            /* per param: final in the running backward */
    int *missing;           /* per bucket: its gradients not final yet in the running backward */
    fsdp_comm_work **work;  /* per bucket */
    int next;               /* the next bucket to start */
    bool active;            /* a backward of root with sync on is running */
};

static void replicate_free(void *p) {
    fsdp_replicate *r = p;
    if (!r) return;
    for (int b = 0; b < r->n_buckets; b++) fsdp_tensor_free(r->bucket[b]);
    for (int b = 0; r->low_bucket && b < r->n_buckets; b++) fsdp_tensor_free(r->low_bucket[b]);
    for (int b = 0; r->work && b < r->n_buckets; b++) fsdp_comm_work_free(r->work[b]);
    free(r->work);
    free(r->ready_at), free(r->bucket_of), free(r->ready), free(r->missing);
    free(r->bucket);
    free(r->low_bucket);
    fsdp_tensor_free(r->low_stage);
    fsdp_tensor_free(r->master);
    fsdp_tensor_free(r->round);
    free(r->bucket_start);
    fsdp_tensor_free(r->stage);
    free(r->params);
    free(r->numel);
    free(r->offset);
    free(r);
}

/* ---- buckets ---- */

/* Splits n tensors of numel[i] f32 elements, in order, into buckets as DDP's
 * compute_bucket_assignment_by_size does with the size limits {first_cap, cap}: the first bucket
 * takes tensors until it holds at least first_cap bytes, every later one until it holds at least
 * cap. starts receives n_buckets + 1 indices (n + 1 entries suffice) and offset (may be NULL)
 * each tensor's place in its bucket; returns the number of buckets and the largest bucket's
 * elements in *max_numel. */
static int assign_buckets(const int64_t *numel, int n, int64_t first_cap, int64_t cap, int *starts,
                          int64_t *offset, int64_t *max_numel) {
    int nb = 0;
    int64_t fill = 0;
    bool open = false;
    *max_numel = 0;
    for (int i = 0; i < n; i++) {
        if (!open) {
            starts[nb] = i;
            open = true;
        }
        if (offset) offset[i] = fill;
        fill += numel[i];
        if (fill * (int64_t)sizeof(float) >= (nb == 0 ? first_cap : cap) || i == n - 1) {
            if (fill > *max_numel) *max_numel = fill;
            nb++;
            fill = 0;
            open = false;
        }
    }
    starts[nb] = n;
    return nb;
}

/* ---- the gradient buckets ---- */

static fsdp_status count_trainable(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    if (fsdp_param_requires_grad(p)) ++*(int *)user;
    return FSDP_OK;
}

static fsdp_status collect_trainable(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    fsdp_replicate *r = user;
    if (!fsdp_param_requires_grad(p)) return FSDP_OK;
    fsdp_tensor *g = fsdp_param_grad(p);
    if (!fsdp_tensor_f32(g))
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "replicate: the gradient of '%s' is not an f32 tensor", name);
    r->dev = fsdp_tensor_device(g);
    r->numel[r->n_params] = fsdp_tensor_numel(g);
    r->params[r->n_params++] = p;
    return FSDP_OK;
}

/* Lists the trainable parameters, last registered first (the order a backward that runs the
 * modules in reverse makes their gradients, which DDP buckets by once it has seen one), and
 * forms their buckets; *max_numel: the largest. */
static fsdp_status layout_buckets(fsdp_ctx *ctx, fsdp_replicate *r, fsdp_module *root,
                                  int64_t first_cap, int64_t cap, int64_t *max_numel) {
    int n = 0;
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, root, count_trainable, &n));
    r->params = calloc((size_t)n + 1, sizeof *r->params);
    r->numel = calloc((size_t)n + 1, sizeof *r->numel);
    r->offset = calloc((size_t)n + 1, sizeof *r->offset);
    r->bucket_start = calloc((size_t)n + 1, sizeof *r->bucket_start);
    if (!r->params || !r->numel || !r->offset || !r->bucket_start)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate replicate buckets");
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, root, collect_trainable, r));
    for (int i = 0, j = r->n_params - 1; i < j; i++, j--) {
        fsdp_param *p = r->params[i];
        r->params[i] = r->params[j], r->params[j] = p;
        int64_t e = r->numel[i];
        r->numel[i] = r->numel[j], r->numel[j] = e;
    }
    r->n_buckets = assign_buckets(r->numel, r->n_params, first_cap, cap, r->bucket_start, r->offset,
                                  max_numel);
    r->bucket = calloc((size_t)r->n_buckets + 1, sizeof *r->bucket);
    if (!r->bucket) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate buckets");
    return FSDP_OK;
}

/* Copies bucket b's averaged gradients back to the parameters (nothing for those that live in
 * it: the copy kernel skips a copy onto itself). */
static void copy_out(fsdp_replicate *r, int b) {
    const fsdp_kernels_i *k = fsdp_kernels_for(r->dev);
    const float *buf = fsdp_tensor_f32(r->bucket[b]);
    for (int i = r->bucket_start[b]; i < r->bucket_start[b + 1]; i++)
        k->copy(fsdp_tensor_f32(fsdp_param_grad(r->params[i])), buf + r->offset[i], r->numel[i]);
}

/* Whether the buckets' reductions may run in the background: the built-in hooks' all_reduce
 * (f32, or the bf16/fp16 hooks' and a low reduce_dtype's in 16 bits) has a non-blocking start;
 * a user hook (its own collectives) runs whole when a bucket is ready. */
static bool overlaps(const fsdp_replicate *r) {
    return r->hook.kind != FSDP_COMM_HOOK_USER;
}

/* Averages bucket b's gradients over the group through the comm hook: in (times 1/W for a
 * built-in hook, as DDP divides while copying; as they are for a user hook), the hook's
 * reduction (the default: all_reduce(sum) in f32), out. With a work (a built-in hook, during
 * backward) the all_reduce is only started on it (in 16 bits: of the bucket rounded into its
 * low bucket, fsdp_dp_round); finish_bucket waits, widens a 16-bit result and copies out. */
static fsdp_status reduce_bucket(fsdp_ctx *ctx, fsdp_replicate *r, int b, fsdp_comm_work *work) {
    const fsdp_kernels_i *k = fsdp_kernels_for(r->dev);
    float *buf = fsdp_tensor_f32(r->bucket[b]);
    bool user = r->hook.kind == FSDP_COMM_HOOK_USER, fold = work && !r->low_bucket;
    float inv = 1.0f / (float)r->world;
    for (int i = r->bucket_start[b]; i < r->bucket_start[b + 1]; i++) {
        fsdp_param *p = r->params[i];
        fsdp_tensor *g = fsdp_param_grad(p);
        if (fsdp_tensor_numel(g) != r->numel[i] || !fsdp_tensor_f32(g))
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "replicate: the gradient of '%s' of '%s' changed since setup (%lld "
                             "elements, %lld then); apply tensor parallelism before replicate",
                             fsdp_param_name(p), fsdp_module_fqn(fsdp_param_module(p)),
                             (long long)fsdp_tensor_numel(g), (long long)r->numel[i]);
        /* With a work the division is the all_reduce's (below); a gradient that lives in its
         * bucket (bind_grads) is not copied at all (the copy kernel skips a copy onto
         * itself). */
        if (user || fold)
            k->copy(buf + r->offset[i], fsdp_tensor_f32(g), r->numel[i]);
        else
            k->scale(buf + r->offset[i], fsdp_tensor_f32(g), inv, r->numel[i]);
    }
    /* The default hook in f32: every element times 1/W as the all_reduce reads it, bitwise
     * the division before it (fsdp_all_reduce_ex), without a pass of its own. */
    if (fold)
        return fsdp_all_reduce_start_ex(ctx, r->group, r->bucket[b], FSDP_REDUCE_SUM,
                                        &(fsdp_reduce_options){.pre_scale = inv}, work);
    if (work) {
        FSDP_TRY_AT(ctx, fsdp_dp_round(ctx, r->low_bucket[b], r->bucket[b], 1.0));
        return fsdp_all_reduce_start(ctx, r->group, r->low_bucket[b], FSDP_REDUCE_SUM, work);
    }
    fsdp_dp_reduce_args a = {.hook = &r->hook,
                             .reduce_dtype = r->mp.reduce_dtype,
                             .group = r->group,
                             .pre = 1.0, /* divided above */
                             .post = 1.0,
                             .index = b,
                             .grad = r->bucket[b],
                             .low_grad = r->low_bucket ? r->low_bucket[b] : NULL};
    FSDP_TRY_AT(ctx, fsdp_dp_reduce(ctx, &a));
    copy_out(r, b);
    return FSDP_OK;
}

/* Waits for bucket b's all_reduce and copies it out: on a device the compute stream waits for
 * it (the host does not), so the copies and whatever follows on that stream see the sums. */
static fsdp_status finish_bucket(fsdp_ctx *ctx, fsdp_replicate *r, int b) {
    FSDP_TRY_AT(ctx, fsdp_comm_work_wait_stream(ctx, r->work[b], fsdp_stream_current(r->dev)));
    if (r->low_bucket) FSDP_TRY_AT(ctx, fsdp_dp_widen(ctx, r->bucket[b], r->low_bucket[b], 1.0));
    copy_out(r, b);
    return FSDP_OK;
}

/* ---- scheduling: during backward, or after it ---- */

/* Starts the buckets whose gradients are all final (every remaining one with `all`), in
 * order: a bucket waits for the ones before it, as DDP's do. The calls are counted as the
 * root module's, whichever module's hook starts them. Then lets the ones in flight progress
 * (MPI moves their data only inside its calls). */
static fsdp_status start_ready(fsdp_ctx *ctx, fsdp_replicate *r, bool all) {
    fsdp_status st = FSDP_OK;
    fsdp_ctx_scope_push(ctx, fsdp_module_fqn(r->root));
    while (st == FSDP_OK && r->next < r->n_buckets && (all || r->missing[r->next] == 0)) {
        st = reduce_bucket(ctx, r, r->next, overlaps(r) ? r->work[r->next] : NULL);
        r->next++;
    }
    for (int b = 0; st == FSDP_OK && b < r->next; b++) {
        bool done;
        st = fsdp_comm_work_test(ctx, r->work[b], &done);
    }
    fsdp_ctx_scope_pop(ctx);
    return FSDP_PASS(ctx, st);
}

/* On a module whose backward finalises gradients: marks them and starts what is ready. */
static fsdp_status grads_ready(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                               const fsdp_tensor **io, void *user) {
    (void)point, (void)io;
    fsdp_replicate *r = user;
    if (!r->active) return FSDP_OK;
    for (int i = 0; i < r->n_params; i++) {
        if (r->ready_at[i] != m) continue;
        if (r->ready[i]) {
            char desc[160];
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "replicate: the backward of %s ran twice in one backward of the "
                             "model, so the gradient of '%s' changed after its bucket was "
                             "reduced; set fsdp_replicate_options.reduce_after_backward for a "
                             "model that runs a module more than once",
                             fsdp_nn_describe(m, desc, sizeof desc), fsdp_param_name(r->params[i]));
        }
        r->ready[i] = true;
        r->missing[r->bucket_of[i]]--;
    }
    return start_ready(ctx, r, false);
}

/* ---- mixed precision: the parameters in param_dtype around forward and backward ---- */

/* Keeps every trainable parameter's f32 values in the master copy and rounds the parameter in
 * place to param_dtype (widened back exactly); nothing when they are rounded already. */
static fsdp_status to_low(fsdp_ctx *ctx, fsdp_replicate *r) {
    if (!r->master || r->low) return FSDP_OK;
    const fsdp_kernels_i *k = fsdp_kernels_for(r->dev);
    float *master = fsdp_tensor_f32(r->master);
    bool bf16 = r->mp.param_dtype == FSDP_DTYPE_BF16;
    void *low = bf16 ? NULL : fsdp_tensor_data(r->round);
    int64_t at = 0;
    for (int i = 0; i < r->n_params; i++) {
        fsdp_param *p = r->params[i];
        fsdp_tensor *d = fsdp_param_data(p);
        if (fsdp_tensor_numel(d) != r->numel[i] || !fsdp_tensor_f32(d))
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "replicate: parameter '%s' of '%s' changed since setup (%lld "
                             "elements, %lld then); apply tensor parallelism before replicate",
                             fsdp_param_name(p), fsdp_module_fqn(fsdp_param_module(p)),
                             (long long)fsdp_tensor_numel(d), (long long)r->numel[i]);
    }
    for (int i = 0; i < r->n_params; i++) {
        float *v = fsdp_tensor_f32(fsdp_param_data(r->params[i]));
        int64_t n = r->numel[i];
        k->copy(master + at, v, n);
        if (bf16) {
            k->round_bf16(v, n); /* in place: the scratch serves f16 only */
        } else {
            k->f32_to_f16(low, v, n);
            k->f16_to_f32(v, low, n);
        }
        at += n;
    }
    r->low = true;
    return FSDP_OK;
}

/* The parameters' f32 values back from the master copy. */
static void to_full(fsdp_replicate *r) {
    if (!r->master || !r->low) return;
    const fsdp_kernels_i *k = fsdp_kernels_for(r->dev);
    const float *master = fsdp_tensor_f32(r->master);
    int64_t at = 0;
    for (int i = 0; i < r->n_params; i++) {
        k->copy(fsdp_tensor_f32(fsdp_param_data(r->params[i])), master + at, r->numel[i]);
        at += r->numel[i];
    }
    r->low = false;
}

static fsdp_status pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                               const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    return to_low(ctx, user);
}

static fsdp_status post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point, (void)io;
    to_full(user);
    return FSDP_OK;
}

static fsdp_status pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    fsdp_replicate *r = user;
    FSDP_TRY_AT(ctx, to_low(ctx, r));
    r->active = r->sync && r->world > 1 && !r->after_backward;
    if (!r->active) return FSDP_OK;
    /* A backward that failed part way may have left calls in flight. */
    for (int b = 0; b < r->n_buckets; b++) FSDP_TRY_AT(ctx, fsdp_comm_work_wait(ctx, r->work[b]));
    for (int i = 0; i < r->n_params; i++) r->ready[i] = false;
    for (int b = 0; b < r->n_buckets; b++)
        r->missing[b] = r->bucket_start[b + 1] - r->bucket_start[b];
    r->next = 0;
    return FSDP_OK;
}

static fsdp_status reduce_all(fsdp_ctx *ctx, fsdp_replicate *r) {
    if (!r->after_backward) {
        if (!r->active) return FSDP_OK;
        r->active = false;
        /* Gradients no hook finalised (the root's own, a module that did not run) go now. */
        FSDP_TRY_AT(ctx, start_ready(ctx, r, true));
        for (int b = 0; overlaps(r) && b < r->n_buckets; b++)
            FSDP_TRY_AT(ctx, finish_bucket(ctx, r, b));
        return FSDP_OK;
    }
    if (!r->sync || r->world == 1) return FSDP_OK;
    for (int b = 0; b < r->n_buckets; b++) FSDP_TRY_AT(ctx, reduce_bucket(ctx, r, b, NULL));
    return FSDP_OK;
}

static fsdp_status post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    fsdp_replicate *r = user;
    fsdp_status st = reduce_all(ctx, r);
    to_full(r); /* also when the reduction failed: the f32 values are never lost */
    return FSDP_PASS(ctx, st);
}

/* ---- setup ---- */

/* The module whose post-backward hook finalises p's gradient: the one that owns it, or the
 * outermost ancestor below root with a post-backward hook of another wrapper (TP's
 * SequenceParallel adds the gradients it collects there). root itself: at the end. */
static fsdp_module *ready_module(fsdp_module *root, fsdp_param *p) {
    fsdp_module *at = fsdp_param_module(p);
    if (at == root) return root;
    for (fsdp_module *a = fsdp_module_parent(at); a && a != root; a = fsdp_module_parent(a))
        if (fsdp_nn_num_hooks_other_than(a, FSDP_HOOK_POST_BACKWARD, grads_ready) > 0) at = a;
    return at;
}

/* The state of the reduction during backward: a work per bucket, each parameter's bucket
 * and the module that finalises its gradient. */
static fsdp_status prepare_during(fsdp_ctx *ctx, fsdp_replicate *r) {
    size_t n = (size_t)r->n_params + 1, nb = (size_t)r->n_buckets + 1;
    r->ready_at = calloc(n, sizeof *r->ready_at);
    r->bucket_of = calloc(n, sizeof *r->bucket_of);
    r->ready = calloc(n, sizeof *r->ready);
    r->missing = calloc(nb, sizeof *r->missing);
    r->work = calloc(nb, sizeof *r->work);
    if (!r->ready_at || !r->bucket_of || !r->ready || !r->missing || !r->work)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate replicate's schedule");
    for (int b = 0; b < r->n_buckets; b++) {
        FSDP_TRY_AT(ctx, fsdp_comm_work_create(ctx, &r->work[b]));
        for (int i = r->bucket_start[b]; i < r->bucket_start[b + 1]; i++) r->bucket_of[i] = b;
    }
    for (int i = 0; i < r->n_params; i++) r->ready_at[i] = ready_module(r->root, r->params[i]);
    return FSDP_OK;
}

/* Installs the hooks: grads_ready on every module that finalises gradients, pre_backward and
 * post_backward on root, and with a param_dtype other than f32 pre_forward and post_forward
 * on root. The post-backward hook owns r (it is freed with root); when a hook
 * cannot be added, those added are removed and r is freed. */
static fsdp_status install_hooks(fsdp_ctx *ctx, fsdp_replicate *r) {
    int n = r->ready_at ? r->n_params : 0, added = 0, pre_id = -1, fwd_id[2] = {-1, -1};
    int *ids = calloc((size_t)n + 1, sizeof *ids);
    fsdp_module **mods = calloc((size_t)n + 1, sizeof *mods);
    fsdp_status st =
        ids && mods ? FSDP_OK
                    : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate replicate's hooks");
    for (int i = 0; st == FSDP_OK && i < n; i++) {
        fsdp_module *m = r->ready_at[i];
        bool seen = m == r->root;
        for (int j = 0; j < added && !seen; j++) seen = mods[j] == m;
        if (seen) continue;
        st = fsdp_module_add_hook(ctx, m, FSDP_HOOK_POST_BACKWARD, grads_ready, r, NULL,
                                  &ids[added]);
        if (st == FSDP_OK) mods[added++] = m;
    }
    if (st == FSDP_OK)
        st = fsdp_module_add_hook(ctx, r->root, FSDP_HOOK_PRE_BACKWARD, pre_backward, r, NULL,
                                  &pre_id);
    if (st == FSDP_OK && r->master)
        st = fsdp_module_add_hook(ctx, r->root, FSDP_HOOK_PRE_FORWARD, pre_forward, r, NULL,
                                  &fwd_id[0]);
    if (st == FSDP_OK && r->master)
        st = fsdp_module_add_hook(ctx, r->root, FSDP_HOOK_POST_FORWARD, post_forward, r, NULL,
                                  &fwd_id[1]);
    bool owned = false; /* r went to the post-backward hook, or was freed by its adding */
    if (st == FSDP_OK) {
        st = fsdp_module_add_hook(ctx, r->root, FSDP_HOOK_POST_BACKWARD, post_backward, r,
                                  replicate_free, NULL);
        owned = true;
    }
    if (st != FSDP_OK) {
        for (int j = 0; j < added; j++) fsdp_nn_remove_hook(mods[j], ids[j]);
        if (pre_id >= 0) fsdp_nn_remove_hook(r->root, pre_id);
        for (int j = 0; j < 2; j++)
            if (fwd_id[j] >= 0) fsdp_nn_remove_hook(r->root, fwd_id[j]);
        if (!owned) replicate_free(r);
    }
    free(ids);
    free(mods);
    return FSDP_PASS(ctx, st);
}

/* When every bucket has a place of its own in the stage (reduction during backward with a
 * built-in hook), the gradients themselves live there, at their place in their bucket, as
 * DDP's gradient_as_bucket_view: backward accumulates into the bucket, which is divided in
 * place and all_reduced, and nothing is copied in or out. The values are bitwise those of the
 * copies (the same division, the same reduction). A gradient that is rebound elsewhere later
 * is copied in and out again. */
static fsdp_status bind_grads(fsdp_ctx *ctx, fsdp_replicate *r) {
    const fsdp_kernels_i *k = fsdp_kernels_for(r->dev);
    for (int b = 0; b < r->n_buckets; b++) {
        float *buf = fsdp_tensor_f32(r->bucket[b]);
        for (int i = r->bucket_start[b]; i < r->bucket_start[b + 1]; i++) {
            fsdp_tensor *g = fsdp_param_grad(r->params[i]);
            k->copy(buf + r->offset[i], fsdp_tensor_f32(g), r->numel[i]);
            FSDP_TRY_AT(ctx, fsdp_tensor_rebind(ctx, g, r->bucket[b], r->offset[i]));
        }
    }
    return FSDP_OK;
}

static fsdp_status setup(fsdp_ctx *ctx, fsdp_replicate *r, fsdp_module *root,
                         const fsdp_replicate_options *o) {
    int64_t cap = o->bucket_bytes ? o->bucket_bytes : FSDP_REPLICATE_DEFAULT_BUCKET_BYTES;
    /* DDP: the first bucket is 1 MiB with the default cap, the cap itself with one given. */
    int64_t first = o->bucket_bytes ? o->bucket_bytes : FSDP_REPLICATE_FIRST_BUCKET_BYTES;
    int64_t grad_max = 0, total = 0;
    FSDP_TRY_AT(ctx, layout_buckets(ctx, r, root, first, cap, &grad_max));
    for (int i = 0; i < r->n_params; i++) total += r->numel[i];
    /* After backward, and with a user hook, one bucket is reduced at a time; during backward
     * with a built-in hook several are in flight, each in its own part of the stage (and of the
     * low stage) (a group of one reduces nothing). */
    bool apart = !r->after_backward && r->world > 1 && overlaps(r);
    int64_t stage = apart ? total : grad_max, at = 0;
    FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, r->dev, 1, &stage, &r->stage));
    for (int b = 0; b < r->n_buckets; b++) {
        int last = r->bucket_start[b + 1] - 1;
        int64_t n = r->offset[last] + r->numel[last];
        FSDP_TRY_AT(ctx, fsdp_tensor_view(ctx, r->stage, apart ? at : 0, 1, &n, &r->bucket[b]));
        at += n;
    }
    if (apart) FSDP_TRY_AT(ctx, bind_grads(ctx, r));
    fsdp_dtype low = fsdp_dp_hook_dtype(r->hook.kind, r->mp.reduce_dtype);
    if (r->hook.kind != FSDP_COMM_HOOK_USER && low != FSDP_DTYPE_F32) {
        FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, low, r->dev, 1, &stage, &r->low_stage));
        r->low_bucket = calloc((size_t)r->n_buckets + 1, sizeof *r->low_bucket);
        if (!r->low_bucket)
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate buckets");
        at = 0;
        for (int b = 0; b < r->n_buckets; b++) {
            int64_t n = fsdp_tensor_numel(r->bucket[b]);
            FSDP_TRY_AT(
                ctx, fsdp_tensor_view(ctx, r->low_stage, apart ? at : 0, 1, &n, &r->low_bucket[b]));
            at += n;
        }
    }
    if (r->mp.param_dtype != FSDP_DTYPE_F32 && r->n_params > 0) {
        int64_t largest = 0;
        for (int i = 0; i < r->n_params; i++)
            largest = r->numel[i] > largest ? r->numel[i] : largest;
        FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, r->dev, 1, &total, &r->master));
        if (r->mp.param_dtype == FSDP_DTYPE_F16) /* bf16 rounds in place (round_bf16) */
            FSDP_TRY_AT(ctx,
                        fsdp_tensor_create(ctx, FSDP_DTYPE_F16, r->dev, 1, &largest, &r->round));
    }
    if (!r->after_backward) FSDP_TRY_AT(ctx, prepare_during(ctx, r));
    if (o->src_rank == FSDP_NO_SRC_RANK || r->world == 1) return FSDP_OK;
    /* DDP's initial sync: buckets formed as the gradient buckets are. */
    fsdp_dp_sync_options so = {.bucket_bytes = cap,
                               .close_at_least = true,
                               .src = o->src_rank,
                               .who = "replicate",
                               .f32_only = true};
    return fsdp_dp_sync_states(ctx, root, r->group, &so);
}

fsdp_status fsdp_replicate_apply(fsdp_ctx *ctx, fsdp_module *root,
                                 const fsdp_replicate_options *opts, fsdp_replicate **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, root);
    if (out) *out = NULL;
    if (fsdp_nn_has_hook(root, FSDP_HOOK_POST_BACKWARD, post_backward)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "replicate: %s is replicated already; apply it once per model",
                         fsdp_nn_describe(root, desc, sizeof desc));
    }
    fsdp_device dev; /* the model's */
    FSDP_TRY_AT(ctx, fsdp_nn_check_one_device(ctx, root, "fsdp_replicate_apply", "replicate",
                                              "replicating it", &dev));
    FSDP_TRY_AT(ctx, fsdp_dp_check_rank_device(ctx, dev, "replicate", "replicating it"));
    fsdp_replicate_options o = opts ? *opts : (fsdp_replicate_options){0};
    fsdp_group *group = o.group ? o.group : fsdp_ctx_world_group(ctx);
    if (!group)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "replicate: no group given and the context is bound to no world; call "
                         "it inside fsdp_world_run");
    FSDP_TRY_AT(ctx,
                fsdp_dp_check_group(ctx, root, group, "fsdp_replicate_apply", ".group", !o.group));
    int world = fsdp_group_size(group);
    if (o.bucket_bytes < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "replicate: bucket_bytes is %lld; it must be >= 0 (0: 25 MiB)",
                         (long long)o.bucket_bytes);
    if (o.src_rank != FSDP_NO_SRC_RANK && (o.src_rank < 0 || o.src_rank >= world))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "replicate: src_rank %d is not a rank of group '%s' (size %d); use "
                         "0..%d or FSDP_NO_SRC_RANK",
                         o.src_rank, fsdp_group_label(group), world, world - 1);
    FSDP_TRY_AT(ctx, fsdp_dp_check_hook(ctx, &o.comm_hook, "fsdp_replicate_apply"));
    FSDP_TRY_AT(ctx, fsdp_dp_check_mixed_precision(ctx, &o.mixed_precision, &o.comm_hook,
                                                   "fsdp_replicate_apply"));
    fsdp_replicate *r = calloc(1, sizeof *r);
    if (!r) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate replicate state");
    r->group = group;
    r->hook = o.comm_hook;
    r->mp = o.mixed_precision;
    r->world = world;
    r->sync = true;
    r->root = root;
    r->after_backward = o.reduce_after_backward;
    r->dev = FSDP_CPU; /* until a trainable parameter says otherwise */
    fsdp_status st = setup(ctx, r, root, &o);
    if (st != FSDP_OK) {
        replicate_free(r);
        return FSDP_PASS(ctx, st);
    }
    FSDP_TRY_AT(ctx, install_hooks(ctx, r)); /* r belongs to root from here, or is freed */
    if (out) *out = r;
    return FSDP_OK;
}

void fsdp_replicate_set_sync(fsdp_replicate *r, bool sync) {
    r->sync = sync;
}

bool fsdp_replicate_sync(const fsdp_replicate *r) {
    return r->sync;
}

int fsdp_replicate_num_buckets(const fsdp_replicate *r) {
    return r->n_buckets;
}

int fsdp_replicate_bucket_num_params(const fsdp_replicate *r, int i) {
    return i >= 0 && i < r->n_buckets ? r->bucket_start[i + 1] - r->bucket_start[i] : 0;
}

int64_t fsdp_replicate_bucket_numel(const fsdp_replicate *r, int i) {
    return i >= 0 && i < r->n_buckets ? fsdp_tensor_numel(r->bucket[i]) : 0;
}

fsdp_group *fsdp_replicate_group(const fsdp_replicate *r) {
    return r->group;
}

/* ---- the batch split ---- */

void fsdp_batch_range(const fsdp_ctx *ctx, const fsdp_group *group, int64_t n, int64_t *offset,
                      int64_t *length) {
    if (!group) group = fsdp_ctx_world_group(ctx);
    int parts = group ? fsdp_group_size(group) : 1, index = group ? fsdp_group_rank(group) : 0;
    fsdp_chunk_range(n, parts, index, offset, length);
}

fsdp_status fsdp_batch_slice(fsdp_ctx *ctx, const fsdp_tensor *global, int batch_dim,
                             const fsdp_group *group, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, global);
    FSDP_ARG_NOT_NULL(ctx, out);
    int ndim = fsdp_tensor_ndim(global);
    int d = batch_dim < 0 ? batch_dim + ndim : batch_dim;
    if (d < 0 || d >= ndim)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_batch_slice: batch dim %d is outside a %d-d tensor", batch_dim,
                         ndim);
    fsdp_device dev = fsdp_tensor_device(global);
    if (*out && fsdp_tensor_dtype(*out) != fsdp_tensor_dtype(global))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_batch_slice: *out is %s but the batch is %s",
                         fsdp_dtype_to_string(fsdp_tensor_dtype(*out)),
                         fsdp_dtype_to_string(fsdp_tensor_dtype(global)));
    if (*out &&
        (fsdp_tensor_device(*out).type != dev.type || fsdp_tensor_device(*out).index != dev.index))
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "fsdp_batch_slice: *out is on %s:%d but the batch on %s:%d; pass an "
                         "*out on the batch's device (or NULL)",
                         fsdp_device_to_string(fsdp_tensor_device(*out)),
                         fsdp_tensor_device(*out).index, fsdp_device_to_string(dev), dev.index);
    const int64_t *gshape = fsdp_tensor_shape(global);
    int64_t off, len, shape[FSDP_MAX_DIMS], outer = 1, inner = 1;
    fsdp_batch_range(ctx, group, gshape[d], &off, &len);
    for (int i = 0; i < ndim; i++) {
        shape[i] = i == d ? len : gshape[i];
        if (i < d) outer *= gshape[i];
        if (i > d) inner *= gshape[i];
    }
    if (*out)
        FSDP_TRY_AT(ctx, fsdp_tensor_resize(ctx, *out, ndim, shape));
    else
        FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, fsdp_tensor_dtype(global), dev, ndim, shape, out));
    size_t es = fsdp_dtype_size(fsdp_tensor_dtype(global));
    size_t row = (size_t)(len * inner) * es;
    if (row == 0 || outer == 0) return FSDP_OK;
    /* outer runs of `row` bytes, through the device's record (never a host copy of device
     * memory) */
    const char *src = fsdp_tensor_data(global);
    return fsdp_device_for(dev.type)->copy_2d(
        ctx, fsdp_tensor_data(*out), dev, row, src + (size_t)off * (size_t)inner * es, dev,
        (size_t)gshape[d] * (size_t)inner * es, row, (size_t)outer);
}

/* post_backward.c: a unit's gradient reduction and the post-backward stream (PyTorch FSDP1's).
 * The reduction's last collective (the fused reduce_scatter, the f32 default hook's
 * reduce_scatter or all_reduce with the divisions folded in, or the bf16/fp16 hooks' and a low
 * reduce_dtype's collective in that dtype) is started on the unit's reduce work; it is finished
 * (a 16-bit result widened and divided, the add into the shard's gradient, the blocks given
 * back) at once, or,
 * when the work is still in flight on the host, once the pool needs a block it holds and at the
 * latest at the end of backward (works.c). On a device it runs on a stream of the state's own,
 * after the compute stream's backward of the unit, so that the next unit's backward computes
 * while the gradient is reduced; the work is completed on that stream, which orders FSDP's own
 * kernels after it (the add, the rounding and widening of a low reduce_dtype) and the blocks'
 * return to the pool. The end of backward (the root's post-backward hook) joins it: the compute
 * stream waits for every reduction, and the pool's blocks given back on it count as the compute
 * stream's. On the CPU the streams are no-ops. */
#include <stdatomic.h>

#include "comm/comm_device.h" // defines: fsdp_comm_work_wait_stream
#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_release_storage
#include "dp/dp_impl.h"
#include "dp/shard_impl.h"
#include "kernels/kernels.h"

static atomic_bool skip_join, blocking;

void fsdp_shard_test_skip_reduce_join(bool on) {
    atomic_store(&skip_join, on);
}

void fsdp_shard_test_blocking_works(bool on) {
    atomic_store(&blocking, on);
}

bool fsdp_works_blocking(void) {
    return atomic_load(&blocking);
}

/* The stream and its events, made once. */
static fsdp_status ready(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (sh->post_ready) return FSDP_OK;
    fsdp_device dev = sh->pool.device;
    FSDP_TRY_AT(ctx, fsdp_stream_create(ctx, dev, &sh->post));
    FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &sh->grads_done));
    FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &sh->reduced));
    sh->post_ready = true;
    return FSDP_OK;
}

fsdp_status fsdp_post_backward_begin(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_stream *compute) {
    *compute = fsdp_stream_current(sh->pool.device);
    if (sh->pool.device.type == FSDP_DEVICE_CPU) return FSDP_OK;
    FSDP_TRY_AT(ctx, ready(ctx, sh));
    FSDP_TRY_AT(ctx, fsdp_event_record(ctx, sh->grads_done, *compute));
    FSDP_TRY_AT(ctx, fsdp_stream_wait(ctx, sh->post, sh->grads_done));
    fsdp_stream_set_current(sh->post);
    return FSDP_OK;
}

void fsdp_post_backward_end(fsdp_sharded *sh, fsdp_stream compute) {
    if (sh->pool.device.type != FSDP_DEVICE_CPU) fsdp_stream_set_current(compute);
}

fsdp_status fsdp_post_backward_join(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (!sh->post_ready) return FSDP_OK;
    fsdp_stream compute = fsdp_stream_current(sh->pool.device);
    fsdp_prefetch_trace(sh->units[0], FSDP_REDUCE_JOINED);
    if (atomic_load(&skip_join)) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_event_record(ctx, sh->reduced, sh->post));
    FSDP_TRY_AT(ctx, fsdp_stream_wait(ctx, compute, sh->reduced));
    fsdp_pool_adopt(&sh->pool, sh->post, compute);
    return FSDP_OK;
}

void fsdp_post_backward_release(fsdp_sharded *sh) {
    if (!sh->post_ready) return;
    fsdp_stream_destroy(sh->post); /* waits for its work */
    fsdp_event_destroy(sh->grads_done);
    fsdp_event_destroy(sh->reduced);
    sh->post_ready = false;
}

/* Whether a unit's gradient is reduced in the fused pass: one fsdp_reduce_scatter_ex that
 * pre-divides, reduce_scatters over the group, post-divides and adds into the shard's gradient
 * (bitwise the separate passes, without the reduced buffer). The rule, from the strategy and
 * the options: fused exactly when
 *   - the strategy shards over more than one rank (not NO_SHARD, not a group of one),
 *   - and no replicate group of more than one rank follows (HYBRID_SHARD across replicas needs
 *     the all_reduce over replicas between the reduce_scatter and the post-divide),
 *   - and parameters are not offloaded (the add then goes through the shard's host stage),
 *   - and the comm hook is the default one,
 *   - reducing in f32 (no mixed-precision reduce_dtype).
 * Otherwise the comm hook's passes run (fsdp_dp_reduce, into pool blocks), then the add. */
static bool reduces_fused(const fsdp_sharded *sh) {
    const fsdp_fully_shard_options *o = &sh->opts;
    return fsdp_shard_sharded_strategy(sh) && !sh->replicate && !o->offload_params &&
           o->comm_hook.kind == FSDP_COMM_HOOK_DEFAULT &&
           o->mixed_precision.reduce_dtype == FSDP_DTYPE_F32;
}

/* shard gradient += src. With offload src is copied to the host first and added there. */
static fsdp_status accumulate(fsdp_ctx *ctx, unit *u, const fsdp_tensor *src) {
    fsdp_tensor *g = fsdp_param_grad(u->flat);
    if (u->owner->opts.offload_params) {
        FSDP_TRY_AT(ctx, fsdp_tensor_copy(ctx, u->stage, src));
        src = u->stage;
    }
    fsdp_kernels_for(fsdp_tensor_device(g))
        ->axpy(fsdp_tensor_f32(g), 1.0f, fsdp_tensor_f32(src), fsdp_tensor_numel(g));
    return FSDP_OK;
}

/* The reduction through the comm hook's separate blocking passes (comm_hook.c; the default:
 * divide by the pre factor; reduce_scatter over the group, all_reduce for NO_SHARD; all_reduce
 * over the replicate group for HYBRID_SHARD; divide by the post factor, in f32 or reduce_dtype),
 * then the add into the shard's gradient; the fused pass as one blocking call. A user hook (its
 * function makes its own collectives), a reduction with no collective to start, and every
 * reduction under the tests' blocking switch, run here. */
static fsdp_status reduce_blocking(fsdp_ctx *ctx, unit *u) {
    fsdp_sharded *sh = u->owner;
    if (reduces_fused(sh)) {
        fsdp_reduce_options o = {.pre_scale = fsdp_dp_inverse(sh->pre_factor),
                                 .post_scale = fsdp_dp_inverse(sh->post_factor),
                                 .accumulate = true};
        return fsdp_reduce_scatter_ex(ctx, sh->group, fsdp_param_grad(u->flat), u->full_grad, 0,
                                      FSDP_REDUCE_SUM, &o);
    }
    bool sharded = fsdp_shard_sharded_strategy(sh), low = sh->grad_dtype != FSDP_DTYPE_F32;
    fsdp_status st = FSDP_OK;
    if (sharded) st = fsdp_pool_take(ctx, &sh->pool, u->reduced);
    if (st == FSDP_OK && low) st = fsdp_pool_take(ctx, &sh->pool, u->low_grad);
    if (st == FSDP_OK && low && sharded) st = fsdp_pool_take(ctx, &sh->pool, u->low_reduced);
    fsdp_dp_reduce_args a = {.hook = &sh->opts.comm_hook,
                             .reduce_dtype = sh->opts.mixed_precision.reduce_dtype,
                             .group = sh->group,
                             .replicate = sh->replicate,
                             .pre = sh->pre_factor,
                             .post = sh->post_factor,
                             .index = u->index,
                             .grad = u->full_grad,
                             .out = sharded ? u->reduced : NULL,
                             .low_grad = u->low_grad,
                             .low_out = u->low_reduced};
    if (st == FSDP_OK) st = fsdp_dp_reduce(ctx, &a);
    if (st == FSDP_OK) st = accumulate(ctx, u, sharded ? u->reduced : u->full_grad);
    fsdp_pool_give(&sh->pool, u->low_reduced);
    fsdp_pool_give(&sh->pool, u->low_grad);
    if (sharded) fsdp_pool_give(&sh->pool, u->reduced);
    return FSDP_PASS(ctx, st);
}

/* The 16-bit reduction (the bf16/fp16 hooks, a low reduce_dtype) with its last collective
 * started on u->reduce_work: comm_hook.c's passes, split around it. Divide by the pre factor and
 * round into low_grad (fsdp_dp_round); then the all_reduce of low_grad over `all` (unsharded),
 * the reduce_scatter into low_reduced, or under HYBRID_SHARD that reduce_scatter blocking and
 * the replicas' all_reduce of low_reduced started; the widening into reduced (full_grad
 * unsharded) and the post-division wait for the work (fsdp_post_backward_finish). The blocks are
 * taken and given back in reduce_blocking's order, so the pool sees the same sequence. */
static fsdp_status reduce_start_low(fsdp_ctx *ctx, unit *u, fsdp_group *all) {
    fsdp_sharded *sh = u->owner;
    fsdp_comm_work *w = u->reduce_work;
    bool sharded = fsdp_shard_sharded_strategy(sh);
    fsdp_status st = FSDP_OK;
    if (sharded) st = fsdp_pool_take(ctx, &sh->pool, u->reduced);
    if (st == FSDP_OK) st = fsdp_pool_take(ctx, &sh->pool, u->low_grad);
    if (st == FSDP_OK && sharded) st = fsdp_pool_take(ctx, &sh->pool, u->low_reduced);
    if (st == FSDP_OK) st = fsdp_dp_round(ctx, u->low_grad, u->full_grad, sh->pre_factor);
    if (st == FSDP_OK && !sharded) {
        st = fsdp_all_reduce_start(ctx, all, u->low_grad, FSDP_REDUCE_SUM, w);
    } else if (st == FSDP_OK && !sh->replicate) {
        st = fsdp_reduce_scatter_start(ctx, sh->group, u->low_reduced, u->low_grad, 0,
                                       FSDP_REDUCE_SUM, w);
    } else if (st == FSDP_OK) {
        st = fsdp_reduce_scatter(ctx, sh->group, u->low_reduced, u->low_grad, 0, FSDP_REDUCE_SUM);
        if (st == FSDP_OK)
            st = fsdp_all_reduce_start(ctx, sh->replicate, u->low_reduced, FSDP_REDUCE_SUM, w);
    }
    if (st != FSDP_OK) {
        if (sharded) fsdp_pool_give(&sh->pool, u->low_reduced);
        fsdp_pool_give(&sh->pool, u->low_grad);
        if (sharded) fsdp_pool_give(&sh->pool, u->reduced);
        return FSDP_PASS(ctx, st);
    }
    u->reduce_low = sharded ? u->low_reduced : u->low_grad;
    u->reduce_add = sharded ? u->reduced : u->full_grad;
    return FSDP_OK;
}

/* Starts the reduction's last collective on u->reduce_work and sets u->reduce_add (what is
 * added into the shard's gradient after it; NULL: nothing). With the default hook in f32 the
 * divisions fold into the collectives (fsdp_reduce_scatter_ex, fsdp_all_reduce_ex: element by
 * element the separate passes' bits): the fused reduce_scatter into the shard's gradient; with
 * offload a reduce_scatter into `reduced`; under HYBRID_SHARD the reduce_scatter (blocking)
 * and then the replicas' all_reduce of `reduced`; unsharded the all_reduce of the full
 * gradient (over the replicas when the shard group has one rank). A bf16/fp16 hook or a low
 * reduce_dtype: reduce_start_low. Anything else runs blocking (reduce_blocking, its add
 * included). */
static fsdp_status reduce_start(fsdp_ctx *ctx, unit *u) {
    fsdp_sharded *sh = u->owner;
    const fsdp_fully_shard_options *o = &sh->opts;
    fsdp_comm_work *w = u->reduce_work;
    u->reduce_add = u->reduce_low = NULL;
    if (u->numel == 0) return FSDP_OK;
    fsdp_reduce_options ro = {.pre_scale = fsdp_dp_inverse(sh->pre_factor),
                              .post_scale = fsdp_dp_inverse(sh->post_factor)};
    bool sharded = fsdp_shard_sharded_strategy(sh);
    fsdp_group *all = fsdp_group_size(sh->group) > 1 ? sh->group : sh->replicate;
    if (fsdp_works_blocking() || o->comm_hook.kind == FSDP_COMM_HOOK_USER ||
        (!sharded && (!all || (sh->replicate && all == sh->group))))
        return reduce_blocking(ctx, u);
    if (sh->grad_dtype != FSDP_DTYPE_F32) return reduce_start_low(ctx, u, all);
    if (reduces_fused(sh)) {
        ro.accumulate = true;
        return fsdp_reduce_scatter_start_ex(ctx, sh->group, fsdp_param_grad(u->flat), u->full_grad,
                                            0, FSDP_REDUCE_SUM, &ro, w);
    }
    if (!sharded) {
        FSDP_TRY_AT(ctx, fsdp_all_reduce_start_ex(ctx, all, u->full_grad, FSDP_REDUCE_SUM, &ro, w));
        u->reduce_add = u->full_grad;
        return FSDP_OK;
    }
    FSDP_TRY_AT(ctx, fsdp_pool_take(ctx, &sh->pool, u->reduced));
    fsdp_status st;
    if (!sh->replicate) {
        st = fsdp_reduce_scatter_start_ex(ctx, sh->group, u->reduced, u->full_grad, 0,
                                          FSDP_REDUCE_SUM, &ro, w);
    } else {
        st = fsdp_reduce_scatter_ex(ctx, sh->group, u->reduced, u->full_grad, 0, FSDP_REDUCE_SUM,
                                    &(fsdp_reduce_options){.pre_scale = ro.pre_scale});
        if (st == FSDP_OK)
            st = fsdp_all_reduce_start_ex(ctx, sh->replicate, u->reduced, FSDP_REDUCE_SUM,
                                          &(fsdp_reduce_options){.post_scale = ro.post_scale}, w);
    }
    if (st != FSDP_OK) {
        fsdp_pool_give(&sh->pool, u->reduced);
        return FSDP_PASS(ctx, st);
    }
    u->reduce_add = u->reduced;
    return FSDP_OK;
}

fsdp_status fsdp_post_backward_reduce(fsdp_ctx *ctx, unit *u, const char *call) {
    fsdp_sharded *sh = u->owner;
    FSDP_TRY_AT(ctx, reduce_start(ctx, u));
    u->reduce_open = true;
    fsdp_status st = fsdp_shard_move(ctx, u, UNIT_REDUCED, call);
    /* nothing reads the gradients through the parameters any more */
    for (int i = 0; u->numel && i < u->n_params; i++)
        fsdp_tensor_release_storage(fsdp_param_grad(u->params[i]));
    if (st == FSDP_OK && sh->pool.device.type == FSDP_DEVICE_CPU &&
        fsdp_comm_work_pending(u->reduce_work)) {
        fsdp_pool_hold(&sh->pool, u->full_grad);
        fsdp_pool_hold(&sh->pool, u->reduce_add);
        if (u->reduce_low) fsdp_pool_hold(&sh->pool, u->low_grad);
        if (u->reduce_low && u->reduce_low == u->low_reduced)
            fsdp_pool_hold(&sh->pool, u->low_reduced);
        fsdp_prefetch_trace(u, FSDP_REDUCE_IN_FLIGHT);
        return FSDP_OK;
    }
    fsdp_status fin = fsdp_post_backward_finish(ctx, u);
    return FSDP_PASS(ctx, st != FSDP_OK ? st : fin);
}

fsdp_status fsdp_post_backward_finish(fsdp_ctx *ctx, unit *u) {
    if (!u->reduce_open) return FSDP_OK;
    fsdp_sharded *sh = u->owner;
    u->reduce_open = false;
    fsdp_status st =
        sh->pool.device.type == FSDP_DEVICE_CPU
            ? fsdp_comm_work_wait(ctx, u->reduce_work)
            : fsdp_comm_work_wait_stream(ctx, u->reduce_work, fsdp_stream_current(sh->pool.device));
    if (st == FSDP_OK && u->reduce_low)
        st = fsdp_dp_widen(ctx, u->reduce_add, u->reduce_low, sh->post_factor);
    if (st == FSDP_OK && u->reduce_add) st = accumulate(ctx, u, u->reduce_add);
    if (u->reduce_low && u->reduce_low == u->low_reduced) fsdp_pool_give(&sh->pool, u->low_reduced);
    if (u->reduce_low) fsdp_pool_give(&sh->pool, u->low_grad);
    if (u->reduce_add == u->reduced) fsdp_pool_give(&sh->pool, u->reduced);
    u->reduce_add = u->reduce_low = NULL;
    if (u->numel) fsdp_pool_give(&sh->pool, u->full_grad);
    return FSDP_PASS(ctx, st);
}

/* shard_impl.h: the state of an FSDP wrapping (units, flat buffers, the pool) and the
 * functions its files share: units.c builds and frees it, hooks.c runs the gathers and
 * reductions, summon.c and shards.c read it. Internal to src/dp. */
#ifndef FSDP_DP_SHARD_IMPL_H
#define FSDP_DP_SHARD_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/stream.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_stamp
#include "dp/pool_impl.h"
#include "fsdp/comm.h"
#include "fsdp/wrap.h"

/* The life of an FSDP unit: what its parameters and its full gradient are bound to. A unit
 * moves only through fsdp_shard_move, which refuses a move the table of unit_state.c does not
 * list. A resident unit (unit_resident) is never SHARDED: its parameters are the flat
 * parameter itself. */
typedef enum unit_state {
    UNIT_SHARDED,      /* parameters without storage: this rank's shard is the only copy */
    UNIT_GATHERED,     /* parameters bound to the gathered full parameter (forward; kept after it by
                        * the root and by SHARD_GRAD_OP and NO_SHARD) */
    UNIT_BACKWARD,     /* gathered, and the parameter gradients bound to the full gradient: from
                        * pre-backward to the reduction in post-backward */
    UNIT_GRAD_PENDING, /* no_sync after backward: parameters freed, the full gradient holds the
                        * gradients of no_sync backwards, not reduced yet */
    UNIT_GATHERED_GRAD_PENDING, /* the same with the parameters gathered (kept after backward,
                                 * or gathered again by the next forward) */
    UNIT_SUMMONED,         /* summon_full_params: parameters bound to a full copy of this rank's own
                            * (with_grads: the gradients to the gathered reduced gradient) */
    UNIT_SUMMONED_ON_HOST, /* the same, the parameters bound to a host copy (offload_to_cpu, or
                            * a resident unit without writeback); the device copy is kept only
                            * when the unit was gathered before, or is resident */
    UNIT_STATE_COUNT
} unit_state;

/* One FSDP unit: a module whose parameters (nested units' excluded) share a flat buffer. */
typedef struct unit {
    fsdp_sharded *owner;
    int index; /* in owner->units (pre-order) */
    fsdp_module *module;
    char *path; /* relative to the root, "" for the root */
    bool is_root;
    fsdp_param **params; /* pre-order, registration order, nested units' excluded */
    int64_t *offsets;    /* of each parameter in the flat buffer */
    int n_params;
    int64_t numel;       /* N: the flat elements (parameters and alignment gaps) */
    int64_t shard_numel; /* S = ceil(N / W) when sharded, else N */
    int64_t padded;      /* W * S when sharded, else N */
    unit_state state;
    unit_state summon_from; /* the state summon_full_params found, which release returns to */
    fsdp_tensor *full;      /* (padded): bound to a pool block while unsharded */
    /* (padded) Rank threads: the block where the group's shards of this unit live side by side
     * (fsdp_group_share_shards, made at the unit's first gather): the forward and backward
     * gathers bind the parameters here, and the all_gather into it moves nothing. NULL when
     * the backend has no such blocks, under offload or a low param_dtype. */
    fsdp_tensor *shared_full;
    bool share_asked;         /* fsdp_group_share_shards was called (once per unit) */
    fsdp_tensor *full_grad;   /* (padded): bound from pre-backward to the reduction */
    fsdp_tensor *reduced;     /* (S): reduce_scatter output, bound during the reduction */
    fsdp_tensor *mine;        /* (S): this rank's chunk of a gather output, for offload */
    fsdp_tensor *stage;       /* (S): view of the host staging buffer, for offload */
    fsdp_tensor *summon_host; /* the copy summon_full_params hands out: offload_to_cpu's on the
                                 host, a resident unit's without writeback on its device */
    /* Mixed precision and the low-precision comm hooks: pool-bound handles of that dtype */
    fsdp_tensor *low_full;    /* (padded) param_dtype: the gather of the rounded shards */
    fsdp_tensor *low_mine;    /* (S) param_dtype: this rank's chunk of low_full */
    fsdp_tensor *low_grad;    /* (padded) grad_dtype: the rounded full gradient */
    fsdp_tensor *low_reduced; /* (S) grad_dtype: its reduce_scatter output */
    fsdp_param *flat;         /* the shard (S) the optimizer steps; resident: views full */
    /* (S) bf16 on the shard's device, or NULL: the shard rounded to bf16 by the Adam step that
     * wrote both in one pass (low_copy.c); current while the shard's storage and write
     * generation are still the ones recorded when it was written. */
    fsdp_tensor *low_copy;
    fsdp_tensor_stamp low_copy_stamp; /* the shard's, when the copy was written */
    int hook_ids[4];
    /* Prefetch (prefetch.c): the gather was issued ahead of the unit's own hook, on the state's
     * unshard stream; `gathered` fires when it is done, and the compute stream waits for it
     * before the unit's parameters are read (or freed). */
    bool prefetched;
    /* Its pre-backward hook ran in the backward under way (reset by the root's pre-forward):
     * BACKWARD_POST prefetches the first unit in backward order without it. */
    bool backward_started;
    fsdp_event gathered;
    /* The unit's started collectives (works.c makes them with the state's first prefetch or
     * reduction): a prefetched gather, completed by fsdp_prefetch_wait; the last collective of
     * its gradient reduction, completed by fsdp_post_backward_finish. */
    fsdp_comm_work *gather_work, *reduce_work;
    /* Left for the gather's completion (fsdp_shard_gather_finish): widen low_full into full and
     * give low_full back (mixed precision). */
    bool gather_widen;
    /* A reduction started and not finished (in flight on the host): after its wait, reduce_low
     * (a 16-bit reduction's result, low_grad or low_reduced; NULL: none) is widened into
     * reduce_add and divided by the post factor, reduce_add (NULL: nothing, the fused
     * reduce_scatter added) is added into the shard's gradient, and the low blocks, full_grad
     * (and reduced, when it is reduce_add) go back to the pool. */
    bool reduce_open;
    fsdp_tensor *reduce_add, *reduce_low;
} unit;

/* The hook that prefetches: a pre-forward, pre-backward or post-backward hook. */
typedef enum fsdp_prefetch_at {
    FSDP_PREFETCH_AT_FORWARD,
    FSDP_PREFETCH_AT_PRE_BACKWARD,
    FSDP_PREFETCH_AT_POST_BACKWARD
} fsdp_prefetch_at;

/* What prefetch.c reports to a test's observer (fsdp_shard_test_trace). */
typedef enum fsdp_prefetch_event {
    FSDP_PREFETCH_ISSUED,  /* a unit's gather issued ahead of it, on the unshard stream */
    FSDP_PREFETCH_SKIPPED, /* not issued: limit_all_gathers, and the limit reached */
    FSDP_PREFETCH_WAITED,  /* the compute stream made to wait for a prefetched gather */
    FSDP_PREFETCH_OWN,     /* a unit's gather issued by its own hook (or a summon) */
    FSDP_REDUCE_ISSUED,    /* a unit's gradient reduction issued on the post-backward stream */
    FSDP_REDUCE_JOINED,    /* the compute stream made to wait for the post-backward stream */
    FSDP_GATHER_IN_FLIGHT, /* a prefetched gather's work still in flight after its start */
    FSDP_REDUCE_IN_FLIGHT  /* a reduction's work still in flight on the host after its start */
} fsdp_prefetch_event;
/* in_flight: the non-root units holding gathered parameters after the event. */
typedef void (*fsdp_prefetch_trace_fn)(void *user, int unit, fsdp_prefetch_event ev, int in_flight);

struct fsdp_sharded {
    fsdp_fully_shard_options opts;
    fsdp_group *group;     /* shards the parameters */
    fsdp_group *replicate; /* HYBRID_SHARD: holds copies of the same shard; else NULL */
    double pre_factor, post_factor;
    fsdp_dtype param_dtype; /* what parameters are gathered in */
    fsdp_dtype grad_dtype;  /* what a built-in comm hook reduces in (f32 for a user hook) */
    fsdp_module *root;
    fsdp_module *flat_store; /* owns the flat shard parameters (impl: this object) */
    fsdp_module *orig;       /* use_orig_params: the mirror tree of shard views; else NULL */
    unit **units;            /* pre-order; units[0] is the root */
    int n_units;
    fsdp_flat_segment *segments;
    int n_segments;
    fsdp_pool pool;          /* gathered parameters and gradients, on the compute device */
    fsdp_tensor *host_stage; /* offload: reduced gradient shards arrive here (max S) */
    bool sync;
    bool summoned;
    fsdp_summon_options summon;
    /* Ownership: the state lives while the model (until fsdp_module_free) or the caller's
     * handle (until fsdp_sharded_free) holds it; the last to let go frees it. */
    bool model_held, handle_held;
    bool unwrapping; /* fsdp_sharded_free is removing the hooks */
    /* Prefetch (prefetch.c): the units in the order their pre-forward ([0]) and pre-backward
     * ([1]) hooks first ran; the stream prefetched gathers run on and the event that orders it
     * after the compute stream (made at the first prefetch); a test's observer. */
    unit **order[2];
    int n_order[2];
    fsdp_stream unshard;
    fsdp_event issue;
    bool prefetch_ready; /* unshard and issue made */
    bool prefetching;    /* a prefetched gather is being issued */
    fsdp_prefetch_trace_fn trace;
    void *trace_user;
    /* The post-backward stream (post_backward.c), made at the first reduction on a device; the
     * events that order it after the compute stream and the compute stream after it. */
    fsdp_stream post;
    fsdp_event grads_done, reduced;
    bool post_ready;
    bool works_ready; /* every unit's gather_work and reduce_work made */
    /* bf16 gathers of this rank's units (low_copy.c): those that took this rank's chunk from the
     * optimizer's bf16 copy, and those that rounded the f32 shard. */
    int64_t low_copy_used, low_copy_rounded;
};

/* The shard group's size and this rank's index in it (what the group says, not a copy). */
int fsdp_shard_world(const fsdp_sharded *sh);
int fsdp_shard_rank(const fsdp_sharded *sh);
/* Whether the strategy shards (not NO_SHARD, more than one rank in the group). */
bool fsdp_shard_sharded_strategy(const fsdp_sharded *sh);
/* NO_SHARD (or a group of one) without offload, in f32: every unit's full flat parameter is the
 * optimizer's parameter itself, always bound; nothing to gather. */
bool fsdp_shard_resident(const fsdp_sharded *sh);

/* ---- the unit's life (unit_state.c) ---- */

/* What moves a unit from state to state (the table of unit_state.c). */
typedef enum unit_event {
    UNIT_UNSHARD,        /* SHARDED -> GATHERED, GRAD_PENDING -> GATHERED_GRAD_PENDING */
    UNIT_RESHARD,        /* the reverse */
    UNIT_TAKE_GRADS,     /* pre-backward: GATHERED or GATHERED_GRAD_PENDING -> BACKWARD */
    UNIT_REDUCED,        /* post-backward: BACKWARD -> GATHERED, the gradient reduced */
    UNIT_KEEP_GRADS,     /* post-backward under no_sync: BACKWARD -> GATHERED_GRAD_PENDING */
    UNIT_SUMMON,         /* a state outside forward and backward -> SUMMONED */
    UNIT_SUMMON_TO_HOST, /* SUMMONED -> SUMMONED_ON_HOST */
    UNIT_RELEASE,        /* SUMMONED or SUMMONED_ON_HOST -> the state the summon found */
    UNIT_EVENT_COUNT
} unit_event;

const char *fsdp_unit_state_name(unit_state s);
const char *fsdp_unit_event_name(unit_event e);
/* FSDP_ERR_STATE naming the unit, its state, the event and `call` (the public call or hook that
 * asked) when the table does not list the move; FSDP_OK otherwise. */
fsdp_status fsdp_shard_check_move(fsdp_ctx *ctx, const unit *u, unit_event event, const char *call);
/* The same check, then the move: the only place a unit's state changes after it is built. */
fsdp_status fsdp_shard_move(fsdp_ctx *ctx, unit *u, unit_event event, const char *call);
/* What the state says: the unit holds its full parameter on the compute device (summoned on
 * the host: that buffer is still held); its full gradient holds unreduced gradients of no_sync
 * backwards (summoned: it did when summoned). */
bool fsdp_unit_gathered(const unit *u);
bool fsdp_unit_grad_pending(const unit *u);
/* FULL_SHARD and HYBRID_SHARD free non-root parameters after forward and every backward. */
bool fsdp_shard_reshard_after_forward(const fsdp_sharded *sh);
/* Points the unit's parameters into base at their offsets / takes their storage away. */
fsdp_status fsdp_shard_bind_params(fsdp_ctx *ctx, unit *u, const fsdp_tensor *base);
void fsdp_shard_release_params(unit *u);
/* full <- every rank's shard, in order (through the device with offload). */
fsdp_status fsdp_shard_gather(fsdp_ctx *ctx, unit *u, fsdp_tensor *full, const fsdp_tensor *shard);
/* Gathers the unit's full parameters and points its parameters into them. The gather runs in
 * `dtype` (the shards rounded to it; f32: exact), the values widened into u->full, a pool
 * block; in f32 on rank threads it is in place in u->shared_full instead. Moves SHARDED to GATHERED
 * and GRAD_PENDING to GATHERED_GRAD_PENDING; a gathered unit is left as it is. */
fsdp_status fsdp_shard_unshard(fsdp_ctx *ctx, unit *u, fsdp_dtype dtype, const char *call);
/* Frees the gathered parameters (a resident unit keeps them): the reverse moves. */
fsdp_status fsdp_shard_reshard(fsdp_ctx *ctx, unit *u, const char *call);
/* Binds the parameter gradients to a zeroed full gradient block (GATHERED to BACKWARD; a unit
 * with pending gradients keeps them and enters BACKWARD); fsdp_post_backward_reduce gives the
 * block back after the reduction (BACKWARD to GATHERED). */
fsdp_status fsdp_shard_take_grads(fsdp_ctx *ctx, unit *u, const char *call);

/* The binding work alone, without a move (summon.c moves the unit itself): gather into a pool
 * block of this rank's own, always (what the caller writes there must not reach the peers'
 * shards) / free it / bind the gradients to a zeroed block / give it back. */
fsdp_status fsdp_shard_gather_copy(fsdp_ctx *ctx, unit *u);
void fsdp_shard_free_full(unit *u);
fsdp_status fsdp_shard_bind_grads(fsdp_ctx *ctx, unit *u);
void fsdp_shard_unbind_grads(unit *u);

/* The four hooks of a unit (user: the unit). */
fsdp_status fsdp_shard_pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   const fsdp_tensor **io, void *user);
fsdp_status fsdp_shard_post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user);
fsdp_status fsdp_shard_pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user);
fsdp_status fsdp_shard_post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                     const fsdp_tensor **io, void *user);

/* ---- CPU offload of a model on a device (offload.c) ---- */

/* offload_params with the model on a device (not the CPU). */
bool fsdp_offload_on_device(const fsdp_sharded *sh);
/* Moves the unit's shard and its gradient (CPU tensors) into pinned host memory. */
fsdp_status fsdp_offload_pin(fsdp_ctx *ctx, const fsdp_sharded *sh, unit *u);
/* The host waits until the copies queued so far (on the compute and unshard streams) have
 * read the pinned shards; nothing without offload on a device. */
fsdp_status fsdp_offload_sync(fsdp_ctx *ctx, const fsdp_sharded *sh);
/* Tests: the negative control that drops that wait (every state, while on). */
void fsdp_shard_test_skip_offload_sync(bool on);

/* ---- the units' started collectives (works.c) ---- */

/* Makes every unit's gather and reduce works (once) and hands the pool the settling below (the
 * hooks call it before a prefetch or a reduction). */
fsdp_status fsdp_works_ready(fsdp_ctx *ctx, fsdp_sharded *sh);
/* Completes every work left in flight on the host (prefetched gathers, reductions), with what
 * follows each (the widening, the add into the shard's gradient, the blocks given back): the
 * pool calls it before it hands out a block such a work still holds, and the end of backward,
 * summon_full_params and a failure call it. */
fsdp_status fsdp_works_settle(fsdp_ctx *ctx, fsdp_sharded *sh);
/* A hook's failure: every unit's work completed (on a device too) before st is returned, its
 * message kept; FSDP_OK passes through. */
fsdp_status fsdp_works_drain(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_status st);
/* Tests: FSDP's hook at `point` of unit unit_index fails (FSDP_ERR_INTERNAL) before it does
 * anything, in every state, until called with unit_index -1; fsdp_works_test_failure is that
 * failure (FSDP_OK for every other hook). */
void fsdp_shard_test_fail_hook(int unit_index, fsdp_hook_point point);
fsdp_status fsdp_works_test_failure(fsdp_ctx *ctx, const unit *u, fsdp_hook_point point);
/* Frees the works (none may be in flight: the hooks drain on failure). */
void fsdp_works_release(fsdp_sharded *sh);

/* ---- the post-backward stream (post_backward.c) ---- */

/* Around a unit's gradient reduction: begin makes the post-backward stream wait for the
 * compute stream (*compute) and current; end makes the compute stream current again. Nothing
 * on the CPU. */
fsdp_status fsdp_post_backward_begin(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_stream *compute);
void fsdp_post_backward_end(fsdp_sharded *sh, fsdp_stream compute);
/* Reduces the unit's gradient (BACKWARD, on the post-backward stream where there is one): its
 * last collective started on u->reduce_work, the unit moved to GATHERED and its parameters'
 * gradients unbound; finished at once (fsdp_post_backward_finish) unless the work is in flight
 * on the host, where it stays open until fsdp_works_settle. Fails with the unit still in
 * BACKWARD when nothing was started. */
fsdp_status fsdp_post_backward_reduce(fsdp_ctx *ctx, unit *u, const char *call);
/* Completes an open reduction (the work's wait: on a device, of the current stream), adds its
 * result into the shard's gradient and gives its blocks back; nothing when none is open. */
fsdp_status fsdp_post_backward_finish(fsdp_ctx *ctx, unit *u);
/* The end of backward: the current (compute) stream waits for every reduction queued, and the
 * pool's blocks given back on the post-backward stream become the compute stream's. */
fsdp_status fsdp_post_backward_join(fsdp_ctx *ctx, fsdp_sharded *sh);
/* Waits for the stream's work and frees it and its events. */
void fsdp_post_backward_release(fsdp_sharded *sh);
/* Tests: the negative control that drops the join (every state, while on). */
void fsdp_shard_test_skip_reduce_join(bool on);
/* Tests: every collective of the hooks blocking, as before the works (the prefetched gather,
 * the reduction's last collective, and the reduction through the comm hook's separate passes
 * instead of the fused options): every state, while on. */
void fsdp_shard_test_blocking_works(bool on);
bool fsdp_works_blocking(void);

/* ---- prefetch (prefetch.c) ---- */

/* Records u in the order of its hooks (backward: pre-backward) the first time it runs. */
fsdp_status fsdp_prefetch_note(fsdp_ctx *ctx, unit *u, bool backward);
/* The unit after u in that order, to be gathered now: when the options ask for it, it is
 * sharded, the limit of units in flight allows it and no recompute runs; else NULL. */
unit *fsdp_prefetch_pick(fsdp_ctx *ctx, unit *u, fsdp_prefetch_at at);
/* Around a prefetch's gather: begin makes the unshard stream wait for the compute stream
 * (*compute) and makes it current; end (given the gather's status) makes compute current
 * again and records the unit's gathered event on the unshard stream. */
fsdp_status fsdp_prefetch_begin(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_stream *compute);
fsdp_status fsdp_prefetch_end(fsdp_ctx *ctx, unit *v, fsdp_stream compute, fsdp_status st);
/* A prefetched unit: the current stream waits for its gather (then it is an ordinary gathered
 * unit). Nothing for another unit. fsdp_prefetch_join: every prefetched unit. */
fsdp_status fsdp_prefetch_wait(fsdp_ctx *ctx, unit *u);
fsdp_status fsdp_prefetch_join(fsdp_ctx *ctx, fsdp_sharded *sh);
/* The non-root units holding gathered parameters. */
int fsdp_prefetch_in_flight(const fsdp_sharded *sh);
void fsdp_prefetch_trace(const unit *u, fsdp_prefetch_event ev);
/* What follows a unit's gather once its collective completed (at once, or after the prefetch's
 * wait): the views of this rank's chunk released, under mixed precision the widening into full
 * (unless st failed) and low_full given back. Returns st, or the widening's failure. */
fsdp_status fsdp_shard_gather_finish(fsdp_ctx *ctx, unit *u, fsdp_status st);
/* Waits for the unshard stream and frees it, the events and the orders. */
void fsdp_prefetch_release(fsdp_sharded *sh);
/* Tests: an observer of the prefetch events of sh (NULL: none); the negative control that
 * drops the compute stream's wait for a prefetched gather (every state, while on). */
void fsdp_shard_test_trace(fsdp_sharded *sh, fsdp_prefetch_trace_fn fn, void *user);
void fsdp_shard_test_skip_prefetch_wait(bool on);

/* ---- the optimizer's bf16 copy of a shard (low_copy.c) ---- */

/* Whether the unit's next bf16 gather may take this rank's chunk from u->low_copy: it exists,
 * was written by an optimizer step, and the shard's storage and write generation are the ones
 * recorded then (nothing has touched the f32 shard since). Counts the answer in the owner's
 * low_copy_used / low_copy_rounded. */
bool fsdp_low_copy_take(unit *u);

/* Tests: FSDP_LOW_COPY_ON (the default), OFF (no copy made or read: every gather rounds the
 * shard, the optimizer runs adam_update), or UNCHECKED (the negative control: a gather takes a
 * copy once written, whatever the shard's generation). Every state, while set. */
typedef enum fsdp_low_copy_mode {
    FSDP_LOW_COPY_ON,
    FSDP_LOW_COPY_OFF,
    FSDP_LOW_COPY_UNCHECKED
} fsdp_low_copy_mode;
void fsdp_shard_test_low_copy(fsdp_low_copy_mode mode);
/* Tests: the counts of fsdp_low_copy_take over sh's units since it was made. */
void fsdp_shard_test_low_copy_counts(const fsdp_sharded *sh, int64_t *used, int64_t *rounded);

/* FSDP_ERR_STATE naming `what` when the model was freed before the state. */
fsdp_status fsdp_shard_check_model(fsdp_ctx *ctx, const fsdp_sharded *sh, const char *what);

#endif

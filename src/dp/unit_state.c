/* unit_state.c: the life of an FSDP unit as one state (shard_impl.h's unit_state), the table of
 * the moves between states that the hooks, summon_full_params and its release make, and the one
 * function that moves a unit, refusing a move the table does not list. */
#include "core/error.h"
#include "dp/shard_impl.h"

int fsdp_shard_world(const fsdp_sharded *sh) {
    return fsdp_group_size(sh->group);
}

int fsdp_shard_rank(const fsdp_sharded *sh) {
    return fsdp_group_rank(sh->group);
}

bool fsdp_shard_sharded_strategy(const fsdp_sharded *sh) {
    return sh->opts.strategy != FSDP_NO_SHARD && fsdp_shard_world(sh) > 1;
}

bool fsdp_shard_resident(const fsdp_sharded *sh) {
    return !fsdp_shard_sharded_strategy(sh) && !sh->opts.offload_params &&
           sh->param_dtype == FSDP_DTYPE_F32;
}

const char *fsdp_unit_state_name(unit_state s) {
    static const char *names[UNIT_STATE_COUNT] = {[UNIT_SHARDED] = "SHARDED",
                                                  [UNIT_GATHERED] = "GATHERED",
                                                  [UNIT_BACKWARD] = "BACKWARD",
                                                  [UNIT_GRAD_PENDING] = "GRAD_PENDING",
                                                  [UNIT_GATHERED_GRAD_PENDING] =
                                                      "GATHERED_GRAD_PENDING",
                                                  [UNIT_SUMMONED] = "SUMMONED",
                                                  [UNIT_SUMMONED_ON_HOST] = "SUMMONED_ON_HOST"};
    return (int)s >= 0 && s < UNIT_STATE_COUNT ? names[s] : "unknown";
}

const char *fsdp_unit_event_name(unit_event e) {
    static const char *names[UNIT_EVENT_COUNT] = {[UNIT_UNSHARD] = "unshard",
                                                  [UNIT_RESHARD] = "reshard",
                                                  [UNIT_TAKE_GRADS] = "take the gradients",
                                                  [UNIT_REDUCED] = "reduce the gradients",
                                                  [UNIT_KEEP_GRADS] =
                                                      "keep the gradients unreduced",
                                                  [UNIT_SUMMON] = "summon",
                                                  [UNIT_SUMMON_TO_HOST] = "summon to the host",
                                                  [UNIT_RELEASE] = "release"};
    return (int)e >= 0 && e < UNIT_EVENT_COUNT ? names[e] : "unknown";
}

/* next[state][event] - 1: the state a unit in `state` moves to on `event`; 0: refused. A release
 * returns to the state the summon found (summon_from). */
#define GO(s) ((s) + 1)
#define BACK  (UNIT_STATE_COUNT + 1)
static const unsigned char next[UNIT_STATE_COUNT][UNIT_EVENT_COUNT] = {
    [UNIT_SHARDED] = {[UNIT_UNSHARD] = GO(UNIT_GATHERED), [UNIT_SUMMON] = GO(UNIT_SUMMONED)},
    [UNIT_GATHERED] = {[UNIT_RESHARD] = GO(UNIT_SHARDED),
                       [UNIT_TAKE_GRADS] = GO(UNIT_BACKWARD),
                       [UNIT_SUMMON] = GO(UNIT_SUMMONED)},
    [UNIT_BACKWARD] =
        {[UNIT_REDUCED] = GO(UNIT_GATHERED), [UNIT_KEEP_GRADS] = GO(UNIT_GATHERED_GRAD_PENDING)},
    /* the summon of a unit with pending gradients leaves them (with_grads is refused before) */
    [UNIT_GRAD_PENDING] =
        {[UNIT_UNSHARD] = GO(UNIT_GATHERED_GRAD_PENDING), [UNIT_SUMMON] = GO(UNIT_SUMMONED)},
    /* the next backward accumulates into the pending gradients */
    [UNIT_GATHERED_GRAD_PENDING] = {[UNIT_RESHARD] = GO(UNIT_GRAD_PENDING),
                                    [UNIT_TAKE_GRADS] = GO(UNIT_BACKWARD),
                                    [UNIT_SUMMON] = GO(UNIT_SUMMONED)},
    [UNIT_SUMMONED] = {[UNIT_SUMMON_TO_HOST] = GO(UNIT_SUMMONED_ON_HOST), [UNIT_RELEASE] = BACK},
    [UNIT_SUMMONED_ON_HOST] = {[UNIT_RELEASE] = BACK},
};

/* What to do instead, for the state the unit is found in. */
static const char *advice(unit_state from) {
    switch (from) {
    case UNIT_SUMMONED:
    case UNIT_SUMMONED_ON_HOST:
        return "call fsdp_release_full_params before running the model or summoning again";
    case UNIT_BACKWARD:
        return "let the backward finish first (a backward that failed leaves the unit inside it: "
               "free the FSDP state and wrap the model again)";
    default:
        return "run forward, backward and summon_full_params in that order, outside each other";
    }
}

/* The state u moves to on event; UNIT_STATE_COUNT when the table refuses it. */
static unit_state next_state(const unit *u, unit_event event) {
    unit_state from = u->state;
    if ((int)from < 0 || from >= UNIT_STATE_COUNT || (int)event < 0 || event >= UNIT_EVENT_COUNT)
        return UNIT_STATE_COUNT;
    unsigned to = next[from][event];
    if (to == BACK) to = GO(u->summon_from);
    return to == 0 || to > UNIT_STATE_COUNT ? UNIT_STATE_COUNT : (unit_state)(to - 1);
}

fsdp_status fsdp_shard_check_move(fsdp_ctx *ctx, const unit *u, unit_event event,
                                  const char *call) {
    if (next_state(u, event) != UNIT_STATE_COUNT) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE, "FSDP unit '%s': %s cannot %s it in state %s; %s",
                     u->path && *u->path ? u->path : "(root)", call, fsdp_unit_event_name(event),
                     fsdp_unit_state_name(u->state), advice(u->state));
}

fsdp_status fsdp_shard_move(fsdp_ctx *ctx, unit *u, unit_event event, const char *call) {
    FSDP_TRY_AT(ctx, fsdp_shard_check_move(ctx, u, event, call));
    u->state = next_state(u, event);
    return FSDP_OK;
}

static bool gathered_state(unit_state s) {
    return s == UNIT_GATHERED || s == UNIT_BACKWARD || s == UNIT_GATHERED_GRAD_PENDING;
}

static bool pending_state(unit_state s) {
    return s == UNIT_GRAD_PENDING || s == UNIT_GATHERED_GRAD_PENDING;
}

static bool summoned_state(unit_state s) {
    return s == UNIT_SUMMONED || s == UNIT_SUMMONED_ON_HOST;
}

bool fsdp_unit_gathered(const unit *u) {
    if (u->state == UNIT_SUMMONED) return true;
    if (u->state == UNIT_SUMMONED_ON_HOST)
        return gathered_state(u->summon_from) || fsdp_shard_resident(u->owner);
    return gathered_state(u->state);
}

bool fsdp_unit_grad_pending(const unit *u) {
    return pending_state(summoned_state(u->state) ? u->summon_from : u->state);
}

/* ctx_impl.h: the body of fsdp_ctx, for libfsdp's own layers. Holds the per-rank state that
 * must not be global: seed, logging, last error, and the stack of running modules that the
 * comm-debug layer reads to attribute collectives. */
#ifndef FSDP_CORE_CTX_IMPL_H
#define FSDP_CORE_CTX_IMPL_H

#include <stdbool.h>

#include "core/error.h"
#include "core/stream.h"
#include "fsdp/ctx.h"
#include "fsdp/profile.h"
#include "fsdp/tensor.h"

#define FSDP_SCOPE_MAX 64

/* Which pass is running; set by the module layer, read by comm-debug. */
typedef enum fsdp_phase { FSDP_PHASE_NONE = 0, FSDP_PHASE_FORWARD, FSDP_PHASE_BACKWARD } fsdp_phase;

struct fsdp_ctx {
    uint64_t seed;
    /* Set while a model builder assembles a tree it resets as a whole at the end
     * (fsdp_nn_defer_init): parameters and buffers are not filled when added, since the reset
     * fills every one under its final name anyway. */
    bool defer_param_init;
    int rank;
    fsdp_device device;      /* fsdp_ctx_set_device; the cpu by default */
    fsdp_stream comm_stream; /* on device, made by fsdp_ctx_comm_stream; handle NULL before */
    fsdp_log_level log_level;
    fsdp_log_fn log_fn;
    void *log_user;

    fsdp_error_record error; /* the most recent failure (core/error.h) */

    const char *scope[FSDP_SCOPE_MAX]; /* fully qualified names of the running modules */
    int scope_depth;
    fsdp_phase phase;
    /* The innermost module whose forward runs (an fsdp_module, opaque to core; NULL outside
     * any): src/nn records the buffers a layer makes in forward on it. */
    void *running_module;
    /* > 0 while a checkpointed module re-runs its forward inside backward (src/nn): FSDP keeps
     * the parameters it gathers then, since the unit's backward follows at once. */
    int recompute_depth;

    /* The rank's binding to its world (src/comm), opaque to core; NULL outside
     * fsdp_world_run. comm_release (set with it) frees it with the context. */
    void *comm;
    void (*comm_release)(void *comm);

    /* fsdp_profile_start/stop (profile.c): the totals, and whether the timers run. */
    fsdp_profile prof;
    bool prof_on;
};

/* The rank the calling thread runs as, or -1 for none (the default): the default log line
 * ("[fsdp r<rank> warn] ...") names it whichever context logs, so a line that a rank's
 * thread logs through another context (fsdp_world_run's, under MPI) still names that rank.
 * fsdp_world_run sets it on every thread that runs a rank. Returns the previous value. */
int fsdp_log_thread_rank_swap(int rank);

/* The rank's streams on its device: compute (the calling thread's default stream there, where
 * its kernels run) and communication (its own, made on first use: FSDP_ERR_DEVICE when the
 * device cannot make one). On the cpu both are the no-op stream. */
fsdp_stream fsdp_ctx_compute_stream(const fsdp_ctx *ctx);
fsdp_status fsdp_ctx_comm_stream(fsdp_ctx *ctx, fsdp_stream *out);

/* Pushes a running module's name (not copied: it must outlive the scope). Deeper nesting
 * than FSDP_SCOPE_MAX is counted but not recorded. */
void fsdp_ctx_scope_push(fsdp_ctx *ctx, const char *name);
void fsdp_ctx_scope_pop(fsdp_ctx *ctx);
/* The innermost running module's name, or "" outside any module. */
const char *fsdp_ctx_scope_top(const fsdp_ctx *ctx);

#endif

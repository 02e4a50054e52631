/* profile.h: where a rank's time goes. Cheap timers around the CPU kernels (GEMM, the
 * elementwise kernels, the optimizer updates) and the collectives (moving data vs waiting),
 * off by default: when off a kernel call costs one thread-local load more and a collective
 * one flag test. bench/bench_scaling --profile prints them per training step. */
#ifndef FSDP_PROFILE_H
#define FSDP_PROFILE_H

#include <stdint.h>

#include "fsdp/comm.h" // defines: FSDP_COMM_OP_COUNT
#include "fsdp/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds (and calls) accumulated since fsdp_profile_start, on the thread that started it. */
typedef struct fsdp_profile {
    double gemm_s;        /* GEMM of the CPU kernel table (the Linear layers) */
    double elementwise_s; /* every other CPU kernel: activations, bias, losses, copies, norms */
    double optimizer_s;   /* the fused SGD and Adam updates */
    /* Per collective, indexed by fsdp_comm_op (FSDP_COMM_ANY unused): the time spent moving or
     * reducing data (local backend), and the rest of the call: the rendezvous with the peers
     * (waiting for them), the checks. The MPI backend reports its whole call as wait. */
    double comm_copy_s[FSDP_COMM_OP_COUNT];
    double comm_wait_s[FSDP_COMM_OP_COUNT];
    int64_t gemm_calls, elementwise_calls, optimizer_calls;
    int64_t comm_calls[FSDP_COMM_OP_COUNT];
} fsdp_profile;

/* Zeroes ctx's profile and turns the timers on for the calling thread (kernels are timed on
 * the thread that calls them: use the thread that runs the rank, i.e. inside the function of
 * fsdp_world_run). Starting again restarts from zero. */
fsdp_status fsdp_profile_start(fsdp_ctx *ctx);
/* Turns the timers off; the totals stay readable. Freeing the context also stops them. */
fsdp_status fsdp_profile_stop(fsdp_ctx *ctx);
/* Copies the totals so far (zero when never started) to *out. */
fsdp_status fsdp_profile_read(fsdp_ctx *ctx, fsdp_profile *out);

#ifdef __cplusplus
}
#endif
#endif

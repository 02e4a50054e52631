/* prof_impl.h: the timers behind fsdp/profile.h for libfsdp's own layers: the profile the
 * calling thread accumulates into (NULL while off) and the clock. */
#ifndef FSDP_CORE_PROF_IMPL_H
#define FSDP_CORE_PROF_IMPL_H

#include "core/clock.h"
#include "fsdp/profile.h"

/* The profile the calling thread's timers add to, or NULL when profiling is off here. */
fsdp_profile *fsdp_prof_current(void);

/* The timers' clock: core's monotonic seconds. */
static inline double fsdp_prof_now(void) {
    return fsdp_clock_now();
}

#endif

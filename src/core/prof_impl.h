/* prof_impl.h: the timers behind fsdp/profile.h for libfsdp's own layers: the profile the
 * calling thread accumulates into (NULL while off) and the clock. */
#ifndef FSDP_CORE_PROF_IMPL_H
#define FSDP_CORE_PROF_IMPL_H

#include "fsdp/profile.h"

/* The profile the calling thread's timers add to, or NULL when profiling is off here. */
fsdp_profile *fsdp_prof_current(void);

/* Monotonic seconds. */
double fsdp_prof_now(void);

#endif

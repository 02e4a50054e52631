/* clock.h: the one clock libfsdp reads for durations and deadlines: monotonic seconds. */
#ifndef FSDP_CORE_CLOCK_H
#define FSDP_CORE_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin, never set back): subtract two readings. */
double fsdp_clock_now(void);

#endif

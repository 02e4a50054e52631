/* sim.h: what the simulated GPU offers beyond its device record (core/device.h): its record,
 * its operator table, the stream modes, the caching allocator's counters and the launch and
 * host-wait counts. Internal to
 * libfsdp (tests and benchmarks read it). The design and its settings (FSDP_SIM_DEVICES,
 * FSDP_SIM_MEMORY, FSDP_SIM_MODE, FSDP_SIM_SEED) are in docs/device.md. */
#ifndef FSDP_KERNELS_SIM_H
#define FSDP_KERNELS_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"     // defines: fsdp_device_i
#include "kernels/kernels.h" // defines: fsdp_kernels_i

/* The record of the sim device kind and its operator table (the CPU kernels run by the
 * streams on translated pointers). */
const fsdp_device_i *fsdp_device_sim(void);
const fsdp_kernels_i *fsdp_kernels_sim(void);

/* How a stream runs its queue:
 *   EAGER:    as soon as work is queued;
 *   DEFERRED: only up to what someone waits for (an event or stream synchronize, a stream
 *             waiting on an event, a value read back, a query); a missing wait reads stale
 *             data every time. The default;
 *   JITTER:   as EAGER, with random delays before each piece of work (FSDP_SIM_SEED). */
typedef enum fsdp_sim_mode {
    FSDP_SIM_EAGER = 0,
    FSDP_SIM_DEFERRED = 1,
    FSDP_SIM_JITTER = 2
} fsdp_sim_mode;

/* The mode in effect (FSDP_SIM_MODE=eager|deferred|jitter at the first use), and a change of
 * it for the whole process, which applies to work queued afterwards. */
fsdp_sim_mode fsdp_sim_mode_get(void);
void fsdp_sim_mode_set(fsdp_sim_mode mode);

/* The caching allocator of one sim device, as fsdp_device_memory_stats reports it: zeroes
 * (capacity aside) when the device was never used; zeroes when the index is out of range. The
 * capacity is FSDP_SIM_MEMORY. */
fsdp_device_memory fsdp_sim_memory_stats_get(int device);
/* Restarts the peaks from the present in_use and reserved. */
void fsdp_sim_memory_reset_peak(int device);

/* Bytes of pinned host memory (host_alloc) handed out and not yet freed, over every sim
 * device. */
size_t fsdp_sim_pinned_bytes(void);

/* Returns the cached blocks of a device to its memory, after the work that last used them. */
void fsdp_sim_empty_cache(int device);

/* The launches and host waits of one sim device since its last reset (counts.c; zeroes for an
 * index out of range), all threads together:
 *   launches:   every piece of work queued on one of its streams for the caller: each operator
 *               table entry (one, where CUDA's may launch a few), fill, conversion, the zeroing
 *               of a new allocation, and each copy to, from or on it (a 2-d copy from pageable
 *               host memory one per row, as it is made). Not counted: event records and stream
 *               waits on events (markers, no work), and the allocator's guard bytes (a check of
 *               the simulation that a GPU does not run);
 *   host_waits: every time a host thread blocks until work of the device has run: an event or
 *               stream synchronize, a copy to host memory (the host reads it next), a table entry
 *               that hands a value to the host (sums, norms, losses) and the allocator's return
 *               of its cache to the device (fsdp_sim_empty_cache, or an allocation that finds
 *               the device full). Counted per call, whether or not the work had already run.
 *               Not a host wait: an event query (it does not block), a stream waiting on an
 *               event (the device waits, as when the allocator hands a block freed on another
 *               stream to this one), a copy from host memory (taken at once, or read from
 *               pinned memory in stream order), a stream's end at its thread's exit. */
fsdp_launch_counts fsdp_sim_counts_get(int device);
void fsdp_sim_counts_reset(int device);

#endif

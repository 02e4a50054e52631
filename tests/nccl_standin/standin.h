/* standin.h: what the stand-in NCCL (libfsdp_nccl_standin.so) offers tests beyond NCCL's own
 * functions: faults injected into a rank's next collective. The tests resolve these with dlsym
 * from the library the backend opened. */
#ifndef FSDP_NCCL_STANDIN_H
#define FSDP_NCCL_STANDIN_H

/* An int holding FSDP_DEVICE_SIM: the marker by which the backend knows a stand-in opened from
 * FSDP_NCCL_LIBRARY (no fsdp_nccl_library_use needed), serving sim devices and named
 * "stand-in NCCL" in every message (FSDP_NCCL_STANDIN_SYMBOL, src/comm/nccl_lib.h). */
#define STANDIN_DEVICE_KIND_SYMBOL "fsdpStandinDeviceKind"

/* What happens to the next collective that rank `rank` of a communicator of `nranks` ranks
 * enqueues (once, then the injection is spent). */
typedef enum standin_fault {
    STANDIN_FAULT_NONE = 0,
    STANDIN_FAULT_HANG,        /* its work never completes, until the communicator is aborted */
    STANDIN_FAULT_ASYNC_ERROR, /* its work ends with ncclSystemError as the async error */
    STANDIN_FAULT_NO_ID,       /* the next ncclGetUniqueId fails (nranks and rank unused) */
} standin_fault;

typedef void (*standin_inject_fn)(int nranks, int rank, standin_fault fault);
#define STANDIN_INJECT_SYMBOL "fsdpStandinInject"

/* How many communicators are alive (made and not destroyed or aborted): 0 after a clean end. */
typedef int (*standin_live_fn)(void);
#define STANDIN_LIVE_SYMBOL "fsdpStandinLiveComms"

/* Cross-process mode (stand-in built with MPI): ids made from now on (on != 0) are for
 * communicators whose ranks are the processes of an MPI job (standin.c). Returns 0 when this
 * stand-in has no such mode. */
typedef int (*standin_cross_fn)(int on);
#define STANDIN_CROSS_SYMBOL "fsdpStandinCrossProcess"

#endif

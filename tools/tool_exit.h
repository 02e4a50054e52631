/* tool_exit.h: how fsdp-train and fsdp-ckpt end their process. HDF5 closes the files it still
 * has open from an exit handler (H5_term_library). After a write that failed (a full disk),
 * HDF5 1.10 keeps a half-destroyed file in its table, and that handler crashes on it (signal
 * 11); a thread stuck inside an HDF5 call holds the lock the handler takes, and exit waits
 * forever. So the tools turn the handler off before HDF5 starts, close HDF5 themselves after
 * a run that left it sound, and leave with _exit while a rank thread is stuck. */
#ifndef FSDP_TOOLS_TOOL_EXIT_H
#define FSDP_TOOLS_TOOL_EXIT_H

typedef enum tool_end {
    TOOL_END_CLEAN,       /* the run succeeded: HDF5 is closed (its files, its memory) */
    TOOL_END_FAILED,      /* it failed, maybe inside HDF5: HDF5 is left as it is */
    TOOL_END_THREADS_LEFT /* a thread is still inside a call: stdout and stderr are flushed and
                             the process ends at once (_exit), without exit handlers */
} tool_end;

/* First thing in main, before any HDF5 call: HDF5 will not register its exit handler. */
void tool_exit_begin(void);
/* What main returns (status), after ending as `how` says; TOOL_END_THREADS_LEFT does not
 * return. */
int tool_exit(int status, tool_end how);

#endif

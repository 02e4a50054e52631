/* tool_exit.c: the tools end without HDF5's exit handler, which can crash after a failed write
 * or wait forever for a thread stuck in HDF5; HDF5 is closed only after a run that left it
 * sound. */
#define _POSIX_C_SOURCE 200809L // _exit

#include "tool_exit.h"

#include <hdf5.h>
#include <stdio.h>
#include <unistd.h> // defines: _exit

void tool_exit_begin(void) {
    H5dont_atexit();
}

int tool_exit(int status, tool_end how) {
    if (how == TOOL_END_CLEAN) H5close();
    if (how == TOOL_END_THREADS_LEFT) {
        fflush(stdout);
        fflush(stderr);
        _exit(status);
    }
    return status;
}

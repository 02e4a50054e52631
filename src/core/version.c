/* version.c: the library's version string, as CMake configured it. */
#include "fsdp/fsdp.h"

const char *fsdp_version(void) {
    return FSDP_VERSION;
}

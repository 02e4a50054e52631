/* version.c: the library's version string, from the generated fsdp/version.h. */
#include "fsdp/version.h"

const char *fsdp_version(void) {
    return FSDP_VERSION_STRING;
}

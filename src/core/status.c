/* status.c: names of the status codes. */
#include "fsdp/status.h"

const char *fsdp_status_to_string(fsdp_status status) {
    static const char *const names[FSDP_STATUS_COUNT] = {
        [FSDP_OK] = "FSDP_OK",
        [FSDP_ERR_INVALID_ARGUMENT] = "FSDP_ERR_INVALID_ARGUMENT",
        [FSDP_ERR_SHAPE] = "FSDP_ERR_SHAPE",
        [FSDP_ERR_DTYPE] = "FSDP_ERR_DTYPE",
        [FSDP_ERR_DEVICE] = "FSDP_ERR_DEVICE",
        [FSDP_ERR_OUT_OF_MEMORY] = "FSDP_ERR_OUT_OF_MEMORY",
        [FSDP_ERR_IO] = "FSDP_ERR_IO",
        [FSDP_ERR_CONFIG] = "FSDP_ERR_CONFIG",
        [FSDP_ERR_NOT_FOUND] = "FSDP_ERR_NOT_FOUND",
        [FSDP_ERR_STATE] = "FSDP_ERR_STATE",
        [FSDP_ERR_UNSUPPORTED] = "FSDP_ERR_UNSUPPORTED",
        [FSDP_ERR_COMM] = "FSDP_ERR_COMM",
        [FSDP_ERR_TIMEOUT] = "FSDP_ERR_TIMEOUT",
        [FSDP_ERR_INTERNAL] = "FSDP_ERR_INTERNAL",
    };
    if ((int)status < 0 || status >= FSDP_STATUS_COUNT) return "FSDP_ERR_UNKNOWN";
    return names[status];
}

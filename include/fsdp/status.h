/* status.h: the status codes every public libfsdp function returns.
 * A failing call also leaves a readable message in its context: fsdp_last_error(ctx). */
#ifndef FSDP_STATUS_H
#define FSDP_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_status {
    FSDP_OK = 0,
    FSDP_ERR_INVALID_ARGUMENT, /* a caller passed a value outside what the function accepts */
    FSDP_ERR_SHAPE,            /* tensor shapes do not fit together */
    FSDP_ERR_DTYPE,            /* a dtype the operation does not support */
    FSDP_ERR_DEVICE,           /* wrong device, or a device this build or machine lacks */
    FSDP_ERR_OUT_OF_MEMORY,
    FSDP_ERR_IO,          /* a file could not be read or written */
    FSDP_ERR_CONFIG,      /* a configuration file or option is wrong */
    FSDP_ERR_NOT_FOUND,   /* a name (module, parameter, key) does not exist */
    FSDP_ERR_STATE,       /* the call is not allowed in the current state */
    FSDP_ERR_UNSUPPORTED, /* valid, but not supported by this build */
    FSDP_ERR_COMM,        /* a collective failed */
    FSDP_ERR_TIMEOUT,     /* a collective waited longer than the configured timeout */
    FSDP_ERR_INTERNAL,    /* a broken invariant inside libfsdp: please report it */
    FSDP_STATUS_COUNT
} fsdp_status;

/* A short fixed name for the status ("FSDP_ERR_SHAPE"); never NULL. */
const char *fsdp_status_to_string(fsdp_status status);

#ifdef __cplusplus
}
#endif
#endif

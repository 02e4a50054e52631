/* fsdp.h: the whole public API of libfsdp in one include. */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#define FSDP_VERSION_MAJOR  0
#define FSDP_VERSION_MINOR  1
#define FSDP_VERSION_PATCH  0
#define FSDP_VERSION_STRING "0.1.0"

#include "fsdp/comm.h"
#include "fsdp/ctx.h"
#include "fsdp/cuda.h"
#include "fsdp/layers.h"
#include "fsdp/loss.h"
#include "fsdp/models.h"
#include "fsdp/module.h"
#include "fsdp/optim.h"
#include "fsdp/replicate.h"
#include "fsdp/rng.h"
#include "fsdp/status.h"
#include "fsdp/tensor.h"
#include "fsdp/tp.h"
#include "fsdp/wrap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, "major.minor.patch", as built. */
const char *fsdp_version(void);

#ifdef __cplusplus
}
#endif
#endif

/* fsdp.h: the whole public API of libfsdp in one include. */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#include "fsdp/ckpt.h"
#include "fsdp/comm.h"
#include "fsdp/comm_hook.h"
#include "fsdp/ctx.h"
#include "fsdp/cuda.h"
#include "fsdp/layers.h"
#include "fsdp/llama.h"
#include "fsdp/loss.h"
#include "fsdp/models.h"
#include "fsdp/module.h"
#include "fsdp/optim.h"
#include "fsdp/profile.h"
#include "fsdp/replicate.h"
#include "fsdp/rng.h"
#include "fsdp/status.h"
#include "fsdp/tensor.h"
#include "fsdp/tp.h"
#include "fsdp/version.h" /* generated: FSDP_VERSION_*, fsdp_version */
#include "fsdp/wrap.h"

#endif

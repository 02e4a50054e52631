/* flat.h: what the layers above FSDP (the optimizers) may ask about its flat-parameter
 * modules, the ones fsdp_sharded_flat_params hands out. Recognised by their ops, not by the kind
 * name they print ("FlatParams"). */
#ifndef FSDP_DP_FLAT_H
#define FSDP_DP_FLAT_H

#include <stdbool.h>

#include "fsdp/module.h"
#include "fsdp/wrap.h"

/* The ops of those modules (flat_module.c; units.c makes the modules with them). */
const fsdp_module_ops *fsdp_flat_params_ops(void);
/* Whether m is one of FSDP's flat-parameter modules: fsdp_sharded_flat_params(sh) or, with
 * use_orig_params, a module of the tree under it. */
bool fsdp_module_is_flat_params(const fsdp_module *m);
/* The FSDP state whose fsdp_sharded_flat_params(sh) m is, or NULL when m is not that module
 * (a module under it included). */
fsdp_sharded *fsdp_module_flat_params_owner(const fsdp_module *m);

/* Mixed precision with param_dtype bf16: the bf16 copy of the flat shard p, on p's device, which
 * an Adam or AdamW step writes in the same pass as p (the kernels' adam_update_bf16); the
 * unit's next gathers then take this rank's chunk from it instead of rounding p again, for as
 * long as nothing has written p since. *out is NULL where there is none: p is not a unit's
 * flat shard of fsdp_sharded_flat_params (use_orig_params hands out views instead), the
 * unit's param_dtype is not bf16, its parameters are offloaded to the host. Made (one bf16
 * shard, half the f32 shard's bytes) at the first call for p; FSDP owns it. */
fsdp_status fsdp_flat_low_copy(fsdp_ctx *ctx, fsdp_param *p, fsdp_bf16 **out);
/* After a step wrote p and *out of fsdp_flat_low_copy in one pass: the copy holds p's values
 * rounded as they stand now. Call it after the step's last access to p's data. */
void fsdp_flat_low_copy_written(fsdp_param *p);

#endif

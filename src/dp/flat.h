/* flat.h: what the layers above FSDP (the optimizers) may ask about its flat-parameter
 * modules, the ones fsdp_sharded_flat_params hands out. Recognised by their ops, not by the kind
 * name they print ("FlatParams"). */
#ifndef FSDP_DP_FLAT_H
#define FSDP_DP_FLAT_H

#include <stdbool.h>

#include "fsdp/module.h"
#include "fsdp/wrap.h"

/* Whether m is one of FSDP's flat-parameter modules: fsdp_sharded_flat_params(sh) or, with
 * use_orig_params, a module of the tree under it. */
bool fsdp_module_is_flat_params(const fsdp_module *m);
/* The FSDP state whose fsdp_sharded_flat_params(sh) m is, or NULL when m is not that module
 * (a module under it included). */
fsdp_sharded *fsdp_module_flat_params_owner(const fsdp_module *m);

#endif

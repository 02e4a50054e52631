/* train_plan.h: the plans over module names of the kinds made of Linear layers (kind_mlp.c,
 * ...): tensor parallelism by [model] tp_plan and activation checkpointing by [model]
 * checkpoint_activations, checked against the module tree the kind builds (train_kind.h). */
#ifndef FSDP_TOOLS_TRAIN_PLAN_H
#define FSDP_TOOLS_TRAIN_PLAN_H

#include "train_kind.h" // defines: train_kind

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_MAX_PLAN_LINEAR 4096 /* Linear layers a tp_plan styles */

/* The modules of the model cfg describes, walked from the tree kind->build(shape_only) makes:
 * every module under the root in pre-order (train_module_info), into m (at most max). Returns
 * their number (all of them, also past max), or -1 when the model cannot be built. */
int train_plan_modules(const train_kind *kind, const train_config *cfg, train_module_info *m,
                       int max);

/* The style of each Linear layer (styles[i] for Linear i in the module tree's pre-order, at
 * least TRAIN_MAX_PLAN_LINEAR entries) under [model] tp_plan, as train_config_tp_plan says;
 * *n_linear: the Linear layers of the model. */
fsdp_status train_plan_styles(const train_kind *kind, const train_config *cfg,
                              train_tp_style *styles, int *n_linear, char *err, size_t err_size);
/* The same, into the first n entries of styles (TRAIN_TP_NONE past the Linear layers). */
fsdp_status train_plan_styles_list(const train_kind *kind, const train_config *cfg,
                                   train_tp_style *styles, int n, char *err, size_t err_size);

/* Tensor parallelism over tp by those styles, the Linear layers walked from the built model
 * and named by their paths in it. */
fsdp_status train_plan_apply(fsdp_ctx *ctx, const train_config *cfg, fsdp_module *model,
                             const fsdp_mesh *tp);

/* Every [model] checkpoint_activations pattern matches a module the kind offers
 * (kind->checkpointable on its module tree); FSDP_ERR_CONFIG naming the pattern and the modules
 * when not. */
fsdp_status train_plan_check_checkpointing(const train_kind *kind, const train_config *cfg,
                                           char *err, size_t err_size);

/* fsdp_checkpoint_wrap on every module the kind offers that a pattern matches. */
fsdp_status train_plan_checkpoint(fsdp_ctx *ctx, const train_kind *kind, const train_config *cfg,
                                  fsdp_module *model);

#ifdef __cplusplus
}
#endif
#endif

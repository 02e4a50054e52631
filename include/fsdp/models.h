/* models.h: the models of the seed scenarios, with the module and parameter names PyTorch
 * gives them, and a general MLP for the trainer. Each constructor returns a root module the
 * caller owns, initialised with fsdp_module_reset_parameters(ctx, m, fsdp_ctx_seed(ctx)). */
#ifndef FSDP_MODELS_H
#define FSDP_MODELS_H

#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MLPModule: net1 Linear(10, 16), relu, net2 Linear(16, 10). */
fsdp_status fsdp_model_mlp_module(fsdp_ctx *ctx, fsdp_module **out);
/* MLPStacked: layers.0 ... layers.<n_layers-1>, each an MLPModule. */
fsdp_status fsdp_model_mlp_stacked(fsdp_ctx *ctx, int n_layers, fsdp_module **out);
/* SimpleMLP: net1 Linear(50, 32), relu, net2 Linear(32, 8), then sigmoid (not a module). */
fsdp_status fsdp_model_simple_mlp(fsdp_ctx *ctx, fsdp_module **out);
/* SimpleModel: net1 Linear(5, 8), relu, net2 Linear(8, 4), net3 Linear(4, 12). */
fsdp_status fsdp_model_simple_model(fsdp_ctx *ctx, fsdp_module **out);
/* Net: fc1 ... fc4, each Linear(dim, dim); the seed uses dim = 2000. */
fsdp_status fsdp_model_net(fsdp_ctx *ctx, int64_t dim, fsdp_module **out);

typedef enum fsdp_activation {
    FSDP_ACT_RELU = 0,
    FSDP_ACT_GELU,
    FSDP_ACT_SIGMOID,
    FSDP_ACT_NONE
} fsdp_activation;

const char *fsdp_activation_to_string(fsdp_activation act);
fsdp_status fsdp_activation_parse(const char *text, fsdp_activation *out);

/* A Sequential MLP over widths[0] -> widths[1] -> ... -> widths[n_widths-1] (n_widths >= 2):
 * Linear layers with `act` between them (not after the last), named as nn.Sequential names
 * them ("0", "1", ...). */
fsdp_status fsdp_model_mlp(fsdp_ctx *ctx, int n_widths, const int64_t *widths, fsdp_activation act,
                           fsdp_module **out);

#ifdef __cplusplus
}
#endif
#endif

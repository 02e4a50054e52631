/* module_impl.h: the bodies of fsdp_module and fsdp_param, read only inside src/nn. Other
 * layers (TP, FSDP, optimizers) use the functions of nn/nn.h. */
#ifndef FSDP_NN_MODULE_IMPL_H
#define FSDP_NN_MODULE_IMPL_H

#include "fsdp/module.h"
#include "nn/nn.h"

struct fsdp_param {
    char *name;          /* local name: "weight" */
    fsdp_module *module; /* owner */
    fsdp_tensor *data;   /* local values: the whole tensor, a TP shard, or a flat-buffer view */
    fsdp_tensor *grad;   /* same shape as data; backward accumulates into it */
    bool requires_grad;
    /* A hook applies this parameter and accumulates its gradient, so the layer leaves it out
     * (TP: a RowwiseParallel bias, added once to the Partial sum, not once per rank). */
    bool hook_applied;
    fsdp_init init;
    void *dist;                /* placement spec set by tensor parallelism; NULL when plain */
    void (*free_dist)(void *); /* (optional) releases dist */
    const char *manager;       /* a wrapper that holds the values elsewhere (FSDP); NULL */
};

typedef struct fsdp_buffer {
    char *name;
    fsdp_tensor *data;
    fsdp_init init;
} fsdp_buffer;

typedef struct fsdp_hook {
    int id;
    fsdp_hook_fn fn;
    void *user;
    void (*free_user)(void *);
} fsdp_hook;

struct fsdp_module {
    const fsdp_module_ops *ops;
    void *impl;
    char *name; /* "" until added to a parent */
    char *fqn;  /* "" for a root */
    fsdp_module *parent;
    fsdp_module **children;
    int n_children, cap_children;
    fsdp_param **params;
    int n_params, cap_params;
    fsdp_buffer *buffers;
    int n_buffers, cap_buffers;
    fsdp_hook *hooks[FSDP_HOOK_POINT_COUNT];
    int n_hooks[FSDP_HOOK_POINT_COUNT], cap_hooks[FSDP_HOOK_POINT_COUNT];
    int next_hook_id;
};

/* Makes *t a tensor of the given shape on `device`, reusing its storage when large enough:
 * the way layers keep activation buffers without allocating in steady state. */
fsdp_status fsdp_nn_buffer(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_device device, int ndim,
                           const int64_t *shape);

/* Checks that a layer's input is f32 with `features` in its last dim; names the module. */
fsdp_status fsdp_nn_check_input(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *in,
                                int64_t features);

/* Runs children[0..n) forward, each on the previous one's output (containers use this). */
fsdp_status fsdp_nn_chain_forward(fsdp_ctx *ctx, fsdp_module *const *children, int n,
                                  const fsdp_tensor *in, const fsdp_tensor **out);
/* Runs children[0..n) backward in reverse; the first child's input gradient only if din. */
fsdp_status fsdp_nn_chain_backward(fsdp_ctx *ctx, fsdp_module *const *children, int n,
                                   const fsdp_tensor *dout, const fsdp_tensor **din);

#endif

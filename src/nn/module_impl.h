/* module_impl.h: the bodies of fsdp_module and fsdp_param, read only inside src/nn. Other
 * layers (TP, FSDP, optimizers) use the functions of nn/nn.h. */
#ifndef FSDP_NN_MODULE_IMPL_H
#define FSDP_NN_MODULE_IMPL_H

#include "core/tensor_impl.h" // defines: fsdp_tensor_stamp
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
    /* The bf16 mirror of data (mirror.c; a Linear under the bf16 policy registers it), owned:
     * current while mirror_stamp (data's, when the mirror was written) holds. */
    fsdp_tensor *mirror;
    fsdp_tensor_stamp mirror_stamp;
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
    bool observer; /* fsdp_module_add_observer: reads, never replaces */
} fsdp_hook;

/* Where a checkpointed module stands between its forward and backward. */
typedef enum fsdp_ckpt_state {
    FSDP_CKPT_LIVE = 0, /* its activations are held (a plain run, or recomputed) */
    FSDP_CKPT_SAVED,    /* released after forward: backward re-runs the forward first */
    FSDP_CKPT_DONE,     /* released after backward: the next backward needs a forward */
} fsdp_ckpt_state;

/* How a wrapped module runs (checkpoint.c fills one): module.c calls through it, so it needs
 * no name of the wrapper's file. */
typedef struct fsdp_nn_wrapper_i {
    fsdp_status (*forward)(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                           const fsdp_tensor **out);
    fsdp_status (*backward)(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                            const fsdp_tensor **din);
    void (*release)(fsdp_module *m); /* frees what the wrapper holds, when m is freed */
} fsdp_nn_wrapper_i;

typedef struct fsdp_ckpt {
    const fsdp_nn_wrapper_i *iface; /* set by fsdp_checkpoint_wrap; NULL: a plain module */
    fsdp_ckpt_state state;
    const fsdp_tensor *input; /* the forward's input, kept (not owned) for the recompute */
    fsdp_tensor *output;      /* a copy of the output when it was one of the released buffers */
} fsdp_ckpt;

struct fsdp_module {
    const fsdp_module_ops *ops;
    void *impl;
    char *name; /* "" until added to a parent */
    char *fqn;  /* "" for a root */
    fsdp_module *parent;
    fsdp_module **children;
    int n_children;
    int64_t cap_children;
    fsdp_param **params;
    int n_params;
    int64_t cap_params;
    fsdp_buffer *buffers;
    int n_buffers;
    int64_t cap_buffers;
    fsdp_hook *hooks[FSDP_HOOK_POINT_COUNT];
    int n_hooks[FSDP_HOOK_POINT_COUNT];
    int64_t cap_hooks[FSDP_HOOK_POINT_COUNT];
    int next_hook_id;
    /* The buffers this module's own forward made with fsdp_nn_buffer (its activations: outputs
     * and what it saves for backward). Handles only: the kind's impl owns them. */
    fsdp_tensor **acts;
    int n_acts;
    int64_t cap_acts;
    fsdp_ckpt ckpt; /* activation checkpointing (checkpoint.c) */
    /* The children its kind declares read its input (fsdp_nn_set_input_readers). */
    fsdp_module *input_readers[FSDP_NN_MAX_INPUT_READERS];
    int n_input_readers;
};

/* Makes *t a tensor of the given shape on `device`, reusing its storage when large enough
 * and on that device (a buffer left on another one by fsdp_module_to gets new storage there):
 * the way layers keep activation buffers without allocating in steady state. Its elements are
 * unspecified (what the last forward left, or new memory not zeroed: fsdp_tensor_create_uninit,
 * a NaN pattern on sim), so a layer writes every element before it reads any, or fills it. */
fsdp_status fsdp_nn_buffer(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_device device, int ndim,
                           const int64_t *shape);
/* fsdp_nn_buffer of another dtype (a buffer keeps the dtype it was made with). */
fsdp_status fsdp_nn_buffer_dtype(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_dtype dtype,
                                 fsdp_device device, int ndim, const int64_t *shape);

/* What a wrapper (ckpt.iface) runs: run_forward is the plain forward with its hooks
 * (post-forward hooks only when post_hooks), run_backward the plain backward. */
fsdp_status fsdp_nn_run_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out, bool post_hooks);
fsdp_status fsdp_nn_run_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din);
/* Records t as an activation of the module whose forward runs (nothing outside a forward). */
fsdp_status fsdp_nn_record_activation(fsdp_ctx *ctx, fsdp_tensor *t);

/* Checks that a layer's input is f32 with `features` in its last dim; names the module. */
fsdp_status fsdp_nn_check_input(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *in,
                                int64_t features);
/* The same, where the layer also takes a bf16 input when allow_bf16 (a Linear under the bf16
 * compute policy). */
fsdp_status fsdp_nn_check_input_bf16(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *in,
                                     int64_t features, bool allow_bf16);

/* Runs children[0..n) forward, each on the previous one's output (containers use this). */
fsdp_status fsdp_nn_chain_forward(fsdp_ctx *ctx, fsdp_module *const *children, int n,
                                  const fsdp_tensor *in, const fsdp_tensor **out);
/* Runs children[0..n) backward in reverse; the first child's input gradient only if din. */
fsdp_status fsdp_nn_chain_backward(fsdp_ctx *ctx, fsdp_module *const *children, int n,
                                   const fsdp_tensor *dout, const fsdp_tensor **din);

/* A layer's bf16 copy of p under the bf16 policy (mirror.c): *mirror is p's mirror, made or
 * remade to p's data's shape and device, and *current whether it holds p's values rounded (then
 * the layer reads it as is; else it rounds p into it and calls fsdp_nn_param_mirror_written).
 * NULL when p may carry none (FSDP manages it, or the test switch is off): the layer keeps its
 * own copy. */
fsdp_status fsdp_nn_param_mirror(fsdp_ctx *ctx, fsdp_param *p, fsdp_tensor **mirror, bool *current);
/* Tests only: off, no parameter carries a mirror (every layer rounds its own copy each forward,
 * the path before mirrors); the forwards that found a mirror current and that rounded, since the
 * last reset. */
void fsdp_nn_test_param_mirror(bool on);
void fsdp_nn_test_param_mirror_counts(int64_t *used, int64_t *rounded, bool reset);

#endif

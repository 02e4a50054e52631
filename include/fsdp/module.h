/* module.h: the module tree. A module has a name, children, parameters and buffers, an
 * explicit forward and backward, and four hook points where tensor parallelism and FSDP
 * attach. There is no general autograd: backward runs the modules in reverse and each one
 * accumulates (+=) its parameter gradients and writes the gradient of its input.
 *
 * Ownership: a module owns its parameters, buffers, children (added with
 * fsdp_module_add_child) and the output and input-gradient buffers it hands back. Those
 * buffers stay valid until the module's next forward (output) or backward (input gradient),
 * or until it is freed; copy them to keep them longer. A module keeps a pointer to its
 * forward input for backward: the input must stay alive and unchanged until then. */
#ifndef FSDP_MODULE_H
#define FSDP_MODULE_H

#include <stdbool.h>

#include "fsdp/rng.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_module fsdp_module;
typedef struct fsdp_param fsdp_param;

/* What a module kind implements. Module authors fill one static instance. */
typedef struct fsdp_module_ops {
    const char *kind; /* "Linear", "Sequential", ... */
    /* Computes this module's output from `in`; *out is a buffer the module owns. */
    fsdp_status (*forward)(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                           const fsdp_tensor **out);
    /* Given the gradient of the last output, accumulates parameter gradients and, when din
     * is not NULL, sets *din to the gradient of the last input (a buffer the module owns).
     * din == NULL means nobody needs the input gradient: skip computing it. */
    fsdp_status (*backward)(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                            const fsdp_tensor **din);
    void (*free_impl)(void *impl); /* (optional) releases the impl pointer */
} fsdp_module_ops;

/* Creates a module of a kind described by ops; impl is the kind's private state, owned by the
 * module from now on (released with ops->free_impl; a call that fails releases it too, unless
 * ops itself is NULL). The module has no name until it is added to a parent; a root module's
 * name is "". */
fsdp_status fsdp_module_create(fsdp_ctx *ctx, const fsdp_module_ops *ops, void *impl,
                               fsdp_module **out);
/* Frees the module, its subtree, hooks, parameters and buffers. NULL does nothing. Do not
 * free a module that has a parent: free the root. */
void fsdp_module_free(fsdp_module *m);

void *fsdp_module_impl(const fsdp_module *m);
const char *fsdp_module_kind(const fsdp_module *m);
const char *fsdp_module_name(const fsdp_module *m);
/* Fully qualified name from the root: "layers.0.net1" ("" for the root). */
const char *fsdp_module_fqn(const fsdp_module *m);
fsdp_module *fsdp_module_parent(const fsdp_module *m);

/* Adds child under `name` (unique among m's children; letters, digits and '_', no '.').
 * m takes ownership of child, also on failure, except when the call is refused for a NULL
 * argument (nothing changes) or because child is already in a tree: it has a parent, or it is
 * m or an ancestor of m (a module cannot be its own descendant; FSDP_ERR_INVALID_ARGUMENT). */
fsdp_status fsdp_module_add_child(fsdp_ctx *ctx, fsdp_module *m, const char *name,
                                  fsdp_module *child);
int fsdp_module_num_children(const fsdp_module *m);
fsdp_module *fsdp_module_child(const fsdp_module *m, int i);
/* The descendant at a dotted path relative to m ("layers.0.net1"; "" is m), or NULL. */
fsdp_module *fsdp_module_find(const fsdp_module *m, const char *path);

/* Registers a parameter of the given shape, f32 on the ctx's CPU, filled by `init` with the
 * stream of its fully qualified name (see fsdp_module_reset_parameters). Its gradient is
 * allocated zeroed. *out (may be NULL) stays owned by m. */
fsdp_status fsdp_module_add_param(fsdp_ctx *ctx, fsdp_module *m, const char *name, int ndim,
                                  const int64_t *shape, fsdp_init init, fsdp_param **out);
/* Registers a buffer: state that is not trained (no gradient). *out stays owned by m. */
fsdp_status fsdp_module_add_buffer(fsdp_ctx *ctx, fsdp_module *m, const char *name, int ndim,
                                   const int64_t *shape, fsdp_init init, fsdp_tensor **out);
int fsdp_module_num_params(const fsdp_module *m); /* m's own, in registration order */
fsdp_param *fsdp_module_param(const fsdp_module *m, int i);
int fsdp_module_num_buffers(const fsdp_module *m);
fsdp_tensor *fsdp_module_buffer(const fsdp_module *m, int i);
const char *fsdp_module_buffer_name(const fsdp_module *m, int i);
/* The parameter at a dotted path relative to m ("net1.weight"), or NULL. */
fsdp_param *fsdp_module_get_param(const fsdp_module *m, const char *path);

const char *fsdp_param_name(const fsdp_param *p); /* local name: "weight" */
fsdp_module *fsdp_param_module(const fsdp_param *p);
fsdp_tensor *fsdp_param_data(const fsdp_param *p);
fsdp_tensor *fsdp_param_grad(const fsdp_param *p);
bool fsdp_param_requires_grad(const fsdp_param *p);
void fsdp_param_set_requires_grad(fsdp_param *p, bool requires_grad);
const fsdp_init *fsdp_param_init(const fsdp_param *p);

/* Visits m and its descendants in pre-order (a module before its children, children in
 * registration order). A non-OK return from fn stops the walk and is returned. */
typedef fsdp_status (*fsdp_module_visit_fn)(fsdp_ctx *ctx, fsdp_module *m, void *user);
fsdp_status fsdp_module_visit(fsdp_ctx *ctx, fsdp_module *m, fsdp_module_visit_fn fn, void *user);
/* Visits every parameter of the subtree in the order PyTorch's named_parameters() gives:
 * pre-order over modules, registration order within one. `name` is relative to m. */
typedef fsdp_status (*fsdp_param_visit_fn)(fsdp_ctx *ctx, fsdp_param *p, const char *name,
                                           void *user);
fsdp_status fsdp_module_visit_params(fsdp_ctx *ctx, fsdp_module *m, fsdp_param_visit_fn fn,
                                     void *user);
int64_t fsdp_module_param_count(const fsdp_module *m); /* elements, whole subtree */

/* Re-initialises every parameter and buffer of the subtree from `seed`: each one is drawn
 * with its own init rule from the stream of its fully qualified name, so the values depend
 * on the model and seed only, not on how the tree was built or will be sharded. */
fsdp_status fsdp_module_reset_parameters(fsdp_ctx *ctx, fsdp_module *m, uint64_t seed);
/* Sets every parameter gradient of the subtree to zero. A parameter FSDP keeps in its flat
 * shards is refused (FSDP_ERR_STATE, nothing zeroed): zero what the optimizer steps
 * (fsdp_optimizer_zero_grad, or this function on fsdp_sharded_flat_params(sh)). */
fsdp_status fsdp_module_zero_grad(fsdp_ctx *ctx, fsdp_module *m);
/* Moves every parameter, gradient and buffer of the subtree to `device` (PyTorch's
 * `model.to(device)`): the parameter handles stay the same, their memory moves. Call it after
 * building (and initialising) the model and before tensor parallelism, FSDP or replicate wrap
 * it or hooks are added: a subtree with hooks, tensor-parallel or FSDP-managed parameters is
 * refused with FSDP_ERR_STATE before anything moves. Inputs must then be on `device` too. If a
 * copy fails midway (out of device memory), the tensors moved so far stay moved. */
fsdp_status fsdp_module_to(fsdp_ctx *ctx, fsdp_module *m, fsdp_device device);

/* Runs m's forward (with its hooks): *out is owned by the module (or by a hook). */
fsdp_status fsdp_module_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out);
/* Runs m's backward (with its hooks) for the output of its last forward. Pass din = NULL
 * when the input gradient is not needed (a model's input): it is then not computed, and
 * containers skip it for their first child too. */
fsdp_status fsdp_module_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din);

/* Activation checkpointing: PyTorch's checkpoint_wrapper (non-reentrant checkpoint) applied to
 * m in place (names and parameters unchanged). m's forward runs as before, then the memory of
 * every activation its subtree made (layers' outputs and what they keep for backward) is
 * released; m keeps a pointer to its input (which, as for every module, must stay alive and
 * unchanged until backward) and its output (copied when it was one of the released buffers).
 * m's backward first re-runs m's pre-forward hooks and forward from that input, recreating the
 * activations bitwise (no layer draws random numbers in forward; a layer that did would have to
 * draw from counters of the step so the re-run replays them), then runs its backward as usual
 * and releases them again. m's post-forward hooks are not re-run: backward does not use their
 * output. Collectives: hooks inside m run again in the recompute, so TP input redistributions
 * within m repeat; FSDP gathers nothing extra (a unit inside m, or m itself, gathered in the
 * recompute is kept for the backward that follows instead of being gathered again there).
 * Works with FSDP units, replicate and TP on m or around it. A checkpointed module nested in
 * another is recomputed as a plain module inside the outer one's recompute. The cost: one more
 * forward of m per step, and its buffers are allocated again each step. Refused
 * (FSDP_ERR_STATE) inside a forward or backward, or when m is checkpointed already. */
fsdp_status fsdp_checkpoint_wrap(fsdp_ctx *ctx, fsdp_module *m);

/* The bytes of activation memory m's subtree holds now: every buffer its layers made in
 * forward (through the module layer's buffers) that still has memory, plus the output copies
 * of checkpointed modules. Right after a forward this is what is kept for backward. Not
 * counted: the model input (the caller's), input-gradient and other backward buffers, and
 * tensors hooks own (TP's redistributed activations). */
fsdp_status fsdp_module_activation_bytes(fsdp_ctx *ctx, const fsdp_module *m, int64_t *bytes);

/* Hooks. Each sees the tensor passing its point: the input (pre-forward), the output
 * (post-forward), the output gradient (pre-backward) or the input gradient (post-backward;
 * *io is NULL when it is not computed). A hook may replace that tensor by pointing *io at one it
 * owns, which must stay valid until the module's next call at the same point. Hooks at a point run
 * in the order they were added. */
typedef enum fsdp_hook_point {
    FSDP_HOOK_PRE_FORWARD = 0,
    FSDP_HOOK_POST_FORWARD,
    FSDP_HOOK_PRE_BACKWARD,
    FSDP_HOOK_POST_BACKWARD,
    FSDP_HOOK_POINT_COUNT
} fsdp_hook_point;

typedef fsdp_status (*fsdp_hook_fn)(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user);

/* Adds a hook; free_user (optional) releases user when the hook is removed or m freed.
 * *id (may be NULL) identifies the hook for fsdp_module_remove_hook. */
fsdp_status fsdp_module_add_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 fsdp_hook_fn fn, void *user, void (*free_user)(void *), int *id);
/* Adds an observer: a hook that reads and never changes, for timing and inspection (profilers,
 * bench_llama_gpu --breakdown). It runs in its point's order with the hooks, and a replacement it
 * makes of *io is ignored. A layer that keeps a tensor in a cheaper form when no hook would read
 * it as its consumers do (the Llama's bf16 storage under the bf16 compute policy) ignores
 * observers, so observing does not change what runs: *io may then be a bf16 tensor. Removed with
 * fsdp_module_remove_hook; arguments as fsdp_module_add_hook's. */
fsdp_status fsdp_module_add_observer(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                     fsdp_hook_fn fn, void *user, void (*free_user)(void *),
                                     int *id);
fsdp_status fsdp_module_remove_hook(fsdp_ctx *ctx, fsdp_module *m, int id);

#ifdef __cplusplus
}
#endif
#endif

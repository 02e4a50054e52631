/* nn.h: what the layers above nn (TP, FSDP, optimizers) may do to modules and parameters
 * beyond the public module.h: functions only; the struct bodies stay in nn/module_impl.h,
 * which only src/nn reads. */
#ifndef FSDP_NN_NN_H
#define FSDP_NN_NN_H

#include <stdbool.h>
#include <stddef.h>

#include "fsdp/module.h"

/* fsdp_module_add_hook, but the hook runs before those already at the point: FSDP's pre-hooks
 * run outside (before) TP's, so parameters are gathered before a style reads them. */
fsdp_status fsdp_nn_add_hook_front(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   fsdp_hook_fn fn, void *user, void (*free_user)(void *), int *id);
/* fsdp_module_remove_hook without a context, for teardown: false when m has no hook `id`. */
bool fsdp_nn_remove_hook(fsdp_module *m, int id);
/* Whether parameters and buffers added on ctx are filled at once (off) or left to the
 * fsdp_module_reset_parameters a model builder ends with (on); returns the previous setting. A
 * builder turns it on, adds its tree, restores it, then resets the tree: the values are those
 * of filling at once then resetting, each element drawn once instead of twice. */
bool fsdp_nn_defer_init(fsdp_ctx *ctx, bool on);
/* Whether m has a hook running fn at point: how a wrapper recognises its own hooks. */
bool fsdp_nn_has_hook(const fsdp_module *m, fsdp_hook_point point, fsdp_hook_fn fn);
/* How many of m's hooks at point may act on what passes (every hook but observers,
 * fsdp_module_add_observer): what a layer asks before keeping a tensor in a form a hook would
 * not read as its consumers do. */
int fsdp_nn_num_acting_hooks(const fsdp_module *m, fsdp_hook_point point);
/* How many of m's hooks at point run a function other than fn. */
int fsdp_nn_num_hooks_other_than(const fsdp_module *m, fsdp_hook_point point, fsdp_hook_fn fn);
/* The user pointer of m's first hook at point that runs fn, or NULL when it has none: how a
 * layer finds the state of its own hook on another module (a TP style on an ancestor). */
void *fsdp_nn_hook_user(const fsdp_module *m, fsdp_hook_point point, fsdp_hook_fn fn);

/* ---- who reads a module's input ---- */

#define FSDP_NN_MAX_INPUT_READERS 4
/* A kind declares (at build time) that its forward hands its input, as it came, to each of
 * readers[0..n) (children of m, n <= FSDP_NN_MAX_INPUT_READERS), once each; that nothing else
 * reads the input (not the module's own code, no other child); and that its backward's input
 * gradient is the plain sum of the readers' input gradients. LlamaAttention declares q_proj,
 * k_proj and v_proj; LlamaMLP gate_proj and up_proj. A layer above may then hand the readers an
 * input whose gradient it reduces once, after the sum (tensor parallelism: one reduce_scatter
 * of a Partial sum per block, docs/tp.md). n = 0 clears the declaration.
 * FSDP_ERR_INVALID_ARGUMENT for a reader that is not a child of m or is named twice. */
fsdp_status fsdp_nn_set_input_readers(fsdp_ctx *ctx, fsdp_module *m, fsdp_module *const *readers,
                                      int n);
/* m's declared readers (borrowed, *readers may be NULL when 0) and their count; 0 when m
 * declares none. */
int fsdp_nn_input_readers(const fsdp_module *m, fsdp_module *const **readers);

/* m's ops, the vtable of its kind: the layer that defines a kind recognises its modules by
 * comparing this with its own ops, never by the kind's name. */
const fsdp_module_ops *fsdp_nn_module_ops(const fsdp_module *m);

/* t (an input or output gradient, `what`) on parameter p's device, or FSDP_ERR_DEVICE naming
 * m (after "<style> on " when style is not NULL), both devices and fsdp_tensor_copy: the check
 * every module with parameters gets before its forward and backward, and TP's styles before
 * they redistribute an input. */
fsdp_status fsdp_nn_check_device(fsdp_ctx *ctx, const fsdp_module *m, const char *style,
                                 const fsdp_param *p, const fsdp_tensor *t, const char *what);

/* The module's name for messages, written into buf: "Linear 'net1'" or "Linear (root)". */
const char *fsdp_nn_describe(const fsdp_module *m, char *buf, size_t size);

/* The placement spec tensor parallelism attached to p (NULL when plain). */
void *fsdp_nn_param_dist(const fsdp_param *p);
/* Replaces p's local values, gradient and spec (TP distributing it): the old tensors and spec
 * are freed; p takes data, grad and dist (released with free_dist, may be NULL). */
void fsdp_nn_param_replace(fsdp_param *p, fsdp_tensor *data, fsdp_tensor *grad, void *dist,
                           void (*free_dist)(void *));
/* Swaps p's gradient tensor for g and returns the previous one (a hook that collects the
 * gradient elsewhere for a while; swap it back after). */
fsdp_tensor *fsdp_nn_param_swap_grad(fsdp_param *p, fsdp_tensor *g);
/* A hook applies p and accumulates its gradient, so the layer leaves it out. */
void fsdp_nn_param_set_hook_applied(fsdp_param *p, bool on);

/* p's bf16 mirror (src/nn/mirror.c), for an optimizer that writes it in its update's pass:
 * the mirror's memory when p has one of its data's size on its device (and FSDP does not
 * manage p), marked not current; else NULL. After the update wrote p and that memory in one
 * pass, fsdp_nn_param_mirror_written records p's storage and write generation: the mirror is
 * current until anything takes a pointer to p's values again. */
fsdp_bf16 *fsdp_nn_param_mirror_target(fsdp_param *p);
void fsdp_nn_param_mirror_written(fsdp_param *p);

/* A wrapper that keeps p's values and gradient elsewhere (FSDP's flat shards) marks it with
 * the text that tells a user where to go instead ("FSDP: ..."); NULL clears the mark. A
 * managed parameter's gradient is not zeroed by fsdp_module_zero_grad (refused, naming this
 * text), optimizers refuse it, and TP refuses to distribute it. */
void fsdp_nn_param_set_manager(fsdp_param *p, const char *manager);
/* FSDP_ERR_STATE naming `what`, the first managed parameter of m's subtree and its manager's
 * advice when there is one; FSDP_OK otherwise. Nothing is changed. */
fsdp_status fsdp_nn_check_unmanaged(fsdp_ctx *ctx, fsdp_module *m, const char *what);

/* The parallel layers (FSDP, replicate, tensor parallelism) run on CPU tensors only in this
 * version. FSDP_ERR_DEVICE when a parameter, gradient or buffer of m's subtree is on another
 * device, naming it and its device: `who` names the call ("fsdp_fully_shard"), `layer` what
 * runs on the CPU only ("FSDP"), `before` what the model must be moved back before
 * ("wrapping it"). Nothing is changed. */
fsdp_status fsdp_nn_check_on_cpu(fsdp_ctx *ctx, fsdp_module *m, const char *who, const char *layer,
                                 const char *before);

/* The one device every parameter, gradient and buffer of m's subtree is on, in *device (the
 * CPU for a tree without tensors). FSDP_ERR_DEVICE when a tensor is on another device than the
 * first one met, naming both and the fix (who, layer and before as fsdp_nn_check_on_cpu's).
 * Nothing is changed. */
fsdp_status fsdp_nn_check_one_device(fsdp_ctx *ctx, fsdp_module *m, const char *who,
                                     const char *layer, const char *before, fsdp_device *device);

/* Whether m is a Linear (fsdp_linear_create). */
bool fsdp_nn_is_linear(const fsdp_module *m);
/* A Linear without bias whose weight is `weight`, a parameter another module owns and holds
 * (tied weights: Hugging Face's tie_word_embeddings, the output projection sharing the
 * embedding's (vocab, dim) table). The Linear has no parameter of its own: it reads weight's
 * values at each call (whatever tensor parallelism or FSDP put there) and accumulates its
 * gradient into weight's, after or before the owner's own use. The owner must outlive it (both
 * in one tree). */
fsdp_status fsdp_nn_linear_create_tied(fsdp_ctx *ctx, fsdp_param *weight, fsdp_module **out);
/* A Linear's weight: its own, or the tied one (then not among its parameters); NULL when m is
 * not a Linear. */
fsdp_param *fsdp_nn_linear_weight(const fsdp_module *m);
/* The compute dtype of Linear m's policy (fsdp_module_set_autocast): FSDP_DTYPE_BF16 when its
 * next forward reads bf16 inputs (it then also takes a bf16 input tensor as is), else
 * FSDP_DTYPE_F32 (also for a module that is not a Linear). */
fsdp_dtype fsdp_nn_linear_compute(const fsdp_module *m);
/* With on, Linear m's forwards under the bf16 compute policy give their output in a bf16 tensor
 * (the values they round to bf16 anyway, without an f32 copy) when m has no bias and the
 * device's table has gemm_bf16_round; otherwise, and outside the policy, an f32 tensor. For a
 * parent that reads it, around its own call (LlamaMLP's gate_proj and up_proj, LlamaAttention's
 * q_proj and k_proj: set on before, off after, so a direct call, as generation makes, gets f32).
 * Nothing for other modules. */
void fsdp_nn_linear_set_bf16_output(fsdp_module *m, bool on);
/* With on, RMSNorm m's forwards give their output in a bf16 tensor, each element the bits
 * f32_to_bf16 gives the f32 output, when the device's table has rmsnorm_forward_bf16; otherwise
 * an f32 tensor. For a parent whose readers round the output to bf16 anyway, around its own call
 * (LlamaDecoderLayer for projections under the bf16 compute policy, LlamaForCausalLM for lm_head:
 * set on before, off after, so a direct call, as generation makes, gets f32). Backward is the same
 * either way (it reads the input and 1/rms, not the output). Nothing for other modules. */
void fsdp_nn_rmsnorm_set_bf16_output(fsdp_module *m, bool on);
/* With dres (NULL: none), RMSNorm m's backwards that give an input gradient give dres + that
 * gradient instead (dres f32, shaped like the output gradient), in the backward's own pass (the
 * table's rmsnorm_backward_add: each element the bits of the plain backward then add; a table
 * without it runs those two). For a parent that sums the norm's input gradient with another
 * (LlamaDecoderLayer: the residual stream's), around its own call: set before, NULL after. Its
 * post-backward hooks then see the sum, so a parent asks only when m has no acting one
 * (fsdp_nn_num_acting_hooks; an observer sees the sum). Nothing for other modules. */
void fsdp_nn_rmsnorm_set_grad_residual(fsdp_module *m, const fsdp_tensor *dres);
/* Whether the LlamaDecoderLayers of m's subtree ask their norms for bf16 outputs when the
 * projections that read them run the bf16 compute policy, and a LlamaForCausalLM (the root of
 * fsdp_model_llama) its model.norm when lm_head does and no acting hook would see the bf16 tensor
 * (on: the default). Off gives the path before (f32 norm outputs that each projection rounds
 * into its own bf16 copy), with the same bits: for tests that compare the two. */
void fsdp_nn_llama_set_bf16_norms(fsdp_module *m, bool on);
/* Whether the LlamaDecoderLayers of m's subtree ask their attention and MLP for a bf16 output
 * (o_proj's and down_proj's, fsdp_nn_linear_can_give_bf16_output) and read it widened in their
 * residual adds (the table's add_bf16; on: the default). Off gives the path before (each of the
 * two Linears widens its bf16 values into an f32 output), with the same bits: for tests that
 * compare the two. */
void fsdp_nn_llama_set_bf16_branches(fsdp_module *m, bool on);
/* With on, Linear m expects a bf16 output gradient (bf16(dy), what its bf16 GEMMs read: the
 * Llama's lm_head with bf16 logits, whose loss writes one): a forward that gives a bf16 output
 * then allocates no bf16 scratch (y16, rows x max(out, in)) for rounding an f32 gradient; a
 * backward given an f32 gradient still works and allocates it then. Nothing for other modules. */
void fsdp_nn_linear_set_bf16_grad(fsdp_module *m, bool on);
/* Whether Linear m takes a bf16 output gradient (bf16(dy), what its bf16 GEMMs read) in the
 * backward of its last forward (next: of its next forward): that forward runs the bf16 compute
 * policy and m has no bias gradient to sum (which reads the f32 dy). false for other modules. */
bool fsdp_nn_linear_takes_bf16_grad(const fsdp_module *m, bool next);
/* Whether Linear m's next backward may leave its input gradient unrounded: m's last forward ran
 * the bf16 compute policy and m has no post-backward hook. A hook reads the input gradient as the
 * GPU writes it, in bf16 (tensor parallelism's ColwiseParallel all_reduces it there), so a Linear
 * with one rounds, unless its gradient is a Partial addend (fsdp_nn_linear_set_dx_partial: f32,
 * unrounded, for a parent that sums it in f32 too). false for other modules. */
bool fsdp_nn_linear_can_leave_dx_unrounded(const fsdp_module *m);
/* Whether Linear m, asked (fsdp_nn_linear_set_bf16_output), gives its output as a bf16 tensor for
 * a parent to pass on to a reader that widens it: m runs the bf16 compute policy, has no bias
 * and no post-forward hook. A hook reads the output as the module gives it (tensor parallelism's
 * RowwiseParallel reduces its Partial output there, which in bf16 would sum in bf16), so a
 * Linear with one keeps its f32 output. false for other modules. */
bool fsdp_nn_linear_can_give_bf16_output(const fsdp_module *m);
/* With on (and fsdp_nn_linear_can_leave_dx_unrounded), Linear m's backwards leave their input
 * gradient under the bf16 policy unrounded (gemm_bf16's f32 sums): for a parent that sums the
 * gradients of parallel branches with the table's add3_round_bf16, which rounds each as it reads
 * it (the same bits, one pass fewer). Set on before the call and off after, as
 * fsdp_nn_linear_set_bf16_output: a Linear used alone rounds. Nothing for other modules. */
void fsdp_nn_linear_set_dx_unrounded(fsdp_module *m, bool on);
/* With on, Linear m's input gradient is a Partial addend: each rank's part of a value that a
 * layer above sums over ranks after m's parent has added its readers' gradients (tensor
 * parallelism's one reduction per block). Under the bf16 policy it is then left in f32,
 * unrounded (never rounded nor bf16, whatever the parent asks): rounding an addend is not
 * rounding the sum, and would add one rounding per rank. Set on before m's backward and off
 * after (ColwiseParallel's pre- and post-backward hooks). Nothing for other modules. */
void fsdp_nn_linear_set_dx_partial(fsdp_module *m, bool on);
/* With on (under the same rule), Linear m's backwards under the bf16 policy give their input
 * gradient as a bf16 tensor written by gemm_bf16_round (each element the bits round_bf16 gives
 * the f32 one: what the rounded f32 gradient holds, in 2 bytes and no pass of its own), for a
 * parent that reads it in bf16 (LlamaAttention's attention on bf16 tensors, for o_proj). Set on
 * before the call and off after. Nothing for other modules. */
void fsdp_nn_linear_set_bf16_dx(fsdp_module *m, bool on);
/* Whether m is an Embedding (fsdp_embedding_create). */
bool fsdp_nn_is_embedding(const fsdp_module *m);
/* Embedding m's weight now holds the rows [start, start + its rows) of the vocabulary (TP's
 * RowwiseParallel has sharded it): forward looks up the tokens in that range and gives zero
 * rows for the others (this rank's addend of the whole lookup); backward adds only to its own
 * rows. Token ids are still checked against the whole vocabulary. CPU tensors only. */
fsdp_status fsdp_nn_embedding_shard_vocab(fsdp_ctx *ctx, fsdp_module *m, int64_t start);

#endif

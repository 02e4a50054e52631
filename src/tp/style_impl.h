/* style_impl.h: the state of one tensor-parallel style (its hooks in style.c, its setup in
 * style_apply.c) and the rule by which a PrepareModuleInput'd block reduces its readers' input
 * gradients once (block_sum.c). Internal to src/tp. */
#ifndef FSDP_TP_STYLE_IMPL_H
#define FSDP_TP_STYLE_IMPL_H

#include "nn/nn.h" // defines: FSDP_NN_MAX_INPUT_READERS
#include "tp/tp_impl.h"

/* One place where a tensor is redistributed every step: its buffers, and the DTensor handle
 * it hands on when the tensor leaves as a DTensor. */
typedef struct site {
    tp_work work;
    fsdp_tensor *buf;
    fsdp_dtensor *handle;
} site;

typedef struct style_state {
    fsdp_tp_style style; /* defaults filled in */
    const fsdp_mesh *mesh;
    fsdp_param *weight, *bias; /* Colwise/Rowwise: the Linear's (or the Embedding's weight) */
    bool embedding;            /* Rowwise on an Embedding: vocabulary-sharded table */
    /* The output leaves sharded as a local tensor into a plan with SequenceParallel, whose
     * styles take local shards as even (PyTorch's from_local): the sharded dim (the sequence)
     * must divide by the tp size (tp_style_apply's even_output). */
    bool even_output;
    site in_fwd, out_fwd, out_bwd, in_bwd;
    /* Forward's record for backward: the input as it came (placements and global shape),
     * whether it came as a DTensor, and the output as the op made it and as it left. */
    fsdp_dtensor_spec in_spec, op_out_spec, out_spec;
    bool in_was_dtensor, out_is_dtensor;
    /* SequenceParallel: parameters whose gradients backward collects in scratch, then
     * all_reduces (they are Partial when the input is sharded) and adds to the real ones. */
    fsdp_param **params;
    fsdp_tensor **scratch, **real;
    int n_params;
    /* One reduction per block (block_sum.c). PrepareModuleInput: how many times each of its
     * module's declared input readers took this forward's handle as a Colwise, whether a Colwise
     * not declared took it (stray), and whether the block's backward reduces the readers' Partial
     * input gradients once (partial, decided in its pre-backward). Colwise: the
     * PrepareModuleInput whose handle its last forward took (NULL: none). */
    int took[FSDP_NN_MAX_INPUT_READERS];
    bool stray, partial;
    struct style_state *taken_from;
} style_state;

void tp_style_state_free(void *p);

/* The four hooks a style installs (style.c). */
fsdp_status tp_style_pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user);
fsdp_status tp_style_post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                  const fsdp_tensor **io, void *user);
fsdp_status tp_style_pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                  const fsdp_tensor **io, void *user);
fsdp_status tp_style_post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   const fsdp_tensor **io, void *user);

/* ---- one reduction per block (block_sum.c; the rule is written there and in docs/tp.md) ---- */

/* PrepareModuleInput s's pre-forward: a new forward, nothing taken yet, no partial backward. */
void tp_block_sum_reset(style_state *s);
/* Colwise s on module m, pre-forward, given its input x as it arrived: records whether x is the
 * handle of a PrepareModuleInput on an ancestor of m, and on that one whether m is among its
 * module's declared readers. */
void tp_block_sum_take(style_state *s, fsdp_module *m, const fsdp_tensor *x);
/* PrepareModuleInput s on module m, pre-backward: decides s->partial from this forward's takes. */
void tp_block_sum_decide(style_state *s, fsdp_module *m);
/* Whether Colwise s leaves its input gradient local and Partial in this backward. */
bool tp_block_sum_partial(const style_state *s);

#endif

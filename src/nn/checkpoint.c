/* checkpoint.c: activation checkpointing (PyTorch's checkpoint_wrapper, non-reentrant): a
 * checkpointed module's forward releases the activations its subtree made, keeping its input
 * and output; its backward re-runs the forward from the kept input, then runs backward. Also
 * the accounting of activation bytes that shows what that saves. */
#include <stdlib.h>

#include "core/ctx_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "fsdp/module.h"
#include "nn/module_impl.h"

/* Frees the output copy (the module frees its activation list). */
static void checkpoint_release(fsdp_module *m) {
    fsdp_tensor_free(m->ckpt.output);
    m->ckpt.output = NULL;
}

/* Whether t is one of the activations recorded in m's subtree (other than m's own copy). */
static bool recorded_in(const fsdp_module *m, const fsdp_tensor *t) {
    for (int i = 0; i < m->n_acts; i++)
        if (m->acts[i] == t) return true;
    for (int i = 0; i < m->n_children; i++) {
        const fsdp_module *c = m->children[i];
        if (recorded_in(c, t) || c->ckpt.output == t) return true;
    }
    return false;
}

/* Frees the memory of every activation recorded in m's subtree, and of the output copies of
 * checkpointed descendants (m's own copy too when with_own). The handles stay. */
static void release_subtree(fsdp_module *m, bool with_own) {
    for (int i = 0; i < m->n_acts; i++) fsdp_tensor_release_storage(m->acts[i]);
    if (with_own && m->ckpt.output) fsdp_tensor_release_storage(m->ckpt.output);
    for (int i = 0; i < m->n_children; i++) release_subtree(m->children[i], true);
}

/* m->ckpt.output <- a copy of y (an enclosing checkpoint releases it with its subtree). */
static fsdp_status keep_output(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *y) {
    fsdp_tensor **o = &m->ckpt.output;
    if (*o && fsdp_tensor_dtype(*o) != fsdp_tensor_dtype(y)) {
        fsdp_tensor_free(*o);
        *o = NULL;
    }
    if (!*o || !fsdp_tensor_has_storage(*o) || fsdp_tensor_capacity(*o) < fsdp_tensor_numel(y)) {
        fsdp_tensor *fresh;
        FSDP_TRY_AT(ctx, fsdp_tensor_create_uninit(ctx, fsdp_tensor_dtype(y), fsdp_tensor_device(y),
                                                   fsdp_tensor_ndim(y), fsdp_tensor_shape(y),
                                                   &fresh)); // the copy below writes it whole
        if (*o) {
            fsdp_tensor_alias(*o, fresh);
            fsdp_tensor_free(fresh);
        } else {
            *o = fresh;
        }
    } else {
        FSDP_TRY_AT(ctx, fsdp_tensor_resize(ctx, *o, fsdp_tensor_ndim(y), fsdp_tensor_shape(y)));
    }
    return fsdp_tensor_copy(ctx, *o, y);
}

static fsdp_status checkpoint_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                      const fsdp_tensor **out) {
    const fsdp_tensor *y;
    FSDP_TRY_AT(ctx, fsdp_nn_run_forward(ctx, m, in, &y, true));
    if (ctx->recompute_depth > 0) {
        /* Inside an enclosing module's recompute: a plain forward, its backward follows. */
        m->ckpt.state = FSDP_CKPT_LIVE;
        *out = y;
        return FSDP_OK;
    }
    if (recorded_in(m, y)) {
        FSDP_TRY_AT(ctx, keep_output(ctx, m, y));
        y = m->ckpt.output;
    }
    release_subtree(m, false);
    m->ckpt.input = in;
    m->ckpt.state = FSDP_CKPT_SAVED;
    *out = y;
    return FSDP_OK;
}

static fsdp_status checkpoint_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                       const fsdp_tensor **din) {
    if (m->ckpt.state == FSDP_CKPT_DONE) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s is checkpointed and its backward already ran: its activations are "
                         "gone; run a forward before the next backward",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    if (m->ckpt.state == FSDP_CKPT_SAVED) {
        /* The recompute: pre-forward hooks and forward, as in the first forward (TP's input
         * redistribution included); no post-forward hooks, whose output backward does not
         * use (FSDP would reshard there). */
        const fsdp_tensor *y;
        ctx->recompute_depth++;
        fsdp_status st = fsdp_nn_run_forward(ctx, m, m->ckpt.input, &y, false);
        ctx->recompute_depth--;
        FSDP_TRY_AT(ctx, st);
    }
    fsdp_status st = fsdp_nn_run_backward(ctx, m, dout, din);
    if (st != FSDP_OK || ctx->recompute_depth > 0) return FSDP_PASS(ctx, st);
    release_subtree(m, true);
    m->ckpt.state = FSDP_CKPT_DONE;
    return FSDP_OK;
}

static const fsdp_nn_wrapper_i checkpoint_iface = {
    .forward = checkpoint_forward,
    .backward = checkpoint_backward,
    .release = checkpoint_release,
};

fsdp_status fsdp_checkpoint_wrap(fsdp_ctx *ctx, fsdp_module *m) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    char desc[160];
    if (ctx->phase != FSDP_PHASE_NONE)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_checkpoint_wrap(%s): called inside a forward or backward; wrap "
                         "modules before running the model",
                         fsdp_nn_describe(m, desc, sizeof desc));
    if (m->ckpt.iface)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_checkpoint_wrap: %s is checkpointed already; wrap it once",
                         fsdp_nn_describe(m, desc, sizeof desc));
    m->ckpt.iface = &checkpoint_iface;
    m->ckpt.state = FSDP_CKPT_LIVE;
    return FSDP_OK;
}

static int64_t held_bytes(const fsdp_tensor *t) {
    if (!t || !fsdp_tensor_has_storage(t)) return 0;
    return fsdp_tensor_capacity(t) * (int64_t)fsdp_dtype_size(fsdp_tensor_dtype(t));
}

static int64_t subtree_bytes(const fsdp_module *m) {
    int64_t n = held_bytes(m->ckpt.output);
    for (int i = 0; i < m->n_acts; i++) n += held_bytes(m->acts[i]);
    for (int i = 0; i < m->n_children; i++) n += subtree_bytes(m->children[i]);
    return n;
}

fsdp_status fsdp_module_activation_bytes(fsdp_ctx *ctx, const fsdp_module *m, int64_t *bytes) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, bytes);
    *bytes = subtree_bytes(m);
    return FSDP_OK;
}

/* block_sum.c: one reduction per PrepareModuleInput'd block, as PyTorch's autograd makes it.
 * When PrepareModuleInput hands its module a DTensor (use_local_output no) and every input reader
 * the module declares (fsdp_nn_set_input_readers: LlamaAttention's q, k and v, LlamaMLP's gate and
 * up) took that very handle, once, as a ColwiseParallel on the same mesh with a Replicate layout,
 * and no other ColwiseParallel took it, then the readers' input gradients stay local and Partial
 * (no collective), the module's backward sums them as it always does (Partial + Partial is
 * Partial), and PrepareModuleInput's post-backward moves that sum from Partial to its input
 * layout once (Shard(1): one reduce_scatter; Replicate: one all_reduce). In every other case
 * (no declaration, a reader without ColwiseParallel, another mesh, use_local_output yes, a reader
 * that took a copy) each ColwiseParallel all_reduces its own gradient, as before.
 *
 * Checked every forward: PrepareModuleInput's pre-forward resets the count, each Colwise's
 * pre-forward records what it took, and PrepareModuleInput's pre-backward decides, once for the
 * whole backward of its module, before any reader's backward. Deciding there (not in
 * post-forward) holds for a checkpoint's recompute: one of the decoder layer re-runs every hook
 * and decides again; one of the attention itself re-runs its pre-forward hooks but not its
 * post-forward ones; one of a single reader inside backward takes again after the decision and
 * changes nothing. */
#include "tp/style_impl.h"

void tp_block_sum_reset(style_state *s) {
    for (int i = 0; i < FSDP_NN_MAX_INPUT_READERS; i++) s->took[i] = 0;
    s->stray = false;
    s->partial = false;
}

/* The style state of module m when its style is `kind`, else NULL. */
static style_state *style_of(const fsdp_module *m, fsdp_tp_style_kind kind) {
    style_state *s = fsdp_nn_hook_user(m, FSDP_HOOK_PRE_FORWARD, tp_style_pre_forward);
    return s && s->style.kind == kind ? s : NULL;
}

void tp_block_sum_take(style_state *s, fsdp_module *m, const fsdp_tensor *x) {
    s->taken_from = NULL;
    const fsdp_dtensor *dt = fsdp_dtensor_of(x);
    if (!dt) return;
    for (fsdp_module *a = fsdp_module_parent(m); a; a = fsdp_module_parent(a)) {
        style_state *p = style_of(a, FSDP_TP_PREPARE_INPUT);
        if (!p || p->in_fwd.handle != dt) continue;
        fsdp_module *const *readers;
        int n = fsdp_nn_input_readers(a, &readers), i = 0;
        while (i < n && readers[i] != m) i++;
        bool replicate = dt->spec.placements[0].kind == FSDP_PLACEMENT_REPLICATE;
        if (i < n && p->mesh == s->mesh && replicate) {
            p->took[i]++;
            s->taken_from = p;
        } else {
            p->stray = true; /* it will all_reduce a whole gradient the block must not add */
        }
        return;
    }
}

void tp_block_sum_decide(style_state *s, fsdp_module *m) {
    fsdp_module *const *readers;
    int n = fsdp_nn_input_readers(m, &readers);
    bool ok = n > 0 && !s->stray && s->in_fwd.handle && s->style.use_local_output == FSDP_TP_NO &&
              s->style.desired_input_layouts.kind == FSDP_PLACEMENT_REPLICATE;
    for (int i = 0; ok && i < n; i++) {
        const style_state *r = style_of(readers[i], FSDP_TP_COLWISE);
        ok = r && r->taken_from == s && s->took[i] == 1;
    }
    s->partial = ok;
}

bool tp_block_sum_partial(const style_state *s) {
    return s->taken_from && s->taken_from->partial;
}

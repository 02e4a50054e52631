/* llama_breakdown.c: bench_llama_gpu --breakdown: hooks that synchronise the device and read
 * the clock and the launch count at the four hook points of every timed module of a Llama, the
 * step's phase marks, and the report (median time and last step's launches per part, "other"
 * the step's total less the parts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h" // defines: bench_now, bench_median
#include "core/error.h" // defines: FSDP_FAIL, FSDP_TRY_AT
#include "llama_breakdown.h"

/* One hooked module: its time goes to part `add` and, when sub >= 0, comes out of part `sub`
 * (its parent's part, which is the parent's time less its children's). */
typedef struct bd_slot {
    llama_breakdown *bd;
    fsdp_module *m;
    int add, sub;
    int ids[FSDP_HOOK_POINT_COUNT]; /* 0: not added */
    double start;
    int64_t launched; /* the device's launches at the pre hook */
} bd_slot;

/* A recorded step: fwd[part], bwd[part], then the forward phase and the total, in seconds. */
#define REC_FWD_PHASE (2 * LLAMA_BD_PARTS)
#define REC_TOTAL     (2 * LLAMA_BD_PARTS + 1)
#define REC_N         (2 * LLAMA_BD_PARTS + 2)

struct llama_breakdown {
    fsdp_device dev;
    bd_slot *slots;
    int n_slots;
    double acc[LLAMA_BD_PARTS][2]; /* this step's module parts: forward, backward */
    double t[LLAMA_BD_MARKS];
    int64_t lacc[LLAMA_BD_PARTS][2]; /* this step's module parts' launches */
    int64_t tl[LLAMA_BD_MARKS];      /* the device's launches at each mark */
    int64_t syncs;                   /* this step's synchronizes, before its END mark */
    int64_t last[LLAMA_BD_PARTS][2], last_forward, last_syncs; /* the last recorded step's */
    double idle_sync_s;
    int next_mark, steps, max_steps;
    double *rec; /* (max_steps, REC_N) */
};

static const char *const PART_NAMES[LLAMA_BD_PARTS] = {
    "embedding", "input_norm", "attn_proj", "attn_core", "post_attn_norm", "mlp_proj", "mlp_rest",
    "residual",  "final_norm", "lm_head",   "loss",      "optimizer",      "other"};

typedef struct bd_target {
    const char *path;
    int add, sub;
} bd_target;

static const bd_target TOP[] = {{"model.embed_tokens", LLAMA_BD_EMBEDDING, -1},
                                {"model.norm", LLAMA_BD_FINAL_NORM, -1},
                                {"lm_head", LLAMA_BD_LM_HEAD, -1}};
#define N_TOP (int)(sizeof TOP / sizeof TOP[0])

/* Relative to a decoder layer ("" is the layer). */
static const bd_target LAYER[] = {
    {"", LLAMA_BD_RESIDUAL, -1},
    {"input_layernorm", LLAMA_BD_INPUT_NORM, LLAMA_BD_RESIDUAL},
    {"self_attn", LLAMA_BD_ATTN_CORE, LLAMA_BD_RESIDUAL},
    {"self_attn.q_proj", LLAMA_BD_ATTN_PROJ, LLAMA_BD_ATTN_CORE},
    {"self_attn.k_proj", LLAMA_BD_ATTN_PROJ, LLAMA_BD_ATTN_CORE},
    {"self_attn.v_proj", LLAMA_BD_ATTN_PROJ, LLAMA_BD_ATTN_CORE},
    {"self_attn.o_proj", LLAMA_BD_ATTN_PROJ, LLAMA_BD_ATTN_CORE},
    {"post_attention_layernorm", LLAMA_BD_POST_NORM, LLAMA_BD_RESIDUAL},
    {"mlp", LLAMA_BD_MLP_REST, LLAMA_BD_RESIDUAL},
    {"mlp.gate_proj", LLAMA_BD_MLP_PROJ, LLAMA_BD_MLP_REST},
    {"mlp.up_proj", LLAMA_BD_MLP_PROJ, LLAMA_BD_MLP_REST},
    {"mlp.down_proj", LLAMA_BD_MLP_PROJ, LLAMA_BD_MLP_REST}};
#define N_LAYER (int)(sizeof LAYER / sizeof LAYER[0])

const char *llama_breakdown_part_name(int part) {
    return part >= 0 && part < LLAMA_BD_PARTS ? PART_NAMES[part] : NULL;
}

static fsdp_status bd_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                           const fsdp_tensor **io, void *user) {
    (void)m, (void)io;
    bd_slot *s = user;
    FSDP_TRY_AT(ctx, fsdp_device_synchronize(ctx, s->bd->dev));
    double now = bench_now();
    int64_t launched = fsdp_kernels_counts(s->bd->dev).launches;
    s->bd->syncs++;
    if (point == FSDP_HOOK_PRE_FORWARD || point == FSDP_HOOK_PRE_BACKWARD) {
        s->start = now;
        s->launched = launched;
        return FSDP_OK;
    }
    int phase = point == FSDP_HOOK_POST_BACKWARD;
    s->bd->acc[s->add][phase] += now - s->start;
    s->bd->lacc[s->add][phase] += launched - s->launched;
    if (s->sub >= 0) {
        s->bd->acc[s->sub][phase] -= now - s->start;
        s->bd->lacc[s->sub][phase] -= launched - s->launched;
    }
    return FSDP_OK;
}

/* Fills the next slot with the module at path under base, or says which name is missing. */
static fsdp_status bd_find(fsdp_ctx *ctx, llama_breakdown *bd, fsdp_module *base,
                           const bd_target *t) {
    fsdp_module *m = fsdp_module_find(base, t->path);
    if (!m)
        return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND,
                         "llama breakdown: the model has no module '%s%s%s': the breakdown times "
                         "a fsdp_model_llama with Hugging Face's module names",
                         fsdp_module_fqn(base), *fsdp_module_fqn(base) && *t->path ? "." : "",
                         t->path);
    bd->slots[bd->n_slots++] = (bd_slot){.bd = bd, .m = m, .add = t->add, .sub = t->sub};
    return FSDP_OK;
}

static fsdp_status bd_find_all(fsdp_ctx *ctx, llama_breakdown *bd, fsdp_module *model,
                               fsdp_module *layers, int n_layers) {
    for (int i = 0; i < N_TOP; i++) FSDP_TRY_AT(ctx, bd_find(ctx, bd, model, &TOP[i]));
    for (int l = 0; l < n_layers; l++)
        for (int i = 0; i < N_LAYER; i++)
            FSDP_TRY_AT(ctx, bd_find(ctx, bd, fsdp_module_child(layers, l), &LAYER[i]));
    for (int s = 0; s < bd->n_slots; s++)
        for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++)
            FSDP_TRY_AT(ctx,
                        fsdp_module_add_observer(ctx, bd->slots[s].m, (fsdp_hook_point)p, bd_hook,
                                                 &bd->slots[s], NULL, &bd->slots[s].ids[p]));
    return FSDP_OK;
}

/* What one synchronize costs with nothing queued: every timed call holds one (its end). */
static fsdp_status bd_time_idle_sync(fsdp_ctx *ctx, llama_breakdown *bd) {
    double t[21];
    FSDP_TRY_AT(ctx, fsdp_device_synchronize(ctx, bd->dev)); /* drains what was queued */
    for (int i = 0; i < 21; i++) {
        double t0 = bench_now();
        FSDP_TRY_AT(ctx, fsdp_device_synchronize(ctx, bd->dev));
        t[i] = bench_now() - t0;
    }
    bd->idle_sync_s = bench_median(t, 21);
    return FSDP_OK;
}

fsdp_status llama_breakdown_attach(fsdp_ctx *ctx, fsdp_module *model, fsdp_device dev,
                                   int max_steps, llama_breakdown **out) {
    fsdp_module *layers = fsdp_module_find(model, "model.layers");
    int n_layers = layers ? fsdp_module_num_children(layers) : 0;
    if (n_layers < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND,
                         "llama breakdown: the model has no decoder layers under 'model.layers': "
                         "the breakdown times a fsdp_model_llama");
    if (max_steps < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "llama breakdown: %d steps to record: give at least 1", max_steps);
    llama_breakdown *bd = calloc(1, sizeof *bd);
    if (bd) bd->slots = calloc((size_t)(N_TOP + N_LAYER * n_layers), sizeof *bd->slots);
    if (bd) bd->rec = calloc((size_t)max_steps * REC_N, sizeof *bd->rec);
    if (!bd || !bd->slots || !bd->rec) {
        llama_breakdown_detach(ctx, bd);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "llama breakdown: cannot allocate its state");
    }
    bd->dev = dev, bd->max_steps = max_steps;
    fsdp_status st = bd_time_idle_sync(ctx, bd);
    if (st == FSDP_OK) st = bd_find_all(ctx, bd, model, layers, n_layers);
    if (st != FSDP_OK) {
        llama_breakdown_detach(ctx, bd); /* the failure's message stays the first one */
        return st;
    }
    *out = bd;
    return FSDP_OK;
}

/* Closes the step whose marks are all in bd->t. */
static void bd_record(llama_breakdown *bd) {
    double *r = bd->rec + (size_t)bd->steps++ * REC_N;
    for (int p = 0; p < LLAMA_BD_LOSS; p++) {
        r[p] = bd->acc[p][0];
        r[LLAMA_BD_PARTS + p] = bd->acc[p][1];
    }
    const double *t = bd->t;
    r[LLAMA_BD_LOSS] = t[LLAMA_BD_LOSS_DONE] - t[LLAMA_BD_FORWARD_DONE];
    r[LLAMA_BD_OPTIMIZER] = t[LLAMA_BD_END] - t[LLAMA_BD_BACKWARD_DONE];
    r[REC_FWD_PHASE] = t[LLAMA_BD_FORWARD_DONE] - t[LLAMA_BD_START];
    r[REC_TOTAL] = t[LLAMA_BD_END] - t[LLAMA_BD_START];
    memcpy(bd->last, bd->lacc, sizeof bd->last);
    const int64_t *tl = bd->tl;
    bd->last[LLAMA_BD_LOSS][0] = tl[LLAMA_BD_LOSS_DONE] - tl[LLAMA_BD_FORWARD_DONE];
    bd->last[LLAMA_BD_OPTIMIZER][0] = tl[LLAMA_BD_END] - tl[LLAMA_BD_BACKWARD_DONE];
    bd->last_forward = tl[LLAMA_BD_FORWARD_DONE] - tl[LLAMA_BD_START];
    bd->last_syncs = bd->syncs;
}

fsdp_status llama_breakdown_mark(fsdp_ctx *ctx, llama_breakdown *bd, llama_bd_mark mark) {
    if (!bd) return FSDP_OK;
    if ((int)mark != bd->next_mark)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "llama breakdown: mark %d out of order, %d comes next (a step marks "
                         "START, FORWARD_DONE, LOSS_DONE, BACKWARD_DONE, END)",
                         (int)mark, bd->next_mark);
    if (mark == LLAMA_BD_START && bd->steps == bd->max_steps)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "llama breakdown: %d steps recorded already, its most: attach it with "
                         "more steps",
                         bd->max_steps);
    FSDP_TRY_AT(ctx, fsdp_device_synchronize(ctx, bd->dev));
    bd->t[mark] = bench_now();
    bd->tl[mark] = fsdp_kernels_counts(bd->dev).launches;
    if (mark == LLAMA_BD_START) {
        memset(bd->acc, 0, sizeof bd->acc);
        memset(bd->lacc, 0, sizeof bd->lacc);
        bd->syncs = 0;
    }
    if (mark != LLAMA_BD_END) bd->syncs++; /* END's comes after the step's closing one */
    bd->next_mark = (mark + 1) % LLAMA_BD_MARKS;
    if (mark == LLAMA_BD_END) bd_record(bd);
    return FSDP_OK;
}

/* The median of column c of the recorded steps, in ms. */
static double bd_median_ms(const llama_breakdown *bd, int c, double *tmp) {
    for (int i = 0; i < bd->steps; i++) tmp[i] = bd->rec[(size_t)i * REC_N + c];
    return 1e3 * bench_median(tmp, bd->steps);
}

void llama_breakdown_report(const llama_breakdown *bd, llama_bd_report *out) {
    *out = (llama_bd_report){.steps = bd->steps,
                             .idle_sync_us = 1e6 * bd->idle_sync_s,
                             .forward_launches = bd->last_forward,
                             .syncs = bd->last_syncs};
    memcpy(out->launches, bd->last, sizeof out->launches);
    double *tmp = malloc((size_t)(bd->steps > 0 ? bd->steps : 1) * sizeof *tmp);
    if (!tmp || bd->steps == 0) {
        free(tmp);
        out->steps = 0;
        return;
    }
    double module_fwd = 0;
    for (int p = 0; p < LLAMA_BD_OTHER; p++) {
        out->fwd_ms[p] = bd_median_ms(bd, p, tmp);
        out->bwd_ms[p] = bd_median_ms(bd, LLAMA_BD_PARTS + p, tmp);
        out->parts_ms += out->fwd_ms[p] + out->bwd_ms[p];
        if (p < LLAMA_BD_LOSS) module_fwd += out->fwd_ms[p];
    }
    out->step_ms = bd_median_ms(bd, REC_TOTAL, tmp);
    out->fwd_ms[LLAMA_BD_OTHER] = bd_median_ms(bd, REC_FWD_PHASE, tmp) - module_fwd;
    out->bwd_ms[LLAMA_BD_OTHER] = out->step_ms - out->parts_ms - out->fwd_ms[LLAMA_BD_OTHER];
    free(tmp);
}

void llama_breakdown_print(const llama_bd_report *r, const char *shape, const char *mode,
                           double timed_step_ms, float loss) {
    for (int p = 0; p < LLAMA_BD_PARTS; p++)
        printf("breakdown libfsdp %s %s %s fwd_ms %.3f bwd_ms %.3f share %.4f\n", shape, mode,
               PART_NAMES[p], r->fwd_ms[p], r->bwd_ms[p],
               r->step_ms > 0 ? (r->fwd_ms[p] + r->bwd_ms[p]) / r->step_ms : 0.0);
    printf("breakdown libfsdp %s %s total step_ms %.3f parts_ms %.3f timed_step_ms %.3f steps %d "
           "idle_sync_us %.1f loss %.9g\n",
           shape, mode, r->step_ms, r->parts_ms, timed_step_ms, r->steps, r->idle_sync_us,
           (double)loss);
}

void llama_breakdown_print_counts(const llama_bd_report *r, const char *shape, const char *mode,
                                  fsdp_launch_counts step) {
    int64_t parts = 0, module_fwd = 0;
    for (int p = 0; p < LLAMA_BD_OTHER; p++) {
        parts += r->launches[p][0] + r->launches[p][1];
        if (p < LLAMA_BD_LOSS) module_fwd += r->launches[p][0];
    }
    int64_t other_fwd = r->forward_launches - module_fwd;
    for (int p = 0; p < LLAMA_BD_PARTS; p++) {
        bool other = p == LLAMA_BD_OTHER;
        printf("counts libfsdp %s %s %s launches_fwd %lld launches_bwd %lld\n", shape, mode,
               PART_NAMES[p], (long long)(other ? other_fwd : r->launches[p][0]),
               (long long)(other ? step.launches - parts - other_fwd : r->launches[p][1]));
    }
    printf("counts libfsdp %s %s breakdown_step launches %lld host_waits %lld\n", shape, mode,
           (long long)step.launches, (long long)(step.host_waits - r->syncs));
}

fsdp_status llama_breakdown_detach(fsdp_ctx *ctx, llama_breakdown *bd) {
    if (!bd) return FSDP_OK;
    fsdp_status first = FSDP_OK;
    for (int s = 0; bd->slots && s < bd->n_slots; s++)
        for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++) {
            if (!bd->slots[s].ids[p]) continue;
            fsdp_status st = fsdp_module_remove_hook(ctx, bd->slots[s].m, bd->slots[s].ids[p]);
            if (first == FSDP_OK) first = st;
        }
    free(bd->slots);
    free(bd->rec);
    free(bd);
    return first;
}

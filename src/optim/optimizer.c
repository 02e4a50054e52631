/* optimizer.c: optimizers over a module's parameters. Each parameter that requires a gradient
 * gets a slot with its option group (PyTorch's param_groups, chosen by fnmatch over its fully
 * qualified name) and its state tensors (momentum buffer; or exp_avg, exp_avg_sq and, with
 * amsgrad, max_exp_avg_sq), allocated once at creation; a step runs the fused update of
 * update.c over every slot with its group's options. The states are enumerated by parameter
 * name for checkpoints. */
#define _POSIX_C_SOURCE 200809L /* strdup */

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_move
#include "dp/flat.h"          // defines: fsdp_flat_low_copy, fsdp_flat_low_copy_written
#include "kernels/kernels.h"  // defines: fsdp_kernels_cpu
#include "nn/nn.h"
#include "optim/update.h"

#define MAX_STATE    3
#define NAMES_LISTED 8 /* parameter names an error message lists */

typedef enum optim_kind { OPTIM_SGD, OPTIM_ADAM, OPTIM_ADAMW } optim_kind;

static const char *const kind_names[] = {"SGD", "Adam", "AdamW"};

/* A set of options: the optimizer's own (group 0) or one of param_groups (group 1 + i). */
typedef struct optim_group {
    char *pattern;          /* NULL for group 0 */
    fsdp_sgd_options sgd;   /* the options in effect, overrides applied; lr follows set_lr */
    fsdp_adam_options adam; /* (param_groups fields cleared: not owned) */
    double initial_lr;
    bool own_lr; /* lr overridden: set_lr scales initial_lr instead of copying */
    int n_params;
} optim_group;

typedef struct optim_slot {
    fsdp_param *param;
    char *name;                    /* fully qualified from the root */
    int group;                     /* index into groups */
    int n_state;                   /* state tensors in use: state[0 .. n_state) */
    int first_state;               /* index of state[0] in the enumeration */
    fsdp_tensor *state[MAX_STATE]; /* the local data's shape, zeroed */
} optim_slot;

struct fsdp_optimizer {
    optim_kind kind;
    optim_group *groups; /* [0] the optimizer's own options, then param_groups in order */
    int n_groups;
    optim_slot *slots;
    int n_slots;
    int n_states; /* state tensors over all slots */
    int64_t steps;
    /* n_slots each: a step's list for adam_update_multi and the params whose bf16 copy it
     * writes (an FSDP shard's or a parameter's mirror; or NULL); zero_grad's list for fill_multi */
    fsdp_adam_tensor *batch;
    fsdp_param **batch_low;
    bool *batch_mirror; /* the copy batch_low[k] has is its mirror, not an FSDP shard's */
    float **fill_out;
    int64_t *fill_n;
};

static fsdp_status count_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    if (fsdp_param_requires_grad(p)) (*(int *)user)++;
    return FSDP_OK;
}

static fsdp_status collect_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    fsdp_optimizer *opt = user;
    if (fsdp_param_requires_grad(p)) opt->slots[opt->n_slots++].param = p;
    return FSDP_OK;
}

void fsdp_optimizer_free(fsdp_optimizer *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n_slots; i++) {
        free(opt->slots[i].name);
        for (int s = 0; s < MAX_STATE; s++) fsdp_tensor_free(opt->slots[i].state[s]);
    }
    for (int g = 0; g < opt->n_groups; g++) free(opt->groups[g].pattern);
    free(opt->groups);
    free(opt->slots);
    free(opt->batch);
    free(opt->batch_low);
    free(opt->batch_mirror);
    free(opt->fill_out);
    free(opt->fill_n);
    free(opt);
}

/* ---- checking options ---- */

/* `what` names the options in messages: "SGD" or "SGD param_groups[0] ('*.bias')". An explicit
 * group override may be 0 where the optimizer's own field uses 0 as "unset". */
static fsdp_status check_sgd(fsdp_ctx *ctx, const char *what, const fsdp_sgd_options *o,
                             bool group) {
    if (group ? !(o->lr >= 0.0) : !(o->lr > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: lr is %g; it must be %s", what, o->lr,
                         group ? ">= 0" : "> 0");
    if (!(o->momentum >= 0.0) || !(o->weight_decay >= 0.0) || !(o->dampening >= 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: momentum %g, dampening %g and weight_decay %g must be >= 0", what,
                         o->momentum, o->dampening, o->weight_decay);
    if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: nesterov needs momentum > 0 and dampening 0 (got %g and %g)", what,
                         o->momentum, o->dampening);
    return FSDP_OK;
}

static fsdp_status check_adam(fsdp_ctx *ctx, const char *what, const fsdp_adam_options *o,
                              bool group) {
    if (group ? !(o->lr >= 0.0) : !(o->lr > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: lr is %g; it must be %s", what, o->lr,
                         group ? ">= 0" : "> 0");
    if (!(o->beta1 >= 0.0 && o->beta1 < 1.0) || !(o->beta2 >= 0.0 && o->beta2 < 1.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: betas (%g, %g) must lie in [0, 1)%s",
                         what, o->beta1, o->beta2, group ? "" : " (0 selects the default)");
    if (!(o->eps > 0.0) || !(o->weight_decay >= 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: eps %g must be > 0 and weight_decay %g >= 0", what, o->eps,
                         o->weight_decay);
    return FSDP_OK;
}

/* ---- groups ---- */

/* Group g's options: the optimizer's own (groups[0], checked) with pg's overrides. */
static fsdp_status group_options(fsdp_ctx *ctx, fsdp_optimizer *opt, int g,
                                 const fsdp_param_group *pg) {
    const char *kind = kind_names[opt->kind];
    if (!pg->pattern)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s param_groups[%d]: pattern is NULL",
                         kind, g - 1);
    char what[160];
    snprintf(what, sizeof what, "%s param_groups[%d] ('%s')", kind, g - 1, pg->pattern);
    const bool sgd = opt->kind == OPTIM_SGD;
    const struct {
        const char *name;
        bool set, fits;
    } fields[] = {{"momentum", pg->momentum.set, sgd},
                  {"dampening", pg->dampening.set, sgd},
                  {"beta1", pg->beta1.set, !sgd},
                  {"beta2", pg->beta2.set, !sgd},
                  {"eps", pg->eps.set, !sgd}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].set && !fields[i].fits)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: %s is not an option of %s", what,
                             fields[i].name, kind);
    optim_group *grp = &opt->groups[g];
    grp->pattern = strdup(pg->pattern);
    if (!grp->pattern) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    grp->sgd = opt->groups[0].sgd;
    grp->adam = opt->groups[0].adam;
#define APPLY(field, dst)                                                                          \
    if (pg->field.set) (dst) = pg->field.value
    APPLY(lr, grp->sgd.lr);
    APPLY(lr, grp->adam.lr);
    APPLY(weight_decay, grp->sgd.weight_decay);
    APPLY(weight_decay, grp->adam.weight_decay);
    APPLY(momentum, grp->sgd.momentum);
    APPLY(dampening, grp->sgd.dampening);
    APPLY(beta1, grp->adam.beta1);
    APPLY(beta2, grp->adam.beta2);
    APPLY(eps, grp->adam.eps);
#undef APPLY
    grp->own_lr = pg->lr.set;
    grp->initial_lr = sgd ? grp->sgd.lr : grp->adam.lr;
    return sgd ? check_sgd(ctx, what, &grp->sgd, true) : check_adam(ctx, what, &grp->adam, true);
}

/* "a, b, c, ... (N in all)": the first NAMES_LISTED parameter names, for messages. */
static void list_names(const fsdp_optimizer *opt, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < opt->n_slots && i < NAMES_LISTED && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", opt->slots[i].name);
    if (opt->n_slots > NAMES_LISTED && len < size)
        snprintf(buf + len, size - len, ", ... (%d in all)", opt->n_slots);
}

/* A group that got no parameter: matches none, or only ones an earlier group took. */
static fsdp_status empty_group(fsdp_ctx *ctx, const fsdp_optimizer *opt, int g) {
    const char *kind = kind_names[opt->kind], *pattern = opt->groups[g].pattern;
    for (int i = 0; i < opt->n_slots; i++)
        if (fnmatch(pattern, opt->slots[i].name, 0) == 0)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s param_groups[%d]: pattern '%s' gets no parameter: every one it "
                             "matches ('%s', ...) takes an earlier group (param_groups[%d], "
                             "'%s'); the first match wins",
                             kind, g - 1, pattern, opt->slots[i].name, opt->slots[i].group - 1,
                             opt->groups[opt->slots[i].group].pattern);
    char names[512];
    list_names(opt, names, sizeof names);
    bool flat = false;
    for (int i = 0; i < opt->n_slots; i++) flat = flat || strstr(opt->slots[i].name, "_flat_param");
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "%s param_groups[%d]: pattern '%s' matches no trainable parameter; the "
                     "parameters are: %s%s",
                     kind, g - 1, pattern, opt->n_slots ? names : "(none)",
                     flat ? " (FSDP flat parameters: wrap with use_orig_params to see the "
                            "original names)"
                          : "");
}

/* Names every slot, puts it in its group (the first whose pattern matches) and allocates its
 * state: n_state tensors, or none for an SGD group without momentum. */
static fsdp_status assign_slots(fsdp_ctx *ctx, fsdp_optimizer *opt, int n_state) {
    for (int i = 0; i < opt->n_slots; i++) {
        optim_slot *slot = &opt->slots[i];
        const char *fqn = fsdp_module_fqn(fsdp_param_module(slot->param));
        const char *pname = fsdp_param_name(slot->param);
        size_t len = strlen(fqn) + strlen(pname) + 2;
        slot->name = malloc(len);
        if (!slot->name)
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a parameter name");
        snprintf(slot->name, len, "%s%s%s", fqn, *fqn ? "." : "", pname);
        for (int g = 1; g < opt->n_groups && slot->group == 0; g++)
            if (fnmatch(opt->groups[g].pattern, slot->name, 0) == 0) slot->group = g;
        opt->groups[slot->group].n_params++;
    }
    for (int g = 1; g < opt->n_groups; g++)
        if (opt->groups[g].n_params == 0) return empty_group(ctx, opt, g);
    for (int i = 0; i < opt->n_slots; i++) {
        optim_slot *slot = &opt->slots[i];
        const optim_group *grp = &opt->groups[slot->group];
        slot->n_state = opt->kind == OPTIM_SGD && grp->sgd.momentum <= 0.0 ? 0 : n_state;
        slot->first_state = opt->n_states;
        opt->n_states += slot->n_state;
        for (int s = 0; s < slot->n_state; s++)
            FSDP_TRY_AT(
                ctx, fsdp_tensor_create_like(ctx, fsdp_param_data(slot->param), &slot->state[s]));
    }
    return FSDP_OK;
}

/* An optimizer over m's trainable parameters: own holds its checked options (defaults filled
 * in), groups/n_groups the param_groups, n_state the state tensors of a parameter. */
static fsdp_status optimizer_new(fsdp_ctx *ctx, fsdp_module *m, optim_kind kind,
                                 const fsdp_sgd_options *sgd, const fsdp_adam_options *adam,
                                 const fsdp_param_group *groups, int n_groups, int n_state,
                                 fsdp_optimizer **out) {
    const char *name = kind_names[kind];
    if (n_groups < 0 || (n_groups > 0 && !groups))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: n_param_groups is %d with param_groups %s; give an array of "
                         "n_param_groups groups",
                         name, n_groups, groups ? "set" : "NULL");
    /* A wrapped model's own parameters are not what is trained: FSDP steps its shards. */
    FSDP_TRY_AT(ctx, fsdp_nn_check_unmanaged(ctx, m, name));
    int n = 0;
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, m, count_param, &n));
    fsdp_optimizer *opt = calloc(1, sizeof *opt);
    if (opt) opt->slots = calloc((size_t)(n ? n : 1), sizeof *opt->slots);
    if (opt) opt->groups = calloc((size_t)n_groups + 1, sizeof *opt->groups);
    size_t lists = (size_t)(n ? n : 1);
    if (opt) opt->batch = calloc(lists, sizeof *opt->batch);
    if (opt) opt->batch_low = calloc(lists, sizeof *opt->batch_low);
    if (opt) opt->batch_mirror = calloc(lists, sizeof *opt->batch_mirror);
    if (opt) opt->fill_out = calloc(lists, sizeof *opt->fill_out);
    if (opt) opt->fill_n = calloc(lists, sizeof *opt->fill_n);
    if (!opt || !opt->slots || !opt->groups || !opt->batch || !opt->batch_low ||
        !opt->batch_mirror || !opt->fill_out || !opt->fill_n) {
        fsdp_optimizer_free(opt);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an optimizer");
    }
    opt->kind = kind;
    opt->n_groups = n_groups + 1;
    optim_group *own = &opt->groups[0];
    if (sgd) own->sgd = *sgd;
    if (adam) own->adam = *adam;
    own->sgd.param_groups = own->adam.param_groups = NULL;
    own->sgd.n_param_groups = own->adam.n_param_groups = 0;
    own->initial_lr = kind == OPTIM_SGD ? own->sgd.lr : own->adam.lr;
    fsdp_module_visit_params(ctx, m, collect_param, opt); /* cannot fail */
    fsdp_status st = FSDP_OK;
    for (int g = 1; st == FSDP_OK && g < opt->n_groups; g++)
        st = group_options(ctx, opt, g, &groups[g - 1]);
    if (st == FSDP_OK) st = assign_slots(ctx, opt, n_state);
    if (st != FSDP_OK) {
        fsdp_optimizer_free(opt);
        return FSDP_PASS(ctx, st);
    }
    *out = opt;
    return FSDP_OK;
}

fsdp_status fsdp_sgd_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_sgd_options *opts,
                            fsdp_optimizer **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, opts);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_TRY_AT(ctx, check_sgd(ctx, "SGD", opts, false));
    return optimizer_new(ctx, m, OPTIM_SGD, opts, NULL, opts->param_groups, opts->n_param_groups, 1,
                         out);
}

static fsdp_status adam_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                               optim_kind kind, fsdp_optimizer **out) {
    const char *name = kind_names[kind];
    if (!m || !opts || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: NULL argument", name);
    fsdp_adam_options o = *opts; /* PyTorch's defaults for the zero fields */
    if (o.beta1 == 0.0) o.beta1 = 0.9;
    if (o.beta2 == 0.0) o.beta2 = 0.999;
    if (o.eps == 0.0) o.eps = 1e-8;
    FSDP_TRY_AT(ctx, check_adam(ctx, name, &o, false));
    return optimizer_new(ctx, m, kind, NULL, &o, opts->param_groups, opts->n_param_groups,
                         o.amsgrad ? 3 : 2, out);
}

fsdp_status fsdp_adam_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                             fsdp_optimizer **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, opts);
    FSDP_ARG_NOT_NULL(ctx, out);
    return adam_create(ctx, m, opts, OPTIM_ADAM, out);
}

fsdp_status fsdp_adamw_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                              fsdp_optimizer **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, opts);
    FSDP_ARG_NOT_NULL(ctx, out);
    return adam_create(ctx, m, opts, OPTIM_ADAMW, out);
}

/* ---- stepping ---- */

/* A slot's arrays for a step, checked; n 0: nothing to update (e.g. an FSDP shard view that
 * holds none of the parameter). */
typedef struct slot_arrays {
    fsdp_device dev;
    float *p, *g, *st[MAX_STATE];
    int64_t n;
} slot_arrays;

static fsdp_status slot_check(fsdp_ctx *ctx, const optim_slot *s, slot_arrays *a) {
    *a = (slot_arrays){.n = fsdp_tensor_numel(fsdp_param_data(s->param)),
                       .dev = fsdp_tensor_device(fsdp_param_data(s->param))};
    /* The state follows its parameter (made before fsdp_module_to moved the model): moved
     * with its values, once, as the parameter was. */
    for (int k = 0; k < s->n_state; k++)
        if (!fsdp_device_same(fsdp_tensor_device(s->state[k]), a->dev))
            FSDP_TRY_AT(ctx, fsdp_tensor_move(ctx, s->state[k], a->dev));
    if (a->n == 0) return FSDP_OK;
    a->p = fsdp_tensor_f32(fsdp_param_data(s->param));
    a->g = fsdp_tensor_f32(fsdp_param_grad(s->param));
    if (!a->p || !a->g)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED, "optimizer: parameter '%s' must be f32",
                         s->name);
    fsdp_device gdev = fsdp_tensor_device(fsdp_param_grad(s->param));
    if (gdev.type != a->dev.type || gdev.index != a->dev.index)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "optimizer: parameter '%s' is on %s:%d but its gradient on %s:%d", s->name,
                         fsdp_device_to_string(a->dev), a->dev.index, fsdp_device_to_string(gdev),
                         gdev.index);
    if (s->n_state > 0 && fsdp_tensor_numel(s->state[0]) != a->n)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "optimizer: parameter '%s' has %lld elements but its state was made "
                         "for %lld; create the optimizer after parallelizing or sharding "
                         "the model",
                         s->name, (long long)a->n, (long long)fsdp_tensor_numel(s->state[0]));
    for (int k = 0; k < s->n_state; k++) a->st[k] = fsdp_tensor_f32(s->state[k]);
    return FSDP_OK;
}

/* The bf16 copy an Adam step writes in its pass for p, or NULL: an FSDP flat shard's copy its
 * gathers take (dp/low_copy.c), else p's mirror its Linear reads (nn/mirror.c; *mirror set). */
static fsdp_status low_copy(fsdp_ctx *ctx, fsdp_param *p, fsdp_bf16 **low, bool *mirror) {
    FSDP_TRY_AT(ctx, fsdp_flat_low_copy(ctx, p, low));
    *mirror = !*low && (*low = fsdp_nn_param_mirror_target(p)) != NULL;
    return FSDP_OK;
}

/* The step wrote p and its copy: the copy is current (an FSDP shard's or p's mirror). */
static void low_written(fsdp_param *p, bool mirror) {
    if (mirror)
        fsdp_nn_param_mirror_written(p);
    else
        fsdp_flat_low_copy_written(p);
}

/* One fused pass over a slot's parameter with its group's options. */
static fsdp_status step_slot(fsdp_ctx *ctx, const fsdp_optimizer *opt, const optim_slot *s) {
    slot_arrays a;
    FSDP_TRY_AT(ctx, slot_check(ctx, s, &a));
    if (a.n == 0) return FSDP_OK;
    const optim_group *g = &opt->groups[s->group];
    if (opt->kind == OPTIM_SGD) {
        fsdp_sgd_update(a.dev, a.p, a.g, a.st[0], a.n, &g->sgd, opt->steps == 0);
        return FSDP_OK;
    }
    /* A bf16 copy read next (an FSDP shard's, a mirror): its rounding written in the same pass. */
    fsdp_bf16 *low;
    bool mirror = false;
    FSDP_TRY_AT(ctx, low_copy(ctx, s->param, &low, &mirror));
    if (low) {
        fsdp_adam_update_bf16(a.dev, a.p, low, a.g, a.st[0], a.st[1], a.st[2], a.n, &g->adam,
                              opt->kind == OPTIM_ADAMW, opt->steps + 1);
        low_written(s->param, mirror);
    } else {
        fsdp_adam_update(a.dev, a.p, a.g, a.st[0], a.st[1], a.st[2], a.n, &g->adam,
                         opt->kind == OPTIM_ADAMW, opt->steps + 1);
    }
    return FSDP_OK;
}

static _Atomic bool per_tensor; /* fsdp_optimizer_test_per_tensor */

void fsdp_optimizer_test_per_tensor(bool on) {
    per_tensor = on;
}

/* The pending run of Adam slots (opt->batch[0 .. n), one device and group) in one call. */
static void adam_flush(fsdp_optimizer *opt, fsdp_device dev, int group, int n) {
    if (n == 0) return;
    fsdp_adam_update_multi(dev, opt->batch, n, &opt->groups[group].adam, opt->kind == OPTIM_ADAMW,
                           opt->steps + 1);
    for (int k = 0; k < n; k++)
        if (opt->batch_low[k]) low_written(opt->batch_low[k], opt->batch_mirror[k]);
}

/* Adam and AdamW: consecutive slots of one device and group share one multi-tensor update
 * (the same scalars: the group's options and the step); a slot that fails its checks ends the
 * step after the slots before it are updated, as the per-slot loop would. */
static fsdp_status step_adam(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    fsdp_status st = FSDP_OK;
    fsdp_device dev = {0};
    int group = 0, n = 0;
    for (int i = 0; i < opt->n_slots; i++) {
        const optim_slot *s = &opt->slots[i];
        slot_arrays a;
        fsdp_bf16 *low = NULL;
        bool mirror = false;
        st = slot_check(ctx, s, &a);
        if (st == FSDP_OK && a.n > 0) st = low_copy(ctx, s->param, &low, &mirror);
        if (st != FSDP_OK) break;
        if (a.n == 0) continue;
        if (n > 0 && (!fsdp_device_same(a.dev, dev) || s->group != group)) {
            adam_flush(opt, dev, group, n);
            n = 0;
        }
        dev = a.dev, group = s->group;
        opt->batch[n] = (fsdp_adam_tensor){a.p, a.g, a.st[0], a.st[1], a.st[2], low, a.n};
        opt->batch_mirror[n] = mirror;
        opt->batch_low[n++] = low ? s->param : NULL;
    }
    adam_flush(opt, dev, group, n);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_optimizer_step(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, opt);
    if (opt->kind != OPTIM_SGD && !per_tensor)
        FSDP_TRY_AT(ctx, step_adam(ctx, opt));
    else
        for (int i = 0; i < opt->n_slots; i++)
            FSDP_TRY_AT(ctx, step_slot(ctx, opt, &opt->slots[i]));
    opt->steps++;
    return FSDP_OK;
}

/* Whether a gradient can join a multi-tensor zero fill: f32 with elements and data. */
static bool fills_f32(const fsdp_tensor *g) {
    return fsdp_tensor_dtype(g) == FSDP_DTYPE_F32 && fsdp_tensor_numel(g) > 0 &&
           fsdp_tensor_data(g) && fsdp_kernels_for(fsdp_tensor_device(g)) &&
           fsdp_kernels_for(fsdp_tensor_device(g))->fill_multi;
}

/* f32 gradients are zeroed by the kernel table, consecutive ones of a device in one fill_multi
 * (one launch per chunk on a GPU; on the CPU each large fill spreads over the rank's threads);
 * anything else by fsdp_tensor_fill. */
fsdp_status fsdp_optimizer_zero_grad(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, opt);
    fsdp_device dev = {0};
    int n = 0;
    for (int i = 0; i <= opt->n_slots; i++) {
        fsdp_tensor *g = i < opt->n_slots ? fsdp_param_grad(opt->slots[i].param) : NULL;
        bool joins = g && fills_f32(g) && !per_tensor;
        if (n > 0 && (!joins || !fsdp_device_same(fsdp_tensor_device(g), dev))) {
            fsdp_kernels_for(dev)->fill_multi(opt->fill_out, opt->fill_n, n, 0.0f);
            n = 0;
        }
        if (!g) continue;
        if (joins) {
            dev = fsdp_tensor_device(g);
            opt->fill_out[n] = fsdp_tensor_f32(g);
            opt->fill_n[n++] = fsdp_tensor_numel(g);
        } else if (fsdp_tensor_dtype(g) == FSDP_DTYPE_F32 && fsdp_tensor_numel(g) > 0 &&
                   fsdp_tensor_data(g) && fsdp_tensor_device(g).type == FSDP_DEVICE_CPU) {
            fsdp_kernels_cpu()->fill(fsdp_tensor_f32(g), 0.0f, fsdp_tensor_numel(g));
        } else {
            FSDP_TRY_AT(ctx, fsdp_tensor_fill(ctx, g, 0.0f));
        }
    }
    return FSDP_OK;
}

int64_t fsdp_optimizer_steps(const fsdp_optimizer *opt) {
    return opt->steps;
}

/* ---- learning rates and groups ---- */

static double *group_lr(optim_group *g, optim_kind kind) {
    return kind == OPTIM_SGD ? &g->sgd.lr : &g->adam.lr;
}

void fsdp_optimizer_set_lr(fsdp_optimizer *opt, double lr) {
    double factor = lr / opt->groups[0].initial_lr;
    for (int g = 0; g < opt->n_groups; g++) {
        optim_group *grp = &opt->groups[g];
        *group_lr(grp, opt->kind) = grp->own_lr ? grp->initial_lr * factor : lr;
    }
}

double fsdp_optimizer_lr(const fsdp_optimizer *opt) {
    return fsdp_optimizer_group_lr(opt, FSDP_OPTIM_NO_GROUP);
}

int fsdp_optimizer_num_groups(const fsdp_optimizer *opt) {
    return opt->n_groups - 1;
}

double fsdp_optimizer_group_lr(const fsdp_optimizer *opt, int group) {
    if (group < FSDP_OPTIM_NO_GROUP || group + 1 >= opt->n_groups) return NAN;
    return *group_lr(&opt->groups[group + 1], opt->kind);
}

fsdp_status fsdp_optimizer_param_group(fsdp_ctx *ctx, const fsdp_optimizer *opt, const char *fqn,
                                       int *group) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, opt);
    FSDP_ARG_NOT_NULL(ctx, fqn);
    FSDP_ARG_NOT_NULL(ctx, group);
    for (int i = 0; i < opt->n_slots; i++)
        if (strcmp(opt->slots[i].name, fqn) == 0) {
            *group = opt->slots[i].group - 1;
            return FSDP_OK;
        }
    char names[512];
    list_names(opt, names, sizeof names);
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "optimizer has no trainable parameter '%s'; it has: %s", fqn,
                     opt->n_slots ? names : "(none)");
}

void fsdp_optimizer_set_steps(fsdp_optimizer *opt, int64_t steps) {
    opt->steps = steps;
}

/* ---- state enumeration ---- */

const char *fsdp_optim_state_kind_to_string(fsdp_optim_state_kind kind) {
    static const char *const names[] = {"momentum_buffer", "exp_avg", "exp_avg_sq",
                                        "max_exp_avg_sq"};
    return (int)kind >= 0 && kind < FSDP_OPTIM_STATE_KIND_COUNT ? names[kind] : "unknown";
}

int fsdp_optimizer_num_states(const fsdp_optimizer *opt) {
    return opt->n_states;
}

fsdp_status fsdp_optimizer_get_state(fsdp_ctx *ctx, const fsdp_optimizer *opt, int i,
                                     fsdp_optim_state *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, opt);
    FSDP_ARG_NOT_NULL(ctx, out);
    int n = opt->n_states;
    if (i < 0 || i >= n)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "optimizer state %d does not exist; this optimizer has %d (0..%d)", i, n,
                         n - 1);
    /* The last slot whose first state is <= i (slots without state share first_state). */
    int lo = 0, hi = opt->n_slots - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (opt->slots[mid].first_state <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    const optim_slot *s = &opt->slots[lo];
    int k = i - s->first_state;
    FSDP_ASSERT(k >= 0 && k < s->n_state);
    *out = (fsdp_optim_state){
        .param_name = s->name,
        .param = s->param,
        .kind = opt->kind == OPTIM_SGD ? FSDP_OPTIM_MOMENTUM_BUFFER
                                       : (fsdp_optim_state_kind)(FSDP_OPTIM_EXP_AVG + k),
        .value = s->state[k],
        .spec = fsdp_param_dtensor_spec(s->param),
        .step = opt->steps,
    };
    return FSDP_OK;
}

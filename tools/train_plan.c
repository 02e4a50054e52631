/* train_plan.c: the plans over module names of the models made of Linear layers (the MLP
 * kinds): [model] tp_plan checked against the modules the kind builds and applied to the built
 * model by its paths, and [model] checkpoint_activations matched against the modules the kind
 * offers. */
#include "train_plan.h"

#include <fnmatch.h> // defines: fnmatch
#include <stdlib.h>
#include <string.h>

/* "0 (Linear), 1 (ReLU), ..." for messages. */
static void describe_modules(const train_module_info *m, int n, char *buf, size_t size) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++)
        train_append(buf, size, "%s%s (%s)", i ? ", " : "", m[i].name, m[i].kind);
}

/* Module index of Linear i. */
static const char *linear_name(const train_module_info *m, int n, int linear) {
    for (int i = 0; i < n; i++)
        if (m[i].linear == linear) return m[i].name;
    return "?";
}

static const char *const g_style_names[] = {"none", "colwise", "rowwise"};

/* Reads one "name=style" entry of tp_plan into styles; on failure the message after the key. */
static bool plan_entry(const train_list_item *item, int entry, const train_module_info *m,
                       int n_mod, train_tp_style *styles, int *from, char *why, size_t why_size) {
    char text[TRAIN_MAX_STRING], modules[512];
    train_item_text(item, text, sizeof text);
    char *eq = strchr(text, '=');
    if (!eq || eq == text) {
        train_append(why, why_size,
                     "entry %d '%s' is not name=style; write e.g. 0=colwise,2=rowwise", entry,
                     text);
        return false;
    }
    *eq = '\0';
    char *name = text, *style = eq + 1;
    size_t len = strlen(name);
    while (len && (name[len - 1] == ' ' || name[len - 1] == '\t')) name[--len] = '\0';
    while (*style == ' ' || *style == '\t') style++;
    int sty = 0;
    while (sty < 3 && strcmp(style, g_style_names[sty]) != 0) sty++;
    if (sty == 0 || sty == 3) {
        train_append(why, why_size, "entry %d '%s=%s': unknown style '%s'; use colwise or rowwise",
                     entry, name, style, style);
        return false;
    }
    int matched = 0;
    for (int i = 0; i < n_mod; i++) {
        if (fnmatch(name, m[i].name, 0) != 0) continue;
        matched++;
        if (m[i].linear < 0) {
            train_append(
                why, why_size,
                "entry %d '%s=%s' names module %s, a %s; a style applies to a Linear layer", entry,
                name, style, m[i].name, m[i].kind);
            return false;
        }
        if (styles[m[i].linear] != TRAIN_TP_NONE) {
            train_append(why, why_size, "module %s gets a style from entry %d and from entry %d",
                         m[i].name, from[m[i].linear], entry);
            return false;
        }
        styles[m[i].linear] = (train_tp_style)sty;
        from[m[i].linear] = entry;
    }
    if (matched) return true;
    describe_modules(m, n_mod, modules, sizeof modules);
    train_append(why, why_size, "entry %d: '%s' matches no module of the model; its modules are %s",
                 entry, name, modules);
    return false;
}

/* The activations between the Linear layers flow: Replicate into a colwise layer, its output
 * sharded into the rowwise one after it, Replicate out of that; the output replicated. */
static bool plan_flows(const train_tp_style *styles, int n_linear, const train_module_info *m,
                       int n_mod, char *why, size_t why_size) {
    bool sharded = false;
    for (int i = 0; i < n_linear; i++) {
        const char *name = linear_name(m, n_mod, i);
        const char *style = styles[i] ? g_style_names[styles[i]] : "not in the plan";
        if (sharded && styles[i] != TRAIN_TP_ROWWISE) {
            train_append(why, why_size,
                         "module %s (Linear %d) is %s, but its input is sharded over tp by the "
                         "colwise module %s before it: make module %s rowwise",
                         name, i, style, linear_name(m, n_mod, i - 1), name);
            return false;
        }
        if (!sharded && styles[i] == TRAIN_TP_ROWWISE) {
            train_append(
                why, why_size,
                "module %s (Linear %d) is rowwise, but its input is not sharded: a rowwise "
                "Linear takes the output of a colwise one; ",
                name, i);
            if (i > 0)
                train_append(why, why_size, "make module %s colwise", linear_name(m, n_mod, i - 1));
            else
                train_append(why, why_size, "the first Linear can be colwise, not rowwise");
            return false;
        }
        sharded = styles[i] == TRAIN_TP_COLWISE;
    }
    if (!sharded) return true;
    train_append(
        why, why_size,
        "module %s, the last Linear, is colwise: the model's output would stay sharded over "
        "tp; leave it out of the plan",
        linear_name(m, n_mod, n_linear - 1));
    return false;
}

/* The styles of the Linear layers of modules m (n_mod of them, n_linear Linear layers) under
 * [model] tp_plan, as train_config_tp_plan says. */
static fsdp_status plan_styles(const train_config *cfg, const train_module_info *m, int n_mod,
                               int n_linear, train_tp_style *styles, char *err, size_t err_size) {
    int from[TRAIN_MAX_PLAN_LINEAR] = {0};
    for (int i = 0; i < TRAIN_MAX_PLAN_LINEAR; i++) styles[i] = TRAIN_TP_NONE;
    train_list_item items[TRAIN_MAX_MODULES];
    int n = train_split_list(cfg->model.tp_plan, TRAIN_MAX_MODULES, items);
    if (n == 0) { /* the Megatron pairs */
        for (int i = 0; i + 1 < n_linear; i += 2)
            styles[i] = TRAIN_TP_COLWISE, styles[i + 1] = TRAIN_TP_ROWWISE;
        return FSDP_OK;
    }
    char why[768] = "", key[TRAIN_KEY_TEXT_SIZE];
    bool ok = n > 0;
    if (!ok) snprintf(why, sizeof why, "more than %d entries", TRAIN_MAX_MODULES);
    for (int i = 0; ok && i < n; i++)
        ok = plan_entry(&items[i], i + 1, m, n_mod, styles, from, why, sizeof why);
    if (ok) ok = plan_flows(styles, n_linear, m, n_mod, why, sizeof why);
    if (ok) return FSDP_OK;
    snprintf(err, err_size, "%s: %s",
             train_config_key_text(cfg, "model", "tp_plan", key, sizeof key), why);
    return FSDP_ERR_CONFIG;
}

typedef struct module_walk {
    train_module_info *m;
    fsdp_module **linear; /* (optional) the Linear layers, in order */
    int max, n, n_linear;
} module_walk;

static fsdp_status visit(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    (void)ctx;
    module_walk *w = user;
    if (!fsdp_module_parent(m)) return FSDP_OK; /* the root */
    bool linear = strcmp(fsdp_module_kind(m), "Linear") == 0;
    if (w->n < w->max) {
        train_module_info *i = &w->m[w->n];
        snprintf(i->name, sizeof i->name, "%s", fsdp_module_fqn(m));
        i->kind = fsdp_module_kind(m); /* a string literal of the layer */
        i->linear = linear ? w->n_linear : -1;
        if (linear && w->linear) w->linear[w->n_linear] = m;
    }
    w->n++;
    w->n_linear += linear;
    return FSDP_OK;
}

int train_plan_modules(const train_kind *kind, const train_config *cfg, train_module_info *m,
                       int max) {
    fsdp_ctx *ctx = NULL;
    fsdp_module *model = NULL;
    module_walk w = {.m = m, .max = max};
    fsdp_ctx_options o = {.log_level = FSDP_LOG_OFF};
    bool ok = fsdp_ctx_create(&o, &ctx) == FSDP_OK &&
              kind->build(ctx, cfg, true, &model) == FSDP_OK &&
              fsdp_module_visit(ctx, model, visit, &w) == FSDP_OK;
    fsdp_module_free(model);
    fsdp_ctx_free(ctx);
    return ok ? w.n : -1;
}

/* The modules of cfg's model on the heap (*m, the caller frees it): their number, or -1. */
static int walk_modules(const train_kind *kind, const train_config *cfg, train_module_info **m) {
    int n = train_plan_modules(kind, cfg, NULL, 0);
    *m = n < 0 ? NULL : malloc((size_t)(n ? n : 1) * sizeof **m);
    if (!*m) return -1;
    return train_plan_modules(kind, cfg, *m, n);
}

static int count_linear(const train_module_info *m, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += m[i].linear >= 0;
    return k;
}

/* The styles of modules m, checked (a model of too many Linear layers refused). */
static fsdp_status styles_of(const train_config *cfg, const train_module_info *m, int n_mod,
                             train_tp_style *styles, int *n_linear, char *err, size_t err_size) {
    *n_linear = count_linear(m, n_mod);
    if (*n_linear <= TRAIN_MAX_PLAN_LINEAR)
        return plan_styles(cfg, m, n_mod, *n_linear, styles, err, err_size);
    snprintf(err, err_size,
             "the model has %d Linear layers; tensor parallelism by [model] tp_plan takes at "
             "most %d: use fewer layers or tp = 1",
             *n_linear, TRAIN_MAX_PLAN_LINEAR);
    return FSDP_ERR_CONFIG;
}

fsdp_status train_plan_styles(const train_kind *kind, const train_config *cfg,
                              train_tp_style *styles, int *n_linear, char *err, size_t err_size) {
    train_module_info *m = NULL;
    int n_mod = walk_modules(kind, cfg, &m);
    fsdp_status st = FSDP_OK;
    *n_linear = 0;
    if (n_mod < 0) {
        snprintf(err, err_size, "cannot list the modules of [model] kind = %s: out of memory",
                 kind->name);
        st = FSDP_ERR_OUT_OF_MEMORY;
    } else {
        st = styles_of(cfg, m, n_mod, styles, n_linear, err, err_size);
    }
    free(m);
    return st;
}

fsdp_status train_plan_styles_list(const train_kind *kind, const train_config *cfg,
                                   train_tp_style *styles, int n, char *err, size_t err_size) {
    train_tp_style all[TRAIN_MAX_PLAN_LINEAR];
    int n_linear = 0;
    fsdp_status st = train_plan_styles(kind, cfg, all, &n_linear, err, err_size);
    for (int i = 0; i < n; i++)
        styles[i] = st == FSDP_OK && i < TRAIN_MAX_PLAN_LINEAR ? all[i] : TRAIN_TP_NONE;
    return st;
}

/* ---- on the built model ------------------------------------------------------------------- */

fsdp_status train_plan_apply(fsdp_ctx *ctx, const train_config *cfg, fsdp_module *model,
                             const fsdp_mesh *tp) {
    int n_all = 0;
    module_walk w = {.max = 0};
    TRAIN_TRY(fsdp_module_visit(ctx, model, visit, &w)); /* count them */
    n_all = w.n;
    train_module_info *m = malloc((size_t)(n_all ? n_all : 1) * sizeof *m);
    fsdp_module **linear = malloc((size_t)(w.n_linear ? w.n_linear : 1) * sizeof *linear);
    train_tp_style *styles = malloc(TRAIN_MAX_PLAN_LINEAR * sizeof *styles);
    fsdp_tp_plan_entry *plan = malloc((size_t)(w.n_linear ? w.n_linear : 1) * sizeof *plan);
    fsdp_status st = m && linear && styles && plan ? FSDP_OK : FSDP_ERR_OUT_OF_MEMORY;
    if (st != FSDP_OK) fsdp_ctx_set_error(ctx, st, "out of memory for the tensor-parallel plan");
    w = (module_walk){.m = m, .linear = linear, .max = n_all};
    if (st == FSDP_OK) st = fsdp_module_visit(ctx, model, visit, &w);
    char err[TRAIN_ERROR_SIZE];
    int n_linear = 0, n = 0;
    if (st == FSDP_OK && (st = styles_of(cfg, m, n_all, styles, &n_linear, err, sizeof err)))
        fsdp_ctx_set_error(ctx, st, "%s", err); /* not reached: the configuration was checked */
    for (int i = 0; st == FSDP_OK && i < n_linear; i++) /* by their paths in the built model */
        if (styles[i] != TRAIN_TP_NONE)
            plan[n++] = (fsdp_tp_plan_entry){fsdp_module_fqn(linear[i]),
                                             styles[i] == TRAIN_TP_COLWISE ? FSDP_COLWISE()
                                                                           : FSDP_ROWWISE()};
    /* every rank initialised the same values from train.seed: no broadcast needed */
    fsdp_tp_options o = {.src_rank = cfg->parallel.sync_module_states ? 0 : FSDP_NO_SRC_RANK};
    if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, model, tp, n, plan, &o);
    free(m);
    free(linear);
    free(styles);
    free(plan);
    return st;
}

fsdp_status train_plan_check_checkpointing(const train_kind *kind, const train_config *cfg,
                                           char *err, size_t err_size) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], key[TRAIN_KEY_TEXT_SIZE];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    if (n <= 0) return FSDP_OK;
    fsdp_ctx *ctx = NULL;
    fsdp_module *model = NULL, **mods = malloc(TRAIN_MAX_LAYERS * sizeof *mods);
    fsdp_ctx_options o = {.log_level = FSDP_LOG_OFF};
    fsdp_status st = mods ? fsdp_ctx_create(&o, &ctx) : FSDP_ERR_OUT_OF_MEMORY;
    if (st == FSDP_OK) st = kind->build(ctx, cfg, true, &model);
    int n_mod = st == FSDP_OK ? kind->checkpointable(model, mods, TRAIN_MAX_LAYERS) : 0;
    if (st != FSDP_OK)
        snprintf(err, err_size, "cannot list the modules of [model] kind = %s: %s", kind->name,
                 ctx ? fsdp_last_error(ctx) : "out of memory");
    for (int p = 0; st == FSDP_OK && p < n; p++) {
        int matched = 0;
        for (int i = 0; i < n_mod; i++)
            matched += fnmatch(patterns[p], fsdp_module_fqn(mods[i]), 0) == 0;
        if (matched) continue;
        char modules[512] = "";
        for (int i = 0; i < n_mod; i++)
            train_append(modules, sizeof modules, "%s%s (%s)", i ? ", " : "",
                         fsdp_module_fqn(mods[i]), fsdp_module_kind(mods[i]));
        snprintf(err, err_size,
                 "%s: pattern '%s' matches no module of the model; its modules are %s",
                 train_config_key_text(cfg, "model", "checkpoint_activations", key, sizeof key),
                 patterns[p], modules);
        st = FSDP_ERR_CONFIG;
    }
    fsdp_module_free(model);
    fsdp_ctx_free(ctx);
    free(mods);
    return st;
}

fsdp_status train_plan_checkpoint(fsdp_ctx *ctx, const train_kind *kind, const train_config *cfg,
                                  fsdp_module *model) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    if (n <= 0) return FSDP_OK;
    fsdp_module **mods = malloc(TRAIN_MAX_LAYERS * sizeof *mods);
    if (!mods) return fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory");
    int n_mod = kind->checkpointable(model, mods, TRAIN_MAX_LAYERS);
    fsdp_status st = FSDP_OK;
    for (int i = 0; st == FSDP_OK && i < n_mod; i++) {
        bool match = false;
        for (int p = 0; p < n && !match; p++)
            match = fnmatch(patterns[p], fsdp_module_fqn(mods[i]), 0) == 0;
        if (match) st = fsdp_checkpoint_wrap(ctx, mods[i]);
    }
    free(mods);
    return st;
}

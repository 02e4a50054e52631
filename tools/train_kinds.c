/* train_kinds.c: the table of fsdp-train's model kinds ([model] kind), and the module tree of
 * the model a configuration describes, for the checks of module names. Adding a kind: its file
 * (tools/kind_<name>.c, which CMake picks up) and its line below. */
#include "train_kind.h"

#include <stdlib.h>
#include <string.h>

extern const train_kind train_kind_mlp;   /* kind_mlp.c */
extern const train_kind train_kind_llama; /* kind_llama.c */

/* By [model] kind's value: its index here (train_model_kind names the first two). */
static const train_kind *const g_kinds[] = {
    &train_kind_mlp,
    &train_kind_llama,
};
#define N_KINDS ((int)(sizeof g_kinds / sizeof g_kinds[0]))
_Static_assert(TRAIN_MODEL_MLP == 0 && TRAIN_MODEL_LLAMA == 1, "the table's first two entries");
_Static_assert(N_KINDS <= 32, "train_key_kinds is a 32-bit mask");

int train_kind_count(void) {
    return N_KINDS;
}
const train_kind *train_kind_at(int i) {
    return g_kinds[i];
}
const char *train_kind_name(int i) {
    return i >= 0 && i < N_KINDS ? g_kinds[i]->name : NULL;
}
const char *train_kind_help(int i) {
    return i >= 0 && i < N_KINDS ? g_kinds[i]->help : NULL;
}

const train_kind *train_kind_of(const train_config *cfg) {
    int i = (int)cfg->model.kind;
    return g_kinds[i >= 0 && i < N_KINDS ? i : 0];
}

typedef struct module_walk {
    train_module_info *m;
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
    }
    w->n++;
    w->n_linear += linear;
    return FSDP_OK;
}

int train_kind_modules(const train_config *cfg, train_module_info *m, int max) {
    fsdp_ctx *ctx = NULL;
    fsdp_module *model = NULL;
    module_walk w = {.m = m, .max = max};
    fsdp_ctx_options o = {.log_level = FSDP_LOG_OFF};
    bool ok = fsdp_ctx_create(&o, &ctx) == FSDP_OK &&
              train_kind_of(cfg)->build(ctx, cfg, true, &model) == FSDP_OK &&
              fsdp_module_visit(ctx, model, visit, &w) == FSDP_OK;
    fsdp_module_free(model);
    fsdp_ctx_free(ctx);
    return ok ? w.n : -1;
}

int train_config_modules(const train_config *cfg, train_module_info *modules) {
    int n = train_kind_modules(cfg, modules, TRAIN_MAX_MODULES);
    return n < 0 ? 0 : n < TRAIN_MAX_MODULES ? n : TRAIN_MAX_MODULES;
}

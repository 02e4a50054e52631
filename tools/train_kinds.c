/* train_kinds.c: the table of fsdp-train's model kinds ([model] kind), their keys joined to the
 * list of keys, and the module names and TP styles of the model a configuration describes.
 * Adding a kind: its file (tools/kind_<name>.c, which CMake picks up) and its line below. */
#include <pthread.h>

#include "train_kind.h"
#include "train_plan.h" // defines: train_plan_modules, train_plan_styles

extern const train_kind train_kind_mlp;         /* kind_mlp.c */
extern const train_kind train_kind_llama;       /* kind_llama.c */
extern const train_kind train_kind_mlp_stacked; /* kind_mlp_stacked.c */

/* By [model] kind's value: its index here (train_model_kind names the first two). */
static const train_kind *const g_kinds[] = {
    &train_kind_mlp,
    &train_kind_llama,
    &train_kind_mlp_stacked,
};
#define N_KINDS ((int)(sizeof g_kinds / sizeof g_kinds[0]))
_Static_assert(TRAIN_MODEL_MLP == 0 && TRAIN_MODEL_LLAMA == 1, "the table's first two entries");
_Static_assert(N_KINDS <= TRAIN_MAX_KINDS, "raise TRAIN_MAX_KINDS");

int train_kind_count(void) {
    return N_KINDS;
}
const train_kind *train_kind_at(int i) {
    return g_kinds[i];
}

const train_kind *train_kind_of(const train_config *cfg) {
    int i = (int)cfg->model.kind;
    return g_kinds[i >= 0 && i < N_KINDS ? i : 0];
}

static train_kind_keys g_keys[N_KINDS];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void register_kinds(void) {
    for (int i = 0; i < N_KINDS; i++)
        g_keys[i] = (train_kind_keys){.name = g_kinds[i]->name,
                                      .help = g_kinds[i]->help,
                                      .keys = g_kinds[i]->keys,
                                      .n_keys = g_kinds[i]->n_keys};
    train_config_register_kinds(g_keys, N_KINDS);
}

void train_kinds_register(void) {
    pthread_once(&g_once, register_kinds);
}

int train_config_modules(const train_config *cfg, train_module_info *modules) {
    int n = train_plan_modules(train_kind_of(cfg), cfg, modules, TRAIN_MAX_MODULES);
    return n < 0 ? 0 : n < TRAIN_MAX_MODULES ? n : TRAIN_MAX_MODULES;
}

fsdp_status train_config_tp_plan(const train_config *cfg, train_tp_style *styles, char *err,
                                 size_t err_size) {
    return train_plan_styles_list(train_kind_of(cfg), cfg, styles, TRAIN_MAX_LIST, err, err_size);
}

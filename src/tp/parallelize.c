/* parallelize.c: parallelize_module: matches each plan key against the module tree segment by
 * segment with shell globs (fnmatch), checks the whole plan, then applies the styles. */
#define _POSIX_C_SOURCE 200809L
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/error.h"
#include "nn/nn.h"
#include "tp/tp_impl.h"

#define KEY_MAX 256

/* A growable list of modules. */
typedef struct module_list {
    fsdp_module **items;
    int n;
    int64_t cap;
} module_list;

static fsdp_status list_push(fsdp_ctx *ctx, module_list *l, fsdp_module *m) {
    if (!fsdp_array_reserve((void **)&l->items, &l->cap, l->n + 1, sizeof *l->items))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot grow a module list");
    l->items[l->n++] = m;
    return FSDP_OK;
}

/* "net1, relu, net2" into buf: the children of m. */
static const char *child_names(const fsdp_module *m, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    int n = fsdp_module_num_children(m);
    for (int i = 0; i < n && used + 1 < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "",
                         fsdp_module_name(fsdp_module_child(m, i)));
        if (w < 0) break;
        used += (size_t)w;
    }
    if (n == 0) snprintf(buf, size, "none");
    return buf;
}

/* Every module under root that key matches, in pre-order. */
static fsdp_status match_key(fsdp_ctx *ctx, fsdp_module *root, const char *key, module_list *out) {
    if (!key || !key[0] || strlen(key) >= KEY_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "plan key '%s' is empty or longer than %d bytes; keys are dotted module "
                         "paths such as \"layers.*.net1\" (apply a style to the root itself "
                         "with fsdp_tp_apply)",
                         key ? key : "(null)", KEY_MAX - 1);
    char copy[KEY_MAX];
    memcpy(copy, key, strlen(key) + 1);
    module_list cur = {0}, next = {0};
    fsdp_status st = list_push(ctx, &cur, root);
    char *save = NULL;
    for (char *seg = strtok_r(copy, ".", &save); st == FSDP_OK && seg;
         seg = strtok_r(NULL, ".", &save)) {
        next.n = 0;
        for (int i = 0; st == FSDP_OK && i < cur.n; i++)
            for (int c = 0; st == FSDP_OK && c < fsdp_module_num_children(cur.items[i]); c++) {
                fsdp_module *child = fsdp_module_child(cur.items[i], c);
                if (fnmatch(seg, fsdp_module_name(child), 0) == 0)
                    st = list_push(ctx, &next, child);
            }
        if (st == FSDP_OK && next.n == 0) {
            char names[512];
            const fsdp_module *at = cur.items[0];
            st = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                           "plan key '%s' matches no module: segment '%s' matches no child of "
                           "%s (its children: %s)",
                           key, seg,
                           fsdp_module_fqn(at)[0] ? fsdp_module_fqn(at) : "the root module",
                           child_names(at, names, sizeof names));
        }
        module_list t = cur;
        cur = next;
        next = t;
    }
    free(next.items);
    if (st == FSDP_OK) {
        *out = cur;
    } else {
        free(cur.items);
    }
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_tp_parallelize(fsdp_ctx *ctx, fsdp_module *root, const fsdp_mesh *mesh, int n,
                                const fsdp_tp_plan_entry *plan, const fsdp_tp_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, root);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    if (n > 0) FSDP_ARG_NOT_NULL(ctx, plan);
    if (n < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_tp_parallelize: n is %d; the plan's length is 0 or more", n);
    fsdp_device dev; /* the model's: the styles run there */
    FSDP_TRY_AT(ctx, fsdp_nn_check_one_device(ctx, root, "fsdp_tp_parallelize",
                                              "tensor parallelism", "parallelising it", &dev));
    module_list *matches = calloc((size_t)n + 1, sizeof *matches);
    if (!matches) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate plan matches");
    fsdp_status st = FSDP_OK;
    for (int e = 0; st == FSDP_OK && e < n; e++)
        st = match_key(ctx, root, plan[e].key, &matches[e]);
    /* A module claimed by two entries would get two styles. */
    for (int e = 0; st == FSDP_OK && e < n; e++)
        for (int i = 0; st == FSDP_OK && i < matches[e].n; i++)
            for (int f = 0; st == FSDP_OK && f < e; f++)
                for (int j = 0; st == FSDP_OK && j < matches[f].n; j++)
                    if (matches[e].items[i] == matches[f].items[j])
                        st = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                                       "plan keys '%s' and '%s' both match module '%s'; a module "
                                       "takes one style",
                                       plan[f].key, plan[e].key,
                                       fsdp_module_fqn(matches[e].items[i]));
    for (int e = 0; st == FSDP_OK && e < n; e++)
        for (int i = 0; st == FSDP_OK && i < matches[e].n; i++)
            st = tp_style_check(ctx, matches[e].items[i], &plan[e].style);
    /* SequenceParallel reads the sequence shards it receives as even ones: where the sequence
     * is split (a Rowwise output that leaves sharded), it must divide by the tp size. */
    bool sequence_parallel = false;
    for (int e = 0; e < n; e++)
        if (matches[e].n && plan[e].style.kind == FSDP_TP_SEQUENCE_PARALLEL)
            sequence_parallel = true;
    for (int e = 0; st == FSDP_OK && e < n; e++)
        for (int i = 0; st == FSDP_OK && i < matches[e].n; i++)
            st = tp_style_apply(ctx, matches[e].items[i], mesh, &plan[e].style, opts,
                                sequence_parallel);
    for (int e = 0; e < n; e++) free(matches[e].items);
    free(matches);
    return FSDP_PASS(ctx, st);
}

/* train_config_text.c: fsdp-train's configuration as text: --help, the effective configuration
 * written as an INI file, a saved one compared with this run's, and the check that the ranks of
 * an MPI job agree on it. All of it walks the one list of keys (train_keys.h). */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "train_config.h"
#include "train_kind.h" // defines: train_kinds_register

/* Writes text word-wrapped to 80 columns: the first line indented by `first` spaces, the others
 * by `rest`. */
static void print_wrapped(FILE *f, int first, int rest, const char *text) {
    int col = fprintf(f, "%*s", first, ""), start = col;
    while (*text) {
        size_t word = strcspn(text, " ");
        if (col > start && col + 1 + (int)word > 80) {
            fputc('\n', f);
            col = start = fprintf(f, "%*s", rest, "");
        } else if (col > start) {
            col += fprintf(f, " ");
        }
        col += fprintf(f, "%.*s", (int)word, text);
        text += word;
        while (*text == ' ') text++;
    }
    fputc('\n', f);
}

/* The help of key i: its kinds' helps, each "kind: help" when it belongs to some (one line
 * per kind); an enum's values' helps after its own. */
static void print_key_help(FILE *f, int i) {
    const train_key *k = train_key_at(i);
    char text[4096];
    unsigned kinds = train_key_kinds(i);
    if (!kinds && k->help_at) {
        snprintf(text, sizeof text, "%s:", k->help);
        for (int v = 0; k->names[v]; v++)
            train_append(text, sizeof text, "%s %s (%s)", v ? (k->names[v + 1] ? "," : " or") : "",
                         k->names[v], k->help_at(v));
        print_wrapped(f, 6, 6, text);
    } else if (!kinds) {
        print_wrapped(f, 6, 6, k->help);
    }
    for (int c = 0; train_key_kind_name(c); c++) {
        if (!(kinds & 1u << c)) continue;
        snprintf(text, sizeof text, "%s: %s", train_key_kind_name(c), train_key_kind_help(i, c));
        print_wrapped(f, 6, 6, text);
    }
}

static void print_key(FILE *f, int i) {
    const train_key *k = train_key_at(i);
    char text[512];
    if (*k->def)
        fprintf(f, "  %s = %s  (%s)\n", k->name, k->def, train_key_type_name(k));
    else
        fprintf(f, "  %s =  (%s, empty by default)\n", k->name, train_key_type_name(k));
    print_key_help(f, i);
    snprintf(text, sizeof text, "allowed: ");
    train_key_describe_expected(k, text + strlen(text), sizeof text - strlen(text));
    print_wrapped(f, 6, 6, text);
}

void train_config_print_usage(FILE *f) {
    fprintf(f, "usage: fsdp-train --config FILE [--set section.key=value ...] [--plan [--json]]\n"
               "       fsdp-train --help | --version\n");
}

void train_config_print_help(FILE *f) {
    train_kinds_register(); /* the kinds' keys join the list */
    train_config_print_usage(f);
    fprintf(f,
            "\n"
            "Trains the model a config file describes and prints its progress.\n\n"
            "options:\n"
            "  --config FILE            the run's configuration, an INI file\n"
            "  --set section.key=value  overrides one key after the file is read;\n"
            "                           repeatable, applied in order\n"
            "  --plan                   trains nothing: prints, per rank, the bytes of\n"
            "                           parameters, gradients, optimizer state, gathered\n"
            "                           FSDP units in flight and activations (with and\n"
            "                           without activation checkpointing), and the\n"
            "                           collectives of one step by op and mesh dim, as\n"
            "                           comm-debug counts them; estimated from the\n"
            "                           configuration, without running a rank\n"
            "  --json                   with --plan: the same as one JSON object\n"
            "  --help, -h               prints this help\n"
            "  --version                prints the version\n\n"
            "exit status: 0 success; 1 the run failed (a library call, a loss that is\n"
            "not finite, output that cannot be written, MPI ranks with different\n"
            "configurations); 2 bad command line or config; 130 stopped by SIGINT or\n"
            "SIGTERM with [checkpoint] dir set, after saving a checkpoint\n\n"
            "limits: a config file is a regular file of at most %d bytes,\n"
            "without NUL bytes, of lines of at most %d characters (the newline not\n"
            "counted); a --set value has at most %d characters\n\n"
            "config keys, by section (key = default (type), meaning, allowed values):\n",
            TRAIN_MAX_CONFIG_BYTES, TRAIN_MAX_LINE, TRAIN_MAX_VALUE);
    for (int s = 0; s < train_section_count(); s++) {
        char text[512];
        snprintf(text, sizeof text, "[%s]: %s", train_section_name(s), train_section_help(s));
        fputc('\n', f);
        print_wrapped(f, 0, 4, text);
        for (int i = 0; i < train_key_count(); i++)
            if (strcmp(train_key_at(i)->section, train_section_name(s)) == 0) print_key(f, i);
    }
}

void train_config_write(const train_config *cfg, FILE *f) {
    for (int s = 0; s < train_section_count(); s++) {
        fprintf(f, "%s[%s]\n", s ? "\n" : "", train_section_name(s));
        for (int i = 0; i < train_key_count(); i++) {
            const train_key *k = train_key_at(i);
            if (strcmp(k->section, train_section_name(s)) != 0) continue;
            char value[TRAIN_MAX_STRING + 64];
            train_key_format(cfg, k, value, sizeof value);
            fprintf(f, "%s = %s  ; %s\n", k->name, value, cfg->origin[i]);
        }
    }
}

/* ---- a configuration saved as text (a checkpoint's) -------------------------------------- */

/* Finds "name = value  ; origin" in [section] of saved: the value and the origin (without the
 * comment mark), each cut to its buffer. */
static bool saved_entry(const char *saved, const char *section, const char *name, char *value,
                        size_t value_size, char *origin, size_t origin_size) {
    bool in_section = false;
    size_t name_len = strlen(name);
    for (const char *line = saved; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (line[0] == '[') {
            const char *close = memchr(line, ']', len);
            in_section = close && (size_t)(close - line - 1) == strlen(section) &&
                         strncmp(line + 1, section, strlen(section)) == 0;
        } else if (in_section && len > name_len + 3 && strncmp(line, name, name_len) == 0 &&
                   strncmp(line + name_len, " = ", 3) == 0) {
            const char *v = line + name_len + 3, *line_end = line + len, *mark = v;
            while (mark + 4 <= line_end && strncmp(mark, "  ; ", 4) != 0) mark++;
            if (mark + 4 > line_end) mark = line_end;
            snprintf(value, value_size, "%.*s", (int)(mark - v), v);
            if (origin)
                snprintf(origin, origin_size, "%.*s",
                         mark == line_end ? 0 : (int)(line_end - mark - 4), mark + 4);
            return true;
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

bool train_config_saved_value(const char *saved, const char *section, const char *name, char *value,
                              size_t size) {
    return saved_entry(saved, section, name, value, size, NULL, 0);
}

static bool in_list(const char *const *list, const char *section, const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", section, name);
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], key) == 0) return true;
    return false;
}

fsdp_status train_config_compare_saved(const train_config *cfg, const char *saved,
                                       const char *const *sections, const char *const *except,
                                       char *err, size_t err_size) {
    for (int i = 0; i < train_key_count(); i++) {
        const train_key *k = train_key_at(i);
        bool wanted = false;
        for (int s = 0; sections[s]; s++) wanted |= strcmp(sections[s], k->section) == 0;
        if (!wanted || in_list(except, k->section, k->name)) continue;
        char mine[TRAIN_MAX_STRING + 64], theirs[TRAIN_MAX_STRING + 64], origin[TRAIN_MAX_ORIGIN];
        train_key_format(cfg, k, mine, sizeof mine);
        if (!saved_entry(saved, k->section, k->name, theirs, sizeof theirs, origin,
                         sizeof origin)) {
            /* saved before the key existed: it had the default's value */
            train_config tmp;
            memset(&tmp, 0, sizeof tmp);
            char why[256];
            if (!train_key_parse(k, k->def, &tmp, why, sizeof why)) continue;
            train_key_format(&tmp, k, theirs, sizeof theirs);
            snprintf(origin, sizeof origin, "default, not in the saved configuration");
        }
        if (strcmp(mine, theirs) == 0) continue;
        snprintf(err, err_size, "[%s] %s = %s (%s) here, but %s (%s) in the saved configuration",
                 k->section, k->name, mine, cfg->origin[i], theirs, origin);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* ---- the ranks agree on one configuration ----------------------------------------------- */

#define FNV_BASIS UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

/* Key i's canonical text, "section.name=value" and its NUL, folded into the FNV-1a hash h. */
static uint64_t hash_key(const train_config *cfg, int i, uint64_t h) {
    char text[TRAIN_MAX_STRING + 128];
    snprintf(text, sizeof text, "%s.%s=", train_key_at(i)->section, train_key_at(i)->name);
    train_key_format(cfg, train_key_at(i), text + strlen(text), sizeof text - strlen(text));
    for (size_t j = 0, n = strlen(text) + 1; j < n; j++)
        h = (h ^ (unsigned char)text[j]) * FNV_PRIME;
    return h;
}

uint64_t train_config_hash(const train_config *cfg) {
    uint64_t h = FNV_BASIS;
    int n_keys = train_key_count();
    for (int i = 0; i < n_keys; i++) h = hash_key(cfg, i, h);
    return h;
}

#define SHARED_TEXT_SIZE (TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 8) /* "value (origin)" */

/* Group rank root's text (SHARED_TEXT_SIZE bytes) on every rank, a byte per f32. */
static fsdp_status share_text(fsdp_ctx *ctx, fsdp_group *group, int root, char *text) {
    fsdp_tensor *t = NULL;
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){SHARED_TEXT_SIZE}, &t);
    if (st == FSDP_OK) {
        float *p = fsdp_tensor_f32(t);
        for (int i = 0; i < SHARED_TEXT_SIZE; i++) p[i] = (float)(unsigned char)text[i];
        st = fsdp_broadcast(ctx, group, t, root);
        for (int i = 0; st == FSDP_OK && i < SHARED_TEXT_SIZE; i++) text[i] = (char)(int)p[i];
        text[SHARED_TEXT_SIZE - 1] = '\0';
    }
    fsdp_tensor_free(t);
    return st;
}

/* The message of a mismatch, the same on every rank: the first key (in table order) that
 * differs, with its value and origin on group rank 0 and on the first rank that differs. */
static fsdp_status describe_mismatch(fsdp_ctx *ctx, fsdp_group *group, const train_config *cfg,
                                     const uint64_t *all, char *err, size_t err_size) {
    int n = fsdp_group_size(group), key = -1, other = -1, more = 0, n_keys = train_key_count();
    for (int i = 0; i < n_keys; i++) {
        int r = 1;
        while (r < n && all[r * n_keys + i] == all[i]) r++;
        if (r == n) continue;
        if (key < 0)
            key = i, other = r;
        else
            more++;
    }
    if (key < 0) { /* the whole hashes differ while every key's agrees: a collision */
        snprintf(err, err_size,
                 "the ranks were started with different configurations (their hashes differ); "
                 "give every rank the same config file and --set options");
        return FSDP_ERR_STATE;
    }
    const train_key *k = train_key_at(key);
    char text[2][SHARED_TEXT_SIZE], value[TRAIN_MAX_STRING]; /* the longest: a string key */
    train_key_format(cfg, k, value, sizeof value);
    for (int side = 0; side < 2; side++) {
        snprintf(text[side], SHARED_TEXT_SIZE, "%s (%s)", value, cfg->origin[key]);
        fsdp_status st = share_text(ctx, group, side ? other : 0, text[side]);
        if (st != FSDP_OK) return st;
    }
    snprintf(err, err_size,
             "the ranks were started with different configurations: [%s] %s = %s on rank %d, "
             "but %s on rank %d",
             k->section, k->name, text[0], fsdp_group_world_rank(group, 0), text[1],
             fsdp_group_world_rank(group, other));
    if (more)
        train_append(err, err_size, " (and %d more key%s differ%s)", more, more == 1 ? "" : "s",
                     more == 1 ? "s" : "");
    train_append(err, err_size, "; give every rank the same config file and --set options");
    return FSDP_ERR_STATE;
}

fsdp_status train_config_agree(fsdp_ctx *ctx, fsdp_group *group, const train_config *cfg, char *err,
                               size_t err_size) {
    if (!group) group = fsdp_ctx_world_group(ctx);
    int n = fsdp_group_size(group), n_keys = train_key_count();
    err[0] = '\0';
    if (n <= 1) return FSDP_OK;
    uint64_t mine[TRAIN_MAX_KEYS], *all = malloc((size_t)n * n_keys * sizeof *all);
    if (!all) {
        snprintf(err, err_size, "comparing the ranks' configurations: out of memory");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    mine[0] = train_config_hash(cfg);
    fsdp_status st = fsdp_all_gather_u64(ctx, group, mine, 1, all);
    int r = 1;
    while (st == FSDP_OK && r < n && all[r] == all[0]) r++;
    if (st == FSDP_OK && r < n) { /* every rank sees the same hashes and takes this branch */
        for (int i = 0; i < n_keys; i++) mine[i] = hash_key(cfg, i, FNV_BASIS);
        st = fsdp_all_gather_u64(ctx, group, mine, n_keys, all);
        if (st == FSDP_OK) st = describe_mismatch(ctx, group, cfg, all, err, err_size);
    }
    if (st != FSDP_OK && !err[0])
        snprintf(err, err_size, "comparing the ranks' configurations: %s", fsdp_last_error(ctx));
    free(all);
    return st;
}

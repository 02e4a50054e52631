/* import_hf.c: a Hugging Face model directory as an import source for fsdp_ckpt_import:
 * config.json (kept as the model configuration) and model.safetensors, or the safetensors shards
 * that model.safetensors.index.json lists. Each shard is a safetensors source (safetensors.c);
 * this source lists their tensors one after another. Nothing is trusted: file names in the index
 * are plain names inside the directory, every listed tensor is in the file the index names and
 * every tensor of a file is listed. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/import_source.h"
#include "core/error.h"

#define HF_MAX_INDEX (64 << 20) /* bytes of model.safetensors.index.json */
#define HF_MAX_FILES 4096       /* safetensors shards of one model */

static fsdp_status hf_read(fsdp_ctx *ctx, import_source *src, int i, void *dst) {
    const import_tensor *t = &src->tensors[i];
    import_source *part = &src->parts[t->part];
    return part->iface->read(ctx, part, t->part_index, dst);
}

static void hf_close(import_source *src) {
    for (int p = 0; p < src->n_parts; p++) {
        import_source *part = &src->parts[p];
        if (part->iface) part->iface->close(part);
        free(part->tensors);
        free((char *)part->path);
    }
    free(src->parts);
    free(src->model_config);
    src->parts = NULL, src->n_parts = 0, src->model_config = NULL;
}

static const import_source_i hf_iface = {.read = hf_read, .close = hf_close};

/* A whole small text file, malloc'ed; *missing when it does not exist. */
static fsdp_status read_text(fsdp_ctx *ctx, const char *path, size_t max, bool *missing,
                             char **out) {
    struct stat sb;
    *out = NULL;
    *missing = stat(path, &sb) != 0;
    if (*missing) return FSDP_OK;
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "'%s' is not a regular file of at most %zu bytes; is this a Hugging Face "
                         "model directory?",
                         path, max);
    FILE *f = fopen(path, "rb");
    char *text = malloc((size_t)sb.st_size + 1);
    size_t got = f && text ? fread(text, 1, (size_t)sb.st_size, f) : 0;
    if (f) fclose(f);
    if (!text || got != (size_t)sb.st_size) {
        free(text);
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot read '%s'", path);
    }
    text[got] = '\0';
    if (strlen(text) != got) {
        free(text);
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "'%s' holds a NUL byte: it is not a JSON text", path);
    }
    *out = text;
    return FSDP_OK;
}

static fsdp_status parse_object(fsdp_ctx *ctx, const char *path, const char *text, json_t **out) {
    json_error_t err;
    *out = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (*out && json_is_object(*out)) return FSDP_OK;
    json_decref(*out);
    *out = NULL;
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "'%s' is not a JSON object (%s, line %d); save the model "
                     "again with save_pretrained",
                     path, err.text, err.line);
}

/* A shard's file name: a plain name in the directory, nothing that climbs out of it. */
static bool plain_name(const char *n) {
    size_t len = strlen(n);
    if (!len || len > 255 || !strcmp(n, ".") || !strcmp(n, "..")) return false;
    for (; *n; n++)
        if ((unsigned char)*n < 0x20 || *n == '/' || *n == '\\') return false;
    return true;
}

static fsdp_status open_part(fsdp_ctx *ctx, import_source *src, const char *dir, const char *file) {
    import_source *part = &src->parts[src->n_parts];
    size_t len = strlen(dir) + strlen(file) + 2;
    char *path = malloc(len);
    if (!path) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    snprintf(path, len, "%s/%s", dir, file);
    src->n_parts++;
    return import_open_safetensors(ctx, path, part); /* part->path = path, freed by hf_close */
}

/* The files the index's weight_map names, each opened once, in order of first mention. */
static fsdp_status open_indexed(fsdp_ctx *ctx, import_source *src, const char *dir,
                                const char *index_path, json_t *map) {
    const char **files = calloc(HF_MAX_FILES + 1, sizeof *files);
    src->parts = calloc(HF_MAX_FILES + 1, sizeof *src->parts);
    if (!files || !src->parts) {
        free(files);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    }
    fsdp_status s = FSDP_OK;
    int n_files = 0;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        const char *file = json_string_value(v);
        if (!file || !plain_name(file)) {
            s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                          "'%s': tensor '%.255s' maps to %s, not the name of a file in the "
                          "directory",
                          index_path, key, file ? "a path" : "no string");
            break;
        }
        int k = 0;
        while (k < n_files && strcmp(files[k], file)) k++;
        if (k < n_files) continue;
        if (n_files == HF_MAX_FILES) {
            s = FSDP_FAIL(ctx, FSDP_ERR_IO, "'%s' names more than %d files", index_path,
                          HF_MAX_FILES);
            break;
        }
        files[n_files++] = file;
    }
    for (int k = 0; s == FSDP_OK && k < n_files; k++) s = open_part(ctx, src, dir, files[k]);
    /* Every tensor of a file is listed for that file; with names unique per file and the
     * counts equal, the index and the files agree exactly. */
    int64_t total = 0;
    for (int p = 0; s == FSDP_OK && p < src->n_parts; p++) {
        const import_source *part = &src->parts[p];
        for (int i = 0; s == FSDP_OK && i < part->n_tensors; i++) {
            const char *want = json_string_value(json_object_get(map, part->tensors[i].name));
            if (!want || strcmp(want, files[p]))
                s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                              "'%s' holds tensor '%s', which '%s' %s: the index and the files "
                              "disagree; save the model again",
                              part->path, part->tensors[i].name, index_path,
                              want ? "places in another file" : "does not list");
        }
        total += part->n_tensors;
    }
    if (s == FSDP_OK && total != (int64_t)json_object_size(map))
        s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                      "'%s' lists %zu tensors but its files hold %lld: a listed tensor is "
                      "missing from its file; save the model again",
                      index_path, json_object_size(map), (long long)total);
    free(files);
    return FSDP_PASS(ctx, s);
}

/* The parts' tensors listed one after another as this source's. */
static fsdp_status list_tensors(fsdp_ctx *ctx, import_source *src) {
    int64_t n = 0;
    for (int p = 0; p < src->n_parts; p++) n += src->parts[p].n_tensors;
    if (n > (1 << 24)) return FSDP_FAIL(ctx, FSDP_ERR_IO, "'%s': too many tensors", src->path);
    src->tensors = calloc((size_t)n + 1, sizeof *src->tensors);
    if (!src->tensors) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    for (int p = 0; p < src->n_parts; p++)
        for (int i = 0; i < src->parts[p].n_tensors; i++) {
            import_tensor *t = &src->tensors[src->n_tensors++];
            *t = src->parts[p].tensors[i];
            t->h5_path = NULL;
            t->part = p, t->part_index = i;
        }
    return FSDP_OK;
}

fsdp_status import_open_hf_dir(fsdp_ctx *ctx, const char *dir, import_source *out) {
    *out = (import_source){.iface = &hf_iface, .path = dir, .h5 = -1};
    char path[4200];
    bool missing;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FSDP_TRY_AT(ctx, read_text(ctx, path, FSDP_HF_CONFIG_MAX, &missing, &out->model_config));
    if (missing)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "'%s' is a directory without config.json, so not a Hugging Face model "
                         "(save_pretrained writes one); pass a state dict file, or a checkpoint "
                         "directory where one is taken",
                         dir);
    json_t *j = NULL;
    FSDP_TRY_AT(ctx, parse_object(ctx, path, out->model_config, &j));
    json_decref(j);
    char *index = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FSDP_TRY_AT(ctx, read_text(ctx, path, HF_MAX_INDEX, &missing, &index));
    fsdp_status s = FSDP_OK;
    if (missing) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        struct stat sb;
        if (stat(path, &sb) != 0)
            return FSDP_FAIL(ctx, FSDP_ERR_IO,
                             "'%s' has neither model.safetensors nor model.safetensors.index.json: "
                             "save the model with save_pretrained(dir, safe_serialization=True) "
                             "(pytorch_model.bin is not read)",
                             dir);
        if (!(out->parts = calloc(2, sizeof *out->parts)))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
        s = open_part(ctx, out, dir, "model.safetensors");
    } else {
        s = parse_object(ctx, path, index, &j);
        json_t *map = s == FSDP_OK ? json_object_get(j, "weight_map") : NULL;
        if (s == FSDP_OK && !json_is_object(map))
            s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                          "'%s' has no \"weight_map\" object; save the model again", path);
        if (s == FSDP_OK) s = open_indexed(ctx, out, dir, path, map);
        json_decref(j);
        free(index);
    }
    if (s == FSDP_OK) s = list_tensors(ctx, out);
    return FSDP_PASS(ctx, s);
}

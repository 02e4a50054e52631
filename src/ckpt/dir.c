/* dir.c: checkpoint directories: temporary while written, committed by a marker and a rename,
 * pruned to the newest K. A directory without its marker is never loaded. */
#define _POSIX_C_SOURCE 200809L /* strdup, strnlen, stpcpy, fsync */
#include "ckpt/dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "core/array.h"
#include "core/error.h"

static fsdp_status make_dirs(fsdp_ctx *ctx, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) break;
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot create checkpoint directory '%s': %s", dir,
                         strerror(errno));
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "'%s' exists and is not a directory", dir);
    return FSDP_OK;
}

/* Removes a checkpoint directory: its commit marker first, so that a directory left half
 * removed (a crash while pruning) is never loaded; then the other files, then itself. */
int ckpt_dir_remove(const char *path) {
    char file[4400];
    snprintf(file, sizeof file, "%s/%s", path, CKPT_COMMIT);
    unlink(file);
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(file, sizeof file, "%s/%s", path, de->d_name);
        unlink(file);
    }
    closedir(d);
    return rmdir(path);
}

/* "step-<8 digits>" (or ".step-<8 digits>.tmp" when tmp): the step, else -1. */
static long long step_of(const char *name, int tmp) {
    const char *p = name;
    if (tmp && *p++ != '.') return -1;
    if (strncmp(p, "step-", 5)) return -1;
    p += 5;
    if (strspn(p, "0123456789") != 8) return -1;
    if (strcmp(p + 8, tmp ? ".tmp" : "")) return -1;
    return atoll(p);
}

/* Whether dir/name holds its commit marker. */
static bool has_marker(const char *dir, const char *name) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, CKPT_COMMIT);
    return access(path, F_OK) == 0;
}

fsdp_status ckpt_dir_begin(fsdp_ctx *ctx, const char *dir, const char *tmp) {
    FSDP_TRY_AT(ctx, make_dirs(ctx, dir));
    DIR *d = opendir(dir);
    if (!d) return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot list '%s': %s", dir, strerror(errno));
    struct dirent *de;
    char path[4400];
    /* What saves left: a failed save's temporary directory, and a step directory without its
     * marker (a removal cut short: its marker goes first), which is never loaded. */
    while ((de = readdir(d))) {
        bool left = step_of(de->d_name, 1) >= 0 ||
                    (step_of(de->d_name, 0) >= 0 && !has_marker(dir, de->d_name));
        if (!left) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (ckpt_dir_remove(path) != 0)
            fsdp_log(ctx, FSDP_LOG_WARN, "could not remove '%s', left by an earlier save: %s", path,
                     strerror(errno));
    }
    closedir(d);
    if (mkdir(tmp, 0755) != 0)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    return FSDP_OK;
}

/* The committed steps under dir, ascending; *n receives how many. */
static long long *committed_steps(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    long long *steps = NULL;
    int64_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long s = step_of(de->d_name, 0);
        if (s < 0 || !has_marker(dir, de->d_name)) continue;
        if (!fsdp_array_reserve((void **)&steps, &cap, *n + 1, sizeof *steps)) break;
        steps[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* insertion sort: few checkpoints */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return steps;
}

static void prune(fsdp_ctx *ctx, const char *dir, int keep) {
    int n;
    long long *steps = committed_steps(dir, &n);
    char path[4400];
    for (int i = 0; i + keep < n; i++) {
        snprintf(path, sizeof path, "%s/step-%08lld", dir, steps[i]);
        if (ckpt_dir_remove(path) != 0)
            fsdp_log(ctx, FSDP_LOG_WARN, "could not remove old checkpoint '%s': %s", path,
                     strerror(errno));
    }
    free(steps);
}

static fsdp_status write_marker(fsdp_ctx *ctx, const char *tmp) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", tmp, CKPT_COMMIT);
    FILE *f = fopen(path, "w");
    bool ok = f && fprintf(f, "libfsdp checkpoint format %d\n", FSDP_CKPT_FORMAT_VERSION) > 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    FSDP_TRY_AT(ctx, ckpt_sync_path(ctx, path));
    return ckpt_sync_path(ctx, tmp);
}

fsdp_status ckpt_dir_commit(fsdp_ctx *ctx, const char *tmp, const char *final, const char *dir,
                            int keep) {
    FSDP_TRY_AT(ctx, write_marker(ctx, tmp));
    if (ckpt_dir_remove(final) != 0 && errno != ENOENT)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot replace '%s': %s", final, strerror(errno));
    if (rename(tmp, final) != 0)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, final,
                         strerror(errno));
    FSDP_TRY_AT(ctx, ckpt_sync_path(ctx, dir));
    if (keep > 0) prune(ctx, dir, keep);
    return FSDP_OK;
}

fsdp_status ckpt_dir_check_committed(fsdp_ctx *ctx, const char *path) {
    char marker[4400];
    snprintf(marker, sizeof marker, "%s/%s", path, CKPT_COMMIT);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND,
                         "checkpoint '%s' does not exist or is not a "
                         "directory",
                         path);
    if (access(marker, F_OK) != 0)
        return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND,
                         "'%s' has no commit marker: its save did not finish, so it is never "
                         "loaded; use an earlier checkpoint",
                         path);
    return FSDP_OK;
}

fsdp_status fsdp_ckpt_latest(fsdp_ctx *ctx, const char *dir, char **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, dir);
    FSDP_ARG_NOT_NULL(ctx, out);
    int n;
    long long *steps = committed_steps(dir, &n);
    if (n == 0) {
        free(steps);
        return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND, "no committed checkpoint in '%s'", dir);
    }
    size_t len = strlen(dir) + 32;
    *out = malloc(len);
    if (*out) snprintf(*out, len, "%s/step-%08lld", dir, steps[n - 1]);
    free(steps);
    return *out ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_ckpt_latest");
}

/* train_ckpt.c: fsdp-train's checkpoints: resolving [model] init and [checkpoint] resume,
 * loading a checkpoint at the run's layout with messages that name the tensor, the shapes,
 * the key and the fix, and saving the run with the loop's position. */
#define _DEFAULT_SOURCE // flock; and POSIX 2008: open_memstream, stat

#include "train_ckpt.h"
#include "tool_fs.h"    // defines: tool_make_scratch_dir, tool_remove_tree
#include "train_kind.h" // defines: train_kind_of

#include <errno.h>
#include <fcntl.h> // defines: open, O_CLOEXEC
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h> // defines: flock
#include <sys/stat.h> // defines: stat, S_ISDIR, S_ISREG
#include <time.h>
#include <unistd.h> // defines: pread, pwrite, ftruncate, gethostname

/* The extras a checkpoint of fsdp-train holds (train_progress). */
static const char *const g_extra_names[] = {"train.step", "data.position", "log.loss_sum_bits",
                                            "log.steps_since"};
#define N_EXTRAS ((int)(sizeof g_extra_names / sizeof g_extra_names[0]))

/* ---- what the run starts from --------------------------------------------------------------- */

/* Makes dir and its parents; 0, or -1 with errno. */
static int make_dirs(const char *dir) {
    char path[TRAIN_CKPT_PATH];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Who holds the lock of fd: "process 1234 on host" as its holder wrote it, or "" when unknown. */
static void lock_holder(int fd, char *buf, size_t size) {
    ssize_t n = pread(fd, buf, size - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
}

fsdp_status train_ckpt_claim_dir(const train_config *cfg, int *fd, char *err, size_t err_size) {
    const char *dir = cfg->checkpoint.dir;
    char path[TRAIN_CKPT_PATH + 16], key[1024], me[128], other[256] = "";
    train_config_key_text(cfg, "checkpoint", "dir", key, sizeof key);
    snprintf(path, sizeof path, "%s/.lock", dir);
    bool made = make_dirs(dir) == 0;
    *fd = made ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    if (*fd < 0) {
        snprintf(err, err_size,
                 "cannot write checkpoints into %s: %s '%s': %s; give a directory this run can "
                 "write",
                 key, made ? "cannot write to" : "cannot create", dir, strerror(errno));
        return FSDP_ERR_IO;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        lock_holder(*fd, other, sizeof other);
        close(*fd);
        *fd = -1;
        if (e == EWOULDBLOCK)
            snprintf(err, err_size,
                     "%s is in use by another run (%s, which holds '%s'): two runs saving into "
                     "one directory would replace and prune each other's checkpoints; give this "
                     "run another directory, or wait until that run has ended",
                     key, other[0] ? other : "a process that did not say which", path);
        else
            snprintf(err, err_size, "cannot lock '%s' (%s): %s", path, key, strerror(e));
        return e == EWOULDBLOCK ? FSDP_ERR_STATE : FSDP_ERR_IO;
    }
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    int len = snprintf(me, sizeof me, "process %ld on %s\n", (long)getpid(), host[0] ? host : "?");
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, me, (size_t)len, 0) != len) {
        snprintf(err, err_size, "cannot write checkpoints into %s: cannot write '%s': %s", key,
                 path, strerror(errno));
        train_ckpt_release_dir(*fd);
        *fd = -1;
        return FSDP_ERR_IO;
    }
    return FSDP_OK;
}

void train_ckpt_release_dir(int fd) {
    if (fd >= 0) close(fd); /* the lock goes with it */
}

/* path itself when it is a committed checkpoint, else the newest committed one under it. */
static fsdp_status checkpoint_path(fsdp_ctx *ctx, const char *path, char *out, size_t size) {
    char *latest = NULL;
    if (fsdp_ckpt_latest(ctx, path, &latest) == FSDP_OK) {
        snprintf(out, size, "%s", latest);
        free(latest);
        return FSDP_OK;
    }
    snprintf(out, size, "%s", path);
    fsdp_ckpt *ck = NULL;
    fsdp_status st = fsdp_ckpt_open(ctx, out, &ck);
    fsdp_ckpt_close(ck);
    if (st == FSDP_OK) fsdp_clear_error(ctx); /* the search's "none under it" was no failure */
    return st;
}

static fsdp_status resolve_resume(fsdp_ctx *ctx, const train_config *cfg, train_sources *src,
                                  char *err, size_t err_size) {
    const char *r = cfg->checkpoint.resume, *dir = cfg->checkpoint.dir;
    char key[1024];
    if (strcmp(r, "none") == 0) return FSDP_OK;
    if (strcmp(r, "auto") == 0) {
        if (!dir[0]) return FSDP_OK;
        struct stat sb;
        char *latest = NULL;
        fsdp_status st =
            stat(dir, &sb) == 0 ? fsdp_ckpt_latest(ctx, dir, &latest) : FSDP_ERR_NOT_FOUND;
        if (st == FSDP_ERR_NOT_FOUND) { /* a fresh start, not a failure */
            fsdp_clear_error(ctx);
            snprintf(src->note, sizeof src->note,
                     "resume: no checkpoint in '%s' yet: starting from step 0", dir);
            return FSDP_OK;
        }
        if (st != FSDP_OK) {
            snprintf(err, err_size, "looking for the newest checkpoint in '%s' (%s): %s", dir,
                     train_config_key_text(cfg, "checkpoint", "resume", key, sizeof key),
                     fsdp_last_error(ctx));
            return st;
        }
        snprintf(src->resume, sizeof src->resume, "%s", latest);
        free(latest);
        return FSDP_OK;
    }
    fsdp_status st = checkpoint_path(ctx, r, src->resume, sizeof src->resume);
    if (st != FSDP_OK) {
        snprintf(err, err_size,
                 "cannot resume from %s: %s; give a checkpoint step directory "
                 "(<dir>/step-<8 digits>) or a directory of them, auto or none",
                 train_config_key_text(cfg, "checkpoint", "resume", key, sizeof key),
                 fsdp_last_error(ctx));
        src->resume[0] = '\0';
    }
    return st;
}

static fsdp_status resolve_init(fsdp_ctx *ctx, const train_config *cfg, train_sources *src,
                                char *err, size_t err_size) {
    const char *init = cfg->model.init;
    char key[1024];
    if (strcmp(init, "random") == 0) return FSDP_OK;
    train_config_key_text(cfg, "model", "init", key, sizeof key);
    if (src->resume[0]) {
        snprintf(src->note + strlen(src->note), sizeof src->note - strlen(src->note),
                 "%s%s is not used: the run resumes", src->note[0] ? "\n" : "", key);
        return FSDP_OK;
    }
    struct stat sb;
    if (stat(init, &sb) != 0) {
        snprintf(err, err_size,
                 "%s: %s; give random, a checkpoint directory, a PyTorch state dict file "
                 "(.safetensors or HDF5) or a Hugging Face model directory",
                 key, strerror(errno));
        return FSDP_ERR_CONFIG;
    }
    fsdp_status st;
    /* A directory with config.json is a Hugging Face model, imported like a state dict file. */
    char hf_config[4200];
    snprintf(hf_config, sizeof hf_config, "%s/config.json", init);
    if (S_ISDIR(sb.st_mode) && stat(hf_config, &sb) != 0) {
        if ((st = checkpoint_path(ctx, init, src->init, sizeof src->init)) != FSDP_OK) {
            snprintf(err, err_size, "%s is not a checkpoint: %s", key, fsdp_last_error(ctx));
            src->init[0] = '\0';
        }
        return st;
    }
    if (!tool_make_scratch_dir("fsdp-train-init", src->tmp, sizeof src->tmp)) {
        snprintf(err, err_size, "importing %s: cannot make a temporary directory '%s': %s", key,
                 src->tmp, strerror(errno));
        src->tmp[0] = '\0';
        return FSDP_ERR_IO;
    }
    fsdp_ckpt_import_options o = {.zstd_level = FSDP_CKPT_NO_COMPRESSION};
    if ((st = fsdp_ckpt_import(ctx, init, src->tmp, &o)) != FSDP_OK) {
        snprintf(err, err_size, "importing %s: %s", key, fsdp_last_error(ctx));
        return st;
    }
    snprintf(src->init, sizeof src->init, "%s/step-00000000", src->tmp);
    return FSDP_OK;
}

fsdp_status train_sources_resolve(fsdp_ctx *ctx, const train_config *cfg, train_sources *src,
                                  char *err, size_t err_size) {
    memset(src, 0, sizeof *src);
    fsdp_ctx *own = NULL;
    if (!ctx) {
        fsdp_ctx_options o = train_config_ctx_options(cfg);
        if (fsdp_ctx_create(&o, &own) != FSDP_OK) {
            snprintf(err, err_size, "cannot create a context (out of memory?)");
            return FSDP_ERR_OUT_OF_MEMORY;
        }
        ctx = own;
    }
    fsdp_status st = resolve_resume(ctx, cfg, src, err, err_size);
    if (st == FSDP_OK) st = resolve_init(ctx, cfg, src, err, err_size);
    fsdp_ctx_free(own);
    return st;
}

void train_ckpt_start_blame(const train_config *cfg, const train_sources *src, char *buf,
                            size_t size) {
    char key[1024];
    buf[0] = '\0';
    if (src->resume[0])
        snprintf(buf, size,
                 "the parameters of the checkpoint it resumed from, '%s', are not finite or "
                 "overflow float32 (was it saved after its run diverged?): resume from an earlier "
                 "checkpoint (--set checkpoint.resume=<its step directory>) or start anew "
                 "(--set checkpoint.resume=none)",
                 src->resume);
    else if (src->init[0])
        snprintf(buf, size,
                 "the parameters of %s are not finite or overflow float32 (saved after a run "
                 "diverged?): give other initial parameters",
                 train_config_key_text(cfg, "model", "init", key, sizeof key));
}

void train_sources_free(train_sources *src) {
    if (src->tmp[0]) tool_remove_tree(src->tmp);
    src->tmp[0] = '\0';
}

/* ---- loading ---------------------------------------------------------------------------- */

static void format_shape(int ndim, const int64_t *shape, char *buf, size_t size) {
    buf[0] = '\0';
    train_append(buf, size, "(");
    for (int d = 0; d < ndim; d++)
        train_append(buf, size, "%s%lld", d ? ", " : "", (long long)shape[d]);
    train_append(buf, size, ")");
}

/* The MLP's key that differs from the saved configuration: norm (a saved configuration without
 * it had none), or widths; *saved its saved value ("" when unknown). */
static const char *mlp_shape_key(const train_config *cfg, fsdp_ckpt *ck, char *saved, size_t size) {
    const char *norm = cfg->model.norm == TRAIN_NORM_RMSNORM ? "rmsnorm" : "none";
    if (!train_config_saved_value(fsdp_ckpt_config(ck), "model", "norm", saved, size))
        snprintf(saved, size, "none");
    if (strcmp(saved, norm) != 0) return "norm";
    if (!train_config_saved_value(fsdp_ckpt_config(ck), "model", "widths", saved, size))
        saved[0] = '\0';
    return "widths";
}

/* What to change when a state's tensor has another shape than this model's: the kind's keys
 * (the MLP: widths, or norm, with the saved value), for a resumed run or an init. */
static void shape_advice(const train_config *cfg, fsdp_ckpt *ck, bool resume, char *err,
                         size_t err_size) {
    const train_kind *kind = train_kind_of(cfg);
    char key[1024], saved[TRAIN_MAX_STRING];
    if (kind->shape_keys) { /* a kind with its own shape keys (llama) */
        train_append(err, err_size, "the shape of [model] kind = %s is set by [model] %s); ",
                     kind->name, kind->shape_keys);
        if (resume)
            train_append(err, err_size,
                         "set those [model] keys to the checkpoint's, or start anew: "
                         "[checkpoint] resume = none, or another [checkpoint] dir");
        else
            train_append(err, err_size,
                         "set those [model] keys to the state's, or give another [model] init "
                         "(a Hugging Face model directory gives them itself)");
        return;
    }
    const char *name = mlp_shape_key(cfg, ck, saved, sizeof saved);
    train_append(err, err_size, "%s", train_config_key_text(cfg, "model", name, key, sizeof key));
    if (saved[0]) train_append(err, err_size, "; it was saved with %s = %s", name, saved);
    train_append(err, err_size, "); ");
    if (resume)
        train_append(err, err_size,
                     "set [model] %s to the checkpoint's, or start anew: [checkpoint] "
                     "resume = none, or another [checkpoint] dir",
                     name);
    else if (strcmp(name, "norm") == 0)
        train_append(err, err_size,
                     "set [model] norm to the state's, or give another [model] init");
    else
        train_append(err, err_size,
                     "set [model] widths to the state's (Linear i's weight is (widths[i+1], "
                     "widths[i])), or give another [model] init");
}

/* The first parameter of the state whose shape differs in ck: the message names it, both
 * shapes, the kind's shape keys here and there, and the fix. */
static fsdp_status check_shapes(fsdp_ctx *ctx, const train_config *cfg, const fsdp_state *st,
                                fsdp_ckpt *ck, const char *path, bool resume, char *err,
                                size_t err_size) {
    for (int i = 0; i < fsdp_state_num_entries(st); i++) {
        fsdp_state_entry e;
        fsdp_ckpt_tensor t;
        if (fsdp_state_entry_get(ctx, st, i, &e) != FSDP_OK || e.kind != FSDP_STATE_PARAM) continue;
        int k = fsdp_ckpt_find(ck, e.name);
        if (k < 0 || fsdp_ckpt_tensor_get(ctx, ck, k, &t) != FSDP_OK) continue; /* strict load */
        bool same = t.ndim == e.ndim;
        for (int d = 0; same && d < e.ndim; d++) same = t.shape[d] == e.shape[d];
        if (same) continue;
        char theirs[128], mine[128];
        format_shape(t.ndim, t.shape, theirs, sizeof theirs);
        format_shape(e.ndim, e.shape, mine, sizeof mine);
        snprintf(err, err_size,
                 "checkpoint '%s' holds another model: tensor '%s' is %s there but %s in this "
                 "model (",
                 path, e.name, theirs, mine);
        shape_advice(cfg, ck, resume, err, err_size);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* Opens path and checks that it holds this model's shapes. */
static fsdp_status open_checked(fsdp_ctx *ctx, const train_config *cfg, const fsdp_state *st,
                                const char *path, bool resume, fsdp_ckpt **ck, char *err,
                                size_t err_size) {
    fsdp_status s = fsdp_ckpt_open(ctx, path, ck);
    if (s != FSDP_OK) {
        snprintf(err, err_size, "opening checkpoint '%s': %s", path, fsdp_last_error(ctx));
        return s;
    }
    return check_shapes(ctx, cfg, st, *ck, path, resume, err, err_size);
}

fsdp_status train_ckpt_init(fsdp_ctx *ctx, const train_config *cfg, const fsdp_state_sources *src,
                            const char *path, char *err, size_t err_size) {
    fsdp_state_sources params = {.model = src->model, .sharded = src->sharded};
    fsdp_state *st = NULL;
    fsdp_ckpt *ck = NULL;
    char key[1024];
    fsdp_status s = fsdp_state_create(ctx, &params, &st);
    if (s == FSDP_OK) s = open_checked(ctx, cfg, st, path, false, &ck, err, err_size);
    if (s == FSDP_OK && (s = fsdp_ckpt_load(ctx, ck, st, NULL)) != FSDP_OK)
        snprintf(err, err_size,
                 "loading the parameters of %s: %s; the state must hold every parameter of the "
                 "[model] kind = %s, named as %s, and nothing else",
                 train_config_key_text(cfg, "model", "init", key, sizeof key), fsdp_last_error(ctx),
                 train_kind_of(cfg)->name, train_kind_of(cfg)->state_advice);
    fsdp_ckpt_close(ck);
    fsdp_state_free(st);
    return s;
}

/* The saved configuration's [model], [data] and [optim] keys are this run's, but init,
 * tp_plan and checkpoint_activations. */
static fsdp_status check_config(const train_config *cfg, fsdp_ckpt *ck, const char *path, char *err,
                                size_t err_size) {
    static const char *const sections[] = {"model", "data", "optim", NULL};
    /* where the parameters start, and how they are laid out or recomputed: not the numbers */
    static const char *const except[] = {"model.init", "model.tp_plan",
                                         "model.checkpoint_activations", NULL};
    char diff[TRAIN_ERROR_SIZE] = "";
    if (train_config_compare_saved(cfg, fsdp_ckpt_config(ck), sections, except, diff,
                                   sizeof diff) == FSDP_OK)
        return FSDP_OK;
    snprintf(err, err_size,
             "cannot resume from '%s': it was saved with another configuration: %s; a "
             "resumed run needs the [model], [data] and [optim] keys it was saved "
             "with (the [parallel] layout may differ): set the checkpoint's value, or start "
             "anew ([checkpoint] resume = none, or another [checkpoint] dir)",
             path, diff);
    return FSDP_ERR_CONFIG;
}

fsdp_status train_ckpt_resume(fsdp_ctx *ctx, const train_config *cfg, const fsdp_state_sources *src,
                              const char *path, int64_t n_positions, train_progress *prog,
                              char *saved_layout, size_t layout_size, char *err, size_t err_size) {
    fsdp_state *st = NULL;
    fsdp_ckpt *ck = NULL;
    int64_t v[N_EXTRAS];
    fsdp_status s = fsdp_state_create(ctx, src, &st);
    if (s == FSDP_OK) s = open_checked(ctx, cfg, st, path, true, &ck, err, err_size);
    for (int i = 0; s == FSDP_OK && i < N_EXTRAS; i++)
        if ((s = fsdp_ckpt_extra(ctx, ck, g_extra_names[i], &v[i])) != FSDP_OK)
            snprintf(err, err_size,
                     "cannot resume from '%s': it has no '%s', so fsdp-train did not save it (an "
                     "imported state, or another program's); to start from its parameters, set "
                     "[model] init = %s and [checkpoint] resume = none",
                     path, g_extra_names[i], path);
    if (s == FSDP_OK &&
        (v[0] != fsdp_ckpt_step(ck) || v[1] < 0 || v[1] >= n_positions || v[3] < 0)) {
        snprintf(err, err_size,
                 "cannot resume from '%s': its loop position is inconsistent (train.step %lld "
                 "at step %lld, data.position %lld of %lld training %s)",
                 path, (long long)v[0], (long long)fsdp_ckpt_step(ck), (long long)v[1],
                 (long long)n_positions,
                 cfg->data.kind == TRAIN_DATA_TOKENS ? "sequence offsets" : "samples");
        s = FSDP_ERR_IO;
    }
    if (s == FSDP_OK) s = check_config(cfg, ck, path, err, err_size);
    if (s == FSDP_OK && (s = fsdp_ckpt_load(ctx, ck, st, NULL)) != FSDP_OK)
        snprintf(err, err_size, "loading checkpoint '%s': %s", path, fsdp_last_error(ctx));
    if (s == FSDP_OK) {
        prog->step = v[0];
        prog->position = v[1];
        memcpy(&prog->loss_sum, &v[2], sizeof prog->loss_sum);
        prog->since = v[3];
        snprintf(saved_layout, layout_size, "%s", fsdp_ckpt_layout(ck));
    }
    fsdp_ckpt_close(ck);
    fsdp_state_free(st);
    return s;
}

/* ---- saving ----------------------------------------------------------------------------- */

fsdp_status train_saver_create(fsdp_ctx *ctx, const train_config *cfg,
                               const fsdp_state_sources *src, const char *layout, train_saver *sv) {
    memset(sv, 0, sizeof *sv);
    snprintf(sv->layout, sizeof sv->layout, "%s", layout);
    size_t size = 0;
    FILE *f = open_memstream(&sv->config, &size);
    if (!f) return FSDP_ERR_OUT_OF_MEMORY;
    train_config_write(cfg, f);
    if (fclose(f) != 0) return FSDP_ERR_OUT_OF_MEMORY;
    const train_kind *kind = train_kind_of(cfg); /* its configuration for other programs */
    if (kind->export_config) {
        fsdp_status st = kind->export_config(ctx, cfg, &sv->model_config);
        if (st != FSDP_OK) return st;
    }
    fsdp_ckpt_options o = {.keep = (int)cfg->checkpoint.keep, .async = cfg->checkpoint.async};
    fsdp_status st = fsdp_state_create(ctx, src, &sv->state);
    if (st == FSDP_OK) st = fsdp_ckpt_writer_create(ctx, cfg->checkpoint.dir, &o, &sv->writer);
    return st;
}

fsdp_status train_saver_save(fsdp_ctx *ctx, train_saver *sv, const train_progress *prog,
                             bool commit, double *blocked) {
    int64_t bits;
    memcpy(&bits, &prog->loss_sum, sizeof bits);
    const int64_t values[N_EXTRAS] = {prog->step, prog->position, bits, prog->since};
    fsdp_ckpt_meta meta = {.step = prog->step,
                           .layout = sv->layout,
                           .config = sv->config,
                           .model_config = sv->model_config,
                           .n_extras = N_EXTRAS,
                           .extra_names = g_extra_names,
                           .extra_values = values};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    fsdp_status st = fsdp_ckpt_save(ctx, sv->writer, sv->state, &meta);
    if (st == FSDP_OK && commit) st = fsdp_ckpt_writer_wait(ctx, sv->writer);
    clock_gettime(CLOCK_MONOTONIC, &b);
    *blocked = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    return st;
}

void train_ckpt_step_path(const train_config *cfg, int64_t step, char *buf, size_t size) {
    snprintf(buf, size, "%s/step-%08lld", cfg->checkpoint.dir, (long long)step);
}

void train_saver_free(fsdp_ctx *ctx, train_saver *sv) {
    fsdp_ckpt_writer_free(ctx, sv->writer);
    fsdp_state_free(sv->state);
    free(sv->config);
    free(sv->model_config);
    memset(sv, 0, sizeof *sv);
}

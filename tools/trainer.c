/* trainer.c: fsdp-train's training run: the model of any kind (train_kind.h) fits its data with
 * SGD, Adam or AdamW under a learning rate schedule, on a world of ranks: tensor parallelism
 * over tp, FSDP or replicas over dp, each dp rank on its slice of every batch; the held-out
 * split is evaluated as it goes. The tool and the tests share it. */
#define _POSIX_C_SOURCE 200809L // clock_gettime, open_memstream, mkdtemp, stat

#include "train_rank.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: stat, mkdir, S_ISDIR, S_ISREG
#include <time.h>
#include <unistd.h> // defines: isatty

#include "fsdp/version.h"      // defines: FSDP_VERSION_STRING
#include "train_ckpt.h"        // defines: train_sources, train_saver, train_ckpt_resume
#include "train_device.h"      // defines: train_device_of, train_device_rule
#include "train_finite.h"      // defines: train_params_finite
#include "train_kind.h"        // defines: train_kind_of, train_rank_env, train_feed_info
#include "train_metrics.h"     // defines: train_report, train_metrics_write
#include "train_plan.h"        // defines: train_plan_checkpoint
#include "train_tensorboard.h" // defines: tb_open, tb_scalar, tb_flush, tb_close

atomic_int train_stop_signal = 0;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The progress bar on rank 0's output, redrawn in place between the log lines. */
typedef struct train_bar {
    bool on;          /* [log] progress = bar, or auto on a terminal */
    bool shown;       /* a bar is on the line now */
    double last_draw; /* when it was drawn */
} train_bar;

/* What one rank holds. */
typedef struct train_state {
    train_layout layout;
    fsdp_mesh *mesh;        /* (dp, tp), or (replicate, shard, tp) for hybrid_shard */
    fsdp_group *dp;         /* the data-parallel group: the mesh's, or dp_owned */
    fsdp_group *dp_owned;   /* hybrid_shard: the replicate x shard ranks of this tp index */
    int dp_rank;            /* this rank's index in dp */
    const train_kind *kind; /* [model] kind */
    const char *wrap[TRAIN_MAX_LAYERS]; /* wrap = layer: the units' paths or kinds */
    fsdp_module *model;
    fsdp_sharded *sh;    /* mode fsdp */
    fsdp_replicate *rep; /* mode replicate: borrowed from the model */
    int64_t micro;       /* samples of a micro-batch: batch_size / grad_accum */
    fsdp_optimizer *opt;
    fsdp_lr_schedule sched; /* [optim] schedule over [train] steps */
    void *feed;             /* the kind's feed of this rank's data */
    train_feed_info info;   /* n_train, n_eval, len */
    int64_t per_sample;     /* tokens of a sample (the kind's tokens_per_sample), or 0 */
    fsdp_tensor *loss;      /* (2): this rank's share of a batch loss (and 0), then sums */
    FILE *out;              /* rank 0's progress stream, or NULL */
    const char *out_name;   /* "the progress to stdout", for messages */
    FILE *metrics;          /* rank 0's metrics file, or NULL */
    char metrics_name[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64]; /* for messages */
    tb_writer *tb;     /* rank 0's TensorBoard writer ([log] tensorboard), or NULL */
    train_saver saver; /* [checkpoint] dir set: the writer and the state it saves */
    bool saving;       /* saver is made */
    fsdp_tensor *stop; /* (1): the stop flag, the max over the world (several ranks) */
    bool counting;     /* rank 0 counts its collectives: [log] comm_debug or metrics */
    train_comm comm;   /* what the steps since the last record communicated */
    train_bar bar;     /* the progress bar */

    /* [parallel] device */
    char device[32]; /* this rank's device ("sim:1") */
    train_mfu mfu;   /* what the progress lines' mfu counts */
} train_state;

static void train_state_free(fsdp_ctx *ctx, train_state *s) {
    if (s->saving) train_saver_free(ctx, &s->saver); /* commits a save in flight */
    if (s->feed) s->kind->feed_free(s->feed);
    fsdp_tensor_free(s->stop);
    fsdp_optimizer_free(s->opt);
    fsdp_sharded_free(s->sh);
    fsdp_module_free(s->model);
    fsdp_tensor_free(s->loss);
    fsdp_group_free(s->dp_owned);
    fsdp_mesh_free(s->mesh);
    if (s->metrics) fclose(s->metrics);
    tb_close(s->tb); /* a failed run's records so far */
}

/* The mesh and the dp group. hybrid_shard's mesh is (replicate, shard, tp) and its dp group
 * the replicate x shard ranks sharing this tp index, in world-rank order (= dp index). */
static fsdp_status setup_mesh(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    const train_layout *l = &s->layout;
    bool hybrid =
        cfg->parallel.mode == TRAIN_MODE_FSDP && cfg->parallel.strategy == FSDP_HYBRID_SHARD;
    fsdp_status st;
    if (hybrid) {
        st = fsdp_mesh_create(ctx, 3, (int[]){l->replicas, l->shard, l->tp},
                              (const char *[]){"replicate", "shard", "tp"}, &s->mesh);
        if (st == FSDP_OK)
            st = fsdp_group_split(ctx, NULL, fsdp_mesh_coordinate(s->mesh, 2), fsdp_ctx_rank(ctx),
                                  "dp", &s->dp_owned);
        s->dp = s->dp_owned;
    } else {
        st =
            fsdp_mesh_create(ctx, 2, (int[]){l->dp, l->tp}, (const char *[]){"dp", "tp"}, &s->mesh);
        if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, s->mesh, "dp", &s->dp);
    }
    if (st == FSDP_OK) s->dp_rank = fsdp_group_rank(s->dp);
    return st;
}

/* FSDP over dp (hybrid_shard: over shard, replicated over replicate), or replicas. */
static fsdp_status apply_dp(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    if (cfg->parallel.mode == TRAIN_MODE_REPLICATE) {
        double mb = cfg->parallel.bucket_mb;
        fsdp_replicate_options o = {.group = s->dp,
                                    .src_rank =
                                        cfg->parallel.sync_module_states ? 0 : FSDP_NO_SRC_RANK,
                                    .bucket_bytes = mb > 0 ? (int64_t)ceil(mb * 1024 * 1024) : 0,
                                    .comm_hook = {.kind = cfg->parallel.comm_hook},
                                    .mixed_precision = train_config_mixed_precision(cfg)};
        return fsdp_replicate_apply(ctx, s->model, &o, &s->rep);
    }
    fsdp_fully_shard_options o = {.strategy = cfg->parallel.strategy,
                                  .group = s->dp,
                                  .offload_params = cfg->parallel.offload,
                                  .sync_module_states = cfg->parallel.sync_module_states,
                                  .use_orig_params = cfg->parallel.use_orig_params,
                                  .comm_hook = {.kind = cfg->parallel.comm_hook},
                                  .mixed_precision = train_config_mixed_precision(cfg)};
    if (cfg->parallel.strategy == FSDP_HYBRID_SHARD) {
        TRAIN_TRY(fsdp_mesh_get_group(ctx, s->mesh, "shard", &o.group));
        TRAIN_TRY(fsdp_mesh_get_group(ctx, s->mesh, "replicate", &o.replicate_group));
    }
    if (cfg->parallel.wrap == TRAIN_WRAP_LAYER) /* the kind's units */
        s->kind->wrap_layers(s->model, &o, s->wrap, TRAIN_MAX_LAYERS);
    return fsdp_fully_shard(ctx, s->model, &o, &s->sh);
}

/* The optimizer [optim] names over params, with weight_decay 0 for the no_decay patterns
 * (the library's parameter groups), and the lr schedule. */
static fsdp_status make_optimizer(fsdp_ctx *ctx, const train_config *cfg, fsdp_module *params,
                                  train_state *s) {
    char patterns[TRAIN_MAX_NO_DECAY][TRAIN_MAX_STRING];
    fsdp_param_group groups[TRAIN_MAX_NO_DECAY];
    int n = train_config_no_decay(cfg, patterns);
    for (int i = 0; i < n; i++)
        groups[i] = (fsdp_param_group){.pattern = patterns[i], .weight_decay = FSDP_OVERRIDE(0.0)};
    n = n < 0 ? 0 : n;
    s->sched = (fsdp_lr_schedule){.kind = (fsdp_lr_schedule_kind)cfg->optim.schedule,
                                  .base_lr = cfg->optim.lr,
                                  .warmup_steps = cfg->optim.warmup_steps,
                                  .total_steps = cfg->train.steps,
                                  .min_lr = cfg->optim.min_lr};
    TRAIN_TRY(fsdp_lr_schedule_check(ctx, &s->sched));
    if (cfg->optim.name == TRAIN_OPTIM_SGD) {
        fsdp_sgd_options o = {.lr = cfg->optim.lr,
                              .momentum = cfg->optim.momentum,
                              .weight_decay = cfg->optim.weight_decay,
                              .nesterov = cfg->optim.nesterov,
                              .param_groups = n ? groups : NULL,
                              .n_param_groups = n};
        return fsdp_sgd_create(ctx, params, &o, &s->opt);
    }
    fsdp_adam_options o = {.lr = cfg->optim.lr,
                           .beta1 = cfg->optim.betas.v[0],
                           .beta2 = cfg->optim.betas.v[1],
                           .eps = cfg->optim.eps,
                           .weight_decay = cfg->optim.weight_decay,
                           .param_groups = n ? groups : NULL,
                           .n_param_groups = n};
    if (o.beta1 == 0) o.beta1 = 1e-30; /* 0 would select the default (optim.h) */
    if (o.beta2 == 0) o.beta2 = 1e-30;
    return cfg->optim.name == TRAIN_OPTIM_ADAM ? fsdp_adam_create(ctx, params, &o, &s->opt)
                                               : fsdp_adamw_create(ctx, params, &o, &s->opt);
}

/* Builds the mesh, the model with its parallelism, the optimizer and this rank's feed of data;
 * all allocation of a run is here. input: what the kind loaded for this process. */
static fsdp_status train_setup(fsdp_ctx *ctx, const train_config *cfg, const void *input,
                               train_state *s, const char **what) {
    fsdp_status st;
    fsdp_device dev = train_device_of(cfg, fsdp_ctx_rank(ctx));
    train_device_name(dev, s->device, sizeof s->device);
    *what = "choosing the device";
    if ((st = fsdp_ctx_set_device(ctx, dev)) || (st = train_device_tf32(ctx, cfg, true))) return st;
    *what = "counting the model's FLOPs";
    if ((st = train_device_mfu(ctx, cfg, s->kind, dev, &s->mfu))) return st;
    *what = "creating the device mesh";
    if ((st = setup_mesh(ctx, cfg, s))) return st;
    *what = "building the model";
    if ((st = s->kind->build(ctx, cfg, false, &s->model))) return st;
    *what = "moving the model to the device"; /* before TP and FSDP, as model.to(device) */
    if (dev.type != FSDP_DEVICE_CPU && (st = fsdp_module_to(ctx, s->model, dev))) return st;
    *what = "applying tensor parallelism";
    fsdp_mesh *tp = NULL;
    if (s->layout.tp > 1 && ((st = fsdp_mesh_dim(ctx, s->mesh, "tp", &tp)) ||
                             (st = s->kind->parallelize(ctx, cfg, s->model, tp))))
        return st;
    *what = "checkpointing activations";
    if ((st = train_plan_checkpoint(ctx, s->kind, cfg, s->model))) return st;
    *what = cfg->parallel.mode == TRAIN_MODE_FSDP ? "applying FSDP" : "making the replicas";
    if ((st = apply_dp(ctx, cfg, s))) return st;
    *what = "creating the optimizer";
    fsdp_module *params = s->sh ? fsdp_sharded_flat_params(s->sh) : s->model;
    if ((st = make_optimizer(ctx, cfg, params, s))) return st;
    *what = "allocating the data";
    train_rank_env env = {.cfg = cfg,
                          .layout = &s->layout,
                          .mesh = s->mesh,
                          .dp = s->dp,
                          .dp_rank = s->dp_rank,
                          .tp_rank = fsdp_mesh_coordinate(s->mesh, fsdp_mesh_ndim(s->mesh) - 1),
                          .micro = cfg->data.batch_size / cfg->train.grad_accum,
                          .input = input};
    s->micro = env.micro;
    s->per_sample = s->kind->tokens_per_sample ? s->kind->tokens_per_sample(cfg) : 0;
    if ((st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){2}, &s->loss)))
        return st;
    return s->kind->feed_create(ctx, &env, &s->feed, &s->info);
}

/* The sum over dp of each rank's `share` (its loss weighted by its part of the samples): the
 * global value, the same on every rank. One rank: its own. */
static fsdp_status sum_over_dp(fsdp_ctx *ctx, train_state *s, double share, double *total) {
    if (s->layout.dp == 1) {
        *total = share;
        return FSDP_OK;
    }
    fsdp_tensor_f32(s->loss)[0] = (float)share;
    fsdp_tensor_f32(s->loss)[1] = 0; /* the count the samples' evaluation sums beside it */
    TRAIN_TRY(fsdp_all_reduce(ctx, s->dp, s->loss, FSDP_REDUCE_SUM));
    *total = fsdp_tensor_f32(s->loss)[0];
    return FSDP_OK;
}

/* The loss over the training part of the data (the kind's: the training samples, the probe
 * sequences). */
static fsdp_status dataset_loss(fsdp_ctx *ctx, train_state *s, double *loss) {
    double accuracy;
    return s->kind->loss(ctx, s->feed, s->model, false, loss, &accuracy);
}

/* Gradient reduction on (sync) or off (no_sync: backward accumulates locally) for the
 * backwards that follow. */
static void set_sync(train_state *s, bool sync) {
    if (s->sh) fsdp_sharded_set_sync(s->sh, sync);
    if (s->rep) fsdp_replicate_set_sync(s->rep, sync);
}

/* One training step on the batch that starts at position `start` of the sample stream
 * (train_order): zero the gradients, then for each of the grad_accum micro-batches (micro
 * samples each, consecutive in the batch) forward and backward on this rank's slice of it, the
 * gradients reduced by the last backward only (no_sync before it); *loss is the global batch
 * loss. The gradient of the mean over a slice is scaled by len * dp / B, so that dp's average
 * (FSDP's and replicate's reductions divide by dp) of the sum over the micro-batches is the
 * gradient of the mean over the whole batch, also when the slices are uneven (or empty). */
static fsdp_status train_step(fsdp_ctx *ctx, const train_config *cfg, train_state *s, int64_t start,
                              double *loss) {
    int64_t b = cfg->data.batch_size, n_micro = cfg->train.grad_accum;
    double share = 0; /* this rank's part of the batch loss */
    TRAIN_TRY(fsdp_optimizer_zero_grad(ctx, s->opt));
    int64_t len = s->info.len;
    for (int64_t m = 0; m < n_micro; m++) {
        fsdp_tensor *dout = NULL;
        float l = 0;
        if (n_micro > 1) set_sync(s, m == n_micro - 1);
        TRAIN_TRY(s->kind->step(ctx, s->feed, s->model, start + m * s->micro, &l, &dout));
        double scale = (double)len * s->layout.dp / (double)b;
        if (scale != 1.0) TRAIN_TRY(fsdp_loss_scale_grad(ctx, dout, (float)scale));
        TRAIN_TRY(fsdp_module_backward(ctx, s->model, dout, NULL)); /* no input gradient */
        share += (double)l * (double)len / (double)b;
    }
    return sum_over_dp(ctx, s, share, loss);
}

/* Flushes f; when that or an earlier write to f failed, writes "cannot write <name>: <why>"
 * into err. A full disk, or stdout on /dev/full, fails the run instead of passing unseen. */
static fsdp_status flush_checked(FILE *f, const char *name, char *err, size_t err_size) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f)) return FSDP_OK;
    snprintf(err, err_size, "cannot write %s: %s", name, errno ? strerror(errno) : "write error");
    return FSDP_ERR_IO;
}

/* Takes the progress bar off its line, so that a line can be written there. */
static void bar_clear(train_state *s) {
    if (!s->bar.shown) return;
    fputs("\r\033[K", s->out);
    s->bar.shown = false;
}

/* "1m05s", "2h03m", "12s" */
static void format_duration(double seconds, char *buf, size_t size) {
    long long t = (long long)(seconds + 0.5);
    if (t >= 3600)
        snprintf(buf, size, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, size, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(buf, size, "%llds", t);
}

/* Redraws the bar after `step` (of this run's first..last), at most 10 times a second:
 * "step 1200/5000 [#####...............]  24%  loss 0.012345  51234 samples/s  ETA 7s". */
static fsdp_status bar_draw(const train_config *cfg, train_state *s, const train_progress *prog,
                            int64_t first, double loss, double elapsed, char *err,
                            size_t err_size) {
    double now = now_seconds();
    if (s->bar.shown && now - s->bar.last_draw < 0.1) return FSDP_OK;
    enum { WIDTH = 24 };
    int64_t step = prog->step, total = cfg->train.steps, done = step - first + 1;
    int filled = (int)((double)WIDTH * (double)step / (double)total);
    char bar[WIDTH + 1], eta[32];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    format_duration(elapsed / (double)done * (double)(total - step), eta, sizeof eta);
    int digits = snprintf(NULL, 0, "%lld", (long long)total);
    int64_t per_step = cfg->data.batch_size * (s->per_sample ? s->per_sample : 1);
    fprintf(s->out, "\r\033[Kstep %*lld/%lld [%s] %3d%%  loss %.6f  %.0f %s/s  ETA %s", digits,
            (long long)step, (long long)total, bar, (int)(100 * step / total),
            prog->since ? prog->loss_sum / (double)prog->since : loss,
            (double)(done * per_step) / fmax(elapsed, 1e-9), s->per_sample ? "tokens" : "samples",
            eta);
    s->bar.shown = true;
    s->bar.last_draw = now;
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* The metrics record's scalars as TensorBoard events of the step, flushed. */
static fsdp_status write_tb(const train_config *cfg, train_state *s, int64_t step,
                            const train_report *r, char *err, size_t err_size) {
    struct {
        bool on;
        const char *tag;
        double value;
    } v[] = {
        {r->progress, "train/loss", r->loss},
        {r->progress, "train/samples_per_s", r->samples_per_s},
        {r->progress && s->per_sample, "train/tokens_per_s",
         r->samples_per_s * (double)s->per_sample},
        {r->progress && r->mfu > 0, "train/mfu", r->mfu},
        {r->progress, "train/lr", r->lr},
        {r->progress && !isnan(r->grad_norm), "train/grad_norm", r->grad_norm},
        {r->eval, "eval/loss", r->eval_loss},
        {r->eval && !isnan(r->eval_accuracy), "eval/accuracy", r->eval_accuracy},
        {r->eval && s->per_sample, "eval/perplexity", exp(r->eval_loss)},
    };
    fsdp_status st = FSDP_OK;
    for (size_t i = 0; i < sizeof v / sizeof v[0] && st == FSDP_OK; i++)
        if (v[i].on) st = tb_scalar(s->tb, v[i].tag, step, v[i].value);
    if (st == FSDP_OK) st = tb_flush(s->tb);
    if (st != FSDP_OK)
        snprintf(err, err_size, "cannot write the TensorBoard events ([log] tensorboard, %s): %s",
                 train_config_origin(cfg, "log", "tensorboard"), tb_last_error(s->tb));
    return st;
}

/* The progress and evaluation lines and one metrics record (and TensorBoard events) of a
 * logged step. */
static fsdp_status report(const train_config *cfg, train_state *s, int64_t step,
                          const train_report *r, char *err, size_t err_size) {
    int digits = snprintf(NULL, 0, "%lld", (long long)cfg->train.steps);
    if (s->out && (r->progress || r->eval)) bar_clear(s);
    if (s->out && r->progress) {
        fprintf(s->out, "step %*lld/%lld  loss %.6f  lr %.3g", digits, (long long)step,
                (long long)cfg->train.steps, r->loss, r->lr);
        if (!isnan(r->grad_norm)) fprintf(s->out, "  grad_norm %.3g", r->grad_norm);
        if (s->per_sample) /* sequences of per_sample targets */
            fprintf(s->out, "  tokens/s %.0f  time %.2fs", r->samples_per_s * (double)s->per_sample,
                    r->elapsed);
        else
            fprintf(s->out, "  samples/s %.0f  time %.2fs", r->samples_per_s, r->elapsed);
        if (r->mfu > 0) fprintf(s->out, "  mfu %.1f%%", 100 * r->mfu);
        if (r->comm) /* the steps' time since the last line, split */
            fprintf(s->out, "  compute %.3fs  comm %.3fs", train_comm_compute_seconds(r->comm),
                    train_comm_seconds(r->comm));
        if (r->device) {
            double gib = (double)r->mem_peak / (1 << 30);
            fprintf(s->out, "  on %s  mem %.*f %s (%.1f%%)", r->device, gib < 1 ? 1 : 2,
                    gib < 1 ? gib * 1024 : gib, gib < 1 ? "MiB" : "GiB",
                    100.0 * (double)r->mem_peak / fmax((double)r->mem_capacity, 1));
        }
        fputc('\n', s->out);
    }
    if (s->out && r->eval) {
        fprintf(s->out, "eval %*lld/%lld  loss %.6f", digits, (long long)step,
                (long long)cfg->train.steps, r->eval_loss);
        if (!isnan(r->eval_accuracy))
            fprintf(s->out, "  accuracy %.2f%%", 100.0 * r->eval_accuracy);
        if (s->per_sample)
            fprintf(s->out, "  perplexity %.3f  (%lld held-out sequences)\n", exp(r->eval_loss),
                    (long long)s->info.n_eval);
        else
            fprintf(s->out, "  (%lld held-out samples)\n", (long long)s->info.n_eval);
    }
    if (s->out) TRAIN_TRY(flush_checked(s->out, s->out_name, err, err_size));
    if (s->metrics) {
        if (train_metrics_write(s->metrics, step, r, s->per_sample) != 0 && !ferror(s->metrics)) {
            snprintf(err, err_size, "cannot write %s: out of memory", s->metrics_name);
            return FSDP_ERR_OUT_OF_MEMORY;
        }
        TRAIN_TRY(flush_checked(s->metrics, s->metrics_name, err, err_size));
    }
    return s->tb ? write_tb(cfg, s, step, r, err, err_size) : FSDP_OK;
}

/* The model and layout lines (and under debug the configuration). */
static void print_banner(const train_config *cfg, train_state *s) {
    char lw[256];
    train_layout_describe(cfg, &s->layout, lw, sizeof lw);
    static const char *const optim[] = {"SGD", "Adam", "AdamW"};
    static const char *const sched[] = {"constant", "warmup", "cosine"};
    fprintf(s->out, "fsdp-train %s: ", FSDP_VERSION_STRING);
    s->kind->banner(cfg, s->feed, s->out);
    fprintf(s->out, "optim: %s lr %g, %s schedule", optim[cfg->optim.name], cfg->optim.lr,
            sched[cfg->optim.schedule]);
    if (cfg->optim.name == TRAIN_OPTIM_SGD) fprintf(s->out, ", momentum %g", cfg->optim.momentum);
    if (cfg->optim.weight_decay > 0) fprintf(s->out, ", weight_decay %g", cfg->optim.weight_decay);
    if (cfg->optim.no_decay[0]) fprintf(s->out, " (none for %s)", cfg->optim.no_decay);
    if (cfg->optim.clip_grad_norm > 0)
        fprintf(s->out, ", clip_grad_norm %g", cfg->optim.clip_grad_norm);
    fprintf(s->out, "\n");
    fprintf(s->out, "parallel: %s", lw);
    char rule[96];
    if (cfg->parallel.device != FSDP_DEVICE_CPU)
        fprintf(s->out, ", device %s (%s)", s->device, train_device_rule(cfg, rule, sizeof rule));
    if (cfg->parallel.allow_tf32 && cfg->parallel.device == FSDP_DEVICE_CUDA)
        fprintf(s->out, ", allow_tf32");
    fprintf(s->out, "\n");
    train_mfu_describe(cfg, &s->mfu, s->out);
    if (cfg->log.level == FSDP_LOG_DEBUG) train_config_write(cfg, s->out);
}

/* The whole-dataset loss where the run starts: step 0, or the resumed step. */
static fsdp_status print_first_loss(const train_config *cfg, train_state *s, double first_loss,
                                    int64_t step, char *err, size_t err_size) {
    int digits = snprintf(NULL, 0, "%lld", (long long)cfg->train.steps);
    fprintf(s->out, "step %*lld/%lld  loss %.6f  (%s, %s)\n", digits, (long long)step,
            (long long)cfg->train.steps, first_loss, s->info.train_part,
            step ? "at the resumed step" : "before training");
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* Makes directory path and those that lead to it (mkdir -p); an error shows when a file in it
 * is opened. */
static void make_dirs(const char *path) {
    char dir[TRAIN_MAX_STRING];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
}

/* Rank 0's metrics file, opened for appending; the directories leading to it are made when
 * missing (one inside [checkpoint] dir may come before the first checkpoint). */
static fsdp_status open_metrics(const train_config *cfg, train_state *s, char *err,
                                size_t err_size) {
    snprintf(s->metrics_name, sizeof s->metrics_name, "metrics file '%s' ([log] metrics, %s)",
             cfg->log.metrics, train_config_origin(cfg, "log", "metrics"));
    char dir[TRAIN_MAX_STRING];
    snprintf(dir, sizeof dir, "%s", cfg->log.metrics);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        make_dirs(dir);
    }
    if ((s->metrics = fopen(cfg->log.metrics, "a"))) return FSDP_OK;
    snprintf(err, err_size, "cannot open %s: %s", s->metrics_name, strerror(errno));
    return FSDP_ERR_IO;
}

/* Rank 0's TensorBoard writer: a directory that cannot be made or written is refused here,
 * before training. */
static fsdp_status open_tb(const train_config *cfg, train_state *s, char *err, size_t err_size) {
    char why[TRAIN_MAX_STRING + 256];
    fsdp_status st = tb_open(cfg->log.tensorboard, &s->tb, why, sizeof why);
    if (st != FSDP_OK)
        snprintf(err, err_size, "[log] tensorboard = %s (%s): %s", cfg->log.tensorboard,
                 train_config_origin(cfg, "log", "tensorboard"), why);
    return st;
}

/* Closes the metrics file; its last write may fail only here. */
static fsdp_status close_metrics(train_state *s, char *err, size_t err_size) {
    fsdp_status st = flush_checked(s->metrics, s->metrics_name, err, err_size);
    errno = 0;
    if (fclose(s->metrics) != 0 && st == FSDP_OK) {
        snprintf(err, err_size, "cannot write %s: %s", s->metrics_name,
                 errno ? strerror(errno) : "write error");
        st = FSDP_ERR_IO;
    }
    s->metrics = NULL;
    return st;
}

/* A loss that is not finite: writes "<what>; lower <the keys that can have caused it>" into
 * err. The keys are those the run uses: lr once a step was taken, weight_decay when not 0, the
 * label noise when not 0; each with its value and origin. Before any step of a run that did not
 * start from random parameters, `start` (train_ckpt_start_blame) is blamed instead. */
static fsdp_status not_finite(const train_config *cfg, bool trained, const char *start, char *err,
                              size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static fsdp_status not_finite(const train_config *cfg, bool trained, const char *start, char *err,
                              size_t err_size, const char *fmt, ...) {
    const char *keys[3][2];
    int n = 0;
    if (trained) keys[n][0] = "optim", keys[n++][1] = "lr";
    if (trained && cfg->optim.weight_decay > 0) keys[n][0] = "optim", keys[n++][1] = "weight_decay";
    if (cfg->data.noise > 0) keys[n][0] = "data", keys[n++][1] = "noise";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    if (!trained && start && *start) n = 0;
    if (n == 0)
        train_append(err, err_size, "; %s",
                     start && *start ? start
                     : cfg->data.kind == TRAIN_DATA_SYNTHETIC
                         ? "the teacher's targets or the initial model overflow float32"
                         : "the initial model overflows float32 on this data");
    for (int i = 0; i < n; i++) {
        char text[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
        const char *sep = i == 0 ? "; lower " : i < n - 1 ? ", " : " or ";
        train_append(err, err_size, "%s%s", sep,
                     train_config_key_text(cfg, keys[i][0], keys[i][1], text, sizeof text));
    }
    return FSDP_ERR_STATE;
}

/* Saves the run at prog->step and says so; commit: wait for the commit (a sync save always
 * does). */
static fsdp_status save(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                        const train_progress *prog, bool commit, train_result *res, char *err,
                        size_t err_size) {
    double blocked = 0;
    fsdp_status st = train_saver_save(ctx, &s->saver, prog, commit, &blocked);
    if (st != FSDP_OK) { /* named here: a save inside the loop is no failure of "training" */
        snprintf(err, err_size, "saving the checkpoint of step %lld: %s", (long long)prog->step,
                 fsdp_last_error(ctx));
        return st;
    }
    snprintf(res->saved, sizeof res->saved, "%s", fsdp_ckpt_writer_last_path(s->saver.writer));
    if (!s->out) return FSDP_OK;
    bar_clear(s);
    char path[TRAIN_CKPT_PATH];
    train_ckpt_step_path(cfg, prog->step, path, sizeof path);
    if (commit || !cfg->checkpoint.async)
        fprintf(s->out, "checkpoint: saved %s (%.3fs)\n", path, blocked);
    else
        fprintf(s->out, "checkpoint: writing %s in the background (the step waited %.3fs)\n", path,
                blocked);
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* Whether the ranks stop after this step: a SIGINT or SIGTERM (train_stop_signal) on any rank
 * of the world. Several ranks agree with one all_reduce (max) of one float over the world, so
 * that every rank stops after the same step. */
static fsdp_status agree_stop(fsdp_ctx *ctx, train_state *s, bool *stop) {
    float mine = train_stop_signal != 0 ? 1.0f : 0.0f;
    if (s->layout.world == 1) {
        *stop = mine > 0;
        return FSDP_OK;
    }
    fsdp_tensor_f32(s->stop)[0] = mine;
    TRAIN_TRY(fsdp_all_reduce(ctx, fsdp_ctx_world_group(ctx), s->stop, FSDP_REDUCE_MAX));
    *stop = fsdp_tensor_f32(s->stop)[0] > 0;
    return FSDP_OK;
}

/* Rank 0's comm-debug counters per op, and the seconds in each op's calls. */
static void comm_read(const fsdp_ctx *ctx, train_comm *c) {
    for (int op = FSDP_COMM_ANY + 1; op < FSDP_COMM_OP_COUNT; op++) {
        fsdp_comm_filter f = {.op = (fsdp_comm_op)op};
        c->count[op] = fsdp_comm_debug_query(ctx, &f);
        c->seconds[op] = fsdp_comm_debug_seconds(ctx, &f);
    }
}

/* Adds what the counters gained from `before` to `after` to sum. */
static void comm_add(train_comm *sum, const train_comm *before, const train_comm *after) {
    for (int op = FSDP_COMM_ANY + 1; op < FSDP_COMM_OP_COUNT; op++) {
        sum->count[op].calls += after->count[op].calls - before->count[op].calls;
        sum->count[op].bytes += after->count[op].bytes - before->count[op].bytes;
        sum->seconds[op] += after->seconds[op] - before->seconds[op];
    }
}

/* [log] comm_debug: rank 0's collectives of one step, as a table. */
static fsdp_status print_comm_table(fsdp_ctx *ctx, train_state *s, int64_t step, char *err,
                                    size_t err_size) {
    bar_clear(s);
    fprintf(s->out, "comm_debug: the collectives of step %lld on rank 0\n", (long long)step);
    TRAIN_TRY(fsdp_comm_debug_print(ctx, s->out));
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* The steps after prog->step, from t0 on. A failure of the tool's own (a loss that is not
 * finite, output that cannot be written) is written into err; a library failure leaves err
 * empty. Progress lines average the batch losses since the previous line of a log_every step
 * (prog->loss_sum, also across a resume), so a resumed run prints the lines of an
 * uninterrupted one. */
static fsdp_status train_loop(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                              train_progress *prog, train_result *res, double t0, char *err,
                              size_t err_size) {
    double t_last = t0;
    int64_t since_line = 0, first = prog->step + 1;
    /* comm_debug's table shows the second step: the first may find parameters that the loss
     * evaluation before it left gathered (FSDP's root keeps them after forward) */
    int64_t table_step = first < cfg->train.steps ? first + 1 : first;
    train_comm before = {0}, after = {0}; /* op 0 (FSDP_COMM_ANY) stays 0 */
    if (s->counting) TRAIN_TRY(fsdp_comm_debug_begin(ctx));
    /* no allocation in here (but in a checkpoint's save, and comm-debug's first counts) */
    for (int64_t step = first; step <= cfg->train.steps; step++) {
        double loss = 0, lr = fsdp_lr_at(&s->sched, step - 1), grad_norm = NAN;
        int64_t k0 = (step - 1) * cfg->data.batch_size; /* the batch's first stream position */
        double t_step = now_seconds();
        if (s->counting && step == table_step && step > first) { /* count it alone */
            TRAIN_TRY(fsdp_comm_debug_end(ctx));
            TRAIN_TRY(fsdp_comm_debug_begin(ctx));
        }
        if (s->counting) comm_read(ctx, &before);
        TRAIN_TRY(train_step(ctx, cfg, s, k0, &loss));
        prog->position = (k0 + cfg->data.batch_size) % s->info.n_train;
        if (!isfinite(loss)) /* the same global loss on every rank: all stop here */
            return not_finite(cfg, true, NULL, err, err_size, "the loss became %g at step %lld",
                              loss, (long long)step);
        if (cfg->optim.clip_grad_norm > 0 && s->sh)
            TRAIN_TRY(fsdp_sharded_clip_grad_norm(ctx, s->sh, cfg->optim.clip_grad_norm, 2.0,
                                                  &grad_norm));
        else if (cfg->optim.clip_grad_norm > 0)
            TRAIN_TRY(
                fsdp_clip_grad_norm(ctx, s->model, cfg->optim.clip_grad_norm, 2.0, &grad_norm));
        fsdp_optimizer_set_lr(s->opt, lr);
        TRAIN_TRY(fsdp_optimizer_step(ctx, s->opt));
        if (s->counting) {
            comm_read(ctx, &after);
            comm_add(&s->comm, &before, &after);
            s->comm.step_seconds += now_seconds() - t_step;
        }
        if (s->counting && cfg->log.comm_debug && s->out && step == table_step)
            TRAIN_TRY(print_comm_table(ctx, s, step, err, err_size));
        prog->step = res->steps = step;
        res->grad_norm = grad_norm;
        if (res->n_step_losses < TRAIN_TRACE_STEPS) res->step_loss[res->n_step_losses++] = loss;
        prog->loss_sum += loss;
        prog->since++;
        since_line++;
        bool stop = false, regular = step % cfg->train.log_every == 0;
        if (s->saving) TRAIN_TRY(agree_stop(ctx, s, &stop));
        stop = stop && step < cfg->train.steps; /* the last step: the run ends anyway */
        bool last = step == cfg->train.steps;
        train_report r = {.progress = regular || last || stop,
                          .lr = lr,
                          .grad_norm = grad_norm,
                          .comm = s->counting ? &s->comm : NULL,
                          .device = cfg->parallel.device ? s->device : NULL};
        if (s->info.n_eval > 0 &&
            (last || (cfg->train.eval_every > 0 && step % cfg->train.eval_every == 0))) {
            r.eval = true;
            TRAIN_TRY(s->kind->loss(ctx, s->feed, s->model, true, &r.eval_loss, &r.eval_accuracy));
            res->eval_loss = r.eval_loss;
            res->eval_accuracy = r.eval_accuracy;
            if (res->n_evals < TRAIN_TRACE_STEPS) res->eval_step[res->n_evals++] = step;
        }
        if (r.progress && r.device && fsdp_ctx_rank(ctx) == 0)
            TRAIN_TRY(train_device_memory(ctx, &r));
        if (r.progress || r.eval) {
            double t = now_seconds();
            r.loss = prog->loss_sum / (double)prog->since;
            r.samples_per_s = (double)(since_line * cfg->data.batch_size) / fmax(t - t_last, 1e-9);
            r.mfu = train_mfu_of(&s->mfu, r.samples_per_s);
            r.elapsed = t - t0;
            TRAIN_TRY(report(cfg, s, step, &r, err, err_size));
            if (r.progress) {
                t_last = t;
                since_line = 0;
                memset(&s->comm, 0, sizeof s->comm);
            }
            if (regular) prog->loss_sum = 0, prog->since = 0;
        }
        if (stop) {
            res->interrupted = true;
            return save(ctx, cfg, s, prog, true, res, err, err_size);
        }
        if (s->saving && cfg->checkpoint.every > 0 && step % cfg->checkpoint.every == 0 &&
            step < cfg->train.steps)
            TRAIN_TRY(save(ctx, cfg, s, prog, false, res, err, err_size));
        if (s->bar.on && step < cfg->train.steps)
            TRAIN_TRY(bar_draw(cfg, s, prog, first, loss, now_seconds() - t0, err, err_size));
    }
    return s->counting ? fsdp_comm_debug_end(ctx) : FSDP_OK;
}

/* Where the run starts: [model] init, or the checkpoint it resumes from (said in one line). */
static fsdp_status start_from(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                              const train_sources *src, train_progress *prog, train_result *res,
                              const char **what, char *err, size_t err_size) {
    fsdp_state_sources from = {.model = s->model, .sharded = s->sh, .optimizer = s->opt};
    if (src->init[0]) {
        *what = "loading [model] init";
        TRAIN_TRY(train_ckpt_init(ctx, cfg, &from, src->init, err, err_size));
        if (s->out) fprintf(s->out, "init: parameters from %s\n", cfg->model.init);
    }
    if (src->resume[0]) {
        char layout[256] = "";
        *what = "resuming";
        TRAIN_TRY(train_ckpt_resume(ctx, cfg, &from, src->resume, s->info.n_train, prog, layout,
                                    sizeof layout, err, err_size));
        res->start_step = res->steps = prog->step;
        snprintf(res->resumed_from, sizeof res->resumed_from, "%s", src->resume);
        if (s->out)
            fprintf(s->out, "resume: from %s at step %lld (saved by %s)\n", src->resume,
                    (long long)prog->step, layout[0] ? layout : "an unknown layout");
    }
    if (s->out && src->note[0]) fprintf(s->out, "%s\n", src->note);
    if (s->out && prog->step >= cfg->train.steps)
        fprintf(s->out, "nothing to train: the run is at step %lld, and [train] steps = %lld\n",
                (long long)prog->step, (long long)cfg->train.steps);
    return s->out ? flush_checked(s->out, s->out_name, err, err_size) : FSDP_OK;
}

/* The checkpoint writer and the stop flag, when [checkpoint] dir is set. */
static fsdp_status setup_saving(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    if (!cfg->checkpoint.dir[0]) return FSDP_OK;
    char layout[256];
    train_layout_describe(cfg, &s->layout, layout, sizeof layout);
    fsdp_state_sources from = {.model = s->model, .sharded = s->sh, .optimizer = s->opt};
    fsdp_status st = train_saver_create(ctx, cfg, &from, layout, &s->saver);
    s->saving = true; /* freed either way */
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &s->stop);
    return st;
}

fsdp_status train_rank(fsdp_ctx *ctx, const train_config *cfg, const train_layout *layout,
                       const train_sources *src, const void *input, FILE *out, train_result *res,
                       char *err, size_t err_size) {
    bool rank0 = fsdp_ctx_rank(ctx) == 0;
    train_state s = {.layout = *layout,
                     .kind = train_kind_of(cfg),
                     .out = rank0 ? out : NULL,
                     .out_name = out == stdout ? "the progress to stdout" : "the progress output"};
    train_progress prog = {0};
    const char *what = "";
    err[0] = '\0';
    res->eval_loss = res->eval_accuracy = res->grad_norm = NAN;
    fsdp_status st = train_setup(ctx, cfg, input, &s, &what);
    if (st == FSDP_OK) {
        what = "setting up checkpoints";
        st = setup_saving(ctx, cfg, &s);
    }
    if (st == FSDP_OK && s.out) print_banner(cfg, &s);
    if (st == FSDP_OK) st = start_from(ctx, cfg, &s, src, &prog, res, &what, err, err_size);
    if (st == FSDP_OK && rank0 && cfg->log.metrics[0]) st = open_metrics(cfg, &s, err, err_size);
    if (st == FSDP_OK && rank0 && cfg->log.tensorboard[0]) st = open_tb(cfg, &s, err, err_size);
    s.counting = rank0 && ((cfg->log.comm_debug && s.out) || s.metrics);
    /* auto: a bar only on a terminal of rank threads; under mpirun every rank has a
     * pseudo-terminal that mpirun copies into whatever its own output is (a file, a pipe). */
    bool terminal =
        s.out && isatty(fileno(s.out)) && !train_backend_processes(train_config_backend(cfg));
    s.bar.on = s.out && (cfg->log.progress == TRAIN_PROGRESS_BAR ||
                         (cfg->log.progress == TRAIN_PROGRESS_AUTO && terminal));
    if (st == FSDP_OK) {
        what = "evaluating the initial loss";
        st = dataset_loss(ctx, &s, &res->first_loss);
    }
    if (st == FSDP_OK && !isfinite(res->first_loss)) {
        char start[3 * TRAIN_CKPT_PATH];
        train_ckpt_start_blame(cfg, src, start, sizeof start);
        st = not_finite(cfg, false, start, err, err_size, "the whole-dataset loss %s is %g",
                        prog.step ? "at the resumed step" : "before training", res->first_loss);
    }
    if (st == FSDP_OK && s.out)
        st = print_first_loss(cfg, &s, res->first_loss, prog.step, err, err_size);
    if (st == FSDP_OK && prog.step > 0 && s.info.n_eval > 0) { /* where a resumed run stands */
        train_report r = {.eval = true};
        what = "evaluating at the resumed step";
        st = s.kind->loss(ctx, s.feed, s.model, true, &r.eval_loss, &r.eval_accuracy);
        if (st == FSDP_OK) {
            res->eval_loss = r.eval_loss, res->eval_accuracy = r.eval_accuracy;
            FILE *metrics = s.metrics; /* a line for the reader, no record */
            tb_writer *tb = s.tb;
            s.metrics = NULL, s.tb = NULL;
            st = report(cfg, &s, prog.step, &r, err, err_size);
            s.metrics = metrics, s.tb = tb;
        }
    }
    double t0 = now_seconds();
    if (st == FSDP_OK) {
        what = "training";
        st = train_loop(ctx, cfg, &s, &prog, res, t0, err, err_size);
    }
    res->seconds = now_seconds() - t0;
    if (s.out) bar_clear(&s); /* before any other line, or an error on the terminal */
    int64_t ran = res->steps - res->start_step;
    res->samples_per_s = (double)(ran * cfg->data.batch_size) / fmax(res->seconds, 1e-9);
    if (st == FSDP_OK && s.saving && ran > 0 && !res->interrupted) {
        what = "saving the final checkpoint";
        st = save(ctx, cfg, &s, &prog, true, res, err, err_size);
    }
    if (st == FSDP_OK && res->interrupted) res->last_loss = NAN;
    if (st == FSDP_OK && !res->interrupted) {
        what = "evaluating the final loss";
        st = dataset_loss(ctx, &s, &res->last_loss);
    }
    if (st == FSDP_OK && !res->interrupted && !isfinite(res->last_loss))
        /* the last update is checked only here */
        st = not_finite(cfg, true, NULL, err, err_size,
                        "the whole-dataset loss after training is %g (%g before): the update "
                        "of step %lld diverged",
                        res->last_loss, res->first_loss, (long long)res->steps);
    char bad[TRAIN_MAX_STRING] = ""; /* a ReLU hides NaN parameters from the loss */
    if (st == FSDP_OK && !res->interrupted) {
        what = "checking the final parameters";
        fsdp_state_sources params = {.model = s.model, .sharded = s.sh};
        st = train_params_finite(ctx, &params, bad, sizeof bad);
    }
    if (st == FSDP_OK && bad[0])
        st = not_finite(cfg, true, NULL, err, err_size,
                        "after training, %s, though the whole-dataset loss is %g", bad,
                        res->last_loss);
    if (st == FSDP_OK && s.metrics) st = close_metrics(&s, err, err_size);
    if (st == FSDP_OK && s.tb) {
        st = tb_close(s.tb);
        if (st != FSDP_OK)
            snprintf(err, err_size, "cannot write the TensorBoard events ([log] tensorboard, %s)",
                     train_config_origin(cfg, "log", "tensorboard"));
        s.tb = NULL;
    }
    if (st == FSDP_OK && s.out && !res->interrupted) {
        double per_s = res->samples_per_s * (double)(s.per_sample ? s.per_sample : 1);
        fprintf(s.out, "done: %lld steps in %.2fs (%.0f %s/s)", (long long)ran, res->seconds, per_s,
                s.per_sample ? "tokens" : "samples");
        s.kind->done(cfg, s.feed, s.out, res->first_loss, res->last_loss);
        st = flush_checked(s.out, s.out_name, err, err_size);
    }
    if (st != FSDP_OK && !err[0]) snprintf(err, err_size, "%s: %s", what, fsdp_last_error(ctx));
    train_state_free(ctx, &s);
    fsdp_status off = train_device_tf32(ctx, cfg, false); /* the thread's default again */
    return st == FSDP_OK ? off : st;
}

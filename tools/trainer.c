/* trainer.c: fsdp-train's training loop: an MLP student fits a fixed random teacher network
 * on a synthetic dataset drawn from the counter RNG by global sample index, with SGD on the
 * MSE loss. The tool and tests/test_train.c share it. */
#define _POSIX_C_SOURCE 200809L // clock_gettime

#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef FSDP_VERSION
#define FSDP_VERSION FSDP_VERSION_STRING
#endif

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void format_widths(const int64_t *w, int n, char *buf, size_t size) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++) train_append(buf, size, "%s%lld", i ? "-" : "", (long long)w[i]);
}

/* The teacher's widths: the model's input, data.teacher_widths, the model's output. */
static int teacher_widths(const train_config *cfg, int64_t *w) {
    int n = 0;
    w[n++] = cfg->model.widths.v[0];
    for (int i = 0; i < cfg->data.teacher_widths.n; i++) w[n++] = cfg->data.teacher_widths.v[i];
    w[n++] = cfg->model.widths.v[cfg->model.widths.n - 1];
    return n;
}

/* Dataset streams and the teacher's seed: fixed functions of data.seed, distinct from any
 * parameter's stream so the teacher never equals the student's initialisation. */
#define STREAM_INPUTS  "fsdp-train/inputs"
#define STREAM_NOISE   "fsdp-train/noise"
#define STREAM_TEACHER "fsdp-train/teacher"

/* x (samples, in): x[i][j] = normal(data.seed, inputs, i*in + j); y (samples, out) = teacher(x)
 * + noise. Both are functions of the global sample index only. */
static fsdp_status make_dataset(fsdp_ctx *ctx, const train_config *cfg, fsdp_tensor *x,
                                fsdp_tensor *y) {
    uint64_t seed = (uint64_t)cfg->data.seed;
    int64_t n = fsdp_tensor_numel(x);
    float *xs = fsdp_tensor_f32(x);
    uint64_t inputs = fsdp_rng_stream(STREAM_INPUTS);
    for (int64_t i = 0; i < n; i++) xs[i] = fsdp_rng_normal(seed, inputs, (uint64_t)i);

    int64_t w[TRAIN_MAX_LIST];
    int nw = teacher_widths(cfg, w);
    fsdp_module *teacher = NULL;
    const fsdp_tensor *out = NULL;
    fsdp_status st = fsdp_model_mlp(ctx, nw, w, cfg->model.activation, &teacher);
    if (st == FSDP_OK)
        st = fsdp_module_reset_parameters(ctx, teacher, seed ^ fsdp_rng_stream(STREAM_TEACHER));
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, teacher, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, y, out);
    fsdp_module_free(teacher);
    if (st != FSDP_OK || cfg->data.noise == 0) return st;
    float *ys = fsdp_tensor_f32(y);
    uint64_t noise = fsdp_rng_stream(STREAM_NOISE);
    for (int64_t i = 0; i < fsdp_tensor_numel(y); i++)
        ys[i] += (float)cfg->data.noise * fsdp_rng_normal(seed, noise, (uint64_t)i);
    return FSDP_OK;
}

/* Copies rows start, start+1, ... (wrapping at the end of the dataset) into the batch. */
static void gather_rows(const fsdp_tensor *src, int64_t start, fsdp_tensor *dst) {
    int64_t rows = fsdp_tensor_dim(src, 0), cols = fsdp_tensor_dim(src, 1);
    int64_t want = fsdp_tensor_dim(dst, 0);
    const float *s = fsdp_tensor_f32(src);
    float *d = fsdp_tensor_f32(dst);
    for (int64_t r = 0, i = start; r < want; i = 0) {
        int64_t n = want - r < rows - i ? want - r : rows - i;
        memcpy(d + r * cols, s + i * cols, (size_t)(n * cols) * sizeof(float));
        r += n;
    }
}

/* The loss of the model over the whole dataset (one forward, no gradients). */
static fsdp_status dataset_loss(fsdp_ctx *ctx, fsdp_module *model, const fsdp_tensor *x,
                                const fsdp_tensor *y, double *loss) {
    const fsdp_tensor *pred = NULL;
    float l = 0;
    fsdp_status st = fsdp_module_forward(ctx, model, x, &pred);
    if (st == FSDP_OK) st = fsdp_loss_mse(ctx, pred, y, &l, NULL);
    *loss = l;
    return st;
}

typedef struct train_state {
    fsdp_module *model;
    fsdp_optimizer *opt;
    fsdp_tensor *x, *y;   /* the dataset: (samples, in), (samples, out) */
    fsdp_tensor *xb, *yb; /* one batch: (batch, in), (batch, out) */
    fsdp_tensor *dout;    /* d(loss)/d(prediction): (batch, out) */
    FILE *metrics;
} train_state;

static void train_state_free(train_state *s) {
    fsdp_optimizer_free(s->opt);
    fsdp_module_free(s->model);
    fsdp_tensor_free(s->x);
    fsdp_tensor_free(s->y);
    fsdp_tensor_free(s->xb);
    fsdp_tensor_free(s->yb);
    fsdp_tensor_free(s->dout);
    if (s->metrics) fclose(s->metrics);
}

/* Builds the model, optimizer, dataset and batch tensors; all allocation of a run is here. */
static fsdp_status train_setup(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                               const char **what) {
    const train_int_list *w = &cfg->model.widths;
    int64_t in = w->v[0], out = w->v[w->n - 1];
    int64_t n = cfg->data.samples, b = cfg->data.batch_size;
    fsdp_status st;
    *what = "building the model";
    if ((st = fsdp_model_mlp(ctx, w->n, w->v, cfg->model.activation, &s->model))) return st;
    if (fsdp_ctx_seed(ctx) != (uint64_t)cfg->train.seed &&
        (st = fsdp_module_reset_parameters(ctx, s->model, (uint64_t)cfg->train.seed)))
        return st;
    *what = "creating the optimizer";
    fsdp_sgd_options sgd = {.lr = (float)cfg->optim.lr,
                            .momentum = (float)cfg->optim.momentum,
                            .weight_decay = (float)cfg->optim.weight_decay,
                            .nesterov = cfg->optim.nesterov};
    if ((st = fsdp_sgd_create(ctx, s->model, &sgd, &s->opt))) return st;
    *what = "allocating the dataset";
    if ((st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){n, in}, &s->x)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){n, out}, &s->y)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){b, in}, &s->xb)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){b, out}, &s->yb)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){b, out}, &s->dout)))
        return st;
    *what = "computing the teacher's targets";
    return make_dataset(ctx, cfg, s->x, s->y);
}

/* One progress line and metrics record for the steps since the last one. */
static void report(const train_config *cfg, FILE *out, FILE *metrics, int64_t step, double loss,
                   double samples_per_s, double elapsed) {
    if (out) {
        int digits = snprintf(NULL, 0, "%lld", (long long)cfg->train.steps);
        fprintf(out, "step %*lld/%lld  loss %.6f  samples/s %.0f  time %.2fs\n", digits,
                (long long)step, (long long)cfg->train.steps, loss, samples_per_s, elapsed);
        fflush(out);
    }
    if (metrics) {
        fprintf(metrics,
                "{\"step\": %lld, \"loss\": %.9g, \"samples_per_s\": %.1f, \"time_s\": %.6f}\n",
                (long long)step, loss, samples_per_s, elapsed);
        fflush(metrics);
    }
}

fsdp_status train_run(fsdp_ctx *ctx, const train_config *cfg, FILE *out, train_result *result,
                      char *err, size_t err_size) {
    train_state s = {0};
    train_result res = {0};
    const char *what = "";
    if (cfg->log.level != FSDP_LOG_DEBUG && cfg->log.level != FSDP_LOG_INFO) out = NULL;
    fsdp_status st = train_setup(ctx, cfg, &s, &what);
    if (st == FSDP_OK && cfg->log.metrics[0] && !(s.metrics = fopen(cfg->log.metrics, "a"))) {
        snprintf(err, err_size, "cannot open metrics file '%s' ([log] metrics, %s): %s",
                 cfg->log.metrics, train_config_origin(cfg, "log", "metrics"), strerror(errno));
        train_state_free(&s);
        return FSDP_ERR_IO;
    }
    if (st == FSDP_OK) {
        what = "evaluating the initial loss";
        st = dataset_loss(ctx, s.model, s.x, s.y, &res.first_loss);
    }
    if (st == FSDP_OK && out) {
        char mw[256], tw[256];
        int64_t w[TRAIN_MAX_LIST];
        format_widths(cfg->model.widths.v, cfg->model.widths.n, mw, sizeof mw);
        format_widths(w, teacher_widths(cfg, w), tw, sizeof tw);
        fprintf(out,
                "fsdp-train %s: MLP %s (%s, %lld parameters), teacher %s, %lld samples, "
                "batch %lld, SGD lr %g momentum %g\n",
                FSDP_VERSION, mw, fsdp_activation_to_string(cfg->model.activation),
                (long long)fsdp_module_param_count(s.model), tw, (long long)cfg->data.samples,
                (long long)cfg->data.batch_size, cfg->optim.lr, cfg->optim.momentum);
        if (cfg->log.level == FSDP_LOG_DEBUG) train_config_write(cfg, out);
        int digits = snprintf(NULL, 0, "%lld", (long long)cfg->train.steps);
        fprintf(out, "step %*d/%lld  loss %.6f  (whole dataset, before training)\n", digits, 0,
                (long long)cfg->train.steps, res.first_loss);
    }

    /* The loop: no allocation in here. */
    double t0 = now_seconds(), t_last = t0, loss_sum = 0;
    int64_t start = 0, since = 0;
    for (int64_t step = 1; st == FSDP_OK && step <= cfg->train.steps; step++) {
        const fsdp_tensor *pred = NULL;
        float loss = 0;
        gather_rows(s.x, start, s.xb);
        gather_rows(s.y, start, s.yb);
        start = (start + cfg->data.batch_size) % cfg->data.samples;
        what = "training";
        if ((st = fsdp_module_zero_grad(ctx, s.model)) ||
            (st = fsdp_module_forward(ctx, s.model, s.xb, &pred)) ||
            (st = fsdp_loss_mse(ctx, pred, s.yb, &loss, s.dout)))
            break;
        if (!isfinite(loss)) {
            snprintf(err, err_size,
                     "the loss became %g at step %lld; lower [optim] lr (now %g, %s)", (double)loss,
                     (long long)step, cfg->optim.lr, train_config_origin(cfg, "optim", "lr"));
            train_state_free(&s);
            return FSDP_ERR_STATE;
        }
        if ((st = fsdp_module_backward(ctx, s.model, s.dout, NULL)) /* no input gradient */ ||
            (st = fsdp_optimizer_step(ctx, s.opt)))
            break;
        res.steps = step;
        loss_sum += loss;
        since++;
        if (step % cfg->train.log_every == 0 || step == cfg->train.steps) {
            double t = now_seconds();
            double rate = (double)(since * cfg->data.batch_size) / fmax(t - t_last, 1e-9);
            report(cfg, out, s.metrics, step, loss_sum / (double)since, rate, t - t0);
            t_last = t;
            loss_sum = 0;
            since = 0;
        }
    }
    res.seconds = now_seconds() - t0;
    res.samples_per_s = (double)(res.steps * cfg->data.batch_size) / fmax(res.seconds, 1e-9);
    if (st == FSDP_OK) {
        what = "evaluating the final loss";
        st = dataset_loss(ctx, s.model, s.x, s.y, &res.last_loss);
    }
    if (st != FSDP_OK) {
        snprintf(err, err_size, "%s: %s", what, fsdp_last_error(ctx));
    } else if (out) {
        fprintf(out,
                "done: %lld steps in %.2fs (%.0f samples/s); whole-dataset loss %.6f -> %.6f, "
                "%.1fx lower\n",
                (long long)res.steps, res.seconds, res.samples_per_s, res.first_loss, res.last_loss,
                res.first_loss / fmax(res.last_loss, 1e-30));
        fflush(out);
    }
    train_state_free(&s);
    if (result) *result = res;
    return st;
}

/* train_samples.c: the samples of the MLP kinds: a dataset of `in` inputs and `out` outputs
 * (a fixed random teacher network on inputs drawn from the counter RNG by global sample index,
 * or an HDF5 file's samples), fitted by regression (MSE) or classification (cross-entropy),
 * each dp rank on its torch.chunk slice of every batch. */
#include "train_samples.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_data.h"   // defines: train_data_load, train_order_sample
#include "train_device.h" // defines: train_device_mirror, train_device_to_host

/* What one rank holds. */
typedef struct samples {
    const train_config *cfg;
    fsdp_group *dp;
    int dp_size, dp_rank;
    int64_t in, out;         /* the model's input and output widths */
    bool h5;                 /* the samples of [data] path, else the teacher's */
    bool classify;           /* [data] task = classification */
    fsdp_tensor *x, *y;      /* the dataset, on every rank: (samples, in), (samples, out) */
    int32_t *labels;         /* classification: (samples) class ids */
    int64_t n_train, n_eval; /* training samples [0, n_train), held-out [n_train, samples) */
    train_order order;       /* the training samples' order */
    fsdp_tensor *xb, *yb;    /* this rank's slice of a batch: (len, in), (len, out) */
    int32_t *lb;             /* classification: (len) the slice's class ids */
    fsdp_tensor *dout;       /* d(slice loss)/d(prediction): (len, out) */
    fsdp_tensor *loss;       /* (2): this rank's shares of a loss and a count, then sums */
    int64_t off, len;        /* the slice: samples [off, off + len) of each batch */
    /* On a device ([parallel] device): the dataset uploaded once, the slice's copies (uploaded
     * once per step) and a host copy of predictions to classify; NULL on the CPU. dout is on
     * the device. */
    fsdp_tensor *dx, *dy, *dxb, *dyb, *pred_host;
} samples;

static void format_widths(const int64_t *w, int n, char *buf, size_t size) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++) train_append(buf, size, "%s%lld", i ? "-" : "", (long long)w[i]);
}

/* The teacher's widths: in, data.teacher_widths, out. */
static int teacher_widths(const train_config *cfg, int64_t in, int64_t out, int64_t *w) {
    int n = 0;
    w[n++] = in;
    for (int i = 0; i < cfg->data.teacher_widths.n; i++) w[n++] = cfg->data.teacher_widths.v[i];
    w[n++] = out;
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
    int nw = teacher_widths(cfg, fsdp_tensor_dim(x, 1), fsdp_tensor_dim(y, 1), w);
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

/* Class ids (samples) of a synthetic classification dataset: the argmax of the teacher's
 * output row (the first maximum). */
static void argmax_rows(const float *v, int64_t rows, int64_t cols, int32_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        int32_t best = 0;
        for (int64_t c = 1; c < cols; c++)
            if (v[r * cols + c] > v[r * cols + best]) best = (int32_t)c;
        out[r] = best;
    }
}

static fsdp_status new_f32(fsdp_ctx *ctx, int64_t rows, int64_t cols, fsdp_tensor **out) {
    return fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, cols}, out);
}

/* The rank's copy of the dataset: the h5 data read by the process, or the synthetic teacher's;
 * with classification the class ids. */
static fsdp_status make_data(fsdp_ctx *ctx, const train_config *cfg, const train_data *data,
                             samples *s) {
    int64_t n = fsdp_tensor_dim(s->x, 0), in = fsdp_tensor_dim(s->x, 1);
    int64_t out = fsdp_tensor_dim(s->y, 1);
    if (data) {
        memcpy(fsdp_tensor_f32(s->x), data->x, (size_t)(n * in) * sizeof(float));
        if (data->y) memcpy(fsdp_tensor_f32(s->y), data->y, (size_t)(n * out) * sizeof(float));
    } else {
        TRAIN_TRY(make_dataset(ctx, cfg, s->x, s->y));
    }
    if (!s->classify) return FSDP_OK;
    if (!(s->labels = malloc((size_t)n * sizeof *s->labels))) return FSDP_ERR_OUT_OF_MEMORY;
    if (data)
        memcpy(s->labels, data->labels, (size_t)n * sizeof *s->labels);
    else
        argmax_rows(fsdp_tensor_f32(s->y), n, out, s->labels);
    return FSDP_OK;
}

/* The sums over dp of each rank's `share` (the rank's loss weighted by its part of the
 * samples) and `count` (its correct predictions, exact in f32 below 2^24): the global values,
 * the same on every rank. One rank: its own. */
static fsdp_status sum_over_dp(fsdp_ctx *ctx, samples *s, double share, double count, double *total,
                               double *total_count) {
    if (s->dp_size == 1) {
        *total = share;
        if (total_count) *total_count = count;
        return FSDP_OK;
    }
    fsdp_tensor_f32(s->loss)[0] = (float)share;
    fsdp_tensor_f32(s->loss)[1] = (float)count;
    TRAIN_TRY(fsdp_all_reduce(ctx, s->dp, s->loss, FSDP_REDUCE_SUM));
    *total = fsdp_tensor_f32(s->loss)[0];
    if (total_count) *total_count = fsdp_tensor_f32(s->loss)[1];
    return FSDP_OK;
}

/* Rows of pred (rows, out), on the host, whose argmax is the label. */
static int64_t count_correct(const fsdp_tensor *pred, const int32_t *labels, int64_t rows) {
    int32_t *best = malloc((size_t)(rows ? rows : 1) * sizeof *best);
    if (!best) return -1;
    argmax_rows(fsdp_tensor_f32(pred), rows, fsdp_tensor_dim(pred, 1), best);
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += best[r] == labels[r];
    free(best);
    return n;
}

/* The loss of the model over samples [first, first + n) (one forward, no gradients), and
 * with classification the fraction of them it classifies right (else NAN): each dp rank takes
 * its torch.chunk of the samples. */
static fsdp_status range_loss(fsdp_ctx *ctx, samples *s, fsdp_module *model, int64_t first,
                              int64_t n, double *loss, double *accuracy) {
    int64_t off, len;
    int64_t in = fsdp_tensor_dim(s->x, 1), out = fsdp_tensor_dim(s->y, 1);
    fsdp_chunk_range(n, s->dp_size, s->dp_rank, &off, &len);
    off += first;
    fsdp_tensor *x = NULL, *y = NULL;
    const fsdp_tensor *pred = NULL;
    float l = 0;
    int64_t right = 0;
    fsdp_status st =
        fsdp_tensor_view(ctx, s->dx ? s->dx : s->x, off * in, 2, (int64_t[]){len, in}, &x);
    if (st == FSDP_OK)
        st = fsdp_tensor_view(ctx, s->dy ? s->dy : s->y, off * out, 2, (int64_t[]){len, out}, &y);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, model, x, &pred); /* every rank joins */
    if (st == FSDP_OK && len > 0 && s->classify)
        st = fsdp_loss_cross_entropy(ctx, pred, s->labels + off, &l, NULL);
    else if (st == FSDP_OK && len > 0)
        st = fsdp_loss_mse(ctx, pred, y, &l, NULL);
    if (st == FSDP_OK && len > 0 && s->classify)
        st = train_device_to_host(ctx, pred, &s->pred_host, &pred);
    if (st == FSDP_OK && len > 0 && s->classify &&
        (right = count_correct(pred, s->labels + off, len)) < 0)
        st = FSDP_ERR_OUT_OF_MEMORY;
    double total_right = 0;
    if (st == FSDP_OK)
        st = sum_over_dp(ctx, s, (double)l * (double)len / (double)n, (double)right, loss,
                         &total_right);
    if (accuracy) *accuracy = s->classify ? total_right / (double)n : NAN;
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    return st;
}

/* Copies the rows of the batch slice into xb, yb (regression) or lb (classification): row r is
 * sample train_order_sample(k0 + off + r). */
static void gather_batch(samples *s, int64_t k0) {
    int64_t in = fsdp_tensor_dim(s->x, 1), out = fsdp_tensor_dim(s->y, 1);
    const float *x = fsdp_tensor_f32(s->x), *y = fsdp_tensor_f32(s->y);
    float *xb = fsdp_tensor_f32(s->xb), *yb = fsdp_tensor_f32(s->yb);
    for (int64_t r = 0; r < s->len; r++) {
        int64_t i = train_order_sample(&s->order, k0 + s->off + r);
        memcpy(xb + r * in, x + i * in, (size_t)in * sizeof(float));
        if (s->classify)
            s->lb[r] = s->labels[i];
        else
            memcpy(yb + r * out, y + i * out, (size_t)out * sizeof(float));
    }
}

fsdp_status train_samples_load(const train_config *cfg, void **input, char *err, size_t err_size) {
    *input = NULL;
    if (cfg->data.kind != TRAIN_DATA_H5) return FSDP_OK;
    train_data *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, err_size, "out of memory for the dataset");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    *input = d;
    return train_data_load(cfg, d, err, err_size);
}

void train_samples_unload(void *input) {
    train_data_free(input);
    free(input);
}

fsdp_status train_samples_create(fsdp_ctx *ctx, const train_rank_env *env, int64_t in, int64_t out,
                                 void **feed, train_feed_info *info) {
    const train_config *cfg = env->cfg;
    const train_data *data = env->input;
    samples *s = calloc(1, sizeof *s);
    if (!s) return fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory");
    *feed = s;
    *s = (samples){.cfg = cfg,
                   .dp = env->dp,
                   .dp_size = env->layout->dp,
                   .dp_rank = env->dp_rank,
                   .in = in,
                   .out = out,
                   .h5 = data != NULL,
                   .classify = cfg->data.task == TRAIN_TASK_CLASSIFICATION};
    int64_t n = data ? data->n : cfg->data.samples;
    s->n_eval = train_data_eval_count(cfg, n);
    s->n_train = n - s->n_eval;
    fsdp_chunk_range(env->micro, s->dp_size, s->dp_rank, &s->off, &s->len);
    *info = (train_feed_info){.n_train = s->n_train,
                              .n_eval = s->n_eval,
                              .len = s->len,
                              .train_part = s->n_eval ? "training samples" : "whole dataset"};
    fsdp_status st;
    if ((st = new_f32(ctx, n, in, &s->x)) || (st = new_f32(ctx, n, out, &s->y)) ||
        (st = new_f32(ctx, s->len, in, &s->xb)) || (st = new_f32(ctx, s->len, out, &s->yb)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, fsdp_ctx_device(ctx), 2,
                                 (int64_t[]){s->len, out}, &s->dout)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){2}, &s->loss)) ||
        (st = train_order_init(&s->order, cfg, s->n_train)))
        return st;
    if (s->classify && !(s->lb = malloc((size_t)(s->len ? s->len : 1) * sizeof *s->lb)))
        return FSDP_ERR_OUT_OF_MEMORY;
    if ((st = make_data(ctx, cfg, data, s))) return st;
    if ((st = train_device_mirror(ctx, s->x, &s->dx)) ||
        (st = train_device_mirror(ctx, s->y, &s->dy)) ||
        (st = train_device_mirror(ctx, s->xb, &s->dxb)))
        return st;
    return train_device_mirror(ctx, s->yb, &s->dyb);
}

void train_samples_free(void *feed) {
    samples *s = feed;
    if (!s) return;
    fsdp_tensor_free(s->x);
    fsdp_tensor_free(s->y);
    free(s->labels);
    free(s->lb);
    train_order_free(&s->order);
    fsdp_tensor_free(s->xb);
    fsdp_tensor_free(s->yb);
    fsdp_tensor_free(s->dout);
    fsdp_tensor_free(s->loss);
    fsdp_tensor_free(s->dx);
    fsdp_tensor_free(s->dy);
    fsdp_tensor_free(s->dxb);
    fsdp_tensor_free(s->dyb);
    fsdp_tensor_free(s->pred_host);
    free(s);
}

fsdp_status train_samples_step(fsdp_ctx *ctx, void *feed, fsdp_module *model, int64_t k0,
                               float *loss, fsdp_tensor **dout) {
    samples *s = feed;
    const fsdp_tensor *pred = NULL;
    *loss = 0;
    *dout = s->dout;
    gather_batch(s, k0);
    if (s->dxb && s->len > 0) { /* the slice uploaded once */
        TRAIN_TRY(fsdp_tensor_copy(ctx, s->dxb, s->xb));
        if (!s->classify) TRAIN_TRY(fsdp_tensor_copy(ctx, s->dyb, s->yb));
    }
    TRAIN_TRY(fsdp_module_forward(ctx, model, s->dxb ? s->dxb : s->xb, &pred));
    if (s->len > 0 && s->classify) return fsdp_loss_cross_entropy(ctx, pred, s->lb, loss, s->dout);
    if (s->len > 0) return fsdp_loss_mse(ctx, pred, s->dyb ? s->dyb : s->yb, loss, s->dout);
    return FSDP_OK;
}

fsdp_status train_samples_loss(fsdp_ctx *ctx, void *feed, fsdp_module *model, bool held_out,
                               double *loss, double *accuracy) {
    samples *s = feed;
    return held_out ? range_loss(ctx, s, model, s->n_train, s->n_eval, loss, accuracy)
                    : range_loss(ctx, s, model, 0, s->n_train, loss, accuracy);
}

void train_samples_banner(const train_config *cfg, const void *feed, FILE *out) {
    const samples *s = feed;
    char tw[256];
    int64_t w[TRAIN_MAX_LIST];
    if (s->h5) {
        fprintf(out, "data %s", cfg->data.path);
    } else {
        format_widths(w, teacher_widths(cfg, s->in, s->out, w), tw, sizeof tw);
        fprintf(out, "teacher %s", tw);
    }
    fprintf(out, ", %lld samples (%lld held out), batch %lld, %s\n",
            (long long)(s->n_train + s->n_eval), (long long)s->n_eval,
            (long long)cfg->data.batch_size, s->classify ? "classification" : "regression");
}

void train_samples_done(const train_config *cfg, const void *feed, FILE *out, double first_loss,
                        double last_loss) {
    (void)cfg;
    const samples *s = feed;
    fprintf(out, "; %s loss %.6f -> %.6f, %.1fx lower\n",
            s->n_eval ? "training-samples" : "whole-dataset", first_loss, last_loss,
            first_loss / fmax(last_loss, 1e-30));
}

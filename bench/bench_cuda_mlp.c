/* bench_cuda_mlp.c: one training step of an MLP on one GPU (forward, MSE loss, backward, AdamW
 * step, zero_grad), f32 and TF32, as ms per step: the same model, batch and optimizer that
 * bench/cuda_mlp.py times in PyTorch, so bench/cuda_mlp.sh can print their ratio.
 * Default: widths 4096-8192-8192-4096 (134 M parameters), batch 8192, ReLU.
 * Usage: bench_cuda_mlp [--widths a,b,c,...] [--batch N] [--steps N] [--mode f32|tf32|all] */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"  // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h" // defines: bench_now, bench_median
#include "fsdp/cuda.h"  // defines: fsdp_cuda_set_allow_tf32
#include "fsdp/fsdp.h"

#define MAX_WIDTHS 16
#define MAX_STEPS  200

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        fsdp_status st_ = (expr);                                                                  \
        if (st_ != FSDP_OK) {                                                                      \
            fprintf(stderr, "bench_cuda_mlp: %s failed: %s\n", #expr, fsdp_last_error(ctx));       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct args {
    int n_widths;
    int64_t widths[MAX_WIDTHS];
    int64_t batch;
    int steps;
    const char *mode;
} args;

#define NAME "bench_cuda_mlp"
static const char usage[] =
    "usage: bench_cuda_mlp [--widths a,b,c,...] [--batch N] [--steps N] [--mode f32|tf32|all]\n"
    "One training step of an MLP on cuda:0 (forward, MSE loss, backward, AdamW step, zero_grad),\n"
    "f32 and TF32: the model, batch and optimizer bench/cuda_mlp.py times in PyTorch\n"
    "(bench/cuda_mlp.sh prints their ratio).\n"
    "options:\n"
    "  --widths a,b,...  the layer widths, 2 to 16 (default 4096,8192,8192,4096: 134 M\n"
    "                    parameters, ReLU between)\n"
    "  --batch N         rows per step (default 8192)\n"
    "  --steps N         timed steps after 3 warm-up steps, median (default 20, 1 to 200)\n"
    "  --mode M          f32, tf32 or all (default all)\n"
    "  --help, -h        prints this help\n"
    "prints: a line naming the model, then per mode\n"
    "  libfsdp MODE MS ms/step  (last loss L)\n"
    "or a line saying it skipped when no CUDA device is usable. Writes no file.\n"
    "exit status: 0 done or skipped; 1 a library call failed; 2 bad command line\n";

static void parse(int argc, char **argv, args *a) {
    *a = (args){.n_widths = 4,
                .widths = {4096, 8192, 8192, 4096},
                .batch = 8192,
                .steps = 20,
                .mode = "all"};
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--widths")) {
            long long w[MAX_WIDTHS];
            a->n_widths = bench_cli_widths(
                NAME, usage, o, bench_cli_value(NAME, usage, argc, argv, &i), w, 2, MAX_WIDTHS);
            for (int k = 0; k < a->n_widths; k++) a->widths[k] = w[k];
        } else if (!strcmp(o, "--batch")) {
            a->batch = bench_cli_int(NAME, usage, o, bench_cli_value(NAME, usage, argc, argv, &i),
                                     1, 1 << 24);
        } else if (!strcmp(o, "--steps")) {
            a->steps = (int)bench_cli_int(
                NAME, usage, o, bench_cli_value(NAME, usage, argc, argv, &i), 1, MAX_STEPS);
        } else if (!strcmp(o, "--mode")) {
            a->mode = bench_cli_value(NAME, usage, argc, argv, &i);
            if (strcmp(a->mode, "f32") && strcmp(a->mode, "tf32") && strcmp(a->mode, "all"))
                bench_cli_fail(NAME, usage, "--mode takes f32, tf32 or all, got '%s'", a->mode);
        } else {
            bench_cli_fail(NAME, usage, "unknown argument '%s'", o);
        }
    }
}

/* A tensor of the given shape on dev, filled with uniform values in [-1, 1) from a fixed seed. */
static fsdp_tensor *random_on(fsdp_ctx *ctx, fsdp_device dev, int64_t rows, int64_t cols,
                              unsigned seed) {
    fsdp_tensor *host, *t;
    CHECK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, cols}, &host));
    float *h = fsdp_tensor_f32(host);
    for (int64_t i = 0; i < rows * cols; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
    }
    CHECK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){rows, cols}, &t));
    CHECK(fsdp_tensor_copy(ctx, t, host));
    fsdp_tensor_free(host);
    return t;
}

/* Median ms per step over a->steps timed steps after 3 warm-up steps; the loss of the last. */
static double time_steps(fsdp_ctx *ctx, const args *a, bool tf32, float *last_loss) {
    fsdp_device gpu = {FSDP_DEVICE_CUDA, 0};
    CHECK(fsdp_cuda_set_allow_tf32(ctx, tf32));
    fsdp_module *model;
    CHECK(fsdp_model_mlp(ctx, a->n_widths, a->widths, FSDP_ACT_RELU, &model));
    CHECK(fsdp_module_to(ctx, model, gpu));
    fsdp_optimizer *opt;
    CHECK(fsdp_adamw_create(ctx, model, &(fsdp_adam_options){.lr = 1e-4, .weight_decay = 0.01},
                            &opt));
    int64_t in = a->widths[0], out = a->widths[a->n_widths - 1];
    fsdp_tensor *x = random_on(ctx, gpu, a->batch, in, 1),
                *y = random_on(ctx, gpu, a->batch, out, 2);
    fsdp_tensor *dout;
    CHECK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, gpu, 2, (int64_t[]){a->batch, out}, &dout));
    double t[MAX_STEPS];
    for (int s = -3; s < a->steps; s++) {
        double t0 = bench_now();
        const fsdp_tensor *pred;
        CHECK(fsdp_optimizer_zero_grad(ctx, opt));
        CHECK(fsdp_module_forward(ctx, model, x, &pred));
        CHECK(fsdp_loss_mse(ctx, pred, y, last_loss, dout)); /* the loss reaches the host: a sync */
        CHECK(fsdp_module_backward(ctx, model, dout, NULL));
        CHECK(fsdp_optimizer_step(ctx, opt));
        CHECK(fsdp_device_synchronize(ctx, gpu));
        if (s >= 0) t[s] = 1e3 * (bench_now() - t0);
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    fsdp_tensor_free(dout);
    fsdp_optimizer_free(opt);
    fsdp_module_free(model);
    return bench_median(t, a->steps);
}

int main(int argc, char **argv) {
    args a;
    parse(argc, argv, &a);
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx) != FSDP_OK) return 1;
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        printf("bench_cuda_mlp: skipped: no CUDA device in this build or on this machine\n");
        fsdp_ctx_free(ctx);
        return 0;
    }
    int64_t params = 0;
    for (int i = 0; i + 1 < a.n_widths; i++)
        params += a.widths[i] * a.widths[i + 1] + a.widths[i + 1];
    printf("libfsdp MLP on cuda:0: widths");
    for (int i = 0; i < a.n_widths; i++) printf("%s%lld", i ? "-" : " ", (long long)a.widths[i]);
    printf(", %.1f M parameters, batch %lld, MSE, AdamW, median of %d steps\n",
           (double)params / 1e6, (long long)a.batch, a.steps);
    const char *modes[] = {"f32", "tf32"};
    for (int m = 0; m < 2; m++) {
        if (strcmp(a.mode, "all") && strcmp(a.mode, modes[m])) continue;
        float loss;
        double ms = time_steps(ctx, &a, m == 1, &loss);
        printf("libfsdp %-5s %9.2f ms/step  (last loss %.6f)\n", modes[m], ms, loss);
    }
    fsdp_ctx_free(ctx);
    return 0;
}

/* test_train_device.c: fsdp-train's [parallel] device (train_run, the loop the tool runs): the
 * MLP and the Llama at (dp, tp) = (2, 2), FSDP per layer after TP (the 2-D layout), and at
 * (2, 1) under FULL_SHARD, on `sim` devices (deferred streams, two devices shared by the rank
 * threads) give the CPU run's step losses, dataset losses, evaluation, comm-debug table and
 * final checkpoint bit for bit; the progress lines and metrics records name the device (and
 * the CPU run's do not); an unknown device, cuda without a GPU and a device under the mpi
 * backend are refused naming the key and the fix, and so are the rules of backend = nccl.
 *
 * With FSDP_TEST_BACKEND=nccl (CTest's test_train_device_nccl) it runs [parallel] backend =
 * nccl instead: the stand-in NCCL opened through FSDP_NCCL_LIBRARY alone (its marker makes it
 * the library of sim devices), one sim device per rank (FSDP_SIM_DEVICES=4), the MLP and the
 * Llama at (2, 2) against the local backend's cpu run, bit for bit: every group has 2 ranks, and
 * a sum of two terms is the same in either order.
 *
 * With FSDP_TEST_DEVICE=cuda (CTest's test_train_device_cuda, label gpu) the device runs use
 * [parallel] device = cuda, every rank thread on cuda:0 (the process sees one GPU: rank r on
 * cuda:(r mod 1)), SGD with momentum instead of AdamW, and are compared with the CPU run within
 * the derived bound of CUDA_K and CUDA_DEPTH below instead of bit for bit; the comm-debug tables
 * stay equal. Without a GPU it skips (77), with FSDP_TEST_REQUIRE_DEVICE=cuda it fails. With
 * FSDP_TEST_CUDA_REHEARSAL=1 too (test_train_device_cuda_rehearsal) the same code runs on sim,
 * every rank on sim:0 (FSDP_SIM_DEVICES=1): the bounded comparison runs, and finds no difference,
 * as sim runs the CPU's kernels. */
#define _POSIX_C_SOURCE 200809L // setenv, open_memstream

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_common.h"   // defines: ckpt_test_tmp_root, ckpt_test_remove_tree, ckpt_test_compare
#include "device_record.h" // defines: record_cuda_model, record_device_mode, on_cuda, rank_device
#include "fsdp/ckpt.h"     // defines: fsdp_ckpt_open, fsdp_ckpt_read
#include "harness.h"
#include "numerics.h"     // defines: fsdp_test_sum_tol
#include "shell.h"        // defines: fsdp_test_shell
#include "train_config.h" // defines: train_config_init, train_config_set, train_config_check
#include "train_tokens.h" // defines: TRAIN_TOKENS_MAGIC, TRAIN_TOKENS_HEADER
#include "trainer.h"      // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */
static char *g_root;       /* this run's scratch directory */
static char g_tokens[1100];
static bool g_nccl;       /* FSDP_TEST_BACKEND=nccl: the sim runs are on backend = nccl */
static int g_sim_devices; /* FSDP_SIM_DEVICES of this run */
static bool g_cuda;       /* FSDP_TEST_DEVICE=cuda: the cuda mode (on sim:0 when rehearsed) */
static const char *g_dev = "sim"; /* the device runs' [parallel] device */
static double g_bound; /* the cuda mode's relative bound (record_cuda_bound); 0: bit for bit */

/* The cuda bound's model (device_record.h record_cuda_model, which derives the bound
 * fsdp_test_sum_tol(k, depth) + 8 depth u from it). k, the longest sum: the gradient norm's sum
 * of squares over every parameter (clip_grad_norm), at most 2^16 terms (the Llama has about
 * 35 000 parameters, its embedding and lm_head 256 x 32 each and two layers of 9 280; the MLP
 * 484); the GEMMs' inner dimensions (at most 64: the Llama's ffn_hidden and batch x sequence in
 * the weight gradients) and the softmax over the vocabulary (256) are shorter. depth, the GEMMs
 * and sums chained on a value's path: the 2-layer Llama's step is test_llama_device's 47 (22 in
 * the forward, 23 in the backward, clipping's norm, the update with its momentum sum), the MLP's
 * fewer; at most 6 steps (the MLP's), then the evaluation's forward (22): 6 x 47 + 22 = 304.
 * That gives 2.27e-3 of a value's magnitude. Each compared loss, the evaluation and the
 * gradient norm is a scalar, bounded relative to itself as the device suites' recorded losses
 * are (the MLP's MSE loss, mean (y - t)^2, may amplify a difference in y by up to
 * 2 max|y| / sqrt(loss) relative to itself: not in the bound, whose margin the first GPU run
 * will show); each checkpoint tensor relative to its largest magnitude. SGD, not AdamW: Adam's
 * division by sqrt(v) turns a rounding difference into a move of up to lr (device_record.c).
 * Momentum is kept (the checkpoint then holds optimizer state the GPU computed): its buffer sums at
 * most 6 gradients with positive weights, one chained sum per step, counted in the update's place.
 */
#define CUDA_K     65536
#define CUDA_DEPTH (6 * 47 + 22)

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The MLP of test_train (Linear(8, 16), relu, Linear(16, 16), relu, Linear(16, 4)), AdamW with
 * clipping, 6 steps: small enough for two cores, long enough for the optimizer state to count. */
static const char *const g_mlp[] = {
    "model.widths=8,16,16,4", "data.samples=64",  "data.batch_size=8",
    "data.teacher_widths=16", "optim.name=adamw", "optim.lr=0.01",
    "optim.clip_grad_norm=1", "train.steps=6",    NULL};

/* A tiny Llama (test_train_llama's, one layer fewer steps): 2 layers of dim 32, 4 query and 2
 * key/value heads, sequences of 16, 4 per batch, 4 AdamW steps with clipping, an evaluation
 * at the end over 2 held-out batches. */
static const char *const g_llama[] = {
    "model.kind=llama",   "model.dim=32",           "model.n_layers=2",     "model.n_heads=4",
    "model.n_kv_heads=2", "model.ffn_hidden=64",    "model.max_seq_len=16", "data.kind=tokens",
    "data.batch_size=4",  "data.eval_fraction=0.1", "data.eval_batches=2",  "optim.name=adamw",
    "optim.lr=0.01",      "optim.clip_grad_norm=1", "train.steps=4",        NULL};

/* The cuda mode's optimizer (replacing the models' AdamW). */
static const char *const g_sgd[] = {"optim.name=sgd", "optim.lr=0.05", "optim.momentum=0.9", NULL};

/* Every run: rank threads, progress and comm-debug table on, a record every 2 steps. */
static const char *const g_common[] = {"parallel.backend=local", "parallel.timeout_s=120",
                                       "log.level=info",         "log.comm_debug=true",
                                       "train.log_every=2",      NULL};

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
    if (err[0]) printf("\n    %s", err);
}

static void setf(const char *key, const char *value) {
    char a[1400];
    snprintf(a, sizeof a, "%s=%s", key, value);
    set(a);
}

/* The run's configuration; dir and metrics may be NULL (none), layout may set them again. */
static void configure(const char *const *model, const char *const *layout, const char *device,
                      const char *dir, const char *metrics) {
    train_config_init(&g_cfg);
    for (int i = 0; g_common[i]; i++) set(g_common[i]);
    for (int i = 0; model[i]; i++) set(model[i]);
    for (int i = 0; g_cuda && g_sgd[i]; i++) set(g_sgd[i]);
    if (model == g_llama) setf("data.path", g_tokens);
    if (dir) setf("checkpoint.dir", dir);
    if (metrics) setf("log.metrics", metrics);
    for (int i = 0; layout[i]; i++) set(layout[i]);
    setf("parallel.device", device);
}

/* One run's results. */
typedef struct run_out {
    train_result res;
    char *text;       /* the progress output (malloc'ed) */
    char *metrics;    /* the metrics file's text (malloc'ed) */
    char dir[1200];   /* [checkpoint] dir */
    char table[4096]; /* the comm_debug table's lines */
} run_out;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, 1 << 20);
    if (f && text) text[fread(text, 1, (1 << 20) - 1, f)] = '\0';
    if (f) fclose(f);
    return text;
}

/* The lines of out from "comm_debug:" up to the next progress, eval or checkpoint line. */
static void comm_table(const char *out, char *table, size_t size) {
    table[0] = '\0';
    const char *p = out ? strstr(out, "comm_debug:") : NULL;
    size_t n = 0;
    while (p && *p && strncmp(p, "step ", 5) != 0 && strncmp(p, "eval ", 5) != 0 &&
           strncmp(p, "checkpoint", 10) != 0) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) + 1 : strlen(p);
        if (n + len < size) memcpy(table + n, p, len), n += len, table[n] = '\0';
        p += len;
    }
}

static fsdp_status run(const char *name, const char *const *model, const char *const *layout,
                       const char *device, run_out *o) {
    char err[TRAIN_ERROR_SIZE] = "", metrics[1200];
    snprintf(o->dir, sizeof o->dir, "%s/%s-%s", g_root, name, device);
    snprintf(metrics, sizeof metrics, "%s/%s-%s.jsonl", g_root, name, device);
    configure(model, layout, device, o->dir, metrics);
    if (g_nccl && strcmp(device, "sim") == 0) set("parallel.backend=nccl");
    size_t size = 0;
    FILE *f = open_memstream(&o->text, &size);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, f, &o->res, err, sizeof err);
    fclose(f);
    if (st != FSDP_OK) printf("\n    %s on %s: %s", name, device, err);
    o->metrics = slurp(metrics);
    comm_table(o->text, o->table, sizeof o->table);
    return st;
}

static bool same_bits(const void *a, const void *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

/* got against the cpu's want: |got - want| <= tol |want|, or with tol 0 the same bits (NAN, no
 * evaluation, equals NAN); prints what differs. *worst: the largest relative difference seen. */
static bool close_rel(const char *what, double got, double want, double tol, double *worst) {
    bool ok;
    if (tol == 0 || isnan(want) || isnan(got)) {
        ok = same_bits(&got, &want, sizeof got) || (isnan(got) && isnan(want));
    } else {
        double rel = fabs(got - want) / fmax(fabs(want), DBL_MIN);
        *worst = fmax(*worst, rel);
        ok = fabs(got - want) <= tol * fabs(want);
    }
    if (!ok) printf("\n    %s: %.17g against the cpu's %.17g (bound %.3g)", what, got, want, tol);
    return ok;
}

/* The device run's results s against the cpu run's c: the step losses, the dataset losses, the
 * evaluation's loss and the gradient norm within tol (0: bit for bit); the accuracy equal, or
 * with tol > 0 within acc_slack (an argmax whose two largest logits are within the bound may
 * flip). */
static bool results_close(const train_result *c, const train_result *s, double tol,
                          double acc_slack, double *worst) {
    bool ok = c->n_step_losses > 0 && c->n_step_losses == s->n_step_losses;
    for (int64_t i = 0; ok && i < c->n_step_losses; i++)
        ok = close_rel("step loss", s->step_loss[i], c->step_loss[i], tol, worst);
    ok = ok && close_rel("first loss", s->first_loss, c->first_loss, tol, worst);
    ok = ok && close_rel("last loss", s->last_loss, c->last_loss, tol, worst);
    ok = ok && close_rel("eval loss", s->eval_loss, c->eval_loss, tol, worst);
    ok = ok && close_rel("grad norm", s->grad_norm, c->grad_norm, tol, worst);
    bool acc = tol == 0 || isnan(c->eval_accuracy)
                   ? same_bits(&s->eval_accuracy, &c->eval_accuracy, sizeof(double))
                   : fabs(s->eval_accuracy - c->eval_accuracy) <= acc_slack;
    if (!acc)
        printf("\n    eval accuracy %g against the cpu's %g", s->eval_accuracy, c->eval_accuracy);
    return ok && acc;
}

/* Checkpoints a (the cpu's) and b: the same tensors and shapes, each value within tol times its
 * tensor's largest magnitude in a (0: the same bits). *worst: the largest such multiple. */
static bool ckpt_close(const char *a, const char *b, double tol, double *worst) {
    double diff = 0;
    bool bitwise = false;
    if (!ckpt_test_compare(a, b, &diff, &bitwise)) return false; /* names and shapes */
    if (tol == 0 || bitwise) return bitwise;
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_ckpt *ca = NULL, *cb = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, a, &ca));
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, b, &cb));
    bool ok = ca && cb;
    for (int t = 0; ok && t < fsdp_ckpt_num_tensors(ca); t++) {
        fsdp_ckpt_tensor ta;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ca, t, &ta));
        fsdp_state_region all = {.ndim = ta.ndim};
        int64_t n = 1;
        for (int d = 0; d < ta.ndim; d++) all.count[d] = ta.shape[d], n *= ta.shape[d];
        float *va = malloc((size_t)n * sizeof(float) + 1),
              *vb = malloc((size_t)n * sizeof(float) + 1);
        ok = va && vb && fsdp_ckpt_read(ctx, ca, t, &all, va) == FSDP_OK &&
             fsdp_ckpt_read(ctx, cb, fsdp_ckpt_find(cb, ta.name), &all, vb) == FSDP_OK;
        double top = 0, d = 0;
        for (int64_t i = 0; ok && i < n; i++) {
            top = fmax(top, fabs((double)va[i]));
            d = fmax(d, fabs((double)va[i] - (double)vb[i]));
        }
        if (ok && d > 0) *worst = fmax(*worst, d / fmax(top, DBL_MIN));
        if (ok && d > tol * top) {
            printf("\n    checkpoint %s: differs by %.3g, bound %.3g x %.3g", ta.name, d, tol, top);
            ok = false;
        }
        free(va), free(vb);
    }
    fsdp_ckpt_close(ca);
    fsdp_ckpt_close(cb);
    return ok;
}

/* Every progress record of a device run has the allocator's figures, each peak above 0 and
 * at most the reserved bytes (reserved does not shrink during a run: nothing empties the
 * cache), and the progress lines name the device's memory. */
static bool memory_recorded(const char *metrics) {
    int records = 0;
    bool ok = metrics != NULL;
    for (const char *p = metrics; ok && (p = strstr(p, "\"mem_peak_bytes\": ")); records++) {
        long long peak = 0, reserved = 0;
        ok = sscanf(p, "\"mem_peak_bytes\": %lld, \"mem_reserved_bytes\": %lld", &peak,
                    &reserved) == 2 &&
             peak > 0 && peak <= reserved;
        if (!ok) printf("\n    bad memory figures: %.80s", p);
        p++;
    }
    return ok && records > 0;
}

/* The run on cpu and on the device (sim; cuda in the cuda mode): every loss and the final
 * checkpoint bit for bit (within g_bound in the cuda mode), the comm-debug table equal; the
 * device in the device run's lines and records only. */
static void cpu_against_sim(const char *name, const char *const *model, const char *const *layout) {
    run_out c = {0}, s = {0};
    FSDP_TEST_OK(run(name, model, layout, "cpu", &c));
    FSDP_TEST_OK(run(name, model, layout, g_dev, &s));
    CU_ASSERT_EQUAL(c.res.steps, s.res.steps);
    double worst = 0, ck_worst = 0;
    /* at most one of the MLP's 16 held-out samples flips (g_mlp's classification case) */
    bool losses = results_close(&c.res, &s.res, g_bound, 1.0 / 16 + 1e-12, &worst);
    CU_ASSERT_TRUE(losses);
    /* the same collectives, calls and bytes, op by op and unit by unit */
    CU_ASSERT_TRUE(c.table[0] != '\0' && strcmp(c.table, s.table) == 0);
    CU_ASSERT_TRUE(c.res.saved[0] && s.res.saved[0]);
    bool ckpt = ckpt_close(c.res.saved, s.res.saved, g_bound, &ck_worst);
    CU_ASSERT_TRUE(ckpt);
    if (g_bound > 0 && strcmp(g_dev, "sim") == 0) /* the rehearsal: sim is the cpu's arithmetic */
        CU_ASSERT_TRUE(worst == 0 && ck_worst == 0);
    /* the device is shown where the run is on one, and nothing changes on the cpu */
    char line[96], on[32], rec[48];
    int count = strcmp(g_dev, "cuda") == 0 ? fsdp_device_count(FSDP_DEVICE_CUDA) : g_sim_devices;
    snprintf(line, sizeof line, ", device %s:0 (rank r on %s:(r mod %d))\n", g_dev, g_dev, count);
    snprintf(on, sizeof on, "  on %s:0  mem ", g_dev);
    snprintf(rec, sizeof rec, "\"device\": \"%s:0\"", g_dev);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.text, line));
    /* the backend that ran: the parallel line's "(nccl)" or "(local)" */
    CU_ASSERT_PTR_NOT_NULL(strstr(s.text, g_nccl ? " ranks (nccl): " : " ranks (local): "));
    CU_ASSERT_PTR_NOT_NULL(strstr(c.text, " ranks (local): "));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.text, on));
    CU_ASSERT_PTR_NOT_NULL(s.metrics && strstr(s.metrics, rec));
    CU_ASSERT_TRUE(memory_recorded(s.metrics));
    CU_ASSERT_PTR_NULL(strstr(c.text, "device"));
    CU_ASSERT_PTR_NULL(strstr(c.text, " mem "));
    CU_ASSERT_PTR_NULL(c.metrics ? strstr(c.metrics, "mem_peak_bytes") : "no metrics");
    CU_ASSERT_PTR_NULL(c.metrics ? strstr(c.metrics, "device") : "no metrics");
    /* no peak figure on the cpu or sim, so no mfu (a GPU in the table has one) */
    CU_ASSERT_PTR_NULL(strstr(c.text, "mfu"));
    if (strcmp(g_dev, "sim") == 0) CU_ASSERT_PTR_NULL(strstr(s.text, "mfu"));
    if (g_bound > 0)
        printf("\n    %s: %lld steps, loss %.6f -> %.6f, %s within %.3g of the cpu: %s (largest "
               "relative difference %.2g, checkpoint %.2g)",
               name, (long long)s.res.steps, s.res.first_loss, s.res.last_loss, g_dev, g_bound,
               losses && ckpt ? "yes" : "NO", worst, ck_worst);
    else
        printf("\n    %s: %lld steps, loss %.6f -> %.6f, sim%s %s the cpu", name,
               (long long)s.res.steps, s.res.first_loss, s.res.last_loss, g_nccl ? " on nccl" : "",
               losses && ckpt ? "bitwise" : "DIFFERS from");
    if (!losses || !ckpt || strcmp(c.table, s.table) != 0)
        printf("\n    cpu:\n%s\n    %s:\n%s", c.text, g_dev, s.text);
    free(c.text), free(s.text), free(c.metrics), free(s.metrics);
}

/* The comparison's negative control: a step loss moved by twice the bound (by one ulp where the
 * comparison is bit for bit), and a checkpoint from other steps, are flagged; a move by half the
 * bound passes. The bound is the cuda mode's (its size where this mode has none). */
static void test_bounded_control(void) {
    train_result c = {.n_step_losses = 3,
                      .step_loss = {2.5, 2.0, 1.75},
                      .first_loss = 2.75,
                      .last_loss = 1.5,
                      .eval_loss = NAN,
                      .eval_accuracy = NAN,
                      .grad_norm = 0.8};
    double tol = g_bound > 0 ? g_bound : fsdp_test_sum_tol(CUDA_K, CUDA_DEPTH), worst = 0;
    train_result s = c;
    CU_ASSERT_TRUE(results_close(&c, &s, tol, 0, &worst));
    CU_ASSERT_TRUE(results_close(&c, &s, 0, 0, &worst));
    s.step_loss[1] = c.step_loss[1] * (1 + tol / 2);
    CU_ASSERT_TRUE(results_close(&c, &s, tol, 0, &worst));
    s.step_loss[1] = c.step_loss[1] * (1 + 2 * tol);
    CU_ASSERT_FALSE(results_close(&c, &s, tol, 0, &worst));
    s.step_loss[1] = nextafter(c.step_loss[1], 0);
    CU_ASSERT_FALSE(results_close(&c, &s, 0, 0, &worst));
    s = c, s.grad_norm = c.grad_norm * (1 - 2 * tol);
    CU_ASSERT_FALSE(results_close(&c, &s, tol, 0, &worst));
    /* checkpoints of the MLP after 1 and 6 steps: far more than the bound apart */
    run_out a = {0}, b = {0};
    FSDP_TEST_OK(run("control_1", g_mlp, SET("parallel.ranks=2", "train.steps=1"), "cpu", &a));
    FSDP_TEST_OK(run("control_6", g_mlp, SET("parallel.ranks=2", "train.steps=6"), "cpu", &b));
    worst = 0;
    CU_ASSERT_TRUE(ckpt_close(a.res.saved, a.res.saved, tol, &worst));
    CU_ASSERT_FALSE(ckpt_close(a.res.saved, b.res.saved, tol, &worst));
    CU_ASSERT_FALSE(ckpt_close(a.res.saved, b.res.saved, 0, &worst));
    printf("\n    moved by 2 x %.3g (or one ulp), a loss is flagged; so is another step's "
           "checkpoint (%.2g of a tensor's magnitude apart)",
           tol, worst);
    free(a.text), free(b.text), free(a.metrics), free(b.metrics);
}

/* (dp, tp) = (2, 2): TP over the Linear pairs, then FSDP per hidden Linear over dp. */
static void test_mlp_fsdp_tp(void) {
    cpu_against_sim("mlp_2x2", g_mlp,
                    SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"));
}

/* (2, 1) FULL_SHARD, classification with a held-out split (predictions read back to count the
 * right ones) and two micro-batches (the gradient of each scaled on the way). */
static void test_mlp_full_shard(void) {
    cpu_against_sim("mlp_2x1", g_mlp,
                    SET("parallel.ranks=2", "parallel.strategy=full_shard",
                        "data.task=classification", "data.eval_fraction=0.25",
                        "train.grad_accum=2"));
}

/* (2, 2): the Llama's TP plan with loss parallel, then FSDP per decoder layer over dp. */
static void test_llama_fsdp_tp(void) {
    cpu_against_sim("llama_2x2", g_llama,
                    SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"));
}

/* Every record's mfu against tokens/s x the FLOPs of a token (counted here from g_llama's
 * shape) over the peak and the devices: within the records' rounding (tokens/s to 0.1, mfu to
 * 4 decimals). Returns the records checked. */
static int mfu_recorded(const char *metrics, double peak_tflops, int devices) {
    /* dim 32, 2 layers, 4 heads of 8 (2 key/value), ffn 64, vocab 256 (the default), T 16 */
    const double d = 32, kv = 2 * 8, ffn = 64, vocab = 256, T = 16, L = 2;
    double n = L * (2 * d * d + 2 * kv * d + 3 * ffn * d + 2 * d) + d + vocab * d;
    double per_token = 6 * n + 12 * L * d * T, rate = per_token / (peak_tflops * 1e12 * devices);
    int records = 0;
    for (const char *p = metrics; p && (p = strstr(p, "\"tokens_per_s\": ")); p++) {
        double tps = 0, mfu = -1;
        bool ok = sscanf(p, "\"tokens_per_s\": %lf, \"mfu\": %lf", &tps, &mfu) == 2 &&
                  fabs(mfu - tps * rate) <= 5e-5 + 0.05 * rate * 1.01;
        if (!ok) printf("\n    mfu %.4f, want %.4f: %.80s", mfu, tps * rate, p);
        records += ok ? 1 : -1000;
    }
    return records;
}

/* [log] peak_tflops and [parallel] allow_tf32: the banner's count and peak (f32 on sim and the
 * cpu, tf32 on a GPU; bf16 under autocast whatever allow_tf32 says), the devices (sim's 2 for 4
 * rank threads, a rank each on the cpu) and each progress record's mfu. */
static void test_mfu(void) {
    const char *const runs[][4] = {
        {"mfu_dev", "f32", "parallel.allow_tf32=true", "model.autocast=f32"},
        {"mfu_cpu", "cpu", "parallel.allow_tf32=true", "model.autocast=bf16"},
    };
    for (int i = 0; i < 2; i++) {
        bool on_cpu = strcmp(runs[i][1], "cpu") == 0, cuda = !on_cpu && strcmp(g_dev, "cuda") == 0;
        int count = cuda ? fsdp_device_count(FSDP_DEVICE_CUDA) : g_sim_devices;
        int devices = on_cpu ? 4 : count < 4 ? count : 4;
        const char *mode = on_cpu ? "bf16" : cuda ? "tf32" : "f32";
        run_out o = {0};
        FSDP_TEST_OK(run(runs[i][0], g_llama,
                         SET("parallel.ranks=4", "parallel.tp=2", "log.peak_tflops=0.002",
                             runs[i][2], runs[i][3]),
                         on_cpu ? "cpu" : g_dev, &o));
        char banner[200];
        snprintf(banner, sizeof banner,
                 "mfu: 2.768e+06 FLOP per sequence (6N + 12 L d T per token) against 0.002 "
                 "TFLOP/s (%s, [log] peak_tflops) x %d device%s\n",
                 mode, devices, devices == 1 ? "" : "s");
        CU_ASSERT_PTR_NOT_NULL(o.text && strstr(o.text, banner));
        CU_ASSERT_PTR_NOT_NULL(o.text && strstr(o.text, "  mfu "));
        int records = mfu_recorded(o.metrics, 0.002, devices);
        printf("\n    %s: %d records' mfu as counted", runs[i][0], records);
        CU_ASSERT_EQUAL(records, 2); /* steps 2 and 4 */
        if (!o.text || !strstr(o.text, banner)) printf("\n    want %s in:\n%s", banner, o.text);
        free(o.text), free(o.metrics);
    }
}

/* (2, 1) FULL_SHARD over the whole Llama. */
static void test_llama_full_shard(void) {
    cpu_against_sim("llama_2x1", g_llama, SET("parallel.ranks=2", "parallel.strategy=full_shard"));
}

/* A checkpoint of a cpu run resumed on sim, and one of a sim run resumed on cpu, end where an
 * uninterrupted cpu run does, bit for bit (losses of the resumed steps and the checkpoint). */
static void resume_across(const char *first, const char *second) {
    char name[64], dir[1300];
    snprintf(name, sizeof name, "resume_%s_then_%s", first, second);
    const char *const *layout = SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer");
    run_out a = {0}, b = {0}, whole = {0};
    FSDP_TEST_OK(
        run(name, g_mlp,
            SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", "train.steps=3"), first,
            &a));
    snprintf(dir, sizeof dir, "checkpoint.dir=%s", a.dir); /* resume = auto: from step 3 */
    FSDP_TEST_OK(run(name, g_mlp,
                     SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", dir), second,
                     &b));
    snprintf(name, sizeof name, "whole_for_%s_then_%s", first, second);
    FSDP_TEST_OK(run(name, g_mlp, layout, "cpu", &whole));
    CU_ASSERT_EQUAL(b.res.start_step, 3);
    CU_ASSERT_EQUAL(b.res.n_step_losses, 3);
    CU_ASSERT_EQUAL(whole.res.n_step_losses, 6);
    bool losses = b.res.n_step_losses == 3 && whole.res.n_step_losses == 6 &&
                  same_bits(b.res.step_loss, whole.res.step_loss + 3, 3 * sizeof(double));
    CU_ASSERT_TRUE(losses);
    double diff = 0;
    bool bitwise = false;
    CU_ASSERT_TRUE(ckpt_test_compare(b.res.saved, whole.res.saved, &diff, &bitwise));
    CU_ASSERT_TRUE(bitwise);
    printf("\n    3 steps on %s, 3 more on %s: %s 6 on cpu (checkpoint max diff %.1e)", first,
           second, losses && bitwise ? "bitwise" : "DIFFER from", diff);
    free(a.text), free(b.text), free(whole.text), free(a.metrics), free(b.metrics),
        free(whole.metrics);
}

static void test_resume_other_device(void) {
    if (g_cuda) {
        fsdp_test_skip("the resumed run must end where an uninterrupted cpu run does bit for bit, "
                       "which only sim's arithmetic gives (the suite's own entry runs it)");
        return;
    }
    resume_across("cpu", "sim");
    resume_across("sim", "cpu");
}

/* An unknown device when the key is read; cuda on a machine without a GPU and any device under
 * the mpi backend when the configuration is checked; each message names the key and the fix. */
static void test_refusals(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.device=gpu", err, sizeof err),
                    FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "device"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "sim"));
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        configure(g_mlp, SET("parallel.ranks=2"), "cuda", NULL, NULL);
        err[0] = '\0';
        CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
        printf("\n    %s", err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "[parallel] device = cuda"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "no GPU is usable"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "device = sim"));
        train_result res;
        CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                        FSDP_ERR_CONFIG);
        CU_ASSERT_EQUAL(res.rank, -1); /* refused before any rank ran */
    } else {
        printf("\n    (a GPU is usable here: cuda is not refused)");
    }
    if (fsdp_backend_available(FSDP_BACKEND_MPI)) {
        configure(g_mlp, SET("parallel.backend=mpi"), "sim", NULL, NULL);
        err[0] = '\0';
        CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
        printf("\n    %s", err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "[parallel] device = sim"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "backend = local"));
    } else {
        printf("\n    (no MPI backend in this build: the mpi refusal is not reached)");
    }
}

/* Expects train_config_check to refuse g_cfg with a message holding each of the strings. */
static void expect_refused(const char *const *parts) {
    char err[TRAIN_ERROR_SIZE] = "";
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    for (int i = 0; parts[i]; i++) {
        bool has = strstr(err, parts[i]) != NULL;
        CU_ASSERT_TRUE(has);
        if (!has) printf("\n    (missing: %s)", parts[i]);
    }
}

/* backend = nccl: no nccl backend in the build; the cpu device; more rank threads than
 * devices; under mpirun (the launcher's variable set) it is nccl-mpi, refused when that is not
 * built. Each message names the key and the fix. */
static void test_nccl_refusals(void) {
    if (g_cuda) {
        fsdp_test_skip("its cases need two sim devices (FSDP_SIM_DEVICES=2) and the stand-in "
                       "NCCL's sim; the cuda mode has one device (the suite's own entry runs it)");
        return;
    }
    if (!fsdp_backend_available(FSDP_BACKEND_NCCL)) {
        configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "sim", NULL, NULL);
        expect_refused(SET("[parallel] backend = nccl", "no nccl backend", "backend = local"));
        return;
    }
    configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "cpu", NULL, NULL);
    expect_refused(SET("[parallel] backend = nccl", "[parallel] device = cpu", "device = cuda",
                       "FSDP_NCCL_LIBRARY", "backend = local"));
    train_result res;
    char err[TRAIN_ERROR_SIZE] = "";
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(res.rank, -1); /* refused before any world was made */
    configure(g_mlp, SET("parallel.ranks=4", "parallel.tp=2", "parallel.backend=nccl"), "sim", NULL,
              NULL); /* 4 rank threads, FSDP_SIM_DEVICES = 2 */
    expect_refused(SET("[parallel] backend = nccl", "the world has 4 ranks", "has 2 devices",
                       "FSDP_SIM_DEVICES"));
    configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "sim", NULL, NULL);
    expect_refused(SET("[parallel] device = sim", "[parallel] backend = nccl", "FSDP_NCCL_LIBRARY",
                       "stand-in NCCL"));
    setenv("FSDP_NCCL_LIBRARY", "libfsdp_nccl_standin.so", 1); /* checked, not opened */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);                    /* as mpirun starts the process */
    configure(g_mlp, SET("parallel.backend=nccl"), "sim", NULL, NULL);
    CU_ASSERT_EQUAL(train_config_backend(&g_cfg), TRAIN_BACKEND_NCCL_MPI);
    CU_ASSERT_EQUAL(train_config_world_size(&g_cfg), 0); /* the job's size decides */
    if (!fsdp_backend_available(FSDP_BACKEND_NCCL_MPI)) {
        expect_refused(SET("[parallel] backend = nccl", "no nccl-mpi backend", "without mpirun"));
    } else {
        err[0] = '\0';
        CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_OK);
        configure(g_mlp, SET("parallel.backend=nccl"), "cpu", NULL, NULL);
        expect_refused(SET("[parallel] backend = nccl", "[parallel] device = cpu"));
    }
    unsetenv("OMPI_COMM_WORLD_SIZE");
    configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "sim", NULL, NULL);
    CU_ASSERT_EQUAL(train_config_backend(&g_cfg), TRAIN_BACKEND_NCCL);
    err[0] = '\0';
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_OK); /* 2 ranks, 2 devices */
    unsetenv("FSDP_NCCL_LIBRARY");
}

#ifndef FSDP_TRAIN_EXE
#define FSDP_TRAIN_EXE ""
#endif

/* `mpirun -np 2 fsdp-train` (FSDP_TRAIN_MPIRUN, set by CTest's test_train_device_mpi2) with
 * backend = nccl, which resolves to nccl-mpi there: each process refuses the cpu device, and
 * sim without FSDP_NCCL_LIBRARY, before making a world (exit status 2, the key and the fix
 * named once per process); in a build without nccl-mpi, the backend itself. */
static void test_nccl_under_mpirun(void) {
    const char *mpirun = getenv("FSDP_TRAIN_MPIRUN");
    if (!mpirun || !*mpirun || !*FSDP_TRAIN_EXE) {
        fsdp_test_skip("FSDP_TRAIN_MPIRUN is not set (CTest's test_train_device_mpi2 sets it)");
        return;
    }
    bool built = fsdp_backend_available(FSDP_BACKEND_NCCL_MPI);
    static const char *const devices[] = {"cpu", "sim"};
    for (int i = 0; i < 2; i++) {
        char cmd[4096], *out = NULL;
        snprintf(cmd, sizeof cmd,
                 "env -u FSDP_NCCL_LIBRARY %s '%s' --config '%s/examples/mlp.ini' --set "
                 "parallel.backend=nccl --set parallel.device=%s 2>&1",
                 mpirun, FSDP_TRAIN_EXE, FSDP_SOURCE_DIR, devices[i]);
        int status = fsdp_test_shell(cmd, &out);
        printf("\n    %s: exit %d\n%s", cmd, status, out);
        CU_ASSERT_EQUAL(status, 2);
        const char *want = !fsdp_backend_available(FSDP_BACKEND_NCCL) ? "no nccl backend"
                           : !built                                   ? "no nccl-mpi backend"
                           : i == 0                                   ? "[parallel] device = cpu"
                                                                      : "needs the stand-in NCCL";
        /* once per process: both refused before any world was made */
        const char *first = strstr(out, want);
        CU_ASSERT_PTR_NOT_NULL(first);
        CU_ASSERT_PTR_NOT_NULL(first ? strstr(first + 1, want) : NULL);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "[parallel] backend = nccl"));
        free(out);
    }
}

/* The stand-in that FSDP_NCCL_LIBRARY named is the library the runs loaded, and every
 * communicator it made was destroyed with its world. */
static void check_standin_used(void) {
    const char *path = getenv("FSDP_NCCL_LIBRARY");
    void *h = path ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    CU_ASSERT_PTR_NOT_NULL(h);
    int (*live)(void) = NULL;
    void *f = h ? dlsym(h, "fsdpStandinLiveComms") : NULL;
    if (f) memcpy(&live, &f, sizeof f);
    CU_ASSERT_PTR_NOT_NULL(live);
    if (live) CU_ASSERT_EQUAL(live(), 0);
    if (h) dlclose(h);
}

/* (2, 2) on nccl: the MLP (FSDP per hidden Linear after TP) and the Llama (its TP plan, FSDP per
 * decoder layer), each against the local backend's cpu run. */
static void test_nccl_mlp_fsdp_tp(void) {
    test_mlp_fsdp_tp();
    check_standin_used();
}

static void test_nccl_llama_fsdp_tp(void) {
    test_llama_fsdp_tp();
    check_standin_used();
}

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A token file of 3000 byte ids (words of a small vocabulary drawn by an LCG), vocab 256. */
static int write_tokens(const char *path) {
    static const char *const words[] = {"the ", "cat ", "sat ", "on ", "a ",   "mat ",
                                        "and ", "dog ", "ran ", "to ", "her ", "house "};
    enum { N = 3000 };
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char hd[TRAIN_TOKENS_HEADER];
    memcpy(hd, TRAIN_TOKENS_MAGIC, 8);
    put_le(hd + 8, 1, 4);
    put_le(hd + 12, 2, 4);
    put_le(hd + 16, N, 8);
    put_le(hd + 24, 256, 8);
    fwrite(hd, 1, sizeof hd, f);
    uint32_t x = 12345;
    for (int n = 0; n < N;) {
        x = x * 1103515245u + 12345u;
        for (const char *w = words[(x >> 16) % 12]; *w && n < N; w++, n++) {
            unsigned char b[2];
            put_le(b, (unsigned char)*w, 2);
            fwrite(b, 1, 2, f);
        }
    }
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"mlp_fsdp_tp", test_mlp_fsdp_tp},
        {"mlp_full_shard", test_mlp_full_shard},
        {"llama_fsdp_tp", test_llama_fsdp_tp},
        {"llama_full_shard", test_llama_full_shard},
        {"resume_other_device", test_resume_other_device},
        {"mfu", test_mfu},
        {"refusals", test_refusals},
        {"bounded_control", test_bounded_control},
        {"nccl_refusals", test_nccl_refusals},
        {"nccl_under_mpirun", test_nccl_under_mpirun},
    };
    static const fsdp_test_case nccl_cases[] = {
        {"nccl_mlp_fsdp_tp", test_nccl_mlp_fsdp_tp},
        {"nccl_llama_fsdp_tp", test_nccl_llama_fsdp_tp},
    };
    const char *be = getenv("FSDP_TEST_BACKEND");
    g_nccl = be && strcmp(be, "nccl") == 0;
#ifdef FSDP_TEST_NCCL_STANDIN
    /* the library a user would name: no call to a test-only API selects it */
    if (g_nccl) setenv("FSDP_NCCL_LIBRARY", FSDP_TEST_NCCL_STANDIN, 1);
    if (!g_nccl) unsetenv("FSDP_NCCL_LIBRARY"); /* its refusals expect none */
#else
    if (g_nccl) {
        printf("test_train_device: no nccl backend and stand-in NCCL in this build: skipped\n");
        return FSDP_TEST_SKIPPED;
    }
#endif
    record_cuda_model(CUDA_K, CUDA_DEPTH);
    g_cuda = on_cuda();
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (g_cuda && !(visible && !*visible)) { /* (set empty: no GPU, left so) */
        /* one GPU for every rank thread, the first the process may use; before the first CUDA
         * call reads the variable */
        char first[64] = "0";
        if (visible) snprintf(first, sizeof first, "%.*s", (int)strcspn(visible, ","), visible);
        setenv("CUDA_VISIBLE_DEVICES", first, 1);
    }
    /* nccl: one per rank; cuda mode: one for all (its rehearsal's); else shared by the threads */
    g_sim_devices = g_nccl ? 4 : g_cuda ? 1 : 2;
    setenv("FSDP_SIM_DEVICES", g_nccl ? "4" : g_cuda ? "1" : "2", 1); /* before the first use */
    setenv("FSDP_SIM_MEMORY", "256M", 1);
    unsetenv("FSDP_SIM_MODE");       /* deferred */
    int mode = record_device_mode(); /* prints the device and the bound; the skip without a GPU */
    if (mode) return mode;
    if (g_cuda) {
        g_bound = record_cuda_bound();
        g_dev = rank_device(0).type == FSDP_DEVICE_CUDA ? "cuda" : "sim";
    }
    g_root = ckpt_test_tmp_root();
    if (!g_root) return 2;
    snprintf(g_tokens, sizeof g_tokens, "%s/tokens.tok", g_root);
    if (write_tokens(g_tokens) != 0) return 2;
    int rc = g_nccl ? fsdp_test_run(argc, argv, "train_device_nccl", nccl_cases,
                                    (int)(sizeof nccl_cases / sizeof nccl_cases[0]))
                    : fsdp_test_run(argc, argv, "train_device", cases,
                                    (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}

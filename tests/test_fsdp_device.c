/* test_fsdp_device.c: FSDP on device tensors, proven on the simulated GPU (sim, deferred
 * streams). Every rank thread gives its context sim:(rank % 2), moves its model there with
 * fsdp_module_to and wraps it; the run must give the CPU run's results bit for bit: the
 * parameters after every step (read inside summon_full_params), the losses, the clipping norms
 * and the comm-debug counts (calls and bytes) of every collective in every phase. Scenarios:
 * test_fsdp's (MLPStacked under each strategy, root only and nested, use_orig_params, CPU
 * offload into pinned host memory, 2 and 4 ranks), seed 001's fully_shard half
 * (test_data_parallel: SimpleMLP with SGD, SGD with momentum and Adam, per-layer units), mixed
 * precision (bf16 and f16 param_dtype, bf16 reduce_dtype), clipping, no_sync, activation
 * checkpointing, sync_module_states and summon_full_params with each option; prefetch
 * (forward, BACKWARD_PRE, limit_all_gathers) by the order of its events. Negative controls drop
 * one wait each (the collectives' wait for their inputs, the compute stream's wait for a
 * prefetched gather, the host's wait for the copies from pinned shards): the sim run then
 * differs from the CPU's. Refused: a model on another device than its rank's, a model across
 * two devices.
 * With FSDP_TEST_BACKEND=nccl (CTest's test_fsdp_device_nccl) the worlds run on the nccl backend
 * over the stand-in NCCL, each rank on its own sim device (sim:rank): bitwise still where every
 * group has 2 ranks, and in groups of 4 the float32 SGD runs' values (Adam and 16-bit runs: their
 * counts and order only) within the bound of the unordered sums (device_record.c record_nccl_bound;
 * docs/comm.md "The NCCL backend").
 * With FSDP_TEST_DEVICE=cuda (CTest's test_fsdp_device_cuda) every rank's pass runs on cuda:0,
 * the four rank threads sharing the one GPU, and the values are compared within the bound of
 * record_cuda_model (CUDA_K, CUDA_DEPTH below; Adam and 16-bit runs: their counts and order
 * only, as on nccl); the negative controls and the refusals, sim's, are skipped there. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/local_impl.h" // defines: fsdp_local_test_skip_input_wait
#include "device_record.h"   // defines: on_nccl, rank_device, record_nccl_bound
#include "dp/shard_impl.h"   // defines: fsdp_shard_test_trace, fsdp_shard_test_skip_*
#include "dp_common.h"       // defines: dp_build_model, dp_batch_block, DP_SEED
#include "harness.h"         // defines: fsdp_test_run_world, FSDP_RANK_CHECK, FSDP_TEST_OK
#include "kernels/sim/sim.h" // defines: fsdp_sim_mode_get
#include "stacked_batches.h" // defines: stacked_batch_rows, STACKED_BATCH
#ifdef FSDP_TEST_NCCL_STANDIN
#include "comm/nccl_impl.h" // defines: fsdp_nccl_library_use
#endif

#define SEED                 7
#define LAYERS               3
#define MAX_RANKS            4
#define MAX_VALUES           (1 << 16)
#define MAX_LAYERS           5
#define MAX_LOG              4096
#define MAX_STEPS            8
#define MAX_SPANS            1024 /* recorded tensors and doubles per rank */
#define LOG_COMPUTE_FORWARD  10   /* a unit's module begins its forward (a hook after FSDP's) */
#define LOG_COMPUTE_BACKWARD 11   /* ... its backward */
#define N_PHASES             (FSDP_COMM_PHASE_BACKWARD + 1)
/* The cuda bound's model (device_record.h record_cuda_model): the largest GEMM K or summed length
 * is SimpleMLP's input width DP_IN_DIM (50; MLPStacked's widths are 10 and 16, the batch 8); the
 * longest path is 3 steps of MLPStacked(5) with clipping: per step its 10 forward GEMMs, 10
 * input-gradient GEMMs, the weight gradient's, the loss's sum and the clipping norm's (23),
 * and the step (1): 3 x 24. */
#define CUDA_K     50
#define CUDA_DEPTH 72
/* Why a negative control is skipped on cuda. */
#define SIM_ONLY                                                                                   \
    "the dropped wait reads stale data every time only on sim's deferred streams; on a GPU the "   \
    "race may or may not show (the sim entry runs it)"

typedef enum model_kind { MODEL_STACKED, MODEL_SIMPLE } model_kind;
typedef enum optim_kind { OPT_SGD, OPT_SGD_MOMENTUM, OPT_ADAM } optim_kind;

typedef struct spec {
    const char *name;
    int world;
    model_kind model;
    optim_kind optim;
    fsdp_sharding_strategy strategy;
    bool nested;   /* MLPStacked: layers.1, layers.2 units; SimpleMLP: net1, net2 */
    bool orig;     /* use_orig_params */
    int replicate; /* HYBRID_SHARD: the replicate size of a (replicate, shard) mesh */
    fsdp_dtype param_dtype, reduce_dtype;
    bool clip, no_sync, checkpoint, sync_states, summons;
    int steps;
    int layers; /* MLPStacked's (0: LAYERS); nested: every layer but layers.0 is a unit */
    /* Prefetch, on the sim run only (the CPU run it must equal has none) */
    bool forward_prefetch, backward_prefetch, limit;
    bool backward_post; /* backward_prefetch is FSDP_BACKWARD_POST, not FSDP_BACKWARD_PRE */
    bool offload;       /* offload_params: pinned host shards on a device */
} spec;

/* A recorded tensor (n floats) or double (two floats' bits) at values[at]. */
typedef struct span {
    int64_t at, n;
    bool dbl;
} span;

/* What one rank saw, in order: compared with memcmp between the CPU and the sim run (on nccl
 * each span within the bound of the unordered sums). */
typedef struct rank_out {
    float *values;
    int64_t n;
    span spans[MAX_SPANS];
    int n_spans;
    int64_t calls[FSDP_COMM_OP_COUNT][N_PHASES], bytes[FSDP_COMM_OP_COUNT][N_PHASES];
    /* prefetch runs: the order of FSDP's prefetch events and the units' computations */
    int log[MAX_LOG][3]; /* event, unit, non-root units gathered */
    int n_log;
    bool log_full;
    int64_t reserved[MAX_STEPS]; /* the FSDP pool's bytes after each step */
} rank_out;

typedef struct run {
    const spec *s;
    bool on_device;
    bool prefetch; /* the spec's prefetch options apply (sim runs; a CPU run when asked) */
    rank_out out[MAX_RANKS];
} run;

/* ---- recording ---- */

static fsdp_status add_span(fsdp_ctx *ctx, rank_out *o, int64_t n, bool dbl) {
    FSDP_RANK_CHECK(ctx, o->n_spans < MAX_SPANS, "more than %d tensors recorded", MAX_SPANS);
    o->spans[o->n_spans++] = (span){o->n, n, dbl};
    return FSDP_OK;
}

/* Appends t's values (on any device) to what the rank saw; a tensor without storage (a rank
 * other than 0 under rank0_only) adds nothing. */
static fsdp_status record_values(fsdp_ctx *ctx, rank_out *o, const fsdp_tensor *t) {
    if (!fsdp_tensor_has_storage(t)) return FSDP_OK;
    int64_t n = fsdp_tensor_numel(t);
    FSDP_RANK_CHECK(ctx, o->n + n <= MAX_VALUES, "more than %d values recorded", MAX_VALUES);
    FSDP_TRY(add_span(ctx, o, n, false));
    fsdp_tensor *h;
    FSDP_TRY(fsdp_tensor_from_blob(ctx, o->values + o->n, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &h));
    fsdp_tensor *flat = NULL;
    fsdp_status st = fsdp_tensor_view(ctx, t, 0, 1, &n, &flat);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, h, flat);
    fsdp_tensor_free(flat);
    fsdp_tensor_free(h);
    o->n += n;
    return st;
}

/* A double as two floats' bits. */
static fsdp_status record_double(fsdp_ctx *ctx, rank_out *o, double v) {
    FSDP_RANK_CHECK(ctx, o->n + 2 <= MAX_VALUES, "more than %d values recorded", MAX_VALUES);
    FSDP_TRY(add_span(ctx, o, 2, true));
    memcpy(o->values + o->n, &v, sizeof v);
    o->n += 2;
    return FSDP_OK;
}

typedef struct visit_args {
    rank_out *o;
    bool grads;
} visit_args;

static fsdp_status record_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    const visit_args *a = user;
    FSDP_TRY(record_values(ctx, a->o, fsdp_param_data(p)));
    return a->grads ? record_values(ctx, a->o, fsdp_param_grad(p)) : FSDP_OK;
}

/* Every parameter (and gradient) of m inside summon_full_params with options so. */
static fsdp_status record_summoned(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_module *m, rank_out *o,
                                   const fsdp_summon_options *so) {
    FSDP_TRY(fsdp_summon_full_params(ctx, sh, so));
    visit_args a = {o, so && so->with_grads};
    fsdp_status st = fsdp_module_visit_params(ctx, m, record_param, &a);
    fsdp_status rel = fsdp_release_full_params(ctx, sh);
    return st != FSDP_OK ? st : rel;
}

/* ---- prefetch: the order of events ---- */

static void log_event(rank_out *o, int ev, int unit_index, int in_flight) {
    if (o->n_log == MAX_LOG) {
        o->log_full = true;
        return;
    }
    o->log[o->n_log][0] = ev;
    o->log[o->n_log][1] = unit_index;
    o->log[o->n_log][2] = in_flight;
    o->n_log++;
}

static void on_prefetch(void *user, int unit_index, fsdp_prefetch_event ev, int in_flight) {
    log_event(user, (int)ev, unit_index, in_flight);
}

typedef struct unit_hook {
    rank_out *o;
    int index;
} unit_hook;

static fsdp_status on_compute(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)io;
    const unit_hook *h = user;
    log_event(h->o, point == FSDP_HOOK_PRE_FORWARD ? LOG_COMPUTE_FORWARD : LOG_COMPUTE_BACKWARD,
              h->index, -1);
    return FSDP_OK;
}

/* The observer of FSDP's prefetch events and, on every unit's module, hooks that run after
 * FSDP's pre-forward and pre-backward hooks, right before the module computes. */
static fsdp_status watch(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_module *m, rank_out *o,
                         unit_hook *hooks) {
    fsdp_shard_test_trace(sh, on_prefetch, o);
    for (int u = 0; u < fsdp_sharded_num_units(sh); u++) {
        fsdp_module *um = fsdp_module_find(m, fsdp_sharded_unit_path(sh, u));
        FSDP_RANK_CHECK(ctx, um != NULL, "no module at unit %d's path", u);
        hooks[u] = (unit_hook){o, u};
        FSDP_TRY(fsdp_module_add_hook(ctx, um, FSDP_HOOK_PRE_FORWARD, on_compute, &hooks[u], NULL,
                                      NULL));
        FSDP_TRY(fsdp_module_add_hook(ctx, um, FSDP_HOOK_PRE_BACKWARD, on_compute, &hooks[u], NULL,
                                      NULL));
    }
    return FSDP_OK;
}

/* Whether event i lies between two backward computations (the last before it and the first
 * after it): a prefetch issued there came from a post-backward hook (BACKWARD_POST); one issued
 * by the root's pre-forward hook follows the last pass's backward but precedes a forward. */
static bool inside_backward(const rank_out *o, int i) {
    int before = i, after = i;
    while (--before >= 0 && o->log[before][0] < LOG_COMPUTE_FORWARD) continue;
    while (++after < o->n_log && o->log[after][0] < LOG_COMPUTE_FORWARD) continue;
    return before >= 0 && after < o->n_log && o->log[before][0] == LOG_COMPUTE_BACKWARD &&
           o->log[after][0] == LOG_COMPUTE_BACKWARD;
}

/* Whether unit u's backward computed between event i and the last forward computation before
 * it. */
static bool backward_ran_since_forward(const rank_out *o, int i, int u) {
    while (--i >= 0 && o->log[i][0] != LOG_COMPUTE_FORWARD)
        if (o->log[i][0] == LOG_COMPUTE_BACKWARD && o->log[i][1] == u) return true;
    return false;
}

/* The order a prefetch run must show (printing what is wrong): no unit computes before its
 * parameters were gathered, and a gather issued ahead (ISSUED) is waited for (WAITED) by the
 * compute stream before its unit computes; a prefetched gather is issued before the unit that
 * issued it computes (the next computation is another unit's), or, from a post-backward hook
 * (BACKWARD_POST), after the issuing unit's backward and before the prefetched unit's backward
 * has run in that pass; under limit_all_gathers no
 * prefetch leaves more than FSDP_PREFETCH_LIMIT non-root units gathered. *issued, *skipped and
 * *most (the most gathered units after a prefetch) for the caller's counts. */
static bool check_order(const spec *s, int rank, const rank_out *o, int *issued, int *skipped,
                        int *most) {
    *issued = *skipped = *most = 0;
    if (o->log_full) {
        printf("\n  %s rank %d: more than %d events\n", s->name, rank, MAX_LOG);
        return false;
    }
    bool open[MAX_LAYERS] = {false}; /* a unit's started gather not waited for yet */
    for (int i = 0; i < o->n_log; i++) {
        int ev = o->log[i][0], u = o->log[i][1];
        if (ev == FSDP_PREFETCH_SKIPPED) ++*skipped;
        if ((ev == FSDP_PREFETCH_ISSUED || ev == FSDP_PREFETCH_WAITED) &&
            open[u] == (ev == FSDP_PREFETCH_ISSUED)) {
            printf("\n  %s rank %d: unit %d's gather %s (event %d)\n", s->name, rank, u,
                   open[u] ? "started again before its wait" : "waited for without a start", i);
            return false;
        }
        if (ev == FSDP_PREFETCH_WAITED) open[u] = false;
        if (ev == FSDP_PREFETCH_ISSUED) {
            open[u] = true;
            ++*issued;
            if (o->log[i][2] > *most) *most = o->log[i][2];
            if (s->limit && o->log[i][2] > FSDP_PREFETCH_LIMIT) {
                printf("\n  %s rank %d: event %d: %d units gathered after a prefetch\n", s->name,
                       rank, i, o->log[i][2]);
                return false;
            }
            if (s->backward_post && inside_backward(o, i)) {
                if (backward_ran_since_forward(o, i, u)) {
                    printf("\n  %s rank %d: unit %d's post-backward prefetch (event %d) comes "
                           "after its own backward\n",
                           s->name, rank, u, i);
                    return false;
                }
                continue;
            }
            int k = i + 1;
            while (k < o->n_log && o->log[k][0] < LOG_COMPUTE_FORWARD) k++;
            if (k < o->n_log && o->log[k][1] == u) {
                printf("\n  %s rank %d: unit %d's prefetch (event %d) is not ahead of another "
                       "unit's computation\n",
                       s->name, rank, u, i);
                return false;
            }
        }
        if (ev < LOG_COMPUTE_FORWARD) continue;
        int g = i - 1;
        while (g >= 0 && !(o->log[g][1] == u && (o->log[g][0] == FSDP_PREFETCH_ISSUED ||
                                                 o->log[g][0] == FSDP_PREFETCH_OWN)))
            g--;
        bool waited = g >= 0 && o->log[g][0] == FSDP_PREFETCH_OWN;
        for (int k = g + 1; g >= 0 && k < i && !waited; k++)
            waited = o->log[k][0] == FSDP_PREFETCH_WAITED && o->log[k][1] == u;
        if (!waited) {
            printf("\n  %s rank %d: unit %d computes (event %d) %s\n", s->name, rank, u, i,
                   g < 0 ? "before any gather" : "before the wait for its prefetched gather");
            return false;
        }
    }
    for (int u = 0; u < MAX_LAYERS; u++)
        if (open[u]) {
            printf("\n  %s rank %d: unit %d's started gather is never waited for\n", s->name, rank,
                   u);
            return false;
        }
    return true;
}

/* How many events ev the rank saw. */
static int count_events(const rank_out *o, int ev) {
    int n = 0;
    for (int i = 0; i < o->n_log; i++) n += o->log[i][0] == ev;
    return n;
}

/* ---- the model, its data and a step ---- */

static fsdp_status build(fsdp_ctx *ctx, const spec *s, int rank, fsdp_module **m) {
    /* sync_module_states: every rank starts from its own values, rank 0's win */
    uint64_t seed = (s->model == MODEL_SIMPLE ? DP_SEED : SEED) + (s->sync_states ? rank : 0);
    if (s->model == MODEL_SIMPLE) return dp_build_model(ctx, 0, seed, m);
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, s->layers ? s->layers : LAYERS, m));
    return fsdp_module_reset_parameters(ctx, *m, seed);
}

static fsdp_status case_options(fsdp_ctx *ctx, const spec *s, fsdp_mesh **mesh,
                                fsdp_fully_shard_options *o) {
    static const char *stacked[] = {"layers.1", "layers.2", "layers.3", "layers.4"},
                      *simple[] = {"net1", "net2"};
    int n_stacked = (s->layers ? s->layers : LAYERS) - 1;
    *o = (fsdp_fully_shard_options){
        .strategy = s->strategy,
        .wrap_paths = s->nested ? (s->model == MODEL_SIMPLE ? simple : stacked) : NULL,
        .n_wrap_paths = s->nested ? (s->model == MODEL_SIMPLE ? 2 : n_stacked) : 0,
        .use_orig_params = s->orig,
        .sync_module_states = s->sync_states,
        .poison_resharded = true,
        .mixed_precision = {.param_dtype = s->param_dtype, .reduce_dtype = s->reduce_dtype}};
    *mesh = NULL;
    if (s->strategy != FSDP_HYBRID_SHARD) return FSDP_OK;
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){s->replicate, s->world / s->replicate},
                              (const char *[]){"replicate", "shard"}, mesh));
    FSDP_TRY(fsdp_mesh_get_group(ctx, *mesh, "shard", &o->group));
    return fsdp_mesh_get_group(ctx, *mesh, "replicate", &o->replicate_group);
}

static fsdp_status make_optimizer(fsdp_ctx *ctx, const spec *s, fsdp_module *flat,
                                  fsdp_optimizer **opt) {
    if (s->optim == OPT_ADAM)
        return fsdp_adam_create(ctx, flat, &(fsdp_adam_options){.lr = 0.1}, opt);
    fsdp_sgd_options o = {.lr = 0.1, .momentum = s->optim == OPT_SGD_MOMENTUM ? 0.9 : 0.0};
    return fsdp_sgd_create(ctx, flat, &o, opt);
}

/* A copy of the host tensor h on dev (the CPU: a copy too); the caller frees it. */
static fsdp_status to_device(fsdp_ctx *ctx, const fsdp_tensor *h, fsdp_device dev,
                             fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, fsdp_tensor_ndim(h), fsdp_tensor_shape(h),
                                out));
    return fsdp_tensor_copy(ctx, *out, h);
}

/* The step's input and target rows [off, off + len) on the host. */
static fsdp_status batch(fsdp_ctx *ctx, const spec *s, int step, int64_t off, int64_t len,
                         fsdp_tensor **x, fsdp_tensor **y) {
    if (s->model == MODEL_STACKED) {
        FSDP_TRY(stacked_batch_rows(ctx, 100 + 2 * (uint64_t)step, off, len, x));
        return stacked_batch_rows(ctx, 101 + 2 * (uint64_t)step, off, len, y);
    }
    FSDP_TRY(dp_batch_block(ctx, STACKED_BATCH, DP_IN_DIM, 0, off, len, 2 * (uint64_t)step, x));
    return dp_batch_block(ctx, STACKED_BATCH, DP_OUT_DIM, 0, off, len, 2 * (uint64_t)step + 1, y);
}

/* Forward and backward on rows [off, off + len): the input goes to the model's device, the
 * output comes to the host for the loss (MLPStacked: sum((out - y)^2) / batch, its gradient
 * times the data-parallel size; SimpleMLP: seed 001's (out - y).sum()), and the output
 * gradient goes back. The loss is recorded. */
static fsdp_status forward_backward(fsdp_ctx *ctx, const spec *s, fsdp_module *m, int step,
                                    int64_t off, int64_t len, fsdp_device dev, rank_out *o) {
    fsdp_tensor *xh = NULL, *yh = NULL, *x = NULL, *oh = NULL, *dyh = NULL, *dy = NULL;
    const fsdp_tensor *out;
    fsdp_status st = batch(ctx, s, step, off, len, &xh, &yh);
    if (st == FSDP_OK) st = to_device(ctx, xh, dev, &x);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, fsdp_tensor_ndim(out),
                                fsdp_tensor_shape(out), &oh);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, oh, out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, oh, &dyh);
    double loss = 0.0;
    if (st == FSDP_OK) {
        const float *ov = fsdp_tensor_f32(oh), *t = fsdp_tensor_f32(yh);
        float *d = fsdp_tensor_f32(dyh);
        for (int64_t i = 0; i < fsdp_tensor_numel(oh); i++) {
            float diff = ov[i] - t[i];
            if (s->model == MODEL_STACKED) {
                loss += (double)diff * diff / STACKED_BATCH;
                d[i] = 2.0f * diff * (float)s->world / (float)STACKED_BATCH;
            } else {
                loss += diff;
                d[i] = 1.0f;
            }
        }
        st = to_device(ctx, dyh, dev, &dy);
    }
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dy, NULL);
    if (st == FSDP_OK) st = record_double(ctx, o, loss);
    fsdp_tensor *all[] = {xh, yh, x, oh, dyh, dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fsdp_tensor_free(all[i]);
    return st;
}

/* One step: no_sync splits the rows in two, the first backward without reduction. */
/* The negative control's order (test_negative_control): after each backward, rank 0 runs its
 * device work to the end while the other ranks wait on the host, so that rank 0's collectives
 * read its peers' gradients before their backward ran (their streams run only when somebody
 * waits for them, and without the input wait nobody has). Otherwise the ranks' host waits
 * could run every backward before any collective read, and the missing wait would not show. */
static atomic_bool order_ranks;
static atomic_int rank0_done; /* steps whose device work rank 0 has finished */

static fsdp_status after_backward(fsdp_ctx *ctx, int step, int rank, fsdp_device dev) {
    if (!atomic_load(&order_ranks)) return FSDP_OK;
    if (rank == 0) {
        FSDP_TRY(fsdp_device_synchronize(ctx, dev));
        atomic_store(&rank0_done, step + 1);
        return FSDP_OK;
    }
    for (int ms = 0; atomic_load(&rank0_done) <= step; ms++) {
        FSDP_RANK_CHECK(ctx, ms < 60000, "rank 0 did not finish step %d in a minute", step);
        fsdp_test_sleep_ms(1);
    }
    return FSDP_OK;
}

static fsdp_status train_step(fsdp_ctx *ctx, const spec *s, fsdp_module *m, fsdp_sharded *sh,
                              fsdp_optimizer *opt, int step, int rank, fsdp_device dev,
                              rank_out *o) {
    int64_t off, len;
    fsdp_chunk_range(STACKED_BATCH, s->world, rank, &off, &len);
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, opt));
    if (s->no_sync) {
        int64_t half = len / 2;
        fsdp_sharded_set_sync(sh, false);
        fsdp_status st = forward_backward(ctx, s, m, step, off, half, dev, o);
        fsdp_sharded_set_sync(sh, true);
        FSDP_TRY(st);
        FSDP_TRY(forward_backward(ctx, s, m, step, off + half, len - half, dev, o));
    } else {
        FSDP_TRY(forward_backward(ctx, s, m, step, off, len, dev, o));
    }
    FSDP_TRY(after_backward(ctx, step, rank, dev));
    if (s->clip) {
        double norm;
        FSDP_TRY(fsdp_sharded_clip_grad_norm(ctx, sh, 0.05, 2.0, &norm));
        FSDP_TRY(record_double(ctx, o, norm));
    }
    FSDP_TRY(fsdp_optimizer_step(ctx, opt));
    return record_summoned(ctx, sh, m, o, NULL);
}

/* summon_full_params with each option: with_grads, offload_to_cpu, rank0_only, and writeback
 * of values written inside (each rank's own part reaches its shard). */
static fsdp_status summon_options(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_module *m, int rank,
                                  rank_out *o) {
    FSDP_TRY(record_summoned(ctx, sh, m, o,
                             &(fsdp_summon_options){.with_grads = true, .writeback = true}));
    FSDP_TRY(record_summoned(ctx, sh, m, o, &(fsdp_summon_options){.offload_to_cpu = true}));
    FSDP_TRY(record_summoned(ctx, sh, m, o, &(fsdp_summon_options){.rank0_only = true}));
    FSDP_TRY(fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.writeback = true}));
    fsdp_status st = FSDP_OK;
    for (int i = 0; st == FSDP_OK && i < fsdp_sharded_num_segments(sh); i++) {
        fsdp_flat_segment seg;
        st = fsdp_sharded_segment(ctx, sh, i, &seg);
        if (st == FSDP_OK)
            st = fsdp_tensor_fill(ctx, fsdp_param_data(seg.param), 0.25f * (float)(rank + i));
    }
    fsdp_status rel = fsdp_release_full_params(ctx, sh);
    FSDP_TRY(st != FSDP_OK ? st : rel);
    return record_summoned(ctx, sh, m, o, NULL);
}

static fsdp_status rank_fn(fsdp_ctx *ctx, int rank, void *user) {
    run *r = user;
    const spec *s = r->s;
    rank_out *o = &r->out[rank];
    fsdp_device dev = r->on_device ? rank_device(rank) : FSDP_CPU;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_fully_shard_options fo;
    unit_hook hooks[MAX_LAYERS];
    bool prefetch = r->prefetch && (s->forward_prefetch || s->backward_prefetch);
    fsdp_status st = r->on_device ? fsdp_ctx_set_device(ctx, dev) : FSDP_OK;
    if (st == FSDP_OK) st = case_options(ctx, s, &mesh, &fo);
    fo.offload_params = s->offload;
    if (r->prefetch) {
        fo.forward_prefetch = s->forward_prefetch;
        fo.backward_prefetch = !s->backward_prefetch ? FSDP_BACKWARD_PREFETCH_NONE
                               : s->backward_post    ? FSDP_BACKWARD_POST
                                                     : FSDP_BACKWARD_PRE;
        fo.limit_all_gathers = s->limit;
    }
    if (st == FSDP_OK) st = build(ctx, s, rank, &m);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, m, dev);
    if (st == FSDP_OK && s->checkpoint)
        st = fsdp_checkpoint_wrap(
            ctx, fsdp_module_find(m, s->model == MODEL_SIMPLE ? "net1" : "layers.1"));
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &fo, &sh);
    /* the shards and their gradients live where the model was moved (offload: on the host) */
    fsdp_device home = s->offload ? FSDP_CPU : dev;
    for (int u = 0; st == FSDP_OK && u < fsdp_sharded_num_units(sh); u++) {
        fsdp_param *flat = fsdp_sharded_unit_flat_param(sh, u);
        fsdp_device at = fsdp_tensor_device(fsdp_param_data(flat)),
                    gat = fsdp_tensor_device(fsdp_param_grad(flat));
        FSDP_RANK_CHECK(ctx,
                        at.type == home.type && at.index == home.index && gat.type == home.type &&
                            gat.index == home.index,
                        "unit %d's shard is on %s:%d, its gradient on %s:%d, want %s:%d", u,
                        fsdp_device_to_string(at), at.index, fsdp_device_to_string(gat), gat.index,
                        fsdp_device_to_string(home), home.index);
    }
    if (st == FSDP_OK && prefetch) st = watch(ctx, sh, m, o, hooks);
    if (st == FSDP_OK) st = make_optimizer(ctx, s, fsdp_sharded_flat_params(sh), &opt);
    for (int step = 0; st == FSDP_OK && step < s->steps; step++) {
        st = train_step(ctx, s, m, sh, opt, step, rank, dev, o);
        fsdp_memory_stats ms;
        fsdp_sharded_memory(sh, &ms);
        if (step < MAX_STEPS) o->reserved[step] = ms.reserved_bytes;
    }
    if (st == FSDP_OK && s->summons) st = summon_options(ctx, sh, m, rank, o);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    for (int op = 0; st == FSDP_OK && op < FSDP_COMM_OP_COUNT; op++)
        for (int ph = 0; ph < N_PHASES; ph++) {
            fsdp_comm_filter f = {.op = (fsdp_comm_op)op, .phase = (fsdp_comm_phase)ph};
            o->calls[op][ph] = fsdp_comm_debug_query(ctx, &f).calls;
            o->bytes[op][ph] = fsdp_comm_debug_query(ctx, &f).bytes;
        }
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

/* ---- comparing a sim run with the CPU run ---- */

static void run_init(run *r, const spec *s, bool on_device) {
    memset(r, 0, sizeof *r);
    r->s = s;
    r->on_device = r->prefetch = on_device;
    for (int i = 0; i < s->world; i++) {
        r->out[i].values = calloc(MAX_VALUES, sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(r->out[i].values);
    }
}

static void run_free(run *r) {
    for (int i = 0; i < MAX_RANKS; i++) free(r->out[i].values);
}

/* The reductions a recorded value passes through per step, each over the data-parallel group
 * in an order of NCCL's on nccl: the gradient's reduce_scatter or all_reduce, HYBRID_SHARD's
 * all_reduce over the replicas after it, and clipping's all_reduce of the squared norms (which
 * scales every gradient). The forward has none (FSDP only gathers). */
#define SUMS_PER_STEP 3

/* The tolerance of a run of spec s against the CPU's: bit for bit on the local backend and in
 * groups of 2; on nccl the bound of its unordered sums over s->steps steps; on cuda the suite's
 * bound (device_record.c). */
static double spec_tol(const spec *s) {
    return record_nccl_bound(s->world, SUMS_PER_STEP * (s->steps > 0 ? s->steps : 1)) +
           record_cuda_bound();
}

/* Whether spec s on nccl is beyond that bound: Adam (its division by sqrt(v) turns a rounding
 * difference into a move of up to lr) or 16-bit parameters or reductions (a reordered sum
 * rounds at bf16's or f16's u), on more than 2 ranks; on cuda at any size. Such a run's values are
 * not compared (at 2 ranks they are, bit for bit); its comm-debug counts, its record's layout and,
 * with prefetch, its order still are. */
static bool nccl_unbounded(const spec *s) {
    return spec_tol(s) > 0 && (s->optim == OPT_ADAM || s->param_dtype || s->reduce_dtype);
}

/* The first value of span sp where y leaves x by more than tol times the span's largest
 * magnitude in x, or -1; *worst raised to the largest such ratio seen. */
static int64_t span_differs(const float *x, const float *y, const span *sp, double tol,
                            double *worst) {
    double scale = 0.0;
    if (sp->dbl) {
        double a, b;
        memcpy(&a, x + sp->at, sizeof a), memcpy(&b, y + sp->at, sizeof b);
        if (memcmp(&a, &b, sizeof a) == 0) return -1;
        double d = fabs(a - b) / fabs(a);
        if (d == d && d > *worst) *worst = d;
        return d <= tol ? -1 : 0;
    }
    for (int64_t k = 0; k < sp->n; k++)
        if (fabsf(x[sp->at + k]) > scale) scale = fabsf(x[sp->at + k]);
    for (int64_t k = 0; k < sp->n; k++) {
        float a = x[sp->at + k], b = y[sp->at + k];
        if (memcmp(&a, &b, sizeof a) == 0) continue;
        double d = fabs((double)a - b);
        if (d == d && scale > 0 && d / scale > *worst) *worst = d / scale;
        if (!(d <= tol * scale)) return k;
    }
    return -1;
}

/* Whether every rank of the two runs saw the same bits (on nccl: the same within spec_tol);
 * prints the first difference. */
static bool same_runs(const run *a, const run *b, bool quiet) {
    const double tol = spec_tol(a->s);
    const bool values = !nccl_unbounded(a->s);
    double worst = 0.0;
    for (int i = 0; i < a->s->world; i++) {
        const rank_out *x = &a->out[i], *y = &b->out[i];
        if (x->n != y->n || x->n_spans != y->n_spans) {
            if (!quiet)
                printf("\n  %s rank %d: %lld values vs %lld\n", a->s->name, i, (long long)x->n,
                       (long long)y->n);
            return false;
        }
        for (int k = 0; values && tol > 0 && k < x->n_spans; k++) {
            const span *sp = &x->spans[k];
            int64_t at = span_differs(x->values, y->values, sp, tol, &worst);
            if (at >= 0) {
                if (!quiet)
                    printf("\n  %s rank %d: value %lld of recorded tensor %d differs beyond the "
                           "bound %.3g of its largest magnitude: cpu %.9g, sim %.9g\n",
                           a->s->name, i, (long long)at, k, tol, (double)x->values[sp->at + at],
                           (double)y->values[sp->at + at]);
                return false;
            }
        }
        for (int64_t k = 0; values && tol == 0 && k < x->n; k++)
            if (memcmp(&x->values[k], &y->values[k], sizeof(float)) != 0) {
                if (!quiet)
                    printf("\n  %s rank %d: value %lld of %lld differs: cpu %.9g, sim %.9g\n",
                           a->s->name, i, (long long)k, (long long)x->n, (double)x->values[k],
                           (double)y->values[k]);
                return false;
            }
        if (memcmp(x->calls, y->calls, sizeof x->calls) ||
            memcmp(x->bytes, y->bytes, sizeof x->bytes)) {
            if (!quiet) printf("\n  %s rank %d: comm-debug counts differ\n", a->s->name, i);
            return false;
        }
    }
    const char *mode = on_nccl() ? "nccl" : "cuda";
    if (bounded() && !quiet && tol > 0 && values)
        printf("\n    %s, %s, %d ranks: largest difference %.3g of a tensor's largest "
               "magnitude (bound %.3g)",
               mode, a->s->name, a->s->world, worst, tol);
    if (bounded() && !quiet && !values)
        printf("\n    %s, %s, %d ranks: Adam or 16 bits, values not compared (counts are)", mode,
               a->s->name, a->s->world);
    return true;
}

static int64_t total_calls(const run *r) {
    int64_t n = 0;
    for (int op = 1; op < FSDP_COMM_BARRIER; op++)
        for (int ph = 1; ph < N_PHASES; ph++) n += r->out[0].calls[op][ph];
    return n;
}

/* The scenario on the CPU and on sim: bitwise the same. */
static void check_spec(const spec *s) {
    run cpu, dev;
    run_init(&cpu, s, false);
    run_init(&dev, s, true);
    FSDP_TEST_OK(fsdp_test_run_world(s->world, 60000, rank_fn, &cpu));
    FSDP_TEST_OK(fsdp_test_run_world(s->world, 60000, rank_fn, &dev));
    bool same = same_runs(&cpu, &dev, false);
    if (!same)
        printf("  (scenario %s on %d ranks: %s, param %s, reduce %s%s)\n", s->name, s->world,
               fsdp_sharding_strategy_to_string(s->strategy), fsdp_dtype_to_string(s->param_dtype),
               fsdp_dtype_to_string(s->reduce_dtype), s->offload ? ", offload" : "");
    CU_ASSERT_TRUE(same);
    CU_ASSERT_TRUE(cpu.out[0].n > 0 && total_calls(&cpu) > 0); /* it did train and communicate */
    run_free(&cpu);
    run_free(&dev);
}

/* ---- the scenarios ---- */

static void strategies(bool nested) {
    static const fsdp_sharding_strategy all[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD,
                                                 FSDP_HYBRID_SHARD};
    for (int w = 2; w <= 4; w += 2)
        for (int k = 0; k < 4; k++)
            for (int orig = 0; orig < 2; orig++)
                for (int offload = 0; offload < 2; offload++) {
                    spec s = {.name = fsdp_sharding_strategy_to_string(all[k]),
                              .world = w,
                              .strategy = all[k],
                              .nested = nested,
                              .orig = orig,
                              .replicate = 2,
                              .steps = 3,
                              .offload = offload};
                    check_spec(&s);
                }
}

static void test_strategies_root(void) {
    strategies(false);
}

static void test_strategies_nested(void) {
    strategies(true);
}

/* Seed 001's fully_shard scenarios (test_data_parallel): SimpleMLP, SGD {lr 0.1}, {+ momentum
 * 0.9} with per-layer units, fused Adam {lr 0.1}, with and without use_orig_params. */
static void test_seed_001(void) {
    static const spec base[] = {
        {.name = "seed 001 sgd", .optim = OPT_SGD},
        {.name = "seed 001 sgd momentum per-layer", .optim = OPT_SGD_MOMENTUM, .nested = true},
        {.name = "seed 001 adam", .optim = OPT_ADAM},
    };
    for (int w = 2; w <= 4; w += 2)
        for (int k = 0; k < 3; k++)
            for (int orig = 0; orig < 2; orig++) {
                spec s = base[k];
                s.world = w;
                s.model = MODEL_SIMPLE;
                s.strategy = FSDP_FULL_SHARD;
                s.orig = orig;
                s.steps = 3;
                check_spec(&s);
            }
}

/* param_dtype bf16 and f16 (gathered in 16 bits, f32 master shards), reduce_dtype bf16. */
static void test_mixed_precision(void) {
    static const struct {
        fsdp_dtype param, reduce;
        fsdp_sharding_strategy strategy;
    } mp[] = {{FSDP_DTYPE_BF16, FSDP_DTYPE_F32, FSDP_FULL_SHARD},
              {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16, FSDP_FULL_SHARD},
              {FSDP_DTYPE_F16, FSDP_DTYPE_F32, FSDP_SHARD_GRAD_OP},
              {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16, FSDP_NO_SHARD}};
    for (int w = 2; w <= 4; w += 2)
        for (size_t k = 0; k < sizeof mp / sizeof *mp; k++)
            for (int offload = 0; offload < 2; offload++) {
                spec s = {.name = "mixed precision",
                          .world = w,
                          .strategy = mp[k].strategy,
                          .nested = true,
                          .param_dtype = mp[k].param,
                          .reduce_dtype = mp[k].reduce,
                          .steps = 3,
                          .offload = offload};
                check_spec(&s);
            }
}

/* Clipping by the global norm, no_sync accumulation, activation checkpointing of a nested
 * unit, sync_module_states from different starts, and summon_full_params with each option. */
static void test_clip_no_sync_checkpoint_summon(void) {
    static const fsdp_sharding_strategy all[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    for (int w = 2; w <= 4; w += 2)
        for (int k = 0; k < 3; k++)
            for (int orig = 0; orig < 2; orig++) {
                spec s = {.name = orig ? "clip, no_sync, checkpoint, sync_module_states, summon, "
                                         "offload"
                                       : "clip, no_sync, checkpoint, sync_module_states, summon",
                          .offload = orig,
                          .world = w,
                          .strategy = all[k],
                          .nested = true,
                          .orig = orig,
                          .clip = true,
                          .no_sync = true,
                          .checkpoint = true,
                          .sync_states = true,
                          .summons = true,
                          .steps = 2};
                check_spec(&s);
            }
}

/* Without the collectives' wait for their inputs the sim run reads stale device memory (the
 * reduce_scatter reads the full gradient before backward wrote it), every time in deferred
 * mode: the results differ from the CPU's. */
static void test_negative_control(void) {
    if (on_cuda()) {
        fsdp_test_skip("%s", SIM_ONLY);
        return;
    }
    if (on_nccl()) {
        fsdp_test_skip("the dropped wait is the local backend's; the nccl backend has its own "
                       "negative control in test_comm_nccl");
        return;
    }
#ifdef UNDER_TSAN
    fsdp_test_skip("the dropped wait is a data race, which ThreadSanitizer reports (as it must)");
    return;
#endif
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_mode_get(), FSDP_SIM_DEFERRED);
    spec s = {.name = "negative control",
              .world = 2,
              .strategy = FSDP_FULL_SHARD,
              .nested = true,
              .steps = 2};
    run cpu, with, without;
    run_init(&cpu, &s, false);
    run_init(&with, &s, true);
    run_init(&without, &s, true);
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, rank_fn, &cpu));
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, rank_fn, &with));
    fsdp_local_test_skip_input_wait(true);
    atomic_store(&order_ranks, true);
    atomic_store(&rank0_done, 0);
    fsdp_status st = fsdp_test_run_world(2, 60000, rank_fn, &without);
    atomic_store(&order_ranks, false);
    fsdp_local_test_skip_input_wait(false);
    FSDP_TEST_OK(st);
    CU_ASSERT_TRUE(same_runs(&cpu, &with, false));
    CU_ASSERT_FALSE(same_runs(&cpu, &without, true));
    run_free(&cpu);
    run_free(&with);
    run_free(&without);
}

/* ---- refusals ---- */

static fsdp_status refuse_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_device sim = {FSDP_DEVICE_SIM, rank % 2};
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    FSDP_TRY(fsdp_model_mlp_stacked(ctx, LAYERS, &m));
    fsdp_status st = fsdp_module_to(ctx, m, sim);
    /* the rank's context still on the CPU */
    fsdp_status got = st == FSDP_OK ? fsdp_fully_shard(ctx, m, NULL, &sh) : st;
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(
            ctx, got == FSDP_ERR_DEVICE && strstr(fsdp_last_error(ctx), "fsdp_ctx_set_device"),
            "model on sim, context on the CPU: %s", fsdp_last_error(ctx));
    /* the rank's context on the other sim device */
    fsdp_device other = {FSDP_DEVICE_SIM, (rank + 1) % 2};
    if (st == FSDP_OK) st = fsdp_ctx_set_device(ctx, other);
    got = st == FSDP_OK ? fsdp_fully_shard(ctx, m, NULL, &sh) : st;
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx,
                        got == FSDP_ERR_DEVICE &&
                            strstr(fsdp_last_error(ctx), "this rank's device is sim:"),
                        "model on one sim device, context on the other: %s", fsdp_last_error(ctx));
    if (st == FSDP_OK) st = fsdp_ctx_set_device(ctx, sim);
    /* one layer back on the CPU: the model is across two devices */
    if (st == FSDP_OK) st = fsdp_module_to(ctx, fsdp_module_find(m, "layers.2"), FSDP_CPU);
    got = st == FSDP_OK ? fsdp_fully_shard(ctx, m, NULL, &sh) : st;
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx,
                        got == FSDP_ERR_DEVICE && strstr(fsdp_last_error(ctx), "layers.2.") &&
                            strstr(fsdp_last_error(ctx), "fsdp_module_to"),
                        "model across sim and the CPU: %s", fsdp_last_error(ctx));
    if (st == FSDP_OK) FSDP_RANK_CHECK(ctx, sh == NULL, "a refused wrap handed out a state");
    fsdp_module_free(m);
    return st;
}

/* ---- prefetch ---- */

/* A prefetch scenario on sim against the CPU run without prefetch, bitwise, and its order;
 * returns (through the pointers) rank 0's counts of issued and skipped prefetches and the most
 * units gathered after one. Every prefetched gather is a started collective: in f32 its work is
 * still in flight when the prefetching hook returns (the device's all_gather is queued on the
 * communication stream, and the compute stream's wait completes it); a mixed-precision one
 * completes on the unshard stream at once, where its widening runs. */
static void check_prefetch(const spec *s, int *issued, int *skipped, int *most) {
    run cpu, dev;
    run_init(&cpu, s, false);
    run_init(&dev, s, true);
    FSDP_TEST_OK(fsdp_test_run_world(s->world, 60000, rank_fn, &cpu));
    FSDP_TEST_OK(fsdp_test_run_world(s->world, 60000, rank_fn, &dev));
    bool same = same_runs(&cpu, &dev, false);
    if (!same)
        printf("  (scenario %s on %d ranks: %s, param %s, reduce %s%s)\n", s->name, s->world,
               fsdp_sharding_strategy_to_string(s->strategy), fsdp_dtype_to_string(s->param_dtype),
               fsdp_dtype_to_string(s->reduce_dtype), s->offload ? ", offload" : "");
    CU_ASSERT_TRUE(same);
    for (int r = 0; r < s->world; r++) {
        int i, k, m;
        CU_ASSERT_TRUE(check_order(s, r, &dev.out[r], &i, &k, &m));
        if (r == 0) *issued = i, *skipped = k, *most = m;
        int in_flight = count_events(&dev.out[r], FSDP_GATHER_IN_FLIGHT);
        if (in_flight != (s->param_dtype ? 0 : i))
            printf("\n  %s rank %d: %d of %d prefetched gathers in flight after their start\n",
                   s->name, r, in_flight, i);
        CU_ASSERT_EQUAL(in_flight, s->param_dtype ? 0 : i);
    }
    run_free(&cpu);
    run_free(&dev);
}

/* MLPStacked(5), every layer but the first a unit (5 units with the root), FULL_SHARD, forward
 * and backward prefetch: from the second step on (the first records the order) every unit but
 * the last in each direction prefetches the next: 4 per direction and step. Also with
 * limit_all_gathers (never reached: a unit frees before the next but one is gathered), mixed
 * precision, use_orig_params with clipping and no_sync, at 2 and 4 ranks. */
static void test_prefetch_order(void) {
    for (int w = 2; w <= 4; w += 2)
        for (int k = 0; k < 4; k++) {
            spec s = {.name = "prefetch FULL_SHARD",
                      .world = w,
                      .strategy = FSDP_FULL_SHARD,
                      .nested = true,
                      .layers = 5,
                      .steps = 3,
                      .forward_prefetch = true,
                      .backward_prefetch = true,
                      .limit = k == 1};
            if (k == 2) s.param_dtype = s.reduce_dtype = FSDP_DTYPE_BF16;
            if (k == 3) s.orig = s.clip = s.no_sync = true;
            int issued, skipped, most;
            check_prefetch(&s, &issued, &skipped, &most);
            /* the first forward-backward pass records the order; no_sync makes two per step */
            int passes = s.steps * (s.no_sync ? 2 : 1);
            int want = 2 * (passes - 1) * 4;
            CU_ASSERT_EQUAL(issued, want);
            CU_ASSERT_EQUAL(skipped, 0);
            CU_ASSERT_TRUE(most <= FSDP_PREFETCH_LIMIT);
        }
    /* one direction at a time */
    for (int dir = 0; dir < 2; dir++) {
        spec s = {.name = dir ? "prefetch backward only" : "prefetch forward only",
                  .world = 4,
                  .strategy = FSDP_FULL_SHARD,
                  .nested = true,
                  .layers = 5,
                  .steps = 3,
                  .forward_prefetch = !dir,
                  .backward_prefetch = dir};
        int issued, skipped, most;
        check_prefetch(&s, &issued, &skipped, &most);
        CU_ASSERT_EQUAL(issued, (s.steps - 1) * 4);
    }
}

/* BACKWARD_POST: a unit's post-backward hook gathers the first unit in backward order whose
 * backward has not started, after its own gradients were reduced: layers.4 -> layers.3 -> 2 ->
 * 1, and nothing after the root's (the end of backward) nor in the first pass (which records
 * the order): 3 per pass from the second on; with forward prefetch too, 4 + 3. Bitwise the CPU
 * run's, with no_sync (its post-backward hook keeps the gradients and still prefetches) and
 * use_orig_params with clipping, and under mixed precision. */
static void test_prefetch_backward_post(void) {
    for (int k = 0; k < 3; k++) {
        spec s = {.name = "prefetch BACKWARD_POST",
                  .world = k == 1 ? 4 : 2,
                  .strategy = FSDP_FULL_SHARD,
                  .nested = true,
                  .layers = 5,
                  .steps = 3,
                  .forward_prefetch = k == 1,
                  .backward_prefetch = true,
                  .backward_post = true};
        if (k == 1) s.param_dtype = s.reduce_dtype = FSDP_DTYPE_BF16;
        if (k == 2) s.orig = s.clip = s.no_sync = true;
        int issued, skipped, most;
        check_prefetch(&s, &issued, &skipped, &most);
        int passes = s.steps * (s.no_sync ? 2 : 1);
        CU_ASSERT_EQUAL(issued, (passes - 1) * (s.forward_prefetch ? 4 + 3 : 3));
        CU_ASSERT_EQUAL(skipped, 0);
    }
}

/* The order the post-backward stream must show in a run of `passes` backward passes of n_units
 * units (printing what is wrong): every unit's reduction issued in each pass, each non-root
 * one before another unit's backward computes and with no join of the compute stream before
 * that, and one join per pass, after the root's reduction (the root is unit 0). */
static bool check_reduce_order(const spec *s, int rank, const rank_out *o, int passes,
                               int n_units) {
    int issued = 0, joined = 0, last = -1;
    bool awaiting = false; /* a non-root reduction not yet followed by a backward computation */
    for (int i = 0; i < o->n_log; i++) {
        int ev = o->log[i][0], u = o->log[i][1];
        if (ev == FSDP_REDUCE_ISSUED) {
            issued++;
            last = u;
            awaiting = u != 0;
        } else if (ev == FSDP_REDUCE_JOINED) {
            joined++;
            if (awaiting || last != 0) {
                printf("\n  %s rank %d: event %d joins the post-backward stream after unit %d's "
                       "reduction, %s\n",
                       s->name, rank, i, last,
                       awaiting ? "before the next unit's backward" : "not the root's");
                return false;
            }
        } else if (ev == LOG_COMPUTE_BACKWARD && awaiting) {
            if (u == last) {
                printf("\n  %s rank %d: unit %d computes again after its reduction\n", s->name,
                       rank, u);
                return false;
            }
            awaiting = false;
        }
    }
    if (issued != passes * n_units || joined != passes) {
        printf("\n  %s rank %d: %d reductions and %d joins, want %d and %d\n", s->name, rank,
               issued, joined, passes * n_units, passes);
        return false;
    }
    return true;
}

/* The gradient reductions on the post-backward stream (fsdp.md, "On a device"): on sim, in
 * deferred mode, bitwise the CPU run; in every pass each unit's reduction is issued before the
 * next unit's backward computes and the compute stream joins the post-backward stream once,
 * after the root's, so the reductions run under the rest of backward; the pool holds the same
 * bytes after the second and the third step (its cross-stream rule allocates a block once
 * instead of waiting for a reduction in flight, and does not grow). FULL_SHARD (the fused
 * reduce_scatter), HYBRID_SHARD (reduce_scatter then the replicas' all_reduce) and bf16 mixed
 * precision (reduce_dtype bf16: rounded, reduced, widened), with BACKWARD_PRE prefetch. The
 * negative control: without the join the optimizer steps before the reductions ran and the
 * results differ. */
static void test_reduce_overlap(void) {
    for (int k = 0; k < 3; k++) {
        spec s = {.name = "post-backward stream",
                  .world = k == 1 ? 4 : 2,
                  .strategy = k == 1 ? FSDP_HYBRID_SHARD : FSDP_FULL_SHARD,
                  .replicate = 2,
                  .nested = true,
                  .layers = 5,
                  .steps = 3,
                  .backward_prefetch = true};
        if (k == 2) s.param_dtype = s.reduce_dtype = FSDP_DTYPE_BF16;
        run cpu, dev;
        run_init(&cpu, &s, false);
        run_init(&dev, &s, true);
        FSDP_TEST_OK(fsdp_test_run_world(s.world, 60000, rank_fn, &cpu));
        FSDP_TEST_OK(fsdp_test_run_world(s.world, 60000, rank_fn, &dev));
        CU_ASSERT_TRUE(same_runs(&cpu, &dev, false));
        for (int r = 0; r < s.world; r++) {
            CU_ASSERT_TRUE(check_reduce_order(&s, r, &dev.out[r], s.steps, 5));
            CU_ASSERT_EQUAL(dev.out[r].reserved[1], dev.out[r].reserved[2]);
        }
        run_free(&cpu);
        run_free(&dev);
    }
}

static void test_reduce_negative_control(void) {
    if (on_cuda()) {
        fsdp_test_skip("%s", SIM_ONLY);
        return;
    }
    if (on_nccl()) {
        fsdp_test_skip("on nccl a blocking collective's host waits for its end, so the "
                       "reductions have run when the optimizer steps and the dropped join "
                       "cannot show");
        return;
    }
#ifdef UNDER_TSAN
    fsdp_test_skip("the dropped join is a data race, which ThreadSanitizer reports (as it must)");
    return;
#endif
    spec s = {.name = "post-backward negative control",
              .world = 2,
              .strategy = FSDP_FULL_SHARD,
              .nested = true,
              .layers = 5,
              .steps = 3};
    run cpu, without;
    run_init(&cpu, &s, false);
    run_init(&without, &s, true);
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, rank_fn, &cpu));
    fsdp_shard_test_skip_reduce_join(true);
    fsdp_status st = fsdp_test_run_world(2, 60000, rank_fn, &without);
    fsdp_shard_test_skip_reduce_join(false);
    FSDP_TEST_OK(st);
    CU_ASSERT_FALSE(same_runs(&cpu, &without, true));
    run_free(&cpu);
    run_free(&without);
}

/* SHARD_GRAD_OP keeps every unit gathered from forward to backward, so forward prefetch alone
 * gathers all 4 non-root units ahead; limit_all_gathers stops prefetching at 2 (the rest gather
 * in their own hooks), bitwise the same results. */
static void test_prefetch_limit(void) {
    for (int limit = 0; limit < 2; limit++) {
        spec s = {.name = limit ? "prefetch limit SHARD_GRAD_OP" : "prefetch SHARD_GRAD_OP",
                  .world = 2,
                  .strategy = FSDP_SHARD_GRAD_OP,
                  .nested = true,
                  .layers = 5,
                  .steps = 3,
                  .forward_prefetch = true,
                  .limit = limit};
        int issued, skipped, most;
        check_prefetch(&s, &issued, &skipped, &most);
        if (limit) {
            CU_ASSERT_TRUE(skipped > 0);
            CU_ASSERT_TRUE(most <= FSDP_PREFETCH_LIMIT);
        } else {
            CU_ASSERT_EQUAL(skipped, 0);
            CU_ASSERT_EQUAL(most, 4);
        }
    }
}

/* On the CPU prefetch only reorders the collectives: with and without it (also under CPU
 * offload, whose gathers copy each shard to the compute device first), bitwise the same
 * results and comm-debug counts, and the same order rules on the host path: unit k+1's gather
 * started on its work before unit k computes, that work waited for (fsdp_comm_work_wait) before
 * unit k+1 computes, every started gather waited for exactly once, and never more than
 * FSDP_PREFETCH_LIMIT units gathered. On rank threads a start on host tensors completes at
 * once, so no gather is in flight after its start (under MPI's non-blocking all_gather one would
 * be, and the same order rules hold). */
static void test_prefetch_cpu(void) {
    for (int offload = 0; offload < 2; offload++) {
        spec s = {.name = offload ? "prefetch on the CPU, offload" : "prefetch on the CPU",
                  .world = 4,
                  .strategy = FSDP_FULL_SHARD,
                  .nested = true,
                  .layers = 5,
                  .steps = 3,
                  .forward_prefetch = true,
                  .backward_prefetch = true,
                  .limit = true,
                  .offload = offload};
        run plain, ahead;
        run_init(&plain, &s, false);
        run_init(&ahead, &s, false);
        ahead.prefetch = true;
        FSDP_TEST_OK(fsdp_test_run_world(s.world, 60000, rank_fn, &plain));
        FSDP_TEST_OK(fsdp_test_run_world(s.world, 60000, rank_fn, &ahead));
        CU_ASSERT_TRUE(same_runs(&plain, &ahead, false));
        for (int r = 0; r < s.world; r++) {
            int issued, skipped, most;
            CU_ASSERT_TRUE(check_order(&s, r, &ahead.out[r], &issued, &skipped, &most));
            CU_ASSERT_EQUAL(issued, 2 * (s.steps - 1) * 4);
            CU_ASSERT_EQUAL(count_events(&ahead.out[r], FSDP_PREFETCH_WAITED), issued);
            CU_ASSERT_EQUAL(count_events(&ahead.out[r], FSDP_GATHER_IN_FLIGHT), 0);
            CU_ASSERT_TRUE(most <= FSDP_PREFETCH_LIMIT);
        }
        run_free(&plain);
        run_free(&ahead);
    }
}

/* Without the compute stream's wait for a prefetched gather, a unit computes with its block
 * before the gather into it ran (deferred mode): the results differ from the CPU's. */
static void test_prefetch_negative_control(void) {
    if (on_cuda()) {
        fsdp_test_skip("%s", SIM_ONLY);
        return;
    }
    if (on_nccl()) {
        fsdp_test_skip("on nccl a blocking collective's host waits for its end, so the gather has "
                       "run when the unit computes and the dropped stream wait cannot show");
        return;
    }
#ifdef UNDER_TSAN
    fsdp_test_skip("the dropped wait is a data race, which ThreadSanitizer reports (as it must)");
    return;
#endif
    spec s = {.name = "prefetch negative control",
              .world = 2,
              .strategy = FSDP_FULL_SHARD,
              .nested = true,
              .layers = 5,
              .steps = 3,
              .forward_prefetch = true,
              .backward_prefetch = true};
    run cpu, without;
    run_init(&cpu, &s, false);
    run_init(&without, &s, true);
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, rank_fn, &cpu));
    fsdp_shard_test_skip_prefetch_wait(true);
    fsdp_status st = fsdp_test_run_world(2, 60000, rank_fn, &without);
    fsdp_shard_test_skip_prefetch_wait(false);
    FSDP_TEST_OK(st);
    CU_ASSERT_FALSE(same_runs(&cpu, &without, true));
    run_free(&cpu);
    run_free(&without);
}

/* Offload on a device: a forward whose output nobody reads yet, then every shard written on
 * the host (as a checkpoint load between steps writes it), then the output read: it must be the
 * forward of the old values. FSDP's host wait at the end of the root's forward is what keeps
 * the copies from the pinned shards ahead of the write; without it (the negative control) the
 * deferred copies read the new values and the output differs from the CPU's. */
static fsdp_status offload_write_rank(fsdp_ctx *ctx, int rank, void *user) {
    run *r = user;
    rank_out *o = &r->out[rank];
    fsdp_device dev = r->on_device ? rank_device(rank) : FSDP_CPU;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_tensor *xh = NULL, *yh = NULL, *x = NULL;
    fsdp_fully_shard_options fo;
    fsdp_status st = r->on_device ? fsdp_ctx_set_device(ctx, dev) : FSDP_OK;
    if (st == FSDP_OK) st = case_options(ctx, r->s, &mesh, &fo);
    fo.offload_params = true;
    if (st == FSDP_OK) st = build(ctx, r->s, rank, &m);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, m, dev);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &fo, &sh);
    if (st == FSDP_OK) st = batch(ctx, r->s, 0, 0, STACKED_BATCH, &xh, &yh);
    if (st == FSDP_OK) st = to_device(ctx, xh, dev, &x);
    const fsdp_tensor *out = NULL;
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    /* every rank's forward has been issued before any rank writes (the rule for writing the
     * shards: between steps) */
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    for (int u = 0; st == FSDP_OK && u < fsdp_sharded_num_units(sh); u++)
        st = fsdp_tensor_fill(ctx, fsdp_param_data(fsdp_sharded_unit_flat_param(sh, u)), 0.5f);
    if (st == FSDP_OK) st = record_values(ctx, o, out);
    fsdp_tensor_free(xh), fsdp_tensor_free(yh), fsdp_tensor_free(x);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_offload_write_after_forward(void) {
#ifdef UNDER_TSAN
    bool control = false; /* the dropped wait is a data race, which ThreadSanitizer reports */
#else
    /* on nccl the gather's host wait for its end has also waited for the copies before it on
     * the stream, so the dropped host wait cannot show */
    bool control = !on_nccl() && !on_cuda(); /* on cuda: SIM_ONLY */
#endif
    spec s = {.name = "offload: shards written after a forward",
              .world = 2,
              .strategy = FSDP_FULL_SHARD,
              .nested = true,
              .offload = true};
    run cpu, dev, without;
    run_init(&cpu, &s, false);
    run_init(&dev, &s, true);
    run_init(&without, &s, true);
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, offload_write_rank, &cpu));
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, offload_write_rank, &dev));
    CU_ASSERT_TRUE(cpu.out[0].n > 0 && same_runs(&cpu, &dev, false));
    if (control) {
        fsdp_shard_test_skip_offload_sync(true);
        fsdp_status st = fsdp_test_run_world(2, 60000, offload_write_rank, &without);
        fsdp_shard_test_skip_offload_sync(false);
        FSDP_TEST_OK(st);
        CU_ASSERT_FALSE(same_runs(&cpu, &without, true));
    }
    run_free(&cpu);
    run_free(&dev);
    run_free(&without);
}

static void test_refusals(void) {
    if (on_cuda()) {
        fsdp_test_skip("the refusals use two sim devices (a model on one, the rank on the other), "
                       "which one GPU cannot give; the sim entry runs them");
        return;
    }
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, refuse_rank, NULL));
}

int main(int argc, char **argv) {
    /* before the first use reads them; on nccl one sim device per rank (rank_device) */
    setenv("FSDP_SIM_DEVICES", on_nccl() ? "4" : "2", 1);
#ifdef FSDP_TEST_NCCL_STANDIN
    fsdp_nccl_library_use(FSDP_TEST_NCCL_STANDIN, "stand-in NCCL", FSDP_DEVICE_SIM);
#endif
    setenv("FSDP_SIM_MEMORY", "256M", 1);
    unsetenv("FSDP_SIM_MODE"); /* deferred */
    record_cuda_model(CUDA_K, CUDA_DEPTH);
    int mode = record_device_mode();
    if (mode) return mode;
    static const fsdp_test_case tests[] = {
        {"strategies_root", test_strategies_root},
        {"strategies_nested", test_strategies_nested},
        {"seed_001", test_seed_001},
        {"mixed_precision", test_mixed_precision},
        {"clip_no_sync_checkpoint_summon", test_clip_no_sync_checkpoint_summon},
        {"negative_control", test_negative_control},
        {"prefetch_order", test_prefetch_order},
        {"prefetch_backward_post", test_prefetch_backward_post},
        {"prefetch_limit", test_prefetch_limit},
        {"reduce_overlap", test_reduce_overlap},
        {"reduce_negative_control", test_reduce_negative_control},
        {"prefetch_cpu", test_prefetch_cpu},
        {"prefetch_negative_control", test_prefetch_negative_control},
        {"offload_write_after_forward", test_offload_write_after_forward},
        {"refusals", test_refusals},
    };
    return fsdp_test_run(argc, argv, "fsdp_device", tests, sizeof tests / sizeof tests[0]);
}

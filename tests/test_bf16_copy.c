/* test_bf16_copy.c: the optimizer's bf16 copy of FSDP's flat shards (param_dtype bf16, Adam and
 * AdamW over fsdp_sharded_flat_params): the step writes the shard and its rounding in one pass
 * and the next gathers take this rank's chunk from the copy. MLPStacked(3) on 2 rank threads,
 * layers.1 and layers.2 nested units, trained STEPS steps with the copy on and with it off
 * (FSDP_LOW_COPY_OFF: every gather rounds the f32 shard, as before the copy): the losses of every
 * step and every rank's final shards must be the same bits, on the CPU and on sim (which must
 * also equal the CPU). The gathers that took the copy are counted, so the copy cannot be dead:
 * every gather after the first step takes it. Writers of the f32 shard between two steps (a
 * fill through the public tensor API, summon_full_params with writeback, a second optimizer,
 * the state API's region writes that a checkpoint load makes) make the next gathers round
 * again, bitwise as without the copy; the negative control
 * (FSDP_LOW_COPY_UNCHECKED, which ignores the shard's write generation) then gathers the stale
 * copy and the run differs. Where the copy does not apply (use_orig_params, SGD, offload, f16)
 * no gather takes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/shard_impl.h"   // defines: fsdp_shard_test_low_copy, fsdp_shard_test_low_copy_counts
#include "harness.h"         // defines: fsdp_test_run_world, FSDP_RANK_CHECK, FSDP_TEST_OK
#include "stacked_batches.h" // defines: stacked_batch_rows, STACKED_BATCH

#define SEED       7
#define LAYERS     3
#define WORLD      2
#define STEPS      4
#define WRITE_STEP 1    /* the writers run after this step's optimizer step */
#define MAX_VALUES 2048 /* floats of one rank's shards (NO_SHARD: all of MLPStacked(3)'s) */

typedef enum opt_kind { OPT_ADAM, OPT_ADAMW, OPT_ADAM_AMSGRAD, OPT_SGD } opt_kind;
typedef enum write_kind {
    WRITE_NONE,
    WRITE_FILL,      /* fsdp_tensor_fill on unit 1's shard */
    WRITE_SUMMON,    /* every parameter rewritten inside summon_full_params(writeback) */
    WRITE_OPTIMIZER, /* a second optimizer (SGD) steps every shard */
    WRITE_STATE      /* the checkpoint path: the parameters of the step before written back */
} write_kind;

typedef struct scenario {
    opt_kind opt;
    fsdp_sharding_strategy strategy;
    bool nested, orig, offload, sim;
    bool prefetch;          /* forward_prefetch and BACKWARD_PRE: gathers on the unshard stream */
    fsdp_dtype param_dtype; /* 0 (f32) means bf16 here */
    write_kind write;
} scenario;

typedef struct rank_result {
    double loss[STEPS];
    float values[MAX_VALUES]; /* every unit's f32 shard after the last step, in unit order */
    int64_t n_values;
    int64_t used, rounded;      /* bf16 gathers that took the copy / rounded the shard */
    float snapshot[MAX_VALUES]; /* WRITE_STATE: the parameters after step WRITE_STEP - 1 */
} rank_result;

typedef struct run {
    const scenario *s;
    rank_result r[WORLD];
} run;

/* ---- one rank's training ---- */

/* Forward and backward of step `step` on this rank's rows, on dev; the loss sum((out - y)^2) /
 * batch is computed on the host, its gradient times WORLD (FSDP's averaging divides it out). */
static fsdp_status forward_backward(fsdp_ctx *ctx, fsdp_module *m, int step, int rank,
                                    fsdp_device dev, double *loss) {
    int64_t off, len;
    fsdp_chunk_range(STACKED_BATCH, WORLD, rank, &off, &len);
    fsdp_tensor *xh = NULL, *yh = NULL, *x = NULL, *oh = NULL, *dyh = NULL, *dy = NULL;
    const fsdp_tensor *out;
    fsdp_status st = stacked_batch_rows(ctx, 100 + 2 * (uint64_t)step, off, len, &xh);
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 101 + 2 * (uint64_t)step, off, len, &yh);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){len, 10}, &x);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, x, xh);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, yh, &oh);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, oh, out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, yh, &dyh);
    *loss = 0.0;
    if (st == FSDP_OK) {
        const float *o = fsdp_tensor_f32(oh), *y = fsdp_tensor_f32(yh);
        float *d = fsdp_tensor_f32(dyh);
        for (int64_t i = 0; i < len * 10; i++) {
            float diff = o[i] - y[i];
            *loss += (double)diff * diff / STACKED_BATCH;
            d[i] = 2.0f * diff * (float)WORLD / (float)STACKED_BATCH;
        }
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){len, 10}, &dy);
    }
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, dy, dyh);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dy, NULL);
    fsdp_tensor *all[] = {xh, yh, x, oh, dyh, dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fsdp_tensor_free(all[i]);
    return st;
}

static fsdp_status make_optimizer(fsdp_ctx *ctx, opt_kind kind, fsdp_module *flat,
                                  fsdp_optimizer **opt) {
    if (kind == OPT_SGD) return fsdp_sgd_create(ctx, flat, &(fsdp_sgd_options){.lr = 0.1}, opt);
    fsdp_adam_options o = {.lr = 0.02, .amsgrad = kind == OPT_ADAM_AMSGRAD};
    if (kind == OPT_ADAMW) o.weight_decay = 0.1;
    return kind == OPT_ADAMW ? fsdp_adamw_create(ctx, flat, &o, opt)
                             : fsdp_adam_create(ctx, flat, &o, opt);
}

/* A writer of the f32 shards between two steps (after an optimizer step wrote the copies). */
static fsdp_status write_shards(fsdp_ctx *ctx, write_kind w, fsdp_sharded *sh) {
    if (w == WRITE_FILL) /* the public tensor API on one unit's shard */
        return fsdp_tensor_fill(ctx, fsdp_param_data(fsdp_sharded_unit_flat_param(sh, 1)), 0.125f);
    if (w == WRITE_SUMMON) { /* every parameter rewritten inside summon_full_params */
        FSDP_TRY(fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.writeback = true}));
        fsdp_status st = FSDP_OK;
        for (int i = 0; st == FSDP_OK && i < fsdp_sharded_num_segments(sh); i++) {
            fsdp_flat_segment seg;
            st = fsdp_sharded_segment(ctx, sh, i, &seg);
            if (st == FSDP_OK)
                st = fsdp_tensor_fill(ctx, fsdp_param_data(seg.param), 0.01f * (float)(i + 1));
        }
        fsdp_status rel = fsdp_release_full_params(ctx, sh);
        return st != FSDP_OK ? st : rel;
    }
    if (w == WRITE_OPTIMIZER) { /* a second optimizer (SGD) steps the shards once more */
        fsdp_optimizer *sgd;
        FSDP_TRY(make_optimizer(ctx, OPT_SGD, fsdp_sharded_flat_params(sh), &sgd));
        fsdp_status st = fsdp_optimizer_step(ctx, sgd);
        fsdp_optimizer_free(sgd);
        return st;
    }
    return FSDP_OK;
}

/* Appends every unit's f32 shard (copied from its device) to the rank's values. */
static fsdp_status record_shards(fsdp_ctx *ctx, fsdp_sharded *sh, rank_result *r) {
    for (int u = 0; u < fsdp_sharded_num_units(sh); u++) {
        const fsdp_tensor *shard = fsdp_param_data(fsdp_sharded_unit_flat_param(sh, u));
        int64_t n = fsdp_tensor_numel(shard);
        FSDP_RANK_CHECK(ctx, r->n_values + n <= MAX_VALUES, "more than %d values", MAX_VALUES);
        fsdp_tensor *h;
        FSDP_TRY(fsdp_tensor_from_blob(ctx, r->values + r->n_values, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                       &n, &h));
        fsdp_status st = fsdp_tensor_copy(ctx, h, shard);
        fsdp_tensor_free(h);
        FSDP_TRY(st);
        r->n_values += n;
    }
    return FSDP_OK;
}

/* The parameter entries of the state (what a checkpoint saves and loads) read into or written
 * from r->snapshot, region by region: fsdp_state_write_region is how fsdp_ckpt_load writes. */
static fsdp_status state_params(fsdp_ctx *ctx, fsdp_module *m, fsdp_sharded *sh,
                                fsdp_optimizer *opt, rank_result *r, bool write) {
    fsdp_state *state;
    FSDP_TRY(fsdp_state_create(
        ctx, &(fsdp_state_sources){.model = m, .sharded = sh, .optimizer = opt}, &state));
    fsdp_status st = FSDP_OK;
    int64_t at = 0;
    for (int i = 0; st == FSDP_OK && i < fsdp_state_num_entries(state); i++) {
        fsdp_state_entry e;
        st = fsdp_state_entry_get(ctx, state, i, &e);
        if (st != FSDP_OK || e.kind != FSDP_STATE_PARAM) continue;
        if (at + e.numel_held > MAX_VALUES) st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "snapshot full");
        for (int k = 0; st == FSDP_OK && k < e.n_regions; k++) {
            fsdp_state_region reg;
            st = fsdp_state_region_get(ctx, state, i, k, &reg);
            int64_t n = 1;
            for (int d = 0; d < reg.ndim; d++) n *= reg.count[d];
            if (st == FSDP_OK)
                st = write ? fsdp_state_write_region(ctx, state, i, k, r->snapshot + at)
                           : fsdp_state_read_region(ctx, state, i, k, r->snapshot + at);
            at += n;
        }
    }
    fsdp_state_free(state);
    return st;
}

static fsdp_status rank_fn(fsdp_ctx *ctx, int rank, void *user) {
    run *rn = user;
    const scenario *s = rn->s;
    rank_result *r = &rn->r[rank];
    fsdp_device dev = s->sim ? (fsdp_device){FSDP_DEVICE_SIM, rank % 2} : FSDP_CPU;
    static const char *nested[] = {"layers.1", "layers.2"};
    fsdp_fully_shard_options fo = {
        .strategy = s->strategy,
        .wrap_paths = s->nested ? nested : NULL,
        .n_wrap_paths = s->nested ? 2 : 0,
        .use_orig_params = s->orig,
        .offload_params = s->offload,
        .forward_prefetch = s->prefetch,
        .backward_prefetch = s->prefetch ? FSDP_BACKWARD_PRE : FSDP_BACKWARD_PREFETCH_NONE,
        .mixed_precision = {.param_dtype = s->param_dtype ? s->param_dtype : FSDP_DTYPE_BF16}};
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_status st = fsdp_ctx_set_device(ctx, dev);
    if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, LAYERS, &m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, SEED);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, m, dev);
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, m, &fo, &sh);
    if (st == FSDP_OK) st = make_optimizer(ctx, s->opt, fsdp_sharded_flat_params(sh), &opt);
    for (int step = 0; st == FSDP_OK && step < STEPS; step++) {
        st = fsdp_optimizer_zero_grad(ctx, opt);
        if (st == FSDP_OK) st = forward_backward(ctx, m, step, rank, dev, &r->loss[step]);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        if (st == FSDP_OK && step == WRITE_STEP - 1 && s->write == WRITE_STATE)
            st = state_params(ctx, m, sh, opt, r, false);
        if (st == FSDP_OK && step == WRITE_STEP && s->write == WRITE_STATE)
            st = state_params(ctx, m, sh, opt, r, true);
        if (st == FSDP_OK && step == WRITE_STEP) st = write_shards(ctx, s->write, sh);
    }
    if (st == FSDP_OK) {
        fsdp_shard_test_low_copy_counts(sh, &r->used, &r->rounded);
        st = record_shards(ctx, sh, r);
    }
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

/* ---- running and comparing ---- */

static void run_mode(run *rn, const scenario *s, fsdp_low_copy_mode mode) {
    memset(rn, 0, sizeof *rn);
    rn->s = s;
    fsdp_shard_test_low_copy(mode);
    fsdp_status st = fsdp_test_run_world(WORLD, 0, rank_fn, rn);
    fsdp_shard_test_low_copy(FSDP_LOW_COPY_ON);
    FSDP_TEST_OK(st);
}

/* The ranks this process ran: both on rank threads, its own under mpirun (--mpi). */
static int hosted(int *first) {
    return fsdp_test_hosted_ranks(WORLD, first);
}

/* Whether two runs gave the same bits: every loss and every shard value of every rank. */
static bool same_bits(const run *a, const run *b) {
    int first, n = hosted(&first);
    for (int k = first; k < first + n; k++) {
        const rank_result *x = &a->r[k], *y = &b->r[k];
        if (memcmp(x->loss, y->loss, sizeof x->loss) != 0) return false;
        if (x->n_values != y->n_values ||
            memcmp(x->values, y->values, (size_t)x->n_values * sizeof(float)) != 0)
            return false;
    }
    return true;
}

static void print_first_difference(const char *what, const run *a, const run *b) {
    int first, n = hosted(&first);
    for (int k = first; k < first + n; k++) {
        for (int i = 0; i < STEPS; i++)
            if (a->r[k].loss[i] != b->r[k].loss[i]) {
                printf("\n  %s: rank %d loss of step %d: %.9g vs %.9g\n", what, k, i,
                       a->r[k].loss[i], b->r[k].loss[i]);
                return;
            }
        for (int64_t i = 0; i < a->r[k].n_values; i++)
            if (memcmp(&a->r[k].values[i], &b->r[k].values[i], sizeof(float)) != 0) {
                printf("\n  %s: rank %d shard value %lld: %.9g vs %.9g\n", what, k, (long long)i,
                       (double)a->r[k].values[i], (double)b->r[k].values[i]);
                return;
            }
    }
}

static void check_same(const char *what, const run *a, const run *b) {
    bool same = same_bits(a, b);
    if (!same) print_first_difference(what, a, b);
    CU_ASSERT_TRUE(same);
}

/* The copy on and off give the same bits; with it off no gather takes it, every gather rounds;
 * with it on every gather after the first step takes it (the gathers of a step are the same
 * number every step: off's count / STEPS). Returns the on run's rounded count of the first
 * rank this process ran. */
static int64_t check_on_off(const scenario *s, run *on, run *off) {
    run_mode(off, s, FSDP_LOW_COPY_OFF);
    run_mode(on, s, FSDP_LOW_COPY_ON);
    check_same("copy on vs off", on, off);
    int first, n = hosted(&first);
    CU_ASSERT_TRUE(n > 0);
    for (int k = first; k < first + n; k++) {
        int64_t total = off->r[k].rounded, per_step = total / STEPS;
        CU_ASSERT_EQUAL(off->r[k].used, 0);
        CU_ASSERT_TRUE(per_step > 0 && total == per_step * STEPS);
        CU_ASSERT_EQUAL(on->r[k].used + on->r[k].rounded, total);
        if (s->write == WRITE_NONE) {
            CU_ASSERT_EQUAL(on->r[k].rounded, per_step);
            CU_ASSERT_EQUAL(on->r[k].used, total - per_step);
        }
    }
    return on->r[first].rounded;
}

/* Adam, AdamW (and Adam with amsgrad) under FULL_SHARD and SHARD_GRAD_OP (and NO_SHARD, whose
 * bf16 gather rounds the whole flat parameter), nested units and root only, with and without
 * prefetch, on `sim` or the CPU: the copy changes no bit and is
 * taken by every gather after the first step; on sim each on run also equals the CPU's. */
static void bitwise_cases(bool sim) {
    static const scenario base[] = {
        {.opt = OPT_ADAM, .strategy = FSDP_FULL_SHARD, .nested = true},
        {.opt = OPT_ADAMW, .strategy = FSDP_FULL_SHARD, .nested = true},
        {.opt = OPT_ADAM, .strategy = FSDP_SHARD_GRAD_OP, .nested = true},
        {.opt = OPT_ADAMW, .strategy = FSDP_SHARD_GRAD_OP, .nested = true},
        {.opt = OPT_ADAM_AMSGRAD, .strategy = FSDP_FULL_SHARD, .nested = true},
        {.opt = OPT_ADAMW, .strategy = FSDP_FULL_SHARD, .nested = false},
        {.opt = OPT_ADAMW, .strategy = FSDP_FULL_SHARD, .nested = true, .prefetch = true},
        {.opt = OPT_ADAM, .strategy = FSDP_NO_SHARD, .nested = true}, /* the whole flat copy */
    };
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) {
        scenario s = base[i];
        s.sim = sim;
        run on, off;
        check_on_off(&s, &on, &off);
        if (sim) {
            scenario c = s;
            c.sim = false;
            run cpu;
            run_mode(&cpu, &c, FSDP_LOW_COPY_ON);
            check_same("sim vs CPU", &on, &cpu);
        }
    }
}

static void test_bitwise_cpu(void) {
    bitwise_cases(false);
}

/* The mpi backend moves CPU tensors only: the sim cases run on rank threads. */
static bool skip_sim_under_mpi(void) {
    if (!fsdp_test_mpi()) return false;
    fsdp_test_skip("sim devices run on rank threads (the mpi backend moves CPU tensors)");
    return true;
}

static void test_bitwise_sim(void) {
    if (!skip_sim_under_mpi()) bitwise_cases(true);
}

/* Where the copy does not apply no gather takes it, and nothing changes: use_orig_params (the
 * optimizer steps views of the original parameters, not the flat shards), SGD, offload (the
 * shard is on the host and is copied to the device for every gather anyway), f16. */
static void test_not_applied(void) {
    static const scenario cases[] = {
        {.opt = OPT_ADAM, .strategy = FSDP_FULL_SHARD, .nested = true, .orig = true},
        {.opt = OPT_SGD, .strategy = FSDP_FULL_SHARD, .nested = true},
        {.opt = OPT_ADAM, .strategy = FSDP_FULL_SHARD, .nested = true, .offload = true},
        {.opt = OPT_ADAM,
         .strategy = FSDP_FULL_SHARD,
         .nested = true,
         .param_dtype = FSDP_DTYPE_F16},
        {.opt = OPT_ADAM,
         .strategy = FSDP_FULL_SHARD,
         .nested = true,
         .sim = true,
         .offload = true}, /* last: rank threads only */
    };
    size_t n_cases = sizeof cases / sizeof *cases - (fsdp_test_mpi() ? 1 : 0);
    for (size_t i = 0; i < n_cases; i++) {
        run on, off;
        run_mode(&off, &cases[i], FSDP_LOW_COPY_OFF);
        run_mode(&on, &cases[i], FSDP_LOW_COPY_ON);
        check_same("not applied: on vs off", &on, &off);
        int first, n = hosted(&first);
        for (int k = first; k < first + n; k++) {
            CU_ASSERT_EQUAL(on.r[k].used, 0);
            CU_ASSERT_EQUAL(on.r[k].rounded, off.r[k].rounded);
        }
    }
}

/* A writer of the f32 shards after step WRITE_STEP: the next gathers of the units it wrote round
 * the shard again (more rounded, fewer taken than without the writer), and the run keeps the
 * bits of the run without the copy. */
static void stale_cases(bool sim) {
    static const write_kind writes[] = {WRITE_FILL, WRITE_SUMMON, WRITE_OPTIMIZER, WRITE_STATE};
    scenario plain = {.opt = OPT_ADAMW, .strategy = FSDP_FULL_SHARD, .nested = true, .sim = sim};
    run on, off;
    int64_t rounded_plain = check_on_off(&plain, &on, &off);
    for (size_t i = 0; i < sizeof writes / sizeof *writes; i++) {
        scenario s = plain;
        s.write = writes[i];
        int64_t rounded = check_on_off(&s, &on, &off);
        printf("\n  writer %d: %lld gathers rounded (%lld without it)", (int)writes[i],
               (long long)rounded, (long long)rounded_plain);
        /* The fill writes unit 1 only; summon, the second optimizer and the state write every
         * unit: all of the next step's gathers round, as in the first step. Reading the state
         * (the snapshot after the step before) hands out the shards' memory too, so the step
         * after the read rounds as well: reads count as writes (see docs/fsdp.md). */
        if (writes[i] == WRITE_FILL) { /* unit 1 (not the root): its forward and backward gathers */
            CU_ASSERT_EQUAL(rounded, rounded_plain + 2);
        } else if (writes[i] == WRITE_STATE) {
            CU_ASSERT_EQUAL(rounded, 3 * rounded_plain);
        } else {
            CU_ASSERT_EQUAL(rounded, 2 * rounded_plain);
        }
    }
}

static void test_stale_cpu(void) {
    stale_cases(false);
}

static void test_stale_sim(void) {
    if (!skip_sim_under_mpi()) stale_cases(true);
}

/* The negative control: with the generation check dropped (FSDP_LOW_COPY_UNCHECKED) a run
 * without a writer still gives the bits of the run without the copy (the copy is right), but
 * after each writer the gathers take the stale copy and the run differs. */
static void test_negative_control(void) {
    static const write_kind writes[] = {WRITE_FILL, WRITE_SUMMON, WRITE_OPTIMIZER, WRITE_STATE};
    scenario s = {.opt = OPT_ADAM, .strategy = FSDP_FULL_SHARD, .nested = true};
    run unchecked, off;
    run_mode(&off, &s, FSDP_LOW_COPY_OFF);
    run_mode(&unchecked, &s, FSDP_LOW_COPY_UNCHECKED);
    check_same("unchecked, no writer", &unchecked, &off);
    for (size_t i = 0; i < sizeof writes / sizeof *writes; i++) {
        s.write = writes[i];
        run_mode(&off, &s, FSDP_LOW_COPY_OFF);
        run_mode(&unchecked, &s, FSDP_LOW_COPY_UNCHECKED);
        bool same = same_bits(&unchecked, &off);
        if (!same) print_first_difference("unchecked after a writer (expected)", &unchecked, &off);
        CU_ASSERT_FALSE(same);
        /* the step before the writer is untouched */
        int first, n = hosted(&first);
        for (int k = first; k < first + n; k++)
            CU_ASSERT_EQUAL(unchecked.r[k].loss[WRITE_STEP], off.r[k].loss[WRITE_STEP]);
    }
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"bitwise_cpu", test_bitwise_cpu}, {"bitwise_sim", test_bitwise_sim},
        {"not_applied", test_not_applied}, {"stale_cpu", test_stale_cpu},
        {"stale_sim", test_stale_sim},     {"negative_control", test_negative_control},
    };
    return fsdp_test_run(argc, argv, "bf16_copy", cases, sizeof cases / sizeof *cases);
}

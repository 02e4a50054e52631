/* test_llama_2d.c: the Llama model under torchtitan's 2-D plan: RowwiseParallel on the
 * vocabulary-sharded embedding, loss parallel against the unsharded cross-entropy, the plan's
 * refusals, and training at (dp, tp) in {(1,1), (2,1), (1,2), (2,2), (1,4)} (TP over heads, MLP
 * width and vocabulary, SequenceParallel norms, FSDP per decoder layer plus the root over dp)
 * against the single-rank run, with the collectives of a (2,2) step pinned. Every rank checks
 * its own results. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "llama_steps.h" // defines: llama_tp_build
#include "numerics.h"

#define SEED  11
#define BATCH 4
#define SEQ   8
#define STEPS 3

/* Grouped-query attention whose heads split at tp 2 and 4 (8 query heads of 4, 4 key/value
 * heads), as do the vocabulary, the MLP width and the sequence. */
static const fsdp_llama_config CFG = {.dim = 32,
                                      .n_layers = 2,
                                      .n_heads = 8,
                                      .n_kv_heads = 4,
                                      .vocab_size = 64,
                                      .ffn_hidden = 48,
                                      .max_seq_len = 16};

/* (BATCH, SEQ) token ids and next-token targets (-100 at each row's end), from the counter RNG:
 * every rank and the reference make the same. */
static void make_batch(int step, int64_t V, int32_t *tokens, int32_t *targets) {
    fsdp_tensor *r = fsdp_test_random(1, (int64_t[]){BATCH * SEQ}, 0.0f, (float)V, 100 + step);
    for (int i = 0; i < BATCH * SEQ; i++) {
        int32_t t = (int32_t)fsdp_tensor_f32(r)[i];
        tokens[i] = t < V ? t : (int32_t)V - 1;
    }
    fsdp_tensor_free(r);
    for (int b = 0; b < BATCH; b++)
        for (int t = 0; t < SEQ; t++)
            targets[b * SEQ + t] = t + 1 < SEQ ? tokens[b * SEQ + t + 1] : FSDP_IGNORE_INDEX;
}

/* Whether this process runs rank 0 of a world of n (and so has its numbers to print). */
static bool hosts_rank0(int n) {
    int first;
    return fsdp_test_hosted_ranks(n, &first) > 0 && first == 0;
}

/* ---- RowwiseParallel on an Embedding ---- */

typedef struct emb_case {
    int64_t V, C;
    fsdp_placement out; /* output_layouts */
    int world;
} emb_case;

static fsdp_status embedding_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const emb_case *c = user;
    int world = c->world;
    int32_t ids[2 * 5] = {0, 3, 9, 1, 2, 7, 8, 4, 5, 6};
    for (int i = 0; i < 10; i++) ids[i] %= (int32_t)c->V;
    fsdp_module *ref = NULL, *m = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_tensor *tok = NULL, *dy = NULL, *full = NULL;
    const fsdp_tensor *want, *got, *unused;
    fsdp_status st = fsdp_embedding_create(ctx, c->V, c->C, &ref);
    if (st == FSDP_OK) st = fsdp_embedding_create(ctx, c->V, c->C, &m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, ref, SEED);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, SEED);
    if (st == FSDP_OK) st = fsdp_mesh_create(ctx, 1, (int[]){world}, (const char *[]){"tp"}, &mesh);
    if (st == FSDP_OK)
        st = fsdp_tp_apply(ctx, m, mesh,
                           &FSDP_ROWWISE(.input_layouts = FSDP_REPLICATE, .output_layouts = c->out),
                           NULL);
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){2, 5}, &tok);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, ref, tok, &want);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, tok, &got);
    /* the whole output: Replicate as it is, Shard(1) gathered by hand */
    int64_t off = 0, len = 5;
    if (st == FSDP_OK && c->out.kind == FSDP_PLACEMENT_SHARD)
        fsdp_chunk_range(5, world, fsdp_ctx_rank(ctx), &off, &len);
    for (int64_t b = 0; st == FSDP_OK && b < 2; b++)
        for (int64_t t = 0; t < len; t++)
            for (int64_t j = 0; j < c->C; j++) {
                float g = fsdp_tensor_f32(got)[(b * len + t) * c->C + j];
                float w = fsdp_tensor_f32(want)[(b * 5 + off + t) * c->C + j];
                if (g != w)
                    st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                                   "embedding output [%lld, %lld, %lld] is %g, want %g",
                                   (long long)b, (long long)(off + t), (long long)j, g, w);
            }
    /* backward: dy = the reference output itself (any values), this rank's part of it */
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){2, len, c->C}, &dy);
    for (int64_t b = 0; st == FSDP_OK && b < 2; b++)
        memcpy(fsdp_tensor_f32(dy) + b * len * c->C, fsdp_tensor_f32(want) + (b * 5 + off) * c->C,
               (size_t)(len * c->C) * sizeof(float));
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, ref, want, &unused);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dy, &unused);
    fsdp_param *pw = fsdp_module_get_param(m, "weight");
    if (st == FSDP_OK) st = fsdp_param_full_tensor(ctx, pw, true, &full);
    if (st == FSDP_OK)
        st =
            fsdp_test_rank_close(ctx, "embedding weight grad", full,
                                 fsdp_param_grad(fsdp_module_get_param(ref, "weight")), 0, 0, NULL);
    fsdp_tensor_free(full);
    fsdp_tensor_free(dy);
    fsdp_tensor_free(tok);
    fsdp_module_free(m);
    fsdp_module_free(ref);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_embedding_rowwise(void) {
    emb_case rep = {10, 6, FSDP_REPLICATE, 0}, seq = {10, 6, FSDP_SHARD(1), 0};
    for (int w = 2; w <= 4; w += 2) { /* V 10: 5 + 5 rows, then 3 + 3 + 3 + 1 */
        rep.world = seq.world = w;
        FSDP_TEST_OK(fsdp_test_run_world(w, 0, embedding_rank, &rep));
        FSDP_TEST_OK(fsdp_test_run_world(w, 0, embedding_rank, &seq));
    }
}

/* ---- loss parallel ---- */

typedef struct loss_case {
    int64_t rows, V;
    int world;
    double max_loss_diff, max_grad_diff; /* seen on this process's ranks */
} loss_case;

static fsdp_status loss_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    loss_case *c = user;
    int world = c->world;
    int32_t targets[64];
    for (int64_t r = 0; r < c->rows; r++)
        targets[r] = r % 5 == 3 ? FSDP_IGNORE_INDEX : (int32_t)((r * 7 + 3) % c->V);
    fsdp_tensor *logits = fsdp_test_random(2, (int64_t[]){c->rows, c->V}, -4.0f, 4.0f, 9);
    fsdp_tensor *dfull = NULL, *dlocal = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_dtensor *dt = NULL;
    float want, got;
    fsdp_status st = fsdp_tensor_create_like(ctx, logits, &dfull);
    if (st == FSDP_OK)
        st = fsdp_loss_cross_entropy_ignore(ctx, logits, targets, FSDP_IGNORE_INDEX, &want, dfull);
    if (st == FSDP_OK) st = fsdp_mesh_create(ctx, 1, (int[]){world}, (const char *[]){"tp"}, &mesh);
    fsdp_placement sh = FSDP_SHARD(-1);
    if (st == FSDP_OK) st = fsdp_distribute_tensor(ctx, logits, mesh, &sh, FSDP_NO_SRC_RANK, &dt);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, fsdp_dtensor_local(dt), &dlocal);
    if (st == FSDP_OK)
        st = fsdp_loss_parallel_cross_entropy(ctx, fsdp_dtensor_local(dt), targets,
                                              FSDP_IGNORE_INDEX, &got, dlocal);
    /* Both sum in double (src/tp/loss_parallel.c); the sharded one all_reduces each rank's
     * float sum of exponentials, rounded once per rank: (tp + 1) u = 3e-7 of the loss and of
     * each softmax value at tp 4 (no BLAS: the same on every machine). Bound 1e-6 (17 u),
     * and 1e-9 absolute for the probabilities that round to 0. */
    double dl = fabs((double)got - (double)want);
    if (st == FSDP_OK && dl > 1e-6 * fabs(want))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "loss_parallel %.9g, unsharded %.9g", got, want);
    int64_t off, len, V = c->V;
    fsdp_chunk_range(V, world, fsdp_ctx_rank(ctx), &off, &len);
    double dg = 0.0;
    for (int64_t r = 0; st == FSDP_OK && r < c->rows; r++)
        for (int64_t j = 0; j < len; j++) {
            double g = fsdp_tensor_f32(dlocal)[r * len + j];
            double w = fsdp_tensor_f32(dfull)[r * V + off + j];
            dg = fmax(dg, fabs(g - w));
            if (fabs(g - w) > 1e-6 * fabs(w) + 1e-9)
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "dlogits[%lld, %lld] %.9g, want %.9g",
                               (long long)r, (long long)(off + j), g, w);
        }
    if (st == FSDP_OK && fsdp_ctx_rank(ctx) == 0) c->max_loss_diff = dl, c->max_grad_diff = dg;
    fsdp_dtensor_free(dt);
    fsdp_tensor_free(dlocal);
    fsdp_tensor_free(dfull);
    fsdp_tensor_free(logits);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_loss_parallel(void) {
    loss_case cases[] = {{32, 64, 0, 0, 0}, {12, 10, 0, 0, 0}}; /* even; 10 classes: uneven at 4 */
    for (size_t i = 0; i < 2; i++)
        for (int w = 1; w <= 4; w *= 2) {
            cases[i].world = w;
            FSDP_TEST_OK(fsdp_test_run_world(w, 0, loss_rank, &cases[i]));
            if (!hosts_rank0(w)) continue;
            printf("\n  loss_parallel rows %lld vocab %lld tp %d: |loss diff| %.3g, max |dlogits "
                   "diff| %.3g",
                   (long long)cases[i].rows, (long long)cases[i].V, w, cases[i].max_loss_diff,
                   cases[i].max_grad_diff);
        }
}

/* ---- the plan's refusals ---- */

static void test_plan_refuses(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_tp_plan_entry plan[FSDP_LLAMA_TP_PLAN_LEN];
    int n;
    fsdp_llama_config gqa = CFG;
    gqa.n_heads = 4, gqa.n_kv_heads = 2;
    FSDP_TEST_FAILS(fsdp_llama_tp_plan(ctx, &gqa, 4, true, plan, &n), FSDP_ERR_INVALID_ARGUMENT,
                    "n_heads = 4", "n_kv_heads = 2", "tp size 4");
    FSDP_TEST_FAILS(fsdp_llama_tp_plan(ctx, &gqa, 3, true, plan, &n), FSDP_ERR_INVALID_ARGUMENT,
                    "n_heads = 4", "n_kv_heads = 2");
    FSDP_TEST_OK(fsdp_llama_tp_plan(ctx, &gqa, 2, true, plan, &n));
    CU_ASSERT_EQUAL(n, FSDP_LLAMA_TP_PLAN_LEN);
    fsdp_llama_config mha = gqa;
    mha.n_kv_heads = 4;
    FSDP_TEST_OK(fsdp_llama_tp_plan(ctx, &mha, 4, false, plan, &n));
}

/* A sequence the tp size does not divide: the plan's SequenceParallel norms would read uneven
 * shards as even ones, so the first forward stops where the embedding splits the sequence,
 * before any collective, on every rank alike, naming the length, the tp size and the fix; the
 * same model then runs a sequence of 6. */
static fsdp_status uneven_sequence_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank, (void)user;
    fsdp_mesh *tp = NULL;
    fsdp_module *m = NULL;
    fsdp_tensor *tok5 = NULL, *tok6 = NULL;
    fsdp_tp_plan_entry plan[FSDP_LLAMA_TP_PLAN_LEN];
    int n = 0;
    int32_t tokens[2 * 6];
    for (int i = 0; i < 2 * 6; i++) tokens[i] = (int32_t)((i * 7 + 1) % CFG.vocab_size);
    const fsdp_tensor *logits;
    fsdp_status st = fsdp_mesh_create(ctx, 1, (int[]){2}, (const char *[]){"tp"}, &tp);
    if (st == FSDP_OK) st = fsdp_model_llama(ctx, &CFG, &m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, SEED);
    if (st == FSDP_OK) st = fsdp_llama_tp_plan(ctx, &CFG, 2, true, plan, &n);
    if (st == FSDP_OK) st = fsdp_tp_parallelize(ctx, m, tp, n, plan, NULL);
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, tokens, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){2, 5},
                                   &tok5);
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, tokens, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){2, 6},
                                   &tok6);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) {
        fsdp_status got = fsdp_module_forward(ctx, m, tok5, &logits);
        const char *msg = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx, got == FSDP_ERR_SHAPE, "a sequence of 5 at tp 2 returned %s",
                        fsdp_status_to_string(got));
        static const char *const needles[] = {"model.embed_tokens", "sequence length 5",
                                              "tp size 2", "multiple of 2"};
        for (int i = 0; i < 4; i++)
            FSDP_RANK_CHECK(ctx, msg && strstr(msg, needles[i]),
                            "a sequence of 5 at tp 2: message \"%s\" lacks \"%s\"",
                            msg ? msg : "(none)", needles[i]);
        st = fsdp_comm_debug_end(ctx);
        FSDP_RANK_CHECK(ctx, st != FSDP_OK || fsdp_comm_debug_num_records(ctx) == 0,
                        "the refused forward ran %d kinds of collective",
                        fsdp_comm_debug_num_records(ctx));
    }
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, tok6, &logits);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_tensor_dim(logits, 1) == 6, "a sequence of 6: logits of %lld",
                        (long long)fsdp_tensor_dim(logits, 1));
    fsdp_tensor_free(tok6);
    fsdp_tensor_free(tok5);
    fsdp_module_free(m);
    fsdp_mesh_free(tp);
    return st;
}

static void test_uneven_sequence(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, uneven_sequence_rank, NULL));
}

/* ---- training at (dp, tp) against one rank ---- */

static float ref_loss[STEPS];  /* the single-rank run's loss per step */
static fsdp_module *ref_model; /* and its parameters after the last step */
static double ref_noise;       /* the reference's rounding noise (NOISE_Q of |ref - nudged|) */

/* The parameters after STEPS Adam steps, against the single-rank run's, by the statistical rule
 * of tests/numerics.h (the largest difference over elements is a random draw under Adam: an
 * element whose gradient passes near zero turns the rounding of another summation order into
 * a move of up to lr). The reference's rounding noise is the NOISE_Q quantile of |ref - ref'|
 * over all parameters, ref' the same single-rank run from parameters nudged by one ulp. Every
 * element must lie within NOISE_K x that noise, but at most MAX_EXCEPTIONS elements, each
 * within twice Adam's largest move in STEPS steps (0.06 here). Why these numbers: a layout
 * reorders only some sums, the nudge perturbs every parameter, so a layout's quantiles are
 * about half of ref' - ref's (the NOISE_Q quantile is 1.2e-7 at vocab 64, 4.5e-7 at 62); the
 * amplified elements form a tail that falls about as 1/x, so of the (1 - NOISE_Q) n = 20
 * elements beyond the noise about 20 / NOISE_K = 2.5 would lie beyond NOISE_K x it if a
 * layout were as noisy as ref' itself, and MAX_EXCEPTIONS = 8 is then exceeded with
 * probability 1e-3. Seen under OpenBLAS's Haswell, Zen, Sandybridge and Prescott kernels: the
 * largest difference 0.2 to 0.96 of the bound, at most 1 element beyond 4 x the noise, none
 * beyond NOISE_K x (docs/testing.md "Bounds"). */
#define LR             1e-2
#define NOISE_Q        0.999
#define NOISE_K        8.0
#define MAX_EXCEPTIONS 8

/* One rank, no wrapper: the reference (nudge: its parameters moved by one ulp first). */
static fsdp_module *reference_run(const fsdp_llama_config *cfg, bool nudge) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m;
    fsdp_optimizer *opt;
    FSDP_TEST_OK(fsdp_model_llama(ctx, cfg, &m));
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, SEED));
    if (nudge) FSDP_TEST_OK(fsdp_test_nudge_params(ctx, m, 77));
    FSDP_TEST_OK(fsdp_adam_create(ctx, m, &(fsdp_adam_options){.lr = LR}, &opt));
    fsdp_tensor *tok, *dlogits = NULL;
    int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, tokens, FSDP_DTYPE_I32, FSDP_CPU, 2,
                                       (int64_t[]){BATCH, SEQ}, &tok));
    for (int s = 0; s < STEPS; s++) {
        make_batch(s, cfg->vocab_size, tokens, targets);
        const fsdp_tensor *logits, *unused;
        float loss;
        FSDP_TEST_OK(fsdp_optimizer_zero_grad(ctx, opt));
        FSDP_TEST_OK(fsdp_module_forward(ctx, m, tok, &logits));
        if (!dlogits) FSDP_TEST_OK(fsdp_tensor_create_like(ctx, logits, &dlogits));
        FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, logits, targets, FSDP_IGNORE_INDEX, &loss,
                                                    dlogits));
        if (!nudge) ref_loss[s] = loss;
        FSDP_TEST_OK(fsdp_module_backward(ctx, m, dlogits, &unused));
        FSDP_TEST_OK(fsdp_optimizer_step(ctx, opt));
    }
    fsdp_tensor_free(dlogits);
    fsdp_tensor_free(tok);
    fsdp_optimizer_free(opt);
    return m;
}

typedef struct layout_case {
    int dp, tp;
    bool count;                 /* pin the collectives of the last step */
    bool plain_loss;            /* lm_head's output Replicate, the ordinary cross-entropy */
    int64_t vocab;              /* 0: CFG's; else a vocabulary that splits unevenly */
    double max_rel;             /* the largest relative loss difference (rank 0 here) */
    fsdp_test_adam_check check; /* the parameters after the last step (rank 0 here) */
    float loss[STEPS];
} layout_case;

/* The collectives of one training step at (dp 2, tp 2) on every rank (35), as (mesh dim, phase,
 * op, calls), with L = 2 decoder layers. Forward, tp: the embedding's reduce_scatter (Partial ->
 * Shard(1)); per layer an all_gather into self_attn and into mlp (Shard(1) -> Replicate) and a
 * reduce_scatter out of o_proj and down_proj; the all_gather into lm_head. The loss's two
 * all_reduces (row max, then sum-exp with the target logits) run outside forward and backward.
 * Backward, tp: lm_head's input gradient Partial -> Shard(1) (reduce_scatter); per layer the
 * all_gathers of o_proj's and down_proj's Shard(1) output gradients, one reduce_scatter
 * (Partial -> Shard(1)) of self_attn's and of mlp's input gradient, the sum of q, k and v's
 * (gate and up's) Partial gradients (PyTorch's one reduction per block: src/tp/block_sum.c),
 * and one all_reduce per SequenceParallel norm weight (2 per layer and model.norm); the
 * embedding's output gradient all_gathered. The
 * embedding and projection weight gradients are Shard: no collective. dp: FSDP FULL_SHARD over
 * 3 units (root and 2 layers; the root keeps its parameters for backward). */
typedef struct comm_pin {
    const char *group;
    fsdp_comm_phase phase;
    fsdp_comm_op op;
    int64_t calls;
} comm_pin;

static const comm_pin PINNED[] = {
    {"tp", FSDP_COMM_PHASE_FORWARD, FSDP_COMM_ALL_GATHER, 2 * 2 + 1},
    {"tp", FSDP_COMM_PHASE_FORWARD, FSDP_COMM_REDUCE_SCATTER, 2 * 2 + 1},
    {"tp", FSDP_COMM_PHASE_NONE, FSDP_COMM_ALL_REDUCE, 2},
    {"tp", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_REDUCE_SCATTER, 1 + 2 * 2},
    {"tp", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_GATHER, 2 * 2 + 1},
    {"tp", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_REDUCE, 2 * 2 + 1},
    {"dp", FSDP_COMM_PHASE_FORWARD, FSDP_COMM_ALL_GATHER, 3},
    {"dp", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_ALL_GATHER, 2},
    {"dp", FSDP_COMM_PHASE_BACKWARD, FSDP_COMM_REDUCE_SCATTER, 3},
};

static fsdp_status comm_check(fsdp_ctx *ctx, const fsdp_mesh *mesh) {
    static const fsdp_comm_phase phases[] = {FSDP_COMM_PHASE_NONE, FSDP_COMM_PHASE_FORWARD,
                                             FSDP_COMM_PHASE_BACKWARD};
    int64_t total = 0;
    size_t np = sizeof PINNED / sizeof PINNED[0];
    for (size_t i = 0; i < np; i++) total += PINNED[i].calls;
    for (int d = 0; d < fsdp_mesh_ndim(mesh); d++)
        for (int ph = 0; ph < 3; ph++)
            for (int op = FSDP_COMM_ALL_GATHER; op < FSDP_COMM_BARRIER; op++) {
                const char *g = fsdp_mesh_dim_name(mesh, d);
                int64_t want = 0;
                for (size_t i = 0; i < np; i++)
                    if (strcmp(PINNED[i].group, g) == 0 && PINNED[i].phase == phases[ph] &&
                        PINNED[i].op == (fsdp_comm_op)op)
                        want = PINNED[i].calls;
                fsdp_comm_filter f = {.op = (fsdp_comm_op)op, .group = g, .phase = phases[ph]};
                int64_t got = fsdp_comm_debug_query(ctx, &f).calls;
                FSDP_RANK_CHECK(ctx, got == want, "(2, 2) step: %lld %s on %s in %s, want %lld",
                                (long long)got, fsdp_comm_op_to_string((fsdp_comm_op)op), g,
                                fsdp_comm_phase_to_string(phases[ph]), (long long)want);
            }
    int64_t got = fsdp_comm_debug_total(ctx).calls;
    FSDP_RANK_CHECK(ctx, got == total, "(2, 2) step: %lld collectives in all, want %lld",
                    (long long)got, (long long)total);
    return FSDP_OK;
}

/* Builds the model with the plan over tp and FSDP (one unit per decoder layer plus the root)
 * over dp, trains STEPS Adam steps on this dp replica's rows with loss parallel, and compares
 * each step's loss (averaged over dp) with the single-rank run. */
static fsdp_status layout_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    layout_case *c = user;
    llama_tp l;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *tok = NULL, *dlogits = NULL, *lt = NULL;
    static const char *const kinds[] = {"LlamaDecoderLayer"};
    fsdp_llama_config cfg = CFG;
    if (c->vocab) cfg.vocab_size = c->vocab;
    fsdp_status st = llama_tp_build(ctx, &cfg, c->dp, c->tp, !c->plain_loss, SEED, FSDP_CPU, &l);
    if (st == FSDP_OK)
        st = fsdp_fully_shard(
            ctx, l.m,
            &(fsdp_fully_shard_options){
                .group = l.dp, .wrap_kinds = kinds, .n_wrap_kinds = 1, .poison_resharded = true},
            &sh);
    if (st == FSDP_OK)
        st = fsdp_adam_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_adam_options){.lr = LR},
                              &opt);
    int64_t off, len;
    fsdp_chunk_range(BATCH, c->dp, fsdp_mesh_coordinate(l.mesh, 0), &off, &len);
    int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, tokens + off * SEQ, FSDP_DTYPE_I32, FSDP_CPU, 2,
                                   (int64_t[]){len, SEQ}, &tok);
    float loss = 0.0f;
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, &loss, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &lt);
    for (int s = 0; st == FSDP_OK && s < STEPS; s++) {
        make_batch(s, cfg.vocab_size, tokens, targets);
        const fsdp_tensor *logits, *unused;
        if (c->count && s == STEPS - 1) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, l.m, tok, &logits);
        if (st == FSDP_OK && !dlogits) st = fsdp_tensor_create_like(ctx, logits, &dlogits);
        if (st == FSDP_OK)
            st = c->plain_loss
                     ? fsdp_loss_cross_entropy_ignore(ctx, logits, targets + off * SEQ,
                                                      FSDP_IGNORE_INDEX, &loss, dlogits)
                     : fsdp_loss_parallel_cross_entropy(ctx, logits, targets + off * SEQ,
                                                        FSDP_IGNORE_INDEX, &loss, dlogits);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, l.m, dlogits, &unused);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        if (st == FSDP_OK && c->count && s == STEPS - 1) {
            st = fsdp_comm_debug_end(ctx);
            if (st == FSDP_OK && fsdp_ctx_rank(ctx) == 0) {
                printf("\n  one (dp 2, tp 2) step, rank 0:\n");
                st = fsdp_comm_debug_print(ctx, stdout);
            }
            if (st == FSDP_OK) st = comm_check(ctx, l.mesh);
        }
        /* every dp replica scores the same number of targets, so the mean of the means is the
         * whole batch's mean */
        if (st == FSDP_OK) st = fsdp_all_reduce(ctx, l.dp, lt, FSDP_REDUCE_AVG);
        /* The loss of step s: the softmax sums run in double, so what differs is the logits,
         * from f32 GEMMs (K <= 48) in another order and the parameters' differences after s
         * steps (below); seen 1.1e-7 (2 u) at most under every kernel run. Bound 1e-5
         * (170 u). */
        double rel = fabs((double)loss - (double)ref_loss[s]) / fabs((double)ref_loss[s]);
        if (st == FSDP_OK && !(rel <= 1e-5))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "(%d, %d) step %d: loss %.9g, one rank %.9g",
                           c->dp, c->tp, s, loss, ref_loss[s]);
        if (st == FSDP_OK && fsdp_ctx_rank(ctx) == 0) {
            c->loss[s] = loss;
            c->max_rel = fmax(c->max_rel, rel);
        }
    }
    /* every parameter, gathered over tp inside summon_full_params */
    fsdp_test_adam_check check = {.bulk = NOISE_K * ref_noise,
                                  .move = 2.0 * LR * fsdp_test_adam_max_move(0.9, 0.999, STEPS),
                                  .max_exceptions = MAX_EXCEPTIONS};
    if (st == FSDP_OK) st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){0});
    if (st == FSDP_OK) {
        st = fsdp_test_adam_add_model(ctx, &check, ref_model, l.m);
        fsdp_status r = fsdp_release_full_params(ctx, sh);
        if (st == FSDP_OK) st = r;
    }
    char why[256];
    if (st == FSDP_OK && !fsdp_test_adam_ok(&check, why, sizeof why))
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "(%d, %d) parameters after %d steps: %s", c->dp,
                       c->tp, STEPS, why);
    if (st == FSDP_OK && fsdp_ctx_rank(ctx) == 0) c->check = check;
    fsdp_tensor_free(lt);
    fsdp_tensor_free(dlogits);
    fsdp_tensor_free(tok);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    llama_tp_free(&l);
    return st;
}

/* Runs each case against the single-rank run of its vocabulary. */
static void run_layouts(layout_case *cases, size_t n, int64_t vocab) {
    fsdp_llama_config cfg = CFG;
    if (vocab) cfg.vocab_size = vocab;
    ref_model = reference_run(&cfg, false);
    fsdp_module *nudged = reference_run(&cfg, true);
    FSDP_TEST_OK(fsdp_test_param_noise(fsdp_test_ctx(), ref_model, nudged, NOISE_Q, &ref_noise));
    fsdp_module_free(nudged);
    printf("\n  vocab %lld: the reference's rounding noise (quantile %g of |ref - nudged|) %.3g; "
           "parameters within %.3g, or %.3g for at most %d elements",
           (long long)cfg.vocab_size, NOISE_Q, ref_noise, NOISE_K * ref_noise,
           2.0 * LR * fsdp_test_adam_max_move(0.9, 0.999, STEPS), MAX_EXCEPTIONS);
    for (size_t i = 0; i < n; i++) {
        layout_case *c = &cases[i];
        c->vocab = vocab;
        fsdp_status st = fsdp_test_run_world(c->dp * c->tp, 0, layout_rank, c);
        if (st != FSDP_OK) fprintf(stderr, "\n  layout (dp %d, tp %d)", c->dp, c->tp);
        FSDP_TEST_OK(st);
        if (!hosts_rank0(c->dp * c->tp)) continue;
        printf("\n  (dp %d, tp %d), vocab %lld%s: losses", c->dp, c->tp, (long long)cfg.vocab_size,
               c->plain_loss ? ", lm_head Replicate, plain loss" : "");
        for (int s = 0; s < STEPS; s++) printf(" %.8f (one rank %.8f)", c->loss[s], ref_loss[s]);
        printf("; max relative loss difference %.3g; parameters after %d steps: max abs "
               "difference %.3g (%.2g of the bound), %lld elements beyond it",
               c->max_rel, STEPS, c->check.max_abs, c->check.max_abs / c->check.bulk,
               (long long)c->check.exceptions);
    }
    fsdp_module_free(ref_model);
    ref_model = NULL;
}

static void test_layouts(void) {
    layout_case cases[] = {
        {.dp = 1, .tp = 1}, {.dp = 2, .tp = 1},
        {.dp = 1, .tp = 2}, {.dp = 2, .tp = 2, .count = true},
        {.dp = 1, .tp = 4}, {.dp = 2, .tp = 2, .plain_loss = true},
    };
    run_layouts(cases, sizeof cases / sizeof cases[0], 0);
}

/* A vocabulary of 62: 31 + 31 rows at tp 2, 16 + 16 + 16 + 14 at tp 4 (torch.chunk). */
static void test_layouts_uneven_vocab(void) {
    layout_case cases[] = {{.dp = 2, .tp = 2}, {.dp = 1, .tp = 4}};
    run_layouts(cases, sizeof cases / sizeof cases[0], 62);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"embedding_rowwise", test_embedding_rowwise},
        {"loss_parallel", test_loss_parallel},
        {"plan_refuses", test_plan_refuses},
        {"uneven_sequence", test_uneven_sequence},
        {"layouts", test_layouts},
        {"layouts_uneven_vocab", test_layouts_uneven_vocab},
    };
    return fsdp_test_run(argc, argv, "llama_2d", cases, sizeof cases / sizeof cases[0]);
}

/* test_tp.c: tensor parallelism on 2, 3 and 4 ranks against the same model on one rank. The seed
 * tests of PyTorch's test_parallelize_api.py, ported: each compares parameters before, the forward
 * output, every parameter gradient and the parameters after one SGD step (lr 0.25), and pins
 * the collectives of parallelize, forward, backward and the step per op (the counts were
 * cross-checked against PyTorch 2.x CommDebugMode on 4 gloo ranks, tools/tp_comm_counts.py).
 * Then: input gradients through Colwise -> Rowwise, SequenceParallel with sharded rows (the
 * tensor-parallel half of REFERENCE.md section 5), DTensor hand-over between styles, plan
 * errors (device tensors: test_tp_device, bitwise against these CPU runs). Every
 * rank builds the reference itself, so the bodies need no shared memory. The seed scenarios and the
 * chains run on 2, 3 (uneven chunks) and 4 ranks; under MPI each runs at the job's size. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define WORLD 4
#define SEED  5

/* The world sizes the seed scenarios and the chains run on. */
static const int sizes[] = {2, 3, 4};
#define N_SIZES ((int)(sizeof sizes / sizeof sizes[0]))

/* ---- helpers ---- */

static int world_size(const fsdp_ctx *ctx) {
    return fsdp_world_size(fsdp_ctx_world(ctx));
}

/* A 1-d mesh "tp" over the whole world. */
static fsdp_status make_mesh(fsdp_ctx *ctx, fsdp_mesh **mesh) {
    return fsdp_mesh_create(ctx, 1, (int[]){world_size(ctx)}, (const char *[]){"tp"}, mesh);
}

/* A tensor of the given shape with values uniform in [0, 1) from `stream` (like torch.rand). */
static fsdp_status rand_tensor(fsdp_ctx *ctx, int ndim, const int64_t *shape, uint64_t stream,
                               fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, shape, out));
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = 0.0f, .b = 1.0f};
    return fsdp_init_tensor(ctx, *out, &init, 99, stream);
}

/* out = the columns [off, off + len) of a (rows, cols) tensor, or its rows when by_rows. */
static fsdp_status chunk_of(fsdp_ctx *ctx, const fsdp_tensor *t, bool by_rows, int rank,
                            fsdp_tensor **out) {
    int64_t rows = fsdp_tensor_dim(t, 0), cols = fsdp_tensor_dim(t, 1), off, len;
    fsdp_chunk_range(by_rows ? rows : cols, world_size(ctx), rank, &off, &len);
    int64_t shape[2] = {by_rows ? len : rows, by_rows ? cols : len};
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, out));
    const float *s = fsdp_tensor_f32(t);
    float *d = fsdp_tensor_f32(*out);
    for (int64_t r = 0; r < shape[0]; r++)
        for (int64_t c = 0; c < shape[1]; c++)
            d[r * shape[1] + c] = by_rows ? s[(off + r) * cols + c] : s[r * cols + off + c];
    return FSDP_OK;
}

/* The bound of every comparison with the single-rank model: rtol 1e-5 + atol 1e-6 (values of
 * order 1). TP splits MLPModule's sums (at most 16 terms; batch rows up to 12 for the weight
 * gradients), adds the halves after, and SGD moves parameters by lr times gradients so
 * computed: a few u of order-1 values, the random-walk estimate sqrt(16 x 4 / 3) u = 2.8e-7
 * (tests/numerics.h) at most. Seen at most 0.052 of the bound under the Haswell, Sandybridge
 * and Prescott kernels. */
typedef struct param_cmp {
    fsdp_module *tp;
    bool grad;
    double rtol, atol;
    const char *stage;
} param_cmp;

/* Compares one reference parameter with the gathered TP parameter of the same name. */
static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    const param_cmp *c = user;
    fsdp_param *q = fsdp_module_get_param(c->tp, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "the TP model has no parameter '%s'", name);
    fsdp_tensor *full;
    FSDP_TRY(fsdp_param_full_tensor(ctx, q, c->grad, &full));
    char what[128];
    snprintf(what, sizeof what, "%s %s%s", c->stage, name, c->grad ? ".grad" : "");
    fsdp_status st = fsdp_test_rank_close(
        ctx, what, full, c->grad ? fsdp_param_grad(p) : fsdp_param_data(p), c->rtol, c->atol, NULL);
    fsdp_tensor_free(full);
    return st;
}

static fsdp_status compare_params(fsdp_ctx *ctx, fsdp_module *ref, fsdp_module *tp, bool grad,
                                  double tol, const char *stage) {
    param_cmp c = {tp, grad, tol, tol * 0.1, stage};
    return fsdp_module_visit_params(ctx, ref, compare_param, &c);
}

/* Collectives of one phase on the tp group, by op. */
static int64_t calls(fsdp_ctx *ctx, fsdp_comm_op op, fsdp_comm_phase phase) {
    fsdp_comm_filter f = {.op = op, .group = "tp", .phase = phase};
    return fsdp_comm_debug_query(ctx, &f).calls;
}

/* What one scenario must communicate: calls per op in forward and backward (index by
 * fsdp_comm_op), broadcasts made by parallelize. Anything not listed must be zero. */
typedef struct want_comm {
    int parallelize_broadcasts;
    int fwd[FSDP_COMM_OP_COUNT];
    int bwd[FSDP_COMM_OP_COUNT];
} want_comm;

/* Every op's calls on tp in the phase are want[op], and the phase's calls over every group
 * and op (barriers included) total their sum: nothing else communicated. */
static fsdp_status check_phase(fsdp_ctx *ctx, const int *want, fsdp_comm_phase phase,
                               const char *what) {
    int64_t total = 0;
    for (int op = FSDP_COMM_ALL_GATHER; op < FSDP_COMM_BARRIER; op++) {
        int64_t got = calls(ctx, (fsdp_comm_op)op, phase);
        FSDP_RANK_CHECK(ctx, got == want[op], "%s: %lld %s in %s, want %d", what, (long long)got,
                        fsdp_comm_op_to_string((fsdp_comm_op)op), fsdp_comm_phase_to_string(phase),
                        want[op]);
        total += want[op];
    }
    fsdp_comm_filter any = {.phase = phase};
    int64_t all = fsdp_comm_debug_query(ctx, &any).calls;
    FSDP_RANK_CHECK(ctx, all == total,
                    "%s: %lld collectives in %s over all groups and ops, want %lld (on tp)", what,
                    (long long)all, fsdp_comm_phase_to_string(phase), (long long)total);
    return FSDP_OK;
}

/* ---- the seed's _compare_module ---- */

typedef struct scenario {
    const char *name;
    fsdp_status (*build)(fsdp_ctx *ctx, fsdp_module **out);
    int n_plan;
    fsdp_tp_plan_entry plan[2]; /* n_plan 0: apply `style` to the root */
    fsdp_tp_style style;
    int64_t inp_rows, inp_cols;
    bool rowwise_input; /* the TP model gets this rank's chunk of the input's last dim */
    want_comm comm;
} scenario;

static fsdp_status linear_16_10(fsdp_ctx *ctx, fsdp_module **out) {
    return fsdp_linear_create(ctx, 16, 10, true, out);
}
static fsdp_status linear_10_16(fsdp_ctx *ctx, fsdp_module **out) {
    return fsdp_linear_create(ctx, 10, 16, true, out);
}
static fsdp_status mlp_stacked_2(fsdp_ctx *ctx, fsdp_module **out) {
    return fsdp_model_mlp_stacked(ctx, 2, out);
}

static fsdp_status build_pair(fsdp_ctx *ctx, const scenario *s, fsdp_module **ref,
                              fsdp_module **tp) {
    FSDP_TRY(s->build(ctx, ref));
    FSDP_TRY(s->build(ctx, tp));
    FSDP_TRY(fsdp_module_reset_parameters(ctx, *ref, SEED));
    return fsdp_module_reset_parameters(ctx, *tp, SEED); /* deepcopy(model) */
}

static fsdp_status compare_module_rank(fsdp_ctx *ctx, int rank, void *user) {
    const scenario *s = user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *ref = NULL, *tp = NULL;
    fsdp_optimizer *ref_opt = NULL, *tp_opt = NULL;
    fsdp_tensor *inp = NULL, *tp_inp = NULL, *dref = NULL, *dtp = NULL, *out_full = NULL;
    const fsdp_tensor *ref_out = NULL, *tp_out = NULL;
    fsdp_status st = make_mesh(ctx, &mesh);
    if (st == FSDP_OK) st = build_pair(ctx, s, &ref, &tp);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK)
        st = s->n_plan ? fsdp_tp_parallelize(ctx, tp, mesh, s->n_plan, s->plan, NULL)
                       : fsdp_tp_apply(ctx, tp, mesh, &s->style, NULL);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        fsdp_comm_count b = fsdp_comm_debug_count(ctx, FSDP_COMM_BROADCAST, "tp");
        FSDP_RANK_CHECK(ctx,
                        b.calls == s->comm.parallelize_broadcasts &&
                            fsdp_comm_debug_total(ctx).calls == b.calls,
                        "%s: parallelize made %lld collectives (%lld broadcasts), want %d "
                        "broadcasts",
                        s->name, (long long)fsdp_comm_debug_total(ctx).calls, (long long)b.calls,
                        s->comm.parallelize_broadcasts);
    }
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, ref, &(fsdp_sgd_options){.lr = 0.25}, &ref_opt);
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, tp, &(fsdp_sgd_options){.lr = 0.25}, &tp_opt);
    /* Parameters start equal: distribution only moves values. */
    if (st == FSDP_OK) st = compare_params(ctx, ref, tp, false, 0.0, "before");
    if (st == FSDP_OK) st = rand_tensor(ctx, 2, (int64_t[]){s->inp_rows, s->inp_cols}, 0, &inp);
    if (st == FSDP_OK && s->rowwise_input) st = chunk_of(ctx, inp, false, rank, &tp_inp);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, ref, inp, &ref_out);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, tp, tp_inp ? tp_inp : inp, &tp_out);
    if (st == FSDP_OK) st = fsdp_test_rank_close(ctx, s->name, tp_out, ref_out, 1e-5, 1e-6, NULL);
    /* output.sum().backward(); the input needs no gradient. */
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, ref_out, &dref);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dref, 1.0f);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, tp_out, &dtp);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dtp, 1.0f);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, ref, dref, NULL);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, tp, dtp, NULL);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) st = check_phase(ctx, s->comm.fwd, FSDP_COMM_PHASE_FORWARD, s->name);
    if (st == FSDP_OK) st = check_phase(ctx, s->comm.bwd, FSDP_COMM_PHASE_BACKWARD, s->name);
    if (st == FSDP_OK) st = compare_params(ctx, ref, tp, true, 1e-5, "gradient");
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, ref_opt);
    if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, tp_opt);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 0, "%s: the SGD step communicated",
                        s->name);
    if (st == FSDP_OK) st = compare_params(ctx, ref, tp, false, 1e-5, "after step");
    fsdp_tensor_free(out_full);
    fsdp_tensor_free(inp);
    fsdp_tensor_free(tp_inp);
    fsdp_tensor_free(dref);
    fsdp_tensor_free(dtp);
    fsdp_optimizer_free(ref_opt);
    fsdp_optimizer_free(tp_opt);
    fsdp_module_free(ref);
    fsdp_module_free(tp);
    fsdp_mesh_free(mesh);
    return st;
}

static void run_scenario(const scenario *s) {
    for (int i = 0; i < N_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(sizes[i], 0, compare_module_rank, (void *)s));
}

/* RowwiseParallel() on Linear(16, 10), input (9, 16) chunked along its last dim. Forward: the
 * output Partial -> Replicate is one all_reduce. Backward: the Replicate output gradient is
 * what the Partial output needs (no collective) and the bias gradient is taken from it, once;
 * the input needs no gradient. Parallelize: weight Shard(1) and bias Replicate, one broadcast
 * each from rank 0 (PyTorch: a scatter and a broadcast). */
static void test_linear_row_wise_parallel(void) {
    scenario s = {.name = "linear_row_wise_parallel",
                  .build = linear_16_10,
                  .style = FSDP_ROWWISE(),
                  .inp_rows = 9,
                  .inp_cols = 16,
                  .rowwise_input = true,
                  .comm = {.parallelize_broadcasts = 2, .fwd = {[FSDP_COMM_ALL_REDUCE] = 1}}};
    run_scenario(&s);
}

/* ColwiseParallel(output_layouts=Replicate()) on Linear(10, 16), input (8, 10). Forward: the
 * Shard(-1) output -> Replicate is one all_gather. Backward: Replicate -> Shard(-1) is a
 * local chunk, and the input needs no gradient, so nothing. Parallelize: weight and bias
 * Shard(0), one broadcast each. */
static void test_linear_col_wise_parallel(void) {
    scenario s = {.name = "linear_col_wise_parallel",
                  .build = linear_10_16,
                  .style = FSDP_COLWISE(.output_layouts = FSDP_REPLICATE),
                  .inp_rows = 8,
                  .inp_cols = 10,
                  .comm = {.parallelize_broadcasts = 2, .fwd = {[FSDP_COMM_ALL_GATHER] = 1}}};
    run_scenario(&s);
}

/* MLPModule with "net*" -> ColwiseParallel(output_layouts=Replicate()): net1 and net2 (not
 * relu). Forward: each Linear's Shard(-1) -> Replicate output, two all_gathers. Backward:
 * net2's input gradient is Partial (a sum over its sharded output features) and goes back to
 * Replicate, one all_reduce; net1's input needs none. Parallelize: 4 parameters, 4
 * broadcasts. The `?` and `[1-2]` keys below match the same two modules. */
static scenario mlp_colwise(const char *name, const char *key) {
    return (scenario){.name = name,
                      .build = fsdp_model_mlp_module,
                      .n_plan = 1,
                      .plan = {{key, FSDP_COLWISE(.output_layouts = FSDP_REPLICATE)}},
                      .inp_rows = 12,
                      .inp_cols = 10,
                      .comm = {.parallelize_broadcasts = 4,
                               .fwd = {[FSDP_COMM_ALL_GATHER] = 2},
                               .bwd = {[FSDP_COMM_ALL_REDUCE] = 1}}};
}

static void test_parallelize_module_with_star(void) {
    scenario s = mlp_colwise("parallelize_module_with_star", "net*");
    run_scenario(&s);
}

static void test_parallelize_module_with_question(void) {
    scenario s = mlp_colwise("parallelize_module_with_question", "net?");
    run_scenario(&s);
}

static void test_parallelize_module_with_digit(void) {
    scenario s = mlp_colwise("parallelize_module_with_digit", "net[1-2]");
    run_scenario(&s);
}

/* MLPStacked(2) with "layers.*.net[1]" -> ColwiseParallel() and "layers.*.net[2]" ->
 * RowwiseParallel(): per layer the Shard(-1) hand-over is free and net2's Partial output ->
 * Replicate is one all_reduce (2 in forward). Backward: layer 1's net1 input gradient is
 * Partial -> Replicate, one all_reduce; layer 0's net1 input (the model input) needs none.
 * Parallelize: 8 parameters, 8 broadcasts (PyTorch: 6 scatters, 2 broadcasts). */
static void test_parallelize_module_multi_wildcard(void) {
    scenario s = {
        .name = "parallelize_module_multi_wildcard",
        .build = mlp_stacked_2,
        .n_plan = 2,
        .plan = {{"layers.*.net[1]", FSDP_COLWISE()}, {"layers.*.net[2]", FSDP_ROWWISE()}},
        .inp_rows = 12,
        .inp_cols = 10,
        .comm = {.parallelize_broadcasts = 8,
                 .fwd = {[FSDP_COMM_ALL_REDUCE] = 2},
                 .bwd = {[FSDP_COMM_ALL_REDUCE] = 1}}};
    run_scenario(&s);
}

/* ---- PrepareModuleInput / PrepareModuleOutput on an identity module ---- */

/* PrepareModuleInput(Shard(0) -> Replicate): each rank's (5, 7) input is its shard of a
 * (5 W, 7) tensor; the module gets the gathered DTensor (one all_gather), and redistributing
 * its output back to Shard(0) (a local chunk, no collective) gives each rank its input. */
static fsdp_status prepare_input_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *m = NULL;
    fsdp_tensor *inp = NULL;
    fsdp_dtensor *back = NULL;
    const fsdp_tensor *out = NULL;
    fsdp_status st = make_mesh(ctx, &mesh);
    if (st == FSDP_OK) st = fsdp_identity_create(ctx, &m);
    if (st == FSDP_OK)
        st = fsdp_tp_apply(ctx, m, mesh,
                           &FSDP_PREPARE_INPUT(.input_layouts = FSDP_SHARD(0),
                                               .desired_input_layouts = FSDP_REPLICATE),
                           NULL);
    if (st == FSDP_OK) st = rand_tensor(ctx, 2, (int64_t[]){5, 7}, 10 + (uint64_t)rank, &inp);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, inp, &out);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        FSDP_RANK_CHECK(ctx, fsdp_dtensor_of(out) != NULL,
                        "use_local_output defaults to no: the module gets a DTensor");
        FSDP_RANK_CHECK(ctx, fsdp_tensor_dim(out, 0) == 5 * world_size(ctx), "gathered rows: %lld",
                        (long long)fsdp_tensor_dim(out, 0));
        FSDP_RANK_CHECK(ctx,
                        fsdp_comm_debug_total(ctx).calls == 1 &&
                            calls(ctx, FSDP_COMM_ALL_GATHER, FSDP_COMM_PHASE_FORWARD) == 1,
                        "want one all_gather");
        st = fsdp_comm_debug_begin(ctx);
    }
    if (st == FSDP_OK)
        st = fsdp_dtensor_redistribute(ctx, fsdp_dtensor_of(out), &FSDP_SHARD(0), &back);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 0,
                        "Replicate -> Shard(0) is a local chunk");
    if (st == FSDP_OK)
        st = fsdp_test_rank_close(ctx, "output", fsdp_dtensor_local(back), inp, 0, 0, NULL);
    fsdp_dtensor_free(back);
    fsdp_tensor_free(inp);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_prepare_module_input(void) {
    for (int i = 0; i < N_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(sizes[i], 0, prepare_input_rank, NULL));
}

/* PrepareModuleOutput(Replicate -> Shard(0)): a Replicate DTensor of (16, 7) goes through;
 * the output is this rank's torch.chunk of its rows ((4, 7) on 4 ranks) as a local tensor,
 * with no collective. */
static fsdp_status prepare_output_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    (void)user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *m = NULL;
    fsdp_tensor *inp = NULL;
    fsdp_dtensor *dt = NULL, *want = NULL;
    const fsdp_tensor *out = NULL;
    fsdp_status st = make_mesh(ctx, &mesh);
    if (st == FSDP_OK) st = fsdp_identity_create(ctx, &m);
    if (st == FSDP_OK)
        st = fsdp_tp_apply(ctx, m, mesh,
                           &FSDP_PREPARE_OUTPUT(.output_layouts = FSDP_REPLICATE,
                                                .desired_output_layouts = FSDP_SHARD(0)),
                           NULL);
    if (st == FSDP_OK) st = rand_tensor(ctx, 2, (int64_t[]){16, 7}, 15, &inp);
    if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, inp, mesh, &FSDP_REPLICATE, NULL, &dt);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, fsdp_dtensor_local(dt), &out);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) {
        FSDP_RANK_CHECK(ctx, fsdp_comm_debug_total(ctx).calls == 0, "no collective expected");
        FSDP_RANK_CHECK(ctx, fsdp_dtensor_of(out) == NULL,
                        "use_local_output defaults to yes: a plain tensor");
        st = fsdp_dtensor_redistribute(ctx, dt, &FSDP_SHARD(0), &want);
    }
    if (st == FSDP_OK)
        st = fsdp_test_rank_close(ctx, "output", out, fsdp_dtensor_local(want), 0, 0, NULL);
    fsdp_dtensor_free(dt);
    fsdp_dtensor_free(want);
    fsdp_tensor_free(inp);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_prepare_module_output(void) {
    for (int i = 0; i < N_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(sizes[i], 0, prepare_output_rank, NULL));
}

/* ---- beyond the seed: input gradients, sequence parallel, DTensor hand-over ---- */

typedef struct chain_case {
    bool sequence_parallel; /* RMSNorm + MLP with rows sharded (REFERENCE.md section 5) */
    bool dtensor_handover;  /* net1 hands net2 a DTensor instead of a local tensor */
} chain_case;

/* Model: [RMSNorm(10)] then MLPModule (or, for the hand-over, Linear(10, 16) then
 * Linear(16, 10): a DTensor reaches only the module it is handed to, so nothing may sit
 * between the two styles); input (8, 10) ((9, 10) on 3 ranks). With sequence_parallel the input
 * rows are sharded (Shard(0)): norm under SequenceParallel(Shard(0)), net1 Colwise(input Shard(0)),
 * net2 Rowwise(output Shard(0)); the output is this rank's rows. The model input's gradient
 * is asked for, so every adjoint runs. */
static fsdp_status chain_rank(fsdp_ctx *ctx, int rank, void *user) {
    const chain_case *c = user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *models[2] = {NULL, NULL};
    fsdp_tensor *inp = NULL, *tp_inp = NULL, *dref = NULL, *dtp = NULL, *want = NULL,
                *want_din = NULL;
    const fsdp_tensor *ref_out = NULL, *tp_out = NULL, *ref_din = NULL, *tp_din = NULL;
    fsdp_status st = make_mesh(ctx, &mesh);
    for (int i = 0; st == FSDP_OK && i < 2; i++) {
        fsdp_module *mlp = NULL, *norm = NULL, *l1 = NULL, *l2 = NULL;
        st = fsdp_sequential_create(ctx, &models[i]);
        if (st == FSDP_OK && c->sequence_parallel) st = fsdp_rmsnorm_create(ctx, 10, 1e-6f, &norm);
        if (st == FSDP_OK && norm) st = fsdp_sequential_append(ctx, models[i], norm);
        if (c->dtensor_handover) { /* two Linears back to back: nothing between the styles */
            if (st == FSDP_OK) st = fsdp_linear_create(ctx, 10, 16, true, &l1);
            if (st == FSDP_OK) st = fsdp_sequential_append(ctx, models[i], l1);
            if (st == FSDP_OK) st = fsdp_linear_create(ctx, 16, 10, true, &l2);
            if (st == FSDP_OK) st = fsdp_sequential_append(ctx, models[i], l2);
        } else {
            if (st == FSDP_OK) st = fsdp_model_mlp_module(ctx, &mlp);
            if (st == FSDP_OK) st = fsdp_sequential_append(ctx, models[i], mlp);
        }
        if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, models[i], SEED);
    }
    fsdp_module *ref = models[0], *tp = models[1];
    if (st == FSDP_OK && c->sequence_parallel) {
        fsdp_tp_plan_entry plan[] = {
            {"0", FSDP_SEQUENCE_PARALLEL(.input_layouts = FSDP_SHARD(0),
                                         .use_local_output = FSDP_TP_YES)},
            {"1.net1", FSDP_COLWISE(.input_layouts = FSDP_SHARD(0))},
            {"1.net2", FSDP_ROWWISE(.output_layouts = FSDP_SHARD(0))},
        };
        st = fsdp_tp_parallelize(ctx, tp, mesh, 3, plan, NULL);
    } else if (st == FSDP_OK) {
        /* With a DTensor hand-over, net2's own input_layouts (Replicate, deliberately wrong)
         * must be ignored: the DTensor's Shard(-1) is used. */
        fsdp_tp_plan_entry plan[] = {
            {c->dtensor_handover ? "0" : "0.net1",
             c->dtensor_handover ? FSDP_COLWISE(.use_local_output = FSDP_TP_NO) : FSDP_COLWISE()},
            {c->dtensor_handover ? "1" : "0.net2",
             c->dtensor_handover ? FSDP_ROWWISE(.input_layouts = FSDP_REPLICATE) : FSDP_ROWWISE()},
        };
        st = fsdp_tp_parallelize(ctx, tp, mesh, 2, plan, NULL);
    }
    /* Rows: 8, or on 3 ranks 9: a sharded input's global shape is its local shape times the
     * ranks (DTensor.from_local without a shape), so the rows split evenly. */
    const int64_t rows = 8 % world_size(ctx) == 0 ? 8 : 3 * world_size(ctx);
    if (st == FSDP_OK) st = rand_tensor(ctx, 2, (int64_t[]){rows, 10}, 3, &inp);
    if (st == FSDP_OK)
        st = c->sequence_parallel ? chunk_of(ctx, inp, true, rank, &tp_inp) : FSDP_OK;
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, ref, inp, &ref_out);
    if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, tp, tp_inp ? tp_inp : inp, &tp_out);
    if (st == FSDP_OK && c->sequence_parallel) st = chunk_of(ctx, ref_out, true, rank, &want);
    if (st == FSDP_OK)
        st = fsdp_test_rank_close(ctx, "output", tp_out, want ? want : ref_out, 1e-5, 1e-6, NULL);
    /* A loss whose gradient differs per element: d(out) = out. */
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, ref_out, &dref);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, dref, ref_out);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, tp_out, &dtp);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, dtp, tp_out);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, ref, dref, &ref_din);
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, tp, dtp, &tp_din);
    if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK && c->sequence_parallel) st = chunk_of(ctx, ref_din, true, rank, &want_din);
    if (st == FSDP_OK)
        st = fsdp_test_rank_close(ctx, "input gradient", tp_din, want_din ? want_din : ref_din,
                                  1e-5, 1e-6, NULL);
    if (st == FSDP_OK) st = compare_params(ctx, ref, tp, true, 1e-5, "gradient");
    if (st == FSDP_OK) {
        want_comm w = {0};
        if (c->sequence_parallel) {
            /* REFERENCE.md section 5, the tp rows: forward, net1 input Shard(0) -> Replicate
             * (all_gather) and net2 output Partial -> Shard(0) (reduce_scatter); backward,
             * their adjoints (all_gather; net1's Partial input gradient -> Shard(0),
             * reduce_scatter) and the norm weight's Partial gradient (all_reduce). */
            w.fwd[FSDP_COMM_ALL_GATHER] = w.fwd[FSDP_COMM_REDUCE_SCATTER] = 1;
            w.bwd[FSDP_COMM_ALL_GATHER] = w.bwd[FSDP_COMM_REDUCE_SCATTER] = 1;
            w.bwd[FSDP_COMM_ALL_REDUCE] = 1;
        } else {
            /* net2's output Partial -> Replicate; net1's input gradient Partial -> Replicate.
             * The hand-over between them is free either way. */
            w.fwd[FSDP_COMM_ALL_REDUCE] = 1;
            w.bwd[FSDP_COMM_ALL_REDUCE] = 1;
        }
        st = check_phase(ctx, w.fwd, FSDP_COMM_PHASE_FORWARD, "chain");
        if (st == FSDP_OK) st = check_phase(ctx, w.bwd, FSDP_COMM_PHASE_BACKWARD, "chain");
    }
    if (st == FSDP_OK && c->sequence_parallel) {
        const fsdp_dtensor_spec *spec =
            fsdp_param_dtensor_spec(fsdp_module_get_param(tp, "0.weight"));
        FSDP_RANK_CHECK(ctx, spec && spec->placements[0].kind == FSDP_PLACEMENT_REPLICATE,
                        "the norm weight is Replicate");
    }
    fsdp_tensor_free(inp);
    fsdp_tensor_free(tp_inp);
    fsdp_tensor_free(dref);
    fsdp_tensor_free(dtp);
    fsdp_tensor_free(want);
    fsdp_tensor_free(want_din);
    fsdp_module_free(ref);
    fsdp_module_free(tp);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_colwise_rowwise_input_grad(void) {
    chain_case c = {false, false};
    for (int i = 0; i < N_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(sizes[i], 0, chain_rank, &c));
}

static void test_dtensor_handover(void) {
    chain_case c = {false, true};
    for (int i = 0; i < N_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(sizes[i], 0, chain_rank, &c));
}

static void test_sequence_parallel(void) {
    chain_case c = {true, false};
    for (int i = 0; i < N_SIZES; i++)
        FSDP_TEST_OK(fsdp_test_run_world(sizes[i], 0, chain_rank, &c));
}

/* ---- plan errors ---- */

static fsdp_status plan_errors_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    (void)user;
    fsdp_mesh *mesh = NULL, *mesh2d = NULL;
    fsdp_module *m = NULL, *stacked = NULL;
    fsdp_status st = make_mesh(ctx, &mesh);
    if (st == FSDP_OK) st = fsdp_model_mlp_module(ctx, &m);
    if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, 2, &stacked);
    if (st == FSDP_OK) {
        fsdp_tp_plan_entry plan[] = {{"net1", FSDP_COLWISE()}, {"net3", FSDP_ROWWISE()}};
        fsdp_status bad = fsdp_tp_parallelize(ctx, m, mesh, 2, plan, NULL);
        const char *e = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx,
                        bad == FSDP_ERR_INVALID_ARGUMENT && strstr(e, "'net3'") &&
                            strstr(e, "net1, relu, net2"),
                        "unmatched key: %s", e);
        /* Keys are all matched before anything is applied: net1 is untouched. */
        FSDP_RANK_CHECK(ctx, !fsdp_param_dtensor_spec(fsdp_module_get_param(m, "net1.weight")),
                        "net1 was parallelized although the plan failed");
        fsdp_tp_plan_entry deep[] = {{"layers.*.net9", FSDP_COLWISE()}};
        bad = fsdp_tp_parallelize(ctx, stacked, mesh, 1, deep, NULL);
        e = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx,
                        bad == FSDP_ERR_INVALID_ARGUMENT && strstr(e, "'layers.*.net9'") &&
                            strstr(e, "'net9'") && strstr(e, "layers.0"),
                        "unmatched deep key: %s", e);
        fsdp_tp_plan_entry twice[] = {{"net1", FSDP_COLWISE()}, {"net?", FSDP_ROWWISE()}};
        bad = fsdp_tp_parallelize(ctx, m, mesh, 2, twice, NULL);
        e = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(e, "both match"),
                        "overlapping keys: %s", e);
        fsdp_tp_plan_entry relu[] = {{"relu", FSDP_COLWISE()}};
        bad = fsdp_tp_parallelize(ctx, m, mesh, 1, relu, NULL);
        e = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(e, "ReLU"),
                        "Colwise on ReLU: %s", e);
        fsdp_tp_plan_entry half[] = {{"net1", FSDP_PREPARE_INPUT(.input_layouts = FSDP_SHARD(0))}};
        bad = fsdp_tp_parallelize(ctx, m, mesh, 1, half, NULL);
        e = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_INVALID_ARGUMENT && strstr(e, "desired_input_layouts"),
                        "PrepareModuleInput without desired layouts: %s", e);
    }
    if (st == FSDP_OK)
        st = fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &mesh2d);
    if (st == FSDP_OK) {
        fsdp_status bad =
            fsdp_tp_apply(ctx, fsdp_module_find(m, "net1"), mesh2d, &FSDP_COLWISE(), NULL);
        FSDP_RANK_CHECK(ctx,
                        bad == FSDP_ERR_INVALID_ARGUMENT && strstr(fsdp_last_error(ctx), "1-d"),
                        "2-d mesh: %s", fsdp_last_error(ctx));
        /* Applying twice is refused. */
        st = fsdp_tp_apply(ctx, fsdp_module_find(m, "net1"), mesh, &FSDP_COLWISE(), NULL);
        if (st == FSDP_OK) {
            bad = fsdp_tp_apply(ctx, fsdp_module_find(m, "net1"), mesh, &FSDP_COLWISE(), NULL);
            FSDP_RANK_CHECK(ctx, bad == FSDP_ERR_STATE && strstr(fsdp_last_error(ctx), "one style"),
                            "second style: %s", fsdp_last_error(ctx));
        }
    }
    fsdp_module_free(m);
    fsdp_module_free(stacked);
    fsdp_mesh_free(mesh2d);
    fsdp_mesh_free(mesh);
    return st;
}

static void test_plan_errors(void) {
    FSDP_TEST_OK(fsdp_test_run_world(WORLD, 0, plan_errors_rank, NULL));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"linear_row_wise_parallel", test_linear_row_wise_parallel},
        {"linear_col_wise_parallel", test_linear_col_wise_parallel},
        {"prepare_module_input", test_prepare_module_input},
        {"prepare_module_output", test_prepare_module_output},
        {"parallelize_module_with_star", test_parallelize_module_with_star},
        {"parallelize_module_with_question", test_parallelize_module_with_question},
        {"parallelize_module_with_digit", test_parallelize_module_with_digit},
        {"parallelize_module_multi_wildcard", test_parallelize_module_multi_wildcard},
        {"colwise_rowwise_input_grad", test_colwise_rowwise_input_grad},
        {"dtensor_handover", test_dtensor_handover},
        {"sequence_parallel", test_sequence_parallel},
        {"plan_errors", test_plan_errors},
    };
    return fsdp_test_run(argc, argv, "tp", cases, sizeof cases / sizeof cases[0]);
}

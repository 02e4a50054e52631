/* test_tp_block_sum.c: one reduction per PrepareModuleInput'd block (src/tp/block_sum.c). A fork
 * module, out = a(x) + b(x) with two Linear children, runs on 2, 3 and 4 ranks under
 * PrepareModuleInput (Shard(1) -> Replicate, or Replicate -> Replicate) with ColwiseParallel
 * (output Replicate) on its children, against the same fork on one rank: its output, its input
 * gradient and every parameter gradient. When the fork declares a and b its input readers
 * (fsdp_nn_set_input_readers) and both are Colwise on the handle, the input gradient is reduced
 * once (Shard(1): one reduce_scatter; Replicate: one all_reduce), also with the fork
 * checkpointed (its recompute runs no post-forward hooks); otherwise (no declaration, b left
 * without a style, PrepareModuleInput's use_local_output yes) each Colwise all_reduces its own
 * gradient, as before. The backward's collectives on tp are pinned for each case. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nn/nn.h" // defines: fsdp_nn_set_input_readers

enum { B = 2, T = 12, D = 8 };

/* ---- the fork: out = a(x) + b(x), din = da + db ---- */

typedef struct fork {
    fsdp_module *a, *b;
    fsdp_tensor *out, *din; /* (B, T, D) */
} fork_t;

static void fork_free(void *impl) {
    fork_t *f = impl;
    fsdp_tensor_free(f->out);
    fsdp_tensor_free(f->din);
    free(f);
}

/* *dst = x + y, elementwise (x, y: (B, T, D), plain CPU tensors) */
static fsdp_status sum_into(fsdp_ctx *ctx, fsdp_tensor **dst, const fsdp_tensor *x,
                            const fsdp_tensor *y) {
    if (!*dst)
        FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){B, T, D}, dst));
    FSDP_RANK_CHECK(ctx, fsdp_tensor_numel(x) == B * T * D && fsdp_tensor_numel(y) == B * T * D,
                    "the fork's branches give %lld and %lld elements, want %d",
                    (long long)fsdp_tensor_numel(x), (long long)fsdp_tensor_numel(y), B * T * D);
    const float *px = fsdp_tensor_f32(x), *py = fsdp_tensor_f32(y);
    float *d = fsdp_tensor_f32(*dst);
    for (int64_t i = 0; i < B * T * D; i++) d[i] = px[i] + py[i];
    return FSDP_OK;
}

static fsdp_status fork_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    fork_t *f = fsdp_module_impl(m);
    const fsdp_tensor *ya, *yb;
    FSDP_TRY(fsdp_module_forward(ctx, f->a, in, &ya));
    FSDP_TRY(fsdp_module_forward(ctx, f->b, in, &yb));
    FSDP_TRY(sum_into(ctx, &f->out, ya, yb));
    *out = f->out;
    return FSDP_OK;
}

static fsdp_status fork_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    fork_t *f = fsdp_module_impl(m);
    const fsdp_tensor *da, *db;
    FSDP_TRY(fsdp_module_backward(ctx, f->a, dout, din ? &da : NULL));
    FSDP_TRY(fsdp_module_backward(ctx, f->b, dout, din ? &db : NULL));
    if (!din) return FSDP_OK;
    FSDP_TRY(sum_into(ctx, &f->din, da, db));
    *din = f->din;
    return FSDP_OK;
}

static const fsdp_module_ops fork_ops = {
    .kind = "Fork", .forward = fork_forward, .backward = fork_backward, .free_impl = fork_free};

static fsdp_status fork_create(fsdp_ctx *ctx, bool declare, fsdp_module **out) {
    fork_t *f = calloc(1, sizeof *f);
    if (!f) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a fork");
    FSDP_TRY(fsdp_module_create(ctx, &fork_ops, f, out));
    fsdp_status st = fsdp_linear_create(ctx, D, D, true, &f->a);
    if (st == FSDP_OK) st = fsdp_module_add_child(ctx, *out, "a", f->a);
    if (st == FSDP_OK) st = fsdp_linear_create(ctx, D, D, true, &f->b);
    if (st == FSDP_OK) st = fsdp_module_add_child(ctx, *out, "b", f->b);
    if (st == FSDP_OK && declare)
        st = fsdp_nn_set_input_readers(ctx, *out, (fsdp_module *const[]){f->a, f->b}, 2);
    return st;
}

/* ---- the cases ---- */

typedef struct block_case {
    const char *name;
    bool declare;       /* the fork declares a and b its input readers */
    bool b_plain;       /* b gets no style: a replicated Linear reading the handle */
    bool local_output;  /* PrepareModuleInput's use_local_output yes */
    bool replicate_in;  /* PrepareModuleInput's input Replicate (else Shard(1)) */
    bool checkpoint;    /* the fork checkpointed */
    bool bf16;          /* the bf16 compute policy on the TP fork */
    int reduce_scatter; /* backward, on tp */
    int all_reduce;
    int all_gather; /* backward: the recompute's */
} block_case;

/* Every compared value is a sum of at most 2 D = 16 products (input gradient: dout in [0, 1)
 * times weights of |w| <= 1/sqrt(D); output: x in [0, 1) times w, plus the bias) or of B T = 24
 * (weight gradients: dout times x), each product below 1: the sum of magnitudes is at most 24,
 * and two summation orders (TP splits the sums over ranks and adds the parts after) differ by at
 * most 2 x 24 x 2^-24 x 24 = 6.9e-5 (the worst case; the usual difference is about 1e-7). A
 * gradient that misses or repeats a rank's part is off by a whole term, of order 0.1 to 1. */
#define BOUND 6.9e-5

static fsdp_status copy_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    fsdp_param *q = fsdp_module_get_param(user, name);
    FSDP_RANK_CHECK(ctx, q, "no parameter '%s'", name);
    return fsdp_tensor_copy(ctx, fsdp_param_data(q), fsdp_param_data(p));
}

typedef struct grad_cmp {
    fsdp_module *tp;
    double *max_abs;
} grad_cmp;

static fsdp_status compare_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    const grad_cmp *g = user;
    fsdp_tensor *full;
    FSDP_TRY(fsdp_param_full_tensor(ctx, fsdp_module_get_param(g->tp, name), true, &full));
    char what[64];
    snprintf(what, sizeof what, "%s.grad", name);
    fsdp_status st =
        fsdp_test_rank_close(ctx, what, full, fsdp_param_grad(p), 0, BOUND, g->max_abs);
    fsdp_tensor_free(full);
    return st;
}

/* x (B, T, D) uniform in [0, 1) from stream, or this rank's Shard(1) chunk of it. */
static fsdp_status input(fsdp_ctx *ctx, uint64_t stream, bool chunk, int rank, int n,
                         fsdp_tensor **out) {
    fsdp_tensor *full;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){B, T, D}, &full));
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = 0.0f, .b = 1.0f};
    fsdp_status st = fsdp_init_tensor(ctx, full, &init, 7, stream);
    if (st != FSDP_OK || !chunk) {
        *out = full;
        return st;
    }
    int64_t off, len;
    fsdp_chunk_range(T, n, rank, &off, &len);
    st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){B, len, D}, out);
    for (int64_t b = 0; st == FSDP_OK && b < B; b++)
        for (int64_t t = 0; t < len; t++)
            for (int64_t d = 0; d < D; d++)
                fsdp_tensor_f32(*out)[(b * len + t) * D + d] =
                    fsdp_tensor_f32(full)[(b * T + off + t) * D + d];
    fsdp_tensor_free(full);
    return st;
}

static fsdp_status parallelize(fsdp_ctx *ctx, const block_case *c, fsdp_module *m,
                               const fsdp_mesh *mesh) {
    fsdp_tp_style prep =
        FSDP_PREPARE_INPUT(.input_layouts = c->replicate_in ? FSDP_REPLICATE : FSDP_SHARD(1),
                           .desired_input_layouts = FSDP_REPLICATE,
                           .use_local_output = c->local_output ? FSDP_TP_YES : FSDP_TP_NO);
    FSDP_TRY(fsdp_tp_apply(ctx, m, mesh, &prep, NULL));
    fsdp_tp_plan_entry plan[] = {{"a", FSDP_COLWISE(.output_layouts = FSDP_REPLICATE)},
                                 {"b", FSDP_COLWISE(.output_layouts = FSDP_REPLICATE)}};
    FSDP_TRY(fsdp_tp_parallelize(ctx, m, mesh, c->b_plain ? 1 : 2, plan, NULL));
    return c->checkpoint ? fsdp_checkpoint_wrap(ctx, m) : FSDP_OK;
}

/* *out (replaced; the old tensor is freed after) = full, or this rank's Shard(1) chunk of it
 * when chunk. */
static fsdp_status shard_of(fsdp_ctx *ctx, const fsdp_mesh *mesh, const fsdp_tensor *full,
                            bool chunk, fsdp_tensor **out) {
    fsdp_dtensor *dt = NULL, *sh = NULL;
    fsdp_tensor *res = NULL;
    fsdp_status st = fsdp_dtensor_from_local(ctx, full, mesh, &FSDP_REPLICATE, NULL, &dt);
    if (st == FSDP_OK)
        st = fsdp_dtensor_redistribute(ctx, dt, chunk ? &FSDP_SHARD(1) : &FSDP_REPLICATE, &sh);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, fsdp_dtensor_local(sh), &res);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, res, fsdp_dtensor_local(sh));
    fsdp_dtensor_free(sh);
    fsdp_dtensor_free(dt);
    if (st != FSDP_OK) {
        fsdp_tensor_free(res);
        return st;
    }
    fsdp_tensor_free(*out);
    *out = res;
    return FSDP_OK;
}

static double bf16_round(float v) { /* round to nearest even (finite values) */
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&v, &u, 4);
    return v;
}

/* The bf16 policy's input gradient of the fork without any rounding of the result: the sum over
 * both branches and every output feature of bf16(dout) bf16(w), in double. The Linears round
 * their own input gradients to bf16 (what the GPU writes) on one rank; on tp, where each rank's
 * is a Partial addend, they leave it in f32, and the block's sum and its reduction are f32: the
 * exact value to f32 summation order. */
static fsdp_status exact_bf16_grad(fsdp_ctx *ctx, fsdp_module *ref, const fsdp_tensor *dout,
                                   fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create_like(ctx, dout, out));
    const float *w[2] = {fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(ref, "a.weight"))),
                         fsdp_tensor_f32(fsdp_param_data(fsdp_module_get_param(ref, "b.weight")))};
    const float *dy = fsdp_tensor_f32(dout);
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t i = 0; i < D; i++) {
            double sum = 0.0;
            for (int k = 0; k < 2; k++)
                for (int64_t o = 0; o < D; o++)
                    sum += bf16_round(dy[r * D + o]) * bf16_round(w[k][o * D + i]);
            fsdp_tensor_f32(*out)[r * D + i] = (float)sum;
        }
    return FSDP_OK;
}

static int64_t bwd_calls(fsdp_ctx *ctx, fsdp_comm_op op) {
    fsdp_comm_filter f = {.op = op, .group = "tp", .phase = FSDP_COMM_PHASE_BACKWARD};
    return fsdp_comm_debug_query(ctx, &f).calls;
}

/* Two steps (the second checks that the decision is made again), each compared. */
static fsdp_status block_rank(fsdp_ctx *ctx, int rank, void *user) {
    const block_case *c = user;
    int n = fsdp_world_size(fsdp_ctx_world(ctx));
    fsdp_mesh *mesh = NULL;
    fsdp_module *ref = NULL, *tp = NULL;
    fsdp_tensor *x = NULL, *xs = NULL, *dout = NULL, *dref = NULL;
    double maxd = 0.0; /* the largest difference from the reference */
    fsdp_status st = fsdp_mesh_create(ctx, 1, (int[]){n}, (const char *[]){"tp"}, &mesh);
    if (st == FSDP_OK) st = fork_create(ctx, c->declare, &ref);
    if (st == FSDP_OK) st = fork_create(ctx, c->declare, &tp);
    if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, tp, copy_param, ref);
    if (st == FSDP_OK) st = parallelize(ctx, c, tp, mesh);
    if (st == FSDP_OK && c->bf16) st = fsdp_module_set_autocast(ctx, tp, FSDP_DTYPE_BF16);
    for (int step = 0; st == FSDP_OK && step < 2; step++) {
        fsdp_tensor_free(x), fsdp_tensor_free(xs), fsdp_tensor_free(dout);
        fsdp_tensor_free(dref);
        x = xs = dout = dref = NULL;
        const fsdp_tensor *y_ref, *y, *dx_ref, *dx;
        st = input(ctx, 10 + (uint64_t)step, false, rank, n, &x);
        if (st == FSDP_OK) st = input(ctx, 10 + (uint64_t)step, !c->replicate_in, rank, n, &xs);
        if (st == FSDP_OK) st = input(ctx, 20 + (uint64_t)step, false, rank, n, &dout);
        if (st == FSDP_OK) st = fsdp_module_zero_grad(ctx, ref);
        if (st == FSDP_OK) st = fsdp_module_zero_grad(ctx, tp);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, ref, x, &y_ref);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, ref, dout, &dx_ref);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, tp, xs, &y);
        if (st == FSDP_OK && !c->bf16)
            st = fsdp_test_rank_close(ctx, "output", y, y_ref, 0, BOUND, &maxd);
        if (st == FSDP_OK) st = fsdp_comm_debug_begin(ctx);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, tp, dout, &dx);
        if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
        /* the reference's input gradient (under the bf16 policy: the exact one), chunked as
         * the TP input is */
        if (st == FSDP_OK && c->bf16) st = exact_bf16_grad(ctx, ref, dout, &dref);
        if (st == FSDP_OK)
            st = shard_of(ctx, mesh, c->bf16 ? dref : dx_ref, !c->replicate_in, &dref);
        if (st == FSDP_OK)
            st = fsdp_test_rank_close(ctx, "input gradient", dx, dref, 0, BOUND, &maxd);
        if (st == FSDP_OK && !c->bf16)
            st = fsdp_module_visit_params(ctx, ref, compare_grad, &(grad_cmp){tp, &maxd});
        if (st == FSDP_OK) { /* after the values: a wrong gradient says more */
            int64_t rs = bwd_calls(ctx, FSDP_COMM_REDUCE_SCATTER),
                    ar = bwd_calls(ctx, FSDP_COMM_ALL_REDUCE),
                    ag = bwd_calls(ctx, FSDP_COMM_ALL_GATHER);
            FSDP_RANK_CHECK(ctx,
                            rs == c->reduce_scatter && ar == c->all_reduce && ag == c->all_gather,
                            "%s, step %d: backward on tp made %lld reduce_scatter, %lld all_reduce "
                            "and %lld all_gather, want %d, %d and %d",
                            c->name, step, (long long)rs, (long long)ar, (long long)ag,
                            c->reduce_scatter, c->all_reduce, c->all_gather);
        }
    }
    if (st == FSDP_OK && rank == 0)
        printf("\n    %s on %d ranks: largest difference %.2g (%.3f of the bound)", c->name, n,
               maxd, maxd / BOUND);
    fsdp_tensor_free(x), fsdp_tensor_free(xs), fsdp_tensor_free(dout);
    fsdp_tensor_free(dref);
    fsdp_module_free(tp);
    fsdp_module_free(ref);
    fsdp_mesh_free(mesh);
    return st;
}

static void run_case(const block_case *c) {
    for (int n = 2; n <= 4; n++) FSDP_TEST_OK(fsdp_test_run_world(n, 0, block_rank, (void *)c));
}

/* Both readers Colwise on the handle: the sum of their Partial gradients, reduce_scattered once. */
static void test_one_reduce_scatter(void) {
    run_case(&(block_case){"declared", .declare = true, .reduce_scatter = 1});
}

/* The same from a Replicate input: one all_reduce of the sum. */
static void test_one_all_reduce(void) {
    run_case(&(block_case){"declared, Replicate input", .declare = true, .replicate_in = true,
                           .all_reduce = 1});
}

/* The fork checkpointed: its recompute (pre-forward hooks, forward: the all_gather into the
 * fork and each reader's output all_gather again) decides the same. */
static void test_checkpointed(void) {
    run_case(&(block_case){"declared, checkpointed", .declare = true, .checkpoint = true,
                           .reduce_scatter = 1, .all_gather = 3});
}

/* b without a style reads the handle's local (Replicate) tensor and gives a whole gradient: a
 * Partial sum would count it once per rank, so each Colwise all_reduces its own (only a). */
static void test_reader_not_colwise(void) {
    run_case(&(block_case){"b not Colwise", .declare = true, .b_plain = true, .all_reduce = 1});
}

/* Under the bf16 policy the readers' Partial gradients are not rounded to bf16 before their
 * sum is reduced (rounding an addend is not rounding the value): the input gradient is the exact
 * one to f32 summation order (a rounded addend would be off by up to 2^-9 of itself, about 1e-3
 * here, far beyond BOUND). */
static void test_bf16_partial_unrounded(void) {
    run_case(
        &(block_case){"declared, bf16 policy", .declare = true, .bf16 = true, .reduce_scatter = 1});
}

/* No declaration, or no handle (use_local_output yes): each Colwise all_reduces, as before. */
static void test_undeclared(void) {
    run_case(&(block_case){"not declared", .all_reduce = 2});
}

static void test_local_output(void) {
    run_case(&(block_case){"use_local_output yes", .declare = true, .local_output = true,
                           .all_reduce = 2});
}

/* The declaration's checks. */
static void test_declaration_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *f = NULL, *g = NULL;
    FSDP_TEST_OK(fork_create(ctx, false, &f));
    FSDP_TEST_OK(fork_create(ctx, false, &g));
    fork_t *ff = fsdp_module_impl(f), *gf = fsdp_module_impl(g);
    FSDP_TEST_FAILS(fsdp_nn_set_input_readers(ctx, f, (fsdp_module *const[]){ff->a, gf->a}, 2),
                    FSDP_ERR_INVALID_ARGUMENT, "not its child");
    FSDP_TEST_FAILS(fsdp_nn_set_input_readers(ctx, f, (fsdp_module *const[]){ff->a, ff->a}, 2),
                    FSDP_ERR_INVALID_ARGUMENT, "named twice");
    FSDP_TEST_FAILS(fsdp_nn_set_input_readers(ctx, f, (fsdp_module *const[]){ff->a}, 5),
                    FSDP_ERR_INVALID_ARGUMENT, "0 to 4");
    CU_ASSERT_EQUAL(fsdp_nn_input_readers(f, NULL), 0);
    FSDP_TEST_OK(fsdp_nn_set_input_readers(ctx, f, (fsdp_module *const[]){ff->b, ff->a}, 2));
    fsdp_module *const *r;
    CU_ASSERT_EQUAL(fsdp_nn_input_readers(f, &r), 2);
    CU_ASSERT(r[0] == ff->b && r[1] == ff->a);
    fsdp_module_free(g);
    fsdp_module_free(f);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"one_reduce_scatter", test_one_reduce_scatter},
        {"one_all_reduce", test_one_all_reduce},
        {"checkpointed", test_checkpointed},
        {"reader_not_colwise", test_reader_not_colwise},
        {"bf16_partial_unrounded", test_bf16_partial_unrounded},
        {"undeclared", test_undeclared},
        {"local_output", test_local_output},
        {"declaration_errors", test_declaration_errors},
    };
    return fsdp_test_run(argc, argv, "tp_block_sum", cases, sizeof cases / sizeof cases[0]);
}

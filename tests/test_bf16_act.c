/* test_bf16_act.c: bf16 activation storage under the bf16 compute policy. The Llama MLP's SwiGLU
 * output, which down_proj rounds to bf16 anyway, is written rounded in bf16 storage and read by
 * down_proj as its bf16 copy. Checked: the kernel that writes it (the bits of swiglu_forward then
 * f32_to_bf16, on the CPU and the run's device); the tiny Llama under the policy bitwise equal to
 * a copy of the path before it (f32 SwiGLU output, rounded by down_proj), on the CPU and on the
 * device (sim, deferred streams: the CPU's bits); its activation bytes, fewer by exactly the
 * derived amount; a bf16 input refused by a Linear outside the policy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx, FSDP_TEST_OK
#include "kernels/kernels.h" // defines: fsdp_kernels_for (the reference's f32 SwiGLU)
#include "on_device.h"       // defines: fsdp_test_device

enum { BATCH = 2, SEQ = 8, VOCAB = 64, N_TOK = BATCH * SEQ, LAYERS = 2, DIM = 32, HIDDEN = 48 };

static fsdp_module *llama(void) {
    fsdp_llama_config cfg = {.dim = DIM,
                             .n_layers = LAYERS,
                             .n_heads = 4,
                             .n_kv_heads = 2,
                             .vocab_size = VOCAB,
                             .ffn_hidden = HIDDEN,
                             .max_seq_len = 16,
                             .init_std = 0.2f,
                             .compute_dtype = FSDP_DTYPE_BF16};
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(fsdp_test_ctx(), &cfg, &m));
    return m;
}

/* ---- the path before bf16 storage, kept as hooks: down_proj's input replaced by the f32
 * SwiGLU of gate_proj's and up_proj's outputs (what the MLP handed it before), which down_proj
 * rounds into its own bf16 copy under the policy, as it did. ---- */

typedef struct f32_path {
    const fsdp_tensor *gate, *up; /* the projections' outputs of this forward */
    fsdp_tensor *hidden;          /* f32 silu(gate) * up, owned here */
    int calls;                    /* down_proj inputs replaced */
} f32_path;

static void f32_path_free(void *user) {
    f32_path *p = user;
    fsdp_tensor_free(p->hidden);
    free(p);
}

static fsdp_status keep_gate(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                             const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    ((f32_path *)user)->gate = *io;
    return FSDP_OK;
}

static fsdp_status keep_up(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                           const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    ((f32_path *)user)->up = *io;
    return FSDP_OK;
}

static fsdp_status f32_hidden(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)m, (void)point;
    f32_path *p = user;
    if (!p->gate || !p->up) return FSDP_ERR_INTERNAL;
    fsdp_tensor_free(p->hidden);
    p->hidden = NULL;
    FSDP_TRY_AT(ctx, fsdp_tensor_create_like(ctx, p->gate, &p->hidden));
    fsdp_kernels_for(fsdp_tensor_device(p->gate))
        ->swiglu_forward(fsdp_tensor_f32(p->hidden), fsdp_tensor_f32(p->gate),
                         fsdp_tensor_f32(p->up), fsdp_tensor_numel(p->gate));
    *io = p->hidden;
    p->calls++;
    return FSDP_OK;
}

/* Puts the f32 path's hooks on every decoder layer's MLP; paths[i] is layer i's. */
static void use_f32_path(fsdp_module *m, f32_path *paths[LAYERS]) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int i = 0; i < LAYERS; i++) {
        char name[64];
        f32_path *p = calloc(1, sizeof *p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        paths[i] = p;
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj", i);
        FSDP_TEST_OK(fsdp_module_add_hook(ctx, fsdp_module_find(m, name), FSDP_HOOK_POST_FORWARD,
                                          keep_gate, p, NULL, NULL));
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj", i);
        FSDP_TEST_OK(fsdp_module_add_hook(ctx, fsdp_module_find(m, name), FSDP_HOOK_POST_FORWARD,
                                          keep_up, p, NULL, NULL));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj", i);
        FSDP_TEST_OK(fsdp_module_add_hook(ctx, fsdp_module_find(m, name), FSDP_HOOK_PRE_FORWARD,
                                          f32_hidden, p, f32_path_free, NULL));
    }
}

/* Counts the bf16 inputs down_proj receives (the new path is taken, so the comparison is not
 * of a path with itself). */
static fsdp_status count_bf16_input(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point;
    *(int *)user += fsdp_tensor_dtype(*io) == FSDP_DTYPE_BF16;
    return FSDP_OK;
}

static void count_bf16_inputs(fsdp_module *m, int *count) {
    for (int i = 0; i < LAYERS; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj", i);
        FSDP_TEST_OK(fsdp_module_add_hook(fsdp_test_ctx(), fsdp_module_find(m, name),
                                          FSDP_HOOK_PRE_FORWARD, count_bf16_input, count, NULL,
                                          NULL));
    }
}

/* ---- one training step's results on the host ---- */

typedef struct step_out {
    float loss;
    float logits[N_TOK * VOCAB];
    float *grads; /* every parameter's gradient, in visit order */
    int64_t n_grads;
} step_out;

static fsdp_status copy_grad(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    step_out *o = user;
    const fsdp_tensor *g = fsdp_param_grad(p);
    fsdp_tensor *h = NULL;
    FSDP_TRY_AT(ctx, fsdp_tensor_from_blob(ctx, o->grads + o->n_grads, FSDP_DTYPE_F32, FSDP_CPU, 1,
                                           (int64_t[]){fsdp_tensor_numel(g)}, &h));
    fsdp_status st = fsdp_tensor_copy(ctx, h, g);
    fsdp_tensor_free(h);
    o->n_grads += fsdp_tensor_numel(g);
    return st;
}

/* Forward, cross-entropy and backward of a fixed batch on m (on dev); *bytes (may be NULL) the
 * model's activation bytes right after the forward. */
static void step(fsdp_module *m, fsdp_device dev, step_out *o, int64_t *bytes) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    int32_t tok[N_TOK], tgt[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)((i * 37 + 11) % VOCAB);
    for (int i = 0; i < N_TOK; i++) tgt[i] = i % SEQ == SEQ - 1 ? FSDP_IGNORE_INDEX : tok[i + 1];
    fsdp_tensor *th = NULL, *td = NULL, *dl = NULL, *lh = NULL;
    int64_t shape[2] = {BATCH, SEQ};
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, tok, FSDP_DTYPE_I32, FSDP_CPU, 2, shape, &th));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, dev, 2, shape, &td));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, td, th));
    const fsdp_tensor *out = NULL;
    FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, td, &out));
    if (bytes) FSDP_TEST_OK(fsdp_module_activation_bytes(ctx, m, bytes));
    FSDP_TEST_OK(fsdp_tensor_create_like(ctx, out, &dl));
    FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, out, tgt, FSDP_IGNORE_INDEX, &o->loss, dl));
    FSDP_TEST_OK(fsdp_module_backward(ctx, m, dl, NULL));
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, o->logits, FSDP_DTYPE_F32, FSDP_CPU, 3,
                                       (int64_t[]){BATCH, SEQ, VOCAB}, &lh));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, lh, out));
    free(o->grads);
    o->n_grads = 0;
    o->grads = calloc((size_t)fsdp_module_param_count(m), sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(o->grads);
    FSDP_TEST_OK(fsdp_module_visit_params(ctx, m, copy_grad, o));
    fsdp_tensor_free(th), fsdp_tensor_free(td), fsdp_tensor_free(dl), fsdp_tensor_free(lh);
}

/* Bit for bit, with the count of differing elements printed. */
static bool same_bits(const char *name, const float *a, const float *b, int64_t n) {
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    printf("\n    %s: %lld of %lld elements differ", name, (long long)diff, (long long)n);
    return diff == 0;
}

/* ---- the kernel ---- */

/* swiglu_forward_bf16 against swiglu_forward then f32_to_bf16 on the same device, bit for bit:
 * 1500 values (not a multiple of the CPU's block of 512) over [-40, 40] where silu saturates,
 * with zeros, +-inf, NaN, f32's largest value and a subnormal among them. */
static void check_kernel(fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    enum { N = 1500 };
    float g[N], u[N];
    for (int i = 0; i < N; i++) {
        g[i] = -40.0f + 80.0f * (float)((i * 7919) % N) / N;
        u[i] = -3.0f + 6.0f * (float)((i * 104729) % N) / N;
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3.4028235e38f, 1e-40f};
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++)
        g[i * 11] = special[i], u[i * 13 + 1] = special[i];
    fsdp_tensor *gh, *uh, *gd, *ud, *y32, *r16, *y16;
    int64_t shape[1] = {N};
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, g, FSDP_DTYPE_F32, FSDP_CPU, 1, shape, &gh));
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, u, FSDP_DTYPE_F32, FSDP_CPU, 1, shape, &uh));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, shape, &gd));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, shape, &ud));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, gd, gh));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, ud, uh));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, shape, &y32));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, dev, 1, shape, &r16));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, dev, 1, shape, &y16));
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k->swiglu_forward_bf16);
    k->swiglu_forward(fsdp_tensor_f32(y32), fsdp_tensor_f32(gd), fsdp_tensor_f32(ud), N);
    k->f32_to_bf16(fsdp_tensor_data(r16), fsdp_tensor_f32(y32), N);
    k->swiglu_forward_bf16(fsdp_tensor_data(y16), fsdp_tensor_f32(gd), fsdp_tensor_f32(ud), N);
    fsdp_bf16 want[N], got[N];
    fsdp_tensor *wh, *gth;
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, want, FSDP_DTYPE_BF16, FSDP_CPU, 1, shape, &wh));
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, got, FSDP_DTYPE_BF16, FSDP_CPU, 1, shape, &gth));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, wh, r16));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, gth, y16));
    int64_t diff = 0, nan = 0;
    for (int i = 0; i < N; i++) diff += got[i] != want[i], nan += (want[i] & 0x7fff) > 0x7f80;
    printf("\n    %s: %lld of %d differ (%lld NaN)", fsdp_device_to_string(dev), (long long)diff, N,
           (long long)nan);
    CU_ASSERT_EQUAL(diff, 0);
    CU_ASSERT_TRUE(nan > 0); /* the specials reached the rounding */
    fsdp_tensor *all[] = {gh, uh, gd, ud, y32, r16, y16, wh, gth};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fsdp_tensor_free(all[i]);
}

static void test_kernel(void) {
    check_kernel(FSDP_CPU);
    check_kernel(fsdp_test_device());
}

/* ---- the model, bitwise the path before ---- */

/* Two steps of the policy's Llama (the second on the buffers of the first) against the same
 * model on the f32 path's hooks, on dev: loss, logits and every gradient bit for bit. */
static void check_bitwise(fsdp_device dev) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *mb = llama(), *mf = llama();
    if (dev.type != FSDP_DEVICE_CPU) { /* moved before hooks are added (fsdp_module_to's rule) */
        FSDP_TEST_OK(fsdp_module_to(ctx, mb, dev));
        FSDP_TEST_OK(fsdp_module_to(ctx, mf, dev));
    }
    f32_path *paths[LAYERS];
    use_f32_path(mf, paths);
    int bf16_inputs = 0;
    count_bf16_inputs(mb, &bf16_inputs);
    step_out *b = calloc(1, sizeof *b), *f = calloc(1, sizeof *f);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b && f);
    for (int s = 0; s < 2; s++) {
        step(mb, dev, b, NULL), step(mf, dev, f, NULL);
        printf("\n    %s step %d: loss %.9g, f32 path %.9g", fsdp_device_to_string(dev), s, b->loss,
               f->loss);
        CU_ASSERT_TRUE(same_bits("loss", &b->loss, &f->loss, 1));
        CU_ASSERT_TRUE(same_bits("logits", b->logits, f->logits, N_TOK * VOCAB));
        CU_ASSERT_EQUAL_FATAL(b->n_grads, f->n_grads);
        CU_ASSERT_TRUE(same_bits("gradients", b->grads, f->grads, b->n_grads));
    }
    /* both paths ran: bf16 inputs reached down_proj in one model, f32 ones in the other */
    CU_ASSERT_EQUAL(bf16_inputs, 2 * LAYERS);
    for (int i = 0; i < LAYERS; i++) CU_ASSERT_EQUAL(paths[i]->calls, 2);
    free(b->grads), free(f->grads), free(b), free(f);
    fsdp_module_free(mb), fsdp_module_free(mf);
}

static void test_bitwise_cpu(void) {
    check_bitwise(FSDP_CPU);
}

static void test_bitwise_device(void) {
    check_bitwise(fsdp_test_device());
}

/* ---- the activation bytes ---- */

/* fsdp_module_activation_bytes of the policy's tiny Llama right after a forward, measured by
 * this suite's `step` on the code before bf16 storage (commit a9991fb: the SwiGLU output in f32,
 * down_proj's own bf16 copy of it), where one MLP held mlp_bytes + 4 R H = 28672: activation
 * bytes are sizes, the same on every machine. */
static const int64_t BYTES_BEFORE = 142144;

/* The MLP's activations under the policy (R rows, D dim, H hidden), each Linear holding its
 * output (f32), its weight's bf16 copy (2 out in) and its bf16 scratch (2 R max(out, in)), and
 * its input's bf16 copy (2 R in) unless the input is bf16:
 *   gate_proj, up_proj: 4 R H + 2 R D + 2 H D + 2 R max(H, D) each
 *   SwiGLU output: 2 R H in bf16 (before: 4 R H in f32)
 *   down_proj: 4 R D + 2 D H + 2 R max(D, H) (before: + 2 R H, its copy of the SwiGLU output)
 * so each decoder layer holds 4 R H bytes fewer. */
static int64_t mlp_bytes(int64_t R, int64_t D, int64_t H) {
    int64_t w = H > D ? H : D;
    return 2 * (4 * R * H + 2 * R * D + 2 * H * D + 2 * R * w) + 2 * R * H +
           (4 * R * D + 2 * D * H + 2 * R * w);
}

static void test_activation_bytes(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m = llama();
    step_out *o = calloc(1, sizeof *o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    int64_t bytes = 0, mlp = 0, saved = 4 * (int64_t)N_TOK * HIDDEN * LAYERS;
    step(m, FSDP_CPU, o, &bytes);
    FSDP_TEST_OK(
        fsdp_module_activation_bytes(ctx, fsdp_module_find(m, "model.layers.0.mlp"), &mlp));
    printf("\n    activation bytes: %lld (before %lld, %lld fewer; derived %lld); one MLP %lld "
           "(derived %lld)",
           (long long)bytes, (long long)BYTES_BEFORE, (long long)(BYTES_BEFORE - bytes),
           (long long)saved, (long long)mlp, (long long)mlp_bytes(N_TOK, DIM, HIDDEN));
    CU_ASSERT_EQUAL(mlp, mlp_bytes(N_TOK, DIM, HIDDEN));
    CU_ASSERT_EQUAL(bytes, BYTES_BEFORE - saved);
    /* the f32 path (down_proj copies its f32 input to bf16 again) holds that copy once more per
     * layer: 2 R H bytes, the part of the saving that down_proj's copy made */
    fsdp_module *mf = llama();
    f32_path *paths[LAYERS];
    use_f32_path(mf, paths);
    int64_t bytes_f = 0;
    step(mf, FSDP_CPU, o, &bytes_f);
    CU_ASSERT_EQUAL(bytes_f - bytes, 2 * (int64_t)N_TOK * HIDDEN * LAYERS);
    free(o->grads), free(o);
    fsdp_module_free(m), fsdp_module_free(mf);
}

/* ---- misuse ---- */

/* A Linear outside the policy refuses a bf16 input, naming the policy; under it, takes it. */
static void test_bf16_input_refused(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *lin = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 4, false, &lin));
    fsdp_tensor *x = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 2, (int64_t[]){3, 8}, &x));
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, x, 0.5f));
    const fsdp_tensor *y = NULL;
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, lin, x, &y), FSDP_ERR_DTYPE, "bf16",
                    "fsdp_module_set_autocast", "FSDP_DTYPE_BF16");
    FSDP_TEST_OK(fsdp_module_set_autocast(ctx, lin, FSDP_DTYPE_BF16));
    FSDP_TEST_OK(fsdp_module_forward(ctx, lin, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_dtype(y), FSDP_DTYPE_F32);
    fsdp_tensor *bad = NULL; /* the shape is still checked */
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 2, (int64_t[]){3, 7}, &bad));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, lin, bad, &y), FSDP_ERR_SHAPE, "8 features");
    fsdp_tensor_free(x), fsdp_tensor_free(bad);
    fsdp_module_free(lin);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"kernel", test_kernel},
        {"bitwise_cpu", test_bitwise_cpu},
        {"bitwise_device", test_bitwise_device},
        {"activation_bytes", test_activation_bytes},
        {"bf16_input_refused", test_bf16_input_refused},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "bf16_act", cases, (int)(sizeof cases / sizeof cases[0]));
}

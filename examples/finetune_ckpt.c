/* finetune_ckpt.c: trains MLPStacked(2) from a checkpoint (such as one `fsdp-ckpt import` made
 * of a PyTorch state dict) on a batch given in a file, then saves the result as a checkpoint,
 * which `fsdp-ckpt export` turns back into a state dict. tools/check_torch_roundtrip.py runs it
 * between torch and torch. Build it against an installed libfsdp:
 *   cc finetune_ckpt.c $(pkg-config --cflags --libs fsdp) -o finetune_ckpt
 * Usage: finetune_ckpt CKPT DATA OUT [--steps N] [--lr LR] [--momentum M] [--layout 1x1|2x2]
 *   CKPT  the checkpoint to start from (its parameters; no optimizer state is needed)
 *   DATA  a state dict file (.safetensors or .h5) holding "x" (N, 10) and "y" (N, 10)
 *   OUT   where the trained checkpoint goes (OUT/step-<N steps>); OUT/data holds DATA
 *         imported (the batch is read from there)
 * Each step: the MSE loss of model(x) against y over the whole batch, backward, SGD (lr 1e-2,
 * momentum 0 by default). --layout 2x2 runs 4 rank threads, dp 2 x tp 2 (net1 Colwise, net2
 * Rowwise over tp, FSDP FULL_SHARD over dp, each dp replica on half the rows): the same
 * training up to rounding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/fsdp.h>

#define WIDTH 10 /* MLPStacked's input and output width */

typedef struct job {
    const char *ckpt, *out;
    float *x, *y; /* (n, WIDTH) each, the whole batch */
    int64_t n;
    int steps, dp, tp;
    double lr, momentum;
} job;

/* On failure, return the status. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        fsdp_status check_ = (call);                                                               \
        if (check_ != FSDP_OK) return check_;                                                      \
    } while (0)

/* On failure, keep the status and go to the rank's cleanup. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st != FSDP_OK) goto done;                                                              \
    } while (0)

/* The model at this rank's layout, its checkpoint values loaded. */
static fsdp_status build(fsdp_ctx *ctx, const job *jb, fsdp_mesh **mesh, fsdp_module **model,
                         fsdp_sharded **sh) {
    CHECK(fsdp_mesh_create(ctx, 2, (int[]){jb->dp, jb->tp}, (const char *[]){"dp", "tp"}, mesh));
    CHECK(fsdp_model_mlp_stacked(ctx, 2, model));
    if (jb->tp > 1) {
        fsdp_mesh *tp;
        CHECK(fsdp_mesh_dim(ctx, *mesh, "tp", &tp));
        fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                     {"layers.*.net2", FSDP_ROWWISE()}};
        CHECK(fsdp_tp_parallelize(ctx, *model, tp, 2, plan, NULL));
    }
    if (jb->dp > 1) {
        fsdp_group *dp;
        CHECK(fsdp_mesh_get_group(ctx, *mesh, "dp", &dp));
        const char *const units[] = {"layers.0", "layers.1"};
        fsdp_fully_shard_options o = {
            .strategy = FSDP_FULL_SHARD, .group = dp, .wrap_paths = units, .n_wrap_paths = 2};
        CHECK(fsdp_fully_shard(ctx, *model, &o, sh));
    }
    /* The checkpoint holds parameters only: load it into the state of the model alone,
     * strictly (every parameter must be there, with its shape). */
    fsdp_state *params = NULL;
    fsdp_ckpt *ck = NULL;
    fsdp_status st =
        fsdp_state_create(ctx, &(fsdp_state_sources){.model = *model, .sharded = *sh}, &params);
    if (st == FSDP_OK) st = fsdp_ckpt_open(ctx, jb->ckpt, &ck);
    if (st == FSDP_OK) st = fsdp_ckpt_load(ctx, ck, params, NULL);
    fsdp_ckpt_close(ck);
    fsdp_state_free(params);
    return st;
}

static fsdp_status train_rank(fsdp_ctx *ctx, int rank, void *user) {
    const job *jb = user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *model = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *sgd = NULL;
    fsdp_state *state = NULL;
    fsdp_ckpt_writer *w = NULL;
    fsdp_tensor *x = NULL, *y = NULL, *dy = NULL, *loss = NULL;
    fsdp_status st;
    TRY(build(ctx, jb, &mesh, &model, &sh));
    fsdp_module *stepped = sh ? fsdp_sharded_flat_params(sh) : model;
    fsdp_sgd_options so = {.lr = jb->lr, .momentum = jb->momentum};
    TRY(fsdp_sgd_create(ctx, stepped, &so, &sgd));
    /* This dp replica's rows of the batch. */
    fsdp_group *dp;
    TRY(fsdp_mesh_get_group(ctx, mesh, "dp", &dp));
    int64_t off, len;
    fsdp_chunk_range(jb->n, jb->dp, fsdp_group_rank(dp), &off, &len);
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, WIDTH}, &x));
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){len, WIDTH}, &y));
    memcpy(fsdp_tensor_f32(x), jb->x + off * WIDTH, (size_t)(len * WIDTH) * sizeof(float));
    memcpy(fsdp_tensor_f32(y), jb->y + off * WIDTH, (size_t)(len * WIDTH) * sizeof(float));
    TRY(fsdp_tensor_create_like(ctx, x, &dy));
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &loss));
    for (int step = 0; step < jb->steps; step++) {
        const fsdp_tensor *out;
        TRY(fsdp_optimizer_zero_grad(ctx, sgd));
        TRY(fsdp_module_forward(ctx, model, x, &out));
        TRY(fsdp_loss_mse(ctx, out, y, fsdp_tensor_f32(loss), dy));
        TRY(fsdp_module_backward(ctx, model, dy, NULL));
        TRY(fsdp_optimizer_step(ctx, sgd));
        TRY(fsdp_all_reduce(ctx, dp, loss, FSDP_REDUCE_AVG)); /* the whole batch's loss */
        if (rank == 0) printf("step %3d  loss %.7f\n", step, fsdp_tensor_f32(loss)[0]);
    }
    /* Saved with the optimizer's state, at step `steps`. */
    TRY(fsdp_state_create(
        ctx, &(fsdp_state_sources){.model = model, .sharded = sh, .optimizer = sgd}, &state));
    TRY(fsdp_ckpt_writer_create(ctx, jb->out, NULL, &w));
    char layout[32];
    snprintf(layout, sizeof layout, "dp=%d tp=%d", jb->dp, jb->tp);
    TRY(fsdp_ckpt_save(ctx, w, state, &(fsdp_ckpt_meta){.step = jb->steps, .layout = layout}));
    if (rank == 0) printf("saved %s\n", fsdp_ckpt_writer_last_path(w));
done:
    fsdp_ckpt_writer_free(ctx, w);
    fsdp_state_free(state);
    fsdp_tensor_free(loss);
    fsdp_tensor_free(dy);
    fsdp_tensor_free(y);
    fsdp_tensor_free(x);
    fsdp_optimizer_free(sgd);
    fsdp_sharded_free(sh);
    fsdp_module_free(model);
    fsdp_mesh_free(mesh);
    return st;
}

/* Tensor `name` of ck, (n, WIDTH) f32, into a malloc'ed buffer. */
static fsdp_status read_batch(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *name, float **out,
                              int64_t *n) {
    int t = fsdp_ckpt_find(ck, name);
    fsdp_ckpt_tensor x;
    if (t < 0 || fsdp_ckpt_tensor_get(ctx, ck, t, &x) != FSDP_OK || x.ndim != 2 ||
        x.shape[1] != WIDTH || x.dtype != FSDP_DTYPE_F32) {
        fprintf(stderr, "finetune_ckpt: the data needs a tensor '%s' of shape (N, %d)\n", name,
                WIDTH);
        return FSDP_ERR_INVALID_ARGUMENT;
    }
    fsdp_state_region all = {.ndim = 2, .count = {x.shape[0], WIDTH}};
    *n = x.shape[0];
    *out = malloc((size_t)(*n * WIDTH) * sizeof(float) + 1);
    return *out ? fsdp_ckpt_read(ctx, ck, t, &all, *out) : FSDP_ERR_OUT_OF_MEMORY;
}

/* DATA imported into OUT/data, then its x and y read. */
static fsdp_status load_data(fsdp_ctx *ctx, const char *data, job *jb) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/data", jb->out);
    CHECK(fsdp_ckpt_import(ctx, data, dir, NULL));
    snprintf(path, sizeof path, "%s/step-00000000", dir);
    fsdp_ckpt *ck;
    CHECK(fsdp_ckpt_open(ctx, path, &ck));
    int64_t ny = 0;
    fsdp_status st = read_batch(ctx, ck, "x", &jb->x, &jb->n);
    if (st == FSDP_OK) st = read_batch(ctx, ck, "y", &jb->y, &ny);
    fsdp_ckpt_close(ck);
    if (st == FSDP_OK && (ny != jb->n || jb->n % jb->dp)) {
        fprintf(stderr, "finetune_ckpt: x and y need the same rows, a multiple of dp (%d)\n",
                jb->dp);
        st = FSDP_ERR_INVALID_ARGUMENT;
    }
    return st;
}

static int usage(void) {
    fprintf(stderr, "usage: finetune_ckpt CKPT DATA OUT [--steps N] [--lr LR] [--momentum M] "
                    "[--layout 1x1|2x2]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc % 2) return usage();
    job jb = {.ckpt = argv[1], .out = argv[3], .steps = 5, .dp = 1, .tp = 1, .lr = 1e-2};
    for (int i = 4; i < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--steps"))
            jb.steps = atoi(v);
        else if (!strcmp(k, "--lr"))
            jb.lr = atof(v);
        else if (!strcmp(k, "--momentum"))
            jb.momentum = atof(v);
        else if (!strcmp(k, "--layout") && (!strcmp(v, "1x1") || !strcmp(v, "2x2")))
            jb.dp = jb.tp = v[0] - '0';
        else
            return usage();
    }
    if (jb.steps < 1) return usage();
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(NULL, &ctx) != FSDP_OK) return 1;
    fsdp_world *world = NULL;
    fsdp_status st = load_data(ctx, argv[2], &jb);
    if (st == FSDP_OK)
        st = fsdp_world_create(ctx, &(fsdp_world_options){.nranks = jb.dp * jb.tp}, &world);
    if (st == FSDP_OK) st = fsdp_world_run(ctx, world, train_rank, &jb);
    if (st != FSDP_OK)
        fprintf(stderr, "finetune_ckpt: %s: %s\n", fsdp_status_to_string(st), fsdp_last_error(ctx));
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    free(jb.x);
    free(jb.y);
    return st == FSDP_OK ? 0 : 1;
}

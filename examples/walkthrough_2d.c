/* walkthrough_2d.c: the program of docs/walkthrough.md. Four rank threads form a (dp 2, tp 2)
 * device mesh; an MLP's Linear pairs are split Colwise/Rowwise over tp, FSDP (FULL_SHARD) shards
 * the result over dp, Adam steps FSDP's flat shards, and after a few steps every rank reads the
 * full weights back. Build it against an installed libfsdp:
 *   cc walkthrough_2d.c $(pkg-config --cflags --libs fsdp) -o walkthrough_2d
 * Exits 0 when every rank saw the same losses and the loss fell at least 2x, so it doubles as a
 * test. */
#include <stdio.h>

#include <fsdp/fsdp.h>

#define WORLD 4  /* rank threads: dp 2 x tp 2 */
#define STEPS 20 /* training steps */
#define BATCH 16 /* samples in the global batch; each dp replica takes half of them */
#define WIDTH 10 /* MLPStacked's input and output width */

/* What each rank reports back to main (rank threads share this process's memory). */
typedef struct losses {
    float loss[WORLD][STEPS]; /* the global batch's loss at each step, as rank r saw it */
} losses;

/* On failure, keep the status and go to the rank's cleanup. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st != FSDP_OK) goto done;                                                              \
    } while (0)

/* Prints a parameter's whole (global) value on rank 0: its shape and largest magnitude. Every
 * rank calls fsdp_param_full_tensor, because it gathers a TP-sharded parameter over tp. */
static fsdp_status print_full_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)user;
    fsdp_tensor *full = NULL;
    fsdp_status st = fsdp_param_full_tensor(ctx, p, false, &full);
    if (st != FSDP_OK) return st;
    float max = 0;
    for (int64_t i = 0; i < fsdp_tensor_numel(full); i++) {
        float v = fsdp_tensor_f32(full)[i];
        if (v > max || -v > max) max = v > 0 ? v : -v;
    }
    char local[32], global[32];
    if (fsdp_ctx_rank(ctx) == 0)
        printf("  %-20s local %-8s full %-8s max |w| %.4f\n", name,
               fsdp_tensor_shape_string(fsdp_param_data(p), local, sizeof local),
               fsdp_tensor_shape_string(full, global, sizeof global), max);
    fsdp_tensor_free(full);
    return FSDP_OK;
}

/* Prints what the optimizer steps on rank 0: one flat shard per FSDP unit. */
static fsdp_status print_flat_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)user;
    if (fsdp_ctx_rank(ctx) == 0)
        printf("  %-20s %lld elements of this rank's shard\n", name,
               (long long)fsdp_tensor_numel(fsdp_param_data(p)));
    return FSDP_OK;
}

static fsdp_status train_rank(fsdp_ctx *ctx, int rank, void *user) {
    losses *out = user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *model = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *adam = NULL;
    fsdp_tensor *data = NULL, *x = NULL, *target = NULL, *dy = NULL, *loss = NULL;
    fsdp_status st;

    /* 1. The mesh: world rank = dp * 2 + tp, so the tp pairs are {0, 1} and {2, 3}, and the dp
     *    groups {0, 2} and {1, 3}. */
    TRY(fsdp_mesh_create(ctx, 2, (int[]){2, 2}, (const char *[]){"dp", "tp"}, &mesh));
    fsdp_mesh *tp;
    fsdp_group *dp;
    TRY(fsdp_mesh_dim(ctx, mesh, "tp", &tp));
    TRY(fsdp_mesh_get_group(ctx, mesh, "dp", &dp));

    /* 2. The model: MLPStacked(2), layers.0 and layers.1, each net1 Linear(10, 16), relu,
     *    net2 Linear(16, 10). Every rank initialises the same values from the world's seed. */
    TRY(fsdp_model_mlp_stacked(ctx, 2, &model));

    /* 3. Tensor parallelism over tp: net1 Colwise (weight rows split, output Shard(-1)), net2
     *    Rowwise (weight columns split, output all_reduced back to Replicate). */
    fsdp_tp_plan_entry plan[] = {{"layers.*.net1", FSDP_COLWISE()},
                                 {"layers.*.net2", FSDP_ROWWISE()}};
    TRY(fsdp_tp_parallelize(ctx, model, tp, 2, plan, NULL));

    /* 4. FSDP over dp, after TP: the root and layers.1 are units, each with one flat parameter
     *    made of the local TP blocks, sharded in 2 over the dp group. The group is given
     *    explicitly: FSDP must average over dp only, never across tp. */
    const char *const units[] = {"layers.1"};
    fsdp_fully_shard_options fsdp = {
        .strategy = FSDP_FULL_SHARD, .group = dp, .wrap_paths = units, .n_wrap_paths = 1};
    TRY(fsdp_fully_shard(ctx, model, &fsdp, &sh));

    /* 5. The optimizer steps the flat shards, not the model's own parameters (those are views
     *    into the gathered buffers, without storage while their unit is sharded). */
    fsdp_module *flat = fsdp_sharded_flat_params(sh);
    if (rank == 0) printf("the optimizer steps:\n");
    TRY(fsdp_module_visit_params(ctx, flat, print_flat_param, NULL));
    TRY(fsdp_adam_create(ctx, flat, &(fsdp_adam_options){.lr = 0.02}, &adam));

    /* 6. Data: learn y = 0.5 * x. Every rank draws the same global batch; both ranks of a tp
     *    pair take the rows of their dp replica. */
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){BATCH, WIDTH}, &data));
    TRY(fsdp_init_tensor(ctx, data, &(fsdp_init){FSDP_INIT_NORMAL, 0.0f, 1.0f}, 7, 1));
    int64_t off, len;
    fsdp_chunk_range(BATCH, fsdp_group_size(dp), fsdp_group_rank(dp), &off, &len);
    TRY(fsdp_tensor_view(ctx, data, off * WIDTH, 2, (int64_t[]){len, WIDTH}, &x));
    TRY(fsdp_tensor_create_like(ctx, x, &target));
    TRY(fsdp_tensor_create_like(ctx, x, &dy));
    for (int64_t i = 0; i < len * WIDTH; i++)
        fsdp_tensor_f32(target)[i] = 0.5f * fsdp_tensor_f32(x)[i];
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &loss));

    /* 7. Training. The loss is the mean over this replica's rows; FSDP averages the gradients
     *    over dp, which makes them the gradient of the mean over the whole batch. Gradients
     *    accumulate, so each step starts by zeroing what the optimizer steps. */
    for (int step = 0; step < STEPS; step++) {
        const fsdp_tensor *y;
        TRY(fsdp_optimizer_zero_grad(ctx, adam));
        TRY(fsdp_module_forward(ctx, model, x, &y));
        TRY(fsdp_loss_mse(ctx, y, target, fsdp_tensor_f32(loss), dy));
        TRY(fsdp_module_backward(ctx, model, dy, NULL));
        TRY(fsdp_optimizer_step(ctx, adam));
        TRY(fsdp_all_reduce(ctx, dp, loss, FSDP_REDUCE_AVG)); /* the whole batch's loss */
        out->loss[rank][step] = fsdp_tensor_f32(loss)[0];
        if (rank == 0) printf("step %2d  loss %.6f\n", step, out->loss[rank][step]);
    }

    /* 8. The full weights: summon_full_params gathers every unit over dp (the model's
     *    parameters hold their local TP block again), fsdp_param_full_tensor gathers over tp.
     *    Only read here, so no writeback into the shards on release. */
    TRY(fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.writeback = false}));
    if (rank == 0) printf("the trained weights:\n");
    st = fsdp_module_visit_params(ctx, model, print_full_param, NULL);
    fsdp_status released = fsdp_release_full_params(ctx, sh);
    if (st == FSDP_OK) st = released;

done:
    fsdp_tensor_free(loss);
    fsdp_tensor_free(dy);
    fsdp_tensor_free(target);
    fsdp_tensor_free(x);
    fsdp_tensor_free(data);
    fsdp_optimizer_free(adam);
    fsdp_sharded_free(sh);
    fsdp_module_free(model);
    fsdp_mesh_free(mesh);
    return st;
}

int main(void) {
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(NULL, &ctx) != FSDP_OK) return 1;
    fsdp_world *world = NULL;
    fsdp_status st =
        fsdp_world_create(ctx, &(fsdp_world_options){.nranks = WORLD, .ctx = {.seed = 1}}, &world);
    losses out = {0};
    if (st == FSDP_OK) st = fsdp_world_run(ctx, world, train_rank, &out);
    if (st != FSDP_OK)
        fprintf(stderr, "walkthrough_2d: %s: %s\n", fsdp_status_to_string(st),
                fsdp_last_error(ctx));
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    if (st != FSDP_OK) return 1;

    /* Replicated values are bitwise equal on every rank; the loss must have fallen. */
    for (int r = 1; r < WORLD; r++)
        for (int s = 0; s < STEPS; s++)
            if (out.loss[r][s] != out.loss[0][s]) {
                fprintf(stderr, "walkthrough_2d: step %d: rank %d's loss %.9g, rank 0's %.9g\n", s,
                        r, out.loss[r][s], out.loss[0][s]);
                return 1;
            }
    float first = out.loss[0][0], last = out.loss[0][STEPS - 1];
    printf("loss %.6f -> %.6f (%.1fx lower)\n", first, last, first / last);
    return last * 2.0f <= first ? 0 : 1;
}

/* embed_mlp.c: libfsdp embedded in a C program: build a model, run forward and backward,
 * step SGD, and report errors through the context. Build it against an installed libfsdp:
 *   cc embed_mlp.c $(pkg-config --cflags --libs fsdp) -o embed_mlp
 * Exits 0 when the loss fell at least 10x, so it doubles as a smoke test. */
#include <stdio.h>

#include <fsdp/fsdp.h>

#define CHECK(ctx, expr)                                                                           \
    do {                                                                                           \
        fsdp_status st_ = (expr);                                                                  \
        if (st_ != FSDP_OK) {                                                                      \
            fprintf(stderr, "%s failed: %s: %s\n", #expr, fsdp_status_to_string(st_),              \
                    fsdp_last_error(ctx));                                                         \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void) {
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx) != FSDP_OK) return 1;

    fsdp_module *model; /* MLPModule: net1 Linear(10, 16), relu, net2 Linear(16, 10) */
    CHECK(ctx, fsdp_model_mlp_module(ctx, &model));
    fsdp_optimizer *sgd;
    CHECK(ctx,
          fsdp_sgd_create(ctx, model, &(fsdp_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &sgd));

    /* Learn y = 0.5 * x on 32 fixed random samples. */
    const int64_t shape[2] = {32, 10};
    fsdp_tensor *x, *target, *dy;
    CHECK(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &x));
    CHECK(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &target));
    CHECK(ctx, fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &dy));
    CHECK(ctx, fsdp_init_tensor(ctx, x, &(fsdp_init){FSDP_INIT_NORMAL, 0.0f, 1.0f}, 7, 1));
    for (int i = 0; i < 320; i++) fsdp_tensor_f32(target)[i] = 0.5f * fsdp_tensor_f32(x)[i];

    float first = 0, loss = 0;
    for (int step = 0; step < 200; step++) {
        const fsdp_tensor *y;
        CHECK(ctx, fsdp_optimizer_zero_grad(ctx, sgd));
        CHECK(ctx, fsdp_module_forward(ctx, model, x, &y));
        CHECK(ctx, fsdp_loss_mse(ctx, y, target, &loss, dy));
        CHECK(ctx, fsdp_module_backward(ctx, model, dy, NULL)); /* no input gradient needed */
        CHECK(ctx, fsdp_optimizer_step(ctx, sgd));
        if (step == 0) first = loss;
    }
    printf("embed_mlp: loss %.6f -> %.6f (%.1fx lower)\n", first, loss, first / loss);

    fsdp_tensor_free(x);
    fsdp_tensor_free(target);
    fsdp_tensor_free(dy);
    fsdp_optimizer_free(sgd);
    fsdp_module_free(model);
    fsdp_ctx_free(ctx);
    return first / loss >= 10.0f ? 0 : 1;
}

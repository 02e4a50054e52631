/* sim_tensor.c: CI's check that a program linked with the static library still has the device
 * kinds. It only makes a tensor on the simulated GPU, so nothing it calls pulls in
 * src/kernels/devices.c, whose constructor registers them: only the link's
 * --undefined=fsdp_kernels_for (from pkg-config --static and fsdp::fsdp_static) keeps it. */
#include <stdio.h>

#include <fsdp/fsdp.h>

int main(void) {
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx) != FSDP_OK) return 1;
    fsdp_tensor *t = NULL;
    const int64_t shape[1] = {4};
    fsdp_device sim = {FSDP_DEVICE_SIM, 0};
    fsdp_status s = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, sim, 1, shape, &t);
    if (s != FSDP_OK)
        fprintf(stderr, "sim_tensor: %s\n", fsdp_last_error(ctx));
    else
        printf("sim_tensor: a tensor on %s\n", fsdp_device_to_string(sim));
    fsdp_tensor_free(t);
    fsdp_ctx_free(ctx);
    return s == FSDP_OK ? 0 : 1;
}

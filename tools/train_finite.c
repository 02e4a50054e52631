/* train_finite.c: every value of every parameter, checked finite after training, on every rank
 * (each reads the values it holds), and agreed on over the world. */
#include "train_finite.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Whether the n values of dtype at v are all finite (bf16, f16: the exponent is not all ones). */
static bool all_finite(fsdp_dtype dtype, const void *v, int64_t n) {
    if (dtype == FSDP_DTYPE_F32) {
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(((const float *)v)[i])) return false;
        return true;
    }
    uint16_t mask = dtype == FSDP_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    for (int64_t i = 0; i < n; i++)
        if ((((const uint16_t *)v)[i] & mask) == mask) return false;
    return true;
}

/* flags[i] = 1 when parameter entry i holds a value on this rank that is not finite. */
static fsdp_status check_held(fsdp_ctx *ctx, const fsdp_state *st, float *flags) {
    for (int i = 0; i < fsdp_state_num_entries(st); i++) {
        fsdp_state_entry e;
        fsdp_status s = fsdp_state_entry_get(ctx, st, i, &e);
        if (s != FSDP_OK) return s;
        for (int k = 0; e.kind == FSDP_STATE_PARAM && k < e.n_regions && !flags[i]; k++) {
            fsdp_state_region r;
            if ((s = fsdp_state_region_get(ctx, st, i, k, &r)) != FSDP_OK) return s;
            int64_t n = 1;
            for (int d = 0; d < r.ndim; d++) n *= r.count[d];
            void *v = malloc((size_t)n * fsdp_dtype_size(e.dtype) + 1);
            if (!v) return FSDP_ERR_OUT_OF_MEMORY;
            s = fsdp_state_read_region(ctx, st, i, k, v);
            if (s == FSDP_OK) flags[i] = all_finite(e.dtype, v, n) ? 0.0f : 1.0f;
            free(v);
            if (s != FSDP_OK) return s;
        }
    }
    return FSDP_OK;
}

/* flags, the maximum over the world's ranks. */
static fsdp_status agree(fsdp_ctx *ctx, float *flags, int n) {
    fsdp_group *world = fsdp_ctx_world_group(ctx);
    if (!world || fsdp_group_size(world) == 1 || n == 0) return FSDP_OK;
    fsdp_tensor *t = NULL;
    fsdp_status s =
        fsdp_tensor_from_blob(ctx, flags, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){n}, &t);
    if (s == FSDP_OK) s = fsdp_all_reduce(ctx, world, t, FSDP_REDUCE_MAX);
    fsdp_tensor_free(t);
    return s;
}

fsdp_status train_params_finite(fsdp_ctx *ctx, const fsdp_state_sources *src, char *bad,
                                size_t size) {
    bad[0] = '\0';
    fsdp_state_sources params = {.model = src->model, .sharded = src->sharded};
    fsdp_state *st = NULL;
    fsdp_status s = fsdp_state_create(ctx, &params, &st);
    if (s != FSDP_OK) return s;
    int n = fsdp_state_num_entries(st);
    float *flags = calloc((size_t)n + 1, sizeof *flags);
    s = flags ? check_held(ctx, st, flags) : FSDP_ERR_OUT_OF_MEMORY;
    if (s == FSDP_OK) s = agree(ctx, flags, n);
    int first = -1, count = 0;
    for (int i = 0; s == FSDP_OK && i < n; i++)
        if (flags[i] > 0) count++, first = first < 0 ? i : first;
    fsdp_state_entry e;
    if (count > 0 && (s = fsdp_state_entry_get(ctx, st, first, &e)) == FSDP_OK) {
        if (count == 1)
            snprintf(bad, size, "'%s' holds NaN or infinite values", e.name);
        else
            snprintf(bad, size, "'%s' and %d other parameter%s hold NaN or infinite values", e.name,
                     count - 1, count > 2 ? "s" : "");
    }
    free(flags);
    fsdp_state_free(st);
    return s;
}

/* sample.c: picking the next token from logits: greedy, or a seeded draw from the softmax at a
 * temperature over the k largest logits (fsdp_sample_logits, declared in fsdp/llama.h). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/llama.h"
#include "fsdp/rng.h"

#define SAMPLE_STREAM "fsdp/sample"

typedef struct ranked {
    float logit;
    int32_t index;
} ranked;

/* Larger logits first; equal ones by index. */
static int by_logit(const void *pa, const void *pb) {
    const ranked *a = pa, *b = pb;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

static int32_t argmax(const float *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

static fsdp_status check_args(fsdp_ctx *ctx, const float *logits, int64_t n,
                              const fsdp_sample_options *o) {
    if (n < 1 || n > INT32_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_sample_logits: %lld logits; it needs 1 to 2^31 - 1", (long long)n);
    if (!(o->temperature >= 0.0f) || isinf(o->temperature))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_sample_logits: temperature %g; it must be finite and >= 0 (0: "
                         "greedy)",
                         (double)o->temperature);
    if (o->top_k < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_sample_logits: top_k %lld; it must be >= 0 (0: every token)",
                         (long long)o->top_k);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(logits[i]))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "fsdp_sample_logits: logit %lld is %g; the model's output is not "
                             "finite (a diverged checkpoint?)",
                             (long long)i, (double)logits[i]);
    return FSDP_OK;
}

fsdp_status fsdp_sample_logits(fsdp_ctx *ctx, const float *logits, int64_t n,
                               const fsdp_sample_options *opts, uint64_t draw, int32_t *token) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_ARG_NOT_NULL(ctx, token);
    fsdp_sample_options o = opts ? *opts : (fsdp_sample_options){0};
    FSDP_TRY_AT(ctx, check_args(ctx, logits, n, &o));
    if (o.temperature == 0.0f || o.top_k == 1) {
        *token = argmax(logits, n);
        return FSDP_OK;
    }
    int64_t k = o.top_k == 0 || o.top_k > n ? n : o.top_k;
    ranked *r = malloc((size_t)n * sizeof *r);
    if (!r)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_sample_logits: %lld logits",
                         (long long)n);
    for (int64_t i = 0; i < n; i++) r[i] = (ranked){logits[i], (int32_t)i};
    qsort(r, (size_t)n, sizeof *r, by_logit);
    /* p_i proportional to exp((l_i - l_max) / T): the largest term is 1, so the sum is >= 1. */
    double sum = 0, t = (double)o.temperature, top = (double)r[0].logit;
    for (int64_t i = 0; i < k; i++) sum += exp(((double)r[i].logit - top) / t);
    double u = (double)fsdp_rng_uniform(o.seed, fsdp_rng_stream(SAMPLE_STREAM), draw) * sum;
    int64_t pick = k - 1; /* where rounding leaves u beyond the last partial sum */
    double cum = 0;
    for (int64_t i = 0; i < k; i++) {
        cum += exp(((double)r[i].logit - top) / t);
        if (u < cum) {
            pick = i;
            break;
        }
    }
    *token = r[pick].index;
    free(r);
    return FSDP_OK;
}

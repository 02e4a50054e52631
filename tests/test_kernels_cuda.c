/* test_kernels_cuda.c: a device against the CPU, on cuda:0 where a GPU is usable and on sim:0
 * (the simulated GPU) otherwise: every entry of the device's operator table on random inputs
 * compared with the CPU table's results (bit for bit on sim), the device's storage (caching
 * allocator, copies, fills, conversions, pinned memory, tensors) and its errors. The cases of
 * CUDA-only features (TF32 GEMMs, the tiled attention) say why they skip elsewhere. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"       // defines: fsdp_device_for, fsdp_device_i
#include "core/stream.h"       // defines: fsdp_host_alloc, fsdp_host_free
#include "harness.h"           // defines: fsdp_test_run, fsdp_test_close, FSDP_TEST_OK
#include "kernel_rng.h"        // defines: rng_seed, rng_u32, rng_uniform
#include "kernels/gpu_peaks.h" // defines: fsdp_gpu_peaks
#include "kernels/kernels.h"   // defines: fsdp_kernels_i, fsdp_kernels_for
#include "kernels/sim/sim.h"   // defines: fsdp_kernels_sim, fsdp_device_sim
#include "on_device.h"         // defines: fsdp_test_device, fsdp_test_device_close
#include "optim/update.h"      // defines: fsdp_sgd_update, fsdp_adam_update
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_device_count, fsdp_cuda_device
#endif

/* ---- the device of the run ---- */

static fsdp_device dev(void) {
    return fsdp_test_device();
}

static const fsdp_device_i *storage(void) {
    return fsdp_device_for(dev().type);
}

static const fsdp_kernels_i *K(void) {
    return fsdp_kernels_for(dev());
}

/* Whether the case, which tests a CUDA-only feature (`what`), runs; otherwise says why not. */
static bool cuda_only(const char *what) {
    if (fsdp_test_device_is_cuda()) return true;
    fsdp_test_skip("%s is CUDA's, and this run is on %s:%d", what, fsdp_device_to_string(dev()),
                   dev().index);
    return false;
}

/* The caching allocator's counters of the run's device (fsdp_device_memory_stats), and its
 * cache emptied (fsdp_device_empty_cache). */
static fsdp_device_memory counters(void) {
    fsdp_device_memory s = {0};
    FSDP_TEST_OK(fsdp_device_memory_stats(fsdp_test_ctx(), dev(), &s));
    return s;
}

static void empty_cache(void) {
    FSDP_TEST_OK(fsdp_device_empty_cache(fsdp_test_ctx(), dev()));
}

/* ---- table and registration ---- */

/* Every entry of a device kind's operator table and device record is there. */
static void check_registered(fsdp_device_type type, const fsdp_kernels_i *table,
                             const fsdp_device_i *record) {
    fsdp_device d = {type, 0};
    const fsdp_kernels_i *k = fsdp_kernels_for(d);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    CU_ASSERT_PTR_EQUAL(k, table);
    CU_ASSERT_STRING_EQUAL(k->name, fsdp_device_to_string(d));
    bool all = k->gemm && k->bias_add && k->bias_backward && k->relu_forward && k->relu_backward &&
               k->sigmoid_forward && k->sigmoid_backward && k->gelu_forward && k->gelu_backward &&
               k->rmsnorm_forward && k->rmsnorm_backward && k->add && k->axpy && k->scale &&
               k->copy && k->fill && k->sum && k->sum_squares && k->max_abs && k->mse_loss &&
               k->cross_entropy && k->f32_to_bf16 && k->bf16_to_f32 && k->f32_to_f16 &&
               k->f16_to_f32 && k->sgd_update && k->adam_update && k->adam_update_bf16 &&
               k->gemm_bf16 && k->gemm_bias_act && k->gemm_bf16_bias_act && k->gemm_bgrad &&
               k->add3 && k->add3_round_bf16 && k->add_bf16 && k->swiglu_backward_bf16_round &&
               k->swiglu_backward_bf16io && k->rope_qk_backward_round &&
               k->rope_qk_forward_bf16_round && k->rope_qk_backward_bf16_round &&
               k->attention_forward_bf16_round && k->attention_backward_bf16_round &&
               k->rmsnorm_backward_add && k->adam_update_multi && k->fill_multi;
    CU_ASSERT_TRUE(all);
    const fsdp_device_i *s = fsdp_device_for(type);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s); // registered when the library loaded
    CU_ASSERT_PTR_EQUAL(s, record);
    CU_ASSERT_STRING_EQUAL(s->name, fsdp_device_to_string(d));
    CU_ASSERT_TRUE(s->alloc && s->free && s->copy && s->copy_2d && s->fill && s->convert &&
                   s->synchronize && s->device_count && s->host_alloc && s->host_free &&
                   s->alloc_uninit && s->memory_stats && s->memory_reset_peak && s->empty_cache &&
                   s->properties);
    CU_ASSERT_EQUAL(s->device_count(), fsdp_device_count(type));
}

static void test_table(void) {
    const fsdp_kernels_i *cpu = fsdp_kernels_for(FSDP_CPU);
    CU_ASSERT_TRUE(cpu->sgd_update && cpu->adam_update && cpu->adam_update_bf16 && cpu->gemm_bf16);
    check_registered(FSDP_DEVICE_SIM, fsdp_kernels_sim(), fsdp_device_sim());
    CU_ASSERT_TRUE(fsdp_device_count(FSDP_DEVICE_SIM) >= 1);
#ifdef FSDP_HAVE_CUDA
    check_registered(FSDP_DEVICE_CUDA, fsdp_kernels_cuda(), fsdp_cuda_device());
    CU_ASSERT_EQUAL(fsdp_device_count(FSDP_DEVICE_CUDA), fsdp_cuda_device_count(NULL, 0));
#else
    CU_ASSERT_PTR_NULL(fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0}));
    printf("\n    (this build has no CUDA: its table was not checked)");
#endif
}

/* A device index past the machine's devices is refused by tensor creation and by the device's
 * own allocation, with a message naming the count (`own` is the allocation's words). */
static void check_past_last(fsdp_device_type type, const char *own) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    int64_t shape[1] = {4};
    fsdp_tensor *t = NULL;
    int count = fsdp_device_count(type);
    fsdp_device past = {type, count};
    char needle[64], own_needle[64];
    snprintf(needle, sizeof needle, "this machine has %d %s device", count,
             fsdp_device_to_string(past));
    snprintf(own_needle, sizeof own_needle, own, count);
    FSDP_TEST_FAILS(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, past, 1, shape, &t), FSDP_ERR_DEVICE,
                    needle);
    CU_ASSERT_PTR_NULL(t);
    void *p = NULL;
    FSDP_TEST_FAILS(fsdp_device_for(type)->alloc(ctx, count, 64, &p), FSDP_ERR_DEVICE, own_needle);
    CU_ASSERT_PTR_NULL(p);
}

/* The run's device kind first; in a CUDA build CUDA's too (here with a count that may be 0). */
static void test_device_out_of_range(void) {
    check_past_last(FSDP_DEVICE_SIM, "%d simulated device");
#ifdef FSDP_HAVE_CUDA
    check_past_last(FSDP_DEVICE_CUDA, "this machine has %d cuda device");
#else
    fsdp_tensor *t = NULL;
    FSDP_TEST_FAILS(fsdp_tensor_create(fsdp_test_ctx(), FSDP_DTYPE_F32,
                                       (fsdp_device){FSDP_DEVICE_CUDA, 0}, 1, (int64_t[]){4}, &t),
                    FSDP_ERR_DEVICE, "no cuda support");
    CU_ASSERT_PTR_NULL(t);
#endif
}

/* ---- helpers: RNG, device buffers, comparisons ---- */

static float *new_uniform(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    for (int64_t i = 0; i < n; i++) p[i] = rng_uniform(lo, hi);
    return p;
}

/* Host bytes to device memory (taken at the call). */
static void dev_put(void *d, const void *host, size_t nbytes) {
    FSDP_TEST_OK(storage()->copy(fsdp_test_ctx(), d, dev(), host, FSDP_CPU, nbytes));
}

/* nbytes of zeroed device memory. */
static void *dev_zeros(size_t nbytes) {
    void *d = NULL;
    FSDP_TEST_OK(storage()->alloc(fsdp_test_ctx(), dev().index, nbytes ? nbytes : 4, &d));
    return d;
}

/* nbytes of device memory holding a copy of host, or when host is NULL every byte 0xFF (NaN in
 * every float dtype), as a block that the caching allocator hands out again holds what its last
 * user left (fsdp_tensor_create_uninit's memory; sim fills it so): an entry that leaves an
 * element of its output unwritten leaves a NaN, which no comparison with the CPU passes. An
 * output the case reads before writing (an accumulating entry's) is given values or zeros. */
static void *dev_new(const void *host, size_t nbytes) {
    void *d = dev_zeros(nbytes);
    if (!nbytes) return d;
    if (host) {
        dev_put(d, host, nbytes);
        return d;
    }
    unsigned char *stale = malloc(nbytes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(stale);
    memset(stale, 0xFF, nbytes);
    dev_put(d, stale, nbytes);
    free(stale);
    return d;
}

static float *dev_floats(const float *host, int64_t n) {
    return dev_new(host, (size_t)n * sizeof(float));
}

/* Device memory to the host (the copy waits for the work queued before it). */
static void dev_get(void *host, const void *d, size_t nbytes) {
    if (nbytes) FSDP_TEST_OK(storage()->copy(fsdp_test_ctx(), host, FSDP_CPU, d, dev(), nbytes));
}

static void dev_free(void *d) {
    storage()->free(dev().index, d);
}

/* Device floats (n) against the CPU's result: bit for bit on sim, within rtol and atol on CUDA
 * (the tolerances are for GPU arithmetic). */
static bool dev_close(const char *name, const float *d, const float *want, int64_t n, double rtol,
                      double atol) {
    float *got = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    dev_get(got, d, (size_t)n * sizeof(float));
    bool ok = fsdp_test_device_close(name, got, want, n, rtol, atol);
    free(got);
    return ok;
}
#define DEV_CLOSE(name, d, want, n, rtol, atol)                                                    \
    CU_ASSERT_TRUE(dev_close((name), (d), (want), (n), (rtol), (atol)))

/* A value the device handed back against the CPU's: equal on sim, within rtol on CUDA. */
static bool close_scalar(const char *name, double got, double want, double rtol) {
    double d = fabs(got - want);
    printf("\n    %-40s got %.17g want %.17g (abs diff %.3g)", name, got, want, d);
    return d <= fsdp_test_device_tol(rtol) * fabs(want) || (isnan(got) && isnan(want));
}
#define CLOSE_S(name, got, want, rtol) CU_ASSERT_TRUE(close_scalar((name), (got), (want), (rtol)))

/* ---- storage ---- */

static void test_alloc_reuse(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const size_t sizes[] = {1, 700, 4096, (1u << 20) + 1, 3u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        void *a = dev_zeros(n);
        unsigned char *junk = malloc(n);
        memset(junk, 0xAB, n);
        FSDP_TEST_OK(storage()->copy(ctx, a, dev(), junk, FSDP_CPU, n));
        dev_free(a);
        fsdp_device_memory before = counters();
        void *b = dev_zeros(n); // the same size again: from the cache, zeroed
        fsdp_device_memory after = counters();
        printf("\n    %zu bytes: device allocations %lld -> %lld, cache hits %lld -> %lld", n,
               (long long)before.device_allocs, (long long)after.device_allocs,
               (long long)before.cache_hits, (long long)after.cache_hits);
        CU_ASSERT_EQUAL(after.device_allocs, before.device_allocs);
        CU_ASSERT_EQUAL(after.cache_hits, before.cache_hits + 1);
        CU_ASSERT_PTR_EQUAL(b, a);
        CU_ASSERT_TRUE(after.in_use >= (int64_t)n && after.reserved >= after.in_use);
        CU_ASSERT_TRUE(after.peak_in_use >= after.in_use);
        dev_get(junk, b, n);
        bool zero = true;
        for (size_t i = 0; i < n; i++) zero = zero && junk[i] == 0;
        CU_ASSERT_TRUE(zero);
        CU_ASSERT_EQUAL(((uintptr_t)b) % 64, 0);
        dev_free(b);
        free(junk);
    }
    empty_cache();
    fsdp_device_memory s = counters();
    CU_ASSERT_EQUAL(s.reserved, s.in_use);

    /* what the device is: its memory the allocator's capacity; on CUDA a name, an sm_80 or
     * later, and the peaks of that name (zeros for a card outside the table) */
    fsdp_device_properties p;
    FSDP_TEST_OK(fsdp_device_get_properties(fsdp_test_ctx(), dev(), &p));
    printf("\n    %s: %lld bytes, sm_%d%d, %d SMs, peaks %g / %g / %g TFLOP/s", p.name,
           (long long)p.total_memory, p.major, p.minor, p.multiprocessors, p.peak_tflops_f32,
           p.peak_tflops_tf32, p.peak_tflops_bf16);
    CU_ASSERT_EQUAL(p.total_memory, s.capacity);
    if (fsdp_test_device_is_cuda()) {
        double f32, tf32, bf16;
        fsdp_gpu_peaks(p.name, &f32, &tf32, &bf16);
        CU_ASSERT_TRUE(p.name[0] != '\0' && p.major >= 8 && p.multiprocessors > 0);
        CU_ASSERT_TRUE(p.peak_tflops_f32 == f32 && p.peak_tflops_tf32 == tf32 &&
                       p.peak_tflops_bf16 == bf16);
    }
}

/* More memory than the device has: out of memory, naming the device and what ran out. */
static void test_alloc_errors(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    void *p = NULL;
    const char *what = fsdp_test_device_is_cuda() ? "cudaMalloc" : "FSDP_SIM_MEMORY";
    char name[32];
    snprintf(name, sizeof name, "%s:%d", fsdp_device_to_string(dev()), dev().index);
    FSDP_TEST_FAILS(storage()->alloc(ctx, dev().index, (size_t)1 << 50, &p), FSDP_ERR_OUT_OF_MEMORY,
                    name, what, "use less memory");
    CU_ASSERT_PTR_NULL(p);
    float x = 3.0f, y = 0.0f; // the failure leaves no error behind
    float *d = dev_floats(&x, 1);
    dev_get(&y, d, sizeof y);
    CU_ASSERT_EQUAL(y, 3.0f);
    dev_free(d);
}

static void test_copy(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_device_i *s = storage();
    rng_seed(1);
    int64_t n = 100003;
    float *h = new_uniform(n, -1, 1), *back = new_uniform(n, 0, 0);
    float *a = dev_floats(h, n), *b = dev_floats(NULL, n);
    FSDP_TEST_OK(s->copy(ctx, b, dev(), a, dev(), (size_t)n * 4));           // D2D
    FSDP_TEST_OK(s->copy(ctx, b + 1, dev(), b, dev(), (size_t)(n - 1) * 4)); // overlapping
    dev_get(back, b, (size_t)n * 4);
    CU_ASSERT_EQUAL(back[0], h[0]);
    CU_ASSERT_EQUAL(memcmp(back + 1, h, (size_t)(n - 1) * 4), 0);
    FSDP_TEST_OK(s->synchronize(ctx, dev().index));

    /* copy_2d: a 5 x 7 box of a 9 x 11 host matrix into a 5 x 8 device one, out again */
    float m[9 * 11], out[5 * 7] = {0};
    for (int i = 0; i < 99; i++) m[i] = (float)i;
    float *box = dev_floats(NULL, 5 * 8);
    FSDP_TEST_OK(s->copy_2d(ctx, box, dev(), 8 * 4, m + 2 * 11 + 3, FSDP_CPU, 11 * 4, 7 * 4, 5));
    float *box2 = dev_floats(NULL, 5 * 8);
    FSDP_TEST_OK(s->copy_2d(ctx, box2, dev(), 8 * 4, box, dev(), 8 * 4, 7 * 4, 5));
    FSDP_TEST_OK(s->copy_2d(ctx, out, FSDP_CPU, 7 * 4, box2, dev(), 8 * 4, 7 * 4, 5));
    bool ok = true;
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 7; c++) ok = ok && out[r * 7 + c] == m[(r + 2) * 11 + c + 3];
    CU_ASSERT_TRUE(ok);

    /* pinned host memory: an asynchronous copy in, synchronize, out */
    float *pinned = NULL;
    FSDP_TEST_OK(fsdp_host_alloc(ctx, dev().type, (size_t)n * 4, (void **)&pinned));
    CU_ASSERT_EQUAL(pinned[n - 1], 0.0f);
    memcpy(pinned, h, (size_t)n * 4);
    FSDP_TEST_OK(s->copy(ctx, b, dev(), pinned, FSDP_CPU, (size_t)n * 4));
    FSDP_TEST_OK(s->synchronize(ctx, dev().index));
    memset(pinned, 0, (size_t)n * 4);
    FSDP_TEST_OK(s->copy(ctx, pinned, FSDP_CPU, b, dev(), (size_t)n * 4));
    CU_ASSERT_EQUAL(memcmp(pinned, h, (size_t)n * 4), 0);
    fsdp_host_free(dev().type, pinned);
    fsdp_host_free(dev().type, NULL);
    dev_free(a), dev_free(b), dev_free(box), dev_free(box2);
    free(h), free(back);
}

static void test_fill_convert(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const fsdp_device_i *s = storage();
    int64_t n = 1027;
    float v = -2.5f, *got = new_uniform(n, 0, 0);
    float *d = dev_floats(NULL, n + 1);
    FSDP_TEST_OK(s->fill(ctx, dev().index, d + 1, &v, 4, n)); // unaligned start
    dev_get(got, d + 1, (size_t)n * 4);
    bool ok = true;
    for (int64_t i = 0; i < n; i++) ok = ok && got[i] == v;
    CU_ASSERT_TRUE(ok);
    fsdp_bf16 hb = fsdp_bf16_from_f32(1.75f), bb[1027];
    fsdp_bf16 *db = dev_new(NULL, (size_t)n * 2);
    FSDP_TEST_OK(s->fill(ctx, dev().index, db, &hb, 2, n));
    dev_get(bb, db, (size_t)n * 2);
    ok = true;
    for (int64_t i = 0; i < n; i++) ok = ok && bb[i] == hb;
    CU_ASSERT_TRUE(ok);
    FSDP_TEST_FAILS(s->fill(ctx, dev().index, d, &v, 8, n), FSDP_ERR_DTYPE, "8 bytes");

    rng_seed(2);
    float *h = new_uniform(n, -100, 100);
    FSDP_TEST_OK(s->copy(ctx, d, dev(), h, FSDP_CPU, (size_t)n * 4));
    FSDP_TEST_OK(s->convert(ctx, dev().index, db, FSDP_DTYPE_BF16, d, FSDP_DTYPE_F32, n));
    dev_get(bb, db, (size_t)n * 2);
    ok = true;
    for (int64_t i = 0; i < n; i++) ok = ok && bb[i] == fsdp_bf16_from_f32(h[i]);
    CU_ASSERT_TRUE(ok);
    FSDP_TEST_OK(s->convert(ctx, dev().index, d, FSDP_DTYPE_F32, db, FSDP_DTYPE_BF16, n));
    dev_get(got, d, (size_t)n * 4);
    ok = true;
    for (int64_t i = 0; i < n; i++) ok = ok && got[i] == fsdp_bf16_to_f32(bb[i]);
    CU_ASSERT_TRUE(ok);
    FSDP_TEST_FAILS(s->convert(ctx, dev().index, d, FSDP_DTYPE_F32, d, FSDP_DTYPE_F32, n),
                    FSDP_ERR_DTYPE, "no conversion");
    dev_free(d), dev_free(db);
    free(got), free(h);
}

/* Tensors on the device through the public API: create, copy from and to the CPU, fill,
 * convert by copying into a bf16 tensor on the same device. */
static void test_tensor(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    int64_t shape[2] = {33, 17}, n = 33 * 17;
    fsdp_tensor *h = NULL, *d = NULL, *d2 = NULL, *db = NULL, *back = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &h));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev(), 2, shape, &d));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev(), 2, shape, &d2));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, dev(), 2, shape, &db));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &back));
    CU_ASSERT_EQUAL(fsdp_tensor_device(d).type, dev().type);
    float *hp = fsdp_tensor_f32(h);
    rng_seed(3);
    for (int64_t i = 0; i < n; i++) hp[i] = rng_uniform(-3, 3);
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, d, h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, d2, d));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, back, d2));
    CU_ASSERT_EQUAL(memcmp(fsdp_tensor_data(back), hp, (size_t)n * 4), 0);
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, db, d)); // f32 -> bf16 on the device
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, d2, db));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, back, d2));
    bool ok = true;
    for (int64_t i = 0; i < n; i++)
        ok = ok && fsdp_tensor_f32(back)[i] == fsdp_bf16_to_f32(fsdp_bf16_from_f32(hp[i]));
    CU_ASSERT_TRUE(ok);
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, d, 0.5f));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, back, d));
    ok = true;
    for (int64_t i = 0; i < n; i++) ok = ok && fsdp_tensor_f32(back)[i] == 0.5f;
    CU_ASSERT_TRUE(ok);
    FSDP_TEST_FAILS(fsdp_tensor_copy(ctx, db, h), FSDP_ERR_DEVICE, "convert on one device");
    fsdp_tensor_free(h), fsdp_tensor_free(d), fsdp_tensor_free(d2), fsdp_tensor_free(db);
    fsdp_tensor_free(back);
}

/* Two threads (two streams) share the device: a block freed by one and taken from the cache
 * by the other, each thread's GEMM against the CPU. */
typedef struct thread_job {
    fsdp_ctx *ctx;
    float *block; // freed by the first thread, allocated again by the second
    bool ok;
} thread_job;

static void *first_thread(void *arg) {
    thread_job *j = arg;
    int64_t n = 1 << 20;
    j->ok = storage()->alloc(j->ctx, dev().index, (size_t)n * 4, (void **)&j->block) == FSDP_OK;
    if (!j->ok) return NULL;
    fsdp_kernels_for(dev())->fill(j->block, 7.0f, n); // queued work still running at the free
    storage()->free(dev().index, j->block);
    return NULL;
}

static void *second_thread(void *arg) {
    thread_job *j = arg;
    int64_t n = 1 << 20;
    float *p = NULL, first = -1.0f;
    j->ok = storage()->alloc(j->ctx, dev().index, (size_t)n * 4, (void **)&p) == FSDP_OK &&
            storage()->copy(j->ctx, &first, FSDP_CPU, p, dev(), 4) == FSDP_OK;
    j->ok = j->ok && p == j->block && first == 0.0f; // zeroed after the first thread's fill
    printf("\n    reused the other thread's block: %s, first element %g",
           p == j->block ? "yes" : "no", first);
    /* this thread's own cuBLAS handle on CUDA, its own default stream on both */
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, C[4];
    float *dA = NULL, *dB = NULL;
    j->ok = j->ok && storage()->alloc(j->ctx, dev().index, 24, (void **)&dA) == FSDP_OK &&
            storage()->alloc(j->ctx, dev().index, 24, (void **)&dB) == FSDP_OK &&
            storage()->copy(j->ctx, dA, dev(), A, FSDP_CPU, 24) == FSDP_OK &&
            storage()->copy(j->ctx, dB, dev(), B, FSDP_CPU, 24) == FSDP_OK;
    if (j->ok) {
        fsdp_kernels_for(dev())->gemm(false, false, 2, 2, 3, 1.0f, dA, 3, dB, 2, 0.0f, p, 2);
        j->ok = storage()->copy(j->ctx, C, FSDP_CPU, p, dev(), 16) == FSDP_OK;
        j->ok = j->ok && C[0] == 4 && C[1] == 5 && C[2] == 10 && C[3] == 11;
    }
    storage()->free(dev().index, dA), storage()->free(dev().index, dB),
        storage()->free(dev().index, p);
    return NULL;
}

static void test_threads(void) {
    empty_cache();
    thread_job j = {.ctx = fsdp_test_ctx()};
    pthread_t t;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, first_thread, &j), 0);
    pthread_join(t, NULL);
    CU_ASSERT_TRUE_FATAL(j.ok);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, second_thread, &j), 0);
    pthread_join(t, NULL);
    CU_ASSERT_TRUE(j.ok);
}

/* ---- kernels against the CPU ---- */

typedef struct gemm_case {
    int64_t M, N, K;
    bool ta, tb;
    int64_t pad; // ld = cols + pad
    float alpha, beta;
    int64_t off; // A, B and C start this many elements into their blocks (unaligned when odd)
} gemm_case;

/* Runs one case on both tables; returns max |diff| / max |C| (the norm-wise error). */
static double gemm_compare(const gemm_case *g, double rtol, bool check) {
    int64_t ar = g->ta ? g->K : g->M, ac = g->ta ? g->M : g->K;
    int64_t br = g->tb ? g->N : g->K, bc = g->tb ? g->K : g->N;
    int64_t lda = ac + g->pad, ldb = bc + g->pad, ldc = g->N + g->pad;
    int64_t off = g->off;
    float *A = new_uniform(ar * lda, -1, 1), *B = new_uniform(br * ldb, -1, 1);
    float *C = new_uniform(g->M * ldc, -1, 1);
    if (g->beta == 0.0f) /* C is not read: NaN stays out of the result (its padding is kept) */
        for (int64_t i = 0; i < g->M; i++)
            for (int64_t j = 0; j < g->N; j++) C[i * ldc + j] = NAN;
    float *dA = dev_floats(NULL, ar * lda + off), *dB = dev_floats(NULL, br * ldb + off);
    float *dC = dev_floats(NULL, g->M * ldc + off);
    dev_put(dA + off, A, (size_t)(ar * lda) * 4), dev_put(dB + off, B, (size_t)(br * ldb) * 4);
    dev_put(dC + off, C, (size_t)(g->M * ldc) * 4);
    fsdp_kernels_for(FSDP_CPU)->gemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, A, lda, B, ldb,
                                     g->beta, C, ldc);
    K()->gemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, dA + off, lda, dB + off, ldb, g->beta,
              dC + off, ldc);
    float *got = new_uniform(g->M * ldc, 0, 0);
    dev_get(got, dC + off, (size_t)(g->M * ldc) * 4);
    double maxd = 0, maxc = 0;
    for (int64_t i = 0; i < g->M * ldc; i++) {
        maxd = fmax(maxd, fabs((double)got[i] - C[i]));
        maxc = fmax(maxc, fabs((double)C[i]));
    }
    if (check) {
        char name[96];
        snprintf(name, sizeof name, "gemm %lldx%lldx%lld%s%s ld+%lld off %lld", (long long)g->M,
                 (long long)g->N, (long long)g->K, g->ta ? " A^T" : "", g->tb ? " B^T" : "",
                 (long long)g->pad, (long long)off);
        // f32 sums of K products in another order: 1e-5 relative, plus K roundings near 0
        CU_ASSERT_TRUE(
            fsdp_test_device_close(name, got, C, g->M * ldc, rtol, 1e-6 * (double)(g->K + 1)));
    }
    free(A), free(B), free(C), free(got);
    dev_free(dA), dev_free(dB), dev_free(dC);
    return maxc > 0 ? maxd / maxc : maxd;
}

static void test_gemm(void) {
    rng_seed(10);
    const gemm_case cases[] = {
        {1, 1, 1, false, false, 0, 1, 0, 0},       {7, 5, 3, false, false, 0, 1, 0, 0},
        {7, 5, 3, true, false, 2, 1.5f, 0.5f, 0},  {7, 5, 3, false, true, 1, 1, 1, 0},
        {7, 5, 3, true, true, 3, -1, 0.25f, 0},    {64, 48, 33, false, false, 0, 1, 0, 0},
        {129, 65, 257, false, true, 0, 1, 0, 0},   {129, 65, 257, true, false, 5, 0.5f, 2, 0},
        {256, 384, 512, false, false, 0, 1, 0, 0}, {17, 9, 0, false, false, 1, 1, 0.5f, 0},
        {17, 9, 0, true, true, 0, 1, 0, 0},        {0, 9, 4, false, false, 0, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) gemm_compare(&cases[i], 1e-5, true);
}

static void test_gemm_tf32(void) {
    if (!cuda_only("TF32 for f32 GEMMs (fsdp_cuda_thread_set_tf32)")) return;
#ifdef FSDP_HAVE_CUDA
    rng_seed(11);
    gemm_case big = {512, 512, 1024, false, true, 0, 1, 0, 0};
    CU_ASSERT_FALSE(fsdp_cuda_thread_tf32()); // off by default
    fsdp_cuda_thread_set_tf32(true);
    double err = gemm_compare(&big, 0, false);
    printf("\n    TF32 GEMM 512x512x1024: max |diff| / max |C| = %.3g", err);
    CU_ASSERT_TRUE(err < 3e-3);
    fsdp_cuda_thread_set_tf32(false);
    err = gemm_compare(&big, 1e-5, true); // exact f32 again
    CU_ASSERT_TRUE(err < 1e-5);
#endif
}

static void test_bias(void) {
    rng_seed(12);
    /* 5000 x 33 and 20000 x 3: the column sums split the rows into chunks (few columns, many
     * rows), summed per chunk and then over the chunks */
    const int64_t shapes[][2] = {{37, 70}, {1000, 33}, {1, 1}, {5000, 33}, {20000, 3}};
    for (int s = 0; s < 5; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float *out = new_uniform(n, -1, 1), *bias = new_uniform(cols, -1, 1);
        float *db = new_uniform(cols, -1, 1);
        float *d_out = dev_floats(out, n), *d_bias = dev_floats(bias, cols);
        float *d_db = dev_floats(db, cols);
        fsdp_kernels_for(FSDP_CPU)->bias_add(out, bias, rows, cols);
        K()->bias_add(d_out, d_bias, rows, cols);
        DEV_CLOSE("bias_add", d_out, out, n, 1e-6, 0);
        fsdp_kernels_for(FSDP_CPU)->bias_backward(db, out, rows, cols);
        K()->bias_backward(d_db, d_out, rows, cols);
        DEV_CLOSE("bias_backward (+=)", d_db, db, cols, 1e-5, 1e-6);
        free(out), free(bias), free(db);
        dev_free(d_out), dev_free(d_bias), dev_free(d_db);
    }
}

typedef void (*unary_fn)(float *out, const float *inp, int64_t n);
typedef void (*binary_fn)(float *out, const float *a, const float *b, int64_t n);

/* out = f(inp) on both tables, out of place at offset `off` floats and in place. */
static void check_unary(const char *name, unary_fn cpu, unary_fn on_dev, int64_t n, int64_t off,
                        float lo, float hi) {
    float *x = new_uniform(n + off, lo, hi), *want = new_uniform(n + off, 0, 0);
    float *dx = dev_floats(x, n + off), *dy = dev_floats(NULL, n + off);
    cpu(want + off, x + off, n);
    on_dev(dy + off, dx + off, n);
    DEV_CLOSE(name, dy + off, want + off, n, 1e-5, 1e-6);
    on_dev(dx + off, dx + off, n); // in place
    DEV_CLOSE(name, dx + off, want + off, n, 1e-5, 1e-6);
    free(x), free(want);
    dev_free(dx), dev_free(dy);
}

/* in_place: also run with out == the second input (not for composites that write out first). */
static void check_binary_at(const char *name, binary_fn cpu, binary_fn on_dev, int64_t n,
                            int64_t off, float lo, float hi, bool in_place) {
    float *a = new_uniform(n + off, lo, hi), *b = new_uniform(n + off, -1, 1);
    float *want = new_uniform(n + off, 0, 0);
    float *da = dev_floats(a, n + off), *db = dev_floats(b, n + off);
    float *dy = dev_floats(NULL, n + off);
    cpu(want + off, a + off, b + off, n);
    on_dev(dy + off, da + off, db + off, n);
    DEV_CLOSE(name, dy + off, want + off, n, 1e-5, 1e-6);
    if (in_place) {
        on_dev(db + off, da + off, db + off, n); // in place over the second input
        DEV_CLOSE(name, db + off, want + off, n, 1e-5, 1e-6);
    }
    free(a), free(b), free(want);
    dev_free(da), dev_free(db), dev_free(dy);
}

static void check_binary(const char *name, binary_fn cpu, binary_fn on_dev, int64_t n, int64_t off,
                         float lo, float hi) {
    check_binary_at(name, cpu, on_dev, n, off, lo, hi, true);
}

static const int64_t sizes[] = {1, 3, 1001, 4099, 1 << 18};

static void test_activations(void) {
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU), *g = K();
    rng_seed(13);
    for (int s = 0; s < 5; s++)
        for (int64_t off = 0; off < 2; off++) {
            int64_t n = sizes[s];
            check_unary("relu_forward", c->relu_forward, g->relu_forward, n, off, -3, 3);
            check_binary("relu_backward", c->relu_backward, g->relu_backward, n, off, -3, 3);
            check_unary("sigmoid_forward", c->sigmoid_forward, g->sigmoid_forward, n, off, -30, 30);
            check_binary("sigmoid_backward", c->sigmoid_backward, g->sigmoid_backward, n, off, 0,
                         1);
            check_unary("gelu_forward", c->gelu_forward, g->gelu_forward, n, off, -12, 12);
            check_binary("gelu_backward", c->gelu_backward, g->gelu_backward, n, off, -12, 12);
        }
}

/* the table's entries with other argument orders, as unary/binary functions (axpy's copies the
 * first input into out first, so it cannot run with out == the second input) */
static void cpu_axpy(float *y, const float *a, const float *x, int64_t n) {
    fsdp_kernels_for(FSDP_CPU)->copy(y, a, n);
    fsdp_kernels_for(FSDP_CPU)->axpy(y, -0.75f, x, n);
}
static void dev_axpy(float *y, const float *a, const float *x, int64_t n) {
    K()->copy(y, a, n);
    K()->axpy(y, -0.75f, x, n);
}
static void cpu_scale(float *out, const float *x, int64_t n) {
    fsdp_kernels_for(FSDP_CPU)->scale(out, x, 1.25f, n);
}
static void dev_scale(float *out, const float *x, int64_t n) {
    K()->scale(out, x, 1.25f, n);
}
static void cpu_fill(float *out, const float *x, int64_t n) {
    (void)x;
    fsdp_kernels_for(FSDP_CPU)->fill(out, 0.3f, n);
}
static void dev_fill(float *out, const float *x, int64_t n) {
    (void)x;
    K()->fill(out, 0.3f, n);
}

/* add3 and add3_round_bf16 with the first input again as the third, (a + b) + a (their bits
 * against add and round_bf16 composed: test_dx_sum) */
static void cpu_add3(float *out, const float *a, const float *b, int64_t n) {
    fsdp_kernels_for(FSDP_CPU)->add3(out, a, b, a, n);
}
static void dev_add3(float *out, const float *a, const float *b, int64_t n) {
    K()->add3(out, a, b, a, n);
}
static void cpu_add3_round_bf16(float *out, const float *a, const float *b, int64_t n) {
    fsdp_kernels_for(FSDP_CPU)->add3_round_bf16(out, a, b, a, n);
}
static void dev_add3_round_bf16(float *out, const float *a, const float *b, int64_t n) {
    K()->add3_round_bf16(out, a, b, a, n);
}

/* add_bf16 with the second input rounded to bf16 first (f32_to_bf16 into a scratch), so both
 * sides read the same bf16 values (its bits against add on widened values: test_bf16_residual) */
static void cpu_add_bf16(float *out, const float *a, const float *b, int64_t n) {
    fsdp_bf16 *b16 = malloc((size_t)(n > 0 ? n : 1) * sizeof *b16);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b16);
    fsdp_kernels_for(FSDP_CPU)->f32_to_bf16(b16, b, n);
    fsdp_kernels_for(FSDP_CPU)->add_bf16(out, a, b16, n);
    free(b16);
}
static void dev_add_bf16(float *out, const float *a, const float *b, int64_t n) {
    fsdp_bf16 *b16 = (fsdp_bf16 *)dev_floats(NULL, n); /* 4 n bytes hold n bf16 */
    K()->f32_to_bf16(b16, b, n);
    K()->add_bf16(out, a, b16, n);
    dev_free(b16);
}

static void test_elementwise(void) {
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU), *g = K();
    rng_seed(14);
    for (int s = 0; s < 5; s++)
        for (int64_t off = 0; off < 2; off++) {
            int64_t n = sizes[s];
            check_binary("add", c->add, g->add, n, off, -5, 5);
            check_binary("add3", cpu_add3, dev_add3, n, off, -5, 5);
            check_binary("add3_round_bf16", cpu_add3_round_bf16, dev_add3_round_bf16, n, off, -5,
                         5);
            check_binary("add_bf16", cpu_add_bf16, dev_add_bf16, n, off, -5, 5);
            check_binary_at("axpy", cpu_axpy, dev_axpy, n, off, -5, 5, false);
            check_unary("scale", cpu_scale, dev_scale, n, off, -5, 5);
            check_unary("copy", c->copy, g->copy, n, off, -5, 5);
            check_unary("fill", cpu_fill, dev_fill, n, off, -5, 5);
        }
}

static void test_rmsnorm(void) {
    rng_seed(15);
    /* CUDA's backward: 4096 x 96 and 2000 x 768 (shape S's width) in the fused form, 1024 and
     * 1000 chunks of rows; the widths at its shared-memory limit (a double per column beside the
     * kernel's 272 bytes of block sums within 48 KiB): 6110 fused, 6144 and 5 x 7000 the
     * two-pass form */
    const int64_t shapes[][2] = {{17, 1000},  {3, 4097}, {300, 64}, {1, 1},   {4096, 96},
                                 {2000, 768}, {5, 7000}, {3, 6110}, {3, 6144}};
    for (int s = 0; s < 9; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float *x = new_uniform(n, -2, 2), *w = new_uniform(cols, 0.5f, 1.5f);
        float *dy = new_uniform(n, -1, 1), *dw = new_uniform(cols, -1, 1);
        float *out = new_uniform(n, 0, 0), *rstd = new_uniform(rows, 0, 0);
        float *dx = new_uniform(n, 0, 0);
        float *d_x = dev_floats(x, n), *d_w = dev_floats(w, cols), *d_dy = dev_floats(dy, n);
        float *d_dw = dev_floats(dw, cols), *d_out = dev_floats(NULL, n);
        float *d_rstd = dev_floats(NULL, rows), *d_dx = dev_floats(NULL, n);
        const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU);
        c->rmsnorm_forward(out, rstd, x, w, 1e-5f, rows, cols);
        K()->rmsnorm_forward(d_out, d_rstd, d_x, d_w, 1e-5f, rows, cols);
        DEV_CLOSE("rmsnorm_forward out", d_out, out, n, 1e-5, 1e-6);
        DEV_CLOSE("rmsnorm_forward rstd", d_rstd, rstd, rows, 1e-5, 0);
        c->rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, cols);
        K()->rmsnorm_backward(d_dx, d_dw, d_dy, d_x, d_w, d_rstd, rows, cols);
        DEV_CLOSE("rmsnorm_backward dinp", d_dx, dx, n, 1e-5, 1e-6);
        DEV_CLOSE("rmsnorm_backward dweight (+=)", d_dw, dw, cols, 1e-5, 1e-6);
        /* with a residual gradient added: dres + dinp, one correctly rounded add after dinp on
         * both, so dinp's difference is carried as is; the bound's absolute term covers a sum
         * that cancels (|dres|, |dinp| of order 1 here) */
        float *dres = new_uniform(n, -1, 1), *d_dres = dev_floats(dres, n);
        c->rmsnorm_backward_add(dx, dw, dy, dres, x, w, rstd, rows, cols);
        K()->rmsnorm_backward_add(d_dx, d_dw, d_dy, d_dres, d_x, d_w, d_rstd, rows, cols);
        DEV_CLOSE("rmsnorm_backward_add dinp", d_dx, dx, n, 1e-5, 1e-6);
        DEV_CLOSE("rmsnorm_backward_add dweight (+=)", d_dw, dw, cols, 1e-5, 1e-6);
        free(x), free(w), free(dy), free(dw), free(out), free(rstd), free(dx), free(dres);
        dev_free(d_x), dev_free(d_w), dev_free(d_dy), dev_free(d_dw), dev_free(d_out);
        dev_free(d_rstd), dev_free(d_dx), dev_free(d_dres);
    }
}

static void test_reductions(void) {
    rng_seed(16);
    const int64_t ns[] = {0, 1, 1000, (1 << 20) + 7};
    for (int s = 0; s < 4; s++) {
        int64_t n = ns[s];
        float *x = new_uniform(n, -1, 1);
        float *d = dev_floats(x, n);
        const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU);
        CLOSE_S("sum", K()->sum(d, n), c->sum(x, n), 1e-10);
        CLOSE_S("sum_squares", K()->sum_squares(d, n), c->sum_squares(x, n), 1e-10);
        CU_ASSERT_EQUAL(K()->max_abs(d, n), c->max_abs(x, n));
        if (n > 1) { // max |x| at the end, then a NaN
            float big = -3.5f, nan = NAN;
            dev_put(d + n - 1, &big, 4);
            CU_ASSERT_EQUAL(K()->max_abs(d, n), 3.5);
            dev_put(d + 1, &nan, 4);
            CU_ASSERT_TRUE(isnan(K()->max_abs(d, n)));
        }
        free(x);
        dev_free(d);
    }
}

static void test_losses(void) {
    rng_seed(17);
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU);
    const int64_t ns[] = {1, 1001, 300000};
    for (int s = 0; s < 3; s++) {
        int64_t n = ns[s];
        float *out = new_uniform(n, -2, 2), *tgt = new_uniform(n, -2, 2);
        float *dout = new_uniform(n, 0, 0), loss = 0, dloss = 0;
        float *d_out = dev_floats(out, n), *d_tgt = dev_floats(tgt, n);
        float *d_dout = dev_floats(NULL, n);
        c->mse_loss(&loss, dout, out, tgt, n);
        K()->mse_loss(&dloss, d_dout, d_out, d_tgt, n);
        CLOSE_S("mse_loss", dloss, loss, 1e-6);
        DEV_CLOSE("mse_loss dout", d_dout, dout, n, 1e-6, 0);
        K()->mse_loss(&dloss, NULL, d_out, d_tgt, n);
        CLOSE_S("mse_loss (no gradient)", dloss, loss, 1e-6);
        free(out), free(tgt), free(dout);
        dev_free(d_out), dev_free(d_tgt), dev_free(d_dout);
    }
    const int64_t shapes[][2] = {{1, 1}, {7, 10}, {64, 1000}, {2000, 3}, {3, 50000}};
    for (int s = 0; s < 5; s++) {
        int64_t rows = shapes[s][0], classes = shapes[s][1], n = rows * classes;
        float *x = new_uniform(n, -8, 8), *dx = new_uniform(n, 0, 0), loss = 0, dloss = 0;
        if (s == 1) x[3] = 200.0f; // exp would overflow without the max shift
        int32_t *t = malloc((size_t)rows * sizeof *t);
        for (int64_t r = 0; r < rows; r++) t[r] = (int32_t)(rng_u32() % (uint32_t)classes);
        float *d_x = dev_floats(x, n), *d_dx = dev_floats(NULL, n);
        int32_t *d_t = dev_new(t, (size_t)rows * sizeof *t);
        c->cross_entropy(&loss, dx, x, t, rows, classes);
        K()->cross_entropy(&dloss, d_dx, d_x, d_t, rows, classes);
        CLOSE_S("cross_entropy", dloss, loss, 1e-6);
        DEV_CLOSE("cross_entropy dlogits", d_dx, dx, n, 1e-5, 1e-9);
        K()->cross_entropy(&dloss, d_x, d_x, d_t, rows, classes); // in place
        CLOSE_S("cross_entropy (in place)", dloss, loss, 1e-6);
        DEV_CLOSE("cross_entropy dlogits (in place)", d_x, dx, n, 1e-5, 1e-9);
        free(x), free(dx), free(t);
        dev_free(d_x), dev_free(d_dx), dev_free(d_t);
    }
}

/* Two device arrays of nbytes hold the same bytes (on every device: a contract between two
 * entries of the device's own table); prints how many bytes differ. */
static bool dev_same(const char *name, const void *a, const void *b, size_t nbytes) {
    unsigned char *x = malloc(nbytes ? nbytes : 1), *y = malloc(nbytes ? nbytes : 1);
    CU_ASSERT_FATAL(x != NULL && y != NULL);
    dev_get(x, a, nbytes), dev_get(y, b, nbytes);
    size_t bad = 0;
    for (size_t i = 0; i < nbytes; i++) bad += x[i] != y[i];
    printf("\n    %-40s %zu of %zu bytes differ", name, bad, nbytes);
    free(x), free(y);
    return bad == 0;
}

/* The row-wise kernels past their grids. CUDA gives each row (or each run of a row's tokens) a
 * block, at most 65535 of them (fsdp_row_blocks), and the cross-entropy with ignored rows at most
 * 1024, each block then striding over the rest; the benchmark shapes (16384 and 8192 rows) never
 * take those strides, 70001 rows of few columns do, in a few MB. RMSNorm forward (f32, and the
 * bf16 output bit for bit the device's f32 one rounded, with its rstd), backward (CUDA's
 * fused form: 1015 chunks of 69 rows) and backward_add; the cross-entropy with a fifth
 * of the rows ignored, over f32 logits and over bf16 ones (f32 and bf16 gradients: the bits of
 * the device's f32 entry on the widened logits, then rounded); loss parallel's row maxima, sums
 * and gradient over a shard [3, 10) of a 13-class vocabulary; the embedding backward of 70001
 * tokens over 50000 rows (more run starts than blocks), a frequent token among them, over the
 * table and over a vocabulary range. Against the CPU table: bit for bit on sim; on CUDA within
 * test_rmsnorm's, test_losses' and test_llama_cuda's tolerances (the same arithmetic, the sums
 * in double in another order), the maxima, target logits and embedding bit for bit. */
static void test_row_grids(void) {
    enum { R = 70001, C = 16, V = 7, TABLE = 50000, EC = 3 };
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU), *g = K();
    CU_ASSERT_TRUE_FATAL(g->rmsnorm_forward_bf16 && g->rmsnorm_backward_add &&
                         g->cross_entropy_ignore && g->cross_entropy_ignore_bf16 &&
                         g->vocab_row_max && g->vocab_exp_sums && g->vocab_ce_grad &&
                         g->embedding_backward);
    rng_seed(38);
    const int64_t n = (int64_t)R * C;
    /* RMSNorm */
    float *x = new_uniform(n, -2, 2), *w = new_uniform(C, 0.5f, 1.5f), *dy = new_uniform(n, -1, 1);
    float *dres = new_uniform(n, -1, 1), *dw = new_uniform(C, -1, 1), *out = new_uniform(n, 0, 0);
    float *rstd = new_uniform(R, 0, 0), *dx = new_uniform(n, 0, 0);
    float *d_x = dev_floats(x, n), *d_w = dev_floats(w, C), *d_dy = dev_floats(dy, n);
    float *d_dres = dev_floats(dres, n), *d_dw = dev_floats(dw, C), *d_out = dev_floats(NULL, n);
    float *d_rstd = dev_floats(NULL, R), *d_rstd16 = dev_floats(NULL, R);
    float *d_dx = dev_floats(NULL, n);
    fsdp_bf16 *d_o16 = dev_new(NULL, (size_t)n * 2), *d_r16 = dev_new(NULL, (size_t)n * 2);
    c->rmsnorm_forward(out, rstd, x, w, 1e-5f, R, C);
    g->rmsnorm_forward(d_out, d_rstd, d_x, d_w, 1e-5f, R, C);
    DEV_CLOSE("rmsnorm_forward out", d_out, out, n, 1e-5, 1e-6);
    DEV_CLOSE("rmsnorm_forward rstd", d_rstd, rstd, R, 1e-5, 0);
    g->rmsnorm_forward_bf16(d_o16, d_rstd16, d_x, d_w, 1e-5f, R, C);
    g->f32_to_bf16(d_r16, d_out, n);
    CU_ASSERT_TRUE(dev_same("rmsnorm_forward_bf16 out", d_o16, d_r16, (size_t)n * 2));
    CU_ASSERT_TRUE(dev_same("rmsnorm_forward_bf16 rstd", d_rstd16, d_rstd, (size_t)R * 4));
    c->rmsnorm_backward(dx, dw, dy, x, w, rstd, R, C);
    g->rmsnorm_backward(d_dx, d_dw, d_dy, d_x, d_w, d_rstd, R, C);
    DEV_CLOSE("rmsnorm_backward dinp", d_dx, dx, n, 1e-5, 1e-6);
    DEV_CLOSE("rmsnorm_backward dweight (+=)", d_dw, dw, C, 1e-5, 1e-6);
    c->rmsnorm_backward_add(dx, dw, dy, dres, x, w, rstd, R, C);
    g->rmsnorm_backward_add(d_dx, d_dw, d_dy, d_dres, d_x, d_w, d_rstd, R, C);
    DEV_CLOSE("rmsnorm_backward_add dinp", d_dx, dx, n, 1e-5, 1e-6);
    DEV_CLOSE("rmsnorm_backward_add dweight (+=)", d_dw, dw, C, 1e-5, 1e-6);
    free(x), free(w), free(dy), free(dres), free(dw), free(out), free(rstd), free(dx);
    dev_free(d_x), dev_free(d_w), dev_free(d_dy), dev_free(d_dres), dev_free(d_dw);
    dev_free(d_out), dev_free(d_rstd), dev_free(d_rstd16), dev_free(d_dx), dev_free(d_o16);
    dev_free(d_r16);

    /* the cross-entropy with ignored rows, and loss parallel's pieces */
    const int64_t nl = (int64_t)R * V;
    int32_t *t = malloc(R * sizeof *t), *ts = malloc(R * sizeof *ts);
    CU_ASSERT_FATAL(t != NULL && ts != NULL);
    int64_t counted = 0;
    for (int64_t r = 0; r < R; r++) {
        bool ignored = r % 5 == 1;
        t[r] = ignored ? -100 : (int32_t)(rng_u32() % V);
        ts[r] = ignored ? -100 : (int32_t)(rng_u32() % (V + 6)); /* the shard holds [3, 3 + V) */
        counted += !ignored;
    }
    float *lg = new_uniform(nl, -4, 4), *dl = new_uniform(nl, 0, 0), lc = 0, ld = 0, lb = 0;
    float *d_lg = dev_floats(lg, nl), *d_dl = dev_floats(NULL, nl), *d_lw = dev_floats(NULL, nl);
    float *d_db = dev_floats(NULL, nl);
    fsdp_bf16 *d_l16 = dev_new(NULL, (size_t)nl * 2), *d_d16 = dev_new(NULL, (size_t)nl * 2);
    fsdp_bf16 *d_w16 = dev_new(NULL, (size_t)nl * 2);
    int32_t *d_t = dev_new(t, R * sizeof *t), *d_ts = dev_new(ts, R * sizeof *ts);
    c->cross_entropy_ignore(&lc, dl, lg, t, -100, R, V);
    g->cross_entropy_ignore(&ld, d_dl, d_lg, d_t, -100, R, V);
    CLOSE_S("cross_entropy_ignore", ld, lc, 1e-6);
    DEV_CLOSE("cross_entropy_ignore dlogits", d_dl, dl, nl, 1e-5, 1e-8);
    /* over bf16 logits: the f32 entry's bits on the widened logits, gradients f32 and bf16 */
    g->f32_to_bf16(d_l16, d_lg, nl);
    g->bf16_to_f32(d_lw, d_l16, nl);
    g->cross_entropy_ignore(&ld, d_dl, d_lw, d_t, -100, R, V);
    g->cross_entropy_ignore_bf16(&lb, d_db, FSDP_DTYPE_F32, d_l16, d_t, -100, R, V);
    CU_ASSERT_EQUAL(memcmp(&lb, &ld, sizeof lb), 0);
    CU_ASSERT_TRUE(dev_same("cross_entropy_ignore_bf16 dlogits", d_db, d_dl, (size_t)nl * 4));
    g->cross_entropy_ignore_bf16(&lb, d_d16, FSDP_DTYPE_BF16, d_l16, d_t, -100, R, V);
    g->f32_to_bf16(d_w16, d_dl, nl);
    CU_ASSERT_EQUAL(memcmp(&lb, &ld, sizeof lb), 0);
    CU_ASSERT_TRUE(
        dev_same("cross_entropy_ignore_bf16 dlogits (bf16)", d_d16, d_w16, (size_t)nl * 2));
    /* loss parallel: mx, se, xt in vs (3 R), the gradient over the counted rows */
    float *vs = new_uniform(3 * R, 0, 0), *d_vs = dev_floats(NULL, 3 * R);
    c->vocab_row_max(vs, lg, R, V);
    g->vocab_row_max(d_vs, d_lg, R, V);
    c->vocab_exp_sums(vs + R, vs + 2 * R, lg, vs, ts, -100, 3, R, V);
    g->vocab_exp_sums(d_vs + R, d_vs + 2 * R, d_lg, d_vs, d_ts, -100, 3, R, V);
    DEV_CLOSE("vocab_row_max", d_vs, vs, R, 0, 0);
    DEV_CLOSE("vocab_exp_sums se", d_vs + R, vs + R, R, 1e-6, 0);
    DEV_CLOSE("vocab_exp_sums xt", d_vs + 2 * R, vs + 2 * R, R, 0, 0);
    c->vocab_ce_grad(dl, lg, vs, vs + R, ts, -100, 3, R, V, counted);
    g->vocab_ce_grad(d_dl, d_lg, d_vs, d_vs + R, d_ts, -100, 3, R, V, counted);
    DEV_CLOSE("vocab_ce_grad", d_dl, dl, nl, 1e-5, 1e-8);
    free(t), free(ts), free(lg), free(dl), free(vs);
    dev_free(d_lg), dev_free(d_dl), dev_free(d_lw), dev_free(d_db), dev_free(d_l16);
    dev_free(d_d16), dev_free(d_w16), dev_free(d_t), dev_free(d_ts), dev_free(d_vs);

    /* the embedding backward: each row's token rows added in token order on both, bit for bit */
    int32_t *tok = malloc(R * sizeof *tok);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
    for (int64_t i = 0; i < R; i++) tok[i] = i % 9 == 0 ? 7 : (int32_t)(rng_u32() % TABLE);
    float *ey = new_uniform((int64_t)R * EC, -1, 1), *ew = new_uniform((int64_t)TABLE * EC, -1, 1);
    float *d_ey = dev_floats(ey, (int64_t)R * EC), *d_ew = dev_floats(ew, (int64_t)TABLE * EC);
    int32_t *d_tok = dev_new(tok, R * sizeof *tok);
    c->embedding_backward(ew, ey, tok, R, EC, 0, TABLE);
    g->embedding_backward(d_ew, d_ey, d_tok, R, EC, 0, TABLE);
    DEV_CLOSE("embedding_backward", d_ew, ew, (int64_t)TABLE * EC, 0, 0);
    c->embedding_backward(ew + 1000 * EC, ey, tok, R, EC, 1000, 30000);
    g->embedding_backward(d_ew + 1000 * EC, d_ey, d_tok, R, EC, 1000, 30000);
    DEV_CLOSE("embedding_backward of a vocabulary range", d_ew, ew, (int64_t)TABLE * EC, 0, 0);
    free(tok), free(ey), free(ew);
    dev_free(d_ey), dev_free(d_ew), dev_free(d_tok);
}

static uint32_t f32_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static float bits_f32(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

static void test_bf16(void) {
    const uint32_t special[] = {
        0x3F808000u, 0x3F818000u, 0x3F80C000u, 0x3F807FFFu, // ties to even both ways, near ties
        0x7F800001u, 0xFFC00001u, 0x7FFFFFFFu, 0x7F800000u, // NaNs (signalling too), inf
        0xFF800000u, 0x80000000u, 0x00000001u, 0x007FFFFFu, // -inf, -0, denormals
        0x7F7FFFFFu, 0x7F7F8000u, 0xFF7FFFFFu, 0x00008000u, // max (rounds to inf), ties at 0
    };
    int64_t nspec = sizeof special / sizeof *special, n = nspec + 100003;
    float *x = new_uniform(n + 4, 0, 0); // the device copy holds 4 floats more (zeros)
    rng_seed(18);
    for (int64_t i = 0; i < n; i++) x[i] = bits_f32(i < nspec ? special[i] : rng_u32());
    fsdp_bf16 *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
    fsdp_kernels_for(FSDP_CPU)->f32_to_bf16(want, x, n);
    float *d = dev_floats(x, n + 4);
    fsdp_bf16 *db = dev_new(NULL, (size_t)(n + 4) * 2);
    for (int off = 0; off < 2; off++) { // aligned (vector) and unaligned (scalar) paths
        K()->f32_to_bf16(db + off, d + off, n - off);
        dev_get(got, db + off, (size_t)(n - off) * 2);
        int64_t bad = 0;
        for (int64_t i = 0; i < n - off; i++)
            bad += got[i] != want[i + off] || got[i] != fsdp_bf16_from_f32(x[i + off]);
        printf("\n    f32_to_bf16 (offset %d): %lld of %lld differ from the CPU", off,
               (long long)bad, (long long)(n - off));
        CU_ASSERT_EQUAL(bad, 0);
        K()->bf16_to_f32(d + off, db + off, n - off);
        float *back = new_uniform(n, 0, 0);
        dev_get(back, d + off, (size_t)(n - off) * 4);
        bad = 0;
        for (int64_t i = 0; i < n - off; i++)
            bad += f32_bits(back[i]) != (uint32_t)want[i + off] << 16;
        CU_ASSERT_EQUAL(bad, 0);
        // round_bf16 in place: the bits of the narrowing then the widening, on the CPU and the
        // device (every special value above, both paths of the kernel)
        dev_put(d, x, (size_t)n * 4);
        K()->round_bf16(d + off, n - off);
        dev_get(back, d + off, (size_t)(n - off) * 4);
        float *host = malloc((size_t)n * 4);
        CU_ASSERT_PTR_NOT_NULL_FATAL(host);
        memcpy(host, x, (size_t)n * 4);
        fsdp_kernels_for(FSDP_CPU)->round_bf16(host + off, n - off);
        int64_t bad_cpu = 0;
        bad = 0;
        for (int64_t i = 0; i < n - off; i++) {
            bad_cpu += f32_bits(host[i + off]) != (uint32_t)want[i + off] << 16;
            bad += f32_bits(back[i]) != (uint32_t)want[i + off] << 16;
        }
        printf("\n    round_bf16 (offset %d): %lld CPU and %lld device elements unlike the "
               "conversions'",
               off, (long long)bad_cpu, (long long)bad);
        CU_ASSERT_EQUAL(bad_cpu, 0);
        CU_ASSERT_EQUAL(bad, 0);
        free(back), free(host);
        dev_put(d, x, (size_t)n * 4);
    }
    free(x), free(want), free(got);
    dev_free(d), dev_free(db);
}

/* Whether two elements of dtype hold the same bits, or are both NaN: a NaN's sign and payload
 * are not results (an x86 CPU gives -NaN where a GPU gives its canonical +NaN). */
static bool same_element(fsdp_dtype dtype, const void *a, const void *b) {
    const size_t esize = fsdp_dtype_size(dtype);
    if (memcmp(a, b, esize) == 0) return true;
    if (dtype == FSDP_DTYPE_F32) {
        float x, y;
        memcpy(&x, a, 4), memcpy(&y, b, 4);
        return isnan(x) && isnan(y);
    }
    uint16_t x, y;
    memcpy(&x, a, 2), memcpy(&y, b, 2);
    const uint16_t exp = dtype == FSDP_DTYPE_BF16 ? 0x7f80 : 0x7c00; // the all-ones exponent
    const bool xn = (x & exp) == exp && (x & ~exp & 0x7fff),
               yn = (y & exp) == exp && (y & ~exp & 0x7fff);
    return xn && yn;
}

/* reduce_n (the collectives' fused reduction) equals the CPU's bits on every device: the inputs
 * combined in order, in f32 (bf16 and f16 widened, the result rounded once; CUDA without FMA
 * contraction), for sums, averages and maxima (NaN wins, its sign and payload unchecked), 1 to
 * 5 inputs, the f32 scales and accumulate, and the output aliasing the first input. */
static void test_reduce_n(void) {
    const fsdp_dtype dtypes[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    const fsdp_reduce_n_args variants[] = {
        {FSDP_REDUCE_KIND_SUM, 1.0f, 1.0f, false}, {FSDP_REDUCE_KIND_AVG, 1.0f, 1.0f, false},
        {FSDP_REDUCE_KIND_MAX, 1.0f, 1.0f, false}, {FSDP_REDUCE_KIND_SUM, 0.5f, 3.0f, false},
        {FSDP_REDUCE_KIND_AVG, 1.0f, 0.25f, true}, {FSDP_REDUCE_KIND_SUM, 1.0f, 1.0f, true},
    };
    const int64_t count = 1003;
    rng_seed(31);
    for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++) {
        const fsdp_dtype dtype = dtypes[t];
        const size_t esize = fsdp_dtype_size(dtype), bytes = (size_t)count * esize;
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
            const fsdp_reduce_n_args *a = &variants[v];
            bool scaled = a->pre_scale != 1.0f || a->post_scale != 1.0f || a->accumulate;
            if (scaled && dtype != FSDP_DTYPE_F32) continue; /* f32 sums only */
            for (int n = 1; n <= 5; n++) {
                for (int alias = 0; alias < 2; alias++) {
                    unsigned char *host[6], *want = malloc(bytes), *got = malloc(bytes);
                    const void *cpu_in[5], *dev_in[5];
                    void *dev_buf[6];
                    for (int r = 0; r <= n; r++) { /* r == n: the output's starting values */
                        float *x = new_uniform(count, -100.0f, 100.0f);
                        if (r == 1) x[7] = NAN; /* max: NaN wins; sums: NaN propagates */
                        host[r] = malloc(bytes);
                        for (int64_t i = 0; i < count; i++) {
                            if (dtype == FSDP_DTYPE_F32)
                                memcpy(host[r] + 4 * i, &x[i], 4);
                            else if (dtype == FSDP_DTYPE_BF16)
                                ((fsdp_bf16 *)host[r])[i] = fsdp_bf16_from_f32(x[i]);
                            else
                                ((fsdp_f16 *)host[r])[i] = fsdp_f16_from_f32(x[i] * 0.01f);
                        }
                        free(x);
                        dev_buf[r] = dev_new(host[r], bytes);
                        if (r < n) cpu_in[r] = host[r], dev_in[r] = dev_buf[r];
                    }
                    unsigned char *cpu_out = alias ? host[0] : host[n];
                    void *dev_out = alias ? dev_buf[0] : dev_buf[n];
                    fsdp_kernels_for(FSDP_CPU)->reduce_n(cpu_out, cpu_in, n, count, dtype, a);
                    memcpy(want, cpu_out, bytes);
                    K()->reduce_n(dev_out, dev_in, n, count, dtype, a);
                    dev_get(got, dev_out, bytes);
                    int64_t bad = 0;
                    for (int64_t i = 0; i < count; i++)
                        bad +=
                            !same_element(dtype, got + (size_t)i * esize, want + (size_t)i * esize);
                    if (bad)
                        printf("\n    reduce_n %s variant %zu, %d inputs%s: %lld of %lld differ",
                               fsdp_dtype_to_string(dtype), v, n, alias ? " (aliased)" : "",
                               (long long)bad, (long long)count);
                    CU_ASSERT_EQUAL(bad, 0);
                    for (int r = 0; r <= n; r++) free(host[r]), dev_free(dev_buf[r]);
                    free(want), free(got);
                }
            }
        }
    }
}

/* f32 -> f16 and back on the device equal the CPU's bits: f16 ties, subnormals and their ties,
 * the overflow threshold, NaNs, then random bit patterns; every f16 widened. */
static void test_f16(void) {
    const uint32_t special[] = {
        0x3F801000u, 0x3F803000u, 0x33000000u, 0x33400000u, // ties to even, 2^-25 tie, above
        0x477FF000u, 0x477FEFFFu, 0x7F800001u, 0xFFC00001u, // 65520 (inf), below it, NaNs
        0x7F800000u, 0x80000000u, 0x38800000u, 0x387FFFFFu, // inf, -0, smallest normal, below
    };
    int64_t nspec = sizeof special / sizeof *special, n = nspec + 100003;
    float *x = new_uniform(n, 0, 0);
    rng_seed(19);
    for (int64_t i = 0; i < n; i++) x[i] = bits_f32(i < nspec ? special[i] : rng_u32());
    fsdp_f16 *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
    fsdp_kernels_for(FSDP_CPU)->f32_to_f16(want, x, n);
    float *d = dev_floats(x, n);
    fsdp_f16 *dh = dev_new(NULL, (size_t)n * 2);
    K()->f32_to_f16(dh, d, n);
    dev_get(got, dh, (size_t)n * 2);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += got[i] != want[i];
    printf("\n    f32_to_f16: %lld of %lld differ from the CPU", (long long)bad, (long long)n);
    CU_ASSERT_EQUAL(bad, 0);
    static fsdp_f16 all[65536];
    static float wide[65536];
    float *dw = dev_floats(NULL, 65536);
    for (int i = 0; i < 65536; i++) all[i] = (fsdp_f16)i;
    fsdp_f16 *da = dev_new(all, sizeof all);
    K()->f16_to_f32(dw, da, 65536);
    dev_get(wide, dw, sizeof wide);
    bad = 0;
    for (int i = 0; i < 65536; i++) bad += f32_bits(wide[i]) != f32_bits(fsdp_f16_to_f32(all[i]));
    printf(", f16_to_f32: %lld of 65536 differ", (long long)bad);
    CU_ASSERT_EQUAL(bad, 0);
    free(x), free(want), free(got);
    dev_free(d), dev_free(dh), dev_free(dw), dev_free(da);
}

/* Several optimizer steps through optim/update.h on both devices; within 1e-6 relative (the
 * same IEEE operations: expected bitwise, and the count of differing elements is printed). */
static void run_optim_case(const char *name, bool adam, bool decoupled, bool with_state, int64_t n,
                           int64_t off) {
    float *p = new_uniform(n + off, -1, 1), *s0 = new_uniform(n + off, 0, 0);
    float *s1 = new_uniform(n + off, 0, 0), *s2 = new_uniform(n + off, 0, 0);
    float *g = new_uniform(n + off, -1, 1);
    float *dp = dev_floats(p, n + off), *dg = dev_floats(NULL, n + off);
    /* the state starts at zeros, as the optimizers make it (the steps read it) */
    float *d0 = dev_zeros((size_t)(n + off) * 4), *d1 = dev_zeros((size_t)(n + off) * 4);
    float *d2 = dev_zeros((size_t)(n + off) * 4);
    fsdp_sgd_options so = {
        .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01, .nesterov = true};
    fsdp_adam_options ao = {.lr = 1e-3,
                            .beta1 = 0.9,
                            .beta2 = 0.999,
                            .eps = 1e-8,
                            .weight_decay = 0.1,
                            .amsgrad = with_state,
                            .maximize = decoupled};
    for (int step = 1; step <= 4; step++) {
        for (int64_t i = 0; i < n + off; i++) g[i] = rng_uniform(-1, 1);
        dev_put(dg, g, (size_t)(n + off) * 4);
        if (adam) {
            fsdp_adam_update(FSDP_CPU, p + off, g + off, s0 + off, s1 + off,
                             with_state ? s2 + off : NULL, n, &ao, decoupled, step);
            fsdp_adam_update(dev(), dp + off, dg + off, d0 + off, d1 + off,
                             with_state ? d2 + off : NULL, n, &ao, decoupled, step);
        } else {
            fsdp_sgd_update(FSDP_CPU, p + off, g + off, with_state ? s0 + off : NULL, n, &so,
                            step == 1);
            fsdp_sgd_update(dev(), dp + off, dg + off, with_state ? d0 + off : NULL, n, &so,
                            step == 1);
        }
    }
    float *got = new_uniform(n, 0, 0);
    dev_get(got, dp + off, (size_t)n * 4);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += f32_bits(got[i]) != f32_bits(p[off + i]);
    printf("\n    %s (n %lld, offset %lld): %lld elements not bitwise equal", name, (long long)n,
           (long long)off, (long long)diff);
    CU_ASSERT_TRUE(fsdp_test_device_close(name, got, p + off, n, 1e-6, 0));
    if (with_state || adam) DEV_CLOSE("  state 0", d0 + off, s0 + off, n, 1e-6, 0);
    if (adam) DEV_CLOSE("  state 1", d1 + off, s1 + off, n, 1e-6, 0);
    if (adam && with_state) DEV_CLOSE("  vmax", d2 + off, s2 + off, n, 1e-6, 0);
    free(p), free(s0), free(s1), free(s2), free(g), free(got);
    dev_free(dp), dev_free(dg), dev_free(d0), dev_free(d1), dev_free(d2);
}

static void test_optim(void) {
    rng_seed(19);
    const int64_t ns[] = {1, 1003, 1 << 16};
    for (int s = 0; s < 3; s++)
        for (int64_t off = 0; off < 2; off++) {
            run_optim_case("sgd momentum nesterov", false, false, true, ns[s], off);
            run_optim_case("sgd plain", false, false, false, ns[s], off);
            run_optim_case("adam", true, false, false, ns[s], off);
            run_optim_case("adam amsgrad", true, false, true, ns[s], off);
            run_optim_case("adamw", true, true, false, ns[s], off);
        }
}

/* adam_update_bf16: on the CPU its p, m, v and vmax are adam_update's bits and p_bf16 is
 * fsdp_bf16_from_f32 of the updated p, with 1 and 2 worker threads (the split path); on the
 * device p, m, v and vmax match the CPU's as run_optim_case's do, and p_bf16 is
 * fsdp_bf16_from_f32 of the device's own p, bit for bit (rounding is exact). Three AdamW steps;
 * the first elements of p are inf, -inf, a finite value beyond bf16's largest, a subnormal and
 * 0. */
static void run_adam_bf16_case(int64_t n, int64_t off, bool amsgrad) {
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu();
    int64_t len = n + off;
    float *p0 = new_uniform(len, -1, 1), *g = new_uniform(len, -1, 1);
    const float special[] = {INFINITY, -INFINITY, 3.39e38f, -1e-40f, 0.0f};
    for (int64_t i = 0; i < 5 && i < n; i++) p0[off + i] = special[i];
    /* [0] adam_update, [1] adam_update_bf16 on the CPU, [2] on the device (copied back) */
    float *p[3], *m[3], *v[3], *x[3];
    for (int r = 0; r < 3; r++) {
        p[r] = malloc((size_t)len * 4), m[r] = calloc((size_t)len, 4);
        v[r] = calloc((size_t)len, 4), x[r] = calloc((size_t)len, 4);
        CU_ASSERT_FATAL(p[r] && m[r] && v[r] && x[r]);
        memcpy(p[r], p0, (size_t)len * 4);
    }
    fsdp_bf16 *lp = calloc((size_t)len, 2), *dlp_host = calloc((size_t)len, 2);
    float *dp = dev_floats(p0, len), *dg = dev_floats(NULL, len), *dm = dev_zeros((size_t)len * 4);
    float *dv = dev_zeros((size_t)len * 4), *dx = dev_zeros((size_t)len * 4); /* the state */
    fsdp_bf16 *dlp = dev_new(NULL, (size_t)len * 2); /* written whole each step */
    const float lr = 1e-3f, wd = 0.1f, b1 = 0.9f, b2 = 0.999f;
    int64_t bad_cpu = 0, bad_lp = 0, bad_dlp = 0;
    for (int step = 1; step <= 3; step++) {
        for (int64_t i = 0; i < len; i++) g[i] = rng_uniform(-1, 1);
        dev_put(dg, g, (size_t)len * 4);
        float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
        fsdp_adam_step_args a = {.sign = 1,
                                 .l2 = 0,
                                 .shrink = 1 - lr * wd,
                                 .w1 = 1 - b1,
                                 .beta2 = b2,
                                 .w2 = 1 - b2,
                                 .eps = 1e-8f,
                                 .neg_step_size = -lr / bc1,
                                 .bc2_sqrt = sqrtf(bc2)};
        CU_ASSERT_EQUAL(fsdp_kernels_cpu_workers_start(step == 2 ? 2 : 1, -1), step == 2 ? 2 : 1);
        cpu->adam_update(p[0] + off, g + off, m[0] + off, v[0] + off, amsgrad ? x[0] + off : NULL,
                         n, &a);
        cpu->adam_update_bf16(p[1] + off, lp + off, g + off, m[1] + off, v[1] + off,
                              amsgrad ? x[1] + off : NULL, n, &a);
        fsdp_kernels_cpu_workers_stop();
        K()->adam_update_bf16(dp + off, dlp + off, dg + off, dm + off, dv + off,
                              amsgrad ? dx + off : NULL, n, &a);
        /* checked after every step: the split step's copy is not overwritten unseen */
        dev_get(p[2], dp, (size_t)len * 4);
        dev_get(dlp_host, dlp, (size_t)len * 2);
        for (int64_t i = off; i < len; i++) {
            bad_cpu +=
                f32_bits(p[0][i]) != f32_bits(p[1][i]) || f32_bits(m[0][i]) != f32_bits(m[1][i]) ||
                f32_bits(v[0][i]) != f32_bits(v[1][i]) || f32_bits(x[0][i]) != f32_bits(x[1][i]);
            bad_lp += lp[i] != fsdp_bf16_from_f32(p[1][i]);
            bad_dlp += dlp_host[i] != fsdp_bf16_from_f32(p[2][i]);
        }
    }
    printf("\n    adam_update_bf16 (n %lld, offset %lld%s): %lld CPU elements unlike adam_update, "
           "%lld CPU and %lld device bf16 copies unlike their p rounded",
           (long long)n, (long long)off, amsgrad ? ", amsgrad" : "", (long long)bad_cpu,
           (long long)bad_lp, (long long)bad_dlp);
    CU_ASSERT_EQUAL(bad_cpu, 0);
    CU_ASSERT_EQUAL(bad_lp, 0);
    CU_ASSERT_EQUAL(bad_dlp, 0);
    /* 1e-6 relative on CUDA, as run_optim_case: the same IEEE operations, expected bitwise */
    CU_ASSERT_TRUE(fsdp_test_device_close("  p", p[2] + off, p[0] + off, n, 1e-6, 0));
    DEV_CLOSE("  m", dm + off, m[0] + off, n, 1e-6, 0);
    DEV_CLOSE("  v", dv + off, v[0] + off, n, 1e-6, 0);
    if (amsgrad) DEV_CLOSE("  vmax", dx + off, x[0] + off, n, 1e-6, 0);
    for (int r = 0; r < 3; r++) free(p[r]), free(m[r]), free(v[r]), free(x[r]);
    free(p0), free(g), free(lp), free(dlp_host);
    dev_free(dp), dev_free(dg), dev_free(dm), dev_free(dv), dev_free(dx), dev_free(dlp);
}

static void test_adam_bf16(void) {
    rng_seed(23);
    const int64_t ns[] = {1, 7, 1003, 1 << 17};
    for (int s = 0; s < 4; s++)
        for (int64_t off = 0; off < 2; off++) run_adam_bf16_case(ns[s], off, s % 2 == 1);
}

/* adam_update_multi and fill_multi over 101 tensors (three chunks of FSDP_ADAM_MULTI_CHUNK,
 * one of FSDP_FILL_MULTI_CHUNK) of odd sizes (0 and 1 elements among them, one beyond
 * 256 x 4096 elements, so its blocks stride) at odd offsets of one allocation, every third with
 * vmax, every fourth with a bf16 copy: each tensor's p, m, v, vmax and p_bf16 against the CPU's
 * per-tensor adam_update or adam_update_bf16 after three AdamW steps (bitwise expected: the same
 * element function; CUDA is checked to 1e-6 relative as run_optim_case, and the elements that
 * differ are counted), the fill bitwise, and the launches on sim: one per chunk. */
#define MULTI_TENSORS 101
static void test_adam_multi(void) {
    rng_seed(29);
    int64_t off[MULTI_TENSORS + 1], len = 0;
    fsdp_adam_tensor h[MULTI_TENSORS], d[MULTI_TENSORS];
    for (int i = 0; i < MULTI_TENSORS; i++) {
        int64_t n = i == 5 ? (1 << 20) + 77 : i % 7 == 0 ? 0 : i % 5 == 1 ? 1 : 3 * i + i % 4;
        off[i] = len + 1, len = off[i] + n; /* odd: unaligned starts */
        h[i].n = n;
    }
    float *p = new_uniform(len, -1, 1), *m = new_uniform(len, 0, 0), *v = new_uniform(len, 0, 0);
    float *x = new_uniform(len, 0, 0), *g = new_uniform(len, -1, 1), *got = new_uniform(len, 0, 0);
    fsdp_bf16 *lp = calloc((size_t)len, 2), *dlp_host = calloc((size_t)len, 2);
    CU_ASSERT_FATAL(lp && dlp_host);
    float *dp = dev_floats(p, len), *dm = dev_floats(m, len), *dv = dev_floats(v, len);
    float *dx = dev_floats(x, len), *dg = dev_floats(NULL, len);
    fsdp_bf16 *dlp = dev_new(lp, (size_t)len * 2); /* zeros, as lp */
    for (int i = 0; i < MULTI_TENSORS; i++) {
        int64_t o = off[i];
        bool amsgrad = i % 3 == 0, low = i % 4 == 0;
        h[i] = (fsdp_adam_tensor){
            p + o, g + o, m + o, v + o, amsgrad ? x + o : NULL, low ? lp + o : NULL, h[i].n};
        d[i] = (fsdp_adam_tensor){
            dp + o, dg + o, dm + o, dv + o, amsgrad ? dx + o : NULL, low ? dlp + o : NULL, h[i].n};
    }
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu();
    int64_t launches = 0;
    for (int step = 1; step <= 3; step++) {
        for (int64_t i = 0; i < len; i++) g[i] = rng_uniform(-1, 1);
        dev_put(dg, g, (size_t)len * 4);
        fsdp_adam_step_args a = {.sign = step == 2 ? -1.0f : 1.0f,
                                 .l2 = 0,
                                 .shrink = 0.9999f,
                                 .w1 = 0.1f,
                                 .beta2 = 0.999f,
                                 .w2 = 0.001f,
                                 .eps = 1e-8f,
                                 .neg_step_size = -1e-3f / (float)step,
                                 .bc2_sqrt = sqrtf(1.0f - powf(0.999f, (float)step))};
        for (int i = 0; i < MULTI_TENSORS; i++) {
            const fsdp_adam_tensor *t = &h[i];
            if (t->p_bf16)
                cpu->adam_update_bf16(t->p, t->p_bf16, t->g, t->m, t->v, t->vmax, t->n, &a);
            else
                cpu->adam_update(t->p, t->g, t->m, t->v, t->vmax, t->n, &a);
        }
        fsdp_launch_counts c0 = fsdp_kernels_counts(dev());
        K()->adam_update_multi(d, MULTI_TENSORS, &a);
        launches += fsdp_kernels_counts(dev()).launches - c0.launches;
    }
    int64_t bad_lp = 0;
    dev_get(dlp_host, dlp, (size_t)len * 2);
    for (int64_t i = 0; i < len; i++) bad_lp += dlp_host[i] != lp[i];
    printf("\n    adam_update_multi (%d tensors, %lld elements): %lld launches in 3 steps, %lld "
           "bf16 copies differ",
           MULTI_TENSORS, (long long)len, (long long)launches, (long long)bad_lp);
    CU_ASSERT_EQUAL(launches,
                    3 * ((MULTI_TENSORS + FSDP_ADAM_MULTI_CHUNK - 1) / FSDP_ADAM_MULTI_CHUNK));
    CU_ASSERT_EQUAL(bad_lp, 0);
    /* the gaps between tensors are never written: they stay the values they started with */
    const float *dev_of[4] = {dp, dm, dv, dx}, *want[4] = {p, m, v, x};
    const char *names[4] = {"  p", "  m", "  v", "  vmax"};
    for (int k = 0; k < 4; k++) {
        dev_get(got, dev_of[k], (size_t)len * 4);
        int64_t diff = 0;
        for (int64_t i = 0; i < len; i++) diff += f32_bits(got[i]) != f32_bits(want[k][i]);
        printf(", %s %lld differ", names[k] + 2, (long long)diff);
        CU_ASSERT_TRUE(fsdp_test_device_close(names[k], got, want[k], len, 1e-6, 0));
    }
    /* fill_multi: every tensor's p to 0.5, the gaps kept */
    float *outs[MULTI_TENSORS];
    int64_t ns[MULTI_TENSORS];
    for (int i = 0; i < MULTI_TENSORS; i++) {
        outs[i] = dp + off[i], ns[i] = h[i].n;
        for (int64_t j = 0; j < h[i].n; j++) p[off[i] + j] = 0.5f;
    }
    fsdp_launch_counts c0 = fsdp_kernels_counts(dev());
    K()->fill_multi(outs, ns, MULTI_TENSORS, 0.5f);
    int64_t fills = fsdp_kernels_counts(dev()).launches - c0.launches, diff = 0;
    dev_get(got, dp, (size_t)len * 4);
    for (int64_t i = 0; i < len; i++) diff += f32_bits(got[i]) != f32_bits(p[i]);
    printf(", fill_multi: %lld launches, %lld elements differ", (long long)fills, (long long)diff);
    CU_ASSERT_EQUAL(fills, (MULTI_TENSORS + FSDP_FILL_MULTI_CHUNK - 1) / FSDP_FILL_MULTI_CHUNK);
    CU_ASSERT_EQUAL(diff, 0);
    free(p), free(m), free(v), free(x), free(g), free(got), free(lp), free(dlp_host);
    dev_free(dp), dev_free(dm), dev_free(dv), dev_free(dx), dev_free(dg), dev_free(dlp);
}

/* gemm_bf16 against a float64 reference of the same bf16 inputs: the products are exact (8-bit
 * significands), so the only error is the f32 accumulation of K terms, the alpha multiply and
 * the beta term: |C - ref| <= (K + 3) 2^-24 (|alpha| sum_k |a b| + |beta c|) (the classical
 * bound of a sum of K terms in any order, gamma_K, plus two roundings). CUDA gets 4 times that:
 * cuBLAS's tensor-core accumulation order and alignment are its own, and this has not run on a
 * GPU yet. On sim the bits are also the CPU's. Shapes cross the CPU's blocks (32 x 128 x 128),
 * with both transposes, padded strides, beta 0 over NaN (overwritten) and 0.5, and K = 0. */
static void run_gemm_bf16_at(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float beta,
                             int64_t off) {
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb, nc = M * ldc;
    fsdp_bf16 *A = malloc((size_t)(na + 1) * 2), *B = malloc((size_t)(nb + 1) * 2);
    float *C0 = new_uniform(nc, -1, 1), *c_cpu = malloc((size_t)(nc + 1) * 4);
    float *c_dev = malloc((size_t)(nc + 1) * 4);
    for (int64_t i = 0; i < na; i++) A[i] = fsdp_bf16_from_f32(rng_uniform(-2, 2));
    for (int64_t i = 0; i < nb; i++) B[i] = fsdp_bf16_from_f32(rng_uniform(-2, 2));
    if (beta == 0.0f)
        for (int64_t i = 0; i < nc; i++) C0[i] = NAN;
    const float alpha = 0.75f;
    memcpy(c_cpu, C0, (size_t)nc * 4);
    fsdp_kernels_cpu()->gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, c_cpu, ldc);
    fsdp_bf16 *dA = dev_new(NULL, (size_t)(na + off) * 2),
              *dB = dev_new(NULL, (size_t)(nb + off) * 2);
    float *dC = dev_floats(NULL, nc + off);
    dev_put(dA + off, A, (size_t)na * 2), dev_put(dB + off, B, (size_t)nb * 2);
    dev_put(dC + off, C0, (size_t)nc * 4);
    fsdp_kernels_for(dev())->gemm_bf16(ta, tb, M, N, K, alpha, dA + off, lda, dB + off, ldb, beta,
                                       dC + off, ldc);
    dev_get(c_dev, dC + off, (size_t)nc * 4);
    double worst_cpu = 0, worst_dev = 0, slack = fsdp_test_device_is_cuda() ? 4.0 : 1.0;
    int64_t bits = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = fsdp_bf16_to_f32(ta ? A[k * lda + i] : A[i * lda + k]);
                double b = fsdp_bf16_to_f32(tb ? B[j * ldb + k] : B[k * ldb + j]);
                acc += a * b, mag += fabs(a * b);
            }
            double c = beta == 0.0f ? 0.0 : (double)C0[i * ldc + j];
            double ref = alpha * acc + beta * c;
            double bound = (double)(K + 3) * 0x1p-24 * (fabs(alpha) * mag + fabs(beta * c)) + 1e-30;
            float got_cpu = c_cpu[i * ldc + j], got_dev = c_dev[i * ldc + j];
            double e_cpu = fabs(got_cpu - ref) / bound, e_dev = fabs(got_dev - ref) / bound;
            worst_cpu = isnan(e_cpu) || e_cpu > worst_cpu ? e_cpu : worst_cpu;
            worst_dev = isnan(e_dev) || e_dev > worst_dev ? e_dev : worst_dev;
            bits += f32_bits(got_cpu) != f32_bits(got_dev);
        }
    printf(
        "\n    gemm_bf16 %lldx%lldx%lld%s%s beta %g off %lld: error / bound CPU %.3f, device %.3f "
        "(bound x %.0f); %lld elements differ in bits",
        (long long)M, (long long)N, (long long)K, ta ? " A^T" : "", tb ? " B^T" : "", (double)beta,
        (long long)off, worst_cpu, worst_dev, slack, (long long)bits);
    CU_ASSERT_TRUE(worst_cpu <= 1.0);
    CU_ASSERT_TRUE(worst_dev <= slack);
    if (!fsdp_test_device_is_cuda()) CU_ASSERT_EQUAL(bits, 0);
    free(A), free(B), free(C0), free(c_cpu), free(c_dev);
    dev_free(dA), dev_free(dB), dev_free(dC);
}

static void run_gemm_bf16_case(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float beta) {
    run_gemm_bf16_at(M, N, K, ta, tb, beta, 0);
}

static void test_gemm_bf16(void) {
    rng_seed(29);
    for (int t = 0; t < 4; t++) {
        run_gemm_bf16_case(5, 7, 3, t & 1, t & 2, 0.5f);
        run_gemm_bf16_case(70, 300, 257, t & 1, t & 2, t < 2 ? 0.0f : 0.5f);
    }
    run_gemm_bf16_case(33, 129, 1, false, false, 0.0f);
    run_gemm_bf16_case(4, 6, 0, false, true, 0.5f);
    run_gemm_bf16_case(3, 2, 0, true, false, 0.0f);
}

/* ---- GEMMs through cuBLASLt (CUDA only) ---- */

#ifdef FSDP_HAVE_CUDA
static fsdp_cuda_gemm_lt_stats lt_stats(void) {
    return fsdp_cuda_gemm_lt_stats_get(dev().index);
}
#endif

/* One f32 case through gemm_compare under its bound (1e-5 relative, 1e-6 (K + 1) absolute). */
static void lt_f32(int64_t M, int64_t N, int64_t K, bool ta, bool tb, int64_t pad, float beta,
                   int64_t off) {
    gemm_case g = {M, N, K, ta, tb, pad, 0.75f, beta, off};
    gemm_compare(&g, 1e-5, true);
}

/* The cases of gemm_lt: M, N, K over 1, 7, 33 and 1000, both transposes, leading dimensions
 * past the shape, beta 0 (over NaN) and 0.5, operands 2 or 4 bytes past an aligned address. */
static void gemm_lt_cases(void) {
    rng_seed(37);
    static const int64_t dims[][3] = {{1, 1, 1},     {7, 7, 7},       {33, 7, 1},    {1, 33, 7},
                                      {7, 1, 33},    {1000, 33, 7},   {7, 1000, 33}, {33, 7, 1000},
                                      {1000, 1, 33}, {33, 1000, 1000}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        for (int t = 0; t < 4; t++) {
            int64_t M = dims[i][0], N = dims[i][1], K = dims[i][2], off = (int64_t)(i + t) % 2;
            float beta = t % 2 ? 0.5f : 0.0f;
            run_gemm_bf16_at(M, N, K, t & 1, t & 2, beta, off);
            lt_f32(M, N, K, t & 1, t & 2, t + 1, t < 2 ? 0.0f : -1.5f, off);
        }
    run_gemm_bf16_at(4, 6, 0, false, true, 0.5f, 0); // K = 0 scales C before either library
}

/* The table's gemm_bf16 and gemm with this thread's GEMMs on cuBLASLt
 * (fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT), the default), then on cuBLAS, against the CPU
 * table: bf16 within run_gemm_bf16_at's derived f32-accumulation bound ((K + 3) 2^-24 (|alpha|
 * sum |a b| + |beta c|), 4 times on CUDA), f32 within gemm_compare's; gemm_lt_cases' shapes
 * (an operand off alignment is a key of its own: the heuristic is told the alignment).
 * Elsewhere (sim) the same cases run through the device's own GEMM, bit for bit the CPU's. */
static void test_gemm_lt(void) {
#ifdef FSDP_HAVE_CUDA
    if (fsdp_test_device_is_cuda()) {
        const char *env = getenv("FSDP_CUDA_GEMM");
        if (!env || !*env) CU_ASSERT_EQUAL(fsdp_cuda_thread_gemm(), FSDP_CUDA_GEMM_LT);
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT);
        CU_ASSERT_EQUAL(fsdp_cuda_thread_gemm(), FSDP_CUDA_GEMM_LT);
        gemm_lt_cases();
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_CUBLAS);
        CU_ASSERT_EQUAL(fsdp_cuda_thread_gemm(), FSDP_CUDA_GEMM_CUBLAS);
        gemm_lt_cases();
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_DEFAULT);
        return;
    }
#endif
    gemm_lt_cases();
}

/* The heuristics' cache: a shape met twice asks the heuristic once and hits the second time
 * (both within gemm_compare's bound); FSDP_CUDA_LT_CACHE_SLOTS + 8 new shapes fill the table
 * and replace the least recently used entries, each still correct; the first of them, replaced
 * since, is asked again. */
static void test_gemm_lt_cache(void) {
    if (!cuda_only("the cuBLASLt heuristics' cache")) return;
#ifdef FSDP_HAVE_CUDA
    fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT);
    rng_seed(41);
    fsdp_cuda_gemm_lt_stats s0 = lt_stats();
    lt_f32(61, 59, 67, false, true, 3, 0.0f, 0); // a shape no other case runs
    fsdp_cuda_gemm_lt_stats s1 = lt_stats();
    CU_ASSERT_EQUAL(s1.queries, s0.queries + 1);
    lt_f32(61, 59, 67, false, true, 3, 0.0f, 0);
    fsdp_cuda_gemm_lt_stats s2 = lt_stats();
    CU_ASSERT_EQUAL(s2.queries, s1.queries);
    CU_ASSERT_EQUAL(s2.hits, s1.hits + 1);
    const int extra = 8, n = FSDP_CUDA_LT_CACHE_SLOTS + extra;
    for (int i = 0; i < n; i++) lt_f32(2000 + i, 8, 8, false, false, 0, 0.5f, 0);
    fsdp_cuda_gemm_lt_stats s3 = lt_stats();
    printf("\n    lt cache: %lld queries, %lld hits, %lld evictions, %lld fallbacks, %d slots",
           (long long)s3.queries, (long long)s3.hits, (long long)s3.evictions,
           (long long)s3.fallbacks, s3.slots_used);
    CU_ASSERT_EQUAL(s3.queries, s2.queries + n);
    CU_ASSERT_EQUAL(s3.slots_used, FSDP_CUDA_LT_CACHE_SLOTS);
    CU_ASSERT_TRUE(s3.evictions >= s2.evictions + extra);
    // f32, 32-byte rows, aligned operands: cuBLASLt has an algorithm for each
    CU_ASSERT_EQUAL(s3.fallbacks, s2.fallbacks);
    lt_f32(2000, 8, 8, false, false, 0, 0.5f, 0); // replaced by the later shapes: asked again
    CU_ASSERT_EQUAL(lt_stats().queries, s3.queries + 1);
    fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_DEFAULT);
#endif
}

/* ---- the fused GEMM epilogues ---- */

/* The device's result (n) against the CPU's: on sim bit for bit (the sim runs the CPU's fused
 * entry, itself the separate entries), on CUDA |got - want| <= tol[i] element by element. */
static bool epi_close(const char *name, const float *d, const float *want, const double *tol,
                      int64_t n) {
    float *got = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    dev_get(got, d, (size_t)n * sizeof(float));
    bool ok = true;
    if (!fsdp_test_device_is_cuda()) {
        ok = fsdp_test_device_close(name, got, want, n, 0, 0);
    } else {
        double worst = 0;
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double r = fabs((double)got[i] - want[i]) / (tol[i] + 1e-30);
            worst = isnan(r) || r > worst ? r : worst;
            bad += !(r <= 1.0);
        }
        printf("\n    %-44s error / bound %.3f, %lld outside", name, worst, (long long)bad);
        ok = bad == 0;
    }
    free(got);
    return ok;
}

/* One forward case, f32 or bf16 inputs (rounded to bf16 first, so both sides read the same
 * values), against the CPU table's entry. The CUDA bound per element, from mag = sum_k |x w|
 * (the products exact in bf16, rounded once in f32): each side's f32 sum of K products in its
 * own order errs by at most (K + 1) 2^-24 mag, and adding the bias rounds once more, so the
 * pre-activations differ by at most 2 (K + 2) 2^-24 (mag + |b|), taken 4 times (cuBLASLt's
 * tensor-core order and split-K are its own; not yet run on a GPU). ReLU passes that on
 * (1-Lipschitz); GELU multiplies it by at most 1.13 (max |GELU'|) and adds its own evaluation:
 * a few f32 ulps of |out| for the separate kernel, and where cuBLASLt's epilogue evaluates tanh
 * with the hardware's approximate tanh (relative error 2^-11, PTX tanh.approx.f32) 0.5 |pre|
 * 2^-11. */
static void run_epilogue_case(int64_t rows, int64_t C, int64_t OC, bool bf16, bool with_bias,
                              bool with_pre, fsdp_gemm_act act) {
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu();
    int64_t nx = rows * C, nw = OC * C, ny = rows * OC;
    float *x = new_uniform(nx, -1, 1), *w = new_uniform(nw, -1, 1), *b = new_uniform(OC, -1, 1);
    fsdp_bf16 *x16 = malloc((size_t)(nx + 1) * 2), *w16 = malloc((size_t)(nw + 1) * 2);
    for (int64_t i = 0; i < nx; i++)
        x16[i] = fsdp_bf16_from_f32(x[i]), x[i] = fsdp_bf16_to_f32(x16[i]);
    for (int64_t i = 0; i < nw; i++)
        w16[i] = fsdp_bf16_from_f32(w[i]), w[i] = fsdp_bf16_to_f32(w16[i]);
    float *out = new_uniform(ny, 0, 0), *pre = new_uniform(ny, 0, 0), *nan = new_uniform(ny, 0, 0);
    for (int64_t i = 0; i < ny; i++) nan[i] = NAN; // beta 0: whatever out held is overwritten
    const float *bias = with_bias ? b : NULL;
    if (bf16) // the CPU always saves pre (the bound reads it); out's bits do not depend on it
        cpu->gemm_bf16_bias_act(out, pre, x16, w16, bias, rows, C, OC, act);
    else
        cpu->gemm_bias_act(out, pre, x, w, bias, rows, C, OC, act);
    double *tol_pre = malloc((size_t)(ny + 1) * sizeof(double));
    double *tol_out = malloc((size_t)(ny + 1) * sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < OC; o++) {
            double mag = with_bias ? fabs(b[o]) : 0;
            for (int64_t k = 0; k < C; k++) mag += fabs((double)x[r * C + k] * w[o * C + k]);
            double t = 4 * 2 * (double)(C + 2) * 0x1p-24 * mag, p = fabs(pre[r * OC + o]);
            int64_t i = r * OC + o;
            tol_pre[i] = t;
            tol_out[i] = act == FSDP_GEMM_ACT_GELU
                             ? 1.13 * t + 0.5 * (p + t) * 0x1p-11 + 0x1p-20 * fabs(out[i])
                             : t;
        }
    void *dx = dev_new(bf16 ? (const void *)x16 : x, (size_t)nx * (bf16 ? 2 : 4));
    void *dw = dev_new(bf16 ? (const void *)w16 : w, (size_t)nw * (bf16 ? 2 : 4));
    float *db = dev_floats(b, OC), *dout = dev_floats(nan, ny), *dpre = dev_floats(nan, ny);
    if (bf16)
        K()->gemm_bf16_bias_act(dout, with_pre ? dpre : NULL, dx, dw, with_bias ? db : NULL, rows,
                                C, OC, act);
    else
        K()->gemm_bias_act(dout, with_pre ? dpre : NULL, dx, dw, with_bias ? db : NULL, rows, C, OC,
                           act);
    static const char *const acts[] = {"none", "relu", "gelu"};
    char name[128];
    snprintf(name, sizeof name, "%s %lldx%lldx%lld %s%s%s out", bf16 ? "bf16" : "f32",
             (long long)rows, (long long)C, (long long)OC, acts[act], with_bias ? " bias" : "",
             with_pre ? " pre" : "");
    CU_ASSERT_TRUE(epi_close(name, dout, out, tol_out, ny));
    if (with_pre) {
        name[strlen(name) - 3] = 0;
        strcat(name, "pre");
        CU_ASSERT_TRUE(epi_close(name, dpre, pre, tol_pre, ny));
    }
    free(x), free(w), free(b), free(x16), free(w16), free(out), free(pre), free(nan);
    free(tol_pre), free(tol_out);
    dev_free(dx), dev_free(dw), dev_free(db), dev_free(dout), dev_free(dpre);
}

/* One weight-gradient case: dweight += dout^T inp and dbias += column sums, both starting from
 * random values. CUDA bound: dweight as a GEMM of K = rows, 2 (rows + 2) 2^-24 (sum_r |dy x| +
 * |dw0|), 4 times; dbias summed in double on the CPU (one rounding) and in f32 by cuBLASLt's
 * epilogue or the column-sum kernel: 2 (rows + 2) 2^-24 (sum_r |dy| + |db0|), 4 times. */
static void run_bgrad_case(int64_t rows, int64_t C, int64_t OC, bool with_bias) {
    int64_t nx = rows * C, ny = rows * OC, nw = OC * C;
    float *x = new_uniform(nx, -1, 1), *dy = new_uniform(ny, -1, 1);
    float *dw = new_uniform(nw, -1, 1), *dbias = new_uniform(OC, -1, 1);
    double *tol_w = malloc((size_t)(nw + 1) * sizeof(double));
    double *tol_b = malloc((size_t)(OC + 1) * sizeof(double));
    for (int64_t o = 0; o < OC; o++) {
        double mb = fabs(dbias[o]);
        for (int64_t r = 0; r < rows; r++) mb += fabs(dy[r * OC + o]);
        tol_b[o] = 4 * 2 * (double)(rows + 2) * 0x1p-24 * mb;
        for (int64_t c = 0; c < C; c++) {
            double m = fabs(dw[o * C + c]);
            for (int64_t r = 0; r < rows; r++) m += fabs((double)dy[r * OC + o] * x[r * C + c]);
            tol_w[o * C + c] = 4 * 2 * (double)(rows + 2) * 0x1p-24 * m;
        }
    }
    float *d_x = dev_floats(x, nx), *d_dy = dev_floats(dy, ny), *d_dw = dev_floats(dw, nw);
    float *d_db = dev_floats(dbias, OC);
    fsdp_kernels_cpu()->gemm_bgrad(dw, with_bias ? dbias : NULL, dy, x, rows, C, OC);
    K()->gemm_bgrad(d_dw, with_bias ? d_db : NULL, d_dy, d_x, rows, C, OC);
    char name[96];
    snprintf(name, sizeof name, "bgrad %lldx%lldx%lld%s dweight", (long long)rows, (long long)C,
             (long long)OC, with_bias ? " bias" : "");
    CU_ASSERT_TRUE(epi_close(name, d_dw, dw, tol_w, nw));
    snprintf(name, sizeof name, "bgrad %lldx%lldx%lld%s dbias", (long long)rows, (long long)C,
             (long long)OC, with_bias ? " bias" : " (untouched)");
    CU_ASSERT_TRUE(epi_close(name, d_db, dbias, tol_b, OC));
    free(x), free(dy), free(dw), free(dbias), free(tol_w), free(tol_b);
    dev_free(d_x), dev_free(d_dy), dev_free(d_dw), dev_free(d_db);
}

static void epilogue_cases(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 33, 8}, {33, 7, 17}, {65, 130, 96}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t rows = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        for (int v = 0; v < 24; v++)
            run_epilogue_case(rows, C, OC, v & 1, v & 2, v & 4, (fsdp_gemm_act)(v / 8));
        run_bgrad_case(rows, C, OC, true);
        run_bgrad_case(rows, C, OC, false);
    }
}

/* The fused entries (gemm_bias_act, gemm_bf16_bias_act, gemm_bgrad) against the CPU table's:
 * every activation, with and without bias and pre-activation, f32 and bf16, shapes with
 * OC a multiple of 8 (cuBLASLt saves GELU's input in the epilogue) and not. On sim bit for bit;
 * on CUDA within the bounds above, once through cuBLASLt's epilogues (FSDP_CUDA_GEMM=lt) and
 * once through the separate entries (cuBLAS). */
static void test_epilogue(void) {
    rng_seed(43);
#ifdef FSDP_HAVE_CUDA
    if (fsdp_test_device_is_cuda()) {
        fsdp_cuda_gemm_lt_stats s0 = lt_stats();
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT);
        epilogue_cases();
        fsdp_cuda_gemm_lt_stats s1 = lt_stats();
        printf("\n    lt epilogues: %lld queries, %lld fallbacks to the separate entries",
               (long long)(s1.queries - s0.queries), (long long)(s1.fallbacks - s0.fallbacks));
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_CUBLAS);
    }
#endif
    epilogue_cases();
#ifdef FSDP_HAVE_CUDA
    fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_DEFAULT);
#endif
}

/* ---- the tiled attention (CUDA only) ---- */

#ifdef FSDP_HAVE_CUDA
typedef struct attn_case {
    int64_t B, T, NH, NKV, D;
} attn_case;

/* One attention's results: out, lse, dq, dk, dv on the host. */
typedef struct attn_result {
    float *t[5];
} attn_result;

static const char *const attn_names[5] = {"out", "lse", "dq", "dk", "dv"};

static void attn_sizes(const attn_case *c, int64_t n[5]) {
    int64_t tq = c->B * c->T * c->NH * c->D, tk = c->B * c->T * c->NKV * c->D;
    n[0] = tq, n[1] = c->B * c->NH * c->T, n[2] = tq, n[3] = tk, n[4] = tk;
}

/* Forward and backward through this thread's CUDA attention path (kind) on host inputs. */
/* Forward and backward on the device with this thread's choice kind, through the f32 entries
 * or the bf16 policy's (bf16); the five results copied back. */
static attn_result attn_run(const attn_case *c, fsdp_cuda_attention kind, bool bf16, const float *q,
                            const float *k, const float *v, const float *dout) {
    int64_t n[5];
    attn_sizes(c, n);
    float *dq_ = dev_floats(q, n[0]), *dk_ = dev_floats(k, n[3]), *dv_ = dev_floats(v, n[3]);
    float *ddo = dev_floats(dout, n[0]), *d[5];
    for (int i = 0; i < 5; i++) d[i] = dev_floats(NULL, n[i]);
    fsdp_cuda_thread_set_attention(kind);
    (bf16 ? K()->attention_forward_bf16 : K()->attention_forward)(d[0], d[1], NULL, dq_, dk_, dv_,
                                                                  c->B, c->T, c->NH, c->NKV, c->D);
    (bf16 ? K()->attention_backward_bf16 : K()->attention_backward)(
        d[2], d[3], d[4], NULL, ddo, dq_, dk_, dv_, d[0], d[1], c->B, c->T, c->NH, c->NKV, c->D);
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_DEFAULT);
    attn_result r;
    for (int i = 0; i < 5; i++) {
        r.t[i] = new_uniform(n[i], 0, 0);
        dev_get(r.t[i], d[i], (size_t)n[i] * sizeof(float));
        dev_free(d[i]);
    }
    dev_free(dq_), dev_free(dk_), dev_free(dv_), dev_free(ddo);
    return r;
}

/* The bf16-tensor entries (attention_forward_bf16_round, attention_backward_bf16_round) under
 * kind on the same inputs (bf16 values, converted exactly), their results widened: out, lse,
 * dq, dk, dv as attn_run gives them. Every tensor the entries see starts `off` elements after
 * an allocation's start (0: aligned as the allocator aligns, 1: off 16-byte alignment). */
static attn_result attn_run16(const attn_case *c, fsdp_cuda_attention kind, const float *q,
                              const float *k, const float *v, const float *dout, int off) {
    int64_t n[5];
    attn_sizes(c, n);
    /* q, k, v, dout, out, dq, dk, dv */
    const int64_t len[8] = {n[0], n[3], n[3], n[0], n[0], n[0], n[3], n[3]};
    fsdp_bf16 *b[8], *base[8];
    const float *host[4] = {q, k, v, dout};
    for (int i = 0; i < 8; i++) {
        base[i] = dev_new(NULL, (size_t)(len[i] + off) * sizeof(fsdp_bf16));
        b[i] = base[i] + off;
        if (i < 4) {
            float *f = dev_floats(host[i], len[i]);
            K()->f32_to_bf16(b[i], f, len[i]);
            dev_free(f);
        }
    }
    float *lse_base = dev_floats(NULL, n[1] + off), *lse = lse_base + off;
    float *scratch = dev_floats(NULL, FSDP_ATTENTION_BF16_SCRATCH(c->T, c->NH, c->NKV, c->D));
    fsdp_cuda_thread_set_attention(kind);
    K()->attention_forward_bf16_round(b[4], lse, scratch, b[0], b[1], b[2], c->B, c->T, c->NH,
                                      c->NKV, c->D);
    K()->attention_backward_bf16_round(b[5], b[6], b[7], scratch, b[3], b[0], b[1], b[2], b[4], lse,
                                       c->B, c->T, c->NH, c->NKV, c->D);
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_DEFAULT);
    attn_result r;
    const int from[5] = {4, -1, 5, 6, 7};
    for (int i = 0; i < 5; i++) {
        r.t[i] = new_uniform(n[i], 0, 0);
        if (from[i] < 0) {
            dev_get(r.t[i], lse, (size_t)n[i] * sizeof(float));
            continue;
        }
        float *f = dev_floats(NULL, n[i]);
        K()->bf16_to_f32(f, b[from[i]], n[i]);
        dev_get(r.t[i], f, (size_t)n[i] * sizeof(float));
        dev_free(f);
    }
    for (int i = 0; i < 8; i++) dev_free(base[i]);
    dev_free(lse_base), dev_free(scratch);
    return r;
}

static attn_result attn_on_device(const attn_case *c, fsdp_cuda_attention kind, const float *q,
                                  const float *k, const float *v, const float *dout) {
    return attn_run(c, kind, false, q, k, v, dout);
}

static void attn_free(attn_result *r) {
    for (int i = 0; i < 5; i++) free(r->t[i]);
}

/* max |got - want| <= tol * max(1, max |want|) per tensor; prints the norm-wise error. */
static void attn_check(const char *what, const attn_case *c, const attn_result *got,
                       const attn_result *want, const double tol[5]) {
    int64_t n[5];
    attn_sizes(c, n);
    for (int i = 0; i < 5; i++) {
        double maxd = 0, maxw = 0;
        for (int64_t e = 0; e < n[i]; e++) {
            double dd = fabs((double)got->t[i][e] - want->t[i][e]);
            if (!(dd <= maxd) && !isnan(maxd)) maxd = dd; // a NaN stays
            maxw = fmax(maxw, fabs((double)want->t[i][e]));
        }
        bool ok = maxd <= tol[i] * fmax(1.0, maxw); // NaN fails
        printf("\n    attention %s B%lld T%lld NH%lld NKV%lld D%lld %s: max|diff| %.3g, max|want| "
               "%.3g, bound %.3g%s",
               what, (long long)c->B, (long long)c->T, (long long)c->NH, (long long)c->NKV,
               (long long)c->D, attn_names[i], maxd, maxw, tol[i] * fmax(1.0, maxw),
               ok ? "" : "  FAILED");
        CU_ASSERT_TRUE(ok);
    }
}
#endif

#ifdef FSDP_HAVE_CUDA
/* The GEMM path (fsdp_cuda_thread_set_attention GEMM, TF32 off: pure f32) on one case, against
 * the CPU within the tiled kernels' bound tol (the same sums in other orders: the CPU's and
 * cuBLAS's GEMMs, the row sums in double on both): with the default scratch bound (one chunk
 * here), again (the same bits: no atomics, a fixed order), with the bound at three pairs'
 * backward blocks (the backward in chunks of at most 3 pairs, so dk and dv add a group's heads
 * across chunks and across runs split inside a chunk), and with a bound below one pair's blocks
 * (every call falls back: the tiled kernels' bits, or the plain ones' above D = 128). */
static void attn_gemm_cases(const attn_case *c, const float *q, const float *k, const float *v,
                            const float *dout, const attn_result *cpu, const attn_result *flash,
                            const double tol[5]) {
    int64_t n[5];
    attn_sizes(c, n);
    attn_result gemm = attn_on_device(c, FSDP_CUDA_ATTENTION_GEMM, q, k, v, dout);
    attn_check("gemm vs cpu", c, &gemm, cpu, tol);
    attn_result again = attn_on_device(c, FSDP_CUDA_ATTENTION_GEMM, q, k, v, dout);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(memcmp(again.t[i], gemm.t[i], (size_t)n[i] * sizeof(float)), 0);
    fsdp_cuda_thread_set_attention_scratch((size_t)(3 * 2 * c->T * c->T) * sizeof(float));
    attn_result chunked = attn_on_device(c, FSDP_CUDA_ATTENTION_GEMM, q, k, v, dout);
    attn_check("gemm chunked vs cpu", c, &chunked, cpu, tol);
    fsdp_cuda_thread_set_attention_scratch(1);
    attn_result fallback = attn_on_device(c, FSDP_CUDA_ATTENTION_GEMM, q, k, v, dout);
    fsdp_cuda_thread_set_attention_scratch(0);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(memcmp(fallback.t[i], flash->t[i], (size_t)n[i] * sizeof(float)), 0);
    attn_free(&gemm), attn_free(&again), attn_free(&chunked), attn_free(&fallback);
}
#endif

/* The tiled kernels (fsdp_cuda_thread_set_attention FLASH) against the CPU table and against
 * the plain CUDA kernels, on ragged tiles (T not a multiple of 32), groups of 1, 3 and 4 query
 * heads per key-value head, D = 64 and 128 and D not a multiple of 16; above D = 128 the flash
 * choice runs the plain kernels (equal bit for bit). The GEMM path on the same cases
 * (attn_gemm_cases). Inputs uniform in [-1, 1]. */
static void test_attention_flash(void) {
    if (!cuda_only("the tiled attention kernels (fsdp_cuda_thread_set_attention)")) return;
#ifdef FSDP_HAVE_CUDA
    rng_seed(31);
    const attn_case cases[] = {
        {2, 45, 3, 3, 64}, {2, 77, 6, 2, 64}, {3, 100, 8, 2, 128}, {1, 33, 4, 1, 128},
        {2, 1, 3, 1, 24},  {1, 65, 2, 2, 40}, {1, 20, 2, 1, 136},
    };
    const double u = 0x1p-24; // f32 unit roundoff
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const attn_case *c = &cases[ci];
        int64_t n[5], T = c->T, D = c->D, group = c->NH / c->NKV;
        attn_sizes(c, n);
        float *q = new_uniform(n[0], -1, 1), *k = new_uniform(n[3], -1, 1);
        float *v = new_uniform(n[3], -1, 1), *dout = new_uniform(n[0], -1, 1);
        float *scratch = new_uniform(2 * T * T, 0, 0);
        attn_result cpu;
        for (int i = 0; i < 5; i++) cpu.t[i] = new_uniform(n[i], 0, 0);
        const fsdp_kernels_i *C = fsdp_kernels_for(FSDP_CPU);
        C->attention_forward(cpu.t[0], cpu.t[1], scratch, q, k, v, c->B, T, c->NH, c->NKV, D);
        C->attention_backward(cpu.t[2], cpu.t[3], cpu.t[4], scratch, dout, q, k, v, cpu.t[0],
                              cpu.t[1], c->B, T, c->NH, c->NKV, D);
        attn_result plain = attn_on_device(c, FSDP_CUDA_ATTENTION_PLAIN, q, k, v, dout);
        attn_result flash = attn_on_device(c, FSDP_CUDA_ATTENTION_FLASH, q, k, v, dout);
        /* Every side sums in its own order (the CPU's scores are an sgemm, the GPU's sequential
         * dot products; the softmax sums run over tiles). A score q.k / sqrt(D) of inputs in
         * [-1, 1] has sum |q_d k_d| / sqrt(D) <= sqrt(D), so two orders differ by at most
         * ts = 2 D u sqrt(D) (1.7e-4 at D = 128). The forward's weights exp(s - lse) carry 2 ts
         * relative (score and lse) plus exp's rounding, and out, a convex combination of
         * |v| <= 1, adds the (T + D) roundings of its sums: out <= 3 ts + 2 (T + D) u; lse
         * <= ts + 2 T u (1 + max |lse|), taken norm-wise. The backward carries the forward's
         * error through dS = P (dout.v - dout.out), two more dot products of D terms (ts each
         * relative to their magnitude), and sums over up to group * T rows: 6 ts + 4 (group T
         * + D) u, norm-wise against the largest gradient entry (entries near 0 after
         * cancellation carry the large ones' absolute error). Worst cases: errors of random
         * sign add far less; a wrong mask, tile or head gives errors of order 1e-1 and more. */
        double ts = 2.0 * (double)D * u * sqrt((double)D);
        double tol[5] = {3 * ts + 2.0 * (double)(T + D) * u,
                         ts + 2.0 * (double)T * u * (1.0 + sqrt((double)D) + log((double)T + 1)),
                         6 * ts + 4.0 * (double)(group * T + D) * u, 0, 0};
        tol[3] = tol[4] = tol[2];
        if (D > FSDP_CUDA_FLASH_MAX_D) { // the flash choice falls back to the plain kernels
            for (int i = 0; i < 5; i++)
                CU_ASSERT_EQUAL(memcmp(flash.t[i], plain.t[i], (size_t)n[i] * sizeof(float)), 0);
        } else {
            attn_check("flash vs cpu", c, &flash, &cpu, tol);
            attn_check("flash vs plain", c, &flash, &plain, tol);
        }
        attn_check("plain vs cpu", c, &plain, &cpu, tol);
        attn_gemm_cases(c, q, k, v, dout, &cpu, &flash, tol);
        attn_free(&cpu), attn_free(&plain), attn_free(&flash);
        free(q), free(k), free(v), free(dout), free(scratch);
    }
    /* The choice: unset FSDP_CUDA_ATTENTION means auto; a thread's choice stays its own. */
    const char *env = getenv("FSDP_CUDA_ATTENTION");
    if (!env || !*env) CU_ASSERT_EQUAL(fsdp_cuda_thread_attention(), FSDP_CUDA_ATTENTION_AUTO);
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_FLASH);
    CU_ASSERT_EQUAL(fsdp_cuda_thread_attention(), FSDP_CUDA_ATTENTION_FLASH);
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_GEMM);
    CU_ASSERT_EQUAL(fsdp_cuda_thread_attention(), FSDP_CUDA_ATTENTION_GEMM);
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_DEFAULT);
#endif
}

/* ---- cuDNN's fused attention ---- */

/* The loader (no GPU needed): the library in use is cuDNN 9; a missing library and a library
 * that is not cuDNN are refused with a message naming the library and the fix. Where there is
 * no cuDNN (a build without its headers, no library), the case skips, printing why. */
static void test_cudnn_loader(void) {
#ifndef FSDP_HAVE_CUDA
    fsdp_test_skip("cuDNN is loaded by the CUDA device, which this build has not");
#else
    char why[512] = "";
    size_t v = fsdp_cuda_cudnn_version(why, sizeof why);
    if (v == 0) {
        fsdp_test_skip("no cuDNN to load: %s", why);
        return;
    }
    printf("\n    cuDNN %zu in use", v);
    CU_ASSERT_EQUAL(v / 10000, 9);
    CU_ASSERT_EQUAL(fsdp_cuda_cudnn_try_open("/nonexistent/libcudnn.so.9", why, sizeof why), 0);
    printf("\n    missing library: %s", why);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "/nonexistent/libcudnn.so.9"));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "FSDP_CUDNN_LIBRARY"));
    CU_ASSERT_EQUAL(fsdp_cuda_cudnn_try_open("libm.so.6", why, sizeof why), 0);
    printf("\n    not cuDNN: %s", why);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "has no cudnnGetVersion"));
#endif
}

/* Every tensor and operation of the forward and backward graphs finalizes (cuDNN checks each
 * one's attributes, shapes and types without a handle, so without a GPU): multi-head and
 * grouped-query heads, odd T. The graph, its engine and plan need a GPU: attention_cudnn. */
static void test_sdpa_graph_ops(void) {
#ifndef FSDP_HAVE_CUDA
    fsdp_test_skip("cuDNN is loaded by the CUDA device, which this build has not");
#else
    char why[512] = "";
    if (fsdp_cuda_cudnn_version(why, sizeof why) == 0) {
        fsdp_test_skip("no cuDNN to load: %s", why);
        return;
    }
    const int64_t shapes[][5] = {
        {2, 45, 3, 3, 64}, {2, 77, 6, 2, 64}, {1, 1024, 12, 4, 64}, {1, 33, 4, 1, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const int64_t *s = shapes[i];
            bool ok = fsdp_cuda_sdpa_check_ops(bwd, s[0], s[1], s[2], s[3], s[4], why, sizeof why);
            printf("\n    %s B%lld T%lld NH%lld NKV%lld D%lld: %s", bwd ? "backward" : "forward",
                   (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3],
                   (long long)s[4], ok ? "every operation finalizes" : why);
            CU_ASSERT_TRUE(ok);
        }
    /* a negative control: 3 query heads cannot share 2 key-value heads, and cuDNN's matmul
     * refuses the broadcast of k's heads over q's when its operation is finalized */
    for (int bwd = 0; bwd < 2; bwd++) {
        bool ok = fsdp_cuda_sdpa_check_ops(bwd, 1, 16, 3, 2, 64, why, sizeof why);
        printf("\n    %s with 3 query heads over 2 key-value heads: %s",
               bwd ? "backward" : "forward", ok ? "accepted" : why);
        CU_ASSERT_FALSE(ok);
    }
#endif
}

#ifdef FSDP_HAVE_CUDA
static float round_bf16(float x) {
    return fsdp_bf16_to_f32(fsdp_bf16_from_f32(x));
}

/* The attention in float64 on the host, the backward's softmax sum from `out` (the forward
 * output the device's backward was given): ref, and per output element the sum of the absolute
 * values of the terms of the last product that forms it, mag: out_i = sum_j P_ij v_j (mag
 * sum_j P_ij |v_j|), dv_j = sum_i P_ij dout_i, dk_j = sum_i dS_ij q_i, dq_i = sum_j dS_ij k_j
 * (dS with its factor scale; dk, dv also over the group's heads); pmag (dq and dk only) the
 * same sums with P_ij scale in place of dS_ij. Each indexed as attn_result's tensors. */
static void sdpa_reference(const attn_case *c, const float *q, const float *k, const float *v,
                           const float *dout, const float *out, double *ref[5], double *mag[5],
                           double *pmag[5]) {
    int64_t T = c->T, NH = c->NH, NKV = c->NKV, D = c->D, n[5];
    attn_sizes(c, n);
    for (int i = 0; i < 5; i++) {
        memset(ref[i], 0, (size_t)n[i] * sizeof(double));
        memset(mag[i], 0, (size_t)n[i] * sizeof(double));
        memset(pmag[i], 0, (size_t)n[i] * sizeof(double));
    }
    double scale = 1.0 / sqrt((double)D), *p = malloc((size_t)T * sizeof(double));
    double *ds = malloc((size_t)T * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t g = h / (NH / NKV);
#define QI(t, i) (((b * T + (t)) * NH + h) * D + (i))
#define KI(t, i) (((b * T + (t)) * NKV + g) * D + (i))
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY, z = 0, rowdot = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < D; e++) s += (double)q[QI(i, e)] * k[KI(j, e)];
                    p[j] = s * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j <= i; j++) z += exp(p[j] - mx);
                for (int64_t j = 0; j <= i; j++) p[j] = exp(p[j] - mx) / z;
                ref[1][(b * NH + h) * T + i] = mx + log(z);
                for (int64_t e = 0; e < D; e++) {
                    double o = 0, m = 0;
                    for (int64_t j = 0; j <= i; j++) {
                        o += p[j] * v[KI(j, e)];
                        m += p[j] * fabs((double)v[KI(j, e)]);
                    }
                    ref[0][QI(i, e)] = o, mag[0][QI(i, e)] = m;
                    rowdot += (double)out[QI(i, e)] * dout[QI(i, e)];
                }
                for (int64_t j = 0; j <= i; j++) {
                    double dp = 0;
                    for (int64_t e = 0; e < D; e++) dp += (double)dout[QI(i, e)] * v[KI(j, e)];
                    ds[j] = p[j] * (dp - rowdot) * scale;
                }
                for (int64_t j = 0; j <= i; j++)
                    for (int64_t e = 0; e < D; e++) {
                        ref[2][QI(i, e)] += ds[j] * k[KI(j, e)];
                        mag[2][QI(i, e)] += fabs(ds[j] * k[KI(j, e)]);
                        pmag[2][QI(i, e)] += p[j] * scale * fabs((double)k[KI(j, e)]);
                        ref[3][KI(j, e)] += ds[j] * q[QI(i, e)];
                        mag[3][KI(j, e)] += fabs(ds[j] * q[QI(i, e)]);
                        pmag[3][KI(j, e)] += p[j] * scale * fabs((double)q[QI(i, e)]);
                        ref[4][KI(j, e)] += p[j] * dout[QI(i, e)];
                        mag[4][KI(j, e)] += fabs(p[j] * dout[QI(i, e)]);
                    }
            }
#undef QI
#undef KI
        }
    free(p), free(ds);
}
#endif

#ifdef FSDP_HAVE_CUDA
/* The shapes of the cuDNN checks, few: each builds two plans, and cuDNN may compile its engines
 * at run time. The last, D 20, cuDNN refuses. */
static const attn_case sdpa_cases[] = {
    {2, 45, 3, 3, 64}, {2, 77, 6, 2, 64}, {3, 100, 8, 2, 128}, {1, 1, 8, 1, 64}, {1, 20, 2, 1, 20},
};

/* Random q, k, v (in[0..2]) and dout in [-1, 1], rounded to bf16 values: a rounding to bf16 of
 * them is exact, so a float64 reference sees what a bf16 path sees. */
static void sdpa_inputs(const attn_case *c, float *in[3], float **dout) {
    int64_t n[5];
    attn_sizes(c, n);
    const int64_t len[4] = {n[0], n[3], n[3], n[0]};
    for (int t = 0; t < 4; t++) {
        float *x = new_uniform(len[t], -1, 1);
        for (int64_t e = 0; e < len[t]; e++) x[e] = round_bf16(x[e]);
        if (t < 3)
            in[t] = x;
        else
            *dout = x;
    }
}

/* Bounds, per element, with m the element's magnitude (mag) and r its reference. The inputs
 * are bf16 values, so every product in cuDNN's f32 GEMMs is exact; its f32 softmax and
 * accumulations add at most (group T + D) u relative to the terms' magnitudes, taken 4 times
 * (scores, softmax, the last GEMM, the conversions): f = 4 (group T + D) u (m + 1). The lse is
 * f32 throughout, its terms at most sqrt(D): |lse - r| <= 4 (T + D) u (|r| + sqrt(D)). bf16
 * adds one rounding (ub relative) of each factor the engine rounds before the last GEMM (P for
 * out), and of the output: out: ub m + ub |r| + f. The backward recomputes P from the given lse
 * (within Lmax, the lse bound at the largest |lse|: a relative error of P), rounds dS (and P,
 * from which dS is formed) to bf16 before the GEMMs of dq and dk, and P for dv: at most two
 * roundings per term: 2 ub m + ub |r| + Lmax m + f. dS_ij = P_ij (dout_i.v_j - dout_i.out_i)
 * scale subtracts two f32 sums of D products each at most 1 in magnitude (D u D each), an
 * absolute error 2 D^2 u of the bracket: dq and dk add 2 D^2 u pmag. Errors of random sign add
 * far less; a wrong mask, head or transpose gives errors of order 1e-1 of m. Returns the
 * elements out of bound per tensor; prints the worst ratio of each. */
static void sdpa_check(const char *what, const attn_case *c, const attn_result *got,
                       double *const ref[5], double *const mag[5], double *const pmag[5],
                       int64_t bad[5]) {
    const double ub = 0x1p-8, u = 0x1p-24; // bf16 (8-bit significand) and f32 unit roundoffs
    int64_t n[5], group = c->NH / c->NKV;
    attn_sizes(c, n);
    double lse_max = 0;
    for (int64_t e = 0; e < n[1]; e++) lse_max = fmax(lse_max, fabs(ref[1][e]));
    double Lmax = 4.0 * (double)(c->T + c->D) * u * (lse_max + sqrt((double)c->D));
    for (int i = 0; i < 5; i++) {
        double worst = 0, at_bound = 0;
        bad[i] = 0;
        for (int64_t e = 0; e < n[i]; e++) {
            double r = ref[i][e], m = mag[i][e], d = fabs((double)got->t[i][e] - r), bound;
            double f = 4.0 * (double)(group * c->T + c->D) * u * (m + 1.0);
            if (i == 1)
                bound = 4.0 * (double)(c->T + c->D) * u * (fabs(r) + sqrt((double)c->D));
            else if (i == 0)
                bound = ub * m + ub * fabs(r) + f;
            else
                bound = 2.0 * ub * m + ub * fabs(r) + Lmax * m + f +
                        2.0 * (double)(c->D * c->D) * u * pmag[i][e];
            if (!(d <= bound)) bad[i]++;
            if (d / bound > worst || isnan(d)) worst = d / bound, at_bound = bound;
        }
        printf("\n    %s B%lld T%lld NH%lld NKV%lld D%lld %s: worst |diff| / bound %.3g (bound "
               "there %.3g), %lld out of bound",
               what, (long long)c->B, (long long)c->T, (long long)c->NH, (long long)c->NKV,
               (long long)c->D, attn_names[i], worst, at_bound, (long long)bad[i]);
    }
}

typedef struct sdpa_ref {
    double *ref[5], *mag[5], *pmag[5];
} sdpa_ref;

static sdpa_ref sdpa_ref_make(const attn_case *c, float *const in[3], const float *dout,
                              const float *out) {
    int64_t n[5];
    attn_sizes(c, n);
    sdpa_ref r;
    for (int i = 0; i < 5; i++) {
        r.ref[i] = malloc((size_t)n[i] * sizeof(double));
        r.mag[i] = malloc((size_t)n[i] * sizeof(double));
        r.pmag[i] = malloc((size_t)n[i] * sizeof(double));
        FSDP_ASSERT(r.ref[i] && r.mag[i] && r.pmag[i]);
    }
    sdpa_reference(c, in[0], in[1], in[2], dout, out, r.ref, r.mag, r.pmag);
    return r;
}

static void sdpa_ref_free(sdpa_ref *r) {
    for (int i = 0; i < 5; i++) free(r->ref[i]), free(r->mag[i]), free(r->pmag[i]);
}
#endif

/* The float64 reference and the bound attention_cudnn judges cuDNN by, checked where there is
 * no GPU: the CPU table (f32, on the same bf16 inputs) lies within the bound (its errors are
 * the f32 part of it), and a negative control: one element of each result moved by a tenth of
 * its magnitude is flagged. */
static void test_attention_reference(void) {
#ifndef FSDP_HAVE_CUDA
    fsdp_test_skip("the reference serves the CUDA build's cuDNN check, which this build has not");
#else
    rng_seed(41);
    for (size_t ci = 0; ci < sizeof sdpa_cases / sizeof *sdpa_cases; ci++) {
        const attn_case *c = &sdpa_cases[ci];
        int64_t n[5];
        attn_sizes(c, n);
        float *in[3], *dout;
        sdpa_inputs(c, in, &dout);
        float *scratch = new_uniform(2 * c->T * c->T, 0, 0);
        attn_result cpu;
        for (int i = 0; i < 5; i++) cpu.t[i] = new_uniform(n[i], 0, 0);
        const fsdp_kernels_i *C = fsdp_kernels_for(FSDP_CPU);
        C->attention_forward(cpu.t[0], cpu.t[1], scratch, in[0], in[1], in[2], c->B, c->T, c->NH,
                             c->NKV, c->D);
        C->attention_backward(cpu.t[2], cpu.t[3], cpu.t[4], scratch, dout, in[0], in[1], in[2],
                              cpu.t[0], cpu.t[1], c->B, c->T, c->NH, c->NKV, c->D);
        sdpa_ref r = sdpa_ref_make(c, in, dout, cpu.t[0]);
        int64_t bad[5];
        sdpa_check("cpu", c, &cpu, r.ref, r.mag, r.pmag, bad);
        for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(bad[i], 0);
        for (int i = 0; i < 5; i++) { // the control
            int64_t e = n[i] / 2;
            cpu.t[i][e] += (float)(0.1 * (r.mag[i][e] + fabs(r.ref[i][e]) + 1.0));
        }
        sdpa_check("cpu, one element moved", c, &cpu, r.ref, r.mag, r.pmag, bad);
        for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(bad[i], 1);
        sdpa_ref_free(&r);
        attn_free(&cpu);
        for (int t = 0; t < 3; t++) free(in[t]);
        free(dout), free(scratch);
    }
#endif
}

/* cuDNN's fused attention (fsdp_cuda_thread_set_attention CUDNN) against the float64 reference
 * of the same bf16 inputs within sdpa_check's bounds, forward and backward: multi-head and
 * grouped-query heads (groups of 1, 3, 4, 8), T odd and not a multiple of 64, T 1, D 64 and
 * 128; D 20 (not a multiple of 8) is refused and runs the tiled kernels, bit for bit; the plan
 * cache hits on a repeated shape. The bf16-tensor entries (attention_forward_bf16_round,
 * attention_backward_bf16_round) on the same inputs: cuDNN's forward bits where it runs, the
 * tiled forward's rounded where it refuses, the gradients within the same bounds. */
static void test_attention_cudnn(void) {
    if (!cuda_only("cuDNN's fused attention (fsdp_cuda_thread_set_attention)")) return;
#ifdef FSDP_HAVE_CUDA
    char why[512] = "";
    if (fsdp_cuda_cudnn_version(why, sizeof why) == 0) {
        fsdp_test_skip("no cuDNN to load: %s", why);
        return;
    }
    rng_seed(37);
    for (size_t ci = 0; ci < sizeof sdpa_cases / sizeof *sdpa_cases; ci++) {
        const attn_case *c = &sdpa_cases[ci];
        int64_t n[5];
        attn_sizes(c, n);
        float *in[3], *dout;
        sdpa_inputs(c, in, &dout);
        fsdp_cuda_sdpa_stats s0 = fsdp_cuda_sdpa_stats_get();
        attn_result got = attn_on_device(c, FSDP_CUDA_ATTENTION_CUDNN, in[0], in[1], in[2], dout);
        fsdp_cuda_sdpa_stats s1 = fsdp_cuda_sdpa_stats_get();
        if (c->D % 8 != 0) { // refused: the tiled kernels ran it
            attn_result flash =
                attn_on_device(c, FSDP_CUDA_ATTENTION_FLASH, in[0], in[1], in[2], dout);
            for (int i = 0; i < 5; i++)
                CU_ASSERT_EQUAL(memcmp(got.t[i], flash.t[i], (size_t)n[i] * sizeof(float)), 0);
            CU_ASSERT_EQUAL(s1.refusals, s0.refusals + 2);
            // the bf16-tensor entries, refused too: the tiled kernels on batches widened in
            // scratch, their forward the tiled one's rounded (bits), the rest within the bound
            attn_result a16 = attn_run16(c, FSDP_CUDA_ATTENTION_AUTO, in[0], in[1], in[2], dout, 0);
            int64_t off = 0;
            for (int64_t e = 0; e < n[0]; e++) off += a16.t[0][e] != round_bf16(flash.t[0][e]);
            CU_ASSERT_EQUAL(off, 0);
            CU_ASSERT_EQUAL(memcmp(a16.t[1], flash.t[1], (size_t)n[1] * sizeof(float)), 0);
            sdpa_ref r16 = sdpa_ref_make(c, in, dout, a16.t[0]);
            int64_t bad16[5];
            sdpa_check("refused, bf16-tensor entries", c, &a16, r16.ref, r16.mag, r16.pmag, bad16);
            for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(bad16[i], 0);
            sdpa_ref_free(&r16);
            attn_free(&a16);
            attn_free(&flash);
        } else {
            CU_ASSERT_EQUAL(s1.refusals, s0.refusals);
            // the backward was given cuDNN's out (bf16 values): the reference's softmax sum too
            sdpa_ref r = sdpa_ref_make(c, in, dout, got.t[0]);
            int64_t bad[5];
            sdpa_check("cudnn", c, &got, r.ref, r.mag, r.pmag, bad);
            for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(bad[i], 0);
            sdpa_ref_free(&r);
            // the same shape again: both plans come from the cache
            attn_result again =
                attn_on_device(c, FSDP_CUDA_ATTENTION_CUDNN, in[0], in[1], in[2], dout);
            fsdp_cuda_sdpa_stats s2 = fsdp_cuda_sdpa_stats_get();
            CU_ASSERT_EQUAL(s2.builds, s1.builds);
            CU_ASSERT_TRUE(s2.hits >= s1.hits + 2);
            attn_free(&again);
            // auto (the default): the bf16 policy's entries run cuDNN (its forward's bits, the
            // gradients within the bound), the f32 entries the tiled kernels, bit for bit
            attn_result ab = attn_run(c, FSDP_CUDA_ATTENTION_AUTO, true, in[0], in[1], in[2], dout);
            attn_result af =
                attn_run(c, FSDP_CUDA_ATTENTION_AUTO, false, in[0], in[1], in[2], dout);
            attn_result fl =
                attn_on_device(c, FSDP_CUDA_ATTENTION_FLASH, in[0], in[1], in[2], dout);
            for (int i = 0; i < 2; i++)
                CU_ASSERT_EQUAL(memcmp(ab.t[i], got.t[i], (size_t)n[i] * sizeof(float)), 0);
            sdpa_ref ra = sdpa_ref_make(c, in, dout, ab.t[0]);
            sdpa_check("auto, bf16 entries", c, &ab, ra.ref, ra.mag, ra.pmag, bad);
            for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(bad[i], 0);
            for (int i = 0; i < 5; i++)
                CU_ASSERT_EQUAL(memcmp(af.t[i], fl.t[i], (size_t)n[i] * sizeof(float)), 0);
            sdpa_ref_free(&ra);
            // the bf16-tensor entries under auto: cuDNN on the tensors as they are, its forward's
            // bits (the f32 entries' conversions were exact), the gradients within the bound
            attn_result a16 = attn_run16(c, FSDP_CUDA_ATTENTION_AUTO, in[0], in[1], in[2], dout, 0);
            for (int i = 0; i < 2; i++)
                CU_ASSERT_EQUAL(memcmp(a16.t[i], got.t[i], (size_t)n[i] * sizeof(float)), 0);
            sdpa_ref r16 = sdpa_ref_make(c, in, dout, a16.t[0]);
            sdpa_check("auto, bf16-tensor entries", c, &a16, r16.ref, r16.mag, r16.pmag, bad);
            for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(bad[i], 0);
            sdpa_ref_free(&r16);
            attn_free(&a16);
            attn_free(&ab), attn_free(&af), attn_free(&fl);
            // the same on tensors one element off 16-byte alignment (views at an offset): the
            // plans assume it, so no plan runs (nor is built) and the calls run the tiled kernels
            // on the widened batches, the bits of the aligned tensors under the tiled choice
            fsdp_cuda_sdpa_stats s3 = fsdp_cuda_sdpa_stats_get();
            attn_result un = attn_run16(c, FSDP_CUDA_ATTENTION_AUTO, in[0], in[1], in[2], dout, 1);
            fsdp_cuda_sdpa_stats s4 = fsdp_cuda_sdpa_stats_get();
            attn_result tiled =
                attn_run16(c, FSDP_CUDA_ATTENTION_FLASH, in[0], in[1], in[2], dout, 0);
            CU_ASSERT_TRUE(s4.builds == s3.builds && s4.hits == s3.hits);
            for (int i = 0; i < 5; i++)
                CU_ASSERT_EQUAL(memcmp(un.t[i], tiled.t[i], (size_t)n[i] * sizeof(float)), 0);
            attn_free(&un), attn_free(&tiled);
        }
        attn_free(&got);
        for (int t = 0; t < 3; t++) free(in[t]);
        free(dout);
    }
    fsdp_cuda_sdpa_stats s = fsdp_cuda_sdpa_stats_get();
    printf("\n    plan cache: %lld builds, %lld hits, %lld evictions, %lld refusals, %d slots",
           (long long)s.builds, (long long)s.hits, (long long)s.evictions, (long long)s.refusals,
           s.slots_used);
#endif
}

/* ---- outputs and scratch that start stale ---- */

/* A device bf16 result (n) widened, against the CPU's bf16 result: the bits on sim; on CUDA
 * within 2^-7 relative (an f32 value one rounding off the CPU's may round to the neighbouring
 * bf16, 2^-8 relative away) and 1e-6 absolute. A NaN where the CPU has a number fails. */
static bool dev_close16(const char *name, const fsdp_bf16 *d, const fsdp_bf16 *want, int64_t n) {
    fsdp_bf16 *got = malloc((size_t)(n > 0 ? n : 1) * 2);
    float *gw = malloc((size_t)(n > 0 ? n : 1) * 4), *ww = malloc((size_t)(n > 0 ? n : 1) * 4);
    CU_ASSERT_FATAL(got && gw && ww);
    dev_get(got, d, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        gw[i] = fsdp_bf16_to_f32(got[i]), ww[i] = fsdp_bf16_to_f32(want[i]);
    bool ok = fsdp_test_device_close(name, gw, ww, n, 0x1p-7, 1e-6);
    free(got), free(gw), free(ww);
    return ok;
}

static fsdp_bf16 *bf16_uniform(int64_t n, float lo, float hi) {
    fsdp_bf16 *p = malloc((size_t)(n > 0 ? n : 1) * 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    for (int64_t i = 0; i < n; i++) p[i] = fsdp_bf16_from_f32(rng_uniform(lo, hi));
    return p;
}

/* The entries with bf16 outputs or inputs that the cases above do not run (the Llama's RoPE
 * and SwiGLU under the bf16 policy, gemm_bf16_round), and SGD's first step with momentum,
 * each on device outputs that start as NaN (dev_new) against the CPU's into zeroed memory: an
 * element an entry leaves unwritten fails. Odd sizes (tails past the vector loops), and the
 * SGD buffer, which the first step writes without reading (`first`), NaN on both sides. */
static void test_stale_outputs(void) {
    const fsdp_kernels_i *c = fsdp_kernels_for(FSDP_CPU), *g = K();
    rng_seed(43);
    enum { B = 2, T = 5, NH = 6, NKV = 2, D = 10 };
    const int64_t nq = B * T * NH * D, nk = B * T * NKV * D, h = D / 2;
    float *cs = new_uniform(2 * T * h, -1, 1), *dcs = dev_floats(cs, 2 * T * h);
    const float *sn = cs + T * h, *dsn = dcs + T * h;
    fsdp_bf16 *q16 = bf16_uniform(nq + nk, -2, 2), *dq16 = dev_new(q16, (size_t)(nq + nk) * 2);
    float *qf = new_uniform(nq + nk, -2, 2), *dqf = dev_floats(qf, nq + nk);
    /* rope_qk_forward_bf16 (f32 out), rope_qk_backward_round (bf16 out from f32) */
    float *of = calloc((size_t)(nq + nk), 4), *dof = dev_floats(NULL, nq + nk);
    fsdp_bf16 *o16 = calloc((size_t)(nq + nk), 2), *do16 = dev_new(NULL, (size_t)(nq + nk) * 2);
    CU_ASSERT_FATAL(of && o16);
    c->rope_qk_forward_bf16(of, of + nq, q16, q16 + nq, cs, sn, B, T, NH, NKV, D);
    g->rope_qk_forward_bf16(dof, dof + nq, dq16, dq16 + nq, dcs, dsn, B, T, NH, NKV, D);
    DEV_CLOSE("rope_qk_forward_bf16", dof, of, nq + nk, 1e-6, 1e-7);
    c->rope_qk_backward_round(o16, o16 + nq, qf, qf + nq, cs, sn, B, T, NH, NKV, D);
    g->rope_qk_backward_round(do16, do16 + nq, dqf, dqf + nq, dcs, dsn, B, T, NH, NKV, D);
    CU_ASSERT_TRUE(dev_close16("rope_qk_backward_round", do16, o16, nq + nk));
    /* rope_qk_forward_bf16_round and rope_qk_backward_bf16_round, bf16 to bf16 */
    for (int back = 0; back < 2; back++) {
        fsdp_bf16 *d = dev_new(NULL, (size_t)(nq + nk) * 2);
        memset(o16, 0, (size_t)(nq + nk) * 2);
        (back ? c->rope_qk_backward_bf16_round : c->rope_qk_forward_bf16_round)(
            o16, o16 + nq, q16, q16 + nq, cs, sn, B, T, NH, NKV, D);
        (back ? g->rope_qk_backward_bf16_round : g->rope_qk_forward_bf16_round)(
            d, d + nq, dq16, dq16 + nq, dcs, dsn, B, T, NH, NKV, D);
        CU_ASSERT_TRUE(dev_close16(
            back ? "rope_qk_backward_bf16_round" : "rope_qk_forward_bf16_round", d, o16, nq + nk));
        dev_free(d);
    }
    free(of), free(o16), dev_free(dof), dev_free(do16);
    /* SwiGLU's bf16 entries over n = 1001 (gate, up: gu's two halves; dout f32 and bf16) */
    const int64_t n = 1001;
    fsdp_bf16 *gu = bf16_uniform(2 * n, -3, 3), *dgu = dev_new(gu, (size_t)(2 * n) * 2);
    float *dy = new_uniform(n, -1, 1), *ddy = dev_floats(dy, n);
    fsdp_bf16 *dy16 = bf16_uniform(n, -1, 1), *ddy16 = dev_new(dy16, (size_t)n * 2);
    float *f2 = calloc((size_t)(2 * n), 4), *df2 = dev_floats(NULL, 2 * n);
    fsdp_bf16 *b2 = calloc((size_t)(2 * n), 2), *db2 = dev_new(NULL, (size_t)(2 * n) * 2);
    CU_ASSERT_FATAL(f2 && b2);
    c->swiglu_forward_bf16(b2, gu, gu + n, n);
    g->swiglu_forward_bf16(db2, dgu, dgu + n, n);
    CU_ASSERT_TRUE(dev_close16("swiglu_forward_bf16", db2, b2, n));
    c->swiglu_backward_bf16(f2, f2 + n, dy, gu, gu + n, n);
    g->swiglu_backward_bf16(df2, df2 + n, ddy, dgu, dgu + n, n);
    DEV_CLOSE("swiglu_backward_bf16", df2, f2, 2 * n, 1e-6, 1e-7);
    dev_free(db2), db2 = dev_new(NULL, (size_t)(2 * n) * 2);
    c->swiglu_backward_bf16_round(b2, b2 + n, dy, gu, gu + n, n);
    g->swiglu_backward_bf16_round(db2, db2 + n, ddy, dgu, dgu + n, n);
    CU_ASSERT_TRUE(dev_close16("swiglu_backward_bf16_round", db2, b2, 2 * n));
    dev_free(db2), db2 = dev_new(NULL, (size_t)(2 * n) * 2);
    c->swiglu_backward_bf16io(b2, b2 + n, dy16, gu, gu + n, n);
    g->swiglu_backward_bf16io(db2, db2 + n, ddy16, dgu, dgu + n, n);
    CU_ASSERT_TRUE(dev_close16("swiglu_backward_bf16io", db2, b2, 2 * n));
    free(gu), free(dy), free(dy16), free(f2), free(b2), dev_free(dgu);
    dev_free(ddy), dev_free(ddy16), dev_free(df2), dev_free(db2);
    /* gemm_bf16_round: C (M, N) = A (M, K) B^T; K = 0 writes zeros */
    const int64_t M = 37, N = 29;
    for (int64_t K = 0; K <= 45; K += 45) {
        fsdp_bf16 *A = bf16_uniform(M * K, -1, 1), *Bm = bf16_uniform(N * K, -1, 1);
        fsdp_bf16 *C = calloc((size_t)(M * N), 2), *dA = dev_new(A, (size_t)(M * K) * 2);
        fsdp_bf16 *dB = dev_new(Bm, (size_t)(N * K) * 2), *dC = dev_new(NULL, (size_t)(M * N) * 2);
        CU_ASSERT_FATAL(C != NULL);
        c->gemm_bf16_round(false, true, M, N, K, A, K, Bm, K, C, N);
        g->gemm_bf16_round(false, true, M, N, K, dA, K, dB, K, dC, N);
        CU_ASSERT_TRUE(dev_close16(K ? "gemm_bf16_round" : "gemm_bf16_round K = 0", dC, C, M * N));
        free(A), free(Bm), free(C), dev_free(dA), dev_free(dB), dev_free(dC);
    }
    /* SGD's first step with momentum: buf = d, not read (NaN on both sides before) */
    float *p = new_uniform(n, -1, 1), *gr = new_uniform(n, -1, 1), *buf = new_uniform(n, 0, 0);
    for (int64_t i = 0; i < n; i++) buf[i] = NAN;
    float *dp = dev_floats(p, n), *dgr = dev_floats(gr, n), *dbuf = dev_floats(NULL, n);
    fsdp_sgd_step_args a = {.sign = 1,
                            .weight_decay = 0.01f,
                            .momentum = 0.9f,
                            .keep = 0.9f,
                            .neg_lr = -0.1f,
                            .nesterov = true,
                            .first = true};
    c->sgd_update(p, gr, buf, n, &a);
    g->sgd_update(dp, dgr, dbuf, n, &a);
    DEV_CLOSE("sgd_update first step: p", dp, p, n, 1e-6, 1e-7);
    DEV_CLOSE("sgd_update first step: buf", dbuf, buf, n, 1e-6, 1e-7);
    free(p), free(gr), free(buf), dev_free(dp), dev_free(dgr), dev_free(dbuf);
    free(cs), free(q16), free(qf), dev_free(dcs), dev_free(dq16), dev_free(dqf);
}

/* Fills the caching allocator's cache with blocks whose every byte is `byte`: two of each size
 * from 512 bytes to 16 MiB in steps of 5/4 (a block serves requests down to 3/4 of its size,
 * so every request in that range finds one; blocks under 1 MiB serve only requests under it,
 * so the largest such block is one of them), about 160 MiB, after emptying it. The entries
 * below take under 1 MiB of scratch at their shapes (cuDNN's workspace: what its plan asks).
 * CUDA only: sim's table takes no scratch memory of its own. */
static void fill_cache(unsigned char byte) {
#ifdef FSDP_HAVE_CUDA
    if (!fsdp_test_device_is_cuda()) return;
    empty_cache();
    void *blocks[2 * 64];
    int nb = 0;
    uint32_t bits = 0x01010101u * byte;
    for (int k = 0; nb + 2 <= 2 * 64; k++) { /* first the largest small block (1 MiB - 512) */
        double size = k == 0 ? (double)((1 << 20) - 512) : 512.0 * pow(1.25, k - 1);
        if (size > 16.0 * (1 << 20)) break;
        for (int twice = 0; twice < 2; twice++) {
            size_t bytes = (size_t)size & ~(size_t)3;
            blocks[nb] = dev_zeros(bytes);
            FSDP_TEST_OK(storage()->fill(fsdp_test_ctx(), dev().index, blocks[nb], &bits, 4,
                                         (int64_t)(bytes / 4)));
            nb++;
        }
    }
    for (int i = 0; i < nb; i++) dev_free(blocks[i]);
#else
    (void)byte;
#endif
}

/* Runs the entries that take scratch memory from the caching allocator (the chunked column
 * sums of the bias and RMSNorm weight gradients, cuBLASLt's bias-gradient vector, the
 * embedding backward's sort, the GEMM and cuDNN attention paths' blocks and workspaces) with
 * the cache filled with `byte`; their results copied to out (floats, in order). */
static int64_t scratch_entries(unsigned char byte, float *out) {
    const fsdp_kernels_i *g = K();
    enum { R = 4096, C = 96, OC = 40, V = 300, NT = 1000, EC = 24 };
    enum { B = 2, T = 70, NH = 4, NKV = 2, D = 64 };
    rng_seed(44); /* the same inputs for every byte */
    float *x = new_uniform(R * C, -1, 1), *y = new_uniform(R * OC, -1, 1);
    float *w = new_uniform(C, 0.5f, 1.5f);
    int32_t tok[NT];
    for (int i = 0; i < NT; i++) tok[i] = i % 7 == 0 ? 5 : (int32_t)(rng_u32() % (V + 20));
    const int64_t nq = B * T * NH * D, nk = B * T * NKV * D;
    float *qkv = new_uniform(nq + 2 * nk, -1, 1), *dout = new_uniform(nq, -1, 1);
    float *dx = dev_floats(x, R * C), *dy = dev_floats(y, R * OC), *dw = dev_floats(w, C);
    float *dtok = (float *)dev_new(tok, sizeof tok), *dqkv = dev_floats(qkv, nq + 2 * nk);
    float *ddout = dev_floats(dout, nq);
    /* outputs: accumulated into start at zero; written ones start as NaN */
    const int64_t len[] = {C,  OC * C, OC, C,  R * C,      R,  V * EC, nq, B * NH * T,
                           nq, nk,     nk, nq, B * NH * T, nq, nk,     nk};
    enum { N_OUT = sizeof len / sizeof *len };
    float *o[N_OUT];
    for (int i = 0; i < N_OUT; i++)
        o[i] = i < 4 || i == 6 ? dev_zeros((size_t)len[i] * 4) : dev_floats(NULL, len[i]);
    fill_cache(byte);
    g->bias_backward(o[0], dx, R, C); /* column sums over 16 chunks */
#ifdef FSDP_HAVE_CUDA
    if (fsdp_test_device_is_cuda()) fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT);
#endif
    g->gemm_bgrad(o[1], o[2], dy, dx, R, C, OC); /* BGRADB's vector from the cache */
    g->rmsnorm_forward(o[4], o[5], dx, dw, 1e-5f, R, C);
    float *dxx = dev_floats(NULL, R * C);
    g->rmsnorm_backward(dxx, o[3], dx, dx, dw, o[5], R, C); /* the fused form's chunk sums */
    dev_free(dxx);
    g->embedding_backward(o[6], dx, (const int32_t *)dtok, NT, EC, 0, V);             /* the sort */
    float *q = dqkv, *k = dqkv + nq, *v = k + nk, *scr = dev_floats(NULL, 2 * T * T); /* sim's */
    for (int path = 0; path < 2; path++) { /* the GEMM attention, then cuDNN's (or the tiled) */
#ifdef FSDP_HAVE_CUDA
        if (fsdp_test_device_is_cuda())
            fsdp_cuda_thread_set_attention(path ? FSDP_CUDA_ATTENTION_CUDNN
                                                : FSDP_CUDA_ATTENTION_GEMM);
#endif
        float **a = o + 7 + 5 * path; /* out, lse, dq, dk, dv */
        g->attention_forward(a[0], a[1], scr, q, k, v, B, T, NH, NKV, D);
        g->attention_backward(a[2], a[3], a[4], scr, ddout, q, k, v, a[0], a[1], B, T, NH, NKV, D);
    }
    dev_free(scr);
#ifdef FSDP_HAVE_CUDA
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_DEFAULT);
    fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_DEFAULT);
#endif
    int64_t at = 0;
    for (int i = 0; i < N_OUT; i++) {
        if (out) dev_get(out + at, o[i], (size_t)len[i] * 4);
        at += len[i];
        dev_free(o[i]);
    }
    free(x), free(y), free(w), free(qkv), free(dout);
    dev_free(dx), dev_free(dy), dev_free(dw), dev_free(dtok), dev_free(dqkv), dev_free(ddout);
    return at;
}

/* The scratch-taking entries with the caching allocator's cache full of NaN (0xFF bytes, what a
 * block may hold from its last user) and then of zeros: the same bits both times (each entry is
 * deterministic), and no NaN: none reads scratch memory it did not write. On sim (no scratch)
 * the same comparison, trivially. */
static void test_stale_scratch(void) {
    int64_t n = scratch_entries(0, NULL);
    float *nan_run = malloc((size_t)n * 4), *zero_run = malloc((size_t)n * 4);
    CU_ASSERT_FATAL(nan_run && zero_run);
    scratch_entries(0xFF, nan_run);
    scratch_entries(0x00, zero_run);
    int64_t nans = 0, differ = 0;
    for (int64_t i = 0; i < n; i++) {
        nans += isnan(nan_run[i]);
        differ += memcmp(&nan_run[i], &zero_run[i], 4) != 0;
    }
    printf("\n    %lld results: %lld NaN, %lld differ between a cache of NaN and one of zeros",
           (long long)n, (long long)nans, (long long)differ);
    CU_ASSERT_EQUAL(nans, 0);
    CU_ASSERT_EQUAL(differ, 0);
    free(nan_run), free(zero_run);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"table", test_table},
        {"device_out_of_range", test_device_out_of_range},
        {"alloc_reuse", test_alloc_reuse},
        {"alloc_errors", test_alloc_errors},
        {"copy", test_copy},
        {"fill_convert", test_fill_convert},
        {"tensor", test_tensor},
        {"threads", test_threads},
        {"gemm", test_gemm},
        {"gemm_tf32", test_gemm_tf32},
        {"bias", test_bias},
        {"activations", test_activations},
        {"elementwise", test_elementwise},
        {"rmsnorm", test_rmsnorm},
        {"reductions", test_reductions},
        {"losses", test_losses},
        {"row_grids", test_row_grids},
        {"bf16", test_bf16},
        {"f16", test_f16},
        {"reduce_n", test_reduce_n},
        {"optim", test_optim},
        {"adam_bf16", test_adam_bf16},
        {"adam_multi", test_adam_multi},
        {"gemm_bf16", test_gemm_bf16},
        {"gemm_lt", test_gemm_lt},
        {"gemm_lt_cache", test_gemm_lt_cache},
        {"epilogue", test_epilogue},
        {"attention_flash", test_attention_flash},
        {"cudnn_loader", test_cudnn_loader},
        {"sdpa_graph_ops", test_sdpa_graph_ops},
        {"attention_reference", test_attention_reference},
        {"attention_cudnn", test_attention_cudnn},
        {"stale_outputs", test_stale_outputs},
        {"stale_scratch", test_stale_scratch},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "kernels_cuda", cases, sizeof cases / sizeof *cases);
}

/* test_sim.c: the simulated GPU itself (src/kernels/sim): memory the host cannot touch (a host
 * read dies naming the allocation), the caching allocator (NaN-filled fresh blocks, reuse,
 * cross-stream reuse ordered by events, the FSDP_SIM_MEMORY cap), streams and events in every
 * mode, and the negative controls the device path relies on: a missing cross-stream wait reads
 * stale data in deferred mode (and is a ThreadSanitizer report in the TSan build), and a pinned
 * buffer changed before its copy ran is what the copy reads; the fused GEMM entries ordered by
 * a cross-stream wait in deferred mode give the CPU's bits. The scenarios that must end a
 * process run in a child: this program started again with `--scenario NAME`. */
#define _POSIX_C_SOURCE 200809L /* popen, setenv */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/device.h"          // defines: fsdp_device_for
#include "core/stream.h"          // defines: fsdp_stream_create, fsdp_event_record, fsdp_host_alloc
#include "harness.h"              // defines: fsdp_test_run, fsdp_test_ctx, FSDP_TEST_OK
#include "kernels/gpu_peaks.h"    // defines: fsdp_gpu_peaks
#include "kernels/kernels.h"      // defines: fsdp_kernels_for
#include "kernels/sim/sim_impl.h" // defines: sim_block_alloc, fsdp_sim_mode_set

#define SIM0   ((fsdp_device){FSDP_DEVICE_SIM, 0})
#define SIM1   ((fsdp_device){FSDP_DEVICE_SIM, 1})
#define CAP_MB 64 /* FSDP_SIM_MEMORY of this program (set before the first use) */

static const char *self_exe;

static const fsdp_device_i *sim(void) {
    return fsdp_device_for(FSDP_DEVICE_SIM);
}

/* n floats on sim:0, zeroed. */
static float *dev_alloc(int64_t n) {
    void *p = NULL;
    FSDP_TEST_OK(sim()->alloc(fsdp_test_ctx(), 0, (size_t)n * 4, &p));
    return p;
}

static void dev_put(float *dev, const float *host, int64_t n) {
    FSDP_TEST_OK(sim()->copy(fsdp_test_ctx(), dev, SIM0, host, FSDP_CPU, (size_t)n * 4));
}

static void dev_get(float *host, const float *dev, int64_t n) {
    FSDP_TEST_OK(sim()->copy(fsdp_test_ctx(), host, FSDP_CPU, dev, SIM0, (size_t)n * 4));
}

static bool all_equal(const float *x, int64_t n, float want) {
    for (int64_t i = 0; i < n; i++)
        if (!(x[i] == want)) return false;
    return true;
}

/* Runs this program again with `--scenario name`; returns its exit status as the shell
 * reports it (128 + signal for a death) and its output (stdout and stderr) in out. */
static int run_scenario(const char *name, char *out, size_t size) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --scenario %s 2>&1", self_exe, name);
    FILE *f = popen(cmd, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    size_t len = fread(out, 1, size - 1, f);
    out[len] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the scenarios run in a child (no CUnit there: plain checks, the exit status says) ---- */

#define REQUIRE(call)                                                                              \
    do {                                                                                           \
        if ((call) != FSDP_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s\n", #call, fsdp_last_error(ctx));                       \
            return 3;                                                                              \
        }                                                                                          \
    } while (0)

static int scenario_host_read(fsdp_ctx *ctx) {
    float *d = NULL;
    REQUIRE(sim()->alloc(ctx, 0, 4000, (void **)&d));
    volatile float x = d[10]; // the bug this device exists to catch
    printf("read %g: the host read of device memory did not fault\n", (double)x);
    return 0;
}

/* Stream a writes 5s into x; stream b copies x to y without waiting for a. */
static int scenario_missing_wait(fsdp_ctx *ctx) {
    enum { n = 256 };
    float *x = NULL, *y = NULL, host[n];
    REQUIRE(sim()->alloc(ctx, 0, sizeof host, (void **)&x));
    REQUIRE(sim()->alloc(ctx, 0, sizeof host, (void **)&y));
    REQUIRE(fsdp_device_synchronize(ctx, SIM0)); // the zeroing has run
    fsdp_stream a, b;
    REQUIRE(fsdp_stream_create(ctx, SIM0, &a));
    REQUIRE(fsdp_stream_create(ctx, SIM0, &b));
    fsdp_stream was = fsdp_stream_set_current(a);
    fsdp_kernels_for(SIM0)->fill(x, 5.0f, n);
    fsdp_stream_set_current(b);
    fsdp_kernels_for(SIM0)->copy(y, x, n); // no fsdp_stream_wait(b, an event after the fill)
    REQUIRE(fsdp_stream_synchronize(ctx, b));
    fsdp_stream_set_current(was);
    REQUIRE(sim()->copy(ctx, host, FSDP_CPU, y, SIM0, sizeof host));
    printf("y[0] = %g\n", (double)host[0]);
    fsdp_stream_destroy(a);
    fsdp_stream_destroy(b);
    sim()->free(0, x);
    sim()->free(0, y);
    return 0;
}

/* A kernel writes 392 bytes into an allocation of 196: the guard in the block's slack says so
 * when the block is freed. */
static int scenario_overrun(fsdp_ctx *ctx) {
    float *x = NULL;
    REQUIRE(sim()->alloc(ctx, 0, 196, (void **)&x));
    fsdp_kernels_for(SIM0)->fill(x, 1.0f, 98);
    sim()->free(0, x);
    REQUIRE(fsdp_device_synchronize(ctx, SIM0));
    printf("the overrun went unnoticed\n");
    return 0;
}

/* A pinned buffer changed while its copy to the device is still queued. */
static int scenario_pinned_reuse(fsdp_ctx *ctx) {
    enum { n = 512 };
    float *pinned = NULL, *x = NULL, back[n];
    REQUIRE(fsdp_host_alloc(ctx, FSDP_DEVICE_SIM, sizeof back, (void **)&pinned));
    REQUIRE(sim()->alloc(ctx, 0, sizeof back, (void **)&x));
    for (int i = 0; i < n; i++) pinned[i] = 1.0f;
    REQUIRE(sim()->copy(ctx, x, SIM0, pinned, FSDP_CPU, sizeof back));
    for (int i = 0; i < n; i++) pinned[i] = 2.0f; // no wait for the copy
    REQUIRE(sim()->copy(ctx, back, FSDP_CPU, x, SIM0, sizeof back));
    printf("x[0] = %g\n", (double)back[0]);
    fsdp_host_free(FSDP_DEVICE_SIM, pinned);
    sim()->free(0, x);
    return 0;
}

static int scenario(const char *name) {
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(NULL, &ctx) != FSDP_OK) return 3;
    int st = !strcmp(name, "host_read")      ? scenario_host_read(ctx)
             : !strcmp(name, "missing_wait") ? scenario_missing_wait(ctx)
             : !strcmp(name, "pinned_reuse") ? scenario_pinned_reuse(ctx)
             : !strcmp(name, "overrun")      ? scenario_overrun(ctx)
                                             : (fprintf(stderr, "unknown scenario %s\n", name), 2);
    fsdp_ctx_free(ctx);
    return st;
}

#ifdef UNDER_TSAN
/* The TSan build's controls run in a child: the race must be reported, and ends the child with
 * TSan's exit status. */
static void expect_race(const char *name) {
    char out[16384];
    int st = run_scenario(name, out, sizeof out);
    CU_ASSERT_NOT_EQUAL(st, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "ThreadSanitizer: data race"));
    if (!strstr(out, "ThreadSanitizer: data race")) printf("\n    child said: %s", out);
}
#endif

/* ---- memory ---- */

static void test_record(void) {
    const fsdp_device_i *d = sim();
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    CU_ASSERT_STRING_EQUAL(d->name, "sim");
    CU_ASSERT_EQUAL(d->device_count(), 2); // FSDP_SIM_DEVICES is unset: the default
    CU_ASSERT_EQUAL(fsdp_device_count(FSDP_DEVICE_SIM), 2);
    CU_ASSERT_PTR_EQUAL(fsdp_kernels_for(SIM0), fsdp_kernels_sim());
    CU_ASSERT_STRING_EQUAL(fsdp_device_to_string(SIM0), "sim");
    fsdp_tensor *t = NULL;
    FSDP_TEST_FAILS(fsdp_tensor_create(fsdp_test_ctx(), FSDP_DTYPE_F32,
                                       (fsdp_device){FSDP_DEVICE_SIM, 2}, 1, (int64_t[]){4}, &t),
                    FSDP_ERR_DEVICE, "sim:2", "2 sim devices", "FSDP_SIM_DEVICES");
}

/* A host read of device memory ends the process with a message naming the allocation. */
static void test_host_read_dies(void) {
    char out[8192];
    int st = run_scenario("host_read", out, sizeof out);
    CU_ASSERT_NOT_EQUAL(st, 0);
    CU_ASSERT_PTR_NULL(strstr(out, "did not fault"));
#if defined(__SANITIZE_ADDRESS__)
    // AddressSanitizer's own handler may report the fault first; the death is what counts.
    CU_ASSERT_TRUE(strstr(out, "sim:0") || strstr(out, "SEGV"));
#else
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "the host touched memory of the simulated device sim:0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "40 bytes into an allocation of 4000 bytes at"));
#endif
    if (st == 0 || !strstr(out, "sim:0")) printf("\n    child said: %s", out);
}

/* Work that writes past the end of its allocation is caught at the free, naming it. */
static void test_overrun_dies(void) {
    char out[8192];
    int st = run_scenario("overrun", out, sizeof out);
    CU_ASSERT_NOT_EQUAL(st, 0);
    CU_ASSERT_PTR_NULL(strstr(out, "went unnoticed"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "wrote up to 196 bytes past the end of an allocation of 196 bytes"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "the allocation was made by:"));
    if (st == 0 || !strstr(out, "past the end")) printf("\n    child said: %s", out);
}

/* Fresh blocks hold NaNs (uninitialised device memory); alloc and tensors hand out zeros,
 * alloc_uninit and fsdp_tensor_create_uninit the 0xFF pattern even where the block held data
 * (a GPU would hand over the stale bytes), without a counted launch. */
static void test_fresh_blocks(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    void *raw = NULL;
    FSDP_TEST_OK(sim_block_alloc(ctx, 1, 3 * 4096, &raw)); // no zeroing: the allocator's block
    uint32_t bits[3 * 1024];
    FSDP_TEST_OK(sim()->copy(ctx, bits, FSDP_CPU, raw, SIM1, sizeof bits));
    bool nan = true;
    for (int i = 0; i < 3 * 1024; i++) nan = nan && bits[i] == 0xffffffffu;
    CU_ASSERT_TRUE(nan);
    sim_block_free(1, raw);
    FSDP_TEST_OK(sim()->alloc(ctx, 1, 3 * 4096, &raw)); // the same block, zeroed
    float host[3 * 1024];
    FSDP_TEST_OK(sim()->copy(ctx, host, FSDP_CPU, raw, SIM1, sizeof host));
    CU_ASSERT_TRUE(all_equal(host, 3 * 1024, 0.0f));
    sim()->free(1, raw);
    int64_t launches = fsdp_kernels_counts(SIM1).launches;
    FSDP_TEST_OK(sim()->alloc_uninit(ctx, 1, 3 * 4096, &raw)); // the same block, zeros in it
    CU_ASSERT_EQUAL(fsdp_kernels_counts(SIM1).launches, launches);
    FSDP_TEST_OK(sim()->copy(ctx, bits, FSDP_CPU, raw, SIM1, sizeof bits));
    nan = true;
    for (int i = 0; i < 3 * 1024; i++) nan = nan && bits[i] == 0xffffffffu;
    CU_ASSERT_TRUE(nan);
    sim()->free(1, raw);
    fsdp_tensor *t = NULL;
    FSDP_TEST_OK(fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_BF16, SIM1, 1, (int64_t[]){6144}, &t));
    fsdp_tensor *h = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, FSDP_CPU, 1, (int64_t[]){6144}, &h));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, h, t));
    nan = true;
    for (int i = 0; i < 6144; i++)
        nan = nan && isnan(fsdp_bf16_to_f32(((const fsdp_bf16 *)fsdp_tensor_data(h))[i]));
    CU_ASSERT_TRUE(nan);
    fsdp_tensor_free(h);
    fsdp_tensor_free(t);
    fsdp_sim_empty_cache(1);
    fsdp_device_memory s = fsdp_sim_memory_stats_get(1);
    CU_ASSERT_EQUAL(s.in_use, 0);
    CU_ASSERT_EQUAL(s.reserved, 0);
    CU_ASSERT_EQUAL(s.device_allocs, 1);
    CU_ASSERT_EQUAL(s.cache_hits, 3);
}

static void test_cache_and_cap(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_sim_empty_cache(0);
    fsdp_device_memory before = fsdp_sim_memory_stats_get(0);
    CU_ASSERT_EQUAL(before.capacity, (int64_t)CAP_MB << 20);
    void *a = NULL, *b = NULL, *c = NULL;
    size_t big = (size_t)40 << 20; // two do not fit under the cap
    FSDP_TEST_OK(sim()->alloc(ctx, 0, big, &a));
    FSDP_TEST_FAILS(sim()->alloc(ctx, 0, big, &b), FSDP_ERR_OUT_OF_MEMORY, "sim:0", "out of memory",
                    "FSDP_SIM_MEMORY");
    CU_ASSERT_PTR_NULL(b);
    sim()->free(0, a);
    FSDP_TEST_OK(sim()->alloc(ctx, 0, big, &c)); // the cached block comes back
    CU_ASSERT_PTR_EQUAL(c, a);
    fsdp_device_memory s = fsdp_sim_memory_stats_get(0);
    CU_ASSERT_EQUAL(s.device_allocs - before.device_allocs, 1);
    CU_ASSERT_EQUAL(s.cache_hits - before.cache_hits, 1);
    CU_ASSERT_EQUAL(s.in_use, before.in_use + (int64_t)big);
    // A smaller request does not take the big cached block (it would waste more than a quarter),
    // and with the cache full the device frees its cache before it gives up.
    sim()->free(0, c);
    FSDP_TEST_OK(sim()->alloc(ctx, 0, (size_t)20 << 20, &b));
    CU_ASSERT_NOT_EQUAL(b, c);
    sim()->free(0, b);
    fsdp_sim_empty_cache(0);
    CU_ASSERT_EQUAL(fsdp_sim_memory_stats_get(0).reserved, before.reserved);
}

/* The public allocator figures (fsdp_device_memory_stats and its two companions) on tensors:
 * in_use and reserved move by the rounded block, the peaks hold until reset, empty_cache gives
 * the cached blocks back; the CPU has no allocator to report on, and a missing device is named. */
static void test_memory_stats(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_device sim0 = {FSDP_DEVICE_SIM, 0};
    const int64_t block = (int64_t)4 << 20; // 3 MiB asked, rounded to a multiple of 2 MiB
    FSDP_TEST_OK(fsdp_device_empty_cache(ctx, sim0));
    FSDP_TEST_OK(fsdp_device_reset_peak_memory(ctx, sim0));
    fsdp_device_memory m0, m;
    FSDP_TEST_OK(fsdp_device_memory_stats(ctx, sim0, &m0));
    CU_ASSERT_EQUAL(m0.capacity, (int64_t)CAP_MB << 20);
    CU_ASSERT_EQUAL(m0.reserved, m0.in_use); // nothing cached
    CU_ASSERT_EQUAL(m0.peak_in_use, m0.in_use);
    CU_ASSERT_EQUAL(m0.peak_reserved, m0.reserved);

    fsdp_tensor *t = NULL;
    int64_t n = (3 << 20) / 4;
    FSDP_TEST_OK(fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_F32, sim0, 1, &n, &t));
    FSDP_TEST_OK(fsdp_device_memory_stats(ctx, sim0, &m));
    CU_ASSERT_EQUAL(m.in_use - m0.in_use, block);
    CU_ASSERT_EQUAL(m.reserved - m0.reserved, block);
    CU_ASSERT_EQUAL(m.device_allocs - m0.device_allocs, 1);
    CU_ASSERT_EQUAL(m.peak_in_use, m.in_use);
    fsdp_tensor_free(t);
    FSDP_TEST_OK(fsdp_device_memory_stats(ctx, sim0, &m));
    CU_ASSERT_EQUAL(m.in_use, m0.in_use);
    CU_ASSERT_EQUAL(m.reserved - m0.reserved, block); // cached, not given back
    CU_ASSERT_EQUAL(m.peak_in_use - m0.in_use, block);
    CU_ASSERT_EQUAL(m.peak_reserved - m0.reserved, block);

    t = NULL; // the same size again comes from the cache
    FSDP_TEST_OK(fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_F32, sim0, 1, &n, &t));
    fsdp_tensor_free(t);
    FSDP_TEST_OK(fsdp_device_memory_stats(ctx, sim0, &m));
    CU_ASSERT_EQUAL(m.device_allocs - m0.device_allocs, 1);
    CU_ASSERT_EQUAL(m.cache_hits - m0.cache_hits, 1);

    FSDP_TEST_OK(fsdp_device_reset_peak_memory(ctx, sim0));
    FSDP_TEST_OK(fsdp_device_memory_stats(ctx, sim0, &m));
    CU_ASSERT_EQUAL(m.peak_in_use, m0.in_use);
    CU_ASSERT_EQUAL(m.peak_reserved, m0.reserved + block);
    FSDP_TEST_OK(fsdp_device_empty_cache(ctx, sim0));
    FSDP_TEST_OK(fsdp_device_memory_stats(ctx, sim0, &m));
    CU_ASSERT_EQUAL(m.reserved, m0.reserved);
    CU_ASSERT_EQUAL(m.peak_reserved, m0.reserved + block); // a peak outlives the release

    FSDP_TEST_FAILS(fsdp_device_memory_stats(ctx, FSDP_CPU, &m), FSDP_ERR_UNSUPPORTED,
                    "fsdp_device_memory_stats", "cpu:0", "no caching allocator");
    FSDP_TEST_FAILS(fsdp_device_reset_peak_memory(ctx, FSDP_CPU), FSDP_ERR_UNSUPPORTED, "cpu:0");
    FSDP_TEST_FAILS(fsdp_device_empty_cache(ctx, FSDP_CPU), FSDP_ERR_UNSUPPORTED, "cpu:0");
    FSDP_TEST_FAILS(fsdp_device_memory_stats(ctx, (fsdp_device){FSDP_DEVICE_SIM, 99}, &m),
                    FSDP_ERR_DEVICE, "sim:99");
}

/* fsdp_device_get_properties: sim's name and memory and no peaks, the CPU's name alone, a
 * missing device named; and the GPU table behind a cuda device's peaks, by the names CUDA
 * gives the cards (the NVL parts and unknown cards get none). */
static void test_device_properties(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_device_properties p;
    memset(&p, 0x5a, sizeof p);
    FSDP_TEST_OK(fsdp_device_get_properties(ctx, (fsdp_device){FSDP_DEVICE_SIM, 1}, &p));
    CU_ASSERT_STRING_EQUAL(p.name, "sim");
    CU_ASSERT_EQUAL(p.total_memory, (int64_t)CAP_MB << 20);
    CU_ASSERT(p.major == 0 && p.minor == 0 && p.multiprocessors == 0);
    CU_ASSERT(p.peak_tflops_f32 == 0 && p.peak_tflops_tf32 == 0 && p.peak_tflops_bf16 == 0);
    memset(&p, 0x5a, sizeof p);
    FSDP_TEST_OK(fsdp_device_get_properties(ctx, FSDP_CPU, &p));
    CU_ASSERT_STRING_EQUAL(p.name, "cpu");
    CU_ASSERT(p.total_memory == 0 && p.major == 0 && p.peak_tflops_bf16 == 0);
    FSDP_TEST_FAILS(fsdp_device_get_properties(ctx, (fsdp_device){FSDP_DEVICE_SIM, 99}, &p),
                    FSDP_ERR_DEVICE, "sim:99");

    static const struct {
        const char *name;
        double f32, tf32, bf16;
    } cards[] = {
        {"NVIDIA H100 80GB HBM3", 66.9, 494.7, 989.0},
        {"NVIDIA H100 PCIe", 51.2, 378.0, 756.0},
        {"NVIDIA H100 NVL", 0, 0, 0},
        {"NVIDIA H200", 66.9, 494.7, 989.0},
        {"NVIDIA GH200 480GB", 66.9, 494.7, 989.0},
        {"NVIDIA H200 NVL", 0, 0, 0},
        {"NVIDIA A100-SXM4-80GB", 19.5, 156.0, 312.0},
        {"NVIDIA A100 80GB PCIe", 19.5, 156.0, 312.0},
        {"NVIDIA L40S", 0, 0, 0},
        {"", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cards / sizeof cards[0]; i++) {
        double f32 = -1, tf32 = -1, bf16 = -1;
        fsdp_gpu_peaks(cards[i].name, &f32, &tf32, &bf16);
        bool right = f32 == cards[i].f32 && tf32 == cards[i].tf32 && bf16 == cards[i].bf16;
        if (!right) printf("\n    '%s': peaks %g / %g / %g", cards[i].name, f32, tf32, bf16);
        CU_ASSERT_TRUE(right);
    }
}

/* A block freed on stream a with a's write still queued, then taken on stream b: b's zeroing
 * waits for a's write (deferred mode leaves a's work unrun until someone waits for it), so the
 * block reads zeros now and after a has drained. */
static void test_cross_stream_reuse(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_sim_mode_set(FSDP_SIM_DEFERRED);
    fsdp_sim_empty_cache(0);
    const int64_t n = 4096;
    fsdp_stream a, b;
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &a));
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &b));
    fsdp_stream was = fsdp_stream_set_current(a);
    float *x = dev_alloc(n);
    fsdp_kernels_for(SIM0)->fill(x, 7.0f, n);
    sim()->free(0, x); // a's fill is still queued
    fsdp_stream_set_current(b);
    float *y = dev_alloc(n);
    CU_ASSERT_PTR_EQUAL(y, x); // the cached block
    float host[4096];
    dev_get(host, y, n); // on b: its zeroing after a's fill
    CU_ASSERT_TRUE(all_equal(host, n, 0.0f));
    fsdp_stream_set_current(was);
    fsdp_stream_destroy(a);
    fsdp_stream_set_current(b);
    dev_get(host, y, n);
    CU_ASSERT_TRUE(all_equal(host, n, 0.0f));
    sim()->free(0, y);
    fsdp_stream_set_current(was);
    fsdp_stream_destroy(b);
}

/* ---- streams and events ---- */

/* x <- fill on stream a; b waits for a's event, copies x to y; the host reads y. */
static bool ordered_copy(fsdp_sim_mode mode, bool wait) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_sim_mode_set(mode);
    const int64_t n = 1000;
    float *x = dev_alloc(n), *y = dev_alloc(n);
    FSDP_TEST_OK(fsdp_device_synchronize(ctx, SIM0));
    fsdp_stream a, b;
    fsdp_event done;
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &a));
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &b));
    FSDP_TEST_OK(fsdp_event_create(ctx, SIM0, &done));
    fsdp_stream was = fsdp_stream_set_current(a);
    fsdp_kernels_for(SIM0)->fill(x, 3.0f, n);
    FSDP_TEST_OK(fsdp_event_record(ctx, done, a));
    fsdp_stream_set_current(b);
    if (wait) FSDP_TEST_OK(fsdp_stream_wait(ctx, b, done));
    fsdp_kernels_for(SIM0)->copy(y, x, n);
    float host[1000];
    dev_get(host, y, n); // a copy to the host waits for b
    fsdp_stream_set_current(was);
    bool right = all_equal(host, n, 3.0f);
    if (wait) CU_ASSERT_TRUE(fsdp_event_query(done)); // b waited for it
    FSDP_TEST_OK(fsdp_event_synchronize(ctx, done));
    CU_ASSERT_TRUE(fsdp_event_query(done));
    fsdp_event_destroy(done);
    fsdp_stream_destroy(a);
    fsdp_stream_destroy(b);
    sim()->free(0, x);
    sim()->free(0, y);
    fsdp_sim_mode_set(FSDP_SIM_DEFERRED);
    return right;
}

static void test_streams_order(void) {
    CU_ASSERT_TRUE(ordered_copy(FSDP_SIM_DEFERRED, true));
    CU_ASSERT_TRUE(ordered_copy(FSDP_SIM_EAGER, true));
    for (int i = 0; i < 20; i++) CU_ASSERT_TRUE(ordered_copy(FSDP_SIM_JITTER, true));
}

/* The negative control: without the wait, deferred mode reads the stale zeros every time. In
 * the TSan build the same run must be reported as a race (it runs in a child, whose report and
 * exit status are read here). */
static void test_missing_wait_is_caught(void) {
#ifdef UNDER_TSAN
    expect_race("missing_wait");
#else
    for (int i = 0; i < 5; i++) CU_ASSERT_FALSE(ordered_copy(FSDP_SIM_DEFERRED, false));
#endif
}

/* Events: a never-recorded event is complete; a query asks for the work (deferred mode runs
 * it) without waiting; a stream waits only for the latest record. */
static void test_events(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_event e;
    FSDP_TEST_OK(fsdp_event_create(ctx, SIM0, &e));
    CU_ASSERT_TRUE(fsdp_event_query(e));
    FSDP_TEST_OK(fsdp_event_synchronize(ctx, e));
    float *x = dev_alloc(64);
    fsdp_kernels_for(SIM0)->fill(x, 2.0f, 64);
    FSDP_TEST_OK(fsdp_event_record(ctx, e, fsdp_stream_current(SIM0)));
    bool done = false;
    for (int i = 0; i < 10000 && !done; i++) {
        done = fsdp_event_query(e);
        if (!done) fsdp_test_sleep_ms(1);
    }
    CU_ASSERT_TRUE(done);
    // Streams and events of different devices do not meet.
    fsdp_stream other;
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM1, &other));
    FSDP_TEST_FAILS(fsdp_stream_wait(ctx, other, e), FSDP_ERR_DEVICE, "sim:0", "sim:1");
    fsdp_stream_destroy(other);
    fsdp_event_destroy(e);
    sim()->free(0, x);
    // The CPU's streams and events are no-ops.
    fsdp_event c;
    FSDP_TEST_OK(fsdp_event_create(ctx, FSDP_CPU, &c));
    FSDP_TEST_OK(fsdp_event_record(ctx, c, fsdp_stream_current(FSDP_CPU)));
    CU_ASSERT_TRUE(fsdp_event_query(c));
    fsdp_event_destroy(c);
}

/* An event recorded on stream a (after a fill of x), awaited by stream c (which then copies x
 * to y), then recorded again on stream b, which runs first: c's wait is for the record on a,
 * as a CUDA stream's wait is for the record made before it, so y holds the fill. (A sim that
 * took the later record's completion for the earlier one let c read x before a wrote it: the
 * local backend's events are recorded again on another stream when collectives alternate
 * between the compute and the post-backward streams.) */
static void test_event_rerecorded(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    const int64_t n = 256;
    float *x = dev_alloc(n), *y = dev_alloc(n);
    FSDP_TEST_OK(fsdp_device_synchronize(ctx, SIM0));
    fsdp_stream a, b, c;
    fsdp_event e;
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &a));
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &b));
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &c));
    FSDP_TEST_OK(fsdp_event_create(ctx, SIM0, &e));
    fsdp_stream was = fsdp_stream_set_current(a);
    fsdp_kernels_for(SIM0)->fill(x, 5.0f, n);
    FSDP_TEST_OK(fsdp_event_record(ctx, e, a));
    fsdp_stream_set_current(c);
    FSDP_TEST_OK(fsdp_stream_wait(ctx, c, e));
    fsdp_kernels_for(SIM0)->copy(y, x, n);
    FSDP_TEST_OK(fsdp_event_record(ctx, e, b));
    FSDP_TEST_OK(fsdp_stream_synchronize(ctx, b)); // b's record of e is passed, a's not yet
    float host[256];
    dev_get(host, y, n); // waits for c
    CU_ASSERT_TRUE(all_equal(host, n, 5.0f));
    fsdp_stream_set_current(was);
    fsdp_event_destroy(e);
    fsdp_stream_destroy(a);
    fsdp_stream_destroy(b);
    fsdp_stream_destroy(c);
    sim()->free(0, x);
    sim()->free(0, y);
}

/* Pinned memory is read when the copy runs; pageable memory when the copy is made. */
static void test_pinned_reuse(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_sim_mode_set(FSDP_SIM_DEFERRED);
    const int64_t n = 512;
    float *pinned = NULL;
    FSDP_TEST_OK(fsdp_host_alloc(ctx, FSDP_DEVICE_SIM, (size_t)n * 4, (void **)&pinned));
    CU_ASSERT_TRUE(all_equal(pinned, n, 0.0f));
    float pageable[512], back[512];
    float *x = dev_alloc(n), *y = dev_alloc(n);
#ifdef UNDER_TSAN
    expect_race("pinned_reuse");
#else
    for (int64_t i = 0; i < n; i++) pinned[i] = 1.0f;
    dev_put(x, pinned, n);
    for (int64_t i = 0; i < n; i++) pinned[i] = 2.0f; // reused before the copy ran
    dev_get(back, x, n);
    CU_ASSERT_TRUE(all_equal(back, n, 2.0f)); // the control: the copy read the buffer late
#endif
    for (int64_t i = 0; i < n; i++) pageable[i] = 1.0f;
    dev_put(y, pageable, n);
    for (int64_t i = 0; i < n; i++) pageable[i] = 2.0f; // pageable: taken at the call
    dev_get(back, y, n);
    CU_ASSERT_TRUE(all_equal(back, n, 1.0f));
    // The right way: wait for the copy before the buffer changes.
    for (int64_t i = 0; i < n; i++) pinned[i] = 4.0f;
    dev_put(x, pinned, n);
    FSDP_TEST_OK(fsdp_device_synchronize(ctx, SIM0));
    for (int64_t i = 0; i < n; i++) pinned[i] = 5.0f;
    dev_get(back, x, n);
    CU_ASSERT_TRUE(all_equal(back, n, 4.0f));
    fsdp_host_free(FSDP_DEVICE_SIM, pinned);
    sim()->free(0, x);
    sim()->free(0, y);
}

/* Another thread's default stream: its work is finished when the thread has exited. */
static void *thread_fill(void *arg) {
    fsdp_kernels_for(SIM0)->fill(arg, 9.0f, 100);
    return NULL;
}

static void test_thread_streams(void) {
    float *x = dev_alloc(100);
    FSDP_TEST_OK(fsdp_device_synchronize(fsdp_test_ctx(), SIM0));
    pthread_t t;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, thread_fill, x), 0);
    pthread_join(t, NULL);
    float host[100];
    dev_get(host, x, 100);
    CU_ASSERT_TRUE(all_equal(host, 100, 9.0f));
    sim()->free(0, x);
}

/* ---- the fused GEMM entries on sim ---- */

/* gemm_bias_act (GELU, pre saved), gemm_bf16_bias_act (ReLU) and gemm_bgrad queued on a second
 * stream that waits for the first stream's uploads, in deferred mode (nothing runs before a
 * wait asks for it): the host reads the CPU table's bits. */
static void test_fused_gemm(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_sim_mode_set(FSDP_SIM_DEFERRED);
    enum { R = 9, C = 21, OC = 16 };
    static float x[R * C], w[OC * C], b[OC], dy[R * OC], gw[OC * C], gb[OC];
    static float out[R * OC], pre[R * OC], out16[R * OC], got[R * OC * 3];
    static fsdp_bf16 x16[R * C], w16[OC * C];
    for (int i = 0; i < R * C; i++) x[i] = (float)((i * 7) % 23 - 11) / 8.0f;
    for (int i = 0; i < OC * C; i++) w[i] = (float)((i * 5) % 19 - 9) / 16.0f;
    for (int i = 0; i < OC; i++) b[i] = (float)(i - 8) / 4.0f, gb[i] = 0.5f;
    for (int i = 0; i < R * OC; i++) dy[i] = (float)((i * 3) % 13 - 6) / 8.0f;
    for (int i = 0; i < OC * C; i++) gw[i] = 0.25f;
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu(), *k = fsdp_kernels_for(SIM0);
    cpu->f32_to_bf16(x16, x, R * C), cpu->f32_to_bf16(w16, w, OC * C);
    float *dx = dev_alloc(R * C), *dw = dev_alloc(OC * C), *db = dev_alloc(OC);
    float *ddy = dev_alloc(R * OC), *dgw = dev_alloc(OC * C), *dgb = dev_alloc(OC);
    float *dout = dev_alloc(R * OC), *dpre = dev_alloc(R * OC), *dout16 = dev_alloc(R * OC);
    fsdp_bf16 *dx16 = (fsdp_bf16 *)dev_alloc(R * C), *dw16 = (fsdp_bf16 *)dev_alloc(OC * C);
    FSDP_TEST_OK(fsdp_device_synchronize(ctx, SIM0));
    fsdp_stream a, s;
    fsdp_event up;
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &a));
    FSDP_TEST_OK(fsdp_stream_create(ctx, SIM0, &s));
    FSDP_TEST_OK(fsdp_event_create(ctx, SIM0, &up));
    fsdp_stream was = fsdp_stream_set_current(a);
    dev_put(dx, x, R * C), dev_put(dw, w, OC * C), dev_put(db, b, OC), dev_put(ddy, dy, R * OC);
    dev_put(dgw, gw, OC * C), dev_put(dgb, gb, OC);
    FSDP_TEST_OK(sim()->copy(ctx, dx16, SIM0, x16, FSDP_CPU, sizeof x16));
    FSDP_TEST_OK(sim()->copy(ctx, dw16, SIM0, w16, FSDP_CPU, sizeof w16));
    FSDP_TEST_OK(fsdp_event_record(ctx, up, a));
    fsdp_stream_set_current(s);
    FSDP_TEST_OK(fsdp_stream_wait(ctx, s, up));
    k->gemm_bias_act(dout, dpre, dx, dw, db, R, C, OC, FSDP_GEMM_ACT_GELU);
    k->gemm_bf16_bias_act(dout16, NULL, dx16, dw16, db, R, C, OC, FSDP_GEMM_ACT_RELU);
    k->gemm_bgrad(dgw, dgb, ddy, dx, R, C, OC);
    cpu->gemm_bias_act(out, pre, x, w, b, R, C, OC, FSDP_GEMM_ACT_GELU);
    cpu->gemm_bf16_bias_act(out16, NULL, x16, w16, b, R, C, OC, FSDP_GEMM_ACT_RELU);
    cpu->gemm_bgrad(gw, gb, dy, x, R, C, OC);
    dev_get(got, dout, R * OC), dev_get(got + R * OC, dpre, R * OC); // on s: waits for it
    dev_get(got + 2 * R * OC, dout16, R * OC);
    CU_ASSERT_EQUAL(memcmp(got, out, sizeof out), 0);
    CU_ASSERT_EQUAL(memcmp(got + R * OC, pre, sizeof pre), 0);
    CU_ASSERT_EQUAL(memcmp(got + 2 * R * OC, out16, sizeof out16), 0);
    static float gw_got[OC * C], gb_got[OC];
    dev_get(gw_got, dgw, OC * C), dev_get(gb_got, dgb, OC);
    CU_ASSERT_EQUAL(memcmp(gw_got, gw, sizeof gw), 0);
    CU_ASSERT_EQUAL(memcmp(gb_got, gb, sizeof gb), 0);
    CU_ASSERT_TRUE(out[0] != 0.0f && gb[0] != 0.5f); // the entries did compute something
    fsdp_stream_set_current(was);
    FSDP_TEST_OK(fsdp_device_synchronize(ctx, SIM0));
    fsdp_event_destroy(up);
    fsdp_stream_destroy(a);
    fsdp_stream_destroy(s);
    float *all[] = {dx, dw, db, ddy, dgw, dgb, dout, dpre, dout16, (float *)dx16, (float *)dw16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) sim()->free(0, all[i]);
}

/* A rank's context: its device, its compute stream and its own communication stream. */
static void test_ctx_streams(void) {
    fsdp_ctx *ctx = NULL;
    FSDP_TEST_OK(fsdp_ctx_create(NULL, &ctx));
    CU_ASSERT_EQUAL(fsdp_ctx_device(ctx).type, FSDP_DEVICE_CPU);
    CU_ASSERT_EQUAL(fsdp_ctx_set_device(ctx, (fsdp_device){FSDP_DEVICE_SIM, 5}), FSDP_ERR_DEVICE);
    CU_ASSERT_EQUAL(fsdp_ctx_device(ctx).type, FSDP_DEVICE_CPU);
    FSDP_TEST_OK(fsdp_ctx_set_device(ctx, SIM1));
    CU_ASSERT_EQUAL(fsdp_ctx_device(ctx).index, 1);
    fsdp_ctx_free(ctx);
}

int main(int argc, char **argv) {
    self_exe = argv[0];
    setenv("FSDP_SIM_MEMORY", "64M", 1); // before the first use reads it
    unsetenv("FSDP_SIM_DEVICES");
    if (argc == 3 && !strcmp(argv[1], "--scenario")) return scenario(argv[2]);
    static const fsdp_test_case cases[] = {
        {"record", test_record},
        {"host_read_dies", test_host_read_dies},
        {"overrun_dies", test_overrun_dies},
        {"fresh_blocks", test_fresh_blocks},
        {"cache_and_cap", test_cache_and_cap},
        {"memory_stats", test_memory_stats},
        {"device_properties", test_device_properties},
        {"cross_stream_reuse", test_cross_stream_reuse},
        {"streams_order", test_streams_order},
        {"missing_wait_is_caught", test_missing_wait_is_caught},
        {"events", test_events},
        {"event_rerecorded", test_event_rerecorded},
        {"pinned_reuse", test_pinned_reuse},
        {"thread_streams", test_thread_streams},
        {"ctx_streams", test_ctx_streams},
        {"fused_gemm", test_fused_gemm},
    };
    return fsdp_test_run(argc, argv, "sim", cases, sizeof cases / sizeof cases[0]);
}

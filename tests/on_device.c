/* on_device.c: the device of the device-parametrised suites and their comparisons with the
 * CPU (on_device.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/local_impl.h" // defines: fsdp_local_test_skip_input_wait
#include "harness.h"         // defines: fsdp_test_close, fsdp_test_run_world
#include "on_device.h"
#ifdef FSDP_HAVE_CUDA
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_thread_set_attention
#endif

static bool chosen;
static fsdp_device device;

static fsdp_device choose(void) {
    const char *want = getenv("FSDP_TEST_DEVICE");
    const char *require = getenv("FSDP_TEST_REQUIRE_DEVICE");
    int gpus = fsdp_device_count(FSDP_DEVICE_CUDA);
    if (want && *want && strcmp(want, "cuda") && strcmp(want, "sim")) {
        fprintf(stderr, "FSDP_TEST_DEVICE=%s: use cuda or sim\n", want);
        exit(1);
    }
    if (require && *require && strcmp(require, "cuda")) {
        fprintf(stderr, "FSDP_TEST_REQUIRE_DEVICE=%s: the only device it can require is cuda\n",
                require);
        exit(1);
    }
    bool need_cuda = (require && *require) || (want && !strcmp(want, "cuda"));
    if (need_cuda && gpus == 0) {
        fprintf(stderr,
                "%s=cuda, but this build or machine has no usable CUDA device: failing instead "
                "of running on the simulated device\n",
                require && *require ? "FSDP_TEST_REQUIRE_DEVICE" : "FSDP_TEST_DEVICE");
        exit(1);
    }
    if (gpus > 0 && !(want && !strcmp(want, "sim"))) {
        printf("device: cuda:0\n");
        return (fsdp_device){FSDP_DEVICE_CUDA, 0};
    }
    const char *mode = getenv("FSDP_SIM_MODE");
    printf("device: sim:0 (streams %s; %s)\n", mode && *mode ? mode : "deferred",
           gpus ? "chosen by FSDP_TEST_DEVICE" : "no CUDA device");
    return (fsdp_device){FSDP_DEVICE_SIM, 0};
}

fsdp_device fsdp_test_device(void) {
    if (!chosen) {
        device = choose();
        chosen = true;
    }
    return device;
}

bool fsdp_test_device_is_cuda(void) {
    return fsdp_test_device().type == FSDP_DEVICE_CUDA;
}

double fsdp_test_device_tol(double tol) {
    return fsdp_test_device_is_cuda() ? tol : 0.0;
}

bool fsdp_test_device_close(const char *name, const float *got, const float *want, int64_t n,
                            double rtol, double atol) {
    if (fsdp_test_device_is_cuda()) return fsdp_test_close(name, got, want, n, rtol, atol);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof *got)) {
            if (first < 0) first = i;
            bad++;
        }
    printf("\n    %-40s %lld of %lld elements differ bitwise", name, (long long)bad, (long long)n);
    if (bad)
        printf("\n    %s: first at %lld: got %.9g want %.9g", name, (long long)first, got[first],
               want[first]);
    return bad == 0;
}

void fsdp_test_device_pin_f32_attention(bool pin) {
#ifdef FSDP_HAVE_CUDA
    fsdp_cuda_thread_set_attention(pin ? FSDP_CUDA_ATTENTION_FLASH : FSDP_CUDA_ATTENTION_DEFAULT);
#else
    (void)pin;
#endif
}

bool fsdp_test_stale_without_input_wait(int n, int timeout_ms, fsdp_rank_fn body, bool *differs,
                                        int tries) {
    bool any = false;
    int runs = 0;
    fsdp_status st = FSDP_OK;
    fsdp_local_test_skip_input_wait(true);
    for (; st == FSDP_OK && !any && runs < tries; runs++) {
        memset(differs, 0, (size_t)n * sizeof *differs);
        st = fsdp_test_run_world(n, timeout_ms, body, differs);
        for (int r = 0; r < n; r++) any = any || differs[r];
    }
    fsdp_local_test_skip_input_wait(false);
    FSDP_TEST_OK(st);
    printf("\n    without the wait, %d run(s): %s", runs,
           any ? "stale in the last" : "never stale");
    return any;
}

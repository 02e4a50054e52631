/* on_device.h: the device the device-parametrised suites run on: cuda:0 where a GPU is
 * usable, sim:0 (the simulated GPU, deferred streams) otherwise, so CI runs the device path on
 * every commit. FSDP_TEST_DEVICE=cuda|sim chooses; FSDP_TEST_REQUIRE_DEVICE=cuda turns the
 * fallback to sim into a failure (for machines that have a GPU: scripts/gpu-session.sh). Results
 * are compared with the CPU's bit for bit on sim and within tolerances on CUDA. */
#ifndef FSDP_TESTS_ON_DEVICE_H
#define FSDP_TESTS_ON_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h" // defines: fsdp_rank_fn
#include "fsdp/tensor.h"

/* The device of this run, chosen at the first call (which prints it and why); exits the
 * process with status 1 when the environment asks for a device this machine cannot give. */
fsdp_device fsdp_test_device(void);

/* Whether the run's device is a real GPU (CUDA), where the CUDA-only cases apply. */
bool fsdp_test_device_is_cuda(void);

/* Pins this thread's CUDA attention to the tiled f32 kernels (pin) or hands it back to the
 * default (auto: cuDNN's bf16 attention for the bf16 policy's entries). A suite comparing a bf16
 * policy run on CUDA element by element with the CPU's (whose attention is f32) pins it: the
 * CPU emulates the policy's roundings, not cuDNN's. Nothing in a build without CUDA. */
void fsdp_test_device_pin_f32_attention(bool pin);

/* The tolerance of a result of the run's device against the CPU table's: `tol` on CUDA (GPU
 * arithmetic rounds and sums in other orders), 0 on sim, which runs the CPU's own kernels. */
double fsdp_test_device_tol(double tol);

/* n floats the run's device computed (copied back to the host) against the CPU's: on sim bit
 * for bit, printing how many elements differ and the first; on CUDA fsdp_test_close's
 * |got - want| <= atol + rtol |want|. */
bool fsdp_test_device_close(const char *name, const float *got, const float *want, int64_t n,
                            double rtol, double atol);

/* A device suite's negative control: body on a world of n ranks (timeout_ms per collective wait)
 * with the local backend's wait for the peers' inputs dropped (fsdp_local_test_skip_input_wait),
 * body setting differs[rank] when its rank's results are not the CPU's. On sim's deferred streams
 * the dropped wait leaves the read to race a peer's writes, and a peer's own waits can drive its
 * stream past the input before the read: one run may miss the race though the wait matters. So
 * the run is made up to `tries` times, until some rank differs (a wait that did not matter would
 * never differ). Prints the runs made; returns whether some rank differed. */
bool fsdp_test_stale_without_input_wait(int n, int timeout_ms, fsdp_rank_fn body, bool *differs,
                                        int tries);

#endif

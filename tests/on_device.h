/* on_device.h: the device the device-parametrised suites run on: cuda:0 where a GPU is
 * usable, sim:0 (the simulated GPU, deferred streams) otherwise, so CI runs the device path on
 * every commit. FSDP_TEST_DEVICE=cuda|sim chooses; FSDP_TEST_REQUIRE_DEVICE=cuda turns the
 * fallback to sim into a failure (for machines that have a GPU: scripts/gpu-session.sh). */
#ifndef FSDP_TESTS_ON_DEVICE_H
#define FSDP_TESTS_ON_DEVICE_H

#include <stdbool.h>

#include "fsdp/tensor.h"

/* The device of this run, chosen at the first call (which prints it and why); exits the
 * process with status 1 when the environment asks for a device this machine cannot give. */
fsdp_device fsdp_test_device(void);

/* Whether the run's device is a real GPU (CUDA), where the CUDA-only cases apply. */
bool fsdp_test_device_is_cuda(void);

#endif

/* For tests that need a usable GPU: where none is usable, a skip on a host without an NVIDIA driver but a
 * failure on one with a driver (a CUDA build whose GPU tests all skip there, because the driver is too old
 * for the build or the device is hidden, must not pass). A build without CUDA skips everywhere: it has no
 * GPU code to test, unless FSDP_GPU_MODULE names a module (the CUDA host emulator's, which needs no CUDA build).
 * FSDP_TEST_GPU_HOST=1 makes this host count as a GPU host. Include after
 * <criterion/criterion.h>; the test links common/. */
#ifndef FSDP_TESTS_UTIL_TU_GPU_H
#define FSDP_TESTS_UTIL_TU_GPU_H

#include <stdio.h>
#include <stdlib.h>

#include "common/gpu_module.h"

#ifdef FSDP_HAVE_CUDA
#define TU_GPU_BUILD 1
#else
#define TU_GPU_BUILD 0
#endif

/* Never returns: cr_skip_test or a failure, with why (printf-style) in the message. */
#define TU_GPU_UNAVAILABLE(...)                                                                                 \
    do {                                                                                                        \
        char tu_gpu_why_[1024];                                                                                 \
        snprintf(tu_gpu_why_, sizeof tu_gpu_why_, __VA_ARGS__);                                                 \
        if ((TU_GPU_BUILD || getenv("FSDP_GPU_MODULE")) && gpu_module_driver_present())                         \
            cr_assert_fail("an NVIDIA driver is present but the GPU test cannot run (a skip here would hide it): %s", \
                     tu_gpu_why_);                                                                              \
        cr_skip_test("%s", tu_gpu_why_);                                                                        \
    } while (0)

#endif

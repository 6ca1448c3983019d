/* The GPU module: the CUDA kernels and the NCCL backend are built into libfsdp_gpu.so and loaded only when
 * a run asks for a GPU. Linking CUDA, cuBLAS(Lt) and NCCL into every program cost a CPU run about 150 MiB of
 * resident memory (their relocations and initialisers) and part of its start-up, for code it never calls. */
#ifndef FSDP_COMMON_GPU_MODULE_H
#define FSDP_COMMON_GPU_MODULE_H

#include <stdbool.h>
#include <stddef.h>

/* Whether an NVIDIA driver is present on this host (its /proc or /dev entries), a check that loads nothing:
 * device = auto uses it to stay on the CPU without loading the module on a host without GPUs, and the GPU
 * tests fail instead of skipping where it answers yes. FSDP_TEST_GPU_HOST=1 makes it answer yes. */
bool gpu_module_driver_present(void);

/* The number of CUDA devices this process can see (cudaGetDeviceCount through the module, which it loads;
 * 0 without a driver, without the module, or when the driver cannot run this build: then *why, when not
 * NULL, says which in words). FSDP_TEST_GPU_COUNT replaces the driver's answer. */
int gpu_module_device_count(char *why, size_t cap);

/* The address of symbol name in the module, loading it on first use (thread-safe). NULL with error_set
 * saying why: a build without CUDA, or the paths tried and the loader's message. FSDP_GPU_MODULE=PATH
 * names the module file explicitly. */
void *gpu_module_symbol(const char *name);

/* NULL for a module that drives real GPUs; for the CUDA host emulator (gpu/emu/, a test module that runs the CUDA
 * backend on the CPU) a phrase saying so, which the run's log and summary carry. Loads the module. */
const char *gpu_module_emulator(void);

/* The path the module was (or would be) loaded from, for messages; "" before the first load attempt. */
const char *gpu_module_path(void);

#endif

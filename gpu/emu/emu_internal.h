/* Private to the CUDA host emulator's runtime files (gpu/emu/emu_*.c): what the stream, memory and API files
 * share beyond emu.h. */
#ifndef FSDP_GPU_EMU_EMU_INTERNAL_H
#define FSDP_GPU_EMU_EMU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

/* 1 in a build with AddressSanitizer (GCC says so with __SANITIZE_ADDRESS__, clang with __has_feature): fiber
 * switches are announced to it and device memory's slack is poisoned. */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifndef EMU_ASAN
#define EMU_ASAN 0
#endif

/* The op a stream worker runs now (its 'what'), NULL on other threads: the fault handler names it. */
extern __thread const char *emu_current_op;
/* The sequence number of the last op queued on the stream so far (0: none). */
uint64_t emu_stream_last(cudaStream_t stream);
/* Waits until the stream has run its op seq: cudaSuccess, the sticky error, or cudaErrorLaunchTimeout after the
 * emulator's hang bound. */
cudaError_t emu_stream_wait(cudaStream_t stream, uint64_t seq);
/* Installs the fault handler that names device memory touched by host code (emu_mem.c), once. */
void emu_mem_init(void);

#endif

/* The CUDA host emulator's internal interface (gpu/emu/): what its parts (the runtime API, the cuBLAS and NCCL
 * stand-ins, the kernel launcher) share. Test infrastructure, for correctness, not speed: it runs the
 * project's own kernels/cuda sources on the CPU so the CUDA backend is tested on machines without a GPU.
 *
 * Device memory lives in two views of one reservation: the host view, whose addresses cudaMalloc hands out and
 * which is never readable (PROT_NONE: host code that dereferences a device pointer crashes at once), and the
 * device view at a fixed offset, which only device work uses (kernels, copies, memsets, GEMMs, collectives),
 * each translating the host-view address it was given with emu_dev. Every stream is an ordered queue run by
 * its own worker thread; device work is an op queued on one (emu_enqueue). C and C++. */
#ifndef FSDP_GPU_EMU_EMU_H
#define FSDP_GPU_EMU_EMU_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One op of a stream: run(arg) on the stream's worker, after every op queued before it on that stream has
 * finished; then release(arg) (may be NULL). release is called in every case, also when the op cannot be queued
 * (emu_enqueue then returns the error, and the caller must not touch arg again). An op that fails calls emu_fail
 * and returns. */
typedef void (*emu_op_fn)(void *arg);
cudaError_t emu_enqueue(cudaStream_t stream, const char *what, emu_op_fn run, void *arg, emu_op_fn release);

/* The device view of p: p + the views' offset when p lies in the host view of device memory (live or not),
 * p itself otherwise (pinned and pageable host memory are the same address on both sides). For device work
 * only: host code never holds a device-view address. */
void *emu_dev(const void *p);
/* True when p lies in the device memory reservation (any allocation, live or freed). */
bool emu_is_device(const void *p);
/* 0 when [p, p + bytes) lies inside one live device allocation; else -1 (what says which operand, for the
 * message emu_fail writes: "<op>: <what> [p, p+bytes) is not inside one live device allocation (...)"). */
int emu_check_device_range(const char *op, const char *what, const void *p, size_t bytes);
/* Device memory for the stand-ins (ncclMemAlloc): as cudaMalloc. */
cudaError_t emu_device_alloc(void **p, size_t bytes);
cudaError_t emu_device_free(void *p);
/* True when p lies inside memory from cudaMallocHost (pinned). */
bool emu_is_pinned(const void *p);

/* A device-side failure (a bad copy range, a collective whose peer died, a kernel that faulted): logged to
 * stderr as "fsdpc CUDA emulator: <message>", and made the sticky error of the context, which every later
 * synchronising call returns (as a real device's sticky error: cudaErrorIllegalAddress, cudaErrorLaunchFailure,
 * ...). Callable from any thread. */
void emu_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The sticky error, cudaSuccess while none. */
cudaError_t emu_sticky_error(void);

/* The emulator's settings, read once from the environment:
 *   FSDP_GPU_EMU_DELAY_US  a random delay of up to this many microseconds before each op of every stream
 *                          (0, the default: none), which makes a missing event wait or stream sync a race
 *                          that loses often;
 *   FSDP_GPU_EMU_SEED      the seed of those delays and of the block scheduler's order (default: from the
 *                          pid and the clock). */
unsigned emu_delay_us(void);
/* Sleeps a random time below emu_delay_us() (the op workers call it before each op; the NCCL stand-in may
 * call it between the steps of a collective). */
void emu_random_delay(void);

#ifdef __cplusplus
}
#endif

#endif

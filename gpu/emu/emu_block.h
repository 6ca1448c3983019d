/* The emulator's block scheduler (emu_block.c): one CUDA thread block run on the calling OS thread, every CUDA
 * thread a fiber with its own stack, switched only at the block's barriers (__syncthreads) and at the warp's
 * exchanges (shuffles, votes, __syncwarp), so a barrier is a real barrier and lanes exchange in lockstep. C and
 * C++: the kernel environment (emu_kernel.h) calls the exchange functions from device code. */
#ifndef FSDP_GPU_EMU_EMU_BLOCK_H
#define FSDP_GPU_EMU_EMU_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One block of a launch: body(ctx) runs once per thread, with the thread's index set (emu_thread_index). */
struct emu_block_launch {
    const char *kernel;   /* the kernel's name, for messages */
    unsigned block[3];    /* blockDim */
    unsigned grid[3];     /* gridDim */
    unsigned index[3];    /* blockIdx */
    size_t dynamic_smem;  /* bytes of dynamic shared memory */
    void (*body)(void *ctx);
    void *ctx;
};

/* Runs the block to completion: 0, or -1 after emu_fail when it deadlocked (a barrier some live thread never
 * reaches while another waits) or has more than 1024 threads. */
int emu_block_run(const struct emu_block_launch *b);

/* The running CUDA thread's coordinates, valid inside body (kernel code reads them as threadIdx and friends,
 * emu_kernel.h). */
extern __thread unsigned emu_tid[3], emu_bid[3], emu_bdim[3], emu_gdim[3];

/* __syncthreads: waits until every live thread of the block has arrived. */
void emu_syncthreads(void);
/* The warp exchange under every shuffle and vote: stores this lane's value, waits until every lane of mask
 * (that is still alive) has stored its own, and returns the warp's 32 values of this round (lanes outside the
 * round hold a poison pattern); *arrived gets the lanes that took part and *lane this thread's lane (either may be
 * NULL). */
const uint64_t *emu_warp_exchange(unsigned mask, uint64_t value, unsigned *arrived, unsigned *lane);
/* The lane of the running thread in its warp (0-31). */
unsigned emu_lane(void);
/* The block's dynamic shared memory (filled with 0xff bytes, a NaN pattern, when the block starts). */
void *emu_dynamic_smem(void);

#ifdef __cplusplus
}
#endif

#endif

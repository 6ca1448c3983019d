/* The block scheduler of the CUDA host emulator (emu_block.h): every CUDA thread of a block is a fiber on the
 * calling OS thread. A fiber runs until it reaches a barrier (__syncthreads), a warp exchange (shuffle, vote,
 * __syncwarp) or its end; the scheduler then runs the next ready fiber. So a thread that reads shared memory
 * another thread has not written yet (a missing __syncthreads) reads the old or poisoned bytes, as a GPU can,
 * but every time, not once in a while.
 *
 * Fibers switch with a few instructions of our own on x86-64 (glibc's swapcontext makes a system call per
 * switch, and a training step switches millions of times); other machines use ucontext. Under AddressSanitizer
 * every switch is announced (__sanitizer_start/finish_switch_fiber), so ASan follows the stacks. */
#include "gpu/emu/emu_block.h"

#include "gpu/emu/emu.h"
#include "gpu/emu/emu_internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
/* ASan's frames are several times larger, and its fake stacks live beside them */
#define FIBER_STACK ((size_t)512 << 10)
#else
#define FIBER_STACK ((size_t)64 << 10)
#endif
#define MAX_THREADS 1024
#define SMEM_BYTES ((size_t)232448) /* the most dynamic shared memory a block may ask for (H100's opt-in) */

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

enum fiber_state { F_READY, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };

struct fiber {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
    char *stack; /* FIBER_STACK bytes above a guard page */
    enum fiber_state state;
    unsigned linear;
    unsigned tid[3];     /* threadIdx, worked out once per block */
    unsigned warp_round; /* the exchange round this lane waits in */
};

struct warp {
    uint32_t live;      /* lanes that exist and have not finished */
    uint32_t expect;    /* the lanes the current round waits for (its mask, live ones) */
    uint32_t arrived;   /* lanes of the current round that stored their value */
    unsigned round;     /* rounds completed */
    uint64_t slots[2][32]; /* values of rounds of each parity: a lane may start round r+1 while others read r */
    uint32_t took[2];   /* the lanes that took part in the round of each parity */
};

/* One OS thread's scheduler (each stream's worker runs its blocks one at a time). */
struct sched {
    struct fiber fibers[MAX_THREADS];
    unsigned nstacks;     /* stacks mapped so far (reused by later blocks) */
    void *sched_sp;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    const struct emu_block_launch *b;
    unsigned n, live, arrived;
    struct warp warps[MAX_THREADS / 32];
    struct fiber *cur;
    /* the fibers ready to run, in the order they became ready: a ring of n entries (a fiber is queued only
     * when it leaves a wait, so it is never in it twice) */
    unsigned ready[MAX_THREADS];
    unsigned ready_head, ready_count;
    char *smem;
#if EMU_ASAN
    void *sched_fake;      /* the scheduler's fake stack while a fiber runs */
    const void *sched_bottom;
    size_t sched_size;
#endif
};

/* (not initial-exec, which would be cheaper: the kernels' static shared memory is thread-local too, and a module
 * with initial-exec TLS must fit all of it in glibc's small surplus of static TLS, or dlopen fails) */
static __thread struct sched *tls_sched;
__thread unsigned emu_tid[3], emu_bid[3], emu_bdim[3], emu_gdim[3];

/* Makes a waiting fiber ready: queued, unless it is the running one (which completed the barrier and runs on). */
static void ready_push(struct sched *s, struct fiber *f)
{
    f->state = F_READY;
    if (f != s->cur)
        s->ready[(s->ready_head + s->ready_count++) % MAX_THREADS] = f->linear;
}

#if defined(__x86_64__)
/* emu_fiber_switch(save, next): saves the callee-saved registers, MXCSR and the x87 control word on the current
 * stack, stores the stack pointer in *save, and resumes the context whose stack pointer is next. A new fiber's
 * stack is laid out as if it had switched away just before emu_fiber_start. */
void emu_fiber_switch(void **save, void *next);
void emu_fiber_start(void);
__asm__(".text\n"
        ".globl emu_fiber_switch\n"
        ".hidden emu_fiber_switch\n"
        ".type emu_fiber_switch,@function\n"
        "emu_fiber_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_fiber_switch, .-emu_fiber_switch\n"
        ".globl emu_fiber_start\n"
        ".hidden emu_fiber_start\n"
        ".type emu_fiber_start,@function\n"
        "emu_fiber_start:\n"
        "  movq %r12, %rdi\n"
        "  callq *%r13\n"
        "  ud2\n"
        ".size emu_fiber_start, .-emu_fiber_start\n");
#endif

static void fiber_main(struct fiber *f);

static int stack_map(struct fiber *f)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, FIBER_STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        return -1;
    /* the guard page below: a kernel that overflows its thread's stack faults there */
    mprotect(m, page, PROT_NONE);
    f->stack = m + page;
    return 0;
}

static void fiber_prepare(struct fiber *f)
{
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f->stack, FIBER_STACK); /* frames of an abandoned earlier block */
#endif
#if defined(__x86_64__)
    uintptr_t top = ((uintptr_t)(f->stack + FIBER_STACK)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 80); /* 16-aligned: after the 8 + 48 bytes and the ret, rsp = top - 16 */
    uint32_t csr[2];
    __asm__ volatile("stmxcsr %0\n fnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
    memcpy(&sp[0], csr, 8);
    sp[1] = 0;                        /* r15 */
    sp[2] = 0;                        /* r14 */
    sp[3] = (uint64_t)(uintptr_t)fiber_main; /* r13: what emu_fiber_start calls */
    sp[4] = (uint64_t)(uintptr_t)f;   /* r12: its argument */
    sp[5] = 0;                        /* rbx */
    sp[6] = 0;                        /* rbp */
    sp[7] = (uint64_t)(uintptr_t)emu_fiber_start;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = FIBER_STACK;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, (void (*)(void))fiber_main, 1, f);
#endif
}

/* Scheduler -> fiber f. */
static void switch_to_fiber(struct sched *s, struct fiber *f)
{
    s->cur = f;
    unsigned *tid = emu_tid;
    tid[0] = f->tid[0];
    tid[1] = f->tid[1];
    tid[2] = f->tid[2];
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&s->sched_fake, f->stack, FIBER_STACK);
#endif
#if defined(__x86_64__)
    emu_fiber_switch(&s->sched_sp, f->sp);
#else
    swapcontext(&s->sched_uc, &f->uc);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(s->sched_fake, NULL, NULL);
#endif
    s->cur = NULL;
}

/* Fiber -> scheduler; returns when the scheduler resumes this fiber. */
static void switch_to_sched(struct sched *s, struct fiber *f, bool finished)
{
#if EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(finished ? NULL : &fake, s->sched_bottom, s->sched_size);
#else
    (void)finished;
#endif
#if defined(__x86_64__)
    emu_fiber_switch(&f->sp, s->sched_sp);
#else
    swapcontext(&f->uc, &s->sched_uc);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &s->sched_bottom, &s->sched_size);
#endif
}

/* Releases the block barrier once every live thread has arrived. */
static void block_barrier_check(struct sched *s)
{
    if (s->arrived == 0 || s->arrived < s->live)
        return;
    s->arrived = 0;
    for (unsigned i = 0; i < s->n; i++)
        if (s->fibers[i].state == F_WAIT_BLOCK)
            ready_push(s, &s->fibers[i]);
}

/* Completes the warp's round once every lane it waits for (still alive) has arrived. */
static void warp_round_check(struct sched *s, unsigned w)
{
    struct warp *wp = &s->warps[w];
    if (wp->arrived == 0 || (wp->arrived & (wp->expect & wp->live)) != (wp->expect & wp->live))
        return;
    unsigned par = wp->round & 1;
    /* lanes that did not take part read as a NaN pattern, never a stale value that happens to be right */
    for (unsigned l = 0; l < 32; l++)
        if (!(wp->arrived >> l & 1))
            wp->slots[par][l] = ~(uint64_t)0;
    wp->took[par] = wp->arrived;
    wp->round++;
    wp->arrived = 0;
    wp->expect = 0;
    for (unsigned l = 0; l < 32; l++) {
        unsigned i = w * 32 + l;
        if (i < s->n && s->fibers[i].state == F_WAIT_WARP)
            ready_push(s, &s->fibers[i]);
    }
}

static void fiber_main(struct fiber *f)
{
    struct sched *s = tls_sched;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &s->sched_bottom, &s->sched_size);
#endif
    s->b->body(s->b->ctx);
    f->state = F_DONE;
    s->live--;
    s->warps[f->linear / 32].live &= ~(1u << (f->linear % 32));
    /* a finished thread counts as arrived at every barrier (as on Volta and later) */
    block_barrier_check(s);
    warp_round_check(s, f->linear / 32);
    switch_to_sched(s, f, true);
    abort(); /* never resumed */
}

void emu_syncthreads(void)
{
    struct sched *s = tls_sched;
    struct fiber *f = s->cur;
    s->arrived++;
    f->state = F_WAIT_BLOCK;
    block_barrier_check(s);
    if (f->state == F_WAIT_BLOCK)
        switch_to_sched(s, f, false);

}

const uint64_t *emu_warp_exchange(unsigned mask, uint64_t value, unsigned *arrived, unsigned *lane_out)
{
    struct sched *s = tls_sched;
    struct fiber *f = s->cur;
    unsigned w = f->linear / 32, lane = f->linear % 32;
    struct warp *wp = &s->warps[w];
    unsigned par = wp->round & 1;
    wp->slots[par][lane] = value;
    wp->expect |= mask;
    wp->arrived |= 1u << lane;
    f->warp_round = wp->round;
    f->state = F_WAIT_WARP;
    warp_round_check(s, w);
    if (f->state == F_WAIT_WARP)
        switch_to_sched(s, f, false);

    if (arrived)
        *arrived = wp->took[par];
    if (lane_out)
        *lane_out = lane;
    return wp->slots[par];
}

unsigned emu_lane(void)
{
    return tls_sched->cur->linear % 32;
}

void *emu_dynamic_smem(void)
{
    return tls_sched->smem;
}

static struct sched *sched_get(void)
{
    if (!tls_sched) {
        struct sched *s = calloc(1, sizeof *s);
        if (!s)
            return NULL;
        s->smem = aligned_alloc(256, SMEM_BYTES);
        if (!s->smem) {
            free(s);
            return NULL;
        }
        tls_sched = s;
    }
    return tls_sched;
}

static const char *wait_what(enum fiber_state st)
{
    return st == F_WAIT_BLOCK ? "__syncthreads" : "a warp exchange (shuffle, vote or __syncwarp)";
}

int emu_block_run(const struct emu_block_launch *b)
{
    size_t n = (size_t)b->block[0] * b->block[1] * b->block[2];
    if (n == 0 || n > MAX_THREADS) {
        emu_fail(cudaErrorInvalidConfiguration, "kernel %s: a block of %zu threads (1 to %d allowed)", b->kernel, n,
                 MAX_THREADS);
        return -1;
    }
    if (b->dynamic_smem > SMEM_BYTES) {
        emu_fail(cudaErrorInvalidConfiguration, "kernel %s: %zu bytes of dynamic shared memory (at most %zu)",
                 b->kernel, b->dynamic_smem, SMEM_BYTES);
        return -1;
    }
    struct sched *s = sched_get();
    if (!s) {
        emu_fail(cudaErrorMemoryAllocation, "kernel %s: no memory for the block scheduler", b->kernel);
        return -1;
    }
    while (s->nstacks < n) {
        if (stack_map(&s->fibers[s->nstacks]) != 0) {
            emu_fail(cudaErrorMemoryAllocation, "kernel %s: cannot map a fiber stack", b->kernel);
            return -1;
        }
        s->nstacks++;
    }
    s->b = b;
    s->n = (unsigned)n;
    s->live = (unsigned)n;
    s->arrived = 0;
    memcpy(emu_bid, b->index, sizeof emu_bid);
    memcpy(emu_bdim, b->block, sizeof emu_bdim);
    memcpy(emu_gdim, b->grid, sizeof emu_gdim);
    if (b->dynamic_smem)
        memset(s->smem, 0xff, b->dynamic_smem); /* a read before any write is a NaN */
    for (unsigned w = 0; w < (n + 31) / 32; w++) {
        struct warp *wp = &s->warps[w];
        unsigned lanes = n - w * 32 < 32 ? (unsigned)(n - w * 32) : 32;
        wp->live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        wp->expect = wp->arrived = 0;
        wp->round = 0;
    }
    s->ready_head = s->ready_count = 0;
    for (unsigned i = 0; i < n; i++) {
        struct fiber *f = &s->fibers[i];
        f->linear = i;
        f->tid[0] = i % b->block[0];
        f->tid[1] = i / b->block[0] % b->block[1];
        f->tid[2] = i / (b->block[0] * b->block[1]);
        fiber_prepare(f);
        ready_push(s, f);
    }
    while (s->live > 0) {
        if (s->ready_count == 0) {
            unsigned first = 0;
            while (first < n && s->fibers[first].state == F_DONE)
                first++;
            emu_fail(cudaErrorLaunchFailure, "kernel %s, block (%u,%u,%u): deadlock: thread %u waits at %s, but %u of "
                     "the %zu threads never get there (a barrier inside a branch not every thread takes?)",
                     b->kernel, b->index[0], b->index[1], b->index[2], first, wait_what(s->fibers[first].state),
                     s->live - s->arrived, n);
            return -1;
        }
        struct fiber *f = &s->fibers[s->ready[s->ready_head]];
        s->ready_head = (s->ready_head + 1) % MAX_THREADS;
        s->ready_count--;
        switch_to_fiber(s, f);
    }
    return 0;
}

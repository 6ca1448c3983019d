/* A stand-in for the emulator's runtime (gpu/emu/emu.h) for unit tests of one part alone (the cuBLAS and NCCL
 * stand-ins): ops run at once on the calling thread, device memory is plain host memory in a small registry,
 * emu_dev is the identity, and emu_fail records its message for the test to read (emu_stub_last_failure). */
#include "gpu/emu/emu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STUB_ALLOCS 4096

static struct {
    char *p;
    size_t n;
    bool pinned;
} allocs[STUB_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cudaError_t sticky = cudaSuccess;
static char last_failure[1024];

const char *emu_stub_last_failure(void);
void emu_stub_reset(void);
cudaError_t emu_stub_host_alloc(void **p, size_t bytes);

cudaError_t emu_enqueue(cudaStream_t stream, const char *what, emu_op_fn run, void *arg, emu_op_fn release)
{
    (void)stream;
    (void)what;
    run(arg);
    if (release)
        release(arg);
    return cudaSuccess;
}

void *emu_dev(const void *p)
{
    return (void *)p;
}

static int find(const void *p, size_t bytes, bool pinned)
{
    const char *c = p;
    for (int i = 0; i < STUB_ALLOCS; i++)
        if (allocs[i].p && allocs[i].pinned == pinned && c >= allocs[i].p && c <= allocs[i].p + allocs[i].n &&
            bytes <= (size_t)(allocs[i].p + allocs[i].n - c))
            return i;
    return -1;
}

bool emu_is_device(const void *p)
{
    pthread_mutex_lock(&mu);
    bool r = find(p, 0, false) >= 0;
    pthread_mutex_unlock(&mu);
    return r;
}

bool emu_is_pinned(const void *p)
{
    pthread_mutex_lock(&mu);
    bool r = find(p, 0, true) >= 0;
    pthread_mutex_unlock(&mu);
    return r;
}

int emu_check_device_range(const char *op, const char *what, const void *p, size_t bytes)
{
    pthread_mutex_lock(&mu);
    int i = find(p, bytes, false);
    pthread_mutex_unlock(&mu);
    if (i >= 0)
        return 0;
    emu_fail(cudaErrorIllegalAddress, "%s: %s [%p, +%zu) is not inside one live device allocation", op, what, p,
             bytes);
    return -1;
}

static cudaError_t stub_alloc(void **p, size_t bytes, bool pinned)
{
    char *m = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!m)
        return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < STUB_ALLOCS; i++)
        if (!allocs[i].p) {
            allocs[i].p = m;
            allocs[i].n = bytes;
            allocs[i].pinned = pinned;
            pthread_mutex_unlock(&mu);
            *p = m;
            return cudaSuccess;
        }
    pthread_mutex_unlock(&mu);
    free(m);
    return cudaErrorMemoryAllocation;
}

cudaError_t emu_device_alloc(void **p, size_t bytes)
{
    return stub_alloc(p, bytes, false);
}

cudaError_t emu_stub_host_alloc(void **p, size_t bytes)
{
    return stub_alloc(p, bytes, true);
}

cudaError_t emu_device_free(void *p)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < STUB_ALLOCS; i++)
        if (allocs[i].p == p) {
            allocs[i].p = NULL;
            pthread_mutex_unlock(&mu);
            free(p);
            return cudaSuccess;
        }
    pthread_mutex_unlock(&mu);
    return cudaErrorInvalidValue;
}

void emu_fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&mu);
    vsnprintf(last_failure, sizeof last_failure, fmt, ap);
    if (sticky == cudaSuccess)
        sticky = e;
    pthread_mutex_unlock(&mu);
    va_end(ap);
}

cudaError_t emu_sticky_error(void)
{
    return sticky;
}

unsigned emu_delay_us(void)
{
    return 0;
}

void emu_random_delay(void)
{
}

const char *emu_stub_last_failure(void)
{
    return last_failure;
}

void emu_stub_reset(void)
{
    sticky = cudaSuccess;
    last_failure[0] = '\0';
}

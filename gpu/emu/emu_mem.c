/* Device and pinned memory of the CUDA host emulator, and the copies and memsets between them (emu.h).
 *
 * Device memory: one reservation of 2 x FSDP_GPU_EMU_MEMORY_GIB (default 16 GiB, reported as the device's
 * memory) split in two views. cudaMalloc hands out addresses of the first half, the host view, which is never
 * mapped readable: host code that dereferences a device pointer faults, and the fault handler names the
 * allocation. The bytes live at the same offset in the second half, the device view, which only device work uses
 * (emu_dev). Each allocation takes whole pages followed by an unmapped guard page, and ends at its pages' end
 * (rounded up to 256 bytes, cudaMalloc's alignment), so a kernel that runs past its end faults; under
 * AddressSanitizer the bytes between the end and the page's end are poisoned too, and any out-of-bounds access is
 * an ASan report. Freed pages are unmapped, and their addresses are reused only after 64 later frees.
 *
 * Copies follow CUDA's rules for each kind of host memory: from pageable memory the bytes are taken when the call
 * returns (staged), to pageable memory the call returns when they have arrived, while copies to and from pinned
 * memory (cudaMallocHost) are truly asynchronous: a host that reads them without synchronising races. */
#include "gpu/emu/emu.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/settings.h"
#include "gpu/emu/emu_internal.h"

#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define PAGE ((size_t)4096)
#define QUARANTINE 64

struct alloc {
    uintptr_t addr; /* host view */
    size_t bytes;
    size_t first_page, pages; /* pages of the view, the guard page not counted */
};

struct extent {
    size_t first, count; /* in pages, guard page included */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static char *host_view, *dev_view;
static size_t view_bytes, next_page;
static struct alloc *allocs; /* sorted by addr */
static size_t nallocs, cap_allocs;
static struct extent *free_ext; /* sorted by first */
static size_t nfree, cap_free;
static struct extent quarantine[QUARANTINE];
static size_t nquarantine, quarantine_head;
static struct pinned {
    uintptr_t addr;
    size_t bytes;
} *pins;
static size_t npins, cap_pins;

size_t emu_memory_bytes(void);

static void fault_handler(int sig, siginfo_t *si, void *uc);

static void mem_reserve(void)
{
    size_t gib = (size_t)settings_int(SETTING_GPU_EMU_MEMORY_GIB); /* 1-4096 (the table's range) */
    view_bytes = gib << 30;
    void *m = mmap(NULL, 2 * view_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        view_bytes = 0;
        return;
    }
    host_view = m;
    dev_view = host_view + view_bytes;
    /* Name the device memory a host dereference touched, then crash as before. Only where no other handler is
     * installed: ASan's own handler (sanitizer builds) reports the same fault with its stack. */
    struct sigaction old;
    if (sigaction(SIGSEGV, NULL, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = fault_handler;
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
    }
}

void emu_mem_init(void)
{
    pthread_once(&init_once, mem_reserve);
}

size_t emu_memory_bytes(void)
{
    emu_mem_init();
    return view_bytes;
}

/* The index of the allocation holding host-view address a (mu held), or -1. */
static long alloc_find(uintptr_t a)
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid].addr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const struct alloc *al = &allocs[lo - 1];
    return a < al->addr + (al->bytes ? al->bytes : 1) ? (long)(lo - 1) : -1;
}

bool emu_is_device(const void *p)
{
    emu_mem_init();
    return (const char *)p >= host_view && (const char *)p < host_view + view_bytes;
}

void *emu_dev(const void *p)
{
    if (emu_is_device(p))
        return (char *)p + view_bytes;
    return (void *)p;
}

bool emu_is_pinned(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&mu);
    bool r = false;
    for (size_t i = 0; i < npins && !r; i++)
        r = a >= pins[i].addr && a < pins[i].addr + pins[i].bytes;
    pthread_mutex_unlock(&mu);
    return r;
}

int emu_check_device_range(const char *op, const char *what, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&mu);
    long i = emu_is_device(p) ? alloc_find(a) : -1;
    struct alloc al = i >= 0 ? allocs[i] : (struct alloc){0};
    pthread_mutex_unlock(&mu);
    if (i >= 0 && bytes <= al.addr + al.bytes - a)
        return 0;
    if (i >= 0)
        emu_fail(cudaErrorInvalidValue, "%s: %s [%p, +%zu bytes) runs %zu bytes past the end of its device allocation "
                 "(%zu bytes at %p)", op, what, p, bytes, (size_t)(a + bytes - al.addr - al.bytes), al.bytes,
                 (void *)al.addr);
    else
        emu_fail(cudaErrorInvalidValue, "%s: %s %p is not in a live device allocation%s", op, what, p,
                 emu_is_device(p) ? " (freed, or between allocations)" : " (a host address)");
    return -1;
}

/* Pages for a new allocation (mu held): first fit among the freed extents, else fresh ones. */
static bool pages_take(size_t count, size_t *first)
{
    for (size_t i = 0; i < nfree; i++)
        if (free_ext[i].count >= count) {
            *first = free_ext[i].first;
            free_ext[i].first += count;
            free_ext[i].count -= count;
            if (free_ext[i].count == 0) {
                memmove(&free_ext[i], &free_ext[i + 1], (nfree - i - 1) * sizeof *free_ext);
                nfree--;
            }
            return true;
        }
    if ((next_page + count) * PAGE > view_bytes)
        return false;
    *first = next_page;
    next_page += count;
    return true;
}

static void pages_give(struct extent e)
{
    size_t i = 0;
    while (i < nfree && free_ext[i].first < e.first)
        i++;
    if (nfree == cap_free) {
        size_t nc = cap_free ? 2 * cap_free : 64;
        struct extent *n = realloc(free_ext, nc * sizeof *n);
        if (!n)
            return; /* the pages are only lost to reuse */
        free_ext = n;
        cap_free = nc;
    }
    memmove(&free_ext[i + 1], &free_ext[i], (nfree - i) * sizeof *free_ext);
    free_ext[i] = e;
    nfree++;
    if (i + 1 < nfree && free_ext[i].first + free_ext[i].count == free_ext[i + 1].first) {
        free_ext[i].count += free_ext[i + 1].count;
        memmove(&free_ext[i + 1], &free_ext[i + 2], (nfree - i - 2) * sizeof *free_ext);
        nfree--;
    }
    if (i > 0 && free_ext[i - 1].first + free_ext[i - 1].count == free_ext[i].first) {
        free_ext[i - 1].count += free_ext[i].count;
        memmove(&free_ext[i], &free_ext[i + 1], (nfree - i - 1) * sizeof *free_ext);
        nfree--;
    }
}

cudaError_t emu_device_alloc(void **out, size_t bytes)
{
    if (!out)
        return cudaErrorInvalidValue;
    emu_mem_init();
    if (!view_bytes)
        return cudaErrorMemoryAllocation;
    if (bytes == 0) {
        *out = NULL;
        return cudaSuccess;
    }
    size_t rounded = (bytes + 255) & ~(size_t)255;
    size_t pages = (rounded + PAGE - 1) / PAGE;
    if (rounded < bytes || pages > view_bytes / PAGE)
        return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&mu);
    size_t first;
    if (nallocs == cap_allocs) {
        size_t nc = cap_allocs ? 2 * cap_allocs : 256;
        struct alloc *n = realloc(allocs, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&mu);
            return cudaErrorMemoryAllocation;
        }
        allocs = n;
        cap_allocs = nc;
    }
    if (!pages_take(pages + 1, &first)) {
        pthread_mutex_unlock(&mu);
        return cudaErrorMemoryAllocation;
    }
    char *dv = dev_view + first * PAGE;
    if (mprotect(dv, pages * PAGE, PROT_READ | PROT_WRITE) != 0) {
        pages_give((struct extent){first, pages + 1});
        pthread_mutex_unlock(&mu);
        return cudaErrorMemoryAllocation;
    }
    uintptr_t addr = (uintptr_t)(host_view + (first + pages) * PAGE - rounded);
#if EMU_ASAN
    ASAN_POISON_MEMORY_REGION(dv, pages * PAGE);
    ASAN_UNPOISON_MEMORY_REGION((void *)(addr + view_bytes), bytes);
#endif
    size_t i = nallocs;
    while (i > 0 && allocs[i - 1].addr > addr)
        i--;
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof *allocs);
    allocs[i] = (struct alloc){addr, bytes, first, pages};
    nallocs++;
    pthread_mutex_unlock(&mu);
    *out = (void *)addr;
    return cudaSuccess;
}

cudaError_t emu_device_free(void *p)
{
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&mu);
    long i = emu_is_device(p) ? alloc_find((uintptr_t)p) : -1;
    if (i < 0 || allocs[i].addr != (uintptr_t)p) {
        pthread_mutex_unlock(&mu);
        emu_fail(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live device allocation%s", p,
                 i >= 0 ? " (inside one)" : " (freed twice, or never allocated)");
        return cudaErrorInvalidValue;
    }
    struct alloc al = allocs[i];
    memmove(&allocs[i], &allocs[i + 1], (nallocs - (size_t)i - 1) * sizeof *allocs);
    nallocs--;
    char *dv = dev_view + al.first_page * PAGE;
    /* unmapped again (and its memory returned): a use after free faults */
    mmap(dv, al.pages * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    struct extent e = {al.first_page, al.pages + 1};
    if (nquarantine == QUARANTINE) {
        pages_give(quarantine[quarantine_head]);
        quarantine[quarantine_head] = e;
        quarantine_head = (quarantine_head + 1) % QUARANTINE;
    } else {
        quarantine[(quarantine_head + nquarantine++) % QUARANTINE] = e;
    }
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* ---- the fault handler ---- */

static void fault_handler(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char msg[512];
    const char *a = si->si_addr;
    int n = 0;
    if (a >= host_view && a < host_view + view_bytes)
        n = snprintf(msg, sizeof msg, "fsdpc CUDA emulator: host code touched device memory at %p (%s): device "
                     "memory is read and written only by kernels and copies (cudaMemcpy)\n", (const void *)a,
                     emu_current_op ? emu_current_op : "not from a stream's op");
    else if (a >= dev_view && a < dev_view + view_bytes)
        n = snprintf(msg, sizeof msg, "fsdpc CUDA emulator: %s touched device memory at %p outside every live "
                     "allocation (out of bounds, or freed)\n", emu_current_op ? emu_current_op : "host code",
                     (const void *)(a - view_bytes));
    if (n > 0 && write(2, msg, (size_t)n) < 0)
        n = 0;
    /* SA_RESETHAND: returning re-runs the access under the default action */
    (void)sig;
}

/* ---- pinned memory ---- */

static cudaError_t pinned_alloc(void **out, size_t bytes)
{
    if (!out)
        return cudaErrorInvalidValue;
    size_t len = bytes ? (bytes + PAGE - 1) & ~(PAGE - 1) : PAGE;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&mu);
    if (npins == cap_pins) {
        size_t nc = cap_pins ? 2 * cap_pins : 64;
        struct pinned *n = realloc(pins, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&mu);
            munmap(m, len);
            return cudaErrorMemoryAllocation;
        }
        pins = n;
        cap_pins = nc;
    }
    pins[npins++] = (struct pinned){(uintptr_t)m, len};
    pthread_mutex_unlock(&mu);
    *out = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **out, size_t bytes)
{
    return pinned_alloc(out, bytes);
}

cudaError_t cudaHostAlloc(void **out, size_t bytes, unsigned int flags)
{
    (void)flags;
    return pinned_alloc(out, bytes);
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < npins; i++)
        if (pins[i].addr == (uintptr_t)p) {
            size_t len = pins[i].bytes;
            pins[i] = pins[--npins];
            pthread_mutex_unlock(&mu);
            munmap(p, len);
            return cudaSuccess;
        }
    pthread_mutex_unlock(&mu);
    return cudaErrorInvalidValue;
}

/* ---- device allocation API ---- */

cudaError_t cudaMalloc(void **out, size_t bytes)
{
    return emu_device_alloc(out, bytes);
}

cudaError_t cudaFree(void *p)
{
    /* as CUDA: cudaFree waits for the device first */
    cudaError_t e = cudaDeviceSynchronize();
    cudaError_t f = emu_device_free(p);
    return f != cudaSuccess ? f : e;
}

cudaError_t cudaMallocAsync(void **out, size_t bytes, cudaStream_t st)
{
    (void)st; /* the memory is usable by work queued after this call on any stream that is ordered after it */
    return emu_device_alloc(out, bytes);
}

cudaError_t cudaMallocFromPoolAsync(void **out, size_t bytes, cudaMemPool_t pool, cudaStream_t st)
{
    (void)pool;
    return cudaMallocAsync(out, bytes, st);
}

static void free_run(void *arg)
{
    emu_device_free(arg);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t st)
{
    if (!p)
        return cudaSuccess;
    /* freed in stream order: work queued before still reads it, work after that touches it faults */
    return emu_enqueue(st, "cudaFreeAsync", free_run, p, NULL);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    emu_mem_init();
    size_t used = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nallocs; i++)
        used += allocs[i].pages * PAGE;
    pthread_mutex_unlock(&mu);
    if (free_b)
        *free_b = view_bytes - used;
    if (total)
        *total = view_bytes;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    if (!a)
        return cudaErrorInvalidValue;
    memset(a, 0, sizeof *a);
    if (emu_is_device(p)) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = (void *)p;
    } else if (emu_is_pinned(p)) {
        a->type = cudaMemoryTypeHost;
        a->hostPointer = (void *)p;
        a->devicePointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
    }
    return cudaSuccess;
}

/* ---- copies and memsets ---- */

struct copy_op {
    char *dst;
    const char *src;
    size_t width, rows, dpitch, spitch;
    void *staged; /* the pageable source's bytes, taken at the call */
    int value;    /* memset: the byte, else -1 */
};

static void copy_run(void *arg)
{
    struct copy_op *o = arg;
    if (emu_sticky_error() != cudaSuccess)
        return;
    char *d = emu_dev(o->dst);
    if (o->value >= 0) {
        for (size_t r = 0; r < o->rows; r++)
            memset(d + r * o->dpitch, o->value, o->width);
        return;
    }
    const char *s = o->staged ? (const char *)o->staged : (const char *)emu_dev(o->src);
    size_t sp = o->staged ? o->width : o->spitch;
    for (size_t r = 0; r < o->rows; r++)
        memmove(d + r * o->dpitch, s + r * sp, o->width);
}

static void copy_release(void *arg)
{
    struct copy_op *o = arg;
    free(o->staged);
    free(o);
}

static const char *kind_name(enum cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
    }
}

/* Queues a (strided) copy; *sync_after is set when the call must wait for it (to pageable memory). */
static cudaError_t copy_queue(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t rows, enum cudaMemcpyKind kind, cudaStream_t st, bool *sync_after)
{
    *sync_after = false;
    if (width == 0 || rows == 0)
        return cudaSuccess;
    if (!dst || !src || dpitch < width || spitch < width)
        return cudaErrorInvalidValue;
    bool dd = emu_is_device(dst), sd = emu_is_device(src);
    if (kind != cudaMemcpyDefault) {
        bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (kind > cudaMemcpyDefault || want_dd != dd || want_sd != sd) {
            emu_fail(cudaErrorInvalidMemcpyDirection, "%s(%p <- %p) with %s, but the destination is %s memory and "
                     "the source %s memory", api, dst, src, kind_name(kind), dd ? "device" : "host",
                     sd ? "device" : "host");
            return cudaErrorInvalidMemcpyDirection;
        }
    }
    size_t dext = (rows - 1) * dpitch + width, sext = (rows - 1) * spitch + width;
    if ((dd && emu_check_device_range(api, "the destination", dst, dext)) ||
        (sd && emu_check_device_range(api, "the source", src, sext)))
        return cudaErrorInvalidValue;
    struct copy_op *o = calloc(1, sizeof *o);
    if (!o)
        return cudaErrorMemoryAllocation;
    *o = (struct copy_op){(char *)dst, src, width, rows, dpitch, spitch, NULL, -1};
    if (!sd && !emu_is_pinned(src)) {
        o->staged = malloc(width * rows);
        if (!o->staged) {
            free(o);
            return cudaErrorMemoryAllocation;
        }
        for (size_t r = 0; r < rows; r++)
            memcpy((char *)o->staged + r * width, (const char *)src + r * spitch, width);
    }
    *sync_after = !dd && !emu_is_pinned(dst);
    return emu_enqueue(st, api, copy_run, o, copy_release);
}

static cudaError_t copy_call(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                             size_t rows, enum cudaMemcpyKind kind, cudaStream_t st, bool sync)
{
    bool sync_after;
    cudaError_t e = copy_queue(api, dst, dpitch, src, spitch, width, rows, kind, st, &sync_after);
    if (e != cudaSuccess)
        return e;
    if (sync || sync_after)
        return emu_stream_wait(st, emu_stream_last(st));
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t st)
{
    return copy_call("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, st, false);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return copy_call("cudaMemcpy", dst, n, src, n, n, 1, kind, NULL, true);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t st)
{
    return copy_call("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, st, false);
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind)
{
    return copy_call("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, kind, NULL, true);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t st)
{
    if (n == 0)
        return cudaSuccess;
    if (emu_check_device_range("cudaMemsetAsync", "the destination", dst, n))
        return cudaErrorInvalidValue;
    struct copy_op *o = calloc(1, sizeof *o);
    if (!o)
        return cudaErrorMemoryAllocation;
    *o = (struct copy_op){(char *)dst, NULL, n, 1, n, n, NULL, value & 0xff};
    return emu_enqueue(st, "cudaMemsetAsync", copy_run, o, copy_release);
}

cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    cudaError_t e = cudaMemsetAsync(dst, value, n, NULL);
    return e != cudaSuccess ? e : emu_stream_wait(NULL, emu_stream_last(NULL));
}

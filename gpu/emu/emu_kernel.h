/* The device-code environment of the CUDA host emulator: force-included (g++ -include) before every
 * kernels/cuda source (.cu) that gpu/emu/cu_to_cc.py has rewritten for the host. It gives device code what nvcc
 * gives it (threadIdx and friends, __syncthreads, warp shuffles and votes, atomics, the math intrinsics the
 * kernels use, shared memory) and turns each launch into an op of the stream (emu_kernel_launch). CUDA's own
 * headers provide __nv_bfloat16, __half and dim3 with their host implementations. C++17. */
#ifndef FSDP_GPU_EMU_EMU_KERNEL_H
#define FSDP_GPU_EMU_EMU_KERNEL_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "gpu/emu/emu.h"
#include "gpu/emu/emu_block.h"

#define __launch_bounds__(...)
/* static shared memory: one copy per OS thread, and a block's threads are fibers of one OS thread */
#define EMU_SHARED static thread_local

/* The builtin variables, read as on the device (uint3 / dim3 copies of the running thread's coordinates). */
#define threadIdx (make_uint3(emu_tid[0], emu_tid[1], emu_tid[2]))
#define blockIdx (make_uint3(emu_bid[0], emu_bid[1], emu_bid[2]))
#define blockDim (dim3(emu_bdim[0], emu_bdim[1], emu_bdim[2]))
#define gridDim (dim3(emu_gdim[0], emu_gdim[1], emu_gdim[2]))
static constexpr int warpSize = 32;

static inline void __syncthreads(void)
{
    emu_syncthreads();
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    emu_warp_exchange(mask, 0, nullptr, nullptr);
}

template <typename T> static inline uint64_t emu_bits_of(T v)
{
    static_assert(sizeof(T) <= 8, "a warp exchange moves at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}

template <typename T> static inline T emu_value_of(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

/* The value of lane src(lane) of this lane's segment of width lanes, or this lane's own where src says -1. */
template <typename T, typename F> static inline T emu_shfl(unsigned mask, T v, F src)
{
    unsigned lane = 0;
    const uint64_t *slots = emu_warp_exchange(mask, emu_bits_of(v), nullptr, &lane);
    int from = src((int)lane);
    return from < 0 ? v : emu_value_of<T>(slots[from & 31]);
}

template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = warpSize)
{
    return emu_shfl(mask, v, [=](int lane) { return (lane & ~(width - 1)) + (src & (width - 1)); });
}

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize)
{
    return emu_shfl(mask, v, [=](int lane) {
        int base = lane & ~(width - 1), from = lane ^ lane_mask;
        return from < base || from >= base + width ? -1 : from;
    });
}

template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize)
{
    return emu_shfl(mask, v, [=](int lane) {
        int base = lane & ~(width - 1), from = lane + (int)delta;
        return from >= base + width ? -1 : from;
    });
}

template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize)
{
    return emu_shfl(mask, v, [=](int lane) {
        int base = lane & ~(width - 1), from = lane - (int)delta;
        return from < base ? -1 : from;
    });
}

static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    unsigned took = 0;
    const uint64_t *slots = emu_warp_exchange(mask, pred != 0, &took, nullptr);
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((took >> l & 1) && (mask >> l & 1) && slots[l])
            r |= 1u << l;
    return r;
}

static inline int __any_sync(unsigned mask, int pred)
{
    return __ballot_sync(mask, pred) != 0;
}

static inline int __all_sync(unsigned mask, int pred)
{
    unsigned took = 0;
    const uint64_t *slots = emu_warp_exchange(mask, pred != 0, &took, nullptr);
    for (int l = 0; l < 32; l++)
        if ((took >> l & 1) && (mask >> l & 1) && !slots[l])
            return 0;
    return 1;
}

/* ---- atomics (real ones: kernels on two streams may run at once) ---- */
template <typename T> static inline T atomicAdd(T *p, T v)
{
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    } else {
        T old = *p, nv;
        do
            nv = old + v;
        while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    }
}

template <typename T> static inline T atomicMin(T *p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

template <typename T> static inline T atomicMax(T *p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

template <typename T> static inline T atomicExch(T *p, T v)
{
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}

template <typename T> static inline T atomicCAS(T *p, T cmp, T v)
{
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}

/* ---- math intrinsics: the host's correctly rounded functions (the GPU's fast ones differ by a few ulp) ---- */
/* glibc declares its own __expf and __logf: the kernels' names are mapped onto ours */
static inline float emu_expf(float x) { return expf(x); }
static inline float emu_logf(float x) { return logf(x); }
#define __expf emu_expf
#define __logf emu_logf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
/* CUDA's min and max for any two arithmetic types (nvcc's overloads promote the same way) */
template <typename A, typename B> static inline typename std::common_type<A, B>::type min(A a, B b)
{
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <typename A, typename B> static inline typename std::common_type<A, B>::type max(A a, B b)
{
    typedef typename std::common_type<A, B>::type T;
    return (T)a > (T)b ? (T)a : (T)b;
}

/* ---- launches ---- */
template <typename... P> struct emu_launch_op {
    void (*fn)(P...);
    std::tuple<typename std::decay<P>::type...> args;
    struct emu_block_launch b;
    const char *name;
};

/* Device-view addresses for the pointer arguments (emu.h: kernels see memory through the device view). */
template <typename T> static inline T emu_arg_dev(T v)
{
    if constexpr (std::is_pointer<T>::value)
        return (T)emu_dev((const void *)v);
    else
        return v;
}

template <typename... P> static void emu_launch_body(void *ctx)
{
    auto *op = (emu_launch_op<P...> *)ctx;
    std::apply(op->fn, op->args);
}

template <typename... P> static void emu_launch_run(void *arg)
{
    auto *op = (emu_launch_op<P...> *)arg;
    if (emu_sticky_error() != cudaSuccess)
        return; /* a device that faulted runs nothing more, as a real one */
    std::apply([](auto &...a) { ((a = emu_arg_dev(a)), ...); }, op->args);
    op->b.body = emu_launch_body<P...>;
    op->b.ctx = op;
    for (unsigned z = 0; z < op->b.grid[2]; z++)
        for (unsigned y = 0; y < op->b.grid[1]; y++)
            for (unsigned x = 0; x < op->b.grid[0]; x++) {
                op->b.index[0] = x;
                op->b.index[1] = y;
                op->b.index[2] = z;
                if (emu_block_run(&op->b) != 0)
                    return;
            }
}

template <typename... P> static void emu_launch_release(void *arg)
{
    delete (emu_launch_op<P...> *)arg;
}

/* 0 when the launch may go (grid and block sizes, dynamic shared memory within what the kernel was allowed by
 * cudaFuncSetAttribute: 48 KiB without it); else the launch error, kept for cudaGetLastError. */
extern "C" cudaError_t emu_launch_check(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem);

/* nvcc's typed overload of cudaFuncSetAttribute (cuda_runtime.h declares it only for nvcc) */
template <typename... P> static inline cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int v)
{
    return cudaFuncSetAttribute((const void *)fn, attr, v);
}

/* kernel<<<grid, block, smem, stream>>>(args) becomes emu_kernel_launch(kernel, "kernel", grid, block, smem,
 * stream)(args): the arguments are converted to the kernel's parameter types and copied, as a launch does. */
template <typename... P> struct emu_launcher {
    void (*fn)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... A> void operator()(A &&...a) const
    {
        if (emu_launch_check((const void *)fn, name, grid, block, smem) != cudaSuccess)
            return;
        auto *op = new emu_launch_op<P...>{fn, std::tuple<typename std::decay<P>::type...>((P)a...), {}, name};
        op->b.kernel = name;
        op->b.block[0] = block.x, op->b.block[1] = block.y, op->b.block[2] = block.z;
        op->b.grid[0] = grid.x, op->b.grid[1] = grid.y, op->b.grid[2] = grid.z;
        op->b.dynamic_smem = smem;
        emu_enqueue(stream, name, emu_launch_run<P...>, op, emu_launch_release<P...>);
    }
};

template <typename... P>
static inline emu_launcher<P...> emu_kernel_launch(void (*fn)(P...), const char *name, dim3 grid, dim3 block,
                                                   size_t smem = 0, cudaStream_t stream = 0)
{
    return emu_launcher<P...>{fn, name, grid, block, smem, stream};
}

#endif

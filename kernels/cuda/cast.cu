/* dtype conversions f32 <-> bf16 <-> f16 on the device, with the same integer bit operations as the CPU
 * backend (round to nearest even, NaN kept quiet, f16 overflow to inf, exact subnormals), so both
 * backends give identical bits; the hardware __float2bfloat16 would also round to nearest but this
 * keeps one definition of the edge cases. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

__device__ __forceinline__ uint16_t dev_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float dev_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t dev_f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t x = u & 0x7fffffffu;
    if (x >= 0x7f800000u)
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) {
        if (x <= 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (x - 0x38000000u) >> 13;
    uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

__device__ __forceinline__ float dev_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* Every pair goes through f32, which holds bf16 and f16 exactly: one rounding. The dtypes are template
 * parameters so the inner loop has no switch. */
template <int SRC, int DST> __global__ void cast_kernel(void *dst, const void *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float f;
        if (SRC == KERNELS_BF16)
            f = dev_bf16_to_f32(((const uint16_t *)src)[i]);
        else if (SRC == KERNELS_F16)
            f = dev_f16_to_f32(((const uint16_t *)src)[i]);
        else
            f = ((const float *)src)[i];
        if (DST == KERNELS_BF16)
            ((uint16_t *)dst)[i] = dev_f32_to_bf16(f);
        else if (DST == KERNELS_F16)
            ((uint16_t *)dst)[i] = dev_f32_to_f16(f);
        else
            ((float *)dst)[i] = f;
    }
}

int cuda_cast(void *dst, enum kernels_dtype dst_dtype, const void *src, enum kernels_dtype src_dtype,
              size_t n)
{
    if ((unsigned)dst_dtype > KERNELS_F16 || (unsigned)src_dtype > KERNELS_F16)
        return error_set(FSDP_EINVAL, "kernels cuda: cast: unknown dtype %d -> %d", (int)src_dtype,
                         (int)dst_dtype);
    if (n == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cuda: cast: NULL buffer");
    if (dst_dtype == src_dtype) /* mem_copy, as the CPU's memmove: cudaMemcpy leaves overlap undefined */
        return cuda_mem_copy(dst, src, n * kernels_dtype_size(dst_dtype), KERNELS_COPY_D2D);
    unsigned g = cuda_grid(n);
    cudaStream_t s = cuda_ctx.stream;
    switch (src_dtype * 3 + dst_dtype) {
    case KERNELS_F32 * 3 + KERNELS_BF16: cast_kernel<KERNELS_F32, KERNELS_BF16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case KERNELS_F32 * 3 + KERNELS_F16: cast_kernel<KERNELS_F32, KERNELS_F16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case KERNELS_BF16 * 3 + KERNELS_F32: cast_kernel<KERNELS_BF16, KERNELS_F32><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case KERNELS_BF16 * 3 + KERNELS_F16: cast_kernel<KERNELS_BF16, KERNELS_F16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case KERNELS_F16 * 3 + KERNELS_F32: cast_kernel<KERNELS_F16, KERNELS_F32><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    default: cast_kernel<KERNELS_F16, KERNELS_BF16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    }
    return cuda_check_launch("cast");
}

/* The cast op on the device: common/dtype.h's conversions (DTYPE_HD, so the same functions as the CPU
 * backend and the collectives: identical bits, one definition of the edge cases; the hardware
 * __float2bfloat16 would also round to nearest but is a second definition). */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

/* Every pair goes through f32, which holds bf16 and f16 exactly: one rounding. The dtypes are template
 * parameters so the inner loop has no branch on them. */
template <int SRC, int DST> __global__ void cast_kernel(void *dst, const void *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dtype_store_f32((enum dtype)DST, dst, i, dtype_load_f32((enum dtype)SRC, src, i));
}

int cuda_cast(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype, size_t n)
{
    if (!dtype_valid(dst_dtype) || !dtype_valid(src_dtype))
        return error_set(FSDP_EINVAL, "kernels cuda: cast: unknown dtype %d -> %d", (int)src_dtype,
                         (int)dst_dtype);
    if (n == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cuda: cast: NULL buffer");
    if (dst_dtype == src_dtype) /* mem_copy, as the CPU's memmove: cudaMemcpy leaves overlap undefined */
        return cuda_mem_copy(dst, src, n * dtype_size(dst_dtype), KERNELS_COPY_D2D);
    unsigned g = cuda_grid(n);
    cudaStream_t s = cuda_ctx.stream;
    switch (src_dtype * 3 + dst_dtype) {
    case DTYPE_F32 * 3 + DTYPE_BF16: cast_kernel<DTYPE_F32, DTYPE_BF16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case DTYPE_F32 * 3 + DTYPE_F16: cast_kernel<DTYPE_F32, DTYPE_F16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case DTYPE_BF16 * 3 + DTYPE_F32: cast_kernel<DTYPE_BF16, DTYPE_F32><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case DTYPE_BF16 * 3 + DTYPE_F16: cast_kernel<DTYPE_BF16, DTYPE_F16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    case DTYPE_F16 * 3 + DTYPE_F32: cast_kernel<DTYPE_F16, DTYPE_F32><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    default: cast_kernel<DTYPE_F16, DTYPE_BF16><<<g, CUDA_THREADS, 0, s>>>(dst, src, n); break;
    }
    return cuda_check_launch("cast");
}

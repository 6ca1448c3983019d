/* What the flash-style attention kernels of attention.cu (one sequence's rows in order) and attention_cp.cu
 * (context-parallel: rows at global positions, block-major) share: the tile shape, the rounding of an operand
 * in bf16 mode, the staging of two operands' rows into shared tiles, the lane-owned accumulator rows, the
 * online-softmax step of a forward row, the limits and shared-memory opt-in of a launch, and the choice of the
 * instantiation for a head size. Every helper is inlined and keeps the order of a kernel's arithmetic (each
 * accumulator takes the same operations in the same order as when written out in the kernel), so results are
 * bit for bit those of the kernel written out. Private to the two files (everything here has internal
 * linkage). */
#ifndef FSDP_KERNELS_CUDA_ATTENTION_TILES_CUH
#define FSDP_KERNELS_CUDA_ATTENTION_TILES_CUH

#include <math.h>
#include <stddef.h>

#include <type_traits>

#include "kernels/cuda/cuda_common.h"

#define ATT_TILE 32 /* rows (keys or queries) per shared tile = lanes per warp */
#define ATT_WARPS 8
#define ATT_ROWS_PER_WARP (ATT_TILE / ATT_WARPS)
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_MAX_HS 256
#define ATT_FULL 0xffffffffu

/* x as an operand of a product in the mode: rounded to bf16 and back with BF16, else as it is. */
template <bool BF16> static __device__ __forceinline__ float att_op(float x)
{
    return BF16 ? dtype_bf16_to_f32(dtype_f32_to_bf16(x)) : x;
}

/* One operand of a staged tile: the shared tile (row stride ld: hs, or hs + 1 for a tile that a lane reads a
 * row of, so the 32 lanes hit 32 banks) and where its rows come from (row i at src + i * ld_src). */
struct att_operand {
    float *tile;
    int ld;
    const float *src;
    size_t ld_src;
};

/* Stages one tile of x and, with PAIR, y: tile row r, head dimension d < hs takes element d of the source row
 * that row(r, &i) names, rounded as an operand in the mode, or 0 when row(r, &i) says the tile row is past the
 * end. The block's threads share the work; the caller syncs. (PAIR is a template parameter, not a test of y:
 * a branch in the loop keeps the compiler from specialising the kernels' tile loops as it does without it.) */
template <bool BF16, bool PAIR, typename Row>
static __device__ __forceinline__ void att_stage_tiles(int hs, Row row, att_operand x, att_operand y)
{
    for (int idx = threadIdx.x; idx < ATT_TILE * hs; idx += ATT_THREADS) {
        const int r = idx / hs, d = idx % hs;
        size_t i = 0;
        const bool in = row(r, &i);
        /* r * ld + d, written so that a tile of stride hs stores at idx and one of hs + 1 at idx + r */
        x.tile[idx + r * (x.ld - hs)] = in ? att_op<BF16>(x.src[i * x.ld_src + d]) : 0.0f;
        if (PAIR)
            y.tile[idx + r * (y.ld - hs)] = in ? att_op<BF16>(y.src[i * y.ld_src + d]) : 0.0f;
    }
}

template <bool BF16, typename Row> static __device__ __forceinline__ void att_stage(int hs, Row row, att_operand x)
{
    att_stage_tiles<BF16, false>(hs, row, x, x);
}

template <bool BF16, typename Row>
static __device__ __forceinline__ void att_stage(int hs, Row row, att_operand x, att_operand y)
{
    att_stage_tiles<BF16, true>(hs, row, x, y);
}

/* Lane d owns head dimensions d, d + 32, ... (DPL of them) of a row held in registers: acc += coef * row. */
template <int DPL>
static __device__ __forceinline__ void att_lane_axpy(float (&acc)[DPL], float coef, const float *row, int hs)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hs)
            acc[i] += coef * row[d];
    }
}

/* Two register rows at once, dimension by dimension (backward's dV += P^T dO and dK += dS^T Q): a += ca * ra,
 * b += cb * rb. */
template <int DPL>
static __device__ __forceinline__ void att_lane_axpy2(float (&a)[DPL], float ca, const float *ra, float (&b)[DPL],
                                                      float cb, const float *rb, int hs)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hs) {
            a[i] += ca * ra[d];
            b[i] += cb * rb[d];
        }
    }
}

/* The lane's head dimensions of a register row added into a global row g. */
template <int DPL> static __device__ __forceinline__ void att_lane_add(float *g, const float (&acc)[DPL], int hs)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hs)
            g[d] += acc[i];
    }
}

/* The lane's head dimensions of a register row, times inv, stored into a global row g. */
template <int DPL>
static __device__ __forceinline__ void att_lane_store(float *g, const float (&acc)[DPL], float inv, int hs,
                                                      bool lp = false)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hs)
            cuda_act_store(g, d, acc[i] * inv, lp);
    }
}

/* s = x . y over hs elements and, in backward, dp = u . w in the same pass (one loop over shared memory). */
static __device__ __forceinline__ float att_dot(const float *x, const float *y, int hs)
{
    float s = 0.0f;
    for (int d = 0; d < hs; d++)
        s += x[d] * y[d];
    return s;
}

static __device__ __forceinline__ void att_dot2(float *s, float *dp, const float *x, const float *y, const float *u,
                                                const float *w, int hs)
{
    float a = 0.0f, b = 0.0f;
    for (int d = 0; d < hs; d++) {
        a += x[d] * y[d];
        b += u[d] * w[d];
    }
    *s = a;
    *dp = b;
}

/* One key tile of a forward row's online softmax, the warp's lanes holding the scores s of its keys (valid:
 * visible; some lane is): the new running max m and sum l (of the unrounded probabilities), the output row o
 * rescaled to the new max; returns the lane's probability exp(s - m), 0 where not valid. */
template <int DPL>
static __device__ __forceinline__ float att_softmax_step(float s, bool valid, float &m, float &l, float (&o)[DPL])
{
    const float mx = cuda_warp_max(valid ? s : -INFINITY); /* finite: some lane is valid */
    const float m_new = fmaxf(m, mx);
    const float p = valid ? __expf(s - m_new) : 0.0f;
    const float alpha = __expf(m - m_new); /* 0 on the row's first tile, where m is -inf */
    l = l * alpha + cuda_warp_sum(p);
    m = m_new;
#pragma unroll
    for (int i = 0; i < DPL; i++)
        o[i] *= alpha;
    return p;
}

/* D = dO . O of one query row, the warp's lanes striding over the head (dO rounded as dP = dO V^T reads it, so
 * the dS of a row still sum to about 0; O the forward's output as it is); every lane gets the sum. */
template <bool BF16>
static __device__ __forceinline__ float att_warp_rowdot(const float *dout, const float *out, int hs, bool lp = false)
{
    float s = 0.0f;
    for (int d = threadIdx.x & 31; d < hs; d += 32)
        s += att_op<BF16>(dout[d]) * cuda_act_load(out, d, lp);
    return cuda_warp_sum(s);
}

/* The limits of these kernels: the head size, and b*nh blocks in the grid's y. */
static inline int att_check_limits(const char *op, int hs, long pairs)
{
    if (hs > ATT_MAX_HS)
        return error_set(FSDP_EUNSUPPORTED, "kernels cuda: %s: head size %d is above the supported %d", op, hs,
                         ATT_MAX_HS);
    if (pairs > 65535)
        return error_set(FSDP_EUNSUPPORTED, "kernels cuda: %s: b*nh = %ld is above 65535 (grid limit)", op, pairs);
    return 0;
}

static inline int att_check_window(const char *op, int window)
{
    if (window < 0)
        return error_set(FSDP_EINVAL, "kernels cuda: %s: window %d must be >= 0 (0 = full causal attention)", op,
                         window);
    return 0;
}

/* Before a launch of kern with smem bytes of dynamic shared memory: refused above what the device allows, and
 * opted in above the 48 KiB default. */
template <typename K> static int att_prepare(const char *op, K kern, size_t smem)
{
    if (smem > (size_t)cuda_ctx.smem_optin)
        return error_set(FSDP_EUNSUPPORTED, "kernels cuda: %s: needs %zu bytes of shared memory per block, the "
                         "device allows %d", op, smem, cuda_ctx.smem_optin);
    if (smem > 48 * 1024)
        return cuda_check(op, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return 0;
}

/* launch(std::integral_constant<int, DPL>()) for the head size: DPL = ceil(hs / 32) rounded up to 1, 2, 4 or 8,
 * the lanes' share of a register row. */
template <typename F> static int att_by_head_size(int hs, F launch)
{
    if (hs <= 32)
        return launch(std::integral_constant<int, 1>());
    if (hs <= 64)
        return launch(std::integral_constant<int, 2>());
    if (hs <= 128)
        return launch(std::integral_constant<int, 4>());
    return launch(std::integral_constant<int, 8>());
}

#endif

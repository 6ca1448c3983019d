/* Context-parallel causal attention on CUDA: a rank's query rows (at their global positions) against the
 * keys and values of the whole sequence, masked by position (key j is visible to query i when
 * kpos[j] <= qpos[i]), with grouped-query heads and the block-major rows of an all-gather or all-to-all read
 * in place (kernels.h, struct kernels_attention_cp). The same scheme as attention.cu, on CUDA cores, in fp32
 * or, in bf16 mode (set_matmul_dtype(bf16)), on operands rounded as attention.cu rounds them (below):
 *
 * - Tiles of 32 query rows by 32 key rows. A block of 8 warps owns 32 rows, 4 per warp; per tile it stages
 *   32 rows of K and V (forward, dQ) or of Q and dO (dK/dV) in shared memory, lane j computes the score of
 *   the tile's row j against the warp's row (padded shared rows, stride hs+1: no bank conflicts), the warp
 *   keeps the online softmax (running max and sum) with shuffles, and lane d accumulates head dimensions
 *   d, d+32, ... (DPL = ceil(hs/32)) in registers. hs up to 256.
 * - Positions need not be increasing (load-balanced chunks r and 2C-1-r), so a tile is skipped when every
 *   key in it comes after every query in the query tile (every warp computes the same min/max, so the
 *   whole block skips together), and a row of a tile with no visible key is skipped by its warp.
 * - A query row that sees no key gets lse = -inf and out 0; backward skips it (its probabilities are 0).
 * - Backward is deterministic without atomics: D = rowsum(dO * O) into scratch, then dQ (blocks over query
 *   tiles, looping over key tiles) and dK/dV (blocks over key tiles of one key/value head, looping over the
 *   query heads of its group and their query tiles); each recomputes P from q, k and lse, and every
 *   gradient element is written by one thread in a fixed order.
 * - bf16 mode: the numbers of attention.cu's and the CPU's bf16 attention (kernels/cpu/attention_cp.c), up to
 *   summation order. q, k, v and dO are rounded to bf16 as they are staged (a score is a sum of exact
 *   products of rounded values, accumulated in fp32); the softmax statistics (running max and sum, lse, D)
 *   stay fp32, the sum l adding the unrounded probabilities; P and dS (computed from the unrounded P) are
 *   rounded once more only as the operands of P V, P^T dO, dS K and dS^T Q; D = rowsum(dO O) takes the
 *   rounded dO (the one dP = dO V^T reads) and the forward's O as it is. Rounding is common/dtype.h's
 *   (nearest even, bit for bit the CPU's). The mode is a template parameter (BF16) chosen at launch from
 *   cuda_ctx.matmul_dtype: the fp32 kernels are the same code as without it. fp16 mode computes in fp32, as
 *   attention.cu does. */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define CP_TILE 32 /* rows per tile = lanes per warp */
#define CP_WARPS 8
#define CP_ROWS (CP_TILE / CP_WARPS)
#define CP_THREADS (CP_WARPS * 32)
#define CP_MAX_HS 256
#define CP_FULL 0xffffffffu

/* The call's shapes with the defaults resolved (qblock, kblock, nkv, ldkv never 0 here). */
struct cp_shape {
    int b, tq, tk, c, nh, nkv, group, hs, ld, ldkv, qblock, kblock;
    int window; /* sliding window (kernels.h); 0 = full causal */
    float scale;
};

/* Key at position kp is visible to the query at qp: causal, and inside the window (w > 0); the difference in
 * 64 bits, as qp may be the INT_MIN of a padding row. */
__device__ __forceinline__ bool cp_visible(int kp, int qp, int w)
{
    return kp <= qp && (w <= 0 || (long long)qp - kp < w);
}

/* x as an operand of a product in the mode: rounded to bf16 and back with BF16, else as it is (attention.cu's
 * att_op). */
template <bool BF16> __device__ __forceinline__ float cp_op(float x)
{
    return BF16 ? dtype_bf16_to_f32(dtype_f32_to_bf16(x)) : x;
}

/* Row of element i of sequence bb in a layout of blocks of blk rows (kernels.h). */
__device__ __forceinline__ size_t cp_row(int bb, int i, int blk, int b)
{
    return ((size_t)(i / blk) * b + bb) * blk + i % blk;
}

__device__ __forceinline__ int cp_warp_min(int x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = min(x, __shfl_xor_sync(CP_FULL, x, o));
    return x;
}

__device__ __forceinline__ int cp_warp_max(int x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = max(x, __shfl_xor_sync(CP_FULL, x, o));
    return x;
}

/* Forward: grid (query tiles, b*nh). */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(CP_THREADS)
    cp_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v, const int *qpos,
                      const int *kpos, cp_shape s)
{
    extern __shared__ float sm[];
    const int hs = s.hs, hp = hs + 1;
    float *qs = sm, *ks = qs + CP_TILE * hs, *vs = ks + CP_TILE * hp;
    const int pair = blockIdx.y, bb = pair / s.nh, h = pair % s.nh, kh = h / s.group;
    const int i0 = blockIdx.x * CP_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int idx = threadIdx.x; idx < CP_TILE * hs; idx += CP_THREADS) {
        const int r = idx / hs, d = idx % hs, i = i0 + r;
        qs[idx] = i < s.tq ? cp_op<BF16>(q[cp_row(bb, i, s.qblock, s.b) * s.ld + (size_t)h * hs + d]) : 0.0f;
    }
    /* the latest query position of the tile: every warp computes the same value */
    const int qmax = cp_warp_max(i0 + lane < s.tq ? qpos[i0 + lane] : INT_MIN);
    int qp[CP_ROWS];
    float m[CP_ROWS], l[CP_ROWS], o[CP_ROWS][DPL];
#pragma unroll
    for (int rr = 0; rr < CP_ROWS; rr++) {
        const int i = i0 + warp * CP_ROWS + rr;
        qp[rr] = i < s.tq ? qpos[i] : INT_MIN;
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int x = 0; x < DPL; x++)
            o[rr][x] = 0.0f;
    }
    for (int j0 = 0; j0 < s.tk; j0 += CP_TILE) {
        const int kp = j0 + lane < s.tk ? kpos[j0 + lane] : INT_MAX; /* lane's key in this tile */
        if (cp_warp_min(kp) > qmax)
            continue; /* block-uniform: no query of the tile sees a key of it */
        __syncthreads(); /* the previous tile is no longer read */
        for (int idx = threadIdx.x; idx < CP_TILE * hs; idx += CP_THREADS) {
            const int r = idx / hs, d = idx % hs, j = j0 + r;
            float kx = 0.0f, vx = 0.0f;
            if (j < s.tk) {
                const size_t off = cp_row(bb, j, s.kblock, s.b) * s.ldkv + (size_t)kh * hs + d;
                kx = cp_op<BF16>(k[off]);
                vx = cp_op<BF16>(v[off]);
            }
            ks[r * hp + d] = kx;
            vs[r * hs + d] = vx;
        }
        __syncthreads();
        const int nj = min(CP_TILE, s.tk - j0);
#pragma unroll
        for (int rr = 0; rr < CP_ROWS; rr++) {
            const int r = warp * CP_ROWS + rr;
            const bool valid = cp_visible(kp, qp[rr], s.window); /* false for the padding rows of both tiles */
            if (!__any_sync(CP_FULL, valid))
                continue; /* warp-uniform */
            const float *qrow = qs + r * hs, *krow = ks + lane * hp;
            float sc = 0.0f;
            for (int d = 0; d < hs; d++)
                sc += qrow[d] * krow[d];
            sc *= s.scale;
            const float mx = cuda_warp_max(valid ? sc : -INFINITY); /* finite: some lane is valid */
            const float m_new = fmaxf(m[rr], mx);
            const float p = valid ? __expf(sc - m_new) : 0.0f;
            const float alpha = __expf(m[rr] - m_new); /* 0 while m is -inf */
            l[rr] = l[rr] * alpha + cuda_warp_sum(p); /* the unrounded p */
            m[rr] = m_new;
#pragma unroll
            for (int x = 0; x < DPL; x++)
                o[rr][x] *= alpha;
            const float pv = cp_op<BF16>(p); /* P as the operand of P V */
            for (int j = 0; j < nj; j++) {
                const float pj = __shfl_sync(CP_FULL, pv, j);
                if (pj == 0.0f)
                    continue; /* warp-uniform: masked key (or a term that adds 0) */
#pragma unroll
                for (int x = 0; x < DPL; x++) {
                    const int d = lane + 32 * x;
                    if (d < hs)
                        o[rr][x] += pj * vs[j * hs + d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < CP_ROWS; rr++) {
        const int i = i0 + warp * CP_ROWS + rr;
        if (i >= s.tq)
            continue;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        float *orow = out + cp_row(bb, i, s.qblock, s.b) * s.c + (size_t)h * hs;
#pragma unroll
        for (int x = 0; x < DPL; x++) {
            const int d = lane + 32 * x;
            if (d < hs)
                orow[d] = o[rr][x] * inv;
        }
        if (lane == 0)
            lse[(size_t)pair * s.tq + i] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    }
}

/* D[(bb*nh + h)*tq + i] = dO_i . O_i of head h, one warp per (pair, query row); in bf16 mode dO rounded as
 * dP = dO V^T reads it (so the dS of a row still sum to about 0), O the forward's output as it is. */
template <bool BF16>
__global__ void cp_rowdot_kernel(float *dsum, const float *dout, const float *out, cp_shape s)
{
    const int lane = threadIdx.x & 31;
    const size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5, total = (size_t)s.b * s.nh * s.tq;
    if (w >= total)
        return;
    const int i = (int)(w % s.tq), pair = (int)(w / s.tq), bb = pair / s.nh, h = pair % s.nh;
    const size_t off = cp_row(bb, i, s.qblock, s.b) * s.c + (size_t)h * s.hs;
    float acc = 0.0f;
    for (int d = lane; d < s.hs; d += 32)
        acc += cp_op<BF16>(dout[off + d]) * out[off + d];
    acc = cuda_warp_sum(acc);
    if (lane == 0)
        dsum[w] = acc;
}

/* dQ: grid (query tiles, b*nh), looping over key tiles as forward does. */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(CP_THREADS)
    cp_backward_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
                          const float *lse, const float *dsum, const int *qpos, const int *kpos, cp_shape s)
{
    extern __shared__ float sm[];
    const int hs = s.hs, hp = hs + 1;
    float *qs = sm, *dos = qs + CP_TILE * hs, *ks = dos + CP_TILE * hs, *vs = ks + CP_TILE * hp;
    const int pair = blockIdx.y, bb = pair / s.nh, h = pair % s.nh, kh = h / s.group;
    const int i0 = blockIdx.x * CP_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int idx = threadIdx.x; idx < CP_TILE * hs; idx += CP_THREADS) {
        const int r = idx / hs, d = idx % hs, i = i0 + r;
        float qx = 0.0f, dx = 0.0f;
        if (i < s.tq) {
            const size_t row = cp_row(bb, i, s.qblock, s.b);
            qx = cp_op<BF16>(q[row * s.ld + (size_t)h * hs + d]);
            dx = cp_op<BF16>(dout[row * s.c + (size_t)h * hs + d]);
        }
        qs[idx] = qx;
        dos[idx] = dx;
    }
    /* a row that saw no key (lse -inf) takes part in nothing: its position becomes INT_MIN */
    const int il = i0 + lane;
    const int qmax = cp_warp_max(il < s.tq && lse[(size_t)pair * s.tq + il] != -INFINITY ? qpos[il] : INT_MIN);
    int qp[CP_ROWS];
    float dqa[CP_ROWS][DPL], row_lse[CP_ROWS], row_d[CP_ROWS];
#pragma unroll
    for (int rr = 0; rr < CP_ROWS; rr++) {
        const int i = i0 + warp * CP_ROWS + rr;
        row_lse[rr] = i < s.tq ? lse[(size_t)pair * s.tq + i] : -INFINITY;
        row_d[rr] = i < s.tq ? dsum[(size_t)pair * s.tq + i] : 0.0f;
        qp[rr] = i < s.tq && row_lse[rr] != -INFINITY ? qpos[i] : INT_MIN;
#pragma unroll
        for (int x = 0; x < DPL; x++)
            dqa[rr][x] = 0.0f;
    }
    for (int j0 = 0; j0 < s.tk; j0 += CP_TILE) {
        const int kp = j0 + lane < s.tk ? kpos[j0 + lane] : INT_MAX;
        if (cp_warp_min(kp) > qmax)
            continue; /* block-uniform */
        __syncthreads();
        for (int idx = threadIdx.x; idx < CP_TILE * hs; idx += CP_THREADS) {
            const int r = idx / hs, d = idx % hs, j = j0 + r;
            float kx = 0.0f, vx = 0.0f;
            if (j < s.tk) {
                const size_t off = cp_row(bb, j, s.kblock, s.b) * s.ldkv + (size_t)kh * hs + d;
                kx = cp_op<BF16>(k[off]);
                vx = cp_op<BF16>(v[off]);
            }
            ks[r * hp + d] = kx;
            vs[r * hp + d] = vx;
        }
        __syncthreads();
        const int nj = min(CP_TILE, s.tk - j0);
#pragma unroll
        for (int rr = 0; rr < CP_ROWS; rr++) {
            const int r = warp * CP_ROWS + rr;
            const bool valid = cp_visible(kp, qp[rr], s.window);
            if (!__any_sync(CP_FULL, valid))
                continue; /* warp-uniform */
            const float *qrow = qs + r * hs, *dorow = dos + r * hs, *krow = ks + lane * hp, *vrow = vs + lane * hp;
            float sc = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                sc += qrow[d] * krow[d];
                dp += dorow[d] * vrow[d];
            }
            const float p = valid ? __expf(sc * s.scale - row_lse[rr]) : 0.0f;
            const float ds = cp_op<BF16>(p * (dp - row_d[rr]) * s.scale); /* from the unrounded p */
            for (int j = 0; j < nj; j++) {
                const float dsj = __shfl_sync(CP_FULL, ds, j);
                if (dsj == 0.0f)
                    continue; /* warp-uniform */
#pragma unroll
                for (int x = 0; x < DPL; x++) {
                    const int d = lane + 32 * x;
                    if (d < hs)
                        dqa[rr][x] += dsj * ks[j * hp + d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < CP_ROWS; rr++) {
        const int i = i0 + warp * CP_ROWS + rr;
        if (i >= s.tq)
            continue;
        float *g = dq + cp_row(bb, i, s.qblock, s.b) * s.ld + (size_t)h * hs;
#pragma unroll
        for (int x = 0; x < DPL; x++) {
            const int d = lane + 32 * x;
            if (d < hs)
                g[d] += dqa[rr][x];
        }
    }
}

/* dK and dV: grid (key tiles, b*nkv); a block owns 32 key rows of one key/value head and loops over the
 * query heads of its group and their query tiles (those with a query at or after the tile's first key). */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(CP_THREADS)
    cp_backward_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                           const float *lse, const float *dsum, const int *qpos, const int *kpos, cp_shape s)
{
    extern __shared__ float sm[];
    const int hs = s.hs, hp = hs + 1;
    float *kb = sm, *vb = kb + CP_TILE * hs, *qt = vb + CP_TILE * hs, *dot = qt + CP_TILE * hp;
    float *lse_t = dot + CP_TILE * hp, *d_t = lse_t + CP_TILE;
    int *qp_t = (int *)(d_t + CP_TILE);
    const int bb = blockIdx.y / s.nkv, kh = blockIdx.y % s.nkv;
    const int j0 = blockIdx.x * CP_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int idx = threadIdx.x; idx < CP_TILE * hs; idx += CP_THREADS) {
        const int r = idx / hs, d = idx % hs, j = j0 + r;
        float kx = 0.0f, vx = 0.0f;
        if (j < s.tk) {
            const size_t off = cp_row(bb, j, s.kblock, s.b) * s.ldkv + (size_t)kh * hs + d;
            kx = cp_op<BF16>(k[off]);
            vx = cp_op<BF16>(v[off]);
        }
        kb[idx] = kx;
        vb[idx] = vx;
    }
    /* the earliest key position of the tile: every warp computes the same value */
    const int kmin = cp_warp_min(j0 + lane < s.tk ? kpos[j0 + lane] : INT_MAX);
    int kp[CP_ROWS];
    float dka[CP_ROWS][DPL], dva[CP_ROWS][DPL];
#pragma unroll
    for (int rr = 0; rr < CP_ROWS; rr++) {
        const int j = j0 + warp * CP_ROWS + rr;
        kp[rr] = j < s.tk ? kpos[j] : INT_MAX;
#pragma unroll
        for (int x = 0; x < DPL; x++)
            dka[rr][x] = dva[rr][x] = 0.0f;
    }
    for (int h = kh * s.group; h < (kh + 1) * s.group; h++) {
        const int pair = bb * s.nh + h;
        for (int i0 = 0; i0 < s.tq; i0 += CP_TILE) {
            const int il = i0 + lane;
            const float L = il < s.tq ? lse[(size_t)pair * s.tq + il] : -INFINITY;
            const int qpl = L != -INFINITY ? qpos[il] : INT_MIN; /* padding and rows that saw no key */
            if (cp_warp_max(qpl) < kmin)
                continue; /* block-uniform */
            __syncthreads(); /* the previous query tile is no longer read */
            for (int idx = threadIdx.x; idx < CP_TILE * hs; idx += CP_THREADS) {
                const int r = idx / hs, d = idx % hs, i = i0 + r;
                float qx = 0.0f, dx = 0.0f;
                if (i < s.tq) {
                    const size_t row = cp_row(bb, i, s.qblock, s.b);
                    qx = cp_op<BF16>(q[row * s.ld + (size_t)h * hs + d]);
                    dx = cp_op<BF16>(dout[row * s.c + (size_t)h * hs + d]);
                }
                qt[r * hp + d] = qx;
                dot[r * hp + d] = dx;
            }
            if (threadIdx.x < CP_TILE) { /* warp 0: lane = threadIdx.x */
                lse_t[lane] = L;
                d_t[lane] = il < s.tq ? dsum[(size_t)pair * s.tq + il] : 0.0f;
                qp_t[lane] = qpl;
            }
            __syncthreads();
            const int nq = min(CP_TILE, s.tq - i0);
#pragma unroll
            for (int rr = 0; rr < CP_ROWS; rr++) {
                const int r = warp * CP_ROWS + rr;
                const bool valid = cp_visible(kp[rr], qp_t[lane], s.window); /* lane's query sees this row's key */
                if (!__any_sync(CP_FULL, valid))
                    continue; /* warp-uniform */
                const float *krow = kb + r * hs, *vrow = vb + r * hs, *qrow = qt + lane * hp, *dorow = dot + lane * hp;
                float sc = 0.0f, dp = 0.0f;
                for (int d = 0; d < hs; d++) {
                    sc += qrow[d] * krow[d];
                    dp += dorow[d] * vrow[d];
                }
                const float p = valid ? __expf(sc * s.scale - lse_t[lane]) : 0.0f;
                /* dS from the unrounded p; both rounded only as operands of P^T dO and dS^T Q */
                const float ds = cp_op<BF16>(p * (dp - d_t[lane]) * s.scale), pv = cp_op<BF16>(p);
                for (int jq = 0; jq < nq; jq++) {
                    const float pj = __shfl_sync(CP_FULL, pv, jq), dsj = __shfl_sync(CP_FULL, ds, jq);
                    if (pj == 0.0f && dsj == 0.0f)
                        continue; /* warp-uniform */
#pragma unroll
                    for (int x = 0; x < DPL; x++) {
                        const int d = lane + 32 * x;
                        if (d < hs) {
                            dva[rr][x] += pj * dot[jq * hp + d];
                            dka[rr][x] += dsj * qt[jq * hp + d];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < CP_ROWS; rr++) {
        const int j = j0 + warp * CP_ROWS + rr;
        if (j >= s.tk)
            continue;
        const size_t off = cp_row(bb, j, s.kblock, s.b) * s.ldkv + (size_t)kh * hs;
#pragma unroll
        for (int x = 0; x < DPL; x++) {
            const int d = lane + 32 * x;
            if (d < hs) {
                dk[off + d] += dka[rr][x];
                dv[off + d] += dva[rr][x];
            }
        }
    }
}

/* The CPU backend's checks (kernels/cpu/attention_cp.c), and the limits of these kernels. */
static int cp_check(const char *op, const struct kernels_attention_cp *a, cp_shape *s)
{
    int nkv = a->nkv ? a->nkv : a->nh;
    bool bad_kv = nkv < 1 || a->nh < 1 || a->nh % nkv != 0 || a->c < 1 || a->c % a->nh != 0 ||
                  (a->ldkv && a->ldkv < nkv * (a->c / a->nh));
    if (a->b < 1 || a->tq < 0 || a->tk < 0 || a->c < 1 || a->nh < 1 || a->c % a->nh != 0 || a->ld < a->c ||
        bad_kv || a->ldkv < 0 || a->qblock < 0 || a->kblock < 0 || (a->qblock && a->tq % a->qblock) ||
        (a->kblock && a->tk % a->kblock) || (a->tq && !a->qpos) || (a->tk && !a->kpos))
        return error_set(FSDP_EINVAL,
                         "kernels cuda: %s: bad shape b=%d tq=%d tk=%d c=%d nh=%d nkv=%d ld=%d ldkv=%d qblock=%d "
                         "kblock=%d",
                         op, a->b, a->tq, a->tk, a->c, a->nh, a->nkv, a->ld, a->ldkv, a->qblock, a->kblock);
    if (a->window < 0)
        return error_set(FSDP_EINVAL, "kernels cuda: %s: window %d must be >= 0 (0 = full causal attention)", op,
                         a->window);
    if (a->c / a->nh > CP_MAX_HS)
        return error_set(FSDP_EUNSUPPORTED, "kernels cuda: %s: head size %d is above the supported %d", op,
                         a->c / a->nh, CP_MAX_HS);
    if ((long)a->b * a->nh > 65535)
        return error_set(FSDP_EUNSUPPORTED, "kernels cuda: %s: b*nh = %ld is above 65535 (grid limit)", op,
                         (long)a->b * a->nh);
    s->b = a->b;
    s->tq = a->tq;
    s->tk = a->tk;
    s->c = a->c;
    s->nh = a->nh;
    s->nkv = nkv;
    s->group = a->nh / nkv;
    s->hs = a->c / a->nh;
    s->ld = a->ld;
    s->ldkv = a->ldkv ? a->ldkv : a->ld;
    s->qblock = a->qblock ? a->qblock : (a->tq ? a->tq : 1);
    s->kblock = a->kblock ? a->kblock : (a->tk ? a->tk : 1);
    s->window = a->window;
    s->scale = 1.0f / sqrtf((float)s->hs);
    return 0;
}

/* Opts in to more than the default 48 KiB of dynamic shared memory where a kernel needs it. */
template <typename K> static int cp_prepare(const char *op, K kern, size_t smem)
{
    if (smem > (size_t)cuda_ctx.smem_optin)
        return error_set(FSDP_EUNSUPPORTED, "kernels cuda: %s: needs %zu bytes of shared memory per block, the "
                         "device allows %d", op, smem, cuda_ctx.smem_optin);
    if (smem > 48 * 1024)
        return cuda_check(op, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return 0;
}

template <int DPL, bool BF16>
static int cp_forward_launch(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *qpos, const int *kpos, const cp_shape &s)
{
    const char *op = "attention_cp_forward";
    size_t smem = (size_t)CP_TILE * (2 * s.hs + s.hs + 1) * sizeof(float);
    FSDP_TRY(cp_prepare(op, cp_forward_kernel<DPL, BF16>, smem));
    dim3 grid((s.tq + CP_TILE - 1) / CP_TILE, s.b * s.nh);
    cp_forward_kernel<DPL, BF16><<<grid, CP_THREADS, smem, cuda_ctx.stream>>>(out, lse, q, k, v, qpos, kpos, s);
    return cuda_check_launch(op);
}

template <int DPL, bool BF16>
static int cp_backward_launch(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *lse, const float *dsum, const int *qpos, const int *kpos,
                              const cp_shape &s)
{
    size_t smem_dq = (size_t)CP_TILE * (2 * s.hs + 2 * (s.hs + 1)) * sizeof(float);
    size_t smem_dkv = (size_t)CP_TILE * (2 * s.hs + 2 * (s.hs + 1) + 3) * sizeof(float);
    FSDP_TRY(cp_prepare("attention_cp_backward dq", cp_backward_dq_kernel<DPL, BF16>, smem_dq));
    FSDP_TRY(cp_prepare("attention_cp_backward dk/dv", cp_backward_dkv_kernel<DPL, BF16>, smem_dkv));
    dim3 grid((s.tq + CP_TILE - 1) / CP_TILE, s.b * s.nh), grid_kv((s.tk + CP_TILE - 1) / CP_TILE, s.b * s.nkv);
    cp_backward_dq_kernel<DPL, BF16><<<grid, CP_THREADS, smem_dq, cuda_ctx.stream>>>(dq, dout, q, k, v, lse, dsum,
                                                                                     qpos, kpos, s);
    FSDP_TRY(cuda_check_launch("attention_cp_backward dq"));
    cp_backward_dkv_kernel<DPL, BF16><<<grid_kv, CP_THREADS, smem_dkv, cuda_ctx.stream>>>(dk, dv, dout, q, k, v, lse,
                                                                                          dsum, qpos, kpos, s);
    return cuda_check_launch("attention_cp_backward dk/dv");
}

/* The instantiation for the head size (DPL = ceil(hs / 32) rounded up to 1, 2, 4 or 8). */
template <bool BF16>
static int cp_forward_hs(float *out, float *lse, const float *q, const float *k, const float *v, const int *qpos,
                         const int *kpos, const cp_shape &s)
{
    if (s.hs <= 32)
        return cp_forward_launch<1, BF16>(out, lse, q, k, v, qpos, kpos, s);
    if (s.hs <= 64)
        return cp_forward_launch<2, BF16>(out, lse, q, k, v, qpos, kpos, s);
    if (s.hs <= 128)
        return cp_forward_launch<4, BF16>(out, lse, q, k, v, qpos, kpos, s);
    return cp_forward_launch<8, BF16>(out, lse, q, k, v, qpos, kpos, s);
}

template <bool BF16>
static int cp_backward_hs(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                          const float *v, const float *out, const float *lse, float *dsum, const int *qpos,
                          const int *kpos, const cp_shape &s)
{
    size_t rows = (size_t)s.b * s.nh * s.tq;
    cp_rowdot_kernel<BF16><<<(unsigned)((rows * 32 + CUDA_THREADS - 1) / CUDA_THREADS), CUDA_THREADS, 0,
                             cuda_ctx.stream>>>(dsum, dout, out, s);
    FSDP_TRY(cuda_check_launch("attention_cp_backward (rowdot)"));
    if (s.hs <= 32)
        return cp_backward_launch<1, BF16>(dq, dk, dv, dout, q, k, v, lse, dsum, qpos, kpos, s);
    if (s.hs <= 64)
        return cp_backward_launch<2, BF16>(dq, dk, dv, dout, q, k, v, lse, dsum, qpos, kpos, s);
    if (s.hs <= 128)
        return cp_backward_launch<4, BF16>(dq, dk, dv, dout, q, k, v, lse, dsum, qpos, kpos, s);
    return cp_backward_launch<8, BF16>(dq, dk, dv, dout, q, k, v, lse, dsum, qpos, kpos, s);
}

int cuda_attention_cp_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              const struct kernels_attention_cp *a)
{
    cp_shape s;
    FSDP_TRY(cp_check("attention_cp_forward", a, &s));
    if (s.tq == 0)
        return 0;
    if (!out || !lse || !q || (s.tk && (!k || !v)))
        return error_set(FSDP_EINVAL, "kernels cuda: attention_cp_forward: NULL tensor");
    if (cuda_ctx.matmul_dtype == DTYPE_BF16)
        return cp_forward_hs<true>(out, lse, q, k, v, a->qpos, a->kpos, s);
    return cp_forward_hs<false>(out, lse, q, k, v, a->qpos, a->kpos, s);
}

int cuda_attention_cp_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, const float *out, const float *lse,
                               const struct kernels_attention_cp *a)
{
    const char *op = "attention_cp_backward";
    cp_shape s;
    FSDP_TRY(cp_check(op, a, &s));
    if (s.tq == 0 || s.tk == 0)
        return 0;
    if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse)
        return error_set(FSDP_EINVAL, "kernels cuda: attention_cp_backward: NULL tensor");
    /* D = rowsum(dO * O) per (sequence, head, query row), in the table's scratch (valid for the work queued
     * until the next scratch user, i.e. these three kernels) */
    void *ws;
    FSDP_TRY(cuda_scratch(op, &ws, (size_t)s.b * s.nh * s.tq * sizeof(float)));
    float *dsum = (float *)ws;
    /* the mode now, as attention_backward: a step's forward and backward run in the same one */
    if (cuda_ctx.matmul_dtype == DTYPE_BF16)
        return cp_backward_hs<true>(dq, dk, dv, dout, q, k, v, out, lse, dsum, a->qpos, a->kpos, s);
    return cp_backward_hs<false>(dq, dk, dv, dout, q, k, v, out, lse, dsum, a->qpos, a->kpos, s);
}

/* Context-parallel causal attention on CUDA: a rank's query rows (at their global positions) against the
 * keys and values of the whole sequence, masked by position (key j is visible to query i when
 * kpos[j] <= qpos[i]), with grouped-query heads and the block-major rows of an all-gather or all-to-all read
 * in place (kernels.h, struct kernels_attention_cp). The same scheme as attention.cu, on CUDA cores, in fp32
 * or, in bf16 mode (set_matmul_dtype(bf16)), on operands rounded as attention.cu rounds them (below); the tile
 * shape, the staging of tiles and the lane-owned register rows are attention_tiles.cuh's, shared with it:
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
#include "kernels/cuda/attention_tiles.cuh"

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

/* Row of element i of sequence bb in a layout of blocks of blk rows (kernels.h). */
__device__ __forceinline__ size_t cp_row(int bb, int i, int blk, int b)
{
    return ((size_t)(i / blk) * b + bb) * blk + i % blk;
}

/* The rows of a tile of elements i0, i0 + 1, ... of sequence bb (n of them, blocks of blk), for att_stage. */
struct cp_rows {
    int bb, i0, n, blk, b;
    __device__ __forceinline__ bool operator()(int r, size_t *row) const
    {
        const int i = i0 + r;
        if (i >= n)
            return false;
        *row = cp_row(bb, i, blk, b);
        return true;
    }
};

/* Key tile j0's rows of key/value head kh's K (padded: a lane reads a row) and V (row stride vld), staged
 * between the syncs that keep the previous tile's readers and this tile's writers apart. */
template <bool BF16>
__device__ __forceinline__ void cp_stage_keys(float *ks, float *vs, int vld, const float *k, const float *v,
                                              const cp_shape &s, int bb, int kh, int j0)
{
    __syncthreads(); /* the previous tile is no longer read */
    const size_t kvcol = (size_t)kh * s.hs;
    att_stage<BF16>(s.hs, cp_rows{bb, j0, s.tk, s.kblock, s.b}, att_operand{ks, s.hs + 1, k + kvcol, (size_t)s.ldkv},
                    att_operand{vs, vld, v + kvcol, (size_t)s.ldkv});
    __syncthreads();
}

__device__ __forceinline__ int cp_warp_min(int x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = min(x, __shfl_xor_sync(ATT_FULL, x, o));
    return x;
}

__device__ __forceinline__ int cp_warp_max(int x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = max(x, __shfl_xor_sync(ATT_FULL, x, o));
    return x;
}

/* Forward: grid (query tiles, b*nh). */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(ATT_THREADS)
    cp_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v, const int *qpos,
                      const int *kpos, cp_shape s)
{
    extern __shared__ float sm[];
    const int hs = s.hs, hp = hs + 1;
    float *qs = sm, *ks = qs + ATT_TILE * hs, *vs = ks + ATT_TILE * hp;
    const int pair = blockIdx.y, bb = pair / s.nh, h = pair % s.nh, kh = h / s.group;
    const int i0 = blockIdx.x * ATT_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    att_stage<BF16>(hs, cp_rows{bb, i0, s.tq, s.qblock, s.b}, att_operand{qs, hs, q + (size_t)h * hs, (size_t)s.ld});
    /* the latest query position of the tile: every warp computes the same value */
    const int qmax = cp_warp_max(i0 + lane < s.tq ? qpos[i0 + lane] : INT_MIN);
    int qp[ATT_ROWS_PER_WARP];
    float m[ATT_ROWS_PER_WARP], l[ATT_ROWS_PER_WARP], o[ATT_ROWS_PER_WARP][DPL] = {};
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int i = i0 + warp * ATT_ROWS_PER_WARP + rr;
        qp[rr] = i < s.tq ? qpos[i] : INT_MIN;
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
    }
    for (int j0 = 0; j0 < s.tk; j0 += ATT_TILE) {
        const int kp = j0 + lane < s.tk ? kpos[j0 + lane] : INT_MAX; /* lane's key in this tile */
        if (cp_warp_min(kp) > qmax)
            continue; /* block-uniform: no query of the tile sees a key of it */
        cp_stage_keys<BF16>(ks, vs, hs, k, v, s, bb, kh, j0);
        const int nj = min(ATT_TILE, s.tk - j0);
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
            const int r = warp * ATT_ROWS_PER_WARP + rr;
            const bool valid = cp_visible(kp, qp[rr], s.window); /* false for the padding rows of both tiles */
            if (!__any_sync(ATT_FULL, valid))
                continue; /* warp-uniform */
            const float sc = att_dot(qs + r * hs, ks + lane * hp, hs) * s.scale;
            const float p = att_softmax_step(sc, valid, m[rr], l[rr], o[rr]);
            const float pv = att_op<BF16>(p); /* P as the operand of P V */
            for (int j = 0; j < nj; j++) {
                const float pj = __shfl_sync(ATT_FULL, pv, j);
                if (pj != 0.0f) /* warp-uniform: a masked key (or a term that adds 0) is skipped */
                    att_lane_axpy(o[rr], pj, vs + j * hs, hs);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int i = i0 + warp * ATT_ROWS_PER_WARP + rr;
        if (i >= s.tq)
            continue;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        att_lane_store(out + cp_row(bb, i, s.qblock, s.b) * s.c + (size_t)h * hs, o[rr], inv, hs);
        if (lane == 0)
            lse[(size_t)pair * s.tq + i] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    }
}

/* D[(bb*nh + h)*tq + i] = dO_i . O_i of head h (att_warp_rowdot), one warp per (pair, query row). */
template <bool BF16>
__global__ void cp_rowdot_kernel(float *dsum, const float *dout, const float *out, cp_shape s)
{
    const int lane = threadIdx.x & 31;
    const size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5, total = (size_t)s.b * s.nh * s.tq;
    if (w >= total)
        return;
    const int i = (int)(w % s.tq), pair = (int)(w / s.tq), bb = pair / s.nh, h = pair % s.nh;
    const size_t off = cp_row(bb, i, s.qblock, s.b) * s.c + (size_t)h * s.hs;
    const float acc = att_warp_rowdot<BF16>(dout + off, out + off, s.hs);
    if (lane == 0)
        dsum[w] = acc;
}

/* dQ: grid (query tiles, b*nh), looping over key tiles as forward does. */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(ATT_THREADS)
    cp_backward_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
                          const float *lse, const float *dsum, const int *qpos, const int *kpos, cp_shape s)
{
    extern __shared__ float sm[];
    const int hs = s.hs, hp = hs + 1;
    float *qs = sm, *dos = qs + ATT_TILE * hs, *ks = dos + ATT_TILE * hs, *vs = ks + ATT_TILE * hp;
    const int pair = blockIdx.y, bb = pair / s.nh, h = pair % s.nh, kh = h / s.group;
    const int i0 = blockIdx.x * ATT_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    att_stage<BF16>(hs, cp_rows{bb, i0, s.tq, s.qblock, s.b}, att_operand{qs, hs, q + (size_t)h * hs, (size_t)s.ld},
                    att_operand{dos, hs, dout + (size_t)h * hs, (size_t)s.c});
    /* a row that saw no key (lse -inf) takes part in nothing: its position becomes INT_MIN */
    const int il = i0 + lane;
    const int qmax = cp_warp_max(il < s.tq && lse[(size_t)pair * s.tq + il] != -INFINITY ? qpos[il] : INT_MIN);
    int qp[ATT_ROWS_PER_WARP];
    float dqa[ATT_ROWS_PER_WARP][DPL] = {}, row_lse[ATT_ROWS_PER_WARP], row_d[ATT_ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int i = i0 + warp * ATT_ROWS_PER_WARP + rr;
        row_lse[rr] = i < s.tq ? lse[(size_t)pair * s.tq + i] : -INFINITY;
        row_d[rr] = i < s.tq ? dsum[(size_t)pair * s.tq + i] : 0.0f;
        qp[rr] = i < s.tq && row_lse[rr] != -INFINITY ? qpos[i] : INT_MIN;
    }
    for (int j0 = 0; j0 < s.tk; j0 += ATT_TILE) {
        const int kp = j0 + lane < s.tk ? kpos[j0 + lane] : INT_MAX;
        if (cp_warp_min(kp) > qmax)
            continue; /* block-uniform */
        cp_stage_keys<BF16>(ks, vs, hp, k, v, s, bb, kh, j0);
        const int nj = min(ATT_TILE, s.tk - j0);
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
            const int r = warp * ATT_ROWS_PER_WARP + rr;
            const bool valid = cp_visible(kp, qp[rr], s.window);
            if (!__any_sync(ATT_FULL, valid))
                continue; /* warp-uniform */
            float sc, dp;
            att_dot2(&sc, &dp, qs + r * hs, ks + lane * hp, dos + r * hs, vs + lane * hp, hs);
            const float p = valid ? __expf(sc * s.scale - row_lse[rr]) : 0.0f;
            const float ds = att_op<BF16>(p * (dp - row_d[rr]) * s.scale); /* from the unrounded p */
            for (int j = 0; j < nj; j++) {
                const float dsj = __shfl_sync(ATT_FULL, ds, j);
                if (dsj != 0.0f) /* warp-uniform */
                    att_lane_axpy(dqa[rr], dsj, ks + j * hp, hs);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int i = i0 + warp * ATT_ROWS_PER_WARP + rr;
        if (i < s.tq)
            att_lane_add(dq + cp_row(bb, i, s.qblock, s.b) * s.ld + (size_t)h * hs, dqa[rr], hs);
    }
}

/* dK and dV: grid (key tiles, b*nkv); a block owns 32 key rows of one key/value head and loops over the
 * query heads of its group and their query tiles (those with a query at or after the tile's first key). */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(ATT_THREADS)
    cp_backward_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                           const float *lse, const float *dsum, const int *qpos, const int *kpos, cp_shape s)
{
    extern __shared__ float sm[];
    const int hs = s.hs, hp = hs + 1;
    float *kb = sm, *vb = kb + ATT_TILE * hs, *qt = vb + ATT_TILE * hs, *dot = qt + ATT_TILE * hp;
    float *lse_t = dot + ATT_TILE * hp, *d_t = lse_t + ATT_TILE;
    int *qp_t = (int *)(d_t + ATT_TILE);
    const int bb = blockIdx.y / s.nkv, kh = blockIdx.y % s.nkv;
    const int j0 = blockIdx.x * ATT_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t kvcol = (size_t)kh * hs;

    att_stage<BF16>(hs, cp_rows{bb, j0, s.tk, s.kblock, s.b}, att_operand{kb, hs, k + kvcol, (size_t)s.ldkv},
                    att_operand{vb, hs, v + kvcol, (size_t)s.ldkv});
    /* the earliest key position of the tile: every warp computes the same value */
    const int kmin = cp_warp_min(j0 + lane < s.tk ? kpos[j0 + lane] : INT_MAX);
    int kp[ATT_ROWS_PER_WARP];
    float dka[ATT_ROWS_PER_WARP][DPL] = {}, dva[ATT_ROWS_PER_WARP][DPL] = {};
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int j = j0 + warp * ATT_ROWS_PER_WARP + rr;
        kp[rr] = j < s.tk ? kpos[j] : INT_MAX;
    }
    for (int h = kh * s.group; h < (kh + 1) * s.group; h++) {
        const int pair = bb * s.nh + h;
        for (int i0 = 0; i0 < s.tq; i0 += ATT_TILE) {
            const int il = i0 + lane;
            const float L = il < s.tq ? lse[(size_t)pair * s.tq + il] : -INFINITY;
            const int qpl = L != -INFINITY ? qpos[il] : INT_MIN; /* padding and rows that saw no key */
            if (cp_warp_max(qpl) < kmin)
                continue; /* block-uniform */
            __syncthreads(); /* the previous query tile is no longer read */
            att_stage<BF16>(hs, cp_rows{bb, i0, s.tq, s.qblock, s.b},
                            att_operand{qt, hp, q + (size_t)h * hs, (size_t)s.ld},
                            att_operand{dot, hp, dout + (size_t)h * hs, (size_t)s.c});
            if (threadIdx.x < ATT_TILE) { /* warp 0: lane = threadIdx.x */
                lse_t[lane] = L;
                d_t[lane] = il < s.tq ? dsum[(size_t)pair * s.tq + il] : 0.0f;
                qp_t[lane] = qpl;
            }
            __syncthreads();
            const int nq = min(ATT_TILE, s.tq - i0);
#pragma unroll
            for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
                const int r = warp * ATT_ROWS_PER_WARP + rr;
                const bool valid = cp_visible(kp[rr], qp_t[lane], s.window); /* lane's query sees this row's key */
                if (!__any_sync(ATT_FULL, valid))
                    continue; /* warp-uniform */
                float sc, dp;
                att_dot2(&sc, &dp, qt + lane * hp, kb + r * hs, dot + lane * hp, vb + r * hs, hs);
                const float p = valid ? __expf(sc * s.scale - lse_t[lane]) : 0.0f;
                /* dS from the unrounded p; both rounded only as operands of P^T dO and dS^T Q */
                const float ds = att_op<BF16>(p * (dp - d_t[lane]) * s.scale), pv = att_op<BF16>(p);
                for (int jq = 0; jq < nq; jq++) {
                    const float pj = __shfl_sync(ATT_FULL, pv, jq), dsj = __shfl_sync(ATT_FULL, ds, jq);
                    if (pj == 0.0f && dsj == 0.0f)
                        continue; /* warp-uniform */
                    att_lane_axpy2(dva[rr], pj, dot + jq * hp, dka[rr], dsj, qt + jq * hp, hs);
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int j = j0 + warp * ATT_ROWS_PER_WARP + rr;
        if (j >= s.tk)
            continue;
        const size_t off = cp_row(bb, j, s.kblock, s.b) * s.ldkv + kvcol;
        att_lane_add(dk + off, dka[rr], hs);
        att_lane_add(dv + off, dva[rr], hs);
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
    FSDP_TRY(att_check_window(op, a->window));
    FSDP_TRY(att_check_limits(op, a->c / a->nh, (long)a->b * a->nh));
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

template <int DPL, bool BF16>
static int cp_forward_launch(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int *qpos, const int *kpos, const cp_shape &s)
{
    const char *op = "attention_cp_forward";
    size_t smem = (size_t)ATT_TILE * (2 * s.hs + s.hs + 1) * sizeof(float);
    FSDP_TRY(att_prepare(op, cp_forward_kernel<DPL, BF16>, smem));
    dim3 grid((s.tq + ATT_TILE - 1) / ATT_TILE, s.b * s.nh);
    cp_forward_kernel<DPL, BF16><<<grid, ATT_THREADS, smem, cuda_ctx.stream>>>(out, lse, q, k, v, qpos, kpos, s);
    return cuda_check_launch(op);
}

template <int DPL, bool BF16>
static int cp_backward_launch(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *lse, const float *dsum, const int *qpos, const int *kpos,
                              const cp_shape &s)
{
    size_t smem_dq = (size_t)ATT_TILE * (2 * s.hs + 2 * (s.hs + 1)) * sizeof(float);
    size_t smem_dkv = (size_t)ATT_TILE * (2 * s.hs + 2 * (s.hs + 1) + 3) * sizeof(float);
    FSDP_TRY(att_prepare("attention_cp_backward dq", cp_backward_dq_kernel<DPL, BF16>, smem_dq));
    FSDP_TRY(att_prepare("attention_cp_backward dk/dv", cp_backward_dkv_kernel<DPL, BF16>, smem_dkv));
    dim3 grid((s.tq + ATT_TILE - 1) / ATT_TILE, s.b * s.nh), grid_kv((s.tk + ATT_TILE - 1) / ATT_TILE, s.b * s.nkv);
    cp_backward_dq_kernel<DPL, BF16><<<grid, ATT_THREADS, smem_dq, cuda_ctx.stream>>>(dq, dout, q, k, v, lse, dsum,
                                                                                     qpos, kpos, s);
    FSDP_TRY(cuda_check_launch("attention_cp_backward dq"));
    cp_backward_dkv_kernel<DPL, BF16><<<grid_kv, ATT_THREADS, smem_dkv, cuda_ctx.stream>>>(dk, dv, dout, q, k, v, lse,
                                                                                          dsum, qpos, kpos, s);
    return cuda_check_launch("attention_cp_backward dk/dv");
}

/* The instantiation for the head size (att_by_head_size). */
template <bool BF16>
static int cp_forward_hs(float *out, float *lse, const float *q, const float *k, const float *v, const int *qpos,
                         const int *kpos, const cp_shape &s)
{
    return att_by_head_size(s.hs, [&](auto dpl) {
        return cp_forward_launch<decltype(dpl)::value, BF16>(out, lse, q, k, v, qpos, kpos, s);
    });
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
    return att_by_head_size(s.hs, [&](auto dpl) {
        return cp_backward_launch<decltype(dpl)::value, BF16>(dq, dk, dv, dout, q, k, v, lse, dsum, qpos, kpos, s);
    });
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

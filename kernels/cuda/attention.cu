/* Causal multi-head attention, flash-attention style, in fp32 on CUDA cores (no t x t matrix anywhere;
 * O(t) memory per head: the lse saved by forward and a D = rowsum(dO * O) vector in backward).
 *
 * Tiles are 32 x 32 (one key or one query per lane). A block of 8 warps owns 32 rows; each warp owns 4
 * of them. Per tile, the block stages 32 rows of K and V (forward, dQ) or of Q and dO (dK/dV) in shared
 * memory; a lane computes the score of "its" key (or query) against the warp's row as a dot product over
 * a padded shared row (stride hs+1: the 32 lanes hit 32 different banks), the warp does the online
 * softmax with shuffles, and the output row is accumulated in registers with lane d owning head
 * dimensions d, d+32, ... (DPL = ceil(hs/32) of them). hs up to 256 is supported. What these kernels share
 * with the context-parallel ones of attention_cp.cu (tile shape, staging, register rows, launch checks) is
 * attention_tiles.cuh's.
 *
 * Backward is two kernels, both deterministic without atomics: dQ (blocks over query rows, looping over
 * key tiles, like forward) and dK/dV (blocks over key rows, looping over query tiles, and with grouped-query
 * attention over the query heads of the key/value head's group). Each recomputes the probabilities from
 * q, k and lse, which costs a second QK^T but writes every gradient element from exactly one thread.
 *
 * Grouped-query attention: qkv rows are [q (nh heads) | k (nkv heads) | v (nkv heads)], query head h reads
 * key/value head h / (nh / nkv) (kernels.h).
 *
 * bf16 mode (set_matmul_dtype(bf16)): the numbers of the CPU's bf16 attention (kernels/cpu/attention.c),
 * up to summation order. q, k, v and dO are rounded to bf16 as they are staged (so a score is a sum of
 * exact products of rounded values, accumulated in fp32); the softmax statistics (running max and sum,
 * lse, D) stay fp32, the sum l adding the unrounded probabilities; P and dS are rounded once more only as
 * the operands of P V, P^T dO, dS K and dS^T Q; D = rowsum(dO O) takes the rounded dO (the one dP = dO V^T
 * reads) and the forward's O as it is. Rounding is common/dtype.h's (nearest even, bit for bit the CPU's).
 * The mode is a template parameter (BF16): the fp32 kernels are the same code as without it. fp16 mode
 * computes in fp32, as the CPU's attention does. In bf16 mode a head size that is a multiple of 8 goes to
 * tensor cores instead (attention_gemm.cu: the same rounding, GEMMs and a t x t score matrix in scratch);
 * these kernels keep the other head sizes and fp32.
 *
 * Sliding window (kernels.h: key j visible to query i when i - window < j <= i; 0 = full causal): forward and
 * dQ start at the key tile of their first query's window, dK/dV stop at the query tile of their last key's,
 * and the tile at the window's edge is masked per (query, key) like the causal diagonal; a warp skips its row
 * in a tile that holds none of the row's keys. */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/attention_tiles.cuh"

/* The first key tile (a multiple of ATT_TILE) that a query tile starting at q0 can see. */
__host__ __device__ __forceinline__ int att_first_tile(int q0, int window)
{
    return window > 0 && q0 - window + 1 > 0 ? (q0 - window + 1) / ATT_TILE * ATT_TILE : 0;
}

/* Key kj is visible to query qi: causal, and inside the window. */
__device__ __forceinline__ bool att_visible(int qi, int kj, int window)
{
    return kj <= qi && (window <= 0 || kj > qi - window);
}

/* Column offsets of query head h's q, k and v in a qkv row of ld = c + 2 nkv hs floats. */
struct att_cols {
    int ld, q, k, v;
};

__device__ __forceinline__ att_cols att_cols_of(int c, int nh, int nkv, int h)
{
    const int hs = c / nh, kvh = h / (nh / nkv);
    att_cols r;
    r.ld = c + 2 * nkv * hs;
    r.q = h * hs;
    r.k = c + kvh * hs;
    r.v = c + nkv * hs + kvh * hs;
    return r;
}

/* The rows of a tile that starts at row r0 of a sequence of t rows, for att_stage. */
struct att_rows {
    int r0, t;
    __device__ __forceinline__ bool operator()(int r, size_t *i) const
    {
        *i = (size_t)(r0 + r);
        return r0 + r < t;
    }
};

/* Key tile k0's rows of the head's K (padded: a lane reads a row) and V (row stride vld), staged between the
 * syncs that keep the previous tile's readers and this tile's writers apart. */
template <bool BF16>
__device__ __forceinline__ void att_stage_keys(float *ks, float *vs, int vld, const float *base, const att_cols &col,
                                               int hs, int k0, int t)
{
    __syncthreads(); /* the previous tile is no longer read */
    att_stage<BF16>(hs, att_rows{k0, t}, att_operand{ks, hs + 1, base + col.k, (size_t)col.ld},
                    att_operand{vs, vld, base + col.v, (size_t)col.ld});
    __syncthreads();
}

/* Where a block of forward or dQ works: pair = blockIdx.y = (sequence bi, query head h), the query tile q0 (the
 * last, heaviest tiles launched first, so the causal triangle's long blocks do not trail at the end), the
 * head's columns and the sequence's first qkv row. */
struct att_qtile {
    int pair, bi, h, q0;
    att_cols col;
    const float *base;
};

__device__ __forceinline__ att_qtile att_qtile_of(const float *qkv, int t, int c, int nh, int nkv)
{
    att_qtile b;
    b.pair = blockIdx.y;
    b.bi = b.pair / nh;
    b.h = b.pair % nh;
    b.col = att_cols_of(c, nh, nkv, b.h);
    b.q0 = (gridDim.x - 1 - blockIdx.x) * ATT_TILE;
    b.base = qkv + (size_t)b.bi * t * b.col.ld;
    return b;
}

/* The key tiles that query tile q0 sees, in order, each staged (K padded, V of row stride vld); in each, for
 * the warp's rows that have a key in it, row(rr, r, qi, k0): rr the warp's row, r its row in the tile, qi its
 * query. Forward and dQ walk their key tiles so. */
template <bool BF16, typename F>
__device__ __forceinline__ void att_key_tiles(float *ks, float *vs, int vld, const att_qtile &blk, int hs, int t,
                                              int window, F row)
{
    const int warp = threadIdx.x >> 5, q0 = blk.q0, q_last = min(q0 + ATT_TILE, t) - 1;
    for (int k0 = att_first_tile(q0, window); k0 <= q_last; k0 += ATT_TILE) {
        att_stage_keys<BF16>(ks, vs, vld, blk.base, blk.col, hs, k0, t);
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
            const int r = warp * ATT_ROWS_PER_WARP + rr, qi = q0 + r;
            if (qi >= t || k0 > qi || (window > 0 && k0 + ATT_TILE - 1 <= qi - window))
                continue; /* warp-uniform: no key of the tile is the row's */
            row(rr, r, qi, k0);
        }
    }
}

/* Forward. grid (query tiles, b*nh), blocks as att_qtile_of says. */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(ATT_THREADS)
    att_forward_kernel(float *out, float *lse, const float *qkv, int t, int c, int nh, int nkv, float scale, int window,
                       bool out_lp)
{
    extern __shared__ float sm[];
    const int hs = c / nh, hp = hs + 1;
    float *qs = sm, *ks = qs + ATT_TILE * hs, *vs = ks + ATT_TILE * hp;
    const att_qtile blk = att_qtile_of(qkv, t, c, nh, nkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    att_stage<BF16>(hs, att_rows{blk.q0, t}, att_operand{qs, hs, blk.base + blk.col.q, (size_t)blk.col.ld});
    float m[ATT_ROWS_PER_WARP], l[ATT_ROWS_PER_WARP], o[ATT_ROWS_PER_WARP][DPL] = {};
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
    }
    att_key_tiles<BF16>(ks, vs, hs, blk, hs, t, window, [&](int rr, int r, int qi, int k0) {
        const float s = att_dot(qs + r * hs, ks + lane * hp, hs) * scale;
        const float p = att_softmax_step(s, att_visible(qi, k0 + lane, window), m[rr], l[rr], o[rr]);
        const int jmax = min(ATT_TILE, qi - k0 + 1);
        const float pv = att_op<BF16>(p); /* P as the operand of P V */
        for (int j = 0; j < jmax; j++)
            att_lane_axpy(o[rr], __shfl_sync(ATT_FULL, pv, j), vs + j * hs, hs);
    });
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int qi = blk.q0 + warp * ATT_ROWS_PER_WARP + rr;
        if (qi >= t)
            continue;
        att_lane_store(cuda_act_row(out, ((size_t)blk.bi * t + qi) * c + (size_t)blk.h * hs, out_lp), o[rr],
                       1.0f / l[rr], hs, out_lp);
        if (lane == 0)
            lse[(size_t)blk.pair * t + qi] = m[rr] + logf(l[rr]);
    }
}

/* D[pair, i] = dO_i . O_i (att_warp_rowdot), one warp per (row, head). */
template <bool BF16>
__global__ void att_rowdot_kernel(float *dsum, const float *dout, const float *out, int b, int t, int c, int nh,
                                  bool out_lp)
{
    const int hs = c / nh, lane = threadIdx.x & 31;
    const size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5, total = (size_t)b * nh * t;
    if (w >= total)
        return;
    const int qi = (int)(w % t), pair = (int)(w / t), bi = pair / nh, h = pair % nh;
    const size_t off = ((size_t)bi * t + qi) * c + (size_t)h * hs;
    const float s = att_warp_rowdot<BF16>(dout + off, cuda_act_row(out, off, out_lp), hs, out_lp);
    if (lane == 0)
        dsum[w] = s;
}

/* dQ: blocks over query tiles (as forward), looping over key tiles. */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(ATT_THREADS)
    att_backward_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *dsum,
                           int t, int c, int nh, int nkv, float scale, int window)
{
    extern __shared__ float sm[];
    const int hs = c / nh, hp = hs + 1;
    float *qs = sm, *dos = qs + ATT_TILE * hs, *ks = dos + ATT_TILE * hs, *vs = ks + ATT_TILE * hp;
    const att_qtile blk = att_qtile_of(qkv, t, c, nh, nkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *dobase = dout + (size_t)blk.bi * t * c + (size_t)blk.h * hs;

    att_stage<BF16>(hs, att_rows{blk.q0, t}, att_operand{qs, hs, blk.base + blk.col.q, (size_t)blk.col.ld},
                    att_operand{dos, hs, dobase, (size_t)c});
    float dq[ATT_ROWS_PER_WARP][DPL] = {}, row_lse[ATT_ROWS_PER_WARP], row_d[ATT_ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int qi = blk.q0 + warp * ATT_ROWS_PER_WARP + rr;
        row_lse[rr] = qi < t ? lse[(size_t)blk.pair * t + qi] : 0.0f;
        row_d[rr] = qi < t ? dsum[(size_t)blk.pair * t + qi] : 0.0f;
    }
    att_key_tiles<BF16>(ks, vs, hp, blk, hs, t, window, [&](int rr, int r, int qi, int k0) {
        float s, dp;
        att_dot2(&s, &dp, qs + r * hs, ks + lane * hp, dos + r * hs, vs + lane * hp, hs);
        const bool valid = att_visible(qi, k0 + lane, window);
        const float p = valid ? __expf(s * scale - row_lse[rr]) : 0.0f;
        const float ds = att_op<BF16>(p * (dp - row_d[rr]) * scale); /* from the unrounded p */
        const int jmax = min(ATT_TILE, qi - k0 + 1);
        for (int j = 0; j < jmax; j++)
            att_lane_axpy(dq[rr], __shfl_sync(ATT_FULL, ds, j), ks + j * hp, hs);
    });
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int qi = blk.q0 + warp * ATT_ROWS_PER_WARP + rr;
        if (qi < t)
            att_lane_add(dqkv + ((size_t)blk.bi * t + qi) * blk.col.ld + blk.col.q, dq[rr], hs);
    }
}

/* dK and dV: blocks over key tiles of one key/value head (the first keys see the most queries, so they
 * launch first), looping over the query heads of its group and, for each, the query tiles at or after the
 * key tile. grid (key tiles, b*nkv). */
template <int DPL, bool BF16>
__global__ void __launch_bounds__(ATT_THREADS)
    att_backward_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *dsum,
                            int t, int c, int nh, int nkv, float scale, int window)
{
    extern __shared__ float sm[];
    const int hs = c / nh, hp = hs + 1, group = nh / nkv;
    float *kb = sm, *vb = kb + ATT_TILE * hs, *qt = vb + ATT_TILE * hs, *dot = qt + ATT_TILE * hp;
    float *lse_t = dot + ATT_TILE * hp, *d_t = lse_t + ATT_TILE;
    const int bi = blockIdx.y / nkv, h0 = blockIdx.y % nkv * group;
    const att_cols col = att_cols_of(c, nh, nkv, h0);
    const int ld = col.ld;
    const int k0 = blockIdx.x * ATT_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *base = qkv + (size_t)bi * t * ld;

    att_stage<BF16>(hs, att_rows{k0, t}, att_operand{kb, hs, base + col.k, (size_t)ld},
                    att_operand{vb, hs, base + col.v, (size_t)ld});
    float dk[ATT_ROWS_PER_WARP][DPL] = {}, dv[ATT_ROWS_PER_WARP][DPL] = {};
    /* (query head, query tile) steps: the tiles at or after the key tile, for each head of the group */
    int tiles = (t - k0 + ATT_TILE - 1) / ATT_TILE;
    if (window > 0) /* the last query that sees a key of the tile is k0 + ATT_TILE - 2 + window */
        tiles = min(tiles, (ATT_TILE - 2 + window) / ATT_TILE + 1);
    for (int step = 0; step < group * tiles; step++) {
        const int h = h0 + step / tiles, q0 = k0 + step % tiles * ATT_TILE, pair = bi * nh + h;
        const float *dobase = dout + (size_t)bi * t * c + (size_t)h * hs;
        __syncthreads();
        att_stage<BF16>(hs, att_rows{q0, t}, att_operand{qt, hp, base + (size_t)h * hs, (size_t)ld},
                        att_operand{dot, hp, dobase, (size_t)c});
        if (threadIdx.x < ATT_TILE) {
            int qi = q0 + threadIdx.x;
            lse_t[threadIdx.x] = qi < t ? lse[(size_t)pair * t + qi] : 0.0f;
            d_t[threadIdx.x] = qi < t ? dsum[(size_t)pair * t + qi] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
            const int r = warp * ATT_ROWS_PER_WARP + rr, kj = k0 + r;
            if (kj >= t)
                continue;
            const int qi = q0 + lane;
            float s, dp;
            att_dot2(&s, &dp, qt + lane * hp, kb + r * hs, dot + lane * hp, vb + r * hs, hs);
            const bool valid = qi < t && att_visible(qi, kj, window);
            const float p = valid ? __expf(s * scale - lse_t[lane]) : 0.0f;
            /* dS from the unrounded p; both rounded only as operands of P^T dO and dS^T Q */
            const float ds = att_op<BF16>(p * (dp - d_t[lane]) * scale), pv = att_op<BF16>(p);
            const int j0 = max(0, kj - q0), j1 = min(ATT_TILE, t - q0);
            for (int j = j0; j < j1; j++) {
                const float pj = __shfl_sync(ATT_FULL, pv, j), dsj = __shfl_sync(ATT_FULL, ds, j);
                att_lane_axpy2(dv[rr], pj, dot + j * hp, dk[rr], dsj, qt + j * hp, hs);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; rr++) {
        const int kj = k0 + warp * ATT_ROWS_PER_WARP + rr;
        if (kj >= t)
            continue;
        float *g = dqkv + ((size_t)bi * t + kj) * ld;
        att_lane_add(g + col.k, dk[rr], hs);
        att_lane_add(g + col.v, dv[rr], hs);
    }
}

static int check_shape(const char *op, int b, int t, int c, int nh, int nkv)
{
    if (b < 0 || t < 0 || c <= 0 || nh <= 0 || c % nh != 0 || nkv <= 0 || nh % nkv != 0)
        return error_set(FSDP_EINVAL,
                         "kernels cuda: %s: bad shape b=%d t=%d c=%d nh=%d nkv=%d (c %% nh and nh %% nkv must be 0)",
                         op, b, t, c, nh, nkv);
    return att_check_limits(op, c / nh, (long)b * nh);
}

template <int DPL, bool BF16>
static int att_forward_launch(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                              int window)
{
    bool out_lp;
    FSDP_TRY(cuda_act_lowp("attention_forward", out, &out_lp));
    const int hs = c / nh;
    size_t smem = (size_t)ATT_TILE * (2 * hs + hs + 1) * sizeof(float);
    FSDP_TRY(att_prepare("attention_forward", att_forward_kernel<DPL, BF16>, smem));
    dim3 grid((t + ATT_TILE - 1) / ATT_TILE, b * nh);
    att_forward_kernel<DPL, BF16><<<grid, ATT_THREADS, smem, cuda_ctx.stream>>>(out, lse, qkv, t, c, nh, nkv,
                                                                                1.0f / sqrtf((float)hs), window,
                                                                                out_lp);
    return cuda_check_launch("attention_forward");
}

template <int DPL, bool BF16>
static int att_backward_launch(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *dsum,
                               int b, int t, int c, int nh, int nkv, int window)
{
    const int hs = c / nh;
    const float scale = 1.0f / sqrtf((float)hs);
    size_t smem_dq = (size_t)ATT_TILE * (2 * hs + 2 * (hs + 1)) * sizeof(float);
    size_t smem_dkv = (size_t)ATT_TILE * (2 * hs + 2 * (hs + 1) + 2) * sizeof(float);
    FSDP_TRY(att_prepare("attention_backward dq", att_backward_dq_kernel<DPL, BF16>, smem_dq));
    FSDP_TRY(att_prepare("attention_backward dk/dv", att_backward_dkv_kernel<DPL, BF16>, smem_dkv));
    dim3 grid((t + ATT_TILE - 1) / ATT_TILE, b * nh), grid_kv((t + ATT_TILE - 1) / ATT_TILE, b * nkv);
    att_backward_dq_kernel<DPL, BF16><<<grid, ATT_THREADS, smem_dq, cuda_ctx.stream>>>(dqkv, dout, qkv, lse, dsum,
                                                                                       t, c, nh, nkv, scale, window);
    FSDP_TRY(cuda_check_launch("attention_backward dq"));
    att_backward_dkv_kernel<DPL, BF16><<<grid_kv, ATT_THREADS, smem_dkv, cuda_ctx.stream>>>(dqkv, dout, qkv, lse,
                                                                                            dsum, t, c, nh, nkv, scale,
                                                                                            window);
    return cuda_check_launch("attention_backward dk/dv");
}

/* The instantiation for the head size (att_by_head_size). */
template <bool BF16>
static int att_forward_hs(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv, int window)
{
    return att_by_head_size(c / nh, [&](auto dpl) {
        return att_forward_launch<decltype(dpl)::value, BF16>(out, lse, qkv, b, t, c, nh, nkv, window);
    });
}

/* D = rowsum(dO O) into dsum, (b, nh, t) as lse. */
template <bool BF16>
static int att_rowdot(float *dsum, const float *dout, const float *out, int b, int t, int c, int nh)
{
    bool out_lp;
    FSDP_TRY(cuda_act_lowp("attention_backward", out, &out_lp));
    size_t warps = (size_t)b * nh * t;
    att_rowdot_kernel<BF16><<<(unsigned)((warps * 32 + CUDA_THREADS - 1) / CUDA_THREADS), CUDA_THREADS, 0,
                              cuda_ctx.stream>>>(dsum, dout, out, b, t, c, nh, out_lp);
    return cuda_check_launch("attention_backward (rowdot)");
}

template <bool BF16>
static int att_backward_hs(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                           float *dsum, int b, int t, int c, int nh, int nkv, int window)
{
    FSDP_TRY(att_rowdot<BF16>(dsum, dout, out, b, t, c, nh));
    return att_by_head_size(c / nh, [&](auto dpl) {
        return att_backward_launch<decltype(dpl)::value, BF16>(dqkv, dout, qkv, lse, dsum, b, t, c, nh, nkv, window);
    });
}

size_t cuda_attention_workspace_bytes(int b, int t, int c, int nh, int nkv)
{
    (void)c;
    (void)nkv;
    if (b <= 0 || t <= 0 || nh <= 0)
        return 64;
    /* Backward's D = rowsum(dO * O), one float per (batch, head, position); forward needs none. */
    return (size_t)b * nh * t * sizeof(float);
}

/* qkv as the flash kernels read it: fp32, widened into the scratch where it is a bf16 activation (act.cu; the
 * kernels round it back to the same bf16 values in bf16 mode, the only mode such a tensor exists in). */
static int att_qkv_f32(const char *op, const float **qkv, int b, int t, int c, int nh, int nkv)
{
    bool lp;
    FSDP_TRY(cuda_act_lowp(op, *qkv, &lp));
    if (!lp)
        return 0;
    size_t n = (size_t)b * t * (c + 2 * (size_t)nkv * (c / nh));
    void *wide;
    FSDP_TRY(cuda_scratch(op, &wide, n * sizeof(float)));
    FSDP_TRY(cuda_cast(wide, DTYPE_F32, *qkv, DTYPE_BF16, n));
    *qkv = (const float *)wide;
    return 0;
}

int cuda_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                           int window, void *workspace)
{
    (void)workspace;
    FSDP_TRY(check_shape("attention_forward", b, t, c, nh, nkv));
    FSDP_TRY(att_check_window("attention_forward", window));
    if (b == 0 || t == 0)
        return 0;
    if (cuda_attention_gemm_applies(c, nh)) /* bf16 on tensor cores (attention_gemm.cu) */
        return cuda_attention_gemm_forward(out, lse, qkv, b, t, c, nh, nkv, window);
    FSDP_TRY(att_qkv_f32("attention_forward", &qkv, b, t, c, nh, nkv));
    if (cuda_ctx.matmul_dtype == DTYPE_BF16)
        return att_forward_hs<true>(out, lse, qkv, b, t, c, nh, nkv, window);
    return att_forward_hs<false>(out, lse, qkv, b, t, c, nh, nkv, window);
}

int cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            int b, int t, int c, int nh, int nkv, int window, void *workspace)
{
    FSDP_TRY(check_shape("attention_backward", b, t, c, nh, nkv));
    FSDP_TRY(att_check_window("attention_backward", window));
    if (b == 0 || t == 0)
        return 0;
    if (!workspace)
        return error_set(FSDP_EINVAL, "kernels cuda: attention_backward: NULL workspace (size it with "
                                      "attention_workspace_bytes)");
    float *dsum = (float *)workspace;
    if (cuda_attention_gemm_applies(c, nh)) {
        FSDP_TRY(att_rowdot<true>(dsum, dout, out, b, t, c, nh));
        return cuda_attention_gemm_backward(dqkv, dout, qkv, lse, dsum, b, t, c, nh, nkv, window);
    }
    FSDP_TRY(att_qkv_f32("attention_backward", &qkv, b, t, c, nh, nkv));
    /* the mode now, as on the CPU: a step's forward and backward run in the same one */
    if (cuda_ctx.matmul_dtype == DTYPE_BF16)
        return att_backward_hs<true>(dqkv, dout, qkv, out, lse, dsum, b, t, c, nh, nkv, window);
    return att_backward_hs<false>(dqkv, dout, qkv, out, lse, dsum, b, t, c, nh, nkv, window);
}

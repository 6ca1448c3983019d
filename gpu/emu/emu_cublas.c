/* The cuBLAS and cuBLASLt stand-ins of the CUDA host emulator (see emu.h): the GEMM entry points the CUDA
 * backend links against (cublasGemmEx and friends, cublasLtMatmul with its epilogues), computed on the CPU by
 * the stream's worker thread, with the numerics spelled out so that a test can predict every bit:
 *
 * - Inputs are read exactly (bf16 and fp16 widen to fp32 without loss), then rounded as the compute type
 *   allows: CUBLAS_COMPUTE_32F and _PEDANTIC keep fp32; _FAST_TF32 rounds each input to TF32 (10 stored
 *   mantissa bits), _FAST_16BF to bf16, _FAST_16F to fp16, all round-to-nearest-even (common/dtype.h's
 *   conversions for the 16-bit types, the project's single definition of those roundings).
 * - Each output accumulates op(A)[i,p] * op(B)[p,j] in fp32, p = 0, 1, ..., k-1 in order, starting from 0;
 *   products and sums are separate roundings (no FMA), so the result is the naive loop's on every machine.
 * - D = alpha * acc + beta * C in fp32, where C is not read at all when beta == 0 (its NaNs cannot leak), then
 *   the epilogue, then one round-to-nearest-even to D's type.
 *
 * The GEMM packs op(A) and op(B), rounded, into contiguous fp32 panels and runs an 8 x 4 register tile whose
 * inner loop is GCC vector arithmetic (SSE on x86-64's baseline): correctness first, yet fast enough for CI
 * to run small models' training steps (16 to 28 GFLOP/s on one core of the Xeon it was written on, 256^2 x 64
 * to 1024^3). No threads: each stream has its own worker already.
 *
 * Validation follows cuBLAS: a NULL handle is CUBLAS_STATUS_NOT_INITIALIZED, bad sizes or leading dimensions
 * CUBLAS_STATUS_INVALID_VALUE, type combinations outside cuBLAS's documented tables NOT_SUPPORTED; an operand
 * span outside device memory is what a GPU would fault on, so it is reported through emu_check_device_range
 * (which makes it the context's sticky error) and the call returns CUBLAS_STATUS_EXECUTION_FAILED.
 *
 * Not offered (the call says so rather than computing something else): device pointer mode
 * (NOT_SUPPORTED), fp64, complex, integer and fp8 types (NOT_SUPPORTED), cuBLASLt orders other than column-major,
 * pointer-array batches and planar complex layouts (NOT_SUPPORTED), fp8 scale and amax pointers
 * (INVALID_VALUE, as cublasLt.h documents for an unsupported combination). */
#include "gpu/emu/emu.h"

#include "common/dtype.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Every product and sum is its own rounding, whatever the build's flags: a fused multiply-add (which GNU C mode
 * or -march=native would allow the compiler to form) changes bits and would make the results depend on the
 * machine. ISO C mode, the project's, does not contract anyway. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Element access and rounding
 * --------------------------------------------------------------------------------------------------------- */

enum rnd { RND_NONE, RND_TF32, RND_BF16, RND_F16 };

static size_t type_size(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

static bool type_known(int t)
{
    return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

/* Element i of a buffer of type t, as fp32 (exact for the three types). */
static inline float load_f32(const void *p, cudaDataType_t t, int64_t i)
{
    switch (t) {
    case CUDA_R_16BF: return dtype_bf16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16F: return dtype_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Stores v into element i, rounded to nearest even for the 16-bit types. */
static inline void store_f32(void *p, cudaDataType_t t, int64_t i, float v)
{
    switch (t) {
    case CUDA_R_16BF: ((uint16_t *)p)[i] = dtype_f32_to_bf16(v); break;
    case CUDA_R_16F: ((uint16_t *)p)[i] = dtype_f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* x rounded to TF32: the 13 low mantissa bits cleared, round to nearest even. A carry into the exponent is the
 * correct rounding (up to inf beyond TF32's largest finite value); NaN is kept as it is, quietened. */
static inline float round_tf32(float x)
{
    uint32_t u = dtype_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return dtype_bits_f32(u | 0x00400000u);
    u += 0xfffu + ((u >> 13) & 1u);
    return dtype_bits_f32(u & 0xffffe000u);
}

static inline float round_input(enum rnd r, float x)
{
    switch (r) {
    case RND_TF32: return round_tf32(x);
    case RND_BF16: return dtype_bf16_to_f32(dtype_f32_to_bf16(x));
    case RND_F16: return dtype_f16_to_f32(dtype_f32_to_f16(x));
    default: return x;
    }
}

/* GELU, the tanh form: cuBLASLt's GELU epilogue is the tanh approximation (PyTorch, which fuses its
 * gelu(approximate='tanh') into the cuBLASLt epilogue, says so: pytorch/pytorch#104061, "cuBLASLt-based fused
 * GELU epilogue ... uses tanh approximation"). Evaluated in double, so the value is the function's to within
 * one fp32 rounding; a GPU's fast tanh is close to it, not equal. */
#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_C 0.044715

static float gelu(float xf)
{
    double x = xf;
    return (float)(0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x))));
}

/* d gelu(x) / dx of the same tanh form. */
static double gelu_grad(float xf)
{
    double x = xf, t = tanh(GELU_K * (x + GELU_C * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
}

/* ---------------------------------------------------------------------------------------------------------
 * The GEMM engine, shared by cuBLAS and cuBLASLt: one queued op describes a whole (strided batched) call.
 * --------------------------------------------------------------------------------------------------------- */

/* What the epilogue does, as flags (cuBLASLt's epilogues map onto them in lt_epilogue_flags). */
enum {
    EPI_BIAS = 1u << 0,    /* x += bias[i] */
    EPI_RELU = 1u << 1,    /* x = max(x, 0) */
    EPI_GELU = 1u << 2,    /* x = gelu(x) */
    EPI_AUX_OUT = 1u << 3, /* store the activation's input: GELU's value, or ReLU's bit (x >= 0) */
    EPI_DRELU = 1u << 4,   /* x = aux bit ? x : 0 */
    EPI_DGELU = 1u << 5,   /* x = x * gelu'(aux) */
    EPI_BGRAD = 1u << 6,   /* bias[i] = sum over j of the final D[i, j] (before D's rounding) */
    EPI_BGRADA = 1u << 7,  /* bias[i] = sum over p of op(A)[i, p] */
    EPI_BGRADB = 1u << 8,  /* bias[j] = sum over p of op(B)[p, j] */
};

struct emu_mat {
    const void *p; /* host view; NULL for an unused C */
    cudaDataType_t t;
    int64_t ld;
    int64_t stride; /* elements between batch entries */
    bool trans;     /* op(X) = X^T (A and B only) */
};

struct emu_gemm {
    const char *what;   /* the API call, for messages */
    const char *d_name; /* the output's name in them: "C" (cuBLAS, where C is D) or "D" */
    int64_t m, n, k, batch;
    struct emu_mat a, b, c, d;
    float alpha, beta;
    enum rnd rnd;
    unsigned epi;
    struct {
        void *p; /* bias (input) or bias gradient (output) */
        cudaDataType_t t;
        int64_t stride;
    } bias;
    struct {
        void *p; /* GELU input (D's type) or ReLU bit mask */
        cudaDataType_t t;
        int64_t ld, stride; /* elements, or bits for the mask */
    } aux;
};

#define MR 8 /* rows of the register tile: two 4-float vectors */
#define NR 4 /* columns of the register tile */

typedef float v4f __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v); /* unaligned-safe and alias-safe; compiles to one vector load */
    return v;
}

static inline void v4_store(float *p, v4f v)
{
    memcpy(p, &v, sizeof v);
}

/* The MR x NR tile t (column-major, ld MR) = sum over p of a[p] b[p]^T, p in order: a is a packed A panel
 * (k rows of MR floats), b a packed B panel (k rows of NR floats). Each lane accumulates its own output with
 * one multiply and one add per p, the same operations as the scalar loop, so vectorising changes no bit. */
static void tile_kernel(int64_t k, const float *restrict a, const float *restrict b, float *restrict t)
{
    v4f c0l = {0}, c0h = {0}, c1l = {0}, c1h = {0}, c2l = {0}, c2h = {0}, c3l = {0}, c3h = {0};
    for (int64_t p = 0; p < k; p++, a += MR, b += NR) {
        v4f al = v4_load(a), ah = v4_load(a + 4);
        v4f b0 = {b[0], b[0], b[0], b[0]}, b1 = {b[1], b[1], b[1], b[1]};
        v4f b2 = {b[2], b[2], b[2], b[2]}, b3 = {b[3], b[3], b[3], b[3]};
        c0l += al * b0;
        c0h += ah * b0;
        c1l += al * b1;
        c1h += ah * b1;
        c2l += al * b2;
        c2h += ah * b2;
        c3l += al * b3;
        c3h += ah * b3;
    }
    v4_store(t + 0, c0l);
    v4_store(t + 4, c0h);
    v4_store(t + 8, c1l);
    v4_store(t + 12, c1h);
    v4_store(t + 16, c2l);
    v4_store(t + 20, c2h);
    v4_store(t + 24, c3l);
    v4_store(t + 28, c3h);
}

/* op(A) (m x k) into MR-row panels: panel q holds rows q*MR.. as k consecutive groups of MR floats, rows past
 * m zero (their products land in tile rows that are never stored). */
static void pack_a(float *dst, const void *a, const struct emu_mat *ma, int64_t m, int64_t k, enum rnd r)
{
    for (int64_t i0 = 0; i0 < m; i0 += MR)
        for (int64_t p = 0; p < k; p++)
            for (int64_t i = i0; i < i0 + MR; i++) {
                float v = 0.0f;
                if (i < m)
                    v = round_input(r, load_f32(a, ma->t, ma->trans ? i * ma->ld + p : p * ma->ld + i));
                *dst++ = v;
            }
}

/* op(B) (k x n) into NR-column panels, likewise. */
static void pack_b(float *dst, const void *b, const struct emu_mat *mb, int64_t k, int64_t n, enum rnd r)
{
    for (int64_t j0 = 0; j0 < n; j0 += NR)
        for (int64_t p = 0; p < k; p++)
            for (int64_t j = j0; j < j0 + NR; j++) {
                float v = 0.0f;
                if (j < n)
                    v = round_input(r, load_f32(b, mb->t, mb->trans ? p * mb->ld + j : j * mb->ld + p));
                *dst++ = v;
            }
}

/* The pointers of one batch entry, in the device view. */
struct gemm_ptrs {
    const void *a, *b, *c;
    void *d, *bias;
    void *aux;        /* element-addressed (GELU) */
    uint8_t *mask;    /* bit-addressed (ReLU): bit mask_bit0 + j * ld + i */
    int64_t mask_bit0;
    float *rowsum;    /* EPI_BGRAD's sums, m floats */
};

static inline bool mask_get(const struct gemm_ptrs *q, int64_t bit)
{
    bit += q->mask_bit0;
    return (q->mask[bit >> 3] >> (bit & 7)) & 1u;
}

static inline void mask_put(const struct gemm_ptrs *q, int64_t bit, bool on)
{
    bit += q->mask_bit0;
    uint8_t b = (uint8_t)(1u << (bit & 7));
    if (on)
        q->mask[bit >> 3] |= b;
    else
        q->mask[bit >> 3] &= (uint8_t)~b;
}

/* Scale, C, epilogue and store for the rows [i0, i0 + rows) and columns [j0, j0 + cols) of D, t holding their
 * fp32 sums (column-major, ld MR). */
static void tile_epilogue(const struct emu_gemm *g, const struct gemm_ptrs *q, const float *t, int64_t i0,
                          int64_t j0, int64_t rows, int64_t cols)
{
    unsigned epi = g->epi;
    for (int64_t jj = 0; jj < cols; jj++) {
        int64_t j = j0 + jj;
        for (int64_t ii = 0; ii < rows; ii++) {
            int64_t i = i0 + ii;
            /* k == 0 leaves D = beta C exactly (no alpha * 0 term that alpha's NaN or inf could spoil) */
            float x = g->k ? g->alpha * t[jj * MR + ii] : 0.0f;
            if (g->beta != 0.0f) {
                float c = g->beta * load_f32(q->c, g->c.t, j * g->c.ld + i);
                x = g->k ? x + c : c;
            }
            if (epi & EPI_BIAS)
                x += load_f32(q->bias, g->bias.t, i);
            if (epi & EPI_AUX_OUT) {
                if (epi & EPI_RELU)
                    mask_put(q, j * g->aux.ld + i, x >= 0.0f);
                else
                    store_f32(q->aux, g->aux.t, j * g->aux.ld + i, x);
            }
            if (epi & EPI_RELU)
                x = x > 0.0f ? x : 0.0f; /* NaN gives 0, as max(x, 0) does */
            if (epi & EPI_GELU)
                x = gelu(x);
            if ((epi & EPI_DRELU) && !mask_get(q, j * g->aux.ld + i))
                x = 0.0f;
            if (epi & EPI_DGELU)
                x = (float)((double)x * gelu_grad(load_f32(q->aux, g->aux.t, j * g->aux.ld + i)));
            if (epi & EPI_BGRAD)
                q->rowsum[i] += x; /* columns arrive in increasing j for each row: a fixed order */
            store_f32(q->d, g->d.t, j * g->d.ld + i, x);
        }
    }
}

/* Rows of A (op(A)) packed per block: enough that the block (rows x k floats) stays in L2 while every B panel
 * streams past it. */
static int64_t row_block(int64_t k)
{
    int64_t rows = (32768 / (k > 0 ? k : 1)) / MR * MR;
    return rows < MR ? MR : rows;
}

/* The device view of entry e of a strided batch at p (host view), elements of `size` bytes `stride` apart;
 * NULL for an operand the call does not have. */
static void *entry(const void *p, int64_t e, int64_t stride, size_t size)
{
    return p ? (char *)emu_dev(p) + (ptrdiff_t)(e * stride) * (ptrdiff_t)size : NULL;
}

/* Runs the whole call on this thread: 0, or -1 when the workspace could not be allocated. */
static int gemm_compute(const struct emu_gemm *g)
{
    int64_t m = g->m, n = g->n, k = g->k;
    int64_t mp = (m + MR - 1) / MR * MR, np = (n + NR - 1) / NR * NR;
    float *ap = NULL, *bp = NULL, *rowsum = NULL;
    if (k > 0) {
        ap = aligned_alloc(64, ((size_t)(mp * k) * sizeof(float) + 63) & ~(size_t)63);
        bp = aligned_alloc(64, ((size_t)(np * k) * sizeof(float) + 63) & ~(size_t)63);
    }
    if (g->epi & EPI_BGRAD)
        rowsum = malloc((size_t)m * sizeof(float));
    if ((k > 0 && (!ap || !bp)) || ((g->epi & EPI_BGRAD) && !rowsum)) {
        free(ap);
        free(bp);
        free(rowsum);
        return -1;
    }
    size_t as = type_size(g->a.t), bs = type_size(g->b.t), cs = type_size(g->c.t), ds = type_size(g->d.t);
    size_t bias_s = type_size(g->bias.t), aux_s = type_size(g->aux.t);
    bool mask = g->aux.p && (g->epi & (EPI_RELU | EPI_DRELU));
    int64_t mb = row_block(k);
    float tile[MR * NR];
    memset(tile, 0, sizeof tile);
    for (int64_t e = 0; e < g->batch; e++) {
        /* batch entry e's operands in the device view; the entries are offsets inside the allocations that
         * check_operands found */
        struct gemm_ptrs q = {
            .a = k > 0 ? entry(g->a.p, e, g->a.stride, as) : NULL,
            .b = k > 0 ? entry(g->b.p, e, g->b.stride, bs) : NULL,
            .c = entry(g->c.p, e, g->c.stride, cs),
            .d = entry(g->d.p, e, g->d.stride, ds),
            .bias = entry(g->bias.p, e, g->bias.stride, bias_s),
            .aux = mask ? NULL : entry(g->aux.p, e, g->aux.stride, aux_s),
            .mask = mask ? emu_dev(g->aux.p) : NULL,
            .mask_bit0 = mask ? e * g->aux.stride : 0,
            .rowsum = rowsum,
        };
        if (k > 0) {
            pack_a(ap, q.a, &g->a, m, k, g->rnd);
            pack_b(bp, q.b, &g->b, k, n, g->rnd);
        }
        if (rowsum)
            memset(rowsum, 0, (size_t)m * sizeof(float));
        for (int64_t i0 = 0; i0 < m; i0 += mb) {
            int64_t i1 = i0 + mb < m ? i0 + mb : m;
            for (int64_t j = 0; j < n; j += NR)
                for (int64_t i = i0; i < i1; i += MR) {
                    if (k > 0)
                        tile_kernel(k, ap + i * k, bp + j * k, tile);
                    tile_epilogue(g, &q, tile, i, j, i1 - i < MR ? i1 - i : MR, n - j < NR ? n - j : NR);
                }
        }
        if (rowsum)
            for (int64_t i = 0; i < m; i++)
                store_f32(q.bias, g->bias.t, i, rowsum[i]);
        /* The bias gradients of the inputs: the operands' stored values (not the compute type's rounding of
         * them), summed over k in fp32 in order; not scaled by alpha. */
        if (g->epi & EPI_BGRADA)
            for (int64_t i = 0; i < m; i++) {
                float s = 0.0f;
                for (int64_t p = 0; p < k; p++)
                    s += load_f32(q.a, g->a.t, g->a.trans ? i * g->a.ld + p : p * g->a.ld + i);
                store_f32(q.bias, g->bias.t, i, s);
            }
        if (g->epi & EPI_BGRADB)
            for (int64_t j = 0; j < n; j++) {
                float s = 0.0f;
                for (int64_t p = 0; p < k; p++)
                    s += load_f32(q.b, g->b.t, g->b.trans ? p * g->b.ld + j : j * g->b.ld + p);
                store_f32(q.bias, g->bias.t, j, s);
            }
    }
    free(ap);
    free(bp);
    free(rowsum);
    return 0;
}

static void gemm_run(void *arg)
{
    struct emu_gemm *g = arg;
    if (gemm_compute(g) != 0)
        emu_fail(cudaErrorMemoryAllocation, "%s: out of host memory for the %lld x %lld x %lld GEMM's workspace",
                 g->what, (long long)g->m, (long long)g->n, (long long)g->k);
}

static void gemm_release(void *arg)
{
    free(arg);
}

/* Checks that a (strided batched) matrix of rows x cols elements, ld apart, lies inside one live device
 * allocation; bytes from the lowest to the highest element touched, whatever the stride's sign. */
static int check_matrix(const char *op, const char *what, const void *p, size_t esize, int64_t rows, int64_t cols,
                        int64_t ld, int64_t stride, int64_t batch)
{
    int64_t span = (cols - 1) * ld + rows; /* elements of one entry */
    int64_t last = (batch - 1) * stride;
    int64_t lo = last < 0 ? last : 0, hi = (last > 0 ? last : 0) + span;
    return emu_check_device_range(op, what, (const char *)p + lo * (int64_t)esize, (size_t)(hi - lo) * esize);
}

/* The device spans every operand of g touches: -1 (already reported by emu_check_device_range) if one is not
 * inside device memory. */
static int check_operands(const struct emu_gemm *g)
{
    const char *w = g->what;
    int64_t m = g->m, n = g->n, k = g->k, nb = g->batch;
    if (k > 0) {
        const struct emu_mat *a = &g->a, *b = &g->b;
        if (check_matrix(w, "A", a->p, type_size(a->t), a->trans ? k : m, a->trans ? m : k, a->ld, a->stride, nb) ||
            check_matrix(w, "B", b->p, type_size(b->t), b->trans ? n : k, b->trans ? k : n, b->ld, b->stride, nb))
            return -1;
    }
    if (g->beta != 0.0f && check_matrix(w, "C", g->c.p, type_size(g->c.t), m, n, g->c.ld, g->c.stride, nb))
        return -1;
    if (check_matrix(w, g->d_name, g->d.p, type_size(g->d.t), m, n, g->d.ld, g->d.stride, nb))
        return -1;
    if (g->epi & (EPI_BIAS | EPI_BGRAD | EPI_BGRADA | EPI_BGRADB)) {
        int64_t len = g->epi & EPI_BGRADB ? n : m;
        if (check_matrix(w, "bias", g->bias.p, type_size(g->bias.t), len, 1, len, g->bias.stride, nb))
            return -1;
    }
    if (g->epi & (EPI_AUX_OUT | EPI_DRELU | EPI_DGELU)) {
        if (g->epi & (EPI_RELU | EPI_DRELU)) {
            /* the mask: bits from 0 to the last one touched, in whole bytes */
            int64_t last = (nb - 1) * g->aux.stride + (n - 1) * g->aux.ld + m - 1;
            if (emu_check_device_range(w, "epilogue aux (ReLU mask)", g->aux.p, (size_t)(last / 8 + 1)))
                return -1;
        } else if (check_matrix(w, "epilogue aux", g->aux.p, type_size(g->aux.t), m, n, g->aux.ld, g->aux.stride,
                                nb)) {
            return -1;
        }
    }
    return 0;
}

/* Checks g's spans and queues it on the stream: takes g (freed here or by the op's release). */
static cublasStatus_t gemm_submit(struct emu_gemm *g, cudaStream_t stream)
{
    if (check_operands(g) != 0) {
        free(g);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    /* emu_enqueue releases g itself when it cannot queue it */
    if (emu_enqueue(stream, g->what, gemm_run, g, gemm_release) != cudaSuccess)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLAS's table of cublasGemmEx's type combinations (the same holds for cublasLtMatmul's regular, not fp8,
 * kernels), for the real types the emulator knows: CUBLAS_COMPUTE_32F and _PEDANTIC take A = B in fp32, bf16
 * or fp16 with C in that type or fp32 (fp32 inputs with fp32 C only); the _FAST_ types take fp32 only. *rnd
 * gets the inputs' rounding. */
static bool types_supported(int compute, cudaDataType_t ab, cudaDataType_t bt, cudaDataType_t ct, enum rnd *rnd)
{
    if (ab != bt || !type_known(ab) || !type_known(ct))
        return false;
    switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        *rnd = RND_NONE;
        return ct == CUDA_R_32F || ct == ab;
    case CUBLAS_COMPUTE_32F_FAST_TF32: *rnd = RND_TF32; break;
    case CUBLAS_COMPUTE_32F_FAST_16BF: *rnd = RND_BF16; break;
    case CUBLAS_COMPUTE_32F_FAST_16F: *rnd = RND_F16; break;
    default: return false;
    }
    return ab == CUDA_R_32F && ct == CUDA_R_32F;
}

/* ---------------------------------------------------------------------------------------------------------
 * cuBLAS
 * --------------------------------------------------------------------------------------------------------- */

struct cublasContext {
    cudaStream_t stream; /* NULL: the legacy default stream */
    cublasMath_t math;
    cublasPointerMode_t pointer_mode;
    void *workspace;
    size_t workspace_bytes;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->math = CUBLAS_DEFAULT_MATH;
    h->pointer_mode = CUBLAS_POINTER_MODE_HOST;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* Ops already queued hold copies of everything they need, so the handle can go while they run. */
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
    case CUBLAS_FP32_EMULATED_BF16X9_MATH:
    case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH:
        handle->math = mode;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* cuBLAS requires the user workspace 256-byte aligned. The emulator needs none; it only keeps it. */
    if (((uintptr_t)workspace & 255u) != 0 || (!workspace && bytes > 0))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == CUBLAS_POINTER_MODE_HOST) {
        handle->pointer_mode = mode;
        return CUBLAS_STATUS_SUCCESS;
    }
    /* alpha and beta in device memory would have to be read by the op; nothing in the project needs it */
    return mode == CUBLAS_POINTER_MODE_DEVICE ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown error";
}

static bool op_valid(cublasOperation_t op)
{
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

static bool algo_valid(cublasGemmAlgo_t algo)
{
    return algo == CUBLAS_GEMM_DEFAULT || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
           (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
           algo == CUBLAS_GEMM_AUTOTUNE;
}

static int64_t max1(int64_t x)
{
    return x > 1 ? x : 1;
}

/* The legacy API's calls, all of them a strided batched GEMM with C = D: validates as cuBLAS does (the BLAS
 * rules: m, n, k >= 0, lda >= max(1, rows of A as stored), ldb likewise, ldc >= max(1, m)), then queues it.
 * A type combination cuBLAS does not offer is NOT_SUPPORTED, checked after the values. */
static cublasStatus_t legacy_gemm(cublasHandle_t h, const char *what, cublasOperation_t ta, cublasOperation_t tb,
                                  int m, int n, int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                  long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb,
                                  const void *beta, void *C, cudaDataType_t ct, int ldc, long long sc, int batch,
                                  int compute, bool math_mode_applies)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!op_valid(ta) || !op_valid(tb) || m < 0 || n < 0 || k < 0 || batch < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    bool trans_a = ta != CUBLAS_OP_N, trans_b = tb != CUBLAS_OP_N; /* OP_C is OP_T for real types */
    if (lda < max1(trans_a ? k : m) || ldb < max1(trans_b ? n : k) || ldc < max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    enum rnd rnd;
    if (!types_supported(compute, at, bt, ct, &rnd))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (math_mode_applies) {
        /* cublasMath_t: CUBLAS_TF32_TENSOR_OP_MATH lets single-precision routines run on TF32 tensor cores;
         * the deprecated CUBLAS_TENSOR_OP_MATH is documented as the same as CUBLAS_COMPUTE_32F_FAST_16F. */
        unsigned base = (unsigned)h->math & 0xfu;
        if (base == CUBLAS_TF32_TENSOR_OP_MATH)
            rnd = RND_TF32;
        else if (base == CUBLAS_TENSOR_OP_MATH)
            rnd = RND_F16;
    }
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    struct emu_gemm *g = calloc(1, sizeof *g);
    if (!g)
        return CUBLAS_STATUS_ALLOC_FAILED;
    g->what = what;
    g->d_name = "C";
    g->m = m;
    g->n = n;
    g->k = k;
    g->batch = batch;
    g->a = (struct emu_mat){.p = A, .t = at, .ld = lda, .stride = sa, .trans = trans_a};
    g->b = (struct emu_mat){.p = B, .t = bt, .ld = ldb, .stride = sb, .trans = trans_b};
    g->d = (struct emu_mat){.p = C, .t = ct, .ld = ldc, .stride = sc};
    /* host pointer mode (the only one offered): the scalars are read now, as cuBLAS reads them at the call */
    memcpy(&g->alpha, alpha, sizeof g->alpha);
    memcpy(&g->beta, beta, sizeof g->beta);
    if (g->beta != 0.0f)
        g->c = g->d;
    else
        g->c = (struct emu_mat){.p = NULL, .t = ct}; /* C is not read: its NaNs cannot reach D */
    g->rnd = rnd;
    return gemm_submit(g, h->stream);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                              int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc)
{
    return legacy_gemm(handle, "cublasSgemm", transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B,
                       CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, true);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batchCount)
{
    return legacy_gemm(handle, "cublasSgemmStridedBatched", transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda,
                       strideA, B, CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount,
                       CUBLAS_COMPUTE_32F, true);
}

/* cublasGemmEx's compute type says what it computes; the handle's math mode is not consulted (a choice: the
 * project always names the compute type, and cuBLAS documents the math mode for the typed routines). */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    if (handle && !algo_valid(algo))
        return CUBLAS_STATUS_INVALID_VALUE;
    return legacy_gemm(handle, "cublasGemmEx", transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
                       beta, C, Ctype, ldc, 0, 1, computeType, false);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo)
{
    if (handle && !algo_valid(algo))
        return CUBLAS_STATUS_INVALID_VALUE;
    return legacy_gemm(handle, "cublasGemmStridedBatchedEx", transa, transb, m, n, k, alpha, A, Atype, lda,
                       strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, false);
}

/* ---------------------------------------------------------------------------------------------------------
 * cuBLASLt
 *
 * The descriptors live inside cuBLASLt's semi-opaque structs (so both cublasLt*Create and the inline
 * cublasLt*Init on caller storage work), copied in and out with memcpy: the caller's storage has the opaque
 * type, never ours.
 * --------------------------------------------------------------------------------------------------------- */

#define LT_MAGIC_LAYOUT 0x4c74654cu /* a descriptor that was never created or initialised is refused */
#define LT_MAGIC_DESC 0x4c746544u
#define LT_MAGIC_PREF 0x4c746550u
#define LT_ALGO_ID 0x454d55u /* the one algorithm the heuristic offers */

struct cublasLtContext {
    int unused; /* the handle is never read: a cublasHandle_t cast to cublasLtHandle_t works too, as on cuBLAS */
};

struct lt_layout {
    uint32_t magic;
    uint32_t type;
    int32_t order;
    int32_t batch;
    uint64_t rows, cols;
    int64_t ld, stride, plane_offset;
    uint32_t batch_mode;
};
_Static_assert(sizeof(struct lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout outgrows cuBLASLt's");

struct lt_desc {
    uint32_t magic;
    int32_t compute, scale, pointer_mode, transa, transb, transc, fill_mode;
    uint32_t epilogue;
    int32_t sm_count, aux_type, bias_type;
    int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, aux_scale_mode, d_out_scale_mode;
    int8_t fast_accum;
    const void *bias;
    int64_t bias_stride;
    void *aux;
    int64_t aux_ld, aux_stride, alpha_stride;
    const void *a_scale, *b_scale, *c_scale, *d_scale, *amax_d, *aux_scale, *aux_amax, *d_out_scale;
    const void *emulation;
};
_Static_assert(sizeof(struct lt_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc outgrows cuBLASLt's");

struct lt_pref {
    uint32_t magic;
    uint32_t search_mode;
    uint64_t max_workspace;
    uint32_t reduction_mask;
    uint32_t align_a, align_b, align_c, align_d;
    float max_waves;
    uint64_t impl_mask;
};
_Static_assert(sizeof(struct lt_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref outgrows cuBLASLt's");

/* One settable attribute: where it lives in our struct and the exact size cuBLASLt documents for it. */
struct lt_attr {
    int attr;
    size_t off, size;
};

#define A_(e, s, f) {e, offsetof(s, f), sizeof(((s *)0)->f)}

static const struct lt_attr layout_attrs[] = {
    A_(CUBLASLT_MATRIX_LAYOUT_TYPE, struct lt_layout, type),
    A_(CUBLASLT_MATRIX_LAYOUT_ORDER, struct lt_layout, order),
    A_(CUBLASLT_MATRIX_LAYOUT_ROWS, struct lt_layout, rows),
    A_(CUBLASLT_MATRIX_LAYOUT_COLS, struct lt_layout, cols),
    A_(CUBLASLT_MATRIX_LAYOUT_LD, struct lt_layout, ld),
    A_(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, struct lt_layout, batch),
    A_(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, struct lt_layout, stride),
    A_(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, struct lt_layout, plane_offset),
    A_(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, struct lt_layout, batch_mode),
};

static const struct lt_attr desc_attrs[] = {
    A_(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, struct lt_desc, compute),
    A_(CUBLASLT_MATMUL_DESC_SCALE_TYPE, struct lt_desc, scale),
    A_(CUBLASLT_MATMUL_DESC_POINTER_MODE, struct lt_desc, pointer_mode),
    A_(CUBLASLT_MATMUL_DESC_TRANSA, struct lt_desc, transa),
    A_(CUBLASLT_MATMUL_DESC_TRANSB, struct lt_desc, transb),
    A_(CUBLASLT_MATMUL_DESC_TRANSC, struct lt_desc, transc),
    A_(CUBLASLT_MATMUL_DESC_FILL_MODE, struct lt_desc, fill_mode),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE, struct lt_desc, epilogue),
    A_(CUBLASLT_MATMUL_DESC_BIAS_POINTER, struct lt_desc, bias),
    A_(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, struct lt_desc, bias_stride),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, struct lt_desc, aux),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, struct lt_desc, aux_ld),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, struct lt_desc, aux_stride),
    A_(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, struct lt_desc, alpha_stride),
    A_(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, struct lt_desc, sm_count),
    A_(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, struct lt_desc, a_scale),
    A_(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, struct lt_desc, b_scale),
    A_(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, struct lt_desc, c_scale),
    A_(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, struct lt_desc, d_scale),
    A_(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, struct lt_desc, amax_d),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, struct lt_desc, aux_type),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, struct lt_desc, aux_scale),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, struct lt_desc, aux_amax),
    A_(CUBLASLT_MATMUL_DESC_FAST_ACCUM, struct lt_desc, fast_accum),
    A_(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, struct lt_desc, bias_type),
    A_(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, struct lt_desc, a_scale_mode),
    A_(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, struct lt_desc, b_scale_mode),
    A_(CUBLASLT_MATMUL_DESC_C_SCALE_MODE, struct lt_desc, c_scale_mode),
    A_(CUBLASLT_MATMUL_DESC_D_SCALE_MODE, struct lt_desc, d_scale_mode),
    A_(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, struct lt_desc, aux_scale_mode),
    A_(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, struct lt_desc, d_out_scale),
    A_(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, struct lt_desc, d_out_scale_mode),
    A_(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, struct lt_desc, emulation),
};

static const struct lt_attr pref_attrs[] = {
    A_(CUBLASLT_MATMUL_PREF_SEARCH_MODE, struct lt_pref, search_mode),
    A_(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, struct lt_pref, max_workspace),
    A_(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, struct lt_pref, reduction_mask),
    A_(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, struct lt_pref, align_a),
    A_(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, struct lt_pref, align_b),
    A_(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, struct lt_pref, align_c),
    A_(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, struct lt_pref, align_d),
    A_(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, struct lt_pref, max_waves),
    A_(CUBLASLT_MATMUL_PREF_IMPL_MASK, struct lt_pref, impl_mask),
};

#undef A_

static const struct lt_attr *attr_find(const struct lt_attr *t, size_t n, int attr)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].attr == attr)
            return &t[i];
    return NULL;
}

/* Loads the descriptor of `size` bytes at `opaque` into `mine`, checking its magic. */
static bool lt_load(void *mine, const void *opaque, size_t size, uint32_t magic)
{
    if (!opaque)
        return false;
    memcpy(mine, opaque, size);
    uint32_t got;
    memcpy(&got, mine, sizeof got);
    return got == magic;
}

/* cublasLt*SetAttribute: the value must be exactly the attribute's documented size. */
static cublasStatus_t lt_set(void *opaque, size_t size, uint32_t magic, const struct lt_attr *t, size_t n, int attr,
                             const void *buf, size_t bytes)
{
    unsigned char mine[sizeof(cublasLtMatmulDescOpaque_t)];
    const struct lt_attr *a = attr_find(t, n, attr);
    if (!lt_load(mine, opaque, size, magic) || !a || !buf || bytes != a->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(mine + a->off, buf, bytes);
    memcpy(opaque, mine, size);
    return CUBLAS_STATUS_SUCCESS;
}

/* cublasLt*GetAttribute: bytes == 0 asks for the size; otherwise it must be the attribute's size. */
static cublasStatus_t lt_get(const void *opaque, size_t size, uint32_t magic, const struct lt_attr *t, size_t n,
                             int attr, void *buf, size_t bytes, size_t *written)
{
    unsigned char mine[sizeof(cublasLtMatmulDescOpaque_t)];
    const struct lt_attr *a = attr_find(t, n, attr);
    if (!lt_load(mine, opaque, size, magic) || !a)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (bytes == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = a->size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || bytes != a->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, mine + a->off, bytes);
    if (written)
        *written = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasLtContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    return cublasGetStatusName(status);
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return cublasGetStatusString(status);
}

size_t cublasLtGetVersion(void)
{
    return CUBLAS_VERSION;
}

/* Matrix layouts */

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t layout, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!layout)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(struct lt_layout))
        return CUBLAS_STATUS_ALLOC_FAILED;
    struct lt_layout l = {.magic = LT_MAGIC_LAYOUT, .type = (uint32_t)type, .order = CUBLASLT_ORDER_COL,
                          .batch = 1, .rows = rows, .cols = cols, .ld = ld,
                          .batch_mode = CUBLASLT_BATCH_MODE_STRIDED};
    memcpy(layout, &l, sizeof l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (!layout)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayout_t l = calloc(1, sizeof *l);
    if (!l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasLtMatrixLayoutInit_internal(l, sizeof *l, type, rows, cols, ld);
    *layout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    free(layout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t bytes)
{
    return lt_set(layout, sizeof(struct lt_layout), LT_MAGIC_LAYOUT, layout_attrs,
                  sizeof layout_attrs / sizeof layout_attrs[0], attr, buf, bytes);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void *buf, size_t bytes, size_t *written)
{
    return lt_get(layout, sizeof(struct lt_layout), LT_MAGIC_LAYOUT, layout_attrs,
                  sizeof layout_attrs / sizeof layout_attrs[0], attr, buf, bytes, written);
}

/* Matmul descriptors */

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc, size_t size, cublasComputeType_t compute,
                                               cudaDataType_t scale)
{
    if (!desc)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(struct lt_desc))
        return CUBLAS_STATUS_ALLOC_FAILED;
    /* the documented defaults: OP_N, host pointers, the full fill mode, DEFAULT epilogue, aux and bias types
     * unset (-1, meaning D's type) */
    struct lt_desc d = {.magic = LT_MAGIC_DESC, .compute = compute, .scale = scale,
                        .pointer_mode = CUBLASLT_POINTER_MODE_HOST, .transa = CUBLAS_OP_N,
                        .transb = CUBLAS_OP_N, .transc = CUBLAS_OP_N, .fill_mode = CUBLAS_FILL_MODE_FULL,
                        .epilogue = CUBLASLT_EPILOGUE_DEFAULT, .aux_type = -1, .bias_type = -1};
    memcpy(desc, &d, sizeof d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    if (!desc)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulDesc_t d = calloc(1, sizeof *d);
    if (!d)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasLtMatmulDescInit_internal(d, sizeof *d, compute, scale);
    *desc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    free(desc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t bytes)
{
    return lt_set(desc, sizeof(struct lt_desc), LT_MAGIC_DESC, desc_attrs, sizeof desc_attrs / sizeof desc_attrs[0],
                  attr, buf, bytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              void *buf, size_t bytes, size_t *written)
{
    return lt_get(desc, sizeof(struct lt_desc), LT_MAGIC_DESC, desc_attrs, sizeof desc_attrs / sizeof desc_attrs[0],
                  attr, buf, bytes, written);
}

/* Preferences: kept and read back; the single algorithm needs no workspace, so none of them can exclude it. */

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(struct lt_pref))
        return CUBLAS_STATUS_ALLOC_FAILED;
    struct lt_pref p = {.magic = LT_MAGIC_PREF, .search_mode = CUBLASLT_SEARCH_BEST_FIT,
                        .reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK, .align_a = 256, .align_b = 256,
                        .align_c = 256, .align_d = 256, .impl_mask = UINT64_MAX};
    memcpy(pref, &p, sizeof p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreference_t p = calloc(1, sizeof *p);
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasLtMatmulPreferenceInit_internal(p, sizeof *p);
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t bytes)
{
    return lt_set(pref, sizeof(struct lt_pref), LT_MAGIC_PREF, pref_attrs, sizeof pref_attrs / sizeof pref_attrs[0],
                  attr, buf, bytes);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                    size_t bytes, size_t *written)
{
    return lt_get(pref, sizeof(struct lt_pref), LT_MAGIC_PREF, pref_attrs, sizeof pref_attrs / sizeof pref_attrs[0],
                  attr, buf, bytes, written);
}

/* The epilogue's flags; false for one the emulator does not implement.
 *
 * Semantics (cublasLt.h's cublasLtEpilogue_t and cublasLtMatmulDescAttributes_t, CUDA 13.1):
 * - BIAS: "Bias vector length must match matrix D rows ... broadcasted to all columns and added before applying
 *   final postprocessing": x = alpha op(A) op(B) + beta C + bias[i], then ReLU or GELU for the _BIAS forms.
 * - GELU_AUX(_BIAS): the aux matrix is "GELU input" (after the bias), m x n, leading dimension
 *   EPILOGUE_AUX_LD (>= D's rows), in D's type unless EPILOGUE_AUX_DATA_TYPE says otherwise.
 * - DGELU: D = (alpha op(A) op(B) + beta C) * gelu'(aux), aux the forward pass's GELU input.
 * - DGELU_BGRAD, DRELU_BGRAD: as DGELU/DRELU, and the bias gradient (BIAS_POINTER, D's rows long, D's
 *   type) is each row's sum of that gradient, i.e. over D's columns.
 * - BGRADA: "The bias size corresponds to the number of rows of the matrix D. The reduction happens over the
 *   GEMM's k dimension": bias[i] = sum_p op(A)[i, p]. BGRADB: D's columns long, bias[j] = sum_p op(B)[p, j].
 *   D is the plain product. Neither sum is scaled by alpha.
 * - RELU_AUX(_BIAS): the aux is a bit mask, bit j * ld + i (ld in bits, a multiple of 128, byte i / 8's bit
 *   i % 8) set where the ReLU input is >= 0; DRELU(_BGRAD) zeroes the gradient where the bit is clear. Bits
 *   for rows past m are left as they were.
 * The details the header leaves open (the aux and bias-gradient contents, BGRADA/B needing op(A) = N /
 * op(B) = T, the missing-pointer answers in lt_check) follow what a test of cuBLASLt 13.0 on an RTX 3060
 * observed, the one source of that behaviour found. */
static bool lt_epilogue_flags(uint32_t e, unsigned *flags)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: *flags = 0; return true;
    case CUBLASLT_EPILOGUE_RELU: *flags = EPI_RELU; return true;
    case CUBLASLT_EPILOGUE_RELU_AUX: *flags = EPI_RELU | EPI_AUX_OUT; return true;
    case CUBLASLT_EPILOGUE_BIAS: *flags = EPI_BIAS; return true;
    case CUBLASLT_EPILOGUE_RELU_BIAS: *flags = EPI_BIAS | EPI_RELU; return true;
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: *flags = EPI_BIAS | EPI_RELU | EPI_AUX_OUT; return true;
    case CUBLASLT_EPILOGUE_DRELU: *flags = EPI_DRELU; return true;
    case CUBLASLT_EPILOGUE_DRELU_BGRAD: *flags = EPI_DRELU | EPI_BGRAD; return true;
    case CUBLASLT_EPILOGUE_GELU: *flags = EPI_GELU; return true;
    case CUBLASLT_EPILOGUE_GELU_AUX: *flags = EPI_GELU | EPI_AUX_OUT; return true;
    case CUBLASLT_EPILOGUE_GELU_BIAS: *flags = EPI_BIAS | EPI_GELU; return true;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: *flags = EPI_BIAS | EPI_GELU | EPI_AUX_OUT; return true;
    case CUBLASLT_EPILOGUE_DGELU: *flags = EPI_DGELU; return true;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: *flags = EPI_DGELU | EPI_BGRAD; return true;
    case CUBLASLT_EPILOGUE_BGRADA: *flags = EPI_BGRADA; return true;
    case CUBLASLT_EPILOGUE_BGRADB: *flags = EPI_BGRADB; return true;
    }
    return false;
}

/* A layout's shape as the matmul reads it. */
static cublasStatus_t lt_layout_load(cublasLtMatrixLayout_t opaque, struct lt_layout *l)
{
    if (!lt_load(l, opaque, sizeof *l, LT_MAGIC_LAYOUT))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* column-major, strided batches, interleaved complex only */
    if (l->order != CUBLASLT_ORDER_COL || l->plane_offset != 0 || l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->rows > INT32_MAX || l->cols > INT32_MAX || l->batch < 1 || l->ld < max1((int64_t)l->rows))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

/* Everything cublasLtMatmul checks, into g; pointers false for the heuristic, which checks the configuration
 * only (it is not given the matrices, and cuBLASLt's heuristic accepts a missing aux or bias pointer that the
 * matmul refuses). */
static cublasStatus_t lt_check(cublasLtMatmulDesc_t opaque_desc, cublasLtMatrixLayout_t la,
                               cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                               bool pointers, struct emu_gemm *g)
{
    struct lt_desc d;
    struct lt_layout a, b, c, o;
    cublasStatus_t s;
    if (!lt_load(&d, opaque_desc, sizeof d, LT_MAGIC_DESC))
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((s = lt_layout_load(la, &a)) || (s = lt_layout_load(lb, &b)) || (s = lt_layout_load(lc, &c)) ||
        (s = lt_layout_load(ld, &o)))
        return s;
    if (!op_valid(d.transa) || !op_valid(d.transb) || !op_valid(d.transc))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* "Transform of matrix C ... Currently only CUBLAS_OP_N is supported"; host scalars only (device ones would
     * have to be read by the op); the full fill mode only */
    if (d.transc != CUBLAS_OP_N || d.pointer_mode != CUBLASLT_POINTER_MODE_HOST ||
        d.fill_mode != CUBLAS_FILL_MODE_FULL || d.scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    enum rnd rnd;
    /* the regular kernels write D in C's type */
    if (!types_supported(d.compute, (cudaDataType_t)a.type, (cudaDataType_t)b.type, (cudaDataType_t)o.type,
                         &rnd) ||
        c.type != o.type)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* fp8-style scaling and amax outputs: "If set for an unsupported matrix data, scale, and compute type
     * combination, calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE" */
    if (d.a_scale || d.b_scale || d.c_scale || d.d_scale || d.amax_d || d.aux_scale || d.aux_amax ||
        d.d_out_scale || d.a_scale_mode || d.b_scale_mode || d.c_scale_mode || d.d_scale_mode ||
        d.aux_scale_mode || d.d_out_scale_mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    bool ta = d.transa != CUBLAS_OP_N, tb = d.transb != CUBLAS_OP_N;
    int64_t m = (int64_t)o.rows, n = (int64_t)o.cols, k = (int64_t)(ta ? a.rows : a.cols);
    if ((int64_t)(ta ? a.cols : a.rows) != m || (int64_t)(tb ? b.rows : b.cols) != n ||
        (int64_t)(tb ? b.cols : b.rows) != k || (int64_t)c.rows != m || (int64_t)c.cols != n)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a.batch != o.batch || b.batch != o.batch || c.batch != o.batch)
        return CUBLAS_STATUS_INVALID_VALUE;
    unsigned epi;
    if (!lt_epilogue_flags(d.epilogue, &epi))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (((epi & EPI_BGRADA) && ta) || ((epi & EPI_BGRADB) && !tb))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    bool mask = epi & (EPI_RELU | EPI_DRELU), aux = epi & (EPI_AUX_OUT | EPI_DRELU | EPI_DGELU);
    cudaDataType_t aux_t = (cudaDataType_t)o.type;
    if (aux && mask) {
        /* "ReLu bit-mask matrix leading dimension in elements (i.e. bits) ... Must be divisible by 128 and be no
         * less than the number of rows in the output matrix"; the batch stride likewise divisible by 128 */
        if (d.aux_ld < m || d.aux_ld % 128 != 0 || d.aux_stride % 128 != 0)
            return CUBLAS_STATUS_INVALID_VALUE;
    } else if (aux) {
        /* GELU input: ld no less than D's rows; the card did not insist on the documented multiple of 8. Its
         * type is D's: another one was refused with INVALID_VALUE. */
        if (d.aux_ld < m || (d.aux_type != -1 && d.aux_type != (int32_t)o.type))
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    bool bias = epi & (EPI_BIAS | EPI_BGRAD | EPI_BGRADA | EPI_BGRADB);
    cudaDataType_t bias_t = (cudaDataType_t)o.type;
    if (bias && d.bias_type != -1) {
        /* D's type, or fp32 for a 16-bit D */
        if (d.bias_type != (int32_t)o.type && d.bias_type != CUDA_R_32F)
            return CUBLAS_STATUS_INVALID_VALUE;
        bias_t = (cudaDataType_t)d.bias_type;
    }
    if (pointers) {
        if (aux && !d.aux)
            /* as observed: a forward epilogue without its aux output is not supported, a backward one without
             * its aux input is an invalid value */
            return epi & EPI_AUX_OUT ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
        if (bias && !d.bias)
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    *g = (struct emu_gemm){
        .what = "cublasLtMatmul",
        .d_name = "D",
        .m = m,
        .n = n,
        .k = k,
        .batch = o.batch,
        .a = {.t = (cudaDataType_t)a.type, .ld = a.ld, .stride = a.stride, .trans = ta},
        .b = {.t = (cudaDataType_t)b.type, .ld = b.ld, .stride = b.stride, .trans = tb},
        .c = {.t = (cudaDataType_t)c.type, .ld = c.ld, .stride = c.stride},
        .d = {.t = (cudaDataType_t)o.type, .ld = o.ld, .stride = o.stride},
        .rnd = rnd,
        .epi = epi,
        .bias = {.p = bias ? (void *)d.bias : NULL, .t = bias_t, .stride = d.bias_stride},
        .aux = {.p = aux ? d.aux : NULL, .t = aux_t, .ld = d.aux_ld, .stride = d.aux_stride},
    };
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                              cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    struct lt_pref p;
    if (requested <= 0 || !results || !returned || !lt_load(&p, pref, sizeof p, LT_MAGIC_PREF))
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    struct emu_gemm g;
    cublasStatus_t s = lt_check(desc, la, lb, lc, ld, false, &g);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = LT_ALGO_ID;
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* The algorithm and the workspace are accepted as given and not used: there is one way to compute, and it
 * needs no device workspace. */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream)
{
    (void)algo;
    (void)workspace;
    (void)workspace_bytes;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    struct emu_gemm g;
    cublasStatus_t s = lt_check(desc, la, lb, lc, ld, true, &g);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (!alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&g.alpha, alpha, sizeof g.alpha);
    memcpy(&g.beta, beta, sizeof g.beta);
    /* in place (C == D) is allowed with the same layout; any other overlap would read what was written */
    if (C == D && g.beta != 0.0f && (g.c.ld != g.d.ld || g.c.stride != g.d.stride))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (g.m == 0 || g.n == 0)
        return CUBLAS_STATUS_SUCCESS;
    g.a.p = A;
    g.b.p = B;
    g.c.p = g.beta != 0.0f ? C : NULL; /* not read at all when beta == 0 */
    g.d.p = D;
    struct emu_gemm *op = malloc(sizeof *op);
    if (!op)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *op = g;
    return gemm_submit(op, stream);
}

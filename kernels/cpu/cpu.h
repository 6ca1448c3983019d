/* Private to the CPU backend: the functions that kernels_cpu() puts in its table, and the helpers
 * shared by its files. */
#ifndef FSDP_KERNELS_CPU_CPU_H
#define FSDP_KERNELS_CPU_CPU_H

#include "kernels/kernels.h"

/* The build targets baseline x86-64 (SSE2) so binaries run on any machine; hot inner loops are compiled
 * again for AVX2/AVX-512 and picked at load time (ifunc). OpenMP-outlined bodies would not inherit the
 * clones, so the cloned functions are the per-chunk/per-row workers called from the parallel loops.
 * -DKERNELS_NO_SIMD_CLONES builds the baseline code only (to test it on a machine with AVX-512). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(KERNELS_NO_SIMD_CLONES)
#define CPU_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_SIMD_CLONES
#endif

/* ISO C mode (-std=c17) makes GCC keep a * b + c as two roundings (-ffp-contract=off), so the AVX2 and
 * AVX-512 clones of a polynomial loop issue a multiply and an add where one FMA would do: about a fifth
 * of GELU's time. Loops whose tolerance allows the (more accurate) fused form opt in with this. */
#if defined(__GNUC__) && !defined(__clang__)
#define CPU_FP_CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define CPU_FP_CONTRACT
#endif

/* Elementwise ops split their range into chunks of this many elements, one OpenMP iteration each;
 * large enough that a chunk amortises the dispatch, small enough to balance two or more threads. */
#define CPU_CHUNK 16384

void *cpu_mem_alloc(size_t bytes);
void cpu_mem_free(void *ptr);
int cpu_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind);
int cpu_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                   enum kernels_copy_kind kind);
int cpu_mem_set(void *dst, int value, size_t bytes);
int cpu_synchronize(void);
int cpu_set_matmul_dtype(enum dtype dtype);
double cpu_peak_flops(void);

/* ---- onednn.c: what oneDNN runs on this CPU, and its matmuls cached per shape ---- */
struct cpu_isa {
    bool usable;  /* oneDNN's CPU engine exists */
    bool avx512;  /* oneDNN runs AVX-512 kernels (avx512_core or better) */
    bool bf16;    /* native bf16 dot products (AVX512_BF16, or AMX): bf16 matmuls at twice the fp32 rate */
    bool capped;  /* FSDP_TEST_CPU_NO_BF16 capped oneDNN below bf16 */
    char name[32]; /* oneDNN's effective ISA, e.g. "avx512_core_bf16" */
};
/* Asked of oneDNN once per process (FSDP_TEST_CPU_NO_BF16 caps it first); never NULL. */
const struct cpu_isa *cpu_isa_get(void);
/* c(m, n) = alpha op(a) op(b) + beta c (+ bias(n) on every row when bias != NULL), row-major with leading
 * dimensions, op = transpose when t* != 0; a and b in dt (f32 or bf16), c and bias f32. The primitive of
 * each distinct problem is made once and cached. */
int cpu_onednn_matmul(enum dtype dt, int ta, int tb, int m, int n, int k, float alpha, const void *a, int lda,
                      const void *b, int ldb, float beta, float *c, int ldc, const float *bias);
struct cpu_onednn_stats {
    unsigned long long created, hits, evicted, executed; /* primitives made, cache hits, dropped, calls */
};
struct cpu_onednn_stats cpu_onednn_stats_get(void);
/* Drops every cached primitive (tests of the cache). */
void cpu_onednn_cache_clear(void);

/* ---- lowp.c: the bf16 operands of the bf16 matmuls ---- */
/* The ranges bound with the table's lowp_bind: [f32, f32 + n) has a bf16 copy at lp, same indices. */
int cpu_lowp_bind(const float *f32, const void *lp, size_t n);
int cpu_lowp_unbind(const float *f32);
/* The bf16 copy of the elements [p, p + span) when one bound range holds all of them, else NULL. */
const uint16_t *cpu_lowp_find(const float *p, size_t span);
/* dst (rows x cols, leading dimension cols) = src (rows x cols, leading dimension ld) rounded to bf16 as
 * common/dtype.h rounds (nearest even, NaN kept quiet), in parallel over rows when large. */
void cpu_round_bf16(uint16_t *dst, const float *src, size_t rows, size_t cols, size_t ld);
/* The same for a contiguous (rows x cols) src on the calling thread, adding each row into acc (cols floats)
 * in the same pass, rows in order: a bias gradient from the read that rounds dy. */
void cpu_round_bf16_colsum(uint16_t *dst, float *acc, const float *src, size_t rows, size_t cols);
/* Scratch slot `slot` (0..CPU_SCRATCH_SLOTS-1) of the calling thread, at least `bytes` long: grown when a
 * larger operand comes, kept for the thread's life; NULL (error set) when memory runs out. */
#define CPU_SCRATCH_SLOTS 4
void *cpu_scratch(int slot, size_t bytes);
/* Bytes the calling thread's scratch holds now (reports and tests). */
size_t cpu_scratch_bytes(void);

/* ---- attention_bf16.c: one (batch, head) pair of attention on AVX512_BF16 dot products (head size 64) ---- */
int cpu_att16_usable(int hs);
/* Workspace bytes one pair's slot needs for a sequence of t tokens. */
size_t cpu_att16_slot_bytes(int t);
/* One query head against its key/value head: q, k, v rows (and dq, dk, dv) at leading dimension ld, out and
 * dout rows at ldo, lse of the pair; ws = the pair's slot. Backward adds into dq, dk, dv, so the query heads
 * of a grouped key/value head run one after another into the same dk, dv. window: attention_forward's (0 = full
 * causal). */
void cpu_att16_forward_pair(float *out, size_t ldo, float *lse, const float *q, const float *k, const float *v,
                            size_t ld, int t, int window, float scale, void *ws);
void cpu_att16_backward_pair(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                             const float *v, const float *out, size_t ld, size_t ldo, const float *lse, int t,
                             int window, float scale, void *ws);

/* ---- matmul.c: the dtype the matmuls compute in now (set_matmul_dtype, what this CPU supports) ---- */
enum dtype cpu_matmul_compute_dtype(void);
/* lowp_hold / lowp_release: in bf16 mode x is rounded into a buffer of the table's and bound until released. */
int cpu_lowp_hold(const float *x, size_t n);
int cpu_lowp_release(const float *x);
/* Whether an fp32 product of m x n x k runs on oneDNN (else OpenBLAS): FSDP_CPU_MATMUL, and for auto the
 * rule matmul.c documents. */
bool cpu_matmul_f32_onednn(int m, int n, int k);

int cpu_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out);
int cpu_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                        int n, int in, int out);
int cpu_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
             const float *b, int ldb, float beta, float *c, int ldc);

int cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int n, int c, float eps);
int cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int n, int c);

size_t cpu_attention_workspace_bytes(int b, int t, int c, int nh, int nkv);
int cpu_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                            int window, void *workspace);
int cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int b, int t, int c, int nh, int nkv, int window,
                             void *workspace);

int cpu_attention_cp_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const struct kernels_attention_cp *a);
int cpu_attention_cp_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *out, const float *lse,
                              const struct kernels_attention_cp *a);

int cpu_gelu_forward(float *out, const float *inp, size_t n);
int cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
int cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
int cpu_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                   const float *weight, const float *bias, int n, int c, float eps);
int cpu_residual_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b,
                                 const float *weight, int n, int c, float eps);
/* The fused residual add and norm of the two above (vector.c): after their checks (op names the call in the
 * messages; out must alias none of res, a, b), res = a + b row by row, each row then normalised by
 * row(ctx, i, res row i) while it is still in cache, where the two-op sequence would stream the whole residual
 * stream through memory once more. */
int cpu_residual_norm_rows(const char *op, float *res, const float *out, const float *a, const float *b, int n,
                           int c, float eps, void (*row)(void *ctx, int i, const float *x), void *ctx);
int cpu_scale(float *x, float s, size_t n);
int cpu_axpy(float *y, float a, const float *x, size_t n);
int cpu_sqnorm(double *result, const float *x, size_t n);
int cpu_sqnorm_sum(double *total, const float *const *xs, const size_t *ns, int count);
int cpu_grad_clip(struct kernels_grad_clip *out, const double *sq, int n, double loss_scale, double max_norm);
int cpu_cast(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
             size_t n);

int cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b,
                          int t, int c, int vocab);
int cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                           int t, int c, int vocab);

int cpu_crossentropy_forward_backward(float *losses, double *loss_acc, float *dlogits,
                                      const float *logits, const int32_t *targets, int n, int v, int vp,
                                      float dloss);

int cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int n, int c, float eps);
int cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         const float *rstd, int n, int c);
int cpu_rope_forward(float *x, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs, int npos);
int cpu_rope_backward(float *dx, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                      int npos);
int cpu_swiglu_forward(float *out, const float *gu, int n, int m);
int cpu_swiglu_backward(float *dgu, const float *gu, const float *dout, int n, int m);

int cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n,
              const struct kernels_adamw_params *hp);

#endif

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
int cpu_mem_set(void *dst, int value, size_t bytes);
int cpu_synchronize(void);
int cpu_set_matmul_dtype(enum dtype dtype);
double cpu_peak_flops(void);

int cpu_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out);
int cpu_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                        int n, int in, int out);
int cpu_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
             const float *b, int ldb, float beta, float *c, int ldc);

int cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int n, int c, float eps);
int cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int n, int c);

size_t cpu_attention_workspace_bytes(int b, int t, int c, int nh);
int cpu_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh,
                          void *workspace);
int cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int b, int t, int c, int nh, void *workspace);

int cpu_attention_cp_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const struct kernels_attention_cp *a);
int cpu_attention_cp_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *out, const float *lse,
                              const struct kernels_attention_cp *a);

int cpu_gelu_forward(float *out, const float *inp, size_t n);
int cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
int cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
int cpu_scale(float *x, float s, size_t n);
int cpu_axpy(float *y, float a, const float *x, size_t n);
int cpu_sqnorm(double *result, const float *x, size_t n);
int cpu_cast(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
             size_t n);

int cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b,
                          int t, int c, int vocab);
int cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                           int t, int c, int vocab);

int cpu_crossentropy_forward_backward(float *losses, double *loss_sum, float *dlogits,
                                      const float *logits, const int32_t *targets, int n, int v, int vp,
                                      float dloss);

int cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n,
              const struct kernels_adamw_params *hp);

#endif

/* Private to the CUDA backend: the functions that kernels_cuda() (table.cu) puts in its table, one kernel
 * file each. Included only by the .cu files (C++ compiled by nvcc); their shared helpers are in
 * cuda_common.h. */
#ifndef FSDP_KERNELS_CUDA_CUDA_H
#define FSDP_KERNELS_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "kernels/kernels.h"
}

void *cuda_mem_alloc(size_t bytes);
void cuda_mem_free(void *ptr);
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *ptr);
int cuda_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind);
int cuda_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                    enum kernels_copy_kind kind);
int cuda_mem_set(void *dst, int value, size_t bytes);
int cuda_synchronize(void);
int cuda_set_matmul_dtype(enum dtype dtype);

int cuda_matmul_forward_gelu(float *pre, float *y, const float *x, const float *w, const float *b, int n, int in,
                             int out);
int cuda_matmul_dx_dgelu(float *dpre, const float *dy, const float *w, const float *pre, int n, int in, int out);
int cuda_lowp_bind(const float *f32, const void *lp, size_t n);
int cuda_lowp_unbind(const float *f32);
int cuda_lowp_hold(const float *x, size_t n);
int cuda_lowp_release(const float *x);
int cuda_act_bind(void *p, size_t bytes, enum dtype dtype);
int cuda_act_unbind(void *p);
int cuda_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out);
int cuda_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                         int n, int in, int out);
int cuda_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

int cuda_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                    const float *weight, const float *bias, int n, int c, float eps);
int cuda_residual_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b,
                                  const float *weight, int n, int c, float eps);
int cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int n, int c, float eps);
int cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int n, int c);

size_t cuda_attention_workspace_bytes(int b, int t, int c, int nh, int nkv);
int cuda_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                             int window, void *workspace);
int cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, int b, int t, int c, int nh, int nkv, int window,
                             void *workspace);

int cuda_attention_cp_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              const struct kernels_attention_cp *a);
int cuda_attention_cp_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, const float *out, const float *lse,
                               const struct kernels_attention_cp *a);

int cuda_gelu_forward(float *out, const float *inp, size_t n);
int cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
int cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
int cuda_scale(float *x, float s, size_t n);
int cuda_axpy(float *y, float a, const float *x, size_t n);
int cuda_sqnorm(double *result, const float *x, size_t n);
int cuda_sqnorm_sum(double *total, const float *const *xs, const size_t *ns, int count);
int cuda_grad_clip(struct kernels_grad_clip *out, const double *sq, int n, double loss_scale, double max_norm);
int cuda_cast(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
              size_t n);

int cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b,
                           int t, int c, int vocab);
int cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                            int t, int c, int vocab);

int cuda_crossentropy_forward_backward(float *losses, double *loss_acc, float *dlogits,
                                       const float *logits, const int32_t *targets, int n, int v, int vp,
                                       float dloss);

int cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int n, int c, float eps);
int cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, int n, int c);
int cuda_rope_forward(float *x, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs, int npos);
int cuda_rope_backward(float *dx, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                       int npos);
int cuda_swiglu_forward(float *out, const float *gu, int n, int m);
int cuda_swiglu_backward(float *dgu, const float *gu, const float *dout, int n, int m);

int cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n,
               const struct kernels_adamw_params *hp);

#endif

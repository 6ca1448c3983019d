/* The compute ops table: every tensor operation the model families (GPT-2, Llama and its relatives) and
 * the optimizer need, as function pointers chosen once at start (`const struct kernels *k =
 * kernels_get("cpu");`), so the model and the FSDP engine have one code path for CPU and CUDA. A new device
 * is a new table, not an `if` in the model.
 *
 * Conventions shared by every backend (docs/kernels.md has the details):
 * - All pointers to tensors are device pointers of the backend (plain host memory for "cpu"); get them
 *   from k->mem_alloc. Pointers documented as "host" are ordinary host memory on every backend.
 * - Tensors are dense row-major fp32 unless stated. N = B*T rows of activations, C channels.
 * - matmul_forward/backward take W(in, out): y = x W + b (the layout of GPT-2's Conv1D weights). A family
 *   whose weights are stored (out, in), as nn.Linear keeps them (Llama), multiplies with gemm and a
 *   transposed operand instead, so no family's Hugging Face weights are transposed on load.
 * - Backward ops ADD (+=) into every gradient output they write (input and parameter gradients alike),
 *   so residual branches and micro-batch accumulation need no extra pass; the caller zeroes gradient
 *   buffers (k->mem_set) when it wants a fresh gradient. Exception: cross-entropy overwrites dlogits.
 *   Passing NULL for an optional gradient output skips computing it.
 * - Ops never allocate; ops that need scratch memory take a workspace sized by the matching
 *   *_workspace_bytes query (call the query with the same shapes, after the thread count is final).
 * - Every op returns 0 or a negative enum fsdp_error, with error_set() saying what was wrong.
 * - The CPU backend uses at most OMP_NUM_THREADS threads (OpenMP loops, OpenBLAS and oneDNN share the
 *   pool). Its bf16 matmuls round fp32 operands into scratch each calling thread owns (grown to the
 *   largest operand, kept), the one exception to "ops never allocate". */
#ifndef FSDP_KERNELS_KERNELS_H
#define FSDP_KERNELS_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

enum kernels_copy_kind {
    KERNELS_COPY_H2D = 0, /* host -> device */
    KERNELS_COPY_D2H = 1, /* device -> host */
    KERNELS_COPY_D2D = 2, /* device -> device */
};

/* AdamW hyper-parameters for one call (one parameter group / tensor). */
struct kernels_adamw_params {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay; /* decoupled: param -= lr * weight_decay * param; 0 disables (biases, norms) */
    float grad_scale;   /* grad is multiplied by this first (gradient clipping, loss scaling); 1 = none */
    int step;           /* 1-based step count, for the bias corrections 1 - beta^step */
    /* Optional, the table's memory (grad_clip's output): grad is also multiplied by *grad_scale_dev, read on the
     * device, so the host need not know the clip coefficient; NaN there skips the update (nothing changes). */
    const float *grad_scale_dev;
};

/* grad_clip's output, in the table's memory. */
struct kernels_grad_clip {
    double norm;       /* the global gradient norm before clipping, unscaled */
    float grad_scale;  /* what adamw's grad_scale_dev multiplies the gradients by; NaN: the norm is not finite */
};

/* grad_clip's arithmetic from the summed squared norm, shared by the tables (host and device code) so every
 * table gives the same bits. */
static inline DTYPE_HD void kernels_grad_clip_finish(struct kernels_grad_clip *out, double sq, double loss_scale,
                                                     double max_norm)
{
    double norm = sqrt(sq) / loss_scale;
    out->norm = norm;
    if (!isfinite(norm)) {
        out->grad_scale = NAN;
        return;
    }
    double coef = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
    out->grad_scale = (float)(coef / loss_scale);
}

/* Shapes of a context-parallel attention call: b sequences, tq local query rows at global positions
 * qpos[0..tq), tk key/value rows at global positions kpos[0..tk), width c in nh query heads, row stride ld.
 * nkv: key/value heads (grouped-query: query head h reads key/value head h / (nh / nkv)); 0 = nh.
 * qblock, kblock: rows of a sequence come in blocks, block-major over the batch, as an all-gather or an
 * all-to-all of the ranks' (b, block) rows lays them out: query i of sequence bb is row
 * ((i / qblock) * b + bb) * qblock + i % qblock (q, out, dq, dout), key j likewise with kblock (k, v, dk,
 * dv); 0 = one block (row bb * tq + i). The positions are indexed by i and j. ldkv: the row stride of k, v,
 * dk and dv (a gather of the key/value columns only); 0 = ld. */
struct kernels_attention_cp {
    int b, tq, tk, c, nh, ld;
    const int *qpos, *kpos;
    int nkv, qblock, kblock, ldkv;
    /* sliding window (attention_forward's): key j is also invisible when kpos[j] <= qpos[i] - window;
     * 0 = full causal */
    int window;
};

struct kernels {
    const char *name; /* "cpu", "cuda": for messages; what a backend can do is asked of the fields below */

    /* ---- what the device is: callers ask these, never the name ---- */
    /* Device memory is host memory: pointers from mem_alloc are ordinary host pointers that the host may
     * read and write directly (CPU). Then a checkpoint writes the shards from where they are, a gather of
     * state needs no device staging, and offload_params has nothing to move. */
    bool host_visible;
    /* The table whose memory is plain host memory and whose ops run on the host: where offload_params keeps
     * the shards, gradients and optimizer state and runs the optimizer. Host-visible tables return
     * themselves. */
    const struct kernels *(*host)(void);
    /* The comm backend (comm_options.backend) whose collectives move this table's memory: "cpu" for host
     * memory, "nccl" for CUDA device memory. */
    const char *comm_backend;
    /* The dtype that mixed precision "auto" gathers and computes in: bf16 on CUDA (tensor cores); fp32 on
     * the CPU, where bf16 compute is opt-in (mixed_precision = bf16) because it changes the numbers of a
     * run that asked for nothing. */
    enum dtype auto_dtype;
    /* The dtypes (bits DTYPE_BIT(d)) whose matmuls this table runs natively once set_matmul_dtype
     * selects them: 16-bit operands, fp32 accumulation, faster than fp32. Decided when the table is first
     * made: the CPU backend has bf16 where oneDNN finds AVX512_BF16 or AMX on this CPU, and no fp16. A dtype
     * outside the set still works: its matmuls compute in fp32 (on the parameters as rounded). */
    unsigned matmul_dtypes;
    /* Peak FLOP/s of this rank's share of the device, for the MFU: a short measurement, run by every rank at
     * once so that each sees its share. NULL where the backend cannot tell (CUDA: the tensor-core peak
     * depends on the dtype and the clocks; FSDP_PEAK_TFLOPS gives it). */
    double (*peak_flops)(void);

    /* ---- device memory: one path for CPU and CUDA ---- */
    /* Named mem_* because libc may define memcpy/free as macros. 64-byte aligned; NULL (and
     * error_set) on failure; mem_free(NULL) is a no-op. */
    void *(*mem_alloc)(size_t bytes);
    void (*mem_free)(void *ptr);
    /* Host memory that device copies move fastest: page-locked (pinned) on CUDA, where H2D/D2H copies of
     * pageable memory go through a staging buffer at a fraction of the bus speed and cannot overlap
     * compute; plain aligned memory on CPU. offload_params keeps the shards, gradients and optimizer
     * state in it. Same contract as mem_alloc/mem_free. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *ptr);
    /* Host to device returns once the host buffer may be reused (on CUDA the copy itself stays queued behind
     * the ops, from pinned staging); device to host returns once the bytes are in the host buffer (waiting
     * for the ops queued before); device to device is queued like an op (overlap allowed, as memmove). */
    int (*mem_copy)(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind);
    /* Strided copy: rows of width bytes, row r from src + r * spitch to dst + r * dpitch (pitches in bytes,
     * each >= width), in one call (on CUDA one cudaMemcpy2DAsync instead of a copy per row: packing columns
     * of many rows, e.g. the key/value columns of qkv). Returns like mem_copy for its kind. The two regions
     * (first row to end of last row) must not overlap: FSDP_EINVAL. */
    int (*mem_copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                      enum kernels_copy_kind kind);
    int (*mem_set)(void *dst, int value, size_t bytes);
    /* Waits for all queued work (no-op on CPU). */
    int (*synchronize)(void);
    /* What matmul_*, gemm and attention compute in from now on (process-wide): DTYPE_F32, exact fp32 (the
     * default); DTYPE_BF16 or DTYPE_F16, the mixed-precision modes: operands rounded to 16 bits, products
     * accumulated in fp32 (CUDA: cuBLAS CUBLAS_COMPUTE_32F_FAST_16BF / _16F; CPU: oneDNN's bf16 matmul and
     * bf16 dot products in attention). A dtype outside matmul_dtypes computes in fp32 (the CPU says so in
     * one log line). Every table accepts the three dtypes. */
    int (*set_matmul_dtype)(enum dtype dtype);
    /* Optional (NULL where the table rounds its operands itself): tells the table that [f32, f32 + n) has a
     * copy in the matmul dtype at lp (same indices), e.g. gathered parameters that arrived in bf16. While
     * bound, a matmul or gemm operand that lies inside the range is read from lp as it is instead of being
     * rounded from fp32, so the two must hold the same values (lp = f32 rounded). Ranges must not overlap;
     * lowp_unbind(f32) before the memory is reused. */
    int (*lowp_bind)(const float *f32, const void *lp, size_t n);
    int (*lowp_unbind)(const float *f32);
    /* Optional (NULL where nothing is rounded twice): the caller promises that [x, x + n) stays as it is until
     * lowp_release(x), so a table that computes in a 16-bit dtype may round it once now for every matmul
     * that reads it before then (as if bound); in fp32 nothing happens. For an operand that two products
     * read in a row: a linear layer's dy (its dx and its dW), the LM head's dlogits. A range that is bound
     * already is left as it is. */
    int (*lowp_hold)(const float *x, size_t n);
    int (*lowp_release)(const float *x);
    /* Activation storage (the activations a model keeps for backward, in the matmul dtype, as bf16 autocast
     * and llm.c keep them): the dtypes (bits DTYPE_BIT(d)) an act_bind range may hold; DTYPE_F32 alone where
     * the table has none (then act_bind is NULL). act_bind marks [p, p + bytes) as holding elements of dtype
     * (a 16-bit dtype of act_dtypes, which must be the matmul dtype whenever an op reads or writes there):
     * the arguments marked [act] below that point inside it hold that dtype: the pointer (typed float * for
     * the ops' one signature) is the address of the first 16-bit element, and a tensor of n elements spans 2n
     * bytes. A 16-bit [act] output holds the fp32 result rounded to nearest even, so a matmul (or attention,
     * on qkv) that reads it sees the bits it would have rounded from fp32 itself; the readers that compute in
     * fp32 (attention_backward on `out`, the SwiGLU on gate and up) read the rounded values. Arguments not
     * marked [act] must not point there (the CUDA table refuses those it checks). Ranges must not overlap;
     * act_unbind(p) before the memory is reused. */
    unsigned act_dtypes;
    int (*act_bind)(void *p, size_t bytes, enum dtype dtype);
    int (*act_unbind)(void *p);

    /* ---- matmul ---- */
    /* y(n, out) = x(n, in) W(in, out) + b(out); b may be NULL. y must not alias x. x and y: [act]. */
    int (*matmul_forward)(float *y, const float *x, const float *w, const float *b, int n, int in,
                          int out);
    /* dx(n, in) += dy W^T; dw(in, out) += x^T dy; db(out) += column sums of dy. Any of dx, dw, db may be
     * NULL. x: [act]. */
    int (*matmul_backward)(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *w, int n, int in, int out);
    /* General row-major SGEMM: C(m, n) = alpha op(A) op(B) + beta C, op = transpose when trans_* != 0
     * (A is (m, k), or (k, m) when transposed; likewise B). For layouts matmul does not cover, e.g. the
     * tied LM head logits = x wte^T with wte stored (V, C). a, b and c: [act] (c with beta 0 only). */
    int (*gemm)(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                const float *b, int ldb, float beta, float *c, int ldc);

    /* ---- layernorm over the last dimension (c) ---- */
    /* out, inp: (n, c); weight, bias: (c); mean, rstd: (n), saved for backward. out: [act]. */
    int (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int n, int c, float eps);
    /* dinp += ..., dweight += ..., dbias += ...; any of the three may be NULL. */
    int (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const float *mean,
                              const float *rstd, int n, int c);

    /* ---- causal self-attention, multi-head or grouped-query ---- */
    /* nh query heads and nkv key/value heads (nkv divides nh; nkv = nh is multi-head attention), head size
     * hs = c/nh. qkv: (b*t, c + 2*nkv*hs), each row [q (nh heads) | k (nkv heads) | v (nkv heads)], as GPT-2's
     * c_attn (nkv = nh) or Llama's q/k/v_proj, whose weights are adjacent, write it; query head h uses q
     * columns h*hs .. h*hs+hs-1 and the k and v columns of key/value head h / (nh/nkv).
     * out: (b*t, c), head h at columns h*hs ... lse: (b, nh, t) log-sum-exp of each row of scaled scores
     * (scale 1/sqrt(hs)), saved for backward. out and qkv: [act] (also backward's).
     * window: sliding-window attention (Mistral): key j is visible to query i when i - window < j <= i, the
     * window tokens ending at the query itself (transformers' sliding_window convention); 0 = full causal.
     * Key blocks entirely outside every query's window are skipped, not masked.
     * Memory is O(t) per head: no t x t matrix is kept between calls; backward recomputes scores from q, k,
     * v. (CUDA's bf16 path on tensor cores holds one sequence's t x t scores in its scratch during a call.) */
    size_t (*attention_workspace_bytes)(int b, int t, int c, int nh, int nkv);
    int (*attention_forward)(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                             int window, void *workspace);
    /* dqkv: (b*t, c + 2*nkv*hs) += gradient w.r.t. qkv. out and lse are forward's outputs (same window). */
    int (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, int b, int t, int c, int nh, int nkv, int window, void *workspace);

    /* ---- context-parallel attention (NULL where a backend lacks it) ----
     * A rank's query rows against the keys/values of the whole sequence, causal by global position:
     * key j is visible to query i when kpos[j] <= qpos[i]. q, k, v (and dq, dk, dv) have row stride ld
     * (3c for GPT-2's packed qkv); out and dout: (b*tq, c); lse: (b, nh, tq). Backward adds into dq, dk,
     * dv (the key/value gradients of the whole sequence, reduce-scattered by the caller). */
    int (*attention_cp_forward)(float *out, float *lse, const float *q, const float *k, const float *v,
                                const struct kernels_attention_cp *a);
    int (*attention_cp_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 const struct kernels_attention_cp *a);

    /* ---- elementwise ---- */
    /* GELU, tanh approximation (GPT-2's gelu_new). out may alias inp. out: [act] (then not aliasing inp). */
    int (*gelu_forward)(float *out, const float *inp, size_t n);
    /* dinp += gelu'(inp) * dout. */
    int (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    /* Optional (NULL: matmul_forward then gelu_forward): pre(n, out) = x W + b (b may be NULL) and
     * y(n, out) = gelu(pre), GPT-2's MLP up-projection in one pass: a table that can apply the GELU as the
     * product is written (cuBLASLt's epilogue) saves reading pre back. Both are written: backward reads pre.
     * y must alias neither pre nor x. x and y: [act]. */
    int (*matmul_forward_gelu)(float *pre, float *y, const float *x, const float *w, const float *b, int n, int in,
                               int out);
    /* Optional (NULL: gemm for dy W^T, then gelu_backward into a zeroed buffer): dpre(n, in) = (dy(n, out)
     * W(in, out)^T) * gelu'(pre(n, in)), WRITTEN (not added): the gradient through the MLP's down-projection
     * and its GELU in one pass (cuBLASLt's DGELU epilogue). dpre aliases neither dy nor pre. */
    int (*matmul_dx_dgelu)(float *dpre, const float *dy, const float *w, const float *pre, int n, int in, int out);
    /* out = a + b (residual add); out may alias a or b. */
    int (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    /* Optional (NULL: residual_forward, then layernorm_forward): res = a + b, then out, mean, rstd as
     * layernorm_forward(out, mean, rstd, res, ...) writes them, with the same bits; the block's residual add
     * and the norm after it in one pass over the rows, so res is not read back from memory a third time.
     * res may alias a or b; out aliases none of res, a, b. out: [act]. */
    int (*residual_layernorm_forward)(float *res, float *out, float *mean, float *rstd, const float *a,
                                      const float *b, const float *weight, const float *bias, int n, int c,
                                      float eps);
    /* x *= s. */
    int (*scale)(float *x, float s, size_t n);
    /* *result (host) = sum of x[i]^2, accumulated in double. */
    int (*sqnorm)(double *result, const float *x, size_t n);
    /* *total (the table's memory, one double) = the sum over i < count, added in order from 0, of the sqnorm of
     * xs[i][0..ns[i]) (each term the bits sqnorm gives it): the squared gradient norm of an optimizer step
     * over all its units, left on the device (no synchronisation). */
    int (*sqnorm_sum)(double *total, const float *const *xs, const size_t *ns, int count);
    /* The gradient clip on the device. sq (the table's memory): the n squared norms of the ranks that share
     * the shards, added in order from 0. out->norm = sqrt(sum) / loss_scale; out->grad_scale = c / loss_scale
     * with c = max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1 (all in double, then
     * rounded); NaN when the norm is not finite. */
    int (*grad_clip)(struct kernels_grad_clip *out, const double *sq, int n, double loss_scale, double max_norm);
    /* dst[i] = src[i] converted; float -> bf16/f16 rounds to nearest even, keeps inf/nan (quiet),
     * f16 overflow gives inf, subnormals are produced and read exactly. Same dtype = copy. */
    int (*cast)(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
                size_t n);

    /* ---- embeddings ---- */
    /* Ids (tokens here, targets of the cross-entropy) are checked: one outside its range is never read and is
     * FSDP_ERANGE naming the op and position, returned by the call itself on the CPU and, on CUDA (where
     * the check costs no host round trip), by the call or by the next synchronising call of the table
     * (synchronize, a device-to-host mem_copy, sqnorm). */
    /* out(b*t, c) = wte[tokens[i]] + wpe[i mod t]; tokens: (b*t) device int32 in [0, vocab); wte: (vocab, c)
     * (rows may be padded beyond the real vocab); wpe: (>= t, c), or NULL for no position embedding (Llama:
     * positions enter through rope). */
    int (*embedding_forward)(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                             int b, int t, int c, int vocab);
    /* dwte[tokens[i]] += dout[i]; dwpe[i mod t] += dout[i]; either may be NULL. */
    int (*embedding_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                              int t, int c, int vocab);

    /* ---- fused softmax cross-entropy over a padded vocabulary ---- */
    /* logits: (n, vp) with only the first v columns real (vp >= v, the columns v..vp-1 are padding and
     * never affect anything). targets: (n) device int32 in [0, v), or -1 to ignore the row.
     * losses (optional, device, n floats): per-row loss, 0 for ignored rows.
     * loss_acc (optional, device, one double): += the sum of the losses of non-ignored rows (summed in a
     *   fixed order). It stays on the device: the caller reads it when it needs it (once per step or per
     *   log line, not once per micro-batch), so the op costs no host round trip.
     * dlogits (optional; may equal logits for in-place): OVERWRITTEN with
     *   dloss * (softmax(logits[:v]) - onehot(target)), 0 in padded columns and in ignored rows.
     * Chunked over the vocabulary with an online max/sum: no probability tensor is kept. logits and dlogits:
     * [act]. */
    int (*crossentropy_forward_backward)(float *losses, double *loss_acc, float *dlogits,
                                         const float *logits, const int32_t *targets, int n, int v,
                                         int vp, float dloss);

    /* ---- optimizer ---- */
    /* AdamW on fp32 master weights: g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * param -= lr * (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + weight_decay * param). */
    int (*adamw)(float *param, const float *grad, float *m, float *v, size_t n,
                 const struct kernels_adamw_params *hp);

    /* ---- accumulation ---- */
    /* y += a * x (gradient accumulation, averaging over ranks/micro-batches). */
    int (*axpy)(float *y, float a, const float *x, size_t n);

    /* ---- Llama: RMSNorm, rotary position embeddings, SwiGLU ---- */
    /* RMSNorm over the last dimension: out = (inp * rstd) * weight, rstd = 1 / sqrt(mean(inp^2) + eps) per
     * row, saved for backward. out, inp: (n, c); weight: (c); rstd: (n). out must not alias inp. out: [act]. */
    int (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight, int n, int c,
                           float eps);
    /* Optional (NULL: residual_forward, then rmsnorm_forward): res = a + b, then out and rstd as
     * rmsnorm_forward(out, rstd, res, ...) writes them, with the same bits, in one pass over the rows. res may
     * alias a or b; out aliases none of res, a, b. out: [act]. */
    int (*residual_rmsnorm_forward)(float *res, float *out, float *rstd, const float *a, const float *b,
                                    const float *weight, int n, int c, float eps);
    /* dinp += ..., dweight += ...; either may be NULL. inp and rstd are forward's. */
    int (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, const float *rstd, int n, int c);
    /* Rotary position embeddings, IN PLACE (not accumulated) on the first nheads*hs columns of n rows of x
     * (row stride ld): each head of hs (even) values is split in halves x1, x2 and becomes
     * [x1 cos - x2 sin | x2 cos + x1 sin] (Hugging Face's rotate_half convention), with the angles of the
     * row's position: pos (n device int32, in [0, npos); the CPU backend checks) picks row pos[i] of
     * freqs (npos, hs) = [cos(p f_0) .. cos(p f_{hs/2-1}) | sin(p f_0) .. sin(p f_{hs/2-1})]. Positions are
     * a tensor, not 0..t-1, so a caller can place rows anywhere in a sequence. */
    int (*rope_forward)(float *x, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                        int npos);
    /* The transpose, in place on a gradient of the same layout: rotation by the negative angle. */
    int (*rope_backward)(float *dx, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                         int npos);
    /* SwiGLU: gu (n, 2m), rows [gate | up]; out (n, m) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
     * out and gu: [act]. */
    int (*swiglu_forward)(float *out, const float *gu, int n, int m);
    /* dgu (n, 2m) += [dout * up * silu'(gate) | dout * silu(gate)]. gu: [act]. */
    int (*swiglu_backward)(float *dgu, const float *gu, const float *dout, int n, int m);
};

/* The CPU backend (OpenBLAS / oneDNN matmuls + OpenMP loops); never NULL. */
const struct kernels *kernels_cpu(void);
/* The CUDA backend; defined in kernels/cuda/, which is built into the GPU module only (kernels_get("cuda")
 * loads it through common/gpu_module.h). Returns NULL with error_set when no usable GPU is present. */
const struct kernels *kernels_cuda(void);
/* By device name ("cpu", "cuda"); NULL with error_set when unknown or not available in this build/machine. */
const struct kernels *kernels_get(const char *device);

#endif

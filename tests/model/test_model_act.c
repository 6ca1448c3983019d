/* A model that keeps its activations in bf16 (model_set_compute_dtype on the CUDA table, kernels.h act_bind)
 * against the same model keeping them in fp32, both computing in bf16: the arena is smaller; the loss within
 * 1e-3 (the bound of bf16 against fp32 on the CPU: the matmuls read the values they would have rounded
 * themselves, but the cross-entropy reads bf16 logits and Llama's SwiGLU bf16 gate and up); the gradients
 * within 1e-2 of their norm. GPT-2 and Llama (grouped-query), with and without activation checkpointing; the
 * logits are not handed out as floats. The CPU table keeps fp32 activations.
 * Skips without a GPU (fails where a driver is present: tests/util/tu_gpu.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"
#include "worker/model/model.h"

static void config(struct model_config *c, bool llama, bool ckpt)
{
    model_config_default(c);
    if (llama) {
        strcpy(c->model_family, "llama");
        c->n_kv_head = 2;
        c->n_embd = 64;
        c->n_head = 4;
        c->intermediate_size = 88;
    } else {
        c->n_embd = 48;
        c->n_head = 3;
    }
    c->n_layer = 2;
    c->vocab_size = 77;
    c->block_size = 16;
    c->activation_checkpointing = ckpt;
}

struct run {
    float loss;
    float *grads; /* host */
    size_t numel, arena;
};

/* One forward and backward of a fixed batch, with the activations stored in act (fp32 or bf16). */
static struct run run_once(const struct kernels *k, const struct model_config *c, enum dtype act)
{
    struct model *m;
    cr_assert_eq(model_create(&m, c, k, 2, 16), 0, "%s", error_message());
    size_t before = model_get_arena_bytes(m);
    cr_assert_eq(model_set_compute_dtype(m, act), 0, "%s", error_message());
    const struct model_layout *l = model_get_layout(m);
    struct run r = {.numel = l->numel, .arena = model_get_arena_bytes(m)};
    if (act == DTYPE_F32)
        cr_assert_eq(r.arena, before);
    float *host = calloc(l->numel, sizeof *host);
    r.grads = malloc(l->numel * sizeof *r.grads);
    cr_assert(host && r.grads);
    cr_assert_eq(model_init_params(l, host), 0, "%s", error_message());
    float *p = k->mem_alloc(l->numel * 4), *g = k->mem_alloc(l->numel * 4);
    cr_assert(p && g);
    cr_assert_eq(k->mem_copy(p, host, l->numel * 4, KERNELS_COPY_H2D), 0);
    cr_assert_eq(k->mem_set(g, 0, l->numel * 4), 0);
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) {
        tok[i] = (i * 7) % 77;
        tgt[i] = (i * 13 + 1) % 77;
    }
    cr_assert_eq(model_set_batch(m, tok, tgt), 0, "%s", error_message());
    cr_assert_eq(model_forward_backward(m, p, g, &r.loss), 0, "%s", error_message());
    cr_assert_eq(model_logits(m) == NULL, act != DTYPE_F32, "bf16 logits handed out as floats, or fp32 ones not");
    cr_assert_eq(k->mem_copy(r.grads, g, l->numel * 4, KERNELS_COPY_D2H), 0);
    k->mem_free(p);
    k->mem_free(g);
    free(host);
    model_destroy(m);
    return r;
}

static void compare(bool llama, bool ckpt)
{
    const struct kernels *k = kernels_get("cuda");
    if (!k)
        TU_GPU_UNAVAILABLE("no CUDA device (or no CUDA kernels in this build): %s", error_message());
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0, "%s", error_message());
    struct model_config c;
    config(&c, llama, ckpt);
    struct run f = run_once(k, &c, DTYPE_F32), b = run_once(k, &c, DTYPE_BF16);
    const char *what = llama ? "llama" : "gpt2";
    cr_assert_lt(b.arena, f.arena, "%s: bf16 activations take %zu bytes, fp32 %zu", what, b.arena, f.arena);
    double rel = fabs((double)b.loss - f.loss) / fabs((double)f.loss);
    cr_assert_leq(rel, 1e-3, "%s: loss %.9g with bf16 activations, %.9g with fp32", what, (double)b.loss,
                  (double)f.loss);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < f.numel; i++) {
        diff += ((double)b.grads[i] - f.grads[i]) * ((double)b.grads[i] - f.grads[i]);
        norm += (double)f.grads[i] * f.grads[i];
    }
    cr_assert_gt(norm, 0);
    cr_assert_lt(sqrt(diff / norm), 1e-2, "%s: gradients differ by %.3g of their norm", what, sqrt(diff / norm));
    cr_log_info("%s checkpointing %d: arena %zu -> %zu bytes, loss difference %.3g relative, gradient difference "
                "%.3g of the norm", what, ckpt, f.arena, b.arena, rel, sqrt(diff / norm));
    free(f.grads);
    free(b.grads);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
}

Test(model_act, gpt2_bf16_activations_keep_the_loss) { compare(false, false); }
Test(model_act, gpt2_bf16_activations_with_checkpointing) { compare(false, true); }
Test(model_act, llama_bf16_activations_keep_the_loss) { compare(true, false); }
Test(model_act, llama_bf16_activations_with_checkpointing) { compare(true, true); }

Test(model_act, the_cpu_table_keeps_fp32_activations)
{
    const struct kernels *k = kernels_cpu();
    struct model_config c;
    config(&c, false, false);
    struct model *m;
    cr_assert_eq(model_create(&m, &c, k, 2, 16), 0, "%s", error_message());
    size_t before = model_get_arena_bytes(m);
    cr_assert_eq(model_set_compute_dtype(m, DTYPE_BF16), 0, "%s", error_message());
    cr_assert_eq(model_get_arena_bytes(m), before);
    model_destroy(m);
}

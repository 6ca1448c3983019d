/* Context parallelism inside the model (model.h): this rank's chunks of every sequence, their global
 * positions, and attention over the whole sequence through the context group's collectives.
 *
 * allgather: every rank contributes the key/value columns of its (b, t) rows; the gather's rank-major
 * (size, b, t) rows are read in place by attention_cp (kblock = t, ldkv), this rank's queries against every
 * key. Backward gathers again (nothing of the sequence is kept between forward and backward), writes the
 * query gradients in place and the key/value gradients into a zeroed gathered buffer, whose reduce-scatter
 * gives this rank's rows their key/value gradients summed over the group.
 *
 * alltoall (Ulysses): the columns of q|k|v are packed head-slice-major (block p: query heads p*nh/size...,
 * key/value heads p*nkv/size...), an all-to-all gives every rank its heads of the whole sequence in the same
 * rank-major row layout (qblock = kblock = t), written over the layer's q|k|v (which nothing else reads, so
 * backward finds them there), attention_cp runs on them, and an all-to-all brings the output's head slices
 * back. Backward moves out and dout the same way and the gradients back. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

struct cp_dims {
    int b, t, T, C, nh, nkv, hs, kvw, ld, S;
};

static struct cp_dims dims(const struct model *m)
{
    const struct model_config *c = &m->layout.config;
    /* C: the width of q and of the attention's output, n_head heads of head_dim (not n_embd where the two
     * differ) */
    struct cp_dims d = {.b = m->b, .t = m->t, .T = m->t_seq, .C = c->n_head * model_head_dim(c), .nh = c->n_head,
                        .nkv = c->n_kv_head > 0 ? c->n_kv_head : c->n_head, .S = m->cp.size};
    d.hs = model_head_dim(c);
    d.kvw = d.nkv * d.hs;
    d.ld = d.C + 2 * d.kvw;
    return d;
}

int model_cp_position(int rank, int size, int t_local, int j)
{
    int s = t_local / 2;
    return j < s ? rank * s + j : (2 * size - 1 - rank) * s + (j - s);
}

int model_position(const struct model *m, int j)
{
    return m->cp.size > 1 ? model_cp_position(m->cp.rank, m->cp.size, m->t, j) : j;
}

/* Scratch floats per strategy: allgather A, B = the gathered k|v columns and their gradient (b, T, 2 kvw) each;
 * alltoall A = packing (b, t, ld), C = head-sharded out, dout (b, t, C) each and dqkv (b, t, ld) (the
 * head-sharded q|k|v live in the layer's own qkv). */
static void scratch_sizes(const struct model *m, size_t n[3])
{
    struct cp_dims d = dims(m);
    size_t rows = (size_t)d.b * d.t;
    if (m->cp.strategy == MODEL_CP_ALLGATHER) {
        n[0] = n[1] = (size_t)d.b * d.T * 2 * d.kvw;
        n[2] = 0;
    } else {
        n[0] = rows * d.ld;
        n[1] = 0;
        n[2] = rows * (2 * (size_t)d.C + d.ld);
    }
}

int model_cp_setup(struct model *m)
{
    const struct kernels *k = m->k;
    struct cp_dims d = dims(m);
    size_t n[3];
    scratch_sizes(m, n);
    int *qpos = malloc((size_t)d.t * sizeof *qpos), *kpos = malloc((size_t)d.T * sizeof *kpos);
    int rc = 0;
    m->cp_host = malloc(2 * (size_t)d.b * d.t * sizeof *m->cp_host);
    m->cp_qpos = k->mem_alloc((size_t)d.t * sizeof *qpos);
    m->cp_kpos = k->mem_alloc((size_t)d.T * sizeof *kpos);
    float **bufs[3] = {&m->cp_a, &m->cp_b, &m->cp_c};
    bool ok = qpos && kpos && m->cp_host && m->cp_qpos && m->cp_kpos;
    for (int i = 0; i < 3 && ok; i++)
        if (n[i] && !(*bufs[i] = k->mem_alloc(n[i] * sizeof(float))))
            ok = false;
    if (!ok) {
        rc = error_set(FSDP_ENOMEM, "model: cannot allocate the context-parallel scratch (%zu bytes)",
                       (n[0] + n[1] + n[2]) * sizeof(float));
        goto out;
    }
    for (int j = 0; j < d.t; j++)
        qpos[j] = model_position(m, j);
    for (int p = 0; p < d.S; p++)
        for (int j = 0; j < d.t; j++)
            kpos[p * d.t + j] = model_cp_position(p, d.S, d.t, j);
    FSDP_TRY_GOTO(k->mem_copy(m->cp_qpos, qpos, (size_t)d.t * sizeof *qpos, KERNELS_COPY_H2D), rc, out);
    FSDP_TRY_GOTO(k->mem_copy(m->cp_kpos, kpos, (size_t)d.T * sizeof *kpos, KERNELS_COPY_H2D), rc, out);
    m->arena_bytes += (n[0] + n[1] + n[2]) * sizeof(float) + ((size_t)d.t + d.T) * sizeof(int);
out:
    free(qpos);
    free(kpos);
    return rc;
}

void model_cp_release(struct model *m)
{
    const struct kernels *k = m->k;
    void *dev[5] = {m->cp_qpos, m->cp_kpos, m->cp_a, m->cp_b, m->cp_c};
    for (int i = 0; i < 5; i++)
        if (dev[i])
            k->mem_free(dev[i]);
    free(m->cp_host);
    m->cp_qpos = m->cp_kpos = NULL;
    m->cp_a = m->cp_b = m->cp_c = NULL;
    m->cp_host = NULL;
}

/* ---- embeddings at global positions: one call per chunk (two per sequence) ---- */
int model_cp_embedding_forward(struct model *m, float *out, const float *wte, const float *wpe)
{
    const struct model_config *c = &m->layout.config;
    int s = m->t / 2;
    for (int bb = 0; bb < m->b; bb++)
        for (int h = 0; h < 2; h++) {
            size_t row = (size_t)bb * m->t + (size_t)h * s, pos = (size_t)model_position(m, h * s);
            FSDP_TRY(m->k->embedding_forward(out + row * c->n_embd, m->tokens + row, wte,
                                             wpe ? wpe + pos * c->n_embd : NULL, 1, s, c->n_embd, c->vocab_size));
        }
    return 0;
}

int model_cp_embedding_backward(struct model *m, float *dwte, float *dwpe, const float *dout)
{
    const struct model_config *c = &m->layout.config;
    int s = m->t / 2;
    for (int bb = 0; bb < m->b; bb++)
        for (int h = 0; h < 2; h++) {
            size_t row = (size_t)bb * m->t + (size_t)h * s, pos = (size_t)model_position(m, h * s);
            FSDP_TRY(m->k->embedding_backward(dwte, dwpe ? dwpe + pos * c->n_embd : NULL, dout + row * c->n_embd,
                                              m->tokens + row, 1, s, c->n_embd, c->vocab_size));
        }
    return 0;
}

/* ---- allgather ---- */
/* The key/value columns of this rank's rows (b*t rows of ld, columns C .. C + 2 kvw) <-> rows of 2 kvw. */
static int kv_move(const struct model *m, const struct cp_dims *d, float *kv, float *qkv, bool unpack)
{
    size_t rows = (size_t)d->b * d->t, width = 2 * (size_t)d->kvw * sizeof(float);
    size_t lda = (size_t)d->ld * sizeof(float), ldp = width;
    float *a = qkv + d->C;
    return unpack ? m->k->mem_copy2d(a, lda, kv, ldp, width, rows, KERNELS_COPY_D2D)
                  : m->k->mem_copy2d(kv, ldp, a, lda, width, rows, KERNELS_COPY_D2D);
}

/* The group's keys and values into cp_a: this rank's packed into its own block, gathered in place. */
static int gather_kv(struct model *m, const struct cp_dims *d, const float *qkv)
{
    size_t n = (size_t)d->b * d->t * 2 * d->kvw;
    float *mine = m->cp_a + (size_t)m->cp.rank * n;
    FSDP_TRY(kv_move(m, d, mine, (float *)qkv, false));
    return m->cp.all_gather(m->cp.ctx, mine, m->cp_a, n);
}

static struct kernels_attention_cp allgather_shape(const struct model *m, const struct cp_dims *d, int window)
{
    return (struct kernels_attention_cp){.b = d->b, .tq = d->t, .tk = d->T, .c = d->C, .nh = d->nh, .ld = d->ld,
                                         .qpos = m->cp_qpos, .kpos = m->cp_kpos, .nkv = d->nkv, .kblock = d->t,
                                         .ldkv = 2 * d->kvw, .window = window};
}

static int allgather_forward(struct model *m, float *out, float *lse, const float *qkv, int window)
{
    struct cp_dims d = dims(m);
    struct kernels_attention_cp a = allgather_shape(m, &d, window);
    FSDP_TRY(gather_kv(m, &d, qkv));
    return m->k->attention_cp_forward(out, lse, qkv, m->cp_a, m->cp_a + d.kvw, &a);
}

static int allgather_backward(struct model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, int window)
{
    struct cp_dims d = dims(m);
    struct kernels_attention_cp a = allgather_shape(m, &d, window);
    size_t n = (size_t)d.b * d.t * 2 * d.kvw;
    FSDP_TRY(gather_kv(m, &d, qkv));
    FSDP_TRY(m->k->mem_set(m->cp_b, 0, n * d.S * sizeof(float)));
    FSDP_TRY(m->k->mem_set(dqkv, 0, (size_t)d.b * d.t * d.ld * sizeof(float)));
    FSDP_TRY(m->k->attention_cp_backward(dqkv, m->cp_b, m->cp_b + d.kvw, dout, qkv, m->cp_a, m->cp_a + d.kvw, out,
                                         lse, &a));
    /* the keys and values are no longer needed: their first block takes this rank's summed gradients */
    FSDP_TRY(m->cp.reduce_scatter(m->cp.ctx, m->cp_b, m->cp_a, n));
    return kv_move(m, &d, m->cp_a, dqkv, true);
}

/* ---- alltoall ---- */
/* Column segments of a row that split by heads: q|k|v (3 segments) or out (1). Block p of the packed
 * buffer holds, for every row, segment s's columns col[s] + p * w[s] ... + w[s] - 1, one after the other. */
struct segs {
    int n, col[3], w[3], ld, width; /* width: a packed row of one block */
};

static struct segs qkv_segs(const struct cp_dims *d)
{
    int qw = d->C / d->S, kw = d->kvw / d->S;
    return (struct segs){3, {0, d->C, d->C + d->kvw}, {qw, kw, kw}, d->ld, qw + 2 * kw};
}

static struct segs out_segs(const struct cp_dims *d)
{
    return (struct segs){1, {0}, {d->C / d->S}, d->C, d->C / d->S};
}

/* unpack = false: packed <- rows; true: rows <- packed. */
static int heads_move(const struct model *m, const struct segs *g, float *packed, float *rows, size_t n, bool unpack)
{
    const struct kernels *k = m->k;
    size_t ldp = (size_t)g->width * sizeof(float), ldr = (size_t)g->ld * sizeof(float);
    for (int p = 0; p < m->cp.size; p++) {
        float *pk = packed + (size_t)p * n * g->width;
        for (int s = 0; s < g->n; s++) {
            float *a = rows + g->col[s] + (size_t)p * g->w[s];
            size_t width = (size_t)g->w[s] * sizeof(float);
            FSDP_TRY(unpack ? k->mem_copy2d(a, ldr, pk, ldp, width, n, KERNELS_COPY_D2D)
                            : k->mem_copy2d(pk, ldp, a, ldr, width, n, KERNELS_COPY_D2D));
            pk += g->w[s];
        }
    }
    return 0;
}

/* rows (b*t rows of g) -> this rank's heads of the whole sequence (size x b*t rows of g->width) in dst */
static int to_heads(struct model *m, const struct segs *g, const float *rows, float *dst)
{
    size_t n = (size_t)m->b * m->t;
    FSDP_TRY(heads_move(m, g, m->cp_a, (float *)rows, n, false));
    return m->cp.all_to_all(m->cp.ctx, m->cp_a, dst, n * g->width);
}

/* the inverse: this rank's heads of the whole sequence in src -> rows */
static int from_heads(struct model *m, const struct segs *g, const float *src, float *rows)
{
    size_t n = (size_t)m->b * m->t;
    FSDP_TRY(m->cp.all_to_all(m->cp.ctx, src, m->cp_a, n * g->width));
    return heads_move(m, g, m->cp_a, rows, n, true);
}

static struct kernels_attention_cp alltoall_shape(const struct model *m, const struct cp_dims *d, int window)
{
    return (struct kernels_attention_cp){.b = d->b, .tq = d->T, .tk = d->T, .c = d->C / d->S, .nh = d->nh / d->S,
                                         .ld = d->ld / d->S, .qpos = m->cp_kpos, .kpos = m->cp_kpos,
                                         .nkv = d->nkv / d->S, .qblock = d->t, .kblock = d->t, .window = window};
}

/* qkv takes the head layout (the all-to-all's output may be its input's rows once they are packed), which
 * backward reads as it is: one all-to-all of q|k|v per layer, not two. */
static int alltoall_forward(struct model *m, float *out, float *lse, float *qkv, int window)
{
    struct cp_dims d = dims(m);
    struct segs gq = qkv_segs(&d), go = out_segs(&d);
    struct kernels_attention_cp a = alltoall_shape(m, &d, window);
    float *hq = qkv, *ho = m->cp_c;
    int qw = d.C / d.S, kw = d.kvw / d.S;
    FSDP_TRY(to_heads(m, &gq, qkv, hq));
    /* lse: (b, nh / size, T) here, the same number of floats as the (b, nh, t) the family keeps */
    FSDP_TRY(m->k->attention_cp_forward(ho, lse, hq, hq + qw, hq + qw + kw, &a));
    return from_heads(m, &go, ho, out);
}

static int alltoall_backward(struct model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int window)
{
    struct cp_dims d = dims(m);
    struct segs gq = qkv_segs(&d), go = out_segs(&d);
    struct kernels_attention_cp a = alltoall_shape(m, &d, window);
    size_t rows = (size_t)d.b * d.t;
    const float *hq = qkv; /* forward left it in head layout */
    float *ho = m->cp_c, *hdo = ho + rows * d.C, *hdq = hdo + rows * d.C;
    int qw = d.C / d.S, kw = d.kvw / d.S;
    FSDP_TRY(to_heads(m, &go, out, ho));
    FSDP_TRY(to_heads(m, &go, dout, hdo));
    FSDP_TRY(m->k->mem_set(hdq, 0, rows * d.ld * sizeof(float)));
    FSDP_TRY(m->k->attention_cp_backward(hdq, hdq + qw, hdq + qw + kw, hdo, hq, hq + qw, hq + qw + kw, ho, lse, &a));
    return from_heads(m, &gq, hdq, dqkv);
}

int model_cp_attention_forward(struct model *m, float *out, float *lse, float *qkv, int window)
{
    return m->cp.strategy == MODEL_CP_ALLGATHER ? allgather_forward(m, out, lse, qkv, window)
                                                : alltoall_forward(m, out, lse, qkv, window);
}

int model_cp_attention_backward(struct model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int window)
{
    return m->cp.strategy == MODEL_CP_ALLGATHER ? allgather_backward(m, dqkv, dout, qkv, out, lse, window)
                                                : alltoall_backward(m, dqkv, dout, qkv, out, lse, window);
}

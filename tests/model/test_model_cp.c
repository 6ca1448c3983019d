/* Context parallelism inside the model (model_create_cp): C threads are the ranks of one context group, their
 * collectives an in-process exchange, each holding its chunks of the same batch of whole sequences. The
 * group's mean loss and its gradients (each rank's over its own tokens, averaged over the ranks: equal token
 * counts) must be one model's on the whole sequences: GPT-2 and Llama (grouped-query heads), allgather and
 * alltoall, C = 2, 3, 4, with activation checkpointing. And the errors name what does not fit. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "worker/model/model.h"

#define MAXC 4

/* The in-process group: every rank posts its input, all wait, each reads what it needs, all wait again so
 * no input changes while another rank reads it. */
struct group {
    int size;
    pthread_barrier_t bar;
    const float *slot[MAXC];
};

struct rank_ctx {
    struct group *g;
    int rank;
};

static int post(struct rank_ctx *r, const float *in)
{
    r->g->slot[r->rank] = in;
    pthread_barrier_wait(&r->g->bar);
    return 0;
}

static int all_gather(void *ctx, const float *in, float *out, size_t count)
{
    struct rank_ctx *r = ctx;
    post(r, in);
    for (int p = 0; p < r->g->size; p++)
        if (out + (size_t)p * count != r->g->slot[p])
            memcpy(out + (size_t)p * count, r->g->slot[p], count * sizeof(float));
    pthread_barrier_wait(&r->g->bar);
    return 0;
}

static int reduce_scatter(void *ctx, const float *in, float *out, size_t count)
{
    struct rank_ctx *r = ctx;
    post(r, in);
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int p = 0; p < r->g->size; p++)
            s += r->g->slot[p][(size_t)r->rank * count + i];
        out[i] = s;
    }
    pthread_barrier_wait(&r->g->bar);
    return 0;
}

static int all_to_all(void *ctx, const float *in, float *out, size_t count)
{
    struct rank_ctx *r = ctx;
    post(r, in);
    for (int p = 0; p < r->g->size; p++)
        memcpy(out + (size_t)p * count, r->g->slot[p] + (size_t)r->rank * count, count * sizeof(float));
    pthread_barrier_wait(&r->g->bar);
    return 0;
}

struct job {
    const struct model_config *cfg;
    const float *params;
    const int32_t *tokens, *targets;
    int b, t;
    struct model_cp cp;
    struct rank_ctx rc;
    float *grads;
    float loss;
    int rc_create, rc_run;
    char err[512];
};

static void *run_rank(void *arg)
{
    struct job *j = arg;
    const struct kernels *k = kernels_cpu();
    struct model *m = NULL;
    j->cp.ctx = &j->rc;
    j->rc_create = model_create_cp(&m, j->cfg, k, j->b, j->t, &j->cp);
    if (j->rc_create) {
        snprintf(j->err, sizeof j->err, "%s", error_message());
        /* the other ranks wait in their first collective: a failed create is not recoverable here */
        return NULL;
    }
    j->rc_run = model_set_batch(m, j->tokens, j->targets);
    if (!j->rc_run)
        j->rc_run = model_forward_backward(m, j->params, j->grads, &j->loss);
    if (j->rc_run)
        snprintf(j->err, sizeof j->err, "%s", error_message());
    model_destroy(m);
    return NULL;
}

static void cp_case(const char *family, int nh, int nkv, int C, enum model_cp_strategy strategy, bool ckpt, int T)
{
    struct model_config cfg;
    model_config_default(&cfg);
    snprintf(cfg.model_family, sizeof cfg.model_family, "%s", family);
    cfg.n_layer = 2;
    cfg.n_head = nh;
    cfg.n_kv_head = nkv;
    cfg.n_embd = 8 * nh;
    cfg.intermediate_size = 40;
    cfg.vocab_size = 50;
    cfg.block_size = T;
    cfg.activation_checkpointing = ckpt;
    const struct kernels *k = kernels_cpu();
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &cfg), 0, "%s", error_message());
    size_t n = l.numel;
    float *params = calloc(n, sizeof *params), *ref = calloc(n, sizeof *ref), *sum = calloc(n, sizeof *sum);
    cr_assert(params && ref && sum);
    cr_assert_eq(model_init_params(&l, params), 0, "%s", error_message());
    int B = 2;
    int32_t tokens[2 * 64], targets[2 * 64];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (i * 7 + 3) % cfg.vocab_size;
        targets[i] = (i * 11 + 5) % cfg.vocab_size;
    }
    /* the reference: one model on the whole sequences */
    struct model *m;
    cr_assert_eq(model_create(&m, &cfg, k, B, T), 0, "%s", error_message());
    cr_assert_eq(model_set_batch(m, tokens, targets), 0);
    float ref_loss;
    cr_assert_eq(model_forward_backward(m, params, ref, &ref_loss), 0, "%s", error_message());
    model_destroy(m);

    struct group g = {.size = C};
    pthread_barrier_init(&g.bar, NULL, (unsigned)C);
    struct job jobs[MAXC];
    pthread_t th[MAXC];
    for (int r = 0; r < C; r++) {
        jobs[r] = (struct job){.cfg = &cfg, .params = params, .tokens = tokens, .targets = targets, .b = B, .t = T,
                               .cp = {.rank = r, .size = C, .strategy = strategy, .all_gather = all_gather,
                                      .reduce_scatter = reduce_scatter, .all_to_all = all_to_all},
                               .rc = {&g, r}, .grads = calloc(n, sizeof(float))};
        cr_assert(jobs[r].grads);
        cr_assert_eq(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    }
    for (int r = 0; r < C; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g.bar);
    double loss = 0;
    for (int r = 0; r < C; r++) {
        cr_assert_eq(jobs[r].rc_create, 0, "rank %d: %s", r, jobs[r].err);
        cr_assert_eq(jobs[r].rc_run, 0, "rank %d: %s", r, jobs[r].err);
        loss += jobs[r].loss / C;
        for (size_t i = 0; i < n; i++)
            sum[i] += jobs[r].grads[i] / C;
        free(jobs[r].grads);
    }
    cr_assert(fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss), "%s C=%d: loss %.9g, one model's %.9g", family, C, loss,
              (double)ref_loss);
    double gmax = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        gmax = fmax(gmax, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)sum[i] - ref[i]);
        worst = fmax(worst, d / gmax);
        cr_assert(d <= 1e-5 * gmax, "%s %s C=%d%s: gradient %zu is %.9g, one model's %.9g (largest |g| %.3g)", family,
                  strategy == MODEL_CP_ALLGATHER ? "allgather" : "alltoall", C, ckpt ? " ckpt" : "", i, (double)sum[i],
                  (double)ref[i], gmax);
    }
    cr_log_info("%s %s C=%d%s: loss %.9g vs %.9g, largest gradient difference %.3g of the largest gradient", family,
                strategy == MODEL_CP_ALLGATHER ? "allgather" : "alltoall", C, ckpt ? " ckpt" : "", loss,
                (double)ref_loss, worst);
    free(params), free(ref), free(sum);
    model_layout_free(&l);
}

Test(model_cp, gpt2_gradients_equal_one_model)
{
    for (int C = 2; C <= 4; C++) {
        int T = C == 3 ? 24 : 16;
        cp_case("gpt2", 4, 0, C, MODEL_CP_ALLGATHER, C == 4, T);
        if (C != 3)
            cp_case("gpt2", 4, 0, C, MODEL_CP_ALLTOALL, C == 2, T);
    }
    cp_case("gpt2", 3, 0, 3, MODEL_CP_ALLTOALL, false, 24);
}

Test(model_cp, llama_gradients_equal_one_model)
{
    for (int C = 2; C <= 4; C++) {
        int T = C == 3 ? 24 : 16;
        cp_case("llama", 4, 2, C, MODEL_CP_ALLGATHER, C == 2, T);
    }
    cp_case("llama", 4, 2, 2, MODEL_CP_ALLTOALL, true, 16);
    cp_case("llama", 4, 4, 4, MODEL_CP_ALLTOALL, false, 16);
    cp_case("llama", 6, 3, 3, MODEL_CP_ALLTOALL, true, 24);
}

Test(model_cp, errors_name_what_does_not_fit)
{
    struct model_config cfg;
    model_config_default(&cfg);
    cfg.n_layer = 1;
    cfg.n_head = 2;
    cfg.n_embd = 16;
    cfg.vocab_size = 50;
    cfg.block_size = 12;
    struct model *m = NULL;
    struct model_cp cp = {.rank = 0, .size = 4, .all_gather = all_gather, .reduce_scatter = reduce_scatter,
                          .all_to_all = all_to_all};
    cr_assert_eq(model_create_cp(&m, &cfg, kernels_cpu(), 1, 12, &cp), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "12 tokens cannot be cut into 2 x 4 equal chunks"), "%s", error_message());
    cp.size = 3;
    cp.strategy = MODEL_CP_ALLTOALL;
    cr_assert_eq(model_create_cp(&m, &cfg, kernels_cpu(), 1, 12, &cp), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "2 attention heads and 2 key/value heads") && strstr(error_message(), "use allgather"),
              "%s", error_message());
    /* a kernels table without context-parallel attention is named */
    struct kernels no_cp = *kernels_cpu();
    no_cp.attention_cp_forward = NULL;
    cp.size = 2;
    cp.strategy = MODEL_CP_ALLGATHER;
    cr_assert_eq(model_create_cp(&m, &cfg, &no_cp, 1, 12, &cp), FSDP_EUNSUPPORTED);
    cr_assert(strstr(error_message(), "which the cpu kernels do not have"), "%s", error_message());
    cr_assert_null(m);
}

Test(model_cp, positions_are_the_load_balanced_chunks)
{
    /* T = 16, C = 2: chunks of 4; rank 0 holds 0-3 and 12-15, rank 1 4-7 and 8-11 */
    const int want0[] = {0, 1, 2, 3, 12, 13, 14, 15}, want1[] = {4, 5, 6, 7, 8, 9, 10, 11};
    for (int j = 0; j < 8; j++) {
        cr_assert_eq(model_cp_position(0, 2, 8, j), want0[j]);
        cr_assert_eq(model_cp_position(1, 2, 8, j), want1[j]);
    }
}

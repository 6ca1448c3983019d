/* The optimizer step on the shards: finish the reductions, the global gradient norm (one small collective
 * over the shard group: replicas hold equal shards), clipping, fp16 loss scaling (skip the step on
 * non-finite gradients, back off, grow after a run of good steps, as PyTorch's ShardedGradScaler), AdamW
 * per parameter piece (weight decay on matrices and embeddings only), then fresh low-precision copies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "worker/fsdp/fsdp_internal.h"

/* GradScaler's defaults. */
#define SCALER_BACKOFF 0.5
#define SCALER_GROWTH 2.0
#define SCALER_INTERVAL 2000

/* Sum of one double per rank of c, added in rank order so every rank gets the same bits. The values
 * travel as raw bytes through an all-gather (in device memory, as NCCL needs). */
int fsdp_sum_over(struct fsdp *f, struct comm *c, double x, double *sum)
{
    if (!c) {
        *sum = x;
        return 0;
    }
    int n = comm_size(c), r = comm_rank(c);
    double *dev = fsdp_buf_get(f, (size_t)n * sizeof(double), FSDP_MEM_COMM);
    double host[256];
    double *all = n <= 256 ? host : malloc((size_t)n * sizeof(double));
    double s = 0;
    int rc = 0;
    if (!dev || !all) {
        rc = error_set(FSDP_ENOMEM, "fsdp: out of memory");
        goto out;
    }
    FSDP_TRY_GOTO(f->k->mem_copy(dev + r, &x, sizeof x, KERNELS_COPY_H2D), rc, out);
    FSDP_TRY_GOTO(comm_all_gather(c, dev + r, dev, 2, DTYPE_F32), rc, out);
    FSDP_TRY_GOTO(f->k->mem_copy(all, dev, (size_t)n * sizeof(double), KERNELS_COPY_D2H), rc, out);
    for (int i = 0; i < n; i++)
        s += all[i];
out:
    *sum = s;
    fsdp_buf_put(f, dev);
    if (all != host)
        free(all);
    return rc;
}

int fsdp_sum_world(struct fsdp *f, double x, double *sum)
{
    return fsdp_sum_over(f, f->g.world, x, sum);
}

/* The low-precision copies the all-gathers send, from the fp32 masters (after a step or a load). */
int fsdp_refresh_lp(struct fsdp *f)
{
    if (f->param_dtype == DTYPE_F32)
        return 0;
    for (int i = 0; i < f->n_units; i++)
        FSDP_TRY(f->sk->cast(f->units[i].lp, f->param_dtype, f->units[i].master, DTYPE_F32, f->units[i].shard));
    return 0;
}

/* The gradient shards zeroed for the next step. */
static int zero_grads(struct fsdp *f)
{
    for (int i = 0; i < f->n_units; i++)
        FSDP_TRY(f->sk->mem_set(f->units[i].grad, 0, f->units[i].shard * sizeof(float)));
    return 0;
}

/* The squared gradient norm of this rank's shards, summed over the shard group into the group's n slots of
 * sq (device memory: the all-gather's), without the host reading anything. */
static int norm_parts(struct fsdp *f, double *sq, int r)
{
    size_t nu = f->n_units > 0 ? (size_t)f->n_units : 1;
    char *buf = malloc(nu * (sizeof(const float *) + sizeof(size_t)));
    if (!buf)
        return error_set(FSDP_ENOMEM, "optimizer step: out of memory for %d unit norms", f->n_units);
    size_t *sizes = (size_t *)buf;
    const float **grads = (const float **)(sizes + nu);
    for (int i = 0; i < f->n_units; i++) {
        grads[i] = f->units[i].grad;
        sizes[i] = f->units[i].shard;
    }
    /* Offloaded shards are in host memory: the host's sum goes up to the device for the all-gather. */
    double host = 0;
    int rc = f->sk->sqnorm_sum(f->offload ? &host : sq + r, grads, sizes, f->n_units);
    free(buf);
    FSDP_TRY(rc);
    if (f->offload)
        FSDP_TRY(f->k->mem_copy(sq + r, &host, sizeof host, KERNELS_COPY_H2D));
    if (f->shard_comm) { /* grad_clip reads it on the device */
        struct comm_work *w;
        FSDP_TRY(comm_all_gather_async(f->shard_comm, sq + r, sq, 2, DTYPE_F32, &w));
        FSDP_TRY(fsdp_comm_order(f, w));
    }
    return 0;
}

int fsdp_optimizer_step(struct fsdp *f, double lr, int64_t step)
{
    FSDP_TRY(fsdp_pending_drain(f, 0));
    /* The global norm, the clip coefficient and the loss-scale check stay on the device: AdamW reads the
     * coefficient there (grad_scale_dev) and skips when the norm is not finite, so nothing in the step waits
     * for the host. fsdp_finish_step reads the outcome once the whole step is queued. */
    int n = f->shard_comm ? comm_size(f->shard_comm) : 1, r = f->shard_comm ? comm_rank(f->shard_comm) : 0;
    double *sq = fsdp_buf_get(f, (size_t)n * sizeof(double), FSDP_MEM_COMM);
    if (!sq)
        return error_set(FSDP_ENOMEM, "fsdp: out of memory");
    int rc = norm_parts(f, sq, r);
    const double *parts = sq;
    double host_parts[256], *hp_all = NULL;
    if (rc == 0 && f->offload) { /* the clip runs where the offloaded optimizer does: on the host */
        hp_all = n <= 256 ? host_parts : malloc((size_t)n * sizeof(double));
        rc = hp_all ? f->k->mem_copy(hp_all, sq, (size_t)n * sizeof(double), KERNELS_COPY_D2H)
                    : error_set(FSDP_ENOMEM, "fsdp: out of memory");
        parts = hp_all;
    }
    if (rc == 0)
        rc = f->sk->grad_clip(&f->stats->clip, parts, n, f->loss_scale, f->wc.optim.grad_clip);
    if (hp_all && hp_all != host_parts)
        free(hp_all);
    fsdp_buf_put(f, sq);
    FSDP_TRY(rc);
    struct kernels_adamw_params hp = {.lr = (float)lr, .beta1 = (float)f->wc.optim.beta1,
                                      .beta2 = (float)f->wc.optim.beta2, .eps = (float)f->wc.optim.eps,
                                      .grad_scale = 1.0f, .step = (int)step,
                                      .grad_scale_dev = &f->stats->clip.grad_scale};
    for (size_t i = 0; i < f->n_pieces; i++) {
        const struct fsdp_piece *p = &f->pieces[i];
        struct fsdp_unit *u = &f->units[p->unit];
        hp.weight_decay = f->layout->params[p->param].weight_decay ? (float)f->wc.optim.weight_decay : 0.0f;
        FSDP_TRY_GOTO(f->sk->adamw(u->master + p->shard_off, u->grad + p->shard_off, u->exp_avg + p->shard_off,
                                   u->exp_avg_sq + p->shard_off, p->count, &hp),
                      rc, out);
    }
    FSDP_TRY_GOTO(zero_grads(f), rc, out);
    /* No all-gather is in flight after a backward: the low-precision copies they read can be refreshed
     * before the gathered copies are dropped (a skipped step refreshes them from unchanged masters). */
    FSDP_TRY_GOTO(fsdp_refresh_lp(f), rc, out);
out:
    /* the update made the gathered copies stale (a failed update too) */
    for (int i = 0; i < f->n_units; i++)
        fsdp_release(f, i);
    f->grads_dirty = false;
    return rc;
}

int fsdp_finish_step(struct fsdp *f, int64_t step, struct fsdp_step_result *res, double *local_loss)
{
    struct fsdp_step_stats st;
    /* The step's collectives first: a failed one (a dead peer: aborted at its deadline) is the step's error,
     * before anything it fed is read. */
    FSDP_TRY(fsdp_ordered_drain(f));
    /* One read for the step: the loss moves next to the clip's outcome on the device first (the same memory
     * unless the optimizer was offloaded to the host). */
    if (!f->offload) {
        FSDP_TRY(model_move_loss(f->model, &f->stats->loss));
        FSDP_TRY(f->k->mem_copy(&st, f->stats, sizeof st, KERNELS_COPY_D2H));
    } else {
        FSDP_TRY(model_take_loss(f->model, &st.loss));
        memcpy(&st.clip, &f->stats->clip, sizeof st.clip);
    }
    *local_loss = st.loss;
    double scale = f->loss_scale, norm = st.clip.norm;
    memset(res, 0, sizeof *res);
    res->grad_norm = norm;
    if (!isfinite(norm)) {
        if (f->param_dtype != DTYPE_F16)
            return error_set(FSDP_ERANGE, "step %lld: the gradient norm is %g (the loss diverged); lower optim.lr "
                             "or set optim.grad_clip", (long long)step, norm);
        /* every rank computed the same norm, so every rank skipped the update together */
        f->loss_scale *= SCALER_BACKOFF;
        f->scaler_good = 0;
        res->skipped = true;
        res->loss_scale = f->loss_scale;
        log_warn("step %lld: non-finite gradients at loss scale %g; step skipped, scale now %g", (long long)step,
                 scale, f->loss_scale);
        return 0;
    }
    if (f->param_dtype == DTYPE_F16 && ++f->scaler_good >= SCALER_INTERVAL) {
        f->loss_scale *= SCALER_GROWTH;
        f->scaler_good = 0;
        /* Said once per growth, like a skip, so a run's log shows every change of the scale. */
        log_info("step %lld: %d steps without overflow; loss scale now %g", (long long)step, SCALER_INTERVAL,
                 f->loss_scale);
    }
    res->loss_scale = f->loss_scale;
    return 0;
}

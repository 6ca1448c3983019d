/* The engine's data path: creating groups and state, gathering units (with prefetch), the per-unit
 * forward/backward over the model, and the gradient reduce-scatter / replicate all-reduce pipeline. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "worker/fsdp/fsdp_internal.h"

static enum dtype precision_dtype(enum worker_precision p, const struct kernels *k)
{
    switch (p) {
    case WORKER_BF16: return DTYPE_BF16;
    case WORKER_FP16: return DTYPE_F16;
    case WORKER_PRECISION_AUTO: return k->auto_dtype;
    default: return DTYPE_F32;
    }
}

static int make_groups(struct fsdp *f)
{
    int world = f->g.world_size, rank = f->g.rank, sg = f->shard_size;
    f->rep_size = world / sg;
    f->shard_rank = rank % sg;
    f->rep_rank = rank / sg;
    if (sg == world) {
        f->shard_comm = sg > 1 ? f->g.world : NULL;
    } else if (sg > 1) {
        f->own_shard_comm = true;
        FSDP_TRY(comm_split(f->g.world, rank / sg, rank, &f->shard_comm));
    }
    if (f->rep_size == world) {
        f->rep_comm = f->rep_size > 1 ? f->g.world : NULL;
    } else if (f->rep_size > 1) {
        f->own_rep_comm = true;
        FSDP_TRY(comm_split(f->g.world, rank % sg, rank, &f->rep_comm));
    }
    return 0;
}

/* One allocation holds every unit's master, gradient, moments and low-precision shards: registered with
 * the communicator, the shards are read by peers directly in all-gathers and replicate all-reduces, and
 * one mapping per rank keeps the peers' mapping caches small. */
static int alloc_state(struct fsdp *f)
{
    size_t es = dtype_size(f->param_dtype), total = 0;
#define SLICE(n) (((n) + 63) / 64 * 64)
    for (int i = 0; i < f->n_units; i++) {
        size_t b = SLICE(f->units[i].shard * sizeof(float));
        total += 4 * b + (f->param_dtype != DTYPE_F32 ? SLICE(f->units[i].shard * es) : 0);
    }
    total += SLICE(sizeof(struct fsdp_step_stats));
    /* Offloaded state lives in the device's pinned host memory: the per-unit H2D/D2H copies of offload then
     * run at bus speed (plain host memory on the CPU backend). */
    f->arena = f->offload ? f->k->host_alloc(total ? total : 64) : fsdp_raw_alloc(f, total);
    if (!f->arena)
        return error_set(FSDP_ENOMEM, "fsdp: cannot allocate the %zu bytes of persistent state: %s", total,
                         error_message());
    /* Offload: a unit's gradients come to the host through one pinned buffer of the largest unit, made
     * now, before any collective (pinning memory while NCCL kernels run can stall the device). */
    if (f->offload) {
        size_t most = 1;
        for (int i = 0; i < f->n_units; i++) {
            size_t n = f->units[i].numel > f->units[i].shard ? f->units[i].numel : f->units[i].shard;
            most = n > most ? n : most;
        }
        if (!(f->host_stage = f->k->host_alloc(most * sizeof(float))))
            return error_set(FSDP_ENOMEM, "fsdp: cannot allocate %zu bytes of pinned staging for offloaded "
                             "gradients: %s", most * sizeof(float), error_message());
        fsdp_mem_add(f, FSDP_MEM_COMM, (ptrdiff_t)(most * sizeof(float)));
    }
    /* Zero it: the moments start at 0, and touching the pages makes RSS show what sharding saves. */
    FSDP_TRY(f->sk->mem_set(f->arena, 0, total ? total : 64));
    char *at = f->arena;
    for (int i = 0; i < f->n_units; i++) {
        struct fsdp_unit *u = &f->units[i];
        size_t b = SLICE(u->shard * sizeof(float));
        u->master = (float *)at;
        u->grad = (float *)(at + b);
        u->exp_avg = (float *)(at + 2 * b);
        u->exp_avg_sq = (float *)(at + 3 * b);
        at += 4 * b;
        fsdp_mem_add(f, FSDP_MEM_PARAMS, (ptrdiff_t)b);
        fsdp_mem_add(f, FSDP_MEM_GRADS, (ptrdiff_t)b);
        fsdp_mem_add(f, FSDP_MEM_OPTIM, (ptrdiff_t)(2 * b));
        if (f->param_dtype != DTYPE_F32) {
            u->lp = at;
            at += SLICE(u->shard * es);
            fsdp_mem_add(f, FSDP_MEM_PARAMS, (ptrdiff_t)SLICE(u->shard * es));
        }
    }
    f->stats = (struct fsdp_step_stats *)at;
#undef SLICE
    for (size_t i = 0; i < f->n_pieces; i++) {
        struct fsdp_piece *p = &f->pieces[i];
        struct fsdp_unit *u = &f->units[p->unit];
        p->data[FSDP_STATE_PARAM] = u->master + p->shard_off;
        p->data[FSDP_STATE_EXP_AVG] = u->exp_avg + p->shard_off;
        p->data[FSDP_STATE_EXP_AVG_SQ] = u->exp_avg_sq + p->shard_off;
    }
    return 0;
}

int fsdp_create(struct fsdp **out, const struct worker_config *wc, struct model *model, const struct kernels *k,
                const struct fsdp_groups *g)
{
    *out = NULL;
    FSDP_TRY(fsdp_check_config(wc, g->world_size, g->local_world_size, k));
    struct fsdp *f = calloc(1, sizeof *f);
    if (!f)
        return error_set(FSDP_ENOMEM, "fsdp: out of memory");
    f->wc = *wc;
    f->k = k;
    /* FSDP_TEST_OFFLOAD=1 runs the offload path on the CPU backend too (host "device"), so the staging
     * copies are tested where no GPU exists; without it offload_params changes nothing on host memory. */
    f->offload = wc->fsdp.enable && wc->fsdp.offload_params &&
                 (!k->host_visible || settings_bool(SETTING_TEST_OFFLOAD));
    f->sk = f->offload ? k->host() : k;
    /* FSDP_REGISTERED_BUFFERS=0 turns registration off (for comparing the two paths). */
    f->reg = g->world && settings_bool(SETTING_REGISTERED_BUFFERS) ? g->world : NULL;
    f->model = model;
    f->layout = model_get_layout(model);
    f->g = *g;
    f->version = wc->fsdp.version;
    f->strategy = wc->fsdp.enable ? wc->fsdp.sharding_strategy : WORKER_NO_SHARD;
    f->param_dtype = precision_dtype(wc->fsdp.mixed_precision, k);
    f->reduce_dtype = precision_dtype(wc->fsdp.reduce_dtype, k);
    f->shard_size = fsdp_shard_group_size(wc, g->world_size, g->local_world_size);
    f->loss_scale = f->param_dtype == DTYPE_F16 ? 65536.0 : 1.0;
    int rc = 0;
    if (g->world_size > 1 && !g->world) {
        rc = error_set(FSDP_EINVAL, "fsdp: world size %d without a communicator", g->world_size);
        goto fail;
    }
    /* Mixed precision reaches the matmuls too: they take bf16/fp16 operands and accumulate in fp32, as
     * autocast does, where the table runs that dtype natively (CUDA's tensor cores; oneDNN on a CPU with
     * bf16 instructions); elsewhere they compute in fp32 on the rounded parameters. A table that takes
     * bound copies reads the gathered 16-bit parameters as they arrived, without rounding them again. */
    f->compute_dtype = k->matmul_dtypes & DTYPE_BIT(f->param_dtype) ? f->param_dtype : DTYPE_F32;
    f->bind_lp = f->compute_dtype != DTYPE_F32 && k->lowp_bind && k->lowp_unbind;
    FSDP_TRY_GOTO(k->set_matmul_dtype(f->param_dtype), rc, fail);
    /* the GEMM inputs the model keeps for backward in that dtype too, where the table stores them so */
    FSDP_TRY_GOTO(model_set_compute_dtype(model, f->compute_dtype), rc, fail);
    FSDP_TRY_GOTO(make_groups(f), rc, fail);
    FSDP_TRY_GOTO(fsdp_plan_build(f), rc, fail);
    FSDP_TRY_GOTO(alloc_state(f), rc, fail);
    fsdp_mem_add(f, FSDP_MEM_ACTIVATIONS, (ptrdiff_t)model_get_arena_bytes(model));
    *out = f;
    return 0;
fail:
    fsdp_destroy(f);
    return rc;
}

void fsdp_destroy(struct fsdp *f)
{
    if (!f)
        return;
    fsdp_pending_drain(f, 0);
    fsdp_ordered_drain(f);
    free(f->ordered);
    for (int i = 0; f->units && i < f->n_units; i++)
        fsdp_release(f, i);
    if (f->offload) {
        f->k->host_free(f->arena);
        f->k->host_free(f->host_stage);
    }
    else if (f->arena)
        fsdp_raw_free(f, f->arena);
    fsdp_pool_free(f);
    if (f->own_shard_comm)
        comm_destroy(f->shard_comm);
    if (f->own_rep_comm)
        comm_destroy(f->rep_comm);
    fsdp_plan_free(f);
    free(f);
}

/* ---- gathering ---- */

/* Once a unit is gathered: its 16-bit copy becomes what the matmuls read for its fp32 parameters. */
static int bind_lp(struct fsdp *f, struct fsdp_unit *u)
{
    return u->full_lp ? f->k->lowp_bind(u->full, u->full_lp, u->numel) : 0;
}

/* A one-rank shard group in low precision: the unit's low-precision copy cast into `full` (through a
 * device copy of it when the state is offloaded). With bind_lp that copy (the shard of a one-rank group is
 * the unit in model order) stays as the unit's full_lp. */
static int lp_to_full(struct fsdp *f, struct fsdp_unit *u)
{
    void *lp = u->lp;
    if (f->offload &&
        !(lp = fsdp_buf_get(f, u->numel * dtype_size(f->param_dtype), f->bind_lp ? FSDP_MEM_GATHERED : FSDP_MEM_COMM)))
        return FSDP_ENOMEM;
    int rc = 0;
    if (lp != u->lp)
        FSDP_TRY_GOTO(fsdp_state_to_dev(f, lp, u->lp, u->numel * dtype_size(f->param_dtype)), rc, out);
    FSDP_TRY_GOTO(f->k->cast(u->full, DTYPE_F32, lp, f->param_dtype, u->numel), rc, out);
out:
    if (f->bind_lp) {
        u->full_lp = lp;
        u->full_lp_alias = lp == u->lp;
    } else if (lp != u->lp) {
        fsdp_buf_put(f, lp);
    }
    return rc;
}

int fsdp_gather_issue(struct fsdp *f, int ui)
{
    struct fsdp_unit *u = &f->units[ui];
    if (u->gstate != FSDP_GATHER_NONE)
        return 0;
    size_t es = dtype_size(f->param_dtype), sg = (size_t)f->shard_size;
    if (sg == 1) {
        if (f->param_dtype == DTYPE_F32 && !f->offload) {
            u->full = u->master;
            u->full_alias = true;
        } else {
            /* Compute sees the parameters as param_dtype rounds them (and in device memory). */
            if (!(u->full = fsdp_buf_get(f, u->numel * sizeof(float), FSDP_MEM_GATHERED)))
                return FSDP_ENOMEM;
            if (f->param_dtype == DTYPE_F32)
                FSDP_TRY(fsdp_state_to_dev(f, u->full, u->master, u->numel * sizeof(float)));
            else
                FSDP_TRY(lp_to_full(f, u));
            FSDP_TRY(bind_lp(f, u));
        }
        u->gstate = FSDP_GATHER_READY;
        return 0;
    }
    const void *src = f->param_dtype == DTYPE_F32 ? (const void *)u->master : u->lp;
    if (f->offload) {
        /* the shard lives in host memory; the collective needs it on the device */
        if (!(u->gsrc = fsdp_buf_get(f, u->shard * es, FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        FSDP_TRY(fsdp_state_to_dev(f, u->gsrc, src, u->shard * es));
        src = u->gsrc;
    }
    size_t cap = f->version == 1 ? sg * u->shard : u->numel;
    if (!(u->full = fsdp_buf_get(f, cap * sizeof(float), FSDP_MEM_GATHERED)))
        return FSDP_ENOMEM;
    void *dst = u->full;
    u->gbuf = NULL;
    if (f->version != 1 || f->param_dtype != DTYPE_F32) {
        if (!(u->gbuf = fsdp_buf_get(f, sg * u->shard * es, FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        dst = u->gbuf;
    }
    FSDP_TRY(comm_all_gather_async(f->shard_comm, src, dst, u->shard, f->param_dtype, &u->gwork));
    u->gstate = FSDP_GATHER_INFLIGHT;
    f->timing.gathers++;
    return 0;
}

/* Rank-major gathered shards -> the unit's parameters in model order (and to fp32). When the matmuls read
 * the 16-bit copy, it is kept in model order too (full_lp): version 1's receive buffer is that already;
 * version 2's rows are copied into place, then converted to fp32 in one pass. */
static int gather_unpack(struct fsdp *f, struct fsdp_unit *u)
{
    const struct kernels *k = f->k;
    size_t es = dtype_size(f->param_dtype), sg = (size_t)f->shard_size;
    if (f->version == 1) {
        if (f->bind_lp) {
            u->full_lp = u->gbuf;
            u->gbuf = NULL;
        }
        return k->cast(u->full, DTYPE_F32, u->full_lp ? u->full_lp : u->gbuf, f->param_dtype, u->numel);
    }
    if (f->bind_lp) {
        if (!(u->full_lp = fsdp_buf_get(f, u->numel * es, FSDP_MEM_GATHERED)))
            return FSDP_ENOMEM;
        for (size_t r = 0; r < sg; r++)
            for (int j = 0; j < u->n_params; j++) {
                const struct fsdp_pslot *s = &u->slots[j];
                size_t rb, re;
                fsdp_slot_rows(s, r, &rb, &re);
                if (re == rb)
                    continue;
                FSDP_TRY(k->mem_copy((char *)u->full_lp + (s->unit_off + rb * s->row_len) * es,
                                     (const char *)u->gbuf + (r * u->shard + s->shard_off) * es,
                                     (re - rb) * s->row_len * es, KERNELS_COPY_D2D));
            }
        return k->cast(u->full, DTYPE_F32, u->full_lp, f->param_dtype, u->numel);
    }
    for (size_t r = 0; r < sg; r++)
        for (int j = 0; j < u->n_params; j++) {
            const struct fsdp_pslot *s = &u->slots[j];
            size_t rb, re;
            fsdp_slot_rows(s, r, &rb, &re);
            if (re == rb)
                continue;
            const char *from = (const char *)u->gbuf + (r * u->shard + s->shard_off) * es;
            FSDP_TRY(k->cast(u->full + s->unit_off + rb * s->row_len, DTYPE_F32, from, f->param_dtype,
                             (re - rb) * s->row_len));
        }
    return 0;
}

int fsdp_gather_wait(struct fsdp *f, int ui)
{
    struct fsdp_unit *u = &f->units[ui];
    if (u->gstate == FSDP_GATHER_NONE) {
        FSDP_TRY(fsdp_gather_issue(f, ui));
    } else if (u->gstate == FSDP_GATHER_INFLIGHT) {
        f->timing.prefetched++;
    }
    if (u->gstate != FSDP_GATHER_INFLIGHT)
        return 0;
    double t0 = clock_now_s();
    int rc = 0, waited = fsdp_comm_order(f, u->gwork); /* the unpack and the forward wait on the device */
    f->timing.gather_wait_s += clock_now_s() - t0;
    u->gwork = NULL;
    FSDP_TRY_GOTO(waited, rc, out);
    if (u->gbuf)
        FSDP_TRY_GOTO(gather_unpack(f, u), rc, out);
    FSDP_TRY_GOTO(bind_lp(f, u), rc, out);
out:
    fsdp_buf_put(f, u->gbuf);
    u->gbuf = NULL;
    fsdp_buf_put(f, u->gsrc);
    u->gsrc = NULL;
    u->gstate = rc ? FSDP_GATHER_NONE : FSDP_GATHER_READY;
    return rc;
}

void fsdp_release(struct fsdp *f, int ui)
{
    struct fsdp_unit *u = &f->units[ui];
    if (u->gstate == FSDP_GATHER_INFLIGHT) {
        comm_work_wait(u->gwork);
        u->gwork = NULL;
        fsdp_buf_put(f, u->gbuf);
        u->gbuf = NULL;
        fsdp_buf_put(f, u->gsrc);
        u->gsrc = NULL;
    }
    if (u->full_lp) {
        f->k->lowp_unbind(u->full);
        if (!u->full_lp_alias)
            fsdp_buf_put(f, u->full_lp);
    }
    u->full_lp = NULL;
    u->full_lp_alias = false;
    if (u->full && !u->full_alias)
        fsdp_buf_put(f, u->full);
    u->full = NULL;
    u->full_alias = false;
    u->gstate = FSDP_GATHER_NONE;
}

/* ---- gradient reduction ---- */

static int pending_push(struct fsdp *f, struct fsdp_pending p)
{
    if (f->n_pending == FSDP_MAX_PENDING)
        FSDP_TRY(fsdp_pending_drain(f, FSDP_MAX_PENDING - 1));
    f->pending[f->n_pending++] = p;
    return 0;
}

/* The unit's fp32 gradient shard cast to reduce_dtype into dst (through a device copy of the shard when
 * the state is offloaded). */
static int grad_to_lp(struct fsdp *f, struct fsdp_unit *u, void *dst)
{
    float *g32 = u->grad;
    if (f->offload && !(g32 = fsdp_buf_get(f, u->shard * sizeof(float), FSDP_MEM_COMM)))
        return FSDP_ENOMEM;
    int rc = 0;
    if (g32 != u->grad)
        FSDP_TRY_GOTO(fsdp_state_to_dev(f, g32, u->grad, u->shard * sizeof(float)), rc, out);
    FSDP_TRY_GOTO(f->k->cast(dst, f->reduce_dtype, g32, DTYPE_F32, u->shard), rc, out);
out:
    if (g32 != u->grad)
        fsdp_buf_put(f, g32);
    return rc;
}

/* The replicate all-reduce of a unit's (accumulated) gradient shard, once per step. */
static int replicate_issue(struct fsdp *f, int ui)
{
    struct fsdp_unit *u = &f->units[ui];
    struct fsdp_pending p = {.unit = ui, .is_replicate = true};
    int rc = 0;
    if (f->reduce_dtype == DTYPE_F32 && !f->offload) {
        FSDP_TRY_GOTO(comm_all_reduce_async(f->rep_comm, u->grad, u->grad, u->shard, DTYPE_F32, COMM_SUM, &p.work),
                      rc, fail);
    } else if (f->reduce_dtype == DTYPE_F32) {
        /* offload: the all-reduce runs on a device copy, copied back when it completes */
        if (!(p.recv = fsdp_buf_get(f, u->shard * sizeof(float), FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        FSDP_TRY_GOTO(fsdp_state_to_dev(f, p.recv, u->grad, u->shard * sizeof(float)), rc, fail);
        FSDP_TRY_GOTO(comm_all_reduce_async(f->rep_comm, p.recv, p.recv, u->shard, DTYPE_F32, COMM_SUM, &p.work),
                      rc, fail);
    } else {
        if (!(p.recv = fsdp_buf_get(f, u->shard * 2, FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        p.recv_lp = true;
        FSDP_TRY_GOTO(grad_to_lp(f, u, p.recv), rc, fail);
        FSDP_TRY_GOTO(comm_all_reduce_async(f->rep_comm, p.recv, p.recv, u->shard, f->reduce_dtype,
                                            COMM_SUM, &p.work),
                      rc, fail);
    }
    return pending_push(f, p);
fail:
    fsdp_buf_put(f, p.recv);
    return rc;
}

static int pending_finish(struct fsdp *f, struct fsdp_pending *p)
{
    double t0 = clock_now_s();
    int rc = 0, waited = fsdp_comm_order(f, p->work); /* the accumulation waits on the device */
    f->timing.reduce_wait_s += clock_now_s() - t0;
    struct fsdp_unit *u = &f->units[p->unit];
    const struct kernels *k = f->k;
    float *tmp = NULL; /* the received low-precision sum in fp32 */
    FSDP_TRY_GOTO(waited, rc, out);
    if (p->is_replicate) {
        if (p->recv_lp && !f->offload) {
            FSDP_TRY_GOTO(k->cast(u->grad, DTYPE_F32, p->recv, f->reduce_dtype, u->shard), rc, out);
        } else if (p->recv_lp) {
            if (!(tmp = fsdp_buf_get(f, u->shard * sizeof(float), FSDP_MEM_COMM))) {
                rc = FSDP_ENOMEM;
                goto out;
            }
            FSDP_TRY_GOTO(k->cast(tmp, DTYPE_F32, p->recv, f->reduce_dtype, u->shard), rc, out);
            FSDP_TRY_GOTO(fsdp_dev_to_state(f, u->grad, tmp, u->shard * sizeof(float)), rc, out);
        } else if (p->recv) {
            FSDP_TRY_GOTO(fsdp_dev_to_state(f, u->grad, p->recv, u->shard * sizeof(float)), rc, out);
        }
    } else {
        float *sum = p->recv;
        if (p->recv_lp) {
            if (!(tmp = fsdp_buf_get(f, u->shard * sizeof(float), FSDP_MEM_COMM))) {
                rc = FSDP_ENOMEM;
                goto out;
            }
            FSDP_TRY_GOTO(k->cast(tmp, DTYPE_F32, p->recv, f->reduce_dtype, u->shard), rc, out);
            sum = tmp;
        }
        FSDP_TRY_GOTO(fsdp_state_accumulate(f, u->grad, sum, u->shard), rc, out);
    }
out:
    fsdp_buf_put(f, tmp);
    fsdp_buf_put(f, p->send);
    fsdp_buf_put(f, p->recv);
    return rc;
}

static struct fsdp_pending pending_pop(struct fsdp *f)
{
    struct fsdp_pending p = f->pending[0];
    memmove(&f->pending[0], &f->pending[1], (size_t)(f->n_pending - 1) * sizeof p);
    f->n_pending--;
    return p;
}

/* Finishes the oldest pending reductions until at most `keep` remain. A reduce-scatter of the last
 * micro-batch, once added into the shard, starts that unit's replicate all-reduce. */
int fsdp_pending_drain(struct fsdp *f, int keep)
{
    int rc = 0;
    while (f->n_pending > keep) {
        struct fsdp_pending p = pending_pop(f);
        FSDP_TRY_GOTO(pending_finish(f, &p), rc, fail);
        if (!p.is_replicate && p.last && f->rep_comm)
            FSDP_TRY_GOTO(replicate_issue(f, p.unit), rc, fail);
    }
    return 0;
fail:
    /* After a failure the rest are still waited for and their buffers returned; the first error is the
     * one passed up. */
    while (f->n_pending > keep) {
        struct fsdp_pending p = pending_pop(f);
        pending_finish(f, &p);
    }
    return rc;
}

/* Unsharded gradients of a unit for this backward: the gradient shard itself when nothing needs to be
 * reduced in between (one-rank shard group in fp32: micro-batches accumulate in place). */
static int grads_begin(struct fsdp *f, int ui)
{
    struct fsdp_unit *u = &f->units[ui];
    if (u->fgrad)
        return 0;
    if (f->shard_size == 1 && f->reduce_dtype == DTYPE_F32 && !f->offload) {
        u->fgrad = u->grad;
        return 0;
    }
    size_t cap = f->shard_size > 1 && f->version == 1 ? (size_t)f->shard_size * u->shard : u->numel;
    if (!(u->fgrad = fsdp_buf_get(f, cap * sizeof(float), FSDP_MEM_UNSHARDED_GRADS)))
        return FSDP_ENOMEM;
    return f->k->mem_set(u->fgrad, 0, cap * sizeof(float));
}

/* Version 2: the unit's unsharded gradients packed into rank-major order in send. Only the padding at the
 * end of a chunk is zeroed, so the pack is the one pass over every gradient. */
static int grads_pack(struct fsdp *f, const struct fsdp_unit *u, float *send)
{
    const struct kernels *k = f->k;
    for (size_t r = 0; r < (size_t)f->shard_size; r++)
        for (int j = 0; j < u->n_params; j++) {
            const struct fsdp_pslot *s = &u->slots[j];
            size_t rb, re;
            fsdp_slot_rows(s, r, &rb, &re);
            float *dst = send + r * u->shard + s->shard_off;
            if (re > rb)
                FSDP_TRY(k->mem_copy(dst, u->fgrad + s->unit_off + rb * s->row_len,
                                     (re - rb) * s->row_len * sizeof(float), KERNELS_COPY_D2D));
            if (re - rb < s->chunk)
                FSDP_TRY(k->mem_set(dst + (re - rb) * s->row_len, 0,
                                    (s->chunk - (re - rb)) * s->row_len * sizeof(float)));
        }
    return 0;
}

/* After a unit's backward: start reducing its gradients (asynchronously). */
static int grads_reduce(struct fsdp *f, int ui, bool last)
{
    struct fsdp_unit *u = &f->units[ui];
    const struct kernels *k = f->k;
    size_t sg = (size_t)f->shard_size;
    int rc = 0;
    if (sg == 1) {
        if (u->fgrad != u->grad) {
            rc = fsdp_state_accumulate(f, u->grad, u->fgrad, u->numel);
            fsdp_buf_put(f, u->fgrad);
        }
        u->fgrad = NULL;
        if (rc)
            return rc;
        return last && f->rep_comm ? replicate_issue(f, ui) : 0;
    }
    struct fsdp_pending p = {.unit = ui, .last = last};
    float *send = u->fgrad;
    if (f->version != 1) {
        if (!(send = fsdp_buf_get(f, sg * u->shard * sizeof(float), FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        rc = grads_pack(f, u, send);
        fsdp_buf_put(f, u->fgrad);
    }
    u->fgrad = NULL;
    if (rc)
        return rc;
    void *in = send;
    if (f->reduce_dtype != DTYPE_F32) {
        if (!(in = fsdp_buf_get(f, sg * u->shard * 2, FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        rc = k->cast(in, f->reduce_dtype, send, DTYPE_F32, sg * u->shard);
        fsdp_buf_put(f, send);
        p.recv_lp = true;
    }
    p.send = in;
    if (rc)
        goto fail;
    if (!(p.recv = fsdp_buf_get(f, u->shard * dtype_size(f->reduce_dtype), FSDP_MEM_COMM))) {
        rc = FSDP_ENOMEM;
        goto fail;
    }
    FSDP_TRY_GOTO(comm_reduce_scatter_async(f->shard_comm, in, p.recv, u->shard, f->reduce_dtype,
                                            COMM_SUM, &p.work),
                  rc, fail);
    FSDP_TRY(pending_push(f, p));
    /* limit_all_gathers also bounds reductions in flight, and so the memory they hold */
    if (f->wc.fsdp.limit_all_gathers)
        FSDP_TRY(fsdp_pending_drain(f, 2));
    return 0;
fail:
    fsdp_buf_put(f, p.send);
    fsdp_buf_put(f, p.recv);
    return rc;
}

/* ---- forward and backward ---- */

static const float *mu_params(const struct fsdp *f, int mu)
{
    const struct fsdp_unit *u = &f->units[f->unit_of_mu[mu]];
    return u->full + (f->layout->units[mu].offset - u->offset);
}

static float *mu_grads(const struct fsdp *f, int mu)
{
    const struct fsdp_unit *u = &f->units[f->unit_of_mu[mu]];
    return u->fgrad + (f->layout->units[mu].offset - u->offset);
}

/* The forward through every block; units are released after forward when `release` says so. */
static int forward_blocks(struct fsdp *f, bool eval)
{
    const struct model_layout *l = f->layout;
    for (int mu = 1; mu < l->n_units; mu++) {
        int ui = f->unit_of_mu[mu];
        struct fsdp_unit *u = &f->units[ui];
        if (mu == u->first_mu) {
            FSDP_TRY(fsdp_gather_wait(f, ui));
            if (f->wc.fsdp.forward_prefetch && ui + 1 < f->n_units)
                FSDP_TRY(fsdp_gather_issue(f, ui + 1));
        }
        FSDP_TRY(model_forward_block(f->model, mu - 1, mu_params(f, mu)));
        /* In training the last unit is not resharded: backward needs it again right after the head, so
         * freeing it would only buy a second all-gather of the same values (torchtitan sets
         * reshard_after_forward = False on the last block for the same reason). The memory peak does not
         * move: backward holds this unit and the next one's prefetch anyway. */
        bool release = eval ? !u->is_root && !u->full_alias : u->reshard && ui != f->n_units - 1;
        if (mu == u->first_mu + u->n_mu - 1 && release)
            fsdp_release(f, ui);
    }
    return 0;
}

int fsdp_forward_backward(struct fsdp *f, float dloss, bool last)
{
    const struct model_layout *l = f->layout;
    bool pre = f->wc.fsdp.backward_prefetch == WORKER_BACKWARD_PRE;
    bool post = f->wc.fsdp.backward_prefetch == WORKER_BACKWARD_POST;
    int rc = 0;
    FSDP_TRY_GOTO(fsdp_gather_wait(f, 0), rc, out);
    if (f->wc.fsdp.forward_prefetch && f->n_units > 1)
        FSDP_TRY_GOTO(fsdp_gather_issue(f, 1), rc, out);
    FSDP_TRY_GOTO(model_forward_embed(f->model, mu_params(f, 0)), rc, out);
    FSDP_TRY_GOTO(forward_blocks(f, false), rc, out);
    FSDP_TRY_GOTO(model_forward_head(f->model, mu_params(f, 0), dloss), rc, out);
    FSDP_TRY_GOTO(grads_begin(f, 0), rc, out);
    FSDP_TRY_GOTO(model_backward_head(f->model, mu_params(f, 0), mu_grads(f, 0)), rc, out);
    for (int mu = l->n_units - 1; mu >= 1; mu--) {
        int ui = f->unit_of_mu[mu];
        struct fsdp_unit *u = &f->units[ui];
        if (mu == u->first_mu + u->n_mu - 1 && ui != 0) {
            FSDP_TRY_GOTO(fsdp_gather_wait(f, ui), rc, out);
            FSDP_TRY_GOTO(grads_begin(f, ui), rc, out);
            if (pre && ui - 1 >= 1)
                FSDP_TRY_GOTO(fsdp_gather_issue(f, ui - 1), rc, out);
        }
        FSDP_TRY_GOTO(model_backward_block(f->model, mu - 1, mu_params(f, mu), mu_grads(f, mu)), rc, out);
        if (mu == u->first_mu && ui != 0) {
            if (post && ui - 1 >= 1)
                FSDP_TRY_GOTO(fsdp_gather_issue(f, ui - 1), rc, out);
            FSDP_TRY_GOTO(grads_reduce(f, ui, last), rc, out);
            /* Parameters are gathered again for the next forward when the strategy reshards; ZeRO-2 keeps
             * them until the optimizer step changes them. */
            if (u->reshard)
                fsdp_release(f, ui);
        }
    }
    FSDP_TRY_GOTO(model_backward_embed(f->model, mu_params(f, 0), mu_grads(f, 0)), rc, out);
    FSDP_TRY_GOTO(grads_reduce(f, 0, last), rc, out);
out:
    f->grads_dirty = true;
    return rc;
}

int fsdp_forward_eval(struct fsdp *f)
{
    FSDP_TRY(fsdp_gather_wait(f, 0));
    if (f->wc.fsdp.forward_prefetch && f->n_units > 1)
        FSDP_TRY(fsdp_gather_issue(f, 1));
    FSDP_TRY(model_forward_embed(f->model, mu_params(f, 0)));
    FSDP_TRY(forward_blocks(f, true));
    return model_forward_head(f->model, mu_params(f, 0), 0.0f);
}

int fsdp_take_loss(struct fsdp *f, double *local)
{
    return model_take_loss(f->model, local);
}

/* ---- accessors ---- */

double fsdp_loss_scale(const struct fsdp *f)
{
    return f->loss_scale;
}

const struct fsdp_mem_stats *fsdp_get_mem(const struct fsdp *f)
{
    return &f->mem;
}

const struct fsdp_timing *fsdp_get_timing(const struct fsdp *f)
{
    return &f->timing;
}

size_t fsdp_persistent_bytes(const struct fsdp *f)
{
    return f->mem.now[FSDP_MEM_PARAMS] + f->mem.now[FSDP_MEM_GRADS] + f->mem.now[FSDP_MEM_OPTIM];
}

const struct fsdp_piece *fsdp_pieces(const struct fsdp *f, size_t *n)
{
    *n = f->n_pieces;
    return f->pieces;
}

int fsdp_shard_rank(const struct fsdp *f)
{
    return f->shard_rank;
}

int fsdp_replica_index(const struct fsdp *f)
{
    return f->rep_rank;
}

int fsdp_shard_size(const struct fsdp *f)
{
    return f->shard_size;
}

int fsdp_n_units(const struct fsdp *f)
{
    return f->n_units;
}

void fsdp_unit_params(const struct fsdp *f, int ui, int *first_param, int *n_params, size_t *offset, size_t *numel)
{
    const struct fsdp_unit *u = &f->units[ui];
    *first_param = u->first_param;
    *n_params = u->n_params;
    *offset = u->offset;
    *numel = u->numel;
}

const struct kernels *fsdp_kernels(const struct fsdp *f)
{
    return f->k;
}

const struct kernels *fsdp_state_kernels(const struct fsdp *f)
{
    return f->sk;
}

const struct model_layout *fsdp_layout(const struct fsdp *f)
{
    return f->layout;
}

struct comm *fsdp_world(const struct fsdp *f)
{
    return f->g.world;
}

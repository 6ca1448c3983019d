/* The engine's state outside the step: initial parameters (each rank its own shards, or rank 0's
 * broadcast), low-precision copies, and access for checkpoints (whole units gathered one at a time). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/fsdp/fsdp_internal.h"
#include "worker/model/model_hf.h"

/* Copies this rank's shard of unit u out of its full parameters `full` (device, model order). */
static int shard_from_full(struct fsdp *f, struct fsdp_unit *u, const float *full)
{
    for (size_t i = 0; i < f->n_pieces; i++) {
        const struct fsdp_piece *p = &f->pieces[i];
        if (&f->units[p->unit] != u)
            continue;
        size_t src = f->layout->params[p->param].offset - u->offset + p->begin;
        FSDP_TRY(fsdp_dev_to_state(f, u->master + p->shard_off, full + src, p->count * sizeof(float)));
    }
    return 0;
}

int fsdp_check_finite(const struct model_layout *l, int p, size_t begin, const float *v, size_t n, const char *source)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return error_set(FSDP_ERANGE,
                             "%s: tensor '%s' holds %s at element %zu (of %zu): the weights were not finite before "
                             "training started (a damaged file, or a run that had diverged when it was saved), so "
                             "this is not a divergence of this run; start from other weights (an earlier "
                             "checkpoint) or without them",
                             source, l->params[p].name, isnan(v[i]) ? "NaN" : "an infinity", begin + i,
                             l->params[p].numel);
    return 0;
}

/* model.init_from as fsdp_check_finite's source. */
static void init_source(const struct fsdp *f, char *out, size_t cap)
{
    snprintf(out, cap, "model.init_from %s", f->layout->config.init_from);
}

/* Rank 0's values of unit u into host (u->numel floats): read parameter by parameter from the weights
 * (w), or generated from the seed, so that rank 0 never holds more than one unit of the model (holding a
 * whole 28.5M-parameter model puts rank 0's peak RSS 114 MB above its peers'). */
static int init_unit_values(const struct fsdp *f, const struct fsdp_unit *u, struct model_weights *w, float *host)
{
    const struct model_layout *l = f->layout;
    for (int j = 0; j < u->n_params; j++) {
        int p = u->first_param + j;
        float *dst = host + (l->params[p].offset - u->offset);
        if (w) {
            char src[FSDP_PATH_MAX + 32]; /* "model.init_from" and its path */
            init_source(f, src, sizeof src);
            FSDP_TRY(model_weights_read(w, p, 0, l->params[p].numel, dst));
            FSDP_TRY(fsdp_check_finite(l, p, 0, dst, l->params[p].numel, src));
        } else
            model_init_param_range(l, p, 0, l->params[p].numel, dst);
    }
    return 0;
}

/* model.init_from's weights (NULL without one), checked against the layout; no tensor data read yet. */
static int open_weights(const struct fsdp *f, struct model_weights **w)
{
    *w = NULL;
    const char *from = f->layout->config.init_from;
    return from[0] ? model_weights_open(f->layout, from, "model.init_from", w) : 0;
}

static void close_weights(struct fsdp *f, struct model_weights *w)
{
    if (w)
        f->init_bytes_read += model_weights_bytes_read(w);
    model_weights_close(w);
}

/* Rank 0's weights (when there are) and one unit's room in *host. The caller frees both, also on failure. */
static int init_rank0_values(const struct fsdp *f, struct model_weights **w, float **host)
{
    size_t most = 0;
    for (int i = 0; i < f->n_units; i++)
        most = f->units[i].numel > most ? f->units[i].numel : most;
    if (!(*host = malloc((most ? most : 1) * sizeof(float))))
        return error_set(FSDP_ENOMEM, "fsdp: no memory for rank 0's largest unit (%zu parameters)", most);
    return open_weights(f, w);
}

/* Unit u from rank 0 (its values from the weights or the seed, staged in host) into every rank's shard.
 * A read failure on rank 0 still joins the broadcast (with whatever host holds) so no rank waits forever;
 * then every rank learns of it from one sum (only when there is a file: a seeded init cannot fail). */
static int broadcast_unit(struct fsdp *f, struct fsdp_unit *u, struct model_weights *w, float *host)
{
    float *dev = fsdp_buf_get(f, u->numel * sizeof(float), FSDP_MEM_GATHERED);
    if (!dev)
        return FSDP_ENOMEM;
    int rc = 0, read = 0;
    if (host) {
        read = init_unit_values(f, u, w, host);
        if (!read)
            read = f->k->mem_copy(dev, host, u->numel * sizeof(float), KERNELS_COPY_H2D);
    }
    FSDP_TRY_GOTO(comm_broadcast(f->g.world, dev, u->numel, DTYPE_F32, 0), rc, out);
    FSDP_TRY_GOTO(shard_from_full(f, u, dev), rc, out);
    if (f->layout->config.init_from[0]) { /* every rank knows whether rank 0 reads a file */
        double bad = 0;
        FSDP_TRY_GOTO(fsdp_sum_world(f, read ? 1.0 : 0.0, &bad), rc, out);
        if (read)
            rc = read;
        else if (bad > 0)
            rc = error_set(FSDP_EABORTED, "fsdp: rank 0 could not read model.init_from (its log says why)");
    } else {
        rc = read;
    }
out:
    fsdp_buf_put(f, dev);
    return rc;
}

static int init_broadcast(struct fsdp *f)
{
    struct model_weights *w = NULL;
    float *host = NULL;
    int rc = f->g.rank == 0 ? init_rank0_values(f, &w, &host) : 0;
    /* Rank 0's init can fail (a bad init_from file): tell the others instead of leaving them in a broadcast.
     * Every rank enters the sum, rank 0 also after its own failure. */
    double failed = 0;
    int shared = fsdp_sum_world(f, rc ? 1.0 : 0.0, &failed);
    if (rc)
        goto out;
    FSDP_TRY_GOTO(shared, rc, out);
    if (failed > 0) {
        rc = error_set(FSDP_EABORTED, "fsdp: rank 0 could not initialise the model (its log says why)");
        goto out;
    }
    for (int i = 0; i < f->n_units; i++)
        FSDP_TRY_GOTO(broadcast_unit(f, &f->units[i], w, host), rc, out);
out:
    close_weights(f, w);
    free(host);
    return rc;
}

/* Every rank reads or generates exactly its own pieces: from a weights file, one pread of each piece's
 * bytes, so a rank reads about 1/world of the file. */
static int init_local(struct fsdp *f)
{
    const struct model_layout *l = f->layout;
    struct model_weights *w = NULL;
    FSDP_TRY(open_weights(f, &w));
    size_t most = 0;
    for (size_t i = 0; i < f->n_pieces; i++)
        most = f->pieces[i].count > most ? f->pieces[i].count : most;
    int rc = 0;
    float *tmp = malloc((most ? most : 1) * sizeof(float));
    if (!tmp) {
        rc = error_set(FSDP_ENOMEM, "fsdp: out of memory");
        goto out;
    }
    for (size_t i = 0; i < f->n_pieces; i++) {
        const struct fsdp_piece *p = &f->pieces[i];
        if (w) {
            char src[FSDP_PATH_MAX + 32]; /* "model.init_from" and its path */
            init_source(f, src, sizeof src);
            FSDP_TRY_GOTO(model_weights_read(w, p->param, p->begin, p->count, tmp), rc, out);
            FSDP_TRY_GOTO(fsdp_check_finite(l, p->param, p->begin, tmp, p->count, src), rc, out);
        } else
            model_init_param_range(l, p->param, p->begin, p->count, tmp);
        FSDP_TRY_GOTO(f->sk->mem_copy(p->data[FSDP_STATE_PARAM], tmp, p->count * sizeof(float), KERNELS_COPY_H2D),
                      rc, out);
    }
out:
    close_weights(f, w);
    free(tmp);
    return rc;
}

int fsdp_init_params(struct fsdp *f)
{
    /* A weights file: every rank reads the byte ranges of its own shards, or with cpu_ram_efficient_loading
     * rank 0 alone reads it, unit by unit, and broadcasts (the file need exist only on rank 0's node).
     * A seeded init: sync_module_states broadcasts rank 0's values. */
    bool bcast = f->layout->config.init_from[0] ? f->wc.checkpoint.cpu_ram_efficient_loading
                                                 : f->wc.fsdp.sync_module_states;
    FSDP_TRY(bcast && f->g.world_size > 1 ? init_broadcast(f) : init_local(f));
    return fsdp_refresh_lp(f);
}

uint64_t fsdp_init_bytes_read(const struct fsdp *f)
{
    return f->init_bytes_read;
}

size_t fsdp_unit_gather_capacity(const struct fsdp *f, int ui)
{
    const struct fsdp_unit *u = &f->units[ui];
    size_t sg = (size_t)f->shard_size, pad = 0;
    if (sg == 1)
        return u->numel;
    if (f->version == 1)
        return sg * u->shard;
    for (int j = 0; j < u->n_params; j++) {
        const struct fsdp_pslot *s = &u->slots[j];
        size_t over = (sg * s->chunk - s->rows) * s->row_len;
        pad = over > pad ? over : pad;
    }
    return u->numel + pad;
}

/* Host memory is device memory on the CPU backend: gather straight into dst, so that a full save holds one
 * unit, not two. Version 2 gathers parameter by parameter in order: a dim-0 chunk gathered over the ranks
 * is the parameter's rows in order, and the zero rows padding its end are overwritten by the next
 * parameter (dst has room for the last one's, see fsdp_unit_gather_capacity). */
static int gather_unit_direct(struct fsdp *f, struct fsdp_unit *u, const float *src, float *dst)
{
    if (f->version == 1)
        return comm_all_gather(f->shard_comm, src, dst, u->shard, DTYPE_F32);
    for (int j = 0; j < u->n_params; j++) {
        const struct fsdp_pslot *s = &u->slots[j];
        FSDP_TRY(comm_all_gather(f->shard_comm, src + s->shard_off, dst + s->unit_off, s->chunk * s->row_len,
                                 DTYPE_F32));
    }
    return 0;
}

/* Every rank's shard of u into all (rank-major), through a device copy of this rank's shard when the state
 * is offloaded. */
static int gather_shards(struct fsdp *f, struct fsdp_unit *u, const float *src, float *all)
{
    float *staged = NULL;
    int rc = 0;
    if (f->offload) {
        if (!(staged = fsdp_buf_get(f, u->shard * sizeof(float), FSDP_MEM_COMM)))
            return FSDP_ENOMEM;
        FSDP_TRY_GOTO(fsdp_state_to_dev(f, staged, src, u->shard * sizeof(float)), rc, out);
        src = staged;
    }
    FSDP_TRY_GOTO(comm_all_gather(f->shard_comm, src, all, u->shard, DTYPE_F32), rc, out);
out:
    fsdp_buf_put(f, staged);
    return rc;
}

int fsdp_gather_unit_state(struct fsdp *f, int ui, enum fsdp_state_kind kind, float *dst)
{
    struct fsdp_unit *u = &f->units[ui];
    const struct kernels *k = f->k;
    const float *src = kind == FSDP_STATE_PARAM ? u->master : kind == FSDP_STATE_EXP_AVG ? u->exp_avg : u->exp_avg_sq;
    size_t sg = (size_t)f->shard_size;
    if (sg == 1)
        return f->sk->mem_copy(dst, src, u->numel * sizeof(float), KERNELS_COPY_D2H);
    if (k->host_visible)
        return gather_unit_direct(f, u, src, dst);
    float *all = fsdp_buf_get(f, sg * u->shard * sizeof(float), FSDP_MEM_GATHERED);
    if (!all)
        return FSDP_ENOMEM;
    int rc = 0;
    FSDP_TRY_GOTO(gather_shards(f, u, src, all), rc, out);
    if (f->version == 1)
        FSDP_TRY_GOTO(k->mem_copy(dst, all, u->numel * sizeof(float), KERNELS_COPY_D2H), rc, out);
    for (size_t r = 0; f->version != 1 && r < sg; r++)
        for (int j = 0; j < u->n_params; j++) {
            const struct fsdp_pslot *s = &u->slots[j];
            size_t rb, re;
            fsdp_slot_rows(s, r, &rb, &re);
            if (re > rb)
                FSDP_TRY_GOTO(k->mem_copy(dst + s->unit_off + rb * s->row_len, all + r * u->shard + s->shard_off,
                                          (re - rb) * s->row_len * sizeof(float), KERNELS_COPY_D2H),
                              rc, out);
        }
out:
    fsdp_buf_put(f, all);
    return rc;
}

int fsdp_state_loaded(struct fsdp *f, int64_t optimizer_steps, double loss_scale, int64_t scaler_good)
{
    (void)optimizer_steps;
    if (f->param_dtype == DTYPE_F16 && loss_scale > 0) {
        f->loss_scale = loss_scale;
        f->scaler_good = scaler_good;
    }
    for (int i = 0; i < f->n_units; i++)
        fsdp_release(f, i);
    return fsdp_refresh_lp(f);
}

int64_t fsdp_scaler_good_steps(const struct fsdp *f)
{
    return f->scaler_good;
}

/* The engine's state outside the step: initial parameters (each rank its own shards, or rank 0's
 * broadcast), low-precision copies, and access for checkpoints (whole units gathered one at a time). */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "worker/fsdp/fsdp_internal.h"
#include "worker/model/model_hf.h"

/* Copies this rank's shard of unit u out of its full parameters `full` (device, model order). */
static int shard_from_full(struct fsdp *f, struct fsdp_unit *u, const float *full)
{
    int rc = 0;
    for (size_t i = 0; i < f->n_pieces && !rc; i++) {
        const struct fsdp_piece *p = &f->pieces[i];
        if (&f->units[p->unit] != u)
            continue;
        size_t src = f->layout->params[p->param].offset - u->offset + p->begin;
        rc = fsdp_dev_to_state(f, u->master + p->shard_off, full + src, p->count * sizeof(float));
    }
    return rc;
}

/* Rank 0's values of unit u into host (u->numel floats): read parameter by parameter from the weights
 * (w), or generated from the seed, so that rank 0 never holds more than one unit of the model (a
 * 28.5M-parameter model made rank 0's peak RSS 114 MB above its peers' when it held all of it). */
static int init_unit_values(const struct fsdp *f, const struct fsdp_unit *u, struct model_weights *w, float *host)
{
    const struct model_layout *l = f->layout;
    int rc = 0;
    for (int j = 0; j < u->n_params && !rc; j++) {
        int p = u->first_param + j;
        float *dst = host + (l->params[p].offset - u->offset);
        if (w)
            rc = model_weights_read(w, p, 0, l->params[p].numel, dst);
        else
            model_init_param_range(l, p, 0, l->params[p].numel, dst);
    }
    return rc;
}

static int open_weights(struct fsdp *f, struct model_weights **w)
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

static int init_broadcast(struct fsdp *f)
{
    struct model_weights *w = NULL;
    float *host = NULL;
    int rc = 0;
    if (f->g.rank == 0) {
        size_t most = 0;
        for (int i = 0; i < f->n_units; i++)
            most = f->units[i].numel > most ? f->units[i].numel : most;
        rc = open_weights(f, &w);
        if (!rc && !(host = malloc((most ? most : 1) * sizeof(float))))
            rc = error_set(FSDP_ENOMEM, "fsdp: no memory for rank 0's largest unit (%zu parameters)", most);
    }
    /* Rank 0's init can fail (a bad init_from file): tell the others instead of leaving them in a broadcast. */
    double failed = 0;
    int rc2 = fsdp_sum_world(f, rc ? 1.0 : 0.0, &failed);
    if (rc || rc2 || failed > 0) {
        close_weights(f, w);
        free(host);
        if (!rc && !rc2)
            rc = error_set(FSDP_EABORTED, "fsdp: rank 0 could not initialise the model (its log says why)");
        return rc ? rc : rc2;
    }
    for (int i = 0; i < f->n_units && !rc; i++) {
        struct fsdp_unit *u = &f->units[i];
        float *dev = fsdp_buf_get(f, u->numel * sizeof(float), FSDP_MEM_GATHERED);
        if (!dev) {
            rc = FSDP_ENOMEM;
            break;
        }
        /* A read failure on rank 0 mid-way still joins this unit's broadcast (with whatever it holds) so no
         * rank waits forever; the error ends the loop on rank 0 and the agreement below on the others. */
        int rrc = host ? init_unit_values(f, u, w, host) : 0;
        if (host && !rrc)
            rrc = f->k->mem_copy(dev, host, u->numel * sizeof(float), KERNELS_COPY_H2D);
        rc = comm_broadcast(f->g.world, dev, u->numel, COMM_F32, 0);
        if (!rc)
            rc = shard_from_full(f, u, dev);
        fsdp_buf_put(f, dev);
        double bad = 0;
        if (!rc)
            rc = fsdp_sum_world(f, rrc ? 1.0 : 0.0, &bad);
        if (!rc && rrc)
            rc = rrc;
        else if (!rc && bad > 0)
            rc = error_set(FSDP_EABORTED, "fsdp: rank 0 could not read model.init_from (its log says why)");
    }
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
    int rc = open_weights(f, &w);
    size_t most = 0;
    for (size_t i = 0; i < f->n_pieces; i++)
        most = f->pieces[i].count > most ? f->pieces[i].count : most;
    float *tmp = rc ? NULL : malloc((most ? most : 1) * sizeof(float));
    if (!rc && !tmp)
        rc = error_set(FSDP_ENOMEM, "fsdp: out of memory");
    for (size_t i = 0; i < f->n_pieces && !rc; i++) {
        const struct fsdp_piece *p = &f->pieces[i];
        if (w)
            rc = model_weights_read(w, p->param, p->begin, p->count, tmp);
        else
            model_init_param_range(l, p->param, p->begin, p->count, tmp);
        if (!rc)
            rc = f->sk->mem_copy(p->data[FSDP_STATE_PARAM], tmp, p->count * sizeof(float), KERNELS_COPY_H2D);
    }
    close_weights(f, w);
    free(tmp);
    return rc;
}

uint64_t fsdp_init_bytes_read(const struct fsdp *f)
{
    return f->init_bytes_read;
}

int fsdp_init_params(struct fsdp *f)
{
    /* A weights file: every rank reads the byte ranges of its own shards, or with cpu_ram_efficient_loading
     * rank 0 alone reads it, unit by unit, and broadcasts (the file need exist only on rank 0's node).
     * A seeded init: sync_module_states broadcasts rank 0's values. */
    bool bcast = f->layout->config.init_from[0] ? f->wc.checkpoint.cpu_ram_efficient_loading
                                                 : f->wc.fsdp.sync_module_states;
    int rc = bcast && f->g.world_size > 1 ? init_broadcast(f) : init_local(f);
    if (!rc)
        rc = fsdp_refresh_lp(f);
    return rc;
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
        return comm_all_gather(f->shard_comm, src, dst, u->shard, COMM_F32);
    int rc = 0;
    for (int j = 0; j < u->n_params && !rc; j++) {
        const struct fsdp_pslot *s = &u->slots[j];
        rc = comm_all_gather(f->shard_comm, src + s->shard_off, dst + s->unit_off, s->chunk * s->row_len, COMM_F32);
    }
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
    float *staged = NULL;
    if (!all)
        return FSDP_ENOMEM;
    int rc = 0;
    if (f->offload) {
        staged = fsdp_buf_get(f, u->shard * sizeof(float), FSDP_MEM_COMM);
        rc = staged ? fsdp_state_to_dev(f, staged, src, u->shard * sizeof(float)) : FSDP_ENOMEM;
        src = staged;
    }
    if (!rc)
        rc = comm_all_gather(f->shard_comm, src, all, u->shard, COMM_F32);
    fsdp_buf_put(f, staged);
    if (!rc && f->version == 1)
        rc = k->mem_copy(dst, all, u->numel * sizeof(float), KERNELS_COPY_D2H);
    for (size_t r = 0; !rc && f->version != 1 && r < sg; r++)
        for (int j = 0; !rc && j < u->n_params; j++) {
            const struct fsdp_pslot *s = &u->slots[j];
            size_t rb, re;
            fsdp_slot_rows(s, r, &rb, &re);
            if (re > rb)
                rc = k->mem_copy(dst + s->unit_off + rb * s->row_len, all + r * u->shard + s->shard_off,
                                 (re - rb) * s->row_len * sizeof(float), KERNELS_COPY_D2H);
        }
    fsdp_buf_put(f, all);
    return rc;
}

int fsdp_state_loaded(struct fsdp *f, int64_t optimizer_steps, double loss_scale, int64_t scaler_good)
{
    (void)optimizer_steps;
    if (f->param_dtype == KERNELS_F16 && loss_scale > 0) {
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

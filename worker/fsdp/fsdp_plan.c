/* The engine's plan: configuration checks against the world, units from the wrap policy, the shard
 * geometry of every unit (version 1 flat chunks, version 2 dim-0 chunks per parameter), the pieces this
 * rank owns, and the plan report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "worker/fsdp/fsdp_internal.h"

static const char *strategy_name(enum worker_sharding s)
{
    static const char *names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};
    return names[s];
}

const char *fsdp_strategy_name(const struct fsdp *f)
{
    return strategy_name(f->strategy);
}

/* Ranks per shard group for a strategy; 0 when the configuration cannot work (message set). */
int fsdp_shard_group_size(const struct worker_config *wc, int world, int local_world)
{
    if (!wc->fsdp.enable)
        return 1;
    switch (wc->fsdp.sharding_strategy) {
    case WORKER_FULL_SHARD:
    case WORKER_SHARD_GRAD_OP: return world;
    case WORKER_NO_SHARD: return 1;
    case WORKER_HYBRID_SHARD:
    case WORKER_HYBRID_SHARD_ZERO2: {
        int hs = wc->fsdp.hybrid_shard_size > 0 ? wc->fsdp.hybrid_shard_size : local_world;
        if (hs < 1)
            hs = 1;
        if (world % hs != 0) {
            char ok[256] = "";
            size_t len = 0;
            for (int d = 1; d <= world && len + 16 < sizeof ok; d++)
                if (world % d == 0)
                    len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
            error_set(FSDP_EINVAL,
                      "fsdp.sharding_strategy = %s: the shard group of %d ranks (fsdp.hybrid_shard_size%s) does not "
                      "divide the world size %d; use one of %s",
                      strategy_name(wc->fsdp.sharding_strategy), hs,
                      wc->fsdp.hybrid_shard_size > 0 ? "" : " = 0: the ranks of a node, LOCAL_WORLD_SIZE", world, ok);
            return 0;
        }
        return hs;
    }
    }
    return world;
}

int fsdp_check_config(const struct worker_config *wc, int world, int local_world, const struct kernels *k)
{
    if (world < 1)
        return error_set(FSDP_EINVAL, "world size %d: must be at least 1", world);
    FSDP_TRY(worker_config_validate_cp(wc));
    int cp = wc->fsdp.context_parallel_size > 0 ? wc->fsdp.context_parallel_size : 1;
    if (world % cp != 0) {
        char ok[256] = "";
        size_t len = 0;
        for (int d = 1; d <= world && len + 16 < sizeof ok; d++)
            if (world % d == 0 && wc->model.block_size % (2 * d) == 0)
                len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
        return error_set(FSDP_EINVAL,
                         "fsdp.context_parallel_size = %d does not divide the world size %d (world = data-parallel "
                         "degree x context_parallel_size); use one of %s",
                         cp, world, ok[0] ? ok : "1");
    }
    int dp = world / cp;
    if (wc->train.train_batch % dp != 0) {
        int lo = wc->train.train_batch / dp * dp, hi = lo + dp;
        return error_set(FSDP_EINVAL,
                         "train.train_batch = %d is not divisible by the %d data-parallel ranks%s: use a multiple of %d "
                         "(for example %d or %d)",
                         wc->train.train_batch, dp, cp > 1 ? " (world size / fsdp.context_parallel_size)" : "", dp,
                         lo > 0 ? lo : hi, lo > 0 ? hi : 2 * hi);
    }
    int per_rank = wc->train.train_batch / dp;
    if (per_rank % wc->train.micro_batch != 0) {
        char ok[256] = "";
        size_t len = 0;
        for (int d = 1; d <= per_rank && len + 16 < sizeof ok; d++)
            if (per_rank % d == 0)
                len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
        return error_set(FSDP_EINVAL,
                         "train.micro_batch = %d does not divide the %d sequences per rank (train.train_batch %d / "
                         "%d data-parallel ranks); use one of %s",
                         wc->train.micro_batch, per_rank, wc->train.train_batch, dp, ok);
    }
    int sg = fsdp_shard_group_size(wc, world, local_world);
    if (sg == 0)
        return FSDP_EINVAL;
    if (cp > 1 && sg % cp != 0)
        return error_set(FSDP_EINVAL,
                         "fsdp.sharding_strategy = %s: the shard group of %d ranks (fsdp.hybrid_shard_size%s) must "
                         "hold whole context groups of fsdp.context_parallel_size = %d consecutive ranks; use a "
                         "hybrid_shard_size that is a multiple of %d and divides %d",
                         strategy_name(wc->fsdp.sharding_strategy), sg,
                         wc->fsdp.hybrid_shard_size > 0 ? "" : " = 0: the ranks of a node", cp, cp, world);
    if (cp > 1 && (!k->attention_cp_forward || !k->attention_cp_backward))
        return error_set(FSDP_EUNSUPPORTED,
                         "fsdp.context_parallel_size = %d needs context-parallel attention, which the %s kernels "
                         "(train.device) do not have; use a device whose kernels have it (cpu, cuda) or "
                         "context_parallel_size = 1",
                         cp, k->name);
    if (wc->fsdp.enable && wc->fsdp.offload_params &&
        (wc->fsdp.sharding_strategy == WORKER_NO_SHARD))
        return error_set(FSDP_EINVAL, "fsdp.offload_params = true needs sharded parameters, but "
                         "fsdp.sharding_strategy = NO_SHARD keeps the whole model on every rank; use FULL_SHARD "
                         "or turn offload_params off");
    if (k->host_visible && wc->fsdp.offload_params)
        log_debug("fsdp.offload_params on %s: parameters already live in host memory; nothing changes", k->name);
    return 0;
}

void fsdp_mesh_of(const struct worker_config *wc, int world, struct fsdp_mesh *out)
{
    int cp = wc->fsdp.context_parallel_size > 0 ? wc->fsdp.context_parallel_size : 1;
    if (world < 1 || world % cp != 0)
        cp = 1;
    *out = (struct fsdp_mesh){.world = world, .dp = world / cp, .cp = cp};
}

/* Appends "[a b c] [d e f] ..." for n groups of size k whose j-th member is first(g) + j * stride. */
static size_t mesh_groups(char *buf, size_t cap, size_t len, int n, int k, int gstep, int stride)
{
    for (int g = 0; g < n && len < cap; g++) {
        if (len + 24 >= cap) {
            len += (size_t)snprintf(buf + len, cap - len, " ...");
            break;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s[", g ? " " : "");
        for (int j = 0; j < k && len < cap; j++) {
            if (len + 24 >= cap) {
                len += (size_t)snprintf(buf + len, cap - len, " ...");
                break;
            }
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", j ? " " : "", g * gstep + j * stride);
        }
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "]");
    }
    return len < cap ? len : cap - 1;
}

void fsdp_mesh_describe(const struct fsdp_mesh *m, char *buf, size_t cap)
{
    if (cap == 0)
        return;
    size_t len = (size_t)snprintf(buf, cap, "world %d = %d data-parallel x %d context; rows shared by ", m->world,
                                  m->dp, m->cp);
    if (len >= cap)
        return;
    len = mesh_groups(buf, cap, len, m->dp, m->cp, m->cp, 1);
    if (len + 1 < cap)
        len += (size_t)snprintf(buf + len, cap - len, "; same sequence slice, different rows: ");
    if (len + 1 < cap)
        mesh_groups(buf, cap, len, m->cp, m->dp, 1, m->cp);
}

/* Engine units as runs [first, first + n) of model units. */
static int plan_units(struct fsdp *f)
{
    const struct model_layout *l = f->layout;
    int nmu = l->n_units;
    f->units = calloc((size_t)nmu, sizeof *f->units);
    f->unit_of_mu = calloc((size_t)nmu, sizeof *f->unit_of_mu);
    if (!f->units || !f->unit_of_mu)
        return error_set(FSDP_ENOMEM, "fsdp: out of memory for the plan");
    int n = 0;
    enum worker_wrap_policy pol = f->wc.fsdp.auto_wrap_policy;
    if (pol == WORKER_WRAP_NONE) {
        f->units[n++] = (struct fsdp_unit){.first_mu = 0, .n_mu = nmu};
    } else {
        /* The blocks are the units; the names given must say so (any other class cannot be one here). */
        if (pol == WORKER_WRAP_TRANSFORMER) {
            int rc = model_wrap_classes_check(l, f->wc.fsdp.transformer_layer_cls_to_wrap);
            if (rc)
                return rc;
        }
        f->units[n++] = (struct fsdp_unit){.first_mu = 0, .n_mu = 1};
        size_t min = pol == WORKER_WRAP_SIZE ? (size_t)f->wc.fsdp.min_num_params : 0;
        for (int mu = 1; mu < nmu;) {
            struct fsdp_unit u = {.first_mu = mu, .n_mu = 0};
            size_t sum = 0;
            while (mu < nmu && (u.n_mu == 0 || sum < min)) {
                sum += l->units[mu].numel;
                u.n_mu++;
                mu++;
            }
            f->units[n++] = u;
        }
    }
    f->n_units = n;
    for (int i = 0; i < n; i++) {
        struct fsdp_unit *u = &f->units[i];
        const struct model_unit *a = &l->units[u->first_mu], *b = &l->units[u->first_mu + u->n_mu - 1];
        u->offset = a->offset;
        u->numel = b->offset + b->numel - a->offset;
        u->first_param = a->first_param;
        u->n_params = b->first_param + b->n_params - a->first_param;
        u->is_root = u->first_mu == 0;
        if (u->n_mu == 1)
            snprintf(u->name, sizeof u->name, "%s", a->name);
        else
            snprintf(u->name, sizeof u->name, "%.30s..%.30s", a->name, b->name);
        for (int mu = u->first_mu; mu < u->first_mu + u->n_mu; mu++)
            f->unit_of_mu[mu] = i;
        /* Parameters must tile the unit contiguously: the shards and the model's unit pointers rely on it. */
        size_t at = u->offset;
        for (int p = u->first_param; p < u->first_param + u->n_params; p++) {
            if (l->params[p].offset != at)
                return error_set(FSDP_EINVAL, "fsdp: parameter %s is not contiguous in unit %s",
                                 l->params[p].name, u->name);
            at += l->params[p].numel;
        }
        if (at != u->offset + u->numel)
            return error_set(FSDP_EINVAL, "fsdp: unit %s is not tiled by its parameters", u->name);
    }
    return 0;
}

static size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static int plan_shards(struct fsdp *f)
{
    const struct model_layout *l = f->layout;
    size_t sg = (size_t)f->shard_size, r = (size_t)f->shard_rank;
    size_t npieces = 0;
    for (int i = 0; i < f->n_units; i++)
        npieces += (size_t)f->units[i].n_params;
    f->pieces = calloc(npieces ? npieces : 1, sizeof *f->pieces);
    if (!f->pieces)
        return error_set(FSDP_ENOMEM, "fsdp: out of memory for the plan");
    f->n_pieces = 0;
    bool reshard_strategy = f->wc.fsdp.enable && (f->strategy == WORKER_FULL_SHARD || f->strategy == WORKER_HYBRID_SHARD) &&
                            f->wc.fsdp.reshard_after_forward;
    for (int i = 0; i < f->n_units; i++) {
        struct fsdp_unit *u = &f->units[i];
        u->reshard = reshard_strategy && !u->is_root && sg > 1;
        if (f->version == 1) {
            u->shard = ceil_div(u->numel, sg);
            size_t lo = r * u->shard, hi = lo + u->shard < u->numel ? lo + u->shard : u->numel;
            for (int p = u->first_param; p < u->first_param + u->n_params; p++) {
                size_t pb = l->params[p].offset - u->offset, pe = pb + l->params[p].numel;
                size_t b = pb > lo ? pb : lo, e = pe < hi ? pe : hi;
                if (b >= e)
                    continue;
                f->pieces[f->n_pieces++] = (struct fsdp_piece){.param = p, .begin = b - pb, .count = e - b,
                                                               .unit = i, .shard_off = b - lo};
            }
        } else {
            u->slots = calloc((size_t)u->n_params, sizeof *u->slots);
            if (!u->slots)
                return error_set(FSDP_ENOMEM, "fsdp: out of memory for the plan");
            size_t off = 0;
            for (int j = 0; j < u->n_params; j++) {
                const struct model_param *mp = &l->params[u->first_param + j];
                struct fsdp_pslot *s = &u->slots[j];
                s->param = u->first_param + j;
                s->rows = (size_t)mp->shape[0];
                s->row_len = mp->numel / s->rows;
                s->chunk = ceil_div(s->rows, sg);
                s->unit_off = mp->offset - u->offset;
                s->shard_off = off;
                off += s->chunk * s->row_len;
                size_t rb, re;
                fsdp_slot_rows(s, r, &rb, &re);
                if (re > rb)
                    f->pieces[f->n_pieces++] =
                        (struct fsdp_piece){.param = s->param, .begin = rb * s->row_len, .count = (re - rb) * s->row_len,
                                            .unit = i, .shard_off = s->shard_off};
            }
            u->shard = off;
        }
    }
    return 0;
}

int fsdp_plan_build(struct fsdp *f)
{
    int rc = plan_units(f);
    return rc ? rc : plan_shards(f);
}

void fsdp_plan_free(struct fsdp *f)
{
    for (int i = 0; f->units && i < f->n_units; i++)
        free(f->units[i].slots);
    free(f->units);
    free(f->unit_of_mu);
    free(f->pieces);
    f->units = NULL;
    f->unit_of_mu = NULL;
    f->pieces = NULL;
}

static void human(char *buf, size_t cap, double bytes)
{
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, cap, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024)
        snprintf(buf, cap, "%.1f MiB", bytes / (1024.0 * 1024));
    else
        snprintf(buf, cap, "%.1f KiB", bytes / 1024.0);
}

static const char *precision_name(enum dtype d)
{
    return d == DTYPE_F32 ? "fp32" : d == DTYPE_BF16 ? "bf16" : "fp16";
}

void fsdp_log_plan(const struct fsdp *f)
{
    if (f->g.rank != 0)
        return;
    static const char *pf[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
    log_info("fsdp plan: %s, version %d, world %d = %d shard group(s) of %d, params %s, compute %s, reduce %s, "
             "backward_prefetch %s, forward_prefetch %s",
             f->wc.fsdp.enable ? strategy_name(f->strategy) : "disabled (NO_SHARD)", f->version, f->g.world_size,
             f->rep_size, f->shard_size, precision_name(f->param_dtype), precision_name(f->compute_dtype),
             precision_name(f->reduce_dtype),
             pf[f->wc.fsdp.backward_prefetch], f->wc.fsdp.forward_prefetch ? "on" : "off");
    struct fsdp_mesh m;
    char desc[512];
    fsdp_mesh_of(&f->wc, f->g.world_size, &m);
    fsdp_mesh_describe(&m, desc, sizeof desc);
    char act[32];
    human(act, sizeof act, (double)model_get_arena_bytes(f->model));
    /* with context parallelism each rank keeps 1/C of every sequence's activations (docs/fsdp.md) */
    log_info("  mesh: %s; activations %s per rank", desc, act);
    size_t largest = 0;
    int largest_u = 0;
    for (int i = 0; i < f->n_units; i++) {
        const struct fsdp_unit *u = &f->units[i];
        char b[32];
        human(b, sizeof b, (double)u->shard * 4);
        log_info("  unit %-12s %10zu parameters, shard %10zu elements (%s fp32) per rank%s", u->name, u->numel,
                 u->shard, b, !u->reshard                ? ""
                 : i == f->n_units - 1 ? ", resharded after backward (backward needs it first)"
                                       : ", resharded after forward");
        if (u->numel > largest) {
            largest = u->numel;
            largest_u = i;
        }
    }
    char p[32], g[32], o[32], lu[32];
    human(p, sizeof p, (double)f->mem.now[FSDP_MEM_PARAMS]);
    human(g, sizeof g, (double)f->mem.now[FSDP_MEM_GRADS]);
    human(o, sizeof o, (double)f->mem.now[FSDP_MEM_OPTIM]);
    human(lu, sizeof lu, (double)largest * 4);
    log_info("  per rank: params %s, grads %s, optimizer state %s; largest unsharded unit %s (%zu parameters, %s)",
             p, g, o, f->units[largest_u].name, largest, lu);
    if (f->version == 1)
        log_warn("fsdp.version = 1 (flat parameters) is deprecated, as in PyTorch; version 2 shards each parameter "
                 "along dim 0");
}

void fsdp_plan_info(const struct fsdp *f, struct fsdp_plan_info *out)
{
    static const char *pf[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
    struct fsdp_mesh m;
    fsdp_mesh_of(&f->wc, f->g.world_size, &m);
    *out = (struct fsdp_plan_info){.data_parallel_size = m.dp, .context_parallel_size = m.cp,.strategy = strategy_name(f->strategy), .enabled = f->wc.fsdp.enable,
                                   .version = f->version, .world_size = f->g.world_size,
                                   .shard_groups = f->rep_size, .shard_group_size = f->shard_size,
                                   .param_dtype = precision_name(f->param_dtype),
                                   .reduce_dtype = precision_name(f->reduce_dtype),
                                   .compute_dtype = precision_name(f->compute_dtype),
                                   .backward_prefetch = pf[f->wc.fsdp.backward_prefetch],
                                   .forward_prefetch = f->wc.fsdp.forward_prefetch, .offload = f->offload,
                                   .n_units = f->n_units};
}

void fsdp_unit_info(const struct fsdp *f, int u, struct fsdp_unit_info *out)
{
    const struct fsdp_unit *x = &f->units[u];
    *out = (struct fsdp_unit_info){.name = x->name, .numel = x->numel, .shard = x->shard,
                                   .resharded_after = !x->reshard             ? NULL
                                                      : u == f->n_units - 1 ? "backward"
                                                                            : "forward"};
}

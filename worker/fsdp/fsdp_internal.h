/* The engine's private state, shared by fsdp_plan.c (units and shard geometry), fsdp_mem.c (buffers and
 * accounting), fsdp_engine.c (gather, compute, reduce), fsdp_optim.c (norm, clipping, AdamW) and
 * fsdp_state.c (initialisation and checkpoint access). */
#ifndef FSDP_WORKER_FSDP_INTERNAL_H
#define FSDP_WORKER_FSDP_INTERNAL_H

#include "worker/fsdp/fsdp.h"

/* One parameter's place in a unit's shards. Version 2: rows [r*chunk, min((r+1)*chunk, rows)) of rank r,
 * at shard_off in every rank's shard. Version 1 does not use these (the unit is one flat chunked buffer). */
struct fsdp_pslot {
    int param;
    size_t rows, row_len; /* the parameter as (rows, row_len) */
    size_t chunk;         /* rows per rank (ceil) */
    size_t unit_off;      /* the parameter's offset inside the unit */
    size_t shard_off;     /* its chunk's offset inside each rank's shard */
};

/* Where a unit's gathered parameters are. */
enum fsdp_gather_state {
    FSDP_GATHER_NONE,     /* not gathered */
    FSDP_GATHER_INFLIGHT, /* all-gather issued, not waited for */
    FSDP_GATHER_READY,    /* `full` holds the parameters */
};

struct fsdp_unit {
    char name[MODEL_NAME_MAX];
    int first_mu, n_mu; /* model units */
    int first_param, n_params;
    size_t offset, numel; /* slice of the model's flat parameter space */
    size_t shard;         /* elements per rank (padded) */
    struct fsdp_pslot *slots; /* version 2 */
    bool reshard;             /* free the gathered parameters after forward */
    bool is_root;

    /* persistent (device memory) */
    float *master, *grad, *exp_avg, *exp_avg_sq; /* shard elements each */
    void *lp;                                    /* param_dtype copy of master (mixed precision) */

    /* transient */
    float *full;       /* gathered parameters, numel (+ padding up to size * shard for version 1) */
    bool full_alias;   /* full == master (one-rank shard group in fp32): never freed */
    void *full_lp;     /* the same in param_dtype, model order, bound to full (k->lowp_bind) for the matmuls;
                          NULL when the table computes in fp32 */
    bool full_lp_alias; /* full_lp == lp (one-rank shard group): never freed */
    enum fsdp_gather_state gstate;
    struct comm_work *gwork;
    void *gbuf;        /* rank-major receive buffer when it is not `full` */
    void *gsrc;        /* offload: the shard staged in device memory for the all-gather */
    float *fgrad;      /* unsharded gradients of the current backward */
};

struct fsdp_pending {
    int unit;
    struct comm_work *work;
    void *send, *recv; /* pool buffers to return (send may be the unit's fgrad) */
    bool recv_lp;
    bool is_replicate; /* replicate all-reduce of the unit's gradient shard */
    bool last;         /* reduce-scatter of the step's last micro-batch: the replicate all-reduce follows */
};

#define FSDP_MAX_PENDING 256

/* What a step leaves on the device for fsdp_finish_step to read in one copy (the state's memory). */
struct fsdp_step_stats {
    struct kernels_grad_clip clip;
    double loss; /* this rank's loss sum, moved here from the model's accumulator */
};

struct fsdp_pool_buf {
    void *ptr;
    size_t bytes;
    bool used;
    enum fsdp_mem cat;
};

struct fsdp {
    struct worker_config wc;
    const struct kernels *k;
    struct model *model;
    const struct model_layout *layout;
    const struct kernels *sk; /* where the persistent state lives: the host's when offloading, else k */
    bool offload;             /* offload_params on a device: shards in host memory, optimizer on the host */
    struct comm *reg;         /* buffers come from comm_mem_alloc of this communicator (NULL: k->mem_alloc) */
    void *arena;              /* all persistent state of this rank, one allocation */
    struct fsdp_step_stats *stats; /* in the arena */
    float *host_stage;        /* offload: pinned host memory for a unit's device gradients (largest unit) */
    struct fsdp_groups g;
    struct comm *shard_comm, *rep_comm; /* NULL for one-rank groups */
    bool own_shard_comm, own_rep_comm;
    int shard_size, shard_rank, rep_size, rep_rank;
    int version;
    enum dtype param_dtype, reduce_dtype;
    enum dtype compute_dtype; /* param_dtype where the table's matmuls run it natively, else fp32 */
    bool bind_lp;                     /* gathered units keep their param_dtype copy for the matmuls */
    enum worker_sharding strategy;

    struct fsdp_unit *units;
    int n_units;
    int *unit_of_mu; /* model unit -> engine unit */

    struct fsdp_piece *pieces;
    size_t n_pieces;

    struct fsdp_pending pending[FSDP_MAX_PENDING];
    int n_pending;
    /* fsdp_order.c: collectives the device waits for, whose status the host takes at the end of the step */
    struct comm_work **ordered;
    int n_ordered, cap_ordered;

    struct fsdp_pool_buf *pool;
    int n_pool, cap_pool;

    struct fsdp_mem_stats mem;
    struct fsdp_timing timing;

    double loss_scale;
    int64_t scaler_good;
    bool grads_dirty;
    uint64_t init_bytes_read; /* tensor bytes this rank read from model.init_from */
};

/* fsdp_plan.c */
/* Ranks per shard group; 0 (message set) when it cannot divide the world. */
int fsdp_shard_group_size(const struct worker_config *wc, int world, int local_world);
int fsdp_plan_build(struct fsdp *f);
void fsdp_plan_free(struct fsdp *f);

/* fsdp_mem.c: buffers from a free list (units of a model mostly share sizes, so steady state allocates
 * nothing) and the per-category accounting. */
void *fsdp_buf_get(struct fsdp *f, size_t bytes, enum fsdp_mem cat);
void fsdp_buf_put(struct fsdp *f, void *ptr);
void fsdp_pool_free(struct fsdp *f);
void fsdp_mem_add(struct fsdp *f, enum fsdp_mem cat, ptrdiff_t bytes);
/* Memory for buffers the collectives read from: registered with the communicator (comm_mem_alloc: peers on
 * the same host read it directly, one copy instead of three), else the backend's. */
void *fsdp_raw_alloc(struct fsdp *f, size_t bytes);
void fsdp_raw_free(struct fsdp *f, void *p);

/* Copies between state memory (host memory when offloading) and device memory, and state += device. */
int fsdp_state_to_dev(struct fsdp *f, void *dev, const void *state, size_t bytes);
int fsdp_dev_to_state(struct fsdp *f, void *state, const void *dev, size_t bytes);
int fsdp_state_accumulate(struct fsdp *f, float *state, const float *dev, size_t n);

/* fsdp_engine.c */
int fsdp_gather_issue(struct fsdp *f, int u);
int fsdp_gather_wait(struct fsdp *f, int u);
void fsdp_release(struct fsdp *f, int u);
int fsdp_pending_drain(struct fsdp *f, int keep);
/* fsdp_order.c: orders the device work queued after this call behind w (comm_work_order) and keeps w until
 * fsdp_ordered_drain, which waits for every kept handle and returns the first failure. On failure w is already
 * waited for and freed. */
int fsdp_comm_order(struct fsdp *f, struct comm_work *w);
int fsdp_ordered_drain(struct fsdp *f);

/* fsdp_optim.c: sum of one double per rank of c (NULL = just x), in rank order */
int fsdp_sum_over(struct fsdp *f, struct comm *c, double x, double *sum);

/* fsdp_state.c */
int fsdp_refresh_lp(struct fsdp *f);

/* Rows [*rb, *re) of slot s that rank r of the shard group owns (empty past the parameter's end). */
static inline void fsdp_slot_rows(const struct fsdp_pslot *s, size_t r, size_t *rb, size_t *re)
{
    *rb = r * s->chunk < s->rows ? r * s->chunk : s->rows;
    *re = *rb + s->chunk < s->rows ? *rb + s->chunk : s->rows;
}

#endif

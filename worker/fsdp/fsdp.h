/* The FSDP engine: it owns the sharded training state of a model (fp32 master parameters, gradients and
 * AdamW moments, each split across the ranks of a shard group) and runs forward/backward unit by unit,
 * gathering a unit's parameters just before it is computed and reduce-scattering its gradients right after.
 *
 * Groups. Ranks form shard groups of `shard_size` consecutive ranks; the ranks with the same position in
 * every shard group form a replicate group. FULL_SHARD and SHARD_GRAD_OP: one shard group (the world);
 * NO_SHARD: shard groups of one rank (the replicate group is the world); HYBRID_*: shard groups of
 * hybrid_shard_size ranks. Gradients are reduce-scattered in the shard group, then all-reduced in the
 * replicate group. One code path serves every strategy: only the group sizes and whether a unit is
 * resharded after forward differ.
 *
 * Units. Engine units are runs of the model's units (model.h: 0 = root with the embeddings and ln_f, then
 * one per block), chosen by the wrap policy. The root unit stays gathered from the embedding forward to the
 * embedding backward (its wte is also the LM head), like PyTorch's root FSDP module.
 *
 * Shards. Version 1: a unit is one flat buffer padded to a multiple of the shard group size, and rank r
 * owns the r-th contiguous chunk (FSDP1's FlatParameter). Version 2: every parameter is split along dim 0
 * into chunks of ceil(rows / shard_size) rows (FSDP2's Shard(0)); a rank's shard is its chunk of each
 * parameter, each padded to the chunk size, one after the other. Either way each rank holds `shard`
 * elements per unit and all-gathers produce rank-major buffers; version 2 unpacks them.
 *
 * Math. A micro-batch's backward uses dloss = 1 / (tokens in the global batch), so summing gradients over
 * ranks and micro-batches gives exactly the gradient of the global mean loss at any world size. With context
 * parallelism a rank's micro-batch is its chunks of its context group's sequences (the model splits them,
 * model_create_cp): the same sums, over every rank of the mesh. */
#ifndef FSDP_WORKER_FSDP_H
#define FSDP_WORKER_FSDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "worker/model/model.h"
#include "worker/config/worker_config.h"

struct fsdp;

struct fsdp_groups {
    struct comm *world; /* NULL when world_size == 1 */
    int rank, world_size;
    int local_world_size; /* ranks per node: HYBRID's default shard group */
};

/* Memory by category, in bytes (device memory of the kernels backend). */
enum fsdp_mem {
    FSDP_MEM_PARAMS = 0,  /* master shards (+ their low-precision copies) */
    FSDP_MEM_GRADS,       /* gradient shards */
    FSDP_MEM_OPTIM,       /* AdamW moments */
    FSDP_MEM_GATHERED,    /* unsharded unit parameters (transient) */
    FSDP_MEM_UNSHARDED_GRADS,
    FSDP_MEM_COMM,        /* pack/unpack and low-precision staging buffers */
    FSDP_MEM_ACTIVATIONS, /* the model's activation arena */
    FSDP_MEM_COUNT
};

struct fsdp_mem_stats {
    size_t now[FSDP_MEM_COUNT], peak[FSDP_MEM_COUNT];
    size_t peak_total; /* peak of the sum over categories */
    size_t pool_held;  /* bytes of transient buffers allocated, in use or kept for reuse (resident) */
};

/* Time spent waiting for all-gathers (exposed communication) and in them (issue to completion). */
struct fsdp_timing {
    double gather_wait_s, reduce_wait_s;
    int64_t gathers, prefetched;
    int64_t ordered; /* collectives whose readers the device ordered after them, without a host wait */
};

/* Checks the fsdp and train sections against the world (shard size, batch divisibility, precision on
 * the device, offload with NO_SHARD, ...); the message names the keys and what would work. */
int fsdp_check_config(const struct worker_config *wc, int world_size, int local_world_size, const struct kernels *k);
/* The device mesh: world = dp x cp ranks, rank r = (r / cp) * cp + r % cp, i.e. the cp ranks of a context
 * group are consecutive. The ranks of a context group hold the same rows of the global batch and each a
 * slice of every sequence; the ranks at the same place of every context group hold different rows. */
struct fsdp_mesh {
    int world, dp, cp;
};
void fsdp_mesh_of(const struct worker_config *wc, int world_size, struct fsdp_mesh *out);
/* One line for the plan: "world 4 = 2 data-parallel x 2 context; rows shared by [0 1] [2 3]; ..." (truncated
 * with "..." past cap). */
void fsdp_mesh_describe(const struct fsdp_mesh *m, char *buf, size_t cap);

/* Builds groups (comm_split of g->world, a collective over all ranks), the unit plan and the persistent
 * state (zeroed). The model must have been created with the micro-batch shape. */
int fsdp_create(struct fsdp **out, const struct worker_config *wc, struct model *model, const struct kernels *k,
                const struct fsdp_groups *g);
void fsdp_destroy(struct fsdp *f);

/* Logs the plan (rank 0): units, parameters per unit, bytes per rank by category, largest unsharded unit. */
void fsdp_log_plan(const struct fsdp *f);

/* The plan as values, for machine-readable reports (the run summary); the same facts fsdp_log_plan says. */
struct fsdp_plan_info {
    const char *strategy; /* "FULL_SHARD", ...; "NO_SHARD" when fsdp.enable is false */
    bool enabled;         /* fsdp.enable */
    int version, world_size;
    int shard_groups, shard_group_size;
    int data_parallel_size, context_parallel_size; /* the mesh: world_size = dp x cp */
    const char *param_dtype, *reduce_dtype; /* "fp32", "bf16", "fp16": what the collectives use */
    const char *compute_dtype; /* what the matmuls compute in: param_dtype where the device runs it natively
                                  (CUDA; a CPU with bf16 instructions), else "fp32" */
    const char *backward_prefetch;          /* "BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH" */
    bool forward_prefetch, offload;
    int n_units;
};
void fsdp_plan_info(const struct fsdp *f, struct fsdp_plan_info *out);
/* Engine unit u: its name ("h.0..h.1"), parameters, shard elements per rank, and when it is resharded
 * (NULL: kept gathered; "forward": after its forward; "backward": after its backward, the last unit). */
struct fsdp_unit_info {
    const char *name;
    size_t numel, shard;
    const char *resharded_after;
};
void fsdp_unit_info(const struct fsdp *f, int u, struct fsdp_unit_info *out);

/* Initial parameters: from model.init_from or the seed; with sync_module_states rank 0 initialises the
 * whole model and broadcasts it, else each rank initialises only its own shards (same values). */
int fsdp_init_params(struct fsdp *f);
/* FSDP_ERANGE when v, elements [begin, begin + n) of parameter p as loaded from source ("model.init_from
 * DIR", "checkpoint DIR (exp_avg)"), holds a NaN or an infinity: the message names the tensor and says the
 * weights were non-finite before training began, so it is not read as a divergence of this run (the
 * optimizer's "the loss diverged; lower optim.lr" would send the user after the wrong cause). */
int fsdp_check_finite(const struct model_layout *l, int p, size_t begin, const float *v, size_t n, const char *source);
/* Tensor bytes this rank read from model.init_from (0 without one): its own shards' bytes, or the whole
 * model on rank 0 when it reads for a broadcast. */
uint64_t fsdp_init_bytes_read(const struct fsdp *f);

/* One micro-batch (set on the model with model_set_batch): forward, backward with dloss, gradients
 * accumulated into the shards. last = the last micro-batch of the step (starts the replicate all-reduce). */
int fsdp_forward_backward(struct fsdp *f, float dloss, bool last);
/* Forward only (evaluation); its loss is accumulated like forward_backward's. */
int fsdp_forward_eval(struct fsdp *f);
/* *local = this rank's sum of per-token losses since the last call (forward_backward and forward_eval add
 * to it on the device; reading it waits for the device, so a step reads it once, after its last micro-batch
 * and the optimizer step). */
int fsdp_take_loss(struct fsdp *f, double *local);

struct fsdp_step_result {
    double grad_norm; /* global norm before clipping (unscaled) */
    bool skipped;     /* fp16: non-finite gradients, step skipped and loss scale backed off */
    double loss_scale;
};
/* Finishes gradient reduction, clips by the global norm, runs AdamW on the shards, refreshes the
 * low-precision parameter shards and zeroes the gradients. step is 1-based (bias correction). The norm, the
 * clip and the non-finite check happen on the device: nothing here waits for it (offloading aside). */
int fsdp_optimizer_step(struct fsdp *f, double lr, int64_t step);
/* After fsdp_optimizer_step: the step's outcome and this rank's loss sum since the last read, in one read
 * from the device. A non-finite norm skipped the update: FSDP_ERANGE ("the loss diverged"), or with fp16 a
 * skipped step (res->skipped) and a lower loss scale. */
int fsdp_finish_step(struct fsdp *f, int64_t step, struct fsdp_step_result *res, double *local_loss);

/* Sum of x over all ranks, added in rank order (every rank gets the same bits). */
int fsdp_sum_world(struct fsdp *f, double x, double *sum);

/* The dloss multiplier for fp16 loss scaling (1 otherwise). */
double fsdp_loss_scale(const struct fsdp *f);

const struct fsdp_mem_stats *fsdp_get_mem(const struct fsdp *f);
const struct fsdp_timing *fsdp_get_timing(const struct fsdp *f);
/* Bytes per rank of params + grads + optimizer state (what sharding divides). */
size_t fsdp_persistent_bytes(const struct fsdp *f);
const char *fsdp_mem_name(enum fsdp_mem m);

/* ---- state access for checkpoints: the pieces of the flat parameter space this rank owns ---- */
enum fsdp_state_kind { FSDP_STATE_PARAM = 0, FSDP_STATE_EXP_AVG, FSDP_STATE_EXP_AVG_SQ };
struct fsdp_piece {
    int param;           /* index in the model layout */
    size_t begin, count; /* elements of the parameter's row-major tensor */
    float *data[3];      /* device pointers for each fsdp_state_kind */
    int unit;            /* engine unit */
    size_t shard_off;    /* offset inside the unit's shard (the gradient is at grad + shard_off) */
};
/* This rank's pieces (replicas of HYBRID / NO_SHARD own the same pieces as their shard-group peers). */
const struct fsdp_piece *fsdp_pieces(const struct fsdp *f, size_t *n);
/* Rank within the shard group and the index of its replicate group (0 = the one that writes). */
int fsdp_shard_rank(const struct fsdp *f);
int fsdp_replica_index(const struct fsdp *f);
int fsdp_shard_size(const struct fsdp *f);
/* After the pieces were overwritten (checkpoint load), refresh derived copies. */
int fsdp_state_loaded(struct fsdp *f, int64_t optimizer_steps, double loss_scale, int64_t scaler_good);
int64_t fsdp_scaler_good_steps(const struct fsdp *f);
/* Gathers engine unit u's full state (kind) to every rank of the shard group into dst (host; the unit's
 * parameters in model order at the start, dst must hold fsdp_unit_gather_capacity elements); for full
 * state dicts. A collective of the shard group. */
int fsdp_gather_unit_state(struct fsdp *f, int unit, enum fsdp_state_kind kind, float *dst_host);
size_t fsdp_unit_gather_capacity(const struct fsdp *f, int unit);
int fsdp_n_units(const struct fsdp *f);
/* First model parameter and count of engine unit u; its flat offset and numel. */
void fsdp_unit_params(const struct fsdp *f, int unit, int *first_param, int *n_params, size_t *offset,
                      size_t *numel);
const struct kernels *fsdp_kernels(const struct fsdp *f);
/* "FULL_SHARD", ... (NO_SHARD when fsdp.enable is false). */
const char *fsdp_strategy_name(const struct fsdp *f);
/* The table whose memory holds the pieces (the host's with offload_params on a device). */
const struct kernels *fsdp_state_kernels(const struct fsdp *f);
const struct model_layout *fsdp_layout(const struct fsdp *f);
struct comm *fsdp_world(const struct fsdp *f);

#endif

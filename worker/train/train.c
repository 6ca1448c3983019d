/* The training loop. Each step: every rank takes its rows of the step's global batch (the batch does not
 * depend on the world size), runs its micro-batches through the engine with dloss = 1 / tokens of the
 * global batch (so the summed gradients are those of the global mean loss), then the sharded AdamW step.
 * The reported loss is the same global mean, summed over ranks in rank order. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rss.h"
#include "common/settings.h"
#include "worker/fsdp/fsdp.h"
#include "worker/model/model.h"
#include "worker/train/data.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/metrics.h"
#include "worker/train/progress.h"
#include "worker/train/run_summary.h"
#include "worker/train/status_report.h"
#include "worker/train/train.h"
#include "worker/train/train_ckpt.h"
#include "worker/train/train_cp.h"
#include "worker/train/train_device.h"

/* Peak FLOP/s of this rank for the MFU: FSDP_PEAK_TFLOPS when set, else the backend's probe (on CPU a short
 * SGEMM measured now, every rank at once); unknown (-1) where the backend has none. */
static double peak_flops(const struct kernels *k)
{
    double tflops = settings_double(SETTING_PEAK_TFLOPS);
    if (tflops > 0)
        return tflops * 1e12;
    return k->peak_flops ? k->peak_flops() : -1;
}

struct trainer {
    const struct worker_config *wc;
    struct train_env *env;
    const struct kernels *k;
    struct comm *world;
    struct model *model;
    struct fsdp *fsdp;
    struct data_file *train, *val;
    int32_t *inputs, *targets;
    int rows_per_rank, accum; /* rows of the global batch per data-parallel rank (a context group) */
    struct model_cp cp;       /* this rank's context group (size 1: none) */
    struct train_cp *cp_group;
    double tokens_per_step;
    struct train_ckpt ckpt;
    /* Resident bytes when training began, before the model, the data and the engine existed: the program
     * and its libraries (CUDA's alone are ~200 MiB). Peak RSS above it is what the run itself used. */
    size_t rss_at_start;
    /* output of rank 0: metrics.jsonl + TensorBoard, the progress line, the MFU's terms */
    struct metrics *met;
    struct progress prog;
    char logdir[FSDP_PATH_MAX];
    char device_reason[640]; /* why this device (train_device_open), for the run summary */
    double peak_flops, flops_per_token;
    double last_loss, last_val;
    struct run_summary summary; /* every rank's end-of-run record */
    struct status_report *status; /* the live record for fsdp-launch's status page (NULL without a store) */
    int64_t last_val_step;
};

/* This rank's rows of the global batch of `step` in file d, micro-batch a. */
static int load_micro(struct trainer *t, struct data_file *d, int64_t step, int a)
{
    int mb = t->wc->train.micro_batch;
    /* the ranks of a context group (consecutive) read the same rows; the model keeps each one's chunks */
    int64_t row0 = (int64_t)(t->env->rank / t->cp.size) * t->rows_per_rank + (int64_t)a * mb;
    FSDP_TRY(data_get_rows(d, step, row0, mb, t->inputs, t->targets));
    return model_set_batch(t->model, t->inputs, t->targets);
}

static int evaluate(struct trainer *t, double *val_loss)
{
    double local = 0;
    double sum = 0;
    int rc = 0;
    for (int64_t e = 0; e < t->wc->train.eval_steps; e++)
        for (int a = 0; a < t->accum; a++) {
            FSDP_TRY_GOTO(load_micro(t, t->val, e, a), rc, out);
            FSDP_TRY_GOTO(fsdp_forward_eval(t->fsdp), rc, out);
        }
    FSDP_TRY_GOTO(fsdp_take_loss(t->fsdp, &local), rc, out);
    FSDP_TRY_GOTO(fsdp_sum_world(t->fsdp, local, &sum), rc, out);
out:
    *val_loss = sum / (t->tokens_per_step * (double)t->wc->train.eval_steps);
    return rc;
}

static int open_data(struct trainer *t)
{
    _Static_assert((int)DATA_ORDER_SHUFFLED == (int)WORKER_ORDER_SHUFFLED &&
                       (int)DATA_ORDER_SEQUENTIAL == (int)WORKER_ORDER_SEQUENTIAL,
                   "data.order converts to enum data_order by a cast");
    const struct worker_config *wc = t->wc;
    struct data_options o = {.block_size = wc->model.block_size, .vocab_size = wc->model.vocab_size,
                             .batch_rows = wc->train.train_batch, .order = (enum data_order)wc->data.order,
                             .seed = wc->train.seed, .stream = DATA_STREAM_TRAIN};
    if (!wc->data.train_file[0])
        return error_set(FSDP_EINVAL, "data.train_file is not set: give a token file (fsdp-prepare-data makes one "
                         "from text files)");
    FSDP_TRY(data_open(wc->data.train_file, &o, &t->train));
    if (wc->data.val_file[0] && wc->train.eval_interval > 0) {
        o.stream = DATA_STREAM_VAL;
        FSDP_TRY(data_open(wc->data.val_file, &o, &t->val));
    }
    return 0;
}

static void report_memory(const struct trainer *t)
{
    const struct fsdp_mem_stats *m = fsdp_get_mem(t->fsdp);
    char line[1024];
    size_t len = 0;
    for (int i = 0; i < FSDP_MEM_COUNT; i++)
        len += (size_t)snprintf(line + len, sizeof line - len, "%s%s %.1f MiB", i ? ", " : "",
                                fsdp_mem_name((enum fsdp_mem)i), (double)m->peak[i] / (1024.0 * 1024));
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const struct fsdp_timing *tm = fsdp_get_timing(t->fsdp);
    double peak = (double)ru.ru_maxrss * 1024.0;
    log_info("peak memory: %s; total %.1f MiB (buffer pool %.1f MiB); peak RSS %.1f MiB (%.1f MiB above the program's own %.1f MiB); "
             "all-gathers %lld (%lld prefetched), waited %.3f s "
             "for gathers and %.3f s for reductions",
             line, (double)m->peak_total / (1024.0 * 1024), (double)m->pool_held / (1024.0 * 1024), peak / 1048576.0,
             peak > (double)t->rss_at_start ? (peak - (double)t->rss_at_start) / 1048576.0 : 0.0,
             (double)t->rss_at_start / 1048576.0, (long long)tm->gathers,
             (long long)tm->prefetched, tm->gather_wait_s, tm->reduce_wait_s);
}

static int write_summary(const struct trainer *t, int64_t first_step, size_t persistent_rss_growth)
{
    struct run_summary_facts f = {.logdir = t->logdir, .wc = t->wc, .env = t->env, .device = t->k->name,
                                  .device_reason = t->device_reason,
                                  .model = t->model, .fsdp = t->fsdp, .ckpt = &t->ckpt.stats,
                                  .micro_batches = t->accum, .first_step = first_step,
                                  .final_loss = t->last_loss, .final_val_loss = t->last_val,
                                  .rss_at_start = t->rss_at_start, .persistent_rss_growth = persistent_rss_growth,
                                  .peak_flops = t->peak_flops, .flops_per_token = t->flops_per_token,
                                  .cp_seconds = train_cp_seconds(t->cp_group), .cp_calls = train_cp_calls(t->cp_group)};
    return run_summary_write(&t->summary, &f);
}

/* A resumed run continues metrics.jsonl; lines of steps at or after the resume point (logged by the attempt
 * that crashed after its last checkpoint) are dropped first, so the file has each step once. Rewritten
 * through a temporary file and rename, so a crash here loses nothing. */
static int metrics_trim(const char *dir, int64_t first_step)
{
    char path[FSDP_PATH_MAX], tmp[FSDP_PATH_MAX];
    FSDP_TRY(fs_path_format(path, sizeof path, "log.dir", "%s/metrics.jsonl", dir));
    FSDP_TRY(fs_path_format(tmp, sizeof tmp, "log.dir", "%s/.metrics.jsonl.tmp", dir));
    FILE *in = fopen(path, "r");
    if (!in)
        return 0;
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return error_set(FSDP_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    char line[4096];
    long long step;
    while (fgets(line, sizeof line, in))
        if (sscanf(line, "{\"step\":%lld", &step) != 1 || step < first_step)
            fputs(line, out);
    fclose(in);
    int bad = fflush(out) != 0 || fsync(fileno(out)) != 0;
    bad |= fclose(out) != 0;
    if (bad || rename(tmp, path) != 0)
        return error_set(FSDP_EIO, "cannot rewrite %s: %s", path, strerror(errno));
    return 0;
}

/* FSDP_FAULT_KILL=STEP:RANK: that rank SIGKILLs itself when it reaches STEP on the first attempt only, so
 * tests (and users rehearsing recovery) can crash a run at a chosen point and watch it recover. */
static void fault_maybe_kill(const struct train_env *env, int64_t step)
{
    const char *v = settings_get_string(SETTING_FAULT_KILL);
    long long at;
    int rank;
    if (v && env->restart_count == 0 && sscanf(v, "%lld:%d", &at, &rank) == 2 && at == step && rank == env->rank) {
        log_warn("FSDP_FAULT_KILL: killing myself at step %lld", at);
        raise(SIGKILL);
    }
}

/* One optimizer step: this rank's micro-batches of the step through forward and backward, the sharded
 * AdamW step, and the step's loss (the mean over every token of the global batch). The loss and the gradient
 * norm stay on the device until the whole step is queued: one read then (fsdp_finish_step). */
static int train_step(struct trainer *t, int64_t step, double lr, double *loss, struct fsdp_step_result *res)
{
    float dloss = (float)(fsdp_loss_scale(t->fsdp) / t->tokens_per_step);
    double local = 0;
    double sum = 0;
    int rc = 0;
    for (int a = 0; a < t->accum; a++) {
        FSDP_TRY_GOTO(load_micro(t, t->train, step, a), rc, out);
        FSDP_TRY_GOTO(fsdp_forward_backward(t->fsdp, dloss, a == t->accum - 1), rc, out);
    }
    FSDP_TRY_GOTO(fsdp_optimizer_step(t->fsdp, lr, step + 1), rc, out);
    FSDP_TRY_GOTO(fsdp_finish_step(t->fsdp, step + 1, res, &local), rc, out);
    FSDP_TRY_GOTO(fsdp_sum_world(t->fsdp, local, &sum), rc, out);
out:
    *loss = sum / t->tokens_per_step;
    return rc;
}

static bool eval_due(const struct trainer *t, int64_t step)
{
    const struct worker_config *wc = t->wc;
    return t->val && wc->train.eval_interval > 0 &&
           ((step + 1) % wc->train.eval_interval == 0 || step + 1 == wc->train.max_steps);
}

/* Rank 0's outputs of the run: the log directory with metrics.jsonl (trimmed to the resume point) and the
 * TensorBoard file, the progress line, and the terms of the MFU. */
static int log_open(struct trainer *t, int64_t first_step)
{
    const struct worker_config *wc = t->wc;
    t->last_loss = t->last_val = NAN;
    FSDP_TRY(train_expand_run_id(t->logdir, sizeof t->logdir, wc->log.dir, t->env->run_id, "log.dir"));
    if (t->env->rank == 0) {
        FSDP_TRY(fs_mkdir_p(t->logdir, "log.dir"));
        if (first_step > 0)
            FSDP_TRY(metrics_trim(t->logdir, first_step));
        FSDP_TRY(metrics_open(t->logdir, first_step, &t->met));
    }
    t->peak_flops = peak_flops(t->k);
    t->flops_per_token = model_flops_per_token(model_get_layout(t->model));
    progress_init(&t->prog, stdout, -1, first_step, wc->train.max_steps, wc->log.interval);
    return 0;
}

static int log_step(struct trainer *t, const struct metrics_row *row)
{
    t->last_loss = row->loss;
    if (row->has_val) {
        t->last_val = row->val_loss;
        t->last_val_step = row->step + 1;
    }
    double mfu = t->peak_flops > 0
                     ? row->tokens_per_s * t->flops_per_token / (t->peak_flops * t->env->world_size)
                     : -1;
    struct status_report_step sr = {.step = row->step + 1, .max_steps = t->wc->train.max_steps, .loss = row->loss,
                                    .tokens_per_s = row->tokens_per_s, .mfu = mfu, .val_loss = t->last_val,
                                    .val_step = t->last_val_step};
    status_report_step(t->status, &sr, t->fsdp, row->has_val || row->step + 1 == t->wc->train.max_steps);
    if (t->env->rank != 0)
        return 0;
    int rc = metrics_log(t->met, row);
    struct progress_stats ps = {.step = row->step, .loss = row->loss, .lr = row->lr, .grad_norm = row->grad_norm,
                                .tokens_per_s = row->tokens_per_s, .mfu = mfu,
                                .mem_bytes = (double)fsdp_get_mem(t->fsdp)->peak_total};
    progress_update(&t->prog, &ps);
    if (row->has_val && !t->prog.tty)
        log_info("step %lld: val loss %.4f", (long long)row->step + 1, row->val_loss);
    return rc;
}

static void log_close(struct trainer *t, int64_t first_step, double elapsed, bool ok)
{
    const struct worker_config *wc = t->wc;
    if (t->env->rank == 0)
        progress_finish(&t->prog);
    if (ok && t->env->rank == 0 && first_step < wc->train.max_steps) {
        long long steps = (long long)(wc->train.max_steps - first_step);
        if (isnan(t->last_val))
            log_info("done: %lld steps in %.1f s, final loss %.4f", steps, elapsed, t->last_loss);
        else
            log_info("done: %lld steps in %.1f s, final loss %.4f, val loss %.4f", steps, elapsed, t->last_loss,
                     t->last_val);
        log_info("metrics: %s/metrics.jsonl, TensorBoard: %s", t->logdir, metrics_events_path(t->met));
    }
    metrics_close(t->met);
    t->met = NULL;
}

/* The loop: for each step, its learning rate, the step, evaluation when due, the step's record, and a
 * checkpoint when due; a final checkpoint at the end. */
static int run_loop(struct trainer *t, int64_t first_step)
{
    _Static_assert((int)LR_SCHEDULE_COSINE == (int)WORKER_LR_COSINE &&
                       (int)LR_SCHEDULE_LINEAR == (int)WORKER_LR_LINEAR &&
                       (int)LR_SCHEDULE_CONSTANT == (int)WORKER_LR_CONSTANT,
                   "optim.lr_schedule converts to enum lr_schedule_kind by a cast");
    const struct worker_config *wc = t->wc;
    struct lr_schedule sched = {.kind = (enum lr_schedule_kind)wc->optim.lr_schedule, .lr = wc->optim.lr,
                                .min_lr = wc->optim.min_lr, .warmup_steps = wc->optim.warmup_steps,
                                .decay_steps = wc->train.max_steps};
    FSDP_TRY(lr_schedule_check(&sched));
    FSDP_TRY(log_open(t, first_step));
    if (status_report_open(t->env->store, t->env->rank, t->env->restart_count, &t->status))
        log_warn("no live status for fsdp-launch's status page: %s", error_message());
    double t_start = clock_now_s();
    int rc = 0;
    for (int64_t s = first_step; s < wc->train.max_steps; s++) {
        fault_maybe_kill(t->env, s);
        double t0 = clock_now_s();
        struct metrics_row row = {.step = s, .lr = lr_schedule_at(&sched, s)};
        struct fsdp_step_result res;
        double scale = fsdp_loss_scale(t->fsdp);
        FSDP_TRY_GOTO(train_step(t, s, row.lr, &row.loss, &res), rc, out);
        run_summary_note_step(&t->summary, s + 1, scale, &res);
        row.grad_norm = res.grad_norm;
        row.tokens_per_s = t->tokens_per_step / (clock_now_s() - t0);
        if (eval_due(t, s)) {
            FSDP_TRY_GOTO(evaluate(t, &row.val_loss), rc, out);
            row.has_val = 1;
        }
        FSDP_TRY_GOTO(log_step(t, &row), rc, out);
        FSDP_TRY_GOTO(train_ckpt_maybe_save(&t->ckpt, t->fsdp, wc, t->env, s + 1, false), rc, out);
    }
    FSDP_TRY_GOTO(train_ckpt_maybe_save(&t->ckpt, t->fsdp, wc, t->env, wc->train.max_steps, true), rc, out);
out:
    status_report_close(t->status);
    t->status = NULL;
    log_close(t, first_step, clock_now_s() - t_start, rc == 0);
    return rc;
}

void train_model_config(const struct worker_config *wc, struct model_config *mc) { worker_config_model(wc, mc); }

int train_run(const struct worker_config *wc, const char *config_text, struct train_env *env)
{
    struct trainer t = {.wc = wc, .env = env, .rss_at_start = rss_now()};
    FSDP_TRY(train_device_open(wc, env, &t.k, t.device_reason, sizeof t.device_reason));
    int checked = fsdp_check_config(wc, env->world_size, env->local_world_size, t.k);
    if (checked < 0) {
        env->config_refused = true;
        return checked;
    }
    t.rows_per_rank = wc->train.train_batch / (env->world_size / (wc->fsdp.context_parallel_size > 0
                                                                     ? wc->fsdp.context_parallel_size : 1));
    t.accum = t.rows_per_rank / wc->train.micro_batch;
    t.tokens_per_step = (double)wc->train.train_batch * wc->model.block_size;

    struct model_config mc;
    train_model_config(wc, &mc);

    size_t ntok = (size_t)wc->train.micro_batch * wc->model.block_size;
    t.inputs = malloc(ntok * sizeof *t.inputs);
    t.targets = malloc(ntok * sizeof *t.targets);
    int rc = 0;
    if (!t.inputs || !t.targets) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    FSDP_TRY_GOTO(open_data(&t), rc, out);
    if (env->world_size > 1) {
        struct comm_options co = {.backend = t.k->comm_backend,
                                  .generation = env->restart_count, .device = -1};
        FSDP_TRY_GOTO(comm_create(env->store, env->rank, env->world_size, "world", &co, &t.world), rc, out);
    }
    FSDP_TRY_GOTO(train_cp_open(wc, env->rank, t.world, &t.cp_group, &t.cp), rc, out);
    FSDP_TRY_GOTO(model_create_cp(&t.model, &mc, t.k, wc->train.micro_batch, wc->model.block_size, &t.cp), rc, out);
    size_t rss0 = rss_now();
    struct fsdp_groups g = {.world = t.world, .rank = env->rank, .world_size = env->world_size,
                            .local_world_size = env->local_world_size};
    FSDP_TRY_GOTO(fsdp_create(&t.fsdp, wc, t.model, t.k, &g), rc, out);
    size_t rss1 = rss_now();
    fsdp_log_plan(t.fsdp);
    const struct model_config *mcfg = &model_get_layout(t.model)->config;
    char family[256];
    model_describe(model_get_layout(t.model), family, sizeof family);
    if (env->rank == 0)
        log_info("model %s: %d layers, %d heads, n_embd %d, vocab %d, context %d%s: %zu parameters; "
                 "activations %.1f MiB per rank (micro_batch %d%s); %d rank(s), %d micro-batch(es) per step",
                 mcfg->model_family, mcfg->n_layer, mcfg->n_head, mcfg->n_embd, mcfg->vocab_size, mcfg->block_size,
                 family, model_get_layout(t.model)->numel_real,
                 (double)model_get_arena_bytes(t.model) / (1024.0 * 1024), wc->train.micro_batch,
                 wc->model.activation_checkpointing ? ", activation checkpointing" : "", env->world_size, t.accum);
    int64_t first_step = 0;
    FSDP_TRY_GOTO(fsdp_init_params(t.fsdp), rc, out);
    log_info("persistent state: %zu bytes per rank (params + grads + optimizer, engine accounting); RSS grew by "
             "%zu bytes creating it",
             fsdp_persistent_bytes(t.fsdp), rss1 > rss0 ? rss1 - rss0 : 0);
    FSDP_TRY_GOTO(train_ckpt_maybe_load(&t.ckpt, t.fsdp, wc, env, config_text, &first_step), rc, out);
    FSDP_TRY_GOTO(run_loop(&t, first_step), rc, out);
    report_memory(&t);
    FSDP_TRY_GOTO(write_summary(&t, first_step, rss1 > rss0 ? rss1 - rss0 : 0), rc, out);
    /* Everyone is done with the store and the communicators before rank 0 may stop its store. */
    if (t.world)
        FSDP_TRY_GOTO(comm_barrier(t.world), rc, out);
out:
    train_ckpt_close(&t.ckpt);
    run_summary_free(&t.summary);
    fsdp_destroy(t.fsdp);
    train_cp_close(t.cp_group);
    comm_destroy(t.world);
    model_destroy(t.model);
    data_close(t.train);
    data_close(t.val);
    free(t.inputs);
    free(t.targets);
    return rc;
}
